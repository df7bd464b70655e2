//! Reports over finished runs, for people: `rtrain report RUN_DIR...` (per-run tables, plots
//! and CSV, several runs side by side, seed statistics over runs that differ only in the seed)
//! and `rtrain report --scaling RUN_DIR...` (how training scales with the number of ranks).

pub mod evaluation;
pub mod gallery;
pub mod projection;
pub mod runs;
pub mod scaling;
pub mod seeds;
pub mod trust;
