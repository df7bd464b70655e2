//! AutoAugment, RandAugment and TrivialAugmentWide: torchvision's automatic augmentation
//! policies and the fifteen operations they draw from, on 8-bit RGB images.
//!
//! This module owns the operations ([`apply_op`]), the AutoAugment sub-policy tables, the
//! magnitude bins of each augmentation space and the random choice of ops ([`Policy::apply`]).
//! Every operation is bit-exact with `torchvision.transforms.v2` (0.28) applied to a PIL RGB
//! image with NEAREST interpolation and fill 0, the defaults of these transforms. On PIL,
//! torchvision hands each op to Pillow (`Image.transform`, `Image.rotate`, `ImageEnhance`,
//! `ImageOps`), so what is reproduced here is Pillow's C arithmetic: its 16.16 fixed-point affine
//! sampling, its float32 blends, its rounded smoothing kernel and its lookup tables.
//! tests/autoaugment_reference.rs checks every op, bin and table against torchvision itself.
//!
//! The random choices come from the caller's [`ChaCha8Rng`], not torch's generator, so a seed
//! does not pick what torchvision would; the distributions are the same. See [`Policy::apply`]
//! for the order of the draws.

use image::RgbImage;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// One image operation, named as torchvision's `transform_id`s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
    Invert,
}

impl Op {
    /// Every op, in declaration order (which `name` relies on).
    #[rustfmt::skip]
    pub const ALL: [Op; 15] = [
        Op::Identity, Op::ShearX, Op::ShearY, Op::TranslateX, Op::TranslateY, Op::Rotate, Op::Brightness,
        Op::Color, Op::Contrast, Op::Sharpness, Op::Posterize, Op::Solarize, Op::AutoContrast, Op::Equalize,
        Op::Invert,
    ];

    /// torchvision's name for the op (`"ShearX"`, `"AutoContrast"`, ...).
    pub fn name(self) -> &'static str {
        #[rustfmt::skip]
        const NAMES: [&str; 15] = [
            "Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
            "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert",
        ];
        NAMES[self as usize]
    }

    /// The op torchvision calls `name`.
    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }

    /// Whether the op takes a magnitude from the bins (the others always get 0).
    pub fn has_magnitude(self) -> bool {
        !matches!(self, Op::Identity | Op::AutoContrast | Op::Equalize | Op::Invert)
    }

    /// Whether a drawn magnitude is negated with probability 1/2 (the same in every space).
    pub fn is_signed(self) -> bool {
        self.has_magnitude() && !matches!(self, Op::Posterize | Op::Solarize)
    }
}

/// The datasets AutoAugment's policies were searched on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AutoAugmentPolicy {
    ImageNet,
    Cifar10,
    Svhn,
}

/// One op of a sub-policy: applied with `probability`, at bin `magnitude_id` of
/// [`AugmentationSpace::AutoAugment`] (`None` for ops without a magnitude).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SubPolicyStep {
    pub op: Op,
    pub probability: f64,
    pub magnitude_id: Option<usize>,
}

/// AutoAugment always draws its magnitudes from 10 bins.
pub const AUTOAUGMENT_BINS: usize = 10;

macro_rules! step {
    ($op:ident, $p:expr) => {
        SubPolicyStep { op: Op::$op, probability: $p, magnitude_id: None }
    };
    ($op:ident, $p:expr, $m:expr) => {
        SubPolicyStep { op: Op::$op, probability: $p, magnitude_id: Some($m) }
    };
}

impl AutoAugmentPolicy {
    /// torchvision's `AutoAugment._get_policies(policy)`, in its order.
    pub fn sub_policies(self) -> &'static [[SubPolicyStep; 2]] {
        match self {
            AutoAugmentPolicy::ImageNet => &IMAGENET,
            AutoAugmentPolicy::Cifar10 => &CIFAR10,
            AutoAugmentPolicy::Svhn => &SVHN,
        }
    }
}

