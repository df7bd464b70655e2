//! The GPU scripts on a machine without a GPU: `scripts/gpu-check` must stop at its first check
//! with a message that says what is missing, having read rtrain's own report correctly (so that
//! on a GPU machine it gets as far as the GPU lets it).

use std::path::Path;
use std::process::Command;

use crate::common;

fn gpu_check(path: &str, out: &Path) -> std::process::Output {
    Command::new(common::repo().join("scripts/gpu-check"))
        .args(["--rtrain", env!("CARGO_BIN_EXE_rtrain"), "--out"])
        .arg(out)
        .env("PATH", path)
        .env("PYTHON", common::python())
        .output()
        .expect("run scripts/gpu-check")
}

#[test]
fn gpu_check_without_a_driver_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let output = gpu_check("/usr/bin:/bin", &dir.path().join("out"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("nvidia-smi not found"), "{stderr}");
}

#[test]
fn gpu_check_with_a_driver_but_no_cuda_stops_at_the_first_check() {
    let dir = tempfile::tempdir().unwrap();
    // A driver's nvidia-smi answering for a GPU that libtorch cannot use (a CPU build).
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("nvidia-smi");
    std::fs::write(&fake, "#!/bin/sh\necho 'NVIDIA H200, 143771 MiB, 580.65.06'\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = dir.path().join("out");
    let output = gpu_check(&format!("{}:/usr/bin:/bin", bin.display()), &out);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("1. CUDA available: False, 0 device(s)"), "{stdout}");
    assert!(stdout.contains("NCCL: no ("), "{stdout}");
    let report = std::fs::read_to_string(out.join("gpu-check.md")).unwrap();
    assert!(report.contains("- GPU: NVIDIA H200, 143771 MiB, 580.65.06"), "{report}");
    assert!(report.contains("1. CUDA available: False"), "{report}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("rtrain cannot use CUDA here"));
    assert!(!out.join("agree.json").exists(), "no GPU step without CUDA");
}
