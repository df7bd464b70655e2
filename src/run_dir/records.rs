//! The records of a run directory, each one type that both writes and reads its file:
//! `metrics.jsonl` ([`MetricsRecord`], one JSON object per logged step and per epoch, appended
//! as training goes, so a crashed run keeps what it logged) and `summary.json` ([`Summary`]).
//! On resume, metrics records past the checkpoint are dropped (they will be logged again), so the
//! file reads as one uninterrupted run.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::util::files;

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: line {line}: {problem}")]
    Parse { path: PathBuf, line: usize, problem: String },
}

/// One line of `metrics.jsonl`, told apart by its `kind` field.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum MetricsRecord {
    Step(StepRecord),
    Epoch(EpochRecord),
}

/// A logged training step: the step's loss and accuracy over every rank's batch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StepRecord {
    pub epoch: u32,
    pub step: u64,
    pub global_step: u64,
    pub loss: f64,
    pub accuracy: f64,
    pub lr: f64,
    pub images_per_second: f64,
    /// Wall seconds of the steps since the last report, on rank 0: from the end of the step
    /// before them to the end of the last (what their phases add up to).
    pub seconds: f64,
    /// Where the steps since the last report went, on every rank (absent before it was
    /// recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<PhaseReport>,
}

/// A finished epoch: its training sums over all ranks and the evaluation after it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct EpochRecord {
    pub epoch: u32,
    pub global_step: u64,
    pub train_loss: f64,
    pub train_accuracy: f64,
    pub train_images_per_second: f64,
    pub lr: f64,
    pub seconds: f64,
    /// Undecodable training samples skipped this epoch (all ranks).
    pub skipped_samples: u64,
    pub val: EvalReport,
    /// Where the epoch's training steps went, on every rank.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<PhaseReport>,
    /// The evaluation after the epoch, on rank 0's clock.
    pub eval_seconds: f64,
}

/// Where the training steps' time went, on every rank: each phase in seconds per step
/// ([`crate::train::phases`] measures them). A rank's phases add up to its steps' wall time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PhaseReport {
    /// Steps the figures cover on each rank.
    pub steps: u64,
    /// Waiting for the loader's next batch.
    pub data: PhaseStat,
    /// Moving the batch to the device and into the run's memory format.
    pub copy: PhaseStat,
    /// Forward pass and loss (and reading the loss back).
    pub forward: PhaseStat,
    /// Backward pass (the all-reduce of finished buckets runs beside it).
    pub backward: PhaseStat,
    /// Waiting for the gradient all-reduce after backward: communication not hidden behind
    /// backward, and waiting for slower ranks.
    pub comm_wait: PhaseStat,
    /// The optimizer step.
    pub optimizer: PhaseStat,
    /// Between steps: logging, stop snapshots, mid-epoch checkpoints.
    pub other: PhaseStat,
    /// The whole step (the sum of the phases above).
    pub step: PhaseStat,
    /// The step without `comm_wait`: the rank's own work, what makes a rank a straggler.
    pub busy: PhaseStat,
    /// The communication thread's time in the gradient all-reduces (overlapping backward),
    /// per step.
    pub allreduce: PhaseStat,
    /// The rank with the largest `busy`, and its node.
    pub slowest_rank: usize,
    pub slowest_node: String,
    /// The slowest rank's `comm_wait`: nobody keeps it waiting, so this is communication that
    /// backward did not hide.
    pub exposed_comm: f64,
    /// The slowest rank's `busy` beyond the median of the others': what every other rank waits
    /// for it each step.
    pub waiting_for_slowest: f64,
    /// Set when the slowest rank's `busy` exceeds the other ranks' median by more than
    /// `log.straggler_threshold`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub straggler: Option<Straggler>,
}

/// One phase over the ranks, in seconds per step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PhaseStat {
    pub rank0: f64,
    pub min: f64,
    pub median: f64,
    pub max: f64,
    /// The rank with the largest value.
    pub max_rank: usize,
}

/// A rank markedly slower than the others at its own work, and the phase that makes it so.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Straggler {
    pub rank: usize,
    pub node: String,
    /// Its `busy` seconds per step, and the other ranks' median.
    pub busy: f64,
    pub median_busy: f64,
    /// The phase it spends the most time in beyond the other ranks, with both values (its own
    /// and the others' median).
    pub phase: String,
    pub phase_seconds: f64,
    pub phase_median: f64,
}

