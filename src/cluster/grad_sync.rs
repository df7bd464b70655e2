//! Gradient synchronisation for data-parallel training, the way PyTorch DDP's reducer does it:
//!
//! - Gradients live in buckets. Each trainable parameter's `.grad` is a view into one flat
//!   float32 buffer per bucket (shaped and strided like the parameter, so channels-last weights
//!   keep their layout), and backward accumulates straight into it: no packing or unpacking.
//! - A hook on each parameter's gradient accumulator reports when its gradient is final; when a
//!   bucket's last gradient arrives, the bucket goes to a communication thread that sums it over
//!   all ranks in place and divides by the world size, while backward carries on with the
//!   layers before it. Buckets are launched strictly in index order, so every rank issues the
//!   same sequence of collectives whatever its timing.
//! - Buckets start in reverse parameter order, with a small first bucket so that communication
//!   starts early. After the first step they are rebuilt in the order the gradients actually
//!   became ready (rank 0's order, broadcast), which is what makes the overlap work.
//! - The last bucket carries one extra value, the stop flag: a rank asked to stop (a
//!   preemption signal, [`super::signals`]) sets it before backward, and after the all-reduce
//!   every rank sees whether any rank did, at the same step, at no cost of its own.
//! - The communication thread sums with NCCL when the gradients are on GPUs and every rank has
//!   it ([`super::nccl`]), else with MPI through host memory ([`Reducer`]). With NCCL, a
//!   bucket's all-reduce runs on a CUDA stream of its own, ordered by events: the hook records
//!   "ready" on the compute stream, and [`GradSync::finish`] makes the compute stream wait for
//!   every bucket's "done" before the optimizer step.

use std::collections::BTreeSet;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use tch::{Device, Kind, Tensor};

use super::nccl::{self, Nccl, NcclApi, NcclError};
use super::wire::Wire;
use super::{all_reduce_mean_compressed_in_background, all_reduce_mean_in_background, Communicator};
use crate::util::shim::{check, ffi, ShimError};

