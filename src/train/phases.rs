//! Where each rank's training time goes: every step is cut into phases by consecutive laps of
//! one clock — waiting for data, copying to the device, forward, backward, waiting for the
//! gradient all-reduce after backward, the optimizer step, and what happens between steps —
//! so that a rank's phases add up to its wall time. The sums are kept per report window, per
//! epoch and per run, and gathered over the ranks into a [`PhaseReport`] (each phase's value on
//! rank 0 and its min, median and max over ranks) with the straggler, if any, named.
//!
//! Always on: a lap is a clock read and an addition. With `log.trace_steps`, each lap is also a
//! span of the step trace ([`crate::trace`]).
//!
//! On a GPU the laps are host clocks: the copy, forward and backward laps then measure what
//! the host waits for, and work the GPU has queued shows up in the next phase that waits for
//! it (the loss read-back in `forward`, the all-reduce wait in `comm_wait`).

use std::time::Instant;

use crate::cluster::Communicator;
use crate::run_dir::records::{PhaseReport, PhaseStat, Straggler};
use crate::trace;
use crate::util::stats::median;

/// A phase of a training step, in the order a step goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Data,
    Copy,
    Forward,
    Backward,
    CommWait,
    Optimizer,
    Other,
}

impl Phase {
    pub const ALL: [Phase; 7] = [
        Phase::Data,
        Phase::Copy,
        Phase::Forward,
        Phase::Backward,
        Phase::CommWait,
        Phase::Optimizer,
        Phase::Other,
    ];

    /// The name in `metrics.jsonl` and in the trace.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Data => "data",
            Phase::Copy => "copy",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::CommWait => "comm_wait",
            Phase::Optimizer => "optimizer",
            Phase::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Seconds per phase summed over `steps` steps of one rank, and the communication thread's
/// all-reduce seconds over them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseSums {
    pub seconds: [f64; 7],
    pub allreduce: f64,
    pub steps: u64,
}

impl PhaseSums {
    fn add(&mut self, other: &PhaseSums) {
        for (sum, value) in self.seconds.iter_mut().zip(other.seconds) {
            *sum += value;
        }
        self.allreduce += other.allreduce;
        self.steps += other.steps;
    }

    /// Seconds per step of each phase, then the all-reduce's.
    fn per_step(&self) -> [f64; 8] {
        let steps = self.steps.max(1) as f64;
        let mut out = [0.0; 8];
        for (value, sum) in out.iter_mut().zip(self.seconds) {
            *value = sum / steps;
        }
        out[7] = self.allreduce / steps;
        out
    }
}

/// The laps of the step in progress.
pub struct PhaseClock {
    last: Instant,
    step_started: Instant,
    current: [f64; 7],
}

impl Default for PhaseClock {
    fn default() -> Self {
        PhaseClock::new()
    }
}

impl PhaseClock {
    pub fn new() -> PhaseClock {
        let now = Instant::now();
        PhaseClock { last: now, step_started: now, current: [0.0; 7] }
    }

    /// Attributes the time since the last lap to `phase`.
    pub fn lap(&mut self, phase: Phase) {
        let now = Instant::now();
        self.current[phase.index()] += now.saturating_duration_since(self.last).as_secs_f64();
        trace::span(phase.name(), trace::USER_ANNOTATION, self.last, now, None);
        self.last = now;
    }

    /// Forgets the time since the last lap (e.g. an evaluation between epochs): the next lap
    /// starts now.
    pub fn restart(&mut self) {
        self.last = Instant::now();
        self.step_started = self.last;
        self.current = [0.0; 7];
    }

    /// Ends the step that global step `global_step` finished: its phases, and the step's span
    /// in the trace (Kineto's `ProfilerStep#N`).
    fn end_step(&mut self, global_step: u64) -> [f64; 7] {
        if trace::recording() {
            let name = format!("ProfilerStep#{global_step}");
            trace::span(name, trace::USER_ANNOTATION, self.step_started, self.last, None);
        }
        self.step_started = self.last;
        std::mem::take(&mut self.current)
    }
}

/// The phase timing of one rank through a run: the clock and the sums since the last report,
/// since the epoch began, and since the run (this process) began.
pub struct PhaseTiming {
    pub clock: PhaseClock,
    window: PhaseSums,
    epoch: PhaseSums,
    run: PhaseSums,
    /// The communication thread's all-reduce seconds when the last step ended.
    allreduce_seen: f64,
    /// Every rank's node, by rank.
    hosts: Vec<String>,
    straggler_threshold: f64,
    /// When the step before the current report window ended, and when the last step ended:
    /// the window's wall time, which its steps' phases add up to.
    window_opened: Instant,
    last_step_ended: Instant,
    /// `log.trace_steps`, and how far the trace is.
    trace_steps: u64,
    trace: TraceState,
}

