//! Probabilities a damage map can trust (issue "Probabilities a damage map can trust"): the
//! math that turns a trained model's logits into probabilities that mean what they say, and
//! into prediction sets with a coverage guarantee, from a calibration split the model never
//! trained on. Pure functions of numbers (no tensors, no files), so that `rtrain calibrate`,
//! `predict` and `eval` share one definition and the tests compare it with the references.
//!
//! - **Temperature scaling** (Guo et al. 2017): one T > 0 for all classes, the minimiser of the
//!   mean negative log-likelihood of softmax(logits / T) ([`fit_temperature`]), the fit that
//!   scikit-learn 1.9's `CalibratedClassifierCV(method="temperature")` makes (same bracket, T
//!   within 1e-4 of it in `tests/eval_metrics.rs`).
//! - **Scores** of probabilities: [`mean_nll`] (scikit-learn's `log_loss`), [`brier_score`]
//!   (its `brier_score_loss`, see there for the scaling), [`entropy`] in nats and the
//!   [`entropy_threshold`] above which a photo counts as uncertain.
//! - **Split-conformal prediction sets** ([`conformal_threshold`], [`prediction_set`]): with
//!   probability at least 1 - alpha a photo's set holds its true class, whatever the model, as
//!   long as calibration and new photos are exchangeable. Two scores, LAC (Sadinle et al. 2019:
//!   the smallest sets on average) and APS (Romano et al. 2020: sets that grow where the model
//!   is unsure). Every rule is MAPIE 1.6's `SplitConformalClassifier` (`prefit=True`, the
//!   defaults of `predict_set`), checked photo for photo in `tests/eval_metrics.rs`:
//!   - the threshold is the ceil((n + 1)(1 - alpha))-th smallest of the n calibration scores
//!     (numpy's quantile at level ceil((n + 1)(1 - alpha)) / n, method "lower", as MAPIE 1.6's
//!     `_compute_classification_quantile`; older MAPIE used "higher", one score further up);
//!   - n must be at least max(1/alpha, 1/(1 - alpha)) (MAPIE's `_check_alpha_and_n_samples`);
//!   - LAC's score is 1 - p(true class); a class is in the set when 1 - p - threshold <= 1e-8
//!     (MAPIE's `EPSILON`), so a set may be empty, as in MAPIE;
//!   - APS's calibration score is randomised as MAPIE's: the probabilities of the classes
//!     ranked down to the true one, summed, minus U·p(true class) with U uniform on [0, 1).
//!     rtrain draws U from a fixed seed ([`APS_SEED`], one draw per calibration image in their
//!     order, [`aps_uniforms`]), so a threshold is reproducible; the tests hand MAPIE the same
//!     draws. A set takes classes by falling probability down to the first whose cumulative
//!     probability reaches the threshold (within 1e-8), that one included (MAPIE's default
//!     `include_last_label=True`), then every class whose probability is within 1e-8 of the
//!     last one's (so exact ties go in or out together); a last class of probability <= 1e-8
//!     stands for the smallest probability above it, so classes of probability 0 stay out;
//!     where no cumulative probability reaches the threshold, class 0 is the last one (MAPIE's
//!     masked `argmin` of nothing). APS sets are never empty, and cover more than 1 - alpha
//!     (MAPIE documents this of `include_last_label=True`).
//!
//!   Where rtrain's rule is not MAPIE's: a calibration image whose true class ties another
//!   class exactly gets the APS score of the true class ranked after the classes it ties (the
//!   larger score, so coverage holds); MAPIE ranks ties as numpy's `argsort` leaves them, in
//!   no documented order (numpy 2.4 with AVX-512 ranks class 0 first in [0.3, 0.3, 0.2, 0.2]
//!   but class 3 first in [0.25, 0.25, 0.25, 0.25]). MAPIE refuses APS when the calibration
//!   labels take only two values; rtrain computes it.

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Temperatures are searched over [e^-10, e^10], scikit-learn 1.9's bracket (its
/// `_TemperatureScaling` searches log(1/T) over [-10, 10]).
pub const LOG_TEMPERATURE_RANGE: (f64, f64) = (-10.0, 10.0);

/// MAPIE's tolerance (`mapie._machine_precision.EPSILON`) in every comparison that builds a set.
pub const SET_TOLERANCE: f64 = 1e-8;

/// The seed of the uniform draws in APS's randomised calibration scores.
pub const APS_SEED: u64 = 20_240_917;

