//! The run configuration: its typed shape, its defaults, and how the layers are merged.
//!
//! Layers, lowest first: built-in defaults < `--config FILE` (TOML) < `RTRAIN_SECTION__KEY`
//! environment variables < `--set section.key=value`. figment does the merging and remembers
//! where each value came from, so an unknown key or a wrong type names the key and its source,
//! and `rtrain config show` can say the origin of every value. Raw input is checked here, once:
//! the rest of the program receives a validated [`Config`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
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

// ---------------------------------------------------------------------------------------------
// One declaration per key.
//
// Each section below is declared once with `section!`: for every key its type, its default,
// its range or rule, and its doc, from which come the struct (serde's shape), its `Default`,
// the checks of each key alone ([`Section::check_keys`]), `configs/default.toml`
// ([`default_toml`]) and `docs/reference/configuration.md` ([`reference_markdown`]).
// [`Config::validate`] keeps the rules between keys.
// ---------------------------------------------------------------------------------------------

/// `Some` of an optional part of a declaration, or `None`.
macro_rules! optional {
    () => {
        None
    };
    ($value:expr) => {
        Some($value)
    };
}

/// Declares a configuration section from one declaration per key:
///
/// ```text
/// /// The key's doc: its rustdoc, and its text in default.toml and the reference.
/// key: Type = default [, range BOUNDS] [, check RULE] [, example "TOML"];
/// ```
///
/// `range` holds every number of the value (each element of a list) within [`Bounds`];
/// `check` is a rule on the value alone, `fn(&Type) -> Result<(), String>`, checked first;
/// `example` is shown commented out for a key whose default is unset (`None`). Sub-tables
/// (declared with `section!` themselves) follow in `tables { ... }`. Makes the struct (every
/// key optional, unknown keys refused), its `Default`, and its [`Section`] impl.
macro_rules! section {
    (
        $(#[doc = $section_doc:literal])+
        pub struct $name:ident in $table:literal {
            $(
                $(#[doc = $doc:literal])+
                $field:ident: $ty:ty = $default:expr
                $(, range $range:expr)?
                $(, check $check:expr)?
                $(, example $example:literal)?
                ;
            )+
        }
        $(tables {
            $(
                $(#[doc = $table_doc:literal])+
                $table_field:ident: $table_ty:ty;
            )+
        })?
    ) => {
        $(#[doc = $section_doc])+
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct $name {
            $(
                $(#[doc = $doc])+
                pub $field: $ty,
            )+
            $($(
                $(#[doc = $table_doc])+
                pub $table_field: $table_ty,
            )+)?
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    $($field: $default,)+
                    $($($table_field: Default::default(),)+)?
                }
            }
        }

        impl Section for $name {
            fn tables() -> Vec<Table> {
                #[allow(unused_mut)]
                let mut tables = vec![Table {
                    name: $table,
                    doc: concat!($($section_doc, "\n"),+),
                    keys: vec![$(
                        Key {
                            name: concat!($table, ".", stringify!($field)),
                            toml_type: <$ty as TomlType>::toml_type(),
                            doc: concat!($($doc, "\n"),+),
                            bounds: optional!($($range)?),
                            values: allowed_values::<$ty>(),
                            example: optional!($($example)?),
                        },
                    )+],
                }];
                $($(tables.extend(<$table_ty as Section>::tables());)+)?
                tables
            }

            fn check_keys(&self) -> Result<(), ConfigError> {
                $(
                    let key = concat!($table, ".", stringify!($field));
                    $(
                        let own_rule: fn(&$ty) -> Result<(), String> = $check;
                        own_rule(&self.$field).map_err(|problem| ConfigError::Invalid { key, problem })?;
                    )?
                    $( check_bounds(key, &self.$field, $range)?; )?
                    let _ = key;
                )+
                $($(self.$table_field.check_keys()?;)+)?
                Ok(())
            }
        }
    };
}

/// Declares [`Config`] from its sections, in the order they are written and documented.
macro_rules! sections {
    ($($field:ident: $ty:ty,)+) => {
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct Config {
            $(pub $field: $ty,)+
        }

        impl Config {
            /// Every table of the configuration (sub-tables after their parent), with its keys.
            pub fn tables() -> Vec<Table> {
                let mut tables = Vec::new();
                $(tables.extend(<$ty as Section>::tables());)+
                tables
            }

            /// Each key's own range and rule, in declaration order; the first broken names its
            /// key.
            fn check_keys(&self) -> Result<(), ConfigError> {
                $(self.$field.check_keys()?;)+
                Ok(())
            }
        }
    };
}

/// A section of the configuration, declared with `section!`.
pub trait Section {
    /// The section's table, then its sub-tables'.
    fn tables() -> Vec<Table>;
    /// The range and rule of each key alone (sub-tables' too), in declaration order.
    fn check_keys(&self) -> Result<(), ConfigError>;
}

/// One table (`[train]`, `[train.early_stopping]`) as the docs describe it.
#[derive(Debug, Clone)]
pub struct Table {
    /// Its dotted name.
    pub name: &'static str,
    /// Its rustdoc, raw.
    pub doc: &'static str,
    pub keys: Vec<Key>,
}

/// One declared key as the docs describe it.
#[derive(Debug, Clone)]
pub struct Key {
    /// Dotted: `train.early_stopping.patience`.
    pub name: &'static str,
    /// What TOML value it takes: "integer", "float", "path, optional"...
    pub toml_type: String,
    /// Its rustdoc, raw.
    pub doc: &'static str,
    pub bounds: Option<Bounds>,
    /// The names an enumerated key takes, as serde reads them; empty for other keys.
    pub values: Vec<&'static str>,
    /// A value to show commented out, for a key unset by default.
    pub example: Option<&'static str>,
}

impl Key {
    /// The last part of the dotted name: `patience`.
    pub fn leaf(&self) -> &'static str {
        self.name.rsplit('.').next().unwrap_or(self.name)
    }

    /// The doc as one paragraph.
    pub fn text(&self) -> String {
        one_paragraph(self.doc)
    }

    /// What values it takes beyond its type: `[0, 64]`, or `"fail", "skip"`.
    pub fn allowed(&self) -> Option<String> {
        match (&self.bounds, self.values.as_slice()) {
            (Some(bounds), _) => Some(bounds.to_string()),
            (None, []) => None,
            (None, values) => Some(values.iter().map(|v| format!("\"{v}\"")).collect::<Vec<_>>().join(", ")),
        }
    }
}

/// Rustdoc lines (each with its leading space) as one paragraph.
fn one_paragraph(doc: &str) -> String {
    doc.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The interval a numeric key's every number must lie in; each end closed or open. Made with
/// [`closed`], [`above`] (open below), [`below`] (open above) and [`open`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub min: f64,
    pub max: f64,
    pub min_open: bool,
    pub max_open: bool,
}

/// `[min, max]`.
pub const fn closed(min: f64, max: f64) -> Bounds {
    Bounds { min, max, min_open: false, max_open: false }
}

/// `(min, max]`: more than `min`.
pub const fn above(min: f64, max: f64) -> Bounds {
    Bounds { min, max, min_open: true, max_open: false }
}

/// `[min, max)`: less than `max`.
pub const fn below(min: f64, max: f64) -> Bounds {
    Bounds { min, max, min_open: false, max_open: true }
}

/// `(min, max)`.
pub const fn open(min: f64, max: f64) -> Bounds {
    Bounds { min, max, min_open: true, max_open: true }
}

impl Bounds {
    /// Whether `value` is a finite number inside.
    pub fn contains(&self, value: f64) -> bool {
        let above_min = if self.min_open { value > self.min } else { value >= self.min };
        let below_max = if self.max_open { value < self.max } else { value <= self.max };
        value.is_finite() && above_min && below_max
    }
}

impl std::fmt::Display for Bounds {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let (left, right) = (if self.min_open { '(' } else { '[' }, if self.max_open { ')' } else { ']' });
        write!(f, "{left}{}, {}{right}", readable(self.min), readable(self.max))
    }
}

/// The numbers of a setting's value that its [`Bounds`] hold: the number, or each element of
/// a list. Counts as f64: every bound is exact in an f64, and a count too large to be exact is
/// outside every range anyway.
pub trait Numbers {
    fn numbers(&self) -> Vec<f64>;
}

impl Numbers for u32 {
    fn numbers(&self) -> Vec<f64> {
        vec![f64::from(*self)]
    }
}

impl Numbers for u64 {
    fn numbers(&self) -> Vec<f64> {
        vec![*self as f64]
    }
}

impl Numbers for usize {
    fn numbers(&self) -> Vec<f64> {
        vec![*self as f64]
    }
}

impl Numbers for f64 {
    fn numbers(&self) -> Vec<f64> {
        vec![*self]
    }
}

impl<T: Numbers, const N: usize> Numbers for [T; N] {
    fn numbers(&self) -> Vec<f64> {
        self.iter().flat_map(Numbers::numbers).collect()
    }
}

impl<T: Numbers> Numbers for Vec<T> {
    fn numbers(&self) -> Vec<f64> {
        self.iter().flat_map(Numbers::numbers).collect()
    }
}

impl Numbers for Workers {
    fn numbers(&self) -> Vec<f64> {
        match self {
            Workers::Auto => Vec::new(),
            Workers::Count(n) => n.numbers(),
        }
    }
}

impl Numbers for ClassWeights {
    fn numbers(&self) -> Vec<f64> {
        match self {
            ClassWeights::Rule(_) => Vec::new(),
            ClassWeights::PerClass(weights) => weights.clone(),
        }
    }
}

/// Refuses the first number of `value` outside `bounds`, naming `key`.
fn check_bounds(key: &'static str, value: &impl Numbers, bounds: Bounds) -> Result<(), ConfigError> {
    match value.numbers().into_iter().find(|&n| !bounds.contains(n)) {
        Some(n) => Err(ConfigError::Invalid { key, problem: format!("{} is outside {bounds}", readable(n)) }),
        None => Ok(()),
    }
}

/// What a key's TOML value is, for the docs.
pub trait TomlType {
    fn toml_type() -> String;
}

macro_rules! toml_types {
    ($($name:literal: $($ty:ty),+;)+) => {
        $($(impl TomlType for $ty {
            fn toml_type() -> String {
                $name.to_string()
            }
        })+)+
    };
}

toml_types! {
    "integer": u32, u64, usize;
    "float": f64;
    "boolean": bool;
    "string": String, Arch, PrecisionSetting, DeviceSetting, UnevenTail, AllreduceAlgorithm,
        GradCompression, AugmentPolicy, TrainGeometry, EvalGeometry, SamplerKind, BadSample, DataSource,
        OptimKind, ScheduleKind, PlateauMode, ThresholdMode, StopMetric, StopMode;
    "path": PathBuf;
    "integer or \"auto\"": Workers;
    "string or list of floats": ClassWeights;
}

impl<T: TomlType> TomlType for Option<T> {
    fn toml_type() -> String {
        format!("{}, optional", T::toml_type())
    }
}

impl<T: TomlType> TomlType for Vec<T> {
    fn toml_type() -> String {
        format!("list of {}s", T::toml_type())
    }
}

impl<T: TomlType, const N: usize> TomlType for [T; N] {
    fn toml_type() -> String {
        format!("{N} {}s", T::toml_type())
    }
}

/// The names serde reads for an enumeration `T` (or an optional one), as its derive declares
/// them; empty for any other type. Asked of serde itself, so that the docs cannot list a name
/// the configuration refuses.
fn allowed_values<T: serde::de::DeserializeOwned>() -> Vec<&'static str> {
    /// A deserializer that only records the variants it is asked for.
    struct Probe<'a>(&'a mut &'static [&'static str]);

    #[derive(Debug)]
    struct NotAnEnum;

    impl std::fmt::Display for NotAnEnum {
        fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("not an enumeration")
        }
    }

    impl std::error::Error for NotAnEnum {}

    impl serde::de::Error for NotAnEnum {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            NotAnEnum
        }
    }

    impl<'de> serde::Deserializer<'de> for Probe<'_> {
        type Error = NotAnEnum;

        fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, NotAnEnum> {
            Err(NotAnEnum)
        }

        fn deserialize_option<V: serde::de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, NotAnEnum> {
            visitor.visit_some(self)
        }

        fn deserialize_enum<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            variants: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, NotAnEnum> {
            *self.0 = variants;
            Err(NotAnEnum)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
            unit_struct newtype_struct seq tuple tuple_struct map struct identifier ignored_any
        }
    }

    let mut variants: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut variants));
    variants.to_vec()
}

