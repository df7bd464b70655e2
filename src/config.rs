//! The run configuration: its typed shape, its defaults, and how the layers are merged.
//!
//! Layers, lowest first: built-in defaults < `--config FILE` (TOML) < `RTRAIN_SECTION__KEY`
//! environment variables < `--set section.key=value`. figment does the merging and remembers
//! where each value came from, so an unknown key or a wrong type names the key and its source,
//! and `rtrain config show` can say the origin of every value. Raw input is checked here, once:
//! the rest of the program receives a validated [`Config`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::data::autoaugment::{AutoAugmentPolicy, Policy};
use crate::data::sampler::UnevenTail;
use crate::model::precision::PrecisionSetting;
use crate::model::Arch;

/// Where the built-in synthetic damage-level data is generated on first use.
pub const DEFAULT_DATA_ROOT: &str = "data/synth-damage";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {}", describe_figment(.0))]
    Figment(Box<figment::Error>),
    #[error("--set {0:?}: expected section.key=value")]
    BadOverride(String),
    #[error("configuration key {key}: {problem}")]
    Invalid { key: &'static str, problem: String },
    #[error("configuration file {path}: not found")]
    MissingFile { path: PathBuf },
    #[error("configuration: cannot be written as TOML: {problem}")]
    Serialize { problem: String },
    #[error("rank {rank} on {host} was started with another configuration than rank 0: {differences}; every rank must run the same rtrain with the same settings (check the launch line and the RTRAIN_* variables on each node)")]
    RanksDiffer { rank: usize, host: String, differences: String },
}

/// figment's message without its profile in key names (rtrain has one profile, so
/// `default.train.epochz` would only confuse): the kind, the key, and where the value came from.
fn describe_figment(error: &figment::Error) -> String {
    let mut lines = Vec::new();
    for error in error.clone() {
        let mut line = error.kind.to_string();
        if !error.path.is_empty() {
            let _ = write!(line, " for key \"{}\"", error.path.join("."));
        }
        if let Some(metadata) = &error.metadata {
            match &metadata.source {
                Some(source) => write!(line, " in {source} {}", metadata.name),
                None => write!(line, " in {}", metadata.name),
            }
            .unwrap_or_default();
        }
        lines.push(line);
    }
    lines.join("\n")
}

impl From<figment::Error> for ConfigError {
    fn from(error: figment::Error) -> Self {
        ConfigError::Figment(Box::new(error))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub run: RunConfig,
    pub data: DataConfig,
    pub model: ModelConfig,
    pub optim: OptimConfig,
    pub schedule: ScheduleConfig,
    pub train: TrainConfig,
    pub checkpoint: CheckpointConfig,
    pub dist: DistConfig,
    pub log: LogConfig,
}

/// `[log]`: what global rank 0 writes while training, beside `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// TensorBoard event files in `RUN_DIR/tensorboard/`, written as `metrics.jsonl` is.
    pub tensorboard: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { tensorboard: true }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Run directory name under `dir`; empty means `<arch>-<UTC timestamp>`.
    pub name: String,
    pub dir: PathBuf,
    /// The one seed every random choice derives from (init, sampling, augmentation).
    pub seed: u64,
    /// Reproducible results: the same config, data, binary, world size and thread count give
    /// bit-identical weights on CPU (always so); on GPU also cuDNN's deterministic kernels
    /// without autotuning, at some speed.
    pub deterministic: bool,
}

/// `data.augment_policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AugmentPolicy {
    None,
    AutoaugmentImagenet,
    AutoaugmentCifar10,
    AutoaugmentSvhn,
    Randaugment,
    Trivialaugmentwide,
}

impl AugmentPolicy {
    /// The policy the loader applies, with torchvision's default parameters.
    pub fn policy(self) -> Option<Policy> {
        match self {
            AugmentPolicy::None => None,
            AugmentPolicy::AutoaugmentImagenet => Some(Policy::AutoAugment(AutoAugmentPolicy::ImageNet)),
            AugmentPolicy::AutoaugmentCifar10 => Some(Policy::AutoAugment(AutoAugmentPolicy::Cifar10)),
            AugmentPolicy::AutoaugmentSvhn => Some(Policy::AutoAugment(AutoAugmentPolicy::Svhn)),
            AugmentPolicy::Randaugment => Some(Policy::RAND_AUGMENT),
            AugmentPolicy::Trivialaugmentwide => Some(Policy::TRIVIAL_AUGMENT_WIDE),
        }
    }
}

/// `data.train_transform`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainGeometry {
    RandomResizedCrop,
    Resize,
}

/// `data.eval_transform`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalGeometry {
    ResizeCenterCrop,
    Resize,
}

/// `data.sampler`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplerKind {
    Shuffle,
    Balanced,
}

