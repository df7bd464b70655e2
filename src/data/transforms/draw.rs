//! The random draws of the training transform, made as torchvision makes them:
//! `RandomResizedCrop.get_params` step for step, from [`sample_rng`], one random stream per
//! sample and epoch.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Augment, Crop};
use crate::util::seeds::splitmix64;

/// The random stream for one sample of one epoch.
///
/// Seeding by (seed, epoch, dataset index) rather than drawing from a shared stream means a
/// sample's augmentation does not depend on which worker decodes it, where it lands in a
/// batch, or whether the run was resumed mid-epoch. `seed` and `epoch` are mixed with
/// splitmix64 into the ChaCha key; `index` selects the ChaCha stream, so distinct samples
/// are guaranteed distinct, non-overlapping streams. (A sample that appears twice in one
/// epoch's order gets the same augmentation both times.)
pub fn sample_rng(seed: u64, epoch: u64, index: usize) -> ChaCha8Rng {
    // The constant ("rtrain-a") separates these streams from other splitmix64 uses of `seed`.
    let mut state = splitmix64(seed ^ 0x7274_7261_696e_2d61);
    state = splitmix64(state ^ epoch);
    let mut key = [0u8; 32];
    for chunk in key.chunks_exact_mut(8) {
        state = splitmix64(state);
        chunk.copy_from_slice(&state.to_le_bytes());
    }
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(index as u64);
    rng
}

/// Python's `round` (half to even), which torchvision's integer geometry relies on.
pub(super) fn py_round(x: f64) -> f64 {
    x.round_ties_even()
}

/// `uniform_(lo, hi)`: written out rather than `random_range` so that `lo == hi` (a fixed
/// scale, say) is allowed instead of panicking on an empty range.
fn uniform(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * rng.random::<f64>()
}

/// `RandomResizedCrop.get_params`, step for step: up to ten tries of a random area in
/// `scale` and log-uniform aspect ratio in `ratio`, else a central crop clamped to the ratio
/// bounds. The result always lies inside the image and, unless the image is empty, is never
/// empty, even for nonsensical `scale`/`ratio` values.
pub fn random_resized_crop(height: u32, width: u32, augment: &Augment, rng: &mut ChaCha8Rng) -> Crop {
    if height == 0 || width == 0 {
        return Crop { top: 0, left: 0, height: 0, width: 0 };
    }
    let area = f64::from(height) * f64::from(width);
    let (log_lo, log_hi) = (augment.ratio.0.ln(), augment.ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * uniform(rng, augment.scale.0, augment.scale.1);
        let aspect = uniform(rng, log_lo, log_hi).exp();
        let w = py_round((target_area * aspect).sqrt());
        let h = py_round((target_area / aspect).sqrt());
        // NaN (from a non-positive ratio) fails these comparisons and falls through.
        if w > 0.0 && w <= f64::from(width) && h > 0.0 && h <= f64::from(height) {
            let (w, h) = (w as u32, h as u32);
            let top = rng.random_range(0..=height - h);
            let left = rng.random_range(0..=width - w);
            return Crop { top, left, height: h, width: w };
        }
    }

    // Fallback: the whole image, or its centre cut to the nearest allowed aspect ratio.
    let in_ratio = f64::from(width) / f64::from(height);
    let min_ratio = augment.ratio.0.min(augment.ratio.1);
    let max_ratio = augment.ratio.0.max(augment.ratio.1);
    let (mut w, mut h) = (width, height);
    if in_ratio < min_ratio {
        h = py_round(f64::from(w) / min_ratio) as u32;
    } else if in_ratio > max_ratio {
        w = py_round(f64::from(h) * max_ratio) as u32;
    }
    // Only reachable with degenerate ratios, but a crop must stay inside and non-empty.
    let h = h.clamp(1, height);
    let w = w.clamp(1, width);
    Crop { top: (height - h) / 2, left: (width - w) / 2, height: h, width: w }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crop_params_stay_within_bounds() {
        let augment = Augment::default();
        let mut saw_full_width = false;
        for (h, w) in [(1, 1), (3, 200), (200, 3), (224, 224), (375, 500), (17, 19)] {
            for i in 0..2000 {
                let mut rng = sample_rng(9, h as u64, i);
                let c = random_resized_crop(h, w, &augment, &mut rng);
                assert!(c.height >= 1 && c.width >= 1, "{c:?} in {w}x{h}");
                assert!(c.top + c.height <= h && c.left + c.width <= w, "{c:?} in {w}x{h}");
                saw_full_width |= c.width == w && w > 100;
                if (h, w) == (375, 500) {
                    let area = f64::from(c.height * c.width) / f64::from(h * w);
                    // Rounding can push the area a little outside `scale`.
                    assert!((0.07..=1.0).contains(&area), "area {area}");
                    let ratio = f64::from(c.width) / f64::from(c.height);
                    assert!((0.7..=1.4).contains(&ratio), "ratio {ratio}");
                }
            }
        }
        assert!(saw_full_width);
    }

    #[test]
    fn crop_fallback_is_central_and_ratio_clamped() {
        // scale > 1 can never fit, so every try fails and the fallback decides.
        let augment = Augment { scale: (4.0, 4.0), ratio: (0.75, 4.0 / 3.0), hflip: false };
        let mut rng = sample_rng(0, 0, 0);
        // Too wide (10:1): height kept, width = round(20 * 4/3) = 27, centred.
        let c = random_resized_crop(20, 200, &augment, &mut rng);
        assert_eq!(c, Crop { top: 0, left: 86, height: 20, width: 27 });
        // Too tall: width kept, height = round(20 / 0.75) = 27.
        let c = random_resized_crop(200, 20, &augment, &mut rng);
        assert_eq!(c, Crop { top: 86, left: 0, height: 27, width: 20 });
        // Within bounds: the whole image.
        let c = random_resized_crop(30, 35, &augment, &mut rng);
        assert_eq!(c, Crop { top: 0, left: 0, height: 30, width: 35 });
        // Degenerate ratios still give a valid crop.
        let bad = Augment { scale: (0.5, 0.5), ratio: (0.0, -1.0), hflip: false };
        let c = random_resized_crop(10, 10, &bad, &mut rng);
        assert!(c.width >= 1 && c.height >= 1 && c.left + c.width <= 10 && c.top + c.height <= 10);
    }

    #[test]
    fn sample_rng_separates_seed_epoch_and_index() {
        let first = |s, e, i| sample_rng(s, e, i).random::<u64>();
        assert_eq!(first(1, 2, 3), first(1, 2, 3));
        let base = first(1, 2, 3);
        assert_ne!(base, first(2, 2, 3));
        assert_ne!(base, first(1, 3, 3));
        assert_ne!(base, first(1, 2, 4));
        // Swapping seed and epoch must not collide.
        assert_ne!(first(1, 2, 0), first(2, 1, 0));
    }
}
