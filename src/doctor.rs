//! `rtrain doctor`: what this process sees of its surroundings (container runtime, GPUs and
//! driver, MPI launcher and job, threads, the data and run directories and their free space) and
//! the concrete fix for each problem found.
//!
//! Everything read from the machine goes through a [`Probe`]: environment variables plus a
//! filesystem root. The process uses `/` and its real environment; tests point the root at a
//! temporary directory holding the marks each runtime leaves (`/.dockerenv`,
//! `/run/.containerenv`, `/.singularity.d`, `/dev/nvidia0`, `/proc/driver/nvidia/version`), so
//! Apptainer, Docker and Podman with or without GPUs are simulated without them.
//! The judgement ([`findings`]) is a pure function of the gathered [`Facts`].

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::cluster::cuda::CudaStack;
use crate::cluster::launcher::{self, LaunchInfo};
use crate::cluster::runtime::{
    detect_image, detect_runtime, driver_version, gpu_devices, gpus_requested, usable_gpus, Probe, Runtime,
};
use crate::cluster::slurm::SlurmJob;
use crate::cluster::Topology;
use crate::config::{Config, DEFAULT_DATA_ROOT};
use crate::model::precision::{self, Compute};
use crate::plan;
use crate::run_dir::manifest::LIBTORCH_VERSION;

/// Below this much free space in the run directory's filesystem, checkpoints may not fit
/// (a ResNet-50 checkpoint with SGD momentum is about 200 MB; `checkpoint.keep_last` of them).
pub const MIN_RUN_DIR_FREE: u64 = 1 << 30;
use crate::util::memory::{available_bytes, MIN_SHM_FREE};

/// A directory rtrain needs, and what is known about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Directory {
    /// "data", "run", "shm" or "stage" (`data.stage_dir`).
    pub role: &'static str,
    pub path: PathBuf,
    pub exists: bool,
    pub available_bytes: Option<u64>,
}

impl Directory {
    pub fn probe(role: &'static str, path: &Path) -> Directory {
        Directory {
            role,
            path: path.to_path_buf(),
            exists: path.exists(),
            available_bytes: available_bytes(path),
        }
    }
}

/// What libtorch says about CUDA, and the CUDA stack under it (whether this binary was built
/// for CUDA, the runtime, driver, cuDNN and NCCL it finds).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cuda {
    pub available: bool,
    pub devices: usize,
    #[serde(flatten)]
    pub stack: CudaStack,
}

/// The MPI side: whether MPI is compiled in, what the launcher variables say, and the job as the
/// communicator sees it (or why joining it failed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mpi {
    pub built_in: bool,
    pub launcher: Option<String>,
    pub job: Option<Topology>,
    /// Why joining the job failed.
    pub error: Option<String>,
    /// The device this rank would take, or why it cannot take one.
    pub rank_device: Option<String>,
    pub device_error: Option<String>,
}

impl Mpi {
    pub fn from_launch(launch: Option<&LaunchInfo>) -> Mpi {
        Mpi {
            built_in: cfg!(feature = "mpi"),
            launcher: launch.map(|l| l.launcher.to_string()),
            job: None,
            error: None,
            rank_device: None,
            device_error: None,
        }
    }
}

/// Threads: the cores this process may use, what `train.threads` asks for, and how many ranks
/// share the node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Threads {
    pub cores: usize,
    pub configured: usize,
    /// The libtorch threads training takes here (`plan::threads_per_rank`).
    pub per_rank: usize,
    pub local_ranks: usize,
}

/// Everything `rtrain doctor` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Facts {
    pub runtime: Runtime,
    pub image: Option<String>,
    pub hostname: String,
    pub gpu_devices: Vec<String>,
    /// The GPUs this process may use: the device nodes narrowed by NVIDIA_VISIBLE_DEVICES and
    /// CUDA_VISIBLE_DEVICES ([`usable_gpus`]).
    pub usable_gpus: usize,
    pub gpus_requested: bool,
    pub driver: Option<String>,
    pub cuda: Cuda,
    pub mpi: Mpi,
    /// The Slurm job this process runs in, if any.
    pub slurm: Option<SlurmJob>,
    /// Set when this process runs in a Slurm job of several tasks without being one of them
    /// (a batch script or `salloc` shell without `srun`): it would train alone.
    pub slurm_note: Option<String>,
    pub threads: Threads,
    pub directories: Vec<Directory>,
    /// `data.root` is the built-in default, generated on first use when missing.
    pub data_is_default: bool,
}

