//! rtrain's NCCL path under `mpirun`, over a fake CUDA/NCCL layer that fails where it is told
//! to: the set-up protocol, the event ordering between the compute and communication streams,
//! and the watchdog, on a machine without a GPU (tests/nccl_faults.rs runs it).
//!
//! `mpirun -np 2 nccl_faults [FAULT RANK [AFTER]]` picks the reducer the way training does
//! ([`choose_reducer`]), then runs real backward passes through [`GradSync`] and checks every
//! averaged gradient against MPI's. The fake keeps "device" memory on the host and sums it
//! over MPI, so the averages are real; its streams and events follow CUDA's rules closely
//! enough to catch a missing record or wait. FAULT (on rank RANK; AFTER all-reduces for the
//! runtime faults) is one of: none, load, set-device, same-gpu, stream, unique-id, init-fails,
//! init-hangs, async-error, stall, cpu. Exit 0 with "reducer: ..." and "gradients agree", or
//! 2 with "error: ..." on every rank for a set-up refused together; faults that end the job
//! end it through MPI_Abort.

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtrain::cluster::grad_sync::{choose_reducer, GradSync, Reducer, SyncOptions};
use rtrain::cluster::nccl::{DataType, Handle, NcclApi, NcclError, ReduceOp, UniqueId};
use rtrain::cluster::{self, watchdog, Communicator};
use rtrain::config::AllreduceAlgorithm;
use rtrain::util::logging::{self, LogFormat};
use tch::{Device, Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Load,
    SetDevice,
    SameGpu,
    Stream,
    UniqueId,
    InitFails,
    InitHangs,
    AsyncError,
    Stall,
    Cpu,
}

impl Fault {
    fn parse(name: &str) -> Option<Fault> {
        Some(match name {
            "none" => Fault::None,
            "load" => Fault::Load,
            "set-device" => Fault::SetDevice,
            "same-gpu" => Fault::SameGpu,
            "stream" => Fault::Stream,
            "unique-id" => Fault::UniqueId,
            "init-fails" => Fault::InitFails,
            "init-hangs" => Fault::InitHangs,
            "async-error" => Fault::AsyncError,
            "stall" => Fault::Stall,
            "cpu" => Fault::Cpu,
            _ => return None,
        })
    }
}

/// What the fake knows of its streams and events.
#[derive(Default)]
struct State {
    next_handle: usize,
    streams: HashSet<usize>,
    /// Event -> the stream it was last recorded on.
    recorded: HashMap<usize, usize>,
    /// Events recorded after the stall began: never complete.
    stalled: HashSet<usize>,
    /// Per stream, the events it has waited for since its last all-reduce.
    waited: HashMap<usize, Vec<usize>>,
    /// Events recorded on a side stream (all-reduces done) that the compute stream has not
    /// waited for yet.
    unwaited: HashSet<usize>,
    /// Per side stream, the ready event its pending all-reduce waited for; per ready event,
    /// the done event recorded after that all-reduce (the bucket's pair).
    last_ready: HashMap<usize, usize>,
    done_of: HashMap<usize, usize>,
    all_reduces: usize,
    /// The first broken rule of stream ordering, if any.
    violation: Option<String>,
}

struct FakeGpu {
    comm: Arc<dyn Communicator>,
    fault: Fault,
    /// The fault applies on this rank only.
    here: bool,
    after: usize,
    state: Mutex<State>,
}

