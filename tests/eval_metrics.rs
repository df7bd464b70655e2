//! Evaluation metrics against their outside references (issue "Evaluation a paper can defend"):
//! rtrain's metrics (`rtrain::metrics`) on seeded, imbalanced, ordinal predictions, beside
//! scikit-learn's on the same numbers to 1e-9, the expected calibration error beside
//! torchmetrics', and the bootstrap intervals beside the percentiles of scikit-learn's metrics
//! on the same resamples (tests/reference/metrics_reference.py).

use crate::common;

use rand::{Rng, SeedableRng};
use rtrain::metrics::{self, Predictions};
use serde_json::Value;

/// `n` images of 4 ordered classes, 70/15/10/5 as damage data are, from a model that is right
/// about 70% of the time and, when wrong, mostly one class off; a few rows tie exactly.
fn damage_like(n: usize, seed: u64) -> (Vec<usize>, Vec<Vec<f64>>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let (mut labels, mut probabilities) = (Vec::new(), Vec::new());
    for i in 0..n {
        let draw: f64 = rng.random();
        let label = [0.70, 0.85, 0.95, 1.0].iter().position(|&edge| draw < edge).unwrap();
        let logits: Vec<f64> = (0..4)
            .map(|c| {
                let distance = c as f64 - label as f64;
                -0.8 * distance.abs() + rng.random_range(-1.5..1.5)
            })
            .collect();
        let max = logits.iter().cloned().fold(f64::MIN, f64::max);
        let exp: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
        let sum: f64 = exp.iter().sum();
        let row = if i % 97 == 0 { vec![0.25; 4] } else { exp.iter().map(|e| e / sum).collect() };
        labels.push(label);
        probabilities.push(row);
    }
    (labels, probabilities)
}

/// scikit-learn's and torchmetrics' answers (tests/reference/metrics_reference.py) for these
/// predictions, passed as JSON (f64 printed to round-trip exactly), with the percentile
/// bootstrap over `resamples` (each a list of image indices).
fn reference(
    dir: &std::path::Path,
    labels: &[usize],
    probabilities: &[Vec<f64>],
    classes: usize,
    resamples: &[Vec<usize>],
) -> Value {
    reference_of(
        dir,
        serde_json::json!({
            "labels": labels, "probabilities": probabilities, "num_classes": classes, "resamples": resamples
        }),
    )
}

/// The resamples `metrics::bootstrap(_, count, seed)` documents: `count` draws of n indices
/// with replacement from ChaCha8 seeded with `seed`, drawn here as it says.
fn resamples(n: usize, count: usize, seed: u64) -> Vec<Vec<usize>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..count).map(|_| (0..n).map(|_| rng.random_range(0..n)).collect()).collect()
}

/// [`reference`] for the images a confusion matrix counts (each predicted with probability
/// 1), without resamples.
fn reference_of_confusion(dir: &std::path::Path, confusion: &[Vec<u64>]) -> Value {
    let (mut labels, mut probabilities) = (Vec::new(), Vec::new());
    for (label, row) in confusion.iter().enumerate() {
        for (predicted, &count) in row.iter().enumerate() {
            let mut one_hot = vec![0.0; row.len()];
            one_hot[predicted] = 1.0;
            labels.extend(std::iter::repeat_n(label, count as usize));
            probabilities.extend(std::iter::repeat_n(one_hot, count as usize));
        }
    }
    let given = serde_json::json!({
        "labels": labels, "probabilities": probabilities, "num_classes": confusion.len()
    });
    reference_of(dir, given)
}

fn reference_of(dir: &std::path::Path, given: Value) -> Value {
    let input = dir.join("predictions.json");
    std::fs::write(&input, given.to_string()).unwrap();
    let output = std::process::Command::new(common::python())
        .arg(common::repo().join("tests/reference/metrics_reference.py"))
        .arg(&input)
        .output()
        .unwrap();
    serde_json::from_slice(&common::assert_success(output, "metrics_reference.py").stdout).unwrap()
}

fn close(ours: f64, reference: &Value, what: &str) {
    let reference = reference.as_f64().unwrap_or_else(|| panic!("{what}: no reference value"));
    assert!((ours - reference).abs() <= 1e-9, "{what}: ours {ours}, reference {reference}");
}

