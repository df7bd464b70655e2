//! The collective watchdog: a rank that waits in a collective for longer than `dist.timeout_s`
//! ends the job (MPI_Abort), naming the rank(s) that did not arrive and what the job was doing.
//! Without it, a stopped rank (a hung node, a stuck file system, SIGSTOP) leaves every other rank
//! waiting forever: MPI notices a process that exits, not one that stops.
//!
//! Every collective of the MPI communicator registers its wait here ([`Wait`]); a thread checks
//! the oldest wait each second. To name the missing ranks, the timed-out rank sends a roll call
//! to every other rank over a communicator of its own: each rank's watchdog thread answers it,
//! whatever its other threads are doing, so the ranks that stay silent are the stopped ones.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Topology;

/// What the watchdog thread needs of MPI: the roll call on a communicator of its own, and the
/// abort. It holds no reference to the job's communicator, whose drop finalises MPI after
/// stopping this thread ([`Watchdog`]).
pub trait RollCall: Send + 'static {
    fn topology(&self) -> &Topology;
    /// Answers the roll calls of other ranks' watchdogs that have arrived.
    fn answer_roll_calls(&self);
    /// Calls every other rank and listens `within`; returns the ranks that did not answer.
    fn roll_call(&self, within: Duration) -> Vec<usize>;
    /// Ends every process of the job.
    fn abort(&self, code: i32) -> !;
}

/// How long the waiting rank listens for answers to its roll call.
const ROLL_CALL_WAIT: Duration = Duration::from_secs(3);
/// How often the thread checks the waits and answers roll calls.
const TICK: Duration = Duration::from_millis(250);

/// The wait limit before the run's configuration says otherwise (set-up can include a long
/// data hashing or staging on one rank while the others wait).
pub const STARTUP_LIMIT: Duration = Duration::from_secs(crate::config::DEFAULT_SETUP_TIMEOUT_S);

static LIMIT_MS: AtomicU64 = AtomicU64::new(STARTUP_LIMIT.as_millis() as u64);
static GLOBAL_STEP: AtomicU64 = AtomicU64::new(0);
static WAITS: Mutex<Vec<(u64, Instant, &'static str)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static PHASE: Mutex<&'static str> = Mutex::new("set-up");
static HOSTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Every rank's host name, by rank, to name where a missing rank runs.
pub fn set_hosts(hosts: Vec<String>) {
    *HOSTS.lock().unwrap_or_else(|p| p.into_inner()) = hosts;
}

/// How long a collective may wait from now on (`dist.timeout_s` once training runs).
pub fn set_limit(limit: Duration) {
    LIMIT_MS.store(limit.as_millis().max(1) as u64, Ordering::SeqCst);
}

/// What the job is doing, for the message: "training", "evaluation", "checkpoint", ...
pub fn set_phase(phase: &'static str, global_step: u64) {
    *PHASE.lock().unwrap_or_else(|p| p.into_inner()) = phase;
    GLOBAL_STEP.store(global_step, Ordering::Relaxed);
}

/// How long a collective may wait now.
pub fn limit() -> Duration {
    Duration::from_millis(LIMIT_MS.load(Ordering::SeqCst))
}

/// What the job is doing, for messages: "a training step (global step 12)".
pub fn doing() -> String {
    let phase = *PHASE.lock().unwrap_or_else(|p| p.into_inner());
    format!("{phase} (global step {})", GLOBAL_STEP.load(Ordering::Relaxed))
}

/// A collective in progress on this rank; registered until dropped.
pub struct Wait(u64);

impl Wait {
    pub fn begin(collective: &'static str) -> Wait {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        WAITS.lock().unwrap_or_else(|p| p.into_inner()).push((id, Instant::now(), collective));
        Wait(id)
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        WAITS.lock().unwrap_or_else(|p| p.into_inner()).retain(|(id, _, _)| *id != self.0);
    }
}

/// The watchdog thread of one rank; dropping it stops the thread (before MPI is finalised).
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the watchdog thread of a rank of a job of more than one process.
    pub fn start(port: impl RollCall) -> Watchdog {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let spawned = std::thread::Builder::new().name("rtrain-watchdog".into()).spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                std::thread::sleep(TICK);
                port.answer_roll_calls();
                let oldest = WAITS
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(|&(_, at, what)| (at, what))
                    .min();
                let limit = limit();
                if let Some((since, collective)) = oldest.filter(|(since, _)| since.elapsed() > limit) {
                    give_up(&port, since.elapsed(), collective, limit);
                }
            }
        });
        let thread = match spawned {
            Ok(thread) => Some(thread),
            Err(error) => {
                tracing::warn!(
                    "cannot start the collective watchdog thread: {error}; a hung rank would hang the job"
                );
                None
            }
        };
        Watchdog { stop, thread }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Names the ranks that do not answer and ends the job.
fn give_up(port: &impl RollCall, waited: Duration, collective: &str, limit: Duration) -> ! {
    let topology = port.topology();
    let silent = port.roll_call(ROLL_CALL_WAIT);
    let hosts = HOSTS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let named = |rank: &usize| match hosts.get(*rank) {
        Some(host) => format!("{rank} on {host}"),
        None => rank.to_string(),
    };
    let missing = match silent.as_slice() {
        [] => "every rank answered a roll call, so all are alive but out of step (one in another collective)"
            .to_string(),
        ranks => format!(
            "no answer from rank{} {} (stopped, hung or cut off)",
            if ranks.len() > 1 { "s" } else { "" },
            ranks.iter().map(named).collect::<Vec<_>>().join(", ")
        ),
    };
    tracing::error!(
        "rank {} on {}: waited {:.0} s in {collective} during {}, longer than \
         dist.timeout_s = {}; {missing}; ending the job",
        topology.rank,
        topology.host,
        waited.as_secs_f64(),
        doing(),
        limit.as_secs()
    );
    port.abort(1)
}
