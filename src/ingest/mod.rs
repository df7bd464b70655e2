//! The offline `rtrain data` tools that make datasets, apart from the training input path
//! (`crate::data`): the built-in synthetic damage-level set, IDX import (Fashion-MNIST), the
//! camera and phone photo kinds of the case-study layout, and the writer of WebDataset shard
//! sets that `crate::data::shards` reads. Downloads, archive extraction and the atomic
//! publication of a directory are generic I/O, in `crate::util`.
//!
//! Only the command line (`crate::cli`) calls in here; `tests/module_graph.rs` keeps it so.

pub mod idx;
pub mod photos;
pub mod pool;
pub mod shard_writer;
pub mod synth;
