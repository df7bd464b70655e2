//! Probabilities a damage map can trust, through the real binary and against outside
//! references: a model carries its preprocessing (a 32 px model predicts at 32 px with no
//! flag), `rtrain calibrate`'s temperature is scikit-learn's `CalibratedClassifierCV(method=
//! "temperature")` on torchvision's logits, its prediction sets are MAPIE's photo for photo,
//! eval's NLL, Brier score and ECE are scikit-learn's and the definition's, and an ensemble with
//! flip TTA is the mean of torchvision's softmaxes. One model is trained for all of them.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{json, Value};

const CLASSES: [&str; 4] = ["0-none", "1-minor", "2-moderate", "3-severe"];

/// Only what the torchvision reference cannot do the same way; no `data.*` key (the model
/// carries its preprocessing): fp32, as torchvision computes.
const FP32: [&str; 2] = ["--set", "train.precision=fp32"];

/// The model every test uses, trained once: a ResNet-18 at 32 px with the tutorial's
/// `Resize((32, 32))`, JPEGs decoded whole (as Pillow decodes them), four epochs of a small
/// synthetic set (about 35% top-1 of 4 classes: enough for a well-defined temperature near 2;
/// a model at chance has a flat likelihood in T), with step checkpoints to make an ensemble of.
struct Trained {
    dir: PathBuf,
    data: PathBuf,
    run: PathBuf,
}

fn trained() -> &'static Trained {
    static TRAINED: OnceLock<Trained> = OnceLock::new();
    TRAINED.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let data = common::synth(&dir, 40, 30, 48);
        let output = common::rtrain(&dir)
            .args(["train", "--run-dir", "run"])
            .args(["--set", &format!("data.root={:?}", data.display().to_string())])
            .args(["--set", "data.image_size=32", "--set", "data.eval_transform=resize"])
            .args(["--set", "data.jpeg_draft=false", "--set", "data.batch_size=16"])
            .args([
                "--set",
                "train.epochs=4",
                "--set",
                "train.threads=1",
                "--set",
                "checkpoint.every_steps=5",
            ])
            .args(["--set", "train.calibrate=true"])
            .args(FP32)
            .output()
            .unwrap();
        common::assert_success(output, "rtrain train");
        Trained { run: dir.join("run"), data, dir }
    })
}

