//! What the loader reads: a split of labelled images, from a class-per-folder tree
//! ([`ImageFolder`]) or from WebDataset shards ([`ShardSet`]), behind one trait so training,
//! evaluation, hashing and benchmarks do not care which.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use image::RgbImage;

use super::decode::decode;
use super::folder::{DataError, ImageFolder};
use super::shards::{ShardError, ShardSet, MANIFEST};

/// A split of labelled images with random access by index.
pub trait Dataset: Send + Sync {
    /// The directory the split was opened from (for messages).
    fn root(&self) -> &Path;
    /// Class names; a label indexes this.
    fn classes(&self) -> &[String];
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The label of sample `index`, or None when out of range.
    fn label(&self, index: usize) -> Option<usize>;
    /// The stored bytes of sample `index` (a JPEG or PNG file).
    fn encoded(&self, index: usize) -> Result<Cow<'_, [u8]>, DataError>;
    /// Decodes sample `index` to RGB8.
    fn load(&self, index: usize) -> Result<RgbImage, DataError> {
        let bytes = self.encoded(index)?;
        decode(&bytes)
            .map_err(|source| DataError::Decode { path: PathBuf::from(self.describe(index)), source })
    }
    /// Where sample `index` lives, for messages: a file path, or `shard.tar:key`.
    fn describe(&self, index: usize) -> String;
    /// The files the split is read from (images or shards), in a fixed order, for hashing.
    fn files(&self) -> Vec<PathBuf>;
}

/// Opens `split` of the dataset at `root`: WebDataset shards when `root` holds rtrain's
/// shard `manifest.json`, else the image tree `root/<split>/<class>/...`.
pub fn open_split(root: &Path, split: &str) -> Result<Arc<dyn Dataset>, ShardError> {
    if root.join(MANIFEST).is_file() {
        Ok(Arc::new(ShardSet::open(root, split)?))
    } else {
        Ok(Arc::new(ImageFolder::open(&root.join(split))?))
    }
}

impl Dataset for ImageFolder {
    fn root(&self) -> &Path {
        &self.root
    }

    fn classes(&self) -> &[String] {
        &self.classes
    }

    fn len(&self) -> usize {
        self.samples.len()
    }

    fn label(&self, index: usize) -> Option<usize> {
        self.samples.get(index).map(|s| s.1)
    }

    fn encoded(&self, index: usize) -> Result<Cow<'_, [u8]>, DataError> {
        ImageFolder::encoded(self, index).map(Cow::Owned)
    }

    fn load(&self, index: usize) -> Result<RgbImage, DataError> {
        ImageFolder::load(self, index)
    }

    fn describe(&self, index: usize) -> String {
        self.samples.get(index).map_or_else(|| format!("#{index}"), |s| s.0.display().to_string())
    }

    fn files(&self) -> Vec<PathBuf> {
        self.samples.iter().map(|s| s.0.clone()).collect()
    }
}
