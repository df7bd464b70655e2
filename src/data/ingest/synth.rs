//! The built-in default dataset: deterministic, seed-driven synthetic photographs of building
//! facades in four damage levels, written as a class-per-folder JPEG tree
//! (`OUT/{train,val}/<class>/<NNNNN>.jpg`) that torchvision's `ImageFolder` and our own folder
//! loader read alike.
//!
//! This module owns the picture model (sky, ground, facade, windows, door, damage), the
//! per-image seeding that makes every file a pure function of `(seed, split, class, index)`, and
//! the writing of the whole tree, which [`super::atomic_dir`] publishes atomically. It needs no
//! network and no data files, which is why it is the default dataset: every test and every
//! fresh install can train on it.
//!
//! The `designsafe` layout writes the same facades as the DesignSafe case study's data look:
//! `OUT/{Train,Validation}/{C0,C2,C4}/*.jpg`, large camera and phone JPEGs of mixed sizes, some
//! stored sideways with an Exif orientation tag ([`super::photos`]).

use std::f32::consts::TAU;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use image::codecs::jpeg::JpegEncoder;

use crate::util::seeds::splitmix64;
use image::RgbImage;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::atomic_dir::{self, AtomicDirError};
use super::photos;

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
    /// A filesystem operation on `path` failed.
    #[error("{}: cannot {action}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: io::Error,
    },
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

    let mut jobs = Vec::new();
    let mut summary = SynthSummary { train_images: 0, val_images: 0 };
    for (split, counts) in options.splits() {
        for ((class, name), &count) in options.class_names().iter().enumerate().zip(&counts) {
            let dir = tmp.path().join(options.split_dir(split)).join(name);
            fs::create_dir_all(&dir).map_err(|source| SynthError::Io {
                path: dir.clone(),
                action: "create directory",
                source,
            })?;
            jobs.extend((0..count).map(|index| ImageToWrite { split, class, index }));
        }
        match split {
            Split::Train => summary.train_images = counts.iter().sum(),
            Split::Val => summary.val_images = counts.iter().sum(),
        }
    }
    run_jobs(tmp.path(), options, &jobs)?;

    let readme = tmp.path().join("README.txt");
    fs::write(&readme, readme_text(options, &summary)).map_err(|source| SynthError::Io {
        path: readme.clone(),
        action: "write",
        source,
    })?;
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
    damage(level, &scene, &mut canvas, rng);
    finish(&scene, &canvas, rng, size)
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

fn readme_text(options: &SynthOptions, summary: &SynthSummary) -> String {
    if let Layout::DesignSafe { photo_scale, .. } = options.layout {
        let kinds: String = photos::KINDS
            .iter()
            .map(|kind| {
                let (w, h) = photos::displayed_size(kind, photo_scale);
                format!(
                    "\x20 {:>3}%  {w}x{h} (as shown), quality {}, {}\n",
                    kind.percent, kind.quality, kind.name
                )
            })
            .collect();
        return format!(
            "rtrain synthetic facade-damage photos, DesignSafe layout (generator version {GENERATOR_VERSION})\n\
             \n\
             Synthetic photographs of building facades shaped like the DesignSafe case study's data:\n\
             \x20 C0  no damage\n\
             \x20 C2  moderate damage (cracks, broken windows, debris)\n\
             \x20 C4  severe damage (partial collapse, rubble)\n\
             \n\
             seed: {seed}\n\
             photo scale: {photo_scale} (1 = full camera size)\n\
             Train: {train} images, Validation: {val} images, spread evenly over the classes\n\
             photo kinds (drawn per image):\n{kinds}\
             \n\
             Every image is a pure function of (seed, split, class, index): the same options give\n\
             byte-identical files with the same build of rtrain.\n",
            seed = options.seed,
            train = summary.train_images,
            val = summary.val_images,
        );
    }
    format!(
        "rtrain synthetic facade-damage dataset (generator version {GENERATOR_VERSION})\n\
         \n\
         Synthetic photographs of building facades, one folder per damage level:\n\
         \x20 0-none      intact (may show stains, a drainpipe or a hairline crack)\n\
         \x20 1-minor     a few thin cracks, maybe a broken window or a little debris\n\
         \x20 2-moderate  many wider cracks, several broken windows, a debris pile\n\
         \x20 3-severe    part of the building collapsed, a large rubble pile\n\
         Labels are the class folders' alphabetical order: {classes}.\n\
         \n\
         seed: {seed}\n\
         image size: {size}x{size} pixels, RGB JPEG quality {JPEG_QUALITY}\n\
         train: {train} per class, {train_total} images in train/<class>/<NNNNN>.jpg\n\
         val: {val} per class, {val_total} images in val/<class>/<NNNNN>.jpg\n\
         \n\
         Every image is a pure function of (seed, split, class, index): the same options give\n\
         byte-identical files with the same build of rtrain.\n",
        classes = CLASS_NAMES.join(", "),
        seed = options.seed,
        size = options.image_size,
        train = options.train_per_class,
        train_total = summary.train_images,
        val = options.val_per_class,
        val_total = summary.val_images,
    )
}

// ---------------------------------------------------------------------------------------------
// Output tree: seeding and parallel writing (publication is `atomic_dir`'s).

#[derive(Debug, Clone, Copy)]
enum Split {
    Train,
    Val,
}

