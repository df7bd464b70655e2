//! The CUDA stack this process finds, layer by layer: the CUDA runtime libtorch was built with,
//! the NVIDIA driver (kernel module and its user-space library `libcuda.so.1`) and the CUDA
//! version that driver supports, cuDNN, NCCL and the GPU models. And, from those facts alone,
//! why CUDA is unusable ([`CudaStack::diagnosis`]): the commonest cause on clusters is a host
//! driver older than the CUDA of PyTorch's wheels (CUDA 13 needs driver 580), which libtorch
//! reports only as "no CUDA device".
//!
//! Probing ([`CudaStack::probe`]) reads libraries already loaded in the process (found in
//! `/proc/self/maps`), opens `libcuda.so.1` without initialising CUDA, and reads the driver's
//! `/proc` files through a [`Probe`]; the judgement is a pure function of the gathered facts, so
//! tests give it fake ones.

use std::ffi::{c_int, c_uint};
use std::fmt;
use std::path::{Path, PathBuf};

use libloading::Library;
use serde::{Serialize, Serializer};

use super::nccl::{self, NcclLibrary};
use super::runtime::{driver_version, Probe};

/// The driver's user-space library, which the container runtime binds in with the GPUs.
const LIBCUDA: &str = "libcuda.so.1";
/// Where the kernel module says which version it is.
const DRIVER_VERSION_FILE: &str = "/proc/driver/nvidia/version";

/// A CUDA version as CUDA's API numbers it: `1000 * major + 10 * minor` (13000 is 13.0, 12020
/// is 12.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion(pub i32);

impl CudaVersion {
    pub fn major(self) -> i32 {
        self.0 / 1000
    }

    pub fn minor(self) -> i32 {
        self.0 % 1000 / 10
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}

/// As people write it: "13.0".
impl Serialize for CudaVersion {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The oldest Linux driver that runs a CUDA major version (minor version compatibility: any
/// driver of the major's first release runs all its minor versions), from NVIDIA's CUDA
/// compatibility table. None for a major this table does not know.
pub fn minimum_driver(cuda_major: i32) -> Option<u32> {
    match cuda_major {
        13 => Some(580),
        12 => Some(525),
        11 => Some(450),
        _ => None,
    }
}

/// What this process finds of CUDA, each layer on its own.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CudaStack {
    /// Whether this rtrain links libtorch's CUDA part (the `cuda` feature): `libtorch_cuda.so`
    /// is loaded. Read from the process, not the feature, so that a binary linked with the
    /// feature's link arguments but compiled without it (scripts/test) reports what it is.
    pub built: bool,
    /// The CUDA runtime libtorch was built with (the `libcudart.so.*` its libraries link; the
    /// CUDA wheels' libtorch_cpu links it too, so a CPU build on them reports it as well); None
    /// with a CPU-only libtorch.
    pub runtime: Option<CudaVersion>,
    /// The loaded NVIDIA kernel module's version (`/proc/driver/nvidia/version`).
    pub driver: Option<String>,
    /// The newest CUDA the driver's `libcuda.so.1` supports, or why that library does not load.
    pub driver_cuda: Result<CudaVersion, String>,
    /// The loaded cuDNN's version ("9.10.2"); None when libtorch did not load cuDNN.
    pub cudnn: Option<String>,
    /// NCCL for the gradient all-reduce between GPUs: its version and file, or why it does not
    /// load (then gradients go through MPI and host memory).
    pub nccl: Result<String, String>,
    /// The GPUs the driver lists (`/proc/driver/nvidia/gpus/*/information`), in bus order.
    pub gpu_models: Vec<String>,
}

/// Why CUDA finds no GPU, judged from a [`CudaStack`]; its `Display` is one sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Diagnosis {
    /// A CPU build: libtorch's CUDA part is not linked.
    NotBuilt,
    /// The driver supports an older CUDA major version than libtorch's runtime.
    DriverTooOld { driver: Option<String>, supports: CudaVersion, needs: CudaVersion },
    /// No NVIDIA kernel module is loaded; `needs` is libtorch's CUDA, when known.
    NoDriver { libcuda: Result<CudaVersion, String>, needs: Option<CudaVersion> },
    /// The kernel module is loaded, but its `libcuda.so.1` does not load in this process.
    NoLibcuda { driver: String, why: String, needs: Option<CudaVersion> },
    /// Every layer is present and compatible, yet CUDA finds no device.
    Unexplained { driver: String, supports: CudaVersion, runtime: Option<CudaVersion> },
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Diagnosis::NotBuilt => f.write_str("this rtrain is built without CUDA"),
            Diagnosis::DriverTooOld { driver, supports, needs } => {
                match driver {
                    Some(driver) => write!(f, "the NVIDIA driver {driver}")?,
                    None => write!(f, "the NVIDIA driver library {LIBCUDA}")?,
                }
                write!(f, " supports CUDA up to {supports}, and this libtorch needs CUDA {needs}")?;
                match minimum_driver(needs.major()) {
                    Some(minimum) => write!(f, " (driver {minimum} or newer)"),
                    None => Ok(()),
                }
            }
            Diagnosis::NoDriver { libcuda: Err(why), needs } => {
                write!(
                    f,
                    "no NVIDIA driver is loaded ({DRIVER_VERSION_FILE} is missing) and {LIBCUDA} is not visible ({why})"
                )?;
                write_need(f, *needs)
            }
            Diagnosis::NoDriver { libcuda: Ok(supports), needs } => {
                write!(
                    f,
                    "no NVIDIA driver is loaded ({DRIVER_VERSION_FILE} is missing), though {LIBCUDA} (CUDA {supports}) is visible"
                )?;
                write_need(f, *needs)
            }
            Diagnosis::NoLibcuda { driver, why, needs } => {
                write!(
                    f,
                    "the NVIDIA driver {driver} is loaded, but its library {LIBCUDA} does not load in this process ({why})"
                )?;
                write_need(f, *needs)
            }
            Diagnosis::Unexplained { driver, supports, runtime } => {
                write!(f, "the NVIDIA driver {driver} supports CUDA up to {supports}")?;
                if let Some(runtime) = runtime {
                    write!(f, ", enough for this libtorch's CUDA {runtime},")?;
                }
                f.write_str(" yet CUDA finds no device")
            }
        }
    }
}

