//! `rtrain explain`: Grad-CAM heatmaps of what a trained model looks at, for image files or a
//! sample of a dataset split, written into a directory: per image the overlay PNG (the photo as
//! the model saw it, under the map), the raw map with the model's input (safetensors: `cam`,
//! `input`), and one `index.csv` listing them with the class explained and the prediction.
//! [`gradcam`] owns the computation and the picture.

pub mod gradcam;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::SeedableRng;
use serde::Serialize;
use tch::Tensor;

use crate::data::dataset::{DataError, Dataset};
use crate::data::decode::DecodeError;
use crate::data::loader::transform_encoded;
use crate::data::shards::ShardError;
use crate::data::transforms;
use crate::inference::{Ensemble, InferenceError};
use crate::model::Model;
use crate::plan::RunPlan;
use crate::predict::inputs::{InputError, Inputs};
use crate::run_dir::checkpoint::CheckpointError;
use crate::util::files::{self, FileError};

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Inputs(#[from] InputError),
    #[error(transparent)]
    Shards(#[from] ShardError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("{image}: cannot decode image: {source}")]
    Decode { image: String, source: DecodeError },
    #[error("{image}: {source}")]
    Inference { image: String, source: Box<InferenceError> },
    #[error("{image}: Grad-CAM failed: {source}")]
    Torch { image: String, source: tch::TchError },
    #[error("--class {class}: not a class of the checkpoint (its classes: {})", classes.join(", "))]
    UnknownClass { class: String, classes: Vec<String> },
    #[error("--layer {0}: expected layer1, layer2, layer3 or layer4 (torchvision's stage names)")]
    UnknownLayer(String),
    #[error("{}: cannot create the output directory: {source}", path.display())]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Write(#[from] FileError),
    #[error("{}: {source}", path.display())]
    Csv { path: PathBuf, source: csv::Error },
}

/// Which images to explain.
pub enum Images {
    /// Image files, directories (searched recursively) and shard sets, as `predict --out` takes.
    Inputs(Vec<PathBuf>),
    /// A seeded sample of `count` images of a split (`root` a data root or shard set).
    Sample { root: PathBuf, split: String, count: usize, seed: u64 },
}

pub struct Request {
    pub images: Images,
    pub out: PathBuf,
    /// `layer1`-`layer4`.
    pub layer: String,
    /// A class name or index; None explains each image's predicted class.
    pub class: Option<String>,
}

/// One explained image, as `index.csv` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Explained {
    pub image: String,
    /// The true class, when the image comes from a split.
    pub true_class: Option<String>,
    pub predicted: String,
    pub predicted_probability: f32,
    /// The class the map explains.
    pub explained: String,
    pub explained_probability: f32,
    pub layer: String,
    /// The overlay PNG and the safetensors file with `cam` and `input`, in the output directory.
    pub overlay: String,
    pub map: String,
}

/// Explains the requested images into `request.out`; returns what `index.csv` lists. The
/// predicted class and the probabilities are `ensemble`'s (with its temperatures and
/// test-time flips); the map is its first model's Grad-CAM of that class, through that
/// model's preprocessing.
pub fn explain(
    ensemble: &Ensemble,
    plan: &RunPlan,
    request: &Request,
) -> Result<Vec<Explained>, ExplainError> {
    let stage = parse_layer(&request.layer)?;
    let classes = ensemble.classes();
    let class = request.class.as_deref().map(|c| parse_class(c, classes)).transpose()?;
    let (dataset, indices): (Arc<dyn Dataset>, Vec<usize>) = match &request.images {
        Images::Inputs(paths) => {
            let inputs = Inputs::gather(paths, &[])?;
            let all = (0..inputs.len()).collect();
            (Arc::new(inputs), all)
        }
        Images::Sample { root, split, count, seed } => {
            let dataset = crate::data::open_split(root, split, plan.class_order())?;
            let indices = sample(dataset.len(), *count, *seed);
            (dataset, indices)
        }
    };
    std::fs::create_dir_all(&request.out)
        .map_err(|source| ExplainError::CreateDir { path: request.out.clone(), source })?;
    let first = ensemble.first();
    let mut explainer = Explainer::new(&first.model, first.transform.clone(), stage);
    let mut explained = Vec::with_capacity(indices.len());
    for (position, &index) in indices.iter().enumerate() {
        let image = dataset.describe(index);
        let bytes = dataset.encoded(index)?;
        let probabilities: Vec<f32> = ensemble
            .classify_encoded(&bytes, &plan.compute)
            .map_err(|source| ExplainError::Inference { image: image.clone(), source: Box::new(source) })?
            .into_iter()
            .map(|p| p as f32)
            .collect();
        let predicted = crate::metrics::argmax(&probabilities);
        let One { cam, overlay, input } =
            explainer.explain(dataset.as_ref(), index, Some(class.unwrap_or(predicted)))?;

        let stem = output_stem(position, &image);
        let (overlay_name, map_name) = (format!("{stem}.png"), format!("{stem}.safetensors"));
        files::write_png(&request.out.join(&overlay_name), &overlay)?;
        let row = Explained {
            image,
            // Inputs have no classes of their own, so this is None for them.
            true_class: dataset.label(index).and_then(|label| dataset.classes().get(label).cloned()),
            predicted: classes[predicted].clone(),
            predicted_probability: probabilities[predicted],
            explained: classes[cam.class].clone(),
            explained_probability: probabilities[cam.class],
            layer: request.layer.clone(),
            overlay: overlay_name,
            map: map_name.clone(),
        };
        let metadata = [
            ("image".to_string(), row.image.clone()),
            ("class".to_string(), row.explained.clone()),
            ("class_index".to_string(), cam.class.to_string()),
            ("layer".to_string(), row.layer.clone()),
        ];
        files::write_safetensors(
            &request.out.join(&map_name),
            &[("cam".into(), cam.map), ("input".into(), input.squeeze_dim(0))],
            Some(metadata.into_iter().collect()),
        )?;
        explained.push(row);
    }
    let index = request.out.join("index.csv");
    let csv =
        files::csv_of(&explained).map_err(|source| ExplainError::Csv { path: index.clone(), source })?;
    files::write_atomic(&index, &csv)?;
    Ok(explained)
}

