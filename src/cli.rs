//! The command line: clap definitions and one function per command, each a handful of calls
//! into the library. `main.rs` maps the result to an exit code (2 for usage and configuration
//! errors, 1 for everything else).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use tch::{Device, Kind, Tensor};

use crate::bench::{self, StepBench};
use crate::checkpoint;
use crate::config::{Config, LoadedConfig, DEFAULT_DATA_ROOT};
use crate::data::decode::decode;
use crate::data::{dataset, extract, fetch, idx, shards, synth, transforms};
use crate::dist::{self, AllreduceAlgorithm, Communicator};
use crate::doctor;
use crate::eval;
use crate::launcher;
use crate::logging::{self, LogFormat};
use crate::manifest::{self, Manifest, LIBTORCH_VERSION};
use crate::model::{Arch, Model};
use crate::precision::{self, Compute, Precision};
use crate::report::{self, runs::RunData, scaling};
use crate::reproduce;
use crate::tensor_io;

use crate::train::{self, Resume};

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
    /// Extract a tar or tar.gz archive into DEST, refusing entries that would escape it.
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
        #[arg(long, default_value_t = 224)]
        image_size: u32,
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
    crate::device::parse(name)
}

fn parse_arch(name: &str) -> Result<Arch, String> {
    Arch::parse(name).ok_or_else(|| {
        format!("unknown architecture {name:?} (resnet18, resnet34, resnet50, resnet101, resnet152)")
    })
}

