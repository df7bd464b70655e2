//! Image data: the built-in synthetic damage-level set, IDX import, class-per-folder trees,
//! WebDataset shards (prepare, verify, stage, index), downloads and archive extraction,
//! augmentation and the batch loader that feeds training.

pub mod atomic_dir;
pub mod dataset;
pub mod decode;
pub mod extract;
pub mod fetch;
pub mod folder;
pub mod idx;
pub mod loader;
pub mod shards;
pub mod synth;
pub mod transforms;