/// PyTorch DDP's `bucket_cap_mb` for the first bucket: small, so communication starts as soon
/// as the last layers' gradients are ready.
pub const FIRST_BUCKET_BYTES: usize = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum GradSyncError {
    #[error("parameter {name}: gradients can only be synchronised for float32 parameters, not {kind:?}")]
    Kind { name: String, kind: Kind },
    #[error(
        "parameter {name} received its gradient twice in one backward pass; data-parallel training \
         needs every parameter used once per step"
    )]
    ReadyTwice { name: String },
    #[error("the gradient communication thread has stopped")]
    ThreadGone,
    #[error(transparent)]
    Nccl(#[from] NcclError),
    #[error(transparent)]
    Shim(#[from] ShimError),
}

/// What averages a bucket over the ranks.
pub enum Reducer {
    /// MPI, on a host copy of GPU tensors (CPU tensors in place); `poll` as in [`SyncOptions`].
    Mpi,
    /// NCCL between the ranks' GPUs, on the GPU.
    Nccl(Arc<Nccl>),
}

/// How buckets are averaged, the same on every rank: MPI when the ranks compute on CPUs; NCCL
/// when every rank computes on a GPU and NCCL's set-up succeeds on all of them; MPI again,
/// with a warning, when the set-up falls back. Ranks on different kinds of device, or a set-up
/// that failed, are an error on every rank. A collective.
pub fn choose_reducer(
    comm: &Arc<dyn Communicator>,
    device: Device,
    load: impl FnOnce() -> Result<Arc<dyn NcclApi>, NcclError>,
) -> Result<Reducer, NcclError> {
    if !nccl::agree_on_device_kind(comm.as_ref(), device)? {
        return Ok(Reducer::Mpi);
    }
    match Nccl::join(comm, device, load) {
        Ok(nccl) => Ok(Reducer::Nccl(Arc::new(nccl))),
        Err(err @ NcclError::Fallback { .. }) => {
            tracing::warn!("{err}");
            Ok(Reducer::Mpi)
        }
        Err(err) => Err(err),
    }
}

impl Reducer {
    /// For the log and the run manifest.
    pub fn describe(&self, comm: &dyn Communicator, on_gpu: bool) -> String {
        let library = comm.library_version().unwrap_or_else(|| "MPI".to_string());
        let library = library.lines().next().unwrap_or_default().to_string();
        match self {
            Reducer::Nccl(nccl) => nccl.describe(),
            Reducer::Mpi if on_gpu => format!("{library}, through host memory"),
            Reducer::Mpi => library,
        }
    }
}

/// A bucket to reduce: its index (for the reply) and its flat buffer.
struct BucketToReduce {
    bucket: usize,
    flat: Tensor,
}

/// What the hooks need, behind one lock: hooks run on the thread that runs backward.
struct HookState {
    /// Bucket of each parameter.
    bucket_of: Vec<usize>,
    /// Parameters per bucket.
    sizes: Vec<usize>,
    /// Per bucket, gradients not yet final in this backward.
    pending: Vec<usize>,
    /// Per parameter, whether its gradient is final in this backward.
    ready: Vec<bool>,
    flats: Vec<Tensor>,
    /// The next bucket to send: buckets go out in index order only.
    next_launch: usize,
    /// Parameters in the order their gradients became ready, recorded until the layout settles.
    ready_order: Option<Vec<usize>>,
    twice: Option<usize>,
    jobs: Option<Sender<BucketToReduce>>,
    /// Send buckets during backward as they fill (else all at `finish`: no overlap).
    overlap: bool,
    /// Gradients accumulate locally: backward's ready reports are ignored (DDP's `no_sync`).
    no_sync: bool,
    /// With NCCL: marks each bucket's gradients ready on the compute stream as it launches.
    gpu: Option<Arc<Nccl>>,
    /// The first error marking a bucket ready (on the backward thread); `finish` reports it.
    gpu_error: Option<NcclError>,
}

/// How gradients are synchronised (the `[dist]` settings that matter here).
#[derive(Debug, Clone, Copy)]
pub struct SyncOptions {
    /// Bucket size in MiB.
    pub bucket_mb: f64,
    /// Start each bucket's all-reduce during backward as soon as it is full.
    pub overlap: bool,
    /// How often the communication thread tests a pending all-reduce (zero: blocking calls).
    pub poll: std::time::Duration,
    /// The gradients' format on the wire (None: fp32).
    pub wire: Option<Wire>,
}

impl HookState {
    fn mark_ready(&mut self, index: usize) {
        if self.no_sync {
            return;
        }
        if self.ready[index] {
            self.twice.get_or_insert(index);
            return;
        }
        self.ready[index] = true;
        if let Some(order) = &mut self.ready_order {
            order.push(index);
        }
        let bucket = self.bucket_of[index];
        self.pending[bucket] -= 1;
        while self.overlap && self.next_launch < self.pending.len() && self.pending[self.next_launch] == 0 {
            let next = self.next_launch;
            self.launch(next);
            self.next_launch += 1;
        }
    }

    fn launch(&mut self, bucket: usize) {
        tracing::trace!("bucket {bucket} ready");
        if let Some(gpu) = &self.gpu {
            if let Err(err) = gpu.bucket_ready(bucket) {
                self.gpu_error.get_or_insert(err);
            }
        }
        if let Some(jobs) = &self.jobs {
            // A closed channel means the thread is gone; `finish` reports it.
            let _ = jobs.send(BucketToReduce { bucket, flat: self.flats[bucket].shallow_clone() });
        }
    }

    fn reset(&mut self) {
        self.pending.clone_from(&self.sizes);
        self.ready.iter_mut().for_each(|r| *r = false);
        self.next_launch = 0;
        self.twice = None;
    }
}

/// Keeps a parameter's gradient-accumulator node, and so its hook, alive.
struct HookHandle(*mut c_void);

impl Drop for HookHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from rtrain_grad_ready_hook and is freed once, here.
        unsafe { ffi::rtrain_grad_ready_hook_free(self.0) }
    }
}

/// Sums and averages gradients over all ranks after each backward.
pub struct GradSync {
    names: Vec<String>,
    params: Vec<Tensor>,
    bucket_bytes: usize,
    comm: Arc<dyn Communicator>,
    /// Boxed: the hooks hold its address.
    plan: Box<Mutex<HookState>>,
    hooks: Vec<HookHandle>,
    done: Receiver<usize>,
    worker: Option<JoinHandle<()>>,
    /// The stop flag: one element after the last bucket's gradients.
    flag: Tensor,
    /// Whether any rank raised the flag in the last step `finish` completed.
    stop_agreed: bool,
    /// Nanoseconds the communication thread has spent in all-reduces.
    busy_nanos: Arc<AtomicU64>,
}

