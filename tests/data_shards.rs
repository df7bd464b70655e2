//! Shards end to end with the real binary: `rtrain data prepare` writes WebDataset shards that
//! Python's `webdataset` reads sample for sample; `rtrain data verify` names a flipped shard;
//! training from shards computes exactly what training from the image tree computes, also
//! with 2 ranks staging the shards to a node-local directory; and a shard damaged at its source
//! fails the staging job promptly, naming the shard, instead of hanging it.

// Helpers of the tier-gated tests are unused in the fast loop (`cargo test` without features).
#![cfg_attr(not(feature = "all-tiers"), allow(dead_code, unused_imports))]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// 4 classes x 24 training and 8 validation JPEGs.
fn tree(dir: &Path) -> std::path::PathBuf {
    common::synth(dir, 24, 8, 40)
}

fn prepare(dir: &Path, data: &Path) -> std::path::PathBuf {
    let shards = dir.join("shards");
    common::rtrain(dir)
        .args(["data", "prepare"])
        .arg(data)
        .arg(&shards)
        .args(["--shard-mb", "1"])
        .assert()
        .success();
    shards
}

fn weights_sha256(run: &Path) -> String {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("manifest.json")).unwrap()).unwrap();
    manifest["weights"]["sha256"].as_str().unwrap().to_string()
}

#[cfg(feature = "test-reference")]
#[test]
fn webdataset_reads_every_sample_and_verify_names_a_flipped_shard() {
    let dir = tempfile::tempdir().unwrap();
    let data = tree(dir.path());
    let shards = prepare(dir.path(), &data);
    let output = std::process::Command::new(common::python())
        .arg(common::repo().join("tests/reference/read_webdataset.py"))
        .arg(&shards)
        .arg("train")
        .output()
        .unwrap();
    let output = common::assert_success(output, "read_webdataset.py");
    let read: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    // Expected from the source tree, independently: key train-<index in ImageFolder order>.
    let mut classes: Vec<String> = std::fs::read_dir(data.join("train"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    classes.sort();
    let mut expected = BTreeMap::new();
    for (label, class) in classes.iter().enumerate() {
        let mut files: Vec<_> =
            std::fs::read_dir(data.join("train").join(class)).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for file in files {
            let sha256 = hex::encode(Sha256::digest(std::fs::read(&file).unwrap()));
            let path = file.strip_prefix(&data).unwrap().to_str().unwrap().to_string();
            expected.insert(
                format!("train-{:09}", expected.len()),
                serde_json::json!({"cls": label, "sha256": sha256, "path": path}),
            );
        }
    }
    assert_eq!(read.len(), 96);
    assert_eq!(read, expected);

    common::rtrain(dir.path()).args(["data", "verify"]).arg(&shards).assert().success();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shards.join("shards.json")).unwrap()).unwrap();
    let victim = manifest["splits"]["val"]["shards"][0]["name"].as_str().unwrap().to_string();
    let mut bytes = std::fs::read(shards.join(&victim)).unwrap();
    bytes[2000] ^= 0x10;
    std::fs::write(shards.join(&victim), bytes).unwrap();
    let output = common::rtrain(dir.path()).args(["data", "verify"]).arg(&shards).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(stdout.matches("BAD").count(), 1, "{stdout}");
    assert!(stdout.contains(&format!("BAD {victim}")), "{stdout}");
}

const TRAIN: [&str; 8] = [
    "train",
    "--set",
    "train.epochs=1",
    "--set",
    "data.image_size=32",
    "--set",
    "data.batch_size=16",
    "--set",
];

