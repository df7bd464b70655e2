//! One epoch of training steps: this rank's shard of the sampler's order through the loader, a
//! step per `train.accumulate` batches, the step reports ([`super::progress`]), and the step
//! checkpoints the policy asks for.

use std::sync::Arc;
use std::time::Instant;

use super::progress::{StepDone, StepReporter};
use super::step::MicroBatch;
use super::trainer::{EpochStart, Trainer};
use super::{policy, TrainError};
use crate::cluster::signals::Preempted;
use crate::cluster::watchdog;
use crate::cluster::Communicator;
use crate::data::dataset::Dataset;
use crate::data::loader::{Batch, Loader};
use crate::data::sampler::Sampler;
use crate::model::Model;
use crate::run_dir::checkpoint::EpochTotals;
use crate::run_dir::RunDir;

/// Trains epoch `epoch` from step `start.batch` on (with `start.totals`, the sums of the steps
/// before it, when resumed) on the samples `sampler` chooses from `dataset`; returns this
/// rank's sums of the epoch. Every rank calls it (each step is a collective, and so are the
/// step reports and checkpoints).
#[allow(clippy::too_many_arguments)]
pub fn train_epoch(
    trainer: &mut Trainer<'_>,
    model: &Model,
    dataset: &Arc<dyn Dataset>,
    sampler: &Sampler,
    comm: &dyn Communicator,
    out: &mut RunDir,
    start: EpochStart,
    epoch: u32,
) -> Result<EpochTotals, TrainError> {
    let mut totals = start.totals;
    let plan = trainer.plan();
    let steps_per_epoch = trainer.steps_per_epoch();
    let order = plan.rank_order(sampler, epoch);
    let batches = plan.epoch_batches(epoch, steps_per_epoch, start.batch);
    let mut loader =
        Loader::new(dataset.clone(), order, plan.train_transform(), batches, plan.train_loader());
    let accumulate = plan.accumulate();
    let mut reporter = StepReporter::new(
        epoch,
        plan.epochs(),
        start.batch,
        steps_per_epoch,
        plan.log_every_steps(),
        plan.topology.is_root(),
    );
    // Training time includes waiting for the loader (what an epoch costs), not logging and
    // checkpoints.
    let mut mark = Instant::now();
    // The loader yields the plan's batches of the epoch, from the resumed step's on.
    for step_in_epoch in start.batch + 1..=steps_per_epoch {
        let Some(step_batches) = next_step(&mut loader, accumulate, step_in_epoch, dataset, &mut totals)?
        else {
            break;
        };
        let micro_batches: Vec<MicroBatch<'_>> =
            step_batches.iter().map(|b| MicroBatch { images: &b.images, labels: &b.labels }).collect();
        let lr = trainer.lr();
        watchdog::set_phase("a training step", trainer.steps() + 1);
        let output = trainer.step(model, &micro_batches)?;
        let samples = output.samples;
        totals.loss_sum += output.loss * samples as f64;
        totals.correct += output.correct;
        totals.samples += samples;
        totals.seconds += mark.elapsed().as_secs_f64();
        let done = StepDone {
            epoch,
            step_in_epoch,
            global_step: trainer.steps(),
            lr,
            loss: output.loss,
            correct: output.correct,
            samples,
        };
        reporter.after_step(&done, comm, out)?;
        if output.stop && step_in_epoch == steps_per_epoch {
            // The epoch's own checkpoint, after its evaluation, is where to resume.
            trainer.stop_at_epoch_end();
        } else if output.stop {
            return Err(stop_mid_epoch(trainer, model, comm, out, epoch, step_in_epoch, &totals));
        }
        if policy::save_after_step(plan.checkpoints(), step_in_epoch, steps_per_epoch) {
            trainer.checkpoint_mid_epoch(model, comm, out, epoch, step_in_epoch, &totals)?;
        }
        trainer.offer_stop_snapshot(model, epoch, step_in_epoch, &totals)?;
        mark = Instant::now();
    }
    reporter.finish();
    Ok(totals)
}

/// The `accumulate` batches of step `step_in_epoch` from the loader (None when it has no more),
/// their skipped samples counted into `totals`.
fn next_step(
    loader: &mut Loader,
    accumulate: u64,
    step_in_epoch: u64,
    dataset: &Arc<dyn Dataset>,
    totals: &mut EpochTotals,
) -> Result<Option<Vec<Batch>>, TrainError> {
    let mut batches = Vec::with_capacity(usize::try_from(accumulate).unwrap_or(1));
    for _ in 0..accumulate {
        let Some(batch) = loader.next() else { return Ok(None) };
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
        batches.push(batch);
    }
    Ok(Some(batches))
}

/// Every rank agreed to stop after this step (a preemption signal reached one of them): rank
/// 0 checkpoints it, and no rank leaves before the checkpoint is on disk (a launcher kills the
/// others when one exits). Returns the error that ends the run. A collective.
fn stop_mid_epoch(
    trainer: &mut Trainer<'_>,
    model: &Model,
    comm: &dyn Communicator,
    out: &mut RunDir,
    epoch: u32,
    step_in_epoch: u64,
    totals: &EpochTotals,
) -> TrainError {
    let saved = trainer.checkpoint_mid_epoch(model, comm, out, epoch, step_in_epoch, totals);
    let saved = saved.and_then(|path| out.write_manifest().map(|()| path).map_err(TrainError::from));
    comm.barrier();
    match saved {
        Ok(checkpoint) => TrainError::Preempted(Preempted { global_step: trainer.steps(), checkpoint }),
        Err(error) => error,
    }
}