/// "; this libtorch needs CUDA 13.0 (driver 580 or newer)", so that every diagnosis says what
/// driver to get.
fn write_need(f: &mut fmt::Formatter<'_>, needs: Option<CudaVersion>) -> fmt::Result {
    let Some(needs) = needs else { return Ok(()) };
    write!(f, "; this libtorch needs CUDA {needs}")?;
    match minimum_driver(needs.major()) {
        Some(minimum) => write!(f, " (driver {minimum} or newer)"),
        None => Ok(()),
    }
}

impl Diagnosis {
    /// What fixes it, in any container runtime (`rtrain doctor` adds the runtime's own option).
    pub fn fix(&self) -> String {
        const OR_CPU: &str = "or set train.device = \"cpu\" to train on the CPU";
        match self {
            Diagnosis::NotBuilt => format!(
                "use the CUDA image (Containerfile) or build with `cargo build --release --features cuda`, {OR_CPU}"
            ),
            Diagnosis::DriverTooOld { supports, needs, .. } => {
                let newer = match minimum_driver(needs.major()) {
                    Some(minimum) => format!("update the host's NVIDIA driver to {minimum} or newer"),
                    None => format!("update the host's NVIDIA driver to one that supports CUDA {needs}"),
                };
                format!(
                    "{newer}, or use an image built for CUDA {} (README \"Older drivers\"), {OR_CPU}",
                    supports.major()
                )
            }
            Diagnosis::NoDriver { .. } => {
                format!("load the NVIDIA driver on the host (`nvidia-smi` must work there), {OR_CPU}")
            }
            Diagnosis::NoLibcuda { .. } => format!(
                "let the container runtime bind the driver's {LIBCUDA} in (Apptainer --nv, Docker --gpus all, Podman --device nvidia.com/gpu=all), {OR_CPU}"
            ),
            Diagnosis::Unexplained { .. } => format!(
                "check that this process may open /dev/nvidia* (permissions, cgroup device rules) and that CUDA_VISIBLE_DEVICES names GPUs that exist (`nvidia-smi` in the same environment), {OR_CPU}"
            ),
        }
    }
}

