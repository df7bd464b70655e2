//! `rtrain train` and `rtrain reproduce`: the commands that run as one rank of a job. Each
//! joins the job (`job::run_in_job`), then every rank makes the same calls in the same order:
//! the set-up every rank takes part in (default data, node-local staging, the run directory's
//! name), the plan, training; rank 0 alone prints the outcome.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use clap::Args;

use super::exit::UsageError;
use super::{exit_code, ConfigArgs};
use crate::calibrate;
use crate::cluster::{job, signals, Communicator};
use crate::config::Config;
use crate::inference::{Ensemble, Tta};
use crate::plan::{Resume, RunPlan};
use crate::run_dir::manifest::Manifest;
use crate::run_dir::reproduce::{self, Verdict};
use crate::run_dir::{self, RunPaths};
use crate::train::{self, TrainError};

#[derive(Debug, Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Run directory (default: <run.dir>/<run.name>, or a timestamped name).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// `auto` (newest valid checkpoint in the run directory, else a fresh start) or a path.
    #[arg(long, conflicts_with = "overwrite")]
    pub resume: Option<String>,
    /// Replace the run already in the run directory: its weights, checkpoints, metrics,
    /// manifest and report are deleted before training starts (otherwise such a directory is
    /// refused).
    #[arg(long)]
    pub overwrite: bool,
}

impl TrainArgs {
    fn resume(&self) -> Resume {
        match self.resume.as_deref() {
            None if self.overwrite => Resume::Overwrite,
            None => Resume::Fresh,
            Some("auto") => Resume::Auto,
            Some(path) => Resume::From(PathBuf::from(path)),
        }
    }

    pub(super) fn run(self) -> Result<()> {
        install_stop_signals()?;
        let loaded = self.config.load().map(|loaded| loaded.config);
        let resume = self.resume();
        job::run_in_job(loaded, exit_code, |config, comm| {
            if let Some(summary) = train_as_rank(config, &comm, self.run_dir, resume)? {
                println!("{}", summary.display());
            }
            Ok(())
        })
    }
}

#[derive(Debug, Args)]
pub struct ReproduceArgs {
    /// The run to reproduce (its manifest.json).
    pub run_dir: PathBuf,
    /// Re-run only the first N epochs (with the original schedule), and compare those.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub epochs: Option<u32>,
    /// Where the new run goes (default: RUN_DIR-reproduce).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Re-run on this many ranks (the job's size, e.g. `mpirun -np W`), keeping the original's
    /// global batch: each rank accumulates `original ranks x train.accumulate / W`
    /// micro-batches per step, so a run made on 8 GPUs can be checked on one.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub ranks: Option<u32>,
}

impl ReproduceArgs {
    pub(super) fn run(self) -> Result<()> {
        install_stop_signals()?;
        let original = Manifest::read(&self.run_dir);
        let loaded =
            original.as_ref().map_err(|e| anyhow!("{e}")).and_then(|m| recorded_config(m, &self.run_dir));
        job::run_in_job(loaded, exit_code, |config, comm| {
            let original = original.map_err(|e| anyhow!("{e}"))?;
            let config = &on_ranks(config, &original, self.ranks, comm.topology().world_size)?;
            let compared = reproduce_as_rank(config, &comm, &original, &self.run_dir, self.epochs, self.out)?;
            let Some((out, verdict)) = compared else { return Ok(()) };
            for line in &verdict.lines {
                println!("{line}");
            }
            if !verdict.reproduced {
                bail!("{} did not reproduce {} (see above)", out.display(), self.run_dir.display());
            }
            Ok(())
        })
    }
}

/// The configuration a manifest records, checked as `train` checks its own (a manifest comes
/// from elsewhere: `optim.lr = -1` must not run because it was written into a manifest) and
/// against the manifest's `config_hash` (an edited or damaged manifest is refused).
fn recorded_config(manifest: &Manifest, run_dir: &Path) -> Result<Config> {
    let config = manifest.config.clone();
    config.validate()?;
    let hash = config.hash()?;
    if hash != manifest.config_hash {
        bail!(
            "{}: config_hash {} is not the hash of the configuration it records ({hash}): the manifest \
             was edited or damaged",
            run_dir.join("manifest.json").display(),
            manifest.config_hash
        );
    }
    Ok(config)
}

/// The configuration a re-run on `ranks` ranks uses (`reproduce --ranks`): the original's, with
/// `train.accumulate` making up for the ranks it lacks. The job must have that many ranks.
fn on_ranks(config: &Config, original: &Manifest, ranks: Option<u32>, world_size: usize) -> Result<Config> {
    let Some(ranks) = ranks.map(|r| r as usize) else { return Ok(config.clone()) };
    if ranks != world_size {
        return Err(UsageError(format!(
            "--ranks {ranks}, but this job has {world_size} rank(s): start it with {ranks} (e.g. mpirun -np {ranks})"
        ))
        .into());
    }
    let micro_batches = original.job.world_size * config.train.accumulate.max(1) as usize;
    if micro_batches % ranks != 0 {
        return Err(UsageError(format!(
            "--ranks {ranks}: the original's steps are {micro_batches} micro-batches of {} ({} rank(s) x train.accumulate = {}), which do not divide among {ranks} ranks",
            config.data.batch_size,
            original.job.world_size,
            config.train.accumulate
        ))
        .into());
    }
    let mut config = config.clone();
    config.train.accumulate = u32::try_from(micro_batches / ranks)?;
    if config.train.accumulate != original.config.train.accumulate {
        tracing::info!(
            "re-running the {}-rank run on {ranks} rank(s), each accumulating {} micro-batch(es) of {} per step: the original's global batch of {}",
            original.job.world_size,
            config.train.accumulate,
            config.data.batch_size,
            micro_batches * config.data.batch_size
        );
    }
    Ok(config)
}