/// `data.on_bad_sample`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BadSample {
    Fail,
    Skip,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// Class-per-folder image tree with `train_split` and `val_split` subdirectories, or a
    /// shard directory from `rtrain data prepare` (it has a shards.json).
    pub root: PathBuf,
    /// Node-local directory (e.g. /tmp/rtrain) to copy shards to before training: local rank 0
    /// of each node copies what is missing and verifies it, the other ranks wait. Unset: read
    /// `root` in place.
    pub stage_dir: Option<PathBuf>,
    /// An image that cannot be decoded fails the run naming it, or is skipped and counted.
    pub on_bad_sample: BadSample,
    pub train_split: String,
    pub val_split: String,
    /// The classes' order, lowest first (e.g. ["C0", "C2", "C4"] for damage levels): the
    /// label index and the rank the ordinal metrics (quadratic kappa, rank error) count.
    /// Empty: the sorted class names, as torchvision's ImageFolder orders them.
    pub class_order: Vec<String>,
    /// Side of the square image the network sees.
    pub image_size: u32,
    /// torchvision's automatic augmentation on each decoded training image, before the
    /// geometry (the tutorial's `AutoAugment()`): none, AutoAugment with the ImageNet, CIFAR-10
    /// or SVHN policy, RandAugment (2 ops, magnitude 9 of 31) or TrivialAugmentWide.
    pub augment_policy: AugmentPolicy,
    /// How a training image becomes image_size x image_size: torchvision's
    /// `RandomResizedCrop` (scale, ratio), or `Resize((image_size, image_size))` of the whole
    /// image, aspect not kept (the DesignSafe tutorial's). Both flip when `hflip`.
    pub train_transform: TrainGeometry,
    /// How an evaluation image does: `Resize(eval_resize)` + `CenterCrop(image_size)`, or
    /// `Resize((image_size, image_size))`.
    pub eval_transform: EvalGeometry,
    /// `Normalize` with ImageNet's mean and std after `ToTensor`; false keeps values in [0, 1]
    /// (the tutorial has no Normalize).
    pub normalize: bool,
    /// Short side before the evaluation centre crop; 0 means image_size * 256 / 224.
    pub eval_resize: u32,
    pub batch_size: usize,
    /// 0 means batch_size.
    pub eval_batch_size: usize,
    /// Decode/augment threads; 0 decodes on the training thread; "auto" picks by device
    /// (`train::loader_workers`).
    pub workers: Workers,
    /// Batches prepared ahead per worker.
    pub prefetch: usize,
    /// RandomResizedCrop area range, as torchvision's `scale`.
    pub scale: [f64; 2],
    /// RandomResizedCrop aspect-ratio range, as torchvision's `ratio`.
    pub ratio: [f64; 2],
    pub hflip: bool,
    /// Drop the last partial training batch (keeps BatchNorm statistics sane).
    pub drop_last: bool,
    /// Which training samples an epoch visits: `shuffle` (each once, in a seeded order) or
    /// `balanced` (drawn with replacement, each class equally often: PyTorch's
    /// `WeightedRandomSampler` with weights `1 / count_c`).
    pub sampler: SamplerKind,
    /// Samples drawn per epoch by the `balanced` sampler (over all ranks); 0: as many as the
    /// training split holds.
    pub samples_per_epoch: usize,
    /// Decode JPEGs at 1/2, 1/4 or 1/8 scale in the DCT domain (Pillow's `draft`) when the
    /// network's input still gets at least as many pixels: several times faster on camera
    /// photos; the pixels differ slightly from torchvision's full decode (false keeps them equal).
    pub jpeg_draft: bool,
    /// Turn photos upright as their Exif orientation tag says (every photo viewer does);
    /// torchvision's ImageFolder ignores the tag (false keeps its parity).
    pub exif_orientation: bool,
    /// An image whose header declares more pixels is refused unread, as a bad sample
    /// (`on_bad_sample`): Pillow's decompression-bomb limit by default.
    pub max_image_pixels: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    pub arch: Arch,
    /// 0 means the number of class folders in the training split.
    pub num_classes: usize,
    /// A torchvision-format state dict to start from: `.safetensors`, or a `torch.save` `.pth`.
    pub pretrained: Option<PathBuf>,
    /// torchvision's published weights by name (`IMAGENET1K_V1`, `IMAGENET1K_V2`, `DEFAULT`), or
    /// a file name in torch.hub's form (`NAME-SHA256PREFIX.pth`) on `weights_url`; taken from
    /// PyTorch's cache (`$TORCH_HOME/hub/checkpoints`) or downloaded into it.
    pub weights: Option<String>,
    /// Where published weights are downloaded from: torchvision's server, or a mirror.
    pub weights_url: String,
    /// Hidden widths of an MLP head: Linear-ReLU layers before the classifier, named as
    /// `nn.Sequential` names them (`fc.0`, `fc.2`, ...). Empty: torchvision's single `fc`.
    pub head_hidden: Vec<usize>,
    /// torchvision's `zero_init_residual`: each residual block's last BatchNorm scale starts at
    /// zero, so the fresh network trains as a shallow one first (no effect on starting weights).
    pub zero_init_residual: bool,
    /// Train only the classifier head (`fc`).
    pub freeze_backbone: bool,
    /// BatchNorm as torchvision's FrozenBatchNorm2d: running statistics fixed, scale and shift
    /// not trained (fine-tuning with small per-rank batches).
    pub freeze_batchnorm: bool,
    /// SyncBatchNorm: in training, BatchNorm's batch statistics cover every rank's batch (the
    /// tutorial's `convert_sync_batchnorm`), on CPU and GPU alike. One collective per layer in
    /// forward and backward; no effect on a single process or with frozen BatchNorm.
    pub sync_batchnorm: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimKind {
    Sgd,
    /// torch.optim.Adam: weight decay as L2 (added to the gradient), as the tutorial uses it.
    Adam,
    /// torch.optim.AdamW: decoupled weight decay.
    Adamw,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimConfig {
    pub name: OptimKind,
    pub lr: f64,
    pub weight_decay: f64,
    /// SGD only.
    pub momentum: f64,
    /// SGD only.
    pub nesterov: bool,
    /// Adam and AdamW.
    pub betas: [f64; 2],
    /// Adam and AdamW.
    pub eps: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    Constant,
    Cosine,
    Step,
    /// torch's ReduceLROnPlateau, stepped once per epoch on the validation metric.
    Plateau,
}

/// ReduceLROnPlateau's `mode`: which validation metric it watches and which way is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlateauMode {
    /// The validation loss, lower is better.
    Min,
    /// The validation top-1, higher is better.
    Max,
}

/// ReduceLROnPlateau's `threshold_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThresholdMode {
    Rel,
    Abs,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScheduleConfig {
    pub kind: ScheduleKind,
    /// Linear warm-up length in epochs (fractions allowed); applied per step.
    pub warmup_epochs: f64,
    /// Warm-up starts at lr * warmup_start_factor, as torch's LinearLR `start_factor`.
    pub warmup_start_factor: f64,
    /// Cosine only: the final learning rate, as CosineAnnealingLR's `eta_min`.
    pub min_lr: f64,
    /// Step only: decay every this many epochs by `gamma`, as StepLR.
    pub step_epochs: u32,
    pub gamma: f64,
    /// Plateau only: torch.optim.lr_scheduler.ReduceLROnPlateau's parameters, by its names
    /// (`min_lr` above is its floor).
    pub mode: PlateauMode,
    pub factor: f64,
    pub patience: u32,
    pub threshold: f64,
    pub threshold_mode: ThresholdMode,
    pub cooldown: u32,
}

/// `data.workers`: a number of loader threads, or `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "WorkersValue", into = "WorkersValue")]
pub enum Workers {
    Auto,
    Count(usize),
}

/// How `data.workers` is written: an integer or a string.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum WorkersValue {
    Count(usize),
    Name(String),
}

impl TryFrom<WorkersValue> for Workers {
    type Error = String;

