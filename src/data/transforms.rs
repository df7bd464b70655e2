//! torchvision-style preprocessing: `RandomResizedCrop` + `RandomHorizontalFlip` for training,
//! `Resize` + `CenterCrop` for evaluation, then `ToTensor` + `Normalize`.
//!
//! This module owns the geometry (crop parameters drawn exactly as torchvision draws them),
//! the resampling and the normalisation, fused into one pass that writes CHW `f32` straight
//! into the caller's batch buffer. It also owns [`sample_rng`], the per-sample random stream
//! that makes augmentation independent of worker count, batch position and resumption.
//!
//! Resampling is PIL's antialiased bilinear ("triangle") filter, which torchvision uses for
//! PIL images, in PIL's own fixed-point arithmetic (horizontal pass, round to 8 bits,
//! vertical pass, round), so the output matches torchvision + Pillow bit for bit given the
//! same crop. Only the crop is resampled, never the whole image.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use image::RgbImage;

use crate::data::autoaugment::Policy;
use crate::util::seeds::splitmix64;

/// Per-channel mean of ImageNet in `[0, 1]` RGB, as used by torchvision's reference models.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// Per-channel standard deviation of ImageNet in `[0, 1]` RGB.
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Training augmentation: `RandomResizedCrop(size, scale, ratio)` then, when `hflip`,
/// `RandomHorizontalFlip(0.5)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Augment {
    /// Range of the crop's area as a fraction of the image's area.
    pub scale: (f64, f64),
    /// Range of the crop's aspect ratio (width / height), sampled log-uniformly.
    pub ratio: (f64, f64),
    /// Whether to flip horizontally with probability one half.
    pub hflip: bool,
}

impl Default for Augment {
    /// torchvision's defaults: scale (0.08, 1.0), ratio (3/4, 4/3), with flipping.
    fn default() -> Self {
        Self { scale: (0.08, 1.0), ratio: (3.0 / 4.0, 4.0 / 3.0), hflip: true }
    }
}

/// How an image becomes `size` x `size` pixels.
#[derive(Debug, Clone, PartialEq)]
pub enum Geometry {
    /// Training's `RandomResizedCrop(size, scale, ratio)` (plus the optional flip).
    RandomResizedCrop(Augment),
    /// Evaluation's `Resize(resize)` (shorter side to `resize`, aspect kept) then
    /// `CenterCrop(size)`; torchvision uses 256 for a 224 crop.
    ResizeCenterCrop { resize: u32 },
    /// `Resize((size, size))`: the whole image squeezed to the square, aspect not kept (the
    /// DesignSafe tutorial's transform), then, when `hflip`, `RandomHorizontalFlip(0.5)`.
    Resize { hflip: bool },
}

/// The default of `data.max_image_pixels`: where Pillow refuses an image as a decompression
/// bomb (twice its `Image.MAX_IMAGE_PIXELS` of 89,478,485). A 24-megapixel camera photo, a
/// 100-megapixel medium-format one and a 12000 x 12000 drone mosaic fit; at most 537 MB of
/// decoded RGB per image. (Here rather than in decode.rs, which depends on this module and
/// re-exports it.)
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = 2 * 89_478_485;

/// What to do to each image before it enters a batch: the automatic augmentation policy (on
/// the decoded image, as the DesignSafe tutorial's `AutoAugment()` before `Resize`), the
/// geometry, then `ToTensor`, then (when `normalize`) `Normalize` with ImageNet's mean and
/// standard deviation.
#[derive(Debug, Clone, PartialEq)]
pub struct Transform {
    /// Output side length: every image becomes `3 x size x size` values.
    pub size: u32,
    /// AutoAugment, RandAugment or TrivialAugmentWide; it needs the whole decoded image.
    pub policy: Option<Policy>,
    pub geometry: Geometry,
    /// `Normalize(IMAGENET_MEAN, IMAGENET_STD)` after `ToTensor`; off, values are in [0, 1].
    pub normalize: bool,
    /// Decode JPEGs at the smallest DCT scale (1/2, 1/4, 1/8) that still leaves the resampler
    /// at least the pixels it writes (Pillow's `draft`): much faster for large photos, pixels
    /// slightly different from a full decode (`data.jpeg_draft`).
    pub jpeg_draft: bool,
    /// Show each photo as its Exif orientation says (`data.exif_orientation`).
    pub exif_orientation: bool,
    /// Refuse an image whose header declares more pixels (`data.max_image_pixels`).
    pub max_image_pixels: u64,
}

impl Transform {
    /// torchvision's training transform: random resized crop (and flip), normalised.
    pub fn train(size: u32, augment: Augment) -> Self {
        Self {
            size,
            policy: None,
            geometry: Geometry::RandomResizedCrop(augment),
            normalize: true,
            jpeg_draft: false,
            exif_orientation: false,
            max_image_pixels: DEFAULT_MAX_IMAGE_PIXELS,
        }
    }

    /// torchvision's evaluation transform: resize, centre crop, normalised.
    pub fn eval(size: u32, resize: u32) -> Self {
        Self {
            size,
            policy: None,
            geometry: Geometry::ResizeCenterCrop { resize },
            normalize: true,
            jpeg_draft: false,
            exif_orientation: false,
            max_image_pixels: DEFAULT_MAX_IMAGE_PIXELS,
        }
    }

    /// Output side length: every image becomes `3 × size × size` values.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Number of `f32` values [`apply`] writes per image.
    pub fn output_len(&self) -> usize {
        let s = self.size() as usize;
        3 * s * s
    }