/// `data.scale`: an area range inside (0, 1].
fn area_range(scale: &[f64; 2]) -> Result<(), String> {
    rule(scale[0] > 0.0 && scale[0] <= scale[1] && scale[1] <= 1.0, "must satisfy 0 < min <= max <= 1")
}

/// `data.ratio`: an aspect-ratio range.
fn aspect_range(ratio: &[f64; 2]) -> Result<(), String> {
    rule(ratio[0] > 0.0 && ratio[0] <= ratio[1], "must satisfy 0 < min <= max")
}

// The rules below take the key's own type (`&String`, `&Vec<String>`), as `section!` asks.
#[allow(clippy::ptr_arg)]
fn not_empty(name: &String) -> Result<(), String> {
    rule(!name.is_empty(), "must not be empty")
}

/// `data.class_order`: each class once.
#[allow(clippy::ptr_arg)]
fn distinct_classes(order: &Vec<String>) -> Result<(), String> {
    let distinct: BTreeSet<&String> = order.iter().collect();
    rule(
        distinct.len() == order.len() && order.iter().all(|c| !c.is_empty()),
        "must name each class once, none empty",
    )
}

/// `train.class_weights`: a rule, or positive weights.
fn positive_weights(weights: &ClassWeights) -> Result<(), String> {
    let ClassWeights::PerClass(weights) = weights else { return Ok(()) };
    rule(
        !weights.is_empty() && weights.iter().all(|w| w.is_finite() && *w > 0.0),
        "must be \"none\", \"balanced\" or one positive weight per class (a batch of only zero-weight classes has no mean loss: leave such a class out of the data instead)",
    )
}

