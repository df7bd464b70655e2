//! `rtrain data`: getting datasets in and ready — the synthetic sets, IDX import, shard sets
//! (prepare, verify, stage), downloads and archives. Each command's arguments become the
//! library's options in one place (`options`), so a new flag touches its struct and that.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

use super::print;
use crate::config::{Config, DEFAULT_DATA_ROOT};
use crate::data::shards;
use crate::ingest::shard_writer::{self, PrepareOptions};
use crate::ingest::{idx, synth};
use crate::util::{extract, fetch};

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Generate the built-in synthetic building-damage set (4 levels) as an image tree.
    Synth(SynthArgs),
    /// Convert IDX files (MNIST, Fashion-MNIST) into OUT/<split>/<class>/*.png.
    ImportIdx(ImportIdxArgs),
    /// Convert an image tree (SRC/<split>/<class>/*) into WebDataset tar shards + shards.json.
    Prepare(PrepareArgs),
    /// Re-hash a shard directory against its shards.json; names every bad shard.
    Verify(ShardVerifyArgs),
    /// Copy a shard directory to DEST (e.g. node-local disk), skipping shards already there
    /// with the right hash, verifying each copy.
    Stage(StageArgs),
    /// Download URL to OUT, resuming and retrying, and check its sha256 before it appears.
    Fetch(FetchArgs),
    /// Extract a tar, tar.gz or zip archive into DEST, refusing entries that would escape it
    /// (and, in zips, encrypted entries, compression bombs and overlapping entries).
    Extract(ExtractArgs),
}

impl DataCommand {
    pub(super) fn run(self) -> Result<()> {
        match self {
            DataCommand::Synth(args) => args.run(),
            DataCommand::ImportIdx(args) => args.run(),
            DataCommand::Prepare(args) => args.run(),
            DataCommand::Verify(args) => args.run(),
            DataCommand::Stage(args) => args.run(),
            DataCommand::Fetch(args) => args.run(),
            DataCommand::Extract(args) => args.run(),
        }
    }
}

/// `rtrain data synth --layout`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum SynthLayout {
    Facades,
    Designsafe,
}

#[derive(Debug, Args)]
pub struct SynthArgs {
    out: PathBuf,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 200)]
    train_per_class: usize,
    #[arg(long, default_value_t = 50)]
    val_per_class: usize,
    #[arg(long, default_value_t = 96)]
    image_size: u32,
    /// `facades`: train/val, four damage levels, square --image-size JPEGs. `designsafe`: the
    /// case study's Train/Validation, C0/C2/C4, camera and phone JPEGs of mixed sizes (up to
    /// 6000x4000), some stored sideways with an Exif orientation tag.
    #[arg(long, value_enum, default_value_t = SynthLayout::Facades)]
    layout: SynthLayout,
    /// designsafe: training photos in all (the case study has 1322).
    #[arg(long, default_value_t = 1322)]
    train_images: usize,
    /// designsafe: validation photos in all (the case study has 363).
    #[arg(long, default_value_t = 363)]
    val_images: usize,
    /// designsafe: every photo's sides times this (1 = full camera size; 0.1 for quick tests).
    #[arg(long, default_value_t = 1.0)]
    photo_scale: f64,
    /// designsafe: how the photos of each split divide among C0, C2, C4, e.g. `70,20,10` (an
    /// imbalanced set, as damage surveys are); default: evenly.
    #[arg(long, value_delimiter = ',')]
    class_shares: Vec<f64>,
}

impl SynthArgs {
    fn options(&self) -> synth::SynthOptions {
        let layout = match self.layout {
            SynthLayout::Facades => synth::Layout::Facades,
            SynthLayout::Designsafe => synth::Layout::DesignSafe {
                train_images: self.train_images,
                val_images: self.val_images,
                photo_scale: self.photo_scale,
                class_shares: self.class_shares.clone(),
            },
        };
        synth::SynthOptions {
            seed: self.seed,
            train_per_class: self.train_per_class,
            val_per_class: self.val_per_class,
            image_size: self.image_size,
            layout,
        }
    }

