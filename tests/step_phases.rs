//! Where every rank's time goes, on a real 2-rank run under `mpirun`: each step's phases add up
//! to its wall time; the step trace loads in Holistic Trace Analysis with the same per-phase
//! totals as metrics.jsonl; a rank slowed on purpose in the second epoch is named the straggler
//! in the log and by `report --scaling`, and the other rank's all-reduce wait grows by the
//! injected delay against the first epoch; a synthetic-input run has no data wait.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

/// The delay rank 1 waits for each batch in the second epoch: long against a step of the head
/// alone at 16 px, so that the other tests' load on the cores, which can keep one rank waiting
/// for the other for a good part of a step, moves the waits by far less than the 20% allowed.
const DELAY_S: f64 = 0.400;

/// 2 ranks x batch 8 over 96 images: 6 steps an epoch, 2 epochs, a report every 3 steps, and a
/// trace of the 3 steps after the first report (global steps 4-6, the second report's window).
fn settings(data: &Path) -> Vec<String> {
    [
        format!("data.root={:?}", data.to_string_lossy()),
        "data.image_size=16".into(),
        "data.batch_size=8".into(),
        "data.workers=0".into(),
        "train.precision=\"fp32\"".into(),
        "train.threads=1".into(),
        "train.epochs=2".into(),
        "train.log_every_steps=3".into(),
        "log.trace_steps=3".into(),
        "log.tensorboard=false".into(),
        "checkpoint.keep_best=false".into(),
        // Only the head trains: a step is a forward pass and a small all-reduce, milliseconds
        // that the other tests' load on the cores can stretch by little, against the delay.
        "model.freeze_backbone=true".into(),
        // Rank 0's own bookkeeping between steps (the metrics, the stop snapshot) is a good
        // part of such short steps, and the load can make one rank slower than the other: only
        // a rank at three times the other's work is a straggler here.
        "log.straggler_threshold=2.0".into(),
    ]
    .into_iter()
    .flat_map(|setting| ["--set".to_string(), setting])
    .collect()
}

/// `mpirun -np 2 rtrain train` with rank 1's data delayed as `delay` says
/// (`RTRAIN_TEST_DATA_DELAY_MS`); returns the run directory and the log.
fn train_two_ranks(dir: &Path, data: &Path, name: &str, delay: &str) -> (PathBuf, String) {
    let mut command = common::mpirun(dir);
    command.args(["-np", "2", "-x", &format!("RTRAIN_TEST_DATA_DELAY_MS={delay}")]);
    command.args([env!("CARGO_BIN_EXE_rtrain"), "train", "--run-dir", name]).args(settings(data));
    let output = common::assert_success(command.output().unwrap(), &format!("mpirun -np 2 train {name}"));
    (dir.join(name), String::from_utf8_lossy(&output.stderr).into_owned())
}

fn records(run: &Path, kind: &str) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|record| record["kind"] == kind)
        .collect()
}

const PHASES: [&str; 7] = ["data", "copy", "forward", "backward", "comm_wait", "optimizer", "other"];

/// A phase's seconds per step on `rank` (of 2) from a phase report's rank-0 value and extremes.
fn on_rank(stat: &Value, rank: usize) -> f64 {
    match rank {
        0 => stat["rank0"].as_f64().unwrap(),
        _ if stat["max_rank"] == 1 => stat["max"].as_f64().unwrap(),
        _ => stat["min"].as_f64().unwrap(),
    }
}

