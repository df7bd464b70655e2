//! Which launcher started this process, and what it says about rank and world size, read from
//! the environment variables each one sets.
//!
//! When MPI is initialised its communicator is the truth; these variables decide whether to
//! initialise it at all, and let a process that was launched as one of many, but cannot join
//! them (no MPI in this build), fail with a clear error instead of training alone.
//!
//! The container's `entrypoint` decides "launched or not" from the same list
//! ([`launch_variables`]; tests/entrypoint.rs holds the two to each other).

/// A launcher's claims about this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    /// Which launcher's variables these are, e.g. "OpenMPI (mpirun)".
    pub launcher: &'static str,
    pub rank: usize,
    /// None where the launcher names no size (PMIx alone): MPI tells it once initialised.
    pub world_size: Option<usize>,
    pub local_rank: Option<usize>,
    pub local_world_size: Option<usize>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("environment variable {variable}={value:?} (set by {launcher}): expected a non-negative integer")]
pub struct LaunchError {
    pub variable: &'static str,
    pub value: String,
    pub launcher: &'static str,
}

/// The variables one launcher sets.
struct LauncherVars {
    name: &'static str,
    rank: &'static str,
    size: Option<&'static str>,
    local_rank: Option<&'static str>,
    local_size: Option<&'static str>,
}

/// Tried in this order: MPI implementations before Slurm (an `srun`-started MPI rank has both,
/// and they agree), PMIx's rank alone after them (any PMIx launcher: prterun, `srun
/// --mpi=pmix`, ...), and torchrun's generic names last.
const LAUNCHERS: &[LauncherVars] = &[
    LauncherVars {
        name: "OpenMPI (mpirun)",
        rank: "OMPI_COMM_WORLD_RANK",
        size: Some("OMPI_COMM_WORLD_SIZE"),
        local_rank: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    LauncherVars {
        name: "MPICH / Intel MPI (mpiexec)",
        rank: "PMI_RANK",
        size: Some("PMI_SIZE"),
        local_rank: Some("MPI_LOCALRANKID"),
        local_size: Some("MPI_LOCALNRANKS"),
    },
    LauncherVars {
        name: "MVAPICH2",
        rank: "MV2_COMM_WORLD_RANK",
        size: Some("MV2_COMM_WORLD_SIZE"),
        local_rank: Some("MV2_COMM_WORLD_LOCAL_RANK"),
        local_size: None,
    },
    LauncherVars {
        name: "Slurm (srun)",
        rank: "SLURM_PROCID",
        size: Some("SLURM_NTASKS"),
        local_rank: Some("SLURM_LOCALID"),
        local_size: None,
    },
    LauncherVars { name: "PMIx", rank: "PMIX_RANK", size: None, local_rank: None, local_size: None },
    LauncherVars {
        name: "torchrun",
        rank: "RANK",
        size: Some("WORLD_SIZE"),
        local_rank: Some("LOCAL_RANK"),
        local_size: Some("LOCAL_WORLD_SIZE"),
    },
];

/// Each launcher's rank variable and, where it has one, its size variable: a process is
/// launched when both of one pair are set (the rank alone, for a launcher without a size).
pub fn launch_variables() -> Vec<(&'static str, Option<&'static str>)> {
    LAUNCHERS.iter().map(|vars| (vars.rank, vars.size)).collect()
}

/// Reads the first launcher whose rank and size variables are both set (its rank variable, for
/// one without a size variable); `None` when nothing launched this process as part of a group.
pub fn detect(env: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>, LaunchError> {
    for vars in LAUNCHERS {
        let launcher = vars.name;
        // An empty variable is an unset one (as the entrypoint's `[ -n ]` reads it).
        let env = |name: &str| env(name).filter(|value| !value.is_empty());
        let Some(rank_value) = env(vars.rank) else { continue };
        let size_value = match vars.size {
            Some(size) => match env(size) {
                Some(value) => Some((size, value)),
                None => continue,
            },
            None => None,
        };
        let parse = |variable: &'static str, value: String| {
            value.trim().parse::<usize>().map_err(|_| LaunchError { variable, value, launcher })
        };
        let optional = |variable: Option<&'static str>| -> Result<Option<usize>, LaunchError> {
            match variable.and_then(|v| env(v).map(|value| (v, value))) {
                Some((v, value)) => parse(v, value).map(Some),
                None => Ok(None),
            }
        };
        return Ok(Some(LaunchInfo {
            launcher,
            rank: parse(vars.rank, rank_value)?,
            world_size: size_value.map(|(variable, value)| parse(variable, value)).transpose()?,
            local_rank: optional(vars.local_rank)?,
            local_world_size: optional(vars.local_size)?,
        }));
    }
    Ok(None)
}

/// [`detect`] over this process's environment.
pub fn detect_from_process() -> Result<Option<LaunchInfo>, LaunchError> {
    detect(|name| std::env::var(name).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn nothing_set_means_no_launcher() {
        assert_eq!(detect(env(&[])).unwrap(), None);
        assert_eq!(detect(env(&[("SLURM_PROCID", "0")])).unwrap(), None, "rank without size is not a group");
    }

    #[test]
    fn openmpi_wins_over_slurm_and_reads_local_ranks() {
        let info = detect(env(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(info.launcher, "OpenMPI (mpirun)");
        assert_eq!(
            (info.rank, info.world_size, info.local_rank, info.local_world_size),
            (3, Some(4), Some(1), Some(2))
        );
    }

    #[test]
    fn slurm_and_torchrun() {
        let slurm = detect(env(&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "1")]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (slurm.launcher, slurm.rank, slurm.world_size, slurm.local_rank),
            ("Slurm (srun)", 5, Some(8), Some(1))
        );
        let pmix = detect(env(&[("PMIX_RANK", "3")])).unwrap().unwrap();
        assert_eq!((pmix.launcher, pmix.rank, pmix.world_size), ("PMIx", 3, None), "MPI will tell the size");
        let torchrun = detect(env(&[("RANK", "1"), ("WORLD_SIZE", "2")])).unwrap().unwrap();
        assert_eq!((torchrun.launcher, torchrun.rank, torchrun.local_rank), ("torchrun", 1, None));
    }

    #[test]
    fn malformed_values_name_the_variable() {
        let err = detect(env(&[("PMI_RANK", "x1"), ("PMI_SIZE", "2")])).unwrap_err();
        assert_eq!(err.variable, "PMI_RANK");
        assert!(err.to_string().contains("PMI_RANK=\"x1\"") && err.to_string().contains("MPICH"), "{err}");
    }
}