/// How far a calibration image's probabilities may sum from 1 (MAPIE's `check_proba_normalized`
/// refuses them past a relative 1e-5).
const PROBABILITY_SUM_TOLERANCE: f64 = 1e-5;

#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error("no images: calibration needs the logits or probabilities of at least one labelled image")]
    NoImages,
    #[error("{images} images but {labels} labels: give one label per image")]
    LabelCount { images: usize, labels: usize },
    #[error("{classes} classes: calibration needs at least 2")]
    TooFewClasses { classes: usize },
    #[error("image {image} has {found} values where image 0 has {expected}: give one value per class for every image")]
    RowLength { image: usize, found: usize, expected: usize },
    #[error("image {image} is labelled {label}, not a class of the {classes} (0 to {})", classes - 1)]
    LabelOutOfRange { image: usize, label: usize, classes: usize },
    #[error("image {image} has the value {value}: logits and probabilities must be finite")]
    NotFinite { image: usize, value: f64 },
    #[error("image {image}'s probabilities sum to {sum}, not 1: pass softmax outputs, each in [0, 1]")]
    NotProbabilities { image: usize, sum: f64 },
    #[error("alpha must be in (0,1), not {alpha}: it is the share of sets allowed to miss the true class (0.1 for 90% coverage)")]
    Alpha { alpha: f64 },
    #[error("fewer than {needed} calibration images for alpha {alpha} ({images} given): split conformal needs at least max(1/alpha, 1/(1 - alpha)); label more images or raise alpha")]
    TooFewForAlpha { needed: usize, alpha: f64, images: usize },
    #[error("{draws} uniform draws for {images} calibration images: APS takes one per image")]
    UniformCount { draws: usize, images: usize },
    #[error("the logits separate the classes of every image (each true class has the top logit): the likelihood keeps rising as the temperature falls below e^-10; temperature scaling needs a calibration split on which the model makes mistakes (more or harder images)")]
    Separable,
    #[error("the logits do not predict the labels: the likelihood is highest at a temperature above e^10 (uniform probabilities); check that the labels are the logits' classes, in the same order")]
    Uninformative,
}

