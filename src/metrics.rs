//! Classification metrics a paper can defend, from per-image predictions: per-class precision,
//! recall, F1 and support; macro and weighted F1; balanced accuracy; top-k; log loss; Cohen's
//! kappa unweighted and quadratic-weighted, the mean error in class rank and the share of
//! errors more than one class away (damage levels are ordered); expected calibration error
//! with its reliability bins; one-vs-rest ROC AUC per class; and seeded bootstrap intervals.
//!
//! Every definition is scikit-learn's (the reference the tests compare with, to 1e-9), with
//! the class set fixed to the model's classes (sklearn's `labels=range(C)`), so that a class
//! nobody predicted still counts: precision, recall or F1 whose denominator is 0 is 0
//! (sklearn's `zero_division=0`), balanced accuracy averages the recall of the classes that
//! occur, and the class rank is the class index (the sorted class names, or `data.class_order`).

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Deserializer, Serialize};

/// Bins of the expected calibration error: equal-width over (0, 1], as most papers use.
pub const ECE_BINS: usize = 15;
/// Resamples of the bootstrap intervals by default.
pub const DEFAULT_BOOTSTRAP: usize = 1000;

/// The most resamples `rtrain eval --bootstrap` takes: each resample's four metrics are kept
/// for the percentiles, and each costs a pass over the images, so 10^9 grew past 5 GB and
/// hours; 10^5 puts Monte Carlo error far below the interval's own width.
pub const MAX_BOOTSTRAP: usize = 100_000;

/// What was predicted for a set of images: the true class of each and the probabilities the
/// model gave every class (rows sum to 1).
pub struct Predictions<'a> {
    pub labels: &'a [usize],
    pub probabilities: &'a [Vec<f64>],
    pub num_classes: usize,
}

impl Predictions<'_> {
    fn predicted(&self, i: usize) -> usize {
        argmax(&self.probabilities[i])
    }
}

/// The index of the largest value (the first of equal ones, as `argmax` everywhere).
pub fn argmax<T: PartialOrd + Copy>(values: &[T]) -> usize {
    values.iter().enumerate().fold(0, |best, (i, &v)| if v > values[best] { i } else { best })
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClassMetrics {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    pub support: u64,
    /// One-vs-rest ROC AUC; None when the class never or always occurs (undefined).
    pub roc_auc: Option<f64>,
}

/// One reliability-diagram bin: images whose confidence (top probability) falls in
/// `(lower, upper]`, their mean confidence and their accuracy.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReliabilityBin {
    pub lower: f64,
    pub upper: f64,
    pub count: u64,
    pub confidence: f64,
    pub accuracy: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Metrics {
    pub images: u64,
    pub top1: f64,
    /// Accuracy with the true class among the `k` most probable, for k = 2..min(5, C).
    pub top_k: Vec<(usize, f64)>,
    pub per_class: Vec<ClassMetrics>,
    /// Macro-F1, balanced accuracy, the kappas and the rank errors (flattened: the same keys
    /// as in `metrics.jsonl`'s validation reports).
    #[serde(flatten)]
    pub ordinal: ConfusionMetrics,
    pub weighted_f1: f64,
    pub log_loss: f64,
    pub ece: f64,
    pub reliability: Vec<ReliabilityBin>,
    /// Mean of the per-class ROC AUCs that are defined.
    pub macro_roc_auc: Option<f64>,
    /// `confusion[true][predicted]`.
    pub confusion: Vec<Vec<u64>>,
}

/// The expected calibration error of `predictions` ([`ECE_BINS`] equal-width bins).
pub fn ece(predictions: &Predictions) -> f64 {
    calibration(predictions).0
}

/// The metrics of `predictions`. Panics if it holds no image or a label outside the classes.
pub fn compute(predictions: &Predictions) -> Metrics {
    let (n, c) = (predictions.labels.len(), predictions.num_classes);
    assert!(n > 0, "metrics of no images");
    let predicted: Vec<usize> = (0..n).map(|i| predictions.predicted(i)).collect();
    let confusion = confusion_of(predictions.labels, &predicted, 0..n, c);
    let per_class: Vec<ClassMetrics> = class_rates(&confusion)
        .iter()
        .enumerate()
        .map(|(k, rates)| ClassMetrics {
            precision: rates.precision,
            recall: rates.recall,
            f1: rates.f1,
            support: rates.support,
            roc_auc: roc_auc(predictions, k),
        })
        .collect();
    let aucs: Vec<f64> = per_class.iter().filter_map(|m| m.roc_auc).collect();
    let (ece, reliability) = calibration(predictions);
    let correct: u64 = (0..c).map(|k| confusion[k][k]).sum();
    Metrics {
        images: n as u64,
        top1: correct as f64 / n as f64,
        top_k: (2..=c.min(5)).map(|k| (k, top_k(predictions, k))).collect(),
        ordinal: from_confusion(&confusion),
        weighted_f1: per_class.iter().map(|m| m.f1 * m.support as f64).sum::<f64>() / n as f64,
        log_loss: log_loss(predictions),
        ece,
        reliability,
        macro_roc_auc: (!aucs.is_empty()).then(|| aucs.iter().sum::<f64>() / aucs.len() as f64),
        per_class,
        confusion,
    }
}

/// The metrics that follow from a confusion matrix alone, cheap enough for every epoch's
/// validation (`metrics.jsonl`, `summary.json`). A kappa is None where it is undefined (every
/// image in one class, or every prediction).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConfusionMetrics {
    pub macro_f1: f64,
    pub balanced_accuracy: f64,
    pub cohen_kappa: Option<f64>,
    pub quadratic_kappa: Option<f64>,
    /// Mean absolute difference between true and predicted class rank, over every image.
    pub mean_rank_error: f64,
    /// Of the wrong predictions, the share more than one class away (0 with no errors).
    pub far_error_share: f64,
}

