//! Shared pieces with no training knowledge: atomic files, directories and safetensors, the
//! HTTP downloader and archive extraction (used by `model` for weights and by `ingest` for
//! datasets), the filesystem error they share, memory readings, logging set-up, the median.

pub mod atomic_dir;
pub mod extract;
pub mod fetch;
pub mod files;
pub mod io_error;
pub mod logging;
pub mod memory;
pub mod seeds;
pub mod shim;
pub mod stats;