    /// The largest reduction (8, 4, 2 or 1) at which a `width` x `height` image still has at
    /// least as many pixels as the geometry samples from it, on each axis, whatever the random
    /// draws: for a policy, which must see the whole image before the geometry is drawn. For
    /// `RandomResizedCrop` that is its smallest crop.
    pub fn whole_image_reduction(&self, width: u32, height: u32) -> u32 {
        let (w, h) = (f64::from(width), f64::from(height));
        let size = f64::from(self.size.max(1));
        let (across, down) = match &self.geometry {
            Geometry::Resize { .. } => (w / size, h / size),
            Geometry::ResizeCenterCrop { resize } => {
                let (new_w, new_h) = resized_dims(width, height, *resize);
                (w / f64::from(new_w.max(1)), h / f64::from(new_h.max(1)))
            }
            Geometry::RandomResizedCrop(augment) => {
                // The smallest area at the most extreme aspect ratios.
                let area = w * h * augment.scale.0.min(augment.scale.1).max(0.0);
                let (lo, hi) = (augment.ratio.0.min(augment.ratio.1), augment.ratio.0.max(augment.ratio.1));
                ((area * lo).sqrt().min(w) / size, (area / hi).sqrt().min(h) / size)
            }
        };
        largest_reduction(across.min(down))
    }
}

/// The reductions libjpeg decodes at in the DCT domain (1/8 .. 1/1 of the size), largest first.
pub const REDUCTIONS: [u32; 4] = [8, 4, 2, 1];

/// The largest of 8, 4, 2 and 1 that is at most `ratio` (source pixels per output pixel).
pub fn largest_reduction(ratio: f64) -> u32 {
    REDUCTIONS.into_iter().find(|&r| f64::from(r) <= ratio).unwrap_or(1)
}

/// A crop rectangle in image pixel coordinates, as `RandomResizedCrop.get_params` returns
/// it: `(i, j, h, w)` = (`top`, `left`, `height`, `width`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crop {
    /// First row.
    pub top: u32,
    /// First column.
    pub left: u32,
    /// Number of rows.
    pub height: u32,
    /// Number of columns.
    pub width: u32,
}

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

/// One step of splitmix64 (Steele, Lea & Flood): a bijective, well-avalanched 64-bit mix.
/// Python's `round` (half to even), which torchvision's integer geometry relies on.
fn py_round(x: f64) -> f64 {
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

/// Transforms `image` and writes the normalised CHW result (`3 * size * size` values, RGB
/// planes) into `out`. `rng` is consumed by the policy's choices, then the random geometry
/// (crop, flip).
///
/// # Panics
/// If `out.len()` differs from [`Transform::output_len`] — a caller bug, not bad input.
pub fn apply(image: &RgbImage, transform: &Transform, rng: &mut ChaCha8Rng, out: &mut [f32]) {
    match transform.policy {
        Some(policy) => apply_owned(policy.apply_owned(image.clone(), rng), transform, rng, out),
        None => render_whole(image, transform, rng, out),
    }
}

/// [`apply`] of an image the caller gives away: the policy works on it in place of a copy (a
/// copy of a 24-megapixel photo costs as much as a third of decoding it).
pub fn apply_owned(image: RgbImage, transform: &Transform, rng: &mut ChaCha8Rng, out: &mut [f32]) {
    let image = match transform.policy {
        Some(policy) => policy.apply_owned(image, rng),
        None => image,
    };
    render_whole(&image, transform, rng, out);
}

/// The geometry, `ToTensor` and `Normalize` of [`apply`], after the policy.
fn render_whole(image: &RgbImage, transform: &Transform, rng: &mut ChaCha8Rng, out: &mut [f32]) {
    let (width, height) = image.dimensions();
    let plan = DrawnTransform::new(width, height, transform, rng);
    plan.render(image.as_raw(), Crop { top: 0, left: 0, height, width }, out);
}

/// What a transform does to one image of a known size: which source pixels it reads and how
/// they become the output.
///
/// Drawing a plan consumes the sample's random numbers (crop, then flip, as torchvision draws
/// them), and needs only the image's size, so the loader draws it after reading a JPEG's
/// header and then decodes only [`DrawnTransform::source`].
pub struct DrawnTransform {
    size: usize,
    /// Columns, rows and whether to flip; `None` when the output is all black (an empty image).
    resample: Option<(Axis, Axis, bool)>,
    /// ImageNet normalisation after scaling to [0, 1].
    normalize: bool,
}

/// The source segment an axis resamples: `len` pixels from `start`, in pixels of the image as
/// decoded. Whole pixels at full size; fractions once the image is decoded reduced.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Segment {
    start: f64,
    len: f64,
}

impl Segment {
    fn whole(start: u32, len: u32) -> Self {
        Self { start: f64::from(start), len: f64::from(len) }
    }
}

impl DrawnTransform {
    /// The plan for an image of `width` x `height` pixels.
    pub fn new(width: u32, height: u32, transform: &Transform, rng: &mut ChaCha8Rng) -> Self {
        let size = transform.size();
        if size == 0 || width == 0 || height == 0 {
            // Nothing to sample: the output is the normalised black that padding would give.
            return Self { size: size as usize, resample: None, normalize: transform.normalize };
        }
        let plan = match &transform.geometry {
            Geometry::RandomResizedCrop(augment) => {
                let crop = random_resized_crop(height, width, augment, rng);
                // torch draws the flip after the crop; keep that order.
                let flip = augment.hflip && rng.random::<f64>() < 0.5;
                Self::resized_crop(crop, size, flip)
            }
            Geometry::ResizeCenterCrop { resize } => {
                let (new_w, new_h) = resized_dims(width, height, *resize);
                let x = Axis::new(Segment::whole(0, width), new_w, center_offset(new_w, size), size);
                let y = Axis::new(Segment::whole(0, height), new_h, center_offset(new_h, size), size);
                Self { size: size as usize, resample: Some((x, y, false)), normalize: true }
            }
            Geometry::Resize { hflip } => {
                let flip = *hflip && rng.random::<f64>() < 0.5;
                Self::resized_crop(Crop { top: 0, left: 0, height, width }, size, flip)
            }
        };
        Self { normalize: transform.normalize, ..plan }
    }

