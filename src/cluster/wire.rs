//! Compressed gradients on the wire (`dist.compress`): fp32 gradients divided by the world size
//! and rounded (to nearest, ties to even) to bf16 or fp16, summed over the ranks in that
//! format, and widened back. Dividing first is what keeps fp16 from overflowing: the sum of
//! the ranks' shares is the average, no larger than the largest gradient. Every addition the
//! all-reduce makes is rounded to the wire format, as NCCL's and gloo's half-precision sums
//! are (PyTorch DDP's `bf16_compress_hook` reduces the same way).

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};

pub use crate::config::GradCompression;

/// A 16-bit wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Bf16,
    Fp16,
}

impl Wire {
    /// The wire format of a setting (None: fp32, uncompressed).
    pub fn of(setting: GradCompression) -> Option<Wire> {
        match setting {
            GradCompression::None => None,
            GradCompression::Bf16 => Some(Wire::Bf16),
            GradCompression::Fp16 => Some(Wire::Fp16),
        }
    }

    pub fn encode(self, value: f32) -> u16 {
        match self {
            Wire::Bf16 => bf16::from_f32(value).to_bits(),
            Wire::Fp16 => f16::from_f32(value).to_bits(),
        }
    }

    pub fn decode(self, bits: u16) -> f32 {
        match self {
            Wire::Bf16 => bf16::from_bits(bits).to_f32(),
            Wire::Fp16 => f16::from_bits(bits).to_f32(),
        }
    }

    /// `values` times `scale` (in place: the caller's buffer is overwritten with the mean
    /// afterwards), rounded to the wire format, into `out` (resized to fit).
    pub fn encode_scaled(self, values: &mut [f32], scale: f32, out: &mut Vec<u16>) {
        values.iter_mut().for_each(|v| *v *= scale);
        out.resize(values.len(), 0);
        self.encode_into(values, out);
    }

    /// Rounds `values` to the wire format into `out` (of the same length). Whole slices at a
    /// time: bf16 with branch-free bit arithmetic the compiler vectorises, fp16 with `half`'s
    /// slice conversion (the CPU's F16C instructions where it has them).
    pub fn encode_into(self, values: &[f32], out: &mut [u16]) {
        match self {
            Wire::Bf16 => out.iter_mut().zip(values).for_each(|(o, &v)| *o = bf16_bits(v)),
            Wire::Fp16 => out.reinterpret_cast_mut::<f16>().convert_from_f32_slice(values),
        }
    }

    pub fn decode_into(self, bits: &[u16], out: &mut [f32]) {
        match self {
            Wire::Bf16 => {
                out.iter_mut().zip(bits).for_each(|(o, &b)| *o = f32::from_bits(u32::from(b) << 16))
            }
            Wire::Fp16 => bits.reinterpret_cast::<f16>().convert_to_f32_slice(out),
        }
    }

    /// `into[i] += from[i]`, rounded to the wire format: the reduction the all-reduce applies.
    pub fn add_into(self, from: &[u16], into: &mut [u16]) {
        const CHUNK: usize = 1024;
        let (mut a, mut b) = ([0f32; CHUNK], [0f32; CHUNK]);
        for (from, into) in from.chunks(CHUNK).zip(into.chunks_mut(CHUNK)) {
            let n = from.len().min(into.len());
            self.decode_into(&from[..n], &mut a[..n]);
            self.decode_into(&into[..n], &mut b[..n]);
            a[..n].iter_mut().zip(&b[..n]).for_each(|(x, y)| *x += y);
            self.encode_into(&a[..n], &mut into[..n]);
        }
    }

    /// The distance between `value` and the next larger-magnitude value of the wire format at
    /// `value`'s magnitude (its unit in the last place).
    pub fn ulp(self, value: f32) -> f32 {
        let magnitude = self.decode(self.encode(value.abs()));
        let above = match self {
            Wire::Bf16 => bf16::from_bits(bf16::from_f32(magnitude).to_bits() + 1).to_f32(),
            Wire::Fp16 => f16::from_bits(f16::from_f32(magnitude).to_bits() + 1).to_f32(),
        };
        above - magnitude
    }

