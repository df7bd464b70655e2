//! The MPI communicator (Open MPI, MPICH and their derivatives, through the `mpi` crate).
//!
//! MPI is initialised with `MPI_THREAD_MULTIPLE` where the library offers it: gradient buckets
//! are all-reduced on a communication thread while the main thread runs backward (Open MPI has
//! no asynchronous progress, so a non-blocking call would not overlap). The collectives go
//! through `mpi::ffi` because the safe API has no in-place all-reduce.

use std::os::raw::{c_int, c_void};

use mpi::ffi;
use mpi::topology::{Color, Communicator as _};
use mpi::traits::*;
use mpi::Threading;

use super::watchdog::{RollCall, Wait, Watchdog};
use super::wire::Wire;

/// Message tags of the watchdogs' roll call: the call, and the answer "present".
const ROLL_CALL: c_int = 1;
const PRESENT: c_int = 2;
use super::{hostname, AllreduceAlgorithm, Communicator, DistError, Topology};
use crate::cluster::launcher::LaunchInfo;

extern "C" {
    /// `MPI_IN_PLACE` of the linked MPI library (src/shim/mpi_shim.c).
    fn rtrain_mpi_in_place() -> *mut c_void;
    /// Whether that library is Open MPI.
    fn rtrain_mpi_is_open_mpi() -> c_int;
}

pub struct MpiCommunicator {
    topology: Topology,
    world: ffi::MPI_Comm,
    /// A duplicate of `world` for the model's own collectives (SyncBatchNorm), which the
    /// training thread runs while the communication thread uses `world`.
    model: ffi::MPI_Comm,
    /// The collective watchdog's thread (jobs of more than one rank); declared before the
    /// universe, so it stops before MPI is finalised.
    _watchdog: Option<Watchdog>,
    /// MPI reduction operations summing bf16 and fp16 values (compressed gradients).
    sum_bf16: ffi::MPI_Op,
    sum_fp16: ffi::MPI_Op,
    /// Finalises MPI when dropped, after every other use.
    _universe: mpi::environment::Universe,
}

// SAFETY: the communicator handle is only passed to MPI calls. With MPI_THREAD_MULTIPLE those
// may come from any thread; with SERIALIZED, rtrain's callers never overlap them (the main
// thread waits for the communication thread before its own collectives).
unsafe impl Send for MpiCommunicator {}
// SAFETY: as for Send; `&self` methods only read the handle.
unsafe impl Sync for MpiCommunicator {}

impl MpiCommunicator {
    pub fn init(claim: &LaunchInfo, algorithm: AllreduceAlgorithm) -> Result<MpiCommunicator, DistError> {
        let chosen = select_open_mpi_allreduce(algorithm, claim.world_size.unwrap_or(0));
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or(DistError::Init { launcher: claim.launcher })?;
        let world = universe.world();
        let (rank, world_size) = (to_usize(world.rank()), to_usize(world.size()));
        if let Some(claimed) = claim.world_size.filter(|&claimed| claimed != world_size) {
            return Err(DistError::WorldMismatch {
                launcher: claim.launcher,
                rank: claim.rank,
                claimed,
                found: world_size,
            });
        }
        if threading < Threading::Serialized && world_size > 1 {
            tracing::warn!("MPI offers only {threading:?} threading; gradient all-reduce may misbehave");
        }
        let shared = world.split_shared(world.rank());
        let (local_rank, local_world_size) = (to_usize(shared.rank()), to_usize(shared.size()));
        // Node index: the rank among the processes that are local rank 0, told to their node.
        let color = if local_rank == 0 { Color::with_value(0) } else { Color::undefined() };
        let leaders = world.split_by_color(color);
        let mut node = [0u64; 2];
        if let Some(leaders) = &leaders {
            node = [u64::from(leaders.rank().unsigned_abs()), u64::from(leaders.size().unsigned_abs())];
        }
        shared.process_at_rank(0).broadcast_into(&mut node[..]);
        let topology = Topology {
            rank,
            world_size,
            local_rank,
            local_world_size,
            node: usize::try_from(node[0]).unwrap_or(0),
            nodes: usize::try_from(node[1]).unwrap_or(1),
            host: hostname(),
            launcher: claim.launcher.to_string(),
        };
        if world_size > 1 {
            tracing::info!("all-reduce algorithm: {chosen}");
            abort_job_on_panic(rank);
        }
        let (sum_bf16, sum_fp16) = (create_op(sum_bf16), create_op(sum_fp16));
        let model = duplicate(world.as_raw());
        let watchdog = (world_size > 1).then(|| {
            let watch = duplicate(world.as_raw());
            Watchdog::start(WatchPort { topology: topology.clone(), world: world.as_raw(), watch })
        });
        Ok(MpiCommunicator {
            topology,
            world: world.as_raw(),
            model,
            _watchdog: watchdog,
            sum_bf16,
            sum_fp16,
            _universe: universe,
        })
    }
}

