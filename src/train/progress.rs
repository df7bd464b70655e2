//! What the ranks say about training while an epoch runs: every `train.log_every_steps` steps
//! (and at the epoch's last) the step's loss and accuracy over every rank's batch and the
//! images per second since the last report, as a step record in `metrics.jsonl`, a log line
//! and the progress bar's message. Like torchvision's `MetricLogger` or burn's event
//! processor, it keeps reporting out of the epoch loop.

use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use super::phases::PhaseTiming;
use super::TrainError;
use crate::cluster::Communicator;
use crate::run_dir::records::StepRecord;
use crate::run_dir::RunDir;

/// One step's outcome on this rank, as the reporter needs it.
pub struct StepDone {
    pub epoch: u32,
    pub step_in_epoch: u64,
    pub global_step: u64,
    /// The learning rate the step was taken at.
    pub lr: f64,
    /// The mean loss over this rank's batch.
    pub loss: f64,
    pub correct: u64,
    pub samples: u64,
}

/// Reports the steps of one epoch; see the module documentation.
pub struct StepReporter {
    log_every_steps: u64,
    steps_per_epoch: u64,
    epochs: u32,
    is_root: bool,
    progress: ProgressBar,
    /// Since the last report: when it was, and the images this rank trained on since.
    window_start: Instant,
    window_images: u64,
}

impl StepReporter {
    /// A reporter for epoch `epoch` of `epochs`, with `steps_per_epoch` steps of which `done`
    /// are already taken (resumed). Only rank 0 (`is_root`) shows progress and logs.
    pub fn new(
        epoch: u32,
        epochs: u32,
        done: u64,
        steps_per_epoch: u64,
        log_every_steps: u64,
        is_root: bool,
    ) -> StepReporter {
        let progress = match is_root {
            true => progress_bar(steps_per_epoch, done, epoch, epochs),
            false => ProgressBar::hidden(),
        };
        StepReporter {
            log_every_steps,
            steps_per_epoch,
            epochs,
            is_root,
            progress,
            window_start: Instant::now(),
            window_images: 0,
        }
    }

    /// Counts a finished step, and reports it when it is due, with where the window's time
    /// went (`timing`). Every rank calls it after every step: a due report is a collective (its
    /// figures are summed and gathered over the ranks).
    pub fn after_step(
        &mut self,
        done: &StepDone,
        comm: &dyn Communicator,
        out: &mut RunDir,
        timing: &mut PhaseTiming,
    ) -> Result<(), TrainError> {
        self.window_images += done.samples;
        self.progress.inc(1);
        let due =
            done.step_in_epoch % self.log_every_steps == 0 || done.step_in_epoch == self.steps_per_epoch;
        if !due {
            return Ok(());
        }
        let mut sums = [
            done.loss * done.samples as f64,
            done.correct as f64,
            done.samples as f64,
            self.window_images as f64,
        ];
        comm.all_reduce_sum_f64(&mut sums);
        let (phases, seconds) = timing.window_report(comm);
        let (loss, accuracy) = (sums[0] / sums[2].max(1.0), sums[1] / sums[2].max(1.0));
        let rate = sums[3] / self.window_start.elapsed().as_secs_f64().max(1e-9);
        (self.window_start, self.window_images) = (Instant::now(), 0);
        let (epoch, step, lr) = (done.epoch, done.step_in_epoch, done.lr);
        out.log_step(StepRecord {
            epoch,
            step,
            global_step: done.global_step,
            loss,
            accuracy,
            lr,
            images_per_second: rate,
            seconds,
            phases: Some(phases),
        })?;
        self.progress.set_message(format!("loss {loss:.4} lr {lr:.4} {rate:.0} img/s"));
        if self.progress.is_hidden() && self.is_root {
            tracing::info!(
                "epoch {}/{} step {step}/{}: loss {loss:.4} lr {lr:.5} {rate:.1} img/s",
                epoch + 1,
                self.epochs,
                self.steps_per_epoch
            );
        }
        Ok(())
    }

    /// Clears the progress bar at the epoch's end.
    pub fn finish(&self) {
        self.progress.finish_and_clear();
    }
}

fn progress_bar(steps: u64, done: u64, epoch: u32, epochs: u32) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps).with_position(done);
    let style = ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg} ({eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(format!("{}/{epochs}", epoch + 1));
    bar
}
