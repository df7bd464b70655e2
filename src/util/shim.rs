//! The Rust side of the C++ shim (`src/shim/shim.cpp`, compiled by build.rs): what tch does not
//! expose (CPU autocast, memory formats, deterministic mode, TF32, pinned memory without a
//! device argument, gradient hooks, SyncBatchNorm).
//! Every shim function catches its C++ exceptions and returns them as a message, which
//! [`check`] turns into a [`ShimError`].

use std::ffi::{c_char, CStr};

pub(crate) mod ffi {
    use std::ffi::{c_char, c_int, c_void};
    use torch_sys::C_tensor;

    pub type GradReadyFn = extern "C" fn(context: *mut c_void, index: usize);
    pub type AllReduceFn = extern "C" fn(context: *mut c_void, data: *mut f64, len: usize);

    extern "C" {
        pub fn rtrain_shim_free(message: *mut c_char);
        pub fn rtrain_autocast_enter(cuda: c_int, enabled: *mut c_int, dtype: *mut c_int) -> *mut c_char;
        pub fn rtrain_autocast_exit(cuda: c_int, enabled: c_int, dtype: c_int) -> *mut c_char;
        pub fn rtrain_channels_last(tensor: *const C_tensor, out: *mut *mut C_tensor) -> *mut c_char;
        pub fn rtrain_param_to_channels_last(param: *mut C_tensor) -> *mut c_char;
        pub fn rtrain_pin_memory(tensor: *const C_tensor, out: *mut *mut C_tensor) -> *mut c_char;
        pub fn rtrain_set_deterministic(on: c_int) -> *mut c_char;
        pub fn rtrain_set_tf32(convolutions: c_int, matrix_products: c_int) -> *mut c_char;
        pub fn rtrain_set_grad(param: *mut C_tensor, grad: *const C_tensor) -> *mut c_char;
        pub fn rtrain_grad_ready_hook(
            param: *const C_tensor,
            callback: GradReadyFn,
            context: *mut c_void,
            index: usize,
            handle: *mut *mut c_void,
        ) -> *mut c_char;
        pub fn rtrain_grad_ready_hook_free(handle: *mut c_void);
        #[allow(clippy::too_many_arguments)]
        pub fn rtrain_sync_batch_norm(
            input: *const C_tensor,
            weight: *const C_tensor,
            bias: *const C_tensor,
            running_mean: *mut C_tensor,
            running_var: *mut C_tensor,
            momentum: f64,
            eps: f64,
            all_reduce: AllReduceFn,
            context: *mut c_void,
            out: *mut *mut C_tensor,
        ) -> *mut c_char;
    }
}

#[derive(Debug, thiserror::Error)]
#[error("libtorch ({what}): {message}")]
pub struct ShimError {
    what: &'static str,
    message: String,
}

/// Turns the shim's returned message (null on success) into a Result, freeing it.
pub(crate) fn check(what: &'static str, message: *mut c_char) -> Result<(), ShimError> {
    if message.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null return is a NUL-terminated string the shim malloc'ed for us.
    let text = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
    // SAFETY: freed once, by the function that pairs with the shim's malloc.
    unsafe { ffi::rtrain_shim_free(message) };
    Err(ShimError { what, message: text })
}

/// A copy of a CPU tensor in pinned memory, so that copying it to the GPU is asynchronous.
pub fn pinned(tensor: &tch::Tensor) -> Result<tch::Tensor, ShimError> {
    let mut out = std::ptr::null_mut();
    // SAFETY: `tensor` is a live tensor; on success `out` is a new at::Tensor we now own.
    check("pin_memory", unsafe { ffi::rtrain_pin_memory(tensor.as_ptr(), &mut out) })?;
    // SAFETY: `out` was allocated by the shim with `new at::Tensor`, as from_ptr expects.
    Ok(unsafe { tch::Tensor::from_ptr(out) })
}