impl FakeGpu {
    fn faulty(&self, fault: Fault) -> bool {
        self.here && self.fault == fault
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn new_handle(&self) -> Handle {
        let mut state = self.state();
        state.next_handle += 1;
        Handle(state.next_handle)
    }

    fn past_fault_point(&self) -> bool {
        self.state().all_reduces >= self.after
    }
}

/// One line on stderr in one write, so that the ranks' lines do not interleave.
fn say(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

fn hang() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

impl NcclApi for FakeGpu {
    fn describe(&self) -> String {
        "fake NCCL (host memory over MPI)".to_string()
    }
    fn set_device(&self, ordinal: usize) -> Result<(), String> {
        match self.faulty(Fault::SetDevice) {
            true => Err(format!("invalid device ordinal (fake CUDA error 101 for device {ordinal})")),
            false => Ok(()),
        }
    }
    fn gpu_identity(&self, _ordinal: usize) -> Result<String, String> {
        let rank = self.comm.topology().rank;
        let bus = if self.faulty(Fault::SameGpu) { 0 } else { rank };
        Ok(format!("0000:{bus:02x}:00.0"))
    }
    fn tensor_device(&self, _ordinal: usize) -> Device {
        Device::Cpu
    }
    fn unique_id(&self) -> Result<UniqueId, String> {
        match self.faulty(Fault::UniqueId) {
            true => Err("unhandled system error (fake: no usable network interface)".to_string()),
            false => Ok(UniqueId([7; 128])),
        }
    }
    fn init_rank(&self, world: usize, id: &UniqueId, rank: usize) -> Result<Handle, String> {
        assert_eq!(id.0, [7; 128], "rank {rank} of {world} did not receive rank 0's unique id");
        if self.fault == Fault::InitHangs {
            hang(); // every rank: NCCL's bootstrap waits for the peer that never arrives
        }
        if self.fault == Fault::InitFails {
            match self.here {
                true => return Err("unhandled system error (fake: shared memory too small)".to_string()),
                false => hang(), // as NCCL's peers wait for the rank that failed
            }
        }
        Ok(self.new_handle())
    }
    unsafe fn all_reduce(
        &self,
        _comm: Handle,
        data: *mut c_void,
        count: usize,
        datatype: DataType,
        op: ReduceOp,
        stream: Handle,
    ) -> Result<(), String> {
        assert_eq!(datatype, DataType::Float32, "the fake sums float32 only");
        {
            let mut state = self.state();
            // The rule that makes overlap safe: a side stream must have waited for an event
            // recorded on the compute stream (the bucket's gradients) since its last call.
            if stream != Handle::DEFAULT_STREAM {
                let waited = state.waited.remove(&stream.0).unwrap_or_default();
                let ready =
                    waited.iter().rev().find(|e| state.recorded.get(e) == Some(&Handle::DEFAULT_STREAM.0));
                if let Some(&ready) = ready {
                    state.last_ready.insert(stream.0, ready);
                } else {
                    let broken = format!(
                        "all-reduce {} on stream {} without waiting for the compute stream",
                        state.all_reduces, stream.0
                    );
                    state.violation.get_or_insert(broken);
                }
                if !state.streams.contains(&stream.0) {
                    state.violation.get_or_insert(format!("all-reduce on unknown stream {}", stream.0));
                }
            }
            state.all_reduces += 1;
        }
        // SAFETY: the caller passes `count` float32 values of host memory it holds for the call.
        let values = unsafe { std::slice::from_raw_parts_mut(data.cast::<f32>(), count) };
        self.comm.all_reduce_sum_f32(values);
        if op == ReduceOp::Avg {
            let scale = 1.0 / self.comm.topology().world_size as f32;
            values.iter_mut().for_each(|v| *v *= scale);
        }
        Ok(())
    }
    fn async_error(&self, _comm: Handle) -> Result<(), String> {
        match self.faulty(Fault::AsyncError) && self.past_fault_point() {
            true => Err("remote process exited or there was a network error (fake NCCL error 6)".to_string()),
            false => Ok(()),
        }
    }
    fn abort(&self, _comm: Handle) {
        say(&format!("fake: ncclCommAbort on rank {}", self.comm.topology().rank));
    }
    fn destroy(&self, _comm: Handle) {}
    fn create_stream(&self) -> Result<Handle, String> {
        if self.faulty(Fault::Stream) {
            return Err("out of memory (fake CUDA error 2)".to_string());
        }
        let stream = self.new_handle();
        self.state().streams.insert(stream.0);
        Ok(stream)
    }
    fn create_event(&self) -> Result<Handle, String> {
        Ok(self.new_handle())
    }
    fn record_event(&self, event: Handle, stream: Handle) -> Result<(), String> {
        let stall = self.faulty(Fault::Stall) && self.past_fault_point();
        let mut state = self.state();
        state.recorded.insert(event.0, stream.0);
        if stream == Handle::DEFAULT_STREAM {
            // A bucket's gradients ready once more, in a new step: the optimizer step before it
            // must have waited for the bucket's last all-reduce.
            if let Some(&done) = state.done_of.get(&event.0).filter(|done| state.unwaited.contains(done)) {
                let broken = format!(
                    "gradients written again (event {}) before all-reduce event {done} was waited for",
                    event.0
                );
                state.violation.get_or_insert(broken);
            }
        } else {
            // An event recorded again after the compute stream waited for it (rtrain recycles
            // done events once complete) no longer stands for its earlier all-reduce: forget
            // that pairing, or the earlier bucket's next ready event would be judged against
            // this all-reduce, which its step never had to wait for.
            if !state.unwaited.contains(&event.0) {
                state.done_of.retain(|_, done| *done != event.0);
            }
            state.unwaited.insert(event.0);
            if let Some(ready) = state.last_ready.remove(&stream.0) {
                state.done_of.insert(ready, event.0);
            }
            if stall {
                state.stalled.insert(event.0);
            }
        }
        Ok(())
    }
    fn wait_event(&self, stream: Handle, event: Handle) -> Result<(), String> {
        let mut state = self.state();
        if !state.recorded.contains_key(&event.0) {
            state
                .violation
                .get_or_insert(format!("stream {} waits for event {} never recorded", stream.0, event.0));
        }
        state.waited.entry(stream.0).or_default().push(event.0);
        if stream == Handle::DEFAULT_STREAM {
            state.unwaited.remove(&event.0);
        }
        Ok(())
    }
    fn event_done(&self, event: Handle) -> Result<bool, String> {
        Ok(!self.state().stalled.contains(&event.0))
    }
}

/// Parameters of a small network, and one rank's loss on its own batch of a step.
struct Net {
    weights: Vec<Tensor>,
}

impl Net {
    fn new() -> Net {
        tch::manual_seed(11);
        let shapes = [[48, 32], [40, 48], [10, 40]];
        Net {
            weights: shapes
                .iter()
                .map(|s| Tensor::randn(*s, (Kind::Float, Device::Cpu)).set_requires_grad(true))
                .collect(),
        }
    }

    fn loss(weights: &[Tensor], rank: usize, step: usize) -> Tensor {
        tch::manual_seed(1000 + 17 * step as i64 + rank as i64);
        let mut x = Tensor::randn([6, 32], (Kind::Float, Device::Cpu));
        for w in weights {
            x = x.matmul(&w.tr()).tanh();
        }
        x.pow_tensor_scalar(2).sum(Kind::Float)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fault = args.first().map_or(Some(Fault::None), |name| Fault::parse(name));
    let Some(fault) = fault else {
        say("usage: nccl_faults [FAULT RANK [AFTER]]");
        std::process::exit(2);
    };
    let fault_rank: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(1);
    let after: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(0);
    let comm = match cluster::init(AllreduceAlgorithm::Auto) {
        Ok(comm) => comm,
        Err(err) => {
            say(&format!("error: {err}"));
            std::process::exit(2);
        }
    };
    let rank = comm.topology().rank;
    logging::init(LogFormat::Human, Some("info"), None, true);
    watchdog::set_limit(Duration::from_secs(3));
    let fake = Arc::new(FakeGpu {
        comm: Arc::clone(&comm),
        fault,
        here: rank == fault_rank,
        after,
        state: Mutex::default(),
    });
    let device = if fault == Fault::Cpu && rank == fault_rank { Device::Cpu } else { Device::Cuda(0) };
    let layer = Arc::clone(&fake);
    let load = move || -> Result<Arc<dyn NcclApi>, NcclError> {
        match layer.faulty(Fault::Load) {
            true => Err(NcclError::Load { library: "libnccl.so.2".into(), reason: "fake: not found".into() }),
            false => Ok(layer),
        }
    };
    let reducer = match choose_reducer(&comm, device, load) {
        Ok(reducer) => reducer,
        Err(err) => {
            say(&format!("rank {rank}: error: {err}"));
            // Finalise MPI (the fake holds the communicator too): a clean exit on every rank.
            drop(fake);
            drop(comm);
            std::process::exit(2);
        }
    };
    let reducer_name = match &reducer {
        Reducer::Mpi => "mpi",
        Reducer::Nccl(_) => "nccl",
    };
    println!("rank {rank}: reducer: {reducer_name}");

    let net = Net::new();
    let params: Vec<(String, Tensor)> =
        net.weights.iter().enumerate().map(|(i, w)| (format!("w{i}"), w.shallow_clone())).collect();
    // A cap below every parameter: one bucket each, so several all-reduces overlap backward.
    let options =
        SyncOptions { bucket_mb: 1e-6, overlap: true, poll: Duration::from_micros(200), wire: None };
    let mut sync = GradSync::new(Arc::clone(&comm), params, options, reducer).expect("gradient sync");
    let mut worst = 0.0f64;
    for step in 0..6 {
        watchdog::set_phase("a training step", step as u64 + 1);
        sync.zero_grad();
        Net::loss(&net.weights, rank, step).backward();
        if let Err(err) = sync.finish() {
            say(&format!("rank {rank}: error: {err}"));
            std::process::exit(2);
        }
        // The reference: this rank's own gradients, averaged over MPI on this thread.
        let local: Vec<Tensor> =
            net.weights.iter().map(|w| w.detach().copy().set_requires_grad(true)).collect();
        Net::loss(&local, rank, step).backward();
        for (w, reference) in net.weights.iter().zip(&local) {
            let mut expected = reference.grad().copy();
            cluster::all_reduce_tensor(comm.as_ref(), &mut expected, "reference").expect("reference sum");
            let expected = expected / comm.topology().world_size as f64;
            let diff = (w.grad() - &expected).abs().max().double_value(&[]);
            worst = worst.max(diff);
        }
    }
    // Let the watchdog look at the last all-reduces (a stall or an error after the last step).
    let watched = matches!(fault, Fault::AsyncError | Fault::Stall);
    std::thread::sleep(Duration::from_millis(if watched { 6000 } else { 300 }));
    let violation = {
        let state = fake.state();
        let unwaited = (!state.unwaited.is_empty())
            .then(|| format!("the last step did not wait for all-reduce events {:?}", state.unwaited));
        state.violation.clone().or(unwaited)
    };
    if let Some(violation) = violation {
        say(&format!("rank {rank}: error: stream ordering: {violation}"));
        std::process::exit(1);
    }
    let all_reduces = fake.state().all_reduces;
    println!("rank {rank}: {all_reduces} fake NCCL all-reduces; max |gradient - MPI reference| {worst:e}");
    if worst > 1e-6 {
        say(&format!("rank {rank}: error: gradients differ from the MPI reference by {worst:e}"));
        std::process::exit(1);
    }
    println!("rank {rank}: gradients agree");
    drop(sync);
    drop(fake);
    drop(comm);
}
