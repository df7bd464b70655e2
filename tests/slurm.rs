//! The Slurm tier (`--features test-slurm`): the README's job scripts, taken out of the README
//! and submitted as written (only sizes, time limits, the configuration and paths substituted)
//! to a real Slurm that each test starts and stops with `scripts/slurm` (Debian 12's slurmctld
//! and slurmd 22.05, a munged of its own, one node with this machine's name). Slurm itself
//! signals the jobs (`--signal`, time limits, `scancel`), requeues them and records how they
//! ended (`sacct -c`, from the job-completion log).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A Slurm of the test's own, in a directory of its own on ports of its own; stopped (jobs
/// cancelled, daemons ended, directory removed) however the test ends.
struct Slurm {
    dir: PathBuf,
}

/// Job scripts written by this process, for their file names.
static SCRIPTS: AtomicU16 = AtomicU16::new(0);

/// Each cluster of this process takes the next two ports.
static NEXT_PORT: AtomicU16 = AtomicU16::new(17300);

impl Slurm {
    fn up(dir: &Path, cpus: u32) -> Slurm {
        let port = NEXT_PORT.fetch_add(2, Ordering::SeqCst);
        let dir = dir.join("slurm");
        let output = Command::new(common::repo().join("scripts/slurm"))
            .arg("up")
            .arg(&dir)
            .args(["--cpus", &cpus.to_string(), "--port", &port.to_string()])
            .output()
            .expect("start scripts/slurm");
        let slurm = Slurm { dir };
        common::assert_success(output, "scripts/slurm up (root, and scripts/setup --test)");
        slurm
    }