impl GradSync {
    /// Puts the gradients of `params` (trainable, float32, already in their final memory
    /// format) into buckets and hooks their accumulators.
    pub fn new(
        comm: Arc<dyn Communicator>,
        params: Vec<(String, Tensor)>,
        options: SyncOptions,
        reducer: Reducer,
    ) -> Result<GradSync, GradSyncError> {
        let SyncOptions { bucket_mb, overlap, poll, wire } = options;
        for (name, param) in &params {
            if param.kind() != Kind::Float {
                return Err(GradSyncError::Kind { name: name.clone(), kind: param.kind() });
            }
        }
        let (names, params): (Vec<String>, Vec<Tensor>) = params.into_iter().unzip();
        let gpu = match &reducer {
            Reducer::Nccl(nccl) => Some(Arc::clone(nccl)),
            Reducer::Mpi => None,
        };
        let (jobs, job_queue) = mpsc::channel::<BucketToReduce>();
        let (done_sender, done) = mpsc::channel();
        let worker_comm = comm.clone();
        let busy_nanos = Arc::new(AtomicU64::new(0));
        let worker_busy = Arc::clone(&busy_nanos);
        let worker = std::thread::Builder::new()
            .name("rtrain-allreduce".to_string())
            .spawn(move || {
                communicate(worker_comm.as_ref(), &reducer, job_queue, done_sender, poll, wire, &worker_busy);
            })
            .map_err(|_| GradSyncError::ThreadGone)?;
        let plan = HookState {
            bucket_of: vec![0; params.len()],
            sizes: Vec::new(),
            pending: Vec::new(),
            ready: vec![false; params.len()],
            flats: Vec::new(),
            next_launch: 0,
            ready_order: Some(Vec::with_capacity(params.len())),
            twice: None,
            jobs: Some(jobs),
            overlap,
            no_sync: false,
            gpu,
            gpu_error: None,
        };
        let mut sync = GradSync {
            names,
            params,
            bucket_bytes: (bucket_mb * 1024.0 * 1024.0).max(1.0) as usize,
            comm,
            plan: Box::new(Mutex::new(plan)),
            hooks: Vec::new(),
            done,
            worker: Some(worker),
            flag: Tensor::zeros([1], (Kind::Float, tch::Device::Cpu)),
            stop_agreed: false,
            busy_nanos,
        };
        let initial: Vec<usize> = (0..sync.params.len()).rev().collect();
        sync.install(&initial)?;
        let context = std::ptr::from_ref::<Mutex<HookState>>(&sync.plan).cast_mut().cast::<c_void>();
        for (index, param) in sync.params.iter().enumerate() {
            let mut handle = std::ptr::null_mut();
            // SAFETY: `param` is a live leaf tensor; `context` points into the boxed plan, which
            // outlives the hooks (Drop frees the hooks first); the callback never unwinds.
            check("grad hook", unsafe {
                ffi::rtrain_grad_ready_hook(param.as_ptr(), grad_ready, context, index, &mut handle)
            })?;
            sync.hooks.push(HookHandle(handle));
        }
        Ok(sync)
    }

    /// The parameter indices of each bucket, in launch order.
    pub fn buckets(&self) -> Vec<Vec<usize>> {
        let plan = self.lock();
        let mut buckets = vec![Vec::new(); plan.sizes.len()];
        for (index, &bucket) in plan.bucket_of.iter().enumerate() {
            buckets[bucket].push(index);
        }
        buckets
    }

    /// Zeroes every gradient, and the stop flag, for the next backward (one fill per bucket).
    pub fn zero_grad(&mut self) {
        let plan = self.lock();
        for flat in &plan.flats {
            let _ = flat.shallow_clone().zero_();
        }
    }

    /// While set, backward adds into the gradients without reducing them (a micro-batch before
    /// a step's last, as DDP's `no_sync()`); the backward after it is cleared reduces the sum.
    pub fn set_no_sync(&mut self, no_sync: bool) {
        self.lock().no_sync = no_sync;
    }

    /// Asks every rank to stop after this step: call after [`Self::zero_grad`], before backward.
    pub fn raise_stop_flag(&mut self) {
        let _ = self.flag.fill_(1.0);
    }

    /// Seconds the communication thread has spent in all-reduces so far (overlapping backward
    /// or waited for after it).
    pub fn allreduce_seconds(&self) -> f64 {
        self.busy_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }

