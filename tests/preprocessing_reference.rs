//! rtrain's preprocessing gives torchvision + Pillow's tensors bit for bit, from the file on
//! disk: JPEG decoding (baseline 4:2:0, 4:2:2 and 4:4:4, progressive, greyscale) and PNG, the
//! eval transform, and resized crops with and without a flip, through both the region decode
//! the loader uses and a whole-image decode. tests/reference/pil_preprocess.py writes the
//! images and torchvision's outputs. DCT-scaled decoding (`data.jpeg_draft`) is checked against
//! Pillow's `draft` and the full decode, and the Exif orientation against Pillow's
//! `exif_transpose` (tests/reference/draft_exif.py).

use crate::common;

use rand::{Rng, SeedableRng};
use rtrain::data::decode::{
    decode, decode_region, decode_request, decode_whole, DecodeOptions, Request, DEFAULT_MAX_IMAGE_PIXELS,
};
use rtrain::data::loader::transform_encoded;
use rtrain::data::transforms::{sample_rng, Augment, Crop, DrawnTransform, Geometry, Transform};
use rtrain::ingest::photos::KINDS;
use rtrain::ingest::synth::photo;
use rtrain::util::files::read_safetensors;
use tch::Tensor;

/// Photos shown upright by their Exif orientation, at the default pixel limit.
const UPRIGHT: DecodeOptions = DecodeOptions { exif_orientation: true, max_pixels: DEFAULT_MAX_IMAGE_PIXELS };

#[derive(serde::Deserialize)]
struct Case {
    key: String,
    file: String,
    size: u32,
    resize: Option<u32>,
    /// top, left, height, width
    crop: Option<[u32; 4]>,
    flip: Option<bool>,
}

impl Case {
    fn plan(&self, width: u32, height: u32) -> DrawnTransform {
        match (self.resize, self.crop) {
            (Some(resize), None) => {
                let transform = Transform::eval(self.size, resize);
                DrawnTransform::new(width, height, &transform, &mut sample_rng(0, 0, 0))
            }
            (None, Some([top, left, height, width])) => DrawnTransform::resized_crop(
                Crop { top, left, height, width },
                self.size,
                self.flip.unwrap_or(false),
            ),
            _ => panic!("case {} is neither an eval transform nor a crop", self.key),
        }
    }
}

#[test]
fn decoding_and_transforms_match_torchvision_and_pillow_exactly() {
    let dir = tempfile::tempdir().unwrap();
    common::run_python("pil_preprocess.py", &[dir.path().as_os_str()]);
    let cases: Vec<Case> =
        serde_json::from_slice(&std::fs::read(dir.path().join("cases.json")).unwrap()).unwrap();
    let expected = read_safetensors(&dir.path().join("expected.safetensors")).unwrap().tensors;
    assert_eq!(cases.len(), 60, "6 flavours x 2 sizes x 5 transforms");
    let mut mismatches = Vec::new();
    for case in &cases {
        let bytes = std::fs::read(dir.path().join(&case.file)).unwrap();
        let len = 3 * (case.size * case.size) as usize;

        // As the loader does it: the plan from the header, then only its pixels decoded.
        let mut plan = None;
        let region = decode_region(&bytes, |width, height| {
            let drawn = case.plan(width, height);
            let source = drawn.source();
            plan = Some(drawn);
            source
        })
        .unwrap();
        let mut from_region = vec![0f32; len];
        plan.unwrap().render(&region.pixels, region.rect, &mut from_region);

        // The whole image decoded, as evaluation and prediction of single files do.
        let whole = decode(&bytes).unwrap();
        let (width, height) = whole.dimensions();
        let mut from_whole = vec![0f32; len];
        case.plan(width, height).render(
            whole.as_raw(),
            Crop { top: 0, left: 0, height, width },
            &mut from_whole,
        );
        let differ = from_region.iter().zip(&from_whole).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{}: region and whole-image decoding differ in {differ} values", case.key);

        let theirs = &expected[&case.key];
        let ours = Tensor::from_slice(&from_region).view([3, i64::from(case.size), i64::from(case.size)]);
        let differ = ours.ne_tensor(theirs).sum(tch::Kind::Int64).int64_value(&[]);
        if differ > 0 {
            let max = (&ours - theirs).abs().max().double_value(&[]);
            mismatches.push(format!("{}: {differ} values differ, by up to {max}", case.key));
        }
    }
    assert!(mismatches.is_empty(), "differences from torchvision + Pillow:\n{}", mismatches.join("\n"));

    // Any rectangle, not only the ones these transforms read: the region decode gives the same
    // pixels as the whole image, in every flavour (chroma subsampling makes the edges of a
    // column crop differ unless the decoder crops wider).
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    for case in cases.iter().filter(|c| c.key.ends_with("/eval")) {
        let bytes = std::fs::read(dir.path().join(&case.file)).unwrap();
        let whole = decode(&bytes).unwrap();
        let (width, height) = whole.dimensions();
        for _ in 0..50 {
            let (left, top) = (rng.random_range(0..width), rng.random_range(0..height));
            let rect = Crop {
                left,
                top,
                width: rng.random_range(1..=width - left),
                height: rng.random_range(1..=height - top),
            };
            let region = decode_region(&bytes, |_, _| Some(rect)).unwrap();
            let (w, h) = (region.rect.width as usize, region.rect.height as usize);
            let offset = (region.rect.left as usize, region.rect.top as usize);
            for row in 0..h {
                let start = ((offset.1 + row) * width as usize + offset.0) * 3;
                assert!(
                    region.pixels[row * w * 3..(row + 1) * w * 3] == whole.as_raw()[start..start + w * 3],
                    "{}: region {rect:?} differs from the whole image in row {row}",
                    case.file
                );
            }
        }
    }
}

