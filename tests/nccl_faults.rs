//! NCCL's set-up and watchdog under real `mpirun -np 2`, over the fake CUDA/NCCL layer of
//! `examples/nccl_faults.rs` (no GPU here): for each failure point, every rank falls back to
//! MPI together, or the whole job ends within seconds naming the rank and cause; never a hang.
//! Without a fault, rtrain's buckets go through the NCCL path (events on the compute stream,
//! the all-reduce on its own stream, the compute stream waiting before the optimizer) and the
//! averaged gradients equal MPI's.

use crate::common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The example binary, built by `cargo test` beside the test binaries.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
    let path = profile.join("examples/nccl_faults");
    assert!(
        path.exists(),
        "{} is missing: cargo test builds it (or cargo build --release --examples)",
        path.display()
    );
    path
}

struct Outcome {
    success: bool,
    stdout: String,
    stderr: String,
    seconds: f64,
}

impl Outcome {
    fn lines_with(&self, text: &str) -> usize {
        self.stdout.lines().chain(self.stderr.lines()).filter(|l| l.contains(text)).count()
    }
}

/// `mpirun -np 2 nccl_faults ARGS`, ended by force after 60 s (a hang fails the test).
fn job(args: &[&str]) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::mpirun(dir.path());
    command.args(["-np", "2"]).arg(example()).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = command.spawn().expect("start mpirun");
    let status = common::wait_within(&mut child, Duration::from_secs(60), "the fake NCCL job");
    let seconds = started.elapsed().as_secs_f64();
    let read = |pipe: Option<&mut dyn std::io::Read>| {
        let mut text = String::new();
        if let Some(pipe) = pipe {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    };
    let stdout = read(child.stdout.as_mut().map(|p| p as &mut dyn std::io::Read));
    let stderr = read(child.stderr.as_mut().map(|p| p as &mut dyn std::io::Read));
    eprintln!(
        "nccl_faults {args:?}: {} after {seconds:.1} s\n{stdout}{stderr}",
        if status.success() { "ok" } else { "failed" }
    );
    Outcome { success: status.success(), stdout, stderr, seconds }
}

#[test]
fn without_a_fault_buckets_take_the_nccl_path_and_average_like_mpi() {
    let out = job(&["none"]);
    assert!(out.success);
    assert_eq!(out.lines_with("reducer: nccl"), 2, "{}", out.stdout);
    // 3 parameters, one bucket each, 6 steps.
    assert_eq!(out.lines_with("18 fake NCCL all-reduces"), 2, "{}", out.stdout);
    assert_eq!(out.lines_with("gradients agree"), 2, "{}", out.stdout);
}

/// Stages before NCCL's communicator exists that every rank can survive: all fall back to MPI
/// together (a rank alone would wait in a broadcast or in ncclCommInitRank for ever).
#[test]
fn a_missing_library_or_unique_id_makes_every_rank_fall_back_to_mpi() {
    for (args, stage) in [
        (&["load", "1"], "loading NCCL failed on rank 1"),
        (&["unique-id", "0"], "creating NCCL's unique id failed on rank 0"),
    ] {
        let out = job(args);
        assert!(out.success, "{args:?}");
        assert!(
            out.stderr.contains(stage) && out.stderr.contains("every rank sends gradients through MPI"),
            "{}",
            out.stderr
        );
        assert_eq!(out.lines_with("reducer: mpi"), 2, "{args:?}: {}", out.stdout);
        assert_eq!(out.lines_with("gradients agree"), 2, "{args:?}: {}", out.stdout);
    }
}

/// Faults that make the GPUs unusable as configured: every rank stops with the same message,
/// naming the rank, within seconds.
#[test]
fn a_gpu_that_cannot_be_used_stops_every_rank_with_the_same_message() {
    for (args, said) in [
        (["set-device", "1"], "NCCL set-up failed (binding the GPU) on rank 1 on "),
        (["stream", "1"], "NCCL set-up failed (creating the communication stream) on rank 1 on "),
        (["same-gpu", "1"], "rank 0 and rank 1 use the same GPU"),
        (["cpu", "1"], "ranks compute on different kinds of device: rank 1 on "),
    ] {
        let out = job(&args);
        assert!(!out.success, "{args:?}");
        assert_eq!(out.lines_with(said), 2, "{args:?}: every rank says it\n{}", out.stderr);
        assert!(out.seconds < 15.0, "{args:?}: ended after {:.1} s", out.seconds);
    }
}

/// ncclCommInitRank failing on rank 1 while rank 0 waits inside its own (as NCCL's peers do):
/// rank 1 ends the job. Stuck in it on every rank: the collective watchdog ends it after
/// dist.timeout_s (3 s in the example).
#[test]
fn a_failed_or_stuck_communicator_set_up_ends_the_job() {
    let out = job(&["init-fails", "1"]);
    assert!(!out.success);
    assert!(
        out.stderr.contains("rank 1 on ")
            && out.stderr.contains("ncclCommInitRank failed: unhandled system error"),
        "{}",
        out.stderr
    );
    assert!(out.seconds < 15.0, "ended after {:.1} s", out.seconds);

    let out = job(&["init-hangs", "1"]);
    assert!(!out.success);
    assert!(
        out.stderr.contains("in NCCL's set-up (ncclCommInitRank)")
            && out.stderr.contains("dist.timeout_s = 3"),
        "{}",
        out.stderr
    );
    assert!(out.seconds < 3.0 + 10.0 + 3.0, "ended after {:.1} s", out.seconds);
}

/// After 7 all-reduces (step 3 of 6) on rank 1: NCCL reports an asynchronous error, or a
/// bucket's all-reduce never completes on the GPU. The watchdog thread aborts the NCCL
/// communicator and ends the job, saying what it was doing.
#[test]
fn an_async_error_or_a_stalled_all_reduce_aborts_nccl_and_ends_the_job() {
    let out = job(&["async-error", "1", "7"]);
    assert!(!out.success);
    assert!(
        out.stderr.contains("rank 1 on ") && out.stderr.contains("NCCL reported remote process exited"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("during a training step (global step"), "{}", out.stderr);
    assert!(out.stderr.contains("fake: ncclCommAbort on rank 1"), "{}", out.stderr);
    assert!(out.seconds < 10.0, "ended after {:.1} s", out.seconds);

    let out = job(&["stall", "1", "7"]);
    assert!(!out.success);
    assert!(out.stderr.contains("has not completed on the GPU after 3 s"), "{}", out.stderr);
    assert!(out.stderr.contains("fake: ncclCommAbort on rank 1"), "{}", out.stderr);
    assert!(out.seconds < 3.0 + 10.0, "ended after {:.1} s", out.seconds);
}
