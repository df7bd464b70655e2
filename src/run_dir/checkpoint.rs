//! Training checkpoints: one `.safetensors` file each, holding the model (torchvision names),
//! the optimizer state (`optim.<state>.<param>`) and, in the header's metadata, where training
//! stood (epoch, step), the seed, the class names and the configuration's hash.
//!
//! The final weights (`model.safetensors`) are a torchvision state dict whose header carries
//! [`WeightsMeta`] (architecture, classes, image size), so `eval`, `predict` and `export` take
//! either file. Every load checks the tensors' digest (`files`) and refuses non-finite
//! values, naming the file; a file rtrain cannot use gets an error naming one it can.
//!
//! Written atomically (see `files`). Where checkpoints live and what they are called is
//! the run directory's ([`crate::run_dir::RunPaths`]); when to take and delete them is the
//! checkpoint policy's (`train::policy`). Randomness needs no saved generator state: the sampler and the
//! augmentation derive every draw from (seed, epoch, sample), so (seed, epoch, step) is the
//! whole RNG state and a resumed run replays exactly what an uninterrupted one would.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::calibration::ConformalMethod;
use crate::model::{Arch, Model, ModelError};
use crate::run_dir::preprocessing::Preprocessing;
use crate::util::files::{self, FileError};

const METADATA_KEY: &str = "rtrain.checkpoint";
const WEIGHTS_METADATA_KEY: &str = "rtrain.weights";
const OPTIM_PREFIX: &str = "optim.";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{}: not an rtrain checkpoint or weights file (no {METADATA_KEY} or {WEIGHTS_METADATA_KEY} metadata: a bare state dict, e.g. torchvision's); use {instead}, or train from it with model.pretrained", path.display())]
    NotACheckpoint { path: PathBuf, instead: String },
    #[error("{}: final weights, not a checkpoint (no optimizer state or training position) so training cannot resume from it; resume from {instead}", path.display())]
    NotResumable { path: PathBuf, instead: String },
    #[error("{}: tensor {name} holds non-finite values (NaN or infinity): the run diverged before it was saved; use an older checkpoint", path.display())]
    NonFinite { path: PathBuf, name: String },
    #[error("{path}: unreadable checkpoint metadata: {source}")]
    Metadata { path: PathBuf, source: serde_json::Error },
    #[error("{path}: checkpoint is for {found}, but this run is {expected}")]
    Mismatch { path: PathBuf, found: String, expected: String },
    #[error("{}: names {named} classes but its model has {outputs} outputs: the file's metadata does not belong to its tensors", path.display())]
    ClassCount { path: PathBuf, named: usize, outputs: usize },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Where training stood when the checkpoint was taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    pub arch: Arch,
    pub num_classes: usize,
    pub classes: Vec<String>,
    /// `model.head_hidden`: the MLP head's hidden widths (empty: torchvision's `fc`).
    #[serde(default)]
    pub head_hidden: Vec<usize>,
    /// The epoch in progress (0-based) and how many of its steps are done.
    pub epoch: u32,
    pub step_in_epoch: u64,
    /// Optimizer steps taken in all (the learning-rate schedule's position).
    pub global_step: u64,
    pub seed: u64,
    /// `data.image_size` of the run.
    #[serde(default)]
    pub image_size: Option<u32>,
    /// The run's evaluation transform (None in checkpoints of rtrain before 0.2).
    #[serde(default)]
    pub preprocessing: Option<Preprocessing>,
    pub config_hash: String,
    /// Validation top-1 of the last completed evaluation, if any, and the best so far.
    pub val_top1: Option<f64>,
    #[serde(default)]
    pub best_val_top1: Option<f64>,
    /// Training sums of the epoch in progress, so its metrics survive a resume.
    #[serde(default)]
    pub epoch_totals: EpochTotals,
    /// ReduceLROnPlateau's state (`schedule.kind = "plateau"`), the one learning-rate schedule
    /// that is not a function of the step alone.
    #[serde(default)]
    pub plateau: Option<PlateauState>,
    /// Early stopping's state (`train.early_stopping`), so that a resumed run stops after the
    /// epoch the uninterrupted one would have.
    #[serde(default)]
    pub early_stopping: EarlyStoppingState,
    /// `train.accumulate` of the run: a step is that many batches, so resuming mid-epoch with
    /// another value would skip or repeat images (1 in checkpoints from before it was recorded).
    #[serde(default = "one_micro_batch")]
    pub accumulate: u32,
    pub rtrain_version: String,
}

fn one_micro_batch() -> u32 {
    1
}