/// [`ConfusionMetrics`] of `confusion[true][predicted]`; all 0 (kappas None) for no images.
pub fn from_confusion(confusion: &[Vec<u64>]) -> ConfusionMetrics {
    let n: u64 = confusion.iter().flatten().sum();
    if n == 0 {
        return ConfusionMetrics::default();
    }
    let rates = class_rates(confusion);
    let [_, macro_f1, balanced_accuracy, quadratic_kappa] = headline(confusion, &rates);
    let (mut rank_error, mut errors, mut far) = (0u64, 0u64, 0u64);
    for (i, row) in confusion.iter().enumerate() {
        for (j, &count) in row.iter().enumerate() {
            let distance = i.abs_diff(j) as u64;
            rank_error += distance * count;
            errors += u64::from(distance > 0) * count;
            far += u64::from(distance > 1) * count;
        }
    }
    let defined = |kappa: f64| kappa.is_finite().then_some(kappa);
    ConfusionMetrics {
        macro_f1,
        balanced_accuracy,
        cohen_kappa: defined(kappa(confusion, |_, _| 1.0)),
        quadratic_kappa: defined(quadratic_kappa),
        mean_rank_error: rank_error as f64 / n as f64,
        far_error_share: if errors == 0 { 0.0 } else { far as f64 / errors as f64 },
    }
}

/// `confusion[true][predicted]` over the images `images` (indices, repeats counted).
fn confusion_of(
    labels: &[usize],
    predicted: &[usize],
    images: impl Iterator<Item = usize>,
    num_classes: usize,
) -> Vec<Vec<u64>> {
    let mut confusion = vec![vec![0u64; num_classes]; num_classes];
    for i in images {
        confusion[labels[i]][predicted[i]] += 1;
    }
    confusion
}

/// One class's precision, recall, F1 and support.
struct ClassRates {
    precision: f64,
    recall: f64,
    f1: f64,
    support: u64,
}

/// Each class's rates from `confusion[true][predicted]`.
fn class_rates(confusion: &[Vec<u64>]) -> Vec<ClassRates> {
    let ratio = |num: f64, den: f64| if den > 0.0 { num / den } else { 0.0 };
    (0..confusion.len())
        .map(|k| {
            let tp = confusion[k][k] as f64;
            let support: u64 = confusion[k].iter().sum();
            let predicted: u64 = confusion.iter().map(|row| row[k]).sum();
            ClassRates {
                precision: ratio(tp, predicted as f64),
                recall: ratio(tp, support as f64),
                f1: ratio(2.0 * tp, (predicted + support) as f64),
                support,
            }
        })
        .collect()
}

/// Top-1, macro F1, balanced accuracy and quadratic kappa: the metrics with intervals, all
/// functions of the confusion matrix (so the bootstrap recomputes them from counts alone).
fn headline(confusion: &[Vec<u64>], rates: &[ClassRates]) -> [f64; 4] {
    let n: u64 = confusion.iter().flatten().sum();
    let correct: u64 = (0..confusion.len()).map(|k| confusion[k][k]).sum();
    let occurring: Vec<&ClassRates> = rates.iter().filter(|r| r.support > 0).collect();
    [
        correct as f64 / n as f64,
        rates.iter().map(|r| r.f1).sum::<f64>() / rates.len() as f64,
        occurring.iter().map(|r| r.recall).sum::<f64>() / occurring.len() as f64,
        kappa(confusion, |i, j| (i.abs_diff(j) as f64).powi(2)),
    ]
}

