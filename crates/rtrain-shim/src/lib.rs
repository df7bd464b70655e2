//! rtrain's C++ bridge to the parts of libtorch that tch does not expose (CPU autocast, memory
//! formats, deterministic mode, TF32, pinned memory without a device argument, gradient hooks,
//! SyncBatchNorm): the declarations of `src/shim.cpp`'s functions. Each returns null on success
//! or a C++ exception's message, to be freed with [`rtrain_shim_free`]; rtrain's
//! `util::shim` turns them into errors.

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