/// The expected calibration error beside torchmetrics', which bins float32 confidences: equal
/// to their rounding.
fn close_ece(ours: f64, reference: &Value) {
    let reference = reference.as_f64().expect("torchmetrics' ECE");
    assert!((ours - reference).abs() <= 1e-6, "ECE: ours {ours}, torchmetrics {reference}");
}

#[test]
fn metrics_match_scikit_learn_and_intervals_scipy() {
    let (labels, probabilities) = damage_like(600, 33);
    let predictions = Predictions { labels: &labels, probabilities: &probabilities, num_classes: 4 };
    let ours = metrics::compute(&predictions);
    let intervals = metrics::bootstrap(&predictions, 1000, 5);

    let dir = tempfile::tempdir().unwrap();
    let reference = reference(dir.path(), &labels, &probabilities, 4, &resamples(labels.len(), 1000, 5));

    close(ours.top1, &reference["top1"], "top-1");
    for (k, value) in &ours.top_k {
        close(*value, &reference["top_k"][k.to_string()], &format!("top-{k}"));
    }
    for (c, class) in ours.per_class.iter().enumerate() {
        close(class.precision, &reference["precision"][c], &format!("precision {c}"));
        close(class.recall, &reference["recall"][c], &format!("recall {c}"));
        close(class.f1, &reference["f1"][c], &format!("F1 {c}"));
        assert_eq!(class.support, reference["support"][c].as_u64().unwrap(), "support {c}");
        close(class.roc_auc.unwrap(), &reference["roc_auc"][c], &format!("ROC AUC {c}"));
    }
    close(ours.ordinal.macro_f1, &reference["macro_f1"], "macro F1");
    close(ours.weighted_f1, &reference["weighted_f1"], "weighted F1");
    close(ours.ordinal.balanced_accuracy, &reference["balanced_accuracy"], "balanced accuracy");
    close(ours.log_loss, &reference["log_loss"], "log loss");
    close(ours.ordinal.cohen_kappa.unwrap(), &reference["cohen_kappa"], "Cohen's kappa");
    close(ours.ordinal.quadratic_kappa.unwrap(), &reference["quadratic_kappa"], "quadratic kappa");
    close(ours.ordinal.mean_rank_error, &reference["mean_rank_error"], "mean rank error");
    close_ece(ours.ece, &reference["ece"]);
    // The data are not degenerate: each metric says something different.
    assert!(ours.top1 > 0.5 && ours.ordinal.balanced_accuracy < ours.top1, "{ours:?}");
    assert!(ours.ordinal.quadratic_kappa > ours.ordinal.cohen_kappa, "{ours:?}");

    // Intervals: on the same resamples, the 2.5th and 97.5th percentiles of scikit-learn's
    // metrics (NumPy's percentile, as SciPy's percentile bootstrap takes it), to 1e-9: an
    // 80% interval (10th and 90th) would be ~0.01 narrower at each end.
    for (name, interval) in [
        ("top1", intervals.top1),
        ("macro_f1", intervals.macro_f1),
        ("balanced_accuracy", intervals.balanced_accuracy),
        ("quadratic_kappa", intervals.quadratic_kappa),
    ] {
        let bounds = &reference["intervals"][name];
        close(interval.low, &bounds[0], &format!("{name} 95% interval, low"));
        close(interval.high, &bounds[1], &format!("{name} 95% interval, high"));
        assert!(interval.high - interval.low > 0.03, "{name}: {interval:?}");
    }
    assert_eq!(metrics::bootstrap(&predictions, 1000, 5), intervals, "not reproducible for a fixed seed");
}