pub fn run(cli: Cli) -> Result<()> {
    // The launcher's rank (MPI's own view, checked later, must agree) labels every log line.
    let rank = launcher::detect_from_process().ok().flatten().filter(|l| l.world_size > 1).map(|l| l.rank);
    logging::init(cli.log_format, cli.log_level.as_deref(), rank, cli.log_all_ranks);
    let _rank_span = rank.map(|rank| tracing::info_span!("rank", rank).entered());
    match cli.command {
        Command::Train(args) => cmd_train(args),
        Command::Eval(args) => cmd_eval(args),
        Command::Predict(args) => cmd_predict(args),
        Command::Export(args) => cmd_export(args),
        Command::Data(command) => cmd_data(command),
        Command::Doctor(args) => cmd_doctor(args),
        Command::Report(args) => cmd_report(args),
        Command::Verify(args) => cmd_verify(args),
        Command::Reproduce(args) => cmd_reproduce(args),
        Command::Config(ConfigCommand::Show(args)) => {
            print!("{}", args.load()?.show()?);
            Ok(())
        }
        Command::Bench(BenchCommand::Allreduce {
            arch,
            bucket_mb,
            warmup,
            iterations,
            link_gbit,
            algorithm,
            blocking,
            json,
        }) => {
            let options = AllreduceOptions { warmup, iterations, link_gbit, algorithm, blocking, json };
            cmd_bench_allreduce(&arch, &bucket_mb, &options)
        }
        Command::Bench(BenchCommand::Peak { threads, device, size, precision, repeats, json }) => {
            let result = bench::bench_peak(threads, device, size, precision.into(), repeats)?;
            if json {
                println!("{}", serde_json::to_string(&result)?);
            } else {
                println!(
                    "{size}x{size} {} matrix product on {}, {} threads: best {:.1} GFLOP/s, median {:.1} of {repeats}",
                    result.precision, result.device, result.threads, result.best_gflops, result.median_gflops
                );
            }
            Ok(())
        }
        Command::Bench(BenchCommand::Loader {
            data,
            split,
            image_size,
            batch_size,
            workers,
            prefetch,
            batches,
            json,
        }) => {
            let options =
                bench::LoaderBench { root: data, split, image_size, batch_size, workers, prefetch, batches };
            let result = bench::bench_loader(&options)?;
            if json {
                println!("{}", serde_json::to_string(&result)?);
            } else {
                println!(
                    "{} from {}: {:.1} img/s at {}x{} with {} worker(s) ({:.1} per core), peak RSS {:.0} MiB",
                    options.root.display(),
                    result.source,
                    result.images_per_second,
                    image_size,
                    image_size,
                    workers,
                    result.images_per_second_per_core,
                    result.peak_rss_mib.unwrap_or(f64::NAN)
                );
            }
            Ok(())
        }
        Command::Bench(BenchCommand::Step {
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
        }) => {
            let precision = Precision::from(precision);
            let compute = Compute { precision, channels_last, device };
            let options = StepBench { arch, image_size, batch_size, threads, warmup, steps, compute };
            let result = bench::bench_step(&options)?;
            if json {
                println!("{}", serde_json::to_string(&result)?);
            } else {
                println!(
                    "{} {} {}x{} batch {} threads {}: {:.1} img/s (median step {:.1} ms over {} steps), {:.1} GFLOP/step at {:.1} GFLOP/s",
                    result.arch,
                    compute,
                    image_size,
                    image_size,
                    batch_size,
                    result.threads,
                    result.images_per_second,
                    result.median_step_seconds * 1e3,
                    steps,
                    result.gflop_per_step,
                    result.gflops
                );
            }
            Ok(())
        }
        Command::Bench(BenchCommand::Agree {
            arch,
            image_size,
            batch_size,
            device,
            loss_tolerance,
            update_tolerance,
            json,
        }) => {
            let reference = Compute { precision: Precision::Fp32, channels_last: false, device: Device::Cpu };
            let result =
                bench::bench_agree(arch, image_size, batch_size, reference, Compute { device, ..reference })?;
            let agree = result.loss_relative_difference <= loss_tolerance
                && result.update_relative_difference <= update_tolerance;
            if json {
                let report = serde_json::json!({
                    "result": result,
                    "loss_tolerance": loss_tolerance,
                    "update_tolerance": update_tolerance,
                    "agree": agree,
                });
                println!("{}", serde_json::to_string(&report)?);
            } else {
                println!(
                    "{arch} one step, cpu vs {device:?}: loss {:.6} vs {:.6} (relative {:.1e}), logits max |diff| {:.1e}, weight update relative {:.1e}: {}",
                    result.loss_reference,
                    result.loss_other,
                    result.loss_relative_difference,
                    result.logits_max_abs_difference,
                    result.update_relative_difference,
                    if agree { "agree" } else { "DIFFER" }
                );
            }
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

#[derive(Clone, Copy)]
struct AllreduceOptions {
    warmup: usize,
    iterations: usize,
    link_gbit: Option<f64>,
    algorithm: AllreduceAlgorithm,
    blocking: bool,
    json: bool,
}

fn cmd_bench_allreduce(archs: &[Arch], bucket_mbs: &[f64], options: &AllreduceOptions) -> Result<()> {
    let AllreduceOptions { warmup, iterations, link_gbit, algorithm, blocking, json } = *options;
    let comm = dist::init(algorithm)?;
    let topology = comm.topology().clone();
    if topology.is_root() && !json {
        println!(
            "all-reduce of gradients: {} ranks on {} nodes ({}), {} calls",
            topology.world_size,
            topology.nodes,
            topology.launcher,
            if blocking { "blocking" } else { "polled non-blocking (as training's communication thread)" }
        );
    }
    for &arch in archs {
        for &bucket_mb in bucket_mbs {
            if bucket_mb.is_nan() || bucket_mb <= 0.0 {
                bail!("--bucket-mb {bucket_mb}: must be positive");
            }
            // The poll interval training uses by default (`dist.poll_us`).
            let poll =
                (!blocking).then(|| Duration::from_micros(crate::config::DistConfig::default().poll_us));
            let result = bench::bench_allreduce(comm.as_ref(), arch, bucket_mb, poll, warmup, iterations)?;
            if !topology.is_root() {
                continue;
            }
            if json {
                println!("{}", serde_json::to_string(&result)?);
                continue;
            }
            let share =
                link_gbit.map(|link| format!(" ({:.0}% of {link} Gbit/s)", 100.0 * result.busbw_gbit / link));
            println!(
                "{:<9} {:>6.1} MB in {:>3} buckets of {:>5} MiB: {:>8.1} ms, algbw {:>6.2} Gbit/s, busbw {:>6.2} Gbit/s{}",
                result.arch,
                result.gradient_bytes as f64 / 1e6,
                result.buckets,
                result.bucket_mb,
                result.median_seconds * 1e3,
                result.algbw_gbit,
                result.busbw_gbit,
                share.unwrap_or_default()
            );
        }
    }
    Ok(())
}

fn cmd_report(args: ReportArgs) -> Result<()> {
    if !args.scaling {
        let runs = args.runs.iter().map(|dir| RunData::read(dir)).collect::<Result<Vec<_>, _>>()?;
        let out = match (&args.out, args.runs.as_slice()) {
            (Some(out), _) => out.clone(),
            (None, [one]) => one.join("report"),
            (None, _) => PathBuf::from("report"),
        };
        println!("{}", report::runs::write(&runs, &out)?.display());
        return Ok(());
    }
    let rows = scaling::scaling(&args.runs)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", scaling::table(&rows));
    }
    if let Some(plot) = &args.plot {
        tensor_io::write_atomic(plot, scaling::svg(&rows).as_bytes())?;
        eprintln!("plot: {}", plot.display());
    }
    Ok(())
}

/// The exit status for a failed command: 2 for usage and configuration errors, 1 otherwise.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    if error.downcast_ref::<crate::config::ConfigError>().is_some() {
        2
    } else {
        1
    }
}

