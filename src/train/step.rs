//! The one training step — zero_grad; forward, loss (under autocast) and backward for each
//! micro-batch (`train.accumulate`); sync_gradients; optimizer step — used by `rtrain train`
//! and by `rtrain bench step|agree`, so that what the benchmarks time and compare is what
//! training runs.

use tch::{Kind, Reduction, Tensor};

use super::optim::{OptimError, Optimizer};
use super::phases::{Phase, PhaseClock};
use crate::cluster::grad_sync::{GradSync, GradSyncError};
use crate::cluster::signals;
use crate::model::precision::Compute;
use crate::model::Model;
use crate::train::stop_snapshot::StopSnapshot;
use crate::util::shim::ShimError;

#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("training step {global_step}: {source}")]
    Torch { global_step: u64, source: tch::TchError },
    #[error("training step {global_step}: loss is {loss} (diverged); lower optim.lr")]
    Diverged { global_step: u64, loss: f64 },
    #[error(transparent)]
    Shim(#[from] ShimError),
    #[error(transparent)]
    GradSync(#[from] GradSyncError),
    #[error(transparent)]
    Optim(#[from] OptimError),
}

/// How gradients meet between backward and the optimizer step: not at all with one rank, else
/// averaged over all ranks by [`GradSync`] (bucketed, overlapping backward).
pub enum GradientSync {
    Local,
    AllReduce(GradSync),
}

impl GradientSync {
    fn zero_grad(&mut self, optimizer: &mut Optimizer) {
        match self {
            GradientSync::Local => optimizer.zero_grad(),
            // The gradients are views into the communication buckets: zero those.
            GradientSync::AllReduce(sync) => sync.zero_grad(),
        }
    }

    /// Whether backward leaves the gradients on this rank (a micro-batch before the step's
    /// last, as DDP's `no_sync`) or hands them to the all-reduce as they are final.
    fn accumulate_locally(&mut self, locally: bool) {
        if let GradientSync::AllReduce(sync) = self {
            sync.set_no_sync(locally);
        }
    }

    /// Raises the stop flag for this step when this process was asked to stop.
    fn offer_stop(&mut self, asked: bool) {
        if let (GradientSync::AllReduce(sync), true) = (self, asked) {
            sync.raise_stop_flag();
        }
    }

    /// Waits until every gradient is averaged over the ranks; returns whether any rank was
    /// asked to stop (`asked` is this rank's answer when the step's last backward began). A
    /// collective. Alone, a request that arrived during the step stops training after it,
    /// rather than after the next one.
    fn sync_gradients(&mut self, asked: bool) -> Result<bool, GradSyncError> {
        match self {
            GradientSync::Local => Ok(asked || signals::requested().is_some()),
            GradientSync::AllReduce(sync) => sync.finish().map(|()| sync.stop_agreed()),
        }
    }

    /// The communication thread's seconds in gradient all-reduces so far (0 with one rank).
    pub fn allreduce_seconds(&self) -> f64 {
        match self {
            GradientSync::Local => 0.0,
            GradientSync::AllReduce(sync) => sync.allreduce_seconds(),
        }
    }
}

/// What one step computed on this rank's micro-batches.
pub struct StepOutput {
    /// The mean loss over the step's images on this rank.
    pub loss: f64,
    /// Correct top-1 predictions among them.
    pub correct: u64,
    /// Images in the step's micro-batches.
    pub samples: u64,
    /// The last micro-batch's logits (for comparisons between devices).
    pub logits: Tensor,
    /// Some rank was asked to stop (a preemption signal) before this step: every rank stops
    /// after it.
    pub stop: bool,
}

/// The model, how it computes, and the loss's label smoothing and class weights: what a step
/// needs besides the optimizer and the batches.
pub struct StepContext<'a> {
    pub model: &'a Model,
    pub compute: &'a Compute,
    pub label_smoothing: f64,
    /// `train.class_weights` as a float tensor on the model's device; None: all 1.
    pub class_weights: Option<&'a Tensor>,
    /// The stop snapshot that holds the tensors the optimizer step is about to change: it is
    /// withdrawn (or its write awaited) first. None outside training's rank 0.
    pub before_update: Option<&'a StopSnapshot>,
}

/// One micro-batch: images and labels from the loader, on the CPU or pinned.
#[derive(Clone, Copy)]
pub struct MicroBatch<'a> {
    pub images: &'a Tensor,
    pub labels: &'a Tensor,
}