/// `rtrain eval --out` on a trained model: `predictions.csv` holds every image of the split with
/// probabilities that sum to 1, `metrics.json` holds the metrics scikit-learn computes from
/// that very file (to 1e-9), the tree named by `--data` and the split named by `--split` give
/// the same report, and the same seed gives the same intervals, byte for byte.
#[test]
fn eval_writes_per_image_results_whose_metrics_scikit_learn_confirms() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 6, 5, 32);
    let data_arg = format!("data.root={:?}", data.display().to_string());
    let settings = ["--set", &data_arg, "--set", "data.image_size=32", "--set", "data.batch_size=4"];
    let trained = common::rtrain(dir.path())
        .args(["train", "--run-dir", "run"])
        .args(settings)
        .args(["--set", "train.epochs=2", "--set", "train.threads=1"])
        .output()
        .unwrap();
    assert!(trained.status.success(), "{}", String::from_utf8_lossy(&trained.stderr));
    // Every epoch record and the summary carry the metrics that follow from the confusion
    // matrix: scikit-learn's on the images it counts.
    let log = std::fs::read_to_string(dir.path().join("run/metrics.jsonl")).unwrap();
    let summary: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("run/summary.json")).unwrap()).unwrap();
    let epochs: Vec<Value> = log
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|r| r["val"].is_object())
        .collect();
    assert_eq!(epochs.len(), 2, "{log}");
    for (what, val) in [("last epoch", &epochs[1]["val"]), ("best model", &summary["best_eval"])] {
        let confusion: Vec<Vec<u64>> = serde_json::from_value(val["confusion"].clone()).unwrap();
        let reference = reference_of_confusion(dir.path(), &confusion);
        for key in ["macro_f1", "balanced_accuracy", "cohen_kappa", "quadratic_kappa", "mean_rank_error"] {
            close(val[key].as_f64().unwrap_or(f64::NAN), &reference[key], &format!("{what}: {key}"));
        }
    }
    let eval = |out: &str, source: &[&str]| {
        let output = common::rtrain(dir.path())
            .args(["eval", "--checkpoint", "run/model.safetensors", "--out", out, "--bootstrap", "200"])
            .args(settings)
            .args(source)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        std::fs::read(dir.path().join(out).join("metrics.json")).unwrap()
    };
    // Training ended by evaluating its best checkpoint as `rtrain eval` does, into
    // run/evaluation: the same bytes as eval's own files (default bootstrap, seeded by run.seed).
    let best = common::rtrain(dir.path())
        .args(["eval", "--checkpoint", "run/checkpoints/best.safetensors", "--out", "best", "--split", "val"])
        .args(settings)
        .output()
        .unwrap();
    assert!(best.status.success(), "{}", String::from_utf8_lossy(&best.stderr));
    for file in ["metrics.json", "predictions.csv", "report.md"] {
        let (trained, evaluated) =
            (dir.path().join("run/evaluation").join(file), dir.path().join("best").join(file));
        assert_eq!(
            std::fs::read(&trained).unwrap(),
            std::fs::read(&evaluated).unwrap(),
            "{} differs from eval's {}",
            trained.display(),
            evaluated.display()
        );
    }
    // rtrain report shows that evaluation: its text and its figures, copied beside report.md.
    let reported = common::rtrain(dir.path()).args(["report", "run"]).output().unwrap();
    assert!(reported.status.success(), "{}", String::from_utf8_lossy(&reported.stderr));
    let report = std::fs::read_to_string(dir.path().join("run/report/report.md")).unwrap();
    let evaluation = std::fs::read_to_string(dir.path().join("best/report.md")).unwrap();
    let text = evaluation.split("```").nth(1).unwrap().trim_start_matches('\n');
    assert!(report.contains(text), "report.md lacks the evaluation's text {text}:\n{report}");
    for figure in [
        "run-best-confusion-by-row.svg",
        "run-best-reliability.svg",
        "run-best-roc.svg",
        "run-best-mistakes.png",
    ] {
        assert!(report.contains(&format!("]({figure})")), "report.md does not show {figure}");
        let name = figure.trim_start_matches("run-best-");
        assert_eq!(
            std::fs::read(dir.path().join("run/report").join(figure)).unwrap(),
            std::fs::read(dir.path().join("best").join(name)).unwrap(),
            "{figure}"
        );
    }

    let by_split = eval("by-split", &["--split", "val"]);
    let val = data.join("val");
    let by_tree = eval("by-tree", &["--data", val.to_str().unwrap()]);
    assert_eq!(by_split, by_tree, "--split val and --data DATA/val differ");
    assert_eq!(eval("again", &["--split", "val"]), by_split, "the same seed gave other bytes");

    let metrics: Value = serde_json::from_slice(&by_split).unwrap();
    let classes: Vec<String> = serde_json::from_value(metrics["classes"].clone()).unwrap();
    let mut reader = csv::Reader::from_path(dir.path().join("by-split/predictions.csv")).unwrap();
    let (mut labels, mut probabilities) = (Vec::new(), Vec::<Vec<f64>>::new());
    for record in reader.records() {
        let record = record.unwrap();
        labels.push(classes.iter().position(|c| c == &record[1]).unwrap());
        let row: Vec<f64> = (5..5 + classes.len()).map(|i| record[i].parse().unwrap()).collect();
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{record:?}");
        assert_eq!(record[4] == *"true", record[1] == record[2], "{record:?}");
        probabilities.push(row);
    }
    assert_eq!(labels.len(), 4 * 5, "one row per validation image");
    // The gallery has a row per (true, predicted) pair with mistakes, as wide as its fullest
    // pair (up to 4 thumbnails); every figure report.md shows exists.
    let mut pairs = std::collections::BTreeMap::<(usize, usize), u32>::new();
    for (label, row) in labels.iter().zip(&probabilities) {
        let predicted = (0..row.len()).fold(0, |best, c| if row[c] > row[best] { c } else { best });
        if predicted != *label {
            *pairs.entry((*label, predicted)).or_default() += 1;
        }
    }
    let gallery = image::open(dir.path().join("by-split/mistakes.png")).unwrap();
    let columns = pairs.values().map(|&n| n.min(4)).max().unwrap_or(1);
    let expected = (170 + columns * 140 + 12, 44 + pairs.len().max(1) as u32 * 184);
    assert_eq!((gallery.width(), gallery.height()), expected, "pairs with mistakes: {pairs:?}");
    // The Grad-CAM panel is the same gallery with each photo replaced by its Grad-CAM overlay
    // for the predicted class: the first thumbnail is `rtrain explain`'s overlay of that image.
    let panel = image::open(dir.path().join("by-split/mistakes-gradcam.png")).unwrap().to_rgb8();
    assert_eq!(panel.dimensions(), (gallery.width(), gallery.height()));
    let mut reader = csv::Reader::from_path(dir.path().join("by-split/predictions.csv")).unwrap();
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    let first = rows.iter().enumerate().filter(|(_, r)| r[4] == *"false").min_by(|(i, a), (j, b)| {
        let key = |r: &csv::StringRecord| (r[1].to_string(), r[2].to_string());
        let probability = |r: &csv::StringRecord| r[3].parse::<f64>().unwrap();
        key(a).cmp(&key(b)).then(probability(b).total_cmp(&probability(a))).then(i.cmp(j))
    });
    if let Some((_, first)) = first {
        let explained = common::rtrain(dir.path())
            .args([
                "explain",
                "--checkpoint",
                "run/model.safetensors",
                "--out",
                "first",
                "--class",
                &first[2],
            ])
            .args(settings)
            .arg(&first[0])
            .output()
            .unwrap();
        assert!(explained.status.success(), "{}", String::from_utf8_lossy(&explained.stderr));
        let overlay = std::fs::read_dir(dir.path().join("first"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "png"))
            .unwrap();
        let overlay = image::open(overlay).unwrap().to_rgb8();
        let scale = 128.0 / f64::from(overlay.width().max(overlay.height()));
        let size = |n: u32| ((f64::from(n) * scale) as u32).max(1);
        let thumbnail = image::imageops::thumbnail(&overlay, size(overlay.width()), size(overlay.height()));
        let shown =
            image::imageops::crop_imm(&panel, 170, 44, thumbnail.width(), thumbnail.height()).to_image();
        assert!(shown == thumbnail, "the panel's first thumbnail is not explain's overlay of {}", &first[0]);
        let photo =
            image::imageops::crop_imm(&gallery.to_rgb8(), 170, 44, thumbnail.width(), thumbnail.height())
                .to_image();
        assert!(photo != shown, "the panel shows the photo, not its Grad-CAM");
    }
    let report = std::fs::read_to_string(dir.path().join("by-split/report.md")).unwrap();
    for figure in report.split("](").skip(1).map(|rest| rest.split(')').next().unwrap()) {
        assert!(
            dir.path().join("by-split").join(figure).is_file(),
            "report.md shows {figure}, which is missing"
        );
    }
    assert!(
        report.contains("mistakes.png")
            && report.contains("mistakes-gradcam.png")
            && report.contains("reliability.svg")
            && report.contains("roc.svg")
    );
    assert_eq!(metrics["samples"], 20);
    let reference = reference(dir.path(), &labels, &probabilities, classes.len(), &[]);
    let m = &metrics["metrics"];
    for key in
        ["top1", "macro_f1", "weighted_f1", "balanced_accuracy", "log_loss", "cohen_kappa", "mean_rank_error"]
    {
        close(m[key].as_f64().unwrap(), &reference[key], key);
    }
    close_ece(m["ece"].as_f64().unwrap(), &reference["ece"]);
    // Undefined (null) only when the model predicts one class for all: not compared then.
    if let Some(qwk) = m["quadratic_kappa"].as_f64() {
        close(qwk, &reference["quadratic_kappa"], "quadratic kappa");
    }
}