impl Communicator for MpiCommunicator {
    fn topology(&self) -> &Topology {
        &self.topology
    }

    fn all_reduce_sum_f32(&self, data: &mut [f32]) {
        // SAFETY: RSMPI_FLOAT and RSMPI_SUM are MPI_FLOAT and MPI_SUM, a sum of f32.
        self.all_reduce(self.world, data, unsafe { (ffi::RSMPI_FLOAT, ffi::RSMPI_SUM) });
    }

    fn all_reduce_sum_f64(&self, data: &mut [f64]) {
        // SAFETY: RSMPI_DOUBLE and RSMPI_SUM are MPI_DOUBLE and MPI_SUM, a sum of f64.
        self.all_reduce(self.world, data, unsafe { (ffi::RSMPI_DOUBLE, ffi::RSMPI_SUM) });
    }

    fn all_reduce_sum_f64_in_model(&self, data: &mut [f64]) {
        // SAFETY: as all_reduce_sum_f64, on the model's communicator.
        self.all_reduce(self.model, data, unsafe { (ffi::RSMPI_DOUBLE, ffi::RSMPI_SUM) });
    }

    /// A non-blocking all-reduce, tested every `poll` with sleeps in between: a blocking MPI
    /// call spins a core until the data arrives, and on a node whose cores are all training
    /// that spinning slows backward by as much as the overlap gains. (Open MPI has no
    /// asynchronous progress, so the tests are what moves the data; the interval must be short
    /// enough that socket buffers do not fill between two tests.)
    fn all_reduce_sum_f32_background(&self, data: &mut [f32], poll: std::time::Duration) {
        if poll.is_zero() {
            return self.all_reduce_sum_f32(data);
        }
        // SAFETY: RSMPI_FLOAT and RSMPI_SUM are MPI_FLOAT and MPI_SUM, a sum of f32.
        self.all_reduce_polled(data, unsafe { (ffi::RSMPI_FLOAT, ffi::RSMPI_SUM) }, poll);
    }

    fn all_reduce_sum_wire_background(&self, data: &mut [u16], wire: Wire, poll: std::time::Duration) {
        let op = match wire {
            Wire::Bf16 => self.sum_bf16,
            Wire::Fp16 => self.sum_fp16,
        };
        // SAFETY: RSMPI_UINT16_T is MPI_UINT16_T, the type of u16; `op` sums them as `wire`.
        let datatype = unsafe { ffi::RSMPI_UINT16_T };
        match poll.is_zero() {
            true => self.all_reduce(self.world, data, (datatype, op)),
            false => self.all_reduce_polled(data, (datatype, op), poll),
        }
    }

    fn broadcast_bytes(&self, data: &mut [u8], root: usize) {
        let _wait = Wait::begin("a broadcast");
        let root = c_int::try_from(root).unwrap_or(0);
        for chunk in data.chunks_mut(c_int::MAX as usize) {
            // SAFETY: `chunk` is writable for its length on every rank; root's is read.
            unsafe {
                ffi::MPI_Bcast(
                    chunk.as_mut_ptr().cast(),
                    chunk.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    root,
                    self.world,
                );
            }
        }
    }

