//! Who this process trains with: the job's topology (world and node-local ranks, nodes) and the
//! collectives data-parallel training needs, behind one [`Communicator`] that is either MPI
//! (when mpirun, srun or ibrun launched the process) or this process alone.
//!
//! Collectives block and every rank must call them in the same order. An error inside MPI is
//! fatal to the whole job (MPI's default error handler), and so are a panic and a fatal error on
//! any rank ([`Communicator::abort`]): a rank that fails must never leave the others waiting.

pub mod cuda;
pub mod device;
pub mod grad_sync;
pub mod job;
pub mod launcher;
#[cfg(feature = "mpi")]
mod mpi;
pub mod nccl;
pub mod runtime;
pub mod signals;
pub mod slurm;
pub mod watchdog;
pub mod wire;

use std::sync::Arc;

use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::config::AllreduceAlgorithm;
use launcher::{LaunchError, LaunchInfo};
use wire::Wire;

/// Where this process sits in the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    pub rank: usize,
    pub world_size: usize,
    /// Rank among the processes on this node (a shared-memory split of the world).
    pub local_rank: usize,
    pub local_world_size: usize,
    /// This node's index, in the order of the lowest world rank on each node.
    pub node: usize,
    pub nodes: usize,
    pub host: String,
    /// What started the job: a launcher's name, or "single process".
    pub launcher: String,
}

impl Topology {
    pub fn single() -> Topology {
        Topology {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            node: 0,
            nodes: 1,
            host: hostname(),
            launcher: "single process".to_string(),
        }
    }

    /// Global rank 0: the one rank that writes the run directory.
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {}/{} (local {}/{}) on node {}/{} ({}), {}",
            self.rank,
            self.world_size,
            self.local_rank,
            self.local_world_size,
            self.node,
            self.nodes,
            self.host,
            self.launcher
        )
    }
}

/// The collectives rtrain uses. Sums are in place; every rank ends with the same values.
pub trait Communicator: Send + Sync {
    fn topology(&self) -> &Topology;
    fn all_reduce_sum_f32(&self, data: &mut [f32]);
    fn all_reduce_sum_f64(&self, data: &mut [f64]);
    /// [`Self::all_reduce_sum_f64`] for collectives inside the model's forward and backward
    /// (SyncBatchNorm). They run on a communicator of their own: backward issues them while
    /// the communication thread's gradient all-reduces are in flight, and two threads'
    /// collectives on one communicator could be matched in different orders on different ranks.
    fn all_reduce_sum_f64_in_model(&self, data: &mut [f64]) {
        self.all_reduce_sum_f64(data);
    }
    /// [`Self::all_reduce_sum_f32`] for a communication thread that shares the cores with
    /// training: where the library allows, it starts a non-blocking all-reduce and tests it
    /// every `poll` with sleeps in between instead of spinning a core (zero: a blocking call).
    fn all_reduce_sum_f32_background(&self, data: &mut [f32], poll: std::time::Duration) {
        let _ = poll;
        self.all_reduce_sum_f32(data);
    }
    /// Sums 16-bit floats of the `wire` format (as their bits) over all ranks in place, each
    /// addition rounded to that format; polled as [`Self::all_reduce_sum_f32_background`].
    fn all_reduce_sum_wire_background(&self, data: &mut [u16], wire: Wire, poll: std::time::Duration);
    /// Copies `root`'s bytes into every rank's `data` (all ranks pass the same length).
    fn broadcast_bytes(&self, data: &mut [u8], root: usize);
    /// Every rank's `data` (of any length, short messages such as host names and failure
    /// causes), in rank order, on every rank.
    fn all_gather_bytes(&self, data: &[u8]) -> Vec<Vec<u8>>;
    fn barrier(&self);
    /// The MPI library's version string (for run manifests); None without MPI.
    fn library_version(&self) -> Option<String> {
        None
    }
    /// Ends every process of the job with `code`.
    fn abort(&self, code: i32) -> !;
}