/// `run.name`: stays inside `run.dir`.
#[allow(clippy::ptr_arg)]
fn one_directory_name(name: &String) -> Result<(), String> {
    rule(
        is_one_directory_name(name),
        "must be one directory name under run.dir (no '/', '\\', '.' or '..'); use --run-dir for a path",
    )
}

fn rule(ok: bool, problem: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(problem.to_string())
    }
}

sections! {
    run: RunConfig,
    data: DataConfig,
    model: ModelConfig,
    optim: OptimConfig,
    schedule: ScheduleConfig,
    train: TrainConfig,
    checkpoint: CheckpointConfig,
    dist: DistConfig,
    log: LogConfig,
}

section! {
    /// Where the run is written, and what makes it reproducible.
    pub struct RunConfig in "run" {
        /// Run directory name under `dir`; empty means `<arch>-<UTC timestamp>`.
        name: String = String::new(), check one_directory_name;
        /// The directory run directories are made in (relative paths are relative to the
        /// working directory).
        dir: PathBuf = PathBuf::from("runs");
        /// The one seed every random choice derives from (init, sampling, augmentation).
        seed: u64 = 0;
        /// Reproducible results: the same config, data, binary, world size and thread count
        /// give bit-identical weights on CPU (always so); on GPU also cuDNN's deterministic
        /// kernels without autotuning, at some speed.
        deterministic: bool = true;
    }
}

