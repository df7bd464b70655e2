//! torchvision-style preprocessing: `RandomResizedCrop` + `RandomHorizontalFlip` for training,
//! `Resize` + `CenterCrop` for evaluation, then `ToTensor` + `Normalize`.
//!
//! This module owns the transform and the plan drawn from it for one image ([`DrawnTransform`]:
//! which source pixels it reads and how they become the output), fused into one pass that
//! writes CHW `f32` straight into the caller's batch buffer. Its parts:
//! - `draw.rs`: the random draws, made exactly as torchvision makes them (the crop of
//!   `RandomResizedCrop`), from [`sample_rng`], the per-sample random stream that makes
//!   augmentation independent of worker count, batch position and resumption;
//! - `resample.rs`: PIL's antialiased bilinear ("triangle") filter, which torchvision uses for
//!   PIL images, in PIL's own fixed-point arithmetic (horizontal pass, round to 8 bits,
//!   vertical pass, round), so the output matches torchvision + Pillow bit for bit given the
//!   same crop. Only the crop is resampled, never the whole image.

mod draw;
mod resample;

pub use draw::{random_resized_crop, sample_rng};
pub use resample::resize_rgb;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use image::RgbImage;

use crate::data::autoaugment::Policy;
use resample::{resample, table, Axis, Segment, Sink};

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
        largest_reduction(x.source_per_output().min(y.source_per_output()))
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
        draw::py_round(f64::from(len - size) / 2.0) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn whole(image: &RgbImage) -> Crop {
        Crop { top: 0, left: 0, height: image.height(), width: image.width() }
    }

    pub(super) fn normalised(c: usize, v: u8) -> f32 {
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