impl Facts {
    /// The probe's part of the facts; the caller fills in what libtorch, MPI and the
    /// configuration say.
    pub fn from_probe(probe: &Probe, cuda: Cuda, mpi: Mpi, threads: Threads) -> Facts {
        let slurm_note = match mpi.launcher {
            Some(_) => None,
            None => launcher::unlaunched_in_slurm_batch(|name| probe.var(name).map(str::to_string)),
        };
        Facts {
            runtime: detect_runtime(probe),
            image: detect_image(probe),
            hostname: crate::cluster::hostname(),
            gpu_devices: gpu_devices(probe),
            usable_gpus: usable_gpus(probe),
            gpus_requested: gpus_requested(probe),
            driver: driver_version(probe),
            cuda,
            mpi,
            slurm: SlurmJob::detect(probe),
            slurm_note,
            threads,
            directories: Vec::new(),
            data_is_default: false,
        }
    }

    fn directory(&self, role: &str) -> Option<&Directory> {
        self.directories.iter().find(|d| d.role == role)
    }
}

/// A problem and the command-line change, option or setting that fixes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub problem: String,
    pub fix: String,
}

fn finding(problem: impl Into<String>, fix: impl Into<String>) -> Finding {
    Finding { problem: problem.into(), fix: fix.into() }
}