impl Straggler {
    /// The log's line, e.g. "rank 3 on node c123-004: step 0.410 s vs median 0.300 s; its data
    /// wait is 0.100 s (median 0.000 s)".
    pub fn describe(&self) -> String {
        format!(
            "rank {} on node {}: step {:.3} s vs the others' median {:.3} s, without waiting in the all-reduce; its {} is {:.3} s (others {:.3} s)",
            self.rank, self.node, self.busy, self.median_busy, self.phase, self.phase_seconds, self.phase_median
        )
    }
}

/// Reads every record of a `metrics.jsonl`, in order; a line that is not a record is an error
/// naming its line.
pub fn read_metrics(path: &Path) -> Result<Vec<MetricsRecord>, RecordError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| RecordError::Io { path: path.to_path_buf(), source })?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(number, line)| {
            serde_json::from_str(line).map_err(|e| RecordError::Parse {
                path: path.to_path_buf(),
                line: number + 1,
                problem: e.to_string(),
            })
        })
        .collect()
}

/// An evaluation over a validation split (`train::eval` computes it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    pub samples: usize,
    pub loss: f64,
    pub top1: f64,
    /// Accuracy per class, in class order (NaN-free: a class with no samples reports 0).
    pub per_class: Vec<f64>,
    /// `confusion[true][predicted]` counts.
    pub confusion: Vec<Vec<u64>>,
    /// Macro-F1, balanced accuracy, the kappas and the ordinal errors, from `confusion`
    /// (absent from records written before they were added).
    #[serde(flatten, default)]
    pub ordinal: crate::metrics::ConfusionMetrics,
}

/// What `summary.json` records about a finished run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Summary {
    pub arch: String,
    pub classes: Vec<String>,
    pub epochs: u32,
    pub global_steps: u64,
    pub train_images: usize,
    pub val_images: usize,
    pub final_eval: Option<EvalReport>,
    pub best_val_top1: Option<f64>,
    /// The best checkpoint (`best.safetensors`) evaluated again at the end, as the tutorial
    /// reloads and evaluates `best_model.pt`, and the epoch (1-based) it was taken after.
    #[serde(default)]
    pub best_epoch: Option<u32>,
    #[serde(default)]
    pub best_eval: Option<EvalReport>,
    pub wall_seconds: f64,
    pub train_images_per_second: f64,
    pub peak_rss_mib: Option<f64>,
    pub threads: i32,
    /// Ranks that trained (each on `batch_size` images per step) and the nodes they ran on
    /// (1 and 1 in summaries written before they were recorded).
    #[serde(default = "one")]
    pub world_size: usize,
    #[serde(default = "one")]
    pub nodes: usize,
    pub global_batch_size: usize,
    pub weights: PathBuf,
    pub weights_sha256: String,
    pub resumed_from: Option<PathBuf>,
    /// Set when `train.early_stopping` ended the run before `train.epochs`.
    pub stopped_early: Option<EarlyStop>,
    /// Where the training steps of this process went, over all its epochs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<PhaseReport>,
    /// Evaluation after each epoch and epoch checkpoints, in all, on rank 0's clock.
    pub eval_seconds: f64,
    pub checkpoint_seconds: f64,
    /// Bytes of gradient each rank sends into the all-reduce per step (on the wire).
    pub gradient_bytes: u64,
}

/// Why early stopping ended a run, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EarlyStop {
    /// The last epoch trained (1-based).
    pub epoch: u32,
    /// The watched metric, as `metrics.jsonl` names it, and its value after `epoch` (None where
    /// it was not a number, e.g. a kappa of a one-class split).
    pub metric: String,
    pub value: Option<f64>,
    /// The best value and the epoch (1-based) it was reached after (None: never a number).
    pub best: Option<f64>,
    pub best_epoch: Option<u32>,
    pub patience: u32,
    pub min_delta: f64,
}

impl EarlyStop {
    /// For the log: why the run stopped.
    pub fn reason(&self) -> String {
        let number = |value: Option<f64>| value.map_or("not a number".to_string(), |v| format!("{v:.6}"));
        let best = match (self.best, self.best_epoch) {
            (Some(best), Some(epoch)) => format!("best {best:.6} after epoch {epoch}"),
            _ => "never a number".to_string(),
        };
        format!(
            "{} has not improved by more than {} for {} epoch(s): {best}, {} after epoch {}",
            self.metric,
            self.min_delta,
            self.patience,
            number(self.value),
            self.epoch
        )
    }
}