fn cmd_train(args: TrainArgs) -> Result<()> {
    let loaded = args.config.load().map(|loaded| loaded.config);
    run_in_job(loaded, |config, comm| train_in_job(args, config, comm))
}

/// Runs `body` as this process's part of the job (MPI, or alone). The configuration chooses
/// the all-reduce algorithm, which must be set before MPI starts; a bad configuration is
/// reported after that, so that any rank's error, bad configuration included, ends the whole
/// job.
fn run_in_job(
    loaded: Result<Config>,
    body: impl FnOnce(&Config, Arc<dyn Communicator>) -> Result<()>,
) -> Result<()> {
    let algorithm = loaded.as_ref().map(|config| config.dist.allreduce).unwrap_or_default();
    let comm = dist::init(algorithm)?;
    let topology = comm.topology().clone();
    if topology.world_size > 1 {
        tracing::info!("data-parallel job: {topology}");
    }
    let result = loaded.and_then(|config| body(&config, comm.clone()));
    if let (Err(error), true) = (&result, topology.world_size > 1) {
        // Returning would leave the other ranks blocked in their next collective (and MPI's
        // finalisation): end the whole job, naming this rank.
        tracing::error!("rank {} on {} failed: {error:#}; aborting the job", topology.rank, topology.host);
        comm.abort(i32::from(exit_code(error)));
    }
    result
}

fn train_in_job(args: TrainArgs, config: &Config, comm: Arc<dyn Communicator>) -> Result<()> {
    ensure_default_data(config, comm.as_ref())?;
    stage_data(config, comm.as_ref())?;
    let run_dir = args.run_dir.unwrap_or_else(|| default_run_dir(config));
    // Rank 0's name: a time-stamped default could differ between ranks by a second.
    let run_dir = PathBuf::from(dist::broadcast_string(comm.as_ref(), &run_dir.to_string_lossy(), 0));
    let resume = match args.resume.as_deref() {
        None => Resume::Fresh,
        Some("auto") => Resume::Auto,
        Some(path) => Resume::From(PathBuf::from(path)),
    };
    if resume == Resume::Fresh && !checkpoint::list_step_checkpoints(&run_dir.join("checkpoints"))?.is_empty()
    {
        bail!(
            "run directory {} already has checkpoints: pass --resume auto to continue it, or choose another --run-dir",
            run_dir.display()
        );
    }
    if run_dir.join(shards::MANIFEST).is_file() && shards::ShardManifest::read(&run_dir).is_ok() {
        bail!(
            "run directory {} holds a shard set (its {} would be overwritten): choose another --run-dir",
            run_dir.display(),
            shards::MANIFEST
        );
    }
    let is_root = comm.topology().is_root();
    train::train(config, &run_dir, resume, None, comm)?;
    if is_root {
        println!("{}", run_dir.join("summary.json").display());
    }
    Ok(())
}

fn cmd_verify(args: VerifyArgs) -> Result<()> {
    let findings = manifest::verify(&args.run_dir)?;
    let mut bad = 0;
    for finding in &findings {
        match finding {
            manifest::Finding::Ok(what) => println!("ok        {what}"),
            manifest::Finding::Mismatch(what) => {
                bad += 1;
                println!("MISMATCH  {what}");
            }
            manifest::Finding::Missing(what) => {
                bad += 1;
                println!("MISSING   {what}");
            }
        }
    }
    if bad > 0 {
        bail!("{}: {bad} file(s) differ from {}", args.run_dir.display(), manifest::FILE_NAME);
    }
    Ok(())
}

