//! The Rust side of the C++ shim (`crates/rtrain-shim/src/shim.cpp`): what tch does not
//! expose (CPU autocast, memory formats, deterministic mode, TF32, pinned memory without a
//! device argument, gradient hooks, SyncBatchNorm).
//! Every shim function catches its C++ exceptions and returns them as a message, which
//! [`check`] turns into a [`ShimError`].

use std::ffi::{c_char, CStr};

/// The bridge's functions, from the `rtrain-shim` crate (crates/rtrain-shim), which compiles
/// the C++ once whatever rtrain's features.
pub(crate) use rtrain_shim as ffi;

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
