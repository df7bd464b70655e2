//! The training run: data, model and optimizer set up from a [`Config`], then epochs of
//! steps (zero_grad -> forward/backward -> gradient all-reduce -> optimizer step), an
//! evaluation after each epoch, checkpoints, metrics and the run directory.
//!
//! Data parallelism: every rank starts from rank 0's weights, trains on its strided shard of
//! each epoch's permutation with `data.batch_size` images per step, and averages gradients with
//! the others after backward, so all ranks take identical steps. Only global rank 0 writes the
//! run directory (the tutorial's GLOBAL_RANK 0 rule); metrics and evaluations are summed over
//! ranks first.
//!
//! Run directory layout: `config.toml` (resolved), `manifest.json` (see [`crate::manifest`]),
//! `metrics.jsonl`, `checkpoints/` (`step-NNNNNNNNN.safetensors`, `best.safetensors`),
//! `model.safetensors` (final weights, torchvision format) and `summary.json`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Reduction, Tensor};

use crate::checkpoint::{self, CheckpointError, CheckpointMeta, EpochTotals};
use crate::config::{BadSample, Config, Workers};
use crate::data::dataset::{self, Dataset};
use crate::data::folder::DataError;
use crate::data::loader::{Loader, LoaderOptions};
use crate::data::shards::ShardError;
use crate::data::transforms::{Augment, Transform};
use crate::device::{self, DeviceError};
use crate::dist::grad_sync::{GradSync, GradSyncError, Reducer, SyncOptions};
use crate::dist::nccl::Nccl;
use crate::dist::{self, Communicator, DistError};
use crate::eval::{self, EvalReport};
use crate::manifest::{self, DataSplit, EpochSummary, FileHash, Manifest, ManifestError};
use crate::metrics::{MetricsError, MetricsLog, StepRecord};
use crate::model::{Model, ModelError};
use crate::optim::{OptimError, Optimizer, Schedule};
use crate::precision::{self, Compute, ShimError};
use crate::sampler;
use crate::tensor_io::{self, TensorIoError};

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Shards(#[from] ShardError),
    #[error("every sample of batch {step} from {} was undecodable and skipped", dir.display())]
    EmptyBatch { step: u64, dir: PathBuf },
    #[error(transparent)]
    Eval(#[from] crate::eval::EvalError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Optim(#[from] OptimError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    File(#[from] TensorIoError),
    #[error("data: {train} has classes {train_classes:?} but {val} has {val_classes:?}")]
    ClassMismatch { train: PathBuf, val: PathBuf, train_classes: Vec<String>, val_classes: Vec<String> },
    #[error("model.num_classes = {configured}, but {dir} has {found} class folders")]
    ClassCount { configured: usize, found: usize, dir: PathBuf },
    #[error("{dir}: fewer training images ({images}) than one batch (data.batch_size = {batch})")]
    TooFewImages { dir: PathBuf, images: usize, batch: usize },
    #[error("training step {global_step}: {source}")]
    Step { global_step: u64, source: tch::TchError },
    #[error("training step {global_step}: loss is {loss} (diverged); lower optim.lr")]
    Diverged { global_step: u64, loss: f64 },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Shim(#[from] ShimError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    GradSync(#[from] GradSyncError),
    #[error(transparent)]
    Dist(#[from] DistError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("{dir}: {images} training images give rank {rank} of {world} no full batch of {batch}")]
    TooFewForRanks { dir: PathBuf, images: usize, rank: usize, world: usize, batch: usize },
}

/// Where to resume from.
#[derive(Debug, Clone, PartialEq)]
pub enum Resume {
    Fresh,
    /// The newest valid checkpoint in the run directory; a fresh start if there is none.
    Auto,
    From(PathBuf),
}

/// What `summary.json` records about a finished run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub arch: String,
    pub classes: Vec<String>,
    pub epochs: u32,
    pub global_steps: u64,
    pub train_images: usize,
    pub val_images: usize,
    pub final_eval: Option<EvalReport>,
    pub best_val_top1: Option<f64>,
    pub wall_seconds: f64,
    pub train_images_per_second: f64,
    pub peak_rss_mib: Option<f64>,
    pub threads: i32,
    /// Ranks that trained (each on `batch_size` images per step) and the nodes they ran on.
    pub world_size: usize,
    pub nodes: usize,
    pub global_batch_size: usize,
    pub weights: PathBuf,
    pub weights_sha256: String,
    pub resumed_from: Option<PathBuf>,
}

#[derive(Serialize)]
struct EpochRecord<'a> {
    kind: &'static str,
    epoch: u32,
    global_step: u64,
    train_loss: f64,
    train_accuracy: f64,
    train_images_per_second: f64,
    lr: f64,
    seconds: f64,
    /// Undecodable training samples skipped this epoch (all ranks).
    skipped_samples: u64,
    val: &'a EvalReport,
}

pub fn train_transform(config: &Config) -> Transform {
    let d = &config.data;
    Transform::Train {
        size: d.image_size,
        augment: Augment { scale: (d.scale[0], d.scale[1]), ratio: (d.ratio[0], d.ratio[1]), hflip: d.hflip },
    }
}

pub fn eval_transform(config: &Config) -> Transform {
    Transform::Eval { size: config.data.image_size, resize: config.eval_resize() }
}

/// The loader's options for batches of `batch_size` with `workers` threads (see
/// [`loader_workers`]); decoding yields to the model when both share the CPU.
pub fn loader_options(
    config: &Config,
    batch_size: usize,
    compute: &Compute,
    workers: usize,
) -> LoaderOptions {
    LoaderOptions {
        batch_size,
        workers,
        prefetch: config.data.prefetch.max(1),
        drop_last: config.data.drop_last,
        skip_bad_samples: config.data.on_bad_sample == BadSample::Skip,
        low_priority: compute.device == Device::Cpu,
        pin_for: compute.device.is_cuda().then_some(compute.device),
    }
}

/// The configured precision and memory format on this device, with the reason for the
/// precision (for the log and `rtrain doctor`).
pub fn compute_for(config: &Config, device: Device) -> (Compute, String) {
    let (precision, why) = precision::resolve(config.train.precision, device);
    (Compute { precision, channels_last: config.train.channels_last, device }, why)
}

/// A model ready to compute as `compute` says (convolution weights in its memory format).
pub fn prepare_model(model: &Model, compute: &Compute) -> Result<(), ShimError> {
    let mut params: Vec<Tensor> = model.state_dict().into_values().collect();
    compute.prepare_parameters(params.iter_mut())
}

/// libtorch intra-op threads: the configured number, else this rank's share of the node: the
/// cores the launcher bound it to, or, when it was not bound, the node's cores split evenly
/// among its `local_ranks` (ranks on one node must not oversubscribe the cores).
pub fn set_threads(configured: usize, local_ranks: usize) -> i32 {
    let threads = match configured {
        0 => core_share(local_ranks),
        n => n,
    };
    tch::set_num_threads(i32::try_from(threads).unwrap_or(1));
    tch::get_num_threads()
}

/// The cores this rank may use: those the launcher bound it to, or, when it was not bound,
/// the node's cores split evenly among its `local_ranks`.
pub fn core_share(local_ranks: usize) -> usize {
    let allowed = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // SAFETY: sysconf has no preconditions.
    let online = usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).unwrap_or(allowed);
    if allowed < online {
        allowed
    } else {
        (online / local_ranks.max(1)).max(1)
    }
}

