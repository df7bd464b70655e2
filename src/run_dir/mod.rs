//! A run directory: every path in it ([`RunPaths`], the one place its file names are spelled)
//! and the training-time writer ([`RunDir`]) through which global rank 0, and only it, writes
//! them — the tutorial's GLOBAL_RANK 0 rule.
//!
//! ```text
//! RUN_DIR/config.toml          the resolved configuration
//! RUN_DIR/manifest.json        what produced the run (manifest.rs); `rtrain verify` checks it
//! RUN_DIR/metrics.jsonl        one record per logged step and per epoch (records.rs)
//! RUN_DIR/summary.json         the finished run (records.rs)
//! RUN_DIR/model.safetensors    final weights, a torchvision state dict
//! RUN_DIR/checkpoints/step-NNNNNNNNN.safetensors, best.safetensors
//! RUN_DIR/report/              `rtrain report`'s output
//! RUN_DIR/.rtrain.lock         held (flock) by the trainer writing the directory
//! ```
//!
//! One trainer at a time: rank 0 holds an exclusive lock on the directory while it trains (the
//! kernel releases it when the process dies), and nothing is written into a directory before
//! the run's checks (a resume's compatibility among them) have passed.
//!
//! No method of [`RunDir`] is a collective: on ranks other than 0 every write is a no-op, so a
//! caller may never deadlock the job through it.

pub mod checkpoint;
pub mod manifest;
pub mod preprocessing;
pub mod records;
pub mod reproduce;
pub mod tensorboard;

use std::path::{Path, PathBuf};

use tch::Tensor;

use crate::config::Config;
use crate::util::files::{self, FileError};
use checkpoint::{CheckpointError, CheckpointMeta, WeightsMeta};
use manifest::{EpochSummary, FileHash, Manifest, ManifestError};
use records::{EpochRecord, MetricsLog, MetricsRecord, RecordError, StepRecord, Summary};

const CONFIG_FILE: &str = "config.toml";
const MANIFEST_FILE: &str = "manifest.json";
const METRICS_FILE: &str = "metrics.jsonl";
const SUMMARY_FILE: &str = "summary.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The final weights with a temperature fitted on the validation split (`train.calibrate`).
const CALIBRATED_FILE: &str = "calibrated.safetensors";
const CHECKPOINTS_DIR: &str = "checkpoints";
const BEST_CHECKPOINT_FILE: &str = "best.safetensors";
const STEP_CHECKPOINT_PREFIX: &str = "step-";
const CHECKPOINT_SUFFIX: &str = ".safetensors";
const REPORT_DIR: &str = "report";
const EVALUATION_DIR: &str = "evaluation";
/// The step traces (`log.trace_steps`), one file per rank.
const TRACE_DIR: &str = "trace";
const TENSORBOARD_DIR: &str = "tensorboard";
const LOCK_FILE: &str = ".rtrain.lock";

#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Records(#[from] RecordError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "run directory {} already has checkpoints: pass --resume auto to continue it, or choose another --run-dir",
        dir.display()
    )]
    HasCheckpoints { dir: PathBuf },
    #[error("run directory {} holds a shard set (its {} would be overwritten): choose another --run-dir", dir.display(), crate::data::shards::SHARDS_JSON)]
    HoldsShards { dir: PathBuf },
    #[error("{} already holds a run: choose another --out", dir.display())]
    HoldsRun { dir: PathBuf },
    #[error(
        "run directory {} already holds a run ({files}): a new one would replace its weights and mix its \
         metrics. Continue it with --resume auto, replace it with --overwrite, or choose another --run-dir \
         (or run.name)",
        dir.display()
    )]
    HoldsEarlierRun { dir: PathBuf, files: String },

    #[error("run directory {} is in use by another trainer ({holder}): wait for it to finish, or choose another --run-dir", dir.display())]
    InUse { dir: PathBuf, holder: String },
}

