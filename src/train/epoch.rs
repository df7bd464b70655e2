//! One epoch of training steps: this rank's shard of the sampler's order through the loader, a
//! step per `train.accumulate` batches, the step reports ([`super::progress`]), and the step
//! checkpoints the policy asks for.

use std::sync::Arc;
use std::time::Instant;

use super::phases::{self, Phase, PhaseTiming};
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
use crate::trace::TraceSource;

/// Trains epoch `epoch` from step `start.batch` on (with `start.totals`, the sums of the steps
/// before it, when resumed) on the samples `sampler` chooses from `dataset`, timing each step's
/// phases into `timing`; returns this rank's sums of the epoch. Every rank calls it (each step
/// is a collective, and so are the step reports, checkpoints and the step trace).
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
    timing: &mut PhaseTiming,
) -> Result<EpochTotals, TrainError> {
    let mut totals = start.totals;
    let plan = trainer.plan();
    let steps_per_epoch = trainer.steps_per_epoch();
    let mut loader = match plan.synthetic_input() {
        true => None,
        false => {
            let order = plan.rank_order(sampler, epoch);
            let batches = plan.epoch_batches(epoch, steps_per_epoch, start.batch);
            Some(Loader::new(dataset.clone(), order, plan.train_transform(), batches, plan.train_loader()))
        }
    };
    let synthetic = plan.synthetic_input().then(|| synthetic_batch(trainer, dataset.classes().len()));
    let accumulate = plan.accumulate();
    let rank = plan.topology.rank;
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
    timing.start_epoch();
    // The loader yields the plan's batches of the epoch, from the resumed step's on.
    for step_in_epoch in start.batch + 1..=steps_per_epoch {
        phases::slow_data_for_tests(rank, trainer.steps());
        let step_batches = match (&mut loader, &synthetic) {
            (Some(loader), _) => next_step(loader, accumulate, step_in_epoch, dataset, &mut totals)?,
            (None, Some(batch)) => Some((0..accumulate).map(|_| batch.shallow_clone()).collect()),
            (None, None) => None,
        };
        let Some(step_batches) = step_batches else { break };
        timing.clock.lap(Phase::Data);
        let micro_batches: Vec<MicroBatch<'_>> =
            step_batches.iter().map(|b| MicroBatch { images: &b.images, labels: &b.labels }).collect();
        let lr = trainer.lr();
        watchdog::set_phase("a training step", trainer.steps() + 1);
        let output = trainer.step(model, &micro_batches, &mut timing.clock)?;
        timing.end_step(trainer.steps(), trainer.allreduce_seconds());
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
        reporter.after_step(&done, comm, out, timing)?;
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
        if timing.trace_complete() {
            write_step_trace(timing, comm, out)?;
        }
        // Reporting, checkpoints and the snapshot are the next step's `other`.
        timing.clock.lap(Phase::Other);
        mark = Instant::now();
    }
    reporter.finish();
    Ok(totals)
}

/// `data.source = "synthetic"`: one batch of random images (standard normal, as normalised
/// pixels are) and labels, made once on the training device from the run's seed and the rank,
/// and trained on at every step: the steps without any input pipeline, as Horovod's synthetic
/// benchmark.
fn synthetic_batch(trainer: &Trainer<'_>, classes: usize) -> Batch {
    let plan = trainer.plan();
    let device = plan.compute.device;
    let side = i64::from(plan.image_size());
    let batch = i64::try_from(plan.batch_size()).unwrap_or(1);
    let seed = plan.seed().wrapping_add(plan.topology.rank as u64);
    tch::manual_seed(i64::from_ne_bytes(seed.to_ne_bytes()));
    let images = tch::Tensor::randn([batch, 3, side, side], (tch::Kind::Float, device));
    let labels = tch::Tensor::randint(classes.max(1) as i64, [batch], (tch::Kind::Int64, device));
    Batch { images, labels, indices: (0..plan.batch_size()).collect(), skipped: Vec::new() }
}

/// Ends the step trace and writes it: every rank's Kineto JSON gathered to rank 0, which writes
/// `trace/rank<R>.pt.trace.json` for each. A collective.
pub fn write_step_trace(
    timing: &mut PhaseTiming,
    comm: &dyn Communicator,
    out: &mut RunDir,
) -> Result<(), TrainError> {
    let Some((trace, steps)) = timing.finish_trace() else { return Ok(()) };
    let topology = comm.topology();
    let node = crate::cluster::hostname();
    let backend = "mpi";
    let source = TraceSource { rank: topology.rank, world_size: topology.world_size, node: &node, backend };
    let json = trace.kineto_bytes(&source);
    let traces = comm.all_gather_bytes(&json);
    let bytes = out.write_traces(&traces)?;
    if out.writes() {
        let dropped = match trace.dropped {
            0 => String::new(),
            n => format!(" ({n} spans past the cap of {} per rank left out)", crate::trace::MAX_EVENTS),
        };
        tracing::info!(
            "step trace of {steps} steps: {} ({:.2} MB for {} ranks){dropped}; open in https://ui.perfetto.dev or Holistic Trace Analysis",
            out.paths().trace(0).parent().unwrap_or(out.paths().root()).display(),
            bytes as f64 / 1e6,
            traces.len()
        );
    }
    Ok(())
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
