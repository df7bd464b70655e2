//! NCCL for gradient all-reduce between GPUs, loaded at run time so that one binary runs where
//! NCCL is absent (CPU nodes, a CPU-only libtorch), and bootstrapped the way Horovod pairs MPI
//! with NCCL: rank 0 creates NCCL's unique id, MPI broadcasts it, every rank joins with it.
//!
//! PyTorch's CUDA wheels ship `libnccl.so.2` and `libtorch_cuda.so` links it, so in a CUDA build
//! the library is usually already in the process and `dlopen` just finds it; `RTRAIN_NCCL`
//! names another file. The CUDA runtime (`libcudart`, also loaded by libtorch) is opened the
//! same way, for `cudaSetDevice`: NCCL binds a communicator to the current device.
//!
//! Collectives are enqueued on CUDA's legacy default stream (stream 0), which libtorch uses
//! for everything unless told otherwise: a bucket's all-reduce runs after the backward kernels
//! that wrote it and before the optimizer's kernels that read it, with no host synchronisation.

use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::Library;
use tch::{Device, Kind, Tensor};

use super::wire::Wire;
use super::Communicator;

/// Where NCCL is looked for unless `RTRAIN_NCCL` names a file.
const NCCL_SONAME: &str = "libnccl.so.2";
/// The CUDA runtime sonames PyTorch's wheels have shipped, newest first.
const CUDART_SONAMES: [&str; 3] = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"];

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [c_char; 128],
}

type NcclComm = *mut c_void;
// `ncclDataType_t` and `ncclRedOp_t` values from nccl.h.
const NCCL_FLOAT16: c_int = 6;
const NCCL_FLOAT32: c_int = 7;
const NCCL_BFLOAT16: c_int = 9;
const NCCL_SUM: c_int = 0;
const NCCL_AVG: c_int = 4;
/// `ncclAvg` exists from NCCL 2.10 (version code 21000).
const FIRST_VERSION_WITH_AVG: c_int = 21000;

type GetVersionFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueIdFn = unsafe extern "C" fn(*mut UniqueId) -> c_int;
type CommInitRankFn = unsafe extern "C" fn(*mut NcclComm, c_int, UniqueId, c_int) -> c_int;
type AllReduceFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, *mut c_void) -> c_int;
type CommDestroyFn = unsafe extern "C" fn(NcclComm) -> c_int;
type GetErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type CudaSetDeviceFn = unsafe extern "C" fn(c_int) -> c_int;

#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    #[error("cannot load {library}: {reason}")]
    Load { library: String, reason: String },
    #[error("{library}: NCCL {version} is too old: rtrain needs 2.10 or newer (ncclAvg)")]
    TooOld { library: String, version: String },
    #[error("{what} failed on rank {rank}: {message}")]
    Call { what: &'static str, rank: usize, message: String },
    #[error("rank {rank}: NCCL all-reduce needs a float32 CUDA tensor, got {kind:?} on {device:?}")]
    Tensor { rank: usize, kind: Kind, device: Device },
    #[error("rank {rank}: NCCL joins GPUs, but this rank computes on {device:?}")]
    NotCuda { rank: usize, device: Device },
    #[error("NCCL is missing on {missing} of {world} ranks (this rank: {reason}): using MPI on all of them")]
    NotEverywhere { missing: usize, world: usize, reason: String },
}

/// The NCCL and CUDA runtime functions rtrain calls, resolved from the loaded libraries.
pub struct NcclLibrary {
    path: String,
    version: c_int,
    get_unique_id: GetUniqueIdFn,
    comm_init_rank: CommInitRankFn,
    all_reduce: AllReduceFn,
    comm_destroy: CommDestroyFn,
    get_error_string: GetErrorStringFn,
    cuda_set_device: CudaSetDeviceFn,
    // The function pointers above stay valid only while these are loaded.
    _nccl: Library,
    _cudart: Library,
}

impl std::fmt::Debug for NcclLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclLibrary({}, {})", self.path, self.version_string())
    }
}

/// Opens the first of `names` that loads.
fn open_first(names: &[&str]) -> Result<(Library, String), NcclError> {
    let mut reasons = Vec::new();
    for name in names {
        // SAFETY: loading runs the library's initialisers; NCCL's and the CUDA runtime's are
        // safe to run in any process (libtorch itself loads them the same way).
        match unsafe { Library::new(name) } {
            Ok(library) => return Ok((library, name.to_string())),
            Err(err) => reasons.push(err.to_string()),
        }
    }
    Err(NcclError::Load { library: names.join(" or "), reason: reasons.join("; ") })
}

