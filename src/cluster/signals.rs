//! Preemption: SIGTERM (Slurm at the time limit, `scancel`, a container stop), SIGINT (Ctrl-C)
//! and SIGUSR1 (Slurm's `--signal=USR1@N` warning) ask training to stop cleanly. The handler
//! only records the request; the ranks agree on it through the next step's gradient
//! all-reduce (a flag in its last bucket, so no collective of its own), stop at that same step,
//! rank 0 writes a checkpoint, and every rank exits with [`PREEMPTED_EXIT_CODE`]; `--resume
//! auto` continues exactly.
//!
//! A second signal ends the process at once (an impatient Ctrl-C Ctrl-C), except a SIGTERM
//! that follows a first SIGTERM within [`REPEAT_WINDOW_NS`]: at a job's time limit Slurm's
//! slurmstepd sends every task SIGTERM, then SIGCONT and SIGTERM again 5-160 ms later, and
//! that pair is one request, which must still end in a checkpoint.
//!
//! Before the work that polls for the request starts ([`arm`]), during start-up (listing,
//! hashing and staging the data, reading weights), nothing would be lost by stopping and
//! nothing polls. A process alone ([`joined`] a job of one) ends at the first stop signal with
//! [`PREEMPTED_EXIT_CODE`], rather than after minutes of hashing a large dataset. The ranks of a
//! job of several only record it and stop together at [`arm`], one all-reduce: a rank that left
//! alone would take the others with it, since Open MPI aborts the job when a rank ends without
//! finalising (under `srun` the others are SIGKILLed and `srun` returns 137, not 75, and the job
//! script does not requeue), and a signal reaches the ranks at different points of start-up.
//! The handlers are installed as the command starts ([`install`], before MPI), so that only the
//! process's first instant (loading libtorch, about 0.2 s) dies of the signal itself.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

use super::Communicator;

/// The exit code of a run stopped by a signal after saving its checkpoint: 75, BSD's
/// EX_TEMPFAIL ("try again later"), which a job script can test before requeueing.
pub const PREEMPTED_EXIT_CODE: u8 = 75;

/// Why a start ended with [`PREEMPTED_EXIT_CODE`] and no checkpoint, as a process alone says it
/// on stderr and as [`StoppedDuringStartUp`] says it in a job of several.
const STOPPED_DURING_START_UP: &str =
    "stopped during start-up by a stop signal (SIGTERM, SIGINT or SIGUSR1): nothing to save yet; run it again";

/// The signals that ask for a clean stop.
pub const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGUSR1];

static RECEIVED: AtomicU32 = AtomicU32::new(0);
static ARMED: AtomicBool = AtomicBool::new(false);
/// The process is a job of one ([`joined`]): a stop before [`arm`] may end it at once.
static ALONE: AtomicBool = AtomicBool::new(false);
static FIRST_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// When the first stop signal arrived (CLOCK_MONOTONIC, nanoseconds).
static FIRST_AT_NS: AtomicU64 = AtomicU64::new(0);

/// A SIGTERM this soon after a first SIGTERM repeats it (Slurm's double SIGTERM at the time
/// limit: 5-160 ms apart, measured) rather than insisting: one second, as Slurm's own `srun`
/// takes two Ctrl-C within one second for one.
pub const REPEAT_WINDOW_NS: u64 = 1_000_000_000;

/// The job stopped, by agreement of all ranks, after a stop signal.
#[derive(Debug, thiserror::Error)]
#[error(
    "stopped at global step {global_step} by a stop signal (SIGTERM, SIGINT or SIGUSR1){}; \
     continue with --resume auto",
    .checkpoint.as_ref().map(|path| format!(", checkpoint {}", path.display())).unwrap_or_default()
)]
pub struct Preempted {
    pub global_step: u64,
    /// The checkpoint written at the stop (rank 0's path; None on the other ranks).
    pub checkpoint: Option<std::path::PathBuf>,
}

/// A job other than training (`rtrain predict --out`) stopped, by agreement of all ranks,
/// after a stop signal, with its finished work kept: the same command continues it.
#[derive(Debug, thiserror::Error)]
#[error(
    "{what} stopped by a stop signal (SIGTERM, SIGINT or SIGUSR1); run the same command again to continue"
)]
pub struct StoppedBySignal {
    /// What stopped and how far it got, e.g. "prediction into out/ (3 of 8 parts done)".
    pub what: String,
}

/// The ranks of a job agreed at [`arm`] to stop: a stop signal reached one of them during
/// start-up, before any work worth saving.
#[derive(Debug, thiserror::Error)]
#[error("{}", STOPPED_DURING_START_UP)]
pub struct StoppedDuringStartUp;

/// Whether a command's error is a clean stop after a stop signal ([`Preempted`],
/// [`StoppedBySignal`] or [`StoppedDuringStartUp`]): every rank stopped at the same point, so it
/// is not one rank's failure, and the exit status says "try again" ([`PREEMPTED_EXIT_CODE`]).
pub fn is_clean_stop(error: &anyhow::Error) -> bool {
    error.downcast_ref::<Preempted>().is_some()
        || error.downcast_ref::<StoppedBySignal>().is_some()
        || error.downcast_ref::<StoppedDuringStartUp>().is_some()
}

