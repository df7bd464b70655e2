//! The one training step — zero_grad, forward and loss (under autocast), backward,
//! sync_gradients, optimizer step — used by `rtrain train` and by `rtrain bench step|agree`, so
//! that what the benchmarks time and compare is what training runs.

use tch::{Kind, Reduction, Tensor};

use super::optim::{OptimError, Optimizer};
use crate::cluster::grad_sync::{GradSync, GradSyncError};
use crate::cluster::signals;
use crate::model::precision::Compute;
use crate::model::Model;
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

    /// Raises the stop flag for this step when this process was asked to stop.
    fn offer_stop(&mut self, asked: bool) {
        if let (GradientSync::AllReduce(sync), true) = (self, asked) {
            sync.raise_stop_flag();
        }
    }

    /// Waits until every gradient is averaged over the ranks; returns whether any rank was
    /// asked to stop (`asked` is this rank's answer). A collective.
    fn sync_gradients(&mut self, asked: bool) -> Result<bool, GradSyncError> {
        match self {
            GradientSync::Local => Ok(asked),
            GradientSync::AllReduce(sync) => sync.finish().map(|()| sync.stop_agreed()),
        }
    }
}

/// What one step computed on this rank's batch.
pub struct StepOutput {
    /// The batch's mean loss.
    pub loss: f64,
    /// Correct top-1 predictions in the batch.
    pub correct: u64,
    /// The forward pass's logits (for comparisons between devices).
    pub logits: Tensor,
    /// Some rank was asked to stop (a preemption signal) before this step: every rank stops
    /// after it.
    pub stop: bool,
}

/// The model, how it computes, and the loss's label smoothing: what a step needs besides the
/// optimizer and the batch.
pub struct StepContext<'a> {
    pub model: &'a Model,
    pub compute: &'a Compute,
    pub label_smoothing: f64,
}

/// One optimisation step on `images`/`labels` (from the loader, on the CPU or pinned) at
/// learning rate `lr`. A non-finite loss is an error ([`StepError::Diverged`]).
pub fn train_step(
    context: &StepContext<'_>,
    optimizer: &mut Optimizer,
    sync: &mut GradientSync,
    images: &Tensor,
    labels: &Tensor,
    lr: f64,
) -> Result<StepOutput, StepError> {
    let global_step = optimizer.steps();
    let torch = |source| StepError::Torch { global_step, source };
    sync.zero_grad(optimizer);
    let asked = signals::requested().is_some();
    sync.offer_stop(asked);
    let labels = context.compute.labels(labels);
    let (logits, loss) = forward_loss(context, images, &labels, global_step)?;
    loss.f_backward().map_err(torch)?;
    let stop = sync.sync_gradients(asked)?;
    optimizer.step(lr)?;
    let loss = loss.f_double_value(&[]).map_err(torch)?;
    if !loss.is_finite() {
        return Err(StepError::Diverged { global_step, loss });
    }
    let correct =
        tch::no_grad(|| logits.argmax(-1, false).eq_tensor(&labels).sum(Kind::Int64).int64_value(&[]));
    Ok(StepOutput { loss, correct: u64::try_from(correct).unwrap_or(0), logits, stop })
}

/// The logits and the batch's mean loss (with label smoothing), in the run's precision and
/// memory format on its device. `labels` must already be on the device.
fn forward_loss(
    context: &StepContext<'_>,
    images: &Tensor,
    labels: &Tensor,
    global_step: u64,
) -> Result<(Tensor, Tensor), StepError> {
    let images = context.compute.input(images)?;
    // Autocast covers the forward pass and the loss, not backward (as torch.autocast).
    let _autocast = context.compute.autocast()?;
    let logits = context.model.forward_t(&images, true);
    let loss = logits
        .f_cross_entropy_loss::<Tensor>(labels, None, Reduction::Mean, -100, context.label_smoothing)
        .map_err(|source| StepError::Torch { global_step, source })?;
    Ok((logits, loss))
}