/// One image explained: the map, its overlay on the image as the model saw it, and the input.
pub struct One {
    pub cam: gradcam::GradCam,
    pub overlay: image::RgbImage,
    pub input: Tensor,
}

/// Grad-CAM of one model at one stage, image after image, with the plan's evaluation transform.
pub struct Explainer<'m> {
    model: &'m Model,
    transform: transforms::Transform,
    stage: usize,
    pixels: Vec<f32>,
}

impl<'m> Explainer<'m> {
    pub fn new(model: &'m Model, transform: transforms::Transform, stage: usize) -> Explainer<'m> {
        let pixels = vec![0f32; transform.output_len()];
        Explainer { model, transform, stage, pixels }
    }

    /// Explains `class` (default: the predicted one) for the image at `index` of `dataset`.
    pub fn explain(
        &mut self,
        dataset: &dyn Dataset,
        index: usize,
        class: Option<usize>,
    ) -> Result<One, ExplainError> {
        let image = dataset.describe(index);
        let bytes = dataset.encoded(index)?;
        let mut rng = transforms::sample_rng(0, 0, 0);
        transform_encoded(&bytes, &self.transform, &mut rng, &mut self.pixels)
            .map_err(|source| ExplainError::Decode { image: image.clone(), source })?;
        let torch_err = |source| ExplainError::Torch { image: image.clone(), source };
        let size = i64::from(self.transform.size);
        let input = Tensor::from_slice(&self.pixels).view([1, 3, size, size]);
        let cam = gradcam::grad_cam(self.model, &input, self.stage, class).map_err(torch_err)?;
        let overlay = gradcam::overlay(&self.pixels, self.transform.size, self.transform.normalize, &cam.map)
            .map_err(torch_err)?;
        Ok(One { cam, overlay, input })
    }
}

/// `layer1`-`layer4` as the stage number Grad-CAM reads.
fn parse_layer(layer: &str) -> Result<usize, ExplainError> {
    match layer {
        "layer1" => Ok(1),
        "layer2" => Ok(2),
        "layer3" => Ok(3),
        "layer4" => Ok(4),
        _ => Err(ExplainError::UnknownLayer(layer.to_string())),
    }
}

/// A class by name, or by index when no class has that name.
fn parse_class(class: &str, classes: &[String]) -> Result<usize, ExplainError> {
    classes
        .iter()
        .position(|name| name == class)
        .or_else(|| class.parse::<usize>().ok().filter(|&i| i < classes.len()))
        .ok_or_else(|| ExplainError::UnknownClass { class: class.to_string(), classes: classes.to_vec() })
}

/// `count` distinct indices of `0..len` drawn with a ChaCha8 stream seeded with `seed`, in
/// increasing order (the whole split when it holds no more).
fn sample(len: usize, count: usize, seed: u64) -> Vec<usize> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut indices = rand::seq::index::sample(&mut rng, len, count.min(len)).into_vec();
    indices.sort_unstable();
    indices
}

/// The output files' name for the image at `position`: its number, then its file name's stem
/// reduced to characters safe in any file system (`0003-IMG_0042`).
fn output_stem(position: usize, image: &str) -> String {
    let stem = Path::new(image).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let safe: String = stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' })
        .take(64)
        .collect();
    format!("{position:04}-{safe}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_named_or_numbered() {
        let classes = vec!["C0".to_string(), "C2".to_string(), "C4".to_string()];
        assert_eq!(parse_class("C2", &classes).unwrap(), 1);
        assert_eq!(parse_class("2", &classes).unwrap(), 2);
        assert!(parse_class("3", &classes).is_err());
        assert!(parse_class("C3", &classes).unwrap_err().to_string().contains("C0, C2, C4"));
    }

    #[test]
    fn a_sample_is_seeded_distinct_and_sorted() {
        let a = sample(100, 10, 7);
        assert_eq!(a, sample(100, 10, 7));
        assert_ne!(a, sample(100, 10, 8));
        assert!(a.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(sample(3, 10, 7), vec![0, 1, 2]);
    }

    #[test]
    fn output_names_are_numbered_and_safe() {
        assert_eq!(output_stem(3, "campaign/house 1/IMG_0042.JPG"), "0003-IMG_0042");
        assert_eq!(output_stem(12, "shards/val/a$b:c"), "0012-a_b_c");
    }
}
