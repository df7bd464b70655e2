//! What `rtrain eval` reports about a checkpoint on a split: the metrics of [`crate::metrics`]
//! with their bootstrap intervals beside training's own report (loss, top-1, confusion), as
//! text, as JSON (`--json`, `metrics.json`), each image's result (`predictions.csv`), and with
//! `--out` the figures: the confusion matrix in counts and by row, the reliability diagram,
//! the ROC curves and the gallery of the most confident mistakes, listed in `report.md`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::explain::Explainer;
use crate::inference::Ensemble;
use crate::metrics::{self, Interval, Intervals, Metrics, Predictions};
use crate::plot;
use crate::report::gallery;
use crate::report::trust::{self, Trust};
use crate::run_dir::checkpoint;
use crate::run_dir::records::EvalReport;
use crate::run_dir::RunPaths;
use crate::train::eval::CheckpointEvaluation;
use crate::util::files;

/// What `metrics.json` is called in an evaluation's directory.
const METRICS_FILE: &str = "metrics.json";

/// The largest `metrics.json` [`Evaluated::read`] reads.
const METRICS_LIMIT: u64 = 64 << 20;

/// The figures of an evaluation's directory that `rtrain report` shows (the confusion in
/// counts it draws itself, from the epoch records).
pub const REPORTED_FIGURES: [&str; 8] = [
    "confusion-by-row.svg",
    "confusion-by-row.png",
    "reliability.svg",
    "reliability.png",
    "roc.svg",
    "roc.png",
    "mistakes.png",
    "mistakes-gradcam.png",
];

/// Every file [`Evaluated::write`] writes into its directory, by name: the run directory's
/// list ([`crate::run_dir::EVALUATION_FILES`]), which `train --overwrite` deletes and `rtrain
/// publish` carries, and nothing else.
pub use crate::run_dir::EVALUATION_FILES as WRITTEN_FILES;

/// The stage whose Grad-CAM the gallery of mistakes is shown with (`layer4`, as papers do).
const GALLERY_LAYER: usize = 4;