section! {
    /// The images: a class-per-folder tree (JPEG/PNG) in torchvision ImageFolder's layout,
    /// `<root>/<train_split>/<class>/*.jpg` and `<root>/<val_split>/<class>/*.jpg`, or a shard
    /// directory made by `rtrain data prepare` (WebDataset tars and a shards.json), and how
    /// they become batches.
    pub struct DataConfig in "data" {
        /// Class-per-folder image tree with `train_split` and `val_split` subdirectories, or a
        /// shard directory from `rtrain data prepare` (it has a shards.json). The default holds
        /// the built-in synthetic damage-level set, generated on first use.
        root: PathBuf = PathBuf::from(DEFAULT_DATA_ROOT);
        /// What training steps read: `images` (the training split, decoded and augmented) or
        /// `synthetic` (one batch of random tensors of the configured shape made once on the
        /// device, no decode: Horovod's synthetic benchmark, to see what the input pipeline
        /// costs). Evaluation always reads the validation split.
        source: DataSource = DataSource::Images;
        /// Node-local directory (e.g. /tmp/rtrain) to copy shards to before training: local
        /// rank 0 of each node copies what is missing and verifies it, the other ranks wait.
        /// Unset: read `root` in place.
        stage_dir: Option<PathBuf> = None, example "\"/tmp/rtrain\"";
        /// An image that cannot be decoded fails the run naming it, or is skipped and counted.
        on_bad_sample: BadSample = BadSample::Fail;
        /// The training split's directory under `root`.
        train_split: String = "train".into(), check not_empty;
        /// The validation split's directory under `root`.
        val_split: String = "val".into(), check not_empty;
        /// The classes' order, lowest first (e.g. ["C0", "C2", "C4"] for damage levels): the
        /// label index and the rank the ordinal metrics (quadratic kappa, rank error) count.
        /// Empty: the sorted class names, as torchvision's ImageFolder orders them.
        class_order: Vec<String> = Vec::new(), check distinct_classes;
        /// Side of the square image the network sees.
        image_size: u32 = 64, range closed(16.0, 4096.0);
        /// torchvision's automatic augmentation on each decoded training image, before the
        /// geometry (the tutorial's `AutoAugment()`): none, AutoAugment with the ImageNet,
        /// CIFAR-10 or SVHN policy, RandAugment (2 ops, magnitude 9 of 31) or
        /// TrivialAugmentWide.
        augment_policy: AugmentPolicy = AugmentPolicy::None;
        /// How a training image becomes image_size x image_size: torchvision's
        /// `RandomResizedCrop` (scale, ratio), or `Resize((image_size, image_size))` of the
        /// whole image, aspect not kept (the DesignSafe tutorial's). Both flip when `hflip`.
        train_transform: TrainGeometry = TrainGeometry::RandomResizedCrop;
        /// How an evaluation image does: `Resize(eval_resize)` + `CenterCrop(image_size)`, or
        /// `Resize((image_size, image_size))`.
        eval_transform: EvalGeometry = EvalGeometry::ResizeCenterCrop;
        /// `Normalize` with ImageNet's mean and std after `ToTensor`; false keeps values in
        /// [0, 1] (the tutorial has no Normalize).
        normalize: bool = true;
        /// Short side before the evaluation centre crop; 0 means image_size * 256 / 224.
        eval_resize: u32 = 0, range closed(0.0, 8192.0);
        /// Images per training batch on each rank: the global batch is batch_size x ranks x
        /// `train.accumulate`.
        batch_size: usize = 64, range closed(1.0, 65536.0);
        /// Images per evaluation batch; 0 means batch_size.
        eval_batch_size: usize = 0, range closed(0.0, 65536.0);
        /// Decode/augment threads; 0 decodes on the training thread; "auto" picks by device:
        /// on the CPU the cores libtorch leaves free (often none), with a GPU all but one
        /// (`plan::loader_workers`).
        workers: Workers = Workers::Auto, range closed(0.0, 256.0);
        /// Batches prepared ahead per worker.
        prefetch: usize = 2, range closed(0.0, 64.0);
        /// RandomResizedCrop area range, as torchvision's `scale` (whose default is
        /// [0.08, 1.0]).
        scale: [f64; 2] = [0.35, 1.0], range closed(0.0, 1.0), check area_range;
        /// RandomResizedCrop aspect-ratio range, as torchvision's `ratio`.
        ratio: [f64; 2] = [3.0 / 4.0, 4.0 / 3.0], range closed(0.0, 100.0), check aspect_range;
        /// RandomHorizontalFlip(0.5) of training images.
        hflip: bool = true;
        /// Drop the last partial training batch (keeps BatchNorm statistics sane); false keeps
        /// it, unless it holds 1 image.
        drop_last: bool = true;
        /// Which training samples an epoch visits: `shuffle` (each once, in a seeded order) or
        /// `balanced` (drawn with replacement, each class equally often: PyTorch's
        /// `WeightedRandomSampler` with weights `1 / count_c`); the same order on any worker
        /// count.
        sampler: SamplerKind = SamplerKind::Shuffle;
        /// Samples drawn per epoch by the `balanced` sampler (over all ranks); 0: as many as
        /// the training split holds. The epoch's draws are held in memory (8 bytes each, and a
        /// rank's share again): 10^8 is 1.6 GB at most, and about 80 epochs of ImageNet in one.
        samples_per_epoch: usize = 0, range closed(0.0, 100_000_000.0);
        /// Decode JPEGs at 1/2, 1/4 or 1/8 scale in the DCT domain (Pillow's `draft`) when the
        /// network's input still gets at least as many pixels: several times faster on camera
        /// photos; the pixels differ slightly from torchvision's full decode (false keeps them
        /// equal).
        jpeg_draft: bool = true;
        /// Turn photos upright as their Exif orientation tag says (every photo viewer does);
        /// torchvision's ImageFolder ignores the tag (false keeps its parity).
        exif_orientation: bool = true;
        /// An image whose header declares more pixels is refused unread, as a bad sample
        /// (`on_bad_sample`): Pillow's decompression-bomb limit by default (a 24 MP photo is
        /// 24000000). Up to 2^36 pixels: far beyond any photo, and still a bound on what one
        /// header can make rtrain allocate.
        max_image_pixels: u64 = crate::data::decode::DEFAULT_MAX_IMAGE_PIXELS,
            range closed(1.0, 68_719_476_736.0);
    }
}

