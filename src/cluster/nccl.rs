//! NCCL for gradient all-reduce between GPUs, loaded at run time so that one binary runs where
//! NCCL is absent (CPU nodes, a CPU-only libtorch), and bootstrapped the way Horovod pairs MPI
//! with NCCL: rank 0 creates NCCL's unique id, MPI broadcasts it, every rank joins with it.
//!
//! PyTorch's CUDA wheels ship `libnccl.so.2` and `libtorch_cuda.so` links it, so in a CUDA build
//! the library is usually already in the process and `dlopen` just finds it; `RTRAIN_NCCL`
//! names another file. The CUDA runtime (`libcudart`, also loaded by libtorch) is opened the
//! same way, for devices, streams and events.
//!
//! Three things keep a fault on one rank from hanging the others:
//! - **Set-up in agreed stages** ([`Nccl::join`]): after each stage (loading the library,
//!   binding the device, creating the unique id) every rank reports its outcome in one small MPI
//!   all-reduce ([`super::agree`]), so all ranks fall back to MPI together or stop together,
//!   naming the rank and cause. Two ranks on one GPU are found from the GPUs' PCI addresses
//!   before NCCL is asked. `ncclCommInitRank` itself is a collective inside NCCL: a rank whose
//!   call fails ends the job (its peers may be inside theirs and cannot take part in an
//!   agreement), and a rank stuck in it is ended by the collective watchdog.
//! - **A watchdog thread per communicator** ([`Nccl`]): NCCL's kernels spin on the GPU when a
//!   peer is lost and the host never notices. The thread asks `ncclCommGetAsyncError` and
//!   whether each bucket's all-reduce has completed (a CUDA event); an error, or a bucket not
//!   done within `dist.timeout_s`, becomes `ncclCommAbort` and MPI_Abort naming the rank, the
//!   cause and what the job was doing.
//! - Every CUDA and NCCL call rtrain makes goes through [`NcclApi`], so the protocol runs in
//!   tests on machines without a GPU over a fake layer that fails where it is told to.
//!
//! Streams, as DDP uses them: the fp32 all-reduce runs on a stream of its own (non-blocking, so
//! it never waits for the legacy default stream implicitly). When a bucket's last gradient is
//! accumulated, an event is recorded on the compute stream (the default one, which libtorch
//! uses); the communication stream waits for it, all-reduces the bucket and records a second
//! event; after backward the compute stream waits for those before the optimizer step. So the
//! all-reduce overlaps the backward kernels of earlier layers, with no host synchronisation.
//! Compressed all-reduces (`dist.compress`) cast with libtorch, which enqueues on the default
//! stream, so they run there, in order with everything else.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use libloading::Library;
use tch::{Device, Kind, Tensor};

use super::wire::Wire;
use super::{agree, describe_failures, gather_strings, watchdog, Communicator, RankFailure};

/// Where NCCL is looked for unless `RTRAIN_NCCL` names a file.
const NCCL_SONAME: &str = "libnccl.so.2";
/// The CUDA runtime sonames PyTorch's wheels have shipped, newest first.
const CUDART_SONAMES: [&str; 3] = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"];

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId(pub [u8; 128]);

/// An opaque CUDA or NCCL handle (a communicator, stream or event pointer), as a number so that
/// it can cross threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle(pub usize);

impl Handle {
    /// CUDA's legacy default stream, on which libtorch computes unless told otherwise.
    pub const DEFAULT_STREAM: Handle = Handle(0);

    fn ptr(self) -> *mut c_void {
        self.0 as *mut c_void
    }
}

/// `ncclDataType_t` of the element types rtrain all-reduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    Float16 = 6,
    Float32 = 7,
    BFloat16 = 9,
}

/// `ncclRedOp_t` of the reductions rtrain uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum = 0,
    Avg = 4,
}

/// `ncclAvg` exists from NCCL 2.10 (version code 21000).
const FIRST_VERSION_WITH_AVG: c_int = 21000;
/// `ncclInProgress`: what `ncclCommGetAsyncError` reports while a non-blocking call runs.
const NCCL_IN_PROGRESS: c_int = 7;
/// `cudaErrorNotReady`: an event's work has not completed yet.
const CUDA_ERROR_NOT_READY: c_int = 600;
/// `cudaStreamNonBlocking`: no implicit synchronisation with the legacy default stream.
const CUDA_STREAM_NON_BLOCKING: c_uint = 1;
/// `cudaEventDisableTiming`: the cheapest events, for ordering only.
const CUDA_EVENT_DISABLE_TIMING: c_uint = 2;
/// How often the NCCL watchdog looks at the communicator and the pending buckets.
const WATCH_TICK: Duration = Duration::from_millis(100);