/// Most loader threads `data.workers = "auto"` starts.
const MAX_AUTO_WORKERS: usize = 8;

/// Loader threads for `data.workers`. `auto`: with the model on the CPU, the cores of this
/// rank's share that libtorch's `threads` leave free, often none — then decoding runs on the
/// training thread between steps, which is faster than a thread that preempts libtorch's
/// (BENCHMARKS.md); with the model on a GPU, every core of the share but one.
pub fn loader_workers(setting: Workers, device: Device, threads: usize, cores: usize) -> usize {
    match setting {
        Workers::Count(n) => n,
        Workers::Auto if device == Device::Cpu => cores.saturating_sub(threads).min(MAX_AUTO_WORKERS),
        Workers::Auto => cores.saturating_sub(1).clamp(1, MAX_AUTO_WORKERS),
    }
}

/// Opens the training and validation splits and checks that they agree on the classes.
/// The training and validation splits.
pub type Splits = (Arc<dyn Dataset>, Arc<dyn Dataset>);

/// Where the data is read from: the node-local copy when `data.stage_dir` stages a shard set
/// (`rtrain train` makes it first), else `data.root`.
pub fn data_root(config: &Config) -> PathBuf {
    match &config.data.stage_dir {
        Some(stage_dir) if config.data.root.join(crate::data::shards::MANIFEST).is_file() => {
            crate::data::shards::staged_root(&config.data.root, stage_dir)
        }
        _ => config.data.root.clone(),
    }
}

pub fn open_splits(config: &Config) -> Result<Splits, TrainError> {
    let root = data_root(config);
    let train = dataset::open_split(&root, &config.data.train_split)?;
    let val = dataset::open_split(&root, &config.data.val_split)?;
    if train.classes() != val.classes() {
        return Err(TrainError::ClassMismatch {
            train: train.root().to_path_buf(),
            val: val.root().to_path_buf(),
            train_classes: train.classes().to_vec(),
            val_classes: val.classes().to_vec(),
        });
    }
    if train.len() < config.data.batch_size && config.data.drop_last {
        return Err(TrainError::TooFewImages {
            dir: train.root().to_path_buf(),
            images: train.len(),
            batch: config.data.batch_size,
        });
    }
    Ok((train, val))
}

