//! Makes the built binaries find libtorch at run time without LD_LIBRARY_PATH.
//!
//! torch-sys (a direct dependency for this reason) announces the libtorch library directory
//! through its `links` metadata; we bake it into every binary's rpath. A `cuda` build also
//! forces `libtorch.so` to be linked: as-needed linking would otherwise drop `libtorch_cuda`,
//! which no symbol references, and CUDA would silently report itself unavailable.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let Ok(lib_dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        println!(
            "cargo:warning=torch-sys did not report its libtorch directory; set LD_LIBRARY_PATH at run time"
        );
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