    /// torchvision's `resized_crop(image, top, left, height, width, [size, size])`, flipped
    /// horizontally when `flip`: the training transform with its random draws given.
    pub fn resized_crop(crop: Crop, size: u32, flip: bool) -> Self {
        if size == 0 || crop.width == 0 || crop.height == 0 {
            return Self { size: size as usize, resample: None, normalize: true };
        }
        let x = Axis::new(Segment::whole(crop.left, crop.width), size, 0, size);
        let y = Axis::new(Segment::whole(crop.top, crop.height), size, 0, size);
        Self { size: size as usize, resample: Some((x, y, flip)), normalize: true }
    }

    /// The largest reduction (8, 4, 2 or 1) at which the image still has at least as many
    /// pixels as this plan samples from it on each axis: the DCT scale to decode at when
    /// `data.jpeg_draft` is on.
    pub fn max_reduction(&self) -> u32 {
        let Some((x, y, _)) = &self.resample else {
            return 1;
        };
        let ratio = |axis: &Axis| axis.segment.len / f64::from(axis.dst_len.max(1));
        largest_reduction(ratio(x).min(ratio(y)))
    }

    /// The same plan for the image decoded at 1/`reduction` of its size: the same source
    /// rectangle, in the reduced image's (fractional) pixels. `reduced(1)` is the plan itself.
    pub fn reduced(&self, reduction: u32) -> Self {
        let resample = self.resample.as_ref().map(|(x, y, flip)| {
            if reduction <= 1 {
                return (x.clone(), y.clone(), *flip);
            }
            (x.reduced(reduction), y.reduced(reduction), *flip)
        });
        Self { size: self.size, resample, normalize: self.normalize }
    }

    /// The rectangle of source pixels the output reads (the crop, widened by the filter's
    /// support), or `None` when it reads none.
    pub fn source(&self) -> Option<Crop> {
        let (x, y, _) = self.resample.as_ref()?;
        let ((left, right), (top, bottom)) = x.source_range().zip(y.source_range())?;
        Some(Crop {
            top: top as u32,
            left: left as u32,
            height: (bottom - top) as u32,
            width: (right - left) as u32,
        })
    }

    /// Writes the normalised CHW output into `out` from `pixels`: packed RGB rows of the
    /// source rectangle `region`, which must contain [`DrawnTransform::source`].
    ///
    /// # Panics
    /// If `out` is not `3 * size * size` long, or `pixels` does not hold `region` — caller
    /// bugs, not bad input.
    pub fn render(&self, pixels: &[u8], region: Crop, out: &mut [f32]) {
        assert_eq!(
            out.len(),
            3 * self.size * self.size,
            "output buffer length does not match the transform's 3*size*size"
        );
        assert_eq!(
            pixels.len(),
            region.width as usize * region.height as usize * 3,
            "pixels do not match their region"
        );
        let table = table(self.normalize);
        match &self.resample {
            Some((x, y, flip)) => resample(pixels, region, x, y, Sink::new(out, self.size, *flip, table)),
            None => Sink::new(out, self.size, false, table).fill_black(),
        }
    }
}

/// torchvision `Resize(int)`: the shorter side becomes `resize`, the longer one
/// `int(resize * long / short)` (truncated, as Python's `int` does).
fn resized_dims(width: u32, height: u32, resize: u32) -> (u32, u32) {
    let long_of = |long: u32, short: u32| (f64::from(resize) * f64::from(long) / f64::from(short)) as u32;
    if width <= height {
        (resize, long_of(height, width))
    } else {
        (long_of(width, height), resize)
    }
}

/// torchvision `CenterCrop` offset of the crop window within a side of length `len`:
/// `round((len - size) / 2)`, or, when the crop is larger than the image, minus the zero
/// padding `(size - len) // 2` added before it.
fn center_offset(len: u32, size: u32) -> i64 {
    if size > len {
        -i64::from((size - len) / 2)
    } else {
        py_round(f64::from(len - size) / 2.0) as i64
    }
}

/// Fixed-point precision of PIL's 8-bit resampling (`PRECISION_BITS` in `Resample.c`).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// PIL's `clip8`: drop the fraction bits (already offset by half for rounding) and clamp.
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resampling weights along one axis, computed as PIL's `precompute_coeffs` and
/// `normalize_coeffs_8bpc` compute them for the bilinear (triangle) filter, so the integer
/// arithmetic below reproduces torchvision's PIL pipeline bit for bit.
///
/// The source segment (see [`Segment`]) is resized to `dst_len` samples, of
/// which only the window `[win_start, win_start + win_len)` is produced; window positions
/// outside `[0, dst_len)` are zero padding (torchvision's `CenterCrop` of a small image).
#[derive(Clone)]
struct Axis {
    /// Per window position: first source index (absolute) and number of taps; `taps == 0`
    /// marks padding.
    spans: Vec<(usize, usize)>,
    /// Per window position, `stride` fixed-point weights (only the first `taps` used).
    weights: Vec<i32>,
    stride: usize,
    /// The source segment, the whole pixels it touches, and the length of its full resized
    /// extent (not just the window).
    segment: Segment,
    src_len: u32,
    dst_len: u32,
    /// The window: its first position in the resized extent, and its length.
    win_start: i64,
    win_len: u32,
}