/// Copies checkpointed tensors into the model, which must have every one of them.
pub fn restore_model(
    model: &Model,
    tensors: &std::collections::BTreeMap<String, Tensor>,
    path: &Path,
) -> Result<(), TrainError> {
    tch::no_grad(|| {
        for (name, mut target) in model.state_dict() {
            let source = tensors.get(&name).ok_or_else(|| ModelError::Incompatible {
                path: path.to_path_buf(),
                arch: model.arch,
                problems: format!("{name} is missing"),
            })?;
            target.f_copy_(source).map_err(|source| ModelError::Read { path: path.to_path_buf(), source })?;
        }
        Ok(())
    })
}

struct Run<'a> {
    config: &'a Config,
    comm: Arc<dyn Communicator>,
    /// Present with more than one rank: averages gradients after backward.
    grad_sync: Option<GradSync>,
    run_dir: PathBuf,
    checkpoints: PathBuf,
    model: Model,
    compute: Compute,
    loader_workers: usize,
    optimizer: Optimizer,
    schedule: Schedule,
    classes: Vec<String>,
    /// Written by rank 0 only.
    metrics: Option<MetricsLog>,
    /// Kept and written by rank 0 only.
    manifest: Option<Manifest>,
    best_val_top1: Option<f64>,
    last_val_top1: Option<f64>,
}