fn cmd_reproduce(args: ReproduceArgs) -> Result<()> {
    let original = Manifest::read(&args.run_dir);
    let loaded = original.as_ref().map(|m| m.config.clone()).map_err(|e| anyhow::anyhow!("{e}"));
    run_in_job(loaded, |config, comm| {
        let original = original.map_err(|e| anyhow::anyhow!("{e}"))?;
        let epochs = args.epochs.unwrap_or(config.train.epochs).min(config.train.epochs);
        let default_out = PathBuf::from(format!("{}-reproduce", args.run_dir.display()));
        let out = args.out.unwrap_or(default_out);
        if out.join(manifest::FILE_NAME).exists() {
            bail!("{} already holds a run: choose another --out", out.display());
        }
        stage_data(config, comm.as_ref())?;
        let is_root = comm.topology().is_root();
        let world_size = comm.topology().world_size;
        train::train(config, &out, Resume::Fresh, Some(epochs), comm)?;
        if !is_root {
            return Ok(());
        }
        let again = Manifest::read(&out)?;
        let verdict = reproduce::compare(&original, &again, epochs, world_size);
        for line in &verdict.lines {
            println!("{line}");
        }
        if !verdict.reproduced {
            bail!("{} did not reproduce {} (see above)", out.display(), args.run_dir.display());
        }
        Ok(())
    })
}

/// With `data.stage_dir`, the first rank of each node copies the shard set at `data.root` to
/// `shards::staged_root` (skipping shards already there with the right hash, verifying each
/// copy) while the node's other ranks wait; training then reads the copy (`train::data_root`),
/// and the run records `data.root` as given. The outcome is summed
/// over all ranks, so a failed copy on any node fails every rank (naming the node and file on
/// the rank that failed) instead of leaving them waiting.
fn stage_data(config: &Config, comm: &dyn Communicator) -> Result<()> {
    let Some(stage_dir) = &config.data.stage_dir else { return Ok(()) };
    let root = &config.data.root;
    if !root.join(shards::MANIFEST).is_file() {
        bail!(
            "data.stage_dir is set, but data.root {} is not a shard directory (no {}); make one with `rtrain data prepare`",
            root.display(),
            shards::MANIFEST
        );
    }
    let dest = shards::staged_root(root, stage_dir);
    let topology = comm.topology();
    let mut outcome = Ok(());
    if topology.local_rank == 0 {
        let started = std::time::Instant::now();
        outcome = match shards::stage(root, &dest) {
            Ok(report) => {
                tracing::info!(
                    "staged {} to {} on {}: {} shard(s) copied ({:.1} MiB), {} already there, {:.1}s",
                    root.display(),
                    dest.display(),
                    topology.host,
                    report.copied,
                    report.bytes_copied as f64 / f64::from(1u32 << 20),
                    report.skipped,
                    started.elapsed().as_secs_f64()
                );
                Ok(())
            }
            Err(error) => {
                Err(anyhow::anyhow!("staging data on node {} ({}): {error}", topology.node, topology.host))
            }
        };
    }
    let mut failed = [f64::from(u8::from(outcome.is_err()))];
    comm.all_reduce_sum_f64(&mut failed);
    outcome?;
    if failed[0] > 0.0 {
        bail!(
            "staging data to {} failed on {} node(s); their ranks name the file",
            dest.display(),
            failed[0]
        );
    }
    Ok(())
}

/// The built-in default data is generated on first use, but only at its default path: a
/// mistyped path of the user's must be an error, not a silent synthetic run. In a job, rank 0
/// generates it first; then the first rank of any node that still lacks it (no shared file
/// system) does.
fn ensure_default_data(config: &Config, comm: &dyn Communicator) -> Result<()> {
    let topology = comm.topology();
    if topology.is_root() {
        generate_default_data(config)?;
    }
    comm.barrier();
    if topology.local_rank == 0 && !topology.is_root() {
        generate_default_data(config)?;
    }
    comm.barrier();
    Ok(())
}

