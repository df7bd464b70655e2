//! Training checkpoints: one `.safetensors` file each, holding the model (torchvision names),
//! the optimizer state (`optim.<state>.<param>`) and, in the header's metadata, where training
//! stood (epoch, step), the seed, the class names and the configuration's hash.
//!
//! Written atomically (see `tensor_io`). Where checkpoints live and what they are called is
//! the run directory's ([`crate::run_dir::RunPaths`]); when to take and delete them is the
//! checkpoint policy's (`train::policy`). Randomness needs no saved generator state: the sampler and the
//! augmentation derive every draw from (seed, epoch, sample), so (seed, epoch, step) is the
//! whole RNG state and a resumed run replays exactly what an uninterrupted one would.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::model::{Arch, Model, ModelError};
use crate::util::tensor_io::{self, TensorIoError};

const METADATA_KEY: &str = "rtrain.checkpoint";
const OPTIM_PREFIX: &str = "optim.";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    File(#[from] TensorIoError),
    #[error("{path}: not an rtrain checkpoint (no {METADATA_KEY} metadata)")]
    NotACheckpoint { path: PathBuf },
    #[error("{path}: unreadable checkpoint metadata: {source}")]
    Metadata { path: PathBuf, source: serde_json::Error },
    #[error("{path}: checkpoint is for {found}, but this run is {expected}")]
    Mismatch { path: PathBuf, found: String, expected: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("no valid checkpoint in {dir}")]
    NoneFound { dir: PathBuf },
}

/// Where training stood when the checkpoint was taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    pub arch: Arch,
    pub num_classes: usize,
    pub classes: Vec<String>,
    /// The epoch in progress (0-based) and how many of its steps are done.
    pub epoch: u32,
    pub step_in_epoch: u64,
    /// Optimizer steps taken in all (the learning-rate schedule's position).
    pub global_step: u64,
    pub seed: u64,
    pub config_hash: String,
    /// Validation top-1 of the last completed evaluation, if any, and the best so far.
    pub val_top1: Option<f64>,
    #[serde(default)]
    pub best_val_top1: Option<f64>,
    /// Training sums of the epoch in progress, so its metrics survive a resume.
    #[serde(default)]
    pub epoch_totals: EpochTotals,
    pub rtrain_version: String,
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

pub struct Checkpoint {
    pub meta: CheckpointMeta,
    pub model: BTreeMap<String, Tensor>,
    pub optimizer: BTreeMap<String, Tensor>,
}

pub fn save(
    path: &Path,
    meta: &CheckpointMeta,
    model: Vec<(String, Tensor)>,
    optimizer: Vec<(String, Tensor)>,
) -> Result<(), CheckpointError> {
    let json = serde_json::to_string(meta)
        .map_err(|source| CheckpointError::Metadata { path: path.to_path_buf(), source })?;
    let mut tensors = model;
    tensors.extend(optimizer.into_iter().map(|(name, t)| (format!("{OPTIM_PREFIX}{name}"), t)));
    tensor_io::write_safetensors(path, &tensors, Some(HashMap::from([(METADATA_KEY.to_string(), json)])))?;
    Ok(())
}

pub fn read_meta(path: &Path) -> Result<CheckpointMeta, CheckpointError> {
    parse_meta(path, &tensor_io::read_metadata(path)?)
}

fn parse_meta(path: &Path, metadata: &HashMap<String, String>) -> Result<CheckpointMeta, CheckpointError> {
    let json = metadata
        .get(METADATA_KEY)
        .ok_or_else(|| CheckpointError::NotACheckpoint { path: path.to_path_buf() })?;
    serde_json::from_str(json)
        .map_err(|source| CheckpointError::Metadata { path: path.to_path_buf(), source })
}

/// Reads a checkpoint in full, refusing one made for another architecture or class count.
pub fn load(path: &Path, expect: Option<(Arch, usize)>) -> Result<Checkpoint, CheckpointError> {
    let file = tensor_io::read_safetensors(path)?;
    let meta = parse_meta(path, &file.metadata)?;
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

/// A model on the CPU restored from a checkpoint, with where training stood (and the class
/// names it was trained on).
pub fn load_model(path: &Path) -> Result<(Model, CheckpointMeta), CheckpointError> {
    let checkpoint = load(path, None)?;
    let model = Model::new(checkpoint.meta.arch, checkpoint.meta.num_classes, tch::Device::Cpu)?;
    model.restore(&checkpoint.model, path)?;
    Ok((model, checkpoint.meta))
}

/// Reads a checkpoint whole (every tensor and the metadata) and drops it: the check that a
/// file is usable before training resumes from it.
pub fn read_whole(path: &Path) -> Result<(), CheckpointError> {
    let file = tensor_io::read_safetensors(path)?;
    parse_meta(path, &file.metadata).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> CheckpointMeta {
        CheckpointMeta {
            arch: Arch::Resnet18,
            num_classes: 4,
            classes: vec!["a".into(), "b".into(), "c".into(), "d".into()],
            epoch: 1,
            step_in_epoch: 3,
            global_step: 13,
            seed: 7,
            config_hash: "abc".into(),
            val_top1: Some(0.5),
            best_val_top1: Some(0.6),
            epoch_totals: EpochTotals { loss_sum: 1.5, correct: 3, samples: 8, seconds: 0.25, skipped: 1 },
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
