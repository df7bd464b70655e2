//! Build glue: binaries that find libtorch at run time without LD_LIBRARY_PATH, and rtrain's C
//! shims. (The C++ bridge to libtorch is the `rtrain-shim` crate, crates/rtrain-shim, compiled
//! once whatever rtrain's features: this script reruns whenever they change.)
//!
//! torch-sys (a direct dependency for this reason) announces the libtorch library directory
//! through its `links` metadata. We bake the directory into every binary's rpath. With the `mpi`
//! feature, a one-line C file gives Rust the MPI library's `MPI_IN_PLACE`, which differs between
//! implementations. `src/shim/jpeg_shim.c` wraps libjpeg-turbo, linked statically (Debian's
//! `libjpeg62-turbo-dev` ships `libjpeg.a`) so that the binary, the container image and a GPU
//! machine need no libjpeg of their own. A `cuda` build also forces `libtorch.so` to be linked:
//! as-needed linking would otherwise drop `libtorch_cuda`, which no symbol references, and CUDA
//! would silently report itself unavailable.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/shim/mpi_shim.c");
    println!("cargo:rerun-if-changed=src/shim/jpeg_shim.c");
    let lib_dir = PathBuf::from(
        std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys did not report its libtorch directory"),
    );
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    compile_jpeg_shim();
    #[cfg(feature = "mpi")]
    compile_mpi_shim();
    println!("cargo:rustc-env=RTRAIN_GIT_REVISION={}", git_revision());
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}

/// The commit being built, `-dirty` with uncommitted changes, for run manifests; the
/// `RTRAIN_GIT_REVISION_OVERRIDE` variable when set; "unknown" outside a git checkout (e.g. a
/// container build that copies no .git).
fn git_revision() -> String {
    println!("cargo:rerun-if-env-changed=RTRAIN_GIT_REVISION_OVERRIDE");
    if let Ok(revision) = std::env::var("RTRAIN_GIT_REVISION_OVERRIDE") {
        // A copy of the source without .git (scripts/build-gpu-binary) says where it came from.
        return revision;
    }
    for path in [".git/HEAD", ".git/index"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git").args(args).output().ok().filter(|o| o.status.success())
    };
    let Some(head) = git(&["rev-parse", "HEAD"]) else { return "unknown".to_string() };
    let revision = String::from_utf8_lossy(&head.stdout).trim().to_string();
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|o| !o.stdout.is_empty());
    if dirty {
        format!("{revision}-dirty")
    } else {
        revision
    }
}

/// The JPEG shim and, after it, libjpeg-turbo's static library, found where the C compiler
/// finds it.
fn compile_jpeg_shim() {
    let build = cc::Build::new();
    build.clone().file("src/shim/jpeg_shim.c").compile("rtrain_jpeg_shim");
    let compiler = build.get_compiler();
    let found = std::process::Command::new(compiler.path())
        .arg("-print-file-name=libjpeg.a")
        .output()
        .ok()
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        .filter(|path| path.is_absolute() && path.is_file());
    let Some(archive) = found else {
        panic!("libjpeg.a not found: install libjpeg-turbo's development files (Debian: libjpeg62-turbo-dev; scripts/setup does)");
    };
    let dir = archive.parent().expect("an absolute file path has a parent");
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=static=jpeg");
}

/// `MPI_IN_PLACE` for the MPI library the `mpi` crate found (the same probe it uses).
#[cfg(feature = "mpi")]
fn compile_mpi_shim() {
    let library = match build_probe_mpi::probe() {
        Ok(library) => library,
        Err(errors) => panic!("the mpi feature needs an MPI library (e.g. libopenmpi-dev): {errors:?}"),
    };
    let mut build = cc::Build::new();
    build.file("src/shim/mpi_shim.c");
    for include in &library.include_paths {
        build.include(include);
    }
    build.compile("rtrain_mpi_shim");
}