/// Trains as `config` says into `run_dir`. `stop_after_epochs` ends the run early (after that
/// many epochs in all) without changing anything that depends on `train.epochs`, such as the
/// learning-rate schedule: `rtrain reproduce --epochs N` re-runs a prefix of a run exactly.
pub fn train(
    config: &Config,
    run_dir: &Path,
    resume: Resume,
    stop_after_epochs: Option<u32>,
    comm: Arc<dyn Communicator>,
) -> Result<Summary, TrainError> {
    let started = Instant::now();
    let started_at = manifest::now();
    let topology = comm.topology().clone();
    precision::set_deterministic(config.run.deterministic)?;
    let threads = set_threads(config.train.threads, topology.local_world_size);
    let (train_set, val_set) = open_splits(config)?;
    let classes = train_set.classes().to_vec();
    let num_classes = match config.model.num_classes {
        0 => classes.len(),
        n if n == classes.len() => n,
        n => {
            return Err(TrainError::ClassCount {
                configured: n,
                found: classes.len(),
                dir: train_set.root().to_path_buf(),
            })
        }
    };

    let device = device::choose(config.train.device, &topology, device::visible_gpus())?;
    device::prepare(device, config.run.deterministic);
    tch::manual_seed(i64::from_ne_bytes(config.run.seed.to_ne_bytes()));
    let mut model = Model::new(config.model.arch, num_classes, device)?;
    if let Some(path) = &config.model.pretrained {
        let report = model.load_pretrained(path)?;
        tracing::info!(
            "loaded {} tensors from {}; re-initialised {:?}; ignored {} num_batches_tracked counters",
            report.loaded,
            path.display(),
            report.reinitialised,
            report.ignored.len()
        );
    }
    if config.model.freeze_backbone {
        model.freeze_backbone();
    }
    if config.model.freeze_batchnorm {
        model.freeze_batchnorm();
    }
    let (compute, why) = compute_for(config, device);
    prepare_model(&model, &compute)?;
    let workers = loader_workers(
        config.data.workers,
        device,
        threads.unsigned_abs() as usize,
        core_share(topology.local_world_size),
    );
    tracing::info!("compute: {compute} ({why}); {threads} libtorch threads, {workers} loader threads");
    // Every rank starts from rank 0's weights, whatever its seed or file system did.
    dist::broadcast_from_root(comm.as_ref(), model.state_dict().into_values());
    let optimizer = Optimizer::new(&config.optim, model.trainable());

    let shard_len = sampler::shard_len(train_set.len(), topology.world_size, config.dist.uneven);
    let batches_per_epoch = match config.data.drop_last {
        true => shard_len / config.data.batch_size,
        false => shard_len.div_ceil(config.data.batch_size),
    } as u64;
    if batches_per_epoch == 0 {
        return Err(TrainError::TooFewForRanks {
            dir: train_set.root().to_path_buf(),
            images: train_set.len(),
            rank: topology.rank,
            world: topology.world_size,
            batch: config.data.batch_size,
        });
    }
    let steps_per_epoch = match config.train.max_steps_per_epoch {
        0 => batches_per_epoch,
        cap => batches_per_epoch.min(cap),
    };
    let schedule = Schedule::new(&config.schedule, config.optim.lr, steps_per_epoch, config.train.epochs);

    let hosts = dist::gather_strings(comm.as_ref(), &topology.host);
    let checkpoints = run_dir.join("checkpoints");
    let metrics = if topology.is_root() {
        std::fs::create_dir_all(&checkpoints)
            .map_err(|source| TrainError::Io { path: checkpoints.clone(), source })?;
        tensor_io::write_atomic(&run_dir.join("config.toml"), config.to_toml().as_bytes())?;
        Some(MetricsLog::open(&run_dir.join("metrics.jsonl"), None)?)
    } else {
        None
    };

    // Rank 0 chooses the checkpoint; every rank loads that same file.
    let chosen = match resume {
        Resume::Fresh => None,
        Resume::From(path) => Some(path),
        Resume::Auto if !topology.is_root() => None,
        Resume::Auto => match checkpoint::latest_valid(&checkpoints) {
            Ok(path) => Some(path),
            Err(CheckpointError::NoneFound { .. }) => {
                tracing::info!("no checkpoint in {} yet: starting fresh", checkpoints.display());
                None
            }
            Err(other) => return Err(other.into()),
        },
    };
    let chosen = chosen.map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    let resume_path =
        Some(dist::broadcast_string(comm.as_ref(), &chosen, 0)).filter(|p| !p.is_empty()).map(PathBuf::from);
    let mut run = Run {
        config,
        comm: comm.clone(),
        grad_sync: None,
        run_dir: run_dir.to_path_buf(),
        checkpoints,
        model,
        compute,
        loader_workers: workers,
        optimizer,
        schedule,
        classes,
        metrics,
        manifest: None,
        best_val_top1: None,
        last_val_top1: None,
    };
    let mut position = Position::default();
    if let Some(path) = &resume_path {
        position = run.restore(path)?;
    }
    if topology.is_root() {
        let hashing = Instant::now();
        let mut data = vec![
            DataSplit::hash(&config.data.train_split, train_set.as_ref())?,
            DataSplit::hash(&config.data.val_split, val_set.as_ref())?,
        ];
        if config.data.stage_dir.is_some() {
            // A staged copy holds the same files under the same names as `data.root`; record
            // the lasting original, which `rtrain verify` can still find after the node's
            // local disk is wiped.
            for split in &mut data {
                split.root =
                    std::fs::canonicalize(&config.data.root).unwrap_or_else(|_| config.data.root.clone());
            }
        }
        tracing::info!(
            "hashed {} data files in {:.1}s",
            data.iter().map(|split| split.files.len()).sum::<usize>(),
            hashing.elapsed().as_secs_f64()
        );
        let job = manifest::Job {
            launcher: topology.launcher.clone(),
            world_size: topology.world_size,
            nodes: topology.nodes,
            ranks_per_node: topology.local_world_size,
            hosts,
            device: format!("{:?}", run.compute.device),
            threads_per_rank: threads,
        };
        run.start_manifest(started_at, job, data, comm.library_version(), position.epoch)?;
    }
    if topology.world_size > 1 {
        let reducer = gradient_reducer(comm.as_ref(), device);
        tracing::info!("gradient all-reduce: {}", reducer.describe(comm.as_ref(), device.is_cuda()));
        run.grad_sync = Some(GradSync::new(
            comm.clone(),
            run.model.trainable(),
            SyncOptions {
                bucket_mb: config.dist.bucket_mb,
                overlap: config.dist.overlap,
                poll: std::time::Duration::from_micros(config.dist.poll_us),
            },
            reducer,
        )?);
    }

    tracing::info!(
        "training {} ({} classes) on {} images ({} val), {} epochs x {} steps, batch {} x {} ranks on {} nodes, {} threads per rank, run dir {}",
        config.model.arch,
        num_classes,
        train_set.len(),
        val_set.len(),
        config.train.epochs,
        steps_per_epoch,
        config.data.batch_size,
        topology.world_size,
        topology.nodes,
        threads,
        run_dir.display()
    );

    let mut final_eval = None;
    let mut trained_images = 0u64;
    let mut trained_seconds = 0.0;
    let last_epoch = stop_after_epochs.map_or(config.train.epochs, |n| n.min(config.train.epochs));
    for epoch in position.epoch..last_epoch {
        let start_batch = if epoch == position.epoch { position.step_in_epoch } else { 0 };
        // Checkpointed sums are global: rank 0 carries them, the others start from zero.
        let totals = if epoch == position.epoch && topology.is_root() {
            position.totals
        } else {
            EpochTotals::default()
        };
        let totals = run.train_epoch(&train_set, epoch, start_batch, steps_per_epoch, totals)?;
        let totals = run.global_totals(&totals);
        trained_images += totals.samples;
        trained_seconds += totals.seconds;
        run.sync_buffers();
        let report = eval::evaluate(
            &run.model,
            val_set.clone(),
            eval_transform(config),
            loader_options(config, config.eval_batch_size(), &run.compute, run.loader_workers),
            &run.compute,
            comm.as_ref(),
        )?;
        run.finish_epoch(epoch, &totals, &report)?;
        final_eval = Some(report);
    }

    run.sync_buffers();
    let digest = weights_digest(&run.model);
    let root_digest = dist::broadcast_string(comm.as_ref(), &digest, 0);
    tracing::info!("final weights digest {digest} (rank {})", topology.rank);
    if digest != root_digest {
        // Replicas drifted apart (e.g. a non-deterministic reduction): rank 0's model is saved,
        // but say so loudly.
        tracing::warn!(
            "rank {}: final weights differ from rank 0's ({digest} vs {root_digest})",
            topology.rank
        );
    }

    let weights = run.run_dir.join("model.safetensors");
    let summary = Summary {
        arch: config.model.arch.to_string(),
        classes: run.classes.clone(),
        epochs: config.train.epochs,
        global_steps: run.optimizer.steps(),
        train_images: train_set.len(),
        val_images: val_set.len(),
        final_eval,
        best_val_top1: run.best_val_top1,
        wall_seconds: started.elapsed().as_secs_f64(),
        train_images_per_second: if trained_seconds > 0.0 {
            trained_images as f64 / trained_seconds
        } else {
            0.0
        },
        peak_rss_mib: crate::memory::peak_rss_mib(),
        threads,
        world_size: topology.world_size,
        nodes: topology.nodes,
        global_batch_size: config.data.batch_size * topology.world_size,
        weights_sha256: String::new(),
        weights,
        resumed_from: resume_path,
    };
    if !topology.is_root() {
        return Ok(summary);
    }
    run.model.write_torchvision(&summary.weights, run.optimizer.steps())?;
    let summary = Summary { weights_sha256: tensor_io::sha256_file(&summary.weights)?, ..summary };
    if let Some(manifest) = &mut run.manifest {
        manifest.weights = Some(FileHash {
            path: manifest::relative(&run.run_dir, &summary.weights),
            sha256: summary.weights_sha256.clone(),
        });
        manifest.finished = Some(manifest::now());
        manifest.write(&run.run_dir)?;
    }
    let json = serde_json::to_string_pretty(&summary).unwrap_or_default();
    tensor_io::write_atomic(&run.run_dir.join("summary.json"), json.as_bytes())?;
    tracing::info!(
        "done in {:.1}s: val top-1 {:.4}, weights {} (sha256 {})",
        summary.wall_seconds,
        summary.final_eval.as_ref().map_or(f64::NAN, |r| r.top1),
        summary.weights.display(),
        &summary.weights_sha256[..16]
    );
    Ok(summary)
}