fn generate_default_data(config: &Config) -> Result<()> {
    let root = &config.data.root;
    if root == Path::new(DEFAULT_DATA_ROOT) && !root.exists() {
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

fn default_run_dir(config: &Config) -> PathBuf {
    let name = if config.run.name.is_empty() {
        // e.g. resnet18-20261130T053000Z: sortable, and free of ':' for file systems that mind.
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        format!("{}-{}", config.model.arch, stamp.replace([':', '-'], ""))
    } else {
        config.run.name.clone()
    };
    config.run.dir.join(name)
}

/// A model restored from a checkpoint, with the class names it was trained on.
fn load_checkpoint_model(path: &Path) -> Result<(Model, checkpoint::CheckpointMeta)> {
    let checkpoint = checkpoint::load(path, None)?;
    let model = Model::new(checkpoint.meta.arch, checkpoint.meta.num_classes, Device::Cpu)?;
    train::restore_model(&model, &checkpoint.model, path)?;
    Ok((model, checkpoint.meta))
}

fn cmd_eval(args: EvalArgs) -> Result<()> {
    let config = args.config.load()?.config;
    let threads = train::set_threads(config.train.threads, 1);
    let (model, meta) = load_checkpoint_model(&args.checkpoint)?;
    let (compute, _) = train::compute_for(&config, Device::Cpu);
    let workers = train::loader_workers(
        config.data.workers,
        compute.device,
        threads.unsigned_abs() as usize,
        train::core_share(1),
    );
    train::prepare_model(&model, &compute)?;
    let dataset = dataset::open_split(&config.data.root, &config.data.val_split)?;
    if dataset.classes() != meta.classes {
        bail!(
            "{}: classes {:?} differ from the checkpoint's {:?}",
            dataset.root().display(),
            dataset.classes(),
            meta.classes
        );
    }
    let report = eval::evaluate(
        &model,
        dataset,
        train::eval_transform(&config),
        train::loader_options(&config, config.eval_batch_size(), &compute, workers),
        &compute,
        dist::single().as_ref(),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{} images: loss {:.4}, top-1 {:.4}", report.samples, report.loss, report.top1);
        for (class, accuracy) in meta.classes.iter().zip(&report.per_class) {
            println!("  {class:<24} {accuracy:.4}");
        }
        println!("confusion (rows: true, columns: predicted):");
        for row in &report.confusion {
            println!("  {row:?}");
        }
    }
    Ok(())
}

fn cmd_predict(args: PredictArgs) -> Result<()> {
    let config = args.config.load()?.config;
    train::set_threads(config.train.threads, 1);
    let (model, meta) = load_checkpoint_model(&args.checkpoint)?;
    let (compute, _) = train::compute_for(&config, Device::Cpu);
    train::prepare_model(&model, &compute)?;
    let transform = train::eval_transform(&config);
    let size = i64::from(config.data.image_size);
    let mut results = Vec::new();
    for path in &args.images {
        // The decoder training and evaluation use, so that a prediction sees the same pixels.
        let bytes = std::fs::read(path).with_context(|| format!("{}: cannot read image", path.display()))?;
        let image = decode(&bytes).with_context(|| format!("{}: cannot decode image", path.display()))?;
        let mut pixels = vec![0f32; 3 * (size * size) as usize];
        let mut rng = transforms::sample_rng(0, 0, 0);
        transforms::apply(&image, &transform, &mut rng, &mut pixels);
        let input = compute.input(&Tensor::from_slice(&pixels).view([1, 3, size, size]))?;
        let probabilities = tch::no_grad(|| -> Result<Tensor> {
            let _autocast = compute.autocast()?;
            Ok(model.forward_t(&input, false).softmax(-1, Kind::Float))
        })?;
        let probabilities: Vec<f32> = Vec::try_from(probabilities.view([-1]))?;
        let mut ranked: Vec<(usize, f32)> = probabilities.iter().copied().enumerate().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        ranked.truncate(args.top.max(1));
        results.push(serde_json::json!({
            "image": path,
            "class": meta.classes[ranked[0].0],
            "top": ranked.iter().map(|&(i, p)| serde_json::json!({"class": meta.classes[i], "probability": p})).collect::<Vec<_>>(),
        }));
        if !args.json {
            let shown: Vec<String> =
                ranked.iter().map(|&(i, p)| format!("{} {:.3}", meta.classes[i], p)).collect();
            println!("{}: {}", path.display(), shown.join(", "));
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    Ok(())
}

fn cmd_doctor(args: DoctorArgs) -> Result<()> {
    let config = args.config.load()?.config;
    let device = if tch::Cuda::is_available() { Device::Cuda(0) } else { Device::Cpu };
    let (compute, why) = train::compute_for(&config, device);
    let probe = doctor::Probe::process();
    // A malformed launcher variable is a finding, not the end of the report.
    let (launch, launch_error) = match launcher::detect_from_process() {
        Ok(launch) => (launch, None),
        Err(error) => (None, Some(error.to_string())),
    };
    let cuda = doctor::Cuda {
        built: cfg!(feature = "cuda"),
        available: tch::Cuda::is_available(),
        devices: usize::try_from(tch::Cuda::device_count()).unwrap_or(0),
        cudnn: tch::Cuda::cudnn_is_available(),
        nccl: dist::nccl::NcclLibrary::load()
            .map(|nccl| format!("NCCL {}", nccl.version_string()))
            .map_err(|err| err.to_string()),
    };
    // Under a launcher, join the job to show what MPI says (the communicator is the truth); a
    // failure to join is a finding, not the end of the report.
    let mut mpi = doctor::Mpi::from_launch(launch.as_ref());
    mpi.error = launch_error;
    if launch.is_some() {
        match dist::init(AllreduceAlgorithm::Mpi) {
            Ok(comm) => {
                let job = comm.topology().clone();
                match dist::device_for(&job, cuda.devices) {
                    Ok(device) => mpi.rank_device = Some(format!("{device:?}")),
                    Err(error) => mpi.device_error = Some(error.to_string()),
                }
                mpi.job = Some(job);
            }
            Err(error) => mpi.error = Some(error.to_string()),
        }
    }
    let local_ranks = mpi.job.as_ref().map_or(1, |job| job.local_world_size);
    let threads = doctor::Threads {
        cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        configured: config.train.threads,
        local_ranks,
    };
    let mut facts = doctor::Facts::from_probe(&probe, cuda, mpi, threads);
    facts.data_is_default = config.data.root == Path::new(DEFAULT_DATA_ROOT);
    facts.directories = vec![
        doctor::Directory::probe("data", &config.data.root),
        doctor::Directory::probe("run", &config.run.dir),
        doctor::Directory::probe("shm", &probe.path("/dev/shm")),
    ];
    if let Some(stage_dir) = &config.data.stage_dir {
        facts.directories.push(doctor::Directory::probe("stage", stage_dir));
    }
    let found = doctor::findings(&facts);
    if args.json {
        let report = serde_json::json!({
            "rtrain": env!("CARGO_PKG_VERSION"),
            "libtorch": LIBTORCH_VERSION,
            "cpu": {"native_bf16": precision::cpu_has_native_bf16()},
            "compute": {
                "device": format!("{device:?}"),
                "precision": compute.precision.to_string(),
                "precision_reason": why,
                "channels_last": compute.channels_last,
            },
            "environment": facts,
            "problems": found,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let preamble = [
            format!("rtrain {} on libtorch {LIBTORCH_VERSION}", env!("CARGO_PKG_VERSION")),
            format!("cpu: native bf16 {}", precision::cpu_has_native_bf16()),
            format!("compute: {compute} ({why})"),
        ];
        print!("{}", doctor::render(&facts, &found, &preamble));
    }
    Ok(())
}

fn cmd_export(args: ExportArgs) -> Result<()> {
    let (model, meta) = load_checkpoint_model(&args.checkpoint)?;
    model.write_torchvision(&args.out, meta.global_step)?;
    println!(
        "{}: torchvision {} state dict, num_classes={} ({})",
        args.out.display(),
        meta.arch,
        meta.num_classes,
        meta.classes.join(", ")
    );
    Ok(())
}

fn cmd_data(command: DataCommand) -> Result<()> {
    match command {
        DataCommand::Synth { out, seed, train_per_class, val_per_class, image_size } => {
            let options = synth::SynthOptions { seed, train_per_class, val_per_class, image_size };
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
        DataCommand::Prepare { src, out, splits, shard_mb, resize, quality, seed } => {
            let options =
                shards::PrepareOptions { splits, shard_bytes: shard_mb << 20, resize, quality, seed };
            let manifest = shards::prepare(&src, &out, &options)?;
            for (split, info) in &manifest.splits {
                let bytes: u64 = info.shards.iter().map(|s| s.bytes).sum();
                println!(
                    "{}: {split}: {} samples in {} shard(s), {:.1} MiB",
                    out.display(),
                    info.samples,
                    info.shards.len(),
                    bytes as f64 / f64::from(1u32 << 20)
                );
            }
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
