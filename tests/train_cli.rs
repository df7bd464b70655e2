//! End-to-end runs of the real binary: learning on real images, exact resume after a kill,
//! evaluation and prediction from checkpoints, and errors that name what is wrong.

// Helpers of the tier-gated tests are unused in the fast loop (`cargo test` without features).
#![cfg_attr(not(feature = "all-tiers"), allow(dead_code, unused_imports))]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use predicates::prelude::*;
use rtrain::run_dir::manifest::{Finding, Manifest};
use serde_json::Value;

fn summary(run_dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap()).unwrap()
}

/// A small synthetic damage set: 4 classes x 24 training and 8 validation images at 48px.
fn small_synth(dir: &Path) -> PathBuf {
    common::synth(dir, 24, 8, 48)
}

const QUICK: &[&str] = &[
    "--set",
    "data.image_size=32",
    "--set",
    "data.batch_size=16",
    "--set",
    "train.epochs=2",
    "--set",
    "optim.lr=0.02",
    "--set",
    "train.threads=2",
    "--set",
    "checkpoint.every_steps=1",
    "--set",
    "checkpoint.keep_last=2",
];

/// Per-epoch training loss from a run's metrics.jsonl.
fn epoch_losses(run_dir: &Path) -> Vec<f64> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|record| record["kind"] == "epoch")
        .map(|record| record["train_loss"].as_f64().unwrap())
        .collect()
}

/// Real photos (a Fashion-MNIST subset): the model learns (top-1 >= 0.70, chance is 0.10) in
/// fp32, and bf16 autocast with channels-last reaches the same accuracy within 0.03 along a
/// close loss curve. A third of the documented subset for 3 of its 4 epochs: on a CPU without
/// native bf16 (AVX2), autocast emulates it at a quarter of fp32's speed, and this test was
/// CI's longest. Measured there (AVX2 kernels, seeds 1, 2, 3): top-1 0.762, 0.750, 0.735 in
/// fp32 and 0.762, 0.741, 0.750 in bf16, epoch losses within 3.5%; with AVX-512 and native
/// bf16 (seed 0): 0.733 fp32, 0.739 bf16.
#[cfg(feature = "test-reference")]
#[test]
fn fashion_mnist_subset_learns_in_fp32_and_bf16_alike() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::fashion_mnist_subset(dir.path(), 1000);
    let mut results = Vec::new();
    for (precision, channels_last) in [("fp32", "false"), ("bf16", "true")] {
        let run = dir.path().join(precision);
        common::rtrain(dir.path())
            .args(["train", "--config"])
            .arg(common::repo().join("configs/fashion-mnist.toml"))
            .arg("--set")
            .arg(format!("data.root={:?}", data.display().to_string()))
            .arg("--set")
            .arg(format!("train.precision={precision}"))
            .arg("--set")
            .arg(format!("train.channels_last={channels_last}"))
            .args(["--set", "train.epochs=3"])
            .arg("--run-dir")
            .arg(&run)
            .assert()
            .success()
            .stderr(predicate::str::contains(format!("compute: {precision}")));
        let summary = summary(&run);
        let top1 = summary["final_eval"]["top1"].as_f64().unwrap();
        println!(
            "Fashion-MNIST subset, {precision}: validation top-1 {top1:.4}, {:.1} img/s, {:.1}s",
            summary["train_images_per_second"].as_f64().unwrap(),
            summary["wall_seconds"].as_f64().unwrap()
        );
        assert_eq!(summary["classes"][9], "9-ankle-boot");
        results.push((top1, epoch_losses(&run)));
    }
    let (fp32, bf16) = (&results[0], &results[1]);
    assert!(fp32.0 >= 0.70, "fp32 validation top-1 {} < 0.70", fp32.0);
    assert!((fp32.0 - bf16.0).abs() <= 0.03, "top-1 fp32 {} vs bf16 {}", fp32.0, bf16.0);
    assert_eq!(fp32.1.len(), 3);
    for (epoch, (a, b)) in fp32.1.iter().zip(&bf16.1).enumerate() {
        assert!((a - b).abs() <= 0.15 * a, "epoch {epoch} train loss fp32 {a} vs bf16 {b}");
    }
}