/// `data.class_order` sets the label index, and so the checkpoint's class list and the rank the
/// ordinal metrics count: each image keeps its own folder's class, the quadratic kappa and rank
/// error are scikit-learn's over labels in that order, a checkpoint trained in one order is
/// not evaluated in another, and an order that is not one of the classes is refused naming
/// the key.
#[test]
fn a_class_order_sets_labels_ranks_and_the_checkpoints_classes() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 5, 32);
    let data_arg = format!("data.root={:?}", data.display().to_string());
    let order = ["1-minor", "0-none", "3-severe", "2-moderate"];
    let order_arg = format!("data.class_order={order:?}");
    let settings = ["--set", &data_arg, "--set", "data.image_size=32", "--set", "data.batch_size=4"];
    let trained = common::rtrain(dir.path())
        .args(["train", "--run-dir", "run", "--set", "train.epochs=1", "--set", "train.threads=1"])
        .args(["--set", &order_arg])
        .args(settings)
        .output()
        .unwrap();
    assert!(trained.status.success(), "{}", String::from_utf8_lossy(&trained.stderr));
    let eval = |extra: &[&str]| {
        common::rtrain(dir.path())
            .args(["eval", "--checkpoint", "run/model.safetensors", "--out", "out", "--bootstrap", "0"])
            .args(settings)
            .args(extra)
            .output()
            .unwrap()
    };
    let output = eval(&["--set", &order_arg]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let metrics: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/metrics.json")).unwrap()).unwrap();
    assert_eq!(metrics["classes"], serde_json::json!(order));
    let mut reader = csv::Reader::from_path(dir.path().join("out/predictions.csv")).unwrap();
    let (mut labels, mut probabilities) = (Vec::new(), Vec::<Vec<f64>>::new());
    for record in reader.records() {
        let record = record.unwrap();
        let folder =
            std::path::Path::new(&record[0]).parent().unwrap().file_name().unwrap().to_str().unwrap();
        assert_eq!(&record[1], folder, "an image's true class is its folder's");
        labels.push(order.iter().position(|c| *c == &record[1]).unwrap());
        probabilities.push((5..9).map(|i| record[i].parse().unwrap()).collect());
    }
    let reference = reference(dir.path(), &labels, &probabilities, 4, &[]);
    let m = &metrics["metrics"];
    for key in ["mean_rank_error", "macro_f1", "balanced_accuracy"] {
        close(m[key].as_f64().unwrap(), &reference[key], key);
    }
    if let Some(qwk) = m["quadratic_kappa"].as_f64() {
        close(qwk, &reference["quadratic_kappa"], "quadratic kappa");
    }

    let sorted = eval(&[]);
    let stderr = String::from_utf8_lossy(&sorted.stderr);
    assert!(!sorted.status.success() && stderr.contains("differ from the checkpoint's"), "{stderr}");
    let missing = eval(&["--set", r#"data.class_order=["0-none", "1-minor", "2-moderate", "4-collapse"]"#]);
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && stderr.contains("data.class_order"), "{stderr}");
}

// --- Calibration (issue "Probabilities a damage map can trust"): rtrain::calibration beside
// scikit-learn 1.9, netcal 1.4, SciPy and MAPIE 1.6 (tests/reference/calibration_reference.py).

use rtrain::calibration::{self, ConformalMethod};

/// The logits of `n` photos of 4 damage levels (70/15/10/5 before the evidence) from a model
/// 2.5 times too sure of itself: labels are drawn from softmax(z), the model says 2.5 z.
fn overconfident_logits(n: usize, seed: u64) -> (Vec<Vec<f64>>, Vec<usize>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let prior = [0.70f64, 0.15, 0.10, 0.05];
    let (mut logits, mut labels) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let z: Vec<f64> = prior.iter().map(|p| p.ln() + rng.random_range(-2.5..2.5)).collect();
        let truth = calibration::softmax(&z, 1.0);
        let draw: f64 = rng.random();
        let mut cumulative = 0.0;
        let label = truth.iter().position(|p| {
            cumulative += p;
            draw < cumulative
        });
        labels.push(label.unwrap_or(3));
        logits.push(z.iter().map(|z| 2.5 * z).collect());
    }
    (logits, labels)
}