#[rustfmt::skip]
static IMAGENET: [[SubPolicyStep; 2]; 25] = [
    [step!(Posterize, 0.4, 8), step!(Rotate, 0.6, 9)],
    [step!(Solarize, 0.6, 5), step!(AutoContrast, 0.6)],
    [step!(Equalize, 0.8), step!(Equalize, 0.6)],
    [step!(Posterize, 0.6, 7), step!(Posterize, 0.6, 6)],
    [step!(Equalize, 0.4), step!(Solarize, 0.2, 4)],
    [step!(Equalize, 0.4), step!(Rotate, 0.8, 8)],
    [step!(Solarize, 0.6, 3), step!(Equalize, 0.6)],
    [step!(Posterize, 0.8, 5), step!(Equalize, 1.0)],
    [step!(Rotate, 0.2, 3), step!(Solarize, 0.6, 8)],
    [step!(Equalize, 0.6), step!(Posterize, 0.4, 6)],
    [step!(Rotate, 0.8, 8), step!(Color, 0.4, 0)],
    [step!(Rotate, 0.4, 9), step!(Equalize, 0.6)],
    [step!(Equalize, 0.0), step!(Equalize, 0.8)],
    [step!(Invert, 0.6), step!(Equalize, 1.0)],
    [step!(Color, 0.6, 4), step!(Contrast, 1.0, 8)],
    [step!(Rotate, 0.8, 8), step!(Color, 1.0, 2)],
    [step!(Color, 0.8, 8), step!(Solarize, 0.8, 7)],
    [step!(Sharpness, 0.4, 7), step!(Invert, 0.6)],
    [step!(ShearX, 0.6, 5), step!(Equalize, 1.0)],
    [step!(Color, 0.4, 0), step!(Equalize, 0.6)],
    [step!(Equalize, 0.4), step!(Solarize, 0.2, 4)],
    [step!(Solarize, 0.6, 5), step!(AutoContrast, 0.6)],
    [step!(Invert, 0.6), step!(Equalize, 1.0)],
    [step!(Color, 0.6, 4), step!(Contrast, 1.0, 8)],
    [step!(Equalize, 0.8), step!(Equalize, 0.6)],
];

#[rustfmt::skip]
static CIFAR10: [[SubPolicyStep; 2]; 25] = [
    [step!(Invert, 0.1), step!(Contrast, 0.2, 6)],
    [step!(Rotate, 0.7, 2), step!(TranslateX, 0.3, 9)],
    [step!(Sharpness, 0.8, 1), step!(Sharpness, 0.9, 3)],
    [step!(ShearY, 0.5, 8), step!(TranslateY, 0.7, 9)],
    [step!(AutoContrast, 0.5), step!(Equalize, 0.9)],
    [step!(ShearY, 0.2, 7), step!(Posterize, 0.3, 7)],
    [step!(Color, 0.4, 3), step!(Brightness, 0.6, 7)],
    [step!(Sharpness, 0.3, 9), step!(Brightness, 0.7, 9)],
    [step!(Equalize, 0.6), step!(Equalize, 0.5)],
    [step!(Contrast, 0.6, 7), step!(Sharpness, 0.6, 5)],
    [step!(Color, 0.7, 7), step!(TranslateX, 0.5, 8)],
    [step!(Equalize, 0.3), step!(AutoContrast, 0.4)],
    [step!(TranslateY, 0.4, 3), step!(Sharpness, 0.2, 6)],
    [step!(Brightness, 0.9, 6), step!(Color, 0.2, 8)],
    [step!(Solarize, 0.5, 2), step!(Invert, 0.0)],
    [step!(Equalize, 0.2), step!(AutoContrast, 0.6)],
    [step!(Equalize, 0.2), step!(Equalize, 0.6)],
    [step!(Color, 0.9, 9), step!(Equalize, 0.6)],
    [step!(AutoContrast, 0.8), step!(Solarize, 0.2, 8)],
    [step!(Brightness, 0.1, 3), step!(Color, 0.7, 0)],
    [step!(Solarize, 0.4, 5), step!(AutoContrast, 0.9)],
    [step!(TranslateY, 0.9, 9), step!(TranslateY, 0.7, 9)],
    [step!(AutoContrast, 0.9), step!(Solarize, 0.8, 3)],
    [step!(Equalize, 0.8), step!(Invert, 0.1)],
    [step!(TranslateY, 0.7, 9), step!(AutoContrast, 0.9)],
];

