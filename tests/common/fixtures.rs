//! What several tests need but none of them tests, made once per test binary and shared: a
//! synthetic tree, a tiny model trained on it, and the lock that keeps container builds one at
//! a time.
//! Each is made on first use, so a filtered run makes only what its tests ask for. A test that
//! checks training itself, or changes its data or run, trains its own.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A synthetic tree (4 classes, 2 training and 2 validation photos each, 32 pixels), made on
/// first use under Cargo's scratch directory for integration tests (replaced on each test run):
/// for the tests that read a tree and fail, or train a run of their own, before what they test.
/// Shared: read it, never write into it.
pub fn synth_tree() -> &'static Path {
    static TREE: OnceLock<PathBuf> = OnceLock::new();
    TREE.get_or_init(|| {
        let dir = scratch("synth-tree");
        super::synth(&dir, 2, 2, 32)
    })
}

/// A ResNet-18 trained for one epoch on `synth_tree()` (batch 4, one thread): what `predict`
/// and `eval` need to write their files, when what they predict is not what is tested.
pub struct TinyRun {
    /// The synthetic tree it was trained on, `synth_tree()`.
    pub data: PathBuf,
    /// The finished run directory (default checkpoints: `checkpoints/best.safetensors` too).
    pub run: PathBuf,
    /// Its final weights, `run/model.safetensors`.
    pub model: PathBuf,
}

/// The tiny run, trained on first use under Cargo's scratch directory for integration tests
/// (replaced on each test run). Shared: read it, never write into it.
pub fn tiny_run() -> &'static TinyRun {
    static RUN: OnceLock<TinyRun> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = scratch("tiny-run");
        let data = synth_tree().to_path_buf();
        let output = super::rtrain(&dir)
            .args(["train", "--run-dir", "run"])
            .args(["--set", &format!("data.root={:?}", data.display().to_string())])
            .args(["--set", "data.image_size=32", "--set", "data.batch_size=4"])
            .args(["--set", "train.epochs=1", "--set", "train.threads=1"])
            .output()
            .unwrap();
        super::assert_success(output, "rtrain train (the shared tiny run, tests/common/fixtures.rs)");
        let run = dir.join("run");
        TinyRun { data, model: run.join("model.safetensors"), run }
    })
}

/// An empty directory `name` under Cargo's scratch directory for integration tests, emptied of
/// what an earlier test run left there.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Held while `scripts/container build` runs, and while a test reads what it left in
/// target/container: every build writes there, so two at once (the Docker tier's image, the
/// Slurm tier's) would mix their files. A lock on a file, not a mutex, because scripts/test
/// runs the Docker tier in a process of its own beside the other tests.
pub struct ContainerBuild {
    _locked: std::fs::File,
}

/// Waits for [`ContainerBuild`], the lock on the container builds.
pub fn container_build() -> ContainerBuild {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("container-build.lock");
    let file = std::fs::File::create(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    // SAFETY: flock on a descriptor this function owns; released when ContainerBuild drops it.
    let locked = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX) };
    assert_eq!(locked, 0, "flock {}: {}", path.display(), std::io::Error::last_os_error());
    ContainerBuild { _locked: file }
}
