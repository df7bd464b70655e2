//! Starting weights as torchvision users have them: `.pth` files written by `torch.save`, and
//! published weights fetched by name into PyTorch's cache. The files come from PyTorch itself
//! (tests/reference/torchvision_pth.py).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use rtrain::model::weights::PUBLISHED;
use tch::Tensor;

fn safetensors(path: &Path) -> BTreeMap<String, Tensor> {
    rtrain::util::files::read_safetensors(path).unwrap().tensors
}

/// Writes torchvision's `arch` with torch.save into `dir`; returns the .pth's hub-style name.
fn write_pth(arch: &str, dir: &Path) -> String {
    let output = std::process::Command::new(common::python())
        .arg(common::repo().join("tests/reference/torchvision_pth.py"))
        .args(["write", arch])
        .arg(dir)
        .output()
        .unwrap();
    let output = common::assert_success(output, "torchvision_pth.py write");
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

#[test]
fn published_weights_match_torchvision() {
    let output = std::process::Command::new(common::python())
        .arg(common::repo().join("tests/reference/torchvision_pth.py"))
        .arg("published")
        .output()
        .unwrap();
    let output = common::assert_success(output, "torchvision_pth.py published");
    let table: BTreeMap<String, BTreeMap<String, String>> = serde_json::from_slice(&output.stdout).unwrap();
    let ours: BTreeMap<String, BTreeMap<String, String>> =
        PUBLISHED.iter().fold(BTreeMap::new(), |mut t, p| {
            t.entry(p.arch.name().to_string()).or_default().insert(p.name.to_string(), p.file.to_string());
            t
        });
    assert_eq!(ours, table);
}

/// `rtrain weights convert` reads PyTorch's zip archive and writes every tensor with its exact
/// dtype, shape and bytes (the reference: the same state dict saved by Python's safetensors).
#[test]
fn a_torch_save_file_converts_tensor_for_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let name = write_pth("resnet34", dir.path());
    common::rtrain(dir.path())
        .args(["weights", "convert", &name, "converted.safetensors"])
        .assert()
        .success();
    let (ours, expected) = (
        safetensors(&dir.path().join("converted.safetensors")),
        safetensors(&dir.path().join("expected.safetensors")),
    );
    assert_eq!(ours.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>());
    assert!(ours.len() > 200, "{} tensors", ours.len());
    for (key, tensor) in &expected {
        assert_eq!(ours[key].kind(), tensor.kind(), "{key}");
        assert!(ours[key].equal(tensor), "{key} differs");
    }
}

/// `model.weights` names a file on a server (loopback here) that is not in the cache: training
/// fetches it into an empty `$TORCH_HOME/hub/checkpoints`, checks it against the hash prefix in
/// its name, starts from it (with backbone and BatchNorm frozen, the trained model still holds
/// its exact tensors) and records it in the manifest. A second run finds it cached.
#[test]
fn training_fetches_named_weights_into_an_empty_cache_and_starts_from_them() {
    let dir = tempfile::tempdir().unwrap();
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    let name = write_pth("resnet18", &served);
    let url = common::serve_dir(&served);
    let data = common::synth(dir.path(), 4, 2, 32);
    let torch_home = dir.path().join("torch");
    let train = |run: &str, base_url: &str| {
        let mut command = common::rtrain(dir.path());
        command
            .env("TORCH_HOME", &torch_home)
            .args(["train", "--run-dir", run])
            .args(["--set", &format!("data.root={:?}", data.to_string_lossy())])
            .args(["--set", "data.image_size=32", "--set", "data.batch_size=8", "--set", "train.epochs=1"])
            .args(["--set", "model.freeze_backbone=true", "--set", "model.freeze_batchnorm=true"])
            .args([
                "--set",
                &format!("model.weights={name:?}"),
                "--set",
                &format!("model.weights_url={base_url:?}"),
            ]);
        command
    };
    train("first", &url).assert().success();

    let cached = torch_home.join("hub/checkpoints").join(&name);
    assert_eq!(std::fs::read(&cached).unwrap(), std::fs::read(served.join(&name)).unwrap());
    let expected = safetensors(&served.join("expected.safetensors"));
    let trained = safetensors(&dir.path().join("first/model.safetensors"));
    for key in ["conv1.weight", "layer4.1.bn2.weight", "layer3.0.downsample.1.running_var"] {
        assert!(trained[key].equal(&expected[key]), "{key} is not the served file's");
    }
    assert_eq!(trained["fc.weight"].size(), [4, 512], "the head is re-initialised for 4 classes");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("first/manifest.json")).unwrap())
            .unwrap();
    let start = &manifest["starting_weights"];
    assert_eq!(start["name"], name.as_str());
    assert_eq!(start["url"], format!("{url}{name}").as_str());
    let sha = start["sha256"].as_str().unwrap();
    assert!(name.contains(&sha[..8]) && sha.len() == 64, "{sha} vs {name}");

    // Cached: a server that does not answer is never asked.
    train("second", "http://127.0.0.1:9/").assert().success();
}

/// Weights that are neither cached nor fetchable: the error names the cache file, the URL and
/// the command that fills the cache.
#[test]
fn weights_neither_cached_nor_fetchable_name_the_file_url_and_fetch_command() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 2, 1, 32);
    let torch_home = dir.path().join("torch");
    let output = common::rtrain(dir.path())
        .env("TORCH_HOME", &torch_home)
        .args(["train", "--run-dir", "run"])
        .args(["--set", &format!("data.root={:?}", data.to_string_lossy())])
        .args(["--set", "data.batch_size=4", "--set", "data.image_size=32"])
        .args(["--set", "model.arch=\"resnet34\"", "--set", "model.weights=\"IMAGENET1K_V1\""])
        .args(["--set", "model.weights_url=\"http://127.0.0.1:9/models/\""])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let file = torch_home.join("hub/checkpoints/resnet34-b627a593.pth");
    for needle in [
        file.to_string_lossy().as_ref(),
        "http://127.0.0.1:9/models/resnet34-b627a593.pth",
        "rtrain weights fetch resnet34 --weights IMAGENET1K_V1",
    ] {
        assert!(stderr.contains(needle), "missing {needle:?} in:\n{stderr}");
    }
    assert!(!file.exists());
}