fn all_close(ours: &[Vec<f64>], reference: &Value, tolerance: f64, what: &str) {
    for (i, row) in ours.iter().enumerate() {
        for (k, &value) in row.iter().enumerate() {
            let theirs = reference[i][k].as_f64().unwrap_or_else(|| panic!("{what}: no value [{i}][{k}]"));
            assert!(
                (value - theirs).abs() <= tolerance,
                "{what} [{i}][{k}]: ours {value}, reference {theirs}"
            );
        }
    }
}

#[test]
fn temperature_scaling_matches_scikit_learn_and_netcal() {
    let (logits, labels) = overconfident_logits(300, 41);
    let (held_out, _) = overconfident_logits(100, 42);
    let temperature = calibration::fit_temperature(&logits, &labels).unwrap();
    let reference = common::calibration_reference(
        "temperature",
        &serde_json::json!({ "logits": logits, "labels": labels, "apply_to": held_out }),
    );
    let sklearn = reference["temperature"].as_f64().unwrap();
    assert!((temperature - sklearn).abs() <= 1e-4, "temperature: ours {temperature}, scikit-learn {sklearn}");
    // The data are what temperature scaling is for: the model is far too sure.
    assert!((1.8..3.5).contains(&temperature), "{temperature}");
    let calibrated: Vec<Vec<f64>> = held_out.iter().map(|z| calibration::softmax(z, temperature)).collect();
    all_close(&calibrated, &reference["probabilities"], 1e-5, "scikit-learn's calibrated probabilities");

    // netcal minimises the same NLL with SciPy's L-BFGS-B at its default tolerances.
    let netcal = reference["netcal"]["temperature"].as_f64().unwrap();
    assert!((temperature - netcal).abs() <= 1e-3, "temperature: ours {temperature}, netcal {netcal}");
    all_close(&calibrated, &reference["netcal"]["probabilities"], 1e-4, "netcal's calibrated probabilities");
}