/// A job of one: every collective is the identity.
pub struct SingleProcess {
    topology: Topology,
}

/// The communicator of a process that trains alone.
pub fn single() -> Arc<dyn Communicator> {
    Arc::new(SingleProcess { topology: Topology::single() })
}

impl Communicator for SingleProcess {
    fn topology(&self) -> &Topology {
        &self.topology
    }
    fn all_reduce_sum_f32(&self, _data: &mut [f32]) {}
    fn all_reduce_sum_f64(&self, _data: &mut [f64]) {}
    fn all_reduce_sum_wire_background(&self, _data: &mut [u16], _wire: Wire, _poll: std::time::Duration) {}
    fn broadcast_bytes(&self, _data: &mut [u8], _root: usize) {}
    fn all_gather_bytes(&self, data: &[u8]) -> Vec<Vec<u8>> {
        vec![data.to_vec()]
    }
    fn barrier(&self) {}
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error(
        "launched by {launcher} as rank {rank} of {}, but this rtrain was built without MPI \
         (cargo feature `mpi`): rebuild with it, or start a single process",
        .world_size.map_or("a group".to_string(), |n| n.to_string())
    )]
    NoMpi { launcher: &'static str, rank: usize, world_size: Option<usize> },
    #[error(
        "launched by {launcher} as rank {rank} of {claimed} processes, but MPI sees a world of {found}: \
         rtrain's MPI library is not the launcher's (use the mpirun that matches the container's Open MPI, \
         or srun --mpi=pmix)"
    )]
    WorldMismatch { launcher: &'static str, rank: usize, claimed: usize, found: usize },
    #[error("MPI_Init failed (MPI already initialised, or no MPI runtime for launcher {launcher})")]
    Init { launcher: &'static str },
    #[error("{what}: cannot all-reduce a tensor of kind {kind:?} (only float32 and float64)")]
    Kind { what: String, kind: Kind },
    #[error(
        "rank {rank} on {host} is local rank {local_rank}, but only {gpus} GPUs are visible there: \
         start at most {gpus} ranks per node"
    )]
    TooFewGpus { rank: usize, host: String, local_rank: usize, gpus: usize },
}

/// Joins the job this process was launched into: MPI when a launcher's variables say so (even
/// for a world of one, so that the MPI library's view is checked), else a single process.
pub fn init(algorithm: AllreduceAlgorithm) -> Result<Arc<dyn Communicator>, DistError> {
    match launcher::detect_from_process()? {
        None => {
            if let Some(warning) = launcher::unlaunched_in_slurm_batch(|name| std::env::var(name).ok()) {
                tracing::warn!("{warning}");
            }
            Ok(single())
        }
        Some(info) => init_launched(info, algorithm),
    }
}

#[cfg(feature = "mpi")]
fn init_launched(
    info: LaunchInfo,
    algorithm: AllreduceAlgorithm,
) -> Result<Arc<dyn Communicator>, DistError> {
    Ok(Arc::new(mpi::MpiCommunicator::init(&info, algorithm)?))
}

#[cfg(not(feature = "mpi"))]
fn init_launched(
    info: LaunchInfo,
    _algorithm: AllreduceAlgorithm,
) -> Result<Arc<dyn Communicator>, DistError> {
    if info.world_size != Some(1) {
        return Err(DistError::NoMpi {
            launcher: info.launcher,
            rank: info.rank,
            world_size: info.world_size,
        });
    }
    Ok(single())
}

/// The device a rank computes on: `cuda:<local_rank>` of the GPUs it sees, the only GPU when
/// the launcher left it just one (e.g. CUDA_VISIBLE_DEVICES per rank), else the CPU.
pub fn device_for(topology: &Topology, visible_gpus: usize) -> Result<Device, DistError> {
    match visible_gpus {
        0 => Ok(Device::Cpu),
        1 => Ok(Device::Cuda(0)),
        gpus if topology.local_rank < gpus => Ok(Device::Cuda(topology.local_rank)),
        gpus => Err(DistError::TooFewGpus {
            rank: topology.rank,
            host: topology.host.clone(),
            local_rank: topology.local_rank,
            gpus,
        }),
    }
}