    /// A Slurm command (or any command that talks to it) for this cluster, with the rtrain
    /// under test first on the PATH and no Slurm variables of an enclosing job.
    fn command(&self, program: &str) -> Command {
        // `scripts/slurm exec` runs it here with SLURM_CONF set, or on a container cluster's
        // first node.
        let mut command = Command::new(common::repo().join("scripts/slurm"));
        command.arg("exec").arg(&self.dir).arg(program);
        for (name, _) in std::env::vars() {
            if name.starts_with("SLURM_") {
                command.env_remove(name);
            }
        }
        let bin = Path::new(env!("CARGO_BIN_EXE_rtrain")).parent().unwrap().to_path_buf();
        let path = std::env::join_paths(
            std::iter::once(bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
        )
        .unwrap();
        command.env("PATH", path).env_remove("RUST_LOG");
        command
    }

    /// Submits `script` from `workdir` (its output goes to `slurm-<job>.out` there, as
    /// sbatch's default) with `env` added to the job's environment; returns the job id.
    fn sbatch(&self, script: &str, workdir: &Path, env: &[(&str, &str)]) -> String {
        let file = workdir.join(format!("job-{}.sh", SCRIPTS.fetch_add(1, Ordering::SeqCst)));
        std::fs::write(&file, script).unwrap();
        // Through env(1), so that the variables reach sbatch on a container node as well.
        let mut command = self.command("env");
        command.args(env.iter().map(|(name, value)| format!("{name}={value}")));
        command.arg("sbatch").arg("--parsable").arg(&file).current_dir(workdir);
        let output = common::assert_success(command.output().unwrap(), &format!("sbatch of\n{script}"));
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// The README's plain `srun --mpi=pmix -n 2 rtrain train` line, run from `workdir` into
    /// `run` (no batch script, no signal); returns its summary.
    fn srun_train(&self, workdir: &Path, config: &Path, run: &str) -> Value {
        let mut command = self.command("timeout");
        command.args(["600", "srun", "--mpi=pmix", "-n", "2", "rtrain", "train", "--config"]);
        command.arg(config).args(["--run-dir", run]).current_dir(workdir);
        common::assert_success(command.output().unwrap(), &format!("srun -n 2 rtrain train --run-dir {run}"));
        summary(&workdir.join(run))
    }

    /// The job's (or array's) states as squeue shows them, every state included.
    fn states(&self, job: &str) -> Vec<String> {
        let output =
            self.command("squeue").args(["-h", "-t", "all", "-j", job, "-o", "%T"]).output().unwrap();
        String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).collect()
    }

    /// Waits until every task of the job has ended; returns what the job-completion log says
    /// of each of its runs (a requeued job ends more than once), as (state, exit code).
    fn wait_for_end(&self, job: &str, limit: Duration) -> Vec<(String, String)> {
        let started = Instant::now();
        loop {
            let states = self.states(job);
            if !states.is_empty() && states.iter().all(|state| FINAL_STATES.contains(&state.as_str())) {
                break;
            }
            assert!(
                started.elapsed() < limit,
                "job {job} still {states:?} after {limit:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        self.ended_runs(job)
    }

    /// Every run of the job that ended, from `sacct -c` (the job-completion log).
    fn ended_runs(&self, job: &str) -> Vec<(String, String)> {
        let output =
            self.command("sacct").args(["-c", "-n", "-P", "-o", "JobID,State,ExitCode"]).output().unwrap();
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split('|').collect();
                (fields.len() == 3 && fields[0] == job)
                    .then(|| (fields[1].to_string(), fields[2].to_string()))
            })
            .collect()
    }

    /// Waits until `condition` holds, failing with the cluster's logs after `limit`.
    fn wait_until(&self, what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
        let started = Instant::now();
        while !condition() {
            assert!(started.elapsed() < limit, "{what}: not within {limit:?}\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The daemons' logs, for a failure's message.
    fn logs(&self) -> String {
        let mut logs = String::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir.join("log"))
            .map(|entries| entries.map(|entry| entry.unwrap().path()).collect())
            .unwrap_or_default();
        files.retain(|file| file.extension().is_some_and(|ext| ext == "log"));
        files.sort();
        for file in files {
            let name = file.file_name().unwrap().to_string_lossy().to_string();
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            logs.push_str(&format!("--- {name} (last lines)\n"));
            for line in tail.into_iter().rev() {
                logs.push_str(line);
                logs.push('\n');
            }
        }
        logs
    }
}

impl Slurm {
    /// `nodes` nodes as containers of `image` (with Slurm's daemons added), `share` mounted at
    /// its own path in each.
    #[cfg(feature = "test-docker")]
    fn up_containers(dir: &Path, nodes: usize, image: &str, share: &Path) -> Slurm {
        let dir = dir.join("slurm");
        let output = Command::new(common::repo().join("scripts/slurm"))
            .arg("up")
            .arg(&dir)
            .args(["--containers", &nodes.to_string(), "--image", image, "--cpus", "2", "--share"])
            .arg(share)
            .output()
            .expect("start scripts/slurm");
        let slurm = Slurm { dir };
        common::assert_success(output, "scripts/slurm up --containers");
        slurm
    }

    /// The name of node `i`'s container.
    fn container(&self, node: usize) -> String {
        let name = std::fs::read_to_string(self.dir.join("containers")).expect("a container cluster");
        format!("{}-node{node}", name.trim())
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let _ = Command::new(common::repo().join("scripts/slurm")).arg("down").arg(&self.dir).output();
    }
}

/// One run of a job as `sacct -c` records it: (state, exit code).
fn ended(state: &str, exit_code: &str) -> (String, String) {
    (state.to_string(), exit_code.to_string())
}

/// The states a job (or an array task) ends in.
const FINAL_STATES: &[&str] =
    &["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"];

/// The README's job scripts (now in docs/operations/slurm.md and containers.md): their indented
/// code blocks that start with `#!/bin/bash` and hold `#SBATCH` lines, each up to its first
/// blank line.
fn readme_job_scripts() -> Vec<String> {
    let readme = common::doc("docs/operations/slurm.md") + &common::doc("docs/operations/containers.md");
    let mut scripts = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match (&mut current, line.strip_prefix("    ")) {
            (None, Some("#!/bin/bash")) => current = Some("#!/bin/bash\n".to_string()),
            (Some(script), Some(body)) if !body.trim().is_empty() => {
                script.push_str(body);
                script.push('\n');
            }
            (Some(_), _) => scripts.push(current.take().unwrap()),
            _ => {}
        }
    }
    scripts.extend(current);
    scripts.retain(|script| script.contains("#SBATCH"));
    scripts
}

/// The one README job script that contains `marker`.
fn readme_job(marker: &str) -> String {
    let found: Vec<String> = readme_job_scripts().into_iter().filter(|s| s.contains(marker)).collect();
    assert_eq!(found.len(), 1, "README job scripts containing {marker:?}: {found:#?}");
    found.into_iter().next().unwrap()
}

/// `script` with each `(from, to)` replaced; each `from` must occur, so that a README edit that
/// the test no longer matches fails here rather than submitting something else.
fn substitute(script: &str, replacements: &[(&str, &str)]) -> String {
    let mut script = script.to_string();
    for (from, to) in replacements {
        assert!(script.contains(from), "the README's job script no longer contains {from:?}:\n{script}");
        script = script.replace(from, to);
    }
    script
}

/// A configuration for the jobs: 4 classes x 24 images at 64 px, batch 8, one thread per rank
/// (several ranks share 2 cores), a step logged each time, only epoch checkpoints (so that a
/// mid-epoch checkpoint is a stop's).
fn job_config(dir: &Path, epochs: u32) -> PathBuf {
    let data = dir.join("data");
    if !data.exists() {
        common::synth(dir, 24, 4, 72);
    }
    let config = dir.join(format!("job-{epochs}-epochs.toml"));
    std::fs::write(
        &config,
        format!(
            "[data]\nroot = {:?}\nimage_size = 64\nbatch_size = 8\nworkers = 0\n\n\
             [train]\nepochs = {epochs}\nthreads = 1\nlog_every_steps = 1\n\n\
             [checkpoint]\nevery_steps = 0\nkeep_last = 1000\n",
            data.to_string_lossy()
        ),
    )
    .unwrap();
    config
}

fn summary(run: &Path) -> Value {
    let text = std::fs::read_to_string(run.join("summary.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", run.join("summary.json").display()));
    serde_json::from_str(&text).unwrap()
}

/// The stops a job's output reports, one per start that a stop signal ended, each checked to
/// have left a valid checkpoint of its step; their global steps. A stop's checkpoint is rank
/// 0's "stopped at global step N ..., checkpoint PATH; ..." or, when slurmd killed the tasks
/// (KillWait: 5 s here) before the step in flight and the stop's own checkpoint were done,
/// the last completed step saved at once ("saved the last completed step (global step N) to
/// PATH at once"): the checkpoint the stop guarantees, unless a newer one replaced it.
fn stops(log: &str) -> Vec<u64> {
    let checkpoint_of = |line: &str| -> Option<(u64, String)> {
        let (after, path) = if line.contains("stopped at global step") && line.contains(", checkpoint ") {
            let after = line.split("stopped at global step ").nth(1)?;
            (after, line.split(", checkpoint ").nth(1)?.split(';').next()?)
        } else if line.contains("saved the last completed step (global step ") {
            let after = line.split("(global step ").nth(1)?;
            (after, line.split(") to ").nth(1)?.split(" at once").next()?)
        } else {
            return None;
        };
        let step = after.split([' ', ')']).next()?.parse().unwrap_or_else(|e| panic!("{e}: {line}"));
        Some((step, path.to_string()))
    };
    // Each start logs its compute set-up once (rank 0), before any step.
    let mut per_start: Vec<Option<(u64, String)>> = Vec::new();
    for line in log.lines() {
        if line.contains(" compute: ") || per_start.is_empty() {
            per_start.push(None);
        }
        if let Some(found) = checkpoint_of(line) {
            let own = line.contains("stopped at global step");
            let slot = per_start.last_mut().unwrap();
            // The stop's own checkpoint, when it came, replaces the rescued one.
            if own || slot.is_none() {
                *slot = Some(found);
            }
        }
    }
    let mut steps = Vec::new();
    for (step, path) in per_start.into_iter().flatten() {
        let path = Path::new(&path);
        if path.exists() {
            let meta = rtrain::run_dir::checkpoint::read_meta(path)
                .unwrap_or_else(|e| panic!("{}: {e:#}\n{log}", path.display()));
            assert_eq!(meta.global_step, step, "{}", path.display());
            steps.push(step);
        } else if let Some(newer) = superseding_checkpoint(path, step) {
            // The stop's own checkpoint deleted the rescued one, and its line is not (yet) in
            // the log: the stop is at that checkpoint's step.
            steps.push(newer);
        }
    }
    steps
}

/// The README's job script with a line that reports how each start ended ("start ended with
/// N", before the script acts on it: a requeue ends the script), so that [`requeueing_starts`] can count them: srun's own
/// lines differ with how the tasks ended (together, apart, killed).
fn reporting_each_start(script: &str) -> String {
    substitute(script, &[("\nstatus=$?\n", "\nstatus=$?\necho \"start ended with $status\"\n")])
}

/// How many starts of a [`reporting_each_start`] script ended with a status the script
/// requeues: 75 (stopped) or 138 (killed by the warning before rtrain could take it).
fn requeueing_starts(log: &str) -> usize {
    log.lines().filter(|line| ["start ended with 75", "start ended with 138"].contains(&line.trim())).count()
}

/// The step of the oldest valid checkpoint beside `rescued` that is newer than its `step`:
/// the one that replaced it.
fn superseding_checkpoint(rescued: &Path, step: u64) -> Option<u64> {
    checkpoint_steps(rescued.parent()?).into_iter().filter(|&newer| newer > step).min()
}

/// The global steps of the valid checkpoints in `checkpoints`.
fn checkpoint_steps(checkpoints: &Path) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(checkpoints) else { return Vec::new() };
    entries
        .filter_map(|entry| rtrain::run_dir::checkpoint::read_meta(&entry.ok()?.path()).ok())
        .map(|meta| meta.global_step)
        .collect()
}

/// The global step of the run's newest logged training step.
fn last_step(run: &Path) -> Option<u64> {
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap_or_default();
    metrics
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|record| record["kind"] == "step")
        .filter_map(|record| record["global_step"].as_u64())
        .max()
}