section! {
    /// The network: a torchvision ResNet, its head, and the weights it starts from.
    pub struct ModelConfig in "model" {
        /// The torchvision architecture.
        arch: Arch = Arch::Resnet18;
        /// 0 means the number of class folders in the training split.
        num_classes: usize = 0, range closed(0.0, 100_000.0);
        /// A torchvision-format state dict to start from: `.safetensors`, or a `torch.save`
        /// `.pth`.
        pretrained: Option<PathBuf> = None, example "\"weights/resnet18.safetensors\"";
        /// torchvision's published weights by name (`IMAGENET1K_V1`, `IMAGENET1K_V2`,
        /// `DEFAULT`), or a file name in torch.hub's form (`NAME-SHA256PREFIX.pth`) on
        /// `weights_url`; taken from PyTorch's cache (`$TORCH_HOME/hub/checkpoints`) or
        /// downloaded into it.
        weights: Option<String> = None, example "\"IMAGENET1K_V1\"";
        /// Where published weights are downloaded from: torchvision's server, or a mirror.
        weights_url: String = crate::model::weights::TORCHVISION_BASE_URL.to_string();
        /// Hidden widths of an MLP head: Linear-ReLU layers before the classifier, named as
        /// `nn.Sequential` names them (`fc.0`, `fc.2`, ...); e.g. [512] is fc.0 Linear(C, 512),
        /// ReLU, fc.2 Linear(512, classes). Empty: torchvision's single `fc`.
        head_hidden: Vec<usize> = Vec::new(), range closed(1.0, 65536.0);
        /// torchvision's `zero_init_residual` (its constructor's default is false): each
        /// residual block's last BatchNorm scale starts at zero, so the fresh network trains as
        /// a shallow one first (no effect on starting weights).
        zero_init_residual: bool = true;
        /// Train only the classifier head (`fc`).
        freeze_backbone: bool = false;
        /// BatchNorm as torchvision's FrozenBatchNorm2d: running statistics fixed, scale and
        /// shift not trained (fine-tuning with small per-rank batches).
        freeze_batchnorm: bool = false;
        /// SyncBatchNorm: in training, BatchNorm's batch statistics cover every rank's batch
        /// (the tutorial's `convert_sync_batchnorm`), on CPU and GPU alike. One collective per
        /// layer in forward and backward; no effect on a single process or with frozen
        /// BatchNorm.
        sync_batchnorm: bool = false;
    }
}

section! {
    /// The optimizer. The default recipe trains the built-in set from scratch: AdamW with
    /// BatchNorm's residual scales at zero (`model.zero_init_residual`) keeps the validation
    /// loss smooth from the first epoch, where SGD at 0.05 threw BatchNorm's running
    /// statistics (validation loss in the hundreds).
    pub struct OptimConfig in "optim" {
        /// `sgd`, `adam` (torch.optim.Adam: weight decay as L2, added to the gradient, as the
        /// tutorial uses it) or `adamw` (decoupled weight decay).
        name: OptimKind = OptimKind::Adamw;
        /// The peak learning rate (after warm-up); scale it with the global batch.
        lr: f64 = 0.002, range above(0.0, 10.0);
        /// Weight decay (L2 for sgd and adam, decoupled for adamw).
        weight_decay: f64 = 5e-4, range closed(0.0, 1.0);
        /// SGD only.
        momentum: f64 = 0.9, range below(0.0, 1.0);
        /// SGD only.
        nesterov: bool = false;
        /// Adam and AdamW.
        betas: [f64; 2] = [0.9, 0.999], range below(0.0, 1.0);
        /// Adam and AdamW.
        eps: f64 = 1e-8, range above(0.0, 1.0);
    }
}

section! {
    /// The learning-rate schedule: `constant`, `cosine` or `step` (applied per step, after a
    /// linear warm-up), or `plateau`: torch's ReduceLROnPlateau, stepped after each epoch's
    /// evaluation (over all ranks), with its parameters by their names (`min_lr` is its
    /// floor).
    pub struct ScheduleConfig in "schedule" {
        /// constant, cosine, step (applied per step) or plateau (per epoch).
        kind: ScheduleKind = ScheduleKind::Cosine;
        /// Linear warm-up length in epochs (fractions allowed), as torch's LinearLR; applied
        /// per step.
        warmup_epochs: f64 = 1.0, range closed(0.0, 100_000.0);
        /// Warm-up starts at lr * warmup_start_factor, as torch's LinearLR `start_factor`.
        warmup_start_factor: f64 = 0.1, range above(0.0, 1.0);
        /// Cosine: the final learning rate, as CosineAnnealingLR's `eta_min`; plateau: the
        /// floor.
        min_lr: f64 = 0.0, range closed(0.0, 10.0);
        /// Step only: decay every this many epochs by `gamma`, as StepLR's `step_size`.
        step_epochs: u32 = 30, range closed(1.0, 100_000.0);
        /// Step only: the decay factor.
        gamma: f64 = 0.1, range above(0.0, 1.0);
        /// Plateau: `min` watches the validation loss, `max` the validation top-1.
        mode: PlateauMode = PlateauMode::Min;
        /// Plateau: lr *= factor when the metric has not improved for `patience` epochs.
        factor: f64 = 0.1, range open(0.0, 1.0);
        /// Plateau: epochs without an improvement before a reduction.
        patience: u32 = 10, range closed(0.0, 100_000.0);
        /// Plateau: what counts as an improvement, relative or absolute (`threshold_mode`).
        threshold: f64 = 1e-4, range closed(0.0, 1e6);
        /// Plateau: `rel` or `abs`.
        threshold_mode: ThresholdMode = ThresholdMode::Rel;
        /// Plateau: epochs to wait after a reduction before counting again.
        cooldown: u32 = 0, range closed(0.0, 100_000.0);
    }
}