/// Cohen's kappa of a confusion matrix with disagreement weights `weight(i, j)` (0 on the
/// diagonal): 1 - sum(w * observed) / sum(w * expected by chance), as sklearn's
/// `cohen_kappa_score` (`weights=None` is 1 off the diagonal; `"quadratic"` is (i - j)^2).
fn kappa(confusion: &[Vec<u64>], weight: impl Fn(usize, usize) -> f64) -> f64 {
    let c = confusion.len();
    let n: f64 = confusion.iter().flatten().sum::<u64>() as f64;
    let rows: Vec<f64> = confusion.iter().map(|r| r.iter().sum::<u64>() as f64).collect();
    let cols: Vec<f64> = (0..c).map(|j| confusion.iter().map(|r| r[j]).sum::<u64>() as f64).collect();
    let (mut observed, mut expected) = (0.0, 0.0);
    for i in 0..c {
        for j in (0..c).filter(|&j| j != i) {
            observed += weight(i, j) * confusion[i][j] as f64;
            expected += weight(i, j) * rows[i] * cols[j] / n;
        }
    }
    1.0 - observed / expected
}

/// Mean negative log probability of the true class, each row normalised to sum 1 and clipped
/// to [eps, 1 - eps] with eps the f64 machine epsilon (sklearn's `log_loss`).
/// scikit-learn's `log_loss`: the mean negative log-likelihood of the true classes, each row
/// clipped to [eps, 1 - eps] and renormalised.
pub fn log_loss(predictions: &Predictions) -> f64 {
    let eps = f64::EPSILON;
    let total: f64 = predictions
        .labels
        .iter()
        .zip(predictions.probabilities)
        .map(|(&label, row)| {
            let clipped: Vec<f64> = row.iter().map(|p| p.clamp(eps, 1.0 - eps)).collect();
            let sum: f64 = clipped.iter().sum();
            -(clipped[label] / sum).ln()
        })
        .sum();
    total / predictions.labels.len() as f64
}

/// Share of images whose true class is among the `k` most probable; of equally probable
/// classes the higher index ranks first (sklearn's `top_k_accuracy_score` documents this).
fn top_k(predictions: &Predictions, k: usize) -> f64 {
    let hits = predictions
        .labels
        .iter()
        .zip(predictions.probabilities)
        .filter(|(&label, row)| {
            let above =
                row.iter().enumerate().filter(|&(c, &p)| p > row[label] || (p == row[label] && c > label));
            above.count() < k
        })
        .count();
    hits as f64 / predictions.labels.len() as f64
}

/// Class `k` against the rest: each image's probability of `k` with whether `k` is its class,
/// and how many images are (positives) and are not (negatives) of it.
struct OneVsRest {
    scored: Vec<(f64, bool)>,
    positives: f64,
    negatives: f64,
}

/// [`OneVsRest`] of class `k`; None when either side is empty.
fn one_vs_rest(predictions: &Predictions, k: usize) -> Option<OneVsRest> {
    let scored: Vec<(f64, bool)> = predictions
        .labels
        .iter()
        .zip(predictions.probabilities)
        .map(|(&label, row)| (row[k], label == k))
        .collect();
    let positives = scored.iter().filter(|(_, p)| *p).count() as f64;
    let negatives = scored.len() as f64 - positives;
    (positives > 0.0 && negatives > 0.0).then_some(OneVsRest { scored, positives, negatives })
}

/// One-vs-rest ROC AUC of class `k`: the probability that an image of the class gets a higher
/// score than one of another (ties count a half), by average ranks (the Mann-Whitney U; equal
/// to the trapezoidal area under sklearn's ROC curve). None when either side is empty.
fn roc_auc(predictions: &Predictions, k: usize) -> Option<f64> {
    let OneVsRest { mut scored, positives, negatives } = one_vs_rest(predictions, k)?;
    scored.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut rank_sum = 0.0;
    let mut start = 0;
    while start < scored.len() {
        let end = start + scored[start..].iter().take_while(|(s, _)| *s == scored[start].0).count();
        let average_rank = (start + end + 1) as f64 / 2.0; // ranks start..end, 1-based
        rank_sum += average_rank * scored[start..end].iter().filter(|(_, p)| *p).count() as f64;
        start = end;
    }
    Some((rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives))
}