fn job_output(workdir: &Path, job: &str) -> String {
    std::fs::read_to_string(workdir.join(format!("slurm-{job}.out"))).unwrap_or_default()
}

/// The README's training job, requeued until done: preempted by Slurm's own `--signal=USR1@N`
/// and, as a second job, by `scancel --signal=USR1` (the script requeues it), then by a plain
/// `scancel` (SIGTERM to tasks and script: cancelled, not requeued) and submitted again. Both
/// end with the weights of one uninterrupted `srun` run. The jobs' steps are lengthened by
/// sleeping (`RTRAIN_TEST_STEP_DELAY_MS`), so that how often a job is stopped depends on
/// Slurm's clock, not on this machine's speed, and waiting costs the other tests no CPU.
#[test]
fn the_readmes_job_preempted_by_slurm_and_by_scancel_ends_as_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let config = job_config(work, 3);
    let slurm = Slurm::up(work, 8);
    let config_arg = config.to_string_lossy().to_string();

    // The README's plain `srun --mpi=pmix -n N rtrain train` line, uninterrupted.
    let started = Instant::now();
    let straight = slurm.srun_train(work, &config, "runs/straight");
    eprintln!("uninterrupted srun -n 2: {:.1} s", started.elapsed().as_secs_f64());
    assert_eq!(straight["world_size"], 2);
    let steps = last_step(&work.join("runs/straight")).expect("the uninterrupted run's steps");

    let readme = readme_job("--time=02:00:00");
    let one_node = |minutes: &str, signal: &str| {
        substitute(
            &readme,
            &[
                (
                    "--nodes=2 --ntasks-per-node=4 --gpus-per-node=4 --time=02:00:00",
                    &format!("--nodes=1 --ntasks-per-node=2 --time={minutes}"),
                ),
                ("--signal=USR1@120", signal),
                ("configs/designsafe.toml", &config_arg),
            ],
        )
    };
    let work_dir = work.to_string_lossy().to_string();

    // Slurm's warning comes at the first 30 s check with at most N + 30 s left: with a time
    // limit of two minutes and N = 30, 60-90 s into each start. Steps that take 100 s in all
    // cannot end within the first start (so the warning stops the job at least once), and a
    // few starts finish them (each trains for 60 s or more, less its start-up).
    let started = Instant::now();
    let slow_steps = (100_000 / steps + 1).to_string();
    let by_slurm = slurm.sbatch(
        &reporting_each_start(&substitute(
            &one_node("2", "--signal=USR1@30"),
            &[("runs/damage", "runs/by-slurm")],
        )),
        work,
        &[("WORK", &work_dir), ("RTRAIN_TEST_STEP_DELAY_MS", &slow_steps)],
    );

    // The second job is stopped by hand: a warning to the tasks (requeued by the script), then
    // scancel's SIGTERM to tasks and script (cancelled), then submitted again. Steps of 2 s
    // leave the test the time to see each stop before the job has ended.
    let by_hand_script = substitute(&one_node("30", "--signal=USR1@1"), &[("runs/damage", "runs/by-hand")]);
    let work_env = [("WORK", work_dir.as_str()), ("RTRAIN_TEST_STEP_DELAY_MS", "2000")];
    let by_hand = slurm.sbatch(&by_hand_script, work, &work_env);
    let by_hand_run = work.join("runs/by-hand");
    slurm.wait_until("the second job trains", Duration::from_secs(120), || last_step(&by_hand_run).is_some());
    let output = slurm.command("scancel").args(["--signal=USR1", &by_hand]).output().unwrap();
    common::assert_success(output, "scancel --signal=USR1");
    slurm.wait_until("the job stopped, requeued and training again", Duration::from_secs(180), || {
        let first_stop = stops(&job_output(work, &by_hand)).first().copied();
        job_output(work, &by_hand).contains("resumed from")
            && first_stop.is_some_and(|stop| last_step(&by_hand_run).is_some_and(|step| step > stop))
    });
    let output = slurm.command("scancel").arg(&by_hand).output().unwrap();
    common::assert_success(output, "scancel");
    let runs = slurm.wait_for_end(&by_hand, Duration::from_secs(120));
    let log = job_output(work, &by_hand);
    assert_eq!(
        runs,
        [ended("PENDING", "0:0"), ended("CANCELLED", "0:0")],
        "requeued by the script, then cancelled:\n{log}"
    );
    assert_eq!(stops(&log).len(), 2, "a checkpoint at each stop:\n{log}");
    let resubmitted = slurm.sbatch(&by_hand_script, work, &work_env);
    let runs = slurm.wait_for_end(&resubmitted, Duration::from_secs(300));
    let log = job_output(work, &resubmitted);
    assert_eq!(runs, [ended("COMPLETED", "0:0")], "{log}");
    assert_eq!(summary(&by_hand_run)["weights_sha256"], straight["weights_sha256"], "{log}");

    let runs = slurm.wait_for_end(&by_slurm, Duration::from_secs(600));
    let log = job_output(work, &by_slurm);
    eprintln!(
        "preempted by Slurm's signal, requeued until done: {:.1} s, runs {runs:?}",
        started.elapsed().as_secs_f64()
    );
    let stopped = stops(&log);
    assert!(
        !stopped.is_empty(),
        "Slurm's warning never stopped the job (it should come 60-90 s into a 2-minute job):\n{log}"
    );
    // The job-completion log records each requeue as the job going back to PENDING: one per
    // start that ended with 75, whether it stopped at a step with a checkpoint or during its
    // start-up (reading the data, resuming: nothing to save yet), or with 138 (the warning
    // came while a task was still loading libtorch).
    let requeued = requeueing_starts(&log);
    let mut expected = vec![ended("PENDING", "0:0"); requeued];
    expected.push(ended("COMPLETED", "0:0"));
    assert_eq!(runs, expected, "{log}");
    // Every start after the first checkpoint resumes from the latest one. A warning that
    // comes during the last step still saves it at once, but the run then finishes: that stop
    // is neither requeued nor resumed (seen on a slow machine).
    let resumed = log.matches("resumed from").count();
    assert!(
        (stopped.len().min(requeued)..=requeued).contains(&resumed),
        "a resume after each stop ({} stops with a checkpoint, {requeued} requeues, {resumed} resumes):\n{log}",
        stopped.len()
    );
    assert_eq!(summary(&work.join("runs/by-slurm"))["weights_sha256"], straight["weights_sha256"], "{log}");
}