/// Every file `rtrain eval`/`train` write into a run's `evaluation/` (`report::evaluation`
/// writes them), by name: what `rtrain publish` carries of it and `train --overwrite` deletes
/// there, and nothing else (a directory a person also keeps notes or edited figures in).
pub const EVALUATION_FILES: [&str; 13] = [
    "metrics.json",
    "predictions.csv",
    "confusion.svg",
    "confusion.png",
    "confusion-by-row.svg",
    "confusion-by-row.png",
    "reliability.svg",
    "reliability.png",
    "roc.svg",
    "roc.png",
    "mistakes.png",
    "mistakes-gradcam.png",
    "report.md",
];

/// The paths of one run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPaths {
    root: PathBuf,
}

impl RunPaths {
    pub fn new(root: impl Into<PathBuf>) -> RunPaths {
        RunPaths { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn config(&self) -> PathBuf {
        self.root.join(CONFIG_FILE)
    }

    pub fn manifest(&self) -> PathBuf {
        self.root.join(MANIFEST_FILE)
    }

    pub fn metrics(&self) -> PathBuf {
        self.root.join(METRICS_FILE)
    }

    pub fn summary(&self) -> PathBuf {
        self.root.join(SUMMARY_FILE)
    }

    /// The final weights, a torchvision state dict.
    pub fn weights(&self) -> PathBuf {
        self.root.join(WEIGHTS_FILE)
    }

    /// The best (else final) weights calibrated on the validation split (`train.calibrate`).
    pub fn calibrated(&self) -> PathBuf {
        self.root.join(CALIBRATED_FILE)
    }

    pub fn checkpoints(&self) -> PathBuf {
        self.root.join(CHECKPOINTS_DIR)
    }

    /// Whether `checkpoint` lies in this run's `checkpoints/`, by its path alone (made absolute,
    /// symlinks not followed), so that every rank answers the same without reading a file.
    pub fn holds_checkpoint(&self, checkpoint: &Path) -> bool {
        let directory = std::path::absolute(self.checkpoints()).ok();
        let parent = std::path::absolute(checkpoint).ok().and_then(|p| p.parent().map(Path::to_path_buf));
        directory.is_some() && directory == parent
    }

    pub fn best_checkpoint(&self) -> PathBuf {
        self.checkpoints().join(BEST_CHECKPOINT_FILE)
    }

    /// The checkpoint taken after `global_step` steps; zero-padded so that names sort in step
    /// order.
    pub fn step_checkpoint(&self, global_step: u64) -> PathBuf {
        self.checkpoints().join(format!("{STEP_CHECKPOINT_PREFIX}{global_step:09}{CHECKPOINT_SUFFIX}"))
    }

    pub fn report(&self) -> PathBuf {
        self.root.join(REPORT_DIR)
    }

    /// TensorBoard's event files (`log.tensorboard`).
    pub fn tensorboard(&self) -> PathBuf {
        self.root.join(TENSORBOARD_DIR)
    }

    /// The best checkpoint evaluated on the validation split at the end of training, as
    /// `rtrain eval --out` writes it (metrics, per-image results, figures).
    pub fn evaluation(&self) -> PathBuf {
        self.root.join(EVALUATION_DIR)
    }

    /// Rank `rank`'s step trace (`log.trace_steps`), named as PyTorch's profiler names its
    /// traces so that Holistic Trace Analysis and Perfetto find them.
    pub fn trace(&self, rank: usize) -> PathBuf {
        self.root.join(TRACE_DIR).join(format!("rank{rank}.pt.trace.json"))
    }

    fn lock(&self) -> PathBuf {
        self.root.join(LOCK_FILE)
    }

    /// A file of the run directory by its path relative to it (as the manifest records it).
    pub fn relative(&self, file: &Path) -> String {
        file.strip_prefix(&self.root).unwrap_or(file).to_string_lossy().into_owned()
    }

    /// Refuses a directory that a run started as `resume` says would damage: a fresh run
    /// into one holding checkpoints or any other file of a run (a finished one whose
    /// checkpoints were removed, another tool's), and any run into a shard set.
    pub fn check_writable(&self, resume: &crate::plan::Resume) -> Result<(), RunDirError> {
        if *resume == crate::plan::Resume::Fresh {
            if !self.step_checkpoints()?.is_empty() {
                return Err(RunDirError::HasCheckpoints { dir: self.root.clone() });
            }
            let files: Vec<&str> = [CONFIG_FILE, MANIFEST_FILE, METRICS_FILE, SUMMARY_FILE, WEIGHTS_FILE]
                .into_iter()
                .filter(|name| self.root.join(name).symlink_metadata().is_ok())
                .collect();
            if !files.is_empty() {
                return Err(RunDirError::HoldsEarlierRun { dir: self.root.clone(), files: files.join(", ") });
            }
        }
        if crate::data::shards::ShardManifest::read(&self.root).is_ok() {
            return Err(RunDirError::HoldsShards { dir: self.root.clone() });
        }
        Ok(())
    }

    /// Refuses a directory that already holds a run (for `rtrain reproduce --out`).
    pub fn check_empty(&self) -> Result<(), RunDirError> {
        match self.manifest().exists() {
            true => Err(RunDirError::HoldsRun { dir: self.root.clone() }),
            false => Ok(()),
        }
    }

    /// Step checkpoints, oldest first, as (global step, path).
    pub fn step_checkpoints(&self) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
        let dir = self.checkpoints();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(CheckpointError::Io { path: dir, source }),
        };
        let mut found = Vec::new();
        for entry in entries {
            let path = entry.map_err(|source| CheckpointError::Io { path: dir.clone(), source })?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if let Some(step) = step_of(name) {
                found.push((step, path));
            }
        }
        found.sort();
        Ok(found)
    }

