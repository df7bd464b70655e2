//! The built-in default dataset: deterministic, seed-driven synthetic photographs of building
//! facades in four damage levels, written as a class-per-folder JPEG tree
//! (`OUT/{train,val}/<class>/<NNNNN>.jpg`) that torchvision's `ImageFolder` and our own folder
//! loader read alike.
//!
//! Its parts: the options and their checks (here), the tree writer with the per-image seeding
//! that makes every file a pure function of `(seed, split, class, index)` ([`tree`]), and the
//! picture model: the scene (sky, ground, facade, windows, door; [`scene`]), the damage painted
//! over it ([`damage`]) and the canvas both draw on ([`raster`]). The tree is published
//! atomically ([`crate::util::atomic_dir`]). It needs no network and no data files, which is why
//! it is the default dataset: every test and every fresh install can train on it.
//!
//! The `designsafe` layout writes the same facades as the DesignSafe case study's data look:
//! `OUT/{Train,Validation}/{C0,C2,C4}/*.jpg`, large camera and phone JPEGs of mixed sizes, some
//! stored sideways with an Exif orientation tag ([`super::photos`]).

mod damage;
mod raster;
mod scene;
mod tree;

use std::io;
use std::path::{Path, PathBuf};

use image::RgbImage;
use rand_chacha::ChaCha8Rng;

use super::photos;
use crate::util::atomic_dir::{self, AtomicDirError};
use crate::util::io_error::IoError;
use raster::Canvas;
use scene::Scene;
use tree::Split;

/// Class folder names; their alphabetical order is the label order.
pub const CLASS_NAMES: [&str; 4] = ["0-none", "1-minor", "2-moderate", "3-severe"];

/// JPEG quality of every written image.
const JPEG_QUALITY: u8 = 90;
/// Below this the facade has too few pixels for windows and cracks to mean anything.
const MIN_IMAGE_SIZE: u32 = 16;
/// Above this a single image would take seconds; nobody trains on synthetic photos that large.
const MAX_IMAGE_SIZE: u32 = 4096;
/// Bump when the picture model changes, so a README tells which generator wrote a tree.
const GENERATOR_VERSION: u32 = 1;

/// How the tree is laid out and what its photos look like.
#[derive(Debug, Clone, PartialEq)]
pub enum Layout {
    /// `train`/`val`, four damage levels, square `image_size` JPEGs.
    Facades,
    /// The case study's: `Train`/`Validation`, classes `C0`, `C2`, `C4` (no, moderate and
    /// severe damage), `train_images` and `val_images` photos in all, divided among the classes
    /// in proportion to `class_shares` (empty: evenly), in the mix of [`photos::KINDS`] with
    /// every side times `photo_scale`.
    DesignSafe { train_images: usize, val_images: usize, photo_scale: f64, class_shares: Vec<f64> },
}

/// `total` divided in proportion to `shares` (largest remainders first), at least 1 each when
/// `total` allows: every class folder needs a file.
fn divide(total: usize, shares: &[f64]) -> Vec<usize> {
    let sum: f64 = shares.iter().sum();
    let exact: Vec<f64> = shares.iter().map(|share| total as f64 * share / sum).collect();
    let mut counts: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
    let mut by_remainder: Vec<usize> = (0..shares.len()).collect();
    by_remainder.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    for &class in by_remainder.iter().take(total.saturating_sub(counts.iter().sum())) {
        counts[class] += 1;
    }
    while let Some(empty) = counts.iter().position(|&count| count == 0) {
        let (largest, _) = counts.iter().enumerate().max_by_key(|&(_, count)| *count).unwrap_or((0, &0));
        if counts[largest] <= 1 {
            break;
        }
        (counts[largest], counts[empty]) = (counts[largest] - 1, 1);
    }
    counts
}

/// The case study's class folders and the damage level each is drawn at.
const DESIGNSAFE_CLASSES: [(&str, usize); 3] = [("C0", 0), ("C2", 2), ("C4", 3)];

/// What to generate.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// Master seed; every image is seeded from it plus its split, class and index.
    pub seed: u64,
    /// Training images per class.
    pub train_per_class: usize,
    /// Validation images per class.
    pub val_per_class: usize,
    /// Width and height of every (square) image in pixels.
    pub image_size: u32,
    /// The facades layout (which uses the three fields above) or the case study's.
    pub layout: Layout,
}

impl Default for SynthOptions {
    fn default() -> Self {
        Self { seed: 0, train_per_class: 200, val_per_class: 50, image_size: 96, layout: Layout::Facades }
    }
}

