//! Small shared pieces with no training knowledge: atomic files and safetensors, memory
//! readings, logging set-up.

pub mod files;
pub mod logging;
pub mod memory;
pub mod seeds;
pub mod shim;
