//! The integration tests, as one binary (ripgrep's `tests/tests.rs`): each file of `tests/` is a
//! module here, so that libtorch is linked once rather than once per file, and the fixtures of
//! `common` (a trained tiny model, a synthetic tree) are made once for every test that shares
//! them. A test's name is `FILE::name`: `cargo test --release --test tests -- FILE::` runs one
//! file. The tiers (Cargo.toml's features) gate whole modules here and single tests in the files.
//!
//! `tests/explain.rs` stays a binary of its own: it seeds libtorch's generator, which is one per
//! process, and relies on no other test drawing from it (see Cargo.toml).

mod common;

#[cfg(feature = "test-reference")]
mod autoaugment_reference;
#[cfg(feature = "test-reference")]
mod container_files;
#[cfg(feature = "test-docker")]
mod container_image;
mod data_shards;
#[cfg(all(feature = "test-mpi", feature = "test-reference"))]
mod distributed;
mod docs;
mod doctor_cli;
mod entrypoint;
#[cfg(feature = "test-reference")]
mod eval_metrics;
#[cfg(feature = "test-reference")]
mod gpu_scripts;
mod hostile_input;
mod module_graph;
#[cfg(feature = "test-mpi")]
mod nccl_faults;
#[cfg(feature = "test-reference")]
mod optim_reference;
#[cfg(feature = "test-reference")]
mod per_building;
#[cfg(all(feature = "test-reference", feature = "test-mpi"))]
mod predict_campaign;
mod preemption;
#[cfg(feature = "test-reference")]
mod preprocessing_reference;
#[cfg(feature = "test-reference")]
mod publish;
mod reproducibility;
#[cfg(feature = "test-reference")]
mod seed_stats;
#[cfg(feature = "test-slurm")]
mod slurm;
#[cfg(all(feature = "test-mpi", feature = "test-reference"))]
mod step_phases;
#[cfg(feature = "test-reference")]
mod tensorboard;
#[cfg(feature = "test-reference")]
mod torchvision_export;
mod train_cli;
#[cfg(feature = "test-reference")]
mod training_choices;
#[cfg(feature = "test-reference")]
mod trust;
#[cfg(all(feature = "test-reference", feature = "test-mpi"))]
mod tutorial;
mod untrusted_input;
#[cfg(feature = "test-reference")]
mod weights;
#[cfg(feature = "test-reference")]
mod zip_archives;