/// A transform without normalisation (values are 8-bit levels / 255), draft decoding on or off.
fn unnormalised(size: u32, geometry: Geometry, jpeg_draft: bool) -> Transform {
    Transform { geometry, normalize: false, jpeg_draft, ..Transform::eval(size, size) }
}

/// The largest and the mean difference between two outputs, in 8-bit levels.
fn level_differences(a: &[f32], b: &[f32]) -> (f32, f64) {
    let diffs = a.iter().zip(b).map(|(x, y)| (x - y).abs() * 255.0);
    let max = diffs.clone().fold(0f32, f32::max);
    let mean = diffs.map(f64::from).sum::<f64>() / a.len() as f64;
    (max, mean)
}

/// `data.jpeg_draft`: photo-sized JPEGs of every flavour decoded at 1/2..1/8 scale give what
/// Pillow's `draft` + torchvision's Resize((s, s)) give, bit for bit, and stay within a few
/// levels of the full decode for every geometry (the full decode is what torchvision sees).
#[test]
fn draft_decoding_equals_pillows_draft_and_stays_close_to_the_full_decode() {
    let dir = tempfile::tempdir().unwrap();
    common::run_python("draft_exif.py", &["draft".as_ref(), dir.path().as_os_str()]);
    let expected = read_safetensors(&dir.path().join("expected.safetensors")).unwrap().tensors;
    let mut files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 10, "5 JPEG flavours x 2 sizes");
    let mut worst = (0f32, 0f64, String::new());
    let mut note = |max: f32, mean: f64, what: String| {
        if mean > worst.1 {
            worst.1 = mean;
        }
        if max > worst.0 {
            worst = (max, worst.1, what);
        }
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        let mut geometries = vec![
            (100, Geometry::Resize { hflip: false }),
            (244, Geometry::Resize { hflip: false }),
            (300, Geometry::Resize { hflip: false }),
            (224, Geometry::ResizeCenterCrop { resize: 256 }),
            (64, Geometry::ResizeCenterCrop { resize: 73 }),
        ];
        for _ in 0..12 {
            let augment = Augment { scale: (0.08, 1.0), ..Augment::default() };
            geometries.push((rng.random_range(64..=224), Geometry::RandomResizedCrop(augment)));
        }
        for (size, geometry) in geometries {
            let draft = unnormalised(size, geometry.clone(), true);
            let full = unnormalised(size, geometry.clone(), false);
            let seed = rng.random::<u64>();
            let mut ours = vec![0f32; draft.output_len()];
            transform_encoded(&bytes, &draft, &mut sample_rng(seed, 0, 0), &mut ours).unwrap();
            let mut reference = vec![0f32; full.output_len()];
            transform_encoded(&bytes, &full, &mut sample_rng(seed, 0, 0), &mut reference).unwrap();
            let (max, mean) = level_differences(&ours, &reference);
            note(max, mean, format!("{stem} {size} {geometry:?}"));
            if let Some(theirs) = expected
                .get(&format!("{stem}/{size}"))
                .filter(|_| draft.geometry == full.geometry && matches!(geometry, Geometry::Resize { .. }))
            {
                let ours = Tensor::from_slice(&ours).view([3, i64::from(size), i64::from(size)]);
                let differ = ours.ne_tensor(theirs).sum(tch::Kind::Int64).int64_value(&[]);
                assert_eq!(
                    differ, 0,
                    "{stem} at {size}: {differ} values differ from Pillow's draft + Resize"
                );
            }
        }
    }
    eprintln!(
        "draft vs full decode, test pattern: largest difference {} levels ({}), largest mean {:.3} levels",
        worst.0, worst.2, worst.1
    );
    // The test pattern is hostile to any reduction: a colour checkerboard 9 x 6 pixels a
    // square, plus noise. At 1/8 scale libjpeg's 4:2:2 chroma comes from 16-pixel-wide blocks
    // without fancy upsampling (Pillow's draft gives the same pixels). Measured: at most 42
    // levels, mean at most 9.9 levels (4:2:2, quality 75, Resize to 100).
    assert!(worst.0 <= 48.0, "draft decoding differs by {} levels in {}", worst.0, worst.2);
    assert!(worst.1 <= 12.0, "draft decoding differs by {:.3} levels on average", worst.1);

    // Photos: the synthetic camera and phone shots (4:2:2 at quality 95, 4:2:0 at 92 and 85).
    let mut worst = (0f32, 0f64);
    for (k, kind) in KINDS.iter().enumerate() {
        let bytes = photo(k % 3, kind, 0.25, &mut rand_chacha::ChaCha8Rng::seed_from_u64(k as u64)).unwrap();
        for (size, geometry) in [
            (244, Geometry::Resize { hflip: false }),
            (224, Geometry::ResizeCenterCrop { resize: 256 }),
            (224, Geometry::RandomResizedCrop(Augment { scale: (0.08, 1.0), ..Augment::default() })),
        ] {
            for seed in 0..4 {
                let mut ours = vec![0f32; 3 * size * size];
                let draft =
                    Transform { exif_orientation: true, ..unnormalised(size as u32, geometry.clone(), true) };
                transform_encoded(&bytes, &draft, &mut sample_rng(seed, 0, 0), &mut ours).unwrap();
                let mut reference = vec![0f32; 3 * size * size];
                let full = Transform { jpeg_draft: false, ..draft };
                transform_encoded(&bytes, &full, &mut sample_rng(seed, 0, 0), &mut reference).unwrap();
                let (max, mean) = level_differences(&ours, &reference);
                worst = (worst.0.max(max), worst.1.max(mean));
            }
        }
    }
    eprintln!(
        "draft vs full decode, photos: largest difference {} levels, largest mean {:.3} levels",
        worst.0, worst.1
    );
    // Measured: at most 19 levels (the grain at an edge), mean at most 1.13 levels.
    assert!(worst.0 <= 28.0, "draft decoding differs by {} levels on a photo", worst.0);
    assert!(worst.1 <= 1.6, "draft decoding differs by {:.3} levels on average on a photo", worst.1);
}