#[rustfmt::skip]
static SVHN: [[SubPolicyStep; 2]; 25] = [
    [step!(ShearX, 0.9, 4), step!(Invert, 0.2)],
    [step!(ShearY, 0.9, 8), step!(Invert, 0.7)],
    [step!(Equalize, 0.6), step!(Solarize, 0.6, 6)],
    [step!(Invert, 0.9), step!(Equalize, 0.6)],
    [step!(Equalize, 0.6), step!(Rotate, 0.9, 3)],
    [step!(ShearX, 0.9, 4), step!(AutoContrast, 0.8)],
    [step!(ShearY, 0.9, 8), step!(Invert, 0.4)],
    [step!(ShearY, 0.9, 5), step!(Solarize, 0.2, 6)],
    [step!(Invert, 0.9), step!(AutoContrast, 0.8)],
    [step!(Equalize, 0.6), step!(Rotate, 0.9, 3)],
    [step!(ShearX, 0.9, 4), step!(Solarize, 0.3, 3)],
    [step!(ShearY, 0.8, 8), step!(Invert, 0.7)],
    [step!(Equalize, 0.9), step!(TranslateY, 0.6, 6)],
    [step!(Invert, 0.9), step!(Equalize, 0.6)],
    [step!(Contrast, 0.3, 3), step!(Rotate, 0.8, 4)],
    [step!(Invert, 0.8), step!(TranslateY, 0.0, 2)],
    [step!(ShearY, 0.7, 6), step!(Solarize, 0.4, 8)],
    [step!(Invert, 0.6), step!(Rotate, 0.8, 4)],
    [step!(ShearY, 0.3, 7), step!(TranslateX, 0.9, 3)],
    [step!(ShearX, 0.1, 6), step!(Invert, 0.6)],
    [step!(Solarize, 0.7, 2), step!(TranslateY, 0.6, 7)],
    [step!(ShearY, 0.8, 4), step!(Invert, 0.8)],
    [step!(ShearX, 0.7, 9), step!(TranslateY, 0.8, 3)],
    [step!(ShearY, 0.8, 5), step!(AutoContrast, 0.7)],
    [step!(ShearX, 0.7, 2), step!(Invert, 0.1)],
];

/// The `_AUGMENTATION_SPACE` of a torchvision transform: which ops it draws and their bins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AugmentationSpace {
    AutoAugment,
    RandAugment,
    TrivialAugmentWide,
}

impl AugmentationSpace {
    /// The space's ops in torchvision's order (RandAugment and TrivialAugmentWide have Identity
    /// and no Invert).
    pub fn ops(self) -> &'static [Op] {
        match self {
            AugmentationSpace::AutoAugment => &Op::ALL[1..],
            AugmentationSpace::RandAugment | AugmentationSpace::TrivialAugmentWide => &Op::ALL[..14],
        }
    }

    /// Bin `bin` of `num_bins` of `op` for an image of `height` x `width`, as torchvision's
    /// `float(magnitudes_fn(num_bins, height, width)[bin])`, unsigned; `None` for ops without
    /// a magnitude or a bin past the end.
    pub fn magnitude(self, op: Op, bin: usize, num_bins: usize, height: u32, width: u32) -> Option<f64> {
        if !op.has_magnitude() || bin >= num_bins {
            return None;
        }
        let wide = self == AugmentationSpace::TrivialAugmentWide;
        let pick = |standard: f64, trivial: f64| if wide { trivial } else { standard };
        let (start, end) = match op {
            Op::ShearX | Op::ShearY => (0.0, pick(0.3, 0.99)),
            Op::TranslateX => (0.0, pick(150.0 / 331.0 * f64::from(width), 32.0)),
            Op::TranslateY => (0.0, pick(150.0 / 331.0 * f64::from(height), 32.0)),
            Op::Rotate => (0.0, pick(30.0, 135.0)),
            Op::Brightness | Op::Color | Op::Contrast | Op::Sharpness => (0.0, pick(0.9, 0.99)),
            Op::Solarize => (1.0, 0.0),
            // `(8 - arange(num_bins) / ((num_bins - 1) / k)).round().int()` in float32.
            Op::Posterize => {
                let divisor = ((num_bins as f64 - 1.0) / pick(4.0, 6.0)) as f32;
                let bits = (8.0 - bin as f32 / divisor).round_ties_even();
                // One bin divides 0 by 0; torchvision then fails in PIL, here it is 8 bits.
                return Some(if bits.is_nan() { 8.0 } else { f64::from(bits) });
            }
            Op::Identity | Op::AutoContrast | Op::Equalize | Op::Invert => return None,
        };
        Some(f64::from(linspace_f32(start, end, num_bins, bin)))
    }

    /// All `num_bins` bins of `op` (see [`AugmentationSpace::magnitude`]).
    pub fn magnitude_bins(self, op: Op, num_bins: usize, height: u32, width: u32) -> Option<Vec<f64>> {
        op.has_magnitude().then(|| {
            (0..num_bins).filter_map(|bin| self.magnitude(op, bin, num_bins, height, width)).collect()
        })
    }
}

