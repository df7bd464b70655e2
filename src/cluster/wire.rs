//! Compressed gradients on the wire (`dist.compress`): fp32 gradients divided by the world size
//! and rounded (to nearest, ties to even) to bf16 or fp16, summed over the ranks in that
//! format, and widened back. Dividing first is what keeps fp16 from overflowing: the sum of
//! the ranks' shares is the average, no larger than the largest gradient. Every addition the
//! all-reduce makes is rounded to the wire format, as NCCL's and gloo's half-precision sums
//! are (PyTorch DDP's `bf16_compress_hook` reduces the same way).

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use multiversion::multiversion;

use crate::config::GradCompression;

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

    /// `values` times `scale`, rounded to the wire format, into `out` (of the same length).
    /// One pass, without writing `values`: the scaled fp32 copy is never stored.
    pub fn encode_scaled(self, values: &[f32], scale: f32, out: &mut [u16]) {
        match self {
            Wire::Bf16 => bf16_encode_scaled(values, scale, out),
            Wire::Fp16 => {
                let mut scaled = [0f32; CHUNK];
                for (values, out) in values.chunks(CHUNK).zip(out.chunks_mut(CHUNK)) {
                    let scaled = &mut scaled[..values.len()];
                    scaled.iter_mut().zip(values).for_each(|(s, &v)| *s = v * scale);
                    self.encode_into(scaled, out);
                }
            }
        }
    }

    /// Rounds `values` to the wire format into `out` (of the same length): bf16 with
    /// branch-free bit arithmetic, fp16 with `half`'s slice conversion (the CPU's F16C
    /// instructions where it has them).
    pub fn encode_into(self, values: &[f32], out: &mut [u16]) {
        match self {
            Wire::Bf16 => bf16_encode_scaled(values, 1.0, out),
            Wire::Fp16 => out.reinterpret_cast_mut::<f16>().convert_from_f32_slice(values),
        }
    }

    pub fn decode_into(self, bits: &[u16], out: &mut [f32]) {
        match self {
            Wire::Bf16 => bf16_decode(bits, out),
            Wire::Fp16 => bits.reinterpret_cast::<f16>().convert_to_f32_slice(out),
        }
    }

    /// `into[i] += from[i]`, rounded to the wire format: the reduction the all-reduce applies.
    pub fn add_into(self, from: &[u16], into: &mut [u16]) {
        match self {
            Wire::Bf16 => bf16_add(from, into),
            Wire::Fp16 => {
                let (mut a, mut b) = ([0f32; CHUNK], [0f32; CHUNK]);
                for (from, into) in from.chunks(CHUNK).zip(into.chunks_mut(CHUNK)) {
                    let n = from.len().min(into.len());
                    self.decode_into(&from[..n], &mut a[..n]);
                    self.decode_into(&into[..n], &mut b[..n]);
                    a[..n].iter_mut().zip(&b[..n]).for_each(|(x, y)| *x += y);
                    self.encode_into(&a[..n], &mut into[..n]);
                }
            }
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

/// Values per step of the fp16 loops, which go through fp32 buffers on the stack (L1-sized).
const CHUNK: usize = 1024;

// The bf16 loops are the communication thread's whole cost on a fast link (three passes over
// every gradient per all-reduce), so each is compiled for the CPU's widest vectors as well and
// picked at run time (`multiversion`): AVX2 does 8 values per instruction where the baseline
// x86-64 build does 4. Each is one pass, with no intermediate buffer.

#[multiversion(targets = "simd")]
fn bf16_encode_scaled(values: &[f32], scale: f32, out: &mut [u16]) {
    out.iter_mut().zip(values).for_each(|(o, &v)| *o = bf16_bits(v * scale));
}

#[multiversion(targets = "simd")]
fn bf16_decode(bits: &[u16], out: &mut [f32]) {
    out.iter_mut().zip(bits).for_each(|(o, &b)| *o = bf16_value(b));
}

#[multiversion(targets = "simd")]
fn bf16_add(from: &[u16], into: &mut [u16]) {
    into.iter_mut().zip(from).for_each(|(i, &f)| *i = bf16_bits(bf16_value(*i) + bf16_value(f)));
}

/// bf16 widened to f32 (exact: bf16 is f32's upper half).
#[inline(always)]
fn bf16_value(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// bf16's bits for `value`, rounded to nearest with ties to even (as `half::bf16::from_f32`,
/// which the tests hold it to), written without branches so that loops over it vectorise.
#[inline(always)]
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
            let (mut x, mut y) = ([0u16; 4], [0u16; 4]);
            wire.encode_scaled(&a, 0.5, &mut x);
            wire.encode_scaled(&b, 0.5, &mut y);
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
            let (mut big, mut other) = ([0u16], [0u16]);
            wire.encode_scaled(&[60000.0], 0.5, &mut big);
            wire.encode_scaled(&[60000.0], 0.5, &mut other);
            wire.add_into(&other, &mut big);
            assert!(wire.decode(big[0]).is_finite(), "{wire:?}");
        }
    }

    /// The slice loops (compiled for the CPU's vector width) against the definitions one value
    /// at a time through `half`: scaling then rounding, widening, and the rounded sum. Lengths
    /// that are not a multiple of any vector width exercise the loops' tails.
    #[test]
    fn slice_loops_equal_the_scalar_definitions() {
        let mut state = 0x9e37_79b9u32;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        let specials = [0.0f32, -0.0, 1.0, -2.5e-3, f32::MAX, f32::MIN_POSITIVE, 1e-40, f32::INFINITY];
        let mut values = specials.to_vec();
        for _ in 0..5000 {
            values.push(f32::from_bits(next()));
            values.push((next() as f32 / u32::MAX as f32 - 0.5) * 1e-3);
        }
        values.retain(|v| !v.is_nan());
        for wire in [Wire::Bf16, Wire::Fp16] {
            for len in [values.len(), 1, 7, 17, 1031] {
                let values = &values[..len];
                let mut encoded = vec![0u16; len];
                wire.encode_scaled(values, 0.5, &mut encoded);
                let expected: Vec<u16> = values.iter().map(|&v| wire.encode(v * 0.5)).collect();
                assert_eq!(encoded, expected, "{wire:?} encode_scaled, {len} values");

                let mut widened = vec![0f32; len];
                wire.decode_into(&encoded, &mut widened);
                let expected: Vec<f32> = encoded.iter().map(|&b| wire.decode(b)).collect();
                assert_eq!(widened, expected, "{wire:?} decode_into, {len} values");

                let mut other: Vec<u16> = encoded.iter().rev().copied().collect();
                let expected: Vec<u16> = other
                    .iter()
                    .zip(&encoded)
                    .map(|(&a, &b)| wire.encode(wire.decode(a) + wire.decode(b)))
                    .collect();
                wire.add_into(&encoded, &mut other);
                let same = other
                    .iter()
                    .zip(&expected)
                    .all(|(&a, &b)| a == b || (wire.decode(a).is_nan() && wire.decode(b).is_nan()));
                assert!(same, "{wire:?} add_into, {len} values");
            }
        }
    }
}
