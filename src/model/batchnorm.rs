//! BatchNorm layers: torchvision's `BatchNorm2d`, or, with `model.sync_batchnorm`,
//! SyncBatchNorm: in training mode the batch statistics cover every rank's batch, and backward
//! sums the gradient terms that depend on them over every rank, so N ranks of batch B train as
//! one process of batch N*B would. Evaluation uses the running statistics, as both of PyTorch's
//! do. A single process with `sync_batchnorm` uses the same function (its sums are the
//! identity), so its arithmetic is the same at every world size: libtorch's own kernel rounds
//! differently, which a fresh network's nearly constant channels can amplify to 1e-3 relative in
//! one step's update.
//!
//! Unlike `torch.nn.SyncBatchNorm`, which refuses CPU tensors, this one works on any device: the
//! autograd function is in the C++ shim (`SyncBatchNormFunction`), and it sums its per-channel
//! statistics with the function the trainer gives it (the job's communicator; host copies for
//! GPU tensors).

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use tch::nn::{self, BatchNorm, ModuleT};
use tch::Tensor;

use crate::util::shim::{check, ffi};

/// Sums values in place over every rank of the job; every rank calls it at the same point.
pub type SumOverRanks = Box<dyn Fn(&mut [f64]) + Send + Sync>;

/// The sum every layer of one model shares once SyncBatchNorm is switched on.
pub type SyncGroup = Arc<OnceLock<SumOverRanks>>;

/// A BatchNorm layer with torchvision's parameter and buffer names (`weight`, `bias`,
/// `running_mean`, `running_var`).
pub struct Norm {
    bn: BatchNorm,
    /// The layer's momentum and eps (tch keeps its copy private).
    config: nn::BatchNormConfig,
    sync: SyncGroup,
}

impl std::fmt::Debug for Norm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Norm").field("bn", &self.bn).field("synced", &self.sync.get().is_some()).finish()
    }
}

impl Norm {
    pub fn new(p: nn::Path, channels: i64, sync: &SyncGroup) -> Norm {
        let config = nn::BatchNormConfig::default();
        Norm { bn: nn::batch_norm2d(p, channels, config), config, sync: Arc::clone(sync) }
    }

    pub fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        match self.sync.get() {
            Some(sum) if train => self.forward_synced(xs, sum),
            _ => self.bn.forward_t(xs, train),
        }
    }

    fn forward_synced(&self, xs: &Tensor, sum: &SumOverRanks) -> Tensor {
        let (weight, bias) = match (&self.bn.ws, &self.bn.bs) {
            (Some(weight), Some(bias)) => (weight, bias),
            // rtrain's BatchNorm layers are always affine.
            _ => unreachable!("BatchNorm without weight and bias"),
        };
        let (mut running_mean, mut running_var) =
            (self.bn.running_mean.shallow_clone(), self.bn.running_var.shallow_clone());
        let mut out = std::ptr::null_mut();
        // The context is the function inside the model's OnceLock, which outlives every
        // autograd graph built from this model (backward calls back through it).
        let context = std::ptr::from_ref(sum).cast_mut().cast::<c_void>();
        // SAFETY: live tensors; `all_reduce_stats` matches the callback type and `context` is
        // the `SumOverRanks` it expects; on success `out` is a new tensor we own.
        let result = check("SyncBatchNorm", unsafe {
            ffi::rtrain_sync_batch_norm(
                xs.as_ptr(),
                weight.as_ptr(),
                bias.as_ptr(),
                running_mean.as_mut_ptr(),
                running_var.as_mut_ptr(),
                self.config.momentum,
                self.config.eps,
                all_reduce_stats,
                context,
                &mut out,
            )
        });
        match result {
            // SAFETY: allocated by the shim with `new at::Tensor`, as from_ptr expects.
            Ok(()) => unsafe { Tensor::from_ptr(out) },
            // Shapes are the model's own, so a failure here is a bug or a broken job, and the
            // other ranks wait in this layer's collective: a panic ends the job (the MPI panic
            // hook aborts every rank), where an error returned would hang it.
            Err(error) => panic!("{error}"),
        }
    }
}

/// Sums the shim's per-channel statistics over the job.
extern "C" fn all_reduce_stats(context: *mut c_void, data: *mut f64, len: usize) {
    let sum = std::panic::AssertUnwindSafe(|| {
        // SAFETY: `context` is the `&SumOverRanks` forward_synced passed, still alive.
        let sum = unsafe { &*context.cast::<SumOverRanks>() };
        // SAFETY: `data` holds `len` doubles that the shim owns, and lends us, for this call.
        let values = unsafe { std::slice::from_raw_parts_mut(data, len) };
        sum(values);
    });
    // Nothing may unwind into C++.
    if std::panic::catch_unwind(sum).is_err() {
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{nn::VarStore, Device, Kind};

    /// Two layers with the same parameters: one BatchNorm, one SyncBatchNorm over `sum`.
    fn pair(sum: SumOverRanks) -> (VarStore, Norm, VarStore, Norm) {
        let (plain_vs, synced_vs) = (VarStore::new(Device::Cpu), VarStore::new(Device::Cpu));
        let plain = Norm::new(plain_vs.root() / "bn", 5, &SyncGroup::default());
        let group = SyncGroup::default();
        let _ = group.set(sum);
        let synced = Norm::new(synced_vs.root() / "bn", 5, &group);
        tch::no_grad(|| {
            let weight = Tensor::rand([5], (Kind::Float, Device::Cpu)) + 0.5;
            let bias = Tensor::randn([5], (Kind::Float, Device::Cpu));
            for norm in [&plain, &synced] {
                norm.bn.ws.as_ref().unwrap().shallow_clone().copy_(&weight);
                norm.bn.bs.as_ref().unwrap().shallow_clone().copy_(&bias);
            }
        });
        (plain_vs, plain, synced_vs, synced)
    }

    /// With one rank, SyncBatchNorm is BatchNorm: output, input and parameter gradients and
    /// running statistics agree with libtorch's own layer.
    #[test]
    fn one_rank_sync_batchnorm_equals_batchnorm() {
        tch::manual_seed(3);
        let (_pv, plain, _sv, synced) = pair(Box::new(|_values: &mut [f64]| {}));
        let mut x = (Tensor::randn([4, 5, 3, 2], (Kind::Float, Device::Cpu)) * 3 + 1).set_requires_grad(true);
        let upstream = Tensor::randn([4, 5, 3, 2], (Kind::Float, Device::Cpu));
        let mut results = Vec::new();
        for norm in [&plain, &synced] {
            x.zero_grad();
            let y = norm.forward_t(&x, true);
            (&y * &upstream).sum(Kind::Float).backward();
            let w = norm.bn.ws.as_ref().unwrap();
            let b = norm.bn.bs.as_ref().unwrap();
            results.push(vec![
                y.detach(),
                x.grad().copy(),
                w.grad().copy(),
                b.grad().copy(),
                norm.bn.running_mean.copy(),
                norm.bn.running_var.copy(),
            ]);
        }
        let names = ["output", "input grad", "weight grad", "bias grad", "running mean", "running var"];
        for (name, (a, b)) in names.iter().zip(results[0].iter().zip(&results[1])) {
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "{name}: max |diff| {diff:e}");
        }
    }
}