/// softmax(logits / temperature), computed stably (subtract max) in f64.
///
/// # Panics
/// If `temperature` is not positive.
pub fn softmax(logits: &[f64], temperature: f64) -> Vec<f64> {
    assert!(temperature > 0.0, "softmax: temperature must be positive, not {temperature}");
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = logits.iter().map(|z| ((z - max) / temperature).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.into_iter().map(|e| e / sum).collect()
}

/// -log softmax(logits / temperature)[label], as log-sum-exp minus the label's scaled logit.
fn negative_log_likelihood(logits: &[f64], label: usize, temperature: f64) -> f64 {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = logits.iter().map(|z| ((z - max) / temperature).exp()).sum();
    sum.ln() - (logits[label] - max) / temperature
}

/// Mean negative log-likelihood of the true labels under softmax(logits / t): scikit-learn's
/// `log_loss` of those probabilities (which it clips to [2.2e-16, 1 - 2.2e-16], so the two part
/// only where a true class gets less than 2.2e-16). NaN for no images.
///
/// # Panics
/// If the labels are not one per image, or a label is not a class.
pub fn mean_nll(logits: &[Vec<f64>], labels: &[usize], temperature: f64) -> f64 {
    assert_eq!(logits.len(), labels.len(), "mean_nll: one label per image");
    let total: f64 =
        logits.iter().zip(labels).map(|(row, &label)| negative_log_likelihood(row, label, temperature)).sum();
    total / logits.len() as f64
}

/// Temperature scaling (Guo et al. 2017): the T > 0 minimising [`mean_nll`].
///
/// The mean NLL is convex in 1/T, its derivative in 1/T being the mean over images of
/// E_p[z] - z_true (p = softmax(z / T)), which rises with 1/T. So the minimiser is where that
/// derivative changes sign, found by bisection on log T over [`LOG_TEMPERATURE_RANGE`]
/// (scikit-learn's bracket, e^-10 to e^10) until the bracket is 1e-13 wide in log T, T to about
/// 1e-13 relative (far below 1e-6 over the whole bracket); bisection on the derivative is
/// exact where a search on the NLL's values stalls at sqrt(machine epsilon).
///
/// At an edge of the bracket the minimum lies outside it, and rtrain refuses rather than
/// return the edge as scikit-learn does: below e^-10 ([`CalibrationError::Separable`]) every
/// image's true class already has the top logit, so sharpening always helps and the "fitted"
/// probabilities would be 0 and 1; above e^10 ([`CalibrationError::Uninformative`]) uniform
/// probabilities beat the model's, which means the labels do not belong to these logits.
pub fn fit_temperature(logits: &[Vec<f64>], labels: &[usize]) -> Result<f64, CalibrationError> {
    check_rows(logits, labels)?;
    let slope =
        |log_temperature: f64| nll_slope_in_inverse_temperature(logits, labels, (-log_temperature).exp());
    let (mut sharp, mut flat) = LOG_TEMPERATURE_RANGE;
    if slope(flat) >= 0.0 {
        return Err(CalibrationError::Uninformative);
    }
    if slope(sharp) <= 0.0 {
        return Err(CalibrationError::Separable);
    }
    while flat - sharp > 1e-13 {
        let middle = 0.5 * (sharp + flat);
        if middle <= sharp || middle >= flat {
            break;
        }
        if slope(middle) > 0.0 {
            sharp = middle;
        } else {
            flat = middle;
        }
    }
    Ok((0.5 * (sharp + flat)).exp())
}

/// d mean_nll / d(1/T) at 1/T = `inverse_temperature`: the mean of E_p[z] - z_true.
fn nll_slope_in_inverse_temperature(logits: &[Vec<f64>], labels: &[usize], inverse_temperature: f64) -> f64 {
    let total: f64 = logits
        .iter()
        .zip(labels)
        .map(|(row, &label)| {
            let p = softmax(row, 1.0 / inverse_temperature);
            p.iter().zip(row).map(|(p, z)| p * z).sum::<f64>() - row[label]
        })
        .sum();
    total / logits.len() as f64
}

/// Multiclass Brier score: the mean over images of the sum over classes of (p_k - y_k)^2, y
/// one-hot, in [0, 2].
///
/// This is scikit-learn 1.9's `brier_score_loss(y, p, labels=range(C))` for C >= 3 classes,
/// where its default `scale_by_half="auto"` leaves the sum as it is; for C = 2 "auto" halves it
/// (the binary Brier score, in [0, 1]) and rtrain does not, so that one definition holds for any
/// class count: rtrain reports `scale_by_half=False`'s value (the same for C >= 3). NaN for no
/// images.
///
/// # Panics
/// If the labels are not one per image, or a label is not a class.
pub fn brier_score(probabilities: &[Vec<f64>], labels: &[usize]) -> f64 {
    assert_eq!(probabilities.len(), labels.len(), "brier_score: one label per image");
    let total: f64 = probabilities
        .iter()
        .zip(labels)
        .map(|(row, &label)| {
            assert!(label < row.len(), "brier_score: label {label} is not one of {} classes", row.len());
            row.iter()
                .enumerate()
                .map(|(k, &p)| {
                    let y = if k == label { 1.0 } else { 0.0 };
                    (y - p) * (y - p)
                })
                .sum::<f64>()
        })
        .sum();
    total / probabilities.len() as f64
}

/// Shannon entropy in nats (0 ln 0 = 0): 0 for a certain prediction, ln C for a uniform one.
/// SciPy's `stats.entropy` of the row, which first divides by the row's sum; rtrain takes the
/// row as it is (softmax rows sum to 1 within rounding).
pub fn entropy(probabilities: &[f64]) -> f64 {
    -probabilities.iter().filter(|&&p| p > 0.0).map(|&p| p * p.ln()).sum::<f64>()
}

/// The entropy above which a photo counts as "uncertain": the `quantile` (e.g. 0.95) of the
/// entropies of the validation split's photos, interpolated linearly as numpy's default
/// `np.quantile`. NaN for no photos.
///
/// # Panics
/// If `quantile` is not in [0, 1].
pub fn entropy_threshold(probabilities: &[Vec<f64>], quantile: f64) -> f64 {
    assert!((0.0..=1.0).contains(&quantile), "entropy_threshold: quantile must be in [0, 1], not {quantile}");
    let mut entropies: Vec<f64> = probabilities.iter().map(|row| entropy(row)).collect();
    if entropies.is_empty() {
        return f64::NAN;
    }
    entropies.sort_by(f64::total_cmp);
    linear_quantile(&entropies, quantile)
}

/// numpy's `quantile(method="linear")` of sorted values, with its two-sided interpolation.
fn linear_quantile(sorted: &[f64], quantile: f64) -> f64 {
    let virtual_index = (sorted.len() - 1) as f64 * quantile;
    let previous = virtual_index.floor();
    let gamma = virtual_index - previous;
    let below = sorted[previous as usize];
    let above = sorted[(previous as usize + 1).min(sorted.len() - 1)];
    let difference = above - below;
    if gamma >= 0.5 {
        above - difference * (1.0 - gamma)
    } else {
        below + difference * gamma
    }
}

/// The conformity score of split-conformal prediction sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ConformalMethod {
    /// Least ambiguous set-valued classifier: 1 - p(true class). Smallest sets on average.
    Lac,
    /// Adaptive prediction sets: the probability mass down to the true class. Sets grow where
    /// the model hesitates.
    Aps,
}