section! {
    /// The training loop.
    pub struct TrainConfig in "train" {
        /// Epochs in all.
        epochs: u32 = 8, range closed(1.0, 100_000.0);
        /// The cross-entropy's label smoothing.
        label_smoothing: f64 = 0.0, range below(0.0, 1.0);
        /// libtorch intra-op threads; 0 means all available cores.
        threads: usize = 0, range closed(0.0, 1024.0);
        /// Log a progress line every this many steps when not on a terminal.
        log_every_steps: u64 = 10, range closed(1.0, 1e12);
        /// Cap on steps per epoch, 0 for none (quick checks and benchmarks).
        max_steps_per_epoch: u64 = 0, range closed(0.0, 1e12);
        /// fp32, bf16 (autocast around forward and loss, fp32 weights and optimizer) or auto
        /// (bf16 where the CPU/GPU computes it natively).
        precision: PrecisionSetting = PrecisionSetting::Auto;
        /// Channels-last (NHWC) activations and convolution weights (faster on CPU; weights
        /// save as NCHW).
        channels_last: bool = true;
        /// auto (cuda:<local rank> when this rank sees GPUs, else the CPU), cpu or cuda.
        device: DeviceSetting = DeviceSetting::Auto;
        /// Micro-batches of `data.batch_size` per optimizer step: their gradients add up
        /// locally and are averaged over the ranks once, on the last (as DDP's `no_sync`), so
        /// a step sees `batch_size x ranks x accumulate` images.
        accumulate: u32 = 1, range closed(1.0, 65536.0);
        /// The cross-entropy's per-class weights (PyTorch's `weight=`): `"none"`, `"balanced"`
        /// (scikit-learn's `n_samples / (n_classes * count_c)` over the training split), or one
        /// weight per class in class order, e.g. [1.0, 2.5, 4.0].
        class_weights: ClassWeights = ClassWeights::Rule(ClassWeightRule::None),
            range above(0.0, 1e6), check positive_weights;
        /// After training, calibrate the best checkpoint (else the final weights) on the
        /// validation split with temperature scaling: `calibrated.safetensors` in the run
        /// directory, as `rtrain calibrate` writes it.
        calibrate: bool = false;
    }
    tables {
        /// Stop when a validation metric has not improved for `patience` epochs.
        early_stopping: EarlyStoppingConfig;
    }
}

section! {
    /// Early stopping: Lightning's `EarlyStopping(monitor, mode, patience, min_delta)`,
    /// decided after each epoch's evaluation over all ranks.
    pub struct EarlyStoppingConfig in "train.early_stopping" {
        /// The validation metric watched (as `metrics.jsonl` names it); `none` never stops
        /// early.
        metric: StopMetric = StopMetric::None;
        /// `min` (lower is better), `max`, or `auto`: `min` for `val_loss`, else `max`.
        mode: StopMode = StopMode::Auto;
        /// Evaluations without an improvement after which training stops.
        patience: u32 = 3, range closed(0.0, 100_000.0);
        /// How much better than the best so far a value must be to count as an improvement.
        min_delta: f64 = 0.0, range closed(0.0, 1e6);
    }
}

section! {
    /// When checkpoints are saved and which are kept.
    pub struct CheckpointConfig in "checkpoint" {
        /// Save at the end of every this many epochs (the last epoch always; 0: only the final
        /// one).
        every_epochs: u32 = 1, range closed(0.0, 100_000.0);
        /// Also save every this many steps inside an epoch (0: never).
        every_steps: u64 = 0, range closed(0.0, 1e12);
        /// How many of the newest step checkpoints to keep.
        keep_last: usize = 3, range closed(1.0, 10_000.0);
        /// Keep `checkpoints/best.safetensors`, the checkpoint with the highest validation
        /// top-1.
        keep_best: bool = true;
    }
}

section! {
    /// Data parallelism when launched by mpirun, srun or ibrun: `data.batch_size` is per rank,
    /// so the global batch is batch_size x ranks (scale `optim.lr` with it).
    pub struct DistConfig in "dist" {
        /// Gradient bucket size in MiB for the all-reduce (PyTorch DDP's `bucket_cap_mb`, whose
        /// default is 25). 5 MiB starts communication earlier in backward: ResNet-18 on 2
        /// simulated nodes with a 1 Gbit/s link trained 25% faster than with 25 MiB
        /// (BENCHMARKS.md), and 5 MiB buckets still fill 93% of that link.
        bucket_mb: f64 = 5.0, range above(0.0, 4096.0);
        /// When the training split does not divide among the ranks: `pad` repeats samples (as
        /// PyTorch's DistributedSampler), `drop` leaves the remainder out.
        uneven: UnevenTail = UnevenTail::Pad;
        /// Start each bucket's all-reduce during backward, as soon as its gradients are final
        /// (false: all buckets after backward; for measuring what the overlap gains).
        overlap: bool = true;
        /// The all-reduce algorithm asked of the MPI library (`auto`: recursive doubling for two
        /// ranks, ring for more, with Open MPI; `mpi`: the library's own choice).
        allreduce: AllreduceAlgorithm = AllreduceAlgorithm::Auto;
        /// Microseconds between the communication thread's tests of a pending all-reduce; 0
        /// makes blocking calls (which spin a core; for fast interconnects with cores to
        /// spare).
        poll_us: u64 = 200, range closed(0.0, 10_000_000.0);
        /// Gradients on the wire: `none` (fp32), or `bf16`/`fp16`, which halve the bytes as
        /// PyTorch DDP's `bf16_compress_hook`/`fp16_compress_hook` and Horovod's
        /// `Compression.fp16` do. Weights, optimizer state and the gradients the optimizer
        /// reads stay fp32. Worth it when the link, not the computation, bounds a step (nodes
        /// behind 1-25 Gbit/s Ethernet); results are then no longer bit-identical across world
        /// sizes.
        compress: GradCompression = GradCompression::None;
        /// Once training runs, a rank that waits longer than this in a collective ends the
        /// job, naming the ranks that did not arrive (a stopped or hung rank would otherwise
        /// hang it). Up to a week; below a second a busy but healthy collective would be a
        /// "hang". Set-up has its own limit, `setup_timeout_s`.
        timeout_s: f64 = 300.0, range closed(1.0, 604_800.0);
        /// The same limit before training runs, while one rank generates the built-in data,
        /// hashes the data files or a node stages them and the others wait: raise it for a
        /// data set that takes longer than 30 minutes to hash or copy.
        setup_timeout_s: f64 = DEFAULT_SETUP_TIMEOUT_S as f64,
            range closed(1.0, 604_800.0);
    }
}