/// `rtrain data import-idx` on Debian's Fashion-MNIST (the first 50 test images): each PNG
/// holds its item's exact pixels in the folder of its label, read here from the IDX files
/// with flate2 (the first item is an ankle boot, as every Fashion-MNIST tutorial shows).
#[cfg(feature = "test-reference")]
#[test]
fn import_idx_writes_real_fashion_mnist_pixel_for_pixel() {
    let gunzip = |file: &str| {
        let mut bytes = Vec::new();
        let path = common::fashion_mnist(file);
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap()),
            &mut bytes,
        )
        .unwrap();
        bytes
    };
    let (images, labels) = (gunzip("t10k-images-idx3-ubyte.gz"), gunzip("t10k-labels-idx1-ubyte.gz"));
    let be32 = |bytes: &[u8], at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!((be32(&labels, 0), be32(&labels, 4)), (0x801, 10_000), "t10k labels header");
    assert_eq!(
        (be32(&images, 0), be32(&images, 4), be32(&images, 8), be32(&images, 12)),
        (0x803, 10_000, 28, 28)
    );
    let dir = tempfile::tempdir().unwrap();
    common::rtrain(dir.path())
        .args(["data", "import-idx"])
        .arg(common::fashion_mnist("t10k-images-idx3-ubyte.gz"))
        .arg(common::fashion_mnist("t10k-labels-idx1-ubyte.gz"))
        .arg("out")
        .args(["--split", "val", "--limit", "50"])
        .assert()
        .success();
    let split = dir.path().join("out/val");
    let mut folders: Vec<String> =
        std::fs::read_dir(&split).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    folders.sort();
    assert_eq!(folders.len(), 10, "{folders:?}");
    assert_eq!(folders[usize::from(labels[8])], "9-ankle-boot", "the first item's folder");
    let written: usize = folders.iter().map(|f| std::fs::read_dir(split.join(f)).unwrap().count()).sum();
    assert_eq!(written, 50);
    for item in 0..50 {
        let label = usize::from(labels[8 + item]);
        let png = split.join(&folders[label]).join(format!("{item:05}.png"));
        let image = image::open(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display())).to_luma8();
        assert_eq!(image.dimensions(), (28, 28));
        let expected = &images[16 + item * 784..16 + (item + 1) * 784];
        assert!(
            image.as_raw() == expected,
            "{}: pixels differ from item {item} of the IDX file",
            png.display()
        );
    }
}