/// Element `index` of `torch.linspace(start, end, steps)` in float32. ATen's kernel fills the
/// first half as `start + step * i` and the second as `end - step * (steps - 1 - i)`; the
/// kernel torch dispatches to on x86 is compiled with FMA contraction, so each is one fused
/// multiply-add, which `mul_add` reproduces exactly.
fn linspace_f32(start: f64, end: f64, steps: usize, index: usize) -> f32 {
    let (start, end) = (start as f32, end as f32);
    if steps <= 1 {
        return start;
    }
    let step = (end - start) / (steps - 1) as f32;
    if index < steps / 2 {
        step.mul_add(index as f32, start)
    } else {
        (-step).mul_add((steps - 1 - index) as f32, end)
    }
}

/// An automatic augmentation policy: what torchvision's transform of the same name does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    AutoAugment(AutoAugmentPolicy),
    /// torchvision's defaults: 2 ops, magnitude 9 of 31 bins. Out-of-range values, which
    /// torchvision rejects, are clamped: at least one bin, magnitude at most the last bin.
    RandAugment {
        num_ops: u32,
        magnitude: u32,
        num_magnitude_bins: u32,
    },
    /// torchvision's default: 31 bins (at least one is used).
    TrivialAugmentWide {
        num_magnitude_bins: u32,
    },
}

impl Policy {
    pub const RAND_AUGMENT: Policy = Policy::RandAugment { num_ops: 2, magnitude: 9, num_magnitude_bins: 31 };
    pub const TRIVIAL_AUGMENT_WIDE: Policy = Policy::TrivialAugmentWide { num_magnitude_bins: 31 };

    /// Augments `image`, drawing from `rng` in torchvision's order:
    /// - AutoAugment: the sub-policy (`random_range(0..25)`); then for each of its two ops, `u =
    ///   random::<f64>()`, applied iff `u <= probability`, and only if applied and signed, a sign
    ///   draw (`random::<f64>() <= 0.5` negates).
    /// - RandAugment: `num_ops` times, the op (`random_range` over the 14 ops of the space), then
    ///   for a signed op the sign draw.
    /// - TrivialAugmentWide: the op, then for an op with a magnitude the bin
    ///   (`random_range(0..num_magnitude_bins)`), then for a signed op the sign draw.
    pub fn apply(&self, image: &RgbImage, rng: &mut ChaCha8Rng) -> RgbImage {
        self.apply_owned(image.clone(), rng)
    }

    /// [`Policy::apply`] on an image the caller gives away (no copy of it is made).
    pub fn apply_owned(&self, image: RgbImage, rng: &mut ChaCha8Rng) -> RgbImage {
        let (width, height) = image.dimensions();
        let mut out = image;
        match *self {
            Policy::AutoAugment(policy) => {
                let table = policy.sub_policies();
                let sub_policy = &table[rng.random_range(0..table.len())];
                for step in sub_policy {
                    // torchvision applies the op iff `rand <= probability`.
                    if rng.random::<f64>() > step.probability {
                        continue;
                    }
                    let magnitude = step.magnitude_id.and_then(|bin| {
                        let space = AugmentationSpace::AutoAugment;
                        space.magnitude(step.op, bin, AUTOAUGMENT_BINS, height, width)
                    });
                    out = apply_op_owned(out, step.op, with_sign(step.op, magnitude, rng));
                }
            }
            Policy::RandAugment { num_ops, magnitude, num_magnitude_bins } => {
                let space = AugmentationSpace::RandAugment;
                let bins = (num_magnitude_bins as usize).max(1);
                let bin = (magnitude as usize).min(bins - 1);
                for _ in 0..num_ops {
                    let op = space.ops()[rng.random_range(0..space.ops().len())];
                    let magnitude = space.magnitude(op, bin, bins, height, width);
                    out = apply_op_owned(out, op, with_sign(op, magnitude, rng));
                }
            }
            Policy::TrivialAugmentWide { num_magnitude_bins } => {
                let space = AugmentationSpace::TrivialAugmentWide;
                let bins = (num_magnitude_bins as usize).max(1);
                let op = space.ops()[rng.random_range(0..space.ops().len())];
                let magnitude = if op.has_magnitude() {
                    space.magnitude(op, rng.random_range(0..bins), bins, height, width)
                } else {
                    None
                };
                out = apply_op_owned(out, op, with_sign(op, magnitude, rng));
            }
        }
        out
    }
}