/// Where early stopping stands after the evaluations so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EarlyStoppingState {
    /// The best value of the watched metric, and the epoch (1-based) it was reached after.
    pub best: Option<f64>,
    pub best_epoch: Option<u32>,
    /// Evaluations since the last improvement.
    pub bad_epochs: u32,
    /// The watched metric's last value.
    pub last: Option<f64>,
}

/// Where ReduceLROnPlateau stands, as torch keeps it (the scheduler is the training loop's; its
/// state is recorded here so that a resumed run continues exactly).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlateauState {
    /// The learning rate it has reduced to (the base rate until the first reduction).
    pub lr: f64,
    /// The best metric so far; None before the first evaluation (torch's +-inf).
    pub best: Option<f64>,
    pub num_bad_epochs: u32,
    pub cooldown_counter: u32,
}

/// Sums over the part of an epoch trained so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochTotals {
    pub loss_sum: f64,
    pub correct: u64,
    pub samples: u64,
    pub seconds: f64,
    /// Undecodable samples left out (`data.on_bad_sample = "skip"`).
    #[serde(default)]
    pub skipped: u64,
}

impl CheckpointMeta {
    fn describe(&self) -> String {
        format!("{} with {} classes", self.arch, self.num_classes)
    }
}

/// What the final weights file says of its model, beside its torchvision tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightsMeta {
    pub arch: Arch,
    pub num_classes: usize,
    pub classes: Vec<String>,
    /// `model.head_hidden`: the MLP head's hidden widths (empty: torchvision's `fc`).
    #[serde(default)]
    pub head_hidden: Vec<usize>,
    /// The square crop the model was trained on (`data.image_size`); unknown for checkpoints
    /// of rtrain before 0.2.
    #[serde(default)]
    pub image_size: Option<u32>,
    /// The evaluation transform the model was trained with (None in files of rtrain before
    /// 0.2): what `predict`, `eval` and `explain` apply by default.
    #[serde(default)]
    pub preprocessing: Option<Preprocessing>,
    /// What `rtrain calibrate` fitted (None: the model's own probabilities).
    #[serde(default)]
    pub calibration: Option<Calibration>,
    pub global_step: u64,
    pub rtrain_version: String,
}

/// What `rtrain calibrate` fitted on held-out images, carried by the calibrated model's file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Probabilities are softmax(logits / temperature) (temperature scaling; 1: unchanged).
    pub temperature: f64,
    /// The images it was fitted on.
    pub fitted_on: FittedOn,
    /// The held-out split's mean negative log-likelihood before and after.
    pub nll_before: f64,
    pub nll_after: f64,
    /// Split-conformal prediction sets (`calibrate --conformal`).
    pub conformal: Option<Conformal>,
    /// The entropy (nats) of the calibrated probabilities above which a photo is counted as
    /// uncertain: the [`UNCERTAIN_QUANTILE`] of the fitting split's.
    pub entropy_threshold: f64,
}

/// The share of the fitting split's photos less uncertain than [`Calibration::entropy_threshold`].
pub const UNCERTAIN_QUANTILE: f64 = 0.95;

/// The held-out images a calibration was fitted on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FittedOn {
    /// The split's directory or shard set, and the split's name.
    pub data: String,
    pub split: String,
    pub images: usize,
    /// sha256 over every image's name, label and bytes, in the split's order.
    pub sha256: String,
}

/// A split-conformal prediction-set rule: the sets cover the true class with probability at
/// least 1 - alpha on exchangeable images.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conformal {
    pub method: ConformalMethod,
    pub alpha: f64,
    /// The conformity-score quantile the sets are made with.
    pub threshold: f64,
}

impl WeightsMeta {
    /// What a checkpoint says of its model.
    pub fn of_checkpoint(meta: &CheckpointMeta) -> WeightsMeta {
        WeightsMeta {
            arch: meta.arch,
            num_classes: meta.num_classes,
            classes: meta.classes.clone(),
            head_hidden: meta.head_hidden.clone(),
            image_size: meta.image_size,
            preprocessing: meta.preprocessing.clone(),
            calibration: None,
            global_step: meta.global_step,
            rtrain_version: meta.rtrain_version.clone(),
        }
    }

    /// Warns when the model is used at another size than it was trained at.
    pub fn warn_if_size_differs(&self, path: &Path, configured: u32) {
        if let Some(trained) = self.image_size.filter(|&trained| trained != configured) {
            tracing::warn!(
                "{}: trained on {trained} px images, used here at {configured} px (set data.image_size = {trained})",
                path.display()
            );
        }
    }