/// `dist.setup_timeout_s`'s default, in seconds: also the collective watchdog's limit until a
/// run's configuration sets it (here, not in `cluster`, which depends on this module).
pub const DEFAULT_SETUP_TIMEOUT_S: u64 = 1800;

section! {
    /// What global rank 0 writes while training, beside `metrics.jsonl`.
    pub struct LogConfig in "log" {
        /// TensorBoard event files in `RUN_DIR/tensorboard/`, written live as `metrics.jsonl`
        /// is.
        tensorboard: bool = true;
        /// Record this many training steps, from the first step report on (after warm-up), as
        /// a trace in the format PyTorch's profiler writes (Kineto's Chrome trace JSON, one
        /// `RUN_DIR/trace/rank<R>.pt.trace.json` per rank, up to 100000 spans each): every
        /// phase of the steps, each gradient bucket's all-reduce, each batch's decode. Opens
        /// in Perfetto, chrome://tracing and Holistic Trace Analysis. 0: no trace.
        trace_steps: u64 = 0, range closed(0.0, 100_000.0);
        /// A rank whose own work per step (its step without waiting for the others) exceeds
        /// the median rank's by more than this fraction is named a straggler in the log and in
        /// `metrics.jsonl`.
        straggler_threshold: f64 = 0.1, range closed(0.0, 100.0);
    }
}

// The enumerated values of the keys above.

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

/// `data.source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataSource {
    Images,
    Synthetic,
}

/// `data.on_bad_sample`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BadSample {
    Fail,
    Skip,
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
    /// Checks what types alone cannot, naming the key at fault: each key's own range and rule
    /// (declared with it), then the rules between keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn check(ok: bool, key: &'static str, problem: &str) -> Result<(), ConfigError> {
            rule(ok, problem).map_err(|problem| ConfigError::Invalid { key, problem })
        }
        self.check_keys()?;
        let (d, m) = (&self.data, &self.model);
        check(
            m.pretrained.is_none() || m.weights.is_none(),
            "model.weights",
            "cannot be combined with model.pretrained: choose published weights by name or a file",
        )?;
        if let Some(name) = &m.weights {
            crate::model::weights::HubFile::resolve(m.arch, name)
                .map_err(|e| ConfigError::Invalid { key: "model.weights", problem: e.to_string() })?;
        }
        check(
            d.batch_size > 1 || m.freeze_batchnorm,
            "data.batch_size",
            "must be at least 2 while BatchNorm trains (the statistics of one image are NaN where the feature map is 1x1, and PyTorch refuses them); set model.freeze_batchnorm = true to train with batches of 1",
        )?;
        check(
            !self.optim.nesterov || self.optim.momentum > 0.0,
            "optim.nesterov",
            "needs optim.momentum > 0",
        )?;
        check(self.schedule.min_lr <= self.optim.lr, "schedule.min_lr", "must be in [0, optim.lr]")?;
        check(
            d.samples_per_epoch == 0 || d.sampler == SamplerKind::Balanced,
            "data.samples_per_epoch",
            "applies to data.sampler = \"balanced\" only (the shuffle visits every sample once)",
        )?;
        Ok(())
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

/// What `configs/default.toml` says before the keys.
const DEFAULT_TOML_HEADER: &str = "\
# rtrain: every configuration key, with its default. Generated from the declarations in
# src/config.rs by `rtrain config defaults`; a test keeps this file equal to its output.
#
# Layers, lowest first: these defaults < --config FILE < RTRAIN_SECTION__KEY environment
# variables (e.g. RTRAIN_TRAIN__EPOCHS=3) < --set section.key=value on the command line.
# `rtrain config show [--config FILE] [--set ...]` prints the result and where each value came
# from. Unknown keys and wrong types are errors. Relative paths are relative to the working
# directory.
";

/// What `docs/reference/configuration.md` says before the tables.
const REFERENCE_HEADER: &str = "\
# Configuration reference

Every key of rtrain's configuration, by table. Generated from the declarations in
`src/config.rs` by `rtrain config reference > docs/reference/configuration.md`; a test keeps
this file equal to its output. `configs/default.toml` lists the same keys with their defaults.

Layers, lowest first: the defaults < `--config FILE` (TOML) < `RTRAIN_SECTION__KEY`
environment variables (e.g. `RTRAIN_TRAIN__EPOCHS=3`) < `--set section.key=value`. `rtrain
config show` prints the result and where each value came from. Unknown keys, wrong types and
values outside a key's range are errors that name the key.
";

/// The built-in defaults as a TOML document, every key documented: the text of
/// `configs/default.toml`. A key unset by default is shown commented out with an example.
pub fn default_toml() -> String {
    let defaults = default_values();
    let mut out = DEFAULT_TOML_HEADER.to_string();
    for table in Config::tables() {
        let _ = writeln!(out, "\n[{}]", table.name);
        out.push_str(&comment(&one_paragraph(table.doc)));
        for key in &table.keys {
            out.push('\n');
            let mut text = key.text();
            if let Some(allowed) = key.allowed() {
                let _ = write!(text, " Allowed: {allowed}.");
            }
            out.push_str(&comment(&text));
            match (defaults.get(key.name), key.example) {
                (Some(value), _) => writeln!(out, "{} = {value}", key.leaf()),
                (None, Some(example)) => writeln!(out, "# {} = {example}", key.leaf()),
                (None, None) => writeln!(out, "# {} is unset by default", key.leaf()),
            }
            .unwrap_or_default();
        }
    }
    out
}