fn json_of(output: std::process::Output, what: &str) -> Value {
    let output = common::assert_success(output, what);
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn reference(script: &str, args: &[&std::ffi::OsStr]) -> Value {
    let output = Command::new(common::python())
        .arg(common::repo().join("tests/reference").join(script))
        .args(args)
        .output()
        .unwrap();
    json_of(output, script)
}

/// The photos of a split, sorted, with their class indices.
fn photos(split: &Path) -> Vec<(PathBuf, usize)> {
    let mut photos = Vec::new();
    for (label, class) in CLASSES.iter().enumerate() {
        let mut files: Vec<PathBuf> =
            std::fs::read_dir(split.join(class)).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        photos.extend(files.into_iter().map(|f| (f, label)));
    }
    photos
}

/// `predict --out`'s rows by photo file name (class folder and file).
fn predicted(dir: &Path, out: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    common::csv_rows(&dir.join(out).join("predictions.csv"))
        .into_iter()
        .map(|row| (short(Path::new(&row["path"])), row))
        .collect()
}

/// `0-none/00003.jpg` of a photo's path.
fn short(path: &Path) -> String {
    let parent = path.parent().unwrap().file_name().unwrap().to_string_lossy();
    format!("{parent}/{}", path.file_name().unwrap().to_string_lossy())
}

fn probabilities(row: &BTreeMap<String, String>) -> Vec<f64> {
    CLASSES.iter().map(|c| row[&format!("probability_{c}")].parse().unwrap()).collect()
}

fn assert_close(what: &str, ours: &[f64], theirs: &[f64], tolerance: f64) {
    assert_eq!(ours.len(), theirs.len(), "{what}");
    for (a, b) in ours.iter().zip(theirs) {
        assert!((a - b).abs() <= tolerance, "{what}: {ours:?} vs {theirs:?} (tolerance {tolerance})");
    }
}

/// torchvision's probabilities of `images` by an ensemble of (weights, temperature), each
/// member's averaged over the image and its mirror when `flip`.
fn torchvision_ensemble(members: &[(PathBuf, f64)], images: &[PathBuf], flip: bool) -> Value {
    let spec = json!({
        "arch": "resnet18", "num_classes": 4, "size": 32, "flip": flip, "images": images,
        "members": members.iter().map(|(w, t)| json!({"weights": w, "temperature": t})).collect::<Vec<_>>(),
    });
    let path = trained().dir.join(format!("ensemble-{}-{flip}.json", members.len()));
    std::fs::write(&path, spec.to_string()).unwrap();
    reference("trust_reference.py", &["ensemble".as_ref(), path.as_os_str()])
}

/// Calibrates the model on the validation split into `out` (once per name), returning
/// `calibrate --json`'s report.
fn calibrated(out: &str, conformal: &[&str]) -> Value {
    let t = trained();
    let output = common::rtrain(&t.dir)
        .args(["calibrate", "--checkpoint", "run", "--data"])
        .arg(t.data.join("val"))
        .args(["--out", out, "--json"])
        .args(conformal)
        .args(FP32)
        .output()
        .unwrap();
    json_of(output, "rtrain calibrate")
}

/// The new user: a model trained at 32 px, `predict` with no flag. It classifies at 32
/// px with the tutorial's resize (today's code used the configuration's 64 px centre crop and
/// only warned), which torchvision confirms, and an explicit `--set` still wins, with a warning.
#[test]
fn a_model_trained_at_32_px_predicts_at_32_px_with_no_flag() {
    let t = trained();
    let val: Vec<PathBuf> = photos(&t.data.join("val")).into_iter().map(|(p, _)| p).collect();
    let output = common::rtrain(&t.dir)
        .args(["predict", "--checkpoint", "run/model.safetensors", "--out", "plain"])
        .arg(t.data.join("val"))
        .args(FP32)
        .output()
        .unwrap();
    let output = common::assert_success(output, "rtrain predict");
    assert!(!String::from_utf8_lossy(&output.stderr).contains("WARN"), "{output:?}");
    let ours = predicted(&t.dir, "plain");
    let theirs = torchvision_ensemble(&[(t.run.join("model.safetensors"), 1.0)], &val, false);
    for path in &val {
        let row = &ours[&short(path)];
        let reference: Vec<f64> = serde_json::from_value(theirs[path.to_str().unwrap()].clone()).unwrap();
        assert_close(&short(path), &probabilities(row), &reference, 1e-5);
    }

    let output = common::rtrain(&t.dir)
        .args(["predict", "--checkpoint", "run/model.safetensors"])
        .arg(&val[0])
        .args(["--set", "data.image_size=48", "--json"])
        .args(FP32)
        .output()
        .unwrap();
    let output = common::assert_success(output, "rtrain predict --set data.image_size=48");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "data.image_size = 48 as set, although the model was trained with data.image_size = 32"
        ),
        "{stderr}"
    );
    let at_48: Value = serde_json::from_slice(&output.stdout).unwrap();
    let p48 = at_48[0]["top"][0]["probability"].as_f64().unwrap();
    let p32 = ours[&short(&val[0])]["probability"].parse::<f64>().unwrap();
    assert!((p48 - p32).abs() > 1e-6, "48 px gave the 32 px probability {p32}: the --set was not honoured");
}