    /// The newest step checkpoint that reads back whole, matches its digest and holds only
    /// finite values, and the newer ones that fail those checks, each with its error (a crash
    /// can only leave temporaries, but a disk can still corrupt a finished file).
    pub fn latest_valid_checkpoint(&self) -> Result<CheckpointSearch, CheckpointError> {
        let mut invalid = Vec::new();
        for (_, path) in self.step_checkpoints()?.into_iter().rev() {
            match checkpoint::read_whole(&path) {
                Ok(()) => return Ok(CheckpointSearch { valid: Some(path), invalid }),
                Err(error) => invalid.push((path, error)),
            }
        }
        Ok(CheckpointSearch { valid: None, invalid })
    }
}

/// What [`RunPaths::latest_valid_checkpoint`] found.
#[derive(Debug)]
pub struct CheckpointSearch {
    pub valid: Option<PathBuf>,
    /// Newer step checkpoints that failed their checks, newest first.
    pub invalid: Vec<(PathBuf, CheckpointError)>,
}

/// What a step checkpoint that failed its checks is renamed to: out of the step pattern, so
/// it neither outranks good checkpoints nor counts against `checkpoint.keep_last`, and kept
/// for whoever wants to look at it.
const SET_ASIDE_SUFFIX: &str = ".invalid";

/// The run directory as training writes it. Holds rank 0's lock, open metrics log and
/// manifest; on every other rank it holds nothing and writes nothing.
pub struct RunDir {
    paths: RunPaths,
    writer: Option<Writer>,
}

struct Writer {
    /// Held for as long as the run directory is.
    _lock: std::fs::File,
    /// Present once [`RunDir::start`] ran.
    metrics: Option<MetricsLog>,
    /// Present once [`RunDir::start_manifest`] ran.
    manifest: Option<Manifest>,
    /// Present once [`RunDir::start_manifest`] ran, with `log.tensorboard`.
    tensorboard: Option<tensorboard::EventFile>,
}

impl RunDir {
    /// On rank 0 (`writes`), creates the directory and takes its lock, refusing one another
    /// trainer holds; writes nothing else yet (see [`RunDir::start`]). Elsewhere only names it.
    pub fn open(paths: RunPaths, writes: bool) -> Result<RunDir, RunDirError> {
        if !writes {
            return Ok(RunDir { paths, writer: None });
        }
        let root = paths.root().to_path_buf();
        std::fs::create_dir_all(&root).map_err(|source| RunDirError::Io { path: root.clone(), source })?;
        let lock = take_lock(&paths)?;
        remove_stale_temporaries(&paths)?;
        Ok(RunDir {
            paths,
            writer: Some(Writer { _lock: lock, metrics: None, manifest: None, tensorboard: None }),
        })
    }