    /// Lengths first (one u64 per rank), then the bytes with MPI_Allgatherv.
    fn all_gather_bytes(&self, data: &[u8]) -> Vec<Vec<u8>> {
        let _wait = Wait::begin("an all-gather");
        let world = self.topology.world_size;
        let mut lengths = vec![0u64; world];
        let mine = data.len() as u64;
        // SAFETY: one u64 sent from `mine` and `world` received into `lengths`, on every rank.
        unsafe {
            ffi::MPI_Allgather(
                std::ptr::from_ref(&mine).cast(),
                1,
                ffi::RSMPI_UINT64_T,
                lengths.as_mut_ptr().cast(),
                1,
                ffi::RSMPI_UINT64_T,
                self.world,
            );
        }
        // Short messages: a total past 2 GiB (MPI's int counts) is a bug, and ends the job.
        let count = |n: u64| c_int::try_from(n).unwrap_or_else(|_| self.abort(1));
        let counts: Vec<c_int> = lengths.iter().map(|&n| count(n)).collect();
        let mut offsets = Vec::with_capacity(world);
        let mut total: c_int = 0;
        for &n in &counts {
            offsets.push(total);
            total = total.checked_add(n).unwrap_or_else(|| self.abort(1));
        }
        let mut all = vec![0u8; usize::try_from(total).unwrap_or(0)];
        // SAFETY: every rank sends its `data` (its length is counts[rank] on every rank) and
        // receives counts[r] bytes at offsets[r] of `all`, which holds their sum.
        unsafe {
            ffi::MPI_Allgatherv(
                data.as_ptr().cast(),
                count(mine),
                ffi::RSMPI_UINT8_T,
                all.as_mut_ptr().cast(),
                counts.as_ptr(),
                offsets.as_ptr(),
                ffi::RSMPI_UINT8_T,
                self.world,
            );
        }
        counts.iter().zip(&offsets).map(|(&n, &at)| all[at as usize..(at + n) as usize].to_vec()).collect()
    }

    fn barrier(&self) {
        let _wait = Wait::begin("a barrier");
        // SAFETY: a collective on a valid communicator.
        unsafe {
            ffi::MPI_Barrier(self.world);
        }
    }

    fn library_version(&self) -> Option<String> {
        // The C string comes back with its terminating NUL.
        mpi::environment::library_version().ok().map(|v| v.trim_end_matches('\0').trim().to_string())
    }

    fn abort(&self, code: i32) -> ! {
        // SAFETY: MPI_Abort on a valid communicator; it does not return.
        unsafe {
            ffi::MPI_Abort(self.world, code);
        }
        std::process::exit(code)
    }
}

impl MpiCommunicator {
    /// A non-blocking in-place reduction (`datatype` must be the MPI type of `T`), tested every
    /// `poll` with sleeps in between: a blocking MPI call spins a core until the data arrives,
    /// and on a node whose cores are all training that spinning slows backward by as much as
    /// the overlap gains. (Open MPI has no asynchronous progress, so the tests are what moves
    /// the data; the interval must be short enough that socket buffers do not fill between two
    /// tests.)
    fn all_reduce_polled<T>(
        &self,
        data: &mut [T],
        (datatype, op): (ffi::MPI_Datatype, ffi::MPI_Op),
        poll: std::time::Duration,
    ) {
        let _wait = Wait::begin("a gradient all-reduce");
        for chunk in data.chunks_mut(c_int::MAX as usize) {
            // SAFETY: MPI_Request is a plain handle; REQUEST_NULL is its empty value.
            let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
            // SAFETY: an in-place reduction of `chunk.len()` elements in memory we borrow
            // mutably until the request completes below (we do not return before it does).
            unsafe {
                ffi::MPI_Iallreduce(
                    rtrain_mpi_in_place(),
                    chunk.as_mut_ptr().cast(),
                    chunk.len() as c_int,
                    datatype,
                    op,
                    self.world,
                    &mut request,
                );
            }
            let mut done: c_int = 0;
            loop {
                // SAFETY: tests the request started above; status is ignored.
                unsafe {
                    ffi::MPI_Test(&mut request, &mut done, ffi::RSMPI_STATUS_IGNORE);
                }
                if done != 0 {
                    break;
                }
                std::thread::sleep(poll);
            }
        }
    }

    /// In-place blocking reduction over `comm` (the world or its duplicate), in chunks that
    /// MPI's `int` count can express. `datatype` must be the MPI type of `T`, and `op` defined
    /// on it.
    fn all_reduce<T>(
        &self,
        comm: ffi::MPI_Comm,
        data: &mut [T],
        (datatype, op): (ffi::MPI_Datatype, ffi::MPI_Op),
    ) {
        let _wait = Wait::begin("an all-reduce");
        for chunk in data.chunks_mut(c_int::MAX as usize) {
            // SAFETY: an in-place reduction of `chunk.len()` elements of `datatype` in memory we
            // borrow mutably; MPI's default error handler aborts the job on failure, so there
            // is no status to check.
            unsafe {
                ffi::MPI_Allreduce(
                    rtrain_mpi_in_place(),
                    chunk.as_mut_ptr().cast(),
                    chunk.len() as c_int,
                    datatype,
                    op,
                    comm,
                );
            }
        }
    }
}

