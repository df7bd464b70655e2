//! The training choices of imbalanced damage data and long jobs, as users set them: the loss's
//! class weights (checked against scikit-learn's rule and PyTorch's `CrossEntropyLoss`), the
//! class-balanced sampler (the same batches on any number of loader threads), and early
//! stopping (where it stops, and that a resumed or reproduced run stops there too). Gradient
//! accumulation and the sampler across ranks are tested under mpirun in tests/distributed.rs;
//! preemption with both in tests/preemption.rs.

use crate::common;

use std::path::{Path, PathBuf};

use serde_json::Value;
use tch::{Kind, Tensor};

fn json_file(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn sets(settings: &[&str]) -> Vec<String> {
    settings.iter().flat_map(|setting| ["--set".to_string(), setting.to_string()]).collect()
}

/// The case study's layout with 70/20/10 of its photos in C0/C2/C4 (tiny photos).
fn imbalanced(dir: &Path) -> PathBuf {
    let data = dir.join("ds");
    common::rtrain(dir)
        .args(["data", "synth"])
        .arg(&data)
        .args(["--layout", "designsafe", "--train-images", "60", "--val-images", "20"])
        .args(["--photo-scale", "0.02", "--class-shares", "70,20,10"])
        .assert()
        .success();
    data
}

/// One epoch on the imbalanced set, in one process with one thread, batches of 6.
fn train_one_epoch(dir: &Path, data: &Path, run: &str, settings: &[&str]) -> Value {
    common::rtrain(dir)
        .args(["train", "--run-dir", run])
        .args(sets(&[
            &format!("data.root={:?}", data.to_string_lossy()),
            "data.train_split=Train",
            "data.val_split=Validation",
            "data.image_size=32",
            "data.batch_size=6",
            "train.epochs=1",
            "train.threads=1",
        ]))
        .args(sets(settings))
        .assert()
        .success();
    json_file(&dir.join(run).join("summary.json"))
}

/// `train.class_weights = "balanced"` gives the loss scikit-learn's
/// `compute_class_weight("balanced")` over the training folders (recorded in the manifest),
/// and rtrain's loss with those weights and label smoothing equals PyTorch's
/// `CrossEntropyLoss(weight=..., label_smoothing=...)`, value and gradient, within 1e-6; the
/// unweighted loss is far from it, so the comparison can tell.
#[test]
fn balanced_class_weights_are_scikit_learns_and_the_loss_is_pytorchs() {
    let dir = tempfile::tempdir().unwrap();
    let data = imbalanced(dir.path());
    train_one_epoch(dir.path(), &data, "weighted", &["train.class_weights=\"balanced\""]);
    let manifest = json_file(&dir.path().join("weighted/manifest.json"));
    let recorded: Vec<f64> = serde_json::from_value(manifest["class_weights"].clone()).unwrap();
    let output = std::process::Command::new(common::python())
        .arg(common::repo().join("tests/reference/imbalance_reference.py"))
        .arg("class-weights")
        .arg(data.join("Train"))
        .output()
        .unwrap();
    let output = common::assert_success(output, "imbalance_reference.py class-weights");
    let sklearn: Vec<f64> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(recorded.len(), 3);
    for (ours, theirs) in recorded.iter().zip(&sklearn) {
        assert!((ours - theirs).abs() < 1e-12, "rtrain {recorded:?}, scikit-learn {sklearn:?}");
    }
    assert!(recorded[2] > 3.0 * recorded[0], "C4 (10%) weighs far more than C0 (70%): {recorded:?}");

    tch::manual_seed(3);
    let logits = Tensor::randn([16, 3], (Kind::Float, tch::Device::Cpu)) * 2.0;
    let labels = Tensor::from_slice(&[0i64, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 0, 1]);
    let weights = Tensor::from_slice(&recorded).to_kind(Kind::Float);
    let input = dir.path().join("loss-in.safetensors");
    let named = |name: &str, t: &Tensor| (name.to_string(), t.shallow_clone());
    let tensors = [named("logits", &logits), named("labels", &labels), named("weights", &weights)];
    rtrain::util::files::write_safetensors(&input, &tensors, None).unwrap();
    for smoothing in [0.0, 0.1] {
        let output = dir.path().join(format!("loss-out-{smoothing}.safetensors"));
        common::run_python(
            "imbalance_reference.py",
            &["loss".as_ref(), input.as_os_str(), output.as_os_str(), smoothing.to_string().as_ref()],
        );
        let torch = rtrain::util::files::read_safetensors(&output).unwrap().tensors;
        let ours_of = |weights: Option<&Tensor>| {
            let x = logits.detach().copy().set_requires_grad(true);
            let loss = rtrain::train::step::cross_entropy(&x, &labels, smoothing, weights).unwrap();
            loss.backward();
            (loss.double_value(&[]), x.grad())
        };
        let (loss, grad) = ours_of(Some(&weights));
        let reference = torch["loss"].double_value(&[0]);
        let grad_diff = (&grad - &torch["grad"]).abs().max().double_value(&[]);
        assert!(
            (loss - reference).abs() < 1e-6,
            "smoothing {smoothing}: loss {loss} vs PyTorch's {reference}"
        );
        assert!(grad_diff < 1e-6, "smoothing {smoothing}: gradient differs from PyTorch's by {grad_diff:e}");
        let (plain, _) = ours_of(None);
        assert!(
            (plain - reference).abs() > 1e-3,
            "the unweighted loss {plain} should differ from {reference}"
        );
    }

    // Through `rtrain train`: from the weighted run's model, with BatchNorm frozen and no
    // augmentation, one step over all 60 training images. Its logged loss is PyTorch's
    // weighted loss of the logits `rtrain eval` gives the same images (their log
    // probabilities: softmax's logits up to a constant per row).
    let start = dir.path().join("weighted/model.safetensors");
    let same_pixels = [
        "data.train_transform=\"resize\"",
        "data.eval_transform=\"resize\"",
        "data.hflip=false",
        "model.freeze_batchnorm=true",
    ];
    let pretrained = format!("model.pretrained={:?}", start.to_string_lossy());
    let mut through =
        vec!["train.class_weights=\"balanced\"", "train.label_smoothing=0.1", "data.batch_size=60"];
    through.extend([pretrained.as_str()].iter().chain(&same_pixels));
    let summary = train_one_epoch(dir.path(), &data, "through", &through);
    assert_eq!(summary["global_steps"], 1, "one step of all 60 images");
    let metrics = std::fs::read_to_string(dir.path().join("through/metrics.jsonl")).unwrap();
    let step: Value = metrics
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|record| record["kind"] == "step" && record["global_step"] == 1)
        .unwrap_or_else(|| panic!("no record of step 1:\n{metrics}"));
    let logged = step["loss"].as_f64().unwrap();
    common::rtrain(dir.path())
        .args(["eval", "--checkpoint"])
        .arg(&start)
        .args(["--split", "Train", "--out", "start-on-train", "--bootstrap", "0"])
        .args(sets(&[&format!("data.root={:?}", data.to_string_lossy()), "data.image_size=32"]))
        .args(sets(&same_pixels))
        .assert()
        .success();
    let mut reader = csv::Reader::from_path(dir.path().join("start-on-train/predictions.csv")).unwrap();
    let classes = ["C0", "C2", "C4"];
    let (mut labels, mut log_probabilities) = (Vec::new(), Vec::new());
    for record in reader.records() {
        let record = record.unwrap();
        labels.push(classes.iter().position(|c| *c == &record[1]).unwrap() as i64);
        log_probabilities.extend((5..8).map(|i| record[i].parse::<f64>().unwrap().ln()));
    }
    assert_eq!(labels.len(), 60);
    let logits = Tensor::from_slice(&log_probabilities).view([60, 3]);
    let labels = Tensor::from_slice(&labels);
    let input = dir.path().join("step-in.safetensors");
    let tensors = [
        named("logits", &logits),
        named("labels", &labels),
        named("weights", &weights.to_kind(Kind::Double)),
    ];
    rtrain::util::files::write_safetensors(&input, &tensors, None).unwrap();
    let output = dir.path().join("step-out.safetensors");
    common::run_python(
        "imbalance_reference.py",
        &["loss".as_ref(), input.as_os_str(), output.as_os_str(), "0.1".as_ref()],
    );
    let reference =
        rtrain::util::files::read_safetensors(&output).unwrap().tensors["loss"].double_value(&[0]);
    assert!(
        (logged - reference).abs() < 1e-5,
        "rtrain train's first step: loss {logged}, PyTorch's CrossEntropyLoss(weight=balanced) {reference}"
    );
    let plain = rtrain::train::step::cross_entropy(&logits, &labels, 0.1, None).unwrap().double_value(&[]);
    assert!((plain - reference).abs() > 1e-3, "the unweighted loss {plain} should differ from {reference}");
}