/// Class `k`'s one-vs-rest ROC curve: (false positive rate, true positive rate) from (0, 0),
/// one point per distinct score from the highest down (sklearn's `roc_curve` with
/// `drop_intermediate=False`). None when either side is empty.
pub fn roc_curve(predictions: &Predictions, k: usize) -> Option<Vec<(f64, f64)>> {
    let OneVsRest { mut scored, positives, negatives } = one_vs_rest(predictions, k)?;
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut curve = vec![(0.0, 0.0)];
    let (mut tp, mut fp) = (0.0, 0.0);
    for (i, &(score, positive)) in scored.iter().enumerate() {
        if positive {
            tp += 1.0;
        } else {
            fp += 1.0;
        }
        if scored.get(i + 1).is_none_or(|next| next.0 != score) {
            curve.push((fp / negatives, tp / positives));
        }
    }
    Some(curve)
}

/// Expected calibration error over [`ECE_BINS`] equal-width bins of confidence (the top
/// probability; bin b holds (b/B, (b+1)/B]): the mean over images of |accuracy - confidence|
/// of their bin (Guo et al. 2017); and the bins for the reliability diagram.
fn calibration(predictions: &Predictions) -> (f64, Vec<ReliabilityBin>) {
    let n = predictions.labels.len() as f64;
    let mut sums = vec![(0u64, 0.0f64, 0u64); ECE_BINS];
    for (i, row) in predictions.probabilities.iter().enumerate() {
        let top = predictions.predicted(i);
        let confidence = row[top];
        // The bin whose (b/B, (b+1)/B] holds it, by comparison with the same bounds the
        // reference computes (a product could round across a bound); 0 goes to the first.
        let bin =
            (0..ECE_BINS).find(|&b| confidence <= (b + 1) as f64 / ECE_BINS as f64).unwrap_or(ECE_BINS - 1);
        let entry = &mut sums[bin];
        entry.0 += 1;
        entry.1 += confidence;
        entry.2 += u64::from(top == predictions.labels[i]);
    }
    let bins: Vec<ReliabilityBin> = sums
        .iter()
        .enumerate()
        .map(|(b, &(count, confidence, correct))| ReliabilityBin {
            lower: b as f64 / ECE_BINS as f64,
            upper: (b + 1) as f64 / ECE_BINS as f64,
            count,
            confidence: if count > 0 { confidence / count as f64 } else { 0.0 },
            accuracy: if count > 0 { correct as f64 / count as f64 } else { 0.0 },
        })
        .collect();
    let ece = bins.iter().map(|b| b.count as f64 / n * (b.accuracy - b.confidence).abs()).sum();
    (ece, bins)
}

/// A 95% interval; NaN bounds (JSON null) where no resample defined the metric.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Interval {
    #[serde(deserialize_with = "nan_if_null")]
    pub low: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub high: f64,
}

/// Reads back a number that serde_json wrote as null because it was NaN.
fn nan_if_null<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

/// Percentile bootstrap intervals of the headline metrics.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Intervals {
    pub resamples: usize,
    pub seed: u64,
    pub top1: Interval,
    pub macro_f1: Interval,
    pub balanced_accuracy: Interval,
    pub quadratic_kappa: Interval,
}

/// 95% percentile-bootstrap intervals over images: `resamples` draws of n images with
/// replacement (ChaCha8 seeded with `seed`, so the same seed gives the same intervals bit for
/// bit), each metric recomputed, the 2.5th and 97.5th percentiles taken (linear interpolation,
/// numpy's default). A resample whose metric is undefined (a kappa with one class) is left
/// out of that metric's interval.
pub fn bootstrap(predictions: &Predictions, resamples: usize, seed: u64) -> Intervals {
    let n = predictions.labels.len();
    let predicted: Vec<usize> = (0..n).map(|i| predictions.predicted(i)).collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut draws: [Vec<f64>; 4] = Default::default();
    for _ in 0..resamples {
        let drawn = (0..n).map(|_| rng.random_range(0..n));
        let confusion = confusion_of(predictions.labels, &predicted, drawn, predictions.num_classes);
        for (draw, value) in draws.iter_mut().zip(headline(&confusion, &class_rates(&confusion))) {
            if value.is_finite() {
                draw.push(value);
            }
        }
    }
    let interval = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        Interval { low: percentile(values, 2.5), high: percentile(values, 97.5) }
    };
    let [top1, macro_f1, balanced_accuracy, quadratic_kappa] = &mut draws;
    Intervals {
        resamples,
        seed,
        top1: interval(top1),
        macro_f1: interval(macro_f1),
        balanced_accuracy: interval(balanced_accuracy),
        quadratic_kappa: interval(quadratic_kappa),
    }
}