/// `data.exif_orientation`: each of the 8 orientations is shown as Pillow's
/// `ImageOps.exif_transpose` shows it, whole, resized, and through a region decode of a crop.
#[test]
fn exif_orientation_matches_pillows_exif_transpose_for_all_eight_values() {
    let dir = tempfile::tempdir().unwrap();
    common::run_python("draft_exif.py", &["exif".as_ref(), dir.path().as_os_str()]);
    let expected = read_safetensors(&dir.path().join("expected.safetensors")).unwrap().tensors;
    for value in 1..=8 {
        let bytes = std::fs::read(dir.path().join(format!("orientation-{value}.jpg"))).unwrap();
        let upright = decode_whole(&bytes, UPRIGHT, |_, _| 1).unwrap();
        let theirs = &expected[&format!("upright/{value}")];
        assert_eq!(
            [i64::from(upright.height()), i64::from(upright.width()), 3],
            theirs.size().as_slice(),
            "orientation {value}: size"
        );
        let ours = Tensor::from_slice(upright.as_raw()).view([
            i64::from(upright.height()),
            i64::from(upright.width()),
            3,
        ]);
        assert!(ours.equal(theirs), "orientation {value}: pixels differ from exif_transpose");
        // Stored as written: the tag ignored.
        let stored = decode_whole(&bytes, DecodeOptions::default(), |_, _| 1).unwrap();
        assert_eq!(stored.dimensions(), (60, 36), "orientation {value}");

        let resize = Transform {
            exif_orientation: true,
            ..unnormalised(24, Geometry::Resize { hflip: false }, false)
        };
        let mut out = vec![0f32; resize.output_len()];
        transform_encoded(&bytes, &resize, &mut sample_rng(0, 0, 0), &mut out).unwrap();
        let ours = Tensor::from_slice(&out).view([3, 24, 24]);
        assert!(
            ours.equal(&expected[&format!("resize/{value}")]),
            "orientation {value}: Resize((24, 24)) differs"
        );

        let mut plan = None;
        let region = decode_request(&bytes, UPRIGHT, |_, _| {
            let drawn =
                DrawnTransform::resized_crop(Crop { top: 3, left: 5, height: 20, width: 14 }, 16, false);
            let rect = drawn.source().unwrap();
            plan = Some(drawn);
            Some(Request { reduction: 1, rect })
        })
        .unwrap();
        let mut out = vec![0f32; 3 * 16 * 16];
        plan.unwrap().render(&region.pixels, region.rect, &mut out);
        let ours = Tensor::from_slice(&out).view([3, 16, 16]);
        // render normalises: compare against the expected values normalised the same way.
        let mean = Tensor::from_slice(&rtrain::data::transforms::IMAGENET_MEAN).view([3, 1, 1]);
        let std = Tensor::from_slice(&rtrain::data::transforms::IMAGENET_STD).view([3, 1, 1]);
        let theirs = (&expected[&format!("crop/{value}")] - mean) / std;
        let max = (&ours - &theirs).abs().max().double_value(&[]);
        assert!(max < 1e-5, "orientation {value}: the cropped region differs by {max}");
    }
}