impl Split {
    /// Distinct constants so that train image k and val image k never share a seed.
    fn tag(self) -> u64 {
        match self {
            Split::Train => 0x7472_6169_6e00_0001,
            Split::Val => 0x7661_6c00_0000_0002,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct ImageToWrite {
    split: Split,
    class: usize,
    index: usize,
}

/// SplitMix64 finaliser: a bijective mixer, so chained calls keep distinct inputs distinct with
/// overwhelming probability and neighbouring indices get unrelated seeds.
fn image_seed(seed: u64, split: Split, class: usize, index: usize) -> u64 {
    let mut h = splitmix64(seed);
    h = splitmix64(h ^ split.tag());
    h = splitmix64(h ^ class as u64);
    splitmix64(h ^ index as u64)
}

fn write_one(root: &Path, options: &SynthOptions, job: &ImageToWrite) -> Result<(), SynthError> {
    let mut rng = ChaCha8Rng::seed_from_u64(image_seed(options.seed, job.split, job.class, job.index));
    let class = options.class_names()[job.class];
    let path = root.join(options.split_dir(job.split)).join(class).join(format!("{:05}.jpg", job.index));
    if let Layout::DesignSafe { photo_scale, .. } = options.layout {
        let kind = photos::pick(rng.next_u32());
        let bytes = photo(DESIGNSAFE_CLASSES[job.class].1, kind, photo_scale, &mut rng)
            .map_err(|source| SynthError::EncodePhoto { path: path.clone(), source })?;
        return fs::write(&path, &bytes).map_err(|source| SynthError::Io { path, action: "write", source });
    }
    let img = render(job.class, &mut rng, options.image_size);
    let mut bytes = Vec::with_capacity(8 * 1024);
    JpegEncoder::new_with_quality(&mut bytes, JPEG_QUALITY)
        .encode_image(&img)
        .map_err(|source| SynthError::Encode { path: path.clone(), source })?;
    fs::write(&path, &bytes).map_err(|source| SynthError::Io { path, action: "write", source })
}

/// Runs `jobs` on a few threads. Each image has its own seed, so the split of work between
/// threads cannot change any file.
fn run_jobs(root: &Path, options: &SynthOptions, jobs: &[ImageToWrite]) -> Result<(), SynthError> {
    let threads =
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).clamp(2, 4).min(jobs.len().max(1));
    let failed = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(threads);
        let mut first_error = None;
        for t in 0..threads {
            let failed = &failed;
            let spawned = std::thread::Builder::new().name(format!("synth-{t}")).spawn_scoped(
                scope,
                move || -> Result<(), SynthError> {
                    for job in jobs.iter().skip(t).step_by(threads) {
                        // Another worker failed: the temporary tree will be discarded anyway.
                        if failed.load(Ordering::Relaxed) {
                            break;
                        }
                        if let Err(err) = write_one(root, options, job) {
                            failed.store(true, Ordering::Relaxed);
                            return Err(err);
                        }
                    }
                    Ok(())
                },
            );
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(err) => {
                    failed.store(true, Ordering::Relaxed);
                    first_error = Some(SynthError::Thread(err));
                    break;
                }
            }
        }
        for handle in handles {
            let result = handle.join().unwrap_or(Err(SynthError::WorkerPanicked));
            if let (Err(err), None) = (result, &first_error) {
                first_error = Some(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    })
}

// ---------------------------------------------------------------------------------------------
// Drawing primitives. Coordinates are in pixels as f32; pixel (x, y) covers [x, x+1) × [y, y+1)
// and is "inside" a shape when its centre is.

type Rgb = [f32; 3];
type Pt = (f32, f32);

#[derive(Debug, Clone, Copy)]
struct Rect {
    x0: f32,
    y0: f32,
    x1: f32,
    y1: f32,
}

impl Rect {
    fn width(&self) -> f32 {
        self.x1 - self.x0
    }

    fn height(&self) -> f32 {
        self.y1 - self.y0
    }

    fn contains(&self, x: f32, y: f32) -> bool {
        x >= self.x0 && x < self.x1 && y >= self.y0 && y < self.y1
    }
}

/// Pixel indices whose centres lie in [a, b), clamped to 0..n.
fn span(a: f32, b: f32, n: usize) -> std::ops::Range<usize> {
    let lo = (a - 0.5).ceil().max(0.0);
    let hi = (b - 0.5).ceil().max(0.0);
    (lo as usize).min(n)..(hi as usize).min(n)
}

struct Canvas {
    size: usize,
    px: Vec<Rgb>,
}

impl Canvas {
    fn new(size: usize) -> Self {
        Self { size, px: vec![[0.0; 3]; size * size] }
    }

    fn bounds(&self) -> Rect {
        let s = self.size as f32;
        Rect { x0: 0.0, y0: 0.0, x1: s, y1: s }
    }

    fn put(&mut self, x: usize, y: usize, c: Rgb, alpha: f32) {
        if x < self.size && y < self.size {
            let p = &mut self.px[y * self.size + x];
            for ch in 0..3 {
                p[ch] += (c[ch] - p[ch]) * alpha;
            }
        }
    }

    fn fill_rect(&mut self, r: Rect, c: Rgb, alpha: f32) {
        for y in span(r.y0, r.y1, self.size) {
            for x in span(r.x0, r.x1, self.size) {
                self.put(x, y, c, alpha);
            }
        }
    }

    /// Even-odd fill of a simple polygon, restricted to `clip`.
    fn fill_polygon(&mut self, pts: &[Pt], clip: Rect, c: Rgb, alpha: f32) {
        if pts.len() < 3 {
            return;
        }
        let (mut x0, mut y0, mut x1, mut y1) = (f32::MAX, f32::MAX, f32::MIN, f32::MIN);
        for &(x, y) in pts {
            x0 = x0.min(x);
            y0 = y0.min(y);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
        for py in span(y0.max(clip.y0), y1.min(clip.y1) + 1.0, self.size) {
            let cy = py as f32 + 0.5;
            for px in span(x0.max(clip.x0), x1.min(clip.x1) + 1.0, self.size) {
                let cx = px as f32 + 0.5;
                if clip.contains(cx, cy) && point_in_polygon(pts, cx, cy) {
                    self.put(px, py, c, alpha);
                }
            }
        }
    }

    /// Filled axis-aligned ellipse, restricted to `clip`.
    fn fill_ellipse(&mut self, centre: Pt, rx: f32, ry: f32, clip: Rect, c: Rgb, alpha: f32) {
        if rx <= 0.0 || ry <= 0.0 {
            return;
        }
        let (ex, ey) = centre;
        for py in span(ey - ry, ey + ry, self.size) {
            let cy = py as f32 + 0.5;
            for px in span(ex - rx, ex + rx, self.size) {
                let cx = px as f32 + 0.5;
                let (dx, dy) = ((cx - ex) / rx, (cy - ey) / ry);
                if dx * dx + dy * dy <= 1.0 && clip.contains(cx, cy) {
                    self.put(px, py, c, alpha);
                }
            }
        }
    }

    /// A polyline of the given width, drawn by stamping along it every half pixel. Widths under
    /// 1.5 px become one-pixel-wide lines rather than vanishing between pixel centres.
    fn stroke(&mut self, pts: &[Pt], width: f32, clip: Rect, c: Rgb) {
        let r = width / 2.0;
        for pair in pts.windows(2) {
            let ((ax, ay), (bx, by)) = (pair[0], pair[1]);
            let len = ((bx - ax).powi(2) + (by - ay).powi(2)).sqrt();
            let steps = (len * 2.0).ceil().max(1.0) as usize;
            for i in 0..=steps {
                let t = i as f32 / steps as f32;
                let (x, y) = (ax + (bx - ax) * t, ay + (by - ay) * t);
                if r < 0.75 {
                    if clip.contains(x, y) && x >= 0.0 && y >= 0.0 {
                        self.put(x as usize, y as usize, c, 1.0);
                    }
                } else {
                    self.fill_ellipse((x, y), r, r, clip, c, 1.0);
                }
            }
        }
    }
}

fn point_in_polygon(pts: &[Pt], x: f32, y: f32) -> bool {
    let mut inside = false;
    let mut j = pts.len() - 1;
    for i in 0..pts.len() {
        let (xi, yi) = pts[i];
        let (xj, yj) = pts[j];
        if (yi > y) != (yj > y) && x < (xj - xi) * (y - yi) / (yj - yi) + xi {
            inside = !inside;
        }
        j = i;
    }
    inside
}

fn mix(a: Rgb, b: Rgb, t: f32) -> Rgb {
    [a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t, a[2] + (b[2] - a[2]) * t]
}

fn scale(c: Rgb, k: f32) -> Rgb {
    [c[0] * k, c[1] * k, c[2] * k]
}

fn grey(v: f32) -> Rgb {
    [v, v, v]
}

/// Uniform in [lo, hi); never panics on an empty range, unlike `random_range`, so degenerate
/// layouts at tiny image sizes cannot crash a render.
fn unif(rng: &mut ChaCha8Rng, lo: f32, hi: f32) -> f32 {
    lo + (hi - lo) * rng.random::<f32>()
}

/// Uniform integer in lo..=hi (lo when the range is empty).
fn int(rng: &mut ChaCha8Rng, lo: usize, hi: usize) -> usize {
    if hi <= lo {
        lo
    } else {
        rng.random_range(lo..=hi)
    }
}

fn jitter(rng: &mut ChaCha8Rng, c: Rgb, common: f32, each: f32) -> Rgb {
    let k = unif(rng, -common, common);
    [c[0] + k + unif(rng, -each, each), c[1] + k + unif(rng, -each, each), c[2] + k + unif(rng, -each, each)]
}

// ---------------------------------------------------------------------------------------------
// The undamaged scene.

struct Scene {
    /// Image size in pixels.
    s: f32,
    sky_top: Rgb,
    sky_horizon: Rgb,
    clouds: Vec<(Pt, f32, f32, f32)>,
    ground_y: f32,
    ground_top: Rgb,
    ground_bottom: Rgb,
    facade: Rect,
    wall: Rgb,
    /// Relative brightness change from the facade's centre to its right edge (sun side).
    light_slope: f32,
    cornice: Option<(Rect, Rgb)>,
    storey_lines: Vec<f32>,
    pipe: Option<(Rect, Rgb)>,
    windows: Vec<Rect>,
    frame: Rgb,
    glass: Rgb,
    door: Option<(Rect, Rgb)>,
    brightness: f32,
    tint: f32,
    noise: f32,
}

const WALL_PALETTE: [Rgb; 6] = [
    [205.0, 190.0, 160.0], // beige render
    [160.0, 88.0, 68.0],   // brick
    [168.0, 165.0, 158.0], // concrete
    [222.0, 212.0, 188.0], // cream
    [196.0, 152.0, 94.0],  // ochre
    [210.0, 172.0, 160.0], // pale pink
];

const GROUND_PALETTE: [Rgb; 3] = [
    [108.0, 108.0, 104.0], // asphalt
    [126.0, 104.0, 78.0],  // dirt
    [84.0, 116.0, 62.0],   // grass
];

impl Scene {
    fn draw(rng: &mut ChaCha8Rng, s: f32) -> Self {
        // Sky: always clearly blue-dominant (b > g > r) so that exposed sky reads as sky.
        let r = unif(rng, 60.0, 140.0);
        let g = r + unif(rng, 15.0, 45.0);
        let b = unif(rng, (g + 25.0).max(185.0), 246.0);
        let sky_top = [r, g, b];
        let sky_horizon = mix(sky_top, [226.0, 232.0, 242.0], unif(rng, 0.45, 0.75));
        let ground_y = s * unif(rng, 0.78, 0.88);
        let n_clouds = int(rng, 0, 3);
        let clouds = (0..n_clouds)
            .map(|_| {
                let centre = (unif(rng, 0.0, s), unif(rng, 0.02 * s, 0.45 * s));
                (centre, s * unif(rng, 0.08, 0.2), s * unif(rng, 0.025, 0.06), unif(rng, 0.2, 0.45))
            })
            .collect();
        let ground = GROUND_PALETTE[int(rng, 0, GROUND_PALETTE.len() - 1)];
        let ground_top = jitter(rng, ground, 12.0, 6.0);
        let ground_bottom = scale(ground_top, unif(rng, 0.8, 1.1));

        // Facade: size and position jitter. Its top stays well below the image top so a
        // collapsed roofline has sky behind it.
        let fw = s * unif(rng, 0.52, 0.8);
        let fh = s * unif(rng, 0.45, 0.64);
        let cx = s * (0.5 + unif(rng, -0.09, 0.09));
        let x0 = (cx - fw / 2.0).max(0.04 * s);
        let x1 = (cx + fw / 2.0).min(0.96 * s);
        let y1 = ground_y + s * unif(rng, 0.0, 0.02);
        let y0 = (y1 - fh).max(0.1 * s);
        let facade = Rect { x0, y0, x1, y1 };
        let base_wall = WALL_PALETTE[int(rng, 0, WALL_PALETTE.len() - 1)];
        let mut wall = jitter(rng, base_wall, 14.0, 5.0);
        // Keep walls from turning blue, which would make them look like sky.
        wall[2] = wall[2].min(wall[0]);
        let light_slope = unif(rng, -0.14, 0.14);

        let cornice = if rng.random_bool(0.6) {
            let h = s * unif(rng, 0.015, 0.035);
            let over = s * unif(rng, 0.0, 0.015);
            let c = scale(wall, unif(rng, 0.75, 1.15));
            Some((Rect { x0: x0 - over, y0, x1: x1 + over, y1: y0 + h }, c))
        } else {
            None
        };
        let top = cornice.map_or(y0, |(r, _)| r.y1);

        // Window grid; rows limited so each storey stays at least ~9% of the image tall.
        let cols = int(rng, 2, 5);
        let max_rows = ((y1 - top) / (0.09 * s)).floor().max(1.0) as usize;
        let rows = int(rng, 2.min(max_rows), 4.min(max_rows));
        let margin_x = facade.width() * unif(rng, 0.06, 0.14);
        let margin_top = s * unif(rng, 0.01, 0.03);
        let cell_w = (facade.width() - 2.0 * margin_x) / cols as f32;
        let cell_h = (y1 - top - margin_top) / rows as f32;
        let win_w = cell_w * unif(rng, 0.42, 0.68);
        let win_h = cell_h * unif(rng, 0.45, 0.66);
        let has_door = rng.random_bool(0.6);
        let door_col = int(rng, 0, cols - 1);
        let door_colour = [unif(rng, 110.0, 150.0), unif(rng, 72.0, 98.0), unif(rng, 44.0, 68.0)];
        let mut windows = Vec::with_capacity(rows * cols);
        let mut door = None;
        let mut storey_lines = Vec::with_capacity(rows);
        for row in 0..rows {
            let cell_y = top + margin_top + row as f32 * cell_h;
            if row > 0 {
                storey_lines.push(cell_y);
            }
            for col in 0..cols {
                let wx = x0 + margin_x + col as f32 * cell_w + (cell_w - win_w) / 2.0;
                let wy = cell_y + (cell_h - win_h) * 0.4;
                if has_door && row + 1 == rows && col == door_col {
                    let dw = cell_w * unif(rng, 0.45, 0.65);
                    let dx = x0 + margin_x + col as f32 * cell_w + (cell_w - dw) / 2.0;
                    door = Some((Rect { x0: dx, y0: wy, x1: dx + dw, y1 }, door_colour));
                } else {
                    windows.push(Rect { x0: wx, y0: wy, x1: wx + win_w, y1: wy + win_h });
                }
            }
        }
        let frame = if rng.random_bool(0.5) {
            grey(unif(rng, 200.0, 235.0))
        } else {
            [unif(rng, 70.0, 95.0), unif(rng, 58.0, 75.0), unif(rng, 45.0, 60.0)]
        };
        // Glass is a dark, only slightly blue grey: bright enough not to read as a crack or a
        // hole, grey enough not to read as sky.
        let gr = unif(rng, 64.0, 88.0);
        let glass = [gr, gr + unif(rng, 2.0, 10.0), gr + unif(rng, 5.0, 18.0)];

        // A drainpipe: a straight dark line, a distractor for cracks at every level.
        let pipe = if rng.random_bool(0.4) {
            let w = s * unif(rng, 0.008, 0.016);
            let px = if rng.random_bool(0.5) { x0 + s * 0.01 } else { x1 - s * 0.01 - w };
            Some((Rect { x0: px, y0: top, x1: px + w, y1 }, grey(unif(rng, 62.0, 90.0))))
        } else {
            None
        };

        Scene {
            s,
            sky_top,
            sky_horizon,
            clouds,
            ground_y,
            ground_top,
            ground_bottom,
            facade,
            wall,
            light_slope,
            cornice,
            storey_lines,
            pipe,
            windows,
            frame,
            glass,
            door,
            brightness: unif(rng, 0.82, 1.12),
            tint: unif(rng, -0.05, 0.05),
            noise: unif(rng, 3.0, 7.0),
        }
    }

    fn sky_at(&self, y: f32) -> Rgb {
        let t = (y / self.ground_y).clamp(0.0, 1.0);
        mix(self.sky_top, self.sky_horizon, t.powf(1.5))
    }

    fn wall_at(&self, x: f32) -> Rgb {
        let f = &self.facade;
        let u = (x - (f.x0 + f.x1) / 2.0) / (f.width() / 2.0).max(1.0);
        scale(self.wall, 1.0 + self.light_slope * u)
    }

    /// The facade including its cornice overhang: everything a collapse can remove.
    fn building(&self) -> Rect {
        let f = self.facade;
        match self.cornice {
            Some((c, _)) => Rect { x0: f.x0.min(c.x0), x1: f.x1.max(c.x1), ..f },
            None => f,
        }
    }

    fn paint(&self, canvas: &mut Canvas) {
        let n = canvas.size;
        let s = self.s;
        for y in 0..n {
            let cy = y as f32 + 0.5;
            let c = if cy < self.ground_y {
                self.sky_at(cy)
            } else {
                let t = (cy - self.ground_y) / (s - self.ground_y).max(1.0);
                mix(self.ground_top, self.ground_bottom, t)
            };
            canvas.px[y * n..(y + 1) * n].fill(c);
        }
        let all = canvas.bounds();
        for &(centre, rx, ry, alpha) in &self.clouds {
            let sky_clip = Rect { y1: self.ground_y, ..all };
            canvas.fill_ellipse(centre, rx, ry, sky_clip, [236.0, 240.0, 248.0], alpha);
        }

        let f = self.facade;
        for y in span(f.y0, f.y1, n) {
            for x in span(f.x0, f.x1, n) {
                let c = self.wall_at(x as f32 + 0.5);
                canvas.put(x, y, c, 1.0);
            }
        }
        for &ly in &self.storey_lines {
            let band = Rect { y0: ly - 0.006 * s, y1: ly + 0.006 * s, ..f };
            canvas.fill_rect(band, scale(self.wall, 0.86), 0.6);
        }
        if let Some((r, c)) = self.cornice {
            canvas.fill_rect(r, c, 1.0);
        }
        if let Some((r, c)) = self.pipe {
            canvas.fill_rect(r, c, 1.0);
        }
        let fw = 0.008 * s;
        for w in &self.windows {
            let outer = Rect { x0: w.x0 - fw, y0: w.y0 - fw, x1: w.x1 + fw, y1: w.y1 + fw };
            canvas.fill_rect(outer, self.frame, 1.0);
            self.paint_glass(canvas, *w);
            let sill = Rect { x0: w.x0 - 2.0 * fw, y0: w.y1 + fw, x1: w.x1 + 2.0 * fw, y1: w.y1 + 2.5 * fw };
            canvas.fill_rect(sill, scale(self.wall, 1.12), 1.0);
        }
        if let Some((r, c)) = self.door {
            let outer = Rect { x0: r.x0 - fw, y0: r.y0 - fw, x1: r.x1 + fw, ..r };
            canvas.fill_rect(outer, self.frame, 1.0);
            canvas.fill_rect(r, c, 1.0);
        }
    }

    /// Glass with a soft diagonal reflection streak.
    fn paint_glass(&self, canvas: &mut Canvas, w: Rect) {
        let n = canvas.size;
        for y in span(w.y0, w.y1, n) {
            let v = (y as f32 + 0.5 - w.y0) / w.height().max(1.0);
            for x in span(w.x0, w.x1, n) {
                let u = (x as f32 + 0.5 - w.x0) / w.width().max(1.0);
                let streak = (1.0 - ((u + v) - 0.9).abs() / 0.25).max(0.0);
                let c = self.glass;
                canvas.put(x, y, [c[0] + 16.0 * streak, c[1] + 16.0 * streak, c[2] + 16.0 * streak], 1.0);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Damage. Ranges overlap between neighbouring levels on purpose: a classifier should have to
// weigh several cues, not count one feature.

fn damage(level: usize, scene: &Scene, canvas: &mut Canvas, rng: &mut ChaCha8Rng) {
    let s = scene.s;
    let px = s / 96.0; // widths below are tuned for 96-pixel images
    let f = scene.facade;

    // Stains are distractors: darker blotches that are not cracks, most common on intact walls.
    let stains = match level {
        0 => int(rng, 0, 3),
        _ => int(rng, 0, 2),
    };
    for _ in 0..stains {
        stain(scene, canvas, rng);
    }

    let crack_colour =
        |rng: &mut ChaCha8Rng| [unif(rng, 25.0, 45.0), unif(rng, 22.0, 40.0), unif(rng, 20.0, 35.0)];
    match level {
        0 => {
            // A faint hairline: wall-toned, not crack-dark.
            if rng.random_bool(0.25) {
                let c = scale(scene.wall, unif(rng, 0.55, 0.7));
                let len = s * unif(rng, 0.05, 0.12);
                crack(scene, canvas, rng, 1.0 * px, len, c);
            }
        }
        1 => {
            for _ in 0..int(rng, 1, 4) {
                let c = crack_colour(rng);
                let w = unif(rng, 0.9, 1.4) * px;
                let len = s * unif(rng, 0.08, 0.22);
                crack(scene, canvas, rng, w, len, c);
            }
        }
        _ => {
            let (n, wmax) = if level == 2 { (int(rng, 3, 8), 2.4) } else { (int(rng, 2, 7), 2.6) };
            for _ in 0..n {
                let c = crack_colour(rng);
                let w = unif(rng, 1.1, wmax) * px;
                let len = s * unif(rng, 0.12, 0.34);
                crack(scene, canvas, rng, w, len, c);
            }
        }
    }

    let broken = match level {
        0 => 0,
        1 => usize::from(rng.random_bool(0.35)),
        2 => int(rng, 1, 3),
        _ => int(rng, 2, 2 + scene.windows.len() / 2),
    };
    let mut order: Vec<usize> = (0..scene.windows.len()).collect();
    for i in 0..broken.min(order.len()) {
        let j = int(rng, i, order.len() - 1);
        order.swap(i, j);
        break_window(scene, canvas, rng, scene.windows[order[i]]);
    }

    match level {
        0 => {}
        1 => {
            // Occasionally a few fallen fragments, no pile.
            if rng.random_bool(0.2) {
                let w = f.width() * unif(rng, 0.1, 0.25);
                let x = unif(rng, f.x0 + w / 2.0, f.x1 - w / 2.0);
                let loose = int(rng, 3, 8);
                rubble(scene, canvas, rng, x, w, 0.0, loose);
            }
        }
        2 => {
            // Now and then a small bite out of the roofline, overlapping with level 3.
            if rng.random_bool(0.15) {
                collapse(scene, canvas, rng, false);
            }
            if rng.random_bool(0.85) {
                let w = f.width() * unif(rng, 0.15, 0.4);
                let x = unif(rng, f.x0 + w / 2.0, f.x1 - w / 2.0);
                let h = s * unif(rng, 0.035, 0.08);
                rubble(scene, canvas, rng, x, w, h, 0);
            }
        }
        _ => {
            let cut_x = collapse(scene, canvas, rng, true);
            let w = f.width() * unif(rng, 0.4, 0.9);
            let x = (cut_x + unif(rng, -0.1, 0.1) * f.width()).clamp(f.x0, f.x1);
            let h = s * unif(rng, 0.07, 0.16);
            rubble(scene, canvas, rng, x, w, h, 0);
        }
    }
}

fn stain(scene: &Scene, canvas: &mut Canvas, rng: &mut ChaCha8Rng) {
    let f = scene.facade;
    let s = scene.s;
    let centre = (unif(rng, f.x0, f.x1), unif(rng, f.y0, f.y1));
    let r = s * unif(rng, 0.02, 0.06);
    let colour = mix(scale(scene.wall, unif(rng, 0.55, 0.8)), [110.0, 92.0, 62.0], unif(rng, 0.0, 0.4));
    let alpha = unif(rng, 0.25, 0.5);
    for _ in 0..int(rng, 2, 4) {
        let c = (centre.0 + unif(rng, -r, r), centre.1 + unif(rng, -r, r) * 0.6);
        let rx = r * unif(rng, 0.5, 1.0);
        // Run-off streaks are taller than wide.
        let ry = rx * unif(rng, 1.0, 2.5);
        canvas.fill_ellipse(c, rx, ry, f, colour, alpha);
    }
}

/// A random-walk polyline from a random point or window corner, with an occasional branch.
fn crack(scene: &Scene, canvas: &mut Canvas, rng: &mut ChaCha8Rng, width: f32, length: f32, c: Rgb) {
    let f = scene.facade;
    let start = if !scene.windows.is_empty() && rng.random_bool(0.5) {
        // Cracks like to start at window corners, where stress concentrates.
        let w = scene.windows[int(rng, 0, scene.windows.len() - 1)];
        match int(rng, 0, 3) {
            0 => (w.x0, w.y0),
            1 => (w.x1, w.y0),
            2 => (w.x0, w.y1),
            _ => (w.x1, w.y1),
        }
    } else {
        (unif(rng, f.x0, f.x1), unif(rng, f.y0, f.y1))
    };
    let step = (scene.s * 0.02).max(1.0);
    let angle = unif(rng, 0.0, TAU);
    let pts = walk(rng, start, angle, step, length);
    canvas.stroke(&pts, width, f, c);
    if pts.len() > 3 && rng.random_bool(0.35) {
        let from = pts[pts.len() / 2];
        let turn = unif(rng, -1.2, 1.2);
        let branch = walk(rng, from, angle + turn, step, length * 0.45);
        canvas.stroke(&branch, (width * 0.7).max(1.0), f, c);
    }
}

fn walk(rng: &mut ChaCha8Rng, start: Pt, mut angle: f32, step: f32, length: f32) -> Vec<Pt> {
    let n = ((length / step).ceil() as usize).max(2);
    let mut pts = Vec::with_capacity(n + 1);
    let mut p = start;
    pts.push(p);
    for _ in 0..n {
        angle += unif(rng, -0.7, 0.7);
        p = (p.0 + step * angle.cos(), p.1 + step * angle.sin());
        pts.push(p);
    }
    pts
}

/// A dark hole with a few jagged shards of glass left along the frame.
fn break_window(scene: &Scene, canvas: &mut Canvas, rng: &mut ChaCha8Rng, w: Rect) {
    canvas.fill_rect(w, grey(unif(rng, 10.0, 26.0)), 1.0);
    for _ in 0..int(rng, 2, 5) {
        let (t0, t1) = (unif(rng, 0.0, 1.0), unif(rng, 0.0, 1.0));
        let depth = unif(rng, 0.2, 0.6);
        let tip = unif(rng, 0.0, 1.0);
        let (dx, dy) = (w.width(), w.height());
        let tri = match int(rng, 0, 3) {
            0 => [(w.x0 + t0 * dx, w.y0), (w.x0 + t1 * dx, w.y0), (w.x0 + tip * dx, w.y0 + depth * dy)],
            1 => [(w.x0 + t0 * dx, w.y1), (w.x0 + t1 * dx, w.y1), (w.x0 + tip * dx, w.y1 - depth * dy)],
            2 => [(w.x0, w.y0 + t0 * dy), (w.x0, w.y0 + t1 * dy), (w.x0 + depth * dx, w.y0 + tip * dy)],
            _ => [(w.x1, w.y0 + t0 * dy), (w.x1, w.y0 + t1 * dy), (w.x1 - depth * dx, w.y0 + tip * dy)],
        };
        canvas.fill_polygon(&tri, w, scale(scene.glass, unif(rng, 0.95, 1.3)), 1.0);
    }
}

/// Removes part of the building, repainting sky behind a jagged broken edge. `severe` takes a
/// large corner or roofline chunk; otherwise a small bite out of the roofline. Returns the
/// horizontal centre of the removed part, where the rubble should fall.
fn collapse(scene: &Scene, canvas: &mut Canvas, rng: &mut ChaCha8Rng, severe: bool) -> f32 {
    let b = scene.building();
    let s = scene.s;
    let n = canvas.size;
    let (bw, bh) = (b.width(), b.height());
    // Depth profile over the cut span, as a function of u in [0, 1] across it.
    let corner = severe && rng.random_bool(0.6);
    let (x_start, x_end, depth_max, shape) = if corner {
        let w = bw * unif(rng, 0.3, 0.6);
        let right = rng.random_bool(0.5);
        let p = unif(rng, 0.6, 1.5);
        if right {
            (b.x1 - w, b.x1 + 1.0, bh * unif(rng, 0.4, 0.8), Shape::RampUp(p))
        } else {
            (b.x0 - 1.0, b.x0 + w, bh * unif(rng, 0.4, 0.8), Shape::RampDown(p))
        }
    } else {
        let (wlo, whi, dlo, dhi) = if severe { (0.3, 0.55, 0.35, 0.7) } else { (0.08, 0.2, 0.05, 0.12) };
        let w = bw * unif(rng, wlo, whi);
        let x = unif(rng, b.x0, b.x1 - w);
        (x, x + w, bh * unif(rng, dlo, dhi), Shape::Notch(unif(rng, 0.7, 2.0)))
    };

    let cols = span(x_start, x_end, n);
    let mut cut = vec![false; n * n];
    let mut jag = 0.0f32;
    let jag_step = s * 0.02;
    let jag_max = s * 0.05;
    for x in cols.clone() {
        let u = ((x as f32 + 0.5 - x_start) / (x_end - x_start).max(1.0)).clamp(0.0, 1.0);
        jag = (jag + unif(rng, -jag_step, jag_step)).clamp(-jag_max, jag_max);
        let depth = (depth_max * shape.at(u) + jag).max(0.0);
        for y in span(b.y0, b.y0 + depth, n) {
            if b.contains(x as f32 + 0.5, y as f32 + 0.5) {
                cut[y * n + x] = true;
                canvas.px[y * n + x] = scene.sky_at(y as f32 + 0.5);
            }
        }
    }

    // Broken concrete showing along the new edge.
    let rim_colour = grey(unif(rng, 72.0, 100.0));
    let rim = if s >= 128.0 { 2 } else { 1 };
    let mut rim_pts = Vec::new();
    for y in span(b.y0, b.y1, n) {
        for x in span(b.x0, b.x1, n) {
            if cut[y * n + x] {
                continue;
            }
            let near_cut = (y.saturating_sub(rim)..=(y + rim).min(n - 1))
                .any(|yy| (x.saturating_sub(rim)..=(x + rim).min(n - 1)).any(|xx| cut[yy * n + xx]));
            if near_cut {
                canvas.put(x, y, rim_colour, 1.0);
                rim_pts.push((x as f32 + 0.5, y as f32 + 0.5));
            }
        }
    }
    // Bent reinforcement bars and, for severe damage, a slab hanging at an angle.
    if !rim_pts.is_empty() {
        let all = canvas.bounds();
        for _ in 0..int(rng, if severe { 2 } else { 0 }, if severe { 5 } else { 2 }) {
            let p = rim_pts[int(rng, 0, rim_pts.len() - 1)];
            let a = unif(rng, -2.8, -0.3); // pointing up into the gap
            let len = s * unif(rng, 0.02, 0.05);
            let q = (p.0 + len * a.cos(), p.1 + len * a.sin());
            canvas.stroke(&[p, q], 1.0, all, grey(unif(rng, 40.0, 62.0)));
        }
        if severe && rng.random_bool(0.5) {
            let p = rim_pts[int(rng, 0, rim_pts.len() - 1)];
            let a = unif(rng, 0.35, 0.9) * if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            let len = s * unif(rng, 0.08, 0.15);
            let th = s * unif(rng, 0.015, 0.03);
            let (dx, dy) = (len * a.cos(), len * a.sin().abs());
            let dir = if p.0 < (b.x0 + b.x1) / 2.0 { 1.0 } else { -1.0 };
            let slab = [p, (p.0 + dir * dx, p.1 + dy), (p.0 + dir * dx, p.1 + dy + th), (p.0, p.1 + th)];
            canvas.fill_polygon(&slab, all, scale(scene.wall, unif(rng, 0.55, 0.8)), 1.0);
        }
    }
    (x_start.max(b.x0) + x_end.min(b.x1)) / 2.0
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    /// Depth grows towards u = 1 (the right-hand corner is gone).
    RampUp(f32),
    /// Depth grows towards u = 0 (the left-hand corner is gone).
    RampDown(f32),
    /// Deepest in the middle.
    Notch(f32),
}

impl Shape {
    fn at(self, u: f32) -> f32 {
        match self {
            Shape::RampUp(p) => u.powf(p),
            Shape::RampDown(p) => (1.0 - u).powf(p),
            Shape::Notch(p) => 1.0 - (2.0 * u - 1.0).abs().powf(p),
        }
    }
}

/// A mound of debris `height` tall and `width` wide at the facade's base, centred on `cx`,
/// strewn with angular chunks. `height` 0 gives `loose` scattered fragments and no mound.
fn rubble(
    scene: &Scene,
    canvas: &mut Canvas,
    rng: &mut ChaCha8Rng,
    cx: f32,
    width: f32,
    height: f32,
    loose: usize,
) {
    let s = scene.s;
    let n = canvas.size;
    let base = scene.facade.y1 + s * 0.01;
    let half = width / 2.0;
    let dust = mix(scale(scene.wall, 0.75), [122.0, 116.0, 106.0], 0.4);
    let all = canvas.bounds();

    let mut profile = Vec::new();
    if height > 0.0 {
        let mut jag = 0.0f32;
        for x in span(cx - half, cx + half, n) {
            let u = (x as f32 + 0.5 - cx) / half.max(1.0);
            jag = (jag + unif(rng, -0.06, 0.06)).clamp(-0.2, 0.2);
            let h = height * (1.0 - u * u).max(0.0).powf(0.6) * (1.0 + jag);
            for y in span(base - h, base, n) {
                let t = (base - (y as f32 + 0.5)) / height.max(1.0);
                canvas.put(x, y, scale(dust, 0.85 + 0.2 * t), 1.0);
            }
            profile.push((x as f32 + 0.5, h));
        }
    }

    let chunks = if height > 0.0 {
        ((width * height) / (s * s) * 2200.0).round().clamp(4.0, 400.0) as usize
    } else {
        loose
    };
    for _ in 0..chunks {
        let (x, y) = if profile.is_empty() {
            (cx + unif(rng, -half, half), base - unif(rng, 0.0, 0.02 * s))
        } else {
            let (x, h) = profile[int(rng, 0, profile.len() - 1)];
            (x, base - h * unif(rng, 0.0, 1.0))
        };
        let r = s * unif(rng, 0.008, 0.025);
        let colour = match int(rng, 0, 9) {
            0..=3 => scale(scene.wall, unif(rng, 0.6, 1.0)),
            4..=7 => grey(unif(rng, 105.0, 170.0)),
            _ => grey(unif(rng, 25.0, 50.0)), // shadowed gaps between chunks
        };
        let a0 = unif(rng, 0.0, TAU);
        let quad: Vec<Pt> = (0..4)
            .map(|k| {
                let a = a0 + k as f32 * TAU / 4.0 + unif(rng, -0.4, 0.4);
                let rr = r * unif(rng, 0.6, 1.2);
                (x + rr * a.cos(), y + rr * a.sin())
            })
            .collect();
        canvas.fill_polygon(&quad, all, colour, 1.0);
    }
}

/// Lighting, colour temperature and sensor noise, then quantisation to 8 bits.
fn finish(scene: &Scene, canvas: &Canvas, rng: &mut ChaCha8Rng, size: u32) -> RgbImage {
    let gain =
        [scene.brightness * (1.0 + scene.tint), scene.brightness, scene.brightness * (1.0 - scene.tint)];
    let mut img = RgbImage::new(size, size);
    // pixels_mut runs row by row, the canvas's own layout.
    for (p, c) in img.pixels_mut().zip(&canvas.px) {
        let bits = rng.next_u32();
        for ch in 0..3 {
            let byte = ((bits >> (8 * ch)) & 0xff) as f32;
            let noise = (byte / 255.0 - 0.5) * 2.0 * scene.noise;
            p.0[ch] = (c[ch] * gain[ch] + noise).round().clamp(0.0, 255.0) as u8;
        }
    }
    img
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

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
    fn seeds_differ_across_split_class_and_index() {
        let mut seen = std::collections::HashSet::new();
        for split in [Split::Train, Split::Val] {
            for class in 0..4 {
                for index in 0..50 {
                    assert!(seen.insert(image_seed(0, split, class, index)));
                }
            }
        }
    }

    fn luma(p: &image::Rgb<u8>) -> f32 {
        0.299 * p.0[0] as f32 + 0.587 * p.0[1] as f32 + 0.114 * p.0[2] as f32
    }

    /// Fraction of near-black pixels: cracks, holes of broken windows, rubble shadows.
    fn dark_fraction(img: &RgbImage) -> f32 {
        let n = img.pixels().filter(|p| luma(p) < 55.0).count();
        n as f32 / (img.width() * img.height()) as f32
    }

    /// Fraction of clearly blue pixels: sky, including sky showing where the building is gone.
    fn sky_fraction(img: &RgbImage) -> f32 {
        let n = img
            .pixels()
            .filter(|p| {
                let [r, g, b] = p.0.map(f32::from);
                b > r + 30.0 && b > g + 10.0
            })
            .count();
        n as f32 / (img.width() * img.height()) as f32
    }

    #[test]
    fn damage_statistics_grow_with_level() {
        const N: u64 = 20;
        let mut dark = [0.0f32; 4];
        let mut sky = [0.0f32; 4];
        for i in 0..N {
            for level in 0..4 {
                // Same seed at every level: same building, different damage.
                let mut rng = ChaCha8Rng::seed_from_u64(1000 + i);
                let img = render(level, &mut rng, 64);
                dark[level] += dark_fraction(&img) / N as f32;
                sky[level] += sky_fraction(&img) / N as f32;
            }
        }
        assert!(dark[0] < 0.01, "intact facades should be almost free of dark pixels: {dark:?}");
        assert!(dark[1] > dark[0] + 0.005, "{dark:?}");
        assert!(dark[2] > dark[1] + 0.01, "{dark:?}");
        assert!(dark[3] > dark[1] + 0.01, "{dark:?}");
        assert!(sky[3] > sky[2] + 0.02, "collapse should expose sky: {sky:?}");
        assert!((sky[1] - sky[0]).abs() < 0.01, "{sky:?}");
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
