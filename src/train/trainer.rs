//! What trains the model and remembers where training stands: the optimizer and its
//! learning-rate schedule, the gradient sync, the loss's class weights, the best and last
//! validation scores, early stopping. It takes
//! steps, restores from a checkpoint, and describes itself for checkpoints and the summary.
//! None of its methods is a collective except [`Trainer::step`] (through the gradient sync)
//! and [`Trainer::checkpoint_mid_epoch`].

use std::path::{Path, PathBuf};
use std::time::Instant;

use tch::Tensor;

use super::early_stop::EarlyStopping;
use super::optim::{Optimizer, Schedule};
use super::phases::PhaseClock;
use super::policy;
use super::step::{self, GradientSync, MicroBatch, StepContext, StepOutput};
use super::stop_snapshot::{ReadyCheckpoint, StopSnapshot};
use super::{reduce_totals, sync_buffers, Splits, TrainError};
use crate::cluster::Communicator;
use crate::model::Model;
use crate::plan::RunPlan;
use crate::run_dir::checkpoint::{self, CheckpointError, CheckpointMeta, EpochTotals, WeightsMeta};
use crate::run_dir::preprocessing::Preprocessing;
use crate::run_dir::records::EvalReport;
use crate::run_dir::records::{EarlyStop, EpochRecord, PhaseReport, Summary};
use crate::run_dir::{RunDir, RunPaths};
use crate::util::files;

/// Where training stands: the epoch in progress, how many of its steps are done, and the
/// training sums of those steps.
#[derive(Debug, Default, Clone, Copy)]
pub struct Position {
    pub epoch: u32,
    pub step_in_epoch: u64,
    /// Optimizer steps taken in all.
    pub global_step: u64,
    pub totals: EpochTotals,
}

impl Position {
    /// Where epoch `epoch` starts on this rank, and the sums it starts from: after the resumed
    /// steps in the epoch training resumed in, else at its beginning. The checkpointed sums are
    /// global: rank 0 (`carries_totals`) carries them, the others start from zero.
    pub fn within(&self, epoch: u32, carries_totals: bool) -> EpochStart {
        let batch = if epoch == self.epoch { self.step_in_epoch } else { 0 };
        let carried = epoch == self.epoch && carries_totals;
        EpochStart { batch, totals: if carried { self.totals } else { EpochTotals::default() } }
    }
}

/// Where an epoch starts on this rank: its first batch to train (after the resumed ones) and
/// this rank's sums of the steps before it.
#[derive(Debug, Default, Clone, Copy)]
pub struct EpochStart {
    pub batch: u64,
    pub totals: EpochTotals,
}

pub struct Trainer<'a> {
    plan: &'a RunPlan,
    optimizer: Optimizer,
    schedule: Schedule,
    /// Local until the ranks have joined a synchronisation ([`Trainer::join_gradient_sync`]).
    sync: GradientSync,
    classes: Vec<String>,
    steps_per_epoch: u64,
    best_val_top1: Option<f64>,
    last_val_top1: Option<f64>,
    /// Over the epochs trained in this process (not the resumed ones).
    trained_images: u64,
    trained_seconds: f64,
    final_eval: Option<EvalReport>,
    /// The ranks agreed to stop at an epoch's last step: stop once the epoch is evaluated and
    /// checkpointed (the same on every rank).
    stop_at_epoch_end: bool,
    /// `train.class_weights` resolved, on the model's device.
    class_weights: Option<Tensor>,
    early_stopping: EarlyStopping,
    /// Set once early stopping has ended training (the same on every rank).
    stopped_early: Option<EarlyStop>,
    /// Rank 0's last completed step, written the moment a stop signal arrives, and the run
    /// directory it goes into ([`Self::keep_stop_snapshot`]).
    stop_snapshot: Option<(StopSnapshot, RunPaths)>,
    /// The configuration's hash, which every checkpoint records: computed once, not at every
    /// step's stop snapshot.
    config_hash: String,
    /// Evaluations after the epochs and epoch checkpoints, in this process (rank 0's clock).
    eval_seconds: f64,
    checkpoint_seconds: f64,
}