/// How to pass the host's GPUs into each runtime.
fn gpu_option(runtime: Runtime) -> &'static str {
    match runtime {
        Runtime::Apptainer => {
            "add --nv: `apptainer run --nv rtrain.sif ...` (binds the driver and /dev/nvidia*)"
        }
        Runtime::Charliecloud => {
            "inject the host's NVIDIA libraries into the image directory once: `ch-fromhost --nvidia IMAGE_DIR`"
        }
        Runtime::Docker => {
            "add --gpus all: `docker run --gpus all ...` (needs the NVIDIA Container Toolkit on the host)"
        }
        Runtime::Podman => {
            "add --device nvidia.com/gpu=all (CDI; generate the spec once with `nvidia-ctk cdi generate`)"
        }
        Runtime::None => "check that the NVIDIA driver is loaded (`nvidia-smi`) and that /dev/nvidia* exist",
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// The problems in `facts`, each with its fix. Empty when all is well.
pub fn findings(facts: &Facts) -> Vec<Finding> {
    let mut found = Vec::new();
    if facts.gpus_requested && facts.gpu_devices.is_empty() {
        found.push(finding(
            format!("GPUs are expected (NVIDIA_VISIBLE_DEVICES is set) but no /dev/nvidia* device is visible under {}", facts.runtime),
            gpu_option(facts.runtime),
        ));
    }
    let gpus = facts.usable_gpus;
    // A CPU build, a driver too old for libtorch's CUDA, libcuda not bound in, ...
    if gpus > 0 && !facts.cuda.available {
        let diagnosis = facts.cuda.stack.diagnosis();
        found.push(finding(
            format!("{gpus} usable GPU(s), but CUDA cannot use them: {diagnosis}"),
            diagnosis.fix(),
        ));
    }
    if let (true, Err(why)) = (facts.cuda.available && facts.cuda.devices > 0, &facts.cuda.stack.nccl) {
        found.push(finding(
            format!("NCCL does not load ({why}): multi-GPU gradients would go through MPI and host memory"),
            "use the image's libtorch (its PyTorch wheels ship libnccl.so.2), or point RTRAIN_NCCL at libnccl.so.2",
        ));
    }
    if let Some(error) = &facts.mpi.error {
        let fix = if facts.mpi.built_in {
            "launch with the MPI that matches the image's Open MPI (hybrid model: same major version and PMIx on host and in the container), or run without a launcher"
        } else {
            "this rtrain is built without MPI: rebuild with default features (`cargo build --release`), or run one process without a launcher"
        };
        found.push(finding(format!("cannot join the MPI job: {error}"), fix));
    }
    if let Some(error) = &facts.mpi.device_error {
        let gpus = facts.cuda.devices;
        found.push(finding(
            error.clone(),
            format!("start at most {gpus} ranks per node, one per GPU (`--map-by ppr:{gpus}:node`, `srun --ntasks-per-node {gpus}`)"),
        ));
    }
    if let Some((tasks, gpus)) = facts.slurm.as_ref().and_then(SlurmJob::tasks_without_a_gpu) {
        found.push(finding(
            format!("{tasks} Slurm tasks on this node share its {gpus} GPU(s) (SLURM_GPUS_ON_NODE): one rank per GPU"),
            format!("ask for a GPU per task (`--gpus-per-task=1`) or at most {gpus} tasks per node (`--ntasks-per-node={gpus}`)"),
        ));
    }
    let threads = &facts.threads;
    if threads.configured > 0 && threads.configured * threads.local_ranks > threads.cores {
        found.push(finding(
            format!(
                "train.threads = {} for each of {} rank(s) on this node oversubscribes its {} cores",
                threads.configured, threads.local_ranks, threads.cores
            ),
            format!(
                "set train.threads = 0 (each rank takes its share of the cores) or at most {}",
                (threads.cores / threads.local_ranks.max(1)).max(1)
            ),
        ));
    }
    if let Some(data) = facts.directory("data") {
        if !data.exists && !facts.data_is_default {
            found.push(finding(
                format!("data.root {} does not exist", data.path.display()),
                format!(
                    "point data.root at an image tree with train/ and val/ folders of one folder per class, or create one with `rtrain data synth {}`",
                    data.path.display()
                ),
            ));
        }
    }
    if let Some(run) = facts.directory("run") {
        if let Some(free) = run.available_bytes.filter(|&free| free < MIN_RUN_DIR_FREE) {
            found.push(finding(
                format!("only {} free for the run directory {}", gib(free), run.path.display()),
                format!(
                    "free space or set run.dir to a filesystem with at least {} free",
                    gib(MIN_RUN_DIR_FREE)
                ),
            ));
        }
    }
    if let Some(stage) = facts.directory("stage") {
        if let Some(free) = stage.available_bytes.filter(|&free| free < MIN_RUN_DIR_FREE) {
            found.push(finding(
                format!("only {} free for data.stage_dir {}", gib(free), stage.path.display()),
                "point data.stage_dir at a node-local disk with room for the shard set (e.g. /tmp or $SLURM_TMPDIR)",
            ));
        }
    }
    if matches!(facts.runtime, Runtime::Docker | Runtime::Podman) {
        if let Some(free) =
            facts.directory("shm").and_then(|d| d.available_bytes).filter(|&free| free < MIN_SHM_FREE)
        {
            found.push(finding(
                format!(
                    "/dev/shm has only {} MiB free; Open MPI's shared-memory transport needs more",
                    free >> 20
                ),
                format!("start the container with --shm-size=1g (or --ipc=host) under {}", facts.runtime),
            ));
        }
    }
    found
}

/// The human form of a report.
pub fn render(facts: &Facts, findings: &[Finding], preamble: &[String]) -> String {
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    for text in preamble {
        line(text.clone());
    }
    line(format!(
        "runtime: {}{} on host {}",
        facts.runtime,
        facts.image.as_ref().map(|i| format!(" (image {i})")).unwrap_or_default(),
        facts.hostname
    ));
    let stack = &facts.cuda.stack;
    line(format!(
        "gpus: {} device(s) {}, {} usable; models {}; driver {}; requested by NVIDIA_VISIBLE_DEVICES: {}",
        facts.gpu_devices.len(),
        if facts.gpu_devices.is_empty() { "-".to_string() } else { facts.gpu_devices.join(",") },
        facts.usable_gpus,
        if stack.gpu_models.is_empty() { "-".to_string() } else { stack.gpu_models.join(", ") },
        facts.driver.as_deref().unwrap_or("none"),
        facts.gpus_requested
    ));
    let version = |v: Option<String>| v.unwrap_or_else(|| "none".to_string());
    line(format!(
        "cuda: built {}, available {}, {} device(s), runtime {}, driver supports {}, cuDNN {}, {}",
        stack.built,
        facts.cuda.available,
        facts.cuda.devices,
        version(stack.runtime.map(|v| v.to_string())),
        match &stack.driver_cuda {
            Ok(cuda) => format!("CUDA {cuda}"),
            Err(why) => format!("no CUDA ({why})"),
        },
        version(stack.cudnn.clone()),
        match &stack.nccl {
            Ok(nccl) => nccl.clone(),
            Err(why) => format!("no NCCL ({why})"),
        }
    ));
    let mpi = &facts.mpi;
    line(match (&mpi.job, &mpi.launcher) {
        (Some(job), _) => format!("job: {job}"),
        (None, Some(launcher)) => format!("job: launched by {launcher}, not joined"),
        (None, None) => format!(
            "job: single process (no launcher variables); MPI support {}",
            if mpi.built_in { "built in" } else { "not built" }
        ),
    });
    if let Some(slurm) = &facts.slurm {
        line(format!("slurm: {slurm}"));
        if let Some(note) = &facts.slurm_note {
            line(format!("  note: {note}"));
        }
    }
    line(format!(
        "threads: {} cores, train.threads = {} ({}: {} per rank), {} rank(s) on this node",
        facts.threads.cores,
        facts.threads.configured,
        if facts.threads.configured == 0 { "this rank's share" } else { "fixed" },
        facts.threads.per_rank,
        facts.threads.local_ranks
    ));
    for dir in &facts.directories {
        line(format!(
            "{}: {} ({}, {} free)",
            dir.role,
            dir.path.display(),
            if dir.exists { "exists" } else { "not created yet" },
            dir.available_bytes.map_or_else(|| "unknown".to_string(), gib)
        ));
    }
    if findings.is_empty() {
        line("problems: none found".to_string());
    } else {
        line(format!("problems: {}", findings.len()));
        for f in findings {
            line(format!("  - {}\n    fix: {}", f.problem, f.fix));
        }
    }
    out
}

/// What `rtrain doctor` reports: the facts it gathered, the problems it found, and how the
/// configuration would compute here.
pub struct Examination {
    pub facts: Facts,
    pub problems: Vec<Finding>,
    pub device: tch::Device,
    pub compute: Compute,
    pub compute_reason: String,
}

/// Gathers the facts of this process (under a launcher it joins the job, since MPI's
/// communicator is the truth) and judges them, with `config` saying which directories matter.
pub fn examine(config: &Config) -> Examination {
    let probe = Probe::process();
    // A malformed launcher variable is a finding, not the end of the report.
    let (launch, launch_error) = match launcher::detect_from_process() {
        Ok(launch) => (launch, None),
        Err(error) => (None, Some(error.to_string())),
    };
    let cuda = Cuda {
        available: tch::Cuda::is_available(),
        devices: usize::try_from(tch::Cuda::device_count()).unwrap_or(0),
        stack: CudaStack::probe(&probe),
    };
    // Under a launcher, join the job to show what MPI says; a failure to join is a finding.
    let mut mpi = Mpi::from_launch(launch.as_ref());
    mpi.error = launch_error;
    if launch.is_some() {
        match crate::cluster::init(crate::config::AllreduceAlgorithm::Mpi) {
            Ok(comm) => {
                let job = comm.topology().clone();
                match crate::cluster::device_for(&job, cuda.devices) {
                    Ok(device) => mpi.rank_device = Some(format!("{device:?}")),
                    Err(error) => mpi.device_error = Some(error.to_string()),
                }
                mpi.job = Some(job);
            }
            Err(error) => mpi.error = Some(error.to_string()),
        }
    }
    // What training would choose here, from the plan's own functions: this rank's device
    // (a GPU that cannot be used is reported as a problem below, and the CPU shown) and its
    // threads.
    let topology = mpi.job.clone().unwrap_or_else(Topology::single);
    let device = plan::choose_device(config, &topology).unwrap_or(tch::Device::Cpu);
    let (compute, compute_reason) = plan::compute_on(config, device);
    let threads = Threads {
        cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        configured: config.train.threads,
        per_rank: plan::threads_per_rank(config.train.threads, topology.local_world_size),
        local_ranks: topology.local_world_size,
    };
    let mut facts = Facts::from_probe(&probe, cuda, mpi, threads);
    facts.data_is_default = config.data.root == Path::new(DEFAULT_DATA_ROOT);
    facts.directories = vec![
        Directory::probe("data", &config.data.root),
        Directory::probe("run", &config.run.dir),
        Directory::probe("shm", &probe.path("/dev/shm")),
    ];
    if let Some(stage_dir) = &config.data.stage_dir {
        facts.directories.push(Directory::probe("stage", stage_dir));
    }
    let problems = findings(&facts);
    Examination { facts, problems, device, compute, compute_reason }
}

impl Examination {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "rtrain": env!("CARGO_PKG_VERSION"),
            "libtorch": LIBTORCH_VERSION,
            "cpu": {"native_bf16": precision::cpu_has_native_bf16()},
            "compute": {
                "device": format!("{:?}", self.device),
                "precision": self.compute.precision.to_string(),
                "precision_reason": self.compute_reason,
                "channels_last": self.compute.channels_last,
            },
            "environment": self.facts,
            "problems": self.problems,
        })
    }

    /// The report as people read it.
    pub fn render(&self) -> String {
        let preamble = [
            format!("rtrain {} on libtorch {LIBTORCH_VERSION}", env!("CARGO_PKG_VERSION")),
            format!("cpu: native bf16 {}", precision::cpu_has_native_bf16()),
            format!("compute: {} ({})", self.compute, self.compute_reason),
        ];
        render(&self.facts, &self.problems, &preamble)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::cuda::{gpu_models, CudaVersion};

    /// One simulated machine: files under the fake root, and environment variables.
    struct Case {
        name: &'static str,
        files: &'static [&'static str],
        vars: &'static [(&'static str, &'static str)],
        runtime: Runtime,
        gpus: usize,
        requested: bool,
        /// Text the fix of the GPU finding must contain; None: no GPU finding.
        gpu_fix: Option<&'static str>,
    }

    const DRIVER: &str = "proc/driver/nvidia/version";

    const CASES: &[Case] = &[
        Case {
            name: "bare host",
            files: &[],
            vars: &[],
            runtime: Runtime::None,
            gpus: 0,
            requested: false,
            gpu_fix: None,
        },
        Case {
            name: "docker without --gpus, CUDA image",
            files: &[".dockerenv"],
            vars: &[("NVIDIA_VISIBLE_DEVICES", "all")],
            runtime: Runtime::Docker,
            gpus: 0,
            requested: true,
            gpu_fix: Some("--gpus all"),
        },
        Case {
            name: "docker with --gpus all",
            files: &[".dockerenv", "dev/nvidia0", "dev/nvidia1", "dev/nvidiactl", "dev/nvidia-uvm", DRIVER],
            vars: &[("NVIDIA_VISIBLE_DEVICES", "all")],
            runtime: Runtime::Docker,
            gpus: 2,
            requested: true,
            gpu_fix: None,
        },
        Case {
            name: "docker, Debian image, no GPU asked",
            files: &[".dockerenv"],
            vars: &[],
            runtime: Runtime::Docker,
            gpus: 0,
            requested: false,
            gpu_fix: None,
        },
        Case {
            name: "podman without CDI device",
            files: &["run/.containerenv", ".dockerenv"],
            vars: &[("NVIDIA_VISIBLE_DEVICES", "all")],
            runtime: Runtime::Podman,
            gpus: 0,
            requested: true,
            gpu_fix: Some("nvidia.com/gpu=all"),
        },
        Case {
            name: "podman by variable only",
            files: &[],
            vars: &[("container", "podman")],
            runtime: Runtime::Podman,
            gpus: 0,
            requested: false,
            gpu_fix: None,
        },
        Case {
            name: "apptainer without --nv",
            files: &[".singularity.d/env/90-environment.sh"],
            vars: &[("APPTAINER_CONTAINER", "/scratch/rtrain.sif"), ("NVIDIA_VISIBLE_DEVICES", "all")],
            runtime: Runtime::Apptainer,
            gpus: 0,
            requested: true,
            gpu_fix: Some("--nv"),
        },
        Case {
            name: "apptainer with --nv, 4 GPUs",
            files: &[
                ".singularity.d/runscript",
                "dev/nvidia0",
                "dev/nvidia1",
                "dev/nvidia2",
                "dev/nvidia3",
                DRIVER,
            ],
            vars: &[("SINGULARITY_CONTAINER", "/scratch/rtrain.sif")],
            runtime: Runtime::Apptainer,
            gpus: 4,
            requested: false,
            gpu_fix: None,
        },
        Case {
            // An image directory from `docker export` keeps /.dockerenv.
            name: "charliecloud (ch-run) on an exported Docker image, GPUs expected",
            files: &[".dockerenv"],
            vars: &[("CH_RUNNING", "Weird Al Yankovic"), ("NVIDIA_VISIBLE_DEVICES", "all")],
            runtime: Runtime::Charliecloud,
            gpus: 0,
            requested: true,
            gpu_fix: Some("ch-fromhost --nvidia"),
        },
        Case {
            name: "GPUs switched off on purpose",
            files: &[".dockerenv"],
            vars: &[("NVIDIA_VISIBLE_DEVICES", "void")],
            runtime: Runtime::Docker,
            gpus: 0,
            requested: false,
            gpu_fix: None,
        },
        Case {
            name: "host with a driver but no GPU bound",
            files: &[DRIVER],
            vars: &[("NVIDIA_VISIBLE_DEVICES", "0")],
            runtime: Runtime::None,
            gpus: 0,
            requested: true,
            gpu_fix: Some("nvidia-smi"),
        },
    ];

    fn build(case: &Case) -> (tempfile::TempDir, Probe) {
        let root = tempfile::tempdir().unwrap();
        for file in case.files {
            let path = root.path().join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let text = if *file == DRIVER {
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.82.07  Wed Aug 20 2025\nGCC version:  gcc 12\n"
            } else {
                ""
            };
            std::fs::write(&path, text).unwrap();
        }
        let probe = Probe::simulated(root.path(), case.vars);
        (root, probe)
    }

    /// A CUDA 13 stack as libtorch's wheels bring it; the driver's side as `probe` shows it,
    /// with a driver library that loads when CUDA is to be available.
    fn stack(probe: &Probe, built: bool, cuda_available: bool) -> CudaStack {
        CudaStack {
            built,
            runtime: built.then_some(CudaVersion(13000)),
            driver: driver_version(probe),
            driver_cuda: if cuda_available {
                Ok(CudaVersion(13000))
            } else {
                Err("libcuda.so.1: cannot open shared object file: No such file or directory".to_string())
            },
            cudnn: built.then(|| "9.10.2".to_string()),
            nccl: if cuda_available {
                Ok("NCCL 2.27.3 (libnccl.so.2)".to_string())
            } else {
                Err("not loaded".to_string())
            },
            gpu_models: gpu_models(probe),
        }
    }

    fn quiet_facts(probe: &Probe, cuda_built: bool, cuda_available: bool) -> Facts {
        let devices = gpu_devices(probe).len();
        let cuda =
            Cuda { available: cuda_available, devices, stack: stack(probe, cuda_built, cuda_available) };
        let mpi = Mpi::from_launch(None);
        Facts::from_probe(
            probe,
            cuda,
            mpi,
            Threads { cores: 16, configured: 0, per_rank: 16, local_ranks: 1 },
        )
    }

    #[test]
    fn simulated_runtimes_are_detected_with_their_gpus_and_fixes() {
        for case in CASES {
            let (_root, probe) = build(case);
            let facts = quiet_facts(&probe, true, !gpu_devices(&probe).is_empty());
            assert_eq!(facts.runtime, case.runtime, "{}", case.name);
            assert_eq!(facts.gpu_devices.len(), case.gpus, "{}", case.name);
            assert_eq!(facts.gpus_requested, case.requested, "{}", case.name);
            let found = findings(&facts);
            match case.gpu_fix {
                Some(fix) => {
                    assert_eq!(found.len(), 1, "{}: {found:?}", case.name);
                    assert!(found[0].fix.contains(fix), "{}: {:?} lacks {fix}", case.name, found[0].fix);
                    assert!(found[0].problem.contains(&case.runtime.to_string()), "{}", case.name);
                }
                None => assert!(found.is_empty(), "{}: {found:?}", case.name),
            }
        }
    }

    #[test]
    fn driver_version_and_device_order_are_read_from_the_root() {
        let (_root, probe) = build(&CASES[7]);
        assert_eq!(driver_version(&probe).as_deref(), Some("580.82.07"));
        assert_eq!(gpu_devices(&probe), ["nvidia0", "nvidia1", "nvidia2", "nvidia3"]);
        assert_eq!(detect_image(&probe).as_deref(), Some("/scratch/rtrain.sif"));
        // nvidia10 sorts after nvidia2 (numeric, not lexical), and control nodes are not GPUs.
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("dev")).unwrap();
        for name in ["nvidia10", "nvidia2", "nvidiactl", "nvidia-caps", "nvme0"] {
            std::fs::write(root.path().join("dev").join(name), "").unwrap();
        }
        assert_eq!(gpu_devices(&Probe::simulated(root.path(), &[])), ["nvidia2", "nvidia10"]);
    }

    #[test]
    fn gpus_without_a_cuda_build_or_driver_library_name_the_fix() {
        let (_root, probe) = build(&CASES[2]);
        let cpu_build = findings(&quiet_facts(&probe, false, false));
        assert_eq!(cpu_build.len(), 1);
        assert!(cpu_build[0].fix.contains("--features cuda"), "{cpu_build:?}");
        let no_libcuda = findings(&quiet_facts(&probe, true, false));
        assert_eq!(no_libcuda.len(), 1);
        assert!(no_libcuda[0].problem.contains("driver 580.82.07"), "{no_libcuda:?}");
        assert!(no_libcuda[0].fix.contains("--gpus all"), "{no_libcuda:?}");
    }

    #[test]
    fn a_driver_too_old_for_libtorchs_cuda_names_both_versions_and_the_driver_needed() {
        let (root, probe) = build(&CASES[7]); // apptainer --nv, 4 GPUs
        std::fs::write(
            root.path().join(DRIVER),
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n",
        )
        .unwrap();
        let mut facts = quiet_facts(&probe, true, false);
        facts.cuda.stack.driver_cuda = Ok(CudaVersion(12020));
        let found = findings(&facts);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            found[0].problem,
            "4 usable GPU(s), but CUDA cannot use them: the NVIDIA driver 535.104.05 supports CUDA up to 12.2, \
             and this libtorch needs CUDA 13.0 (driver 580 or newer)"
        );
        for part in ["580 or newer", "Older drivers", "train.device = \"cpu\""] {
            assert!(found[0].fix.contains(part), "{part:?} missing from {:?}", found[0].fix);
        }
        let json = serde_json::to_value(&facts).unwrap();
        let cuda = &json["cuda"];
        assert_eq!((&cuda["runtime"], &cuda["driver_cuda"]["Ok"]), (&"13.0".into(), &"12.2".into()));
        assert_eq!((&cuda["driver"], &cuda["cudnn"]), (&"535.104.05".into(), &"9.10.2".into()));
        assert_eq!(json["usable_gpus"], 4);
        // CUDA_VISIBLE_DEVICES="" hides the GPUs on purpose: nothing to report.
        let hidden = Probe::simulated(root.path(), &[("CUDA_VISIBLE_DEVICES", "")]);
        let mut facts = quiet_facts(&hidden, true, false);
        facts.cuda.stack.driver_cuda = Ok(CudaVersion(12020));
        assert_eq!(findings(&facts), []);
    }

    #[test]
    fn mpi_threads_directories_and_shm_problems() {
        let (_root, probe) = build(&CASES[3]); // docker, no GPU
        let mut facts = quiet_facts(&probe, false, false);
        facts.mpi.error = Some("launched by OpenMPI (mpirun) as rank 1 of 2".into());
        facts.mpi.built_in = false;
        facts.threads = Threads { cores: 8, configured: 6, per_rank: 6, local_ranks: 2 };
        facts.directories = vec![
            Directory { role: "data", path: "/nope".into(), exists: false, available_bytes: Some(1 << 40) },
            Directory { role: "run", path: "runs".into(), exists: true, available_bytes: Some(300 << 20) },
            Directory { role: "shm", path: "/dev/shm".into(), exists: true, available_bytes: Some(64 << 20) },
            Directory {
                role: "stage",
                path: "/tmp/rtrain".into(),
                exists: false,
                available_bytes: Some(10 << 20),
            },
        ];
        let found = findings(&facts);
        assert_eq!(found.len(), 6, "{found:#?}");
        assert!(found[4].problem.contains("data.stage_dir /tmp/rtrain"), "{found:#?}");
        facts.directories.pop();
        let found = findings(&facts);
        let fixes: Vec<&str> = found.iter().map(|f| f.fix.as_str()).collect();
        assert_eq!(found.len(), 5, "{found:#?}");
        assert!(fixes[0].contains("built without MPI"));
        assert!(fixes[1].contains("at most 4"), "{}", fixes[1]);
        assert!(found[2].problem.contains("/nope") && fixes[2].contains("rtrain data synth /nope"));
        assert!(found[3].problem.contains("0.3 GiB") && found[3].problem.contains("runs"));
        assert!(found[4].problem.contains("64 MiB") && fixes[4].contains("--shm-size"));

        // The same numbers are fine where they should be: default data is generated on first use,
        // a bare host's /dev/shm is not limited by a container, enough threads for both ranks.
        facts.mpi.error = None;
        facts.threads.configured = 4;
        facts.data_is_default = true;
        facts.directories[1].available_bytes = Some(MIN_RUN_DIR_FREE);
        facts.runtime = Runtime::None;
        assert_eq!(findings(&facts), []);
    }

    #[test]
    fn more_ranks_than_gpus_on_a_node_says_how_many_to_start() {
        let (_root, probe) = build(&CASES[2]); // docker with 2 GPUs
        let mut facts = quiet_facts(&probe, true, true);
        let mut job = Topology::single();
        (job.rank, job.world_size, job.local_rank, job.local_world_size) = (2, 4, 2, 4);
        let error = crate::cluster::device_for(&job, facts.cuda.devices).unwrap_err();
        facts.mpi.device_error = Some(error.to_string());
        let found = findings(&facts);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].problem.contains("rank 2"), "{found:?}");
        assert!(found[0].fix.contains("at most 2 ranks per node"), "{found:?}");
    }

    #[test]
    fn free_space_is_measured_at_the_nearest_existing_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let existing = available_bytes(dir.path()).unwrap();
        let future = available_bytes(&dir.path().join("not/yet/made")).unwrap();
        assert!(existing > 0);
        // Same filesystem; allow for other writers between the two calls.
        assert!(existing.abs_diff(future) < 64 << 20, "{existing} vs {future}");
    }
}