/// A stop signal that reaches one rank of two during start-up stops both, with 75, where
/// start-up ends. A rank used to end at once, alone: Open MPI then aborted the job, slurmstepd
/// SIGKILLed the other rank and srun returned 137, which the README's script does not requeue
/// (a CI run's one-minute job, warned 0-30 s into each start, ended FAILED 137:0 so).
#[test]
fn a_stop_signal_to_one_rank_during_start_up_stops_both_with_75() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let config = job_config(work, 1);
    let slurm = Slurm::up(work, 4);
    let mut srun = slurm.command("srun");
    srun.args(["--mpi=pmix", "-n", "2", "rtrain", "train", "--config"])
        .arg(&config)
        .args(["--run-dir", "run"])
        .current_dir(work)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = srun.spawn().unwrap();
    // The first rank that takes SIGUSR1 (rtrain installs its handlers as the command starts,
    // before MPI, the configuration, the data and the model: a second or more of start-up).
    let config_arg = config.to_string_lossy().to_string();
    let started = Instant::now();
    let rank = loop {
        if let Some(pid) = rtrain_processes(&config_arg).into_iter().find(|&pid| catches_sigusr1(pid)) {
            break pid;
        }
        assert!(child.try_wait().unwrap().is_none(), "srun ended before a rank took SIGUSR1");
        assert!(started.elapsed() < Duration::from_secs(120), "no rank took SIGUSR1 within 2 minutes");
        std::thread::sleep(Duration::from_millis(2));
    };
    let signalled = Command::new("kill").args(["-USR1", &rank.to_string()]).status().unwrap();
    assert!(signalled.success());
    common::wait_within(&mut child, Duration::from_secs(120), "srun of a job stopped during start-up");
    let output = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(75), "srun's status:\n{log}");
    assert_eq!(log.matches("stopped during start-up").count(), 2, "both ranks stopped:\n{log}");
    assert_eq!(last_step(&work.join("run")), None, "no step was taken:\n{log}");
}

/// The processes named `rtrain` whose command line contains `marker`.
fn rtrain_processes(marker: &str) -> Vec<u32> {
    let read = |pid: &str, file: &str| std::fs::read(format!("/proc/{pid}/{file}")).unwrap_or_default();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let pid = pid.to_string();
            read(&pid, "comm") == b"rtrain\n"
                && String::from_utf8_lossy(&read(&pid, "cmdline")).contains(marker)
        })
        .collect()
}