    fn try_from(value: WorkersValue) -> Result<Workers, String> {
        match value {
            WorkersValue::Count(n) => Ok(Workers::Count(n)),
            WorkersValue::Name(name) if name == "auto" => Ok(Workers::Auto),
            WorkersValue::Name(name) => {
                Err(format!("expected \"auto\" or a number of threads, found {name:?}"))
            }
        }
    }
}

impl From<Workers> for WorkersValue {
    fn from(workers: Workers) -> WorkersValue {
        match workers {
            Workers::Auto => WorkersValue::Name("auto".to_string()),
            Workers::Count(n) => WorkersValue::Count(n),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    pub epochs: u32,
    pub label_smoothing: f64,
    /// libtorch intra-op threads; 0 means all available cores.
    pub threads: usize,
    /// Log a progress line every this many steps when not on a terminal.
    pub log_every_steps: u64,
    /// Cap on steps per epoch, 0 for none (quick checks and benchmarks).
    pub max_steps_per_epoch: u64,
    /// fp32, bf16 (autocast, fp32 master weights) or auto (bf16 where native).
    pub precision: PrecisionSetting,
    /// Channels-last (NHWC) activations and convolution weights.
    pub channels_last: bool,
    /// auto (this rank's GPU when it sees one, else the CPU), cpu or cuda.
    pub device: DeviceSetting,
    /// Micro-batches of `data.batch_size` per optimizer step: their gradients add up locally
    /// and are averaged over the ranks once, on the last (as DDP's `no_sync`), so a step sees
    /// `batch_size x ranks x accumulate` images.
    pub accumulate: u32,
    /// The cross-entropy's per-class weights (PyTorch's `weight=`): `"none"`, `"balanced"`
    /// (scikit-learn's `n_samples / (n_classes * count_c)` over the training split), or one
    /// weight per class in class order.
    pub class_weights: ClassWeights,
    /// After training, calibrate the best checkpoint (else the final weights) on the
    /// validation split with temperature scaling: `calibrated.safetensors` in the run
    /// directory, as `rtrain calibrate` writes it.
    pub calibrate: bool,
    /// Stop when a validation metric has not improved for `patience` epochs.
    pub early_stopping: EarlyStoppingConfig,
}

/// `train.class_weights`: a rule or one weight per class.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ClassWeights {
    Rule(ClassWeightRule),
    PerClass(Vec<f64>),
}

/// What `train.class_weights` takes, for its error messages.
const CLASS_WEIGHTS_EXPECTED: &str = "\"none\", \"balanced\", or a list of one positive weight per class";

/// Read by hand rather than as serde's untagged enum, whose error for any value that fits no
/// variant ("data did not match any variant") lists none of the values that do.
impl<'de> Deserialize<'de> for ClassWeights {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<ClassWeights, D::Error> {
        struct Expected;
        impl<'de> serde::de::Visitor<'de> for Expected {
            type Value = ClassWeights;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str(CLASS_WEIGHTS_EXPECTED)
            }

            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<ClassWeights, E> {
                match name {
                    "none" => Ok(ClassWeights::Rule(ClassWeightRule::None)),
                    "balanced" => Ok(ClassWeights::Rule(ClassWeightRule::Balanced)),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(name), &self)),
                }
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut list: A) -> Result<ClassWeights, A::Error> {
                let mut weights = Vec::new();
                while let Some(Weight(weight)) = list.next_element()? {
                    weights.push(weight);
                }
                Ok(ClassWeights::PerClass(weights))
            }
        }
        deserializer.deserialize_any(Expected)
    }
}

/// One weight of a `train.class_weights` list: any number, and for anything else the message
/// that lists what the setting takes.
struct Weight(f64);

impl<'de> Deserialize<'de> for Weight {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Weight, D::Error> {
        struct Expected;
        impl serde::de::Visitor<'_> for Expected {
            type Value = Weight;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str(CLASS_WEIGHTS_EXPECTED)
            }

            fn visit_f64<E: serde::de::Error>(self, weight: f64) -> Result<Weight, E> {
                Ok(Weight(weight))
            }

            fn visit_i64<E: serde::de::Error>(self, weight: i64) -> Result<Weight, E> {
                Ok(Weight(weight as f64))
            }

            fn visit_u64<E: serde::de::Error>(self, weight: u64) -> Result<Weight, E> {
                Ok(Weight(weight as f64))
            }
        }
        deserializer.deserialize_any(Expected)
    }
}

/// The named `train.class_weights`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClassWeightRule {
    /// Every class weighs 1 (the plain cross-entropy).
    None,
    /// `n_samples / (n_classes * count_c)`: each class weighs as much in all as any other.
    Balanced,
}

/// `train.early_stopping`: Lightning's `EarlyStopping(monitor, mode, patience, min_delta)`,
/// checked after each epoch's evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EarlyStoppingConfig {
    /// The validation metric watched; `none` never stops early.
    pub metric: StopMetric,
    /// `min` (lower is better), `max`, or `auto`: `min` for `val_loss`, else `max`.
    pub mode: StopMode,
    /// Epochs without an improvement after which training stops.
    pub patience: u32,
    /// How much better than the best so far a value must be to count as an improvement.
    pub min_delta: f64,
}

/// The validation metrics early stopping can watch (as `metrics.jsonl` names them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopMetric {
    None,
    ValLoss,
    ValTop1,
    ValMacroF1,
    ValBalancedAccuracy,
    ValQuadraticKappa,
}

/// `train.early_stopping.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopMode {
    Auto,
    Min,
    Max,
}