/// NCCL when the ranks train on GPUs and every one of them can load it, else MPI (through host
/// memory for GPU tensors), with the reason in the log. Called by every rank together.
fn gradient_reducer(comm: &dyn Communicator, device: Device) -> Reducer {
    if !device.is_cuda() {
        return Reducer::Mpi;
    }
    match Nccl::join(comm, device) {
        Ok(nccl) => Reducer::Nccl(nccl),
        Err(err) => {
            tracing::warn!("NCCL not used, gradients go through MPI and host memory: {err}");
            Reducer::Mpi
        }
    }
}

/// The batch's mean loss (with the configured label smoothing) and the logits, in the run's
/// precision and memory format on its device. `labels` must already be on the device.
fn forward_loss(
    model: &Model,
    compute: &Compute,
    images: &Tensor,
    labels: &Tensor,
    label_smoothing: f64,
    global_step: u64,
) -> Result<(Tensor, Tensor), TrainError> {
    let images = compute.input(images)?;
    // Autocast covers the forward pass and the loss, not backward (as torch.autocast).
    let _autocast = compute.autocast()?;
    let logits = model.forward_t(&images, true);
    let loss = logits.f_cross_entropy_loss::<Tensor>(labels, None, Reduction::Mean, -100, label_smoothing);
    let loss = loss.map_err(|source| TrainError::Step { global_step, source })?;
    Ok((logits, loss))
}

/// Where training stands: the epoch in progress, how many of its steps are done, and the
/// training sums of those steps.
#[derive(Debug, Default)]
struct Position {
    epoch: u32,
    step_in_epoch: usize,
    totals: EpochTotals,
}