/// This machine's host name (for logs and the topology), or "unknown".
pub fn hostname() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is writable for its full length; gethostname NUL-terminates within it
    // on success (we also bound the read by the buffer).
    let status = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    if status != 0 {
        return "unknown".to_string();
    }
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).into_owned()
}

/// Whether a tensor's elements fill one block of memory with no gaps or overlaps, in any
/// dimension order (contiguous and channels-last tensors both do).
pub fn is_dense(size: &[i64], stride: &[i64]) -> bool {
    let mut dims: Vec<(i64, i64)> =
        stride.iter().copied().zip(size.iter().copied()).filter(|&(_, n)| n != 1).collect();
    if dims.iter().any(|&(_, n)| n == 0) {
        return true;
    }
    dims.sort_unstable();
    let mut expected = 1;
    for (stride, n) in dims {
        if stride != expected {
            return false;
        }
        expected *= n;
    }
    true
}

/// Runs `f` on the tensor's memory as bytes: in place for a dense CPU tensor, else on a CPU
/// copy that is written back afterwards.
fn with_host_bytes(tensor: &mut Tensor, f: impl FnOnce(&mut [u8])) {
    tch::no_grad(|| {
        let in_place = tensor.device() == Device::Cpu && is_dense(&tensor.size(), &tensor.stride());
        let host = if in_place { tensor.shallow_clone() } else { tensor.to_device(Device::Cpu).contiguous() };
        let len = host.numel() * host.kind().elt_size_in_bytes();
        if len > 0 {
            // SAFETY: `host` is a dense CPU tensor, so its `numel * element size` bytes from
            // data_ptr are its elements and nothing else; we hold it (and so the storage) for
            // the whole call, and no other reference writes it meanwhile.
            let bytes = unsafe { std::slice::from_raw_parts_mut(host.data_ptr().cast::<u8>(), len) };
            f(bytes);
        }
        if !in_place {
            tensor.copy_(&host);
        }
    })
}

/// Sums a float32 or float64 tensor over all ranks, in place.
pub fn all_reduce_tensor(comm: &dyn Communicator, tensor: &mut Tensor, what: &str) -> Result<(), DistError> {
    let kind = tensor.kind();
    if !matches!(kind, Kind::Float | Kind::Double) {
        return Err(DistError::Kind { what: what.to_string(), kind });
    }
    with_host_bytes(tensor, |bytes| match kind {
        // Tensor memory is aligned for its element type (libtorch allocates 64-byte aligned);
        // bytemuck checks it (and the length) and panics otherwise.
        Kind::Float => comm.all_reduce_sum_f32(bytemuck::cast_slice_mut::<u8, f32>(bytes)),
        _ => comm.all_reduce_sum_f64(bytemuck::cast_slice_mut::<u8, f64>(bytes)),
    });
    Ok(())
}

/// Sums a float32 tensor over all ranks and divides by the world size, in place: gradients, on
/// the communication thread.
pub fn all_reduce_mean_in_background(
    comm: &dyn Communicator,
    tensor: &mut Tensor,
    poll: std::time::Duration,
) {
    let scale = 1.0 / comm.topology().world_size as f32;
    with_host_bytes(tensor, |bytes| {
        let values = bytemuck::cast_slice_mut::<u8, f32>(bytes);
        comm.all_reduce_sum_f32_background(values, poll);
        values.iter_mut().for_each(|v| *v *= scale);
    });
}