    fn run(self) -> Result<()> {
        let summary = synth::generate(&self.out, &self.options())?;
        let (train, val) = (summary.train_images, summary.val_images);
        println!("{}: {train} training and {val} validation images", self.out.display());
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct ImportIdxArgs {
    images: PathBuf,
    labels: PathBuf,
    out: PathBuf,
    #[arg(long, default_value = "train")]
    split: String,
    /// Keep only the first N images.
    #[arg(long)]
    limit: Option<usize>,
    /// Name classes by number instead of by Fashion-MNIST's class names.
    #[arg(long)]
    numeric_classes: bool,
}

impl ImportIdxArgs {
    fn run(self) -> Result<()> {
        let names: Option<&[&str]> =
            if self.numeric_classes { None } else { Some(&idx::FASHION_MNIST_CLASSES) };
        let written = idx::import(&self.images, &self.labels, &self.out, &self.split, self.limit, names)?;
        println!("{}: {written} images", self.out.join(&self.split).display());
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct PrepareArgs {
    src: PathBuf,
    out: PathBuf,
    /// The splits to convert (subdirectories of SRC).
    #[arg(long, value_delimiter = ',', default_value = "train,val")]
    splits: Vec<String>,
    /// Close a shard before it grows past this many MiB.
    #[arg(long, default_value_t = 256)]
    shard_mb: u64,
    /// Re-encode images as JPEG with this short side (never enlarging); unset: store as is.
    #[arg(long)]
    resize: Option<u32>,
    /// JPEG quality when re-encoding.
    #[arg(long, default_value_t = 90)]
    quality: u8,
    /// Seeds the order of samples across shards.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// With --resize, turn photos upright by their Exif orientation before re-encoding
    /// (the new file has no tag); false keeps the stored pixels.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    exif_orientation: bool,
}

impl PrepareArgs {
    fn options(&self) -> PrepareOptions {
        PrepareOptions {
            splits: self.splits.clone(),
            shard_bytes: self.shard_mb << 20,
            resize: self.resize,
            quality: self.quality,
            seed: self.seed,
            exif_orientation: self.exif_orientation,
        }
    }

    fn run(self) -> Result<()> {
        print::prepared_shards(&self.out, &shard_writer::prepare(&self.src, &self.out, &self.options())?);
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct ShardVerifyArgs {
    dir: PathBuf,
}

impl ShardVerifyArgs {
    fn run(self) -> Result<()> {
        let dir = self.dir.display();
        let report = shards::verify(&self.dir)?;
        for (name, problem) in &report.bad {
            println!("{dir}: BAD {name}: {problem}");
        }
        if !report.bad.is_empty() {
            let (bad, all) = (report.bad.len(), report.shards);
            bail!("{dir}: {bad} of {all} shard(s) do not match {}", shards::SHARDS_JSON);
        }
        println!("{dir}: {} shard(s), {} bytes: ok", report.shards, report.bytes);
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct StageArgs {
    src: PathBuf,
    dest: PathBuf,
}

impl StageArgs {
    fn run(self) -> Result<()> {
        let report = shards::stage(&self.src, &self.dest)?;
        println!(
            "{}: {} shard(s) copied ({} bytes), {} already present",
            self.dest.display(),
            report.copied,
            report.bytes_copied,
            report.skipped
        );
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct FetchArgs {
    url: String,
    out: PathBuf,
    /// The expected sha256 (hex) of the file.
    #[arg(long)]
    sha256: String,
    /// Allow plain http to hosts other than loopback (no transport security).
    #[arg(long)]
    allow_http: bool,
    /// Retries of transient failures in a row (connection errors, 5xx, truncated bodies);
    /// an attempt that makes progress resets the count.
    #[arg(long, default_value_t = 5)]
    retries: u32,
    /// Give up on a request that sends nothing for this long (e.g. 60s, 5m), or fewer than
    /// 1 KiB a second over that long (a stalled transfer; retried, and counted as a failure).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The file's size in bytes, where the data portal lists it: a body running past it is cut
    /// off (an endless one cannot fill the disk) and another announced size refused.
    #[arg(long)]
    size: Option<u64>,
    /// No progress bar (log lines instead).
    #[arg(long)]
    no_progress: bool,
}

impl FetchArgs {
    fn options(&self) -> fetch::FetchOptions {
        fetch::FetchOptions {
            sha256: self.sha256.clone(),
            allow_http: self.allow_http,
            retries: self.retries,
            timeout: self.timeout,
            progress: !self.no_progress,
            size: self.size,
            ..fetch::FetchOptions::default()
        }
    }

    fn run(self) -> Result<()> {
        let fetched = fetch::fetch(&self.url, &self.out, &self.options())?;
        println!(
            "{}: {} bytes, sha256 ok ({} attempt(s), resumed from byte {})",
            fetched.path.display(),
            fetched.bytes,
            fetched.attempts,
            fetched.resumed_from
        );
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct ExtractArgs {
    archive: PathBuf,
    dest: PathBuf,
    /// Refuse archives that unpack to more than this many GiB (ImageNet-1k's training tar
    /// is about 140).
    #[arg(long, default_value_t = 256)]
    max_gib: u64,
    /// Refuse archives with more entries than this.
    #[arg(long, default_value_t = 10_000_000)]
    max_entries: u64,
}

impl ExtractArgs {
    fn limits(&self) -> extract::ExtractLimits {
        extract::ExtractLimits { max_bytes: self.max_gib << 30, max_entries: self.max_entries }
    }

    fn run(self) -> Result<()> {
        let extracted = extract::extract(&self.archive, &self.dest, &self.limits())?;
        println!("{}: {} files, {} bytes", self.dest.display(), extracted.files, extracted.bytes);
        Ok(())
    }
}

/// The built-in default data, generated on first use, but only at its default path: a
/// mistyped path of the user's must be an error, not a silent synthetic run. Training calls it
/// on one rank per node ([`crate::cluster::job::once_per_node`]).
pub(super) fn generate_default_data(config: &Config) -> Result<()> {
    let root = &config.data.root;
    if root == std::path::Path::new(DEFAULT_DATA_ROOT) && !root.exists() {
        tracing::info!(
            "generating the built-in synthetic damage-level dataset at {} (first use)",
            root.display()
        );
        let summary = synth::generate(root, &synth::SynthOptions::default())?;
        tracing::info!(
            "generated {} training and {} validation images",
            summary.train_images,
            summary.val_images
        );
    }
    Ok(())
}
