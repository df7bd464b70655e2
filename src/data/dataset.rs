//! What the loader reads: a split of labelled images, from a class-per-folder tree
//! ([`ImageFolder`]) or from WebDataset shards ([`ShardSet`]), behind one trait so training,
//! evaluation, hashing and benchmarks do not care which.

use std::borrow::Cow;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use image::RgbImage;

use super::decode::{decode, DecodeError};

/// Everything that can go wrong while reading, decoding or batching image data. Each message
/// names the file or directory involved so a user can find the offending input.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The dataset root does not exist.
    #[error("image folder {} does not exist", path.display())]
    Missing {
        /// The path that was looked for.
        path: PathBuf,
    },
    /// The dataset root exists but is not a directory.
    #[error("image folder {} is not a directory", path.display())]
    NotADirectory {
        /// The offending path.
        path: PathBuf,
    },
    /// Listing a directory or opening a file failed.
    #[error("reading {}: {source}", path.display())]
    Io {
        /// The directory or file being read.
        path: PathBuf,
        /// The underlying failure.
        source: io::Error,
    },
    /// A class folder whose name is not UTF-8: class names are text in checkpoints, reports and
    /// predictions, where two such names would be one.
    #[error(
        "{}: a class folder whose name is not UTF-8: rename it (class names are stored as text)",
        crate::util::files::path_text(path)
    )]
    ClassNameNotUtf8 {
        /// The class folder.
        path: PathBuf,
    },
    /// The root has no subdirectories, so there are no classes.
    #[error("image folder {} has no class subdirectories", path.display())]
    NoClasses {
        /// The dataset root.
        path: PathBuf,
    },
    /// A class directory holds no `.jpg`/`.jpeg`/`.png` file; torchvision refuses this too,
    /// because the class would silently never be seen in training.
    #[error("class directory {} contains no .jpg, .jpeg or .png images", path.display())]
    EmptyClass {
        /// The class directory.
        path: PathBuf,
    },
    /// A file with an image's extension that is not a regular file (symlinks followed): a
    /// FIFO would block training, a link to /dev/zero would be read for ever.
    #[error("{} is {what}, not a regular file: only regular files are images", path.display())]
    NotARegularFile {
        /// The file.
        path: PathBuf,
        /// What it is instead ("a FIFO", "a character device", ...).
        what: &'static str,
    },
    /// A file could not be decoded as an image.
    #[error("decoding image {}: {source}", path.display())]
    Decode {
        /// The file that failed to decode.
        path: PathBuf,
        /// The decoder's complaint.
        source: DecodeError,
    },
    /// A sample index beyond the end of the dataset (a sampler bug, or an order built for a
    /// different tree).
    #[error("sample index {index} is out of range for image folder {} with {len} samples", root.display())]
    IndexOutOfRange {
        /// The requested index.
        index: usize,
        /// The number of samples in the dataset.
        len: usize,
        /// The dataset root.
        root: PathBuf,
    },
    /// Loader options that cannot produce batches.
    #[error("invalid loader options for image folder {}: {reason}", root.display())]
    InvalidOptions {
        /// The dataset root.
        root: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// libtorch refused to build a batch tensor.
    #[error("building a batch tensor for image folder {}: {source}", root.display())]
    Tensor {
        /// The dataset root.
        root: PathBuf,
        /// The libtorch error.
        source: tch::TchError,
    },
    /// A loader worker thread died (panicked) without reporting an error.
    #[error(
        "{}: data.class_order {order:?} is not an order of the classes found there, {found:?}",
        root.display()
    )]
    ClassOrder { root: PathBuf, order: Vec<String>, found: Vec<String> },
    #[error("loader worker {worker} for image folder {} stopped unexpectedly", root.display())]
    WorkerLost {
        /// The worker's number.
        worker: usize,
        /// The dataset root.
        root: PathBuf,
    },
}

/// Every sample's label, in sample order.
pub fn labels(dataset: &dyn Dataset) -> Vec<usize> {
    (0..dataset.len()).filter_map(|index| dataset.label(index)).collect()
}

/// How many samples each class has, in class order.
pub fn class_counts(dataset: &dyn Dataset) -> Vec<u64> {
    let mut counts = vec![0u64; dataset.classes().len()];
    for label in labels(dataset) {
        if let Some(count) = counts.get_mut(label) {
            *count += 1;
        }
    }
    counts
}

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
    /// The sha256 that `file` (one of [`Self::files`]) was recorded with when the split was
    /// made (a shard's, in its manifest), for the run to compare with what it reads now.
    fn recorded_sha256(&self, file: &Path) -> Option<&str> {
        let _ = file;
        None
    }
}

/// A dataset with its classes in another order (`data.class_order`): the same samples, each
/// label mapped to its class's place in the order.
pub struct Reordered {
    inner: Arc<dyn Dataset>,
    classes: Vec<String>,
    /// `new_label[inner label]`.
    new_label: Vec<usize>,
}

impl Reordered {
    /// `inner` with its classes in `order`, which must name each of them exactly once.
    pub fn new(inner: Arc<dyn Dataset>, order: &[String]) -> Result<Reordered, DataError> {
        let found = inner.classes();
        let new_label: Option<Vec<usize>> =
            found.iter().map(|class| order.iter().position(|o| o == class)).collect();
        match new_label {
            Some(new_label) if order.len() == found.len() => {
                Ok(Reordered { classes: order.to_vec(), new_label, inner })
            }
            _ => Err(DataError::ClassOrder {
                root: inner.root().to_path_buf(),
                order: order.to_vec(),
                found: found.to_vec(),
            }),
        }
    }
}

impl Dataset for Reordered {
    fn root(&self) -> &Path {
        self.inner.root()
    }
    fn classes(&self) -> &[String] {
        &self.classes
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn label(&self, index: usize) -> Option<usize> {
        self.inner.label(index).map(|label| self.new_label[label])
    }
    fn encoded(&self, index: usize) -> Result<Cow<'_, [u8]>, DataError> {
        self.inner.encoded(index)
    }
    fn load(&self, index: usize) -> Result<RgbImage, DataError> {
        self.inner.load(index)
    }
    fn describe(&self, index: usize) -> String {
        self.inner.describe(index)
    }
    fn files(&self) -> Vec<PathBuf> {
        self.inner.files()
    }
    fn recorded_sha256(&self, file: &Path) -> Option<&str> {
        self.inner.recorded_sha256(file)
    }
}
