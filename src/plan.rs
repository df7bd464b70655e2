//! Every decision derived from the configuration and the job, made once: libtorch threads,
//! loader threads, device, precision and memory format, where the data is read from, the
//! transforms, the loader's options, steps per epoch and the batches of each, gradient
//! synchronisation, where to resume and when to stop.
//! Training, evaluation, prediction and the benchmarks read a [`RunPlan`] instead of deriving
//! these again from raw settings: the plan holds the configuration privately and answers with
//! decisions and typed settings; the whole configuration leaves it only to be recorded
//! ([`RunPlan::recorded_config`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tch::Device;

use crate::cluster::device::{self, DeviceError};
use crate::cluster::grad_sync::SyncOptions;
use crate::cluster::watchdog;
use crate::cluster::wire::Wire;
use crate::cluster::Topology;
use crate::config::{
    BadSample, CheckpointConfig, ClassWeights, Config, ConfigError, DistConfig, EarlyStoppingConfig,
    EvalGeometry, ModelConfig, OptimConfig, SamplerKind, ScheduleConfig, TrainGeometry, Workers,
};
use crate::data::dataset::{self, Dataset};
use crate::data::loader::{EpochBatches, LoaderOptions};
use crate::data::sampler::{self, Sampler};
use crate::data::shards::{self, Staging};
use crate::data::transforms::{Augment, Geometry, Transform};
use crate::model::precision::{self, Compute};
use crate::util::shim::ShimError;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Shim(#[from] ShimError),
    #[error("{dir}: {images} training images give rank {rank} of {world} no full batch of {batch}")]
    TooFewForRanks { dir: PathBuf, images: usize, rank: usize, world: usize, batch: usize },
    #[error("{dir}: {images} training images give rank {rank} of {world} {batches} batch(es) of {batch} an epoch, fewer than one step of train.accumulate = {accumulate}")]
    TooFewToAccumulate {
        dir: PathBuf,
        images: usize,
        rank: usize,
        world: usize,
        batch: usize,
        batches: u64,
        accumulate: u64,
    },
}

/// Where a run starts.
#[derive(Debug, Clone, PartialEq)]
pub enum Resume {
    Fresh,
    /// A fresh start that first deletes the run already in the run directory (`--overwrite`).
    Overwrite,
    /// The newest valid checkpoint in the run directory; a fresh start if there is none.
    Auto,
    From(PathBuf),
}

/// A run's derived decisions. Making one applies the process-wide settings it decides
/// (libtorch's thread count, deterministic kernels, the device's flags), so make it before any
/// tensor work.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// The resolved configuration, which the methods turn into decisions.
    config: Config,
    pub topology: Topology,
    /// libtorch intra-op threads, as libtorch reports them after setting.
    pub threads: i32,
    pub loader_workers: usize,
    pub compute: Compute,
    /// Why `compute.precision` is what it is (for the log and `rtrain doctor`).
    pub compute_reason: String,
    /// Training's copy of the data to node-local disk, if any (never for inference).
    pub staging: Option<Staging>,
    pub resume: Resume,
    /// The run ends after this many epochs in all (`train.epochs`, or fewer for `rtrain
    /// reproduce --epochs N`, without changing anything that depends on `train.epochs`, such as
    /// the learning-rate schedule).
    pub last_epoch: u32,
}

impl RunPlan {
    /// The plan of a training run of `topology`'s rank.
    pub fn for_training(
        config: &Config,
        topology: &Topology,
        resume: Resume,
        stop_after_epochs: Option<u32>,
    ) -> Result<RunPlan, PlanError> {
        precision::set_deterministic(config.run.deterministic)?;
        // Until `train::run` sets `dist.timeout_s`, every wait is a set-up one.
        watchdog::set_limit(Duration::from_secs_f64(config.dist.setup_timeout_s));
        let threads = set_threads(config.train.threads, topology.local_world_size);
        let device = choose_device(config, topology)?;
        device::prepare(device, config.run.deterministic);
        let last_epoch = stop_after_epochs.map_or(config.train.epochs, |n| n.min(config.train.epochs));
        let mut plan = RunPlan::new(config, topology.clone(), threads, device, resume, last_epoch);
        plan.staging = staging(config);
        Ok(plan)
    }

