//! A trained model as `predict`, `eval`, `explain` and `calibrate` use it: one model file or
//! several (a deep ensemble), each member seen through its own recorded preprocessing and
//! scaled by its own temperature, optionally with test-time flips.
//!
//! An image's probabilities are the mean over members of each member's, and a member's the
//! mean over its views (the image, and with `--tta flip` its horizontal mirror: timm's and
//! mmdetection's default) of `softmax(logits / temperature)`, computed in f64 on the CPU in a
//! fixed order, so that they are the same bytes whatever the world size or worker count.
//! Members that see images through the same transform share one decoded batch.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use tch::{Kind, Tensor};

use crate::config::Config;
use crate::data::dataset::{DataError, Dataset};
use crate::data::decode::DecodeError;
use crate::data::loader::{transform_encoded, Batch, EpochBatches, Loader, LoaderOptions};
use crate::data::transforms::{self, Transform};
use crate::model::precision::Compute;
use crate::model::Model;
use crate::plan::eval_transform_of;
use crate::run_dir::checkpoint::{self, Calibration, CheckpointError, WeightsMeta};
use crate::run_dir::preprocessing;
use crate::run_dir::RunPaths;
use crate::util::files::{sha256_file, FileError};
use crate::util::shim::ShimError;

#[derive(Debug, thiserror::Error)]
pub enum InferenceError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Shim(#[from] ShimError),
    #[error("{}: its recorded preprocessing is out of range: {source}", path.display())]
    Preprocessing { path: PathBuf, source: crate::config::ConfigError },
    #[error("no model given: name at least one --checkpoint")]
    NoModel,
    #[error("{}: classes [{}] differ from {}'s [{}]: the members of an ensemble must have the same classes in the same order", path.display(), found.join(", "), first.display(), expected.join(", "))]
    Classes { path: PathBuf, found: Vec<String>, first: PathBuf, expected: Vec<String> },
    #[error("computing probabilities: {0}")]
    Torch(#[from] tch::TchError),
    #[error("the loaders of two transforms disagree on a batch's images ({first:?} and {other:?})")]
    Views { first: Vec<usize>, other: Vec<usize> },
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("cannot decode image: {0}")]
    Decode(#[from] DecodeError),
    #[error("{}: neither a model file, a run directory (with {}), a run group (directories of runs) nor a bundle of `rtrain publish` (with runs/)", path.display(), crate::run_dir::WEIGHTS_FILE)]
    NotAModel { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// The model files `--checkpoint` arguments name, in order: a file is itself; a run directory
/// its final weights; a bundle of `rtrain publish` (it has `runs/`) and a run group (a
/// directory of run directories) the final weights of each of their runs, in name order.
pub fn model_files(arguments: &[PathBuf]) -> Result<Vec<PathBuf>, InferenceError> {
    let mut files = Vec::new();
    for argument in arguments {
        if !argument.is_dir() {
            files.push(argument.clone());
            continue;
        }
        let weights = RunPaths::new(argument).weights();
        if weights.is_file() {
            files.push(weights);
            continue;
        }
        let group = match argument.join("runs").is_dir() {
            true => argument.join("runs"),
            false => argument.clone(),
        };
        let io = |source| InferenceError::Io { path: group.clone(), source };
        let mut runs: Vec<PathBuf> = std::fs::read_dir(&group)
            .map_err(io)?
            .map(|entry| entry.map(|e| RunPaths::new(e.path()).weights()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io)?;
        runs.retain(|weights| weights.is_file());
        runs.sort();
        if runs.is_empty() {
            return Err(InferenceError::NotAModel { path: argument.clone() });
        }
        files.extend(runs);
    }
    Ok(files)
}

/// Test-time augmentation (`--tta`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Tta {
    /// Each image once.
    #[default]
    None,
    /// The image and its horizontal mirror, probabilities averaged.
    Flip,
}

impl Tta {
    /// Forward passes per image and member.
    pub fn views(self) -> usize {
        match self {
            Tta::None => 1,
            Tta::Flip => 2,
        }
    }
}

/// One model of an ensemble, ready to classify.
pub struct Member {
    pub path: PathBuf,
    pub sha256: String,
    pub model: Model,
    pub meta: WeightsMeta,
    /// The configuration with the model's preprocessing in place (see [`preprocessing::resolve`]).
    pub config: Config,
    pub transform: Transform,
}

impl Member {
    /// Loads the model file at `path` onto `compute`'s device, with its preprocessing resolved
    /// against `config` (the keys in `explicit` win).
    pub fn load(
        path: &Path,
        config: &Config,
        explicit: &BTreeSet<String>,
        compute: &Compute,
    ) -> Result<Member, InferenceError> {
        let (model, meta) = checkpoint::load_model_on(path, compute.device)?;
        compute.prepare_model(&model)?;
        let config = preprocessing::resolve(config, explicit, meta.preprocessing.as_ref(), path);
        // The file may come from elsewhere: its preprocessing is held to the ranges a
        // configuration is (a recorded image size of 10^6 would allocate terabytes).
        config
            .validate()
            .map_err(|source| InferenceError::Preprocessing { path: path.to_path_buf(), source })?;
        if meta.preprocessing.is_none() {
            meta.warn_if_size_differs(path, config.data.image_size);
        }
        let transform = eval_transform_of(&config);
        Ok(Member { path: path.to_path_buf(), sha256: sha256_file(path)?, model, meta, config, transform })
    }

    /// The temperature its probabilities are scaled by (1 for an uncalibrated model).
    pub fn temperature(&self) -> f64 {
        self.meta.calibration.as_ref().map_or(1.0, |c| c.temperature)
    }

    /// The model's logits of a batch (`[B, C]`, f64 on the CPU), before any temperature.
    pub fn logits(&self, images: &Tensor, compute: &Compute) -> Result<Tensor, InferenceError> {
        let logits = tch::no_grad(|| -> Result<Tensor, InferenceError> {
            let images = compute.input(images)?;
            let _autocast = compute.autocast()?;
            Ok(self.model.forward_t(&images, false))
        })?;
        Ok(logits.to_device(tch::Device::Cpu).to_kind(Kind::Double))
    }

    /// `softmax(logits / T)` of a batch and, with `tta`, of its mirror, averaged (`[B, C]` f64).
    pub fn probabilities(
        &self,
        images: &Tensor,
        tta: Tta,
        compute: &Compute,
    ) -> Result<Tensor, InferenceError> {
        self.probabilities_given(&self.logits(images, compute)?, images, tta, compute)
    }

    /// [`Self::probabilities`] of a batch whose `logits` are already computed (only the mirror,
    /// with `tta`, takes a forward pass).
    pub fn probabilities_given(
        &self,
        logits: &Tensor,
        images: &Tensor,
        tta: Tta,
        compute: &Compute,
    ) -> Result<Tensor, InferenceError> {
        let temperature = self.temperature();
        let scaled = |logits: &Tensor| (logits / temperature).softmax(-1, Kind::Double);
        let probabilities = scaled(logits);
        Ok(match tta {
            Tta::None => probabilities,
            Tta::Flip => (probabilities + scaled(&self.logits(&images.f_flip([3])?, compute)?)) / 2.0,
        })
    }
}

/// What the outputs say of a member.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct MemberRecord {
    pub path: PathBuf,
    pub sha256: String,
    pub temperature: f64,
    pub image_size: u32,
}

/// One or more models used as one classifier.
pub struct Ensemble {
    pub members: Vec<Member>,
    pub tta: Tta,
    /// The distinct transforms the members see images through, and which each member uses.
    views: Vec<Transform>,
    view_of: Vec<usize>,
}

impl Ensemble {
    /// Loads the model files at `paths` (see [`Member::load`]); they must name the same classes
    /// in the same order.
    pub fn load(
        paths: &[PathBuf],
        config: &Config,
        explicit: &BTreeSet<String>,
        compute: &Compute,
        tta: Tta,
    ) -> Result<Ensemble, InferenceError> {
        let members = paths
            .iter()
            .map(|path| Member::load(path, config, explicit, compute))
            .collect::<Result<Vec<_>, _>>()?;
        let first = members.first().ok_or(InferenceError::NoModel)?;
        if let Some(other) = members.iter().find(|m| m.meta.classes != first.meta.classes) {
            return Err(InferenceError::Classes {
                path: other.path.clone(),
                found: other.meta.classes.clone(),
                first: first.path.clone(),
                expected: first.meta.classes.clone(),
            });
        }
        let mut views: Vec<Transform> = Vec::new();
        let mut view_of = Vec::new();
        for member in &members {
            let view = match views.iter().position(|t| *t == member.transform) {
                Some(view) => view,
                None => {
                    views.push(member.transform.clone());
                    views.len() - 1
                }
            };
            view_of.push(view);
        }
        let ensemble = Ensemble { members, tta, views, view_of };
        ensemble.warn_of_unused_calibration();
        Ok(ensemble)
    }

    pub fn classes(&self) -> &[String] {
        &self.members[0].meta.classes
    }

    /// The first member: the one whose configuration (batch size, compute) the job runs with.
    pub fn first(&self) -> &Member {
        &self.members[0]
    }

    /// The calibration whose prediction sets and uncertainty threshold apply: a single
    /// model's, used without test-time views. They were fitted on that model's one-view
    /// probabilities; an ensemble's mean or a flip's average is another score, for which
    /// their coverage promise does not hold (each member's temperature still applies).
    pub fn calibration(&self) -> Option<&Calibration> {
        match (self.members.as_slice(), self.tta) {
            ([only], Tta::None) => only.meta.calibration.as_ref(),
            _ => None,
        }
    }

    /// Warns when members carry prediction sets or uncertainty thresholds that
    /// [`Self::calibration`] leaves out.
    fn warn_of_unused_calibration(&self) {
        let Some(member) = self.members.iter().find(|m| m.meta.calibration.is_some()) else { return };
        let why = match self.members.len() {
            1 => "--tta flip averages views it was not fitted on",
            _ => "an ensemble's mean is not the probability any one member was fitted on",
        };
        if self.calibration().is_none() {
            tracing::warn!(
                "{}: its prediction sets and uncertainty threshold are not applied ({why}): no prediction_set, uncertain or abstain; its temperature is",
                member.path.display()
            );
        }
    }

    pub fn records(&self) -> Vec<MemberRecord> {
        self.members
            .iter()
            .map(|m| MemberRecord {
                path: m.path.clone(),
                sha256: m.sha256.clone(),
                temperature: m.temperature(),
                image_size: m.config.data.image_size,
            })
            .collect()
    }

    /// Forward passes per image (members times views), the cost `--tta` and ensembles add.
    pub fn passes(&self) -> usize {
        self.members.len() * self.tta.views()
    }

    /// One loader per distinct transform over the same images and batches, in step.
    pub fn loaders(
        &self,
        dataset: &Arc<dyn Dataset>,
        order: &[usize],
        batches: EpochBatches,
        options: &LoaderOptions,
    ) -> Views {
        let loaders = self
            .views
            .iter()
            .map(|t| Loader::new(dataset.clone(), order.to_vec(), t.clone(), batches, options.clone()))
            .collect();
        Views { loaders }
    }

    /// The distinct transforms the members see images through (see [`Self::probabilities`]).
    pub fn transforms(&self) -> &[Transform] {
        &self.views
    }

    /// The probabilities of a batch of images (`[B, C]` f64 on the CPU): `views[v]` is the
    /// batch seen through transform `v` of [`Self::transforms`].
    pub fn probabilities(&self, views: &[&Tensor], compute: &Compute) -> Result<Tensor, InferenceError> {
        let mut sum: Option<Tensor> = None;
        for (member, &view) in self.members.iter().zip(&self.view_of) {
            let p = member.probabilities(views[view], self.tta, compute)?;
            sum = Some(match sum {
                None => p,
                Some(sum) => sum + p,
            });
        }
        let sum = sum.ok_or(InferenceError::NoModel)?;
        Ok(match self.members.len() {
            1 => sum,
            n => sum / n as f64,
        })
    }
}

impl Ensemble {
    /// The probabilities of one encoded image (a JPEG or PNG file's bytes), decoded through
    /// each transform as evaluation decodes it (draft scale, orientation).
    pub fn classify_encoded(&self, bytes: &[u8], compute: &Compute) -> Result<Vec<f64>, InferenceError> {
        let mut views = Vec::with_capacity(self.views.len());
        for transform in &self.views {
            let size = i64::from(transform.size);
            let mut pixels = vec![0f32; transform.output_len()];
            let mut rng = transforms::sample_rng(0, 0, 0);
            transform_encoded(bytes, transform, &mut rng, &mut pixels)?;
            views.push(Tensor::from_slice(&pixels).view([1, 3, size, size]));
        }
        let probabilities = self.probabilities(&views.iter().collect::<Vec<_>>(), compute)?;
        Ok(Vec::try_from(probabilities.view([-1]))?)
    }
}

/// Loaders of the same images through several transforms, yielding each batch once per
/// transform.
pub struct Views {
    loaders: Vec<Loader>,
}

impl Iterator for Views {
    type Item = Result<Vec<Batch>, InferenceError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut batches = Vec::with_capacity(self.loaders.len());
        for loader in &mut self.loaders {
            match loader.next()? {
                Ok(batch) => batches.push(batch),
                Err(error) => return Some(Err(error.into())),
            }
        }
        if let Some(other) = batches.iter().find(|b| b.indices != batches[0].indices) {
            let error =
                InferenceError::Views { first: batches[0].indices.clone(), other: other.indices.clone() };
            return Some(Err(error));
        }
        Some(Ok(batches))
    }
}

/// The images of each view's batch, as [`Ensemble::probabilities`] takes them.
pub fn images(views: &[Batch]) -> Vec<&Tensor> {
    views.iter().map(|batch| &batch.images).collect()
}

/// Rows of a `[B, C]` f64 tensor.
pub fn rows(probabilities: &Tensor) -> Result<Vec<Vec<f64>>, InferenceError> {
    Ok(Vec::<Vec<f64>>::try_from(&probabilities.contiguous())?)
}