/// Whether process `pid` has a handler for SIGUSR1 (`SigCgt` in /proc/PID/status: a mask of
/// the caught signals, bit N-1 for signal N).
fn catches_sigusr1(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGUSR1 - 1)) != 0)
}

/// The README's job with a time limit of one minute and no `--signal`, on a cluster of its own
/// in `work`, with `env` for sbatch; returns how it ended (one run, not requeued: the script is
/// signalled too) and its output.
fn job_at_its_time_limit(work: &Path, env: &[(&str, &str)]) -> (Vec<(String, String)>, String) {
    let config = job_config(work, 1000);
    let slurm = Slurm::up(work, 4);
    let script = substitute(
        &readme_job("--time=02:00:00"),
        &[
            ("--nodes=2 --ntasks-per-node=4 --gpus-per-node=4 --time=02:00:00", "--ntasks=1 --time=1"),
            ("#SBATCH --signal=USR1@120      # warn every rank 2 minutes before the time limit\n", ""),
            ("configs/designsafe.toml", &config.to_string_lossy()),
        ],
    );
    let started = Instant::now();
    let mut env = env.to_vec();
    env.push(("WORK", work.to_str().unwrap()));
    let job = slurm.sbatch(&script, work, &env);
    let runs = slurm.wait_for_end(&job, Duration::from_secs(240));
    let log = job_output(work, &job);
    eprintln!("time limit 1 min: ended {:.1} s after submission, {runs:?}", started.elapsed().as_secs_f64());
    assert_eq!(runs.len(), 1, "not requeued: the script is signalled too:\n{log}");
    assert_eq!(runs[0].0, "TIMEOUT", "{log}");
    (runs, log)
}

/// A job that reaches its time limit with no `--signal`: Slurm's SIGTERM, SIGTERM again a few
/// milliseconds later, then SIGKILL after KillWait. The pair is one request: a checkpoint and
/// exit 75 in time (rtrain exited 143 with nothing saved before it counted them as one). Steps
/// of 1 s (`RTRAIN_TEST_STEP_DELAY_MS`), shorter than KillWait, so that the step in flight ends
/// before the checkpoint, and the minute until the limit is spent sleeping, not computing.
#[test]
fn a_job_at_its_time_limit_without_a_warning_still_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let (_, log) = job_at_its_time_limit(dir.path(), &[("RTRAIN_TEST_STEP_DELAY_MS", "1000")]);
    assert!(log.contains("task 0: Exited with exit code 75"), "{log}");
    assert_eq!(stops(&log).len(), 1, "one stop, with its checkpoint:\n{log}");
}

/// Issue 50: the same with steps of 10 s (`RTRAIN_TEST_STEP_DELAY_MS`), longer than KillWait
/// (5 s here): slurmd kills the task before the step in flight ends, so the stop checkpoint
/// must not wait for it. The last completed step is saved at once (before, the newest
/// checkpoint was the epoch's, and every step since was lost).
#[test]
fn a_job_of_slow_steps_at_its_time_limit_keeps_its_last_completed_step() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let (_, log) = job_at_its_time_limit(work, &[("RTRAIN_TEST_STEP_DELAY_MS", "10000")]);
    let saved: Vec<&str> =
        log.lines().filter(|line| line.contains("saved the last completed step")).collect();
    assert_eq!(saved.len(), 1, "{log}");
    let rescued: u64 =
        saved[0].split("(global step ").nth(1).unwrap().split(')').next().unwrap().parse().unwrap();
    assert!(rescued > 0, "{log}");
    // The step in flight at the signal may still end, and be logged, within KillWait before
    // the kill (whether it does depends on where the limit falls in its 10 s): the rescued
    // checkpoint holds the last step completed when the signal came, and at most that step is
    // lost. When the step in flight ends in time, its own stop checkpoint replaces the rescued
    // one (which is then deleted), so the newest checkpoint on disk is one of the two.
    let before_the_signal = last_logged_step_before(&log, "saved the last completed step");
    assert_eq!(Some(rescued), before_the_signal, "the last step logged before the save:\n{log}");
    let run = work.join("runs/damage");
    let newest = checkpoint_steps(&run.join("checkpoints")).into_iter().max();
    assert!(
        newest == Some(rescued) || newest == Some(rescued + 1),
        "the newest checkpoint holds step {newest:?}, not {rescued} or the step in flight:\n{log}"
    );
    let last = last_step(&run).unwrap_or(0);
    assert!(last <= rescued + 1, "steps {}..={last} lost:\n{log}", rescued + 1);
}

/// The global step of the last `epoch E/N step S/M:` line of `log` before its first line that
/// contains `until`.
fn last_logged_step_before(log: &str, until: &str) -> Option<u64> {
    log.lines()
        .take_while(|line| !line.contains(until))
        .filter_map(|line| {
            let after = line.split(" epoch ").nth(1)?;
            let (epoch, rest) = after.split_once('/')?;
            let (step, rest) = rest.split(" step ").nth(1)?.split_once('/')?;
            let per_epoch = rest.split(':').next()?;
            let (epoch, step, per_epoch): (u64, u64, u64) =
                (epoch.parse().ok()?, step.parse().ok()?, per_epoch.parse().ok()?);
            Some((epoch - 1) * per_epoch + step)
        })
        .last()
}

