//! TensorBoard event files (`log.tensorboard`), read back with TensorBoard's own reader
//! (`event_accumulator`): every scalar equal to what `metrics.jsonl` holds, from a finished run,
//! from a run still in progress, and from a run killed and resumed (no step twice).

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

const QUICK: &[&str] = &[
    "--set",
    "data.image_size=32",
    "--set",
    "data.batch_size=8",
    "--set",
    "train.epochs=2",
    "--set",
    "train.threads=1",
    "--set",
    "checkpoint.every_steps=1",
];

/// What TensorBoard's reader finds in `run/tensorboard`.
fn read_events(run: &Path) -> Value {
    let output = std::process::Command::new(common::python())
        .arg(common::repo().join("tests/reference/tensorboard_reader.py"))
        .arg(run.join("tensorboard"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn records(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// (tag, global step, value) for each scalar `metrics.jsonl`'s records give TensorBoard.
fn expected_scalars(records: &[Value]) -> Vec<(String, u64, f32)> {
    let mut expected = Vec::new();
    for r in records {
        let step = r["global_step"].as_u64().unwrap();
        let mut add = |tag: &str, value: &Value| {
            if let Some(value) = value.as_f64() {
                expected.push((tag.to_string(), step, value as f32));
            }
        };
        if r["kind"] == "step" {
            for (tag, key) in [
                ("loss", "loss"),
                ("accuracy", "accuracy"),
                ("lr", "lr"),
                ("images_per_second", "images_per_second"),
            ] {
                add(&format!("train/{tag}"), &r[key]);
            }
        } else {
            add("epoch/epoch", &Value::from(r["epoch"].as_u64().unwrap() + 1));
            for key in ["train_loss", "train_accuracy", "train_images_per_second", "seconds", "lr"] {
                add(&format!("epoch/{key}"), &r[key]);
            }
            for key in ["loss", "top1", "macro_f1", "balanced_accuracy", "mean_rank_error", "quadratic_kappa"]
            {
                add(&format!("val/{key}"), &r["val"][key]);
            }
        }
    }
    expected
}

/// Every scalar of `records` is in `events` at its step with its value (as f32), and, with
/// `exactly`, nothing else is there (each step of each tag once).
fn assert_scalars(events: &Value, records: &[Value], exactly: bool) {
    let expected = expected_scalars(records);
    assert!(expected.len() > 20, "{expected:?}");
    for (tag, step, value) in &expected {
        let found: Vec<f32> = events["scalars"][tag]
            .as_array()
            .unwrap_or_else(|| panic!("no tag {tag}: {events}"))
            .iter()
            .filter(|e| e[0].as_u64() == Some(*step))
            .map(|e| e[1].as_f64().unwrap() as f32)
            .collect();
        assert_eq!(found, vec![*value], "{tag} at step {step}");
    }
    if exactly {
        let total: usize =
            events["scalars"].as_object().unwrap().values().map(|v| v.as_array().unwrap().len()).sum();
        assert_eq!(total, expected.len(), "scalars beyond metrics.jsonl's: {events}");
    }
}

#[test]
fn tensorboard_reads_what_metrics_jsonl_holds_live_finished_and_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 24, 6, 32);
    let data_arg = format!("data.root={:?}", data.display().to_string());
    let run = dir.path().join("run");
    // Started, read while it runs, killed once a mid-run checkpoint exists, then resumed.
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("rtrain"))
        .current_dir(dir.path())
        .args(["train", "--run-dir", "run", "--set", &data_arg, "--set", "train.log_every_steps=1"])
        .args(QUICK)
        .args(["--set", "checkpoint.keep_last=100"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !run.join("checkpoints/step-000000014.safetensors").exists() {
        assert!(Instant::now() < deadline, "no checkpoint appeared");
        assert!(child.try_wait().unwrap().is_none(), "training ended before it could be read live");
        std::thread::sleep(Duration::from_millis(5));
    }
    // metrics.jsonl first: the event file is written before it, so it holds at least as much.
    let live = records(&run);
    let events = read_events(&run);
    assert!(child.try_wait().unwrap().is_none(), "the run finished before it was read");
    assert!(live.iter().any(|r| r["kind"] == "epoch"), "read after the first epoch: {live:?}");
    assert_scalars(&events, &live, false);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!run.join("summary.json").exists(), "the run was killed before it finished");

    let resumed = common::rtrain(dir.path())
        .args(["train", "--run-dir", "run", "--set", &data_arg, "--set", "train.log_every_steps=1"])
        .args(QUICK)
        .args(["--set", "checkpoint.keep_last=100", "--resume", "auto"])
        .output()
        .unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let finished = records(&run);
    let events = read_events(&run);
    assert_scalars(&events, &finished, true);
    assert_eq!(
        std::fs::read_dir(run.join("tensorboard")).unwrap().count(),
        1,
        "one event file after the resume"
    );
    // The configuration as text, and a confusion image per epoch.
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert_eq!(events["text"]["config"][0].as_str(), Some(config.as_str()));
    let images = events["images"]["val/confusion"].as_array().unwrap();
    let epoch_steps: Vec<u64> = finished
        .iter()
        .filter(|r| r["kind"] == "epoch")
        .map(|r| r["global_step"].as_u64().unwrap())
        .collect();
    assert_eq!(images.iter().map(|i| i[0].as_u64().unwrap()).collect::<Vec<_>>(), epoch_steps);
    assert!(images.iter().all(|i| i[1] == 800 && i[2] == 480 && i[3].as_u64().unwrap() > 1000), "{images:?}");

    // log.tensorboard = false writes none.
    let off = common::rtrain(dir.path())
        .args(["train", "--run-dir", "off", "--set", &data_arg, "--set", "log.tensorboard=false"])
        .args(QUICK)
        .output()
        .unwrap();
    assert!(off.status.success(), "{}", String::from_utf8_lossy(&off.stderr));
    assert!(!dir.path().join("off/tensorboard").exists());
}