/// The uniform draws on [0, 1) of APS's randomised calibration scores, one per calibration
/// image in their order, from [`APS_SEED`]: the same for every run.
pub fn aps_uniforms(images: usize) -> Vec<f64> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(APS_SEED);
    (0..images).map(|_| rng.random::<f64>()).collect()
}

/// Split-conformal threshold on calibration probabilities with the finite-sample correction:
/// the ceil((n + 1)(1 - alpha))-th smallest conformity score (numpy's quantile at level
/// ceil((n + 1)(1 - alpha)) / n, method "lower", as MAPIE 1.6). For LAC a threshold on
/// 1 - p, for APS on cumulative probability; APS's scores are randomised with
/// [`aps_uniforms`]. Errors if n is too small for alpha (see the module's notes).
pub fn conformal_threshold(
    probabilities: &[Vec<f64>],
    labels: &[usize],
    alpha: f64,
    method: ConformalMethod,
) -> Result<f64, CalibrationError> {
    conformal_threshold_with(probabilities, labels, alpha, method, &aps_uniforms(probabilities.len()))
}

/// [`conformal_threshold`] with APS's uniform draws given (one per calibration image; LAC
/// ignores them): how the tests hand MAPIE and rtrain the same randomness.
pub fn conformal_threshold_with(
    probabilities: &[Vec<f64>],
    labels: &[usize],
    alpha: f64,
    method: ConformalMethod,
    uniforms: &[f64],
) -> Result<f64, CalibrationError> {
    check_probabilities(probabilities, labels)?;
    let images = probabilities.len();
    if !(alpha > 0.0 && alpha < 1.0) {
        return Err(CalibrationError::Alpha { alpha });
    }
    let needed = (1.0 / alpha).max(1.0 / (1.0 - alpha));
    if (images as f64) < needed {
        return Err(CalibrationError::TooFewForAlpha { needed: needed.ceil() as usize, alpha, images });
    }
    if method == ConformalMethod::Aps && uniforms.len() != images {
        return Err(CalibrationError::UniformCount { draws: uniforms.len(), images });
    }
    let mut scores: Vec<f64> = probabilities
        .iter()
        .zip(labels)
        .enumerate()
        .map(|(i, (row, &label))| match method {
            ConformalMethod::Lac => 1.0 - row[label],
            ConformalMethod::Aps => aps_score(row, label) - uniforms[i] * row[label],
        })
        .collect();
    scores.sort_by(f64::total_cmp);
    Ok(scores[finite_sample_rank(images, alpha)])
}

/// The 0-based rank of the split-conformal order statistic: numpy's "lower" index at level
/// ceil((n + 1)(1 - alpha)) / n, computed in MAPIE's order of floating-point operations, which
/// is ceil((n + 1)(1 - alpha)) - 1 while n >= 1/alpha.
fn finite_sample_rank(images: usize, alpha: f64) -> usize {
    let n = images as f64;
    let level = ((n + 1.0) * (1.0 - alpha)).ceil() / n;
    (((n - 1.0) * level).floor() as usize).min(images - 1)
}

/// The probability mass of the classes ranked down to the true one, the true one ranked after
/// every class it ties (summed in falling order, as numpy's `cumsum` of the sorted row).
fn aps_score(probabilities: &[f64], label: usize) -> f64 {
    let mut sorted = probabilities.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let ranked_down_to_label = sorted.iter().filter(|&&p| p >= probabilities[label]).count();
    sorted[..ranked_down_to_label].iter().sum()
}

