//! The stop checkpoint that does not wait for the step in flight. At a job's time limit
//! slurmstepd sends SIGTERM (then SIGCONT and SIGTERM again) and kills the task `KillWait`
//! seconds later (30 by default, 5 on some clusters) whatever it is doing; the ranks' agreement
//! to stop travels with a step's gradient all-reduce, so a step of several seconds (a large
//! model, a busy node) can outlast the grace period and lose every step since the last
//! checkpoint.
//!
//! So rank 0 keeps the last completed step ready to save: parameters and optimizer state do not
//! change until the next optimizer step, and BatchNorm's running statistics, which every forward
//! pass changes, are copied after each step. A thread writes that checkpoint the moment a stop
//! signal arrives, while the step in flight goes on; the next optimizer step (and any other
//! checkpoint write) first waits for that write to finish. Nothing here is a collective, so no
//! rank waits for another. Training then stops as before, by agreement, after the step in
//! flight, with a checkpoint of its own when the job lives long enough; that newer checkpoint
//! replaces the rescued one, which the checkpoint policy never asked for.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tch::Tensor;

use crate::cluster::signals;
use crate::run_dir::checkpoint::{self, CheckpointMeta};

/// How often the saving thread looks for a stop request: well inside the 2 s within which a
/// stop checkpoint must be on disk.
const POLL: Duration = Duration::from_millis(20);

/// A checkpoint of the last completed step, ready to be written: the parameters and optimizer
/// state as the live tensors (unchanged until the next optimizer step), the BatchNorm buffers
/// as copies.
pub struct ReadyCheckpoint {
    pub path: PathBuf,
    pub meta: CheckpointMeta,
    pub model: Vec<(String, Tensor)>,
    pub optimizer: Vec<(String, Tensor)>,
}

impl ReadyCheckpoint {
    /// A checkpoint of `model_state` (the model's state dict, which shares the live tensors)
    /// in which every tensor that training changes outside the optimizer step (the BatchNorm
    /// buffers: they take no gradient) is copied now.
    pub fn new(
        path: PathBuf,
        meta: CheckpointMeta,
        model_state: Vec<(String, Tensor)>,
        optimizer: Vec<(String, Tensor)>,
    ) -> ReadyCheckpoint {
        let model = tch::no_grad(|| {
            model_state
                .into_iter()
                .map(|(name, tensor)| match tensor.requires_grad() {
                    true => (name, tensor),
                    false => (name, tensor.copy()),
                })
                .collect()
        });
        ReadyCheckpoint { path, meta, model, optimizer }
    }
}

struct Shared {
    /// The checkpoint to write on a stop request; None while the optimizer updates the tensors
    /// it would hold (or another checkpoint is being written). The saving thread holds the lock
    /// while it writes.
    ready: Mutex<Option<ReadyCheckpoint>>,
    /// Set when training is over: the thread ends.
    finished: AtomicBool,
    /// The checkpoint the thread wrote, until a newer one replaces it.
    written: Mutex<Option<PathBuf>>,
}

/// Rank 0's stop snapshot and the thread that writes it on a stop request.
pub struct StopSnapshot {
    shared: Arc<Shared>,
    saver: Option<JoinHandle<()>>,
}

impl StopSnapshot {
    /// Starts the thread that waits for a stop signal ([`signals::requested`]).
    pub fn start() -> std::io::Result<StopSnapshot> {
        let shared = Arc::new(Shared {
            ready: Mutex::new(None),
            finished: AtomicBool::new(false),
            written: Mutex::new(None),
        });
        let saver = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new().name("stop-checkpoint".into()).spawn(move || save_on_stop(&shared))?
        };
        Ok(StopSnapshot { shared, saver: Some(saver) })
    }

    /// Offers `ready` as the checkpoint to write on a stop request, in place of the last one.
    pub fn offer(&self, ready: ReadyCheckpoint) {
        *lock(&self.shared.ready) = Some(ready);
    }

    /// Withdraws the checkpoint on offer, waiting while it is being written: call it before
    /// changing the tensors it holds (the optimizer step) or writing a checkpoint of one's own.
    pub fn withdraw(&self) {
        *lock(&self.shared.ready) = None;
    }

    /// The checkpoint `newer` replaces the one written on the stop signal, if any: that one is
    /// deleted (so a stopped run holds one stop checkpoint, as the policy's retention expects).
    pub fn superseded_by(&self, newer: &Path) {
        let written = self.shared.written.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(rescued) = written.filter(|rescued| rescued != newer) {
            if let Err(error) = std::fs::remove_file(&rescued) {
                tracing::warn!(
                    "could not delete {} (replaced by {}): {error}",
                    rescued.display(),
                    newer.display()
                );
            }
        }
    }
}

impl Drop for StopSnapshot {
    fn drop(&mut self) {
        self.shared.finished.store(true, Ordering::SeqCst);
        if let Some(saver) = self.saver.take() {
            let _ = saver.join();
        }
    }
}

/// A poisoned lock only means a panic elsewhere (which ends the job); the data is still whole.
fn lock(ready: &Mutex<Option<ReadyCheckpoint>>) -> MutexGuard<'_, Option<ReadyCheckpoint>> {
    ready.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The saving thread: once a stop signal has arrived, writes the checkpoint on offer (or the
/// next one offered, when none is at that moment), once.
fn save_on_stop(shared: &Shared) {
    while !shared.finished.load(Ordering::SeqCst) {
        if signals::requested().is_some() {
            let mut ready = lock(&shared.ready);
            if let Some(ready) = ready.take() {
                let written = write(ready);
                *shared.written.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = written;
                return;
            }
        }
        std::thread::sleep(POLL);
    }
}

/// Writes `ready` unless the checkpoint policy already saved that step; returns the file
/// written.
fn write(ready: ReadyCheckpoint) -> Option<PathBuf> {
    let ReadyCheckpoint { path, meta, model, optimizer } = ready;
    if path.exists() {
        tracing::info!("stop signal: the last completed step is saved already ({})", path.display());
        return None;
    }
    let started = std::time::Instant::now();
    match tch::no_grad(|| checkpoint::save(&path, &meta, model, optimizer)) {
        Ok(_) => {
            tracing::info!(
                "stop signal: saved the last completed step (global step {}) to {} at once ({:.2} s); \
                 the step in flight goes on",
                meta.global_step,
                path.display(),
                started.elapsed().as_secs_f64()
            );
            Some(path)
        }
        Err(error) => {
            tracing::warn!("stop signal: could not save the last completed step: {error}");
            None
        }
    }
}
