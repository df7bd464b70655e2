//! Writing the synthetic tree: the split, class and index of every image, the per-image seed
//! that makes each file a pure function of `(seed, split, class, index)`, the class folders, the
//! images written on the shared worker [`pool`], and the README. Publication is
//! [`atomic_dir`](crate::util::atomic_dir)'s.

use std::fs;
use std::path::Path;

use image::codecs::jpeg::JpegEncoder;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{
    photo, render, Layout, SynthError, SynthOptions, SynthSummary, CLASS_NAMES, DESIGNSAFE_CLASSES,
    GENERATOR_VERSION, JPEG_QUALITY,
};
use crate::ingest::photos;
use crate::ingest::pool::{self, Stopped};
use crate::util::io_error::IoError;
use crate::util::seeds::splitmix64;

#[derive(Debug, Clone, Copy)]
pub(super) enum Split {
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

/// Writes every image of `options` under `root` (class folders included) and its README.
pub(super) fn write(root: &Path, options: &SynthOptions) -> Result<SynthSummary, SynthError> {
    let mut jobs = Vec::new();
    let mut summary = SynthSummary { train_images: 0, val_images: 0 };
    for (split, counts) in options.splits() {
        for ((class, name), &count) in options.class_names().iter().enumerate().zip(&counts) {
            let dir = root.join(options.split_dir(split)).join(name);
            fs::create_dir_all(&dir).map_err(IoError::at(&dir, "create directory"))?;
            jobs.extend((0..count).map(|index| ImageToWrite { split, class, index }));
        }
        match split {
            Split::Train => summary.train_images = counts.iter().sum(),
            Split::Val => summary.val_images = counts.iter().sum(),
        }
    }
    // Each image has its own seed, so the split of work between threads cannot change any file.
    pool::for_each("synth", &jobs, |_, job| write_one(root, options, job)).map_err(
        |stopped| match stopped {
            Stopped::Failed(err) => err,
            Stopped::Spawn(err) => SynthError::Thread(err),
            Stopped::Panicked => SynthError::WorkerPanicked,
        },
    )?;
    let readme = root.join("README.txt");
    fs::write(&readme, readme_text(options, &summary)).map_err(IoError::at(&readme, "write"))?;
    Ok(summary)
}

fn write_one(root: &Path, options: &SynthOptions, job: &ImageToWrite) -> Result<(), SynthError> {
    let mut rng = ChaCha8Rng::seed_from_u64(image_seed(options.seed, job.split, job.class, job.index));
    let class = options.class_names()[job.class];
    let path = root.join(options.split_dir(job.split)).join(class).join(format!("{:05}.jpg", job.index));
    if let Layout::DesignSafe { photo_scale, .. } = options.layout {
        let kind = photos::pick(rng.next_u32());
        let bytes = photo(DESIGNSAFE_CLASSES[job.class].1, kind, photo_scale, &mut rng)
            .map_err(|source| SynthError::EncodePhoto { path: path.clone(), source })?;
        return Ok(fs::write(&path, &bytes).map_err(IoError::at(&path, "write"))?);
    }
    let img = render(job.class, &mut rng, options.image_size);
    let mut bytes = Vec::with_capacity(8 * 1024);
    JpegEncoder::new_with_quality(&mut bytes, JPEG_QUALITY)
        .encode_image(&img)
        .map_err(|source| SynthError::Encode { path: path.clone(), source })?;
    Ok(fs::write(&path, &bytes).map_err(IoError::at(&path, "write"))?)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
