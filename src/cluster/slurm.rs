//! The Slurm job this process runs in, as Slurm's own variables describe it (recorded under
//! Debian 12's Slurm 22.05: a batch script has the job's variables, an `srun` task the step's
//! too): the job and array task, the step, the nodes, the tasks and GPUs on this node, how often
//! the job was requeued. `rtrain doctor` reports it and flags tasks that outnumber their GPUs.

use serde::Serialize;

use super::runtime::Probe;

/// A Slurm job, seen from one of its processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlurmJob {
    /// `SLURM_JOB_ID`; inside a job array, each task has its own.
    pub job_id: String,
    /// `SLURM_ARRAY_JOB_ID`_`SLURM_ARRAY_TASK_ID` inside a job array.
    pub array_task: Option<String>,
    /// `SLURM_STEP_ID`: set only in a job step (`srun`), never in the batch script.
    pub step: Option<String>,
    /// `SLURM_JOB_NODELIST`, in Slurm's compressed form (`node[01-04]`).
    pub nodelist: Option<String>,
    pub nodes: Option<usize>,
    /// The step's tasks in a step, the job's otherwise.
    pub tasks: Option<usize>,
    /// This node's share of them (`SLURM_STEP_TASKS_PER_NODE` or `SLURM_TASKS_PER_NODE`, at
    /// `SLURM_NODEID`).
    pub tasks_on_this_node: Option<usize>,
    /// `SLURM_GPUS_ON_NODE`: the GPUs the job was given on this node (unset: none asked for).
    pub gpus_on_this_node: Option<usize>,
    /// `SLURM_GPUS_PER_TASK`, as given (`1`, `a100:1`).
    pub gpus_per_task: Option<String>,
    /// `SLURM_RESTART_COUNT`: how often the job was requeued.
    pub restarts: u32,
}

impl SlurmJob {
    /// The job, when `SLURM_JOB_ID` says there is one.
    pub fn detect(probe: &Probe) -> Option<SlurmJob> {
        let number = |name: &str| probe.var(name).and_then(|v| v.trim().parse::<usize>().ok());
        let job_id = probe.var("SLURM_JOB_ID")?.to_string();
        let in_step = probe.var("SLURM_STEP_ID").is_some();
        let (tasks, tasks_per_node) = if in_step {
            (number("SLURM_STEP_NUM_TASKS"), probe.var("SLURM_STEP_TASKS_PER_NODE"))
        } else {
            (number("SLURM_NTASKS"), probe.var("SLURM_TASKS_PER_NODE"))
        };
        let node_index = number("SLURM_NODEID").unwrap_or(0);
        Some(SlurmJob {
            job_id,
            array_task: probe
                .var("SLURM_ARRAY_JOB_ID")
                .zip(probe.var("SLURM_ARRAY_TASK_ID"))
                .map(|(array, task)| format!("{array}_{task}")),
            step: probe.var("SLURM_STEP_ID").map(str::to_string),
            nodelist: probe.var("SLURM_JOB_NODELIST").map(str::to_string),
            nodes: number("SLURM_JOB_NUM_NODES").or_else(|| number("SLURM_NNODES")),
            tasks,
            tasks_on_this_node: tasks_per_node
                .and_then(expand_tasks_per_node)
                .and_then(|per_node| per_node.get(node_index).copied()),
            gpus_on_this_node: number("SLURM_GPUS_ON_NODE"),
            gpus_per_task: probe.var("SLURM_GPUS_PER_TASK").map(str::to_string),
            restarts: probe.var("SLURM_RESTART_COUNT").and_then(|v| v.trim().parse().ok()).unwrap_or(0),
        })
    }

    /// Tasks on this node beyond its GPUs, when the job was given GPUs here: each task takes a
    /// GPU of its own, so the surplus has none (or two share one).
    pub fn tasks_without_a_gpu(&self) -> Option<(usize, usize)> {
        let (tasks, gpus) = (self.tasks_on_this_node?, self.gpus_on_this_node?);
        (gpus > 0 && tasks > gpus).then_some((tasks, gpus))
    }
}