    /// Deletes the files of the run already in the directory (`--overwrite`), by their names
    /// only: whatever else the directory holds stays, in `checkpoints/`, `evaluation/` and
    /// `tensorboard/` too (a copy of the model, notes, another run's TensorBoard directory).
    /// Under the lock; a no-op off rank 0.
    pub fn delete_previous_run(&mut self) -> Result<(), RunDirError> {
        if self.writer.is_none() {
            return Ok(());
        }
        for name in [
            CONFIG_FILE,
            MANIFEST_FILE,
            METRICS_FILE,
            SUMMARY_FILE,
            WEIGHTS_FILE,
            CALIBRATED_FILE,
            REPORT_DIR,
        ] {
            let path = self.paths.root().join(name);
            // A link (a `report` pointing elsewhere) is removed itself, never followed.
            let removed = match path.symlink_metadata() {
                Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&path),
                Ok(_) => std::fs::remove_file(&path),
                Err(_) => continue,
            };
            removed.map_err(|source| RunDirError::Io { path: path.clone(), source })?;
            tracing::info!("--overwrite: deleted {}", path.display());
        }
        delete_named(&self.paths.checkpoints(), is_checkpoint_name)?;
        delete_named(&self.paths.evaluation(), |name| EVALUATION_FILES.contains(&name))?;
        delete_named(&self.paths.tensorboard(), tensorboard::is_event_file)?;
        delete_named(&self.paths.root().join(TRACE_DIR), |name| name.ends_with(".pt.trace.json"))?;
        Ok(())
    }

    /// Starts writing, once the run's checks have passed: `checkpoints/`, the resolved
    /// `config.toml`, and `metrics.jsonl` open for appending (without the records past
    /// `resume_point`, the (global step, epoch) training resumes at).
    pub fn start(&mut self, config: &Config, resume_point: Option<(u64, u32)>) -> Result<(), RunDirError> {
        let Some(writer) = &mut self.writer else { return Ok(()) };
        let checkpoints = self.paths.checkpoints();
        std::fs::create_dir_all(&checkpoints)
            .map_err(|source| RunDirError::Io { path: checkpoints, source })?;
        files::write_atomic(&self.paths.config(), config.to_toml()?.as_bytes())?;
        writer.metrics = Some(MetricsLog::open(&self.paths.metrics(), resume_point)?);
        Ok(())
    }

    pub fn paths(&self) -> &RunPaths {
        &self.paths
    }

    /// Whether this rank writes the directory (global rank 0).
    pub fn writes(&self) -> bool {
        self.writer.is_some()
    }

    /// Rank 0's choice of checkpoint for `--resume auto`: the newest valid one, or none (a fresh
    /// start) when there is none yet. Other ranks learn it from rank 0.
    pub fn auto_resume_checkpoint(&self) -> Result<Option<PathBuf>, RunDirError> {
        if !self.writes() {
            return Ok(None);
        }
        let search = self.paths.latest_valid_checkpoint()?;
        for (path, error) in search.invalid {
            let mut aside = path.clone().into_os_string();
            aside.push(SET_ASIDE_SUFFIX);
            std::fs::rename(&path, &aside)
                .map_err(|source| RunDirError::Io { path: path.clone(), source })?;
            tracing::warn!("set aside as {} (not resumed from): {error}", Path::new(&aside).display());
        }
        if search.valid.is_none() {
            tracing::info!(
                "no valid checkpoint in {} yet: starting fresh",
                self.paths.checkpoints().display()
            );
        }
        Ok(search.valid)
    }

    /// Rank 0's manifest: continued from the directory's own when resuming (keeping its start
    /// time and the epochs before the resume point), else `fresh` as given; then it records
    /// the checkpoints already present and is written.
    pub fn start_manifest(&mut self, fresh: Manifest, resume_epoch: u32) -> Result<(), RunDirError> {
        let Some(writer) = &mut self.writer else { return Ok(()) };
        let mut manifest = fresh;
        let previous = Manifest::read(self.paths.root()).ok();
        if let Some(previous) = &previous {
            if resume_epoch > 0 || !previous.checkpoints.is_empty() {
                manifest.started = previous.started.clone();
                manifest.epochs =
                    previous.epochs.iter().filter(|e| e.epoch < resume_epoch).cloned().collect();
            }
        }
        let recorded = previous.map(|m| m.checkpoints).unwrap_or_default();
        let best = Some(self.paths.best_checkpoint()).filter(|best| best.exists());
        let present = self.paths.step_checkpoints()?.into_iter().map(|(_, file)| file).chain(best);
        for file in present {
            let relative = self.paths.relative(&file);
            let sha256 = files::sha256_file(&file)?;
            match recorded.get(&relative) {
                // As recorded when it was written: nothing to check again.
                Some(known) if *known == sha256 => manifest.record_checkpoint(&self.paths, &file, sha256),
                // Changed since: keep the recorded hash, so that `rtrain verify` reports it.
                Some(known) => {
                    tracing::warn!(
                        "{}: changed since it was written (sha256 {sha256}, recorded {known})",
                        file.display()
                    );
                    manifest.checkpoints.insert(relative, known.clone());
                }
                // Never recorded: only a file that passes its checks is.
                None => match checkpoint::read_whole(&file) {
                    Ok(()) => manifest.record_checkpoint(&self.paths, &file, sha256),
                    Err(error) => tracing::warn!("not recording a checkpoint that fails its checks: {error}"),
                },
            }
        }
        manifest.write(&self.paths)?;
        if manifest.config.log.tensorboard {
            // What metrics.jsonl kept (start() cut a resumed run's at its resume point).
            let records = records::read_metrics(&self.paths.metrics())?;
            let classes = manifest.data.first().map(|d| d.classes.clone()).unwrap_or_default();
            let config = manifest.config.to_toml()?;
            let events =
                tensorboard::EventFile::create(&self.paths.tensorboard(), &config, &classes, &records)?;
            writer.tensorboard = Some(events);
        }
        writer.manifest = Some(manifest);
        Ok(())
    }

    pub fn log_step(&mut self, record: StepRecord) -> Result<(), RunDirError> {
        let Some(writer) = &mut self.writer else { return Ok(()) };
        let record = MetricsRecord::Step(record);
        if let Some(events) = &mut writer.tensorboard {
            events.append(&record)?;
        }
        if let Some(metrics) = &mut writer.metrics {
            metrics.append(&record)?;
        }
        Ok(())
    }

    /// Appends the epoch to metrics.jsonl and the manifest (written by the next
    /// [`RunDir::write_manifest`]).
    pub fn log_epoch(&mut self, record: EpochRecord) -> Result<(), RunDirError> {
        let Some(writer) = &mut self.writer else { return Ok(()) };
        if let Some(manifest) = &mut writer.manifest {
            manifest.epochs.push(EpochSummary {
                epoch: record.epoch,
                global_step: record.global_step,
                train_loss: record.train_loss,
                train_accuracy: record.train_accuracy,
                val_loss: record.val.loss,
                val_top1: record.val.top1,
                seconds: record.seconds,
                images_per_second: record.train_images_per_second,
            });
        }
        let record = MetricsRecord::Epoch(record);
        if let Some(events) = &mut writer.tensorboard {
            events.append(&record)?;
        }
        if let Some(metrics) = &mut writer.metrics {
            metrics.append(&record)?;
        }
        Ok(())
    }

    pub fn write_manifest(&mut self) -> Result<(), RunDirError> {
        if let Some(Writer { manifest: Some(manifest), .. }) = &mut self.writer {
            manifest.write(&self.paths)?;
        }
        Ok(())
    }

    /// Writes a step checkpoint (rank 0), deletes the step checkpoints that `retention` picks
    /// from those present (oldest first), and records the change in the manifest. Returns the
    /// file on rank 0.
    pub fn save_checkpoint(
        &mut self,
        meta: &CheckpointMeta,
        model: Vec<(String, Tensor)>,
        optimizer: Vec<(String, Tensor)>,
        retention: impl FnOnce(&[(u64, PathBuf)]) -> Vec<PathBuf>,
    ) -> Result<Option<PathBuf>, RunDirError> {
        let Some(writer) = &mut self.writer else { return Ok(None) };
        let path = self.paths.step_checkpoint(meta.global_step);
        let sha256 = checkpoint::save(&path, meta, model, optimizer)?;
        for stale in retention(&self.paths.step_checkpoints()?) {
            if let Err(error) = std::fs::remove_file(&stale) {
                tracing::warn!("could not delete old checkpoint {}: {error}", stale.display());
            }
        }
        if let Some(manifest) = &mut writer.manifest {
            manifest.record_checkpoint(&self.paths, &path, sha256);
            manifest.drop_missing_checkpoints(&self.paths);
            manifest.write(&self.paths)?;
        }
        tracing::debug!("checkpoint {}", path.display());
        Ok(Some(path))
    }

    /// Writes every rank's step trace (`traces[rank]`, Kineto JSON) atomically under `trace/`;
    /// returns the bytes written.
    pub fn write_traces(&mut self, traces: &[Vec<u8>]) -> Result<u64, RunDirError> {
        if self.writer.is_none() {
            return Ok(0);
        }
        let mut bytes = 0;
        for (rank, trace) in traces.iter().enumerate() {
            let path = self.paths.trace(rank);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|source| RunDirError::Io { path: dir.to_path_buf(), source })?;
            }
            files::write_atomic(&path, trace)?;
            bytes += trace.len() as u64;
        }
        Ok(bytes)
    }

    /// Copies a step checkpoint to `best.safetensors` and records it in the manifest.
    pub fn save_best(&mut self, checkpoint: &Path) -> Result<(), RunDirError> {
        let Some(writer) = &mut self.writer else { return Ok(()) };
        let best = self.paths.best_checkpoint();
        let bytes = std::fs::read(checkpoint)
            .map_err(|source| RunDirError::Io { path: checkpoint.to_path_buf(), source })?;
        let sha256 = files::write_atomic(&best, &bytes)?;
        if let Some(manifest) = &mut writer.manifest {
            manifest.record_checkpoint(&self.paths, &best, sha256);
        }
        Ok(())
    }

    /// Writes the final weights (`weights` is their torchvision state dict, `meta` what they
    /// are), their hash into the manifest and `summary.json`; returns the summary with the hash
    /// filled in.
    pub fn finish(
        &mut self,
        weights: &[(String, Tensor)],
        meta: &WeightsMeta,
        summary: Summary,
    ) -> Result<Summary, RunDirError> {
        let Some(writer) = &mut self.writer else { return Ok(summary) };
        let path = self.paths.weights();
        let sha256 = files::write_safetensors(&path, weights, Some(meta.to_metadata()))?;
        let summary = Summary { weights_sha256: sha256, weights: path.clone(), ..summary };
        if let Some(manifest) = &mut writer.manifest {
            manifest.weights =
                Some(FileHash { path: self.paths.relative(&path), sha256: summary.weights_sha256.clone() });
            manifest.finished = Some(manifest::now());
            manifest.stopped_early.clone_from(&summary.stopped_early);
            manifest.write(&self.paths)?;
        }
        summary.write(&self.paths.summary())?;
        Ok(summary)
    }
}

