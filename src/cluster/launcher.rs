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
    /// A variable that must be set too for rank and size to mean a launch: Slurm sets
    /// `SLURM_PROCID` and `SLURM_NTASKS` in a batch script as well, where only one process
    /// runs; `SLURM_STEP_ID` only in a job step (`srun`).
    step: Option<&'static str>,
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
        step: None,
        local_rank: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    LauncherVars {
        name: "MPICH / Intel MPI (mpiexec)",
        rank: "PMI_RANK",
        size: Some("PMI_SIZE"),
        step: None,
        local_rank: Some("MPI_LOCALRANKID"),
        local_size: Some("MPI_LOCALNRANKS"),
    },
    LauncherVars {
        name: "MVAPICH2",
        rank: "MV2_COMM_WORLD_RANK",
        size: Some("MV2_COMM_WORLD_SIZE"),
        step: None,
        local_rank: Some("MV2_COMM_WORLD_LOCAL_RANK"),
        local_size: None,
    },
    LauncherVars {
        name: "Slurm (srun)",
        rank: "SLURM_PROCID",
        size: Some("SLURM_NTASKS"),
        step: Some("SLURM_STEP_ID"),
        local_rank: Some("SLURM_LOCALID"),
        local_size: None,
    },
    LauncherVars {
        name: "PMIx",
        rank: "PMIX_RANK",
        size: None,
        step: None,
        local_rank: None,
        local_size: None,
    },
    LauncherVars {
        name: "torchrun",
        rank: "RANK",
        size: Some("WORLD_SIZE"),
        step: None,
        local_rank: Some("LOCAL_RANK"),
        local_size: Some("LOCAL_WORLD_SIZE"),
    },
];

/// Each launcher's variables as the entrypoint lists them, `RANK[/SIZE[/STEP]]`: a process is
/// launched when every variable of one entry is set.
pub fn launch_variables() -> Vec<String> {
    LAUNCHERS
        .iter()
        .map(|vars| {
            [Some(vars.rank), vars.size, vars.step].into_iter().flatten().collect::<Vec<_>>().join("/")
        })
        .collect()
}

/// A warning for a process that no launcher started although it runs in a Slurm batch script
/// of several tasks (`SLURM_NTASKS` > 1 without `SLURM_STEP_ID`): the script ran rtrain without
/// `srun`, so one process trains where the job asked for more.
pub fn unlaunched_in_slurm_batch(env: impl Fn(&str) -> Option<String>) -> Option<String> {
    let tasks: usize = env("SLURM_NTASKS")?.trim().parse().ok()?;
    let job = env("SLURM_JOB_ID")?;
    if tasks <= 1 || env("SLURM_STEP_ID").is_some() {
        return None;
    }
    Some(format!(
        "Slurm job {job} has {tasks} tasks, but this process was started by its batch script (or salloc shell), not by srun: \
         training as one process; start the ranks with `srun rtrain train ...` (or `srun --mpi=pmix ...`)"
    ))
}

/// Reads the first launcher whose rank and size variables are both set (its rank variable, for
/// one without a size variable); `None` when nothing launched this process as part of a group.
pub fn detect(env: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>, LaunchError> {
    for vars in LAUNCHERS {
        let launcher = vars.name;
        // An empty variable is an unset one (as the entrypoint's `[ -n ]` reads it).
        let env = |name: &str| env(name).filter(|value| !value.is_empty());
        let Some(rank_value) = env(vars.rank) else { continue };
        if vars.step.is_some_and(|step| env(step).is_none()) {
            continue;
        }
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

    /// What Slurm 22.05 (Debian 12's) set, recorded with `env` on this machine's single-node
    /// Slurm (`sbatch -n 2`; trimmed to the variables launchers are read from).
    const BATCH_SCRIPT: &[(&str, &str)] = &[
        ("SLURM_JOB_ID", "1"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_NODEID", "0"),
        ("SLURM_NPROCS", "2"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_PROCID", "0"),
        ("SLURM_TASKS_PER_NODE", "2"),
    ];
    /// The second task of `srun --mpi=pmix` inside that batch script.
    const SRUN_STEP: &[(&str, &str)] = &[
        ("PMIX_RANK", "1"),
        ("SLURM_JOB_ID", "1"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "0"),
        ("SLURM_NPROCS", "2"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_PROCID", "1"),
        ("SLURM_STEPID", "0"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_STEP_NUM_TASKS", "2"),
    ];
    /// A command under `salloc -n 2`, outside any step.
    const SALLOC: &[(&str, &str)] =
        &[("SLURM_JOB_ID", "2"), ("SLURM_NPROCS", "2"), ("SLURM_NTASKS", "2"), ("SLURM_TASKS_PER_NODE", "2")];
    /// Rank 1 of `mpirun -np 2` inside that allocation (Open MPI starts its daemons through Slurm).
    const MPIRUN_IN_ALLOCATION: &[(&str, &str)] = &[
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("PMIX_RANK", "1"),
        ("SLURM_JOB_ID", "2"),
        ("SLURM_NPROCS", "2"),
        ("SLURM_NTASKS", "2"),
    ];

    #[test]
    fn launched_or_not_as_slurm_really_sets_it() {
        assert_eq!(detect(env(BATCH_SCRIPT)).unwrap(), None, "a batch script is one process");
        let warning = unlaunched_in_slurm_batch(env(BATCH_SCRIPT)).unwrap();
        assert!(warning.contains("job 1 has 2 tasks") && warning.contains("srun"), "{warning}");
        let step = detect(env(SRUN_STEP)).unwrap().unwrap();
        assert_eq!(
            (step.launcher, step.rank, step.world_size, step.local_rank),
            ("Slurm (srun)", 1, Some(2), Some(1))
        );
        assert_eq!(unlaunched_in_slurm_batch(env(SRUN_STEP)), None);
        assert_eq!(detect(env(SALLOC)).unwrap(), None);
        let mpirun = detect(env(MPIRUN_IN_ALLOCATION)).unwrap().unwrap();
        assert_eq!((mpirun.launcher, mpirun.rank, mpirun.world_size), ("OpenMPI (mpirun)", 1, Some(2)));
        let one_task = [("SLURM_JOB_ID", "3"), ("SLURM_NTASKS", "1"), ("SLURM_PROCID", "0")];
        assert_eq!(unlaunched_in_slurm_batch(env(&one_task)), None, "a one-task job is one process anyway");
    }

    #[test]
    fn slurm_and_torchrun() {
        let slurm = detect(env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_ID", "0"),
        ]))
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