impl SynthOptions {
    /// The split folders with the number of images of each class in them.
    fn splits(&self) -> Vec<(Split, Vec<usize>)> {
        match self.layout {
            Layout::Facades => vec![
                (Split::Train, vec![self.train_per_class; CLASS_NAMES.len()]),
                (Split::Val, vec![self.val_per_class; CLASS_NAMES.len()]),
            ],
            Layout::DesignSafe { train_images, val_images, ref class_shares, .. } => {
                let shares = match class_shares.is_empty() {
                    true => vec![1.0; DESIGNSAFE_CLASSES.len()],
                    false => class_shares.clone(),
                };
                vec![(Split::Train, divide(train_images, &shares)), (Split::Val, divide(val_images, &shares))]
            }
        }
    }

    /// Class folder names, in label order.
    fn class_names(&self) -> Vec<&'static str> {
        match self.layout {
            Layout::Facades => CLASS_NAMES.to_vec(),
            Layout::DesignSafe { .. } => DESIGNSAFE_CLASSES.iter().map(|c| c.0).collect(),
        }
    }

    /// The split's folder name.
    fn split_dir(&self, split: Split) -> &'static str {
        match (&self.layout, split) {
            (Layout::Facades, Split::Train) => "train",
            (Layout::Facades, Split::Val) => "val",
            (Layout::DesignSafe { .. }, Split::Train) => "Train",
            (Layout::DesignSafe { .. }, Split::Val) => "Validation",
        }
    }
}

/// What [`generate`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSummary {
    /// Images under `OUT/train`, all classes together.
    pub train_images: usize,
    /// Images under `OUT/val`, all classes together.
    pub val_images: usize,
}