impl CudaStack {
    /// The stack of this process; the driver's files are read through `probe`.
    pub fn probe(probe: &Probe) -> CudaStack {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        CudaStack {
            built: loaded_library(&maps, "libtorch_cuda.so").is_some(),
            runtime: loaded_library(&maps, "libcudart.so").and_then(|path| runtime_version(&path)),
            driver: driver_version(probe),
            driver_cuda: driver_cuda_version(),
            cudnn: loaded_library(&maps, "libcudnn.so").and_then(|path| cudnn_version(&path)),
            nccl: NcclLibrary::load()
                .map(|nccl| format!("NCCL {}", nccl.version_string()))
                .map_err(|err| err.to_string()),
            gpu_models: gpu_models(probe),
        }
    }

    /// Why CUDA finds no GPU (meaningful when it finds none). The driver being too old is
    /// judged first: a driver older than the runtime fails CUDA whatever else is right.
    pub fn diagnosis(&self) -> Diagnosis {
        if !self.built {
            return Diagnosis::NotBuilt;
        }
        match (&self.driver, &self.driver_cuda, self.runtime) {
            (driver, Ok(supports), Some(needs)) if supports.major() < needs.major() => {
                Diagnosis::DriverTooOld { driver: driver.clone(), supports: *supports, needs }
            }
            (None, libcuda, needs) => Diagnosis::NoDriver { libcuda: libcuda.clone(), needs },
            (Some(driver), Err(why), needs) => {
                Diagnosis::NoLibcuda { driver: driver.clone(), why: why.clone(), needs }
            }
            (Some(driver), Ok(supports), runtime) => {
                Diagnosis::Unexplained { driver: driver.clone(), supports: *supports, runtime }
            }
        }
    }
}

/// The file of a library already mapped into the process whose name starts with `stem`
/// ("libcudart.so" finds `libcudart.so.13`, not `libcudart_static`), from `/proc/self/maps`.
pub fn loaded_library(maps: &str, stem: &str) -> Option<PathBuf> {
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(Path::new)
        .find(|path| {
            path.file_name().and_then(|name| name.to_str()).is_some_and(|name| name.starts_with(stem))
        })
        .map(Path::to_path_buf)
}

/// Opens a library the process has already loaded (the handle just counts one more user).
fn open_loaded(path: &Path) -> Option<Library> {
    // SAFETY: the library is already loaded and initialised; opening it again runs nothing.
    unsafe { Library::new(path) }.ok()
}

/// The CUDA runtime's version, from the runtime library libtorch loaded.
fn runtime_version(path: &Path) -> Option<CudaVersion> {
    let library = open_loaded(path)?;
    // SAFETY: the signature of `cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)`
    // (cuda_runtime_api.h); it needs no device and no initialised context.
    let version = unsafe {
        let get: libloading::Symbol<unsafe extern "C" fn(*mut c_int) -> c_int> =
            library.get(b"cudaRuntimeGetVersion").ok()?;
        let mut version = 0;
        (get(&mut version) == 0).then_some(version)?
    };
    Some(CudaVersion(version))
}

/// cuDNN's version ("9.10.2"), from the cuDNN library libtorch loaded.
fn cudnn_version(path: &Path) -> Option<String> {
    let library = open_loaded(path)?;
    // SAFETY: the signature of `size_t cudnnGetVersion(void)` (cudnn_graph.h, cudnn.h before
    // cuDNN 9); it only returns a constant.
    let version = unsafe {
        let get: libloading::Symbol<unsafe extern "C" fn() -> usize> =
            library.get(b"cudnnGetVersion").ok()?;
        get()
    };
    // cuDNN numbers its versions as NCCL does (major * 10000 + minor * 100 + patch from 9 on).
    c_int::try_from(version).ok().map(nccl::version_string)
}