/// A checkpoint evaluated on a split, with everything `eval` says about it (read back from
/// `metrics.json` without the ROC curves, which only the figures keep).
#[derive(Debug, Serialize, Deserialize)]
pub struct Evaluated {
    /// The evaluated data (the split's directory, or the shard set).
    pub data: PathBuf,
    pub classes: Vec<String>,
    #[serde(flatten)]
    pub report: EvalReport,
    pub metrics: Metrics,
    /// 95% percentile-bootstrap intervals; None with `--bootstrap 0`.
    pub intervals: Option<Intervals>,
    /// What the probabilities are worth: NLL, Brier and ECE (before and after a temperature),
    /// conformal coverage and set size, uncertain photos.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<Trust>,
    /// Each class's one-vs-rest ROC curve (None when it has no image, or only its images).
    #[serde(skip)]
    pub roc_curves: Vec<Option<Vec<(f64, f64)>>>,
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
            roc_curves: (0..evaluation.classes.len()).map(|k| metrics::roc_curve(&predictions, k)).collect(),
            trust: None,
        })
    }

    /// With the trust report of `ensemble` (the models `evaluation` was made with).
    pub fn with_trust(
        self,
        evaluation: &CheckpointEvaluation,
        ensemble: &Ensemble,
        resamples: usize,
        seed: u64,
    ) -> Self {
        Evaluated { trust: Some(trust::assess(evaluation, ensemble, resamples, seed)), ..self }
    }

    /// Reads `metrics.json` of a directory [`Evaluated::write`] wrote.
    pub fn read(dir: &Path) -> Result<Evaluated> {
        let path = dir.join(METRICS_FILE);
        // A run directory may come from elsewhere: only a regular file of a bounded size is read
        // (a metrics.json of 100 classes is well under 1 MiB).
        let bytes = files::read_regular(&path, METRICS_LIMIT)
            .with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_slice(&bytes)
            .with_context(|| format!("{}: not an evaluation rtrain wrote", path.display()))
    }

    /// The report as text: per-class table, headline metrics with intervals, confusion.
    pub fn describe(&self) -> String {
        let (report, m) = (&self.report, &self.metrics);
        let mut text = String::new();
        let _ = writeln!(text, "{}: {} images, loss {:.4}", self.data.display(), report.samples, report.loss);
        let _ = writeln!(
            text,
            "  {:<24} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "class", "precision", "recall", "f1", "support", "roc auc"
        );
        for (class, c) in self.classes.iter().zip(&m.per_class) {
            let auc = c.roc_auc.map_or("-".to_string(), |auc| format!("{auc:.4}"));
            let _ = writeln!(
                text,
                "  {class:<24} {:>9.4} {:>9.4} {:>9.4} {:>9} {auc:>9}",
                c.precision, c.recall, c.f1, c.support
            );
        }
        let interval = |pick: fn(&Intervals) -> Interval| {
            self.intervals
                .as_ref()
                .map(pick)
                .map_or(String::new(), |i| format!(" (95% interval [{:.4}, {:.4}])", i.low, i.high))
        };
        let _ = writeln!(text, "top-1 {:.4}{}", m.top1, interval(|i| i.top1));
        let ordinal = &m.ordinal;
        let _ = writeln!(
            text,
            "macro F1 {:.4}{}, weighted F1 {:.4}",
            ordinal.macro_f1,
            interval(|i| i.macro_f1),
            m.weighted_f1
        );
        let _ = writeln!(
            text,
            "balanced accuracy {:.4}{}",
            ordinal.balanced_accuracy,
            interval(|i| i.balanced_accuracy)
        );
        let kappa = |k: Option<f64>| k.map_or("undefined".to_string(), |k| format!("{k:.4}"));
        let _ = writeln!(
            text,
            "Cohen's kappa {}, quadratic-weighted {}{}",
            kappa(ordinal.cohen_kappa),
            kappa(ordinal.quadratic_kappa),
            interval(|i| i.quadratic_kappa)
        );
        let _ = writeln!(
            text,
            "mean error in class rank {:.4}, errors more than one class away {:.1}%",
            ordinal.mean_rank_error,
            100.0 * ordinal.far_error_share
        );
        let _ = writeln!(
            text,
            "log loss {:.4}, expected calibration error {:.4} ({} bins)",
            m.log_loss,
            m.ece,
            metrics::ECE_BINS
        );
        if let Some(trust) = &self.trust {
            let _ = writeln!(text, "probabilities:");
            text.push_str(&trust::describe(trust));
        }
        let _ = writeln!(text, "confusion (rows: true, columns: predicted):");
        for row in &report.confusion {
            let _ = writeln!(text, "  {row:?}");
        }
        text
    }

    /// Writes into `out`, each file atomically: `metrics.json` (what `--json` prints),
    /// `predictions.csv`, the figures (SVG and PNG; the gallery PNG) and `report.md`.
    pub fn write(&self, out: &Path, evaluation: &CheckpointEvaluation) -> Result<()> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        files::write_atomic(&out.join(METRICS_FILE), serde_json::to_string_pretty(self)?.as_bytes())?;
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
            let predicted = crate::metrics::argmax(&image.probabilities);
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
        self.write_figures(out, evaluation)?;
        Ok(())
    }

    /// Draws the figures (each SVG and PNG, the gallery PNG only) and `report.md`.
    fn write_figures(&self, out: &Path, evaluation: &CheckpointEvaluation) -> Result<()> {
        let confusion = &self.metrics.confusion;
        plot::confusion(&out.join("confusion"), "Confusion", &self.classes, confusion, plot::Cells::Counts)?;
        let title = "Confusion by true class (recall on the diagonal)";
        plot::confusion(
            &out.join("confusion-by-row"),
            title,
            &self.classes,
            confusion,
            plot::Cells::RowShares,
        )?;
        let diagonal =
            |label: &str| plot::Series { label: label.into(), points: vec![(0.0, 0.0), (1.0, 1.0)] };
        let occupied = self.metrics.reliability.iter().filter(|bin| bin.count > 0);
        let reliability = [
            plot::Series {
                label: format!("model (ECE {:.4})", self.metrics.ece),
                points: occupied.map(|bin| (bin.confidence, bin.accuracy)).collect(),
            },
            diagonal("perfectly calibrated"),
        ];
        let labels = plot::Labels {
            title: "Reliability (15 equal-width confidence bins)",
            x: "confidence (top probability)",
            y: "accuracy",
            log_y: false,
        };
        plot::lines(&out.join("reliability"), &labels, &reliability)?;
        let mut roc: Vec<plot::Series> = self
            .classes
            .iter()
            .zip(&self.roc_curves)
            .zip(&self.metrics.per_class)
            .filter_map(|((class, curve), m)| {
                let label = format!("{class} (AUC {:.3})", m.roc_auc?);
                Some(plot::Series { label, points: curve.clone()? })
            })
            .collect();
        roc.push(diagonal("chance"));
        let labels = plot::Labels {
            title: "ROC, one class vs the rest",
            x: "false positive rate",
            y: "true positive rate",
            log_y: false,
        };
        plot::lines(&out.join("roc"), &labels, &roc)?;
        let mistakes = gallery::most_confident_mistakes(&evaluation.images, gallery::DEFAULT_PER_PAIR);
        let title = format!("Most confident mistakes (up to {} per pair)", gallery::DEFAULT_PER_PAIR);
        let dataset = evaluation.dataset.as_ref();
        gallery::draw(&out.join("mistakes.png"), &title, dataset, &self.classes, &mistakes, |mistake| {
            dataset.load(mistake.index).ok()
        })?;
        // The same mistakes as Grad-CAM sees them: the predicted class's map at layer4 (fp32, on
        // the CPU, from the checkpoint file, as `rtrain explain` computes it).
        let (model, _) = checkpoint::load_model(&evaluation.checkpoint)?;
        let mut explainer = Explainer::new(&model, evaluation.transform.clone(), GALLERY_LAYER);
        let title = format!("Grad-CAM of the predicted class (layer{GALLERY_LAYER}) for the mistakes above");
        gallery::draw(
            &out.join("mistakes-gradcam.png"),
            &title,
            dataset,
            &self.classes,
            &mistakes,
            |mistake| match explainer.explain(dataset, mistake.index, Some(mistake.predicted)) {
                Ok(one) => Some(one.overlay),
                Err(error) => {
                    tracing::warn!("{error}: shown grey in mistakes-gradcam.png");
                    None
                }
            },
        )?;
        let markdown = format!(
            "# Evaluation of {}\n\n```\n{}```\n\n![confusion](confusion.svg)\n\n\
             ![confusion by true class](confusion-by-row.svg)\n\n![reliability](reliability.svg)\n\n\
             ![ROC](roc.svg)\n\n![most confident mistakes](mistakes.png)\n\n\
             ![Grad-CAM of the mistakes](mistakes-gradcam.png)\n",
            self.data.display(),
            self.describe()
        );
        files::write_atomic(&out.join("report.md"), markdown.as_bytes())?;
        Ok(())
    }
}