/// [`apply_op`] on an image the caller gives away: the identity returns it, uncopied.
fn apply_op_owned(image: RgbImage, op: Op, magnitude: f64) -> RgbImage {
    match op {
        Op::Identity => image,
        _ => apply_op(&image, op, magnitude),
    }
}

/// The magnitude torchvision passes on: 0 without one, negated with probability 1/2 if signed.
fn with_sign(op: Op, magnitude: Option<f64>, rng: &mut ChaCha8Rng) -> f64 {
    match magnitude {
        None => 0.0,
        Some(value) if op.is_signed() && rng.random::<f64>() <= 0.5 => -value,
        Some(value) => value,
    }
}

/// Applies `op` at `magnitude` exactly as torchvision's `_apply_image_or_video_transform` does
/// for a PIL RGB image with NEAREST interpolation and fill 0. `magnitude` is what torchvision
/// passes: the shear factor, pixels to translate (truncated), degrees counter-clockwise, the
/// enhancement factor minus 1, posterize bits (truncated; PIL's 1..=8 enforced by clamping
/// rather than torchvision's error), solarize threshold as a fraction of 255; ignored by the
/// ops without one.
pub fn apply_op(image: &RgbImage, op: Op, magnitude: f64) -> RgbImage {
    let centre = [f64::from(image.width()) * 0.5, f64::from(image.height()) * 0.5];
    // torchvision shears by the angle atan(magnitude), in degrees, about the corner (0, 0).
    let shear_degrees = magnitude.atan() * RAD_TO_DEG;
    match op {
        Op::Identity => image.clone(),
        Op::ShearX => affine(image, inverse_affine_matrix([0.0, 0.0], [0.0, 0.0], [shear_degrees, 0.0])),
        Op::ShearY => affine(image, inverse_affine_matrix([0.0, 0.0], [0.0, 0.0], [0.0, shear_degrees])),
        Op::TranslateX => affine(image, inverse_affine_matrix(centre, [magnitude.trunc(), 0.0], [0.0, 0.0])),
        Op::TranslateY => affine(image, inverse_affine_matrix(centre, [0.0, magnitude.trunc()], [0.0, 0.0])),
        Op::Rotate => rotate(image, magnitude),
        Op::Brightness => blend(&RgbImage::new(image.width(), image.height()), image, 1.0 + magnitude),
        Op::Color => blend(&grayscale(image), image, 1.0 + magnitude),
        Op::Contrast => blend(&mean_grey(image), image, 1.0 + magnitude),
        Op::Sharpness => blend(&smooth(image), image, 1.0 + magnitude),
        Op::Posterize => {
            let bits = (magnitude.trunc() as i64).clamp(1, 8) as u32;
            let mask = 0xffu8 << (8 - bits);
            map_channels(image, |_| std::array::from_fn(|value| value as u8 & mask))
        }
        Op::Solarize => {
            let threshold = 255.0 * magnitude;
            map_channels(image, |_| {
                std::array::from_fn(
                    |value| if (value as f64) < threshold { value as u8 } else { 255 - value as u8 },
                )
            })
        }
        Op::AutoContrast => {
            let histograms = histograms(image);
            map_channels(image, |channel| autocontrast_lut(&histograms[channel]))
        }
        Op::Equalize => {
            let histograms = histograms(image);
            map_channels(image, |channel| equalize_lut(&histograms[channel]))
        }
        Op::Invert => map_channels(image, |_| std::array::from_fn(|value| 255 - value as u8)),
    }
}

// CPython's `math.radians`/`math.degrees` multiply by these constants.
const DEG_TO_RAD: f64 = std::f64::consts::PI / 180.0;
const RAD_TO_DEG: f64 = 180.0 / std::f64::consts::PI;

