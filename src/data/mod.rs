//! Image data: the built-in synthetic damage-level set, IDX import, class-per-folder trees,
//! augmentation and the batch loader that feeds training.

pub mod atomic_dir;
pub mod folder;
pub mod idx;
pub mod loader;
pub mod synth;
pub mod transforms;
