//! `metrics.jsonl`: one JSON object per logged step and per epoch, appended as training goes,
//! so a crashed run keeps what it logged. On resume, records past the checkpoint are dropped
//! (they will be logged again), so the file reads as one uninterrupted run.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::tensor_io;

#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct MetricsError {
    path: PathBuf,
    source: std::io::Error,
}

pub struct MetricsLog {
    path: PathBuf,
    file: File,
}

#[derive(Debug, Serialize)]
pub struct StepRecord {
    pub kind: &'static str,
    pub epoch: u32,
    pub step: u64,
    pub global_step: u64,
    pub loss: f64,
    pub accuracy: f64,
    pub lr: f64,
    pub images_per_second: f64,
}

impl MetricsLog {
    /// Opens `path` for appending. With `resume_point = Some((global_step, epoch))`, first
    /// rewrites it (atomically) without the step records after `global_step` and the epoch
    /// records from `epoch` on: the resumed run logs those again.
    pub fn open(path: &Path, resume_point: Option<(u64, u32)>) -> Result<MetricsLog, MetricsError> {
        let err = |source| MetricsError { path: path.to_path_buf(), source };
        if let Some((global_step, epoch)) = resume_point {
            if path.exists() {
                let kept = records_up_to(path, global_step, epoch).map_err(err)?;
                tensor_io::write_atomic(path, kept.as_bytes())
                    .map_err(|e| err(std::io::Error::other(e.to_string())))?;
            }
        }
        let file = OpenOptions::new().create(true).append(true).open(path).map_err(err)?;
        Ok(MetricsLog { path: path.to_path_buf(), file })
    }

    pub fn append<T: Serialize>(&mut self, record: &T) -> Result<(), MetricsError> {
        let mut line = serde_json::to_string(record)
            .map_err(|e| MetricsError { path: self.path.clone(), source: e.into() })?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .map_err(|source| MetricsError { path: self.path.clone(), source })
    }
}

fn records_up_to(path: &Path, global_step: u64, epoch: u32) -> std::io::Result<String> {
    let mut kept = String::new();
    for line in BufReader::new(File::open(path)?).lines() {
        let line = line?;
        let Ok(record) = serde_json::from_str::<Value>(&line) else { continue };
        let keep = match record.get("kind").and_then(Value::as_str) {
            Some("step") => {
                record.get("global_step").and_then(Value::as_u64).is_some_and(|s| s <= global_step)
            }
            Some("epoch") => {
                record.get("epoch").and_then(Value::as_u64).is_some_and(|e| e < u64::from(epoch))
            }
            _ => true,
        };
        if keep {
            kept.push_str(&line);
            kept.push('\n');
        }
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_drops_records_after_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut log = MetricsLog::open(&path, None).unwrap();
        for global_step in 1..=6 {
            let epoch = if global_step <= 3 { 0 } else { 1 };
            let step = StepRecord {
                kind: "step",
                epoch,
                step: 0,
                global_step,
                loss: 1.0,
                accuracy: 0.0,
                lr: 0.1,
                images_per_second: 1.0,
            };
            log.append(&step).unwrap();
            if global_step == 3 {
                log.append(&serde_json::json!({"kind": "epoch", "epoch": 0})).unwrap();
            }
        }
        drop(log);
        MetricsLog::open(&path, Some((4, 1))).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let steps: Vec<u64> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v.get("global_step").and_then(Value::as_u64))
            .collect();
        assert_eq!(steps, vec![1, 2, 3, 4]);
        let epochs = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["kind"] == "epoch")
            .count();
        assert_eq!(epochs, 1, "the epoch 0 record stays, nothing of epoch 1 does");
    }
}