/// The fitted temperature is scikit-learn's and netcal's on torchvision's logits of the same
/// photos (1e-4), the calibrated probabilities `predict` writes are scikit-learn's (1e-5), and
/// the file records what it was fitted on.
#[test]
fn the_temperature_is_scikit_learns_on_torchvisions_logits() {
    let t = trained();
    let report = calibrated("calibrated.safetensors", &[]);
    let temperature = report["calibration"]["temperature"].as_f64().unwrap();
    let fitted = &report["calibration"]["fitted_on"];
    assert_eq!(fitted["split"], "val");
    assert_eq!(fitted["images"], 120);
    assert_eq!(fitted["sha256"].as_str().unwrap().len(), 64);

    let val = photos(&t.data.join("val"));
    let train = photos(&t.data.join("train"));
    let logits_of = |photos: &[(PathBuf, usize)]| -> Vec<Vec<f64>> {
        let mut args: Vec<&std::ffi::OsStr> = vec!["logits".as_ref(), "resnet18".as_ref(), "4".as_ref()];
        args.push("32".as_ref());
        let weights = t.run.join("model.safetensors");
        args.push(weights.as_os_str());
        args.extend(photos.iter().map(|(p, _)| p.as_os_str()));
        let logits = reference("trust_reference.py", &args);
        photos
            .iter()
            .map(|(p, _)| serde_json::from_value(logits[p.to_str().unwrap()].clone()).unwrap())
            .collect()
    };
    let labels: Vec<usize> = val.iter().map(|(_, l)| *l).collect();
    let sklearn = common::calibration_reference(
        "temperature",
        &json!({"logits": logits_of(&val), "labels": labels, "apply_to": logits_of(&train)}),
    );
    let theirs = sklearn["temperature"].as_f64().unwrap();
    assert!((temperature - theirs).abs() < 1e-4, "rtrain T {temperature}, scikit-learn's {theirs}");
    if let Some(netcal) = sklearn["netcal"]["temperature"].as_f64() {
        assert!((temperature - netcal).abs() < 1e-4, "rtrain T {temperature}, netcal's {netcal}");
    }

    let output = common::rtrain(&t.dir)
        .args(["predict", "--checkpoint", "calibrated.safetensors", "--out", "calibrated-train"])
        .arg(t.data.join("train"))
        .args(FP32)
        .output()
        .unwrap();
    common::assert_success(output, "rtrain predict (calibrated)");
    let ours = predicted(&t.dir, "calibrated-train");
    for ((path, _), reference) in train.iter().zip(sklearn["probabilities"].as_array().unwrap()) {
        let reference: Vec<f64> = serde_json::from_value(reference.clone()).unwrap();
        assert_close(&short(path), &probabilities(&ours[&short(path)]), &reference, 1e-5);
    }
    let summary: Value =
        serde_json::from_slice(&std::fs::read(t.dir.join("calibrated-train/summary.json")).unwrap()).unwrap();
    assert_eq!(summary["calibration"]["temperature"].as_f64(), Some(temperature));

    // train.calibrate = true calibrated the best checkpoint on the validation split as
    // `rtrain calibrate` does.
    let output = common::rtrain(&t.dir)
        .args(["calibrate", "--checkpoint", "run/checkpoints/best.safetensors", "--data"])
        .arg(t.data.join("val"))
        .args(["--out", "best-calibrated.safetensors", "--json"])
        .args(FP32)
        .output()
        .unwrap();
    let best = json_of(output, "rtrain calibrate (best)")["calibration"]["temperature"].as_f64().unwrap();
    let metadata = rtrain::util::files::read_metadata(&t.run.join("calibrated.safetensors")).unwrap();
    let recorded: Value = serde_json::from_str(&metadata["rtrain.weights"]).unwrap();
    // Equal but for the summation order of the threads training ran with (1 here, 2 there).
    let trained_t = recorded["calibration"]["temperature"].as_f64().unwrap();
    assert!((trained_t - best).abs() < 1e-6, "train.calibrate fitted {trained_t}, calibrate {best}");
    assert_eq!(recorded["preprocessing"]["image_size"], 32);
}

/// eval's NLL, Brier score and ECE, after the temperature and before it, are scikit-learn's
/// (`log_loss`, `brier_score_loss`) and the definition's (15 equal-width bins) on the
/// probabilities eval wrote, to 1e-9.
#[test]
fn evals_nll_brier_and_ece_are_scikit_learns_before_and_after() {
    let t = trained();
    calibrated("scored.safetensors", &[]);
    let mut scores = Vec::new();
    for (model, out) in [("scored.safetensors", "eval-after"), ("run/model.safetensors", "eval-before")] {
        let output = common::rtrain(&t.dir)
            .args(["eval", "--checkpoint", model, "--data"])
            .arg(t.data.join("train"))
            .args(["--out", out, "--json", "--bootstrap", "50"])
            .args(FP32)
            .output()
            .unwrap();
        let report = json_of(output, "rtrain eval");
        let rows = common::csv_rows(&t.dir.join(out).join("predictions.csv"));
        let labels: Vec<usize> =
            rows.iter().map(|r| CLASSES.iter().position(|c| *c == r["true_class"]).unwrap()).collect();
        let probabilities: Vec<Vec<f64>> = rows.iter().map(probabilities).collect();
        let sklearn = common::calibration_reference(
            "metrics",
            &json!({"probabilities": probabilities, "labels": labels}),
        );
        let ece = definition_ece(&probabilities, &labels);
        let trust = &report["trust"]["scores"];
        for (name, theirs) in [("nll", &sklearn["log_loss"]), ("brier", &sklearn["brier_unscaled"])] {
            let (a, b) = (trust[name].as_f64().unwrap(), theirs.as_f64().unwrap());
            assert!((a - b).abs() < 1e-9, "{out} {name}: rtrain {a}, scikit-learn {b}");
        }
        assert!((trust["ece"].as_f64().unwrap() - ece).abs() < 1e-9, "{out} ece: {trust} vs {ece}");
        let interval = &trust["intervals"]["nll"];
        assert!(
            interval["low"].as_f64() <= trust["nll"].as_f64()
                && trust["nll"].as_f64() <= interval["high"].as_f64()
        );
        scores.push(report["trust"].clone());
    }
    // The calibrated model's "before" is the uncalibrated model's own evaluation.
    let (after, before) = (&scores[0], &scores[1]);
    for name in ["nll", "brier", "ece"] {
        let (a, b) =
            (after["before_temperature"][name].as_f64().unwrap(), before["scores"][name].as_f64().unwrap());
        assert!((a - b).abs() < 1e-12, "before {name}: {a} vs {b}");
    }
    assert!(before["before_temperature"].is_null());
}

