//! The command line: clap definitions and one function per command, each a handful of calls
//! into the library; what the commands print is `print.rs`'s. `main.rs` maps the result to an
//! exit code (2 for usage and configuration errors, 1 for everything else).

mod print;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};
use tch::Device;

use crate::bench::{self, StepBench};
use crate::cluster::launcher;
use crate::cluster::{job, AllreduceAlgorithm};
use crate::config::{GradCompression, LoadedConfig};
use crate::data::ingest::{extract, fetch, idx, synth};
use crate::data::shards;
use crate::data::transforms::{Augment, Transform};
use crate::doctor;
use crate::jobs;
use crate::model::precision::{Compute, Precision};
use crate::model::{weights, Arch};
use crate::plan::{Resume, RunPlan};
use crate::predict;
use crate::report::{self, runs::RunData, scaling};
use crate::run_dir::checkpoint;
use crate::run_dir::manifest::{self, Manifest};
use crate::run_dir::RunPaths;
use crate::train::eval;
use crate::util::logging::{self, LogFormat};
use crate::util::tensor_io;

#[derive(Debug, Parser)]
#[command(
    name = "rtrain",
    version,
    about = "Data-parallel ResNet training on libtorch",
    propagate_version = true
)]
pub struct Cli {
    /// Log filter, e.g. `debug` or `rtrain=debug` (default: $RUST_LOG, else info).
    #[arg(long, global = true)]
    pub log_level: Option<String>,
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// In a multi-rank job, log at the chosen level on every rank (default: rank 0 logs, the
    /// others report warnings and errors only).
    #[arg(long, global = true)]
    pub log_all_ranks: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a model; writes a run directory (config, metrics, checkpoints, final weights).
    Train(TrainArgs),
    /// Evaluate a checkpoint on the validation split.
    Eval(EvalArgs),
    /// Classify images with a checkpoint.
    Predict(PredictArgs),
    /// Write a checkpoint's weights as a torchvision state dict (.safetensors).
    Export(ExportArgs),
    /// Datasets: the built-in synthetic set and IDX import.
    #[command(subcommand)]
    Data(DataCommand),
    /// Starting weights: torchvision's published ImageNet weights, and `.pth` conversion.
    #[command(subcommand)]
    Weights(WeightsCommand),
    /// The resolved configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Benchmarks comparable with PyTorch's.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// What rtrain sees here: libtorch, CPU, CUDA, and the precision `auto` resolves to.
    Doctor(DoctorArgs),
    /// Reports over finished runs.
    Report(ReportArgs),
    /// Re-hash a run's checkpoints, weights and data against its manifest.json.
    Verify(VerifyArgs),
    /// Re-run a run from its manifest.json and compare the results.
    Reproduce(ReproduceArgs),
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    pub run_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct ReproduceArgs {
    /// The run to reproduce (its manifest.json).
    pub run_dir: PathBuf,
    /// Re-run only the first N epochs (with the original schedule), and compare those.
    #[arg(long)]
    pub epochs: Option<u32>,
    /// Where the new run goes (default: RUN_DIR-reproduce).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// How training scales: time per epoch, img/s, speed-up and efficiency against the run
    /// with the fewest ranks (printed; no report directory).
    #[arg(long)]
    pub scaling: bool,
    /// Run directories (each with metrics.jsonl; manifest.json and summary.json where present).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Where report.md, the plots and the CSV go (default: RUN_DIR/report for one run,
    /// ./report for several).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// --scaling: also write the plot (SVG) here.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// --scaling: print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[arg(long)]
    pub json: bool,
}

/// `rtrain data synth --layout`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum SynthLayout {
    Facades,
    Designsafe,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// TOML configuration file (layered over the built-in defaults).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override one key, e.g. `--set train.epochs=3` (repeatable; wins over file and env).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl ConfigArgs {
    fn load(&self) -> Result<LoadedConfig> {
        Ok(LoadedConfig::load(self.config.as_deref(), &self.set)?)
    }
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Run directory (default: <run.dir>/<run.name>, or a timestamped name).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// `auto` (newest valid checkpoint in the run directory, else a fresh start) or a path.
    #[arg(long)]
    pub resume: Option<String>,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[arg(long)]
    pub checkpoint: PathBuf,
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PredictArgs {
    #[arg(long)]
    pub checkpoint: PathBuf,
    #[command(flatten)]
    pub config: ConfigArgs,
    /// How many classes to show per image.
    #[arg(long, default_value_t = 3)]
    pub top: usize,
    #[arg(long)]
    pub json: bool,
    #[arg(required = true)]
    pub images: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[arg(long)]
    pub checkpoint: PathBuf,
    pub out: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Generate the built-in synthetic building-damage set (4 levels) as an image tree.
    Synth {
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
    },
    /// Convert IDX files (MNIST, Fashion-MNIST) into OUT/<split>/<class>/*.png.
    ImportIdx {
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
    },
    /// Convert an image tree (SRC/<split>/<class>/*) into WebDataset tar shards + manifest.json.
    Prepare {
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
    },
    /// Re-hash a shard directory against its manifest.json; names every bad shard.
    Verify { dir: PathBuf },
    /// Copy a shard directory to DEST (e.g. node-local disk), skipping shards already there
    /// with the right hash, verifying each copy.
    Stage { src: PathBuf, dest: PathBuf },
    /// Download URL to OUT, resuming and retrying, and check its sha256 before it appears.
    Fetch {
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
        /// Give up on a request that sends nothing for this long (e.g. 60s, 5m).
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        timeout: Duration,
        /// No progress bar (log lines instead).
        #[arg(long)]
        no_progress: bool,
    },
    /// Extract a tar, tar.gz or zip archive into DEST, refusing entries that would escape it
    /// (and, in zips, encrypted entries, compression bombs and overlapping entries).
    Extract {
        archive: PathBuf,
        dest: PathBuf,
        /// Refuse archives that unpack to more than this many GiB (ImageNet-1k's training tar
        /// is about 140).
        #[arg(long, default_value_t = 256)]
        max_gib: u64,
        /// Refuse archives with more entries than this.
        #[arg(long, default_value_t = 10_000_000)]
        max_entries: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum WeightsCommand {
    /// Download torchvision's published weights into PyTorch's cache ($TORCH_HOME/hub/checkpoints),
    /// checked against the sha256 prefix in their file name; a file already there is checked.
    Fetch {
        #[arg(value_parser = parse_arch)]
        arch: Arch,
        /// torchvision's weights name (IMAGENET1K_V1, IMAGENET1K_V2), DEFAULT (the newest), or a
        /// file name in torch.hub's form NAME-SHA256PREFIX.pth on the server.
        #[arg(long, default_value = "DEFAULT")]
        weights: String,
        /// Download from this server instead of torchvision's (a mirror).
        #[arg(long, default_value = weights::TORCHVISION_BASE_URL)]
        base_url: String,
    },
    /// Write a `torch.save` state dict (.pth) as safetensors, tensor for tensor.
    Convert { input: PathBuf, output: PathBuf },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the resolved configuration with the origin of each value.
    Show(ConfigArgs),
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Time the training step (forward, backward, SGD) on random input.
    Step {
        #[arg(long, default_value = "resnet18", value_parser = parse_arch)]
        arch: Arch,
        #[arg(long, default_value_t = 64)]
        image_size: i64,
        #[arg(long, default_value_t = 32)]
        batch_size: i64,
        /// libtorch threads (0: all cores).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        #[arg(long, default_value_t = 3)]
        warmup: usize,
        #[arg(long, default_value_t = 10)]
        steps: usize,
        #[arg(long, value_enum, default_value_t = BenchPrecision::Fp32)]
        precision: BenchPrecision,
        /// Channels-last (NHWC) input and convolution weights.
        #[arg(long)]
        channels_last: bool,
        /// cpu, cuda or cuda:N.
        #[arg(long, default_value = "cpu", value_parser = parse_device)]
        device: Device,
        #[arg(long)]
        json: bool,
    },
    /// One training step on the CPU and on DEVICE from the same weights and batch: how far the
    /// loss, logits and updated weights differ (fp32; a GPU's TF32 convolutions differ a little).
    Agree {
        #[arg(long, default_value = "resnet18", value_parser = parse_arch)]
        arch: Arch,
        #[arg(long, default_value_t = 64)]
        image_size: i64,
        #[arg(long, default_value_t = 8)]
        batch_size: i64,
        /// cpu, cuda or cuda:N.
        #[arg(long, default_value = "cuda", value_parser = parse_device)]
        device: Device,
        /// Largest relative difference of the loss accepted.
        #[arg(long, default_value_t = 1e-3)]
        loss_tolerance: f64,
        /// Largest relative difference of the weight update accepted.
        #[arg(long, default_value_t = 5e-2)]
        update_tolerance: f64,
        #[arg(long)]
        json: bool,
    },
    /// The attainable GFLOP/s through libtorch (square matrix products), on the CPU or a GPU.
    Peak {
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// cpu, cuda or cuda:N.
        #[arg(long, default_value = "cpu", value_parser = parse_device)]
        device: Device,
        #[arg(long, default_value_t = 2048)]
        size: i64,
        #[arg(long, value_enum, default_value_t = BenchPrecision::Fp32)]
        precision: BenchPrecision,
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        #[arg(long)]
        json: bool,
    },
    /// Time the input pipeline (decode + RandomResizedCrop + flip + normalise into batches).
    Loader {
        /// A shard directory (rtrain data prepare) or an image tree.
        #[arg(long)]
        data: PathBuf,
        #[arg(long, default_value = "train")]
        split: String,
        /// Output side; default 224, or data.image_size with --config/--set.
        #[arg(long)]
        image_size: Option<u32>,
        /// Time a configuration's training transform (policy, geometry, data.jpeg_draft,
        /// data.exif_orientation) instead of torchvision's RandomResizedCrop + flip.
        #[command(flatten)]
        config: ConfigArgs,
        #[arg(long, default_value_t = 32)]
        batch_size: usize,
        /// Decoding threads (0: on the iterating thread).
        #[arg(long, default_value_t = 1)]
        workers: usize,
        #[arg(long, default_value_t = 2)]
        prefetch: usize,
        /// Batches timed (after one warm-up batch).
        #[arg(long, default_value_t = 20)]
        batches: usize,
        #[arg(long)]
        json: bool,
    },
    /// Time the gradient all-reduce per bucket size (run under mpirun; rank 0 prints).
    Allreduce {
        /// Models whose gradients to reduce.
        #[arg(long, value_delimiter = ',', default_value = "resnet18,resnet50", value_parser = parse_arch)]
        arch: Vec<Arch>,
        /// Bucket sizes in MiB.
        #[arg(long, value_delimiter = ',', default_value = "1,5,25,100")]
        bucket_mb: Vec<f64>,
        #[arg(long, default_value_t = 2)]
        warmup: usize,
        #[arg(long, default_value_t = 5)]
        iterations: usize,
        /// The link's rate in Gbit/s, to print bus bandwidth as a share of it.
        #[arg(long)]
        link_gbit: Option<f64>,
        /// The all-reduce algorithm to ask MPI for (as `dist.allreduce`).
        #[arg(long, value_enum, default_value_t = AllreduceAlgorithm::Auto)]
        algorithm: AllreduceAlgorithm,
        /// Time blocking calls instead of the communication thread's polled non-blocking ones.
        #[arg(long)]
        blocking: bool,
        /// Gradients on the wire as `dist.compress` sends them (cast, summed in that format,
        /// widened back).
        #[arg(long, value_enum, default_value_t = GradCompression::None)]
        compress: GradCompression,
        /// After timing, average ResNet-18's gradients as training does (with --compress) and
        /// compare them with the exact mean of every rank's gradients rounded to the wire
        /// format.
        #[arg(long)]
        check: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BenchPrecision {
    Fp32,
    Bf16,
}

impl From<BenchPrecision> for Precision {
    fn from(precision: BenchPrecision) -> Precision {
        match precision {
            BenchPrecision::Fp32 => Precision::Fp32,
            BenchPrecision::Bf16 => Precision::Bf16,
        }
    }
}

fn parse_device(name: &str) -> Result<Device, String> {
    crate::cluster::device::parse(name)
}

fn parse_arch(name: &str) -> Result<Arch, String> {
    Arch::parse(name).ok_or_else(|| {
        format!("unknown architecture {name:?} (resnet18, resnet34, resnet50, resnet101, resnet152)")
    })
}

fn cmd_weights(command: WeightsCommand) -> Result<()> {
    match command {
        WeightsCommand::Fetch { arch, weights: name, base_url } => {
            let file = weights::HubFile::resolve(arch, &name)?;
            let path = weights::fetch_to_cache(arch, &file, &base_url, true)?;
            println!("{arch} {}: {} (sha256 starts {})", file.name, path.display(), file.sha256_prefix());
        }
        WeightsCommand::Convert { input, output } => {
            let tensors = weights::read_state_dict(&input)?;
            let named: Vec<(String, tch::Tensor)> = tensors.into_iter().collect();
            tensor_io::write_safetensors(&output, &named, None)?;
            println!("{}: {} tensors from {}", output.display(), named.len(), input.display());
        }
    }
    Ok(())
}

pub fn run(cli: Cli) -> Result<()> {
    // The launcher's rank (MPI's own view, checked later, must agree) labels every log line.
    let rank =
        launcher::detect_from_process().ok().flatten().filter(|l| l.world_size != Some(1)).map(|l| l.rank);
    logging::init(cli.log_format, cli.log_level.as_deref(), rank, cli.log_all_ranks);
    let _rank_span = rank.map(|rank| tracing::info_span!("rank", rank).entered());
    match cli.command {
        Command::Train(args) => cmd_train(args),
        Command::Eval(args) => cmd_eval(args),
        Command::Predict(args) => cmd_predict(args),
        Command::Export(args) => cmd_export(args),
        Command::Data(command) => cmd_data(command),
        Command::Weights(command) => cmd_weights(command),
        Command::Doctor(args) => {
            let examination = doctor::examine(&args.config.load()?.config);
            match args.json {
                true => println!("{}", serde_json::to_string_pretty(&examination.to_json())?),
                false => print!("{}", examination.render()),
            }
            // The report is printed either way; the exit status lets scripts (apptainer.def's
            // %test, a job's first step) stop on a problem.
            match examination.problems.len() {
                0 => Ok(()),
                n => anyhow::bail!("doctor found {n} problem(s); each is printed above with its fix"),
            }
        }
        Command::Report(args) => cmd_report(args),
        Command::Verify(args) => cmd_verify(args),
        Command::Reproduce(args) => cmd_reproduce(args),
        Command::Config(ConfigCommand::Show(args)) => {
            print!("{}", args.load()?.show()?);
            Ok(())
        }
        Command::Bench(command) => cmd_bench(command),
    }
}

/// The exit status for a failed command: 2 for usage and configuration errors, 1 otherwise.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    job::exit_code(error)
}

fn cmd_train(args: TrainArgs) -> Result<()> {
    let loaded = args.config.load().map(|loaded| loaded.config);
    let resume = match args.resume.as_deref() {
        None => Resume::Fresh,
        Some("auto") => Resume::Auto,
        Some(path) => Resume::From(PathBuf::from(path)),
    };
    job::run_in_job(loaded, |config, comm| {
        if let Some(summary) = jobs::train(config, &comm, args.run_dir, resume)? {
            println!("{}", summary.display());
        }
        Ok(())
    })
}

fn cmd_reproduce(args: ReproduceArgs) -> Result<()> {
    let original = Manifest::read(&args.run_dir);
    let loaded = original.as_ref().map(|m| m.config.clone()).map_err(|e| anyhow::anyhow!("{e}"));
    job::run_in_job(loaded, |config, comm| {
        let original = original.map_err(|e| anyhow::anyhow!("{e}"))?;
        let compared = jobs::reproduce(config, &comm, (&original, &args.run_dir), args.epochs, args.out)?;
        let Some((out, verdict)) = compared else { return Ok(()) };
        for line in &verdict.lines {
            println!("{line}");
        }
        if !verdict.reproduced {
            bail!("{} did not reproduce {} (see above)", out.display(), args.run_dir.display());
        }
        Ok(())
    })
}

fn cmd_eval(args: EvalArgs) -> Result<()> {
    let config = args.config.load()?.config;
    let (report, classes) = eval::evaluate_checkpoint(&config, &args.checkpoint)?;
    print::eval_report(&report, &classes, args.json)
}

fn cmd_predict(args: PredictArgs) -> Result<()> {
    let config = args.config.load()?.config;
    let predictions = predict::predict_files(&config, &args.checkpoint, &args.images, args.top)?;
    print::predictions(&predictions, args.json)
}

fn cmd_export(args: ExportArgs) -> Result<()> {
    let (model, meta) = checkpoint::load_model(&args.checkpoint)?;
    model.write_torchvision(&args.out, meta.global_step, Some(meta.to_metadata()))?;
    println!(
        "{}: torchvision {} state dict, num_classes={} ({})",
        args.out.display(),
        meta.arch,
        meta.num_classes,
        meta.classes.join(", ")
    );
    Ok(())
}

fn cmd_verify(args: VerifyArgs) -> Result<()> {
    let findings = manifest::verify(&args.run_dir)?;
    let bad = print::verify_findings(&findings);
    if bad > 0 {
        let manifest = RunPaths::new(&args.run_dir).manifest();
        bail!("{}: {bad} file(s) differ from {}", args.run_dir.display(), manifest.display());
    }
    Ok(())
}

fn cmd_report(args: ReportArgs) -> Result<()> {
    if !args.scaling {
        let runs = args.runs.iter().map(|dir| RunData::read(dir)).collect::<Result<Vec<_>, _>>()?;
        let out = match (&args.out, args.runs.as_slice()) {
            (Some(out), _) => out.clone(),
            (None, [one]) => RunPaths::new(one).report(),
            (None, _) => PathBuf::from("report"),
        };
        println!("{}", report::runs::write(&runs, &out)?.display());
        return Ok(());
    }
    let rows = scaling::scaling(&args.runs)?;
    match args.json {
        true => println!("{}", serde_json::to_string_pretty(&rows)?),
        false => print!("{}", scaling::table(&rows)),
    }
    if let Some(plot) = &args.plot {
        tensor_io::write_atomic(plot, scaling::svg(&rows).as_bytes())?;
        eprintln!("plot: {}", plot.display());
    }
    Ok(())
}

fn cmd_data(command: DataCommand) -> Result<()> {
    match command {
        DataCommand::Synth {
            out,
            seed,
            train_per_class,
            val_per_class,
            image_size,
            layout,
            train_images,
            val_images,
            photo_scale,
        } => {
            let layout = match layout {
                SynthLayout::Facades => synth::Layout::Facades,
                SynthLayout::Designsafe => {
                    synth::Layout::DesignSafe { train_images, val_images, photo_scale }
                }
            };
            let options = synth::SynthOptions { seed, train_per_class, val_per_class, image_size, layout };
            let summary = synth::generate(&out, &options)?;
            println!(
                "{}: {} training and {} validation images",
                out.display(),
                summary.train_images,
                summary.val_images
            );
        }
        DataCommand::ImportIdx { images, labels, out, split, limit, numeric_classes } => {
            let names: Option<&[&str]> =
                if numeric_classes { None } else { Some(&idx::FASHION_MNIST_CLASSES) };
            let written = idx::import(&images, &labels, &out, &split, limit, names)?;
            println!("{}: {written} images", out.join(&split).display());
        }
        DataCommand::Prepare { src, out, splits, shard_mb, resize, quality, seed, exif_orientation } => {
            let options = shards::PrepareOptions {
                splits,
                shard_bytes: shard_mb << 20,
                resize,
                quality,
                seed,
                exif_orientation,
            };
            print::prepared_shards(&out, &shards::prepare(&src, &out, &options)?);
        }
        DataCommand::Verify { dir } => {
            let report = shards::verify(&dir)?;
            for (name, problem) in &report.bad {
                println!("{}: BAD {name}: {problem}", dir.display());
            }
            if !report.bad.is_empty() {
                bail!(
                    "{}: {} of {} shard(s) do not match {}",
                    dir.display(),
                    report.bad.len(),
                    report.shards,
                    shards::MANIFEST
                );
            }
            println!("{}: {} shard(s), {} bytes: ok", dir.display(), report.shards, report.bytes);
        }
        DataCommand::Stage { src, dest } => {
            let report = shards::stage(&src, &dest)?;
            println!(
                "{}: {} shard(s) copied ({} bytes), {} already present",
                dest.display(),
                report.copied,
                report.bytes_copied,
                report.skipped
            );
        }
        DataCommand::Fetch { url, out, sha256, allow_http, retries, timeout, no_progress } => {
            let options = fetch::FetchOptions {
                sha256,
                allow_http,
                retries,
                timeout,
                progress: !no_progress,
                ..fetch::FetchOptions::default()
            };
            let fetched = fetch::fetch(&url, &out, &options)?;
            println!(
                "{}: {} bytes, sha256 ok ({} attempt(s), resumed from byte {})",
                fetched.path.display(),
                fetched.bytes,
                fetched.attempts,
                fetched.resumed_from
            );
        }
        DataCommand::Extract { archive, dest, max_gib, max_entries } => {
            let limits = extract::ExtractLimits { max_bytes: max_gib << 30, max_entries };
            let extracted = extract::extract(&archive, &dest, &limits)?;
            println!("{}: {} files, {} bytes", dest.display(), extracted.files, extracted.bytes);
        }
    }
    Ok(())
}

fn cmd_bench(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Allreduce {
            arch,
            bucket_mb,
            warmup,
            iterations,
            link_gbit,
            algorithm,
            blocking,
            compress,
            check,
            json,
        } => {
            let suite = bench::AllreduceSuite {
                archs: arch,
                bucket_mbs: bucket_mb,
                algorithm,
                blocking,
                compress,
                check,
                warmup,
                iterations,
            };
            let mut printed = Ok(());
            bench::allreduce_suite(&suite, |event| match event {
                bench::AllreduceEvent::Started(topology) if !json => {
                    print::allreduce_header(topology, blocking)
                }
                bench::AllreduceEvent::Started(_) => {}
                bench::AllreduceEvent::Measured(result) => {
                    if printed.is_ok() {
                        printed = print::allreduce(&result, link_gbit, json);
                    }
                }
                bench::AllreduceEvent::Checked(checked) => {
                    if printed.is_ok() {
                        printed = print::wire_check(&checked, json);
                    }
                }
            })?;
            printed
        }
        BenchCommand::Peak { threads, device, size, precision, repeats, json } => print::peak(
            &bench::bench_peak(threads, device, size, precision.into(), repeats)?,
            size,
            repeats,
            json,
        ),
        BenchCommand::Loader {
            data,
            split,
            image_size,
            config,
            batch_size,
            workers,
            prefetch,
            batches,
            json,
        } => {
            let mut transform = if config.config.is_some() || !config.set.is_empty() {
                RunPlan::for_inference(&config.load()?.config).train_transform()
            } else {
                Transform::train(224, Augment::default())
            };
            transform.size = image_size.unwrap_or(transform.size);
            let options =
                bench::LoaderBench { root: data, split, transform, batch_size, workers, prefetch, batches };
            print::loader(&options, &bench::bench_loader(&options)?, json)
        }
        BenchCommand::Step {
            arch,
            image_size,
            batch_size,
            threads,
            warmup,
            steps,
            precision,
            channels_last,
            device,
            json,
        } => {
            let compute = Compute { precision: precision.into(), channels_last, device };
            let options = StepBench { arch, image_size, batch_size, threads, warmup, steps, compute };
            print::step(&options, &bench::bench_step(&options)?, json)
        }
        BenchCommand::Agree {
            arch,
            image_size,
            batch_size,
            device,
            loss_tolerance,
            update_tolerance,
            json,
        } => {
            let reference = Compute { precision: Precision::Fp32, channels_last: false, device: Device::Cpu };
            let result =
                bench::bench_agree(arch, image_size, batch_size, reference, Compute { device, ..reference })?;
            let agree = result.loss_relative_difference <= loss_tolerance
                && result.update_relative_difference <= update_tolerance;
            print::agree(&result, device, (loss_tolerance, update_tolerance), agree, json)?;
            if !agree {
                bail!(
                    "{device:?} and the CPU differ after one step: loss {:.1e} (tolerance {loss_tolerance:.0e}), weight update {:.1e} (tolerance {update_tolerance:.0e})",
                    result.loss_relative_difference,
                    result.update_relative_difference
                );
            }
            Ok(())
        }
    }
}