#[test]
fn resume_after_kill_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let data = small_synth(dir.path());
    let data_arg = format!("data.root={:?}", data.display().to_string());

    let straight = dir.path().join("straight");
    common::rtrain(dir.path())
        .arg("train")
        .args(QUICK)
        .args(["--set", &data_arg])
        .arg("--run-dir")
        .arg(&straight)
        .assert()
        .success();

    // Same run, killed mid-epoch once a few step checkpoints exist, then resumed. (It keeps
    // all its checkpoints so that the one it resumed from can be inspected afterwards.)
    let killed = dir.path().join("killed");
    let keep_all = "checkpoint.keep_last=100";
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("rtrain"))
        .current_dir(dir.path())
        .arg("train")
        .args(QUICK)
        .args(["--set", &data_arg, "--set", keep_all])
        .arg("--run-dir")
        .arg(&killed)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !killed.join("checkpoints/step-000000002.safetensors").exists() {
        assert!(Instant::now() < deadline, "no checkpoint appeared");
        assert!(child.try_wait().unwrap().is_none(), "training ended before it could be killed");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!killed.join("summary.json").exists(), "the run was killed before it finished");

    common::rtrain(dir.path())
        .arg("train")
        .args(QUICK)
        .args(["--set", &data_arg, "--set", keep_all, "--resume", "auto"])
        .arg("--run-dir")
        .arg(&killed)
        .assert()
        .success()
        .stderr(predicate::str::contains("resumed from"));
    let resumed = summary(&killed);
    let from = PathBuf::from(resumed["resumed_from"].as_str().expect("resumed_from"));
    let meta = rtrain::run_dir::checkpoint::read_meta(&from).unwrap();
    assert!(meta.step_in_epoch > 0, "the kill should have landed mid-epoch, got {meta:?}");
    assert_eq!(resumed["weights_sha256"], summary(&straight)["weights_sha256"], "resumed weights differ");
    assert_eq!(resumed["final_eval"], summary(&straight)["final_eval"]);
    // The resumed run's manifest tells the same story: same weights hash, the same epochs
    // (continued across the kill, not restarted), and the resumed checkpoints still verify.
    let (a, b) = (Manifest::read(&killed).unwrap(), Manifest::read(&straight).unwrap());
    assert_eq!(a.weights.as_ref().unwrap().sha256, b.weights.as_ref().unwrap().sha256);
    assert_eq!(
        a.epochs.iter().map(|e| e.train_loss).collect::<Vec<_>>(),
        b.epochs.iter().map(|e| e.train_loss).collect::<Vec<_>>()
    );
    assert!(rtrain::run_dir::manifest::verify(&killed).unwrap().iter().all(|f| matches!(f, Finding::Ok(_))));

    // A different seed really changes the weights, so the equality above means something.
    let other = dir.path().join("other-seed");
    common::rtrain(dir.path())
        .arg("train")
        .args(QUICK)
        .args(["--set", &data_arg, "--set", "run.seed=1"])
        .arg("--run-dir")
        .arg(&other)
        .assert()
        .success();
    assert_ne!(summary(&other)["weights_sha256"], summary(&straight)["weights_sha256"]);

    // Retention kept the newest two step checkpoints, plus best.
    let kept = rtrain::run_dir::RunPaths::new(&straight).step_checkpoints().unwrap();
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(straight.join("checkpoints/best.safetensors").exists());

    // Eval of the final checkpoint reproduces the run's own final evaluation.
    let last = &kept.last().unwrap().1;
    let output = common::rtrain(dir.path())
        .args(["eval", "--json", "--set", &data_arg, "--set", "data.image_size=32", "--checkpoint"])
        .arg(last)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let in_run = &summary(&straight)["final_eval"];
    assert_eq!(report["confusion"], in_run["confusion"]);
    // The summed loss may differ in the last float bits between processes (kernel choice).
    let (a, b) = (report["loss"].as_f64().unwrap(), in_run["loss"].as_f64().unwrap());
    assert!((a - b).abs() <= 1e-6 * b.abs(), "eval loss {a} vs in-run {b}");

    // Predict names one of the classes for a validation image.
    let image = std::fs::read_dir(data.join("val/3-severe")).unwrap().next().unwrap().unwrap().path();
    common::rtrain(dir.path())
        .args(["predict", "--set", "data.image_size=32", "--checkpoint"])
        .arg(last)
        .arg(&image)
        .assert()
        .success()
        .stdout(predicate::str::is_match(r"[0-3]-(none|minor|moderate|severe) 0\.\d{3}").unwrap());

    // A checkpoint of another architecture is refused, naming both.
    common::rtrain(dir.path())
        .arg("train")
        .args(QUICK)
        .args(["--set", &data_arg, "--set", "model.arch=resnet34", "--resume"])
        .arg(last)
        .arg("--run-dir")
        .arg(dir.path().join("wrong-arch"))
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("resnet18 with 4 classes").and(predicate::str::contains("resnet34")),
        );

    // Starting a fresh run over existing checkpoints is refused instead of mixing two runs.
    common::rtrain(dir.path())
        .arg("train")
        .args(QUICK)
        .args(["--set", &data_arg])
        .arg("--run-dir")
        .arg(&straight)
        .assert()
        .failure()
        .stderr(predicate::str::contains("--resume auto"));
}