    /// Whether any rank raised the stop flag in the step [`Self::finish`] last completed; the
    /// same on every rank.
    pub fn stop_agreed(&self) -> bool {
        self.stop_agreed
    }

    /// Waits until every gradient is summed over the ranks and averaged; call after backward,
    /// before the optimizer step. Buckets whose gradients never became ready (parameters that
    /// took no part in this step) are sent now, with the zeros they hold.
    pub fn finish(&mut self) -> Result<(), GradSyncError> {
        let buckets = {
            let mut plan = self.lock();
            if let Some(index) = plan.twice {
                return Err(GradSyncError::ReadyTwice { name: self.names[index].clone() });
            }
            while plan.next_launch < plan.sizes.len() {
                let next = plan.next_launch;
                plan.launch(next);
                plan.next_launch += 1;
            }
            if let Some(err) = plan.gpu_error.take() {
                return Err(err.into());
            }
            plan.sizes.len()
        };
        let waiting = std::time::Instant::now();
        for _ in 0..buckets {
            self.done.recv().map_err(|_| GradSyncError::ThreadGone)?;
        }
        tracing::trace!("after backward, waited {:?} for the gradient all-reduces", waiting.elapsed());
        let gpu = self.lock().gpu.clone();
        if let Some(gpu) = gpu {
            gpu.compute_waits_for(buckets)?;
        }
        // Averaged like the gradients: positive when any rank raised it. (On a GPU, reading it
        // waits for the all-reduce, which the optimizer step does anyway.)
        self.stop_agreed = self.flag.double_value(&[0]) > 0.0;
        let recorded = {
            let mut plan = self.lock();
            plan.reset();
            plan.ready_order.take()
        };
        if let Some(order) = recorded {
            self.settle_layout(order)?;
        }
        Ok(())
    }

    /// After the first step: rebuild the buckets in the order gradients became ready on rank 0
    /// (identical on every rank, so all ranks launch the same buckets in the same order).
    fn settle_layout(&mut self, mut order: Vec<usize>) -> Result<(), GradSyncError> {
        let seen: BTreeSet<usize> = order.iter().copied().collect();
        order.extend((0..self.params.len()).rev().filter(|i| !seen.contains(i)));
        let mut bytes: Vec<u8> = order.iter().flat_map(|&i| (i as u64).to_le_bytes()).collect();
        self.comm.broadcast_bytes(&mut bytes, 0);
        let order: Vec<usize> = bytes
            .chunks_exact(8)
            .map(|c| usize::try_from(u64::from_le_bytes(c.try_into().unwrap_or_default())).unwrap_or(0))
            .collect();
        if order == self.buckets().concat() {
            return Ok(());
        }
        // The gradients just reduced are still needed by this step's optimizer: keep them.
        let current: Vec<Tensor> = self.params.iter().map(|p| p.grad().copy()).collect();
        self.install(&order)?;
        tch::no_grad(|| {
            for (param, grad) in self.params.iter().zip(&current) {
                param.grad().copy_(grad);
            }
        });
        tracing::debug!("gradient buckets rebuilt in ready order: {:?}", self.buckets());
        Ok(())
    }