/// The README's job array: one seed per array task, each into its own run directory, then the
/// README's `rtrain report` over them (seed statistics of 3 runs).
#[test]
fn the_readmes_job_array_trains_one_seed_per_task() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let config = job_config(work, 1);
    let slurm = Slurm::up(work, 4);
    let script = substitute(
        &readme_job("--array="),
        &[
            ("--array=1-5 --ntasks=4 --gpus-per-task=1 --time=04:00:00", "--array=1-3 --ntasks=1 --time=10"),
            ("configs/designsafe.toml", &config.to_string_lossy()),
        ],
    );
    let started = Instant::now();
    let array = slurm.sbatch(&script, work, &[("WORK", work.to_str().unwrap())]);
    slurm.wait_for_end(&array, Duration::from_secs(300));
    eprintln!("3-task array: {:.1} s", started.elapsed().as_secs_f64());
    let outputs: String =
        (1..=3).map(|task| job_output(work, &format!("{array}_{task}"))).collect::<Vec<_>>().join("\n");
    assert_eq!(slurm.states(&array), ["COMPLETED"; 3], "{outputs}");
    let mut weights = Vec::new();
    for seed in 1..=3 {
        let run = work.join(format!("runs/damage-seed{seed}"));
        let manifest: Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("manifest.json")).unwrap()).unwrap();
        assert_eq!(manifest["config"]["run"]["seed"], seed, "{}", run.display());
        weights.push(summary(&run)["weights_sha256"].as_str().unwrap().to_string());
    }
    let distinct: std::collections::BTreeSet<&String> = weights.iter().collect();
    assert_eq!(distinct.len(), 3, "three seeds, three different models: {weights:?}");

    // The README's report line, after the array.
    let readme = common::doc("docs/operations/slurm.md");
    let report_line = readme
        .lines()
        .find(|line| line.trim_start().starts_with("rtrain report $WORK/runs/damage-seed*"))
        .expect("the README's report line after the job array");
    let mut report = slurm.command("bash");
    report.args(["-c", report_line.trim()]).env("WORK", work).current_dir(work);
    common::assert_success(report.output().unwrap(), report_line);
    let seeds = std::fs::read_to_string(work.join("reports/damage/seeds.csv")).unwrap();
    let mut rows = csv::Reader::from_reader(seeds.as_bytes());
    let n = rows.headers().unwrap().iter().position(|column| column == "n").expect("an n column");
    let rows: Vec<csv::StringRecord> = rows.records().map(Result::unwrap).collect();
    assert!(!rows.is_empty(), "no seed statistics:\n{seeds}");
    for row in &rows {
        assert_eq!(&row[n], "3", "n = 3 in every row of the seed statistics:\n{seeds}");
    }
}

/// A shell snippet that writes `rtrain doctor --json` to `TAG.json` and `env` to `TAG.env` in
/// the working directory (`tag` may hold shell variables, such as `$SLURM_PROCID`).
fn doctor_and_env(tag: &str) -> String {
    format!("rtrain doctor --json > {tag}.json; env > {tag}.env")
}

fn read_doctor(workdir: &Path, tag: &str) -> (Value, String) {
    let json = std::fs::read_to_string(workdir.join(format!("{tag}.json")))
        .unwrap_or_else(|e| panic!("{tag}.json: {e}"));
    let doctor: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{tag}.json: {e}\n{json}"));
    let env = std::fs::read_to_string(workdir.join(format!("{tag}.env"))).unwrap();
    (doctor["environment"].clone(), env)
}

fn has_var(env: &str, name: &str) -> bool {
    env.lines().any(|line| line.starts_with(&format!("{name}=")))
}

/// Launched or not, as Slurm really sets it (the README's table): a batch script, an `srun`
/// step, an `salloc` shell and `mpirun` inside that allocation, each with `env` recorded and
/// `rtrain doctor` reporting the launch and the job; and a batch script without `srun` trains
/// as one process with a warning naming `srun` (it stopped with a world-size mismatch before).
#[test]
fn launched_or_not_in_a_batch_script_a_step_salloc_and_mpirun() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let config = job_config(work, 1);
    let slurm = Slurm::up(work, 4);
    let script = format!(
        "#!/bin/bash\n#SBATCH -n 2\n{}\nsrun --mpi=pmix bash -c '{}'\nrtrain train --config {} --run-dir runs/batch\n",
        doctor_and_env("batch"),
        doctor_and_env("step-$SLURM_PROCID"),
        config.display()
    );
    let job = slurm.sbatch(&script, work, &[]);
    let mut salloc = slurm.command("timeout");
    salloc
        .args(["300", "salloc", "-n", "2", "bash", "-c"])
        .arg(format!(
            "{}; mpirun -np 2 --oversubscribe bash -c '{}'",
            doctor_and_env("salloc"),
            doctor_and_env("mpirun-$OMPI_COMM_WORLD_RANK")
        ))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .current_dir(work);
    common::assert_success(salloc.output().unwrap(), "salloc -n 2 with mpirun inside");
    let runs = slurm.wait_for_end(&job, Duration::from_secs(300));
    let output = job_output(work, &job);
    assert_eq!(runs, [ended("COMPLETED", "0:0")], "{output}");

    let (batch, env) = read_doctor(work, "batch");
    assert!(has_var(&env, "SLURM_PROCID") && has_var(&env, "SLURM_NTASKS"), "{env}");
    assert!(!has_var(&env, "SLURM_STEP_ID") && !has_var(&env, "PMIX_RANK"), "{env}");
    assert_eq!(batch["mpi"]["launcher"], Value::Null, "a batch script is one process: {batch}");
    assert_eq!(
        (batch["slurm"]["job_id"].as_str(), batch["slurm"]["tasks"].as_u64()),
        (Some(job.as_str()), Some(2))
    );
    assert_eq!(batch["slurm"]["step"], Value::Null);
    assert!(batch["slurm_note"].as_str().is_some_and(|note| note.contains("srun")), "{batch}");
    for rank in 0..2u64 {
        let (step, env) = read_doctor(work, &format!("step-{rank}"));
        assert!(has_var(&env, "SLURM_STEP_ID") && has_var(&env, "PMIX_RANK"), "{env}");
        assert_eq!(step["mpi"]["launcher"], "Slurm (srun)", "{step}");
        assert_eq!(
            (step["mpi"]["job"]["rank"].as_u64(), step["mpi"]["job"]["world_size"].as_u64()),
            (Some(rank), Some(2))
        );
        assert_eq!(
            (step["slurm"]["step"].as_str(), step["slurm"]["tasks_on_this_node"].as_u64()),
            (Some("0"), Some(2))
        );
        assert_eq!(step["slurm_note"], Value::Null);
    }
    let (salloc, env) = read_doctor(work, "salloc");
    assert!(!has_var(&env, "SLURM_PROCID") && has_var(&env, "SLURM_NTASKS"), "{env}");
    assert_eq!(salloc["mpi"]["launcher"], Value::Null, "{salloc}");
    assert!(salloc["slurm"]["job_id"].is_string(), "{salloc}");
    for rank in 0..2u64 {
        let (mpirun, env) = read_doctor(work, &format!("mpirun-{rank}"));
        assert!(has_var(&env, "OMPI_COMM_WORLD_RANK") && !has_var(&env, "SLURM_STEP_ID"), "{env}");
        assert_eq!(mpirun["mpi"]["launcher"], "OpenMPI (mpirun)", "{mpirun}");
        assert_eq!(
            (mpirun["mpi"]["job"]["rank"].as_u64(), mpirun["mpi"]["job"]["world_size"].as_u64()),
            (Some(rank), Some(2))
        );
        assert_eq!(mpirun["slurm_note"], Value::Null, "mpirun launched it: {mpirun}");
    }

    // rtrain train in the batch script, without srun: one process, and a warning naming srun.
    assert_eq!(summary(&work.join("runs/batch"))["world_size"], 1, "{output}");
    assert!(
        output.contains(&format!("Slurm job {job} has 2 tasks")) && output.contains("srun rtrain train"),
        "{output}"
    );
}

