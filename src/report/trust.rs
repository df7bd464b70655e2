//! What `rtrain eval` says of a model's probabilities, beside its accuracy: the negative
//! log-likelihood, the Brier score and the expected calibration error, with bootstrap
//! intervals, after and (for a model `rtrain calibrate` scaled) before its temperature; the
//! conformal prediction sets' empirical coverage and mean size with intervals; and how many
//! photos are above the calibrated uncertainty threshold.
//!
//! The definitions are scikit-learn's (`log_loss`, `brier_score_loss`) and the metrics
//! module's (ECE), computed on the same per-image probabilities the report uses; the bootstrap
//! draws images with replacement as `metrics::bootstrap` does (ChaCha8 seeded, percentiles as
//! numpy's).

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::calibration::{self, ConformalMethod};
use crate::inference::{Ensemble, MemberRecord, Tta};
use crate::metrics::{self, Interval, Predictions};
use crate::run_dir::checkpoint::Calibration;
use crate::train::eval::CheckpointEvaluation;

/// NLL, Brier score and ECE of a set of probabilities.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Scores {
    pub nll: f64,
    pub brier: f64,
    pub ece: f64,
    /// 95% percentile-bootstrap intervals (None with `--bootstrap 0`).
    pub intervals: Option<ScoreIntervals>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ScoreIntervals {
    pub nll: Interval,
    pub brier: Interval,
    pub ece: Interval,
}

/// How the conformal prediction sets did on the evaluated images.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SetReport {
    pub method: ConformalMethod,
    pub alpha: f64,
    /// The share of images whose set holds the true class (promised: at least 1 - alpha).
    pub coverage: f64,
    pub mean_set_size: f64,
    pub coverage_interval: Option<Interval>,
    pub set_size_interval: Option<Interval>,
    /// The evaluated images are the ones the sets were fitted on: coverage is not a test.
    pub fitted_on_these_images: bool,
}

/// Photos above the calibrated entropy threshold.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Uncertain {
    pub entropy_threshold: f64,
    pub count: usize,
    pub share: f64,
}

/// Everything eval says of the probabilities.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Trust {
    /// The models evaluated (one, or an ensemble's members) and the test-time views.
    pub members: Vec<MemberRecord>,
    pub tta: Tta,
    /// The probabilities as used (after any temperature, averaged over members and views).
    pub scores: Scores,
    /// A single calibrated model's, before its temperature.
    pub before_temperature: Option<Scores>,
    pub temperature: Option<f64>,
    pub sets: Option<SetReport>,
    pub uncertain: Option<Uncertain>,
}

/// The trust report of `ensemble` on `evaluation`, with `resamples` bootstrap resamples
/// seeded by `seed`.
pub fn assess(evaluation: &CheckpointEvaluation, ensemble: &Ensemble, resamples: usize, seed: u64) -> Trust {
    let temperature = match ensemble.members.as_slice() {
        [only] => only.meta.calibration.as_ref().map(|c| c.temperature),
        _ => None,
    };
    let models = Models {
        members: ensemble.records(),
        tta: ensemble.tta,
        calibration: ensemble.calibration(),
        temperature,
    };
    assess_models(evaluation, &models, resamples, seed)
}

/// The trust report of the one uncalibrated model `evaluation` was made with (the run's best
/// checkpoint at the end of training), as `rtrain eval` of that file reports it.
pub fn assess_checkpoint(evaluation: &CheckpointEvaluation, resamples: usize, seed: u64) -> Trust {
    let member = MemberRecord {
        path: evaluation.checkpoint.clone(),
        sha256: crate::util::files::sha256_file(&evaluation.checkpoint).unwrap_or_default(),
        temperature: 1.0,
        image_size: evaluation.transform.size,
    };
    let models = Models { members: vec![member], tta: Tta::None, calibration: None, temperature: None };
    assess_models(evaluation, &models, resamples, seed)
}

/// What the report says of the models: who they are, their views, the calibration whose sets
/// and threshold apply, and a single model's temperature.
struct Models<'a> {
    members: Vec<MemberRecord>,
    tta: Tta,
    calibration: Option<&'a Calibration>,
    temperature: Option<f64>,
}

fn assess_models(evaluation: &CheckpointEvaluation, models: &Models, resamples: usize, seed: u64) -> Trust {
    let labels: Vec<usize> = evaluation.images.iter().map(|i| i.label).collect();
    let probabilities: Vec<Vec<f64>> = evaluation.images.iter().map(|i| i.probabilities.clone()).collect();
    let num_classes = evaluation.classes.len();
    let calibration = models.calibration;
    // Before the temperature: the single model's own softmax of one view (its logits).
    let before_temperature = calibration.map(|_| {
        let raw: Vec<Vec<f64>> =
            evaluation.images.iter().map(|i| calibration::softmax(&i.logits, 1.0)).collect();
        scores(&labels, &raw, num_classes, resamples, seed)
    });
    let sets = calibration.and_then(|c| c.conformal.as_ref()).map(|rule| {
        let sets: Vec<Vec<usize>> = probabilities
            .iter()
            .map(|p| calibration::prediction_set(p, rule.threshold, rule.method))
            .collect();
        let covered: Vec<f64> =
            sets.iter().zip(&labels).map(|(set, label)| f64::from(u8::from(set.contains(label)))).collect();
        let sizes: Vec<f64> = sets.iter().map(|set| set.len() as f64).collect();
        let fitted = calibration.map(|c| c.fitted_on.sha256.clone());
        let here = crate::calibrate::split_sha256(evaluation.dataset.as_ref()).ok();
        let fitted_on_these_images = fitted.is_some() && fitted == here;
        if fitted_on_these_images {
            tracing::warn!(
                "{}: the prediction sets were fitted on these images: their coverage here is not a test (evaluate another split)",
                evaluation.dataset.root().display()
            );
        }
        let (coverage_interval, set_size_interval) = match resamples {
            0 => (None, None),
            _ => {
                let [coverage, size] = bootstrap_means(&[&covered, &sizes], resamples, seed);
                (Some(coverage), Some(size))
            }
        };
        SetReport {
            method: rule.method,
            alpha: rule.alpha,
            coverage: mean(&covered),
            mean_set_size: mean(&sizes),
            coverage_interval,
            set_size_interval,
            fitted_on_these_images,
        }
    });
    let uncertain = calibration.map(|c| {
        let count = probabilities.iter().filter(|p| calibration::entropy(p) > c.entropy_threshold).count();
        Uncertain {
            entropy_threshold: c.entropy_threshold,
            count,
            share: count as f64 / labels.len().max(1) as f64,
        }
    });
    Trust {
        members: models.members.clone(),
        tta: models.tta,
        scores: scores(&labels, &probabilities, num_classes, resamples, seed),
        before_temperature,
        temperature: models.temperature,
        sets,
        uncertain,
    }
}

