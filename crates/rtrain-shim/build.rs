//! Compiles the bridge (`src/shim.cpp`) against libtorch's headers. A crate of its own so that
//! this compilation, the slowest step of building rtrain's own code, happens once per profile:
//! a build script reruns whenever its package's features change, and rtrain's change from one
//! cargo command to the next (the test tiers, `cuda`, no `mpi`).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/shim.cpp");
    let lib_dir = PathBuf::from(
        std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys did not report its libtorch directory"),
    );
    let include = lib_dir.parent().map(|p| p.join("include")).unwrap_or_default();
    cc::Build::new()
        .cpp(true)
        .file("src/shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .warnings(false)
        .compile("rtrain_shim");
    // After the static library, so that its references to libtorch resolve.
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
}
