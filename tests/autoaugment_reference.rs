//! rtrain's AutoAugment / RandAugment / TrivialAugmentWide operations give torchvision's outputs
//! on PIL images byte for byte: every op at every magnitude any of the three spaces can draw
//! (with both signs where they negate) plus extremes, on a non-square, a square and a 2x3
//! image (geometric ops also on a 33000x3 one, for Pillow's floating-point affine path); and the AutoAugment sub-policy tables and every space's magnitude bins equal
//! torchvision's. tests/reference/autoaugment_reference.py writes the expected images.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use image::RgbImage;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rtrain::data::autoaugment::{apply_op, AugmentationSpace, AutoAugmentPolicy, Op, Policy};

#[derive(serde::Deserialize)]
struct Index {
    versions: BTreeMap<String, String>,
    inputs: BTreeMap<String, String>,
    cases: Vec<Case>,
    policies: BTreeMap<String, Vec<[Step; 2]>>,
    bins: Vec<Bins>,
}

#[derive(serde::Deserialize)]
struct Case {
    input: String,
    op: String,
    /// The magnitude's exact float64 bits: JSON decimals may not parse back exactly.
    magnitude_bits: u64,
    file: String,
}

#[derive(serde::Deserialize)]
struct Step {
    op: String,
    probability_bits: u64,
    magnitude_id: Option<usize>,
}

#[derive(serde::Deserialize)]
struct Bins {
    space: String,
    num_bins: usize,
    height: u32,
    width: u32,
    ops: Vec<SpaceOp>,
}

#[derive(serde::Deserialize)]
struct SpaceOp {
    op: String,
    signed: bool,
    values_bits: Option<Vec<u64>>,
}

fn read_png(path: &Path) -> RgbImage {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    image::load_from_memory_with_format(&bytes, image::ImageFormat::Png)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .to_rgb8()
}

fn op(name: &str) -> Op {
    Op::from_name(name).unwrap_or_else(|| panic!("torchvision op {name} is unknown to rtrain"))
}

#[test]
fn operations_policies_and_bins_match_torchvision() {
    let dir = tempfile::tempdir().unwrap();
    common::run_python("autoaugment_reference.py", &[dir.path().as_os_str()]);
    let index: Index =
        serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).unwrap()).unwrap();
    let inputs: BTreeMap<&str, RgbImage> =
        index.inputs.iter().map(|(key, file)| (key.as_str(), read_png(&dir.path().join(file)))).collect();

    // Every op, every magnitude.
    assert!(index.cases.len() > 3000, "only {} cases", index.cases.len());
    let mut failures = Vec::new();
    for case in &index.cases {
        let magnitude = f64::from_bits(case.magnitude_bits);
        let ours = apply_op(&inputs[case.input.as_str()], op(&case.op), magnitude);
        let theirs = read_png(&dir.path().join(&case.file));
        if ours.dimensions() != theirs.dimensions() {
            failures.push(format!("{} {} magnitude {magnitude}: size differs", case.input, case.op));
            continue;
        }
        let differing = ours.iter().zip(theirs.iter()).filter(|(a, b)| a != b).count();
        if differing > 0 {
            let max = ours.iter().zip(theirs.iter()).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
            failures.push(format!(
                "{} {} magnitude {magnitude}: {differing} of {} bytes differ (max {max})",
                case.input,
                case.op,
                ours.len()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from torchvision {:?}:\n{}",
        failures.len(),
        index.cases.len(),
        index.versions,
        failures.join("\n")
    );

    // AutoAugment's sub-policy tables.
    for (name, policy) in [
        ("imagenet", AutoAugmentPolicy::ImageNet),
        ("cifar10", AutoAugmentPolicy::Cifar10),
        ("svhn", AutoAugmentPolicy::Svhn),
    ] {
        let theirs = &index.policies[name];
        let ours = policy.sub_policies();
        assert_eq!(ours.len(), theirs.len(), "{name}: number of sub-policies");
        for (i, (ours, theirs)) in ours.iter().zip(theirs).enumerate() {
            for (ours, theirs) in ours.iter().zip(theirs) {
                let want = (op(&theirs.op), f64::from_bits(theirs.probability_bits), theirs.magnitude_id);
                assert_eq!((ours.op, ours.probability, ours.magnitude_id), want, "{name} sub-policy {i}");
            }
        }
    }

    // The spaces' ops (in order), signs and magnitude bins, for several image sizes.
    for bins in &index.bins {
        let space = match bins.space.as_str() {
            "AutoAugment" => AugmentationSpace::AutoAugment,
            "RandAugment" => AugmentationSpace::RandAugment,
            "TrivialAugmentWide" => AugmentationSpace::TrivialAugmentWide,
            other => panic!("unknown space {other}"),
        };
        let names: Vec<&str> = space.ops().iter().map(|op| op.name()).collect();
        let theirs: Vec<&str> = bins.ops.iter().map(|op| op.op.as_str()).collect();
        assert_eq!(names, theirs, "{} ops", bins.space);
        for entry in &bins.ops {
            let op = op(&entry.op);
            let context =
                format!("{} {} {} bins, {}x{}", bins.space, entry.op, bins.num_bins, bins.width, bins.height);
            assert_eq!(op.is_signed(), entry.signed, "{context}: signed");
            let want =
                entry.values_bits.as_ref().map(|bits| bits.iter().copied().map(f64::from_bits).collect());
            let got = space.magnitude_bins(op, bins.num_bins, bins.height, bins.width);
            assert_eq!(got, want, "{context}: bins");
        }
    }
}

/// The same generator state gives the same augmentation, and the policies do change images.
#[test]
fn policies_are_deterministic_per_seed_and_augment() {
    let image =
        RgbImage::from_fn(37, 53, |x, y| image::Rgb([(x * 7) as u8, (y * 5) as u8, ((x * y) % 256) as u8]));
    let policies = [
        Policy::AutoAugment(AutoAugmentPolicy::ImageNet),
        Policy::AutoAugment(AutoAugmentPolicy::Cifar10),
        Policy::AutoAugment(AutoAugmentPolicy::Svhn),
        Policy::RAND_AUGMENT,
        Policy::TRIVIAL_AUGMENT_WIDE,
    ];
    for policy in policies {
        let mut changed = 0;
        for seed in 0..64 {
            let first = policy.apply(&image, &mut ChaCha8Rng::seed_from_u64(seed));
            let again = policy.apply(&image, &mut ChaCha8Rng::seed_from_u64(seed));
            assert_eq!(first, again, "{policy:?} seed {seed} is not deterministic");
            assert_eq!(first.dimensions(), image.dimensions());
            changed += usize::from(first != image);
        }
        assert!(changed >= 16, "{policy:?} changed only {changed} of 64 images");
    }
}