/// Whether `name` is a file training writes in `checkpoints/`: a step checkpoint, one set
/// aside as invalid by a resume, or the best checkpoint.
fn is_checkpoint_name(name: &str) -> bool {
    let name = name.strip_suffix(SET_ASIDE_SUFFIX).unwrap_or(name);
    name == BEST_CHECKPOINT_FILE || step_of(name).is_some()
}

/// The global step a step checkpoint's file name holds (`step-000000120.safetensors`).
fn step_of(name: &str) -> Option<u64> {
    let step = name.strip_prefix(STEP_CHECKPOINT_PREFIX)?.strip_suffix(CHECKPOINT_SUFFIX)?;
    step.parse().ok()
}

/// Deletes the files in `dir` whose names an earlier run wrote there (`written`), and `dir`
/// itself if nothing else is left in it; a `dir` that is a link is removed itself, never
/// followed. Files of other names, and directories, are kept and counted in the log.
fn delete_named(dir: &Path, written: impl Fn(&str) -> bool) -> Result<(), RunDirError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RunDirError::Io { path, source }
    };
    match dir.symlink_metadata() {
        Ok(meta) if meta.file_type().is_symlink() => {
            std::fs::remove_file(dir).map_err(io(dir))?;
            tracing::info!("--overwrite: deleted the link {}", dir.display());
            return Ok(());
        }
        Ok(meta) if meta.is_dir() => {}
        // Nothing there, or a file under the name that no run wrote: training will say so.
        _ => return Ok(()),
    }
    let (mut deleted, mut kept) = (0, 0);
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let is_dir = entry.file_type().map_err(io(&entry.path()))?.is_dir();
        if is_dir || !written(&entry.file_name().to_string_lossy()) {
            kept += 1;
            continue;
        }
        std::fs::remove_file(entry.path()).map_err(io(&entry.path()))?;
        deleted += 1;
    }
    if kept == 0 {
        std::fs::remove_dir(dir).map_err(io(dir))?;
    }
    tracing::info!(
        "--overwrite: deleted {deleted} file(s) of the earlier run in {}{}",
        dir.display(),
        match kept {
            0 => String::new(),
            n => format!("; kept {n} other(s) rtrain did not write"),
        }
    );
    Ok(())
}

