//! Which device a rank computes on (`train.device`), and getting batches there.
//!
//! One rank per GPU: a rank takes `cuda:<local_rank>` of the GPUs it sees, or the only one when
//! its launcher left it just one ([`crate::cluster::device_for`]). Batches come from the loader in
//! pinned host memory when the device is a GPU, so that the copy to the device is asynchronous
//! and overlaps the previous step's kernels.

use tch::Device;

use crate::cluster::{self, DistError, Topology};
pub use crate::config::DeviceSetting;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "train.device = \"cuda\", but rank {rank} on {host} sees no GPU ({why}); under Apptainer \
         add --nv, under Docker --gpus all, or set train.device = \"cpu\""
    )]
    NoGpu { rank: usize, host: String, why: &'static str },
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

/// The device this rank computes on, given the GPUs it sees.
pub fn choose(setting: DeviceSetting, topology: &Topology, visible: usize) -> Result<Device, DeviceError> {
    match setting {
        DeviceSetting::Cpu => Ok(Device::Cpu),
        DeviceSetting::Cuda if visible == 0 => Err(DeviceError::NoGpu {
            rank: topology.rank,
            host: topology.host.clone(),
            why: if cfg!(feature = "cuda") {
                "CUDA reports no device"
            } else {
                "this rtrain was built without the cuda feature"
            },
        }),
        DeviceSetting::Auto | DeviceSetting::Cuda => Ok(cluster::device_for(topology, visible)?),
    }
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

    fn rank(local_rank: usize) -> Topology {
        Topology { local_rank, local_world_size: 2, ..Topology::single() }
    }

    #[test]
    fn settings_choose_devices_and_name_the_rank_when_there_is_no_gpu() {
        assert_eq!(choose(DeviceSetting::Auto, &rank(1), 0).unwrap(), Device::Cpu);
        assert_eq!(choose(DeviceSetting::Auto, &rank(1), 2).unwrap(), Device::Cuda(1));
        assert_eq!(choose(DeviceSetting::Cpu, &rank(1), 2).unwrap(), Device::Cpu);
        assert_eq!(choose(DeviceSetting::Cuda, &rank(0), 1).unwrap(), Device::Cuda(0));
        let err = choose(DeviceSetting::Cuda, &rank(0), 0).unwrap_err().to_string();
        assert!(err.contains("rank 0") && err.contains("--nv") && err.contains("sees no GPU"), "{err}");
        let err = choose(DeviceSetting::Auto, &rank(1), 1).map(|_| ()).err();
        assert!(err.is_none(), "one visible GPU per rank is that rank's GPU");
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