    /// Allocates the buckets for parameters taken in `order` and points every gradient into
    /// them.
    fn install(&mut self, order: &[usize]) -> Result<(), GradSyncError> {
        let numels: Vec<usize> = self.params.iter().map(|p| p.numel()).collect();
        let layout =
            bucket_layout(&numels, order, FIRST_BUCKET_BYTES.min(self.bucket_bytes), self.bucket_bytes);
        let mut bucket_of = vec![0; self.params.len()];
        let mut flats = Vec::with_capacity(layout.len());
        for (bucket, members) in layout.iter().enumerate() {
            let total: usize = members.iter().map(|&i| numels[i]).sum();
            let device = self.params[members[0]].device();
            let last = bucket + 1 == layout.len();
            let flat = Tensor::zeros([total as i64 + i64::from(last)], (Kind::Float, device));
            if last {
                self.flag = flat.narrow(0, total as i64, 1);
            }
            let mut offset = 0i64;
            for &index in members {
                let param = &mut self.params[index];
                let view = flat.as_strided(param.size(), param.stride(), Some(offset));
                // SAFETY: both are live tensors; the view is shaped and strided like the
                // parameter (checked dense when the bucket was sized by numel).
                check("set grad", unsafe { ffi::rtrain_set_grad(param.as_mut_ptr(), view.as_ptr()) })?;
                offset += numels[index] as i64;
                bucket_of[index] = bucket;
            }
            flats.push(flat);
        }
        let mut plan = self.lock();
        plan.sizes = layout.iter().map(Vec::len).collect();
        plan.bucket_of = bucket_of;
        plan.flats = flats;
        plan.reset();
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, HookState> {
        self.plan.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for GradSync {
    fn drop(&mut self) {
        // Hooks first: after this nothing calls into the plan. Then close the queue so the
        // thread ends.
        self.hooks.clear();
        self.lock().jobs = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// Called by libtorch after a parameter's gradient has been accumulated.
extern "C" fn grad_ready(context: *mut c_void, index: usize) {
    // SAFETY: `context` is the boxed plan registered with the hook, alive while hooks exist.
    let plan = unsafe { &*context.cast::<Mutex<HookState>>() };
    let mut plan = plan.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if index < plan.ready.len() {
        plan.mark_ready(index);
    }
}

/// The communication thread: one all-reduce per bucket, in arrival order, with the gradients
/// on the wire as `wire` says. An NCCL failure ends the whole job: the other ranks would
/// otherwise wait for this one forever.
fn communicate(
    comm: &dyn Communicator,
    reducer: &Reducer,
    buckets: Receiver<BucketToReduce>,
    done: Sender<usize>,
    poll: std::time::Duration,
    wire: Option<Wire>,
    busy_nanos: &AtomicU64,
) {
    let mut scratch = Vec::new();
    if let Reducer::Nccl(nccl) = reducer {
        // CUDA's current device is per thread: NCCL's calls must come from this rank's GPU.
        if let Err(err) = nccl.bind_thread() {
            tracing::error!("gradient communication thread: {err}");
            comm.abort(1);
        }
    }
    for mut job in buckets {
        let started = std::time::Instant::now();
        match (reducer, wire) {
            (Reducer::Mpi, None) => all_reduce_mean_in_background(comm, &mut job.flat, poll),
            (Reducer::Mpi, Some(wire)) => {
                all_reduce_mean_compressed_in_background(comm, &mut job.flat, wire, &mut scratch, poll);
            }
            (Reducer::Nccl(nccl), wire) => {
                if let Err(err) = nccl.all_reduce_mean(job.bucket, &mut job.flat, wire) {
                    tracing::error!("gradient all-reduce of bucket {}: {err}", job.bucket);
                    comm.abort(1);
                }
            }
        }
        let finished = std::time::Instant::now();
        let took = finished.duration_since(started);
        busy_nanos.fetch_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
        if crate::trace::recording() {
            let elements = job.flat.numel();
            let bytes = elements * wire.map_or(4, |_| 2);
            let args = serde_json::json!({
                "bucket": job.bucket, "elements": elements, "bytes": bytes,
                "wire": wire.map_or("fp32".to_string(), |w| format!("{w:?}").to_lowercase()),
            });
            let name = format!("all-reduce bucket {}", job.bucket);
            crate::trace::span(name, crate::trace::CPU_OP, started, finished, Some(args));
        }
        tracing::trace!("bucket {} all-reduced in {took:?}", job.bucket);
        if done.send(job.bucket).is_err() {
            break;
        }
    }
}

/// Groups parameters (taken in `order`) into consecutive buckets: the first up to
/// `first_cap_bytes`, the others up to `cap_bytes`; a parameter larger than a cap gets a bucket
/// of its own.
pub fn bucket_layout(
    numels: &[usize],
    order: &[usize],
    first_cap_bytes: usize,
    cap_bytes: usize,
) -> Vec<Vec<usize>> {
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut bytes = 0usize;
    for &index in order {
        let size = numels[index] * std::mem::size_of::<f32>();
        let cap = if buckets.is_empty() { first_cap_bytes } else { cap_bytes };
        if !current.is_empty() && bytes + size > cap {
            buckets.push(std::mem::take(&mut current));
            bytes = 0;
        }
        current.push(index);
        bytes += size;
    }
    if !current.is_empty() {
        buckets.push(current);
    }
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{SingleProcess, Topology};
    use tch::Device;

    fn options(bucket_mb: f64, overlap: bool) -> SyncOptions {
        SyncOptions { bucket_mb, overlap, poll: std::time::Duration::from_micros(200), wire: None }
    }

    #[test]
    fn layout_respects_caps_and_order() {
        // 4 bytes per element: caps of 40 and 100 bytes are 10 and 25 elements.
        let numels = [8, 8, 30, 5, 5, 5, 5, 5];
        let order: Vec<usize> = (0..numels.len()).rev().collect();
        let layout = bucket_layout(&numels, &order, 40, 100);
        assert_eq!(layout, vec![vec![7, 6], vec![5, 4, 3], vec![2], vec![1, 0]]);
        assert_eq!(layout.concat().len(), numels.len());
    }

    #[test]
    fn gradients_land_in_buckets_and_hooks_fire_in_backward() {
        // A world of one: the all-reduce is the identity and the mean divides by 1, so after
        // finish() the gradients must equal what autograd computes without any buckets.
        for overlap in [true, false] {
            let comm: Arc<dyn Communicator> = Arc::new(SingleProcess { topology: Topology::single() });
            let w1 = Tensor::randn([64, 32], (Kind::Float, Device::Cpu)).set_requires_grad(true);
            let w2 = Tensor::randn([10, 64], (Kind::Float, Device::Cpu)).set_requires_grad(true);
            let x = Tensor::randn([5, 32], (Kind::Float, Device::Cpu));
            let loss = |w1: &Tensor, w2: &Tensor| {
                x.matmul(&w1.tr()).relu().matmul(&w2.tr()).pow_tensor_scalar(2).sum(Kind::Float)
            };
            let (r1, r2) =
                (w1.detach().copy().set_requires_grad(true), w2.detach().copy().set_requires_grad(true));
            loss(&r1, &r2).backward();

            // Tiny caps: one parameter per bucket. Given last layer last, the initial (reverse)
            // order puts w1 first, although backward finishes w2 first.
            let params = vec![("w2".into(), w2.shallow_clone()), ("w1".into(), w1.shallow_clone())];
            let mut sync = GradSync::new(comm, params, options(1e-6, overlap), Reducer::Mpi).unwrap();
            assert_eq!(sync.buckets(), vec![vec![1], vec![0]]);
            for step in 0..2 {
                sync.zero_grad();
                loss(&w1, &w2).backward();
                sync.finish().unwrap();
                // After step 0 the buckets are rebuilt: the reduced gradients must survive it.
                assert!(w1.grad().allclose(&r1.grad(), 1e-6, 1e-6, false), "step {step}, overlap {overlap}");
                assert!(w2.grad().allclose(&r2.grad(), 1e-6, 1e-6, false), "step {step}, overlap {overlap}");
            }
            assert_eq!(sync.buckets(), vec![vec![0], vec![1]], "rebuilt in ready order: w2 first");
            let flat_ptr = sync.lock().flats[0].data_ptr();
            assert_eq!(w2.grad().data_ptr(), flat_ptr, "the gradient is a view of its bucket");
        }
    }

    #[test]
    fn a_parameter_used_twice_is_an_error_naming_it() {
        let comm: Arc<dyn Communicator> = Arc::new(SingleProcess { topology: Topology::single() });
        let w = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let mut sync = GradSync::new(
            comm,
            vec![("shared.weight".into(), w.shallow_clone())],
            options(25.0, true),
            Reducer::Mpi,
        )
        .unwrap();
        sync.zero_grad();
        (&w * 2.0).sum(Kind::Float).backward();
        (&w * 3.0).sum(Kind::Float).backward();
        let err = sync.finish().unwrap_err().to_string();
        assert!(err.contains("shared.weight"), "{err}");
    }

    /// Micro-batches under `no_sync` add into the buckets without a report; the last backward
    /// reduces their sum (a world of one: the sum itself), and is not "ready twice".
    #[test]
    fn no_sync_backwards_accumulate_into_the_next_reduction() {
        let comm: Arc<dyn Communicator> = Arc::new(SingleProcess { topology: Topology::single() });
        let w = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let mut sync =
            GradSync::new(comm, vec![("w".into(), w.shallow_clone())], options(25.0, true), Reducer::Mpi)
                .unwrap();
        sync.zero_grad();
        sync.set_no_sync(true);
        (&w * 2.0).sum(Kind::Float).backward();
        (&w * 3.0).sum(Kind::Float).backward();
        sync.set_no_sync(false);
        (&w * 4.0).sum(Kind::Float).backward();
        sync.finish().unwrap();
        assert_eq!(Vec::<f32>::try_from(w.grad()).unwrap(), vec![9.0; 3]);
    }
}
