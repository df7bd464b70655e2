//! The training run: the pipeline from a [`RunPlan`] to a finished run directory, in
//! [`run`], which reads top to bottom with every collective called by name.
//!
//! Data parallelism: every rank starts from rank 0's weights, trains on its strided shard of
//! each epoch's order (the sampler's) with `train.accumulate` micro-batches of
//! `data.batch_size` images per step, and averages gradients with the others after the last
//! backward, so all ranks take identical steps. Only global rank 0 writes the
//! run directory ([`RunDir`]); metrics and evaluations are summed over ranks first.
//!
//! The parts: [`step`] (the one training step), [`trainer`] (optimizer, schedule, gradient sync
//! and where training stands), [`epoch`] (one epoch of steps), [`progress`] (the step
//! reports), [`eval`], [`policy`] (when to save and delete checkpoints), [`optim`],
//! [`class_weights`] (the loss's), [`early_stop`] and [`stop_snapshot`] (the stop checkpoint
//! written at once at a time limit, whatever the step in flight).

pub mod class_weights;
pub mod early_stop;
pub mod epoch;
pub mod eval;
pub mod optim;
pub mod phases;
pub mod policy;
pub mod progress;
pub mod step;
pub mod stop_snapshot;
pub mod trainer;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tch::{Device, Kind};

use crate::cluster::grad_sync::{choose_reducer, GradSync, GradSyncError};
use crate::cluster::nccl::NcclLibrary;
use crate::cluster::signals::{self, Preempted, StoppedDuringStartUp};
use crate::cluster::watchdog;
use crate::cluster::{self, Communicator, DistError};
use crate::data::dataset::{self as dataset, DataError, Dataset};
use crate::data::sampler::Sampler;
use crate::data::shards::ShardError;
use crate::model::weights::{self, HubFile, StartingWeights};
use crate::model::{Model, ModelError};
use crate::plan::{PlanError, RunPlan};
use crate::run_dir::checkpoint::{CheckpointError, EpochTotals};
use crate::run_dir::manifest::{self, DataSplit, Manifest};
use crate::run_dir::records::Summary;
use crate::run_dir::{RunDir, RunDirError, RunPaths};
use crate::util::files::{self, FileError};
use crate::util::shim::ShimError;
use phases::PhaseTiming;
use step::{GradientSync, StepError};
use trainer::{Position, Trainer};