/// The CUDA runtime and NCCL calls rtrain makes: the real libraries ([`NcclLibrary`]) or, in
/// tests, a fake that fails where it is told to. Errors are the library's message.
pub trait NcclApi: Send + Sync {
    /// For the log and the manifest: "NCCL 2.27.3 (libnccl.so.2)".
    fn describe(&self) -> String;
    /// Makes `ordinal` the calling thread's current GPU (`cudaSetDevice`).
    fn set_device(&self, ordinal: usize) -> Result<(), String>;
    /// What tells GPUs apart across ranks of a node: the PCI bus id.
    fn gpu_identity(&self, ordinal: usize) -> Result<String, String>;
    /// The device whose tensors this layer all-reduces (a fake may use host memory).
    fn tensor_device(&self, ordinal: usize) -> Device {
        Device::Cuda(ordinal)
    }
    fn unique_id(&self) -> Result<UniqueId, String>;
    fn init_rank(&self, world: usize, id: &UniqueId, rank: usize) -> Result<Handle, String>;
    /// Enqueues an in-place all-reduce of `count` elements at `data` on `stream`.
    ///
    /// # Safety
    /// `data` must hold `count` elements of `datatype` on the communicator's device, alive and
    /// written by no one else until `stream` has run the call.
    unsafe fn all_reduce(
        &self,
        comm: Handle,
        data: *mut c_void,
        count: usize,
        datatype: DataType,
        op: ReduceOp,
        stream: Handle,
    ) -> Result<(), String>;
    /// An error NCCL hit after a call returned (a lost peer, a network failure).
    fn async_error(&self, comm: Handle) -> Result<(), String>;
    /// Ends the communicator's work at once, kernels included (from any thread).
    fn abort(&self, comm: Handle);
    fn destroy(&self, comm: Handle);
    /// A stream that does not synchronise with the legacy default stream.
    fn create_stream(&self) -> Result<Handle, String>;
    fn create_event(&self) -> Result<Handle, String>;
    fn record_event(&self, event: Handle, stream: Handle) -> Result<(), String>;
    /// Makes `stream` wait for the work recorded in `event`.
    fn wait_event(&self, stream: Handle, event: Handle) -> Result<(), String>;
    /// Whether the work recorded in `event` has completed.
    fn event_done(&self, event: Handle) -> Result<bool, String>;
}

#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    #[error("cannot load {library}: {reason}")]
    Load { library: String, reason: String },
    #[error("{library}: NCCL {version} is too old: rtrain needs 2.10 or newer (ncclAvg)")]
    TooOld { library: String, version: String },
    #[error("rank {rank}: {what} failed: {message}")]
    Call { what: &'static str, rank: usize, message: String },
    #[error("rank {rank}: NCCL all-reduce needs a contiguous float32 tensor on {expected:?}, got {kind:?} on {device:?}")]
    Tensor { rank: usize, kind: Kind, device: Device, expected: Device },
    #[error("rank {rank}: NCCL joins GPUs, but this rank computes on {device:?}")]
    NotCuda { rank: usize, device: Device },
    /// Every rank falls back to MPI for the gradients.
    #[error("NCCL not used ({stage} failed on {}): every rank sends gradients through MPI instead", describe_failures(.failures))]
    Fallback { stage: &'static str, failures: Vec<RankFailure> },
    /// Every rank stops: the GPUs cannot be used as configured.
    #[error("NCCL set-up failed ({stage}) on {}", describe_failures(.failures))]
    Failed { stage: &'static str, failures: Vec<RankFailure> },
    #[error(
        "ranks compute on different kinds of device: {on_cpu} on the CPU, the others on GPUs (CUDA \
         unusable there?): give every rank a GPU, or set train.device = \"cpu\" for all"
    )]
    MixedDevices { on_cpu: String },
    #[error("{ranks} use the same GPU ({gpu}): start one rank per GPU (check CUDA_VISIBLE_DEVICES and the launcher's ranks per node)")]
    SameGpu { ranks: String, gpu: String },
}