impl Default for EarlyStoppingConfig {
    fn default() -> Self {
        EarlyStoppingConfig { metric: StopMetric::None, mode: StopMode::Auto, patience: 3, min_delta: 0.0 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Save at the end of every this many epochs (0: only the final one).
    pub every_epochs: u32,
    /// Also save every this many steps inside an epoch (0: never).
    pub every_steps: u64,
    /// How many of the newest step checkpoints to keep.
    pub keep_last: usize,
    /// Keep `best.safetensors`, the checkpoint with the highest validation top-1.
    pub keep_best: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DistConfig {
    /// Gradient bucket size in MiB for the all-reduce (PyTorch DDP's `bucket_cap_mb`, whose
    /// default is 25). 5 MiB starts communication earlier in backward: ResNet-18 on 2
    /// simulated nodes with a 1 Gbit/s link trained 25% faster than with 25 MiB (BENCHMARKS.md),
    /// and 5 MiB buckets still fill 93% of that link.
    pub bucket_mb: f64,
    /// When the training split does not divide among the ranks: `pad` repeats samples (as
    /// PyTorch's DistributedSampler), `drop` leaves the remainder out.
    pub uneven: UnevenTail,
    /// Start each bucket's all-reduce during backward, as soon as its gradients are final
    /// (false: all buckets after backward; for measuring what the overlap gains).
    pub overlap: bool,
    /// The all-reduce algorithm asked of the MPI library (`auto`: recursive doubling for two
    /// ranks, ring for more, with Open MPI; `mpi`: the library's own choice).
    pub allreduce: AllreduceAlgorithm,
    /// Microseconds between the communication thread's tests of a pending all-reduce; 0 makes
    /// blocking calls (which spin a core; for fast interconnects with cores to spare).
    pub poll_us: u64,
    /// Gradients on the wire: `none` (fp32), or `bf16`/`fp16`, which halve the bytes as PyTorch
    /// DDP's `bf16_compress_hook`/`fp16_compress_hook` and Horovod's `Compression.fp16` do.
    /// Weights, optimizer state and the gradients the optimizer reads stay fp32. Worth it when
    /// the link, not the computation, bounds a step (nodes behind 1-25 Gbit/s Ethernet);
    /// results are then no longer bit-identical across world sizes.
    pub compress: GradCompression,
    /// Once training runs, a rank that waits longer than this in a collective ends the job,
    /// naming the ranks that did not arrive (a stopped or hung rank would otherwise hang it).
    /// Set-up (data hashing, staging) may take up to 30 minutes.
    pub timeout_s: f64,
}

impl Default for DistConfig {
    fn default() -> Self {
        DistConfig {
            bucket_mb: 5.0,
            uneven: UnevenTail::Pad,
            overlap: true,
            allreduce: AllreduceAlgorithm::Auto,
            poll_us: 200,
            compress: GradCompression::None,
            timeout_s: 300.0,
        }
    }
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig { name: String::new(), dir: PathBuf::from("runs"), seed: 0, deterministic: true }
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            root: PathBuf::from(DEFAULT_DATA_ROOT),
            stage_dir: None,
            on_bad_sample: BadSample::Fail,
            train_split: "train".into(),
            val_split: "val".into(),
            class_order: Vec::new(),
            image_size: 64,
            augment_policy: AugmentPolicy::None,
            train_transform: TrainGeometry::RandomResizedCrop,
            eval_transform: EvalGeometry::ResizeCenterCrop,
            normalize: true,
            eval_resize: 0,
            batch_size: 64,
            eval_batch_size: 0,
            workers: Workers::Auto,
            prefetch: 2,
            scale: [0.35, 1.0],
            ratio: [3.0 / 4.0, 4.0 / 3.0],
            hflip: true,
            drop_last: true,
            sampler: SamplerKind::Shuffle,
            samples_per_epoch: 0,
            jpeg_draft: true,
            exif_orientation: true,
            max_image_pixels: crate::data::decode::DEFAULT_MAX_IMAGE_PIXELS,
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            arch: Arch::Resnet18,
            num_classes: 0,
            pretrained: None,
            weights: None,
            weights_url: crate::model::weights::TORCHVISION_BASE_URL.to_string(),
            head_hidden: Vec::new(),
            zero_init_residual: true,
            freeze_backbone: false,
            freeze_batchnorm: false,
            sync_batchnorm: false,
        }
    }
}

impl Default for OptimConfig {
    fn default() -> Self {
        // The default recipe trains the built-in set from scratch: AdamW with BatchNorm's
        // residual scales at zero (`model.zero_init_residual`) keeps the validation loss
        // smooth from the first epoch, where SGD at 0.05 threw BatchNorm's running statistics
        // (validation loss in the hundreds); CHANGELOG.md gives both recipes' curves.
        OptimConfig {
            name: OptimKind::Adamw,
            lr: 0.002,
            weight_decay: 5e-4,
            momentum: 0.9,
            nesterov: false,
            betas: [0.9, 0.999],
            eps: 1e-8,
        }
    }
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            kind: ScheduleKind::Cosine,
            warmup_epochs: 1.0,
            warmup_start_factor: 0.1,
            min_lr: 0.0,
            step_epochs: 30,
            gamma: 0.1,
            mode: PlateauMode::Min,
            factor: 0.1,
            patience: 10,
            threshold: 1e-4,
            threshold_mode: ThresholdMode::Rel,
            cooldown: 0,
        }
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 8,
            label_smoothing: 0.0,
            threads: 0,
            log_every_steps: 10,
            max_steps_per_epoch: 0,
            precision: PrecisionSetting::Auto,
            channels_last: true,
            device: DeviceSetting::Auto,
            accumulate: 1,
            class_weights: ClassWeights::Rule(ClassWeightRule::None),
            calibrate: false,
            early_stopping: EarlyStoppingConfig::default(),
        }
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig { every_epochs: 1, every_steps: 0, keep_last: 3, keep_best: true }
    }
}

/// `--set section.key=value` pairs as a figment provider named "--set", so that errors and
/// `config show` attribute the values to the command line.
struct CommandLineOverrides(Dict);

impl CommandLineOverrides {
    fn parse(pairs: &[String]) -> Result<Self, ConfigError> {
        let mut root = Dict::new();
        for pair in pairs {
            let (key, raw) = pair.split_once('=').ok_or_else(|| ConfigError::BadOverride(pair.clone()))?;
            let key = key.trim();
            if key.is_empty() || key.split('.').any(str::is_empty) {
                return Err(ConfigError::BadOverride(pair.clone()));
            }
            insert_dotted(&mut root, key, parse_override_value(raw.trim()));
        }
        Ok(CommandLineOverrides(root))
    }
}

/// A TOML value when it parses as one (`3`, `true`, `[0.5, 1.0]`, `"x"`), else a bare string,
/// so `--set model.arch=resnet50` works without shell-quoted TOML strings.
fn parse_override_value(raw: &str) -> Value {
    let parsed: Result<toml::Table, _> = toml::from_str(&format!("v = {raw}"));
    match parsed.ok().and_then(|mut table| table.remove("v")) {
        Some(value) => Value::serialize(value).unwrap_or_else(|_| Value::from(raw.to_string())),
        None => Value::from(raw.to_string()),
    }
}