impl Run<'_> {
    /// Rank 0's manifest: continued from the run directory's own when resuming (keeping its
    /// start time and the epochs before the resume point), else new.
    fn start_manifest(
        &mut self,
        started: String,
        job: manifest::Job,
        data: Vec<DataSplit>,
        mpi: Option<String>,
        resume_epoch: u32,
    ) -> Result<(), TrainError> {
        let config = self.config;
        let previous = Manifest::read(&self.run_dir).ok();
        let (started, epochs) = match previous {
            Some(previous) if resume_epoch > 0 || !previous.checkpoints.is_empty() => {
                let epochs = previous.epochs.into_iter().filter(|e| e.epoch < resume_epoch).collect();
                (previous.started, epochs)
            }
            _ => (started, Vec::new()),
        };
        let mut manifest = Manifest {
            rtrain_version: env!("CARGO_PKG_VERSION").to_string(),
            git_revision: manifest::GIT_REVISION.to_string(),
            config_hash: config.hash(),
            config: config.clone(),
            seeds: manifest::Seeds::from_run_seed(config.run.seed),
            deterministic: config.run.deterministic,
            software: manifest::Software::here(mpi),
            container: manifest::Container::detect(),
            job,
            data,
            started,
            updated: String::new(),
            finished: None,
            epochs,
            checkpoints: Default::default(),
            weights: None,
        };
        for (_, file) in checkpoint::list_step_checkpoints(&self.checkpoints)? {
            manifest.add_checkpoint(&self.run_dir, &file)?;
        }
        let best = self.checkpoints.join(checkpoint::BEST_NAME);
        if best.exists() {
            manifest.add_checkpoint(&self.run_dir, &best)?;
        }
        manifest.write(&self.run_dir)?;
        self.manifest = Some(manifest);
        Ok(())
    }

    fn restore(&mut self, path: &Path) -> Result<Position, TrainError> {
        let checkpoint = checkpoint::load(path, Some((self.model.arch, self.model.num_classes)))?;
        let meta = &checkpoint.meta;
        if meta.classes != self.classes {
            return Err(CheckpointError::Mismatch {
                path: path.to_path_buf(),
                found: format!("classes {:?}", meta.classes),
                expected: format!("classes {:?}", self.classes),
            }
            .into());
        }
        if meta.config_hash != self.config.hash() {
            tracing::warn!(
                "{}: made with another configuration; resuming with the current one",
                path.display()
            );
        }
        restore_model(&self.model, &checkpoint.model, path)?;
        self.optimizer.load_state(&checkpoint.optimizer, meta.global_step)?;
        if self.comm.topology().is_root() {
            let resume_point = Some((meta.global_step, meta.epoch));
            self.metrics = Some(MetricsLog::open(&self.run_dir.join("metrics.jsonl"), resume_point)?);
        }
        self.last_val_top1 = meta.val_top1;
        self.best_val_top1 = meta.best_val_top1;
        tracing::info!(
            "resumed from {} at epoch {} step {} (global step {})",
            path.display(),
            meta.epoch,
            meta.step_in_epoch,
            meta.global_step
        );
        Ok(Position {
            epoch: meta.epoch,
            step_in_epoch: usize::try_from(meta.step_in_epoch).unwrap_or(usize::MAX),
            totals: meta.epoch_totals,
        })
    }

    fn train_epoch(
        &mut self,
        dataset: &Arc<dyn Dataset>,
        epoch: u32,
        start_batch: usize,
        steps_per_epoch: u64,
        mut totals: EpochTotals,
    ) -> Result<EpochTotals, TrainError> {
        let config = self.config;
        let topology = self.comm.topology().clone();
        let permutation = sampler::epoch_permutation(dataset.len(), config.run.seed, u64::from(epoch));
        let order = sampler::rank_shard(&permutation, topology.rank, topology.world_size, config.dist.uneven);
        let loader = Loader::new(
            dataset.clone(),
            order,
            train_transform(config),
            config.run.seed,
            u64::from(epoch),
            start_batch,
            loader_options(config, config.data.batch_size, &self.compute, self.loader_workers),
        );
        let progress = match topology.is_root() {
            true => progress_bar(steps_per_epoch, start_batch as u64, epoch, config.train.epochs),
            false => ProgressBar::hidden(),
        };
        let mut window = (Instant::now(), 0u64);
        // Training time includes waiting for the loader (what an epoch costs), not logging
        // and checkpoints.
        let mut mark = Instant::now();
        for (step_in_epoch, batch) in (start_batch as u64 + 1..=steps_per_epoch).zip(loader) {
            let batch = batch?;
            for bad in &batch.skipped {
                tracing::warn!("skipped an undecodable sample (data.on_bad_sample = skip): {bad}");
            }
            totals.skipped += batch.skipped.len() as u64;
            if batch.indices.is_empty() {
                // Every rank must take every step (the gradient all-reduce), so an empty batch
                // cannot simply be passed over.
                return Err(TrainError::EmptyBatch {
                    step: step_in_epoch,
                    dir: dataset.root().to_path_buf(),
                });
            }
            let global_step = self.optimizer.steps();
            let lr = self.schedule.lr(global_step);
            let (loss, correct) = self.step(&batch.images, &batch.labels, lr)?;
            let samples = batch.indices.len() as u64;
            totals.loss_sum += loss * samples as f64;
            totals.correct += correct;
            totals.samples += samples;
            totals.seconds += mark.elapsed().as_secs_f64();
            window.1 += samples;
            progress.inc(1);

            let log_now =
                step_in_epoch % config.train.log_every_steps == 0 || step_in_epoch == steps_per_epoch;
            if log_now {
                // Global values: the step's loss and accuracy over every rank's batch.
                let mut sums = [loss * samples as f64, correct as f64, samples as f64, window.1 as f64];
                self.comm.all_reduce_sum_f64(&mut sums);
                let (loss, accuracy) = (sums[0] / sums[2].max(1.0), sums[1] / sums[2].max(1.0));
                let rate = sums[3] / window.0.elapsed().as_secs_f64().max(1e-9);
                window = (Instant::now(), 0);
                let record = StepRecord {
                    kind: "step",
                    epoch,
                    step: step_in_epoch,
                    global_step: self.optimizer.steps(),
                    loss,
                    accuracy,
                    lr,
                    images_per_second: rate,
                };
                if let Some(metrics) = &mut self.metrics {
                    metrics.append(&record)?;
                }
                progress.set_message(format!("loss {loss:.4} lr {lr:.4} {rate:.0} img/s"));
                if progress.is_hidden() && topology.is_root() {
                    tracing::info!(
                        "epoch {}/{} step {step_in_epoch}/{steps_per_epoch}: loss {loss:.4} lr {lr:.5} {rate:.1} img/s",
                        epoch + 1,
                        config.train.epochs
                    );
                }
            }
            let every = config.checkpoint.every_steps;
            if every > 0 && step_in_epoch % every == 0 && step_in_epoch < steps_per_epoch {
                self.save_checkpoint(epoch, step_in_epoch, totals)?;
            }
            mark = Instant::now();
        }
        progress.finish_and_clear();
        Ok(totals)
    }

    /// One optimisation step; returns the batch's mean loss and its number of correct top-1
    /// predictions.
    fn step(&mut self, images: &Tensor, labels: &Tensor, lr: f64) -> Result<(f64, u64), TrainError> {
        let global_step = self.optimizer.steps();
        let torch = |source| TrainError::Step { global_step, source };
        match &mut self.grad_sync {
            Some(sync) => sync.zero_grad(),
            None => self.optimizer.zero_grad(),
        }
        let labels = self.compute.labels(labels);
        let smoothing = self.config.train.label_smoothing;
        let (logits, loss) =
            forward_loss(&self.model, &self.compute, images, &labels, smoothing, global_step)?;
        loss.f_backward().map_err(torch)?;
        if let Some(sync) = &mut self.grad_sync {
            sync.finish()?;
        }
        self.optimizer.step(lr)?;
        let loss_value = loss.f_double_value(&[]).map_err(torch)?;
        if !loss_value.is_finite() {
            return Err(TrainError::Diverged { global_step, loss: loss_value });
        }
        let correct =
            tch::no_grad(|| logits.argmax(-1, false).eq_tensor(&labels).sum(Kind::Int64).int64_value(&[]));
        Ok((loss_value, u64::try_from(correct).unwrap_or(0)))
    }

    fn finish_epoch(
        &mut self,
        epoch: u32,
        totals: &EpochTotals,
        report: &EvalReport,
    ) -> Result<(), TrainError> {
        let config = self.config;
        let samples = totals.samples.max(1) as f64;
        let record = EpochRecord {
            kind: "epoch",
            epoch,
            global_step: self.optimizer.steps(),
            train_loss: totals.loss_sum / samples,
            train_accuracy: totals.correct as f64 / samples,
            train_images_per_second: totals.samples as f64 / totals.seconds.max(1e-9),
            lr: self.schedule.lr(self.optimizer.steps().saturating_sub(1)),
            seconds: totals.seconds,
            skipped_samples: totals.skipped,
            val: report,
        };
        if totals.skipped > 0 {
            tracing::warn!("epoch {}: skipped {} undecodable training samples", epoch + 1, totals.skipped);
        }
        if let Some(metrics) = &mut self.metrics {
            metrics.append(&record)?;
        }
        tracing::info!(
            "epoch {}/{}: train loss {:.4} acc {:.4} ({:.1} img/s) | val loss {:.4} top-1 {:.4} per class {:?}",
            epoch + 1,
            config.train.epochs,
            record.train_loss,
            record.train_accuracy,
            record.train_images_per_second,
            report.loss,
            report.top1,
            report.per_class.iter().map(|a| (a * 1000.0).round() / 1000.0).collect::<Vec<_>>()
        );
        tracing::info!("confusion (rows: true class, columns: predicted): {:?}", report.confusion);
        if let Some(manifest) = &mut self.manifest {
            manifest.epochs.push(EpochSummary {
                epoch,
                global_step: record.global_step,
                train_loss: record.train_loss,
                train_accuracy: record.train_accuracy,
                val_loss: report.loss,
                val_top1: report.top1,
                seconds: record.seconds,
                images_per_second: record.train_images_per_second,
            });
        }
        self.last_val_top1 = Some(report.top1);
        let is_best = self.best_val_top1.is_none_or(|best| report.top1 > best);
        if is_best {
            self.best_val_top1 = Some(report.top1);
        }
        let last = epoch + 1 == config.train.epochs;
        let every = config.checkpoint.every_epochs;
        if last || (every > 0 && (epoch + 1) % every == 0) || (is_best && config.checkpoint.keep_best) {
            let saved = self.save_checkpoint(epoch + 1, 0, EpochTotals::default())?;
            if let (Some(path), true) = (saved, is_best && config.checkpoint.keep_best) {
                let best = self.checkpoints.join(checkpoint::BEST_NAME);
                let bytes =
                    std::fs::read(&path).map_err(|source| TrainError::Io { path: path.clone(), source })?;
                tensor_io::write_atomic(&best, &bytes)?;
                if let Some(manifest) = &mut self.manifest {
                    manifest.add_checkpoint(&self.run_dir, &best)?;
                }
            }
        }
        if let Some(manifest) = &mut self.manifest {
            manifest.write(&self.run_dir)?;
        }
        Ok(())
    }

    /// This epoch's training sums over all ranks (seconds: the mean over ranks). A collective.
    fn global_totals(&self, local: &EpochTotals) -> EpochTotals {
        let world = self.comm.topology().world_size;
        if world == 1 {
            return *local;
        }
        let mut sums =
            [local.loss_sum, local.correct as f64, local.samples as f64, local.seconds, local.skipped as f64];
        self.comm.all_reduce_sum_f64(&mut sums);
        EpochTotals {
            loss_sum: sums[0],
            correct: sums[1] as u64,
            samples: sums[2] as u64,
            seconds: sums[3] / world as f64,
            skipped: sums[4] as u64,
        }
    }

    /// BatchNorm running statistics (and any other non-trained tensor) from rank 0, so that
    /// evaluation and checkpoints see one model. A collective.
    fn sync_buffers(&self) {
        let buffers = self.model.state_dict().into_values().filter(|t| !t.requires_grad());
        dist::broadcast_from_root(self.comm.as_ref(), buffers);
    }

    /// Saves a checkpoint from rank 0; every rank must call it (it sums the epoch's totals and
    /// syncs the buffers first). Returns the file on rank 0.
    fn save_checkpoint(
        &mut self,
        epoch: u32,
        step_in_epoch: u64,
        totals: EpochTotals,
    ) -> Result<Option<PathBuf>, TrainError> {
        let totals = self.global_totals(&totals);
        self.sync_buffers();
        if !self.comm.topology().is_root() {
            return Ok(None);
        }
        let meta = CheckpointMeta {
            arch: self.model.arch,
            num_classes: self.model.num_classes,
            classes: self.classes.clone(),
            epoch,
            step_in_epoch,
            global_step: self.optimizer.steps(),
            seed: self.config.run.seed,
            config_hash: self.config.hash(),
            val_top1: self.last_val_top1,
            best_val_top1: self.best_val_top1,
            epoch_totals: totals,
            rtrain_version: env!("CARGO_PKG_VERSION").to_string(),
        };
        let path = self.checkpoints.join(checkpoint::step_file_name(meta.global_step));
        let model: Vec<(String, Tensor)> = self.model.state_dict().into_iter().collect();
        checkpoint::save(&path, &meta, model, self.optimizer.state_tensors())?;
        for stale in checkpoint::retention(
            &checkpoint::list_step_checkpoints(&self.checkpoints)?,
            self.config.checkpoint.keep_last,
        ) {
            if let Err(error) = std::fs::remove_file(&stale) {
                tracing::warn!("could not delete old checkpoint {}: {error}", stale.display());
            }
        }
        if let Some(manifest) = &mut self.manifest {
            manifest.add_checkpoint(&self.run_dir, &path)?;
            manifest.drop_missing_checkpoints(&self.run_dir);
            manifest.write(&self.run_dir)?;
        }
        tracing::debug!("checkpoint {}", path.display());
        Ok(Some(path))
    }
}