    /// The plan of `rtrain eval` and `rtrain predict`: one process on the CPU, reading
    /// `data.root` itself.
    pub fn for_inference(config: &Config) -> RunPlan {
        let threads = set_threads(config.train.threads, 1);
        RunPlan::new(config, Topology::single(), threads, Device::Cpu, Resume::Fresh, 0)
    }

    /// The plan of `rtrain predict --out` as `topology`'s rank: the device training would
    /// choose (the rank's GPU when there is one), its cores shared among the node's ranks.
    pub fn for_prediction(config: &Config, topology: &Topology) -> Result<RunPlan, PlanError> {
        let threads = set_threads(config.train.threads, topology.local_world_size);
        let device = choose_device(config, topology)?;
        device::prepare(device, false);
        Ok(RunPlan::new(config, topology.clone(), threads, device, Resume::Fresh, 0))
    }

    fn new(
        config: &Config,
        topology: Topology,
        threads: i32,
        device: Device,
        resume: Resume,
        last_epoch: u32,
    ) -> RunPlan {
        let (compute, compute_reason) = compute_on(config, device);
        let loader_workers = loader_workers(
            config.data.workers,
            device,
            threads.unsigned_abs() as usize,
            core_share(topology.local_world_size),
        );
        RunPlan {
            config: config.clone(),
            staging: None,
            topology,
            threads,
            loader_workers,
            compute,
            compute_reason,
            resume,
            last_epoch,
        }
    }

    /// The resolved configuration whole, to be recorded (`config.toml`, the manifest, a
    /// checkpoint's preprocessing); decisions are the other methods'.
    pub fn recorded_config(&self) -> &Config {
        &self.config
    }

    /// sha256 of the configuration (its `config_hash`): identifies it in checkpoints and
    /// prediction jobs.
    pub fn digest(&self) -> Result<String, ConfigError> {
        self.config.hash()
    }

    /// The one seed every random choice derives from, `run.seed`.
    pub fn seed(&self) -> u64 {
        self.config.run.seed
    }

    /// Whether results are bit-reproducible, `run.deterministic` (applied when the plan was
    /// made).
    pub fn deterministic(&self) -> bool {
        self.config.run.deterministic
    }

    /// The model to build and what it starts from, `[model]`.
    pub fn model(&self) -> &ModelConfig {
        &self.config.model
    }

    /// The optimizer, `[optim]`.
    pub fn optim(&self) -> &OptimConfig {
        &self.config.optim
    }

    /// The learning-rate schedule, `[schedule]`, over [`Self::epochs`].
    pub fn schedule(&self) -> &ScheduleConfig {
        &self.config.schedule
    }

    /// When training stops early, `train.early_stopping`.
    pub fn early_stopping(&self) -> &EarlyStoppingConfig {
        &self.config.train.early_stopping
    }

    /// When checkpoints are saved and which are kept, `[checkpoint]`.
    pub fn checkpoints(&self) -> &CheckpointConfig {
        &self.config.checkpoint
    }

    /// The run's length in epochs, `train.epochs`, which the schedule spans; the run itself
    /// ends after [`Self::last_epoch`].
    pub fn epochs(&self) -> u32 {
        self.config.train.epochs
    }

    pub fn label_smoothing(&self) -> f64 {
        self.config.train.label_smoothing
    }

    /// Steps between progress lines when not on a terminal.
    pub fn log_every_steps(&self) -> u64 {
        self.config.train.log_every_steps
    }

    /// `log.trace_steps`: steps in the step trace (0: none).
    pub fn trace_steps(&self) -> u64 {
        self.config.log.trace_steps
    }

    /// `log.straggler_threshold`.
    pub fn straggler_threshold(&self) -> f64 {
        self.config.log.straggler_threshold
    }