/// One optimisation step over `micro_batches` at learning rate `lr`: each micro-batch's loss,
/// divided by their number, is backpropagated into the same gradients, which are averaged over
/// the ranks once, after the last. With one micro-batch per rank, W ranks with K micro-batches
/// each take the step W x K ranks with one each would. A non-finite loss is an error
/// ([`StepError::Diverged`]). `clock` takes a lap at the end of each phase.
pub fn train_step(
    context: &StepContext<'_>,
    optimizer: &mut Optimizer,
    sync: &mut GradientSync,
    micro_batches: &[MicroBatch<'_>],
    lr: f64,
    clock: &mut PhaseClock,
) -> Result<StepOutput, StepError> {
    let global_step = optimizer.steps();
    let torch = |source| StepError::Torch { global_step, source };
    sync.zero_grad(optimizer);
    let scale = 1.0 / micro_batches.len().max(1) as f64;
    let (mut loss_sum, mut correct, mut samples, mut asked, mut last_logits) = (0.0, 0i64, 0u64, false, None);
    for (index, batch) in micro_batches.iter().enumerate() {
        let last = index + 1 == micro_batches.len();
        if last {
            // The stop flag travels with the step's one all-reduce.
            asked = signals::requested().is_some();
            sync.offer_stop(asked);
        }
        sync.accumulate_locally(!last);
        let labels = context.compute.labels(batch.labels);
        let images = context.compute.input(batch.images)?;
        clock.lap(Phase::Copy);
        let (logits, loss) = forward_loss(context, &images, &labels, global_step)?;
        clock.lap(Phase::Forward);
        (&loss * scale).f_backward().map_err(torch)?;
        clock.lap(Phase::Backward);
        let images = u64::try_from(labels.size().first().copied().unwrap_or(0)).unwrap_or(0);
        let loss = loss.f_double_value(&[]).map_err(torch)?;
        loss_sum += loss * images as f64;
        samples += images;
        correct +=
            tch::no_grad(|| logits.argmax(-1, false).eq_tensor(&labels).sum(Kind::Int64).int64_value(&[]));
        last_logits = Some(logits);
        // Reading the loss and the accuracy back waits for the forward pass on a GPU.
        clock.lap(Phase::Forward);
    }
    // Every rank takes part in the all-reduce before a diverged one reports it (the job then
    // ends on the error; leaving first would make the others wait for it).
    slow_step_for_tests();
    clock.lap(Phase::Backward);
    let stop = sync.sync_gradients(asked)?;
    clock.lap(Phase::CommWait);
    if let Some(snapshot) = context.before_update {
        snapshot.withdraw();
    }
    optimizer.step(lr)?;
    clock.lap(Phase::Optimizer);
    let loss = loss_sum / samples.max(1) as f64;
    if !loss.is_finite() {
        return Err(StepError::Diverged { global_step, loss });
    }
    Ok(StepOutput {
        loss,
        correct: u64::try_from(correct).unwrap_or(0),
        samples,
        logits: last_logits.unwrap_or_else(|| Tensor::zeros([0], (Kind::Float, tch::Device::Cpu))),
        stop,
    })
}

/// Test-only: `RTRAIN_TEST_STEP_DELAY_MS` lengthens every training step by that many
/// milliseconds before its gradients are synchronised, as a large model or a busy node would,
/// so that the tests of the time-limit stop can signal a step in flight. Unset, nothing.
fn slow_step_for_tests() {
    static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    let delay = DELAY.get_or_init(|| {
        let millis = std::env::var("RTRAIN_TEST_STEP_DELAY_MS").ok()?.parse().ok()?;
        Some(std::time::Duration::from_millis(millis))
    });
    if let Some(delay) = delay {
        std::thread::sleep(*delay);
    }
}

/// The logits and the batch's mean loss (with label smoothing), in the run's precision and
/// memory format on its device. `images` and `labels` must already be on the device
/// (`Compute::input`, `Compute::labels`).
fn forward_loss(
    context: &StepContext<'_>,
    images: &Tensor,
    labels: &Tensor,
    global_step: u64,
) -> Result<(Tensor, Tensor), StepError> {
    // Autocast covers the forward pass and the loss, not backward (as torch.autocast).
    let _autocast = context.compute.autocast()?;
    let logits = context.model.forward_t(images, true);
    let loss = cross_entropy(&logits, labels, context.label_smoothing, context.class_weights)
        .map_err(|source| StepError::Torch { global_step, source })?;
    Ok((logits, loss))
}

/// Training's loss: the batch's mean cross-entropy as PyTorch's `CrossEntropyLoss(weight=
/// class_weights, label_smoothing=label_smoothing)` computes it (with weights, the mean divides
/// by the sum of the true classes' weights).
pub fn cross_entropy(
    logits: &Tensor,
    labels: &Tensor,
    label_smoothing: f64,
    class_weights: Option<&Tensor>,
) -> Result<Tensor, tch::TchError> {
    logits.f_cross_entropy_loss(labels, class_weights, Reduction::Mean, -100, label_smoothing)
}
