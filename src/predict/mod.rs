//! `rtrain predict`: classifying image files with a trained model, through the same decoder
//! and evaluation transform that training and evaluation use, so that a prediction sees the
//! pixels they see. This module prints a few files' predictions (`predict IMG...`);
//! [`campaign`] classifies a whole campaign's photos into a directory as a job, from the
//! inputs [`inputs`] gathers, writing what [`outputs`] formats.

pub mod campaign;
pub mod inputs;
pub mod outputs;

use std::path::{Path, PathBuf};

use serde::Serialize;
use tch::{Kind, Tensor};

use crate::config::Config;
use crate::data::decode::{DecodeError, MAX_IMAGE_FILE_BYTES};
use crate::data::loader::transform_encoded;
use crate::data::transforms::{self, Transform};
use crate::model::precision::Compute;
use crate::model::Model;
use crate::plan::RunPlan;
use crate::run_dir::checkpoint::{self, CheckpointError};
use crate::util::files::read_regular;
use crate::util::shim::ShimError;

#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    #[error("{}: cannot read image: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: cannot decode image: {source}", path.display())]
    Decode { path: PathBuf, source: DecodeError },
    #[error("{}: {source}", path.display())]
    Torch { path: PathBuf, source: tch::TchError },
    #[error(transparent)]
    Shim(#[from] ShimError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// One image's most likely classes, best first.
#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    pub image: PathBuf,
    pub class: String,
    pub top: Vec<ClassProbability>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClassProbability {
    pub class: String,
    pub probability: f32,
}

/// The model with what it needs to classify images.
pub struct Classifier<'a> {
    pub model: &'a Model,
    pub classes: &'a [String],
    pub compute: &'a Compute,
    pub transform: Transform,
    pub image_size: u32,
}

impl Classifier<'_> {
    /// The `top` most likely classes of the image file at `path`.
    pub fn classify(&self, path: &Path, top: usize) -> Result<Prediction, PredictError> {
        let bytes = read_regular(path, MAX_IMAGE_FILE_BYTES)
            .map_err(|source| PredictError::Read { path: path.to_path_buf(), source })?;
        let size = i64::from(self.image_size);
        let mut pixels = vec![0f32; 3 * (size * size) as usize];
        let mut rng = transforms::sample_rng(0, 0, 0);
        // As evaluation decodes it (draft scale, orientation), so a prediction agrees with it.
        transform_encoded(&bytes, &self.transform, &mut rng, &mut pixels)
            .map_err(|source| PredictError::Decode { path: path.to_path_buf(), source })?;
        let input = self.compute.input(&Tensor::from_slice(&pixels).view([1, 3, size, size]))?;
        let probabilities = tch::no_grad(|| -> Result<Tensor, ShimError> {
            let _autocast = self.compute.autocast()?;
            Ok(self.model.forward_t(&input, false).softmax(-1, Kind::Float))
        })?;
        let probabilities: Vec<f32> = Vec::try_from(probabilities.view([-1]))
            .map_err(|source| PredictError::Torch { path: path.to_path_buf(), source })?;
        let mut ranked: Vec<(usize, f32)> = probabilities.iter().copied().enumerate().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        ranked.truncate(top.max(1));
        let top: Vec<ClassProbability> = ranked
            .iter()
            .map(|&(i, probability)| ClassProbability { class: self.classes[i].clone(), probability })
            .collect();
        Ok(Prediction { image: path.to_path_buf(), class: top[0].class.clone(), top })
    }
}

/// `rtrain predict`: the `top` most likely classes of each image file, with the checkpoint at
/// `checkpoint`, in one process on the CPU.
pub fn predict_files(
    config: &Config,
    checkpoint: &Path,
    images: &[PathBuf],
    top: usize,
) -> Result<Vec<Prediction>, PredictError> {
    let plan = RunPlan::for_inference(config);
    let (model, meta) = checkpoint::load_model(checkpoint)?;
    meta.warn_if_size_differs(checkpoint, config.data.image_size);
    plan.compute.prepare_model(&model)?;
    let classifier = Classifier {
        model: &model,
        classes: &meta.classes,
        compute: &plan.compute,
        transform: plan.eval_transform(),
        image_size: config.data.image_size,
    };
    images.iter().map(|path| classifier.classify(path, top)).collect()
}
