//! The Rust optimizers and learning-rate schedules against torch.optim on the same libtorch:
//! tests/reference/optim_reference.py and plateau_reference.py make the references, these tests
//! replay them.

use crate::common;

use std::collections::BTreeMap;

use rtrain::config::{OptimConfig, OptimKind, PlateauMode, ScheduleConfig, ScheduleKind, ThresholdMode};
use rtrain::train::optim::{Optimizer, Schedule};
use rtrain::util::files::read_safetensors;
use serde_json::Value;
use tch::{Kind, Tensor};

fn replay(case: &str, files: &std::path::Path) {
    let file = read_safetensors(&files.join(format!("{case}.safetensors"))).unwrap();
    let meta: Value = serde_json::from_str(&file.metadata["case"]).unwrap();
    let f = |key: &str| meta[key].as_f64().unwrap();
    let u = |key: &str| meta[key].as_u64().unwrap();
    let mut optim = OptimConfig {
        name: match meta["name"].as_str() {
            Some("sgd") => OptimKind::Sgd,
            Some("adam") => OptimKind::Adam,
            _ => OptimKind::Adamw,
        },
        lr: f("lr"),
        weight_decay: f("weight_decay"),
        ..OptimConfig::default()
    };
    if optim.name == OptimKind::Sgd {
        optim.momentum = f("momentum");
        optim.nesterov = meta["nesterov"].as_bool().unwrap();
    } else {
        optim.betas = [meta["betas"][0].as_f64().unwrap(), meta["betas"][1].as_f64().unwrap()];
        optim.eps = f("eps");
    }
    let schedule_config = ScheduleConfig {
        kind: ScheduleKind::Cosine,
        warmup_epochs: f("warmup_epochs"),
        warmup_start_factor: f("warmup_start_factor"),
        min_lr: f("min_lr"),
        ..ScheduleConfig::default()
    };
    let schedule = Schedule::new(&schedule_config, optim.lr, u("steps_per_epoch"), u("epochs") as u32);
    let t: &BTreeMap<String, Tensor> = &file.tensors;
    let count = t.keys().filter(|k| k.starts_with("param.")).count();
    let params: Vec<Tensor> =
        (0..count).map(|i| t[&format!("param.{i}")].copy().set_requires_grad(true)).collect();
    let named = params.iter().enumerate().map(|(i, p)| (format!("p{i}"), p.shallow_clone())).collect();
    let mut optimizer = Optimizer::new(&optim, named);
    let reference_lr: Vec<f64> = Vec::try_from(&t["lr"]).unwrap();
    for (step, &expected_lr) in reference_lr.iter().enumerate() {
        let lr = schedule.lr(step as u64);
        assert!(
            (lr - expected_lr).abs() <= 1e-12 * expected_lr.abs().max(1.0),
            "{case} step {step}: lr {lr} vs torch {expected_lr}"
        );
        optimizer.zero_grad();
        // A loss whose gradient with respect to each parameter is exactly the reference's.
        let loss = params
            .iter()
            .enumerate()
            .map(|(i, p)| (p * &t[&format!("grad.{step}.{i}")]).sum(Kind::Float))
            .reduce(|a, b| a + b)
            .unwrap();
        loss.backward();
        optimizer.step(lr).unwrap();
    }
    for (i, p) in params.iter().enumerate() {
        let expected = &t[&format!("expected.{i}")];
        let initial = &t[&format!("param.{i}")];
        let moved = (expected - initial).abs().max().double_value(&[]);
        assert!(moved > 1e-3, "{case}: the reference must actually move the parameters");
        let diff = (p.detach() - expected).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "{case}: parameter {i} differs from torch.optim by {diff}");
    }
}

#[test]
fn optimizers_and_schedule_match_torch_optim() {
    let dir = tempfile::tempdir().unwrap();
    common::run_python("optim_reference.py", &[dir.path().as_os_str()]);
    for case in ["sgd_plain", "sgd_momentum", "sgd_nesterov", "adam", "adamw"] {
        replay(case, dir.path());
    }
}

/// ReduceLROnPlateau against torch's on fixed metric sequences: every epoch's learning rate
/// equal (the tutorial's settings, abs/rel thresholds, min and max modes, cooldown, the floor).
#[test]
fn reduce_lr_on_plateau_matches_torch() {
    let dir = tempfile::tempdir().unwrap();
    common::run_python("plateau_reference.py", &[dir.path().as_os_str()]);
    let cases: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("plateau.json")).unwrap()).unwrap();
    for (name, case) in cases.as_object().unwrap() {
        let p = &case["params"];
        let f = |key: &str| p[key].as_f64().unwrap();
        let config = ScheduleConfig {
            kind: ScheduleKind::Plateau,
            warmup_epochs: 0.0,
            mode: if p["mode"] == "min" { PlateauMode::Min } else { PlateauMode::Max },
            factor: f("factor"),
            patience: p["patience"].as_u64().unwrap() as u32,
            threshold: f("threshold"),
            threshold_mode: if p["threshold_mode"] == "rel" {
                ThresholdMode::Rel
            } else {
                ThresholdMode::Abs
            },
            cooldown: p["cooldown"].as_u64().unwrap() as u32,
            min_lr: f("min_lr"),
            ..ScheduleConfig::default()
        };
        let mut schedule = Schedule::new(&config, f("lr"), 10, 30);
        let metrics: Vec<f64> = serde_json::from_value(case["metrics"].clone()).unwrap();
        let expected: Vec<f64> = serde_json::from_value(case["lr"].clone()).unwrap();
        for (epoch, (&metric, &expected_lr)) in metrics.iter().zip(&expected).enumerate() {
            // The metric goes in as the loss and as the top-1: the mode picks which it watches.
            schedule.after_evaluation(metric, metric);
            let lr = schedule.lr(10 * (epoch as u64 + 1));
            assert!(
                (lr - expected_lr).abs() <= 1e-15 * expected_lr,
                "{name} epoch {epoch}: lr {lr} vs torch {expected_lr}"
            );
        }
    }
}