/// Says [`STOPPED_DURING_START_UP`] and ends the process with [`PREEMPTED_EXIT_CODE`], running
/// nothing else; async-signal-safe.
fn exit_stopped_during_start_up() -> ! {
    // SAFETY: write(2) and _exit are async-signal-safe; the buffers are valid statics.
    // Start-up work has nothing to save, and "try again" is the truth.
    unsafe {
        for said in ["error: ", STOPPED_DURING_START_UP, "\n"] {
            libc::write(libc::STDERR_FILENO, said.as_ptr().cast(), said.len());
        }
        libc::_exit(libc::c_int::from(PREEMPTED_EXIT_CODE))
    }
}

extern "C" fn on_stop_signal(signal: libc::c_int) {
    // Only async-signal-safe work here: atomics, and _exit for the second signal.
    if ALONE.load(Ordering::SeqCst) && !ARMED.load(Ordering::SeqCst) {
        // Said, so that a log shows why this start ended with 75 and no checkpoint.
        exit_stopped_during_start_up();
    }
    let now = monotonic_ns();
    if RECEIVED.fetch_add(1, Ordering::SeqCst) > 0 {
        let first = FIRST_SIGNAL.load(Ordering::SeqCst);
        let since_first = now.saturating_sub(FIRST_AT_NS.load(Ordering::SeqCst));
        if is_repeat(first, signal, since_first) {
            return;
        }
        // SAFETY: _exit is async-signal-safe and ends the process without running anything else.
        unsafe { libc::_exit(128 + signal) };
    }
    FIRST_AT_NS.store(now, Ordering::SeqCst);
    FIRST_SIGNAL.store(signal, Ordering::SeqCst);
}

/// Whether `signal`, `since_first_ns` after the first stop signal `first`, repeats it (Slurm's
/// second SIGTERM) instead of asking to end at once.
pub fn is_repeat(first: libc::c_int, signal: libc::c_int, since_first_ns: u64) -> bool {
    first == libc::SIGTERM && signal == libc::SIGTERM && since_first_ns < REPEAT_WINDOW_NS
}

/// CLOCK_MONOTONIC in nanoseconds; async-signal-safe (clock_gettime is, by POSIX).
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(now.tv_nsec).unwrap_or(0)
}

/// Routes the stop signals to [`requested`] for the rest of the process's life.
pub fn install() -> std::io::Result<()> {
    for signal in STOP_SIGNALS {
        // SAFETY: a zeroed sigaction is a valid starting point; the handler is an extern "C"
        // fn of the expected signature that only touches atomics and calls _exit.
        let failed = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut()) != 0
        };
        if failed {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The process knows its job's size: alone, a stop signal before [`arm`] ends it at once, and
/// one that came before this call (while MPI started) ends it now.
pub fn joined(world_size: usize) {
    if world_size == 1 {
        ALONE.store(true, Ordering::SeqCst);
        if requested().is_some() && !ARMED.load(Ordering::SeqCst) {
            exit_stopped_during_start_up();
        }
    }
}

/// Start-up is over: from now on a stop signal is only recorded, for the work that polls
/// [`requested`] to stop at its next step. In a job of several ranks, first a collective: the
/// ranks agree whether one of them received a stop signal during start-up, and all stop if so.
pub fn arm(comm: &dyn Communicator) -> Result<(), StoppedDuringStartUp> {
    if comm.topology().world_size > 1 {
        let mut stops = [f64::from(u8::from(requested().is_some()))];
        comm.all_reduce_sum_f64(&mut stops);
        if stops[0] > 0.0 {
            return Err(StoppedDuringStartUp);
        }
    }
    // A signal from here on (on this rank or a slower one) is recorded, and the first step's
    // agreement stops every rank.
    ARMED.store(true, Ordering::SeqCst);
    Ok(())
}

/// The first stop signal this process received, if any.
pub fn requested() -> Option<i32> {
    match FIRST_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_prompt_second_sigterm_repeats_the_first() {
        let ms = 1_000_000;
        assert!(is_repeat(libc::SIGTERM, libc::SIGTERM, 5 * ms), "Slurm's pair, 5 ms apart");
        assert!(is_repeat(libc::SIGTERM, libc::SIGTERM, 160 * ms), "and 160 ms apart");
        assert!(!is_repeat(libc::SIGTERM, libc::SIGTERM, 1500 * ms), "a later kill insists");
        assert!(!is_repeat(libc::SIGINT, libc::SIGINT, 100 * ms), "Ctrl-C Ctrl-C ends at once");
        assert!(!is_repeat(libc::SIGUSR1, libc::SIGTERM, 5 * ms), "a TERM after USR1 insists");
        assert!(!is_repeat(libc::SIGTERM, libc::SIGINT, 5 * ms));
    }
}