impl<'a> Trainer<'a> {
    /// A trainer of `model` on `classes`, taking `steps_per_epoch` optimizer steps an epoch,
    /// with the loss's `class_weights` (None: all 1).
    pub fn new(
        plan: &'a RunPlan,
        model: &Model,
        classes: &[String],
        steps_per_epoch: u64,
        class_weights: Option<&[f64]>,
    ) -> Result<Trainer<'a>, TrainError> {
        let class_weights = class_weights.map(|weights| {
            Tensor::from_slice(weights).to_kind(tch::Kind::Float).to_device(plan.compute.device)
        });
        Ok(Trainer {
            plan,
            optimizer: Optimizer::new(plan.optim(), model.trainable()),
            schedule: Schedule::new(plan.schedule(), plan.optim().lr, steps_per_epoch, plan.epochs()),
            sync: GradientSync::Local,
            classes: classes.to_vec(),
            steps_per_epoch,
            best_val_top1: None,
            last_val_top1: None,
            trained_images: 0,
            trained_seconds: 0.0,
            final_eval: None,
            stop_at_epoch_end: false,
            class_weights,
            early_stopping: EarlyStopping::new(plan.early_stopping()),
            stopped_early: None,
            stop_snapshot: None,
            config_hash: plan.digest()?,
            eval_seconds: 0.0,
            checkpoint_seconds: 0.0,
        })
    }

    /// From here on, rank 0 (the rank that writes `out`) keeps each completed step ready to be
    /// checkpointed the moment a stop signal arrives, without waiting for the step in flight
    /// ([`super::stop_snapshot`]). The other ranks have nothing to write.
    pub fn keep_stop_snapshot(&mut self, out: &RunDir) -> Result<(), TrainError> {
        if out.writes() {
            let snapshot = StopSnapshot::start().map_err(TrainError::StopSnapshot)?;
            self.stop_snapshot = Some((snapshot, out.paths().clone()));
        }
        Ok(())
    }

    /// Offers the state after step `step_in_epoch` of epoch `epoch` (with the epoch's sums so
    /// far) as the checkpoint to write on a stop signal. Call it once a step is done. In a job
    /// of several ranks the sums are rank 0's own: the global ones would take a collective,
    /// which a rank stopped by the time limit cannot wait for; they only feed the epoch's
    /// logged training loss and accuracy, never the weights.
    pub fn offer_stop_snapshot(
        &self,
        model: &Model,
        epoch: u32,
        step_in_epoch: u64,
        totals: &EpochTotals,
    ) -> Result<(), TrainError> {
        let Some((snapshot, paths)) = &self.stop_snapshot else { return Ok(()) };
        let meta = self.checkpoint_meta(model, epoch, step_in_epoch, *totals);
        let path = paths.step_checkpoint(meta.global_step);
        let state = model.state_dict().into_iter().collect();
        snapshot.offer(ReadyCheckpoint::new(path, meta, state, self.optimizer.state_tensors()));
        Ok(())
    }

    pub fn plan(&self) -> &'a RunPlan {
        self.plan
    }

    /// Optimizer steps per epoch, from the plan.
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    /// Averages gradients with the other ranks from the next step on, through `sync` (which
    /// the ranks joined together: `train::run`'s `join_gradient_sync`).
    pub fn join_gradient_sync(&mut self, sync: GradientSync) {
        self.sync = sync;
    }

    /// The ranks agreed to stop at the end of this epoch, once it is evaluated and
    /// checkpointed.
    pub fn stop_at_epoch_end(&mut self) {
        self.stop_at_epoch_end = true;
    }

    /// Whether the run stops after the epoch just finished ([`Self::stop_at_epoch_end`]);
    /// equal on every rank.
    pub fn stops_at_epoch_end(&self) -> bool {
        self.stop_at_epoch_end
    }

    /// Set once early stopping has ended training: the epochs left are not trained. Equal on
    /// every rank.
    pub fn stopped_early(&self) -> Option<&EarlyStop> {
        self.stopped_early.as_ref()
    }

    /// Optimizer steps taken in all.
    pub fn steps(&self) -> u64 {
        self.optimizer.steps()
    }

    /// The learning rate of the next step.
    pub fn lr(&self) -> f64 {
        self.schedule.lr(self.optimizer.steps())
    }

    /// One training step over `micro_batches` (`train.accumulate` of them) at [`Self::lr`]. A
    /// collective with more than one rank.
    pub fn step(
        &mut self,
        model: &Model,
        micro_batches: &[MicroBatch<'_>],
        clock: &mut PhaseClock,
    ) -> Result<StepOutput, TrainError> {
        let lr = self.lr();
        let context = StepContext {
            model,
            compute: &self.plan.compute,
            label_smoothing: self.plan.label_smoothing(),
            class_weights: self.class_weights.as_ref(),
            before_update: self.stop_snapshot.as_ref().map(|(snapshot, _)| snapshot),
        };
        Ok(step::train_step(&context, &mut self.optimizer, &mut self.sync, micro_batches, lr, clock)?)
    }

    /// The gradient communication thread's seconds in all-reduces so far.
    pub fn allreduce_seconds(&self) -> f64 {
        self.sync.allreduce_seconds()
    }

    /// Restores the model and the optimizer from `path`, refusing a checkpoint of another
    /// model or class list; returns where training stands. Writes nothing.
    pub fn restore(&mut self, model: &Model, path: &Path) -> Result<Position, TrainError> {
        let checkpoint = checkpoint::load(path, Some((model.arch, model.num_classes)))?;
        let meta = &checkpoint.meta;
        if meta.head_hidden != model.head_hidden {
            return Err(CheckpointError::Mismatch {
                path: path.to_path_buf(),
                found: format!("model.head_hidden = {:?}", meta.head_hidden),
                expected: format!("model.head_hidden = {:?}", model.head_hidden),
            }
            .into());
        }
        if meta.classes != self.classes {
            return Err(CheckpointError::Mismatch {
                path: path.to_path_buf(),
                found: format!("classes {:?}", meta.classes),
                expected: format!("classes {:?}", self.classes),
            }
            .into());
        }
        let accumulate = self.plan.accumulate();
        if meta.step_in_epoch > 0 && u64::from(meta.accumulate) != accumulate {
            return Err(CheckpointError::Mismatch {
                path: path.to_path_buf(),
                found: format!("train.accumulate = {} after step {} of an epoch", meta.accumulate, meta.step_in_epoch),
                expected: format!(
                    "train.accumulate = {accumulate} (a step's batches would shift: resume mid-epoch with the same value, or from an epoch's checkpoint)"
                ),
            }
            .into());
        }
        if meta.config_hash != self.config_hash {
            tracing::warn!(
                "{}: made with another configuration; resuming with the current one",
                path.display()
            );
        }
        model.restore(&checkpoint.model, path)?;
        self.optimizer.load_state(&checkpoint.optimizer, meta.global_step)?;
        self.schedule.restore_plateau(meta.plateau.clone());
        self.last_val_top1 = meta.val_top1;
        self.best_val_top1 = meta.best_val_top1;
        self.early_stopping.restore(meta.early_stopping.clone());
        // A checkpoint taken as early stopping ended the run: nothing is left to train.
        if meta.step_in_epoch == 0 && meta.epoch < self.plan.epochs() {
            self.stopped_early = self.early_stopping.stop_after(meta.epoch);
            if let Some(stop) = &self.stopped_early {
                tracing::info!(
                    "{}: taken when early stopping ended its run ({}); nothing is left to train (raise \
                     train.early_stopping.patience, or set its metric to \"none\", to train on)",
                    path.display(),
                    stop.reason()
                );
            }
        }
        tracing::info!(
            "resumed from {} at epoch {} step {} (global step {})",
            path.display(),
            meta.epoch,
            meta.step_in_epoch,
            meta.global_step
        );
        Ok(Position {
            epoch: meta.epoch,
            step_in_epoch: meta.step_in_epoch,
            global_step: meta.global_step,
            totals: meta.epoch_totals,
        })
    }

    /// Checkpoints training where it stands in the middle of an epoch, after step
    /// `step_in_epoch` of epoch `epoch`, with this rank's sums of the epoch so far (`local`).
    /// A collective, the one way to checkpoint mid-epoch: the sums are added up over the ranks
    /// and every rank takes rank 0's BatchNorm statistics (so the checkpoint holds the model
    /// every rank goes on with), then rank 0 writes. Returns the checkpoint's path on rank 0.
    pub fn checkpoint_mid_epoch(
        &self,
        model: &Model,
        comm: &dyn Communicator,
        out: &mut RunDir,
        epoch: u32,
        step_in_epoch: u64,
        local: &EpochTotals,
    ) -> Result<Option<PathBuf>, TrainError> {
        let global = reduce_totals(comm, local);
        sync_buffers(comm, model);
        self.write_checkpoint(model, out, epoch, step_in_epoch, global)
    }

    /// Writes a checkpoint of `model` at `epoch`/`step_in_epoch` with the epoch's global sums
    /// so far, on rank 0 (the others return at once). Not a collective: the callers
    /// ([`Self::checkpoint_mid_epoch`], and [`Self::finish_epoch`] after the loop reduced and
    /// synced) make the ranks agree first. A model or optimizer state that is no longer finite
    /// is an error, and nothing is written.
    fn write_checkpoint(
        &self,
        model: &Model,
        out: &mut RunDir,
        epoch: u32,
        step_in_epoch: u64,
        totals: EpochTotals,
    ) -> Result<Option<PathBuf>, TrainError> {
        if !out.writes() {
            return Ok(None);
        }
        // The stop snapshot is of an older step than this, and its file may be this one.
        if let Some((snapshot, _)) = &self.stop_snapshot {
            snapshot.withdraw();
        }
        let meta = self.checkpoint_meta(model, epoch, step_in_epoch, totals);
        let tensors: Vec<(String, Tensor)> = model.state_dict().into_iter().collect();
        let optimizer = self.optimizer.state_tensors();
        let when = format!("checkpoint at step {}", meta.global_step);
        check_finite(&when, tensors.iter().chain(&optimizer))?;
        let keep_last = self.plan.checkpoints().keep_last;
        let retention = |present: &[(u64, PathBuf)]| policy::retention(present, keep_last);
        let saved = out.save_checkpoint(&meta, tensors, optimizer, retention)?;
        if let (Some((snapshot, _)), Some(path)) = (&self.stop_snapshot, &saved) {
            snapshot.superseded_by(path);
        }
        Ok(saved)
    }

    /// What a checkpoint after step `step_in_epoch` of epoch `epoch` says of training, with the
    /// epoch's sums so far.
    fn checkpoint_meta(
        &self,
        model: &Model,
        epoch: u32,
        step_in_epoch: u64,
        totals: EpochTotals,
    ) -> CheckpointMeta {
        let plan = self.plan;
        CheckpointMeta {
            arch: model.arch,
            num_classes: model.num_classes,
            classes: self.classes.clone(),
            head_hidden: model.head_hidden.clone(),
            epoch,
            step_in_epoch,
            global_step: self.optimizer.steps(),
            seed: plan.seed(),
            image_size: Some(plan.image_size()),
            preprocessing: Some(Preprocessing::of_config(plan.recorded_config())),
            config_hash: self.config_hash.clone(),
            val_top1: self.last_val_top1,
            best_val_top1: self.best_val_top1,
            epoch_totals: totals,
            plateau: self.schedule.plateau_state(),
            early_stopping: self.early_stopping.state(),
            accumulate: u32::try_from(plan.accumulate()).unwrap_or(u32::MAX),
            rtrain_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// Logs a finished epoch (its global training sums and evaluation), and saves what the
    /// checkpoint policy asks for. No collective: call it after the epoch's sums are reduced
    /// and the buffers synced (`train::run` does both before evaluating).
    pub fn finish_epoch(
        &mut self,
        model: &Model,
        epoch: u32,
        totals: &EpochTotals,
        val: EvalReport,
        (phases, eval_seconds): (PhaseReport, f64),
        out: &mut RunDir,
    ) -> Result<(), TrainError> {
        let epochs = self.plan.epochs();
        if let (Some(straggler), true) = (&phases.straggler, out.writes()) {
            tracing::warn!("epoch {}: straggler: {}", epoch + 1, straggler.describe());
        }
        let samples = totals.samples.max(1) as f64;
        let record = EpochRecord {
            epoch,
            global_step: self.optimizer.steps(),
            train_loss: totals.loss_sum / samples,
            train_accuracy: totals.correct as f64 / samples,
            train_images_per_second: totals.samples as f64 / totals.seconds.max(1e-9),
            lr: self.schedule.lr(self.optimizer.steps().saturating_sub(1)),
            seconds: totals.seconds,
            skipped_samples: totals.skipped,
            val,
            phases: Some(phases),
            eval_seconds,
        };
        self.eval_seconds += eval_seconds;
        if totals.skipped > 0 {
            tracing::warn!("epoch {}: skipped {} undecodable training samples", epoch + 1, totals.skipped);
        }
        tracing::info!(
            "epoch {}/{}: train loss {:.4} acc {:.4} ({:.1} img/s) | val loss {:.4} top-1 {:.4} per class {:?}",
            epoch + 1,
            epochs,
            record.train_loss,
            record.train_accuracy,
            record.train_images_per_second,
            record.val.loss,
            record.val.top1,
            record.val.per_class.iter().map(|a| (a * 1000.0).round() / 1000.0).collect::<Vec<_>>()
        );
        tracing::info!("confusion (rows: true class, columns: predicted): {:?}", record.val.confusion);
        if !record.val.loss.is_finite() {
            return Err(TrainError::NotFinite {
                when: format!("epoch {}", epoch + 1),
                what: format!("validation loss ({})", record.val.loss),
            });
        }
        if let Some(lr) = self.schedule.after_evaluation(record.val.loss, record.val.top1) {
            tracing::info!(
                "epoch {}: no improvement for schedule.patience epochs: learning rate reduced to {lr:e}",
                epoch + 1
            );
        }
        self.trained_images += totals.samples;
        self.trained_seconds += totals.seconds;
        let top1 = record.val.top1;
        self.final_eval = Some(record.val.clone());
        // Patience running out after the last epoch is no early stop.
        let stop = self.early_stopping.after_evaluation(epoch, &record.val);
        self.stopped_early = stop.filter(|_| epoch + 1 < epochs);
        out.log_epoch(record)?;
        self.last_val_top1 = Some(top1);
        let is_best = policy::is_best(self.best_val_top1, top1);
        if is_best {
            self.best_val_top1 = Some(top1);
        }
        if let Some(stop) = &self.stopped_early {
            tracing::info!("early stopping after epoch {} of {}: {}", epoch + 1, epochs, stop.reason());
        }
        let actions = policy::after_epoch(self.plan.checkpoints(), epoch, epochs, is_best);
        // A stop at the epoch's end resumes from its checkpoint, whatever the policy says, and
        // the last epoch of an early stop is the run's last.
        if actions.save || self.stop_at_epoch_end || self.stopped_early.is_some() {
            let started = Instant::now();
            let saved = self.write_checkpoint(model, out, epoch + 1, 0, EpochTotals::default())?;
            if let (Some(path), true) = (saved, actions.keep_as_best) {
                out.save_best(&path)?;
            }
            self.checkpoint_seconds += started.elapsed().as_secs_f64();
        }
        out.write_manifest()?;
        Ok(())
    }

    /// Forgets the best validation top-1 a checkpoint carried: its `best.safetensors` lies in
    /// the run directory it came from, not this one, so the best is tracked afresh from here.
    pub fn forget_best(&mut self) {
        self.best_val_top1 = None;
    }

    /// Whether the run has a best checkpoint (`checkpoint.keep_best` and an evaluation done);
    /// equal on every rank.
    pub fn has_best_checkpoint(&self) -> bool {
        self.plan.checkpoints().keep_best && self.best_val_top1.is_some()
    }

    /// What the final weights file says of the model.
    pub fn weights_meta(&self, model: &Model) -> WeightsMeta {
        WeightsMeta {
            arch: model.arch,
            num_classes: model.num_classes,
            classes: self.classes.clone(),
            head_hidden: model.head_hidden.clone(),
            image_size: Some(self.plan.image_size()),
            preprocessing: Some(Preprocessing::of_config(self.plan.recorded_config())),
            calibration: None,
            global_step: self.optimizer.steps(),
            rtrain_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// What `summary.json` says of the run (the final weights' path and hash are the run
    /// directory's to fill in).
    pub fn summary(&self, data: &Splits, started: Instant, resumed_from: Option<PathBuf>) -> Summary {
        let topology = &self.plan.topology;
        Summary {
            arch: self.plan.model().arch.to_string(),
            classes: self.classes.clone(),
            epochs: self.plan.epochs(),
            global_steps: self.optimizer.steps(),
            train_images: data.train.len(),
            val_images: data.val.len(),
            final_eval: self.final_eval.clone(),
            best_val_top1: self.best_val_top1,
            best_epoch: None,
            best_eval: None,
            wall_seconds: started.elapsed().as_secs_f64(),
            train_images_per_second: if self.trained_seconds > 0.0 {
                self.trained_images as f64 / self.trained_seconds
            } else {
                0.0
            },
            peak_rss_mib: crate::util::memory::peak_rss_mib(),
            threads: self.plan.threads,
            world_size: topology.world_size,
            nodes: topology.nodes,
            global_batch_size: self.plan.global_batch_size(),
            weights: PathBuf::new(),
            weights_sha256: String::new(),
            resumed_from,
            stopped_early: self.stopped_early.clone(),
            phases: None,
            eval_seconds: self.eval_seconds,
            checkpoint_seconds: self.checkpoint_seconds,
            gradient_bytes: 0,
        }
    }
}

/// Refuses tensors holding NaN or infinity (a diverged run), before anything is saved from
/// them; `when` says what was about to be saved.
pub fn check_finite<'t>(
    when: &str,
    tensors: impl IntoIterator<Item = &'t (String, Tensor)>,
) -> Result<(), TrainError> {
    match files::first_non_finite(tensors.into_iter().map(|(name, tensor)| (name, tensor))) {
        Some(name) => Err(TrainError::NotFinite { when: when.to_string(), what: name.clone() }),
        None => Ok(()),
    }
}