/// Resolves `symbol` from `library` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the symbol's true C signature.
unsafe fn symbol<F: Copy>(library: &Library, path: &str, name: &str) -> Result<F, NcclError> {
    let found = library
        .get::<F>(name.as_bytes())
        .map_err(|err| NcclError::Load { library: path.to_string(), reason: format!("{name}: {err}") })?;
    Ok(*found)
}

impl NcclLibrary {
    /// Loads NCCL (`RTRAIN_NCCL` or `libnccl.so.2`) and the CUDA runtime.
    pub fn load() -> Result<NcclLibrary, NcclError> {
        let configured = std::env::var("RTRAIN_NCCL").ok().filter(|p| !p.is_empty());
        let (nccl, path) = open_first(&[configured.as_deref().unwrap_or(NCCL_SONAME)])?;
        let (cudart, cudart_path) = open_first(&CUDART_SONAMES)?;
        // SAFETY: each type alias above is the function's signature in nccl.h / cuda_runtime_api.h.
        let library = unsafe {
            let get_version: GetVersionFn = symbol(&nccl, &path, "ncclGetVersion")?;
            let mut version = 0;
            get_version(&mut version);
            NcclLibrary {
                version,
                get_unique_id: symbol(&nccl, &path, "ncclGetUniqueId")?,
                comm_init_rank: symbol(&nccl, &path, "ncclCommInitRank")?,
                all_reduce: symbol(&nccl, &path, "ncclAllReduce")?,
                comm_destroy: symbol(&nccl, &path, "ncclCommDestroy")?,
                get_error_string: symbol(&nccl, &path, "ncclGetErrorString")?,
                cuda_set_device: symbol(&cudart, &cudart_path, "cudaSetDevice")?,
                path,
                _nccl: nccl,
                _cudart: cudart,
            }
        };
        if library.version < FIRST_VERSION_WITH_AVG {
            return Err(NcclError::TooOld {
                library: library.path.clone(),
                version: library.version_string(),
            });
        }
        Ok(library)
    }

    /// `major.minor.patch` from NCCL's version code (`major*10000 + minor*100 + patch` since
    /// 2.9; `major*1000 + minor*100 + patch` before).
    pub fn version_string(&self) -> String {
        version_string(self.version)
    }

    fn message(&self, code: c_int) -> String {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let text = unsafe { (self.get_error_string)(code) };
        if text.is_null() {
            return format!("NCCL error {code}");
        }
        // SAFETY: non-null, NUL-terminated, static (see above).
        format!("{} (NCCL error {code})", unsafe { CStr::from_ptr(text) }.to_string_lossy())
    }
}

pub fn version_string(code: c_int) -> String {
    let (major, rest) = if code >= 10000 { (code / 10000, code % 10000) } else { (code / 1000, code % 1000) };
    format!("{major}.{}.{}", rest / 100, rest % 100)
}

/// One rank's NCCL communicator over all ranks of the job, bound to this rank's GPU.
pub struct Nccl {
    library: NcclLibrary,
    comm: NcclComm,
    rank: usize,
    world_size: usize,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not run
// concurrently; rtrain calls it from one communication thread at a time.
unsafe impl Send for Nccl {}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Nccl(rank {}, {:?})", self.rank, self.library)
    }
}