impl Axis {
    /// Taps resizing `segment` to `dst_len` samples, of which the window `[win_start,
    /// win_start + win_len)` is produced. A segment of whole pixels gives PIL's weights
    /// exactly; a fractional one (a reduced decode) places the filter as PIL does for a
    /// resize with a box (`precompute_coeffs` with `in0`), clamped to the pixels it touches.
    fn new(segment: Segment, dst_len: u32, win_start: i64, win_len: u32) -> Self {
        let src_start = segment.start.floor().max(0.0) as u32;
        let src_end = (segment.start + segment.len).ceil() as u32;
        let src_len = src_end.saturating_sub(src_start);
        // Zero for whole pixels, so that the arithmetic below is PIL's to the last bit.
        let offset = segment.start - f64::from(src_start);
        let scale = segment.len / f64::from(dst_len.max(1));
        // Downscaling widens the filter so every source pixel contributes (antialiasing).
        let filter_scale = scale.max(1.0);
        let support = filter_scale; // the triangle filter's support is 1
        let inv_scale = 1.0 / filter_scale;
        let stride = (support.ceil() as usize) * 2 + 1;
        let one = f64::from(1u32 << PRECISION_BITS);
        let mut spans = Vec::with_capacity(win_len as usize);
        let mut weights = vec![0i32; stride * win_len as usize];
        let mut raw = vec![0f64; stride];
        for (o, row) in weights.chunks_exact_mut(stride).enumerate() {
            let x = win_start + o as i64;
            if x < 0 || x >= i64::from(dst_len) {
                spans.push((0, 0));
                continue;
            }
            let center = offset + (x as f64 + 0.5) * scale;
            // C's `(int)` truncation as in PIL; with the clamp at 0 it is a floor.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).clamp(0, i64::from(src_len)) as usize;
            let taps = xmax.saturating_sub(xmin).min(stride);
            let mut total = 0.0;
            for (k, r) in raw[..taps].iter_mut().enumerate() {
                let t = ((k + xmin) as f64 - center + 0.5) * inv_scale;
                *r = (1.0 - t.abs()).max(0.0);
                total += *r;
            }
            if total <= 0.0 {
                // Unreachable for a position inside the image (some tap is always nearer
                // than the support); PIL would output black, as padding does.
                spans.push((0, 0));
                continue;
            }
            for (dst, r) in row.iter_mut().zip(&raw[..taps]) {
                // Weights are non-negative, so PIL's `(int)(0.5 + w * 2^22)` branch applies.
                *dst = (0.5 + *r / total * one) as i32;
            }
            spans.push((src_start as usize + xmin, taps));
        }
        Self { spans, weights, stride, segment, src_len, dst_len, win_start, win_len }
    }

    /// The same taps for the image decoded at 1/`reduction` of its size.
    fn reduced(&self, reduction: u32) -> Self {
        let r = f64::from(reduction);
        let segment = Segment { start: self.segment.start / r, len: self.segment.len / r };
        Self::new(segment, self.dst_len, self.win_start, self.win_len)
    }

    /// Source indices `[lo, hi)` that any non-padding window position reads, if any.
    fn source_range(&self) -> Option<(usize, usize)> {
        let mut used = self.spans.iter().filter(|span| span.1 > 0);
        let first = used.next()?;
        let (lo, hi) =
            used.fold((first.0, first.0 + first.1), |(lo, hi), &(s, t)| (lo.min(s), hi.max(s + t)));
        Some((lo, hi))
    }

    /// The taps re-expressed with the same number `k` of weights for every position,
    /// reading source indices within `[lo, hi)` and given relative to `lo`, so the
    /// horizontal pass can run a fixed-length, branch-free loop.
    ///
    /// Zero weights at either end of a span (PIL keeps them; upsampling always has one) are
    /// trimmed first, as they add exactly nothing; `k` is the longest remaining span. A
    /// window that would run past `hi` is moved left with its weights shifted, the extra
    /// weights being zero. Padding positions get all-zero weights, which yields black.
    /// `None` when the source is narrower than `k`.
    fn fixed(&self, lo: usize, hi: usize) -> Option<FixedTaps> {
        let trimmed: Vec<(usize, &[i32])> = (0..self.spans.len())
            .map(|o| {
                let (start, taps) = self.taps(o);
                let first = taps.iter().position(|&w| w != 0).unwrap_or(taps.len());
                let last = taps.iter().rposition(|&w| w != 0).map_or(first, |i| i + 1);
                (start + first, &taps[first..last])
            })
            .collect();
        let k = trimmed.iter().map(|t| t.1.len()).max().unwrap_or(0).max(1);
        if hi < lo + k {
            return None;
        }
        let mut starts = Vec::with_capacity(trimmed.len());
        let mut weights = vec![0i32; k * trimmed.len()];
        for (dst, &(start, taps)) in weights.chunks_exact_mut(k).zip(&trimmed) {
            if taps.is_empty() {
                starts.push(0);
                continue;
            }
            let begin = start.min(hi - k).max(lo);
            let shift = start - begin;
            dst[shift..shift + taps.len()].copy_from_slice(taps);
            starts.push(begin - lo);
        }
        Some(FixedTaps { starts, weights, k })
    }

    fn taps(&self, o: usize) -> (usize, &[i32]) {
        let (start, taps) = self.spans[o];
        (start, &self.weights[o * self.stride..o * self.stride + taps])
    }
}

/// Per-channel lookup from an 8-bit value to the network's input.
type Table = [[f32; 256]; 3];

/// Lookup table from an 8-bit channel value to torchvision's `v / 255` (`ToTensor`), then
/// `(x - mean) / std` when `normalize`, computed in `f32` exactly as torchvision computes it.
fn value_table(normalize: bool) -> Table {
    let mut table = [[0f32; 256]; 3];
    for (c, plane) in table.iter_mut().enumerate() {
        for (v, slot) in plane.iter_mut().enumerate() {
            let x = v as f32 / 255.0;
            *slot = if normalize { (x - IMAGENET_MEAN[c]) / IMAGENET_STD[c] } else { x };
        }
    }
    table
}

/// The tables are 3 KiB each and the same for every image: build them once per process.
fn table(normalize: bool) -> &'static Table {
    static NORMALIZED: std::sync::OnceLock<Table> = std::sync::OnceLock::new();
    static PLAIN: std::sync::OnceLock<Table> = std::sync::OnceLock::new();
    match normalize {
        true => NORMALIZED.get_or_init(|| value_table(true)),
        false => PLAIN.get_or_init(|| value_table(false)),
    }
}

