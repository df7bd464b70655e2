//! What `rtrain eval` reports about a checkpoint on a split: the metrics of [`crate::metrics`]
//! with their bootstrap intervals beside training's own report (loss, top-1, confusion), as
//! JSON (`--json`, `metrics.json`), and each image's result (`predictions.csv`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::metrics::{self, Intervals, Metrics, Predictions};
use crate::run_dir::records::EvalReport;
use crate::train::eval::CheckpointEvaluation;
use crate::util::files;

/// A checkpoint evaluated on a split, with everything `eval` says about it.
#[derive(Debug, Serialize)]
pub struct Evaluated {
    /// The evaluated data (the split's directory, or the shard set).
    pub data: PathBuf,
    pub classes: Vec<String>,
    #[serde(flatten)]
    pub report: EvalReport,
    pub metrics: Metrics,
    /// 95% percentile-bootstrap intervals; None with `--bootstrap 0`.
    pub intervals: Option<Intervals>,
}

impl Evaluated {
    /// The metrics of `evaluation`, with `resamples` bootstrap resamples seeded by `seed`.
    pub fn new(evaluation: &CheckpointEvaluation, resamples: usize, seed: u64) -> Result<Evaluated> {
        if evaluation.images.is_empty() {
            bail!("{}: no image could be evaluated", evaluation.dataset.root().display());
        }
        let labels: Vec<usize> = evaluation.images.iter().map(|image| image.label).collect();
        let probabilities: Vec<Vec<f64>> =
            evaluation.images.iter().map(|i| i.probabilities.clone()).collect();
        let predictions = Predictions {
            labels: &labels,
            probabilities: &probabilities,
            num_classes: evaluation.classes.len(),
        };
        Ok(Evaluated {
            data: evaluation.dataset.root().to_path_buf(),
            classes: evaluation.classes.clone(),
            report: evaluation.report.clone(),
            metrics: metrics::compute(&predictions),
            intervals: (resamples > 0).then(|| metrics::bootstrap(&predictions, resamples, seed)),
        })
    }

    /// Writes `out/metrics.json` (what `--json` prints) and `out/predictions.csv`, each
    /// atomically.
    pub fn write(&self, out: &Path, evaluation: &CheckpointEvaluation) -> Result<()> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        files::write_atomic(&out.join("metrics.json"), serde_json::to_string_pretty(self)?.as_bytes())?;
        let mut csv = csv::Writer::from_writer(Vec::new());
        let mut header = vec![
            "image".to_string(),
            "true_class".into(),
            "class".into(),
            "probability".into(),
            "correct".into(),
        ];
        header.extend(self.classes.iter().map(|class| format!("probability_{class}")));
        csv.write_record(&header)?;
        for image in &evaluation.images {
            let predicted = image.probabilities.iter().enumerate().fold(0, |best, (c, &p)| {
                if p > image.probabilities[best] {
                    c
                } else {
                    best
                }
            });
            let mut row = vec![
                evaluation.dataset.describe(image.index),
                self.classes[image.label].clone(),
                self.classes[predicted].clone(),
                image.probabilities[predicted].to_string(),
                (predicted == image.label).to_string(),
            ];
            row.extend(image.probabilities.iter().map(f64::to_string));
            csv.write_record(&row)?;
        }
        let bytes = csv.into_inner().context("writing predictions.csv")?;
        files::write_atomic(&out.join("predictions.csv"), &bytes)?;
        Ok(())
    }
}