/// Every job script in the README is submitted by a test here, or cannot run on these machines
/// (named with the reason); none asks for `--signal=B:...`, which signals only the batch shell
/// (the ranks would never checkpoint).
#[test]
fn every_readme_job_script_is_submitted_or_named_as_unrunnable_here() {
    let submitted = ["--time=02:00:00", "--array=", "ch-run"];
    // Apptainer cannot be installed here; ibrun is TACC's.
    let unrunnable = ["srun --mpi=pmix apptainer run", "ibrun"];
    let scripts = readme_job_scripts();
    assert!(scripts.len() >= 4, "{scripts:#?}");
    for script in &scripts {
        let covered = submitted.iter().chain(&unrunnable).filter(|marker| script.contains(*marker)).count();
        assert_eq!(covered, 1, "a README job script no test submits (or two markers match):\n{script}");
        assert!(!script.contains("--signal=B:"), "B: signals only the batch shell:\n{script}");
    }
    for marker in submitted {
        readme_job(marker);
    }
}

/// The rtrain image with the rtrain under test (and its libtorch), built once per process by
/// `scripts/container build` (left for the next run; `rtrain-slurmnode` images build on it).
#[cfg(feature = "test-docker")]
fn test_image() -> &'static str {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    const TAG: &str = "rtrain:slurm-test";
    BUILT.get_or_init(|| {
        let _one_at_a_time = common::fixtures::container_build();
        let output = Command::new(common::repo().join("scripts/container"))
            .args(["build", "--binary", env!("CARGO_BIN_EXE_rtrain")])
            .env("RTRAIN_IMAGE_TAG", TAG)
            .output()
            .unwrap();
        common::assert_success(output, "scripts/container build");
    });
    TAG
}

/// The image as a Charliecloud image directory, exported from Docker into `dir`.
#[cfg(feature = "test-docker")]
fn charliecloud_image(dir: &Path) -> PathBuf {
    let create = Command::new("docker").args(["create", test_image()]).output().unwrap();
    let container =
        String::from_utf8_lossy(&common::assert_success(create, "docker create").stdout).trim().to_string();
    std::fs::create_dir_all(dir).unwrap();
    let export = Command::new("sh")
        .arg("-c")
        .arg(format!("docker export {container} | tar -x -C {}", dir.display()))
        .output()
        .unwrap();
    let _ = Command::new("docker").args(["rm", &container]).output();
    common::assert_success(export, "docker export | tar -x");
    dir.to_path_buf()
}

/// The README's Charliecloud job (the hybrid model: `srun --mpi=pmix ch-run IMAGE --
/// /opt/rtrain/entrypoint train ...`): each task is a rank inside the image, joined through the
/// host Slurm's PMIx by the image's Open MPI, the entrypoint recognising Charliecloud (no ranks
/// of its own); the weights equal those of the same job run by `srun` without a container.
#[cfg(feature = "test-docker")]
#[test]
fn the_readmes_charliecloud_job_trains_in_the_image_as_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let config = job_config(work, 1);
    let started = Instant::now();
    charliecloud_image(&work.join("rtrain"));
    eprintln!("image built and exported: {:.1} s", started.elapsed().as_secs_f64());
    let slurm = Slurm::up(work, 4);
    let config_arg = config.to_string_lossy().to_string();
    let host = slurm.srun_train(work, &config, "runs/host");

    let script = substitute(
        &readme_job("ch-run"),
        &[
            (
                "-N 2 --ntasks-per-node=4 --gpus-per-node=4 --time=04:00:00",
                "-N 1 --ntasks-per-node=2 --time=10",
            ),
            ("/opt/rtrain/configs/designsafe.toml", &config_arg),
        ],
    );
    let started = Instant::now();
    // ch-run needs USER; the job's environment is the submitter's.
    let job = slurm.sbatch(&script, work, &[("SCRATCH", work.to_str().unwrap()), ("USER", "root")]);
    let runs = slurm.wait_for_end(&job, Duration::from_secs(300));
    let log = job_output(work, &job);
    eprintln!("Charliecloud job: {:.1} s", started.elapsed().as_secs_f64());
    assert_eq!(runs, [ended("COMPLETED", "0:0")], "{log}");
    assert_eq!(
        log.matches("entrypoint: runtime charliecloud, 0 GPU(s), launcher: SLURM_PROCID").count(),
        2,
        "{log}"
    );
    assert!(
        !log.contains("single_copy_mechanism CMA is"),
        "the entrypoint turns CMA off under ch-run:\n{log}"
    );
    let in_image = summary(&work.join("runs/damage"));
    assert_eq!(in_image["world_size"], 2, "{log}");
    assert_eq!(in_image["weights_sha256"], host["weights_sha256"], "{log}");
}