/// [`all_reduce_mean_in_background`] with the gradients on the wire in `wire`'s 16-bit format
/// (`dist.compress`): each rank's share (divided by the world size) is rounded to it, the
/// shares are summed in it, and the mean is widened back into `tensor`. `scratch` holds the
/// wire values (kept between calls).
pub fn all_reduce_mean_compressed_in_background(
    comm: &dyn Communicator,
    tensor: &mut Tensor,
    wire: Wire,
    scratch: &mut Vec<u16>,
    poll: std::time::Duration,
) {
    with_host_bytes(tensor, |bytes| {
        all_reduce_mean_compressed(comm, bytemuck::cast_slice_mut::<u8, f32>(bytes), wire, scratch, poll)
    });
}

/// The mean of `values` over all ranks, in place, with the values on the wire in `wire`'s
/// 16-bit format (see [`all_reduce_mean_compressed_in_background`]); a zero `poll` makes
/// blocking calls.
pub fn all_reduce_mean_compressed(
    comm: &dyn Communicator,
    values: &mut [f32],
    wire: Wire,
    scratch: &mut Vec<u16>,
    poll: std::time::Duration,
) {
    let scale = 1.0 / comm.topology().world_size as f32;
    // Buckets differ in size: grow the scratch to the largest, never shrink it (regrowing would
    // write zeros over it again).
    if scratch.len() < values.len() {
        scratch.resize(values.len(), 0);
    }
    let scratch = &mut scratch[..values.len()];
    wire.encode_scaled(values, scale, scratch);
    comm.all_reduce_sum_wire_background(scratch, wire, poll);
    wire.decode_into(scratch, values);
}

/// Makes `tensor` equal to `root`'s on every rank (any element type).
pub fn broadcast_tensor(comm: &dyn Communicator, tensor: &mut Tensor, root: usize) {
    with_host_bytes(tensor, |bytes| comm.broadcast_bytes(bytes, root));
}

/// Makes every rank's parameters and buffers equal to rank 0's: at the start, so that all ranks
/// begin identical, and for BatchNorm's running statistics before evaluation and checkpoints
/// (each rank's statistics follow only its own batches), as PyTorch DDP does.
pub fn broadcast_from_root(comm: &dyn Communicator, tensors: impl IntoIterator<Item = Tensor>) {
    if comm.topology().world_size == 1 {
        return;
    }
    for mut tensor in tensors {
        broadcast_tensor(comm, &mut tensor, 0);
    }
}

/// Every rank's `value` (e.g. host names, failure causes), whole, in rank order. A collective.
pub fn gather_strings(comm: &dyn Communicator, value: &str) -> Vec<String> {
    let gathered = comm.all_gather_bytes(value.as_bytes());
    gathered.iter().map(|bytes| String::from_utf8_lossy(bytes).into_owned()).collect()
}

/// A rank that failed a step all ranks took together, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankFailure {
    pub rank: usize,
    pub host: String,
    pub cause: String,
}

impl std::fmt::Display for RankFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} on {}: {}", self.rank, self.host, self.cause)
    }
}