/// The newest CUDA the driver's user-space library supports, or why it does not load.
/// `cuDriverGetVersion` is one of the calls allowed before `cuInit`, so this touches no GPU.
fn driver_cuda_version() -> Result<CudaVersion, String> {
    // SAFETY: loading libcuda runs its initialisers, which CUDA's runtime runs anyway on first
    // use; a missing or broken library is an error, not a crash.
    let library = unsafe { Library::new(LIBCUDA) }.map_err(|err| err.to_string())?;
    // SAFETY: the signature of `CUresult cuDriverGetVersion(int *driverVersion)` (cuda.h).
    let result = unsafe {
        match library.get::<unsafe extern "C" fn(*mut c_int) -> c_uint>(b"cuDriverGetVersion") {
            Ok(get) => {
                let mut version = 0;
                match get(&mut version) {
                    0 => Ok(CudaVersion(version)),
                    code => Err(format!("{LIBCUDA}: cuDriverGetVersion failed (CUresult {code})")),
                }
            }
            Err(err) => Err(format!("{LIBCUDA}: {err}")),
        }
    };
    // Kept loaded: the CUDA runtime opens the same library when it starts, and unloading a
    // driver library is something its authors do not promise to survive.
    std::mem::forget(library);
    result
}

/// The model of each GPU the driver lists ("NVIDIA H100 80GB HBM3"), ordered by PCI bus id
/// (each GPU's directory name), from the `Model:` line of its `information` file.
pub fn gpu_models(probe: &Probe) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(probe.path("/proc/driver/nvidia/gpus")) else { return Vec::new() };
    let mut gpus: Vec<PathBuf> = entries.filter_map(|entry| Some(entry.ok()?.path())).collect();
    gpus.sort();
    gpus.iter()
        .filter_map(|gpu| std::fs::read_to_string(gpu.join("information")).ok())
        .filter_map(|text| {
            let line = text.lines().find(|line| line.starts_with("Model:"))?;
            Some(line["Model:".len()..].trim().to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(driver: Option<&str>, driver_cuda: Result<i32, &str>, runtime: Option<i32>) -> CudaStack {
        CudaStack {
            built: true,
            runtime: runtime.map(CudaVersion),
            driver: driver.map(str::to_string),
            driver_cuda: driver_cuda.map(CudaVersion).map_err(str::to_string),
            cudnn: Some("9.10.2".into()),
            nccl: Ok("NCCL 2.27.3".into()),
            gpu_models: vec!["NVIDIA A100-SXM4-80GB".into()],
        }
    }

    #[test]
    fn versions_read_as_cuda_writes_them() {
        assert_eq!(CudaVersion(13000).to_string(), "13.0");
        assert_eq!(CudaVersion(12020).to_string(), "12.2");
        assert_eq!(CudaVersion(12080).to_string(), "12.8");
        assert_eq!(CudaVersion(11040).major(), 11);
        assert_eq!(serde_json::to_value(CudaVersion(12090)).unwrap(), "12.9");
        assert_eq!(minimum_driver(13), Some(580));
        assert_eq!(minimum_driver(12), Some(525));
        assert_eq!(minimum_driver(11), Some(450));
        assert_eq!(minimum_driver(10), None);
        assert_eq!(nccl::version_string(91002), "9.10.2", "cuDNN 9's numbering");
        assert_eq!(nccl::version_string(8907), "8.9.7", "cuDNN 8's numbering");
    }

    #[test]
    fn a_driver_for_an_older_cuda_major_is_named_with_the_driver_needed() {
        let diagnosis = stack(Some("535.104.05"), Ok(12020), Some(13000)).diagnosis();
        assert_eq!(
            diagnosis.to_string(),
            "the NVIDIA driver 535.104.05 supports CUDA up to 12.2, and this libtorch needs CUDA 13.0 (driver 580 or newer)"
        );
        let fix = diagnosis.fix();
        assert!(
            fix.contains("580 or newer") && fix.contains("CUDA 12") && fix.contains("Older drivers"),
            "{fix}"
        );
        assert!(fix.contains("train.device = \"cpu\""), "{fix}");
        // Only libcuda tells: the kernel module's version is unknown.
        let diagnosis = stack(None, Ok(12020), Some(13000)).diagnosis();
        assert!(diagnosis
            .to_string()
            .starts_with("the NVIDIA driver library libcuda.so.1 supports CUDA up to 12.2"));
    }

    #[test]
    fn a_newer_minor_version_on_the_same_major_is_not_too_old() {
        // CUDA 12.8's runtime on a 12.2 driver: minor version compatibility.
        let diagnosis = stack(Some("535.104.05"), Ok(12020), Some(12080)).diagnosis();
        assert!(matches!(diagnosis, Diagnosis::Unexplained { .. }), "{diagnosis:?}");
        assert_eq!(
            diagnosis.to_string(),
            "the NVIDIA driver 535.104.05 supports CUDA up to 12.2, enough for this libtorch's CUDA 12.8, yet CUDA finds no device"
        );
        let current = stack(Some("580.82.07"), Ok(13000), Some(13000)).diagnosis();
        assert!(matches!(current, Diagnosis::Unexplained { .. }), "{current:?}");
    }

    #[test]
    fn a_missing_driver_or_driver_library_is_told_apart() {
        let missing = "libcuda.so.1: cannot open shared object file: No such file or directory";
        let none = stack(None, Err(missing), Some(13000)).diagnosis();
        assert_eq!(
            none.to_string(),
            format!(
                "no NVIDIA driver is loaded (/proc/driver/nvidia/version is missing) and libcuda.so.1 is not visible \
                 ({missing}); this libtorch needs CUDA 13.0 (driver 580 or newer)"
            )
        );
        assert!(none.fix().contains("nvidia-smi"), "{}", none.fix());
        let unbound = stack(Some("580.82.07"), Err(missing), Some(13000)).diagnosis();
        assert!(
            unbound.to_string().starts_with(
                "the NVIDIA driver 580.82.07 is loaded, but its library libcuda.so.1 does not load"
            ),
            "{unbound}"
        );
        assert!(unbound.fix().contains("--nv") && unbound.fix().contains("--gpus all"), "{}", unbound.fix());
        let cpu_build = CudaStack { built: false, ..stack(None, Err(missing), None) }.diagnosis();
        assert_eq!(cpu_build, Diagnosis::NotBuilt);
        assert_eq!(cpu_build.to_string(), "this rtrain is built without CUDA");
    }

    #[test]
    fn loaded_libraries_are_found_by_file_name() {
        let maps = "\
7f00-7f01 r--p 00000000 08:01 42 /opt/venv/torch/lib/libtorch_cuda.so
7f01-7f02 r-xp 00000000 08:01 43 /opt/venv/nvidia/cudnn/lib/libcudnn_ops.so.9
7f02-7f03 r-xp 00000000 08:01 44 /opt/venv/nvidia/cudnn/lib/libcudnn.so.9
7f03-7f04 r-xp 00000000 08:01 45 /opt/venv/nvidia/cu13/lib/libcudart.so.13
7f04-7f05 rw-p 00000000 00:00 0
7f05-7f06 rw-p 00000000 00:00 0 [heap]
";
        assert_eq!(
            loaded_library(maps, "libcudart.so"),
            Some("/opt/venv/nvidia/cu13/lib/libcudart.so.13".into())
        );
        assert_eq!(
            loaded_library(maps, "libcudnn.so"),
            Some("/opt/venv/nvidia/cudnn/lib/libcudnn.so.9".into())
        );
        assert_eq!(loaded_library(maps, "libnccl.so"), None);
    }

    #[test]
    fn gpu_models_come_from_the_drivers_information_files_in_bus_order() {
        let root = tempfile::tempdir().unwrap();
        let gpus = root.path().join("proc/driver/nvidia/gpus");
        for (bus, model) in [("0000:c1:00.0", "NVIDIA H200"), ("0000:18:00.0", "NVIDIA A100-SXM4-80GB")] {
            std::fs::create_dir_all(gpus.join(bus)).unwrap();
            let text = format!(
                "Model: \t\t {model}\nIRQ:   \t\t 55\nGPU UUID: \t GPU-1234\nBus Location: \t {bus}\n"
            );
            std::fs::write(gpus.join(bus).join("information"), text).unwrap();
        }
        let probe = Probe::simulated(root.path(), &[]);
        assert_eq!(gpu_models(&probe), ["NVIDIA A100-SXM4-80GB", "NVIDIA H200"]);
        assert_eq!(gpu_models(&Probe::simulated(root.path().join("nowhere"), &[])), Vec::<String>::new());
    }
}
