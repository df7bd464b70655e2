//! The run manifest, `manifest.json`: what produced a run's results, so that a reviewer can
//! check and re-run it. Resolved configuration and its hash, rtrain's version, git revision
//! and binary hash, library versions and the CUDA stack, container and image digest, hosts and
//! world size, seeds, a hash of every data file, start and end times, per-epoch metrics, and
//! the hash of every checkpoint and of the final weights.
//!
//! Global rank 0 writes it atomically when the run starts and again after every epoch and
//! checkpoint, so even a run that crashed has an accurate one. `rtrain verify` re-hashes the
//! files it names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::RunPaths;
use crate::cluster::cuda::CudaStack;
use crate::cluster::runtime::{self, Probe};
use crate::config::Config;
use crate::data::dataset::Dataset;
use crate::model::weights::StartingWeights;
use crate::util::files::{self, FileError};

/// The libtorch release tch 0.26 is built against (scripts/setup installs exactly this).
pub const LIBTORCH_VERSION: &str = "2.13.0";

/// The git revision rtrain was built from (`-dirty` with uncommitted changes), or "unknown".
pub const GIT_REVISION: &str = env!("RTRAIN_GIT_REVISION");

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{path}: {problem}")]
    Parse { path: PathBuf, problem: String },
    #[error("{}: sha256 {found}, but it was recorded as {recorded} when the data were prepared: the file changed since (run rtrain data verify; prepare or stage the data again)", file.display())]
    DataChanged { file: PathBuf, found: String, recorded: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub rtrain_version: String,
    pub git_revision: String,
    pub config_hash: String,
    pub config: Config,
    pub seeds: Seeds,
    pub deterministic: bool,
    pub software: Software,
    pub container: Container,
    pub job: JobRecord,
    pub data: Vec<DataSplit>,
    /// The weights training started from (`model.weights` or `model.pretrained`): which,
    /// from where, and the file's sha256. None: a fresh initialisation.
    #[serde(default)]
    pub starting_weights: Option<StartingWeights>,
    pub started: String,
    pub updated: String,
    pub finished: Option<String>,
    pub epochs: Vec<EpochSummary>,
    /// Checkpoints present in the run directory, by path relative to it.
    pub checkpoints: BTreeMap<String, String>,
    /// The final weights (`model.safetensors`) and their sha256, once written.
    pub weights: Option<FileHash>,
    /// The loss's class weights as `train.class_weights` resolved them (None: all 1).
    #[serde(default)]
    pub class_weights: Option<Vec<f64>>,
    /// Set when `train.early_stopping` ended the run before `train.epochs`.
    #[serde(default)]
    pub stopped_early: Option<crate::run_dir::records::EarlyStop>,
}

/// Every random stream and the seed it is derived from (all from `run.seed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Seeds {
    pub run: u64,
    /// libtorch's generator before the model is built.
    pub model_init: u64,
    /// Each epoch's permutation: a function of (seed, epoch).
    pub sampler: u64,
    /// Each sample's augmentation: a function of (seed, epoch, sample index).
    pub augmentation: u64,
}