/// Separable resampling of the source pixels selected by `x`/`y` into the `size`×`size`
/// window, normalised and written as CHW planes (columns reversed when `flip`, which equals
/// flipping after the resize).
///
/// Each pass rounds to 8 bits, so the pass order changes the result by a grey level here
/// and there. Pillow 13.0.0 (the reference torchvision environment in `.deps/venv`) runs the
/// vertical pass first when the height shrinks by more than twice as many pixels as the
/// width does; we follow the same rule so our output stays bit-identical to it. (Older
/// Pillow always went horizontal first; that differs by at most one level on some pixels.)
///
/// `src` holds the packed RGB rows of `region`, which contains every source pixel read.
fn resample(src: &[u8], region: Crop, x: &Axis, y: &Axis, mut sink: Sink) {
    let (out_w, out_h) = (x.win_len as usize, y.win_len as usize);
    let shrink_h = i64::from(y.src_len) - i64::from(y.dst_len);
    let shrink_w = i64::from(x.src_len) - i64::from(x.dst_len);
    let (lo, hi) = (x.source_range(), y.source_range());
    let Some(((col_lo, col_hi), (row_lo, row_hi))) = lo.zip(hi) else {
        // Every output pixel is padding.
        sink.fill_black();
        return;
    };
    let (top, left, width) = (region.top as usize, region.left as usize, region.width as usize);
    assert!(
        left <= col_lo && col_hi <= left + width && top <= row_lo && row_hi <= top + region.height as usize,
        "the decoded region does not contain the pixels the transform reads"
    );
    let src_stride = width * 3;
    let row_len = out_w * 3;
    // Padding columns have no taps (or all-zero weights), so both passes leave them at 0:
    // black, as torchvision's zero padding is. Padding rows are filled explicitly.
    if shrink_h > 0 && shrink_h > 2 * shrink_w {
        // Vertical pass: each output row over the needed source columns.
        let ncols = col_hi - col_lo;
        let mut vert = vec![0u8; ncols * 3];
        let mut acc = vec![0i32; ncols * 3];
        let mut line = vec![0u8; row_len];
        let fixed = x.fixed(col_lo, col_hi);
        for oy in 0..out_h {
            let (start, weights) = y.taps(oy);
            if weights.is_empty() {
                sink.black_row(oy);
                continue;
            }
            acc.fill(HALF);
            for (k, &w) in weights.iter().enumerate() {
                let begin = (start + k - top) * src_stride + (col_lo - left) * 3;
                accumulate(&mut acc, &src[begin..begin + ncols * 3], w);
            }
            for (d, &a) in vert.iter_mut().zip(&acc) {
                *d = clip8(a);
            }
            // Horizontal pass over the intermediate row.
            horizontal_row(&vert, x, fixed.as_ref(), col_lo, &mut line);
            sink.put_row(oy, &line);
        }
    } else {
        // Horizontal pass: each needed source row → `size` interleaved RGB samples.
        let mut horiz = vec![0u8; (row_hi - row_lo) * row_len];
        let fixed = x.fixed(left, left + width);
        for (r, dst) in horiz.chunks_exact_mut(row_len).enumerate() {
            let row = &src[(row_lo + r - top) * src_stride..(row_lo + r - top + 1) * src_stride];
            horizontal_row(row, x, fixed.as_ref(), left, dst);
        }
        // Vertical pass: accumulate whole rows (contiguous, so it vectorises).
        let mut acc = vec![0i32; row_len];
        let mut line = vec![0u8; row_len];
        for oy in 0..out_h {
            let (start, weights) = y.taps(oy);
            if weights.is_empty() {
                sink.black_row(oy);
                continue;
            }
            acc.fill(HALF);
            for (k, &w) in weights.iter().enumerate() {
                let r = start + k - row_lo;
                accumulate(&mut acc, &horiz[r * row_len..(r + 1) * row_len], w);
            }
            for (d, &a) in line.iter_mut().zip(&acc) {
                *d = clip8(a);
            }
            sink.put_row(oy, &line);
        }
    }
}

/// Horizontal taps padded to a fixed count `k`; see [`Axis::fixed`].
struct FixedTaps {
    starts: Vec<usize>,
    weights: Vec<i32>,
    k: usize,
}

/// Horizontal pass over one row of interleaved RGB (`row` starts at the `lo` the taps were
/// made for), writing one RGB triple per output position into `dst`.
fn horizontal_row(row: &[u8], x: &Axis, fixed: Option<&FixedTaps>, lo: usize, dst: &mut [u8]) {
    match fixed {
        // The common tap counts get a loop the compiler fully unrolls.
        Some(f) if f.k == 1 => horizontal_fixed::<1>(row, f, dst),
        Some(f) if f.k == 2 => horizontal_fixed::<2>(row, f, dst),
        Some(f) if f.k == 3 => horizontal_fixed::<3>(row, f, dst),
        Some(f) if f.k == 4 => horizontal_fixed::<4>(row, f, dst),
        Some(f) if f.k == 5 => horizontal_fixed::<5>(row, f, dst),
        Some(f) if f.k == 6 => horizontal_fixed::<6>(row, f, dst),
        Some(f) if f.k == 7 => horizontal_fixed::<7>(row, f, dst),
        Some(f) if f.k == 8 => horizontal_fixed::<8>(row, f, dst),
        _ => {
            for (ox, px) in dst.chunks_exact_mut(3).enumerate() {
                let (start, weights) = x.taps(ox);
                let begin = start.saturating_sub(lo) * 3;
                px.copy_from_slice(&horizontal_tap(&row[begin..begin + weights.len() * 3], weights));
            }
        }
    }
}