/// Whether every rank computes on a GPU (true), every rank on the CPU (false), or a mix (an
/// error naming the CPU ranks, on every rank). A collective.
pub fn agree_on_device_kind(comm: &dyn Communicator, device: Device) -> Result<bool, NcclError> {
    let outcome = if device.is_cuda() { Ok(()) } else { Err(format!("computes on {device:?}")) };
    let world = comm.topology().world_size;
    match agree(comm, outcome) {
        Ok(()) => Ok(true),
        Err(on_cpu) if on_cpu.len() == world => Ok(false),
        Err(on_cpu) => Err(NcclError::MixedDevices {
            on_cpu: on_cpu
                .iter()
                .map(|f| format!("rank {} on {}", f.rank, f.host))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The NCCL and CUDA runtime functions rtrain calls, resolved from the loaded libraries.
pub struct NcclLibrary {
    path: String,
    version: c_int,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    comm_init_rank: unsafe extern "C" fn(*mut *mut c_void, c_int, UniqueId, c_int) -> c_int,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        *mut c_void,
        *mut c_void,
    ) -> c_int,
    comm_get_async_error: unsafe extern "C" fn(*mut c_void, *mut c_int) -> c_int,
    comm_abort: unsafe extern "C" fn(*mut c_void) -> c_int,
    comm_destroy: unsafe extern "C" fn(*mut c_void) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    cuda_set_device: unsafe extern "C" fn(c_int) -> c_int,
    cuda_device_get_pci_bus_id: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int,
    cuda_stream_create_with_flags: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> c_int,
    cuda_event_create_with_flags: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> c_int,
    cuda_event_record: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    cuda_stream_wait_event: unsafe extern "C" fn(*mut c_void, *mut c_void, c_uint) -> c_int,
    cuda_event_query: unsafe extern "C" fn(*mut c_void) -> c_int,
    cuda_get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    // The function pointers above stay valid only while these are loaded.
    _nccl: Library,
    _cudart: Library,
}

impl std::fmt::Debug for NcclLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclLibrary({}, {})", self.path, version_string(self.version))
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

/// A static NUL-terminated message from `f`, or `fallback` when it returns null.
fn static_message(text: *const c_char, fallback: String) -> String {
    if text.is_null() {
        return fallback;
    }
    // SAFETY: non-null, NUL-terminated and static (both libraries document their strings so).
    unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
}

impl NcclLibrary {
    /// Loads NCCL (`RTRAIN_NCCL` or `libnccl.so.2`) and the CUDA runtime.
    pub fn load() -> Result<NcclLibrary, NcclError> {
        let configured = std::env::var("RTRAIN_NCCL").ok().filter(|p| !p.is_empty());
        let (nccl, path) = open_first(&[configured.as_deref().unwrap_or(NCCL_SONAME)])?;
        let (cudart, cudart_path) = open_first(&CUDART_SONAMES)?;
        // SAFETY: each field's type is the function's signature in nccl.h / cuda_runtime_api.h.
        let library = unsafe {
            let get_version: unsafe extern "C" fn(*mut c_int) -> c_int =
                symbol(&nccl, &path, "ncclGetVersion")?;
            let mut version = 0;
            get_version(&mut version);
            NcclLibrary {
                version,
                get_unique_id: symbol(&nccl, &path, "ncclGetUniqueId")?,
                comm_init_rank: symbol(&nccl, &path, "ncclCommInitRank")?,
                all_reduce: symbol(&nccl, &path, "ncclAllReduce")?,
                comm_get_async_error: symbol(&nccl, &path, "ncclCommGetAsyncError")?,
                comm_abort: symbol(&nccl, &path, "ncclCommAbort")?,
                comm_destroy: symbol(&nccl, &path, "ncclCommDestroy")?,
                get_error_string: symbol(&nccl, &path, "ncclGetErrorString")?,
                cuda_set_device: symbol(&cudart, &cudart_path, "cudaSetDevice")?,
                cuda_device_get_pci_bus_id: symbol(&cudart, &cudart_path, "cudaDeviceGetPCIBusId")?,
                cuda_stream_create_with_flags: symbol(&cudart, &cudart_path, "cudaStreamCreateWithFlags")?,
                cuda_event_create_with_flags: symbol(&cudart, &cudart_path, "cudaEventCreateWithFlags")?,
                cuda_event_record: symbol(&cudart, &cudart_path, "cudaEventRecord")?,
                cuda_stream_wait_event: symbol(&cudart, &cudart_path, "cudaStreamWaitEvent")?,
                cuda_event_query: symbol(&cudart, &cudart_path, "cudaEventQuery")?,
                cuda_get_error_string: symbol(&cudart, &cudart_path, "cudaGetErrorString")?,
                path,
                _nccl: nccl,
                _cudart: cudart,
            }
        };
        if library.version < FIRST_VERSION_WITH_AVG {
            return Err(NcclError::TooOld {
                library: library.path.clone(),
                version: version_string(library.version),
            });
        }
        Ok(library)
    }

    /// `major.minor.patch` of the loaded NCCL.
    pub fn version_string(&self) -> String {
        version_string(self.version)
    }

    /// [`Self::load`] as the layer [`Nccl::join`] takes.
    pub fn load_shared() -> Result<Arc<dyn NcclApi>, NcclError> {
        Ok(Arc::new(NcclLibrary::load()?))
    }

    fn nccl(&self, code: c_int) -> Result<(), String> {
        match code {
            0 => Ok(()),
            code => {
                // SAFETY: ncclGetErrorString returns a static string for any code.
                let message = unsafe { (self.get_error_string)(code) };
                Err(format!("{} (NCCL error {code})", static_message(message, String::new())))
            }
        }
    }

    fn cuda(&self, code: c_int) -> Result<(), String> {
        match code {
            0 => Ok(()),
            code => {
                // SAFETY: cudaGetErrorString returns a static string for any code.
                let message = unsafe { (self.cuda_get_error_string)(code) };
                Err(format!("{} (CUDA error {code})", static_message(message, String::new())))
            }
        }
    }
}

fn to_c_int(value: usize) -> c_int {
    c_int::try_from(value).unwrap_or(c_int::MAX)
}

impl NcclApi for NcclLibrary {
    fn describe(&self) -> String {
        format!("NCCL {} ({})", version_string(self.version), self.path)
    }

    fn set_device(&self, ordinal: usize) -> Result<(), String> {
        // SAFETY: plain integer argument.
        self.cuda(unsafe { (self.cuda_set_device)(to_c_int(ordinal)) })
    }

    fn gpu_identity(&self, ordinal: usize) -> Result<String, String> {
        let mut buffer = [0 as c_char; 64];
        // SAFETY: the buffer is writable for the length passed; CUDA NUL-terminates within it.
        self.cuda(unsafe { (self.cuda_device_get_pci_bus_id)(buffer.as_mut_ptr(), 64, to_c_int(ordinal)) })?;
        // SAFETY: NUL-terminated within the buffer on success (above).
        Ok(unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().into_owned())
    }

    fn unique_id(&self) -> Result<UniqueId, String> {
        let mut id = UniqueId([0; 128]);
        // SAFETY: `id` is a valid, writable ncclUniqueId.
        self.nccl(unsafe { (self.get_unique_id)(&mut id) })?;
        Ok(id)
    }

    fn init_rank(&self, world: usize, id: &UniqueId, rank: usize) -> Result<Handle, String> {
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` is writable; the id is the one every rank received.
        self.nccl(unsafe { (self.comm_init_rank)(&mut comm, to_c_int(world), *id, to_c_int(rank)) })?;
        Ok(Handle(comm as usize))
    }

    unsafe fn all_reduce(
        &self,
        comm: Handle,
        data: *mut c_void,
        count: usize,
        datatype: DataType,
        op: ReduceOp,
        stream: Handle,
    ) -> Result<(), String> {
        // SAFETY: as the caller promises (the trait's contract).
        self.nccl(unsafe {
            (self.all_reduce)(data, data, count, datatype as c_int, op as c_int, comm.ptr(), stream.ptr())
        })
    }

    fn async_error(&self, comm: Handle) -> Result<(), String> {
        let mut state = 0;
        // SAFETY: a live communicator and a writable result.
        self.nccl(unsafe { (self.comm_get_async_error)(comm.ptr(), &mut state) })?;
        match state {
            NCCL_IN_PROGRESS => Ok(()),
            state => self.nccl(state),
        }
    }

    fn abort(&self, comm: Handle) {
        // SAFETY: a communicator from ncclCommInitRank; NCCL allows abort from any thread.
        unsafe { (self.comm_abort)(comm.ptr()) };
    }

    fn destroy(&self, comm: Handle) {
        // SAFETY: a communicator from ncclCommInitRank, destroyed once.
        unsafe { (self.comm_destroy)(comm.ptr()) };
    }

    fn create_stream(&self) -> Result<Handle, String> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: a writable stream handle.
        self.cuda(unsafe { (self.cuda_stream_create_with_flags)(&mut stream, CUDA_STREAM_NON_BLOCKING) })?;
        Ok(Handle(stream as usize))
    }

    fn create_event(&self) -> Result<Handle, String> {
        let mut event = std::ptr::null_mut();
        // SAFETY: a writable event handle.
        self.cuda(unsafe { (self.cuda_event_create_with_flags)(&mut event, CUDA_EVENT_DISABLE_TIMING) })?;
        Ok(Handle(event as usize))
    }

    fn record_event(&self, event: Handle, stream: Handle) -> Result<(), String> {
        // SAFETY: an event from create_event and a stream of the same device (or 0).
        self.cuda(unsafe { (self.cuda_event_record)(event.ptr(), stream.ptr()) })
    }

    fn wait_event(&self, stream: Handle, event: Handle) -> Result<(), String> {
        // SAFETY: as record_event.
        self.cuda(unsafe { (self.cuda_stream_wait_event)(stream.ptr(), event.ptr(), 0) })
    }

    fn event_done(&self, event: Handle) -> Result<bool, String> {
        // SAFETY: an event from create_event.
        match unsafe { (self.cuda_event_query)(event.ptr()) } {
            CUDA_ERROR_NOT_READY => Ok(false),
            code => self.cuda(code).map(|()| true),
        }
    }
}

pub fn version_string(code: c_int) -> String {
    let (major, rest) = if code >= 10000 { (code / 10000, code % 10000) } else { (code / 1000, code % 1000) };
    format!("{major}.{}.{}", rest / 100, rest % 100)
}

/// The events of the all-reduces in flight. A bucket's "ready" event is recorded again each
/// step (a stream waits for an event as it was when the wait was enqueued). Each all-reduce's
/// "done" event is a fresh one from `free`, so that the watchdog follows that all-reduce and
/// no later one; it returns the event to `free` once complete. Waiting for a done event that
/// has been recorded again since only waits longer: all of them are on one stream, in order.
#[derive(Default)]
struct Events {
    ready: Vec<Handle>,
    /// Per bucket, the done event of its latest all-reduce.
    done: Vec<Option<Handle>>,
    /// All-reduces enqueued and not yet seen complete, oldest first: bucket, done event, since.
    pending: VecDeque<(usize, Handle, Instant)>,
    free: Vec<Handle>,
}

/// One rank's NCCL communicator over all ranks of the job, bound to this rank's GPU, with its
/// communication stream and watchdog thread.
pub struct Nccl {
    api: Arc<dyn NcclApi>,
    comm: Handle,
    stream: Handle,
    ordinal: usize,
    tensor_device: Device,
    rank: usize,
    world_size: usize,
    /// Shared with the watchdog thread.
    events: Arc<Mutex<Events>>,
    stop: Arc<AtomicBool>,
    watchdog: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Nccl(rank {}, {})", self.rank, self.api.describe())
    }
}

impl Nccl {
    /// Joins every rank of `comm` into one NCCL communicator on `device` (a GPU on every rank:
    /// [`agree_on_device_kind`] first), or says why not, the same on every rank: a
    /// [`NcclError::Fallback`] means every rank uses MPI, any other error that every rank stops.
    /// All ranks must call this together (see the module documentation).
    pub fn join(
        comm: &Arc<dyn Communicator>,
        device: Device,
        load: impl FnOnce() -> Result<Arc<dyn NcclApi>, NcclError>,
    ) -> Result<Nccl, NcclError> {
        let topology = comm.topology().clone();
        let Device::Cuda(ordinal) = device else {
            return Err(NcclError::NotCuda { rank: topology.rank, device });
        };
        let loaded = load();
        let outcome = loaded.as_ref().map(|_| ()).map_err(ToString::to_string);
        agree(comm.as_ref(), outcome)
            .map_err(|failures| NcclError::Fallback { stage: "loading NCCL", failures })?;
        let api = loaded?;

        let bound = api.set_device(ordinal).and_then(|()| api.gpu_identity(ordinal));
        let outcome = bound.as_ref().map(|_| ()).map_err(|e| format!("cudaSetDevice({ordinal}): {e}"));
        agree(comm.as_ref(), outcome)
            .map_err(|failures| NcclError::Failed { stage: "binding the GPU", failures })?;
        let identity = format!("{}/{}", topology.host, bound.unwrap_or_default());
        let identities = gather_strings(comm.as_ref(), &identity);
        if let Some(err) = shared_gpu(&identities) {
            return Err(err);
        }

        let stream = api.create_stream();
        let outcome = stream.as_ref().map(|_| ()).map_err(|e| format!("cudaStreamCreateWithFlags: {e}"));
        agree(comm.as_ref(), outcome)
            .map_err(|failures| NcclError::Failed { stage: "creating the communication stream", failures })?;
        let stream = stream.unwrap_or(Handle::DEFAULT_STREAM);

        let id = if topology.is_root() {
            api.unique_id().map_err(|e| format!("ncclGetUniqueId: {e}"))
        } else {
            Ok(UniqueId([0; 128]))
        };
        agree(comm.as_ref(), id.as_ref().map(|_| ()).map_err(Clone::clone))
            .map_err(|failures| NcclError::Fallback { stage: "creating NCCL's unique id", failures })?;
        let mut id = id.unwrap_or(UniqueId([0; 128]));
        comm.broadcast_bytes(&mut id.0, 0);

        let joined = {
            let _wait = watchdog::Wait::begin("NCCL's set-up (ncclCommInitRank)");
            api.init_rank(topology.world_size, &id, topology.rank)
        };
        let nccl_comm = match joined {
            Ok(handle) => handle,
            Err(message) => {
                // The other ranks may be inside ncclCommInitRank, waiting for this one: no
                // agreement can reach them, so this rank ends the job, saying why.
                tracing::error!(
                    "rank {} on {}: ncclCommInitRank failed: {message}{}; ending the job",
                    topology.rank,
                    topology.host,
                    shared_memory_hint(topology.local_world_size)
                );
                comm.abort(1);
            }
        };
        let events = Arc::new(Mutex::new(Events::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let watchdog = start_watchdog(Arc::clone(&api), nccl_comm, ordinal, Arc::clone(comm), &events, &stop);
        Ok(Nccl {
            tensor_device: api.tensor_device(ordinal),
            api,
            comm: nccl_comm,
            stream,
            ordinal,
            rank: topology.rank,
            world_size: topology.world_size,
            events,
            stop,
            watchdog,
        })
    }

    /// What is used, for the log and the manifest: "NCCL 2.27.3 (libnccl.so.2)".
    pub fn describe(&self) -> String {
        self.api.describe()
    }

    /// Binds the calling thread to this rank's GPU (CUDA's current device is per thread).
    pub fn bind_thread(&self) -> Result<(), NcclError> {
        self.api.set_device(self.ordinal).map_err(|message| self.call_error("cudaSetDevice", message))
    }

    fn call_error(&self, what: &'static str, message: String) -> NcclError {
        NcclError::Call { what, rank: self.rank, message }
    }

    fn events(&self) -> std::sync::MutexGuard<'_, Events> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn new_event(&self) -> Result<Handle, NcclError> {
        self.api.create_event().map_err(|m| self.call_error("cudaEventCreateWithFlags", m))
    }

    /// Marks `bucket`'s gradients ready at this point of the compute stream: call on the thread
    /// that ran its backward, when its last gradient is accumulated.
    pub fn bucket_ready(&self, bucket: usize) -> Result<(), NcclError> {
        let ready = {
            let mut events = self.events();
            while events.ready.len() <= bucket {
                let event = self.new_event()?;
                events.ready.push(event);
                events.done.push(None);
            }
            events.ready[bucket]
        };
        self.api
            .record_event(ready, Handle::DEFAULT_STREAM)
            .map_err(|m| self.call_error("cudaEventRecord", m))
    }

    /// Makes the compute stream wait for the all-reduces of buckets `0..buckets`: call after
    /// backward has been enqueued, before the optimizer step.
    pub fn compute_waits_for(&self, buckets: usize) -> Result<(), NcclError> {
        let done: Vec<Handle> = self.events().done.iter().take(buckets).flatten().copied().collect();
        for event in done {
            self.api
                .wait_event(Handle::DEFAULT_STREAM, event)
                .map_err(|m| self.call_error("cudaStreamWaitEvent", m))?;
        }
        Ok(())
    }

    /// Averages bucket `bucket`'s float32 tensor over all ranks, in place: as fp32 on the
    /// communication stream after its ready event, or, with `wire`, as bf16/fp16 on the
    /// compute stream (cast before and widened after, as DDP's compression hooks do). Returns
    /// once the work is enqueued; the watchdog thread follows it to completion.
    pub fn all_reduce_mean(
        &self,
        bucket: usize,
        tensor: &mut Tensor,
        wire: Option<Wire>,
    ) -> Result<(), NcclError> {
        if tensor.kind() != Kind::Float || tensor.device() != self.tensor_device || !tensor.is_contiguous() {
            return Err(NcclError::Tensor {
                rank: self.rank,
                kind: tensor.kind(),
                device: tensor.device(),
                expected: self.tensor_device,
            });
        }
        let Some(wire) = wire else {
            let ready = self.events().ready.get(bucket).copied().ok_or_else(|| {
                self.call_error("cudaStreamWaitEvent", format!("bucket {bucket} was never marked ready"))
            })?;
            self.api.wait_event(self.stream, ready).map_err(|m| self.call_error("cudaStreamWaitEvent", m))?;
            self.enqueue(tensor, DataType::Float32, ReduceOp::Avg, self.stream)?;
            return self.track(bucket, self.stream);
        };
        let (kind, datatype) = match wire {
            Wire::Bf16 => (Kind::BFloat16, DataType::BFloat16),
            Wire::Fp16 => (Kind::Half, DataType::Float16),
        };
        // Divided by the world size first, so that fp16's sum cannot overflow.
        let scale = 1.0 / self.world_size as f64;
        let mut narrow = (&*tensor * scale).to_kind(kind);
        self.enqueue(&mut narrow, datatype, ReduceOp::Sum, Handle::DEFAULT_STREAM)?;
        tensor.copy_(&narrow);
        self.track(bucket, Handle::DEFAULT_STREAM)
    }

    fn enqueue(
        &self,
        tensor: &mut Tensor,
        datatype: DataType,
        op: ReduceOp,
        stream: Handle,
    ) -> Result<(), NcclError> {
        // SAFETY: a contiguous tensor of `numel` elements of `datatype` on the device. Its
        // storage outlives the all-reduce: a bucket's flat buffer lives as long as the layout,
        // and the compute stream waits for the all-reduce before anything reuses the memory.
        unsafe { self.api.all_reduce(self.comm, tensor.data_ptr(), tensor.numel(), datatype, op, stream) }
            .map_err(|m| self.call_error("ncclAllReduce", m))
    }

    /// Records a done event after the bucket's all-reduce on `stream`, for the compute stream
    /// to wait for and the watchdog to follow.
    fn track(&self, bucket: usize, stream: Handle) -> Result<(), NcclError> {
        let free = self.events().free.pop();
        let done = match free {
            Some(event) => event,
            None => self.new_event()?,
        };
        self.api.record_event(done, stream).map_err(|m| self.call_error("cudaEventRecord", m))?;
        let mut events = self.events();
        if let Some(slot) = events.done.get_mut(bucket) {
            *slot = Some(done);
        }
        events.pending.push_back((bucket, done, Instant::now()));
        Ok(())
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.watchdog.take() {
            let _ = thread.join();
        }
        self.api.destroy(self.comm);
    }
}

/// Two ranks on one GPU (the same host and PCI address), as an error naming them.
fn shared_gpu(identities: &[String]) -> Option<NcclError> {
    for (rank, identity) in identities.iter().enumerate() {
        let same: Vec<usize> =
            (0..identities.len()).filter(|&other| identities[other] == *identity).collect();
        if same.len() > 1 && same[0] == rank {
            let ranks = same.iter().map(|r| format!("rank {r}")).collect::<Vec<_>>().join(" and ");
            return Some(NcclError::SameGpu { ranks, gpu: identity.clone() });
        }
    }
    None
}

/// A hint for NCCL failures on a node of several ranks whose /dev/shm is small (Docker's
/// default 64 MiB breaks NCCL's shared-memory transport).
fn shared_memory_hint(local_ranks: usize) -> String {
    use crate::util::memory::{available_bytes, MIN_SHM_FREE};
    match available_bytes(std::path::Path::new("/dev/shm")) {
        Some(free) if local_ranks > 1 && free < MIN_SHM_FREE => format!(
            " (/dev/shm has only {} MiB free for {local_ranks} ranks on this node: under Docker add \
             --shm-size=8g or --ipc=host)",
            free / (1024 * 1024)
        ),
        _ => String::new(),
    }
}

/// The watchdog thread of a communicator: turns an asynchronous NCCL error, or an all-reduce
/// not completed within the collective limit (`dist.timeout_s`), into `ncclCommAbort` and
/// MPI_Abort. It stops when `stop` is set ([`Nccl`]'s drop joins it).
fn start_watchdog(
    api: Arc<dyn NcclApi>,
    nccl_comm: Handle,
    ordinal: usize,
    comm: Arc<dyn Communicator>,
    events: &Arc<Mutex<Events>>,
    stop: &Arc<AtomicBool>,
) -> Option<JoinHandle<()>> {
    let (events, stop) = (Arc::clone(events), Arc::clone(stop));
    let spawned = std::thread::Builder::new().name("rtrain-nccl-watchdog".into()).spawn(move || {
        let bound = api.set_device(ordinal);
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(WATCH_TICK);
            let fault =
                bound.clone().err().map(|e| format!("cudaSetDevice({ordinal}) on the watchdog thread: {e}"));
            let fault =
                fault.or_else(|| api.async_error(nccl_comm).err().map(|e| format!("NCCL reported {e}")));
            let fault = fault.or_else(|| overdue(api.as_ref(), &events));
            if let Some(fault) = fault {
                let topology = comm.topology();
                tracing::error!(
                    "rank {} on {}: {fault} during {}; aborting NCCL and ending the job",
                    topology.rank,
                    topology.host,
                    watchdog::doing()
                );
                api.abort(nccl_comm);
                comm.abort(1);
            }
        }
    });
    match spawned {
        Ok(thread) => Some(thread),
        Err(error) => {
            tracing::warn!("cannot start the NCCL watchdog thread: {error}; a lost peer could hang the job");
            None
        }
    }
}

/// Drops the completed all-reduces from the pending ones; describes the oldest one still running past
/// the limit, or an error querying it.
fn overdue(api: &dyn NcclApi, events: &Mutex<Events>) -> Option<String> {
    let mut events = events.lock().unwrap_or_else(|p| p.into_inner());
    while let Some(&(bucket, event, since)) = events.pending.front() {
        match api.event_done(event) {
            Ok(true) => {
                events.pending.pop_front();
                events.free.push(event);
            }
            Ok(false) if since.elapsed() > watchdog::limit() => {
                return Some(format!(
                    "the gradient all-reduce of bucket {bucket} has not completed on the GPU after {:.0} s \
                     (dist.timeout_s = {:.0}; a peer lost or stopped?)",
                    since.elapsed().as_secs_f64(),
                    watchdog::limit().as_secs_f64()
                ));
            }
            Ok(false) => return None,
            Err(e) => return Some(format!("cudaEventQuery of bucket {bucket}'s all-reduce: {e}")),
        }
    }
    None
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
        let err = Nccl::join(&comm, Device::Cpu, || panic!("must not load")).unwrap_err();
        assert!(matches!(err, NcclError::NotCuda { rank: 0, device: Device::Cpu }), "{err}");
    }

    #[test]
    fn two_ranks_on_one_gpu_are_named() {
        let ids = ["a/0000:3b:00.0", "a/0000:5e:00.0", "b/0000:3b:00.0", "a/0000:3b:00.0"].map(String::from);
        let err = shared_gpu(&ids).unwrap().to_string();
        assert!(err.contains("rank 0 and rank 3") && err.contains("a/0000:3b:00.0"), "{err}");
        assert!(shared_gpu(&ids[..3]).is_none(), "same PCI address on another host is another GPU");
    }
}