/// The README's job on two nodes, each a container of the image with slurmd (one network the
/// test creates, the image's Open MPI wired up by Slurm's PMIx on each node): uninterrupted, and
/// stopped by `scancel --signal=USR1` on both nodes and requeued, to the same weights. Then a
/// lost node: node1's container killed mid-training. rank 0 ends the job after
/// `dist.timeout_s`, naming rank 1 on node1; the last checkpoint stays valid, and once the node
/// is back the same script, submitted again, resumes from it.
#[cfg(feature = "test-docker")]
#[test]
fn two_container_nodes_run_the_readmes_job_and_survive_a_lost_node() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let config = job_config(work, 2);
    let started = Instant::now();
    let slurm = Slurm::up_containers(work, 2, test_image(), work);
    eprintln!("2 container nodes up (with the image): {:.1} s", started.elapsed().as_secs_f64());
    let work_env = [("WORK", work.to_str().unwrap())];
    let two_nodes = |run: &str, extra: &str| {
        substitute(
            &readme_job("--time=02:00:00"),
            &[
                (
                    "--nodes=2 --ntasks-per-node=4 --gpus-per-node=4 --time=02:00:00",
                    "--nodes=2 --ntasks-per-node=1 --time=10",
                ),
                ("configs/designsafe.toml", &config.to_string_lossy()),
                ("runs/damage", run),
                ("--resume auto", &format!("--resume auto {extra}")),
            ],
        )
    };

    let started = Instant::now();
    let straight = slurm.sbatch(&two_nodes("runs/straight", ""), work, &work_env);
    let runs = slurm.wait_for_end(&straight, Duration::from_secs(300));
    let log = job_output(work, &straight);
    eprintln!("2-node job: {:.1} s", started.elapsed().as_secs_f64());
    assert_eq!(runs, [ended("COMPLETED", "0:0")], "{log}");
    assert!(log.contains("rank 0/2 (local 0/1) on node 0/2 (node0), Slurm (srun)"), "{log}");
    let straight = summary(&work.join("runs/straight"));

    let stopped = slurm.sbatch(&two_nodes("runs/stopped", ""), work, &work_env);
    let run = work.join("runs/stopped");
    slurm.wait_until("the job trains", Duration::from_secs(120), || last_step(&run).is_some());
    common::assert_success(
        slurm.command("scancel").args(["--signal=USR1", &stopped]).output().unwrap(),
        "scancel",
    );
    let runs = slurm.wait_for_end(&stopped, Duration::from_secs(300));
    let log = job_output(work, &stopped);
    assert_eq!(runs.last().map(|run| run.0.as_str()), Some("COMPLETED"), "{runs:?}\n{log}");
    assert_eq!(stops(&log).len(), 1, "{log}");
    assert_eq!(summary(&run)["weights_sha256"], straight["weights_sha256"], "{log}");

    // A lost node. Many epochs, a checkpoint every 2 steps, a short collective timeout.
    let lost_script = two_nodes(
        "runs/lost",
        "--set dist.timeout_s=10 --set checkpoint.every_steps=2 --set train.epochs=$EPOCHS",
    );
    let lost = slurm.sbatch(&lost_script, work, &[work_env[0], ("EPOCHS", "100")]);
    let run = work.join("runs/lost");
    slurm.wait_until("the job trains 3 steps", Duration::from_secs(120), || {
        last_step(&run).is_some_and(|step| step >= 3)
    });
    let killed = Instant::now();
    common::assert_success(
        Command::new("docker").args(["kill", &slurm.container(1)]).output().unwrap(),
        "docker kill node1",
    );
    let runs = slurm.wait_for_end(&lost, Duration::from_secs(180));
    let ended_after = killed.elapsed().as_secs_f64();
    let log = job_output(work, &lost);
    eprintln!("lost node: job {runs:?} {ended_after:.1} s after node1's container was killed");
    assert_eq!(runs, [ended("FAILED", "1:0")], "the script passes srun's status on:\n{log}");
    assert!(
        log.contains("dist.timeout_s = 10; no answer from rank 1 on node1"),
        "rank 0 names the silent rank and host:\n{log}"
    );
    assert!(ended_after < 90.0, "the job must end by itself promptly: {ended_after:.1} s\n{log}");
    let newest = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.file_name().unwrap().to_string_lossy().starts_with("step-"))
        .max()
        .expect("a checkpoint before the loss");
    let meta = rtrain::run_dir::checkpoint::read_meta(&newest).unwrap();

    let restart = Command::new(common::repo().join("scripts/slurm"))
        .arg("restart-node")
        .arg(&slurm.dir)
        .arg("1")
        .output()
        .unwrap();
    common::assert_success(restart, "scripts/slurm restart-node");
    let again = slurm.sbatch(&lost_script, work, &[work_env[0], ("EPOCHS", "2")]);
    let runs = slurm.wait_for_end(&again, Duration::from_secs(300));
    let log = job_output(work, &again);
    assert_eq!(runs, [ended("COMPLETED", "0:0")], "{log}");
    assert!(
        log.contains(&format!("(global step {})", meta.global_step)),
        "resumed from the newest checkpoint {}:\n{log}",
        newest.display()
    );
}