fn one() -> usize {
    1
}

impl Summary {
    pub fn read(path: &Path) -> Result<Summary, RecordError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| RecordError::Io { path: path.to_path_buf(), source })?;
        serde_json::from_str(&text).map_err(|e| RecordError::Parse {
            path: path.to_path_buf(),
            line: e.line(),
            problem: e.to_string(),
        })
    }

    pub fn write(&self, path: &Path) -> Result<(), RecordError> {
        let json = serde_json::to_string_pretty(self)
            .map_err(|e| RecordError::Io { path: path.to_path_buf(), source: e.into() })?;
        files::write_atomic(path, json.as_bytes()).map_err(|e| RecordError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok(())
    }
}

/// `metrics.jsonl` open for appending (rank 0 only).
pub struct MetricsLog {
    path: PathBuf,
    file: File,
}

impl MetricsLog {
    /// Opens `path` for appending. With `resume_point = Some((global_step, epoch))`, first
    /// rewrites it (atomically) without the step records after `global_step` and the epoch
    /// records from `epoch` on: the resumed run logs those again.
    pub fn open(path: &Path, resume_point: Option<(u64, u32)>) -> Result<MetricsLog, RecordError> {
        let err = |source| RecordError::Io { path: path.to_path_buf(), source };
        if let Some((global_step, epoch)) = resume_point {
            if path.exists() {
                let kept = records_up_to(path, global_step, epoch).map_err(err)?;
                files::write_atomic(path, kept.as_bytes())
                    .map_err(|e| err(std::io::Error::other(e.to_string())))?;
            }
        }
        let file = OpenOptions::new().create(true).append(true).open(path).map_err(err)?;
        Ok(MetricsLog { path: path.to_path_buf(), file })
    }

    pub fn append(&mut self, record: &MetricsRecord) -> Result<(), RecordError> {
        let mut line = serde_json::to_string(record)
            .map_err(|e| RecordError::Io { path: self.path.clone(), source: e.into() })?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .map_err(|source| RecordError::Io { path: self.path.clone(), source })
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

    /// Records written before the ordinal metrics were added still read, with them zero; new
    /// records carry them beside the counts, an undefined kappa as null.
    #[test]
    fn evaluation_records_with_and_without_the_confusion_metrics_read() {
        let old = r#"{"samples":4,"loss":0.5,"top1":0.5,"per_class":[1.0,0.0],"confusion":[[2,0],[2,0]]}"#;
        let report: EvalReport = serde_json::from_str(old).unwrap();
        assert_eq!(report.ordinal, crate::metrics::ConfusionMetrics::default());
        let new = EvalReport { ordinal: crate::metrics::from_confusion(&report.confusion), ..report };
        let json = serde_json::to_value(&new).unwrap();
        // Every prediction is class 0: no better than chance; recall is 1 and 0, F1 2/3 and 0.
        assert_eq!(json["quadratic_kappa"], 0.0);
        assert!((json["macro_f1"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(json["balanced_accuracy"], 0.5);
        assert_eq!(json["mean_rank_error"], 0.5);
        assert_eq!(serde_json::from_value::<EvalReport>(json).unwrap(), new);
        // Every image and every prediction in one class: chance agreement is total, kappa
        // undefined, written as null.
        let one_class = crate::metrics::from_confusion(&[vec![4, 0], vec![0, 0]]);
        assert_eq!(serde_json::to_value(&one_class).unwrap()["quadratic_kappa"], serde_json::Value::Null);
    }

    #[test]
    fn resume_drops_records_after_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut log = MetricsLog::open(&path, None).unwrap();
        for global_step in 1..=6 {
            let epoch = if global_step <= 3 { 0 } else { 1 };
            let step = StepRecord {
                epoch,
                step: 0,
                global_step,
                loss: 1.0,
                accuracy: 0.0,
                lr: 0.1,
                images_per_second: 1.0,
                ..StepRecord::default()
            };
            log.append(&MetricsRecord::Step(step)).unwrap();
            if global_step == 3 {
                log.append(&MetricsRecord::Epoch(EpochRecord {
                    epoch: 0,
                    global_step: 3,
                    ..EpochRecord::default()
                }))
                .unwrap();
            }
        }
        drop(log);
        MetricsLog::open(&path, Some((4, 1))).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let steps: Vec<u64> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["kind"] == "step")
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