/// The step trace: recorded from the first report on (after the warm-up steps before it), for
/// `log.trace_steps` steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TraceState {
    Waiting,
    Recording { traced: u64 },
    Done,
}

impl PhaseTiming {
    /// `hosts`: every rank's node, by rank; a rank whose own work per step exceeds the median
    /// rank's by more than `straggler_threshold` (a fraction) is named a straggler.
    /// With `trace_steps` > 0, a step trace of that many steps starts after the first report.
    pub fn new(hosts: Vec<String>, straggler_threshold: f64, trace_steps: u64) -> PhaseTiming {
        PhaseTiming {
            trace_steps,
            trace: if trace_steps > 0 { TraceState::Waiting } else { TraceState::Done },
            clock: PhaseClock::new(),
            window: PhaseSums::default(),
            epoch: PhaseSums::default(),
            run: PhaseSums::default(),
            allreduce_seen: 0.0,
            window_opened: Instant::now(),
            last_step_ended: Instant::now(),
            hosts,
            straggler_threshold,
        }
    }

    /// Ends a step: `allreduce_total` is the communication thread's all-reduce seconds so far.
    pub fn end_step(&mut self, global_step: u64, allreduce_total: f64) {
        let seconds = self.clock.end_step(global_step);
        self.last_step_ended = Instant::now();
        let step =
            PhaseSums { seconds, allreduce: (allreduce_total - self.allreduce_seen).max(0.0), steps: 1 };
        self.allreduce_seen = allreduce_total;
        if let TraceState::Recording { traced } = &mut self.trace {
            *traced += 1;
        }
        self.window.add(&step);
        self.epoch.add(&step);
        self.run.add(&step);
    }

    /// Starts an epoch: its sums and the clock (the evaluation before it is not a step's).
    pub fn start_epoch(&mut self) {
        self.epoch = PhaseSums::default();
        self.window = PhaseSums::default();
        self.clock.restart();
        (self.window_opened, self.last_step_ended) = (self.clock.last, self.clock.last);
    }

    /// The steps since the last report, over every rank, and their wall time on this rank
    /// (from the end of the step before them to the end of the last); starts the next window.
    /// A collective.
    pub fn window_report(&mut self, comm: &dyn Communicator) -> (PhaseReport, f64) {
        let sums = std::mem::take(&mut self.window);
        let wall = self.last_step_ended.saturating_duration_since(self.window_opened).as_secs_f64();
        self.window_opened = self.last_step_ended;
        let report = self.gather(comm, &sums);
        if self.trace == TraceState::Waiting {
            trace::start();
            self.trace = TraceState::Recording { traced: 0 };
        }
        (report, wall)
    }

    /// Whether the step trace has its `log.trace_steps` steps (the same on every rank).
    pub fn trace_complete(&self) -> bool {
        matches!(self.trace, TraceState::Recording { traced } if traced >= self.trace_steps)
    }

    /// Ends the step trace, complete or not (a run shorter than asked); None when none is being
    /// recorded. The same on every rank.
    pub fn finish_trace(&mut self) -> Option<(trace::Trace, u64)> {
        let TraceState::Recording { traced } = self.trace else { return None };
        self.trace = TraceState::Done;
        Some((trace::stop(), traced))
    }

    /// The epoch's steps over every rank. A collective.
    pub fn epoch_report(&self, comm: &dyn Communicator) -> PhaseReport {
        self.gather(comm, &self.epoch)
    }

    /// This process's steps over every rank. A collective.
    pub fn run_report(&self, comm: &dyn Communicator) -> PhaseReport {
        self.gather(comm, &self.run)
    }

    fn gather(&self, comm: &dyn Communicator, sums: &PhaseSums) -> PhaseReport {
        let topology = comm.topology();
        let (world, rank) = (topology.world_size, topology.rank);
        // Each rank fills its own row; the sum is every rank's rows.
        let mut rows = vec![0.0; world * 9];
        rows[rank * 9..rank * 9 + 8].copy_from_slice(&sums.per_step());
        rows[rank * 9 + 8] = sums.steps as f64;
        comm.all_reduce_sum_f64(&mut rows);
        let per_rank: Vec<[f64; 8]> = rows.chunks(9).map(|row| std::array::from_fn(|i| row[i])).collect();
        summarize(&per_rank, sums.steps, &self.hosts, self.straggler_threshold)
    }
}