/// The prediction set of one image: class indices in increasing order. `threshold` is
/// [`conformal_threshold`]'s for the same method; `probabilities` a softmax row.
pub fn prediction_set(probabilities: &[f64], threshold: f64, method: ConformalMethod) -> Vec<usize> {
    let classes = 0..probabilities.len();
    match method {
        ConformalMethod::Lac => {
            classes.filter(|&k| (1.0 - probabilities[k]) - threshold <= SET_TOLERANCE).collect()
        }
        ConformalMethod::Aps => {
            let last = aps_last_probability(probabilities, threshold);
            classes.filter(|&k| probabilities[k] - last >= -SET_TOLERANCE).collect()
        }
    }
}

/// The probability of the last class APS takes (MAPIE's `_get_last_included_proba` with
/// `include_last_label=True`).
fn aps_last_probability(probabilities: &[f64], threshold: f64) -> f64 {
    let mut order: Vec<usize> = (0..probabilities.len()).collect();
    order.sort_by(|&a, &b| probabilities[b].total_cmp(&probabilities[a]));
    let mut cumulative = vec![0.0; probabilities.len()];
    let mut sum = 0.0;
    for &k in &order {
        sum += probabilities[k];
        cumulative[k] = sum;
    }
    // The class whose cumulative probability reaches the threshold first: the smallest excess
    // over it (the lowest class on equal excess, as argmin), class 0 when none reaches it.
    let last = (0..probabilities.len())
        .filter(|&k| cumulative[k] - threshold >= -SET_TOLERANCE)
        .fold(None, |best: Option<usize>, k| match best {
            Some(b) if cumulative[b] - threshold <= cumulative[k] - threshold => Some(b),
            _ => Some(k),
        })
        .unwrap_or(0);
    let probability = probabilities[last];
    if probability <= SET_TOLERANCE {
        probabilities.iter().copied().filter(|&p| p >= SET_TOLERANCE).fold(f64::INFINITY, f64::min)
    } else {
        probability
    }
}

/// Checks that there are images, one label each, rows of one length (at least 2 classes),
/// finite values and labels among the classes; returns the class count.
fn check_rows(rows: &[Vec<f64>], labels: &[usize]) -> Result<usize, CalibrationError> {
    if rows.is_empty() {
        return Err(CalibrationError::NoImages);
    }
    if rows.len() != labels.len() {
        return Err(CalibrationError::LabelCount { images: rows.len(), labels: labels.len() });
    }
    let classes = rows[0].len();
    if classes < 2 {
        return Err(CalibrationError::TooFewClasses { classes });
    }
    for (image, (row, &label)) in rows.iter().zip(labels).enumerate() {
        if row.len() != classes {
            return Err(CalibrationError::RowLength { image, found: row.len(), expected: classes });
        }
        if label >= classes {
            return Err(CalibrationError::LabelOutOfRange { image, label, classes });
        }
        if let Some(&value) = row.iter().find(|v| !v.is_finite()) {
            return Err(CalibrationError::NotFinite { image, value });
        }
    }
    Ok(classes)
}