#[cfg(feature = "test-reference")]
#[test]
fn frozen_backbone_keeps_pretrained_weights() {
    let dir = tempfile::tempdir().unwrap();
    let data = small_synth(dir.path());
    let pretrained = dir.path().join("imagenet-layout.safetensors");
    let script = format!(
        "import torch, torchvision\nfrom safetensors.torch import save_file\ntorch.manual_seed(2)\nm = torchvision.models.resnet18()\nsave_file({{k: v.contiguous() for k, v in m.state_dict().items()}}, {:?})",
        pretrained.display().to_string()
    );
    assert!(std::process::Command::new(common::python()).args(["-c", &script]).status().unwrap().success());
    let run = dir.path().join("run");
    common::rtrain(dir.path())
        .arg("train")
        .args(QUICK)
        .arg("--set")
        .arg(format!("data.root={:?}", data.display().to_string()))
        .arg("--set")
        .arg(format!("model.pretrained={:?}", pretrained.display().to_string()))
        .args(["--set", "model.freeze_backbone=true", "--set", "train.epochs=1", "--run-dir"])
        .arg(&run)
        .assert()
        .success()
        .stderr(predicate::str::contains("re-initialised [\"fc.bias\", \"fc.weight\"]"));
    let before = rtrain::util::files::read_safetensors(&pretrained).unwrap().tensors;
    let after = rtrain::util::files::read_safetensors(&run.join("model.safetensors")).unwrap().tensors;
    assert_eq!(after.keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>());
    // Every parameter outside the head stays as loaded; BatchNorm's running statistics (and
    // its counter) still follow the batches, as in PyTorch with requires_grad=False.
    let statistic = |name: &str| {
        [".running_mean", ".running_var", ".num_batches_tracked"].iter().any(|s| name.ends_with(s))
    };
    let mut compared = 0;
    for (name, tensor) in before.iter().filter(|(name, _)| !name.starts_with("fc.") && !statistic(name)) {
        assert!(after[name].equal(tensor), "frozen {name} changed in training");
        compared += 1;
    }
    assert_eq!(compared, 60, "resnet18's parameters less fc's two");
    assert!(!after["layer1.0.bn1.running_mean"].equal(&before["layer1.0.bn1.running_mean"]), "it trained");
    assert_eq!(after["fc.weight"].size(), vec![4, 512]);
}

#[test]
fn configuration_errors_name_the_key_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[train]\nepochz = 3\n").unwrap();
    common::rtrain(dir.path())
        .args(["train", "--config"])
        .arg(&config)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("epochz").and(predicate::str::contains("bad.toml")));
    common::rtrain(dir.path())
        .args(["config", "show", "--set", "optim.lr=fast"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("optim.lr"));
    common::rtrain(dir.path())
        .args(["config", "show"])
        .env("RTRAIN_TRAIN__EPOCHS", "7")
        .assert()
        .success()
        .stdout(predicate::str::contains("epochs = 7  # environment"));
    // Launched as one of several ranks by a launcher whose processes MPI does not see as one
    // job (here: torchrun's variables, no mpirun), rtrain refuses rather than training alone.
    common::rtrain(dir.path())
        .args(["train"])
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .assert()
        .code(1)
        .stderr(predicate::str::contains("torchrun as rank 1 of 2 processes, but MPI sees a world of 1"));
    // A user's data path that does not exist is an error naming it, never a synthetic run.
    common::rtrain(dir.path())
        .args(["train", "--set", "data.root=\"nowhere\""])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("nowhere"));
}