use crate::plan::Resume;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Shards(#[from] ShardError),
    #[error("every sample of batch {step} from {} was undecodable and skipped", dir.display())]
    EmptyBatch { step: u64, dir: PathBuf },
    #[error(transparent)]
    Eval(#[from] eval::EvalError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Optim(#[from] optim::OptimError),
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Step(#[from] StepError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("data: {train} has classes {train_classes:?} but {val} has {val_classes:?}")]
    ClassMismatch { train: PathBuf, val: PathBuf, train_classes: Vec<String>, val_classes: Vec<String> },
    #[error("model.num_classes = {configured}, but {dir} has {found} class folders")]
    ClassCount { configured: usize, found: usize, dir: PathBuf },
    #[error("{dir}: fewer training images ({images}) than one batch (data.batch_size = {batch})")]
    TooFewImages { dir: PathBuf, images: usize, batch: usize },
    #[error(transparent)]
    Shim(#[from] ShimError),
    #[error(transparent)]
    GradSync(#[from] GradSyncError),
    #[error(transparent)]
    Dist(#[from] DistError),
    #[error(transparent)]
    Manifest(#[from] manifest::ManifestError),
    #[error(transparent)]
    ClassWeights(#[from] class_weights::ClassWeightsError),
    #[error("weights digest: cannot read tensor {name}: {source}")]
    Digest { name: String, source: tch::TchError },
    #[error("{when}: {what} is not finite (NaN or infinity): the run diverged, and nothing was saved from it; lower optim.lr")]
    NotFinite { when: String, what: String },
    /// Every rank stopped at the same step after a stop signal, with a checkpoint written.
    #[error(transparent)]
    Preempted(Preempted),
    /// The ranks agreed to stop before the first step: a stop signal reached one of them.
    #[error(transparent)]
    StoppedDuringStartUp(StoppedDuringStartUp),
    #[error("cannot install the handlers of the stop signals (SIGTERM, SIGINT, SIGUSR1): {0}")]
    Signals(std::io::Error),
    #[error("cannot start the thread that saves the stop checkpoint: {0}")]
    StopSnapshot(std::io::Error),
}

/// What a finished training run returns: its summary, and its best checkpoint's evaluation
/// with every image's result (on every rank), for `RUN_DIR/evaluation/`.
pub struct Trained {
    pub summary: Summary,
    pub best_evaluation: Option<eval::CheckpointEvaluation>,
}

/// Trains as `plan` says into the run directory at `paths`; a finished run resumed is left as
/// it is and its summary returned ([`finished_already`]). Every rank calls it, with the
/// stop-signal handlers installed (`signals::install`, before MPI starts).
pub fn run(plan: &RunPlan, comm: &Arc<dyn Communicator>, paths: RunPaths) -> Result<Trained, TrainError> {
    let (started, started_at) = (Instant::now(), manifest::now());
    let data = Splits::open(plan)?;
    let (model, starting_weights) = build_model(plan, &data)?;
    broadcast_weights(comm.as_ref(), &model);
    join_sync_batchnorm(plan, &model, comm);
    let sampler = plan.train_sampler(data.train.as_ref(), data.classes().len());
    let steps_per_epoch = plan.steps_per_epoch(sampler.len(), data.train.root())?;
    let loss_weights = data.class_weights(plan)?;
    let mut trainer = Trainer::new(plan, &model, data.classes(), steps_per_epoch, loss_weights.as_deref())?;
    let hosts = cluster::gather_strings(comm.as_ref(), &plan.topology.host);
    watchdog::set_hosts(hosts.clone());
    let mut timing = PhaseTiming::new(hosts.clone(), plan.straggler_threshold(), plan.trace_steps());
    let mut out = RunDir::open(paths, plan.topology.is_root())?;
    if plan.resume == Resume::Overwrite {
        out.delete_previous_run()?;
    }
    let (resume_from, position) = resume(comm.as_ref(), plan, &mut trainer, &model, &out)?;
    if finished_already(comm.as_ref(), plan, &out, resume_from.is_some(), &position, &trainer) {
        return Ok(Trained { summary: finished_summary(&out)?, best_evaluation: None });
    }
    out.start(
        plan.recorded_config(),
        resume_from.is_some().then_some((position.global_step, position.epoch)),
    )?;
    if out.writes() {
        let manifest =
            run_manifest(plan, &data, started_at, hosts, starting_weights, loss_weights, comm.as_ref());
        out.start_manifest(manifest?, position.epoch)?;
    }
    // From here every wait is a training-time one, NCCL's set-up included.
    watchdog::set_limit(plan.collective_timeout());
    trainer.join_gradient_sync(join_gradient_sync(plan, &model, comm)?);
    log_start(plan, &data, &sampler, steps_per_epoch, out.paths());
    trainer.keep_stop_snapshot(&out)?;
    signals::arm(comm.as_ref()).map_err(TrainError::StoppedDuringStartUp)?;
    for epoch in position.epoch..plan.last_epoch {
        if trainer.stopped_early().is_some() {
            break;
        }
        let start = position.within(epoch, plan.topology.is_root());
        let (train, comm) = (&data.train, comm.as_ref());
        let totals = epoch::train_epoch(
            &mut trainer,
            &model,
            train,
            &sampler,
            comm,
            &mut out,
            start,
            epoch,
            &mut timing,
        )?;
        let totals = reduce_totals(comm, &totals);
        let phases = timing.epoch_report(comm);
        sync_buffers(comm, &model);
        watchdog::set_phase("evaluation", trainer.steps());
        let eval_started = Instant::now();
        let val = eval::evaluate_split(&model, &data.val, plan, comm)?;
        let eval_seconds = eval_started.elapsed().as_secs_f64();
        watchdog::set_phase("checkpoint", trainer.steps());
        trainer.finish_epoch(&model, epoch, &totals, val, (phases, eval_seconds), &mut out)?;
        let last = epoch + 1 == plan.last_epoch || trainer.stopped_early().is_some();
        if trainer.stops_at_epoch_end() && !last {
            return Err(stopped_at_epoch_end(comm, &trainer, &out));
        }
    }
    // A trace the run was too short to complete.
    epoch::write_step_trace(&mut timing, comm.as_ref(), &mut out)?;
    sync_buffers(comm.as_ref(), &model);
    check_replicas_agree(comm.as_ref(), &model)?;
    let mut summary = trainer.summary(&data, started, resume_from);
    summary.phases = Some(timing.run_report(comm.as_ref()));
    summary.gradient_bytes = gradient_bytes(plan, &model);
    let best_evaluation = evaluate_best(plan, &data, comm.as_ref(), &out, &trainer, &mut summary)?;
    let weights = model.torchvision_state_dict(trainer.steps());
    trainer::check_finite("final weights", &weights)?;
    let summary = out.finish(&weights, &trainer.weights_meta(&model), summary)?;
    if out.writes() {
        log_done(&summary);
    }
    Ok(Trained { summary, best_evaluation })
}

/// SyncBatchNorm's sums over the ranks, when the plan asks for them ([`RunPlan::sync_batchnorm`]);
/// also in a job of one, where the sum is the identity: the same arithmetic at every world
/// size, so runs at different sizes stay comparable.
fn join_sync_batchnorm(plan: &RunPlan, model: &Model, comm: &Arc<dyn Communicator>) {
    if plan.sync_batchnorm() {
        let comm = Arc::clone(comm);
        model.sync_batchnorm(Box::new(move |values| comm.all_reduce_sum_f64_in_model(values)));
    }
}

/// Where training starts: the checkpoint the ranks resume from (restored into `trainer` and
/// `model`), and the position it records; the start when there is none. A collective.
fn resume(
    comm: &dyn Communicator,
    plan: &RunPlan,
    trainer: &mut Trainer,
    model: &Model,
    out: &RunDir,
) -> Result<(Option<PathBuf>, Position), TrainError> {
    let Some(path) = broadcast_resume_checkpoint(comm, plan, out)? else {
        return Ok((None, Position::default()));
    };
    let position = trainer.restore(model, &path)?;
    // Decided from the path alone (the same on every rank, wherever the files are).
    if !out.paths().holds_checkpoint(&path) {
        if out.writes() {
            tracing::info!(
                "{}: resumed from another run directory; its best checkpoint stays there, and \
                 this run keeps its own best from here",
                path.display()
            );
        }
        trainer.forget_best();
    }
    Ok((Some(path), position))
}

/// The summary of a run found finished ([`finished_already`]): rank 0 reads it, the others
/// return an empty one.
fn finished_summary(out: &RunDir) -> Result<Summary, TrainError> {
    match out.writes() {
        true => Ok(Summary::read(&out.paths().summary()).map_err(RunDirError::from)?),
        false => Ok(Summary::default()),
    }
}

/// The ranks agreed to stop at the end of an epoch, whose checkpoint is written: the error that
/// ends the run there, naming the checkpoint (on rank 0). A collective.
fn stopped_at_epoch_end(comm: &dyn Communicator, trainer: &Trainer, out: &RunDir) -> TrainError {
    comm.barrier();
    let checkpoint = out.writes().then(|| out.paths().step_checkpoint(trainer.steps()));
    TrainError::Preempted(Preempted { global_step: trainer.steps(), checkpoint })
}

/// The best checkpoint (when the run keeps one) evaluated again, as the tutorial reloads
/// `best_model.pt`: its epoch and report go into `summary`, and every image's result is
/// returned. A collective.
fn evaluate_best(
    plan: &RunPlan,
    data: &Splits,
    comm: &dyn Communicator,
    out: &RunDir,
    trainer: &Trainer,
    summary: &mut Summary,
) -> Result<Option<eval::CheckpointEvaluation>, TrainError> {
    if !trainer.has_best_checkpoint() {
        return Ok(None);
    }
    let best = out.paths().best_checkpoint();
    let (epoch, report, evaluation) = eval::evaluate_best(plan, data.classes(), &data.val, comm, &best)?;
    if out.writes() {
        tracing::info!(
            "best epoch {epoch} ({} evaluated again): val loss {:.4} top-1 {:.4}",
            best.display(),
            report.loss,
            report.top1
        );
    }
    (summary.best_epoch, summary.best_eval) = (Some(epoch), Some(report));
    Ok(Some(evaluation))
}

/// The training and validation splits, which agree on the classes.
pub struct Splits {
    pub train: Arc<dyn Dataset>,
    pub val: Arc<dyn Dataset>,
}

impl Splits {
    /// Opens both splits under the plan's data root and checks them against each other, the
    /// configured class count and the batch size.
    pub fn open(plan: &RunPlan) -> Result<Splits, TrainError> {
        let train = crate::data::open_split(plan.data_root(), plan.train_split(), plan.class_order())?;
        let val = crate::data::open_split(plan.data_root(), plan.val_split(), plan.class_order())?;
        if train.classes() != val.classes() {
            return Err(TrainError::ClassMismatch {
                train: train.root().to_path_buf(),
                val: val.root().to_path_buf(),
                train_classes: train.classes().to_vec(),
                val_classes: val.classes().to_vec(),
            });
        }
        if train.len() < plan.batch_size() && plan.drop_last() {
            return Err(TrainError::TooFewImages {
                dir: train.root().to_path_buf(),
                images: train.len(),
                batch: plan.batch_size(),
            });
        }
        let configured = plan.model().num_classes;
        if configured != 0 && configured != train.classes().len() {
            return Err(TrainError::ClassCount {
                configured,
                found: train.classes().len(),
                dir: train.root().to_path_buf(),
            });
        }
        Ok(Splits { train, val })
    }

    pub fn classes(&self) -> &[String] {
        self.train.classes()
    }

    /// The loss's class weights (`train.class_weights`), counted over the training split.
    pub fn class_weights(&self, plan: &RunPlan) -> Result<Option<Vec<f64>>, TrainError> {
        let counts = dataset::class_counts(self.train.as_ref());
        let setting = plan.class_weights();
        let weights =
            class_weights::resolve(setting, self.classes(), &counts, self.train.root().to_path_buf())?;
        if let Some(weights) = &weights {
            let rounded: Vec<f64> = weights.iter().map(|w| (w * 1e4).round() / 1e4).collect();
            tracing::info!("class weights of the loss: {rounded:?} (training images per class {counts:?})");
        }
        Ok(weights)
    }
}

/// The model as configured: seeded initialisation, starting weights, frozen parts, and the
/// plan's memory format. Returns what the weights started from, for the manifest.
fn build_model(plan: &RunPlan, data: &Splits) -> Result<(Model, Option<StartingWeights>), TrainError> {
    let m = plan.model();
    tch::manual_seed(i64::from_ne_bytes(plan.seed().to_ne_bytes()));
    let mut model = Model::with_head(m.arch, data.classes().len(), &m.head_hidden, plan.compute.device)?;
    if m.zero_init_residual {
        model.zero_init_residual()?;
    }
    let starting = starting_weights(plan)?;
    if let Some(start) = &starting {
        let report = model.load_pretrained(&start.path)?;
        tracing::info!(
            "loaded {} tensors from {}; re-initialised {:?}; ignored {} (num_batches_tracked counters, the file's own head)",
            report.loaded,
            start.path.display(),
            report.reinitialised,
            report.ignored.len()
        );
    }
    if m.freeze_backbone {
        model.freeze_backbone();
    }
    if m.freeze_batchnorm {
        model.freeze_batchnorm();
    }
    plan.compute.prepare_model(&model)?;
    tracing::info!(
        "compute: {} ({}); {} libtorch threads, {} loader threads",
        plan.compute,
        plan.compute_reason,
        plan.threads,
        plan.loader_workers
    );
    Ok((model, starting))
}

/// The file the weights start from: `model.pretrained`, or `model.weights` from PyTorch's cache,
/// downloaded there if missing. Published weights are fetched and read by rank 0 only, since
/// every rank starts from rank 0's weights anyway ([`broadcast_weights`]): compute nodes
/// without internet or without the cache need nothing but rank 0's node.
fn starting_weights(plan: &RunPlan) -> Result<Option<StartingWeights>, TrainError> {
    let m = plan.model();
    let hash = |path: &Path| files::sha256_file(path);
    if let Some(path) = &m.pretrained {
        let sha256 = if plan.topology.is_root() { hash(path)? } else { String::new() };
        return Ok(Some(StartingWeights { name: None, url: None, path: path.clone(), sha256 }));
    }
    let Some(name) = m.weights.as_deref().filter(|_| plan.topology.is_root()) else {
        return Ok(None);
    };
    let file = HubFile::resolve(m.arch, name).map_err(ModelError::from)?;
    let path = weights::fetch_to_cache(m.arch, &file, &m.weights_url, false).map_err(ModelError::from)?;
    Ok(Some(StartingWeights {
        name: Some(file.name.clone()),
        url: Some(file.url(&m.weights_url)),
        sha256: hash(&path)?,
        path,
    }))
}

/// Every rank starts from rank 0's weights, whatever its seed or file system did. A collective.
fn broadcast_weights(comm: &dyn Communicator, model: &Model) {
    cluster::broadcast_from_root(comm, model.state_dict().into_values());
}

/// BatchNorm running statistics (and any other non-trained tensor) from rank 0, so that
/// evaluation and checkpoints see one model. A collective.
pub fn sync_buffers(comm: &dyn Communicator, model: &Model) {
    let buffers = model.state_dict().into_values().filter(|t| !t.requires_grad());
    cluster::broadcast_from_root(comm, buffers);
}

/// Training sums over all ranks (seconds: the mean over ranks). A collective.
pub fn reduce_totals(comm: &dyn Communicator, local: &EpochTotals) -> EpochTotals {
    let world = comm.topology().world_size;
    if world == 1 {
        return *local;
    }
    let mut sums =
        [local.loss_sum, local.correct as f64, local.samples as f64, local.seconds, local.skipped as f64];
    comm.all_reduce_sum_f64(&mut sums);
    EpochTotals {
        loss_sum: sums[0],
        correct: sums[1] as u64,
        samples: sums[2] as u64,
        seconds: sums[3] / world as f64,
        skipped: sums[4] as u64,
    }
}

/// The checkpoint to resume from, on every rank: rank 0 chooses, the others load that same
/// file. A collective.
fn broadcast_resume_checkpoint(
    comm: &dyn Communicator,
    plan: &RunPlan,
    out: &RunDir,
) -> Result<Option<PathBuf>, TrainError> {
    let chosen = match &plan.resume {
        Resume::Fresh | Resume::Overwrite => None,
        Resume::From(path) => Some(path.clone()),
        Resume::Auto => out.auto_resume_checkpoint()?,
    };
    let chosen = chosen.map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    let chosen = cluster::broadcast_string(comm, &chosen, 0);
    Ok(Some(chosen).filter(|p| !p.is_empty()).map(PathBuf::from))
}

/// Whether the run directory holds a finished run (its summary.json is written) to which
/// resuming has nothing to add: training would resume at its end, or after early stopping
/// ended it, or `--resume auto` found no checkpoint to resume from. Resuming it anyway would
/// only write its summary and weights again without training, and lose its final evaluation
/// (a Slurm requeue of a finished job runs `--resume auto` again), so it is left as it is.
/// Rank 0 decides and says so. A collective.
fn finished_already(
    comm: &dyn Communicator,
    plan: &RunPlan,
    out: &RunDir,
    resumed: bool,
    position: &Position,
    trainer: &Trainer,
) -> bool {
    let nothing_to_train = match resumed {
        true => position.epoch >= plan.last_epoch || trainer.stopped_early().is_some(),
        false => plan.resume == Resume::Auto,
    };
    let summary = out.paths().summary();
    let finished = out.writes() && nothing_to_train && summary.exists();
    let finished = cluster::broadcast_string(comm, if finished { "finished" } else { "" }, 0) == "finished";
    if finished && out.writes() {
        tracing::info!(
            "{} holds a finished run ({} is written): nothing is left to train, and the run is left as it \
             is (to train it further, raise train.epochs and resume it)",
            out.paths().root().display(),
            summary.display()
        );
    }
    finished
}

/// How gradients are averaged: not at all with one rank; else NCCL when the ranks train on
/// GPUs and its set-up succeeds on every one of them, or MPI (through host memory for GPU
/// tensors), with the reason in the log ([`choose_reducer`]). A collective.
fn join_gradient_sync(
    plan: &RunPlan,
    model: &Model,
    comm: &Arc<dyn Communicator>,
) -> Result<GradientSync, TrainError> {
    if plan.topology.world_size == 1 {
        return Ok(GradientSync::Local);
    }
    let device = plan.compute.device;
    let reducer = choose_reducer(comm, device, NcclLibrary::load_shared).map_err(GradSyncError::from)?;
    let options = plan.sync_options();
    let on_the_wire = options.wire.map_or("fp32".to_string(), |wire| format!("{wire:?}").to_lowercase());
    tracing::info!(
        "gradient all-reduce: {}, {on_the_wire} on the wire",
        reducer.describe(comm.as_ref(), device.is_cuda())
    );
    Ok(GradientSync::AllReduce(GradSync::new(comm.clone(), model.trainable(), options, reducer)?))
}

/// Bytes of gradient a rank puts into the all-reduce each step: every trainable element, in
/// the wire's format (`dist.compress`).
fn gradient_bytes(plan: &RunPlan, model: &Model) -> u64 {
    let elements: i64 = model.trainable().iter().map(|(_, tensor)| tensor.numel() as i64).sum();
    let per_element = if plan.sync_options().wire.is_some() { 2 } else { 4 };
    u64::try_from(elements).unwrap_or(0) * per_element
}

/// Rank 0's manifest of a starting run: what produced it, and the hash of every data file.
fn run_manifest(
    plan: &RunPlan,
    data: &Splits,
    started: String,
    hosts: Vec<String>,
    starting_weights: Option<StartingWeights>,
    class_weights: Option<Vec<f64>>,
    comm: &dyn Communicator,
) -> Result<Manifest, TrainError> {
    let hashing = Instant::now();
    let mut splits = vec![
        DataSplit::hash(plan.train_split(), data.train.as_ref())?,
        DataSplit::hash(plan.val_split(), data.val.as_ref())?,
    ];
    if let Some(staging) = &plan.staging {
        // A staged copy holds the same files under the same names as `data.root`; record the
        // lasting original, which `rtrain verify` can still find after the node's local disk
        // is wiped.
        for split in &mut splits {
            split.root = std::fs::canonicalize(&staging.from).unwrap_or_else(|_| staging.from.clone());
        }
    }
    tracing::info!(
        "hashed {} data files in {:.1}s",
        splits.iter().map(|split| split.files.len()).sum::<usize>(),
        hashing.elapsed().as_secs_f64()
    );
    let topology = &plan.topology;
    Ok(Manifest {
        rtrain_version: env!("CARGO_PKG_VERSION").to_string(),
        git_revision: manifest::GIT_REVISION.to_string(),
        config_hash: plan.digest()?,
        config: plan.recorded_config().clone(),
        seeds: manifest::Seeds::from_run_seed(plan.seed()),
        deterministic: plan.deterministic(),
        software: manifest::Software::here(comm.library_version()),
        container: manifest::Container::detect(),
        job: manifest::JobRecord {
            launcher: topology.launcher.clone(),
            world_size: topology.world_size,
            nodes: topology.nodes,
            ranks_per_node: topology.local_world_size,
            hosts,
            device: format!("{:?}", plan.compute.device),
            threads_per_rank: plan.threads,
            global_batch_size: plan.global_batch_size(),
        },
        class_weights,
        stopped_early: None,
        data: splits,
        starting_weights,
        started,
        updated: String::new(),
        finished: None,
        epochs: Vec::new(),
        checkpoints: Default::default(),
        weights: None,
    })
}

/// Compares every rank's final weights with rank 0's (a collective); replicas that drifted
/// apart (e.g. a non-deterministic reduction) are reported loudly, and rank 0's model is
/// saved.
fn check_replicas_agree(comm: &dyn Communicator, model: &Model) -> Result<(), TrainError> {
    let digest = weights_digest(model)?;
    let root_digest = cluster::broadcast_string(comm, &digest, 0);
    let rank = comm.topology().rank;
    tracing::info!("final weights digest {digest} (rank {rank})");
    if digest != root_digest {
        tracing::warn!("rank {rank}: final weights differ from rank 0's ({digest} vs {root_digest})");
    }
    Ok(())
}

/// sha256 over every tensor's name and values, in name order: equal on two ranks exactly when
/// their models are bit-identical.
pub fn weights_digest(model: &Model) -> Result<String, TrainError> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for (name, tensor) in model.state_dict() {
        hasher.update(name.as_bytes());
        let values = tensor.to_device(Device::Cpu).to_kind(Kind::Float).contiguous().view(-1);
        let values: Vec<f32> =
            Vec::try_from(values).map_err(|source| TrainError::Digest { name: name.clone(), source })?;
        for value in values {
            hasher.update(value.to_le_bytes());
        }
    }
    Ok(hex::encode(hasher.finalize()))
}

fn log_start(plan: &RunPlan, data: &Splits, sampler: &Sampler, steps_per_epoch: u64, paths: &RunPaths) {
    let topology = &plan.topology;
    let drawn = match sampler {
        Sampler::Shuffle { .. } => String::new(),
        Sampler::Balanced { .. } => format!(", {} drawn per epoch class-balanced", sampler.len()),
    };
    tracing::info!(
        "training {} ({} classes) on {} images{drawn} ({} val), {} epochs x {} steps, batch {} x {} ranks x {} accumulated = {} on {} nodes, {} threads per rank, run dir {}",
        plan.model().arch,
        data.classes().len(),
        data.train.len(),
        data.val.len(),
        plan.epochs(),
        steps_per_epoch,
        plan.batch_size(),
        topology.world_size,
        plan.accumulate(),
        plan.global_batch_size(),
        topology.nodes,
        plan.threads,
        paths.root().display()
    );
}

fn log_done(summary: &Summary) {
    tracing::info!(
        "done in {:.1}s: val top-1 {:.4}, weights {} (sha256 {})",
        summary.wall_seconds,
        summary.final_eval.as_ref().map_or(f64::NAN, |r| r.top1),
        summary.weights.display(),
        &summary.weights_sha256[..16]
    );
}