/// torchvision's `_get_inverse_affine_matrix` (angle 0, scale 1), operation for operation: the
/// output-to-input matrix Pillow's `Image.transform(AFFINE)` takes.
fn inverse_affine_matrix(centre: [f64; 2], translate: [f64; 2], shear_degrees: [f64; 2]) -> [f64; 6] {
    let rot = 0.0f64 * DEG_TO_RAD;
    let sx = shear_degrees[0] * DEG_TO_RAD;
    let sy = shear_degrees[1] * DEG_TO_RAD;
    let [cx, cy] = centre;
    let cos_sy = sy.cos();
    let tan_sx = sx.tan();
    let rot_minus_sy = rot - sy;
    let cx_plus_tx = cx + translate[0];
    let cy_plus_ty = cy + translate[1];
    let a = rot_minus_sy.cos() / cos_sy;
    let b = -(a * tan_sx + rot.sin());
    let c = rot_minus_sy.sin() / cos_sy;
    let d = rot.cos() - c * tan_sx;
    let mut m = [d, -b, 0.0, -c, a, 0.0];
    m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
    m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
    m
}

/// `Image.rotate(degrees, NEAREST, expand=False, fillcolor=0)`: Pillow's exact transposes for
/// multiples of 90 where the size allows, else its affine with the matrix rounded to 15 decimals.
fn rotate(image: &RgbImage, degrees: f64) -> RgbImage {
    let (width, height) = image.dimensions();
    // Python's `angle % 360.0`, which takes the divisor's sign.
    let remainder = degrees % 360.0;
    let angle = if remainder < 0.0 { remainder + 360.0 } else { remainder };
    if angle == 0.0 {
        return image.clone();
    }
    if angle == 180.0 {
        return remap(image, width, height, |x, y| (width - 1 - x, height - 1 - y));
    }
    if width == height && angle == 90.0 {
        return remap(image, height, width, |x, y| (width - 1 - y, x));
    }
    if width == height && angle == 270.0 {
        return remap(image, height, width, |x, y| (y, height - 1 - x));
    }
    let (cx, cy) = (f64::from(width) / 2.0, f64::from(height) / 2.0);
    let angle = -(angle * DEG_TO_RAD);
    let (cos, sin) = (round_15(angle.cos()), round_15(angle.sin()));
    let mut m = [cos, sin, 0.0, round_15(-angle.sin()), cos, 0.0];
    m[2] += m[0] * -cx + m[1] * -cy;
    m[5] += m[3] * -cx + m[4] * -cy;
    m[2] += cx;
    m[5] += cy;
    affine(image, m)
}

/// Python's `round(value, 15)`: correctly rounded to 15 decimals, as Rust's formatting is.
fn round_15(value: f64) -> f64 {
    format!("{value:.15}").parse().unwrap_or(value)
}

/// A same-size image whose pixel (x, y) is `image`'s pixel `source(x, y)`.
fn remap(image: &RgbImage, width: u32, height: u32, source: impl Fn(u32, u32) -> (u32, u32)) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        let (sx, sy) = source(x, y);
        *image.get_pixel(sx, sy)
    })
}

