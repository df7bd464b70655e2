//! Mixed precision and memory format: bf16 autocast around the forward pass and loss (fp32
//! master weights, optimizer state and gradients), and channels-last (NHWC) tensors.
//!
//! tch exposes neither CPU autocast nor memory formats, so both go through a small C++ shim
//! (`src/shim/shim.cpp`, compiled by build.rs) whose functions catch every C++ exception and
//! return it as a message. Autocast state is thread-local in libtorch: [`Autocast`] must be
//! created and dropped on the thread that runs the model.

use std::ffi::c_int;
use std::marker::PhantomData;

use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

use crate::util::shim::ShimError;
use crate::util::shim::{check, ffi};

/// The configured choice, `train.precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrecisionSetting {
    /// bf16 where the hardware computes it natively, else fp32.
    Auto,
    Fp32,
    Bf16,
}

/// What a run computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Bf16,
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
        })
    }
}

/// Whether this CPU has bf16 arithmetic (AVX512-BF16 or AMX-BF16 on x86, BF16 on Arm), read
/// from /proc/cpuinfo; without it, autocast to bf16 would emulate and run slower than fp32.
pub fn cpu_has_native_bf16() -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else { return false };
    info.lines()
        .filter(|l| l.starts_with("flags") || l.starts_with("Features"))
        .flat_map(|l| l.split_whitespace())
        .any(|flag| matches!(flag, "avx512_bf16" | "amx_bf16" | "bf16"))
}

/// Resolves `auto` for a device, with the reason, for the log and `rtrain doctor`.
pub fn resolve(setting: PrecisionSetting, device: Device) -> (Precision, String) {
    match setting {
        PrecisionSetting::Fp32 => (Precision::Fp32, "train.precision = \"fp32\"".into()),
        PrecisionSetting::Bf16 => (Precision::Bf16, "train.precision = \"bf16\"".into()),
        PrecisionSetting::Auto => match device {
            Device::Cuda(_) => (Precision::Bf16, "auto: CUDA computes bf16 natively".into()),
            _ if cpu_has_native_bf16() => {
                (Precision::Bf16, "auto: this CPU computes bf16 natively (avx512_bf16 or amx_bf16)".into())
            }
            _ => (Precision::Fp32, "auto: this CPU has no native bf16 instructions".into()),
        },
    }
}

/// bf16 autocast on the current thread for as long as it lives (a no-op for fp32).
pub struct Autocast {
    active: Option<(c_int, c_int, c_int)>,
    /// Autocast state is per thread: the guard must end on the thread that began it.
    _not_send: PhantomData<*const ()>,
}

impl Autocast {
    pub fn new(precision: Precision, device: Device) -> Result<Autocast, ShimError> {
        if precision == Precision::Fp32 {
            return Ok(Autocast { active: None, _not_send: PhantomData });
        }
        let cuda = c_int::from(device.is_cuda());
        let (mut enabled, mut dtype) = (0, 0);
        // SAFETY: plain out-parameters; the shim catches all C++ exceptions.
        check("autocast enter", unsafe { ffi::rtrain_autocast_enter(cuda, &mut enabled, &mut dtype) })?;
        Ok(Autocast { active: Some((cuda, enabled, dtype)), _not_send: PhantomData })
    }
}

impl Drop for Autocast {
    fn drop(&mut self) {
        if let Some((cuda, enabled, dtype)) = self.active.take() {
            // SAFETY: pairs with the enter above, on the same thread (Autocast is !Send).
            let status = unsafe { ffi::rtrain_autocast_exit(cuda, enabled, dtype) };
            if let Err(error) = check("autocast exit", status) {
                tracing::error!("{error}");
            }
        }
    }
}

/// How a run computes: precision and memory format, applied the same way by training,
/// evaluation, prediction and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compute {
    pub precision: Precision,
    pub channels_last: bool,
    pub device: Device,
}

impl Compute {
    /// The input batch on the run's device, in its memory format.
    pub fn input(&self, images: &Tensor) -> Result<Tensor, ShimError> {
        let images = to_device(images, self.device);
        if self.channels_last {
            channels_last(&images)
        } else {
            Ok(images)
        }
    }

    /// A batch's labels on the run's device.
    pub fn labels(&self, labels: &Tensor) -> Tensor {
        to_device(labels, self.device)
    }

    /// Autocast for the forward pass and loss; drop it before backward.
    pub fn autocast(&self) -> Result<Autocast, ShimError> {
        Autocast::new(self.precision, self.device)
    }

    /// A model ready to compute as this says (convolution weights in its memory format); call
    /// before the optimizer is made.
    pub fn prepare_model(&self, model: &crate::model::Model) -> Result<(), ShimError> {
        let mut params: Vec<Tensor> = model.state_dict().into_values().collect();
        self.prepare_parameters(params.iter_mut())
    }

