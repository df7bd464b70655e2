//! The machine this process runs on, as far as it can tell: the container runtime and image,
//! the NVIDIA GPU device nodes and driver. Everything is read through a [`Probe`]
//! (environment variables plus a filesystem root), so tests simulate Apptainer, Docker and
//! Podman with or without GPUs on a temporary root. `rtrain doctor` judges these facts; run
//! manifests record them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

/// Where detection looks: environment variables and a filesystem root.
#[derive(Debug, Clone)]
pub struct Probe {
    root: PathBuf,
    vars: BTreeMap<String, String>,
}

impl Probe {
    /// This process: `/` and its environment.
    pub fn process() -> Probe {
        Probe { root: PathBuf::from("/"), vars: std::env::vars().collect() }
    }

    /// A simulated machine: `root` stands for `/`.
    pub fn simulated(root: impl Into<PathBuf>, vars: &[(&str, &str)]) -> Probe {
        let vars = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Probe { root: root.into(), vars }
    }

    /// A variable's value, treating empty as unset.
    pub fn var(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    /// A variable's value as it is set, empty included (`CUDA_VISIBLE_DEVICES=` hides every GPU
    /// from CUDA, which unset does not).
    pub fn raw_var(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// An absolute path of the probed machine, under the probe's root.
    pub fn path(&self, absolute: &str) -> PathBuf {
        self.root.join(absolute.trim_start_matches('/'))
    }
}

/// The container runtime the process runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Apptainer,
    /// Charliecloud's `ch-run IMAGE_DIR -- CMD` (unprivileged, no daemon; passes the host's
    /// environment through as Apptainer does).
    Charliecloud,
    Podman,
    Docker,
    None,
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Runtime::Apptainer => "apptainer",
            Runtime::Charliecloud => "charliecloud",
            Runtime::Podman => "podman",
            Runtime::Docker => "docker",
            Runtime::None => "none",
        })
    }
}

