//! Camera and phone photographs of the synthetic facades, shaped like the DesignSafe case
//! study's data: large JPEGs of mixed sizes (24-megapixel camera frames, 12-megapixel phone
//! shots, small resized copies), at the qualities and chroma subsampling those devices write,
//! the phone and camera portraits stored sideways with an Exif orientation tag.
//!
//! This module owns the mix of photo kinds and making one photo of a scene that
//! [`super::synth`] rendered at [`SCENE_SIDE`] pixels (drawing it at 24 megapixels would take
//! seconds and add nothing): the scene is cut to the photo's aspect ratio, enlarged to its size
//! with a sensor's fine grain (so the JPEG holds as much detail, and costs as much to decode,
//! as a real photo of that size), turned as the device stores it, and encoded.

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::data::encode::{encode_jpeg, EncodeError, Subsampling};
use crate::data::orientation::{exif_block, Orientation};

/// One kind of photo in the mix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhotoKind {
    /// What it stands for, for the dataset's README.
    pub name: &'static str,
    /// Displayed (upright) width and height at `photo_scale` 1.
    pub width: u32,
    pub height: u32,
    pub quality: u8,
    pub subsampling: Subsampling,
    /// How the device stores it; an orientation other than upright is written as an Exif tag.
    pub orientation: Orientation,
    /// Whether the file carries an Exif block at all (cameras and phones do, resized copies not).
    pub exif: bool,
    /// Share of the photos of this kind, in percent.
    pub percent: u32,
}

/// The mix: about half of the photos are 24-megapixel camera frames, a third 12-megapixel
/// phone shots (half of them portraits stored sideways), the rest small copies such as
/// messaging apps and web pages keep.
pub const KINDS: [PhotoKind; 6] = [
    PhotoKind {
        name: "camera, landscape",
        width: 6000,
        height: 4000,
        quality: 95,
        subsampling: Subsampling::Half,
        orientation: Orientation::Upright,
        exif: true,
        percent: 35,
    },
    PhotoKind {
        name: "camera, portrait (stored sideways, Exif orientation 8)",
        width: 4000,
        height: 6000,
        quality: 95,
        subsampling: Subsampling::Half,
        orientation: Orientation::TurnedLeft,
        exif: true,
        percent: 10,
    },
    PhotoKind {
        name: "phone, landscape",
        width: 4032,
        height: 3024,
        quality: 92,
        subsampling: Subsampling::Quarter,
        orientation: Orientation::Upright,
        exif: true,
        percent: 15,
    },
    PhotoKind {
        name: "phone, portrait (stored sideways, Exif orientation 6)",
        width: 3024,
        height: 4032,
        quality: 92,
        subsampling: Subsampling::Quarter,
        orientation: Orientation::TurnedRight,
        exif: true,
        percent: 20,
    },
    PhotoKind {
        name: "resized copy, portrait",
        width: 608,
        height: 1080,
        quality: 85,
        subsampling: Subsampling::Quarter,
        orientation: Orientation::Upright,
        exif: false,
        percent: 10,
    },
    PhotoKind {
        name: "resized copy, landscape",
        width: 1024,
        height: 768,
        quality: 85,
        subsampling: Subsampling::Quarter,
        orientation: Orientation::Upright,
        exif: false,
        percent: 10,
    },
];

/// The side the scene is drawn at before it is enlarged to the photo's size.
pub const SCENE_SIDE: u32 = 512;

/// The kind of photo number `draw` (a uniform random number) picks from the mix.
pub fn pick(draw: u32) -> &'static PhotoKind {
    let mut at = draw % 100;
    for kind in &KINDS {
        if at < kind.percent {
            return kind;
        }
        at -= kind.percent;
    }
    &KINDS[0]
}

/// The displayed size of a photo of `kind` at `scale` (at least 16 pixels a side).
pub fn displayed_size(kind: &PhotoKind, scale: f64) -> (u32, u32) {
    let side = |len: u32| ((f64::from(len) * scale).round() as u32).max(16);
    (side(kind.width), side(kind.height))
}

