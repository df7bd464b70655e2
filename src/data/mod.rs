//! Image data: class-per-folder trees and WebDataset shards behind one [`dataset::Dataset`]
//! trait, the sampler that splits each epoch among ranks, JPEG/PNG decoding, augmentation and the
//! batch loader that feeds training. Making datasets (the built-in synthetic set, IDX import,
//! writing shards) is `crate::ingest`'s, which this module never calls; downloads and archive
//! extraction are `crate::util`'s.

pub mod autoaugment;
pub mod dataset;
pub mod decode;
pub mod encode;
pub mod folder;
pub mod loader;
pub mod orientation;
pub mod photo;
pub mod sampler;
pub mod shards;
pub mod transforms;

use std::path::Path;
use std::sync::Arc;

use dataset::{Dataset, Reordered};
use folder::ImageFolder;
use shards::{ShardError, ShardSet};

/// Opens `split` of the dataset at `root`: WebDataset shards when `root` holds rtrain's
/// shard manifest, else the image tree `root/<split>/<class>/...`; its classes in
/// `class_order` when that is given (`data.class_order`), else as the dataset sorts them.
pub fn open_split(root: &Path, split: &str, class_order: &[String]) -> Result<Arc<dyn Dataset>, ShardError> {
    let dataset: Arc<dyn Dataset> = if shards::is_shard_dir(root) {
        Arc::new(ShardSet::open(root, split)?)
    } else {
        Arc::new(ImageFolder::open(&root.join(split))?)
    };
    if class_order.is_empty() || class_order == dataset.classes() {
        return Ok(dataset);
    }
    Ok(Arc::new(Reordered::new(dataset, class_order)?))
}
