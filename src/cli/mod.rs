//! The command line: `Cli` and `Command` (clap's top level), `run` (logging, then dispatch to
//! the command), and what several commands share: `ConfigArgs` (`--config`/`--set`) and
//! `parse_arch`. Each command group's arguments, and the few calls into the library that
//! carry it out, live in their own file: train.rs (train, reproduce: one rank of a job),
//! model.rs (eval, predict, buildings, export), data.rs, weights.rs, bench.rs, report.rs (report,
//! publish, verify), doctor.rs. What the commands print is print.rs's; the exit status of a failed
//! command is exit.rs's (0 success, 1 failure, 2 usage or configuration error, 75 a run
//! stopped by a signal after its checkpoint).

mod bench;
mod data;
mod doctor;
mod exit;
mod model;
mod print;
mod report;
mod train;
mod weights;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::cluster::launcher;
use crate::config::LoadedConfig;
use crate::model::Arch;
use crate::util::logging::{self, LogFormat};

pub use bench::BenchCommand;
pub use data::DataCommand;
pub use doctor::DoctorArgs;
pub use exit::exit_code;
pub use model::{BuildingsArgs, CalibrateArgs, EvalArgs, ExplainArgs, ExportArgs, PredictArgs};
pub use report::{PublishArgs, ReportArgs, VerifyArgs};
pub use train::{ReproduceArgs, TrainArgs};
pub use weights::WeightsCommand;

#[derive(Debug, Parser)]
#[command(
    name = "rtrain",
    version,
    about = "Data-parallel ResNet training on libtorch",
    after_help = exit::EXIT_CODES_HELP,
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
    /// Evaluate a checkpoint on a split or tree: metrics with intervals, per-image results.
    Eval(EvalArgs),
    /// Classify images with a model, or an ensemble of models.
    Predict(PredictArgs),
    /// Join a finished `predict --out` to building footprints: each photo's building, each
    /// building's fused estimate (buildings.geojson, buildings.csv) and the map.
    Buildings(BuildingsArgs),
    /// Temperature scaling (and conformal prediction sets) fitted on held-out images, written
    /// as a new model file that predict, eval and explain apply.
    Calibrate(CalibrateArgs),
    /// Grad-CAM heatmaps: where in each image the model finds its class.
    Explain(ExplainArgs),
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
    /// A bundle for an archive from finished runs: weights, model card, RO-Crate, citation.
    Publish(PublishArgs),
    /// Re-hash a run's checkpoints, weights and data against its manifest.json (or a bundle's
    /// files against its checksums).
    Verify(VerifyArgs),
    /// Re-run a run from its manifest.json and compare the results.
    Reproduce(ReproduceArgs),
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the resolved configuration with the origin of each value.
    Show(ConfigArgs),
    /// Print every key with its default and doc, as TOML (the text of configs/default.toml).
    Defaults,
    /// Print the configuration reference in Markdown (docs/reference/configuration.md).
    Reference,
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
    /// The built-in defaults, then the file, the environment and the `--set`s.
    fn load(&self) -> Result<LoadedConfig> {
        Ok(LoadedConfig::load(self.config.as_deref(), &self.set)?)
    }

    fn show(&self) -> Result<()> {
        print!("{}", self.load()?.show()?);
        Ok(())
    }
}

fn parse_arch(name: &str) -> Result<Arch, String> {
    Arch::parse(name).ok_or_else(|| {
        format!("unknown architecture {name:?} (resnet18, resnet34, resnet50, resnet101, resnet152)")
    })
}

pub fn run(cli: Cli) -> Result<()> {
    // The launcher's rank (MPI's own view, checked later, must agree) labels every log line.
    let rank =
        launcher::detect_from_process().ok().flatten().filter(|l| l.world_size != Some(1)).map(|l| l.rank);
    logging::init(cli.log_format, cli.log_level.as_deref(), rank, cli.log_all_ranks);
    let _rank_span = rank.map(|rank| tracing::info_span!("rank", rank).entered());
    match cli.command {
        Command::Train(args) => args.run(),
        Command::Eval(args) => args.run(),
        Command::Predict(args) => args.run(),
        Command::Buildings(args) => args.run(),
        Command::Calibrate(args) => args.run(),
        Command::Explain(args) => args.run(),
        Command::Export(args) => args.run(),
        Command::Data(command) => command.run(),
        Command::Weights(command) => command.run(),
        Command::Doctor(args) => args.run(),
        Command::Report(args) => args.run(),
        Command::Publish(args) => args.run(),
        Command::Verify(args) => args.run(),
        Command::Reproduce(args) => args.run(),
        Command::Config(ConfigCommand::Show(args)) => args.show(),
        Command::Config(ConfigCommand::Defaults) => {
            print!("{}", crate::config::default_toml());
            Ok(())
        }
        Command::Config(ConfigCommand::Reference) => {
            print!("{}", crate::config::reference_markdown());
            Ok(())
        }
        Command::Bench(command) => command.run(),
    }
}