    /// Bytes per value on the wire.
    pub const BYTES: usize = 2;
}

/// bf16's bits for `value`, rounded to nearest with ties to even (as `half::bf16::from_f32`,
/// which the tests hold it to), written without branches so that loops over it vectorise.
fn bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
    // A NaN stays a (quiet) NaN; rounding its payload could carry it into infinity.
    let nan = ((bits >> 16) | 0x40) as u16;
    if value.is_nan() {
        nan
    } else {
        rounded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even_and_decoding_is_exact() {
        // 1 + 2^-8 lies halfway between bf16's 1.0 and 1.0078125: ties go to even (1.0).
        assert_eq!(Wire::Bf16.decode(Wire::Bf16.encode(1.0 + 2f32.powi(-8))), 1.0);
        assert_eq!(Wire::Bf16.decode(Wire::Bf16.encode(1.0 + 3.0 * 2f32.powi(-8))), 1.015625);
        // fp16 has 10 fraction bits: 1 + 2^-10 is exact, 1 + 2^-11 a tie that goes to 1.0.
        assert_eq!(Wire::Fp16.decode(Wire::Fp16.encode(1.0 + 2f32.powi(-10))), 1.0 + 2f32.powi(-10));
        assert_eq!(Wire::Fp16.decode(Wire::Fp16.encode(1.0 + 2f32.powi(-11))), 1.0);
        assert_eq!(Wire::Fp16.decode(Wire::Fp16.encode(1e5)), f32::INFINITY, "past fp16's range");
        assert_eq!(Wire::Bf16.ulp(1.0), 2f32.powi(-7));
        assert_eq!(Wire::Fp16.ulp(-3.0), 2f32.powi(-9));
    }

    #[test]
    fn bf16_rounding_equals_the_half_crates() {
        let mut state = 0x1234_5678u32;
        let specials =
            [0.0f32, -0.0, 1.0, f32::MAX, f32::MIN_POSITIVE, 1e-40, f32::INFINITY, f32::NAN, 3.0e38];
        let randoms = (0..100_000).map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            f32::from_bits(state)
        });
        for value in specials.into_iter().chain(randoms) {
            let ours = bf16::from_bits(bf16_bits(value));
            let theirs = bf16::from_f32(value);
            assert!(
                ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()),
                "{value:e}: {ours} vs {theirs}"
            );
        }
    }

    #[test]
    fn scaled_shares_sum_to_the_rounded_mean() {
        let (a, b) = ([0.75f32, 3.0e-3, -1.5, 1.0e4], [0.25f32, 1.0e-3, -0.5, 3.0e4]);
        for wire in [Wire::Bf16, Wire::Fp16] {
            let (mut x, mut y) = (Vec::new(), Vec::new());
            wire.encode_scaled(&mut a.clone(), 0.5, &mut x);
            wire.encode_scaled(&mut b.clone(), 0.5, &mut y);
            wire.add_into(&x, &mut y);
            let mut mean = [0f32; 4];
            wire.decode_into(&y, &mut mean);
            for i in 0..4 {
                let exact = (a[i] + b[i]) / 2.0;
                let rounded = wire.decode(wire.encode(exact));
                assert!(
                    (mean[i] - rounded).abs() <= wire.ulp(exact),
                    "{wire:?} {i}: {} vs {rounded}",
                    mean[i]
                );
            }
            // Pre-dividing keeps fp16's sum in range: 1e4 + 3e4 alone would be fine, but the
            // average of two values near fp16's limit must not overflow either.
            let (mut big, mut other) = (Vec::new(), Vec::new());
            wire.encode_scaled(&mut [60000.0], 0.5, &mut big);
            wire.encode_scaled(&mut [60000.0], 0.5, &mut other);
            wire.add_into(&other, &mut big);
            assert!(wire.decode(big[0]).is_finite(), "{wire:?}");
        }
    }
}