fn horizontal_fixed<const K: usize>(row: &[u8], f: &FixedTaps, dst: &mut [u8]) {
    for ((px, &start), w) in dst.chunks_exact_mut(3).zip(&f.starts).zip(f.weights.chunks_exact(K)) {
        let taps = &row[start * 3..start * 3 + 3 * K];
        let mut acc = [HALF; 3];
        for k in 0..K {
            acc[0] += i32::from(taps[3 * k]) * w[k];
            acc[1] += i32::from(taps[3 * k + 1]) * w[k];
            acc[2] += i32::from(taps[3 * k + 2]) * w[k];
        }
        px[0] = clip8(acc[0]);
        px[1] = clip8(acc[1]);
        px[2] = clip8(acc[2]);
    }
}

/// PIL's rounding offset: half of one in fixed point.
const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// `acc[i] += w * src[i]` over a whole row.
fn accumulate(acc: &mut [i32], src: &[u8], w: i32) {
    if w == 0 {
        // A zero tap (PIL keeps them at the filter's edge) adds exactly nothing.
        return;
    }
    for (a, &v) in acc.iter_mut().zip(src) {
        *a += i32::from(v) * w;
    }
}

/// One horizontally filtered RGB pixel from interleaved source taps.
fn horizontal_tap(taps: &[u8], weights: &[i32]) -> [u8; 3] {
    let mut acc = [HALF; 3];
    for (s, &w) in taps.chunks_exact(3).zip(weights) {
        acc[0] += i32::from(s[0]) * w;
        acc[1] += i32::from(s[1]) * w;
        acc[2] += i32::from(s[2]) * w;
    }
    [clip8(acc[0]), clip8(acc[1]), clip8(acc[2])]
}

/// Where resampled rows go: normalised values in three CHW planes (a network input), or 8-bit
/// RGB rows (an image, for `data prepare --resize`).
enum Target<'a> {
    Planes { red: &'a mut [f32], green: &'a mut [f32], blue: &'a mut [f32], table: &'static Table },
    Rgb(&'a mut [u8]),
}

/// Writes resampled rows of `width` 8-bit RGB pixels into its target, columns reversed when
/// `flip`.
struct Sink<'a> {
    target: Target<'a>,
    width: usize,
    flip: bool,
}

impl<'a> Sink<'a> {
    /// Into `size` x `size` CHW planes of values looked up in `table`.
    fn new(out: &'a mut [f32], size: usize, flip: bool, table: &'static Table) -> Self {
        let (red, rest) = out.split_at_mut(size * size);
        let (green, blue) = rest.split_at_mut(size * size);
        Self { target: Target::Planes { red, green, blue, table }, width: size, flip }
    }

    /// Into packed RGB rows `width` pixels long.
    fn rgb(out: &'a mut [u8], width: usize) -> Self {
        Self { target: Target::Rgb(out), width, flip: false }
    }

    /// Every output pixel black, as padding gives.
    fn fill_black(&mut self) {
        match &mut self.target {
            Target::Planes { red, green, blue, table } => {
                red.fill(table[0][0]);
                green.fill(table[1][0]);
                blue.fill(table[2][0]);
            }
            Target::Rgb(out) => out.fill(0),
        }
    }

    /// Stores one output row of interleaved 8-bit RGB.
    fn put_row(&mut self, oy: usize, rgb: &[u8]) {
        let line = oy * self.width..(oy + 1) * self.width;
        match &mut self.target {
            Target::Planes { red, green, blue, table } => {
                let (red, green, blue) = (&mut red[line.clone()], &mut green[line.clone()], &mut blue[line]);
                let [tr, tg, tb] = *table;
                let mut store = |dx: usize, px: &[u8]| {
                    red[dx] = tr[usize::from(px[0])];
                    green[dx] = tg[usize::from(px[1])];
                    blue[dx] = tb[usize::from(px[2])];
                };
                if self.flip {
                    for (dx, px) in rgb.chunks_exact(3).rev().enumerate() {
                        store(dx, px);
                    }
                } else {
                    for (dx, px) in rgb.chunks_exact(3).enumerate() {
                        store(dx, px);
                    }
                }
            }
            Target::Rgb(out) => out[line.start * 3..line.end * 3].copy_from_slice(rgb),
        }
    }

    fn black_row(&mut self, oy: usize) {
        let line = oy * self.width..(oy + 1) * self.width;
        match &mut self.target {
            Target::Planes { red, green, blue, table } => {
                red[line.clone()].fill(table[0][0]);
                green[line.clone()].fill(table[1][0]);
                blue[line].fill(table[2][0]);
            }
            Target::Rgb(out) => out[line.start * 3..line.end * 3].fill(0),
        }
    }
}