/// The configuration reference in Markdown: a table per section with each key's type,
/// default, allowed values and doc: the text of `docs/reference/configuration.md`.
pub fn reference_markdown() -> String {
    let defaults = default_values();
    let cell = |text: &str| text.replace('|', "\\|");
    let mut out = REFERENCE_HEADER.to_string();
    for table in Config::tables() {
        let _ = writeln!(out, "\n## `[{}]`\n\n{}\n", table.name, one_paragraph(table.doc));
        out.push_str("| Key | Type | Default | Allowed | Description |\n|---|---|---|---|---|\n");
        for key in &table.keys {
            let default = defaults.get(key.name).map_or("unset".to_string(), |v| format!("`{}`", cell(v)));
            let _ = writeln!(
                out,
                "| `{}` | {} | {default} | {} | {} |",
                key.leaf(),
                key.toml_type,
                cell(&key.allowed().unwrap_or_default()),
                cell(&key.text())
            );
        }
    }
    out
}

/// Every default value by dotted key, as a person writes it in TOML (`0.002`, `1e-8`,
/// `[0.35, 1.0]`); keys unset by default are absent.
fn default_values() -> BTreeMap<String, String> {
    fn walk(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, String>) {
        for (key, value) in table {
            let key = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            match value.as_table() {
                Some(inner) => walk(&key, inner, out),
                None => {
                    out.insert(key, render(value));
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(toml::Value::Table(table)) = toml::Value::try_from(Config::default()) {
        walk("", &table, &mut out);
    }
    out
}

/// A TOML value as a person writes it: floats [`readable`], but still floats (`5.0`).
fn render(value: &toml::Value) -> String {
    match value {
        toml::Value::Float(number) => {
            let text = readable(*number);
            match text.contains(['.', 'e', 'i', 'N']) {
                true => text,
                false => format!("{text}.0"),
            }
        }
        toml::Value::Array(items) => format!("[{}]", items.iter().map(render).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// `text` as `# ` comment lines of at most 96 characters.
fn comment(text: &str) -> String {
    let mut out = String::new();
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > 96 && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
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
        Config::default().validate().unwrap();
        assert_eq!(readable(1e300), "1e300");
        assert_eq!(readable(604_800.0), "604800");
        assert_eq!(readable(0.002), "0.002");
    }

    /// A number a key's range leaves out is refused naming the key, with the range as the
    /// declaration writes it, open ends included.
    #[test]
    fn bounds_name_the_key_and_their_open_ends() {
        let err = load_with("", &["optim.lr=-1"]).err().unwrap().to_string();
        assert!(err.contains("optim.lr: -1 is outside (0, 10]"), "{err}");
        let err = load_with("", &["schedule.factor=1.0"]).err().unwrap().to_string();
        assert!(err.contains("schedule.factor: 1 is outside (0, 1)"), "{err}");
        let err = load_with("", &["optim.betas=[0.9, 1.0]"]).err().unwrap().to_string();
        assert!(err.contains("optim.betas: 1 is outside [0, 1)"), "{err}");
        let err = load_with("", &["data.workers=257"]).err().unwrap().to_string();
        assert!(err.contains("data.workers: 257 is outside [0, 256]"), "{err}");
        load_with("", &["optim.lr=10", "schedule.factor=0.99", "data.workers=256"]).unwrap();
        assert!(!above(0.0, 1.0).contains(f64::NAN) && !closed(0.0, 1.0).contains(f64::INFINITY));
    }

    /// Every key serde reads is declared once, with its doc, and every number has a range
    /// (`run.seed` spans its whole type).
    #[test]
    fn every_key_is_declared_with_a_range_for_its_numbers() {
        let tables = Config::tables();
        let declared: Vec<&Key> = tables.iter().flat_map(|t| &t.keys).collect();
        let names: BTreeSet<&str> = declared.iter().map(|k| k.name).collect();
        assert_eq!(names.len(), declared.len(), "a key is declared twice");
        let serialised = dotted_leaves(&Config::default().to_toml().unwrap());
        for key in serialised.keys() {
            assert!(names.contains(key.as_str()), "{key} is not declared");
        }
        for key in &declared {
            assert!(
                serialised.contains_key(key.name) || key.example.is_some(),
                "{} is neither serialised nor shown by an example",
                key.name
            );
            assert!(!key.text().is_empty(), "{} has no doc", key.name);
            let numeric = key.toml_type.contains("integer") || key.toml_type.contains("float");
            assert!(
                !numeric || key.bounds.is_some() || key.name == "run.seed",
                "{} ({}) has no range",
                key.name,
                key.toml_type
            );
        }
        assert!(names.contains("train.early_stopping.patience") && names.len() > 60, "{names:?}");
        let optim = declared.iter().find(|k| k.name == "optim.name").unwrap();
        assert_eq!(optim.values, ["sgd", "adam", "adamw"]);
        let stage_dir = declared.iter().find(|k| k.name == "data.stage_dir").unwrap();
        assert_eq!((stage_dir.toml_type.as_str(), stage_dir.values.len()), ("path, optional", 0));
    }

    /// `configs/default.toml` and `docs/reference/configuration.md` are what the declarations
    /// make; `RTRAIN_BLESS=1 cargo test --release --lib generated` writes them anew.
    #[test]
    fn generated_files_are_current() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        for (file, text) in [
            ("configs/default.toml", default_toml()),
            ("docs/reference/configuration.md", reference_markdown()),
        ] {
            let path = repo.join(file);
            if std::env::var_os("RTRAIN_BLESS").is_some() {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &text).unwrap();
            }
            let found = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                found == text,
                "{file} is not what src/config.rs declares: regenerate it with `RTRAIN_BLESS=1 cargo test --release --lib generated` (or `rtrain config defaults` / `rtrain config reference`)"
            );
        }
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