/// The watchdog's side of the job ([`RollCall`]): plain MPI handles, so that its thread holds no
/// reference to the communicator whose drop finalises MPI.
struct WatchPort {
    topology: Topology,
    world: ffi::MPI_Comm,
    watch: ffi::MPI_Comm,
}

// SAFETY: MPI handles used from the watchdog thread under MPI_THREAD_MULTIPLE; the thread is
// joined before MPI_Finalize (MpiCommunicator's Watchdog is dropped before its Universe).
unsafe impl Send for WatchPort {}

impl RollCall for WatchPort {
    fn topology(&self) -> &Topology {
        &self.topology
    }

    fn answer_roll_calls(&self) {
        while let Some(caller) = self.receive_byte(ROLL_CALL) {
            let byte = 1u8;
            // SAFETY: one byte to a rank of the watch communicator; a blocking send of one byte
            // goes out eagerly, without waiting for the receiver.
            unsafe {
                ffi::MPI_Send((&raw const byte).cast(), 1, ffi::RSMPI_UINT8_T, caller, PRESENT, self.watch);
            }
        }
    }

    fn roll_call(&self, within: std::time::Duration) -> Vec<usize> {
        static CALL: u8 = 1;
        let me = self.topology.rank;
        let mut silent: Vec<usize> = (0..self.topology.world_size).filter(|&r| r != me).collect();
        for &rank in &silent {
            // SAFETY: MPI_Request is a plain handle; the buffer is a static, valid for ever (the
            // request is never completed: the job ends right after the roll call).
            unsafe {
                let mut request = ffi::RSMPI_REQUEST_NULL;
                ffi::MPI_Isend(
                    (&raw const CALL).cast_mut().cast(),
                    1,
                    ffi::RSMPI_UINT8_T,
                    rank as c_int,
                    ROLL_CALL,
                    self.watch,
                    &mut request,
                );
            }
        }
        let started = std::time::Instant::now();
        while !silent.is_empty() && started.elapsed() < within {
            // Other waiting ranks may be calling too.
            self.answer_roll_calls();
            match self.receive_byte(PRESENT) {
                Some(present) => silent.retain(|&rank| rank as c_int != present),
                None => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
        silent
    }

    fn abort(&self, code: i32) -> ! {
        // SAFETY: MPI_Abort on a valid communicator; it does not return.
        unsafe {
            ffi::MPI_Abort(self.world, code);
        }
        std::process::exit(code)
    }
}

impl WatchPort {
    /// Receives a one-byte message with `tag` on the watch communicator if one has arrived;
    /// returns its sender.
    fn receive_byte(&self, tag: c_int) -> Option<c_int> {
        let mut arrived: c_int = 0;
        let mut status = std::mem::MaybeUninit::<ffi::MPI_Status>::uninit();
        // SAFETY: probes the watch communicator; MPI fills `status` when a message arrived.
        unsafe {
            ffi::MPI_Iprobe(ffi::RSMPI_ANY_SOURCE, tag, self.watch, &mut arrived, status.as_mut_ptr());
        }
        if arrived == 0 {
            return None;
        }
        // SAFETY: set by the successful probe above.
        let source = unsafe { status.assume_init() }.MPI_SOURCE;
        let mut byte = 0u8;
        // SAFETY: receives the one byte that was probed.
        unsafe {
            ffi::MPI_Recv(
                (&raw mut byte).cast(),
                1,
                ffi::RSMPI_UINT8_T,
                source,
                tag,
                self.watch,
                ffi::RSMPI_STATUS_IGNORE,
            );
        }
        Some(source)
    }
}

/// A new communicator with the same ranks as `comm`, whose collectives never match `comm`'s.
fn duplicate(comm: ffi::MPI_Comm) -> ffi::MPI_Comm {
    let mut copy = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
    // SAFETY: a collective on a valid communicator; MPI writes the handle (its default error
    // handler aborts the job on failure, so it is always set).
    unsafe {
        ffi::MPI_Comm_dup(comm, copy.as_mut_ptr());
        copy.assume_init()
    }
}

/// An MPI reduction operation (commutative) from a user function.
fn create_op(
    function: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut ffi::MPI_Datatype),
) -> ffi::MPI_Op {
    let mut op = std::mem::MaybeUninit::<ffi::MPI_Op>::uninit();
    // SAFETY: MPI is initialised; the function has MPI_User_function's signature; MPI writes
    // the handle (its default error handler aborts the job on failure, so it is always set).
    unsafe {
        ffi::MPI_Op_create(Some(function), 1, op.as_mut_ptr());
        op.assume_init()
    }
}

/// The reduction of compressed gradients: `inout[i] = in[i] + inout[i]` in `wire`'s format.
///
/// # Safety
/// MPI passes `len` values of MPI_UINT16_T at both pointers.
unsafe fn sum_wire(wire: Wire, input: *mut c_void, inout: *mut c_void, len: *mut c_int) {
    let len = usize::try_from(*len).unwrap_or(0);
    let from = std::slice::from_raw_parts(input.cast::<u16>(), len);
    let into = std::slice::from_raw_parts_mut(inout.cast::<u16>(), len);
    wire.add_into(from, into);
}

unsafe extern "C" fn sum_bf16(
    input: *mut c_void,
    inout: *mut c_void,
    len: *mut c_int,
    _: *mut ffi::MPI_Datatype,
) {
    // SAFETY: as `sum_wire` requires; registered only for MPI_UINT16_T buffers.
    unsafe { sum_wire(Wire::Bf16, input, inout, len) }
}

unsafe extern "C" fn sum_fp16(
    input: *mut c_void,
    inout: *mut c_void,
    len: *mut c_int,
    _: *mut ffi::MPI_Datatype,
) {
    // SAFETY: as `sum_wire` requires; registered only for MPI_UINT16_T buffers.
    unsafe { sum_wire(Wire::Fp16, input, inout, len) }
}

/// Open MPI's algorithm numbers: `coll_tuned_allreduce_algorithm` (blocking) and
/// `coll_libnbc_iallreduce_algorithm` (non-blocking, the communication thread's).
fn open_mpi_numbers(algorithm: AllreduceAlgorithm) -> Option<(u32, u32)> {
    match algorithm {
        AllreduceAlgorithm::RecursiveDoubling => Some((3, 4)),
        AllreduceAlgorithm::Ring => Some((4, 1)),
        AllreduceAlgorithm::Rabenseifner => Some((6, 3)),
        AllreduceAlgorithm::Auto | AllreduceAlgorithm::Mpi => None,
    }
}

/// Asks Open MPI's tuned collectives for the algorithm through its MCA variables, which
/// MPI_Init reads from the environment. A variable the user set wins. Returns what was chosen,
/// for the log.
fn select_open_mpi_allreduce(algorithm: AllreduceAlgorithm, world_size: usize) -> String {
    const VARIABLE: &str = "OMPI_MCA_coll_tuned_allreduce_algorithm";
    // SAFETY: a constant query of the linked library.
    let open_mpi = unsafe { rtrain_mpi_is_open_mpi() } != 0;
    if let Ok(value) = std::env::var(VARIABLE) {
        return format!("{VARIABLE}={value} (set by the user)");
    }
    let wanted = match algorithm {
        AllreduceAlgorithm::Auto if world_size == 2 => AllreduceAlgorithm::RecursiveDoubling,
        AllreduceAlgorithm::Auto if world_size > 2 => AllreduceAlgorithm::Ring,
        other => other,
    };
    match (open_mpi, open_mpi_numbers(wanted)) {
        (true, Some((tuned, libnbc))) => {
            // Before MPI_Init, while this process has no other threads that read the
            // environment.
            std::env::set_var("OMPI_MCA_coll_tuned_use_dynamic_rules", "1");
            std::env::set_var(VARIABLE, tuned.to_string());
            std::env::set_var("OMPI_MCA_coll_libnbc_iallreduce_algorithm", libnbc.to_string());
            format!("{wanted:?} (Open MPI tuned {tuned}, libnbc {libnbc}; dist.allreduce = {algorithm:?})")
        }
        (false, Some(_)) => format!("the MPI library's choice ({wanted:?} is only selectable with Open MPI)"),
        (_, None) => "the MPI library's choice".to_string(),
    }
}

/// A panic unwinding out of one rank would leave the others blocked in their next collective
/// for ever; after the default report, end the whole job instead.
fn abort_job_on_panic(rank: usize) {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        eprintln!("rank {rank}: panicked; aborting the MPI job so that no rank waits for it");
        // SAFETY: MPI is initialised (the hook is installed after MPI_Init); MPI_Abort ends
        // every process of the job.
        unsafe {
            ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 70);
        }
    }));
}

fn to_usize(value: c_int) -> usize {
    usize::try_from(value).unwrap_or(0)
}
