//! Which device a rank computes on (`train.device`), and getting batches there.
//!
//! One rank per GPU: a rank takes `cuda:<local_rank>` of the GPUs it sees, or the only one when
//! its launcher left it just one ([`crate::cluster::device_for`]). Batches come from the loader in
//! pinned host memory when the device is a GPU, so that the copy to the device is asynchronous
//! and overlaps the previous step's kernels.
//!
//! `auto` never falls back to the CPU unasked when this process has GPUs that a CUDA build
//! cannot use: that is an error naming the cause ([`crate::cluster::cuda::Diagnosis`]).

use tch::Device;

use crate::cluster::cuda::{CudaStack, Diagnosis};
use crate::cluster::runtime::{usable_gpus, Probe};
use crate::cluster::{self, DistError, Topology};
use crate::config::DeviceSetting;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "train.device = \"cuda\", but rank {rank} on {host} sees no GPU ({device_nodes} usable GPU \
         device node(s); {diagnosis}). Fix: {fix}"
    )]
    NoGpu { rank: usize, host: String, device_nodes: usize, diagnosis: Diagnosis, fix: String },
    /// `train.device = "auto"` with GPUs present that CUDA cannot use: an error rather than a
    /// silent fallback to the CPU.
    #[error(
        "train.device = \"auto\", but rank {rank} on {host} has {device_nodes} usable GPU device \
         node(s) that CUDA cannot use: {diagnosis}. Fix: {}",
        .diagnosis.fix()
    )]
    CudaUnusable { rank: usize, host: String, device_nodes: usize, diagnosis: Diagnosis },
    #[error(transparent)]
    Dist(#[from] DistError),
}

/// GPUs libtorch can use in this process: 0 in a CPU build, or when CUDA finds none.
pub fn visible_gpus() -> usize {
    if tch::Cuda::is_available() {
        usize::try_from(tch::Cuda::device_count()).unwrap_or(0)
    } else {
        0
    }
}

/// What [`choose`] asks about this rank's GPUs, each only when the setting needs it: a CPU
/// setting asks nothing (CUDA is never touched), and only a GPU that CUDA does not find is
/// diagnosed.
pub trait GpuSight {
    /// GPUs CUDA finds ([`visible_gpus`]).
    fn visible(&self) -> usize;
    /// GPUs the device nodes and visibility variables let this process use ([`usable_gpus`]).
    fn device_nodes(&self) -> usize;
    /// Why CUDA finds none ([`CudaStack::diagnosis`]).
    fn diagnosis(&self) -> Diagnosis;
}

/// This process's view of its GPUs.
pub struct ThisProcess;

impl GpuSight for ThisProcess {
    fn visible(&self) -> usize {
        visible_gpus()
    }

    fn device_nodes(&self) -> usize {
        usable_gpus(&Probe::process())
    }

    fn diagnosis(&self) -> Diagnosis {
        CudaStack::probe(&Probe::process()).diagnosis()
    }
}

/// The device this rank computes on. `auto` takes a GPU when CUDA finds one, and the CPU when
/// there is no GPU to find (no usable device node) or this rtrain is a CPU build; GPUs in
/// sight that a CUDA build cannot use are an error naming the cause, never a silent fallback
/// to the CPU (typically a host driver older than libtorch's CUDA).
pub fn choose(
    setting: DeviceSetting,
    topology: &Topology,
    gpus: &dyn GpuSight,
) -> Result<Device, DeviceError> {
    let auto = match setting {
        DeviceSetting::Cpu => return Ok(Device::Cpu),
        DeviceSetting::Auto => true,
        DeviceSetting::Cuda => false,
    };
    let visible = gpus.visible();
    if visible > 0 {
        return Ok(cluster::device_for(topology, visible)?);
    }
    let (rank, host, device_nodes) = (topology.rank, topology.host.clone(), gpus.device_nodes());
    if auto && device_nodes == 0 {
        return Ok(Device::Cpu);
    }
    let diagnosis = gpus.diagnosis();
    if auto {
        return match diagnosis {
            // A CPU build trains on the CPU by design (the default `cargo build`); it says so,
            // and `rtrain doctor` points out the idle GPUs.
            Diagnosis::NotBuilt => {
                tracing::warn!(
                    "rank {rank}: {device_nodes} GPU(s) in sight, but this rtrain is built without CUDA: \
                     training on the CPU (build with --features cuda, or use the image)"
                );
                Ok(Device::Cpu)
            }
            diagnosis => Err(DeviceError::CudaUnusable { rank, host, device_nodes, diagnosis }),
        };
    }
    let fix = if device_nodes == 0 && diagnosis != Diagnosis::NotBuilt {
        "pass the GPUs in (under Apptainer add --nv, under Docker --gpus all, under Podman --device \
         nvidia.com/gpu=all; check CUDA_VISIBLE_DEVICES), or set train.device = \"cpu\""
            .to_string()
    } else {
        diagnosis.fix()
    };
    Err(DeviceError::NoGpu { rank, host, device_nodes, diagnosis, fix })
}

/// A device named on the command line: `cpu`, `cuda` (the first GPU) or `cuda:N`.
pub fn parse(name: &str) -> Result<Device, String> {
    match name {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        _ => name
            .strip_prefix("cuda:")
            .and_then(|index| index.parse().ok())
            .map(Device::Cuda)
            .ok_or_else(|| format!("unknown device {name:?} (cpu, cuda or cuda:N)")),
    }
}