/// Removes what a trainer killed during a save left: the temporaries of atomic writes
/// (`.tmp-XXXXXX`) in the run directory and `checkpoints/`. Called under the lock, so no live
/// writer owns them; other files are never touched.
fn remove_stale_temporaries(paths: &RunPaths) -> Result<(), RunDirError> {
    for dir in [paths.root().to_path_buf(), paths.checkpoints()] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let is_file = entry.file_type().is_ok_and(|kind| kind.is_file());
            if is_file && files::is_stale_temporary(&entry.file_name()) {
                let path = entry.path();
                std::fs::remove_file(&path)
                    .map_err(|source| RunDirError::Io { path: path.clone(), source })?;
                tracing::warn!("removed {}, left by a run killed while saving", path.display());
            }
        }
    }
    Ok(())
}

/// Takes the run directory's lock, or names the trainer that holds it (as it wrote itself into
/// the lock file).
fn take_lock(paths: &RunPaths) -> Result<std::fs::File, RunDirError> {
    let path = paths.lock();
    let me = format!("pid {} on {}", std::process::id(), crate::cluster::hostname());
    match files::lock_with_holder(&path, &me) {
        Ok(Ok(file)) => Ok(file),
        Ok(Err(holder)) => Err(RunDirError::InUse { dir: paths.root().to_path_buf(), holder }),
        Err(source) => Err(RunDirError::Io { path, source }),
    }
}

