//! The DesignSafe tutorial's job as its users run it: `configs/designsafe-tutorial.toml` (ResNet-34
//! from torchvision weights, the MLP head, AutoAugment, Resize((s, s)) without Normalize, Adam,
//! label smoothing, ReduceLROnPlateau, SyncBatchNorm) on a tree with the tutorial's layout,
//! checked against the same recipe in PyTorch (tests/reference/tutorial_reference.py).

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rtrain::model::weights::read_state_dict;
use serde_json::Value;
use tch::{Kind, Tensor};

const CONFIG: &str = "configs/designsafe-tutorial.toml";

fn reference(args: &[&std::ffi::OsStr]) -> String {
    let output = std::process::Command::new(common::python())
        .arg(common::repo().join("tests/reference/tutorial_reference.py"))
        .args(args)
        .output()
        .unwrap();
    let output = common::assert_success(output, "tutorial_reference.py");
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// `Dataset_2/{Train,Validation}/{C0,C2,C4}` with `per_class` training photos per class.
fn tutorial_tree(dir: &Path, per_class: usize) -> PathBuf {
    let data = dir.join("Dataset_2");
    reference(&["tree".as_ref(), data.as_os_str(), per_class.to_string().as_ref()]);
    data
}

/// A resnet34 `.pth` written by torch.save into `dir`, named as torch.hub names files.
fn torch_weights(dir: &Path, kind: &str) -> String {
    std::fs::create_dir_all(dir).unwrap();
    reference(&["weights".as_ref(), dir.as_os_str(), kind.as_ref()])
}

fn safetensors(path: &Path) -> BTreeMap<String, Tensor> {
    rtrain::util::files::read_safetensors(path).unwrap().tensors
}

fn json_file(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn set(args: &mut Vec<String>, setting: impl Into<String>) {
    args.extend(["--set".to_string(), setting.into()]);
}

/// One step of the tutorial's model and loss (augmentation off, the same 12 photos in one
/// batch, the same starting weights) in rtrain and in PyTorch: the loss agrees within 1e-5
/// relative and the update within 1e-4 relative (Adam's first step moves nearly every weight
/// by lr, so a wrong gradient sign or scale shows at once).
#[test]
fn one_training_step_agrees_with_pytorch() {
    let dir = tempfile::tempdir().unwrap();
    let data = tutorial_tree(dir.path(), 4);
    let cache = dir.path().join("torch/hub/checkpoints");
    let name = torch_weights(&cache, "head");
    let start = read_state_dict(&cache.join(&name)).unwrap();

    let mut args =
        vec!["train".to_string(), "--config".into(), common::repo().join(CONFIG).to_string_lossy().into()];
    args.extend(["--run-dir".to_string(), "run".into()]);
    set(&mut args, format!("data.root={:?}", data.to_string_lossy()));
    set(&mut args, format!("model.weights={name:?}"));
    for setting in [
        "data.image_size=64",
        "data.batch_size=12",
        "data.augment_policy=\"none\"",
        "data.workers=0",
        "model.sync_batchnorm=false",
        "train.epochs=1",
        // PyTorch's default memory format, so that both run the same libtorch kernels: Adam's
        // first step divides each gradient by its own size, which turns the rounding of
        // near-zero gradients under another kernel (channels-last) into 1e-3 of the update.
        "train.channels_last=false",
    ] {
        set(&mut args, setting);
    }
    common::rtrain(dir.path()).env("TORCH_HOME", dir.path().join("torch")).args(&args).assert().success();

    let out = dir.path().join("torch_step.safetensors");
    let printed = reference(&[
        "step".as_ref(),
        cache.join(&name).as_os_str(),
        data.as_os_str(),
        "64".as_ref(),
        out.as_os_str(),
    ]);
    let torch_loss = serde_json::from_str::<Value>(&printed).unwrap()["loss"].as_f64().unwrap();
    let epoch = std::fs::read_to_string(dir.path().join("run/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|record| record.get("train_loss").is_some())
        .unwrap();
    assert_eq!(epoch["global_step"], 1, "one step of 12 images");
    let loss = epoch["train_loss"].as_f64().unwrap();
    let loss_rel = (loss - torch_loss).abs() / torch_loss.abs();
    assert!(loss_rel < 1e-5, "loss: rtrain {loss}, PyTorch {torch_loss} (relative {loss_rel:e})");

    let (ours, torch) = (safetensors(&dir.path().join("run/model.safetensors")), safetensors(&out));
    let (mut diff_sq, mut update_sq, mut worst) = (0.0, 0.0, (0.0, String::new()));
    for (key, before) in start.iter().filter(|(_, t)| t.kind() == Kind::Float) {
        let (update_ours, update_torch) = (&ours[key] - before, &torch[key] - before);
        let diff = (&update_ours - &update_torch).square().sum(Kind::Double).double_value(&[]);
        let size = update_torch.square().sum(Kind::Double).double_value(&[]);
        if size > 0.0 && (diff / size).sqrt() > worst.0 {
            worst = ((diff / size).sqrt(), key.clone());
        }
        (diff_sq, update_sq) = (diff_sq + diff, update_sq + size);
    }
    let update_rel = (diff_sq / update_sq).sqrt();
    eprintln!(
        "one step: loss {loss} vs {torch_loss} (relative {loss_rel:e}); update relative {update_rel:e}, worst tensor {} {:e}",
        worst.1, worst.0
    );
    assert!(update_rel < 1e-4, "update differs by {update_rel:e} relative (worst {} {:e})", worst.1, worst.0);
}

/// The tutorial's config end to end under `mpirun -np 2`: its weights fetched over loopback into
/// an empty cache and checked, then SyncBatchNorm, AutoAugment, the plateau schedule and the MLP
/// head in training; the best model evaluated again; the exported weights load strictly into
/// torchvision with the same head and give `rtrain predict`'s probabilities within 1e-5.
#[test]
fn the_tutorial_config_trains_end_to_end_under_mpirun() {
    let dir = tempfile::tempdir().unwrap();
    let data = tutorial_tree(dir.path(), 6);
    let served = dir.path().join("served");
    let name = torch_weights(&served, "imagenet");
    let url = common::serve_dir(&served);
    let torch_home = dir.path().join("torch");

    let mut args = vec!["-np".to_string(), "2".into(), env!("CARGO_BIN_EXE_rtrain").into(), "train".into()];
    args.extend(["--config".to_string(), common::repo().join(CONFIG).to_string_lossy().into()]);
    args.extend(["--run-dir".to_string(), "run".into()]);
    set(&mut args, format!("data.root={:?}", data.to_string_lossy()));
    set(&mut args, format!("model.weights={name:?}"));
    set(&mut args, format!("model.weights_url={url:?}"));
    for setting in
        ["data.image_size=64", "data.batch_size=4", "data.workers=0", "train.epochs=2", "train.threads=1"]
    {
        set(&mut args, setting);
    }
    let mut mpirun = common::mpirun(dir.path());
    mpirun.env("TORCH_HOME", &torch_home).args(&args);
    common::assert_success(
        mpirun.output().unwrap(),
        "mpirun -np 2 rtrain train --config designsafe-tutorial.toml",
    );

    let run = dir.path().join("run");
    assert!(torch_home.join("hub/checkpoints").join(&name).is_file(), "weights not fetched into the cache");
    let manifest = json_file(&run.join("manifest.json"));
    assert_eq!(manifest["starting_weights"]["name"], name.as_str());
    let config = &manifest["config"];
    assert_eq!(config["data"]["augment_policy"], "autoaugment_imagenet");
    assert_eq!(config["model"]["sync_batchnorm"], true);
    assert_eq!(config["schedule"]["kind"], "plateau");
    let summary = json_file(&run.join("summary.json"));
    assert_eq!(summary["world_size"], 2);
    assert!(summary["best_epoch"].is_number() && summary["best_eval"]["samples"] == 9, "{summary}");

    let images: Vec<PathBuf> = ["C0/C0_000.jpg", "C2/C2_001.jpg", "C4/C4_002.jpg"]
        .iter()
        .map(|file| data.join("Validation").join(file))
        .collect();
    let output = common::rtrain(dir.path())
        .args(["predict", "--checkpoint", "run/model.safetensors", "--json", "--top", "3", "--config"])
        .arg(common::repo().join(CONFIG))
        .args(["--set", "data.image_size=64"])
        .args(&images)
        .output()
        .unwrap();
    let output = common::assert_success(output, "rtrain predict");
    let ours: Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut args: Vec<&std::ffi::OsStr> = vec!["predict".as_ref()];
    let weights = run.join("model.safetensors");
    args.extend([weights.as_os_str(), "64".as_ref()]);
    args.extend(images.iter().map(|p| p.as_os_str()));
    let torch: Value = serde_json::from_str(&reference(&args)).unwrap();
    let classes = ["C0", "C2", "C4"];
    let mut worst: f64 = 0.0;
    for prediction in ours.as_array().unwrap() {
        let image = prediction["image"].as_str().unwrap();
        for entry in prediction["top"].as_array().unwrap() {
            let class = classes.iter().position(|c| entry["class"] == *c).unwrap();
            let theirs = torch[image][class].as_f64().unwrap();
            worst = worst.max((entry["probability"].as_f64().unwrap() - theirs).abs());
        }
    }
    eprintln!("predict vs torchvision: max |probability difference| {worst:e}");
    assert!(worst < 1e-5, "rtrain predict and torchvision differ by {worst:e}");
}