/// NLL (scikit-learn's `log_loss`), Brier score and ECE of `probabilities`, with intervals.
pub fn scores(
    labels: &[usize],
    probabilities: &[Vec<f64>],
    num_classes: usize,
    resamples: usize,
    seed: u64,
) -> Scores {
    let of = |labels: &[usize], probabilities: &[Vec<f64>]| {
        let predictions = Predictions { labels, probabilities, num_classes };
        [
            metrics::log_loss(&predictions),
            calibration::brier_score(probabilities, labels),
            metrics::ece(&predictions),
        ]
    };
    let [nll, brier, ece] = of(labels, probabilities);
    let intervals = (resamples > 0).then(|| {
        let n = labels.len();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut draws: [Vec<f64>; 3] = Default::default();
        for _ in 0..resamples {
            let drawn: Vec<usize> = (0..n).map(|_| rng.random_range(0..n)).collect();
            let labels: Vec<usize> = drawn.iter().map(|&i| labels[i]).collect();
            let probabilities: Vec<Vec<f64>> = drawn.iter().map(|&i| probabilities[i].clone()).collect();
            for (draw, value) in draws.iter_mut().zip(of(&labels, &probabilities)) {
                draw.push(value);
            }
        }
        let [nll, brier, ece] = draws.map(|mut values| metrics::percentile_interval(&mut values));
        ScoreIntervals { nll, brier, ece }
    });
    Scores { nll, brier, ece, intervals }
}

/// 95% percentile-bootstrap intervals of the means of per-image `values` (all drawn with the
/// same images).
fn bootstrap_means<const K: usize>(values: &[&[f64]; K], resamples: usize, seed: u64) -> [Interval; K] {
    let n = values[0].len();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut draws: [Vec<f64>; K] = std::array::from_fn(|_| Vec::with_capacity(resamples));
    for _ in 0..resamples {
        let drawn: Vec<usize> = (0..n).map(|_| rng.random_range(0..n)).collect();
        for (draw, values) in draws.iter_mut().zip(values) {
            draw.push(drawn.iter().map(|&i| values[i]).sum::<f64>() / n.max(1) as f64);
        }
    }
    draws.map(|mut values| metrics::percentile_interval(&mut values))
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// The report's lines of text.
pub fn describe(trust: &Trust) -> String {
    let interval =
        |i: &Option<Interval>| i.map(|i| format!(" [{:.4}, {:.4}]", i.low, i.high)).unwrap_or_default();
    let line = |name: &str, s: &Scores| {
        let i = s.intervals.as_ref();
        format!(
            "  {name:<20} NLL {:.4}{}  Brier {:.4}{}  ECE {:.4}{}\n",
            s.nll,
            interval(&i.map(|i| i.nll)),
            s.brier,
            interval(&i.map(|i| i.brier)),
            s.ece,
            interval(&i.map(|i| i.ece))
        )
    };
    let mut text = String::new();
    if trust.members.len() > 1 || trust.tta != Tta::None {
        text.push_str(&format!("  {} models, test-time views: {:?}\n", trust.members.len(), trust.tta));
    }
    if let (Some(before), Some(t)) = (&trust.before_temperature, trust.temperature) {
        text.push_str(&line("before temperature", before));
        text.push_str(&line(&format!("after (T = {t:.4})"), &trust.scores));
    } else {
        text.push_str(&line("probabilities", &trust.scores));
    }
    if let Some(sets) = &trust.sets {
        text.push_str(&format!(
            "  prediction sets ({:?}, alpha {}): coverage {:.4}{} (promised >= {:.2}), mean size {:.3}{}{}\n",
            sets.method,
            sets.alpha,
            sets.coverage,
            interval(&sets.coverage_interval),
            1.0 - sets.alpha,
            sets.mean_set_size,
            interval(&sets.set_size_interval),
            if sets.fitted_on_these_images { " (fitted on these images: not a test)" } else { "" }
        ));
    }
    if let Some(u) = &trust.uncertain {
        text.push_str(&format!(
            "  uncertain (entropy > {:.4}): {} photos ({:.1}%)\n",
            u.entropy_threshold,
            u.count,
            100.0 * u.share
        ));
    }
    text
}
