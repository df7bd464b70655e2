//! What a trained model expects of its input, carried in its own files: the evaluation
//! transform it was trained with (input size, resize and crop, normalisation, decoding), as
//! torchvision's `weights.transforms()` and timm's `pretrained_cfg` carry theirs. Checkpoints
//! and weights files record a [`Preprocessing`] in their metadata (under the tensors' digest),
//! and `predict`, `eval`, `explain` and `calibrate` apply it by default: a model trained at 32
//! px classifies at 32 px whatever `data.image_size` the configuration holds. A key the user
//! set explicitly (a file, `RTRAIN_DATA__*` or `--set`) wins, with a warning naming both values.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::{Config, EvalGeometry};
use crate::data::transforms::{IMAGENET_MEAN, IMAGENET_STD};

/// The evaluation transform of a model, as its files record it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preprocessing {
    /// The side of the square the network sees (`data.image_size`).
    pub image_size: u32,
    /// `resize_center_crop` (`Resize(resize)` + `CenterCrop(image_size)`) or `resize`
    /// (`Resize((image_size, image_size))`) (`data.eval_transform`).
    pub eval_transform: EvalGeometry,
    /// The shorter side before the centre crop, resolved (`data.eval_resize`, 0 made explicit).
    pub resize: u32,
    /// torchvision's default, the only one rtrain resamples with; recorded for outside tools.
    pub interpolation: String,
    /// `Normalize(mean, std)` after `ToTensor` (`data.normalize`); mean 0 and std 1 when off.
    pub normalize: bool,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// JPEGs decoded at a DCT scale (`data.jpeg_draft`), and photos turned upright by their
    /// Exif orientation (`data.exif_orientation`).
    pub jpeg_draft: bool,
    pub exif_orientation: bool,
}

/// The configuration keys a [`Preprocessing`] sets.
pub const KEYS: [&str; 6] = [
    "data.image_size",
    "data.eval_transform",
    "data.eval_resize",
    "data.normalize",
    "data.jpeg_draft",
    "data.exif_orientation",
];

impl Preprocessing {
    /// The evaluation transform `config` describes.
    pub fn of_config(config: &Config) -> Preprocessing {
        let d = &config.data;
        Preprocessing {
            image_size: d.image_size,
            eval_transform: d.eval_transform,
            resize: config.eval_resize(),
            interpolation: "bilinear".to_string(),
            normalize: d.normalize,
            mean: if d.normalize { IMAGENET_MEAN } else { [0.0; 3] },
            std: if d.normalize { IMAGENET_STD } else { [1.0; 3] },
            jpeg_draft: d.jpeg_draft,
            exif_orientation: d.exif_orientation,
        }
    }

    /// Each key's value as the configuration would write it, in [`KEYS`]' order.
    fn values(&self) -> [String; 6] {
        let geometry = match self.eval_transform {
            EvalGeometry::ResizeCenterCrop => "resize_center_crop",
            EvalGeometry::Resize => "resize",
        };
        [
            self.image_size.to_string(),
            geometry.to_string(),
            self.resize.to_string(),
            self.normalize.to_string(),
            self.jpeg_draft.to_string(),
            self.exif_orientation.to_string(),
        ]
    }
}

/// The configuration to use the model at `path` with: `config` with the model's preprocessing
/// (`recorded`) in place of its `data.*` keys, but for those in `explicit` (set by the user),
/// which are kept with a warning naming both values when they differ. A file from before rtrain
/// recorded preprocessing (`recorded` None) keeps the configuration's, with a note.
pub fn resolve(
    config: &Config,
    explicit: &BTreeSet<String>,
    recorded: Option<&Preprocessing>,
    path: &Path,
) -> Config {
    let Some(model) = recorded else {
        tracing::info!(
            "{}: the file does not record its preprocessing (written before rtrain 0.2): using the configuration's data.image_size = {} and evaluation transform",
            path.display(),
            config.data.image_size
        );
        return config.clone();
    };
    let mut resolved = config.clone();
    let configured = Preprocessing::of_config(config).values();
    for ((key, ours), theirs) in KEYS.iter().zip(&configured).zip(model.values()) {
        if explicit.contains(*key) && *ours != theirs {
            tracing::warn!(
                "{}: {key} = {ours} as set, although the model was trained with {key} = {theirs}",
                path.display()
            );
        }
    }
    let keep = |key: &str| explicit.contains(key);
    let d = &mut resolved.data;
    if !keep("data.image_size") {
        d.image_size = model.image_size;
    }
    if !keep("data.eval_transform") {
        d.eval_transform = model.eval_transform;
    }
    if !keep("data.eval_resize") {
        // The model's resize belongs to its crop: a crop set anew gets its own default.
        d.eval_resize = if d.image_size == model.image_size { model.resize } else { 0 };
    }
    if !keep("data.normalize") {
        d.normalize = model.normalize;
    }
    if !keep("data.jpeg_draft") {
        d.jpeg_draft = model.jpeg_draft;
    }
    if !keep("data.exif_orientation") {
        d.exif_orientation = model.exif_orientation;
    }
    resolved
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trained_at(size: u32) -> Preprocessing {
        let mut config = Config::default();
        config.data.image_size = size;
        config.data.normalize = false;
        Preprocessing::of_config(&config)
    }

    #[test]
    fn the_models_preprocessing_replaces_the_configurations_unless_set() {
        let config = Config::default();
        let model = trained_at(32);
        assert_eq!(model.resize, 37);
        let none = BTreeSet::new();
        let resolved = resolve(&config, &none, Some(&model), Path::new("m.safetensors"));
        assert_eq!(Preprocessing::of_config(&resolved), model);
        let set = BTreeSet::from(["data.image_size".to_string()]);
        let mut asked = config.clone();
        asked.data.image_size = 48;
        let resolved = resolve(&asked, &set, Some(&model), Path::new("m.safetensors"));
        assert_eq!(resolved.data.image_size, 48);
        // The crop set anew gets its own resize; the rest is the model's.
        assert_eq!(resolved.eval_resize(), 55);
        assert!(!resolved.data.normalize);
        let old = resolve(&config, &none, None, Path::new("m.safetensors"));
        assert_eq!(old.data.image_size, config.data.image_size);
    }
}