impl Nccl {
    /// Joins every rank of `comm` into one NCCL communicator on `device`, or says why not. All
    /// ranks must call this together. First they agree whether NCCL loads everywhere (a rank
    /// without it would otherwise leave the others waiting in ncclCommInitRank); then rank 0's
    /// unique id goes to all over MPI.
    pub fn join(comm: &dyn Communicator, device: Device) -> Result<Nccl, NcclError> {
        let topology = comm.topology().clone();
        let Device::Cuda(ordinal) = device else {
            return Err(NcclError::NotCuda { rank: topology.rank, device });
        };
        let loaded = NcclLibrary::load();
        let mut missing = [f64::from(u8::from(loaded.is_err()))];
        comm.all_reduce_sum_f64(&mut missing);
        let library = match loaded {
            Ok(library) if missing[0] == 0.0 => library,
            Ok(_) => {
                return Err(NcclError::NotEverywhere {
                    missing: missing[0] as usize,
                    world: topology.world_size,
                    reason: "loaded here".to_string(),
                })
            }
            Err(err) => {
                return Err(NcclError::NotEverywhere {
                    missing: missing[0] as usize,
                    world: topology.world_size,
                    reason: err.to_string(),
                })
            }
        };
        let call = |what: &'static str, code: c_int| match code {
            0 => Ok(()),
            code => Err(NcclError::Call { what, rank: topology.rank, message: library.message(code) }),
        };
        let ordinal = c_int::try_from(ordinal).unwrap_or(c_int::MAX);
        // SAFETY: plain integer argument.
        let set = unsafe { (library.cuda_set_device)(ordinal) };
        if set != 0 {
            return Err(NcclError::Call {
                what: "cudaSetDevice",
                rank: topology.rank,
                message: format!("CUDA error {set} for device {ordinal}"),
            });
        }
        let mut id = UniqueId { internal: [0; 128] };
        if topology.is_root() {
            // SAFETY: `id` is a valid, writable ncclUniqueId.
            call("ncclGetUniqueId", unsafe { (library.get_unique_id)(&mut id) })?;
        }
        // SAFETY: UniqueId is 128 plain bytes; viewing it as u8 is sound.
        let bytes = unsafe { std::slice::from_raw_parts_mut(id.internal.as_mut_ptr().cast::<u8>(), 128) };
        comm.broadcast_bytes(bytes, 0);
        let mut nccl_comm: NcclComm = std::ptr::null_mut();
        let world = c_int::try_from(topology.world_size).unwrap_or(c_int::MAX);
        let rank = c_int::try_from(topology.rank).unwrap_or(c_int::MAX);
        // SAFETY: `nccl_comm` is writable; the id is the one every rank received.
        call("ncclCommInitRank", unsafe { (library.comm_init_rank)(&mut nccl_comm, world, id, rank) })?;
        Ok(Nccl { library, comm: nccl_comm, rank: topology.rank, world_size: topology.world_size })
    }

    /// What is used, for the log and the manifest: "NCCL 2.27.3 (libnccl.so.2)".
    pub fn describe(&self) -> String {
        format!("NCCL {} ({})", self.library.version_string(), self.library.path)
    }

    /// Averages a float32 CUDA tensor over all ranks, in place, on the wire as fp32 or, with
    /// `wire`, as bf16/fp16 (cast on the device before and widened after, as DDP's compression
    /// hooks do). The all-reduce is enqueued on the default stream and this returns at once (see
    /// the module documentation).
    pub fn all_reduce_mean(&self, tensor: &mut Tensor, wire: Option<Wire>) -> Result<(), NcclError> {
        if tensor.kind() != Kind::Float || !tensor.device().is_cuda() || !tensor.is_contiguous() {
            return Err(NcclError::Tensor { rank: self.rank, kind: tensor.kind(), device: tensor.device() });
        }
        let Some(wire) = wire else { return self.all_reduce(tensor, NCCL_FLOAT32, NCCL_AVG) };
        let (kind, datatype) = match wire {
            Wire::Bf16 => (Kind::BFloat16, NCCL_BFLOAT16),
            Wire::Fp16 => (Kind::Half, NCCL_FLOAT16),
        };
        // Divided by the world size first, so that fp16's sum cannot overflow.
        let scale = 1.0 / self.world_size as f64;
        let mut narrow = (&*tensor * scale).to_kind(kind);
        self.all_reduce(&mut narrow, datatype, NCCL_SUM)?;
        tensor.copy_(&narrow);
        Ok(())
    }

    /// `op` over all ranks of `tensor` (of NCCL type `datatype`), in place.
    fn all_reduce(&self, tensor: &mut Tensor, datatype: c_int, op: c_int) -> Result<(), NcclError> {
        let pointer = tensor.data_ptr();
        // SAFETY: `tensor` is a contiguous CUDA tensor of `numel` elements of `datatype` that we
        // hold for the call; NCCL reads and writes it on the stream, after earlier kernels.
        let code = unsafe {
            (self.library.all_reduce)(
                pointer,
                pointer,
                tensor.numel(),
                datatype,
                op,
                self.comm,
                std::ptr::null_mut(),
            )
        };
        match code {
            0 => Ok(()),
            code => Err(NcclError::Call {
                what: "ncclAllReduce",
                rank: self.rank,
                message: self.library.message(code),
            }),
        }
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // SAFETY: the communicator came from ncclCommInitRank and is destroyed once, here.
        unsafe { (self.library.comm_destroy)(self.comm) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_decode_in_both_schemes() {
        assert_eq!(version_string(22703), "2.27.3");
        assert_eq!(version_string(21003), "2.10.3");
        assert_eq!(version_string(2804), "2.8.4");
    }

    #[test]
    fn a_missing_library_is_named_in_the_error() {
        let err = open_first(&["/nonexistent/libnccl.so.2"]).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/libnccl.so.2"), "{err}");
    }

    #[test]
    fn joining_on_the_cpu_is_refused_without_loading_anything() {
        let comm = super::super::single();
        let err = Nccl::join(comm.as_ref(), Device::Cpu).unwrap_err();
        assert!(matches!(err, NcclError::NotCuda { rank: 0, device: Device::Cpu }), "{err}");
    }
}