/// The expected calibration error by its definition: 15 equal-width bins of the top
/// probability, (lower, upper], each weighted by its share of the images.
fn definition_ece(probabilities: &[Vec<f64>], labels: &[usize]) -> f64 {
    let mut bins = vec![(0usize, 0f64, 0usize); 15];
    for (row, &label) in probabilities.iter().zip(labels) {
        let (top, confidence) =
            row.iter()
                .copied()
                .enumerate()
                .fold((0, f64::MIN), |best, (i, p)| if p > best.1 { (i, p) } else { best });
        let bin = ((confidence * 15.0).ceil() as usize).clamp(1, 15) - 1;
        bins[bin].0 += 1;
        bins[bin].1 += confidence;
        bins[bin].2 += usize::from(top == label);
    }
    let n = labels.len() as f64;
    bins.iter()
        .filter(|b| b.0 > 0)
        .map(|&(count, confidence, correct)| {
            count as f64 / n * (correct as f64 / count as f64 - confidence / count as f64).abs()
        })
        .sum()
}

/// `calibrate --conformal`'s prediction sets, as `predict --abstain` writes them, are MAPIE
/// 1.6's photo for photo (LAC and APS, given the same probabilities and, for APS, the same
/// uniform draws), and abstaining is a set of other than one class.
#[test]
fn prediction_sets_are_mapies_photo_for_photo() {
    let t = trained();
    let cal_photos = photos(&t.data.join("val"));
    for (method, alpha) in [("lac", "0.1"), ("aps", "0.05")] {
        let model = format!("sets-{method}.safetensors");
        let report = calibrated(&model, &["--conformal", "--method", method, "--alpha", alpha]);
        let threshold = report["calibration"]["conformal"]["threshold"].as_f64().unwrap();
        // Calibration probabilities in f64, as calibrate saw them: eval of the calibrated model.
        let eval_probabilities = |split: &str, out: &str| -> Vec<Vec<f64>> {
            let output = common::rtrain(&t.dir)
                .args(["eval", "--checkpoint", &model, "--data"])
                .arg(t.data.join(split))
                .args(["--out", out, "--bootstrap", "0"])
                .args(FP32)
                .output()
                .unwrap();
            common::assert_success(output, "rtrain eval");
            common::csv_rows(&t.dir.join(out).join("predictions.csv")).iter().map(probabilities).collect()
        };
        let calibration = eval_probabilities("val", &format!("sets-{method}-val"));
        let test = eval_probabilities("train", &format!("sets-{method}-train"));
        let labels: Vec<usize> = cal_photos.iter().map(|(_, l)| *l).collect();
        let uniforms = rtrain::calibration::aps_uniforms(labels.len());
        let mapie = common::calibration_reference(
            "conformal",
            &json!({
                "calibration": {"probabilities": calibration, "labels": labels},
                "test": {"probabilities": test},
                "alphas": [alpha.parse::<f64>().unwrap()], "method": method, "uniforms": uniforms,
            }),
        );
        let result = &mapie["results"][0];
        assert!(
            (result["threshold"].as_f64().unwrap() - threshold).abs() < 1e-12,
            "{method}: {result} vs {threshold}"
        );

        let out = format!("sets-{method}-predict");
        let output = common::rtrain(&t.dir)
            .args(["predict", "--checkpoint", &model, "--abstain", "--out", &out])
            .arg(t.data.join("train"))
            .args(FP32)
            .output()
            .unwrap();
        common::assert_success(output, "rtrain predict --abstain");
        let rows = common::csv_rows(&t.dir.join(&out).join("predictions.csv"));
        let mut abstained = 0;
        for (i, row) in rows.iter().enumerate() {
            let theirs: Vec<&str> = result["sets"][i]
                .as_array()
                .unwrap()
                .iter()
                .zip(CLASSES)
                .filter(|(inside, _)| inside.as_bool().unwrap())
                .map(|(_, class)| class)
                .collect();
            let ours: Vec<&str> = row["prediction_set"].split('|').filter(|c| !c.is_empty()).collect();
            assert_eq!(ours, theirs, "{method} {}: {row:?}", row["path"]);
            assert_eq!(row["set_size"], theirs.len().to_string());
            assert_eq!(row["abstain"], (theirs.len() != 1).to_string());
            abstained += usize::from(theirs.len() != 1);
        }
        let summary: Value =
            serde_json::from_slice(&std::fs::read(t.dir.join(&out).join("summary.json")).unwrap()).unwrap();
        assert_eq!(summary["abstained"], abstained, "{method}");
    }
}