/// Every failure of a step, for one message: "rank 1 on a: ...; rank 3 on b: ...".
pub fn describe_failures(failures: &[RankFailure]) -> String {
    failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// Whether every rank succeeded at a step they all took (a set-up stage): one all-reduce of a
/// flag per rank; when any failed, the ranks also gather the hosts and causes, so that every
/// rank returns the same failures and can act on them alike. A collective.
pub fn agree(comm: &dyn Communicator, outcome: Result<(), String>) -> Result<(), Vec<RankFailure>> {
    let topology = comm.topology();
    if topology.world_size == 1 {
        return outcome.map_err(|cause| vec![RankFailure { rank: 0, host: topology.host.clone(), cause }]);
    }
    let mut failed = vec![0.0f64; topology.world_size];
    failed[topology.rank] = f64::from(u8::from(outcome.is_err()));
    comm.all_reduce_sum_f64(&mut failed);
    if failed.iter().all(|&f| f == 0.0) {
        return Ok(());
    }
    let hosts = gather_strings(comm, &topology.host);
    let causes = gather_strings(comm, outcome.err().as_deref().unwrap_or_default());
    Err(failed
        .iter()
        .zip(hosts.into_iter().zip(causes))
        .enumerate()
        .filter(|(_, (&f, _))| f > 0.0)
        .map(|(rank, (_, (host, cause)))| RankFailure { rank, host, cause })
        .collect())
}

/// `root`'s string on every rank (a run directory, a checkpoint path).
pub fn broadcast_string(comm: &dyn Communicator, value: &str, root: usize) -> String {
    if comm.topology().world_size == 1 {
        return value.to_string();
    }
    let mut len = (value.len() as u64).to_le_bytes();
    comm.broadcast_bytes(&mut len, root);
    let mut bytes = value.as_bytes().to_vec();
    bytes.resize(usize::try_from(u64::from_le_bytes(len)).unwrap_or(0), 0);
    comm.broadcast_bytes(&mut bytes, root);
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn density_of_layouts() {
        assert!(is_dense(&[2, 3, 4, 5], &[60, 20, 5, 1]), "contiguous");
        assert!(is_dense(&[2, 3, 4, 5], &[60, 1, 15, 3]), "channels-last");
        assert!(!is_dense(&[2, 3], &[6, 2]), "strided view with gaps");
        assert!(!is_dense(&[4, 4], &[1, 1]), "overlapping");
        assert!(is_dense(&[3, 1], &[1, 7]), "size-1 dims have any stride");
    }

    #[test]
    fn each_local_rank_gets_its_own_gpu() {
        let mut topology = Topology { local_rank: 2, local_world_size: 4, rank: 6, ..Topology::single() };
        assert_eq!(device_for(&topology, 0).unwrap(), Device::Cpu);
        assert_eq!(device_for(&topology, 1).unwrap(), Device::Cuda(0), "one visible GPU per rank");
        assert_eq!(device_for(&topology, 4).unwrap(), Device::Cuda(2));
        let err = device_for(&topology, 2).unwrap_err().to_string();
        assert!(
            err.contains("rank 6") && err.contains("local rank 2") && err.contains("only 2 GPUs"),
            "{err}"
        );
        topology.local_rank = 0;
        assert_eq!(device_for(&topology, 2).unwrap(), Device::Cuda(0));
    }

    #[test]
    fn single_process_collectives_are_identity_and_tensors_round_trip() {
        let comm = SingleProcess { topology: Topology::single() };
        let mut t = Tensor::from_slice(&[1.0f32, 2.0, 3.0]);
        all_reduce_tensor(&comm, &mut t, "t").unwrap();
        assert_eq!(Vec::<f32>::try_from(&t).unwrap(), vec![1.0, 2.0, 3.0]);
        let mut ints = Tensor::from_slice(&[1i64]);
        let err = all_reduce_tensor(&comm, &mut ints, "counter").unwrap_err().to_string();
        assert!(err.contains("counter") && err.contains("Int64"), "{err}");
        assert_eq!(broadcast_string(&comm, "runs/a", 0), "runs/a");
        assert_eq!(gather_strings(&comm, "node0"), vec!["node0".to_string()]);
    }

    #[test]
    fn host_bytes_of_a_strided_tensor_write_back() {
        // A non-dense view goes through a copy; what `f` writes must land in the view.
        let base = Tensor::zeros([4, 4], (Kind::Float, Device::Cpu));
        let mut column = base.narrow(1, 1, 1);
        with_host_bytes(&mut column, |bytes| bytemuck::cast_slice_mut::<u8, f32>(bytes).fill(7.0));
        let sum = base.sum(Kind::Double).double_value(&[]);
        assert_eq!(sum, 28.0);
        assert_eq!(base.double_value(&[2, 1]), 7.0);
    }
}
