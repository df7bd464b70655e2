//! PIL's antialiased bilinear ("triangle") filter in PIL's own fixed-point arithmetic
//! (`Resample.c`): horizontal pass, round to 8 bits, vertical pass, round; the pass order
//! chosen as Pillow chooses it. The output matches torchvision + Pillow bit for bit given the
//! same source segment, and goes either to normalised CHW planes (a network input) or to 8-bit
//! RGB rows (`data prepare --resize`).

use super::{Crop, IMAGENET_MEAN, IMAGENET_STD};

/// The source segment an axis resamples: `len` pixels from `start`, in pixels of the image as
/// decoded. Whole pixels at full size; fractions once the image is decoded reduced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Segment {
    start: f64,
    len: f64,
}

impl Segment {
    pub(super) fn whole(start: u32, len: u32) -> Self {
        Self { start: f64::from(start), len: f64::from(len) }
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
pub(super) struct Axis {
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
    pub(super) fn new(segment: Segment, dst_len: u32, win_start: i64, win_len: u32) -> Self {
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
    pub(super) fn reduced(&self, reduction: u32) -> Self {
        let r = f64::from(reduction);
        let segment = Segment { start: self.segment.start / r, len: self.segment.len / r };
        Self::new(segment, self.dst_len, self.win_start, self.win_len)
    }

    /// Source pixels per output pixel: how far the image could be reduced before the axis
    /// had fewer pixels than it writes.
    pub(super) fn source_per_output(&self) -> f64 {
        self.segment.len / f64::from(self.dst_len.max(1))
    }

    /// Source indices `[lo, hi)` that any non-padding window position reads, if any.
    pub(super) fn source_range(&self) -> Option<(usize, usize)> {
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
pub(super) type Table = [[f32; 256]; 3];

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
pub(super) fn table(normalize: bool) -> &'static Table {
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
pub(super) fn resample(src: &[u8], region: Crop, x: &Axis, y: &Axis, mut sink: Sink) {
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
pub(super) struct Sink<'a> {
    target: Target<'a>,
    width: usize,
    flip: bool,
}

impl<'a> Sink<'a> {
    /// Into `size` x `size` CHW planes of values looked up in `table`.
    pub(super) fn new(out: &'a mut [f32], size: usize, flip: bool, table: &'static Table) -> Self {
        let (red, rest) = out.split_at_mut(size * size);
        let (green, blue) = rest.split_at_mut(size * size);
        Self { target: Target::Planes { red, green, blue, table }, width: size, flip }
    }

    /// Into packed RGB rows `width` pixels long.
    fn rgb(out: &'a mut [u8], width: usize) -> Self {
        Self { target: Target::Rgb(out), width, flip: false }
    }

    /// Every output pixel black, as padding gives.
    pub(super) fn fill_black(&mut self) {
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
    use crate::data::transforms::tests::{normalised, whole};
    use image::RgbImage;

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
}
