//! Image data: class-per-folder trees and WebDataset shards behind one [`dataset::Dataset`]
//! trait, the sampler that splits each epoch among ranks, JPEG/PNG decoding, augmentation and the
//! batch loader that feeds training. Getting data in (the built-in synthetic set, IDX import,
//! downloads, archive extraction) is [`ingest`]'s.

pub mod autoaugment;
pub mod dataset;
pub mod decode;
pub mod encode;
pub mod folder;
pub mod ingest;
pub mod loader;
pub mod orientation;
pub mod photo;
pub mod sampler;
pub mod shards;
pub mod transforms;

use std::path::Path;
use std::sync::Arc;

use dataset::Dataset;
use folder::ImageFolder;
use shards::{ShardError, ShardSet};

/// Opens `split` of the dataset at `root`: WebDataset shards when `root` holds rtrain's
/// shard manifest, else the image tree `root/<split>/<class>/...`.
pub fn open_split(root: &Path, split: &str) -> Result<Arc<dyn Dataset>, ShardError> {
    if shards::is_shard_dir(root) {
        Ok(Arc::new(ShardSet::open(root, split)?))
    } else {
        Ok(Arc::new(ImageFolder::open(&root.join(split))?))
    }
}
