//! `rtrain calibrate`: a model's probabilities made trustworthy on held-out images, written as
//! a new model file. Temperature scaling (one scalar T minimising the negative log-likelihood of
//! the split, [`calibration::fit_temperature`]); with `--conformal`, the split-conformal
//! threshold of prediction sets (LAC or APS) on the calibrated probabilities; and the entropy
//! above which a photo counts as uncertain. What was fitted, and on which images (the split's
//! name and sha256), goes into the new file's metadata, under its digest; `predict`, `eval` and
//! `explain` apply it. The weights are the input model's, unchanged.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::calibration::{self, ConformalMethod};
use crate::cluster::Communicator;
use crate::data::dataset::Dataset;
use crate::inference::Ensemble;
use crate::metrics::{self, Predictions};
use crate::plan::RunPlan;
use crate::run_dir::checkpoint::{Calibration, Conformal, FittedOn, WeightsMeta, UNCERTAIN_QUANTILE};
use crate::train::eval::{self, CheckpointEvaluation};

/// The prediction-set rule to fit beside the temperature (`--conformal`).
#[derive(Debug, Clone, Copy)]
pub struct ConformalRequest {
    pub method: ConformalMethod,
    pub alpha: f64,
}

/// What calibrating found, for the log and the command's output.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Calibrated {
    pub model: PathBuf,
    pub out: PathBuf,
    pub calibration: Calibration,
    pub ece_before: f64,
    pub ece_after: f64,
}

impl Calibrated {
    /// What calibrating `ensemble`'s model on `evaluation` into `out` did.
    pub fn new(
        ensemble: &Ensemble,
        evaluation: &CheckpointEvaluation,
        calibration: Calibration,
        out: &Path,
    ) -> Self {
        let labels: Vec<usize> = evaluation.images.iter().map(|i| i.label).collect();
        let ece = |temperature: f64| {
            let probabilities: Vec<Vec<f64>> =
                evaluation.images.iter().map(|i| calibration::softmax(&i.logits, temperature)).collect();
            metrics::ece(&Predictions {
                labels: &labels,
                probabilities: &probabilities,
                num_classes: evaluation.classes.len(),
            })
        };
        Calibrated {
            model: ensemble.first().path.clone(),
            out: out.to_path_buf(),
            ece_before: ece(1.0),
            ece_after: ece(calibration.temperature),
            calibration,
        }
    }
}

/// Fits the calibration of the one model of `ensemble` on `split` of `root` (every rank
/// evaluates its share; a collective), returning it on every rank.
pub fn fit(
    plan: &RunPlan,
    comm: &dyn Communicator,
    ensemble: &Ensemble,
    root: &Path,
    split: &str,
    conformal: Option<ConformalRequest>,
) -> Result<(Calibration, CheckpointEvaluation)> {
    if ensemble.members.len() != 1 {
        bail!(
            "calibrate takes one model (--checkpoint given {} times): calibrate each member, then use them together",
            ensemble.members.len()
        );
    }
    let evaluation = eval::evaluate_ensemble(plan, comm, ensemble, root, split)?;
    let data = evaluation.dataset.root().display().to_string();
    if evaluation.images.is_empty() {
        bail!("{data}: no image of split {split:?} could be evaluated");
    }
    let labels: Vec<usize> = evaluation.images.iter().map(|i| i.label).collect();
    let logits: Vec<Vec<f64>> = evaluation.images.iter().map(|i| i.logits.clone()).collect();
    let temperature = calibration::fit_temperature(&logits, &labels)
        .with_context(|| format!("fitting the temperature on {data}"))?;
    let calibrated: Vec<Vec<f64>> = logits.iter().map(|l| calibration::softmax(l, temperature)).collect();
    let conformal = match conformal {
        None => None,
        Some(ConformalRequest { method, alpha }) => Some(Conformal {
            method,
            alpha,
            threshold: calibration::conformal_threshold(&calibrated, &labels, alpha, method)
                .with_context(|| format!("the conformal threshold on {data}"))?,
        }),
    };
    let calibration = Calibration {
        temperature,
        fitted_on: FittedOn {
            data,
            split: split.to_string(),
            images: labels.len(),
            sha256: split_sha256(evaluation.dataset.as_ref())?,
        },
        nll_before: calibration::mean_nll(&logits, &labels, 1.0),
        nll_after: calibration::mean_nll(&logits, &labels, temperature),
        conformal,
        entropy_threshold: calibration::entropy_threshold(&calibrated, UNCERTAIN_QUANTILE),
    };
    Ok((calibration, evaluation))
}

/// Writes the model of `ensemble` with `calibration` in its metadata to `out` (atomically).
pub fn write(ensemble: &Ensemble, calibration: &Calibration, out: &Path) -> Result<()> {
    let member = ensemble.first();
    let meta = WeightsMeta {
        calibration: Some(calibration.clone()),
        // A file from before preprocessing was recorded gets the one it was calibrated with.
        preprocessing: Some(crate::run_dir::preprocessing::Preprocessing::of_config(&member.config)),
        ..member.meta.clone()
    };
    member
        .model
        .write_torchvision(out, meta.global_step, Some(meta.to_metadata()))
        .with_context(|| format!("writing {}", out.display()))
}

/// sha256 over every image of `split`, in order: its name, its label and its bytes'
/// sha256 (each length-prefixed), so that the same images with the same labels give the same
/// digest wherever the split lives.
pub fn split_sha256(split: &dyn Dataset) -> Result<String> {
    let mut hasher = Sha256::new();
    for index in 0..split.len() {
        let name = split.describe(index);
        let name = name.strip_prefix(&split.root().display().to_string()).unwrap_or(&name).to_string();
        let bytes = split.encoded(index).with_context(|| format!("reading {}", split.describe(index)))?;
        for part in [
            name.as_bytes(),
            &split.label(index).unwrap_or(usize::MAX).to_le_bytes(),
            &Sha256::digest(&bytes),
        ] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
    }
    Ok(hex::encode(hasher.finalize()))
}