/// Pillow's `ImagingTransformAffine` for NEAREST into a same-size, zero-filled image. It picks
/// one of three samplers, which round differently, so all three are reproduced: a pure
/// scale/translate table, 16.16 fixed point when every corner maps within +-32768, and
/// floating point otherwise. Output pixel (x, y) samples input (a0 (x+.5) + a1 (y+.5) + a2, ...).
fn affine(image: &RgbImage, a: [f64; 6]) -> RgbImage {
    let (width, height) = image.dimensions();
    let (w, h) = (width as usize, height as usize);
    let src = image.as_raw();
    let mut out = RgbImage::new(width, height);
    let dst: &mut [u8] = &mut out;
    let mut copy = |x: usize, y: usize, sx: usize, sy: usize| {
        let (o, i) = (3 * (y * w + x), 3 * (sy * w + sx));
        dst[o..o + 3].copy_from_slice(&src[i..i + 3]);
    };

    if a[1] == 0.0 && a[3] == 0.0 {
        // ImagingScaleAffine: source columns tabulated once; a row's copy spans the first to the
        // last valid column.
        let mut columns = vec![0usize; w];
        let (mut first, mut end) = (w, 0);
        let mut xo = a[2] + a[0] * 0.5;
        for (x, column) in columns.iter_mut().enumerate() {
            if let Some(sx) = coord(xo, w) {
                end = x + 1;
                first = first.min(x);
                *column = sx;
            }
            xo += a[0];
        }
        let mut yo = a[5] + a[4] * 0.5;
        for y in 0..h {
            if let Some(sy) = coord(yo, h) {
                for (x, &sx) in columns.iter().enumerate().take(end).skip(first) {
                    copy(x, y, sx, sy);
                }
            }
            yo += a[4];
        }
        return out;
    }

    let within_fixed = |x: f64, y: f64| {
        (x * a[0] + y * a[1] + a[2]).abs() < 32768.0 && (x * a[3] + y * a[4] + a[5]).abs() < 32768.0
    };
    let (fw, fh) = (f64::from(width), f64::from(height));
    if within_fixed(0.0, 0.0) && within_fixed(fw, fh) && within_fixed(0.0, fh) && within_fixed(fw, 0.0) {
        // affine_fixed: C `int` arithmetic, so wrapping; `>> 16` floors like C's on negatives.
        let fix = |v: f64| {
            let v = v * 65536.0 + 0.5;
            (if v < 0.0 { v.floor() } else { v }) as i32
        };
        let (a0, a1, a3, a4) = (fix(a[0]), fix(a[1]), fix(a[3]), fix(a[4]));
        let mut row_x = fix(a[2] + a[0] * 0.5 + a[1] * 0.5);
        let mut row_y = fix(a[5] + a[3] * 0.5 + a[4] * 0.5);
        for y in 0..h {
            let (mut xx, mut yy) = (row_x, row_y);
            for x in 0..w {
                let (sx, sy) = (xx >> 16, yy >> 16);
                if (0..width as i64).contains(&i64::from(sx)) && (0..height as i64).contains(&i64::from(sy)) {
                    copy(x, y, sx as usize, sy as usize);
                }
                xx = xx.wrapping_add(a0);
                yy = yy.wrapping_add(a3);
            }
            row_x = row_x.wrapping_add(a1);
            row_y = row_y.wrapping_add(a4);
        }
        return out;
    }

    let mut xo = a[2] + a[1] * 0.5 + a[0] * 0.5;
    let mut yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
    for y in 0..h {
        let (mut xx, mut yy) = (xo, yo);
        for x in 0..w {
            if let (Some(sx), Some(sy)) = (coord(xx, w), coord(yy, h)) {
                copy(x, y, sx, sy);
            }
            xx += a[0];
            yy += a[3];
        }
        xo += a[1];
        yo += a[4];
    }
    out
}

/// Pillow's `COORD` (negative -> -1, else truncated) as an index, `None` when outside `size`.
fn coord(v: f64, size: usize) -> Option<usize> {
    if v.is_nan() || v < 0.0 {
        return None;
    }
    let index = v as u64;
    (index < size as u64).then_some(index as usize)
}

/// `Image.blend(degenerate, image, factor)`, the core of every `ImageEnhance`: C float32
/// arithmetic, truncated; clipped only when extrapolating, as Pillow does.
fn blend(degenerate: &RgbImage, image: &RgbImage, factor: f64) -> RgbImage {
    let alpha = factor as f32;
    if alpha == 0.0 {
        return degenerate.clone();
    }
    if alpha == 1.0 {
        return image.clone();
    }
    let interpolating = (0.0..=1.0).contains(&alpha);
    let mut out = image.clone();
    for (value, &from) in out.iter_mut().zip(degenerate.iter()) {
        let blended = f32::from(from) + alpha * (i32::from(*value) - i32::from(from)) as f32;
        *value = if interpolating || (0.0 < blended && blended < 255.0) {
            blended as u8
        } else if blended <= 0.0 {
            0
        } else {
            255
        };
    }
    out
}

/// Pillow's RGB -> L: ITU-R 601-2 luma in 16.16 fixed point, rounded.
fn luma(pixel: &[u8]) -> u8 {
    let [r, g, b] = [pixel[0], pixel[1], pixel[2]].map(u32::from);
    ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16) as u8
}

/// `image.convert("L").convert("RGB")`, ImageEnhance.Color's degenerate image.
fn grayscale(image: &RgbImage) -> RgbImage {
    RgbImage::from_fn(image.width(), image.height(), |x, y| {
        let l = luma(&image.get_pixel(x, y).0);
        image::Rgb([l, l, l])
    })
}

