//! rtrain: data-parallel ResNet training on libtorch, packaged as a containerised appliance.
//!
//! The binary (`src/main.rs`) only parses the command line and dispatches here; each module
//! owns one concern and returns its own error type.

pub mod bench;
pub mod calibrate;
pub mod calibration;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod data;
pub mod doctor;
pub mod explain;
pub mod inference;
pub mod ingest;
pub mod metrics;
pub mod model;
pub mod plan;
pub mod plot;
pub mod predict;
pub mod publish;
pub mod report;
pub mod run_dir;
pub mod trace;
pub mod train;
pub mod util;