/// Writes `RUN/evaluation/` from the best checkpoint's per-image results at the end of
/// training: what `rtrain eval --checkpoint RUN/checkpoints/best.safetensors --split VAL --out
/// DIR` writes (the bootstrap seeded by `run.seed`), for `rtrain report`. After the weights and
/// summary, so that a failure here (an image the gallery cannot read again, no font, a full
/// disk) costs only this directory, which `rtrain eval` can write again: logged, not fatal.
pub fn write_for_run(paths: &RunPaths, evaluation: &CheckpointEvaluation, seed: u64) {
    let dir = paths.evaluation();
    let written = Evaluated::new(evaluation, metrics::DEFAULT_BOOTSTRAP, seed)
        .map(|evaluated| Evaluated {
            trust: Some(trust::assess_checkpoint(evaluation, metrics::DEFAULT_BOOTSTRAP, seed)),
            ..evaluated
        })
        .and_then(|evaluated| evaluated.write(&dir, evaluation));
    match written {
        Ok(()) => tracing::info!(
            "the best checkpoint's evaluation (metrics with intervals, per-image results, figures): {}",
            dir.display()
        ),
        Err(error) => tracing::error!(
            "could not write {}: {error:#}; `rtrain eval --out` writes it from the best checkpoint",
            dir.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_directorys_list_names_the_metrics_file() {
        assert!(WRITTEN_FILES.contains(&METRICS_FILE), "{WRITTEN_FILES:?}");
    }

    #[test]
    fn a_metrics_json_that_is_no_regular_file_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        // A device that never ends: reading it whole would allocate until memory ran out.
        std::os::unix::fs::symlink("/dev/zero", dir.path().join(METRICS_FILE)).unwrap();
        let error = format!("{:#}", Evaluated::read(dir.path()).unwrap_err());
        assert!(error.contains("metrics.json"), "{error}");
    }
}