#[cfg(feature = "test-mpi")]
#[test]
fn training_from_shards_equals_training_from_the_tree_also_staged_on_two_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let data = tree(dir.path());
    let shards = prepare(dir.path(), &data);
    let train = |root: &Path, run: &str| {
        common::rtrain(dir.path())
            .args(TRAIN)
            .arg(format!("data.root={}", root.display()))
            .args(["--run-dir", run])
            .assert()
            .success();
        weights_sha256(&dir.path().join(run))
    };
    let from_tree = train(&data, "run-tree");
    let from_shards = train(&shards, "run-shards");
    assert_eq!(from_tree, from_shards, "the same samples, decoded and augmented the same way");
    // One process (no MPI) stages too.
    let alone = dir.path().join("alone");
    common::rtrain(dir.path())
        .args(TRAIN)
        .arg(format!("data.root={}", shards.display()))
        .args(["--set", &format!("data.stage_dir={}", alone.display()), "--run-dir", "run-alone"])
        .assert()
        .success();
    assert_eq!(weights_sha256(&dir.path().join("run-alone")), from_shards);
    common::rtrain(dir.path()).args(["data", "verify"]).arg(staged_copy(&alone)).assert().success();

    // Two ranks: the tree read in place against the shards staged to a "node-local" directory.
    let two_ranks = |root: &Path, run: &str, extra: &[String]| {
        let output = common::mpirun(dir.path())
            .args(["-np", "2", env!("CARGO_BIN_EXE_rtrain")])
            .args(TRAIN)
            .arg(format!("data.root={}", root.display()))
            .args(extra)
            .args(["--set", "train.threads=1", "--run-dir", run])
            .output()
            .unwrap();
        common::assert_success(output, run);
        weights_sha256(&dir.path().join(run))
    };
    let local = dir.path().join("local");
    let staged =
        two_ranks(&shards, "run-staged", &["--set".into(), format!("data.stage_dir={}", local.display())]);
    assert_eq!(two_ranks(&data, "run-tree-2", &[]), staged);
    common::rtrain(dir.path()).args(["data", "verify"]).arg(staged_copy(&local)).assert().success();
    // The run records the lasting original, so `rtrain verify` works after the copy is gone.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("run-staged/manifest.json")).unwrap()).unwrap();
    let recorded = manifest["data"][0]["root"].as_str().unwrap_or_default().to_string();
    assert_eq!(Path::new(&recorded), shards.canonicalize().unwrap());
    std::fs::remove_dir_all(&local).unwrap();
    common::rtrain(dir.path()).arg("verify").arg(dir.path().join("run-staged")).assert().success();

    // A run directory that is the shard directory would overwrite its manifest: refused.
    let output = common::rtrain(dir.path())
        .args(TRAIN)
        .arg(format!("data.root={}", shards.display()))
        .arg("--run-dir")
        .arg(&shards)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("holds a shard set"), "{output:?}");
    common::rtrain(dir.path()).args(["data", "verify"]).arg(&shards).assert().success();
}

#[cfg(feature = "test-mpi")]
#[test]
fn a_damaged_source_shard_fails_the_staging_job_promptly_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = tree(dir.path());
    let shards = prepare(dir.path(), &data);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shards.join("shards.json")).unwrap()).unwrap();
    let victim = manifest["splits"]["train"]["shards"][0]["name"].as_str().unwrap().to_string();
    let mut bytes = std::fs::read(shards.join(&victim)).unwrap();
    bytes[1000] ^= 0x01;
    std::fs::write(shards.join(&victim), bytes).unwrap();
    let started = Instant::now();
    let output = common::mpirun(dir.path())
        .args(["-np", "2", env!("CARGO_BIN_EXE_rtrain")])
        .args(TRAIN)
        .arg(format!("data.root={}", shards.display()))
        .args(["--set", &format!("data.stage_dir={}", dir.path().join("local").display())])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&victim) && stderr.contains("staging data on node 0"), "{stderr}");
    let local = dir.path().join("local");
    assert!(!local.exists() || !staged_copy(&local).join(&victim).exists());
}

/// The one staged copy under a `data.stage_dir` (named after the shard folder plus a hash).
fn staged_copy(stage_dir: &Path) -> std::path::PathBuf {
    let copies: Vec<_> = std::fs::read_dir(stage_dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert!(copies[0].file_name().unwrap().to_string_lossy().starts_with("shards-"), "{copies:?}");
    copies[0].clone()
}

#[test]
fn an_undecodable_image_fails_the_run_naming_it_or_is_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let data = tree(dir.path());
    let class = std::fs::read_dir(data.join("train")).unwrap().next().unwrap().unwrap().path();
    let victim = std::fs::read_dir(&class).unwrap().next().unwrap().unwrap().path();
    std::fs::write(&victim, b"\xff\xd8\xff\xe0 not really a JPEG").unwrap();
    let root = format!("data.root={}", data.display());

    let failed =
        common::rtrain(dir.path()).args(TRAIN).arg(&root).args(["--run-dir", "fail"]).output().unwrap();
    assert_eq!(failed.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(stderr.contains(&*victim.to_string_lossy()), "{stderr}");

    let skipped = common::rtrain(dir.path())
        .args(TRAIN)
        .arg(&root)
        .args(["--set", "data.on_bad_sample=skip", "--run-dir", "skip"])
        .output()
        .unwrap();
    let skipped = common::assert_success(skipped, "train with on_bad_sample=skip");
    assert!(String::from_utf8_lossy(&skipped.stderr).contains("skipped 1 undecodable training samples"));
    let metrics = std::fs::read_to_string(dir.path().join("skip/metrics.jsonl")).unwrap();
    let epoch: serde_json::Value = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["kind"] == "epoch")
        .unwrap();
    assert_eq!(epoch["skipped_samples"], 1);
}