    /// Whether training steps read synthetic tensors (`data.source = "synthetic"`).
    pub fn synthetic_input(&self) -> bool {
        self.config.data.source == crate::config::DataSource::Synthetic
    }

    /// The loss's class weights as configured, `train.class_weights`.
    pub fn class_weights(&self) -> &ClassWeights {
        &self.config.train.class_weights
    }

    pub fn train_split(&self) -> &str {
        &self.config.data.train_split
    }

    pub fn val_split(&self) -> &str {
        &self.config.data.val_split
    }

    /// The classes' order, `data.class_order` (empty: sorted names).
    pub fn class_order(&self) -> &[String] {
        &self.config.data.class_order
    }

    /// Images per training batch on this rank, `data.batch_size`.
    pub fn batch_size(&self) -> usize {
        self.config.data.batch_size
    }

    /// Whether a partial last training batch is dropped, `data.drop_last`.
    pub fn drop_last(&self) -> bool {
        self.config.data.drop_last
    }

    /// Side of the square image the network sees, `data.image_size`.
    pub fn image_size(&self) -> u32 {
        self.config.data.image_size
    }

    /// How the training split's samples are chosen each epoch (`data.sampler`).
    pub fn train_sampler(&self, train: &dyn Dataset, classes: usize) -> Sampler {
        match self.config.data.sampler {
            SamplerKind::Shuffle => Sampler::Shuffle { len: train.len() },
            SamplerKind::Balanced => {
                Sampler::balanced(&dataset::labels(train), classes, self.config.data.samples_per_epoch)
            }
        }
    }

    /// This rank's share of epoch `epoch`'s order of `sampler`: seeded by the run's seed, split
    /// among the ranks as `dist.uneven` says.
    pub fn rank_order(&self, sampler: &Sampler, epoch: u32) -> Vec<usize> {
        let epoch_order = sampler.epoch_order(self.seed(), u64::from(epoch));
        let topology = &self.topology;
        sampler::rank_shard(&epoch_order, topology.rank, topology.world_size, self.config.dist.uneven)
    }