/// Why a synthetic dataset could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// The options cannot produce a usable dataset.
    #[error("invalid synthetic dataset options: {0}")]
    InvalidOptions(String),
    /// Staging or publishing the output directory failed (it exists, or a rename failed).
    #[error(transparent)]
    Publish(#[from] AtomicDirError),
    /// A filesystem operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The JPEG encoder rejected an image.
    #[error("{}: cannot encode JPEG", path.display())]
    Encode {
        path: PathBuf,
        #[source]
        source: image::ImageError,
    },
    /// libjpeg could not encode a photo.
    #[error("{}: cannot encode JPEG", path.display())]
    EncodePhoto {
        path: PathBuf,
        #[source]
        source: crate::data::encode::EncodeError,
    },
    /// A worker thread could not be started.
    #[error("cannot start an image-generation thread")]
    Thread(#[source] io::Error),
    /// A worker thread panicked; that is a bug in this module, not a problem with the input.
    #[error("an image-generation thread panicked")]
    WorkerPanicked,
}

/// Writes the dataset described by `options` to `out` and returns how many images it wrote.
///
/// The tree is built in a temporary directory next to `out` and renamed into place at the end,
/// so `out` either does not exist or is complete. An existing empty directory at `out` is
/// replaced; anything else there is an error. The same options always give byte-identical
/// files with the same build, however many threads run.
pub fn generate(out: &Path, options: &SynthOptions) -> Result<SynthSummary, SynthError> {
    validate(options)?;
    atomic_dir::ensure_free(out)?;
    let tmp = atomic_dir::staging_dir(out, ".synth-")?;
    let summary = tree::write(tmp.path(), options)?;
    atomic_dir::publish(tmp, out)?;
    tracing::info!(
        out = %out.display(),
        train = summary.train_images,
        val = summary.val_images,
        seed = options.seed,
        "generated synthetic facade-damage dataset"
    );
    Ok(summary)
}

/// Renders one facade photograph at damage `level` (0 = none … 3 = severe; larger values are
/// treated as 3), `size` × `size` pixels, drawing all randomness from `rng`.
///
/// The undamaged scene (layout, colours, lighting) is drawn from `rng` before anything that
/// depends on `level`, so the same rng state rendered at two levels shows the same building with
/// different damage; tests use that to compare levels without scene-to-scene variance.
pub fn render(level: usize, rng: &mut ChaCha8Rng, size: u32) -> RgbImage {
    let level = level.min(CLASS_NAMES.len() - 1);
    let size = size.max(1);
    let scene = Scene::draw(rng, size as f32);
    let mut canvas = Canvas::new(size as usize);
    scene.paint(&mut canvas);
    damage::damage(level, &scene, &mut canvas, rng);
    scene::finish(&scene, &canvas, rng, size)
}

/// One photo of damage `level` as a JPEG file's bytes: a facade drawn from `rng`, shot as a
/// `kind` photo at `scale` times its size ([`photos::shoot`]).
pub fn photo(
    level: usize,
    kind: &photos::PhotoKind,
    scale: f64,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<u8>, crate::data::encode::EncodeError> {
    let (width, height) = photos::displayed_size(kind, scale);
    let scene = render(level, rng, photos::SCENE_SIDE.min(width.max(height)));
    photos::shoot(&scene, kind, scale, rng)
}

fn validate(options: &SynthOptions) -> Result<(), SynthError> {
    if let Layout::DesignSafe { train_images, val_images, photo_scale, ref class_shares } = options.layout {
        // Every class folder needs a file, which ImageFolder requires.
        let classes = DESIGNSAFE_CLASSES.len();
        let shares_ok = class_shares.iter().all(|share| share.is_finite() && *share > 0.0);
        if !(class_shares.is_empty() || class_shares.len() == classes && shares_ok) {
            return Err(SynthError::InvalidOptions(format!(
                "class_shares {class_shares:?}: expected {classes} positive numbers, one per class (C0, C2, C4)"
            )));
        }
        if train_images < classes || val_images < classes {
            return Err(SynthError::InvalidOptions(format!(
                "train_images ({train_images}) and val_images ({val_images}) must both be at least {classes}, one per class"
            )));
        }
        if !(0.004..=1.0).contains(&photo_scale) {
            return Err(SynthError::InvalidOptions(format!(
                "photo_scale {photo_scale} is outside 0.004..=1 (1 is full camera size, 6000x4000)"
            )));
        }
        return Ok(());
    }
    if !(MIN_IMAGE_SIZE..=MAX_IMAGE_SIZE).contains(&options.image_size) {
        return Err(SynthError::InvalidOptions(format!(
            "image_size {} is outside {MIN_IMAGE_SIZE}..={MAX_IMAGE_SIZE}",
            options.image_size
        )));
    }
    // An empty split would leave class folders without files, which ImageFolder rejects.
    if options.train_per_class == 0 || options.val_per_class == 0 {
        return Err(SynthError::InvalidOptions(format!(
            "train_per_class ({}) and val_per_class ({}) must both be at least 1",
            options.train_per_class, options.val_per_class
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use sha2::{Digest, Sha256};
    use std::fs;
    use std::path::PathBuf;

    fn small() -> SynthOptions {
        SynthOptions {
            seed: 7,
            train_per_class: 3,
            val_per_class: 2,
            image_size: 48,
            layout: Layout::Facades,
        }
    }

    /// SHA-256 over every file's relative path and contents, in sorted order.
    fn tree_hash(root: &Path) -> String {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, out);
                } else {
                    out.push(path);
                }
            }
        }
        let mut files = Vec::new();
        walk(root, &mut files);
        files.sort();
        let mut h = Sha256::new();
        for f in files {
            h.update(f.strip_prefix(root).unwrap().to_string_lossy().as_bytes());
            h.update([0]);
            h.update(fs::read(&f).unwrap());
        }
        hex::encode(h.finalize())
    }

    fn count_files(dir: &Path) -> usize {
        fs::read_dir(dir).unwrap().count()
    }

    #[test]
    fn same_seed_gives_identical_trees_and_other_seed_differs() {
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a");
        let b = tmp.path().join("b");
        let c = tmp.path().join("c");
        generate(&a, &small()).unwrap();
        generate(&b, &small()).unwrap();
        generate(&c, &SynthOptions { seed: 8, ..small() }).unwrap();
        assert_eq!(tree_hash(&a), tree_hash(&b));
        assert_ne!(tree_hash(&a), tree_hash(&c));
        // The README mentions the seed, so compare the images alone too.
        assert_ne!(tree_hash(&a.join("train")), tree_hash(&c.join("train")));
    }

    #[test]
    fn class_shares_divide_the_photos_exactly() {
        assert_eq!(divide(100, &[70.0, 20.0, 10.0]), vec![70, 20, 10]);
        assert_eq!(divide(10, &[1.0, 1.0, 1.0]), vec![4, 3, 3]);
        assert_eq!(
            divide(33, &[0.7, 0.2, 0.1]),
            vec![23, 7, 3],
            "23.1, 6.6, 3.3: the largest remainder gets the spare"
        );
        assert_eq!(divide(4, &[98.0, 1.0, 1.0]), vec![2, 1, 1], "every class gets a photo");
    }

    #[test]
    fn writes_requested_counts_per_class_and_readme() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("nested").join("synth");
        let summary = generate(&out, &small()).unwrap();
        assert_eq!(summary, SynthSummary { train_images: 12, val_images: 8 });
        for class in CLASS_NAMES {
            assert_eq!(count_files(&out.join("train").join(class)), 3, "{class}");
            assert_eq!(count_files(&out.join("val").join(class)), 2, "{class}");
        }
        let first = out.join("train").join("2-moderate").join("00000.jpg");
        let img = image::open(&first).unwrap();
        assert_eq!((img.width(), img.height()), (48, 48));
        let readme = fs::read_to_string(out.join("README.txt")).unwrap();
        assert!(readme.contains("seed: 7"), "{readme}");
        assert!(readme.contains("3 per class"), "{readme}");
        // Nothing but the result is left beside it.
        assert_eq!(count_files(out.parent().unwrap()), 1);
    }

    #[test]
    fn designsafe_layout_spreads_the_counts_over_c0_c2_c4_in_train_and_validation() {
        let tmp = tempfile::tempdir().unwrap();
        let options = SynthOptions {
            layout: Layout::DesignSafe {
                train_images: 10,
                val_images: 4,
                photo_scale: 0.02,
                class_shares: vec![],
            },
            ..small()
        };
        let out = tmp.path().join("ds");
        let summary = generate(&out, &options).unwrap();
        assert_eq!(summary, SynthSummary { train_images: 10, val_images: 4 });
        let counts = |split: &str| ["C0", "C2", "C4"].map(|c| count_files(&out.join(split).join(c)));
        assert_eq!(counts("Train"), [4, 3, 3]);
        assert_eq!(counts("Validation"), [2, 1, 1]);
        // Sizes of the mix at 2%: 120x80 camera frames down to 16 a side, none square.
        let mut sizes = std::collections::BTreeSet::new();
        for class in ["C0", "C2", "C4"] {
            for entry in fs::read_dir(out.join("Train").join(class)).unwrap() {
                let img = image::open(entry.unwrap().path()).unwrap();
                assert_ne!(img.width(), img.height());
                sizes.insert(img.width().max(img.height()));
            }
        }
        assert!(sizes.len() >= 2, "a mix of sizes: {sizes:?}");
        assert!(sizes.iter().all(|&s| s <= 120), "{sizes:?}");
        let again = tmp.path().join("again");
        generate(&again, &options).unwrap();
        assert_eq!(tree_hash(&out), tree_hash(&again));
        let bad = SynthOptions {
            layout: Layout::DesignSafe {
                train_images: 2,
                val_images: 4,
                photo_scale: 0.02,
                class_shares: vec![],
            },
            ..small()
        };
        assert!(matches!(generate(&tmp.path().join("bad"), &bad), Err(SynthError::InvalidOptions(_))));
    }

    #[test]
    fn refuses_non_empty_output_but_accepts_empty_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("taken");
        fs::create_dir(&out).unwrap();
        fs::write(out.join("keep.txt"), b"precious").unwrap();
        let err = generate(&out, &small()).unwrap_err();
        assert!(matches!(err, SynthError::Publish(AtomicDirError::OutputExists { .. })), "{err:?}");
        assert!(err.to_string().contains(&out.display().to_string()), "{err}");
        assert_eq!(fs::read(out.join("keep.txt")).unwrap(), b"precious");
        // No temporary directory left behind.
        assert_eq!(count_files(tmp.path()), 1);

        let empty = tmp.path().join("empty");
        fs::create_dir(&empty).unwrap();
        generate(&empty, &small()).unwrap();
        assert!(empty.join("README.txt").is_file());
    }

    #[test]
    fn rejects_bad_options() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("x");
        let err = generate(&out, &SynthOptions { image_size: 8, ..small() }).unwrap_err();
        assert!(matches!(err, SynthError::InvalidOptions(_)), "{err:?}");
        let err = generate(&out, &SynthOptions { val_per_class: 0, ..small() }).unwrap_err();
        assert!(matches!(err, SynthError::InvalidOptions(_)), "{err:?}");
        assert!(!out.exists());
    }

    #[test]
    fn render_is_deterministic_and_sized() {
        let a = render(3, &mut ChaCha8Rng::seed_from_u64(5), 40);
        let b = render(3, &mut ChaCha8Rng::seed_from_u64(5), 40);
        let c = render(3, &mut ChaCha8Rng::seed_from_u64(6), 40);
        assert_eq!((a.width(), a.height()), (40, 40));
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Out-of-range levels render as severe rather than panicking.
        let d = render(9, &mut ChaCha8Rng::seed_from_u64(5), 40);
        assert_eq!(a, d);
    }

    #[test]
    fn render_survives_degenerate_sizes() {
        // generate() refuses these, but render() is public and must not panic on them.
        for size in [0, 1, 2, 3, 5, 9, 16, 17] {
            for level in 0..4 {
                for seed in 0..10 {
                    let img = render(level, &mut ChaCha8Rng::seed_from_u64(seed), size);
                    assert_eq!(img.width(), size.max(1));
                }
            }
        }
    }
}