    /// The header metadata of a weights file.
    pub fn to_metadata(&self) -> HashMap<String, String> {
        let json = serde_json::to_string(self).unwrap_or_default();
        HashMap::from([(WEIGHTS_METADATA_KEY.to_string(), json)])
    }
}

pub struct Checkpoint {
    pub meta: CheckpointMeta,
    pub model: BTreeMap<String, Tensor>,
    pub optimizer: BTreeMap<String, Tensor>,
}

/// Writes a checkpoint atomically; returns the file's sha256.
pub fn save(
    path: &Path,
    meta: &CheckpointMeta,
    model: Vec<(String, Tensor)>,
    optimizer: Vec<(String, Tensor)>,
) -> Result<String, CheckpointError> {
    let json = serde_json::to_string(meta)
        .map_err(|source| CheckpointError::Metadata { path: path.to_path_buf(), source })?;
    let mut tensors = model;
    tensors.extend(optimizer.into_iter().map(|(name, t)| (format!("{OPTIM_PREFIX}{name}"), t)));
    let sha256 =
        files::write_safetensors(path, &tensors, Some(HashMap::from([(METADATA_KEY.to_string(), json)])))?;
    Ok(sha256)
}

pub fn read_meta(path: &Path) -> Result<CheckpointMeta, CheckpointError> {
    parse_meta(path, &files::read_metadata(path)?)
}

fn parse_meta(path: &Path, metadata: &HashMap<String, String>) -> Result<CheckpointMeta, CheckpointError> {
    let Some(json) = metadata.get(METADATA_KEY) else {
        let instead = newest_step_checkpoint_near(path)
            .map_or_else(|| "a checkpoint of its run (checkpoints/step-*.safetensors)".to_string(), display);
        return Err(match metadata.contains_key(WEIGHTS_METADATA_KEY) {
            true => CheckpointError::NotResumable { path: path.to_path_buf(), instead },
            false => CheckpointError::NotACheckpoint { path: path.to_path_buf(), instead },
        });
    };
    let meta: CheckpointMeta = serde_json::from_str(json)
        .map_err(|source| CheckpointError::Metadata { path: path.to_path_buf(), source })?;
    check_class_names(path, meta.classes.len(), meta.num_classes)?;
    Ok(meta)
}

/// A class name for every output of the model: a shorter list made `predict` index past it
/// and a longer one printed names of classes the model never learnt.
fn check_class_names(path: &Path, named: usize, outputs: usize) -> Result<(), CheckpointError> {
    match named == outputs {
        true => Ok(()),
        false => Err(CheckpointError::ClassCount { path: path.to_path_buf(), named, outputs }),
    }
}

fn display(path: PathBuf) -> String {
    path.display().to_string()
}

/// The run directory a file of it sits in: its own directory, or the parent of `checkpoints/`.
fn run_dir_of(path: &Path) -> Option<&Path> {
    let dir = path.parent()?;
    match dir.file_name() == Some(std::ffi::OsStr::new("checkpoints")) {
        true => dir.parent(),
        false => Some(dir),
    }
}

/// The newest step checkpoint of the run directory `path` belongs to, if it has one.
fn newest_step_checkpoint_near(path: &Path) -> Option<PathBuf> {
    let run = crate::run_dir::RunPaths::new(run_dir_of(path)?);
    run.step_checkpoints().ok()?.pop().map(|(_, file)| file)
}

/// A file beside `path` that `eval` and `predict` can use: its run's final weights, best or
/// newest checkpoint.
fn usable_file_near(path: &Path) -> Option<PathBuf> {
    let run = crate::run_dir::RunPaths::new(run_dir_of(path)?);
    [Some(run.weights()), Some(run.best_checkpoint()), newest_step_checkpoint_near(path)]
        .into_iter()
        .flatten()
        .find(|file| file != path && file.is_file())
}

/// Refuses a file holding NaN or infinity in any floating-point tensor.
fn check_finite<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (&'a String, &'a Tensor)>,
) -> Result<(), CheckpointError> {
    match files::first_non_finite(tensors) {
        Some(name) => Err(CheckpointError::NonFinite { path: path.to_path_buf(), name: name.clone() }),
        None => Ok(()),
    }
}

