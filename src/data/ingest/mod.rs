//! Getting data in: the built-in synthetic damage-level set, IDX import (Fashion-MNIST),
//! downloads with resume and checksums, safe archive extraction, and the atomic publication of
//! a directory that all of them write through.

pub mod atomic_dir;
pub mod extract;
pub mod fetch;
pub mod idx;
pub mod photos;
pub mod synth;