/// Takes the stop signals from the command's start, before MPI starts and the configuration is
/// read: a signal then is recorded, not fatal (`signals`).
pub(super) fn install_stop_signals() -> Result<()> {
    Ok(signals::install().map_err(TrainError::Signals)?)
}

/// A preempted run's error as [`crate::cluster::signals::Preempted`] itself, which the job
/// layer recognises (its exit code, and no abort: every rank stops together).
fn preempted_as_such(error: TrainError) -> anyhow::Error {
    match error {
        TrainError::Preempted(preempted) => anyhow::Error::new(preempted),
        TrainError::StoppedDuringStartUp(stopped) => anyhow::Error::new(stopped),
        other => other.into(),
    }
}

/// Trains into `run_dir` (default: a name from the configuration); returns the path of
/// `summary.json` on rank 0. A collective: every rank calls it.
fn train_as_rank(
    config: &Config,
    comm: &Arc<dyn Communicator>,
    run_dir: Option<PathBuf>,
    resume: Resume,
) -> Result<Option<PathBuf>> {
    // The plan first: it sets how long the set-up below may keep a rank waiting.
    let plan = RunPlan::for_training(config, comm.topology(), resume, None)?;
    job::once_per_node(comm.as_ref(), || super::data::generate_default_data(config))?;
    job::stage_data(plan.staging.as_ref(), comm.as_ref())?;
    let run_dir = run_dir.unwrap_or_else(|| run_dir::default_run_dir(config));
    let paths = RunPaths::new(job::broadcast_path(comm.as_ref(), &run_dir));
    paths.check_writable(&plan.resume)?;
    let trained = train::run(&plan, comm, paths.clone()).map_err(preempted_as_such)?;
    write_evaluation(comm.as_ref(), &paths, &trained, config);
    if config.train.calibrate {
        calibrate_run(comm.as_ref(), &paths, config)?;
    }
    Ok(comm.topology().is_root().then(|| paths.summary()))
}

/// Rank 0 writes the best checkpoint's evaluation into the run directory (`evaluation/`).
fn write_evaluation(comm: &dyn Communicator, paths: &RunPaths, trained: &train::Trained, config: &Config) {
    if let (true, Some(evaluation)) = (comm.topology().is_root(), &trained.best_evaluation) {
        crate::report::evaluation::write_for_run(paths, evaluation, config.run.seed);
    }
}

/// `train.calibrate`: the best checkpoint (else the final weights) temperature-scaled on the
/// validation split into the run's `calibrated.safetensors`. A collective.
fn calibrate_run(comm: &dyn Communicator, paths: &RunPaths, config: &Config) -> Result<()> {
    let best = paths.best_checkpoint();
    let model = if best.is_file() { best } else { paths.weights() };
    let plan = RunPlan::for_prediction(config, comm.topology())?;
    // The run's own configuration is the model's preprocessing.
    let ensemble = Ensemble::load(&[model], config, &BTreeSet::new(), &plan.compute, Tta::None)?;
    let (calibration, _) =
        calibrate::fit(&plan, comm, &ensemble, &config.data.root, &config.data.val_split, None)?;
    if comm.topology().is_root() {
        calibrate::write(&ensemble, &calibration, &paths.calibrated())?;
        tracing::info!(
            "calibrated on the validation split: temperature {:.4}, NLL {:.4} -> {:.4}: {}",
            calibration.temperature,
            calibration.nll_before,
            calibration.nll_after,
            paths.calibrated().display()
        );
    }
    Ok(())
}

/// Re-runs the run at `original_dir` (whose manifest is `original`, configuration `config`)
/// into `out` (default: `<original_dir>-reproduce`), for its first `epochs` epochs (default:
/// all), and compares the two manifests; returns the new run's directory and the verdict on
/// rank 0. A collective: every rank calls it.
fn reproduce_as_rank(
    config: &Config,
    comm: &Arc<dyn Communicator>,
    original: &Manifest,
    original_dir: &Path,
    epochs: Option<u32>,
    out: Option<PathBuf>,
) -> Result<Option<(PathBuf, Verdict)>> {
    let out = RunPaths::new(out.unwrap_or_else(|| format!("{}-reproduce", original_dir.display()).into()));
    out.check_empty()?;
    // A run that stopped early is re-run to its stop, not beyond (where metrics only agree
    // within tolerances, the re-run's own early stopping may not fire at the same epoch).
    let epochs = match (&original.stopped_early, epochs) {
        (Some(stop), Some(epochs)) => Some(epochs.min(stop.epoch)),
        (Some(stop), None) => Some(stop.epoch),
        (None, epochs) => epochs,
    };
    let plan = RunPlan::for_training(config, comm.topology(), Resume::Fresh, epochs)?;
    job::stage_data(plan.staging.as_ref(), comm.as_ref())?;
    let trained = train::run(&plan, comm, out.clone()).map_err(preempted_as_such)?;
    write_evaluation(comm.as_ref(), &out, &trained, config);
    if !comm.topology().is_root() {
        return Ok(None);
    }
    let verdict =
        reproduce::compare(original, &Manifest::read(out.root())?, plan.last_epoch, plan.topology.world_size);
    Ok(Some((out.root().to_path_buf(), verdict)))
}
