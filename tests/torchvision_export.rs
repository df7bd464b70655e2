//! `rtrain export` writes state dicts that torchvision loads strictly and that give the same
//! logits there as here (tests/reference/torchvision_logits.py runs the torchvision side), and
//! torchvision-format files load into rtrain as pretrained weights.

use crate::common;

use std::collections::HashMap;

use rtrain::model::{Arch, Model};
use rtrain::run_dir::checkpoint;
use rtrain::util::files::{read_safetensors, write_safetensors};
use tch::{Device, Kind, Tensor};

fn exported_logits_match(arch: Arch, num_classes: usize, head_hidden: &[usize]) {
    let dir = tempfile::tempdir().unwrap();
    tch::manual_seed(11);
    let model = Model::with_head(arch, num_classes, head_hidden, Device::Cpu).unwrap();
    // Move the BatchNorm running statistics away from their initial 0/1, so that the test sees
    // whether they are exported under the right names.
    tch::no_grad(|| {
        for _ in 0..3 {
            let _ = model
                .forward_t(&(Tensor::randn([4, 3, 64, 64], (Kind::Float, Device::Cpu)) * 2.0 + 0.5), true);
        }
    });
    let classes = (0..num_classes).map(|i| format!("c{i}")).collect();
    let meta = common::checkpoint_meta(arch, classes, head_hidden, 3, 64);
    let ckpt = dir.path().join("ckpt.safetensors");
    checkpoint::save(&ckpt, &meta, model.state_dict().into_iter().collect(), vec![]).unwrap();
    let weights = dir.path().join("weights.safetensors");
    common::rtrain(dir.path()).args(["export", "--checkpoint"]).arg(&ckpt).arg(&weights).assert().success();

    let input = Tensor::randn([2, 3, 64, 64], (Kind::Float, Device::Cpu));
    let input_path = dir.path().join("input.safetensors");
    write_safetensors(&input_path, &[("input".into(), input.shallow_clone())], None).unwrap();
    let out = dir.path().join("logits.safetensors");
    let head = head_hidden.iter().map(|w| w.to_string()).collect::<Vec<_>>().join(",");
    common::run_python(
        "torchvision_logits.py",
        &[
            arch.name().as_ref(),
            num_classes.to_string().as_ref(),
            weights.as_os_str(),
            input_path.as_os_str(),
            out.as_os_str(),
            head.as_ref(),
        ],
    );
    let theirs = &read_safetensors(&out).unwrap().tensors["logits"];
    let ours = tch::no_grad(|| model.forward_t(&input, false));
    assert_eq!(theirs.size(), vec![2, num_classes as i64]);
    let diff = (&ours - theirs).abs().max().double_value(&[]);
    let scale = theirs.abs().max().double_value(&[]);
    assert!(scale > 1e-3, "logits should not be trivially zero");
    assert!(diff <= 1e-5 * scale.max(1.0), "{arch}: logits differ from torchvision's by {diff}");
}

#[test]
fn resnet18_export_loads_strictly_in_torchvision_with_equal_logits() {
    exported_logits_match(Arch::Resnet18, 4, &[]);
}

/// The tutorial's head, `nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 3))`, and a
/// deeper one: the export loads strictly into torchvision after the same `model.fc = ...`.
#[test]
fn an_mlp_head_exports_as_torchvisions_sequential_with_equal_logits() {
    exported_logits_match(Arch::Resnet34, 3, &[512]);
    exported_logits_match(Arch::Resnet18, 5, &[64, 32]);
}

#[test]
fn resnet50_export_loads_strictly_in_torchvision_with_equal_logits() {
    exported_logits_match(Arch::Resnet50, 7, &[]);
}

#[test]
fn torchvision_imagenet_layout_loads_as_pretrained() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tv.safetensors");
    let script = format!(
        "import torch, torchvision\nfrom safetensors.torch import save_file\ntorch.manual_seed(5)\nm = torchvision.models.resnet18()\nsave_file({{k: v.contiguous() for k, v in m.state_dict().items()}}, {:?})",
        path.display().to_string()
    );
    let status = std::process::Command::new(common::python()).args(["-c", &script]).status().unwrap();
    assert!(status.success());
    let model = Model::new(Arch::Resnet18, 4, Device::Cpu).unwrap();
    let report = model.load_pretrained(&path).unwrap();
    assert_eq!(report.reinitialised, vec!["fc.bias".to_string(), "fc.weight".to_string()]);
    assert_eq!(report.ignored.len(), 20);
    let file: HashMap<String, Tensor> = read_safetensors(&path).unwrap().tensors.into_iter().collect();
    let loaded: Vec<(String, Tensor)> =
        model.state_dict().into_iter().filter(|(name, _)| !name.starts_with("fc.")).collect();
    assert_eq!((loaded.len(), report.loaded), (100, 100), "60 parameters and 40 BatchNorm statistics");
    for (name, tensor) in &loaded {
        assert!(tensor.equal(&file[name]), "{name} not loaded");
    }
    assert_eq!(model.state_dict()["fc.weight"].size(), vec![4, 512]);
}
