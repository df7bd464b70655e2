//! rtrain: data-parallel ResNet training on libtorch, packaged as a containerised appliance.
//!
//! The binary (`src/main.rs`) only parses the command line and dispatches here; each module
//! owns one concern and returns its own error type.

pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod data;
pub mod device;
pub mod dist;
pub mod doctor;
pub mod eval;
pub mod flops;
pub mod launcher;
pub mod logging;
pub mod manifest;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod precision;
pub mod report;
pub mod reproduce;
pub mod resnet;
pub mod sampler;
pub mod tensor_io;
pub mod train;