/// `schedule.kind = "plateau"` (ReduceLROnPlateau) keeps its state in checkpoints: a run
/// stopped after 3 epochs and resumed to 5 reduces the learning rate at the same epochs and
/// ends with the same weights as an uninterrupted one (without the saved state, the resumed
/// run would restart from the base rate).
#[test]
fn plateau_schedule_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 8, 4, 32);
    let sets: Vec<String> = [
        format!("data.root={:?}", data.display().to_string()),
        "data.image_size=32".into(),
        "data.batch_size=8".into(),
        "train.threads=1".into(),
        "optim.lr=0.05".into(),
        "schedule.kind=\"plateau\"".into(),
        "schedule.warmup_epochs=0".into(),
        // Top-1 must rise by 0.5 to count: every epoch after the first is a plateau.
        "schedule.mode=\"max\"".into(),
        "schedule.threshold_mode=\"abs\"".into(),
        "schedule.threshold=0.5".into(),
        "schedule.patience=0".into(),
        "schedule.factor=0.5".into(),
    ]
    .iter()
    .flat_map(|s| ["--set".to_string(), s.clone()])
    .collect();
    let train = |run: &str, epochs: u32, resume: bool| {
        let mut command = common::rtrain(dir.path());
        command
            .args(["train", "--run-dir", run])
            .args(&sets)
            .args(["--set", &format!("train.epochs={epochs}")]);
        if resume {
            command.args(["--resume", "auto"]);
        }
        command.assert().success();
    };
    train("whole", 5, false);
    train("resumed", 3, false);
    train("resumed", 5, true);
    let lrs = |run: &str| -> Vec<f64> {
        let text = std::fs::read_to_string(dir.path().join(run).join("metrics.jsonl")).unwrap();
        text.lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .filter(|record| record["kind"] == "epoch")
            .map(|record| record["lr"].as_f64().unwrap())
            .collect()
    };
    assert_eq!(lrs("whole"), [0.05, 0.05, 0.025, 0.0125, 0.00625]);
    assert_eq!(lrs("resumed"), lrs("whole"));
    assert_eq!(
        summary(&dir.path().join("resumed"))["weights_sha256"],
        summary(&dir.path().join("whole"))["weights_sha256"]
    );
}

/// At the end the best checkpoint is evaluated again (as the tutorial reloads `best_model.pt`):
/// summary.json has the best epoch and its report next to the last one, and the report equals
/// what that epoch's own evaluation logged.
#[test]
fn the_best_checkpoint_is_evaluated_again_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 8, 4, 32);
    common::rtrain(dir.path())
        .args(["train", "--run-dir", "run", "--set", &format!("data.root={:?}", data.display().to_string())])
        .args(["--set", "data.image_size=32", "--set", "data.batch_size=8", "--set", "train.threads=1"])
        .args(["--set", "train.epochs=4", "--set", "optim.lr=0.05"])
        .assert()
        .success();
    let run = dir.path().join("run");
    let epochs: Vec<Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|record| record["kind"] == "epoch")
        .collect();
    // The first epoch with the highest top-1 (a tie keeps the earlier best).
    let top1 = |record: &Value| record["val"]["top1"].as_f64().unwrap();
    let best =
        epochs.iter().fold(&epochs[0], |best, record| if top1(record) > top1(best) { record } else { best });
    let summary = summary(&run);
    assert_eq!(summary["best_epoch"].as_u64(), Some(best["epoch"].as_u64().unwrap() + 1), "{summary}");
    assert_eq!(summary["best_eval"]["top1"].as_f64(), Some(top1(best)));
    let (loss, logged) =
        (summary["best_eval"]["loss"].as_f64().unwrap(), best["val"]["loss"].as_f64().unwrap());
    assert!(
        (loss - logged).abs() <= 1e-9 * logged.abs().max(1.0),
        "re-evaluated loss {loss} vs logged {logged}"
    );
    assert_eq!(summary["best_eval"]["confusion"], best["val"]["confusion"]);
    assert_eq!(summary["final_eval"]["top1"].as_f64(), Some(top1(epochs.last().unwrap())));
}