fn progress_bar(steps: u64, done: u64, epoch: u32, epochs: u32) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps).with_position(done);
    let style = ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg} ({eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(format!("{}/{epochs}", epoch + 1));
    bar
}

/// sha256 over every tensor's name and values, in name order: equal on two ranks exactly when
/// their models are bit-identical.
pub fn weights_digest(model: &Model) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for (name, tensor) in model.state_dict() {
        hasher.update(name.as_bytes());
        let values: Vec<f32> =
            Vec::try_from(tensor.to_device(Device::Cpu).to_kind(Kind::Float).contiguous().view(-1))
                .unwrap_or_default();
        for value in values {
            hasher.update(value.to_le_bytes());
        }
    }
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::{loader_workers, Workers};
    use tch::Device;

    #[test]
    fn auto_loader_workers_take_only_the_cores_libtorch_leaves_free_on_cpu() {
        assert_eq!(loader_workers(Workers::Auto, Device::Cpu, 2, 2), 0, "every core computes: decode inline");
        assert_eq!(loader_workers(Workers::Auto, Device::Cpu, 1, 2), 1);
        assert_eq!(loader_workers(Workers::Auto, Device::Cpu, 4, 64), 8, "capped");
        assert_eq!(loader_workers(Workers::Auto, Device::Cuda(0), 1, 16), 8);
        assert_eq!(
            loader_workers(Workers::Auto, Device::Cuda(0), 1, 1),
            1,
            "a GPU always gets a loader thread"
        );
        assert_eq!(loader_workers(Workers::Count(3), Device::Cpu, 2, 2), 3, "a number is taken as given");
    }
}