    /// Puts the 4-d parameters (convolution weights) in the run's memory format; call before
    /// the optimizer's first step so its state takes the same layout.
    pub fn prepare_parameters<'a>(
        &self,
        params: impl IntoIterator<Item = &'a mut Tensor>,
    ) -> Result<(), ShimError> {
        if self.channels_last {
            for param in params.into_iter().filter(|p| p.dim() == 4) {
                param_to_channels_last(param)?;
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for Compute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let layout = if self.channels_last { "channels-last" } else { "NCHW" };
        write!(f, "{} {layout} on {:?}", self.precision, self.device)
    }
}

/// A channels-last version of a 4-d tensor (the same tensor if it already is).
pub fn channels_last(tensor: &Tensor) -> Result<Tensor, ShimError> {
    let mut out = std::ptr::null_mut();
    // SAFETY: `tensor` is a live tensor; on success `out` is a new at::Tensor we now own.
    check("channels_last", unsafe { ffi::rtrain_channels_last(tensor.as_ptr(), &mut out) })?;
    // SAFETY: `out` was allocated by the shim with `new at::Tensor`, as from_ptr expects.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// Converts a 4-d parameter to channels-last in place (same tensor identity).
pub fn param_to_channels_last(param: &mut Tensor) -> Result<(), ShimError> {
    // SAFETY: `param` is a live tensor; set_data keeps its identity.
    check("channels_last", unsafe { ffi::rtrain_param_to_channels_last(param.as_mut_ptr()) })
}

/// Deterministic mode for the whole process (`run.deterministic`): on GPU, cuDNN's
/// deterministic kernels without autotuning, cuBLAS's fixed workspace
/// (`CUBLAS_WORKSPACE_CONFIG`, unless set) and PyTorch's deterministic-algorithms switch. CPU
/// kernels are deterministic for a given thread count already. Call before any CUDA work.
pub fn set_deterministic(on: bool) -> Result<(), ShimError> {
    if on && std::env::var_os("CUBLAS_WORKSPACE_CONFIG").is_none() {
        // Read by cuBLAS when its handle is created, after this; no other thread runs yet.
        std::env::set_var("CUBLAS_WORKSPACE_CONFIG", ":4096:8");
    }
    // SAFETY: flags on libtorch's global context; the shim catches all C++ exceptions.
    check("deterministic mode", unsafe { ffi::rtrain_set_deterministic(c_int::from(on)) })
}

/// TF32 inside fp32 GPU work, for the whole process: in cuDNN's convolutions (libtorch's
/// default, as PyTorch's: on) and in cuBLAS's matrix products (default: off). No effect on the
/// CPU. With it on, one ResNet-18 step on an H200 lands about 11% (relative update) away from
/// the CPU's, in PyTorch as in rtrain; off, within 1e-5 (`bench/agree_reference.py`).
pub fn set_tf32(convolutions: bool, matrix_products: bool) -> Result<(), ShimError> {
    // SAFETY: flags on libtorch's global context; the shim catches all C++ exceptions.
    check("TF32 setting", unsafe {
        ffi::rtrain_set_tf32(c_int::from(convolutions), c_int::from(matrix_products))
    })
}

/// Whether a 4-d tensor is laid out channels-last (channel stride 1).
pub fn is_channels_last(tensor: &Tensor) -> bool {
    tensor.dim() == 4 && tensor.stride()[1] == 1 && tensor.size()[1] > 1
}

/// `tensor` on `device`. From pinned host memory the copy is asynchronous (ordered on the
/// device's stream before the kernels that read it); on the CPU this is the same tensor.
pub fn to_device(tensor: &Tensor, device: Device) -> Tensor {
    if tensor.device() == device {
        return tensor.shallow_clone();
    }
    tensor.to_device_(device, tensor.kind(), true, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    #[test]
    fn autocast_runs_matmul_in_bf16_and_restores() {
        let a = Tensor::randn([8, 8], (Kind::Float, Device::Cpu));
        {
            let _guard = Autocast::new(Precision::Bf16, Device::Cpu).unwrap();
            assert_eq!(a.matmul(&a).kind(), Kind::BFloat16);
        }
        assert_eq!(a.matmul(&a).kind(), Kind::Float, "autocast must end with the guard");
        let _none = Autocast::new(Precision::Fp32, Device::Cpu).unwrap();
        assert_eq!(a.matmul(&a).kind(), Kind::Float);
    }

    #[test]
    fn channels_last_keeps_values_and_identity() {
        let x = Tensor::randn([2, 3, 4, 5], (Kind::Float, Device::Cpu));
        let y = channels_last(&x).unwrap();
        assert!(is_channels_last(&y) && !is_channels_last(&x));
        assert!(x.equal(&y));
        let mut param = x.copy();
        let alias = param.shallow_clone();
        param_to_channels_last(&mut param).unwrap();
        assert!(is_channels_last(&alias), "set_data changes the shared tensor");
        assert!(alias.equal(&x));
    }

    #[test]
    fn shim_errors_become_messages() {
        let x = Tensor::randn([3], (Kind::Float, Device::Cpu));
        let err = channels_last(&x).expect_err("a 1-d tensor cannot be channels-last").to_string();
        assert!(err.contains("channels_last"), "{err}");
    }

    #[test]
    fn explicit_settings_are_kept() {
        assert_eq!(resolve(PrecisionSetting::Fp32, Device::Cpu).0, Precision::Fp32);
        assert_eq!(resolve(PrecisionSetting::Bf16, Device::Cpu).0, Precision::Bf16);
        assert_eq!(resolve(PrecisionSetting::Auto, Device::Cuda(0)).0, Precision::Bf16);
    }

    #[test]
    fn on_the_cpu_moving_keeps_the_same_tensor() {
        let t = Tensor::from_slice(&[1.0f32, 2.0]);
        let moved = to_device(&t, Device::Cpu);
        assert_eq!(moved.data_ptr(), t.data_ptr());
    }
}