impl Seeds {
    pub fn from_run_seed(seed: u64) -> Seeds {
        Seeds { run: seed, model_init: seed, sampler: seed, augmentation: seed }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Software {
    pub libtorch: String,
    pub cuda_available: bool,
    pub cuda_devices: i64,
    pub cudnn_available: bool,
    /// The MPI library's own version string, when the run was an MPI job.
    pub mpi: Option<String>,
    /// The CUDA stack rank 0 found (empty in manifests from before it was recorded).
    #[serde(default)]
    pub cuda: CudaRecord,
    /// sha256 of the rtrain binary that ran (`/proc/self/exe`): identifies the software even
    /// where no image digest is known (a binary built outside a container, or a launcher that
    /// does not pass `RTRAIN_IMAGE_DIGEST`). None when it cannot be read (and in older manifests).
    #[serde(default)]
    pub rtrain_sha256: Option<String>,
}

impl Software {
    pub fn here(mpi: Option<String>) -> Software {
        Software {
            libtorch: LIBTORCH_VERSION.to_string(),
            cuda_available: tch::Cuda::is_available(),
            cuda_devices: tch::Cuda::device_count(),
            cudnn_available: tch::Cuda::cudnn_is_available(),
            mpi,
            cuda: CudaRecord::from(&CudaStack::probe(&Probe::process())),
            rtrain_sha256: files::sha256_file(Path::new("/proc/self/exe")).ok(),
        }
    }
}

/// The CUDA stack of a run, each layer's version or None where it is absent (see
/// [`CudaStack`], which `rtrain doctor` reports with the reasons).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CudaRecord {
    /// The GPUs the driver lists, in bus order ("NVIDIA H100 80GB HBM3").
    pub gpu_models: Vec<String>,
    /// The NVIDIA kernel driver ("580.82.07").
    pub driver: Option<String>,
    /// The newest CUDA that driver supports ("13.0").
    pub driver_cuda: Option<String>,
    /// The CUDA runtime libtorch was built with ("13.0"); None with a CPU-only libtorch.
    pub runtime: Option<String>,
    /// cuDNN as loaded by libtorch ("9.10.2").
    pub cudnn: Option<String>,
    /// NCCL as rtrain loads it for the gradient all-reduce ("NCCL 2.27.3").
    pub nccl: Option<String>,
}

impl From<&CudaStack> for CudaRecord {
    fn from(stack: &CudaStack) -> CudaRecord {
        CudaRecord {
            gpu_models: stack.gpu_models.clone(),
            driver: stack.driver.clone(),
            driver_cuda: stack.driver_cuda.as_ref().ok().map(ToString::to_string),
            runtime: stack.runtime.map(|version| version.to_string()),
            cudnn: stack.cudnn.clone(),
            nccl: stack.nccl.as_ref().ok().cloned(),
        }
    }
}

/// The container the run executed in, as far as the process can tell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Container {
    /// "apptainer", "docker", "podman" or "none".
    pub runtime: String,
    /// The image: Apptainer's SIF path, or what the image's own labels say (RTRAIN_IMAGE).
    pub image: Option<String>,
    /// The image's digest, from `RTRAIN_IMAGE_DIGEST` as the launcher sets it: nothing inside a
    /// container can read its own image's digest, so the launcher passes it in (`docker image
    /// inspect -f '{{.Id}}' IMAGE`, or the SIF's digest). None when not passed (and in older
    /// manifests); `software.rtrain_sha256` still identifies the binary.
    #[serde(default)]
    pub image_digest: Option<String>,
}

impl Container {
    /// What `rtrain doctor` detects (see `runtime::detect_runtime`).
    pub fn detect() -> Container {
        Container::from_probe(&Probe::process())
    }