/// The 95% percentile interval of `values` (sorted here), as [`bootstrap`] takes it.
pub fn percentile_interval(values: &mut [f64]) -> Interval {
    values.sort_by(f64::total_cmp);
    Interval { low: percentile(values, 2.5), high: percentile(values, 97.5) }
}

/// The `q`th percentile of sorted values, interpolating linearly between ranks (numpy's
/// default); NaN for no values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let position = q / 100.0 * (sorted.len() - 1) as f64;
    let (below, fraction) = (position.floor() as usize, position.fract());
    let above = (below + 1).min(sorted.len() - 1);
    sorted[below] + (sorted[above] - sorted[below]) * fraction
}

#[cfg(test)]
mod tests {
    use super::*;

    fn predictions(labels: &[usize], rows: &[[f64; 3]]) -> (Vec<usize>, Vec<Vec<f64>>) {
        (labels.to_vec(), rows.iter().map(|r| r.to_vec()).collect())
    }

    #[test]
    fn a_perfect_classifier_and_hand_counted_values() {
        let (labels, probs) =
            predictions(&[0, 1, 2, 2], &[[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.1, 0.1, 0.8], [0.6, 0.1, 0.3]]);
        let m = compute(&Predictions { labels: &labels, probabilities: &probs, num_classes: 3 });
        assert_eq!(m.confusion, vec![vec![1, 0, 0], vec![0, 1, 0], vec![1, 0, 1]]);
        assert_eq!(m.top1, 0.75);
        // Class 0: precision 1/2, recall 1, F1 2/3; class 2: precision 1, recall 1/2.
        assert_eq!((m.per_class[0].precision, m.per_class[0].recall), (0.5, 1.0));
        assert!((m.per_class[2].f1 - 2.0 / 3.0).abs() < 1e-15);
        assert_eq!(m.ordinal.balanced_accuracy, (1.0 + 1.0 + 0.5) / 3.0);
        // One error, two classes away.
        assert_eq!((m.ordinal.mean_rank_error, m.ordinal.far_error_share), (0.5, 1.0));
        assert_eq!(m.top_k, vec![(2, 1.0), (3, 1.0)]);
    }

    #[test]
    fn percentiles_interpolate_as_numpy() {
        let values = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&values, 50.0), 2.5);
        assert_eq!(percentile(&values, 2.5), 1.075);
        assert_eq!(percentile(&[7.0], 97.5), 7.0);
    }

    #[test]
    fn the_same_seed_gives_the_same_intervals() {
        let (labels, probs) = predictions(
            &[0, 1, 2, 2, 1, 0, 0, 2],
            &[
                [0.8, 0.1, 0.1],
                [0.2, 0.7, 0.1],
                [0.1, 0.1, 0.8],
                [0.6, 0.1, 0.3],
                [0.3, 0.3, 0.4],
                [0.5, 0.4, 0.1],
                [0.2, 0.5, 0.3],
                [0.1, 0.2, 0.7],
            ],
        );
        let p = Predictions { labels: &labels, probabilities: &probs, num_classes: 3 };
        let (a, b, c) = (bootstrap(&p, 200, 7), bootstrap(&p, 200, 7), bootstrap(&p, 200, 8));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.top1.low <= 0.625 && 0.625 <= a.top1.high, "{a:?}");
    }

    #[test]
    fn the_area_under_the_roc_curve_is_the_roc_auc() {
        let labels = [0, 1, 2, 1, 0, 2, 2, 1, 0, 1];
        let scores = [0.9, 0.4, 0.2, 0.4, 0.7, 0.1, 0.4, 0.8, 0.3, 0.6];
        let probabilities: Vec<Vec<f64>> =
            scores.iter().map(|&s: &f64| vec![s, (1.0 - s) / 2.0, (1.0 - s) / 2.0]).collect();
        let predictions = Predictions { labels: &labels, probabilities: &probabilities, num_classes: 3 };
        for k in 0..3 {
            let curve = roc_curve(&predictions, k).unwrap();
            assert_eq!(curve.first(), Some(&(0.0, 0.0)));
            assert_eq!(curve.last(), Some(&(1.0, 1.0)));
            let area: f64 = curve.windows(2).map(|w| (w[1].0 - w[0].0) * (w[1].1 + w[0].1) / 2.0).sum();
            assert!((area - roc_auc(&predictions, k).unwrap()).abs() < 1e-12, "class {k}: {curve:?}");
        }
    }
}