fn insert_dotted(dict: &mut Dict, dotted: &str, value: Value) {
    match dotted.split_once('.') {
        None => {
            dict.insert(dotted.to_string(), value);
        }
        Some((head, rest)) => {
            let entry = dict.entry(head.to_string()).or_insert_with(|| Value::from(Dict::new()));
            if let Value::Dict(_, inner) = entry {
                insert_dotted(inner, rest, value);
            } else {
                let mut inner = Dict::new();
                insert_dotted(&mut inner, rest, value);
                *entry = Value::from(inner);
            }
        }
    }
}

impl Provider for CommandLineOverrides {
    fn metadata(&self) -> Metadata {
        Metadata::named("--set")
    }
    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.0.clone()))
    }
}

/// The merged configuration together with the figment that remembers each value's origin.
pub struct LoadedConfig {
    pub config: Config,
    figment: Figment,
}

impl LoadedConfig {
    /// Merges the layers and validates the result.
    pub fn load(file: Option<&Path>, overrides: &[String]) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::MissingFile { path: path.to_path_buf() });
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment
            // Only RTRAIN_SECTION__KEY: other RTRAIN_* variables (an image label, build
            // metadata) are not configuration.
            .merge(Env::prefixed("RTRAIN_").filter(|key| key.as_str().contains("__")).split("__"))
            .merge(CommandLineOverrides::parse(overrides)?);
        for warning in
            misnamed_setting_variables(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))
        {
            tracing::warn!("{warning}");
        }
        let config: Config = figment.extract()?;
        config.validate()?;
        Ok(LoadedConfig { config, figment })
    }

    /// The dotted keys the user set (in a file, the environment or `--set`), not left at
    /// their defaults: a model's recorded preprocessing gives way to these.
    pub fn explicit_keys(&self) -> Result<BTreeSet<String>, ConfigError> {
        Ok(dotted_leaves(&self.config.to_toml()?)
            .into_keys()
            .filter(|key| self.figment.find_metadata(key).is_some_and(|m| describe_origin(m) != "default"))
            .collect())
    }

    /// The resolved configuration as TOML, each value annotated with where it came from.
    pub fn show(&self) -> Result<String, ConfigError> {
        // Grouped by table (`train`, `train.early_stopping`), so that each is written once.
        let mut tables: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (key, rendered) in dotted_leaves(&self.config.to_toml()?) {
            let (table, leaf) = key.rsplit_once('.').unwrap_or(("", key.as_str()));
            let origin =
                self.figment.find_metadata(&key).map(describe_origin).unwrap_or_else(|| "default".into());
            tables.entry(table.to_string()).or_default().push(format!("{leaf} = {rendered}  # {origin}"));
        }
        let mut out = String::new();
        for (table, lines) in tables {
            let _ = writeln!(out, "\n[{table}]\n{}", lines.join("\n"));
        }
        Ok(out.trim_start().to_string())
    }
}

fn describe_origin(metadata: &Metadata) -> String {
    match &metadata.source {
        Some(figment::Source::File(path)) => format!("file {}", path.display()),
        _ if metadata.name == std::any::type_name::<Config>() => "default".into(),
        _ if metadata.name.contains("environment") => "environment (RTRAIN_*)".into(),
        _ => metadata.name.to_string(),
    }
}

/// `run.name` stays inside `run.dir`: empty (a generated name) or one normal path component.
fn is_one_directory_name(name: &str) -> bool {
    name.is_empty() || (!name.contains(['/', '\\']) && name != "." && name != "..")
}

/// A number as a person would write it in a config: `64`, `0.002`, `1e300` (not 301 digits).
fn readable(value: f64) -> String {
    if value != 0.0 && (value.abs() >= 1e9 || value.abs() < 1e-4) {
        format!("{value:e}")
    } else {
        format!("{value}")
    }
}

/// Environment variables that look like settings but name none: `RTRAIN_OPTIM_LR` (one
/// underscore after the section), which the environment layer would otherwise ignore
/// silently. One message per variable, with the spelling that works. Other `RTRAIN_*`
/// variables (image labels, build metadata, the entrypoint's) do not start with a section.
fn misnamed_setting_variables(variables: impl Iterator<Item = String>) -> Vec<String> {
    // The sections as the configuration serialises them (`run`, `data`, ...), not a copy.
    let sections: Vec<String> = Config::default()
        .to_toml()
        .ok()
        .and_then(|text| text.parse::<toml::Table>().ok())
        .map(|table| table.keys().cloned().collect())
        .unwrap_or_default();
    variables
        .filter_map(|name| {
            let rest = name.strip_prefix("RTRAIN_")?;
            if rest.contains("__") {
                return None;
            }
            let (section, key) = rest.split_once('_')?;
            let section = section.to_ascii_lowercase();
            sections.contains(&section).then(|| {
                format!(
                    "environment variable {name} names no setting and is ignored; \
                     did you mean RTRAIN_{}__{key}?",
                    section.to_ascii_uppercase()
                )
            })
        })
        .collect()
}

