//! Training checkpoints: one `.safetensors` file each, holding the model (torchvision names),
//! the optimizer state (`optim.<state>.<param>`) and, in the header's metadata, where training
//! stood (epoch, step), the seed, the class names and the configuration's hash.
//!
//! Written atomically (see `tensor_io`). Retention is a pure policy ([`retention`]) apart from
//! the file operations. Randomness needs no saved generator state: the sampler and the
//! augmentation derive every draw from (seed, epoch, sample), so (seed, epoch, step) is the
//! whole RNG state and a resumed run replays exactly what an uninterrupted one would.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::model::Arch;
use crate::tensor_io::{self, TensorIoError};

const METADATA_KEY: &str = "rtrain.checkpoint";
const OPTIM_PREFIX: &str = "optim.";
pub const BEST_NAME: &str = "best.safetensors";

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

/// The file name of the checkpoint taken after `global_step` steps; zero-padded so that names
/// sort in step order.
pub fn step_file_name(global_step: u64) -> String {
    format!("step-{global_step:09}.safetensors")
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

/// Step checkpoints in `dir`, oldest first, as (global step, path).
pub fn list_step_checkpoints(dir: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(CheckpointError::Io { path: dir.to_path_buf(), source }),
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry.map_err(|source| CheckpointError::Io { path: dir.to_path_buf(), source })?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if let Some(step) = name.strip_prefix("step-").and_then(|s| s.strip_suffix(".safetensors")) {
            if let Ok(step) = step.parse::<u64>() {
                found.push((step, path));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The newest checkpoint in `dir` that reads back whole; broken ones are skipped with a warning
/// (a crash can only leave temporaries, but a disk can still corrupt a finished file).
pub fn latest_valid(dir: &Path) -> Result<PathBuf, CheckpointError> {
    for (_, path) in list_step_checkpoints(dir)?.into_iter().rev() {
        match tensor_io::read_safetensors(&path)
            .map_err(CheckpointError::from)
            .and_then(|f| parse_meta(&path, &f.metadata))
        {
            Ok(_) => return Ok(path),
            Err(error) => tracing::warn!("skipping unreadable checkpoint: {error}"),
        }
    }
    Err(CheckpointError::NoneFound { dir: dir.to_path_buf() })
}

/// Which step checkpoints to delete so that only the newest `keep_last` remain.
pub fn retention(existing: &[(u64, PathBuf)], keep_last: usize) -> Vec<PathBuf> {
    let excess = existing.len().saturating_sub(keep_last);
    existing.iter().take(excess).map(|(_, path)| path.clone()).collect()
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
        let path = dir.path().join(step_file_name(13));
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

    #[test]
    fn latest_valid_skips_corrupt_newest() {
        let dir = tempfile::tempdir().unwrap();
        let t = || vec![("w".to_string(), Tensor::from_slice(&[1.0f32; 16]))];
        for step in [5, 10, 15] {
            save(&dir.path().join(step_file_name(step)), &meta(), t(), vec![]).unwrap();
        }
        let newest = dir.path().join(step_file_name(15));
        let bytes = std::fs::read(&newest).unwrap();
        std::fs::write(&newest, &bytes[..bytes.len() - 8]).unwrap();
        assert_eq!(latest_valid(dir.path()).unwrap(), dir.path().join(step_file_name(10)));
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(latest_valid(empty.path()), Err(CheckpointError::NoneFound { .. })));
    }

    #[test]
    fn retention_keeps_newest() {
        let existing: Vec<(u64, PathBuf)> =
            [1, 2, 3, 4].iter().map(|&s| (s, PathBuf::from(step_file_name(s)))).collect();
        assert_eq!(
            retention(&existing, 2),
            vec![PathBuf::from(step_file_name(1)), PathBuf::from(step_file_name(2))]
        );
        assert!(retention(&existing, 5).is_empty());
    }
}