    pub fn from_probe(probe: &Probe) -> Container {
        Container {
            runtime: runtime::detect_runtime(probe).to_string(),
            image: runtime::detect_image(probe),
            image_digest: probe.var("RTRAIN_IMAGE_DIGEST").map(str::to_string),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub launcher: String,
    pub world_size: usize,
    pub nodes: usize,
    pub ranks_per_node: usize,
    /// Host of each rank, in rank order.
    pub hosts: Vec<String>,
    pub device: String,
    pub threads_per_rank: i32,
    /// Images per optimizer step over all ranks: `data.batch_size x world_size x
    /// train.accumulate` (0 in manifests from before it was recorded).
    #[serde(default)]
    pub global_batch_size: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataSplit {
    pub split: String,
    pub root: PathBuf,
    pub classes: Vec<String>,
    pub images: usize,
    /// sha256 over every file's path (relative to `root`) and content hash, in sample order.
    pub sha256: String,
    /// Each file's sha256, by path relative to `root` (as [`portable_path`] writes it).
    pub files: BTreeMap<String, String>,
}

impl DataSplit {
    /// Hashes every file of a split (about 0.5 GB/s per core: a few seconds for tens of
    /// thousands of photos), refusing a file whose hash differs from the one the data were
    /// recorded with (a shard's, in `shards.json`).
    pub fn hash(split: &str, data: &dyn Dataset) -> Result<DataSplit, ManifestError> {
        let mut files = BTreeMap::new();
        let mut all = Sha256::new();
        for path in data.files() {
            let relative = portable_path(path.strip_prefix(data.root()).unwrap_or(&path));
            let digest = files::sha256_file(&path)?;
            if let Some(recorded) = data.recorded_sha256(&path).filter(|&recorded| recorded != digest) {
                let recorded = recorded.to_string();
                return Err(ManifestError::DataChanged { file: path, found: digest, recorded });
            }
            all.update(relative.as_bytes());
            all.update([0]);
            all.update(digest.as_bytes());
            files.insert(relative, digest);
        }
        Ok(DataSplit {
            split: split.to_string(),
            // Absolute, so that `rtrain verify` works from any directory.
            root: std::fs::canonicalize(data.root()).unwrap_or_else(|_| data.root().to_path_buf()),
            classes: data.classes().to_vec(),
            images: data.len(),
            sha256: hex::encode(all.finalize()),
            files,
        })
    }
}

/// A path as the manifest stores it, losslessly: its bytes where they are UTF-8 (a backslash
/// doubled), and `\xNN` for each byte that is not, as Linux file names may hold any bytes.
pub fn portable_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for chunk in path.as_os_str().as_bytes().utf8_chunks() {
        out.push_str(&chunk.valid().replace('\\', "\\\\"));
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out
}

/// The path [`portable_path`] wrote (a backslash not starting an escape is kept as it is).
pub fn native_path(portable: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let bytes = portable.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped_byte = match bytes.get(i + 1) {
            Some(b'x') => bytes
                .get(i + 2..i + 4)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok()),
            _ => None,
        };
        match (bytes[i], bytes.get(i + 1), escaped_byte) {
            (b'\\', _, Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (b'\\', Some(b'\\'), _) => {
                out.push(b'\\');
                i += 2;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochSummary {
    pub epoch: u32,
    pub global_step: u64,
    pub train_loss: f64,
    pub train_accuracy: f64,
    pub val_loss: f64,
    pub val_top1: f64,
    pub seconds: f64,
    pub images_per_second: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileHash {
    pub path: String,
    pub sha256: String,
}

/// Now, as RFC 3339 UTC.
pub fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

impl Manifest {
    pub fn write(&mut self, run: &RunPaths) -> Result<(), ManifestError> {
        self.updated = now();
        let path = run.manifest();
        let json = serde_json::to_string_pretty(self)
            .map_err(|e| ManifestError::Parse { path: path.clone(), problem: e.to_string() })?;
        files::write_atomic(&path, json.as_bytes())?;
        Ok(())
    }

    /// Reads the manifest of the run directory `run_dir`.
    pub fn read(run_dir: &Path) -> Result<Manifest, ManifestError> {
        let path = RunPaths::new(run_dir).manifest();
        let bytes = std::fs::read(&path).map_err(|source| FileError::Io { path: path.clone(), source })?;
        serde_json::from_slice(&bytes).map_err(|e| ManifestError::Parse { path, problem: e.to_string() })
    }

    /// Records a checkpoint file whose hash is known (taken as it was written).
    pub fn record_checkpoint(&mut self, run: &RunPaths, file: &Path, sha256: String) {
        self.checkpoints.insert(run.relative(file), sha256);
    }

    /// Forgets checkpoints that are no longer in the run directory (retention deleted them).
    pub fn drop_missing_checkpoints(&mut self, run: &RunPaths) {
        self.checkpoints.retain(|path, _| run.root().join(path).exists());
    }
}

/// One finding of `rtrain verify`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    Ok(String),
    Mismatch(String),
    Missing(String),
}

/// Whether `relative` (a path a manifest names under a directory) stays inside it: relative,
/// with no `..`. A manifest comes with a run directory from elsewhere; it must not make
/// `verify` read `/dev/zero` or `../../secret`.
fn stays_inside(relative: &Path) -> bool {
    relative
        .components()
        .all(|part| matches!(part, std::path::Component::Normal(_) | std::path::Component::CurDir))
}

/// Re-hashes what the manifest names: checkpoints, final weights and every data file. Returns
/// one finding per file group or file at fault. A checkpoint, weights or data file named by a
/// path that leaves its directory (absolute, or with `..`) is a finding, and is not read.
pub fn verify(run_dir: &Path) -> Result<Vec<Finding>, ManifestError> {
    let manifest = Manifest::read(run_dir)?;
    let check = |dir: &Path, relative: PathBuf, expected: &str, what: &str| {
        if !stays_inside(&relative) {
            return Finding::Mismatch(format!(
                "{what} {}: names a path outside {}; not read",
                relative.display(),
                dir.display()
            ));
        }
        check_file(dir.join(relative), expected, what)
    };
    let mut findings = Vec::new();
    for (path, sha256) in &manifest.checkpoints {
        findings.push(check(run_dir, PathBuf::from(path), sha256, "checkpoint"));
    }
    if let Some(weights) = &manifest.weights {
        findings.push(check(run_dir, PathBuf::from(&weights.path), &weights.sha256, "weights"));
    }
    for split in &manifest.data {
        let what = format!("{} data", split.split);
        // One line for a split whose files all match, instead of thousands.
        let bad: Vec<Finding> = split
            .files
            .iter()
            .map(|(file, sha256)| check(&split.root, native_path(file), sha256, &what))
            .filter(|finding| !matches!(finding, Finding::Ok(_)))
            .collect();
        if bad.is_empty() {
            findings.push(Finding::Ok(format!(
                "{} data {}: {} files",
                split.split,
                split.root.display(),
                split.files.len()
            )));
        }
        findings.extend(bad);
    }
    Ok(findings)
}

/// Whether the file at `path` has the sha256 `expected`.
fn check_file(path: PathBuf, expected: &str, what: &str) -> Finding {
    match files::sha256_file(&path) {
        Ok(found) if found == expected => Finding::Ok(format!("{what} {}", path.display())),
        Ok(found) => {
            Finding::Mismatch(format!("{what} {}: sha256 {found}, manifest says {expected}", path.display()))
        }
        Err(_) if !path.exists() => Finding::Missing(format!("{what} {}", path.display())),
        Err(error) => Finding::Mismatch(format!("{what} {}: {error}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::folder::ImageFolder;

    #[test]
    fn manifests_without_the_cuda_stack_or_image_digest_still_load() {
        let software = r#"{"libtorch": "2.13.0", "cuda_available": false, "cuda_devices": 0,
            "cudnn_available": false, "mpi": null}"#;
        let software: Software = serde_json::from_str(software).unwrap();
        assert_eq!((software.cuda, software.rtrain_sha256), (CudaRecord::default(), None));
        let container: Container = serde_json::from_str(r#"{"runtime": "docker", "image": null}"#).unwrap();
        assert_eq!(container.image_digest, None);
    }

    #[test]
    fn the_image_digest_comes_from_the_launcher() {
        let digest = "sha256:4f5e0b1c";
        let probe = Probe::simulated("/nonexistent", &[("RTRAIN_IMAGE_DIGEST", digest)]);
        assert_eq!(Container::from_probe(&probe).image_digest.as_deref(), Some(digest));
        let unset = Probe::simulated("/nonexistent", &[("RTRAIN_IMAGE_DIGEST", "")]);
        assert_eq!(Container::from_probe(&unset).image_digest, None);
    }

    #[test]
    fn the_cuda_record_keeps_each_layers_version() {
        use crate::cluster::cuda::CudaVersion;
        let stack = CudaStack {
            built: true,
            runtime: Some(CudaVersion(13000)),
            driver: Some("535.104.05".into()),
            driver_cuda: Ok(CudaVersion(12020)),
            cudnn: Some("9.10.2".into()),
            nccl: Err("cannot load libnccl.so.2".into()),
            gpu_models: vec!["NVIDIA A100-SXM4-80GB".into()],
        };
        let record = serde_json::to_value(CudaRecord::from(&stack)).unwrap();
        assert_eq!(
            record,
            serde_json::json!({
                "gpu_models": ["NVIDIA A100-SXM4-80GB"],
                "driver": "535.104.05",
                "driver_cuda": "12.2",
                "runtime": "13.0",
                "cudnn": "9.10.2",
                "nccl": null,
            })
        );
    }

    #[test]
    fn paths_are_stored_losslessly() {
        use std::os::unix::ffi::OsStrExt;
        let names: [&[u8]; 5] =
            [b"a/b.jpg", b"caf\xc3\xa9.jpg", b"caf\xe9.jpg", b"back\\x41slash", b"\xff\xfe"];
        for name in names {
            let path = Path::new(std::ffi::OsStr::from_bytes(name));
            let portable = portable_path(path);
            assert_eq!(native_path(&portable), path, "{portable}");
        }
        assert_eq!(portable_path(Path::new("caf\u{e9}/x.jpg")), "caf\u{e9}/x.jpg", "UTF-8 stays readable");
        assert_eq!(portable_path(Path::new(std::ffi::OsStr::from_bytes(b"caf\xe9"))), "caf\\xe9");
    }

    #[test]
    fn data_hash_names_files_and_changes_with_content() {
        let dir = tempfile::tempdir().unwrap();
        for (class, name, bytes) in [("a", "1.png", b"one".as_slice()), ("b", "2.png", b"two".as_slice())] {
            std::fs::create_dir_all(dir.path().join(class)).unwrap();
            std::fs::write(dir.path().join(class).join(name), bytes).unwrap();
        }
        let folder = ImageFolder {
            root: dir.path().to_path_buf(),
            classes: vec!["a".into(), "b".into()],
            samples: vec![(dir.path().join("a/1.png"), 0), (dir.path().join("b/2.png"), 1)],
        };
        let first = DataSplit::hash("train", &folder).unwrap();
        assert_eq!(first.files.keys().collect::<Vec<_>>(), vec!["a/1.png", "b/2.png"]);
        // sha256("one"), computed independently.
        assert_eq!(
            first.files["a/1.png"],
            "7692c3ad3540bb803c020b3aee66cd8887123234ea0c6e7143c0add73ff431ed"
        );
        std::fs::write(dir.path().join("b/2.png"), b"twO").unwrap();
        let second = DataSplit::hash("train", &folder).unwrap();
        assert_ne!(first.sha256, second.sha256);
        assert_eq!(first.files["a/1.png"], second.files["a/1.png"]);
    }
}