/// Resizes the whole image in `pixels` (packed RGB rows of a `region` at the origin: the
/// image decoded at 1/`reduction` of `full_width` x `full_height`) to `width` x `height`, with
/// the resampling the network's input gets (PIL's antialiased bilinear filter): what
/// `data prepare --resize` stores.
///
/// # Panics
/// If `pixels` does not hold `region`, or `region` is not the whole reduced image (caller bugs).
pub fn resize_rgb(
    pixels: &[u8],
    region: Crop,
    full: (u32, u32),
    reduction: u32,
    width: u32,
    height: u32,
) -> image::RgbImage {
    assert_eq!(
        pixels.len(),
        region.width as usize * region.height as usize * 3,
        "pixels do not match their region"
    );
    let mut out = vec![0u8; width as usize * height as usize * 3];
    if width > 0 && height > 0 && region.width > 0 && region.height > 0 {
        let x = Axis::new(Segment::whole(0, full.0), width, 0, width).reduced(reduction.max(1));
        let y = Axis::new(Segment::whole(0, full.1), height, 0, height).reduced(reduction.max(1));
        resample(pixels, region, &x, &y, Sink::rgb(&mut out, width as usize));
    }
    image::RgbImage::from_raw(width, height, out).expect("width * height RGB pixels")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(image: &RgbImage) -> Crop {
        Crop { top: 0, left: 0, height: image.height(), width: image.width() }
    }

    fn normalised(c: usize, v: u8) -> f32 {
        (f32::from(v) / 255.0 - IMAGENET_MEAN[c]) / IMAGENET_STD[c]
    }

    #[test]
    fn eval_of_constant_image_is_the_normalised_constant() {
        let img = RgbImage::from_pixel(37, 23, image::Rgb([200, 17, 90]));
        let t = Transform::eval(16, 19);
        let mut out = vec![f32::NAN; t.output_len()];
        apply(&img, &t, &mut sample_rng(0, 0, 0), &mut out);
        for (c, v) in [200u8, 17, 90].into_iter().enumerate() {
            let want = normalised(c, v);
            assert!(out[c * 256..(c + 1) * 256].iter().all(|&x| x == want), "channel {c}");
        }
    }

    #[test]
    fn train_of_constant_image_is_the_normalised_constant() {
        let img = RgbImage::from_pixel(50, 31, image::Rgb([3, 128, 255]));
        let t = Transform::train(12, Augment::default());
        let mut out = vec![0f32; t.output_len()];
        for i in 0..20 {
            apply(&img, &t, &mut sample_rng(1, 2, i), &mut out);
            for (c, v) in [3u8, 128, 255].into_iter().enumerate() {
                let want = normalised(c, v);
                assert!(out[c * 144..(c + 1) * 144].iter().all(|&x| x == want));
            }
        }
    }

    #[test]
    fn eval_geometry_of_a_small_image() {
        // 10 wide × 20 tall: Resize(9) gives 9×18, CenterCrop(8) takes columns 0..8
        // (round(0.5) = 0) and rows 5..13 (round(5.0) = 5).
        let mut img = RgbImage::new(10, 20);
        for (x, y, p) in img.enumerate_pixels_mut() {
            *p = image::Rgb([(x * 20) as u8, (y * 10) as u8, 7]);
        }
        let t = Transform::eval(8, 9);
        assert_eq!(resized_dims(10, 20, 9), (9, 18));
        assert_eq!(center_offset(9, 8), 0);
        assert_eq!(center_offset(18, 8), 5);
        let mut out = vec![0f32; t.output_len()];
        apply(&img, &t, &mut sample_rng(0, 0, 0), &mut out);
        assert_eq!(out.len(), 3 * 8 * 8);
        let red = &out[..64];
        let green = &out[64..128];
        // Red grows along x, green along y, blue is constant.
        for row in red.chunks_exact(8) {
            assert!(row.windows(2).all(|w| w[0] < w[1]), "{row:?}");
        }
        for col in 0..8 {
            assert!((0..7).all(|r| green[r * 8 + col] < green[(r + 1) * 8 + col]));
        }
        assert!(out[128..].iter().all(|&b| b == normalised(2, 7)));
        // Output row 0 is resized row 5, centred at source y = 5.5 * 20/18 = 6.111 with
        // filter scale 20/18: PIL's taps are rows 5 and 6 (values 50, 60) with triangle
        // weights 1 - |5.5 - 6.111| / 1.111 = 0.45 and 1 - |6.5 - 6.111| / 1.111 = 0.65.
        let want_g = (0.45 * 50.0 + 0.65 * 60.0) / 1.1_f32; // 55.9
        assert_eq!(green[0], normalised(1, want_g.round() as u8));
    }

    #[test]
    fn eval_pads_when_the_crop_is_larger_than_the_image() {
        // Resize(4) of a 4×4 image is itself; CenterCrop(6) pads one pixel on every side.
        let img = RgbImage::from_pixel(4, 4, image::Rgb([255, 255, 255]));
        let t = Transform::eval(6, 4);
        let mut out = vec![0f32; t.output_len()];
        apply(&img, &t, &mut sample_rng(0, 0, 0), &mut out);
        let red = &out[..36];
        for y in 0..6 {
            for x in 0..6 {
                let inside = (1..5).contains(&x) && (1..5).contains(&y);
                let want = normalised(0, if inside { 255 } else { 0 });
                assert_eq!(red[y * 6 + x], want, "({x}, {y})");
            }
        }
    }

    #[test]
    fn identity_resize_copies_pixels_and_flip_reverses_columns() {
        let mut img = RgbImage::new(5, 3);
        for (x, y, p) in img.enumerate_pixels_mut() {
            *p = image::Rgb([(x * 50) as u8, (y * 100) as u8, (x + y) as u8]);
        }
        let x = Axis::new(Segment::whole(0, 5), 5, 0, 3);
        let y = Axis::new(Segment::whole(0, 3), 3, 0, 3);
        let mut out = vec![0f32; 27];
        resample(img.as_raw(), whole(&img), &x, &y, Sink::new(&mut out, 3, false, table(true)));
        let mut flipped = vec![0f32; 27];
        resample(img.as_raw(), whole(&img), &x, &y, Sink::new(&mut flipped, 3, true, table(true)));
        for yy in 0..3 {
            for xx in 0..3 {
                let p = img.get_pixel(xx as u32, yy as u32).0;
                for c in 0..3 {
                    assert_eq!(out[c * 9 + yy * 3 + xx], normalised(c, p[c]));
                    assert_eq!(flipped[c * 9 + yy * 3 + (2 - xx)], normalised(c, p[c]));
                }
            }
        }
    }

    /// Resizes the whole test pattern `w`×`h` to 5×5 through the crop path and returns the
    /// red and green planes as 8-bit values.
    fn pattern_resized(w: u32, h: u32) -> (Vec<u8>, Vec<u8>) {
        let img = RgbImage::from_fn(w, h, |x, y| {
            image::Rgb(std::array::from_fn(|c| ((x * 37 + y * 91 + c as u32 * 53) * 7 % 256) as u8))
        });
        let (xa, ya) = (Axis::new(Segment::whole(0, w), 5, 0, 5), Axis::new(Segment::whole(0, h), 5, 0, 5));
        let mut out = vec![0f32; 75];
        resample(img.as_raw(), whole(&img), &xa, &ya, Sink::new(&mut out, 5, false, table(true)));
        let back = |c: usize, v: f32| (0..=255u8).find(|&u| normalised(c, u) == v).unwrap();
        let red = out[..25].iter().map(|&v| back(0, v)).collect();
        let green = out[25..50].iter().map(|&v| back(1, v)).collect();
        (red, green)
    }

    #[test]
    fn resampling_matches_pillow_in_both_pass_orders() {
        // Expected values from Pillow 13.0.0: `Image.fromarray(pattern).resize((5, 5),
        // Image.BILINEAR)`. 7×15 is resized vertically first, 15×7 horizontally first; each
        // differs from the other order in at least one pixel.
        let (red, green) = pattern_resized(7, 15);
        assert_eq!(
            red,
            [
                125, 93, 69, 73, 77, 188, 176, 152, 86, 71, 165, 169, 173, 177, 143, 170, 174, 178, 182, 186,
                155, 159, 163, 167, 171
            ]
        );
        assert_eq!(
            green,
            [
                176, 180, 184, 188, 128, 161, 165, 169, 173, 177, 166, 170, 174, 178, 182, 143, 147, 151,
                155, 159, 142, 146, 150, 154, 158
            ]
        );
        let (red, green) = pattern_resized(15, 7);
        assert_eq!(
            red,
            [
                46, 54, 63, 72, 80, 145, 64, 73, 82, 90, 152, 100, 93, 102, 110, 190, 103, 65, 74, 82, 200,
                190, 65, 56, 64
            ]
        );
        assert_eq!(
            green,
            [
                161, 159, 102, 101, 109, 171, 167, 87, 83, 91, 191, 199, 154, 55, 63, 163, 171, 180, 113, 83,
                145, 153, 162, 114, 93
            ]
        );
    }

    #[test]
    fn resize_rgb_gives_the_pixels_the_network_input_gets() {
        // `data prepare --resize` stores what the input pipeline makes: the same Pillow values
        // as resampling_matches_pillow_in_both_pass_orders, in both pass orders.
        for (w, h) in [(7, 15), (15, 7)] {
            let img = RgbImage::from_fn(w, h, |x, y| {
                image::Rgb(std::array::from_fn(|c| ((x * 37 + y * 91 + c as u32 * 53) * 7 % 256) as u8))
            });
            let resized = resize_rgb(img.as_raw(), whole(&img), (w, h), 1, 5, 5);
            let (red, green) = pattern_resized(w, h);
            assert_eq!(resized.pixels().map(|p| p.0[0]).collect::<Vec<_>>(), red, "{w}x{h}");
            assert_eq!(resized.pixels().map(|p| p.0[1]).collect::<Vec<_>>(), green, "{w}x{h}");
        }
    }

    #[test]
    fn a_reduced_plan_reads_the_same_part_of_the_picture() {
        // A 64x48 crop at (32, 16) of a 200x120 image, to 8x8: at 1/4 scale it reads the
        // reduced image's pixels 8..24 across and 4..16 down (plus the filter's reach).
        let plan = DrawnTransform::resized_crop(Crop { top: 16, left: 32, height: 48, width: 64 }, 8, false);
        assert_eq!(plan.max_reduction(), 4, "64/8 and 48/8 are at least 4 but below 8 for the rows");
        let reduced = plan.reduced(4);
        assert_eq!(reduced.source(), Some(Crop { top: 4, left: 8, height: 12, width: 16 }));
        // A constant picture stays constant whatever the reduction.
        let pixels = vec![77u8; 50 * 30 * 3];
        let mut out = vec![0f32; 3 * 64];
        reduced.render(&pixels, Crop { top: 0, left: 0, height: 30, width: 50 }, &mut out);
        assert!(out[..64].iter().all(|&v| v == normalised(0, 77)));
        // Transform-level: Resize((244, 244)) of a 6000x4000 photo allows 1/8 (750x500).
        let transform =
            Transform { geometry: Geometry::Resize { hflip: false }, ..Transform::eval(244, 256) };
        assert_eq!(transform.whole_image_reduction(6000, 4000), 8);
        assert_eq!(transform.whole_image_reduction(608, 1080), 2);
        assert_eq!(transform.whole_image_reduction(300, 300), 1);
    }

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
    fn degenerate_inputs_give_black_instead_of_panicking() {
        let black: Vec<f32> = (0..3).flat_map(|c| vec![normalised(c, 0); 16]).collect();
        let mut rng = sample_rng(0, 0, 0);
        let mut out = vec![1f32; 48];
        apply(&RgbImage::new(0, 0), &Transform::eval(4, 4), &mut rng, &mut out);
        assert_eq!(out, black);
        let mut out = vec![1f32; 48];
        let img = RgbImage::from_pixel(5, 5, image::Rgb([9, 9, 9]));
        apply(&img, &Transform::eval(4, 0), &mut rng, &mut out);
        assert_eq!(out, black);
        apply(&img, &Transform::train(0, Augment::default()), &mut rng, &mut []);
        let c = random_resized_crop(0, 7, &Augment::default(), &mut rng);
        assert_eq!((c.width, c.height), (0, 0));
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

    #[test]
    fn train_is_deterministic_per_rng_and_varies_across_samples() {
        let mut img = RgbImage::new(64, 48);
        for (x, y, p) in img.enumerate_pixels_mut() {
            *p = image::Rgb([(x * 4) as u8, (y * 5) as u8, ((x * y) % 256) as u8]);
        }
        let t = Transform::train(32, Augment::default());
        let run = |i| {
            let mut out = vec![0f32; t.output_len()];
            apply(&img, &t, &mut sample_rng(5, 1, i), &mut out);
            out
        };
        assert_eq!(run(0), run(0));
        assert_ne!(run(0), run(1));
    }
}