/// Reads a checkpoint in full, refusing one that fails its digest, holds non-finite values, or
/// was made for another architecture or class count.
pub fn load(path: &Path, expect: Option<(Arch, usize)>) -> Result<Checkpoint, CheckpointError> {
    let file = files::read_safetensors(path)?;
    let meta = parse_meta(path, &file.metadata)?;
    check_finite(path, &file.tensors)?;
    if let Some((arch, num_classes)) = expect {
        if meta.arch != arch || meta.num_classes != num_classes {
            return Err(CheckpointError::Mismatch {
                path: path.to_path_buf(),
                found: meta.describe(),
                expected: format!("{arch} with {num_classes} classes"),
            });
        }
    }
    let mut model = BTreeMap::new();
    let mut optimizer = BTreeMap::new();
    for (name, tensor) in file.tensors {
        match name.strip_prefix(OPTIM_PREFIX) {
            Some(rest) => optimizer.insert(rest.to_string(), tensor),
            None => model.insert(name, tensor),
        };
    }
    Ok(Checkpoint { meta, model, optimizer })
}

/// A model on the CPU restored from a checkpoint or a final weights file, with what it is.
pub fn load_model(path: &Path) -> Result<(Model, WeightsMeta), CheckpointError> {
    load_model_on(path, tch::Device::Cpu)
}

/// [`load_model`] onto `device`.
pub fn load_model_on(path: &Path, device: tch::Device) -> Result<(Model, WeightsMeta), CheckpointError> {
    let file = files::read_safetensors(path)?;
    let info = match file.metadata.get(WEIGHTS_METADATA_KEY) {
        Some(json) => {
            let info = serde_json::from_str::<WeightsMeta>(json)
                .map_err(|source| CheckpointError::Metadata { path: path.to_path_buf(), source })?;
            check_class_names(path, info.classes.len(), info.num_classes)?;
            info
        }
        None if !file.metadata.contains_key(METADATA_KEY) => {
            let instead = usable_file_near(path).map_or_else(
                || "an rtrain run's model.safetensors or checkpoints/*.safetensors".to_string(),
                display,
            );
            return Err(CheckpointError::NotACheckpoint { path: path.to_path_buf(), instead });
        }
        None => WeightsMeta::of_checkpoint(&parse_meta(path, &file.metadata)?),
    };
    check_finite(path, &file.tensors)?;
    let model = Model::with_head(info.arch, info.num_classes, &info.head_hidden, device)?;
    model.restore(&file.tensors, path)?;
    Ok((model, info))
}

/// Reads a checkpoint whole and drops it: the check that a file is usable before training
/// resumes from it (its digest, its metadata, finite values).
pub fn read_whole(path: &Path) -> Result<(), CheckpointError> {
    load(path, None).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> CheckpointMeta {
        CheckpointMeta {
            arch: Arch::Resnet18,
            num_classes: 4,
            classes: vec!["a".into(), "b".into(), "c".into(), "d".into()],
            head_hidden: vec![512],
            epoch: 1,
            step_in_epoch: 3,
            global_step: 13,
            seed: 7,
            image_size: Some(32),
            preprocessing: None,
            config_hash: "abc".into(),
            val_top1: Some(0.5),
            best_val_top1: Some(0.6),
            epoch_totals: EpochTotals { loss_sum: 1.5, correct: 3, samples: 8, seconds: 0.25, skipped: 1 },
            plateau: Some(PlateauState { lr: 0.01, best: Some(0.5), num_bad_epochs: 2, cooldown_counter: 1 }),
            early_stopping: Default::default(),
            accumulate: 1,
            rtrain_version: "0.1.0".into(),
        }
    }

    #[test]
    fn save_load_round_trip_and_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("step-000000013.safetensors");
        let w = Tensor::from_slice(&[1.0f32, 2.0]);
        let m = Tensor::from_slice(&[0.5f32, 0.25]);
        save(
            &path,
            &meta(),
            vec![("fc.weight".into(), w.shallow_clone())],
            vec![("momentum_buffer.fc.weight".into(), m.shallow_clone())],
        )
        .unwrap();
        let loaded = load(&path, Some((Arch::Resnet18, 4))).unwrap();
        assert_eq!(loaded.meta, meta());
        assert!(loaded.model["fc.weight"].equal(&w));
        assert!(loaded.optimizer["momentum_buffer.fc.weight"].equal(&m));
        assert_eq!(read_meta(&path).unwrap().global_step, 13);
        let err = load(&path, Some((Arch::Resnet50, 4))).err().unwrap().to_string();
        assert!(err.contains("resnet18 with 4 classes") && err.contains("resnet50"), "{err}");
        let err = load(&path, Some((Arch::Resnet18, 10))).err().unwrap().to_string();
        assert!(err.contains("10 classes") && err.contains(&path.display().to_string()), "{err}");
    }
}