/// Every leaf of a TOML document under its dotted key (`train.epochs`), rendered as TOML; empty
/// if the text is not TOML.
fn dotted_leaves(text: &str) -> BTreeMap<String, String> {
    fn walk(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
        match value.as_table() {
            Some(table) => {
                for (key, value) in table {
                    let key = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                    walk(&key, value, out);
                }
            }
            None => {
                out.insert(prefix.to_string(), value.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(table) = text.parse::<toml::Table>() {
        walk("", &toml::Value::Table(table), &mut out);
    }
    out
}

impl Config {
    /// Checks the values that types alone cannot, naming the key at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn check(ok: bool, key: &'static str, problem: &str) -> Result<(), ConfigError> {
            if ok {
                Ok(())
            } else {
                Err(ConfigError::Invalid { key, problem: problem.to_string() })
            }
        }
        let d = &self.data;
        check(d.image_size >= 16, "data.image_size", "must be at least 16 pixels")?;
        check(
            self.model.head_hidden.iter().all(|&width| width > 0),
            "model.head_hidden",
            "widths must be positive",
        )?;
        check(
            self.model.pretrained.is_none() || self.model.weights.is_none(),
            "model.weights",
            "cannot be combined with model.pretrained: choose published weights by name or a file",
        )?;
        if let Some(name) = &self.model.weights {
            crate::model::weights::HubFile::resolve(self.model.arch, name)
                .map_err(|e| ConfigError::Invalid { key: "model.weights", problem: e.to_string() })?;
        }
        check(d.batch_size > 0, "data.batch_size", "must be positive")?;
        check(
            d.batch_size > 1 || self.model.freeze_batchnorm,
            "data.batch_size",
            "must be at least 2 while BatchNorm trains (the statistics of one image are NaN where the feature map is 1x1, and PyTorch refuses them); set model.freeze_batchnorm = true to train with batches of 1",
        )?;
        check(
            d.scale[0] > 0.0 && d.scale[0] <= d.scale[1] && d.scale[1] <= 1.0,
            "data.scale",
            "must satisfy 0 < min <= max <= 1",
        )?;
        check(d.ratio[0] > 0.0 && d.ratio[0] <= d.ratio[1], "data.ratio", "must satisfy 0 < min <= max")?;
        check(!d.train_split.is_empty(), "data.train_split", "must not be empty")?;
        check(!d.val_split.is_empty(), "data.val_split", "must not be empty")?;
        let mut order = d.class_order.clone();
        order.sort();
        order.dedup();
        check(
            order.len() == d.class_order.len() && order.iter().all(|c| !c.is_empty()),
            "data.class_order",
            "must name each class once, none empty",
        )?;
        check(
            self.dist.bucket_mb > 0.0 && self.dist.bucket_mb.is_finite(),
            "dist.bucket_mb",
            "must be a positive number of MiB",
        )?;
        check(
            self.dist.timeout_s > 0.0 && self.dist.timeout_s.is_finite(),
            "dist.timeout_s",
            "must be a positive number of seconds",
        )?;
        let o = &self.optim;
        check(o.lr > 0.0 && o.lr.is_finite(), "optim.lr", "must be a positive number")?;
        check(o.weight_decay >= 0.0, "optim.weight_decay", "must not be negative")?;
        check((0.0..1.0).contains(&o.momentum), "optim.momentum", "must be in [0, 1)")?;
        check(!o.nesterov || o.momentum > 0.0, "optim.nesterov", "needs optim.momentum > 0")?;
        check(o.betas.iter().all(|b| (0.0..1.0).contains(b)), "optim.betas", "both must be in [0, 1)")?;
        check(o.eps > 0.0, "optim.eps", "must be positive")?;
        let s = &self.schedule;
        check(s.warmup_epochs >= 0.0, "schedule.warmup_epochs", "must not be negative")?;
        check(
            s.warmup_start_factor > 0.0 && s.warmup_start_factor <= 1.0,
            "schedule.warmup_start_factor",
            "must be in (0, 1]",
        )?;
        check(s.min_lr >= 0.0 && s.min_lr <= o.lr, "schedule.min_lr", "must be in [0, optim.lr]")?;
        check(s.step_epochs > 0, "schedule.step_epochs", "must be positive")?;
        check(s.gamma > 0.0 && s.gamma <= 1.0, "schedule.gamma", "must be in (0, 1]")?;
        check(s.factor > 0.0 && s.factor < 1.0, "schedule.factor", "must be in (0, 1), as torch requires")?;
        check(s.threshold >= 0.0, "schedule.threshold", "must not be negative")?;
        let t = &self.train;
        check(t.epochs > 0, "train.epochs", "must be positive")?;
        check((0.0..1.0).contains(&t.label_smoothing), "train.label_smoothing", "must be in [0, 1)")?;
        check(t.log_every_steps > 0, "train.log_every_steps", "must be positive")?;
        check(t.accumulate > 0, "train.accumulate", "must be at least 1")?;
        if let ClassWeights::PerClass(weights) = &t.class_weights {
            check(
                !weights.is_empty() && weights.iter().all(|w| w.is_finite() && *w > 0.0),
                "train.class_weights",
                "must be \"none\", \"balanced\" or one positive weight per class (a batch of only zero-weight classes has no mean loss: leave such a class out of the data instead)",
            )?;
        }
        check(
            d.samples_per_epoch == 0 || d.sampler == SamplerKind::Balanced,
            "data.samples_per_epoch",
            "applies to data.sampler = \"balanced\" only (the shuffle visits every sample once)",
        )?;
        let e = &t.early_stopping;
        check(
            e.min_delta >= 0.0 && e.min_delta.is_finite(),
            "train.early_stopping.min_delta",
            "must be a non-negative number",
        )?;
        check(self.checkpoint.keep_last > 0, "checkpoint.keep_last", "must be at least 1")?;
        check(
            is_one_directory_name(&self.run.name),
            "run.name",
            "must be one directory name under run.dir (no '/', '\\', '.' or '..'); use --run-dir for a path",
        )?;
        for (key, value, range) in self.numeric_settings() {
            if !(value.is_finite() && range.contains(&value)) {
                let (min, max) = (range.start(), range.end());
                return Err(ConfigError::Invalid {
                    key,
                    problem: format!(
                        "{} is outside [{}, {}]",
                        readable(value),
                        readable(*min),
                        readable(*max)
                    ),
                });
            }
        }
        Ok(())
    }

    /// Every numeric setting (each element of a list setting under the list's key) with the
    /// range that validation holds it to: wide enough for any real job, narrow enough that no
    /// value inside fails later as a huge allocation, a `Duration` overflow or thousands of
    /// threads. `run.seed` spans its whole type and is not listed. Finer rules (a positive
    /// learning rate, `min <= max`) are the checks above.
    pub fn numeric_settings(&self) -> Vec<(&'static str, f64, RangeInclusive<f64>)> {
        let (d, m, o, s, t, c, n) =
            (&self.data, &self.model, &self.optim, &self.schedule, &self.train, &self.checkpoint, &self.dist);
        // Counts as f64: every range bound here is exact in an f64, and a count too large to
        // be exact is outside every range anyway.
        let count = |value: usize| value as f64;
        let mut settings = vec![
            ("data.image_size", f64::from(d.image_size), 16.0..=4096.0),
            ("data.eval_resize", f64::from(d.eval_resize), 0.0..=8192.0),
            ("data.batch_size", count(d.batch_size), 1.0..=65536.0),
            ("data.eval_batch_size", count(d.eval_batch_size), 0.0..=65536.0),
            ("data.prefetch", count(d.prefetch), 0.0..=64.0),
            // Up to 2^36 pixels (a 262144 x 262144 image): far beyond any photo, and still a
            // bound on what one header can make rtrain allocate.
            ("data.max_image_pixels", d.max_image_pixels as f64, 1.0..=68_719_476_736.0),
            ("model.num_classes", count(m.num_classes), 0.0..=100_000.0),
            ("optim.lr", o.lr, 0.0..=10.0),
            ("optim.weight_decay", o.weight_decay, 0.0..=1.0),
            ("optim.momentum", o.momentum, 0.0..=1.0),
            ("optim.eps", o.eps, 0.0..=1.0),
            ("schedule.warmup_epochs", s.warmup_epochs, 0.0..=100_000.0),
            ("schedule.warmup_start_factor", s.warmup_start_factor, 0.0..=1.0),
            ("schedule.min_lr", s.min_lr, 0.0..=10.0),
            ("schedule.step_epochs", f64::from(s.step_epochs), 1.0..=100_000.0),
            ("schedule.gamma", s.gamma, 0.0..=1.0),
            ("schedule.factor", s.factor, 0.0..=1.0),
            ("schedule.patience", f64::from(s.patience), 0.0..=100_000.0),
            ("schedule.threshold", s.threshold, 0.0..=1e6),
            ("schedule.cooldown", f64::from(s.cooldown), 0.0..=100_000.0),
            ("train.epochs", f64::from(t.epochs), 1.0..=100_000.0),
            ("train.label_smoothing", t.label_smoothing, 0.0..=1.0),
            ("train.threads", count(t.threads), 0.0..=1024.0),
            ("train.log_every_steps", t.log_every_steps as f64, 1.0..=1e12),
            ("train.max_steps_per_epoch", t.max_steps_per_epoch as f64, 0.0..=1e12),
            ("train.accumulate", f64::from(t.accumulate), 1.0..=65536.0),
            ("train.early_stopping.patience", f64::from(t.early_stopping.patience), 0.0..=100_000.0),
            ("train.early_stopping.min_delta", t.early_stopping.min_delta, 0.0..=1e6),
            // The epoch's draws are held in memory (8 bytes each, and a rank's share again):
            // 10^8 is 1.6 GB at most, and about 80 epochs of ImageNet in one.
            ("data.samples_per_epoch", count(d.samples_per_epoch), 0.0..=100_000_000.0),
            ("checkpoint.every_epochs", f64::from(c.every_epochs), 0.0..=100_000.0),
            ("checkpoint.every_steps", c.every_steps as f64, 0.0..=1e12),
            ("checkpoint.keep_last", count(c.keep_last), 1.0..=10_000.0),
            ("dist.bucket_mb", n.bucket_mb, 0.0..=4096.0),
            ("dist.poll_us", n.poll_us as f64, 0.0..=10_000_000.0),
            // Up to a week; below a second a busy but healthy collective would be a "hang".
            ("dist.timeout_s", n.timeout_s, 1.0..=604_800.0),
        ];
        if let Workers::Count(workers) = d.workers {
            settings.push(("data.workers", count(workers), 0.0..=256.0));
        }
        settings.extend(d.scale.iter().map(|&v| ("data.scale", v, 0.0..=1.0)));
        settings.extend(d.ratio.iter().map(|&v| ("data.ratio", v, 0.0..=100.0)));
        settings.extend(m.head_hidden.iter().map(|&w| ("model.head_hidden", count(w), 1.0..=65536.0)));
        settings.extend(o.betas.iter().map(|&v| ("optim.betas", v, 0.0..=1.0)));
        if let ClassWeights::PerClass(weights) = &t.class_weights {
            settings.extend(weights.iter().map(|&w| ("train.class_weights", w, 0.0..=1e6)));
        }
        settings
    }

    pub fn eval_resize(&self) -> u32 {
        match self.data.eval_resize {
            0 => (self.data.image_size * 256).div_ceil(224),
            n => n,
        }
    }

    pub fn eval_batch_size(&self) -> usize {
        match self.data.eval_batch_size {
            0 => self.data.batch_size,
            n => n,
        }
    }

    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string_pretty(self).map_err(|e| ConfigError::Serialize { problem: e.to_string() })
    }

    /// sha256 of the canonical TOML: identifies the configuration in checkpoints.
    pub fn hash(&self) -> Result<String, ConfigError> {
        Ok(hex::encode(Sha256::digest(self.to_toml()?.as_bytes())))
    }
}

/// The settings in which two resolved configurations (as [`Config::to_toml`] writes them)
/// differ, as `key = theirs (ours)` with `ours` the first one's value.
pub fn differences(ours: &str, theirs: &str) -> Vec<String> {
    let (ours, theirs) = (dotted_leaves(ours), dotted_leaves(theirs));
    let keys: std::collections::BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
    let unset = || "unset".to_string();
    keys.into_iter()
        .filter(|key| ours.get(*key) != theirs.get(*key))
        .map(|key| {
            let (mine, other) = (
                ours.get(key).cloned().unwrap_or_else(unset),
                theirs.get(key).cloned().unwrap_or_else(unset),
            );
            format!("{key} = {other} (rank 0: {mine})")
        })
        .collect()
}

/// The configured choice, `train.device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceSetting {
    /// A GPU when this rank sees one, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// A GPU, or an error saying why there is none.
    Cuda,
}

