//! One epoch of training steps: this rank's shard of the epoch's permutation through the
//! loader, a step per batch, the step records (reduced over the ranks), and the step
//! checkpoints the policy asks for.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use super::trainer::Trainer;
use super::{policy, reduce_totals, sync_buffers, TrainError};
use crate::cluster::signals::Preempted;
use crate::cluster::watchdog;
use crate::cluster::Communicator;
use crate::data::dataset::Dataset;
use crate::data::loader::Loader;
use crate::data::sampler;
use crate::model::Model;
use crate::run_dir::checkpoint::EpochTotals;
use crate::run_dir::records::StepRecord;
use crate::run_dir::RunDir;

/// Trains epoch `epoch` from batch `start_batch` on (with the sums of the steps before it,
/// when resumed); returns this rank's sums of the epoch. Every rank calls it (each step is a
/// collective, and so are the step records and checkpoints).
pub fn train_epoch(
    trainer: &mut Trainer<'_>,
    model: &Model,
    dataset: &Arc<dyn Dataset>,
    comm: &dyn Communicator,
    out: &mut RunDir,
    (start_batch, mut totals): (usize, EpochTotals),
    epoch: u32,
) -> Result<EpochTotals, TrainError> {
    let plan = trainer.plan;
    let config = &plan.config;
    let topology = &plan.topology;
    let steps_per_epoch = trainer.steps_per_epoch;
    let permutation = sampler::epoch_permutation(dataset.len(), config.run.seed, u64::from(epoch));
    let order = sampler::rank_shard(&permutation, topology.rank, topology.world_size, config.dist.uneven);
    let loader = Loader::new(
        dataset.clone(),
        order,
        plan.train_transform(),
        config.run.seed,
        u64::from(epoch),
        start_batch,
        plan.train_loader(),
    );
    let progress = match topology.is_root() {
        true => progress_bar(steps_per_epoch, start_batch as u64, epoch, config.train.epochs),
        false => ProgressBar::hidden(),
    };
    let mut window = (Instant::now(), 0u64);
    // Training time includes waiting for the loader (what an epoch costs), not logging and
    // checkpoints.
    let mut mark = Instant::now();
    for (step_in_epoch, batch) in (start_batch as u64 + 1..=steps_per_epoch).zip(loader) {
        let batch = batch?;
        for bad in &batch.skipped {
            tracing::warn!("skipped an undecodable sample (data.on_bad_sample = skip): {bad}");
        }
        totals.skipped += batch.skipped.len() as u64;
        if batch.indices.is_empty() {
            // Every rank must take every step (the gradient all-reduce), so an empty batch
            // cannot simply be passed over.
            return Err(TrainError::EmptyBatch { step: step_in_epoch, dir: dataset.root().to_path_buf() });
        }
        let lr = trainer.lr();
        watchdog::set_phase("a training step", trainer.steps() + 1);
        let output = trainer.step(model, &batch.images, &batch.labels)?;
        let samples = batch.indices.len() as u64;
        totals.loss_sum += output.loss * samples as f64;
        totals.correct += output.correct;
        totals.samples += samples;
        totals.seconds += mark.elapsed().as_secs_f64();
        window.1 += samples;
        progress.inc(1);

        if step_in_epoch % config.train.log_every_steps == 0 || step_in_epoch == steps_per_epoch {
            // Global values: the step's loss and accuracy over every rank's batch. A collective.
            let mut sums =
                [output.loss * samples as f64, output.correct as f64, samples as f64, window.1 as f64];
            comm.all_reduce_sum_f64(&mut sums);
            let (loss, accuracy) = (sums[0] / sums[2].max(1.0), sums[1] / sums[2].max(1.0));
            let rate = sums[3] / window.0.elapsed().as_secs_f64().max(1e-9);
            window = (Instant::now(), 0);
            out.log_step(StepRecord {
                epoch,
                step: step_in_epoch,
                global_step: trainer.steps(),
                loss,
                accuracy,
                lr,
                images_per_second: rate,
            })?;
            progress.set_message(format!("loss {loss:.4} lr {lr:.4} {rate:.0} img/s"));
            if progress.is_hidden() && topology.is_root() {
                tracing::info!(
                    "epoch {}/{} step {step_in_epoch}/{steps_per_epoch}: loss {loss:.4} lr {lr:.5} {rate:.1} img/s",
                    epoch + 1,
                    config.train.epochs
                );
            }
        }
        if output.stop && step_in_epoch == steps_per_epoch {
            // The epoch's own checkpoint, after its evaluation, is where to resume.
            trainer.stop_at_epoch_end = true;
        } else if output.stop {
            return Err(stop_mid_epoch(trainer, model, comm, out, (epoch, step_in_epoch), &totals));
        }
        if policy::save_after_step(&config.checkpoint, step_in_epoch, steps_per_epoch) {
            let so_far = reduce_totals(comm, &totals);
            sync_buffers(comm, model);
            trainer.save_checkpoint(model, out, epoch, step_in_epoch, so_far)?;
        }
        mark = Instant::now();
    }
    progress.finish_and_clear();
    Ok(totals)
}

/// Every rank agreed to stop after this step (a preemption signal reached one of them): rank
/// 0 checkpoints it, and no rank leaves before the checkpoint is on disk (a launcher kills the
/// others when one exits). Returns the error that ends the run. A collective.
fn stop_mid_epoch(
    trainer: &mut Trainer<'_>,
    model: &Model,
    comm: &dyn Communicator,
    out: &mut RunDir,
    (epoch, step_in_epoch): (u32, u64),
    totals: &EpochTotals,
) -> TrainError {
    let so_far = reduce_totals(comm, totals);
    sync_buffers(comm, model);
    let saved = trainer.save_checkpoint(model, out, epoch, step_in_epoch, so_far);
    let saved = saved.and_then(|path| out.write_manifest().map(|()| path).map_err(TrainError::from));
    comm.barrier();
    match saved {
        Ok(checkpoint) => TrainError::Preempted(Preempted { global_step: trainer.steps(), checkpoint }),
        Err(error) => error,
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