/// The balanced sampler draws each epoch's order before the loader sees it: one epoch with 0
/// and with 2 loader threads ends with bit-identical weights; the shuffle sampler (every image
/// once) ends elsewhere.
#[test]
fn the_balanced_sampler_gives_the_same_batches_on_any_number_of_loader_threads() {
    let dir = tempfile::tempdir().unwrap();
    let data = imbalanced(dir.path());
    let balanced = |run: &str, workers: &str| {
        train_one_epoch(
            dir.path(),
            &data,
            run,
            &["data.sampler=\"balanced\"", &format!("data.workers={workers}")],
        )
    };
    let (inline, threads) = (balanced("inline", "0"), balanced("threads", "2"));
    let shuffled = train_one_epoch(dir.path(), &data, "shuffled", &["data.workers=0"]);
    assert_eq!(inline["weights_sha256"], threads["weights_sha256"]);
    assert_ne!(inline["weights_sha256"], shuffled["weights_sha256"]);
    assert_eq!(inline["global_steps"], 10, "60 draws in batches of 6");
    let manifest = json_file(&dir.path().join("inline/manifest.json"));
    assert_eq!(manifest["config"]["data"]["sampler"], "balanced");
}

/// `train.early_stopping` on the validation top-1 with `min_delta = 1` (no top-1 can beat
/// another by more than 1) and patience 2 stops a 6-epoch run after epoch 3; the stop is in the
/// summary, the manifest and the log. Resumed from its epoch-2 checkpoint into another
/// directory, the run stops after epoch 3 too, with the same weights (without early stopping's
/// state in the checkpoint, the resumed run would count afresh and stop after epoch 5); and
/// `rtrain reproduce` expects the stop. Resuming its mid-epoch checkpoint with another
/// `train.accumulate` is refused.
#[test]
fn early_stopping_stops_where_it_should_and_a_resumed_run_stops_there_too() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 8, 4, 32);
    let settings = sets(&[
        &format!("data.root={:?}", data.to_string_lossy()),
        "data.image_size=32",
        "data.batch_size=8",
        "data.workers=0",
        "train.epochs=6",
        "train.threads=1",
        "train.early_stopping.metric=\"val_top1\"",
        "train.early_stopping.patience=2",
        "train.early_stopping.min_delta=1.0",
        "checkpoint.keep_last=10",
        "checkpoint.every_steps=2",
    ]);
    let output =
        common::rtrain(dir.path()).args(["train", "--run-dir", "first"]).args(&settings).output().unwrap();
    let output = common::assert_success(output, "train with early stopping");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.contains("early stopping after epoch 3 of 6: val_top1 has not improved"), "{log}");
    let first = dir.path().join("first");
    let summary = json_file(&first.join("summary.json"));
    let stop = &summary["stopped_early"];
    assert_eq!((stop["epoch"].as_u64(), stop["best_epoch"].as_u64()), (Some(3), Some(1)), "{stop}");
    assert_eq!(stop["metric"], "val_top1");
    assert_eq!(summary["global_steps"], 12, "3 epochs of 4 steps");
    assert_eq!(json_file(&first.join("manifest.json"))["stopped_early"], *stop);
    let metrics = std::fs::read_to_string(first.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().filter(|l| l.contains("\"kind\":\"epoch\"")).count(), 3);

    let after_epoch_2 = first.join("checkpoints/step-000000008.safetensors");
    common::rtrain(dir.path())
        .args(["train", "--run-dir", "resumed", "--resume"])
        .arg(&after_epoch_2)
        .args(&settings)
        .assert()
        .success();
    let resumed = json_file(&dir.path().join("resumed/summary.json"));
    assert_eq!(resumed["stopped_early"]["epoch"], 3, "{}", resumed["stopped_early"]);
    assert_eq!(resumed["weights_sha256"], summary["weights_sha256"]);

    // Mid-epoch (step 2 of 4), a step of 2 batches would shift which images come next.
    let mid_epoch = first.join("checkpoints/step-000000002.safetensors");
    let output = common::rtrain(dir.path())
        .args(["train", "--run-dir", "shifted", "--resume"])
        .arg(&mid_epoch)
        .args(&settings)
        .args(["--set", "train.accumulate=2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("train.accumulate = 1 after step 2"), "{stderr}");

    let output = common::rtrain(dir.path()).args(["reproduce", "first"]).output().unwrap();
    let output = common::assert_success(output, "reproduce a run that stopped early");
    let verdict = String::from_utf8_lossy(&output.stdout);
    assert!(
        verdict.contains("early stopping: ok   after epoch 3") && verdict.contains("\nreproduced"),
        "{verdict}"
    );
}
