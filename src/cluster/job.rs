//! This process's part of a job: joining it (MPI, or alone), checking that every rank runs the
//! same configuration, ending the whole job when this rank fails, and the set-up every rank
//! takes part in before training — the built-in default data generated once per node, and
//! shard sets staged to node-local disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Result};

use super::{Communicator, Topology};
use crate::config::{Config, ConfigError};
use crate::data::shards::{self, Staging};

/// Refuses a job whose ranks resolved different configurations or run different rtrain
/// versions (an MPMD launch, an RTRAIN_* variable set on one node only), naming the first rank
/// that differs from rank 0 and the settings. A collective: one small gather when they agree.
pub fn agree_on_config(comm: &dyn Communicator, config: &Config) -> Result<(), ConfigError> {
    let topology = comm.topology();
    if topology.world_size == 1 {
        return Ok(());
    }
    let version = env!("CARGO_PKG_VERSION");
    let fingerprints = super::gather_strings(comm, &format!("{version} {}", config.hash()?));
    let Some(rank) = fingerprints.iter().position(|f| *f != fingerprints[0]) else { return Ok(()) };
    // Every rank gathered the same table, so every rank is here: learn rank 0's and that rank's
    // settings to say what differs.
    let toml = config.to_toml()?;
    let (root, theirs) =
        (super::broadcast_string(comm, &toml, 0), super::broadcast_string(comm, &toml, rank));
    let hosts = super::gather_strings(comm, &topology.host);
    let mut differences = crate::config::differences(&root, &theirs);
    let versions = |f: &str| f.split(' ').next().unwrap_or_default().to_string();
    if versions(&fingerprints[rank]) != versions(&fingerprints[0]) {
        differences.insert(
            0,
            format!("rtrain {} (rank 0: {})", versions(&fingerprints[rank]), versions(&fingerprints[0])),
        );
    }
    Err(ConfigError::RanksDiffer { rank, host: hosts[rank].clone(), differences: differences.join(", ") })
}

/// Runs `body` as this process's part of the job (MPI, or alone). The configuration chooses
/// the all-reduce algorithm, which must be set before MPI starts; a bad configuration is
/// reported after that, so that any rank's error, bad configuration included, ends the whole
/// job, with the status `exit_code` (the command line's policy) gives the error.
pub fn run_in_job(
    loaded: Result<Config>,
    exit_code: fn(&anyhow::Error) -> u8,
    body: impl FnOnce(&Config, Arc<dyn Communicator>) -> Result<()>,
) -> Result<()> {
    let algorithm = loaded.as_ref().map(|config| config.dist.allreduce).unwrap_or_default();
    let comm = super::init(algorithm)?;
    let topology = comm.topology().clone();
    super::signals::joined(topology.world_size);
    if topology.world_size > 1 {
        tracing::info!("data-parallel job: {topology}");
    }
    let result = loaded.and_then(|config| {
        agree_on_config(comm.as_ref(), &config)?;
        body(&config, comm.clone())
    });
    // A preempted run is not a failure of one rank: every rank stops at the same step.
    let preempted = result.as_ref().is_err_and(super::signals::is_clean_stop);
    if let (Err(error), true, false) = (&result, topology.world_size > 1, preempted) {
        // Returning would leave the other ranks blocked in their next collective (and MPI's
        // finalisation): end the whole job, naming this rank.
        let described = crate::util::logging::describe_error(error);
        tracing::error!("rank {} on {} failed: {described}; aborting the job", topology.rank, topology.host);
        comm.abort(i32::from(exit_code(error)));
    }
    result
}

/// Rank 0's path on every rank, e.g. the run directory (a time-stamped default name could
/// differ between ranks by a second). A collective.
pub fn broadcast_path(comm: &dyn Communicator, path: &Path) -> PathBuf {
    PathBuf::from(super::broadcast_string(comm, &path.to_string_lossy(), 0))
}

/// When the plan stages the data (`RunPlan::staging`, from `data.stage_dir`), the first rank of each node copies the
/// shard set to its node-local copy (skipping shards already there with the right hash,
/// verifying each copy) while the node's other ranks wait; training then reads the copy
/// (`RunPlan::data_root()`), and the run records `data.root` as given. The outcome is summed
/// over all ranks, so a failed copy on any node fails every rank (naming the node and file on
/// the rank that failed) instead of leaving them waiting. A collective.
pub fn stage_data(staging: Option<&Staging>, comm: &dyn Communicator) -> Result<()> {
    let Some(Staging { from, to }) = staging else { return Ok(()) };
    if !shards::is_shard_dir(from) {
        bail!(
            "data.stage_dir is set, but data.root {} is not a shard directory (no {}); make one with `rtrain data prepare`",
            from.display(),
            shards::SHARDS_JSON
        );
    }
    let topology = comm.topology();
    let mut outcome = Ok(());
    if topology.local_rank == 0 {
        outcome = stage_on_this_node(from, to, topology);
    }
    let mut failed = [f64::from(u8::from(outcome.is_err()))];
    comm.all_reduce_sum_f64(&mut failed);
    outcome?;
    if failed[0] > 0.0 {
        bail!("staging data to {} failed on {} node(s); their ranks name the file", to.display(), failed[0]);
    }
    Ok(())
}

fn stage_on_this_node(root: &Path, dest: &Path, topology: &Topology) -> Result<()> {
    let started = std::time::Instant::now();
    match shards::stage(root, dest) {
        Ok(report) => {
            tracing::info!(
                "staged {} to {} on {}: {} shard(s) copied ({:.1} MiB), {} already there, {:.1}s",
                root.display(),
                dest.display(),
                topology.host,
                report.copied,
                report.bytes_copied as f64 / f64::from(1u32 << 20),
                report.skipped,
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Err(error) => {
            Err(anyhow::anyhow!("staging data on node {} ({}): {error}", topology.node, topology.host))
        }
    }
}

/// Set-up that each node needs once and that does nothing where it is done already (the
/// built-in default data): rank 0 does it first; then the first rank of any node that still
/// lacks it (no shared file system) does. A collective.
pub fn once_per_node(comm: &dyn Communicator, set_up: impl Fn() -> Result<()>) -> Result<()> {
    let topology = comm.topology();
    if topology.is_root() {
        set_up()?;
    }
    comm.barrier();
    if topology.local_rank == 0 && !topology.is_root() {
        set_up()?;
    }
    comm.barrier();
    Ok(())
}