#[test]
fn phases_add_up_load_in_hta_and_name_the_straggler() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 24, 8, 32);
    // Rank 1 waits longer for each batch from global step 7 on: the second epoch.
    let delay = format!("1:{}:6", DELAY_S * 1e3);
    let (run, log) = train_two_ranks(dir.path(), &data, "run", &delay);

    // Each report's phases, rank 0's, add up to the wall time of its steps within 2%.
    let steps = records(&run, "step");
    assert_eq!(steps.len(), 4, "{steps:?}");
    for record in &steps {
        let phases = &record["phases"];
        let sum: f64 = PHASES.iter().map(|p| phases[p]["rank0"].as_f64().unwrap()).sum::<f64>()
            * phases["steps"].as_f64().unwrap();
        let wall = record["seconds"].as_f64().unwrap();
        assert!(
            (sum - wall).abs() <= 0.02 * wall,
            "step {}: phases {sum} s vs wall {wall} s",
            record["global_step"]
        );
        assert!((phases["step"]["rank0"].as_f64().unwrap() * 3.0 - sum).abs() < 1e-9);
    }

    // The traces: Holistic Trace Analysis parses both ranks' files, and its per-phase totals
    // are the second report's (global steps 4-6) within 1%.
    let trace_dir = run.join("trace");
    for rank in 0..2 {
        assert!(trace_dir.join(format!("rank{rank}.pt.trace.json")).is_file());
    }
    let script = common::repo().join("tests/reference/hta_totals.py");
    let output = std::process::Command::new(common::python()).arg(&script).arg(&trace_dir).output().unwrap();
    let output = common::assert_success(output, "hta_totals.py");
    let hta: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(hta["ranks"], serde_json::json!([0, 1]));
    let window = &steps.iter().find(|r| r["global_step"] == 6).unwrap()["phases"];
    for rank in 0..2 {
        let totals = &hta["totals"][rank.to_string()];
        for phase in PHASES {
            let traced_us = totals[phase][0].as_f64().unwrap();
            // A span per lap: forward and backward take two laps a step.
            assert!(
                totals[phase][1].as_u64().unwrap() >= 3,
                "rank {rank} {phase}: a span per traced step at least"
            );
            let logged_us = on_rank(&window[phase], rank) * 3.0 * 1e6;
            assert!(
                (traced_us - logged_us).abs() <= 0.01 * logged_us.max(10.0),
                "rank {rank} {phase}: HTA {traced_us} us vs metrics.jsonl {logged_us} us"
            );
        }
        assert_eq!(totals["ProfilerStep#5"][1], 1);
        let buckets =
            totals.as_object().unwrap().keys().filter(|k| k.starts_with("all-reduce bucket")).count();
        assert!(buckets >= 1, "rank {rank}: the all-reduces of the buckets are traced: {totals}");
    }

    // The straggler, in the second epoch: rank 1, for its data; rank 0 waits in the all-reduce
    // for it by as much longer as rank 1 was delayed. (Compared over each epoch's second report,
    // steps 4-6 and 10-12: each epoch's first step on rank 0 starts after it wrote the epoch's
    // checkpoint, which rank 1 spends waiting for its data.)
    assert!(log.contains("epoch 2: straggler: rank 1 on node"), "{log}");
    assert!(!log.contains("epoch 1: straggler"), "{log}");
    let slow = &records(&run, "epoch")[1]["phases"];
    assert_eq!(slow["straggler"]["rank"], 1, "{slow}");
    assert_eq!(slow["straggler"]["phase"], "data", "{slow}");
    let window =
        |global_step: u64| steps.iter().find(|r| r["global_step"] == global_step).unwrap()["phases"].clone();
    let grown = on_rank(&window(12)["comm_wait"], 0) - on_rank(&window(6)["comm_wait"], 0);
    eprintln!("rank 0's all-reduce wait grew by {grown:.4} s per step ({DELAY_S} s injected)");
    assert!(
        (grown - DELAY_S).abs() <= 0.2 * DELAY_S,
        "rank 0's all-reduce wait grew by {grown} s, not {DELAY_S}"
    );

    // report --scaling names it too (from the epochs after the first), and the time the
    // others wait for it.
    let mut command = common::rtrain(dir.path());
    command.args(["report", "--scaling"]).arg(&run);
    let table = String::from_utf8(command.assert().success().get_output().stdout.clone()).unwrap();
    assert!(table.contains("rank 1 on "), "{table}");
    let mut command = common::rtrain(dir.path());
    command.args(["report", "--scaling", "--json"]).arg(&run);
    let rows: Value = serde_json::from_slice(&command.assert().success().get_output().stdout).unwrap();
    let waiting = rows[0]["breakdown"]["waiting_for_slowest"].as_f64().unwrap();
    assert!(
        (waiting - DELAY_S).abs() <= 0.2 * DELAY_S,
        "waiting for the slowest {waiting} s per step: {rows}"
    );
}

/// `data.source = "synthetic"` trains on tensors made once: no data wait, the validation split
/// still evaluated.
#[test]
fn synthetic_input_has_no_data_wait() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 6, 2, 32);
    let output: Output = common::rtrain(dir.path())
        .args(["train", "--run-dir", "run", "--set", &format!("data.root={:?}", data.to_string_lossy())])
        .args([
            "--set",
            "data.source=\"synthetic\"",
            "--set",
            "data.batch_size=4",
            "--set",
            "data.image_size=32",
        ])
        .args(["--set", "train.epochs=1", "--set", "train.log_every_steps=2", "--set", "train.threads=1"])
        .output()
        .unwrap();
    common::assert_success(output, "synthetic-input training");
    let run = dir.path().join("run");
    let epoch = records(&run, "epoch").pop().unwrap();
    assert_eq!(epoch["val"]["samples"], 8);
    let phases = &epoch["phases"];
    assert_eq!(phases["steps"], 6);
    assert!(phases["data"]["rank0"].as_f64().unwrap() < 1e-3, "{phases}");
    assert!(phases["forward"]["rank0"].as_f64().unwrap() > 1e-3, "{phases}");
}