/// Slurm's tasks-per-node form, `2(x3),1`, as one count per node: `[2, 2, 2, 1]`.
pub fn expand_tasks_per_node(spec: &str) -> Option<Vec<usize>> {
    let mut counts = Vec::new();
    for part in spec.split(',') {
        let (count, repeat) = match part.split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (part, 1),
        };
        let count = count.trim().parse::<usize>().ok()?;
        counts.extend(std::iter::repeat_n(count, repeat));
    }
    Some(counts)
}

impl std::fmt::Display for SlurmJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let or_dash = |value: Option<String>| value.unwrap_or_else(|| "-".to_string());
        write!(f, "job {}", self.job_id)?;
        if let Some(task) = &self.array_task {
            write!(f, " (array task {task})")?;
        }
        match &self.step {
            Some(step) => write!(f, ", step {step}")?,
            None => f.write_str(", no step (batch script or allocation)")?,
        }
        write!(
            f,
            "; {} node(s) {}; {} task(s), {} on this node; GPUs on this node {}, per task {}; requeued {} time(s)",
            or_dash(self.nodes.map(|n| n.to_string())),
            or_dash(self.nodelist.clone()),
            or_dash(self.tasks.map(|n| n.to_string())),
            or_dash(self.tasks_on_this_node.map(|n| n.to_string())),
            or_dash(self.gpus_on_this_node.map(|n| n.to_string())),
            or_dash(self.gpus_per_task.clone()),
            self.restarts
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(vars: &[(&str, &str)]) -> Probe {
        Probe::simulated("/nonexistent", vars)
    }

    #[test]
    fn tasks_per_node_expand_as_slurm_writes_them() {
        assert_eq!(expand_tasks_per_node("2(x3),1"), Some(vec![2, 2, 2, 1]));
        assert_eq!(expand_tasks_per_node("4"), Some(vec![4]));
        assert_eq!(expand_tasks_per_node("2(x"), None);
        assert_eq!(expand_tasks_per_node("a"), None);
    }

    /// Rank 5 of `srun` in `sbatch -N 2 --ntasks-per-node=4 --gpus-per-node=2 --array=3`.
    #[test]
    fn a_step_on_the_second_node_with_fewer_gpus_than_tasks() {
        let job = SlurmJob::detect(&probe(&[
            ("SLURM_JOB_ID", "42"),
            ("SLURM_ARRAY_JOB_ID", "40"),
            ("SLURM_ARRAY_TASK_ID", "3"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_JOB_NODELIST", "gpu[01-02]"),
            ("SLURM_JOB_NUM_NODES", "2"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_STEP_NUM_TASKS", "6"),
            ("SLURM_TASKS_PER_NODE", "4(x2)"),
            ("SLURM_STEP_TASKS_PER_NODE", "4,2"),
            ("SLURM_NODEID", "1"),
            ("SLURM_GPUS_ON_NODE", "1"),
            ("SLURM_RESTART_COUNT", "2"),
        ]))
        .unwrap();
        assert_eq!((job.tasks, job.tasks_on_this_node, job.restarts), (Some(6), Some(2), 2));
        assert_eq!(job.array_task.as_deref(), Some("40_3"));
        assert_eq!(job.tasks_without_a_gpu(), Some((2, 1)));
        let text = job.to_string();
        assert!(
            text.contains(
                "job 42 (array task 40_3), step 0; 2 node(s) gpu[01-02]; 6 task(s), 2 on this node"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_batch_script_counts_the_jobs_tasks_and_no_gpus_means_no_flag() {
        let job = SlurmJob::detect(&probe(&[
            ("SLURM_JOB_ID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_TASKS_PER_NODE", "2"),
            ("SLURM_NODEID", "0"),
        ]))
        .unwrap();
        assert_eq!((job.step.as_deref(), job.tasks, job.tasks_on_this_node), (None, Some(2), Some(2)));
        assert_eq!(job.tasks_without_a_gpu(), None, "no GPUs asked for: nothing to outnumber");
        assert!(SlurmJob::detect(&probe(&[("SLURM_NTASKS", "2")])).is_none(), "no job id, no job");
    }
}