/// The square `scene` shot as a `kind` photo at `scale` times its size: a JPEG file's bytes.
/// Its grain is drawn from `rng`.
pub fn shoot(
    scene: &image::RgbImage,
    kind: &PhotoKind,
    scale: f64,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<u8>, EncodeError> {
    let (width, height) = displayed_size(kind, scale);
    let upright = enlarge(scene, width, height, rng);
    let (stored_w, stored_h) = kind.orientation.displayed_size(width, height);
    let stored = kind.orientation.store(&upright, stored_w, stored_h);
    let exif = if kind.exif { exif_block(kind.orientation) } else { Vec::new() };
    encode_jpeg(&stored, stored_w, stored_h, kind.quality, kind.subsampling, &exif)
}

/// The centre of the square `scene` cut to `width`:`height` and enlarged to that size
/// (bilinear), with sensor grain of a few grey levels: packed RGB rows.
fn enlarge(scene: &image::RgbImage, width: u32, height: u32, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let side = f64::from(scene.width());
    // The largest centred rectangle of the photo's aspect inside the square.
    let aspect = f64::from(width) / f64::from(height);
    let (cut_w, cut_h) = if aspect >= 1.0 { (side, side / aspect) } else { (side * aspect, side) };
    let (x0, y0) = ((side - cut_w) / 2.0, (side - cut_h) / 2.0);
    let last = scene.width() as usize - 1;
    let raw = scene.as_raw();
    let stride = scene.width() as usize * 3;
    // Per output column: the two source columns and the weight of the right one.
    let columns: Vec<(usize, usize, f32)> = (0..width)
        .map(|x| {
            let at = (x0 + (f64::from(x) + 0.5) * cut_w / f64::from(width) - 0.5).clamp(0.0, last as f64);
            let left = at.floor() as usize;
            (left * 3, (left + 1).min(last) * 3, (at - at.floor()) as f32)
        })
        .collect();
    let mut grain = ChaCha8Rng::seed_from_u64(rng.next_u64());
    let strength: f32 = rng.random_range(2.0..5.0);
    let mut out = vec![0u8; width as usize * height as usize * 3];
    let mut noise = vec![0u8; width as usize * 3];
    for (y, row) in out.chunks_exact_mut(width as usize * 3).enumerate() {
        let at = (y0 + (y as f64 + 0.5) * cut_h / f64::from(height) - 0.5).clamp(0.0, last as f64);
        let top = at.floor() as usize;
        let (upper, lower) = (&raw[top * stride..][..stride], &raw[(top + 1).min(last) * stride..][..stride]);
        let down = (at - at.floor()) as f32;
        grain.fill_bytes(&mut noise);
        for ((px, &(left, right, across)), bits) in
            row.chunks_exact_mut(3).zip(&columns).zip(noise.chunks_exact(3))
        {
            for c in 0..3 {
                let lerp = |a: u8, b: u8| f32::from(a) + (f32::from(b) - f32::from(a)) * across;
                let value = lerp(upper[left + c], upper[right + c])
                    + (lerp(lower[left + c], lower[right + c]) - lerp(upper[left + c], upper[right + c]))
                        * down;
                let jitter = (f32::from(bits[c]) / 255.0 - 0.5) * 2.0 * strength;
                px[c] = (value + jitter).round().clamp(0.0, 255.0) as u8;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::decode::{decode_whole, DecodeOptions};
    use crate::ingest::synth::photo;

    #[test]
    fn the_mix_adds_up_and_every_kind_is_picked() {
        assert_eq!(KINDS.iter().map(|k| k.percent).sum::<u32>(), 100);
        for kind in &KINDS {
            assert!((0..100).any(|draw| pick(draw) == kind), "{}", kind.name);
        }
    }

    #[test]
    fn a_phone_portrait_is_stored_sideways_and_shown_upright() {
        let kind = KINDS.iter().find(|k| k.orientation == Orientation::TurnedRight).unwrap();
        let bytes = photo(2, kind, 0.05, &mut ChaCha8Rng::seed_from_u64(3)).unwrap();
        let (width, height) = displayed_size(kind, 0.05);
        assert!(height > width);
        let stored = decode_whole(&bytes, DecodeOptions::default(), |_, _| 1).unwrap();
        assert_eq!(stored.dimensions(), (height, width), "stored sideways");
        let shown = decode_whole(
            &bytes,
            DecodeOptions { exif_orientation: true, ..DecodeOptions::default() },
            |_, _| 1,
        )
        .unwrap();
        assert_eq!(shown.dimensions(), (width, height), "shown upright");
        // The sky is at the top of the upright photo: its first rows are brighter than its last.
        let luma = |img: &image::RgbImage, rows: std::ops::Range<u32>| {
            let values: Vec<f64> = rows
                .flat_map(|y| (0..img.width()).map(move |x| (x, y)))
                .map(|(x, y)| img.get_pixel(x, y).0.iter().map(|&v| f64::from(v)).sum::<f64>())
                .collect();
            values.iter().sum::<f64>() / values.len() as f64
        };
        assert!(luma(&shown, 0..height / 10) > luma(&shown, height * 9 / 10..height));
    }
}