/// Sets what a device needs before training: cuDNN's autotuner picks the fastest convolution
/// algorithms for the fixed input shape, unless the run must be deterministic (its choice can
/// differ between runs).
pub fn prepare(device: Device, deterministic: bool) {
    if device.is_cuda() {
        tch::Cuda::cudnn_set_benchmark(!deterministic);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::cuda::CudaVersion;

    fn rank(local_rank: usize) -> Topology {
        Topology { rank: local_rank, world_size: 2, local_rank, local_world_size: 2, ..Topology::single() }
    }

    /// A rank's GPUs as a test states them; asking what the setting should not need panics.
    struct Seen {
        visible: Option<usize>,
        device_nodes: Option<usize>,
        diagnosis: Option<Diagnosis>,
    }

    impl GpuSight for Seen {
        fn visible(&self) -> usize {
            self.visible.expect("CUDA asked for its devices")
        }
        fn device_nodes(&self) -> usize {
            self.device_nodes.expect("device nodes counted")
        }
        fn diagnosis(&self) -> Diagnosis {
            self.diagnosis.clone().expect("CUDA diagnosed")
        }
    }

    fn seen(visible: usize, device_nodes: usize) -> Seen {
        Seen { visible: Some(visible), device_nodes: Some(device_nodes), diagnosis: None }
    }

    fn too_old() -> Diagnosis {
        Diagnosis::DriverTooOld {
            driver: Some("535.104.05".into()),
            supports: CudaVersion(12020),
            needs: CudaVersion(13000),
        }
    }

    #[test]
    fn settings_choose_devices_and_name_the_rank_when_there_is_no_gpu() {
        assert_eq!(choose(DeviceSetting::Auto, &rank(1), &seen(0, 0)).unwrap(), Device::Cpu);
        assert_eq!(choose(DeviceSetting::Auto, &rank(1), &seen(2, 2)).unwrap(), Device::Cuda(1));
        assert_eq!(choose(DeviceSetting::Cuda, &rank(0), &seen(1, 1)).unwrap(), Device::Cuda(0));
        let none = Seen {
            diagnosis: Some(Diagnosis::NoDriver { libcuda: Err("not found".into()), needs: None }),
            ..seen(0, 0)
        };
        let err = choose(DeviceSetting::Cuda, &rank(0), &none).unwrap_err().to_string();
        assert!(err.contains("rank 0") && err.contains("--nv") && err.contains("sees no GPU"), "{err}");
        assert!(err.contains("no NVIDIA driver is loaded"), "{err}");
        let err = choose(DeviceSetting::Auto, &rank(1), &seen(1, 1)).map(|_| ()).err();
        assert!(err.is_none(), "one visible GPU per rank is that rank's GPU");
    }

    #[test]
    fn the_cpu_setting_never_asks_cuda() {
        let nothing = Seen { visible: None, device_nodes: None, diagnosis: None };
        assert_eq!(choose(DeviceSetting::Cpu, &rank(1), &nothing).unwrap(), Device::Cpu);
    }

    #[test]
    fn auto_with_gpus_cuda_cannot_use_fails_naming_the_cause() {
        let broken = Seen { diagnosis: Some(too_old()), ..seen(0, 4) };
        let err = choose(DeviceSetting::Auto, &rank(1), &broken).unwrap_err().to_string();
        for part in ["rank 1", "4 usable GPU device node(s)", "535.104.05", "CUDA up to 12.2", "CUDA 13.0"] {
            assert!(err.contains(part), "{part:?} missing from: {err}");
        }
        for fix in ["580 or newer", "Older drivers", "train.device = \"cpu\""] {
            assert!(err.contains(fix), "{fix:?} missing from: {err}");
        }
        // Under train.device = "cuda" the same cause is named.
        let err = choose(DeviceSetting::Cuda, &rank(0), &broken).unwrap_err().to_string();
        assert!(err.contains("sees no GPU") && err.contains("535.104.05") && err.contains("580"), "{err}");
    }

    #[test]
    fn auto_without_usable_nodes_or_in_a_cpu_build_trains_on_the_cpu() {
        // Device nodes hidden (CUDA_VISIBLE_DEVICES=""): nothing to diagnose.
        assert_eq!(choose(DeviceSetting::Auto, &rank(0), &seen(0, 0)).unwrap(), Device::Cpu);
        let cpu_build = Seen { diagnosis: Some(Diagnosis::NotBuilt), ..seen(0, 2) };
        assert_eq!(choose(DeviceSetting::Auto, &rank(0), &cpu_build).unwrap(), Device::Cpu);
        let err = choose(DeviceSetting::Cuda, &rank(0), &cpu_build).unwrap_err().to_string();
        assert!(err.contains("built without CUDA") && err.contains("--features cuda"), "{err}");
    }

    #[test]
    fn device_names_parse_like_torch() {
        assert_eq!(parse("cpu").unwrap(), Device::Cpu);
        assert_eq!(parse("cuda").unwrap(), Device::Cuda(0));
        assert_eq!(parse("cuda:3").unwrap(), Device::Cuda(3));
        assert!(parse("gpu").unwrap_err().contains("\"gpu\""));
        assert!(parse("cuda:x").is_err());
    }
}