/// [`check_rows`], and every row a probability distribution (MAPIE's check).
fn check_probabilities(rows: &[Vec<f64>], labels: &[usize]) -> Result<usize, CalibrationError> {
    let classes = check_rows(rows, labels)?;
    for (image, row) in rows.iter().enumerate() {
        let sum: f64 = row.iter().sum();
        if (sum - 1.0).abs() > PROBABILITY_SUM_TOLERANCE || row.iter().any(|p| !(0.0..=1.0).contains(p)) {
            return Err(CalibrationError::NotProbabilities { image, sum });
        }
    }
    Ok(classes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::seq::SliceRandom;

    fn close(ours: f64, expected: f64, tolerance: f64, what: &str) {
        assert!((ours - expected).abs() <= tolerance, "{what}: {ours}, expected {expected}");
    }

    #[test]
    fn softmax_nll_brier_and_entropy_by_hand() {
        let p = softmax(&[1f64.ln(), 2f64.ln(), 3f64.ln()], 1.0);
        for (ours, expected) in p.iter().zip([1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]) {
            close(*ours, expected, 1e-15, "softmax");
        }
        // At T = 2 the probabilities go as the square roots.
        let root_sum = 1.0 + 2f64.sqrt() + 3f64.sqrt();
        close(
            softmax(&[0.0, 2f64.ln(), 3f64.ln()], 2.0)[2],
            3f64.sqrt() / root_sum,
            1e-15,
            "softmax at T = 2",
        );
        assert_eq!(softmax(&[1000.0, 1000.0], 1.0), vec![0.5, 0.5], "large logits stay finite");

        close(mean_nll(&[vec![1000.0, 1000.0]], &[0], 1.0), 2f64.ln(), 1e-15, "NLL of a tie");
        let logits = [vec![0.0, 2f64.ln(), 3f64.ln()], vec![0.0, 0.0, 0.0]];
        close(mean_nll(&logits, &[2, 1], 1.0), (2f64.ln() + 3f64.ln()) / 2.0, 1e-15, "mean NLL");

        // scikit-learn's docstring example of brier_score_loss: 0.146 (0.44 / 3).
        let probabilities = [vec![0.8, 0.1, 0.1], vec![0.2, 0.7, 0.1], vec![0.2, 0.2, 0.6]];
        close(brier_score(&probabilities, &[0, 1, 2]), 0.44 / 3.0, 1e-15, "Brier");
        close(brier_score(&[vec![0.0, 1.0]], &[0]), 2.0, 0.0, "Brier of a confident mistake");

        close(entropy(&[0.25; 4]), 4f64.ln(), 1e-15, "entropy of a uniform row");
        close(entropy(&[1.0, 0.0, 0.0]), 0.0, 0.0, "entropy of a certain row");
        close(entropy(&[0.5, 0.5, 0.0]), 2f64.ln(), 1e-15, "entropy with a zero");
        // Entropies 0, ln 2, ln 4: the 0.75 quantile is halfway from ln 2 to ln 4.
        let rows = [vec![0.25; 4], vec![1.0, 0.0, 0.0, 0.0], vec![0.5, 0.5, 0.0, 0.0]];
        close(entropy_threshold(&rows, 0.75), 1.5 * 2f64.ln(), 1e-15, "entropy quantile");
        close(entropy_threshold(&rows, 1.0), 4f64.ln(), 1e-15, "top entropy quantile");
        assert!(entropy_threshold(&[], 0.95).is_nan());
    }

    /// `n` images of 4 classes with logits z ~ 3 N(0, 1) and labels drawn from softmax(z / t).
    fn sampled(n: usize, temperature: f64, seed: u64) -> (Vec<Vec<f64>>, Vec<usize>) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let logits: Vec<Vec<f64>> =
            (0..n).map(|_| (0..4).map(|_| 3.0 * standard_normal(&mut rng)).collect()).collect();
        let labels = logits
            .iter()
            .map(|z| {
                let p = softmax(z, temperature);
                let draw: f64 = rng.random();
                let mut cumulative = 0.0;
                p.iter()
                    .position(|&p| {
                        cumulative += p;
                        draw < cumulative
                    })
                    .unwrap_or(3)
            })
            .collect();
        (logits, labels)
    }

    /// A standard normal draw (Box-Muller), without another dependency.
    fn standard_normal(rng: &mut rand_chacha::ChaCha8Rng) -> f64 {
        let u: f64 = 1.0 - rng.random::<f64>();
        let v: f64 = rng.random();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    #[test]
    fn fit_temperature_recovers_the_temperature_that_drew_the_labels() {
        for true_temperature in [0.5, 2.5] {
            let (logits, labels) = sampled(20_000, true_temperature, 7);
            let fitted = fit_temperature(&logits, &labels).unwrap();
            // The maximum-likelihood estimate is within a few standard errors (~1%) of the truth.
            close(fitted, true_temperature, 0.04 * true_temperature, "fitted temperature");
            // And it is the minimum of the mean NLL, to far better than 1e-6.
            let at = |t: f64| mean_nll(&logits, &labels, t);
            assert!(at(fitted) <= at(fitted * (1.0 + 1e-6)) && at(fitted) <= at(fitted * (1.0 - 1e-6)));
        }
    }

    #[test]
    fn fit_temperature_refuses_what_it_cannot_fit() {
        let separable = [vec![3.0, 0.0], vec![0.0, 1.0]];
        assert!(matches!(fit_temperature(&separable, &[0, 1]), Err(CalibrationError::Separable)));
        let constant = [vec![1.0, 1.0], vec![2.0, 2.0]];
        assert!(matches!(fit_temperature(&constant, &[0, 1]), Err(CalibrationError::Uninformative)));
        let backwards = [vec![3.0, 0.0], vec![0.0, 1.0]];
        assert!(matches!(fit_temperature(&backwards, &[1, 0]), Err(CalibrationError::Uninformative)));
        assert!(matches!(fit_temperature(&[], &[]), Err(CalibrationError::NoImages)));
        let mixed = [vec![3.0, 0.0], vec![0.0, 1.0], vec![0.5, 0.0]];
        assert!(matches!(fit_temperature(&mixed, &[0, 1]), Err(CalibrationError::LabelCount { .. })));
        assert!(matches!(fit_temperature(&mixed, &[0, 1, 2]), Err(CalibrationError::LabelOutOfRange { .. })));
        assert!(matches!(
            fit_temperature(&[vec![0.0, f64::NAN]], &[0]),
            Err(CalibrationError::NotFinite { image: 0, .. })
        ));
        // One mistake among the three makes it fittable.
        let t = fit_temperature(&mixed, &[0, 1, 1]).unwrap();
        assert!(t > 0.0 && t.is_finite());
    }

    /// 20 images whose true class has probability 1 - s for s = 0.01, 0.02, ..., 0.20 (LAC
    /// scores s), in shuffled order.
    fn scored_twenty() -> (Vec<Vec<f64>>, Vec<usize>) {
        let mut scores: Vec<f64> = (1..=20).map(|i| i as f64 / 100.0).collect();
        scores.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(3));
        let rows = scores.iter().map(|s| vec![1.0 - s, s / 2.0, s / 2.0]).collect();
        (rows, vec![0; 20])
    }

    #[test]
    fn the_threshold_is_the_finite_sample_order_statistic() {
        let (rows, labels) = scored_twenty();
        let lac = |alpha| conformal_threshold(&rows, &labels, alpha, ConformalMethod::Lac);
        // ceil(21 x 0.9) = 19: the 19th smallest score.
        close(lac(0.1).unwrap(), 0.19, 1e-12, "alpha 0.1");
        // ceil(21 x 0.95) = 20: the largest.
        close(lac(0.05).unwrap(), 0.20, 1e-12, "alpha 0.05");
        // ceil(21 x 0.5) = 11.
        close(lac(0.5).unwrap(), 0.11, 1e-12, "alpha 0.5");
        // ceil(21 x 0.75) = 16.
        close(lac(0.25).unwrap(), 0.16, 1e-12, "alpha 0.25");
        assert!(matches!(lac(0.04), Err(CalibrationError::TooFewForAlpha { needed: 25, images: 20, .. })));
        assert!(matches!(lac(0.0), Err(CalibrationError::Alpha { .. })));
        assert!(matches!(lac(1.0), Err(CalibrationError::Alpha { .. })));
        // APS with U = 0: the score is the mass down to the true class, 1 - s here (0.80 to
        // 0.99), and the 19th smallest is 0.98; with U = 1/2 every score is halved.
        let aps = conformal_threshold_with(&rows, &labels, 0.1, ConformalMethod::Aps, &[0.0; 20]).unwrap();
        close(aps, 0.98, 1e-12, "APS");
        let with_half =
            conformal_threshold_with(&rows, &labels, 0.1, ConformalMethod::Aps, &[0.5; 20]).unwrap();
        close(with_half, 0.49, 1e-12, "randomised APS");
        assert!(matches!(
            conformal_threshold_with(&rows, &labels, 0.1, ConformalMethod::Aps, &[0.5; 3]),
            Err(CalibrationError::UniformCount { draws: 3, images: 20 })
        ));
        let unnormalised = vec![vec![0.5, 0.4, 0.0]; 20];
        assert!(matches!(
            conformal_threshold(&unnormalised, &labels, 0.1, ConformalMethod::Lac),
            Err(CalibrationError::NotProbabilities { image: 0, .. })
        ));
    }

    #[test]
    fn prediction_sets_by_hand() {
        let lac = |p: &[f64], t| prediction_set(p, t, ConformalMethod::Lac);
        assert_eq!(lac(&[0.6, 0.3, 0.1], 0.7), vec![0, 1]);
        assert_eq!(lac(&[0.6, 0.3, 0.1], 0.7 - 5e-9), vec![0, 1], "within MAPIE's 1e-8");
        assert_eq!(lac(&[0.6, 0.3, 0.1], 0.7 - 2e-8), vec![0]);
        assert_eq!(lac(&[0.6, 0.3, 0.1], 0.3), Vec::<usize>::new(), "LAC sets may be empty");

        let aps = |p: &[f64], t| prediction_set(p, t, ConformalMethod::Aps);
        let p = [0.1, 0.5, 0.3, 0.1];
        assert_eq!(aps(&p, 0.4), vec![1], "the top class alone reaches 0.4");
        assert_eq!(aps(&p, 0.75), vec![1, 2], "the class that reaches the threshold is in");
        assert_eq!(aps(&p, 0.8 + 5e-9), vec![1, 2], "reaching within 1e-8");
        assert_eq!(aps(&p, 0.85), vec![0, 1, 2, 3], "tied classes go in together");
        assert_eq!(aps(&p, 1.5), vec![0, 1, 2, 3], "nothing reaches: class 0 is the last");
        // Classes of probability 0 reach as far as the last positive one; the first of them
        // would be "last", and stands for the smallest positive probability instead.
        assert_eq!(aps(&[0.0, 0.0, 0.3, 0.7], 0.99), vec![2, 3]);
        assert_eq!(aps(&[0.25; 4], 0.3), vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_true_class_that_ties_is_ranked_after_its_ties() {
        close(aps_score(&[0.25; 4], 0), 1.0, 1e-15, "uniform row");
        close(aps_score(&[0.4, 0.3, 0.3, 0.0], 2), 1.0, 1e-15, "tied second");
        close(aps_score(&[0.4, 0.3, 0.3, 0.0], 0), 0.4, 1e-15, "untied top");
    }

    /// 4000 images of 4 classes: the probabilities softmax(z / 3) of a model twice as sure as
    /// the truth, whose labels are drawn from softmax(z / 6).
    fn overconfident(seed: u64) -> (Vec<Vec<f64>>, Vec<usize>) {
        let (logits, labels) = sampled(4000, 2.0 * 3.0, seed);
        (logits.iter().map(|z| softmax(z, 3.0)).collect(), labels)
    }

    #[test]
    fn split_conformal_sets_cover_as_promised() {
        let (probabilities, labels) = overconfident(11);
        for alpha in [0.1, 0.05] {
            for method in [ConformalMethod::Lac, ConformalMethod::Aps] {
                let (mut set_coverage, mut score_coverage) = (0.0, 0.0);
                for split in 0..20 {
                    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(100 + split);
                    let mut order: Vec<usize> = (0..probabilities.len()).collect();
                    order.shuffle(&mut rng);
                    let (calibration, test) = order.split_at(1000);
                    let rows = |images: &[usize]| {
                        images.iter().map(|&i| probabilities[i].clone()).collect::<Vec<_>>()
                    };
                    let truth = |images: &[usize]| images.iter().map(|&i| labels[i]).collect::<Vec<_>>();
                    let threshold =
                        conformal_threshold(&rows(calibration), &truth(calibration), alpha, method).unwrap();
                    let (mut in_set, mut below) = (0, 0);
                    for &i in test {
                        let (p, label) = (&probabilities[i], labels[i]);
                        let set = prediction_set(p, threshold, method);
                        // The score of a new photo falls at or below the threshold with
                        // probability ceil((n + 1)(1 - alpha)) / (n + 1), and then the set holds
                        // the true class.
                        let score = match method {
                            ConformalMethod::Lac => 1.0 - p[label],
                            ConformalMethod::Aps => aps_score(p, label) - rng.random::<f64>() * p[label],
                        };
                        if score <= threshold {
                            below += 1;
                            assert!(
                                set.contains(&label),
                                "{method:?} alpha {alpha}: {p:?} ({label}) not in {set:?}"
                            );
                        }
                        in_set += usize::from(set.contains(&label));
                    }
                    set_coverage += in_set as f64 / test.len() as f64 / 20.0;
                    score_coverage += below as f64 / test.len() as f64 / 20.0;
                }
                let what = format!("{method:?} at alpha {alpha}");
                close(score_coverage, 1.0 - alpha, 0.02, &format!("{what}: score coverage"));
                match method {
                    ConformalMethod::Lac => {
                        close(set_coverage, 1.0 - alpha, 0.02, &format!("{what}: set coverage"))
                    }
                    // MAPIE's include_last_label=True takes one class more than the score asks.
                    ConformalMethod::Aps => {
                        assert!(set_coverage >= 1.0 - alpha - 0.02, "{what}: {set_coverage}")
                    }
                }
                eprintln!("{what}: scores {score_coverage:.4}, sets {set_coverage:.4}");
            }
        }
    }
}