#[test]
fn nll_brier_and_entropy_match_scikit_learn_and_scipy() {
    let (logits, labels) = overconfident_logits(300, 43);
    for temperature in [1.0, 2.5] {
        let probabilities: Vec<Vec<f64>> =
            logits.iter().map(|z| calibration::softmax(z, temperature)).collect();
        let quantiles = [0.95, 0.5, 0.123];
        let reference = common::calibration_reference(
            "metrics",
            &serde_json::json!({ "probabilities": probabilities, "labels": labels, "quantiles": quantiles }),
        );
        let what = |name: &str| format!("{name} at T = {temperature}");
        close(calibration::mean_nll(&logits, &labels, temperature), &reference["log_loss"], &what("NLL"));
        let brier = calibration::brier_score(&probabilities, &labels);
        close(brier, &reference["brier_unscaled"], &what("Brier"));
        close(brier, &reference["brier"], &what("Brier (scikit-learn's default for 4 classes)"));
        for (i, row) in probabilities.iter().enumerate() {
            close(calibration::entropy(row), &reference["entropy"][i], &what(&format!("entropy {i}")));
        }
        for (q, reference) in quantiles.iter().zip(reference["entropy_quantiles"].as_array().unwrap()) {
            close(
                calibration::entropy_threshold(&probabilities, *q),
                reference,
                &what(&format!("entropy quantile {q}")),
            );
        }
    }

    // Two classes: scikit-learn's default halves the Brier score; rtrain reports the sum.
    let binary = [vec![0.9, 0.1], vec![0.3, 0.7], vec![0.6, 0.4]];
    let reference = common::calibration_reference(
        "metrics",
        &serde_json::json!({ "probabilities": binary, "labels": [0, 0, 1] }),
    );
    let brier = calibration::brier_score(&binary, &[0, 0, 1]);
    close(brier, &reference["brier_unscaled"], "binary Brier");
    close(brier / 2.0, &reference["brier"], "binary Brier, halved");
}