/// The report of per-rank seconds per step (`per_rank[r]`: the seven phases, then the
/// all-reduce's).
pub fn summarize(
    per_rank: &[[f64; 8]],
    steps: u64,
    hosts: &[String],
    straggler_threshold: f64,
) -> PhaseReport {
    let column = |f: &dyn Fn(&[f64; 8]) -> f64| -> Vec<f64> { per_rank.iter().map(f).collect() };
    let phase = |i: usize| stat(&column(&|r| r[i]));
    let step_of = |r: &[f64; 8]| r[..7].iter().sum::<f64>();
    let busy_of = |r: &[f64; 8]| step_of(r) - r[Phase::CommWait.index()];
    let busy = stat(&column(&busy_of));
    let node = |rank: usize| hosts.get(rank).cloned().unwrap_or_else(|| "?".to_string());
    // The slowest rank against the median of the others (with two ranks, the other one).
    let slowest = busy.max_rank;
    let others_median = |f: &dyn Fn(&[f64; 8]) -> f64| {
        median(
            &per_rank
                .iter()
                .enumerate()
                .filter(|(r, _)| *r != slowest)
                .map(|(_, v)| f(v))
                .collect::<Vec<_>>(),
        )
    };
    let busy_of_others = if per_rank.len() > 1 { others_median(&busy_of) } else { busy.max };
    let waiting_for_slowest = (busy.max - busy_of_others).max(0.0);
    let straggler =
        (per_rank.len() > 1 && busy.max > busy_of_others * (1.0 + straggler_threshold)).then(|| {
            // The phase it loses the most time in, against the others.
            let (phase, phase_median) = Phase::ALL
                .iter()
                .filter(|p| **p != Phase::CommWait)
                .map(|p| (*p, others_median(&|r| r[p.index()])))
                .max_by(|a, b| {
                    let excess = |(p, m): &(Phase, f64)| per_rank[slowest][p.index()] - m;
                    excess(a).total_cmp(&excess(b))
                })
                .unwrap_or((Phase::Data, 0.0));
            Straggler {
                rank: slowest,
                node: node(slowest),
                busy: busy.max,
                median_busy: busy_of_others,
                phase: phase.name().to_string(),
                phase_seconds: per_rank[slowest][phase.index()],
                phase_median,
            }
        });
    PhaseReport {
        steps,
        exposed_comm: per_rank.get(slowest).map_or(0.0, |r| r[Phase::CommWait.index()]),
        waiting_for_slowest,
        data: phase(0),
        copy: phase(1),
        forward: phase(2),
        backward: phase(3),
        comm_wait: phase(4),
        optimizer: phase(5),
        other: phase(6),
        allreduce: phase(7),
        step: stat(&column(&step_of)),
        slowest_rank: busy.max_rank,
        slowest_node: node(busy.max_rank),
        busy,
        straggler,
    }
}

fn stat(values: &[f64]) -> PhaseStat {
    let max_rank = crate::metrics::argmax(values);
    PhaseStat {
        rank0: values.first().copied().unwrap_or(0.0),
        min: values.iter().copied().fold(f64::INFINITY, f64::min),
        median: median(values),
        max: values.get(max_rank).copied().unwrap_or(0.0),
        max_rank,
    }
}