    /// How long a collective may wait once training runs, `dist.timeout_s`.
    pub fn collective_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.config.dist.timeout_s)
    }

    /// Where the data is read from: the node-local copy when training stages it, else
    /// `data.root`.
    pub fn data_root(&self) -> &Path {
        self.staging.as_ref().map_or(&self.config.data.root, |staging| &staging.to)
    }

    pub fn train_transform(&self) -> Transform {
        let d = &self.config.data;
        let geometry = match d.train_transform {
            TrainGeometry::RandomResizedCrop => Geometry::RandomResizedCrop(Augment {
                scale: (d.scale[0], d.scale[1]),
                ratio: (d.ratio[0], d.ratio[1]),
                hflip: d.hflip,
            }),
            TrainGeometry::Resize => Geometry::Resize { hflip: d.hflip },
        };
        Transform {
            size: d.image_size,
            policy: d.augment_policy.policy(),
            geometry,
            normalize: d.normalize,
            jpeg_draft: d.jpeg_draft,
            exif_orientation: d.exif_orientation,
            max_image_pixels: d.max_image_pixels,
        }
    }

    pub fn eval_transform(&self) -> Transform {
        eval_transform_of(&self.config)
    }

    /// The loader's options for training batches; decoding yields to the model when both share
    /// the CPU.
    pub fn train_loader(&self) -> LoaderOptions {
        self.loader_options(self.config.data.batch_size)
    }

    pub fn eval_loader(&self) -> LoaderOptions {
        self.loader_options(self.config.eval_batch_size())
    }

    fn loader_options(&self, batch_size: usize) -> LoaderOptions {
        LoaderOptions {
            batch_size,
            workers: self.loader_workers,
            prefetch: self.config.data.prefetch.max(1),
            skip_bad_samples: self.config.data.on_bad_sample == BadSample::Skip,
            low_priority: self.compute.device == Device::Cpu,
            pin_for: self.compute.device.is_cuda().then_some(self.compute.device),
        }
    }

    /// The training (micro-)batches of `epoch` this rank loads: `train.accumulate` for each of
    /// the `steps_per_epoch` steps (from [`Self::steps_per_epoch`]), from step `start` on
    /// (resuming mid-epoch), augmented with randomness keyed by the run's seed and the epoch.
    pub fn epoch_batches(&self, epoch: u32, steps_per_epoch: u64, start: u64) -> EpochBatches {
        let to_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let accumulate = self.accumulate();
        EpochBatches {
            seed: self.config.run.seed,
            epoch: u64::from(epoch),
            count: to_usize(steps_per_epoch.saturating_mul(accumulate)),
            start: to_usize(start.saturating_mul(accumulate)),
        }
    }

    /// Micro-batches per optimizer step, `train.accumulate`.
    pub fn accumulate(&self) -> u64 {
        u64::from(self.config.train.accumulate.max(1))
    }

    /// Images per optimizer step over all ranks: `data.batch_size x ranks x train.accumulate`.
    pub fn global_batch_size(&self) -> usize {
        self.config.data.batch_size * self.topology.world_size * self.accumulate() as usize
    }

    /// How gradients are averaged between ranks: the `[dist]` settings.
    pub fn sync_options(&self) -> SyncOptions {
        sync_options(&self.config.dist)
    }

    /// Whether BatchNorm statistics are summed over the ranks (SyncBatchNorm): when
    /// `model.sync_batchnorm` asks for it and BatchNorm still learns statistics.
    pub fn sync_batchnorm(&self) -> bool {
        self.config.model.sync_batchnorm && !self.config.model.freeze_batchnorm
    }

    /// Optimizer steps per epoch when the sampler gives an epoch `images` samples (`dir`, the
    /// split, for the message): this rank's batches ([`batches_per_epoch`]) divided by
    /// `train.accumulate` (batches that do not fill a whole step are left out), capped by
    /// `train.max_steps_per_epoch`. Equal on every rank (the sampler gives every rank a shard
    /// of the same length).
    pub fn steps_per_epoch(&self, images: usize, dir: &std::path::Path) -> Result<u64, PlanError> {
        let d = &self.config.data;
        let shard_len = sampler::shard_len(images, self.topology.world_size, self.config.dist.uneven);
        if !d.drop_last && shard_len % d.batch_size == 1 {
            tracing::info!(
                "the last batch of each epoch would hold 1 image on each rank ({shard_len} images in batches of {}): it is dropped",
                d.batch_size
            );
        }
        let batches = batches_per_epoch(shard_len, d.batch_size, d.drop_last) as u64;
        if batches == 0 {
            return Err(PlanError::TooFewForRanks {
                dir: dir.to_path_buf(),
                images,
                rank: self.topology.rank,
                world: self.topology.world_size,
                batch: d.batch_size,
            });
        }
        let accumulate = self.accumulate();
        let steps = batches / accumulate;
        if steps == 0 {
            return Err(PlanError::TooFewToAccumulate {
                dir: dir.to_path_buf(),
                images,
                rank: self.topology.rank,
                world: self.topology.world_size,
                batch: d.batch_size,
                batches,
                accumulate,
            });
        }
        if batches % accumulate != 0 {
            tracing::info!(
                "each epoch's last {} batch(es) of {batches} on each rank fill no whole step of train.accumulate = {accumulate}: they are left out",
                batches % accumulate
            );
        }
        Ok(match self.config.train.max_steps_per_epoch {
            0 => steps,
            cap => steps.min(cap),
        })
    }
}

/// Whether training copies its data first: with `data.stage_dir`, `data.root` goes to its
/// node-local copy (`cluster::job::stage_data` makes it, refusing a root that is not a shard
/// set).
fn staging(config: &Config) -> Option<Staging> {
    let stage_dir = config.data.stage_dir.as_ref()?;
    let from = config.data.root.clone();
    Some(Staging { to: shards::staged_root(&from, stage_dir), from })
}