/// `<run.dir>/<run.name>`, or with no name a sortable, time-stamped one such as
/// `resnet18-20261130T053000Z` (free of ':' for file systems that mind).
pub fn default_run_dir(config: &Config) -> PathBuf {
    let name = if config.run.name.is_empty() {
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        format!("{}-{}", config.model.arch, stamp.replace([':', '-'], ""))
    } else {
        config.run.name.clone()
    };
    config.run.dir.join(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Arch;
    use checkpoint::EpochTotals;

    fn meta(global_step: u64) -> CheckpointMeta {
        CheckpointMeta {
            arch: Arch::Resnet18,
            num_classes: 2,
            classes: vec!["a".into(), "b".into()],
            head_hidden: Vec::new(),
            epoch: 0,
            step_in_epoch: global_step,
            global_step,
            seed: 0,
            image_size: None,
            preprocessing: None,
            config_hash: "abc".into(),
            val_top1: None,
            best_val_top1: None,
            epoch_totals: EpochTotals::default(),
            plateau: None,
            early_stopping: Default::default(),
            accumulate: 1,
            rtrain_version: "0.1.0".into(),
        }
    }

    #[test]
    fn step_checkpoints_sort_by_step_and_the_newest_valid_one_is_chosen() {
        let dir = tempfile::tempdir().unwrap();
        let paths = RunPaths::new(dir.path());
        assert_eq!(paths.step_checkpoints().unwrap(), [], "no checkpoints directory yet");
        let t = || vec![("w".to_string(), Tensor::from_slice(&[1.0f32; 16]))];
        for step in [15, 5, 100] {
            checkpoint::save(&paths.step_checkpoint(step), &meta(step), t(), vec![]).unwrap();
        }
        std::fs::write(paths.checkpoints().join("notes.txt"), b"not a checkpoint").unwrap();
        std::fs::write(paths.best_checkpoint(), b"best is not a step checkpoint").unwrap();
        let steps: Vec<u64> = paths.step_checkpoints().unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(steps, [5, 15, 100], "by step, not by name");
        assert!(paths.step_checkpoint(100).ends_with("checkpoints/step-000000100.safetensors"));
        // A truncated newest checkpoint is skipped for the next older one.
        let newest = paths.step_checkpoint(100);
        let bytes = std::fs::read(&newest).unwrap();
        std::fs::write(&newest, &bytes[..bytes.len() - 8]).unwrap();
        let search = paths.latest_valid_checkpoint().unwrap();
        assert_eq!(search.valid, Some(paths.step_checkpoint(15)));
        assert_eq!(search.invalid.len(), 1);
        assert_eq!(search.invalid[0].0, newest);
        let empty = RunPaths::new(dir.path().join("empty"));
        let search = empty.latest_valid_checkpoint().unwrap();
        assert!(search.valid.is_none() && search.invalid.is_empty());
        // The writer sets the corrupt one aside, out of the step pattern, and resumes from 15.
        let out = RunDir::open(paths.clone(), true).unwrap();
        assert_eq!(out.auto_resume_checkpoint().unwrap(), Some(paths.step_checkpoint(15)));
        assert!(!newest.exists());
        assert!(paths.checkpoints().join("step-000000100.safetensors.invalid").exists());
        let steps: Vec<u64> = paths.step_checkpoints().unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(steps, [5, 15]);
    }

    #[test]
    fn only_the_writing_rank_writes() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::default();
        let mut other = RunDir::open(RunPaths::new(dir.path().join("other")), false).unwrap();
        other.start(&config, None).unwrap();
        other.log_step(StepRecord::default()).unwrap();
        let saved = other.save_checkpoint(&meta(1), vec![], vec![], |_| Vec::new()).unwrap();
        assert_eq!(saved, None);
        assert!(!dir.path().join("other").exists(), "a non-writing rank creates nothing");
        let mut root = RunDir::open(RunPaths::new(dir.path().join("root")), true).unwrap();
        assert!(!root.paths().config().exists(), "nothing written before start");
        root.start(&config, None).unwrap();
        root.log_step(StepRecord { global_step: 1, ..StepRecord::default() }).unwrap();
        let saved = root.save_checkpoint(&meta(1), vec![], vec![], |_| Vec::new()).unwrap();
        assert_eq!(saved, Some(root.paths().step_checkpoint(1)));
        assert!(root.paths().config().is_file());
        let records = records::read_metrics(&root.paths().metrics()).unwrap();
        assert!(matches!(records.as_slice(), [MetricsRecord::Step(StepRecord { global_step: 1, .. })]));
    }

    #[test]
    fn a_locked_run_directory_is_refused_naming_the_holder_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let paths = RunPaths::new(dir.path().join("run"));
        let first = RunDir::open(paths.clone(), true).unwrap();
        // A second open file description, as another process would have.
        let err = RunDir::open(paths.clone(), true).err().unwrap().to_string();
        assert!(err.contains(&format!("pid {}", std::process::id())) && err.contains("in use"), "{err}");
        drop(first);
        RunDir::open(paths, true).expect("the lock is released with its holder");
    }
}
