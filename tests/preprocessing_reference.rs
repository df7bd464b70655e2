//! rtrain's preprocessing gives torchvision + Pillow's tensors bit for bit, from the file on
//! disk: JPEG decoding (baseline 4:2:0, 4:2:2 and 4:4:4, progressive, greyscale) and PNG, the
//! eval transform, and resized crops with and without a flip, through both the region decode
//! the loader uses and a whole-image decode. tests/reference/pil_preprocess.py writes the
//! images and torchvision's outputs.

mod common;

use rand::{Rng, SeedableRng};
use rtrain::data::decode::{decode, decode_region};
use rtrain::data::transforms::{sample_rng, Crop, Plan, Transform};
use rtrain::util::tensor_io::read_safetensors;
use tch::Tensor;

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
    fn plan(&self, width: u32, height: u32) -> Plan {
        match (self.resize, self.crop) {
            (Some(resize), None) => {
                let transform = Transform::eval(self.size, resize);
                Plan::new(width, height, &transform, &mut sample_rng(0, 0, 0))
            }
            (None, Some([top, left, height, width])) => {
                Plan::resized_crop(Crop { top, left, height, width }, self.size, self.flip.unwrap_or(false))
            }
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