/// Which all-reduce algorithm to ask the MPI library for. Open MPI's own choice reached only
/// 50-65% of a 1 Gbit/s link between two nodes in `rtrain bench allreduce`; recursive doubling
/// (one exchange of the whole buffer when there are two ranks) reached 87-95%, and ring was
/// the best with four (77% with 25 MiB buckets, against 49%).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum AllreduceAlgorithm {
    /// Recursive doubling for two ranks, ring for more (Open MPI); the library's choice
    /// elsewhere.
    #[default]
    Auto,
    /// Whatever the MPI library decides.
    Mpi,
    RecursiveDoubling,
    Ring,
    Rabenseifner,
}

/// The format gradients cross the network in, `dist.compress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "lowercase")]
pub enum GradCompression {
    /// fp32, as computed.
    #[default]
    None,
    /// bfloat16: fp32's range, 8 bits of precision.
    Bf16,
    /// IEEE half precision: 11 bits of precision, range up to 65504 (gradients are divided by
    /// the world size before the cast, so their sum cannot overflow where they did not).
    Fp16,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_with(toml: &str, overrides: &[&str]) -> Result<LoadedConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        std::fs::write(&path, toml).unwrap();
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        LoadedConfig::load(Some(&path), &overrides)
    }

    #[test]
    fn misnamed_setting_variables_are_those_that_start_with_a_section() {
        let names =
            ["RTRAIN_OPTIM_LR", "RTRAIN_TRAIN__EPOCHS", "RTRAIN_IMAGE_TAG", "RTRAIN_DIST_TIMEOUT_S", "HOME"];
        let warnings = misnamed_setting_variables(names.into_iter().map(String::from));
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("RTRAIN_OPTIM__LR?"), "{warnings:?}");
        assert!(warnings[1].contains("RTRAIN_DIST__TIMEOUT_S?"), "{warnings:?}");
    }

    #[test]
    fn a_run_name_is_one_directory_name() {
        for good in ["", "smoke", "resnet50-2026", "a.b", "..x"] {
            assert!(is_one_directory_name(good), "{good}");
        }
        for bad in ["..", ".", "../x", "a/b", "/abs", "a\\b"] {
            assert!(!is_one_directory_name(bad), "{bad}");
        }
    }

    #[test]
    fn every_default_is_inside_its_range() {
        let config = Config::default();
        for (key, value, range) in config.numeric_settings() {
            assert!(range.contains(&value), "{key} = {value} outside {range:?}");
        }
        assert_eq!(readable(1e300), "1e300");
        assert_eq!(readable(604_800.0), "604800");
        assert_eq!(readable(0.002), "0.002");
    }

    #[test]
    fn layers_override_in_order() {
        let loaded = load_with("[train]\nepochs = 3\n[optim]\nlr = 0.2\n", &["train.epochs=5"]).unwrap();
        assert_eq!(loaded.config.train.epochs, 5, "--set beats the file");
        assert_eq!(loaded.config.optim.lr, 0.2, "the file beats the defaults");
        assert_eq!(loaded.config.data.batch_size, 64, "defaults fill the rest");
        let shown = loaded.show().unwrap();
        assert!(shown.contains("epochs = 5  # --set"), "{shown}");
        assert!(shown.contains("lr = 0.2  # file"), "{shown}");
        assert!(shown.contains("batch_size = 64  # default"), "{shown}");
    }

    #[test]
    fn bare_strings_and_arrays_in_overrides() {
        let loaded = load_with("", &["model.arch=resnet50", "data.scale=[0.5, 1.0]"]).unwrap();
        assert_eq!(loaded.config.model.arch, Arch::Resnet50);
        assert_eq!(loaded.config.data.scale, [0.5, 1.0]);
    }

    #[test]
    fn loader_workers_are_auto_or_a_number() {
        assert_eq!(load_with("", &[]).unwrap().config.data.workers, Workers::Auto);
        assert_eq!(load_with("", &["data.workers=3"]).unwrap().config.data.workers, Workers::Count(3));
        let file = load_with("[data]\nworkers = \"auto\"\n", &["data.workers=0"]).unwrap();
        assert_eq!(file.config.data.workers, Workers::Count(0));
        let err = load_with("", &["data.workers=many"]).err().unwrap().to_string();
        assert!(err.contains("data.workers") && err.contains("\"many\""), "{err}");
    }

    #[test]
    fn unknown_key_names_key_and_file() {
        let err = load_with("[train]\nepochz = 3\n", &[]).err().unwrap().to_string();
        assert!(err.contains("epochz"), "{err}");
        assert!(err.contains("run.toml"), "{err}");
    }

    #[test]
    fn wrong_type_names_key() {
        let err = load_with("", &["train.epochs=many"]).err().unwrap().to_string();
        assert!(err.contains("train.epochs"), "{err}");
        assert!(err.contains("--set"), "{err}");
    }

    /// Each form of `train.class_weights` reads back from the TOML of `config.toml` and from the
    /// JSON of `manifest.json`, which `reproduce` reads.
    #[test]
    fn class_weights_round_trip_through_toml_and_json() {
        for setting in [
            ClassWeights::Rule(ClassWeightRule::None),
            ClassWeights::Rule(ClassWeightRule::Balanced),
            ClassWeights::PerClass(vec![1.0, 2.5, 3.0]),
        ] {
            let mut config = Config::default();
            config.train.class_weights = setting.clone();
            let toml: Config = toml::from_str(&config.to_toml().unwrap()).unwrap();
            let json: Config = serde_json::from_str(&serde_json::to_string(&config).unwrap()).unwrap();
            assert_eq!((toml.train.class_weights, json.train.class_weights), (setting.clone(), setting));
        }
        let integers = load_with("[train]\nclass_weights = [1, 2]\n", &[]).unwrap();
        assert_eq!(integers.config.train.class_weights, ClassWeights::PerClass(vec![1.0, 2.0]));
    }

    #[test]
    fn unknown_arch_is_rejected() {
        let err = load_with("[model]\narch = \"resnet19\"\n", &[]).err().unwrap().to_string();
        assert!(err.contains("resnet19") && err.contains("model.arch"), "{err}");
    }

    #[test]
    fn invalid_values_name_the_key() {
        let err = load_with("", &["data.scale=[0.9, 0.1]"]).err().unwrap().to_string();
        assert!(err.contains("data.scale"), "{err}");
        let err = load_with("", &["optim.nesterov=true", "optim.momentum=0"]).err().unwrap();
        assert!(err.to_string().contains("optim.nesterov"));
    }

    #[test]
    fn malformed_override_is_rejected() {
        let err = load_with("", &["train.epochs"]).err().unwrap().to_string();
        assert!(err.contains("section.key=value"), "{err}");
    }

    #[test]
    fn documented_defaults_are_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/default.toml");
        let documented = LoadedConfig::load(Some(&path), &[]).unwrap().config;
        assert_eq!(documented, Config::default(), "configs/default.toml and Config::default() disagree");
        let text = std::fs::read_to_string(&path).unwrap();
        let shown = LoadedConfig::load(None, &[]).unwrap().show().unwrap();
        for line in shown.lines().filter(|l| l.contains(" = ")) {
            let key = line.split(" = ").next().unwrap();
            assert!(
                text.contains(&format!("{key} = ")) || text.contains(&format!("# {key} = ")),
                "{key} undocumented"
            );
        }
    }

    #[test]
    fn every_shipped_config_loads_and_validates() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        let mut count = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let loaded = LoadedConfig::load(Some(&path), &[]);
            let config = loaded.unwrap_or_else(|e| panic!("{}: {e}", path.display())).config;
            config.validate().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            count += 1;
        }
        assert!(count >= 5, "{count} configs");
    }

    #[test]
    fn hash_changes_with_values() {
        let a = Config::default();
        let mut b = Config::default();
        b.optim.lr = 0.01;
        assert_ne!(a.hash().unwrap(), b.hash().unwrap());
        assert_eq!(a.hash().unwrap(), Config::default().hash().unwrap());
    }
}