/// Reads the marks each runtime leaves: Apptainer/Singularity's variables and `/.singularity.d`,
/// Charliecloud's `CH_RUNNING`, Podman's `/run/.containerenv` (or `container=podman`), Docker's
/// `/.dockerenv`. Charliecloud comes before the files, since an image directory made by
/// `docker export` keeps `/.dockerenv`; Podman before Docker, since Podman may create
/// `/.dockerenv` too.
pub fn detect_runtime(probe: &Probe) -> Runtime {
    let apptainer_var =
        ["APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "APPTAINER_NAME", "SINGULARITY_NAME"]
            .iter()
            .any(|name| probe.var(name).is_some());
    if apptainer_var || probe.path("/.singularity.d").is_dir() {
        Runtime::Apptainer
    } else if probe.var("CH_RUNNING").is_some() {
        Runtime::Charliecloud
    } else if probe.path("/run/.containerenv").exists() || probe.var("container") == Some("podman") {
        Runtime::Podman
    } else if probe.path("/.dockerenv").exists() {
        Runtime::Docker
    } else {
        Runtime::None
    }
}

/// The image: Apptainer's SIF path, or what the image's own environment says (`RTRAIN_IMAGE`,
/// set by the Containerfile).
pub fn detect_image(probe: &Probe) -> Option<String> {
    ["APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "RTRAIN_IMAGE"]
        .iter()
        .find_map(|name| probe.var(name))
        .map(str::to_string)
}

/// The NVIDIA GPU device nodes visible in `/dev` (`nvidia0`, `nvidia1`, ...), in index order.
/// Every runtime that passes GPUs in (`--nv`, `--gpus`, CDI) makes these appear; the variables
/// that ask for GPUs prove nothing on their own.
pub fn gpu_devices(probe: &Probe) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(probe.path("/dev")) else { return Vec::new() };
    let mut indexed: Vec<(u32, String)> = entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter_map(|name| Some((name.strip_prefix("nvidia")?.parse().ok()?, name)))
        .collect();
    indexed.sort();
    indexed.into_iter().map(|(_, name)| name).collect()
}

/// The GPUs this process may use: the device nodes, narrowed by the variables that choose
/// which GPUs CUDA enumerates. So that a test can hold the entrypoint's shell version of this
/// rule to this one, the rule is exactly:
///
/// 1. Start from the number of `/dev/nvidia<digits>` nodes ([`gpu_devices`]).
/// 2. `NVIDIA_VISIBLE_DEVICES`, when set, not empty and not `all`: `none` or `void` allow 0;
///    any other value is a device list.
/// 3. `CUDA_VISIBLE_DEVICES`, when set, even to the empty string, is a device list.
/// 4. A device list allows as many GPUs as it has comma-separated entries before the first that
///    is empty or starts with `-` (CUDA stops reading its list there, so `-1` and the empty
///    string allow 0), and at most 1 when any of those is a `MIG-` instance (CUDA enumerates
///    one MIG instance per process).
///
/// The result is the smallest of the node count and the limits. Entries are not trimmed or
/// checked further (CUDA may reject an index that does not exist; then it finds fewer).
pub fn usable_gpus(probe: &Probe) -> usize {
    fn list_limit(list: &str) -> usize {
        let entries: Vec<&str> =
            list.split(',').take_while(|entry| !entry.is_empty() && !entry.starts_with('-')).collect();
        match entries.iter().any(|entry| entry.starts_with("MIG-")) {
            true => entries.len().min(1),
            false => entries.len(),
        }
    }
    let mut usable = gpu_devices(probe).len();
    match probe.var("NVIDIA_VISIBLE_DEVICES") {
        None | Some("all") => {}
        Some("none" | "void") => usable = 0,
        Some(list) => usable = usable.min(list_limit(list)),
    }
    if let Some(list) = probe.raw_var("CUDA_VISIBLE_DEVICES") {
        usable = usable.min(list_limit(list));
    }
    usable
}

/// The loaded NVIDIA kernel driver's version, from `/proc/driver/nvidia/version`
/// ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.82.07  ...").
pub fn driver_version(probe: &Probe) -> Option<String> {
    let text = std::fs::read_to_string(probe.path("/proc/driver/nvidia/version")).ok()?;
    let line = text.lines().find(|line| line.starts_with("NVRM version"))?;
    let after = line.split("Kernel Module").nth(1)?;
    after.split_whitespace().next().map(str::to_string)
}

/// Whether the environment asks for GPUs: NVIDIA's images set `NVIDIA_VISIBLE_DEVICES`, and
/// the runtimes' GPU options are expected to honour it.
pub fn gpus_requested(probe: &Probe) -> bool {
    probe.var("NVIDIA_VISIBLE_DEVICES").is_some_and(|v| !matches!(v, "void" | "none"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usable_gpus_narrow_the_device_nodes_by_the_visibility_variables() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("dev")).unwrap();
        for name in ["nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"] {
            std::fs::write(root.path().join("dev").join(name), "").unwrap();
        }
        // (NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, usable of 4 nodes); None: unset.
        let cases: &[(Option<&str>, Option<&str>, usize)] = &[
            (None, None, 4),
            (Some("all"), None, 4),
            (Some(""), None, 4),
            (Some("none"), None, 0),
            (Some("void"), Some("0,1"), 0),
            (Some("0,1"), None, 2),
            (Some("GPU-8a1b,GPU-77c2,GPU-0f3e"), None, 3),
            (Some("0,1,2,3,4,5"), None, 4),
            (Some("MIG-4f1d,MIG-9e2a"), None, 1),
            (Some("0,,2"), None, 1),
            (None, Some(""), 0),
            (None, Some("-1"), 0),
            (None, Some("1"), 1),
            (None, Some("2,3"), 2),
            (None, Some("0,-1,2"), 1),
            (None, Some("0,,2"), 1),
            (None, Some("0,1,2,3,4,5,6,7"), 4),
            (None, Some("MIG-GPU-8a1b/1/0"), 1),
            (Some("all"), Some("0,1,MIG-4f1d"), 1),
            (Some("0,1,2"), Some("0,1"), 2),
            (Some("0"), Some("0,1,2"), 1),
        ];
        for &(nvidia, cuda, expected) in cases {
            let vars: Vec<(&str, &str)> =
                [("NVIDIA_VISIBLE_DEVICES", nvidia), ("CUDA_VISIBLE_DEVICES", cuda)]
                    .into_iter()
                    .filter_map(|(name, value)| Some((name, value?)))
                    .collect();
            let probe = Probe::simulated(root.path(), &vars);
            assert_eq!(
                usable_gpus(&probe),
                expected,
                "NVIDIA_VISIBLE_DEVICES {nvidia:?}, CUDA_VISIBLE_DEVICES {cuda:?}"
            );
        }
        // Without device nodes no variable makes a GPU.
        let bare = tempfile::tempdir().unwrap();
        assert_eq!(usable_gpus(&Probe::simulated(bare.path(), &[("CUDA_VISIBLE_DEVICES", "0,1")])), 0);
    }
}