/// Rows that put MAPIE's rules to work on the prediction side: exact ties, zeros, differences
/// inside its 1e-8 tolerance, and for each threshold rows just inside and just outside it.
fn edge_rows(lac_thresholds: &[f64], aps_thresholds: &[f64]) -> Vec<Vec<f64>> {
    let mut rows = vec![
        vec![0.25; 4],
        vec![0.4, 0.3, 0.3, 0.0],
        vec![0.0, 0.0, 0.3, 0.7],
        vec![1.0, 0.0, 0.0, 0.0],
        vec![0.0, 0.0, 0.0, 1.0],
        vec![0.5, 0.25 + 5e-9, 0.25 - 5e-9, 0.0],
        vec![0.5 - 3e-9, 0.5 + 3e-9, 0.0, 0.0],
    ];
    // LAC takes a class when 1 - p - threshold <= 1e-8.
    for &t in lac_thresholds {
        let inside = 1.0 - t - 5e-9;
        let outside = 1.0 - t - 2e-8;
        rows.push(vec![inside, outside, (1.0 - inside - outside) / 2.0, (1.0 - inside - outside) / 2.0]);
    }
    // APS stops at the first class whose cumulative probability comes within 1e-8 of the
    // threshold.
    for &t in aps_thresholds {
        for top in [t - 5e-9, t - 2e-8] {
            if top < 1.0 {
                rows.push(vec![(1.0 - top) * 0.6, top, (1.0 - top) * 0.4, 0.0]);
            }
        }
    }
    rows
}

#[test]
fn conformal_sets_match_mapie_photo_for_photo() {
    let (logits, labels) = overconfident_logits(500, 44);
    let temperature = calibration::fit_temperature(&logits, &labels).unwrap();
    let probabilities: Vec<Vec<f64>> = logits.iter().map(|z| calibration::softmax(z, temperature)).collect();
    let (mut calibration_rows, mut calibration_labels) =
        (probabilities[..300].to_vec(), labels[..300].to_vec());
    // Ties and zeros in calibration too, but never a true class tied with another: numpy's
    // argsort, which ranks MAPIE's APS classes, leaves the order of ties undocumented (see
    // src/calibration.rs).
    calibration_rows.extend([vec![0.5, 0.2, 0.2, 0.1], vec![0.1, 0.3, 0.3, 0.3], vec![0.6, 0.4, 0.0, 0.0]]);
    calibration_labels.extend([0, 0, 1]);
    let n = calibration_rows.len();
    // 0.3 besides the usual levels: a threshold low enough for LAC to give empty sets.
    let alphas = [0.1, 0.05, 0.3];
    let uniforms = calibration::aps_uniforms(n);

    let threshold = |alpha, method| {
        calibration::conformal_threshold(&calibration_rows, &calibration_labels, alpha, method).unwrap()
    };
    let lac: Vec<f64> = alphas.iter().map(|&a| threshold(a, ConformalMethod::Lac)).collect();
    let aps: Vec<f64> = alphas.iter().map(|&a| threshold(a, ConformalMethod::Aps)).collect();
    let mut test_rows = probabilities[300..].to_vec();
    test_rows.extend(edge_rows(&lac, &aps));

    let mut sizes = std::collections::BTreeMap::new();
    for (method, name, thresholds) in
        [(ConformalMethod::Lac, "lac", &lac), (ConformalMethod::Aps, "aps", &aps)]
    {
        let reference = common::calibration_reference(
            "conformal",
            &serde_json::json!({
                "calibration": { "probabilities": calibration_rows, "labels": calibration_labels },
                "test": { "probabilities": test_rows },
                "alphas": alphas, "method": name, "uniforms": uniforms,
            }),
        );
        for (a, (&alpha, &ours)) in alphas.iter().zip(thresholds).enumerate() {
            let mapie = &reference["results"][a];
            let theirs = mapie["threshold"].as_f64().unwrap();
            assert_eq!(ours, theirs, "{name} threshold at alpha {alpha}: ours {ours}, MAPIE {theirs}");
            for (i, row) in test_rows.iter().enumerate() {
                let set = calibration::prediction_set(row, ours, method);
                let mapie_set: Vec<usize> =
                    (0..4).filter(|&k| mapie["sets"][i][k].as_bool().unwrap()).collect();
                assert_eq!(
                    set, mapie_set,
                    "{name} at alpha {alpha}, photo {i} {row:?}: ours {set:?}, MAPIE {mapie_set:?}"
                );
                *sizes.entry((name, set.len())).or_insert(0) += 1;
            }
        }
    }
    // Not a degenerate comparison: singletons and larger sets of both kinds, and empty LAC sets.
    for key in [("lac", 0), ("lac", 1), ("lac", 2), ("aps", 1), ("aps", 2), ("aps", 3)] {
        assert!(sizes.get(&key).is_some_and(|&count| count > 0), "no {key:?} sets: {sizes:?}");
    }
}
