//! Reproducible runs: the same seed gives the same weights hash, `rtrain verify` catches a
//! changed byte in a checkpoint or a data file, and `rtrain reproduce` re-runs a run from its
//! manifest and says whether it matched.

use crate::common;

use std::path::{Path, PathBuf};

use predicates::prelude::*;
use rtrain::run_dir::manifest::Manifest;

/// Trains 2 short epochs of ResNet-18 on `data` into `dir/name` with `seed`.
fn train(dir: &Path, data: &Path, name: &str, seed: u64) -> PathBuf {
    common::rtrain(dir)
        .args(["train", "--run-dir", name])
        .args(["--set", &format!("data.root={:?}", data.to_string_lossy())])
        .args(["--set", "data.image_size=32", "--set", "data.batch_size=16", "--set", "train.epochs=2"])
        .args(["--set", "train.threads=1", "--set", &format!("run.seed={seed}")])
        .assert()
        .success();
    dir.join(name)
}

fn weights_hash(run: &Path) -> String {
    Manifest::read(run).unwrap().weights.expect("final weights in the manifest").sha256
}

/// Flips one byte of `file` in place.
fn flip_byte(file: &Path, offset: usize) {
    let mut bytes = std::fs::read(file).unwrap();
    bytes[offset] ^= 0x5a;
    std::fs::write(file, bytes).unwrap();
}

#[test]
fn same_seed_same_weights_and_verify_names_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 16, 4, 40);
    let a = train(dir.path(), &data, "a", 0);
    let b = train(dir.path(), &data, "b", 0);
    let c = train(dir.path(), &data, "c", 1);
    assert_eq!(weights_hash(&a), weights_hash(&b), "same seed, different weights");
    assert_ne!(weights_hash(&a), weights_hash(&c), "the seed changes nothing?");
    let manifest = Manifest::read(&a).unwrap();
    assert_eq!(manifest.epochs.len(), 2);
    assert_eq!(manifest.data[0].images, 64);
    assert!(manifest.checkpoints.keys().any(|k| k.ends_with("best.safetensors")));

    common::rtrain(dir.path())
        .args(["verify", "a"])
        .assert()
        .success()
        .stdout(predicate::str::contains("MISMATCH").not());

    // The report of two runs side by side: markdown with both, plots as SVG and PNG, CSV.
    common::rtrain(dir.path()).args(["report", "a", "c", "--out", "report"]).assert().success();
    let report = dir.path().join("report");
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(md.contains("## a") && md.contains("## c") && md.contains(&weights_hash(&a)[..12]), "{md}");
    for plot in ["loss", "accuracy", "lr", "throughput", "confusion-a", "confusion-c"] {
        let png = std::fs::read(report.join(format!("{plot}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 5000, "{plot}.png");
        assert!(std::fs::read_to_string(report.join(format!("{plot}.svg"))).unwrap().contains("<svg"));
    }
    let csv = std::fs::read_to_string(report.join("epochs.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 2 + 2, "a header and two epochs per run:\n{csv}");

    // A changed byte in a checkpoint: named, non-zero exit.
    let name = manifest.checkpoints.keys().next().unwrap();
    let checkpoint = a.join(name);
    flip_byte(&checkpoint, 4096);
    common::rtrain(dir.path())
        .args(["verify", "a"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains(format!("MISMATCH  checkpoint a/{name}")));
    flip_byte(&checkpoint, 4096);

    // A changed byte in one training image: that file is named.
    let image = manifest.data[0].root.join(manifest.data[0].files.keys().nth(5).unwrap());
    flip_byte(&image, 200);
    common::rtrain(dir.path())
        .args(["verify", "a"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains(format!("MISMATCH  train data {}", image.display())))
        .stdout(predicate::str::contains("MISMATCH").count(1));
    flip_byte(&image, 200);
    common::rtrain(dir.path()).args(["verify", "a"]).assert().success();
}

#[test]
fn reproduce_reruns_from_the_manifest_and_detects_a_difference() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 16, 4, 40);
    let run = train(dir.path(), &data, "run", 3);

    common::rtrain(dir.path())
        .args(["reproduce", "run", "--epochs", "1", "--out", "first-epoch"])
        .assert()
        .success()
        .stdout(predicate::str::contains("epoch 1: ok").and(predicate::str::contains("reproduced")));
    common::rtrain(dir.path()).args(["reproduce", "run"]).assert().success().stdout(
        predicate::str::contains(format!("final weights: identical (sha256 {})", weights_hash(&run))),
    );

    // Doctor the original's record of epoch 2 by one part in a million: the re-run must disagree.
    let path = run.join("manifest.json");
    let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let loss = manifest["epochs"][1]["train_loss"].as_f64().unwrap();
    manifest["epochs"][1]["train_loss"] = serde_json::json!(loss * 1.000001);
    std::fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    common::rtrain(dir.path())
        .args(["reproduce", "run", "--out", "again"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("epoch 2: DIFF").and(predicate::str::contains("NOT reproduced")));
}
