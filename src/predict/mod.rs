//! `rtrain predict`: classifying image files with a trained model, through the same decoder
//! and evaluation transform that training and evaluation use, so that a prediction sees the
//! pixels they see. This module prints a few files' predictions (`predict IMG...`);
//! [`campaign`] classifies a whole campaign's photos into a directory as a job, from the
//! inputs [`inputs`] gathers, writing what [`outputs`] formats; with building footprints,
//! [`footprints`] reads them, [`assign`] gives each photo its building, [`buildings`] fuses
//! each building's photos and [`map`] draws the result.

pub mod assign;
pub mod buildings;
pub mod campaign;
pub mod footprints;
pub mod inputs;
pub mod map;
pub mod outputs;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::data::decode::{DecodeError, MAX_IMAGE_FILE_BYTES};
use crate::inference::{Ensemble, InferenceError};
use crate::model::precision::Compute;
use crate::util::files::read_regular;

#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    #[error("{}: cannot read image: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: cannot decode image: {source}", path.display())]
    Decode { path: PathBuf, source: DecodeError },
    #[error(transparent)]
    Inference(#[from] InferenceError),
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

/// The `top` most likely classes of the image file at `path`, by `ensemble`.
fn classify(
    ensemble: &Ensemble,
    compute: &Compute,
    path: &Path,
    top: usize,
) -> Result<Prediction, PredictError> {
    let bytes = read_regular(path, MAX_IMAGE_FILE_BYTES)
        .map_err(|source| PredictError::Read { path: path.to_path_buf(), source })?;
    let probabilities = ensemble.classify_encoded(&bytes, compute).map_err(|error| match error {
        InferenceError::Decode(source) => PredictError::Decode { path: path.to_path_buf(), source },
        other => PredictError::Inference(other),
    })?;
    let mut ranked: Vec<(usize, f64)> = probabilities.iter().copied().enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked.truncate(top.max(1));
    let classes = ensemble.classes();
    let top: Vec<ClassProbability> = ranked
        .iter()
        .map(|&(i, probability)| ClassProbability {
            class: classes[i].clone(),
            probability: probability as f32,
        })
        .collect();
    Ok(Prediction { image: path.to_path_buf(), class: top[0].class.clone(), top })
}

/// `rtrain predict`: the `top` most likely classes of each image file, by `ensemble`, in one
/// process.
pub fn predict_files(
    ensemble: &Ensemble,
    compute: &Compute,
    images: &[PathBuf],
    top: usize,
) -> Result<Vec<Prediction>, PredictError> {
    images.iter().map(|path| classify(ensemble, compute, path, top)).collect()
}
