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
    Podman,
    Docker,
    None,
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Runtime::Apptainer => "apptainer",
            Runtime::Podman => "podman",
            Runtime::Docker => "docker",
            Runtime::None => "none",
        })
    }
}

/// Reads the marks each runtime leaves: Apptainer/Singularity's variables and `/.singularity.d`,
/// Podman's `/run/.containerenv` (or `container=podman`), Docker's `/.dockerenv`. Podman is
/// checked before Docker because Podman may create `/.dockerenv` too.
pub fn detect_runtime(probe: &Probe) -> Runtime {
    let apptainer_var =
        ["APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "APPTAINER_NAME", "SINGULARITY_NAME"]
            .iter()
            .any(|name| probe.var(name).is_some());
    if apptainer_var || probe.path("/.singularity.d").is_dir() {
        Runtime::Apptainer
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