/// The seven phases of a report, by name, from its per-rank medians (for reports and plots).
pub fn medians(report: &PhaseReport) -> [(&'static str, f64); 7] {
    let p = report;
    [
        ("data", p.data.median),
        ("copy", p.copy.median),
        ("forward", p.forward.median),
        ("backward", p.backward.median),
        ("comm_wait", p.comm_wait.median),
        ("optimizer", p.optimizer.median),
        ("other", p.other.median),
    ]
}

/// Test-only: `RTRAIN_TEST_DATA_DELAY_MS="RANK:MS[:AFTER]"` makes rank RANK wait MS
/// milliseconds more for each batch once AFTER steps are done (0 if not given), as a slow disk
/// or too few loader threads would, so that the tests can make a straggler and compare its
/// job before and after. Unset, nothing.
pub fn slow_data_for_tests(rank: usize, steps_done: u64) {
    type Delay = (usize, std::time::Duration, u64);
    static DELAY: std::sync::OnceLock<Option<Delay>> = std::sync::OnceLock::new();
    let delay = DELAY.get_or_init(|| {
        let value = std::env::var("RTRAIN_TEST_DATA_DELAY_MS").ok()?;
        let mut fields = value.split(':');
        let slow = fields.next()?.parse().ok()?;
        let millis = fields.next()?.parse().ok()?;
        let after = fields.next().map_or(Some(0), |f| f.parse().ok())?;
        Some((slow, std::time::Duration::from_millis(millis), after))
    });
    if let Some((slow, delay, after)) = delay {
        if *slow == rank && steps_done >= *after {
            std::thread::sleep(*delay);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> Vec<String> {
        ["n1", "n2", "n3"].map(String::from).to_vec()
    }

    #[test]
    fn a_rank_slow_at_its_data_is_the_straggler_and_the_others_wait_for_it() {
        // Rank 2 waits 0.10 s more for data; the others wait that long in the all-reduce.
        let fast = [0.01, 0.0, 0.05, 0.10, 0.11, 0.02, 0.001, 0.03];
        let slow = [0.11, 0.0, 0.05, 0.10, 0.01, 0.02, 0.001, 0.03];
        let report = summarize(&[fast, fast, slow], 20, &hosts(), 0.1);
        let straggler = report.straggler.clone().expect("a straggler");
        assert_eq!((straggler.rank, straggler.node.as_str(), straggler.phase.as_str()), (2, "n3", "data"));
        assert!((straggler.busy - 0.281).abs() < 1e-12 && (straggler.median_busy - 0.181).abs() < 1e-12);
        assert!((report.busy.median - 0.181).abs() < 1e-12);
        assert!(
            (straggler.phase_seconds - 0.11).abs() < 1e-12 && (straggler.phase_median - 0.01).abs() < 1e-12
        );
        assert_eq!((report.slowest_rank, report.slowest_node.as_str()), (2, "n3"));
        // Every rank's step takes the same wall time: the phases add up to it.
        assert!((report.step.min - 0.291).abs() < 1e-12 && (report.step.max - 0.291).abs() < 1e-12);
        assert_eq!((report.comm_wait.rank0, report.comm_wait.min, report.comm_wait.max), (0.11, 0.01, 0.11));
        assert_eq!(report.data.max_rank, 2);
        assert!(
            (report.exposed_comm - 0.01).abs() < 1e-12 && (report.waiting_for_slowest - 0.1).abs() < 1e-12
        );
        assert!(straggler
            .describe()
            .starts_with("rank 2 on node n3: step 0.281 s vs the others' median 0.181 s"));
    }

    #[test]
    fn no_straggler_within_the_threshold_or_alone() {
        let a = [0.01, 0.0, 0.05, 0.10, 0.01, 0.02, 0.0, 0.0];
        let b = [0.02, 0.0, 0.05, 0.10, 0.0, 0.02, 0.0, 0.0];
        assert!(summarize(&[a, b, a], 5, &hosts(), 0.1).straggler.is_none());
        assert!(summarize(&[b], 5, &hosts(), 0.0).straggler.is_none());
    }

    #[test]
    fn laps_add_up_to_the_wall_time() {
        let mut timing = PhaseTiming::new(vec!["n1".into()], 0.1, 0);
        let started = Instant::now();
        for step in 1..=3 {
            for phase in Phase::ALL {
                std::thread::sleep(std::time::Duration::from_millis(2));
                timing.clock.lap(phase);
            }
            timing.end_step(step, 0.001 * step as f64);
        }
        let wall = started.elapsed().as_secs_f64();
        let (report, window_wall) = timing.window_report(crate::cluster::single().as_ref());
        assert_eq!(report.steps, 3);
        assert!((report.step.rank0 * 3.0 - wall).abs() < 0.002, "{} vs {wall}", report.step.rank0 * 3.0);
        assert!(
            (report.step.rank0 * 3.0 - window_wall).abs() < 1e-4,
            "{} vs {window_wall}",
            report.step.rank0 * 3.0
        );
        assert!(report.data.rank0 >= 0.002 && report.other.rank0 >= 0.002);
        assert!((report.allreduce.rank0 - 0.001).abs() < 1e-12);
        // The window starts again; the epoch and the run keep the steps.
        assert_eq!(timing.window_report(crate::cluster::single().as_ref()).0.steps, 0);
        assert_eq!(timing.run_report(crate::cluster::single().as_ref()).steps, 3);
    }
}