/// Three members (the final weights, a step checkpoint and the calibrated model, each with its
/// own temperature) with flip TTA: the mean over members of each one's mean softmax over the
/// photo and its mirror, as torchvision computes it (1e-5); the same bytes with 0 and 2 loader
/// workers; the summary names every member with its sha256 and the passes it cost.
#[test]
fn an_ensemble_with_flips_is_the_mean_of_torchvisions_softmaxes() {
    let t = trained();
    let report = calibrated("member.safetensors", &[]);
    let temperature = report["calibration"]["temperature"].as_f64().unwrap();
    let mut steps: Vec<PathBuf> = std::fs::read_dir(t.run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("step-"))
        .collect();
    steps.sort();
    let step = steps[0].clone();
    let exported = t.dir.join("step-exported.safetensors");
    let output =
        common::rtrain(&t.dir).arg("export").arg("--checkpoint").arg(&step).arg(&exported).output().unwrap();
    common::assert_success(output, "rtrain export");

    let val: Vec<PathBuf> = photos(&t.data.join("val")).into_iter().map(|(p, _)| p).collect();
    let mut outputs = Vec::new();
    for workers in ["0", "2"] {
        let out = format!("ensemble-{workers}");
        let output = common::rtrain(&t.dir)
            .args(["predict", "--checkpoint", "run", "--checkpoint"])
            .arg(&step)
            .args(["--checkpoint", "member.safetensors", "--tta", "flip", "--out", &out])
            .args(["--set", &format!("data.workers={workers}")])
            .arg(t.data.join("val"))
            .args(FP32)
            .output()
            .unwrap();
        common::assert_success(output, "rtrain predict (ensemble)");
        outputs.push(std::fs::read(t.dir.join(&out).join("predictions.csv")).unwrap());
    }
    assert_eq!(outputs[0], outputs[1], "the ensemble's bytes depend on the loader's workers");

    let members = [
        (t.run.join("model.safetensors"), 1.0),
        (exported, 1.0),
        (t.run.join("model.safetensors"), temperature),
    ];
    let theirs = torchvision_ensemble(&members, &val, true);
    let ours = predicted(&t.dir, "ensemble-0");
    for path in &val {
        let reference: Vec<f64> = serde_json::from_value(theirs[path.to_str().unwrap()].clone()).unwrap();
        assert_close(&short(path), &probabilities(&ours[&short(path)]), &reference, 1e-5);
    }
    let summary: Value =
        serde_json::from_slice(&std::fs::read(t.dir.join("ensemble-0/summary.json")).unwrap()).unwrap();
    assert_eq!(summary["passes_per_image"], 6);
    assert_eq!(summary["tta"], "flip");
    let listed: Vec<&Value> = summary["members"].as_array().unwrap().iter().collect();
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[2]["temperature"].as_f64(), Some(temperature));
    for member in listed {
        assert_eq!(member["sha256"].as_str().unwrap().len(), 64, "{member}");
    }
}
