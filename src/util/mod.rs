//! Small shared pieces with no training knowledge: atomic files and safetensors, memory
//! readings, logging set-up.

pub mod logging;
pub mod memory;
pub mod shim;
pub mod tensor_io;