/// How gradients are averaged between ranks, from the `[dist]` settings.
pub fn sync_options(dist: &DistConfig) -> SyncOptions {
    SyncOptions {
        bucket_mb: dist.bucket_mb,
        overlap: dist.overlap,
        poll: Duration::from_micros(dist.poll_us),
        wire: Wire::of(dist.compress),
    }
}

/// libtorch intra-op threads for `train.threads = configured`: that number, else this rank's
/// share of the node: the cores the launcher bound it to, or, when it was not bound, the
/// node's cores split evenly among its `local_ranks` (ranks on one node must not
/// oversubscribe the cores).
pub fn threads_per_rank(configured: usize, local_ranks: usize) -> usize {
    match configured {
        0 => core_share(local_ranks),
        n => n,
    }
}

/// Sets libtorch's intra-op threads to [`threads_per_rank`]; returns what libtorch reports.
pub fn set_threads(configured: usize, local_ranks: usize) -> i32 {
    let threads = threads_per_rank(configured, local_ranks);
    tch::set_num_threads(i32::try_from(threads).unwrap_or(1));
    tch::get_num_threads()
}

/// How the model computes on `device` (precision as `train.precision = "auto"` resolves it
/// there, memory format), and why that precision.
pub fn compute_on(config: &Config, device: Device) -> (Compute, String) {
    let (precision, reason) = precision::resolve(config.train.precision, device);
    (Compute { precision, channels_last: config.train.channels_last, device }, reason)
}

/// The device this rank computes on, as training chooses it (`train.device`, the rank's GPU).
pub fn choose_device(config: &Config, topology: &Topology) -> Result<Device, DeviceError> {
    device::choose(config.train.device, topology, &device::ThisProcess)
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

/// Batches of `batch` in a rank's `shard_len` samples: full ones, and with `drop_last = false`
/// the partial last one too, unless it would hold a single image: BatchNorm's statistics of one
/// image are NaN where the feature map is 1x1 (PyTorch refuses such a batch), so it is dropped.
fn batches_per_epoch(shard_len: usize, batch: usize, drop_last: bool) -> usize {
    match (drop_last, shard_len % batch) {
        (false, remainder) if remainder > 1 => shard_len.div_ceil(batch),
        _ => shard_len / batch,
    }
}

/// The evaluation transform `config` describes: `data.image_size`, `data.eval_transform` and
/// the rest, as evaluation, prediction and a model's recorded preprocessing apply them.
pub fn eval_transform_of(config: &Config) -> Transform {
    let d = &config.data;
    let geometry = match d.eval_transform {
        EvalGeometry::ResizeCenterCrop => Geometry::ResizeCenterCrop { resize: config.eval_resize() },
        EvalGeometry::Resize => Geometry::Resize { hflip: false },
    };
    Transform {
        size: d.image_size,
        policy: None,
        geometry,
        normalize: d.normalize,
        jpeg_draft: d.jpeg_draft,
        exif_orientation: d.exif_orientation,
        max_image_pixels: d.max_image_pixels,
    }
}

#[cfg(test)]
mod tests {
    use super::{batches_per_epoch, loader_workers, Workers};

    #[test]
    fn a_last_batch_of_one_image_is_dropped() {
        assert_eq!(batches_per_epoch(25, 4, false), 6, "25 = 6 x 4 + 1: the 1 is dropped");
        assert_eq!(batches_per_epoch(26, 4, false), 7, "a last batch of 2 is kept");
        assert_eq!(batches_per_epoch(26, 4, true), 6);
        assert_eq!(batches_per_epoch(1, 4, false), 0, "a 1-image tree has no batch (refused at start)");
        // 7 images on 2 ranks with dist.uneven = "drop": 3 each, in batches of 2.
        assert_eq!(batches_per_epoch(3, 2, false), 1);
        assert_eq!(batches_per_epoch(5, 1, false), 5, "batches of 1 (frozen BatchNorm) are all kept");
    }
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