/// ImageEnhance.Contrast's degenerate image: a constant grey, the mean of the L image from its
/// histogram (`ImageStat`), rounded with `int(mean + 0.5)`.
fn mean_grey(image: &RgbImage) -> RgbImage {
    let (sum, count) = image
        .chunks_exact(3)
        .fold((0u64, 0u64), |(sum, count), pixel| (sum + u64::from(luma(pixel)), count + 1));
    let mean = if count == 0 { 0.0 } else { sum as f64 / count as f64 };
    let grey = (mean + 0.5) as u8;
    RgbImage::from_pixel(image.width(), image.height(), image::Rgb([grey, grey, grey]))
}

/// `image.filter(ImageFilter.SMOOTH)`, ImageEnhance.Sharpness's degenerate image: Pillow's 3x3
/// kernel [1 1 1; 1 5 1; 1 1 1] / 13 in float32 with +0.5 for rounding; the border pixels (and
/// images under 3x3) are copied unfiltered.
fn smooth(image: &RgbImage) -> RgbImage {
    let (w, h) = (image.width() as usize, image.height() as usize);
    let mut out = image.clone();
    if w < 3 || h < 3 {
        return out;
    }
    let (edge, centre) = (1.0f32 / 13.0, 5.0f32 / 13.0);
    let src = image.as_raw();
    let dst: &mut [u8] = &mut out;
    let row_len = 3 * w;
    for y in 1..h - 1 {
        let row = |dy: usize| &src[(y + dy - 1) * row_len..(y + dy) * row_len];
        let (above, middle, below) = (row(0), row(1), row(2));
        for i in 3..row_len - 3 {
            let taps = |r: &[u8], k: [f32; 3]| {
                f32::from(r[i - 3]) * k[0] + f32::from(r[i]) * k[1] + f32::from(r[i + 3]) * k[2]
            };
            // Pillow sums the row below first, then the middle, then the row above.
            let mut sum = 0.5f32;
            sum += taps(below, [edge; 3]);
            sum += taps(middle, [edge, centre, edge]);
            sum += taps(above, [edge; 3]);
            dst[y * row_len + i] = sum.clamp(0.0, 255.0) as u8;
        }
    }
    out
}

/// 256-bin histograms of the R, G and B channels.
fn histograms(image: &RgbImage) -> [[u64; 256]; 3] {
    let mut histograms = [[0u64; 256]; 3];
    for pixel in image.chunks_exact(3) {
        for (histogram, &value) in histograms.iter_mut().zip(pixel) {
            histogram[usize::from(value)] += 1;
        }
    }
    histograms
}

/// ImageOps.autocontrast (no cutoff): stretch [lowest, highest] used value to [0, 255].
fn autocontrast_lut(histogram: &[u64; 256]) -> [u8; 256] {
    let lo = histogram.iter().position(|&count| count > 0).unwrap_or(255);
    let hi = histogram.iter().rposition(|&count| count > 0).unwrap_or(0);
    if hi <= lo {
        return std::array::from_fn(|value| value as u8);
    }
    let scale = 255.0 / (hi - lo) as f64;
    let offset = -(lo as f64) * scale;
    std::array::from_fn(|value| (value as f64 * scale + offset).clamp(0.0, 255.0) as u8)
}

/// ImageOps.equalize: integer arithmetic over the histogram; Pillow clips the table to 255.
fn equalize_lut(histogram: &[u64; 256]) -> [u8; 256] {
    let identity = std::array::from_fn(|value| value as u8);
    let used: Vec<u64> = histogram.iter().copied().filter(|&count| count > 0).collect();
    let (Some(&last), true) = (used.last(), used.len() > 1) else {
        return identity;
    };
    let step = (used.iter().sum::<u64>() - last) / 255;
    if step == 0 {
        return identity;
    }
    let mut n = step / 2;
    std::array::from_fn(|value| {
        let mapped = (n / step).min(255) as u8;
        n += histogram[value];
        mapped
    })
}

/// `Image.point` with one 256-entry table per channel.
fn map_channels(image: &RgbImage, lut: impl Fn(usize) -> [u8; 256]) -> RgbImage {
    let tables = [lut(0), lut(1), lut(2)];
    let mut out = image.clone();
    for pixel in out.chunks_exact_mut(3) {
        for (value, table) in pixel.iter_mut().zip(&tables) {
            *value = table[usize::from(*value)];
        }
    }
    out
}
