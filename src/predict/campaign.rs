//! `rtrain predict --out DIR`: a whole campaign's photos classified as one rank of a job,
//! resumably, with rank 0 merging the outputs.
//!
//! The inputs, in their sorted order, are cut into parts of `--part-size` images (a multiple
//! of `data.eval_batch_size`, so that no batch spans two parts and every batch but the last
//! holds the same images whatever the part size or world size: the numbers are the same
//! bytes); part `p` belongs to rank `p % world_size`. Each rank runs one loader over all of its
//! parts (decoding runs ahead across part boundaries) and writes each finished part atomically
//! to `DIR/parts/part-NNNNNN.jsonl`, sealed with its rows' sha256; a rerun of the same
//! command (same model, inputs and settings, checked against `DIR/parts/job.json`, whose part
//! size it reuses) skips the parts that exist and are whole, and sets aside (`*.invalid`) and
//! classifies again those that are not. A stop signal ends a rank's work after its current
//! batch, without writing the part in progress; the ranks learn of it at the end (one
//! all-reduce), and all exit 75. When every part exists, rank 0 writes the merged files, each
//! atomically.
//!
//! One job at a time writes DIR: rank 0 holds an exclusive lock (flock) on `DIR/.rtrain.lock`
//! from start to end, and a second job is refused at once, naming the holder the lock file
//! records.
//!
//! With `--footprints`, rank 0 reads the footprints before any photo is classified (a bad file
//! fails the job at once), and gives each photo its building when it merges, so that a resumed
//! job and any world size give the same files; [`add_buildings`] does the same later, for an
//! existing directory (`rtrain buildings`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::buildings;
use super::inputs::{Ignored, Inputs};
use super::map;
use super::outputs::{self, FileStamp, Part, Record};
use crate::cluster::signals::{self, StoppedBySignal};
use crate::cluster::{self, Communicator};
use crate::data::dataset::{DataError, Dataset};
use crate::data::loader::{EpochBatches, LoaderOptions};
use crate::data::shards::SampleSource;
use crate::inference::{self, Ensemble, MemberRecord, Tta};
use crate::plan::RunPlan;
use crate::run_dir::checkpoint::Calibration;
use crate::util::files::{is_stale_temporary, read_regular, write_atomic};

/// What to do with an input that cannot be read or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBadImage {
    /// A row with the error (counted in the summary); the job goes on.
    Row,
    /// The job fails, naming the image.
    Error,
}

/// `rtrain predict --out`'s request.
#[derive(Debug, Clone)]
pub struct Request {
    pub inputs: Vec<PathBuf>,
    pub lists: Vec<PathBuf>,
    pub out: PathBuf,
    /// Columns for the `top` most likely classes (0: none; at most the model's classes).
    pub top: usize,
    /// Images per part; None: the part size of the job being continued, or for a new job
    /// [`auto_part_size`].
    pub part_size: Option<usize>,
    pub on_bad_image: OnBadImage,
    /// Mark photos whose conformal prediction set is not one class (`--abstain`).
    pub abstain: bool,
    /// Per building (`--footprints`).
    pub buildings: Option<buildings::Request>,
}

/// What identifies a job's parts: a rerun continues only the same job.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
struct JobKey {
    /// Images per part (a multiple of the batch size).
    part_size: usize,
    rtrain_version: String,
    /// The model file's sha256; for an ensemble, the sha256 of its members' in order.
    model_sha256: String,
    #[serde(default)]
    tta: Tta,
    /// sha256 over the inputs' paths, in order.
    inputs_sha256: String,
    images: usize,
    /// The configuration's hash (image size, transform, batch size, precision...).
    config_hash: String,
    top: usize,
}

/// A new job's part size: about four parts per rank (so that a stopped job keeps most of its
/// work and ranks finish together), at most 1024 images, a multiple of `batch`.
pub fn auto_part_size(images: usize, world_size: usize, batch: usize) -> usize {
    aligned(images.div_ceil(4 * world_size.max(1)).clamp(1, 1024), batch)
}

/// `size` rounded up to a multiple of `batch`.
fn aligned(size: usize, batch: usize) -> usize {
    size.max(1).div_ceil(batch.max(1)) * batch.max(1)
}

fn part_range(part: usize, part_size: usize, images: usize) -> std::ops::Range<usize> {
    part * part_size..((part + 1) * part_size).min(images)
}

/// `summary.json`: written by a job, read and written again by [`add_buildings`].
#[derive(Debug, Serialize, serde::Deserialize)]
struct Summary {
    model: PathBuf,
    model_sha256: String,
    /// Every model used (one, or an ensemble's members), with its sha256 and temperature.
    members: Vec<MemberRecord>,
    tta: Tta,
    /// Forward passes per image (members times test-time views): what ensembles and `--tta`
    /// cost, beside `images_per_second`.
    passes_per_image: usize,
    /// The calibration applied (a single calibrated model's), with what it was fitted on.
    calibration: Option<Calibration>,
    rtrain_version: String,
    inputs: Vec<PathBuf>,
    /// The model's classes, in its order (the order of the `probabilities` of each record).
    #[serde(default)]
    classes: Vec<String>,
    #[serde(flatten)]
    counts: outputs::Counts,
    /// Files and folders met and left out: how many, and each with why.
    ignored_files: usize,
    ignored: Vec<Ignored>,
    parts: usize,
    /// Parts found finished by an earlier run of the same command.
    parts_resumed: usize,
    ranks: usize,
    compute: String,
    /// This run's time, and the images it classified per second (resumed parts excluded).
    wall_seconds: f64,
    images_per_second: f64,
    /// With `--footprints`: the buildings, and the photos by how they were assigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    buildings: Option<buildings::Summary>,
}

const SUMMARY_FILE: &str = "summary.json";

/// What `rtrain buildings` reads of a directory that may come from elsewhere, each a regular
/// file (a FIFO is refused, not waited on) within a bound: a summary lists at most every
/// ignored file; predictions.jsonl holds about 1 KB a photo, so 16 GiB is millions of photos.
const MAX_SUMMARY_BYTES: u64 = 1 << 30;
const MAX_PREDICTIONS_BYTES: u64 = 16 << 30;

impl Summary {
    fn write(&self, out: &Path) -> Result<()> {
        let mut json = serde_json::to_vec_pretty(self)?;
        json.push(b'\n');
        write_atomic(&out.join(SUMMARY_FILE), &json)?;
        Ok(())
    }

    fn read(out: &Path) -> Result<Summary> {
        let path = out.join(SUMMARY_FILE);
        let bytes = read_regular(&path, MAX_SUMMARY_BYTES).with_context(|| {
            format!("reading {}: not the directory of a finished `rtrain predict --out`", path.display())
        })?;
        serde_json::from_slice(&bytes)
            .with_context(|| format!("{}: not the summary of `rtrain predict --out`", path.display()))
    }
}

const JOB_FILE: &str = "job.json";
/// In the output directory: held (flock) by the job writing it.
const LOCK_FILE: &str = ".rtrain.lock";

fn part_path(parts_dir: &Path, part: usize) -> PathBuf {
    parts_dir.join(format!("part-{part:06}.jsonl"))
}

/// Runs this rank's share of the job; rank 0 returns the directory the outputs were merged into.
/// The caller has installed the stop-signal handlers (`signals::install`, before MPI starts).
pub fn run(
    plan: &RunPlan,
    comm: Arc<dyn Communicator>,
    ensemble: &Ensemble,
    request: &Request,
) -> Result<Option<PathBuf>> {
    let started = Instant::now();
    let topology = comm.topology().clone();
    // Footprints first: a bad file ends the job before a photo is classified.
    let setup = match topology.is_root() {
        true => read_footprints(request)
            .and_then(|footprints| Ok((footprints, Some(lock_out_dir(&request.out)?)))),
        false => Ok((None, None)),
    };
    cluster::agree(comm.as_ref(), setup.as_ref().map(|_| ()).map_err(|e| format!("{e:#}")))
        .map_err(|failures| anyhow::anyhow!("{}", cluster::describe_failures(&failures)))?;
    // The lock is held until the merged files are written.
    let (footprints, _lock) = setup?;
    let inputs = Arc::new(Inputs::gather(&request.inputs, &request.lists)?);
    if topology.is_root() {
        for ignored in &inputs.ignored {
            tracing::warn!("{}: left out: {}", ignored.path, ignored.reason);
        }
    }
    let inputs_sha256 = names_digest(&inputs);
    let seen = cluster::gather_strings(comm.as_ref(), &inputs_sha256);
    if let Some(rank) = seen.iter().position(|digest| *digest != seen[0]) {
        bail!(
            "rank {rank} found other inputs than rank 0 ({} images here): every rank must see the same files",
            inputs.len()
        );
    }
    if request.abstain && ensemble.calibration().and_then(|c| c.conformal.as_ref()).is_none() {
        bail!(
            "--abstain needs the prediction sets of one model calibrated with `rtrain calibrate --conformal`, used without --tta ({} has none that apply)",
            ensemble.first().path.display()
        );
    }
    // As `predict` without --out: no more columns than classes (4294967296 of them filled the
    // memory before a photo was read).
    let top = request.top.min(ensemble.classes().len());
    let batch = plan.eval_loader().batch_size;
    let mut key = JobKey {
        part_size: 0,
        rtrain_version: env!("CARGO_PKG_VERSION").to_string(),
        model_sha256: models_sha256(ensemble),
        tta: ensemble.tta,
        inputs_sha256,
        images: inputs.len(),
        config_hash: plan.digest()?,
        top,
    };
    let parts_dir = request.out.join("parts");
    let prepared = if topology.is_root() {
        let asked = request.part_size.map(|size| aligned(size, batch));
        let new_job = auto_part_size(inputs.len(), topology.world_size, batch);
        prepare_parts_dir(&parts_dir, &key, asked, new_job)
    } else {
        Ok(0)
    };
    cluster::agree(comm.as_ref(), prepared.as_ref().map(|_| ()).map_err(|e| format!("{e:#}")))
        .map_err(|failures| anyhow::anyhow!("{}", cluster::describe_failures(&failures)))?;
    let part_size = prepared?.to_string();
    key.part_size = cluster::broadcast_string(comm.as_ref(), &part_size, 0).parse()?;

    let parts = inputs.len().div_ceil(key.part_size);
    let mine: Vec<usize> = (topology.rank..parts).step_by(topology.world_size).collect();
    let (done, todo): (Vec<usize>, Vec<usize>) =
        mine.into_iter().partition(|&p| is_done(&parts_dir, p, &inputs, key.part_size));
    let classifier = Classifier { ensemble, plan, top };
    signals::arm(comm.as_ref())?;
    let classified = classifier.parts(&inputs, &todo, key.part_size, &parts_dir, request.on_bad_image)?;
    let stopped = classified.is_none() || signals::requested().is_some();
    // The one collective after the work: did any rank stop, and how much was done.
    let mut totals = [f64::from(u8::from(stopped)), done.len() as f64, classified.unwrap_or(0) as f64];
    comm.all_reduce_sum_f64(&mut totals);
    if totals[0] > 0.0 {
        let done = (0..parts).filter(|&p| part_path(&parts_dir, p).exists()).count();
        return Err(StoppedBySignal {
            what: format!("prediction into {} ({done} of {parts} parts done)", request.out.display()),
        }
        .into());
    }
    let world = topology.world_size;
    if !topology.is_root() {
        return Ok(None);
    }
    let mut records = read_parts(&parts_dir, parts, &inputs, key.part_size)?;
    if request.abstain {
        records.iter_mut().for_each(Record::judge_abstention);
    }
    let classes = ensemble.classes();
    let out = &request.out;
    let buildings = write_merged(out, &mut records, classes, top, footprints.as_ref())?;
    let wall_seconds = started.elapsed().as_secs_f64();
    let summary = Summary {
        model: ensemble.first().path.clone(),
        model_sha256: key.model_sha256.clone(),
        members: ensemble.records(),
        tta: ensemble.tta,
        passes_per_image: ensemble.passes(),
        calibration: ensemble.calibration().cloned(),
        rtrain_version: key.rtrain_version.clone(),
        inputs: request.inputs.iter().chain(&request.lists).cloned().collect(),
        classes: classes.to_vec(),
        counts: outputs::counts(&records, classes),
        ignored_files: inputs.ignored.len(),
        ignored: inputs.ignored.clone(),
        parts,
        parts_resumed: totals[1] as usize,
        ranks: world,
        compute: plan.compute.to_string(),
        wall_seconds,
        images_per_second: totals[2] / wall_seconds.max(1e-9),
        buildings,
    };
    summary.write(out)?;
    let counts = &summary.counts;
    let first_unreadable = counts
        .gps_unreadable_examples
        .first()
        .map(|example| format!(" (first: {}: {})", example.path, example.problem))
        .unwrap_or_default();
    tracing::info!(
        "classified {} of {} images into {} ({} refused, {} without GPS, {} with an unreadable GPS block{}), {:.1} img/s",
        counts.classified,
        counts.images,
        out.display(),
        counts.refused,
        counts.without_gps,
        counts.gps_unreadable,
        first_unreadable,
        summary.images_per_second
    );
    Ok(Some(out.clone()))
}

/// The footprints of the request, read and indexed (None without `--footprints`).
fn read_footprints(request: &Request) -> Result<Option<buildings::Prepared>> {
    Ok(request.buildings.as_ref().map(buildings::Prepared::read).transpose()?)
}

/// Writes the merged files of `records` into `out`: with `footprints`, each photo's building
/// first, then `predictions.csv`, `.jsonl` and `.geojson`, and the building outputs and map.
/// Returns the buildings' summary.
fn write_merged(
    out: &Path,
    records: &mut [Record],
    classes: &[String],
    top: usize,
    footprints: Option<&buildings::Prepared>,
) -> Result<Option<buildings::Summary>> {
    let fused =
        footprints.map(|prepared| buildings::assign_and_fuse(prepared, records, classes)).transpose()?;
    write_atomic(&out.join("predictions.csv"), &outputs::csv_bytes(records, classes, top)?)?;
    write_atomic(&out.join("predictions.jsonl"), &outputs::jsonl_bytes(records)?)?;
    write_atomic(&out.join("predictions.geojson"), &outputs::geojson_bytes(records, classes)?)?;
    let (Some(prepared), Some(fused)) = (footprints, fused) else {
        // Without footprints, a building file of an earlier run into this directory would
        // describe other predictions than these: it goes.
        for stale in [buildings::GEOJSON_FILE, buildings::CSV_FILE].into_iter().chain(map::FILES) {
            match std::fs::remove_file(out.join(stale)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("removing {}", out.join(stale).display()))
                }
                _ => {}
            }
        }
        return Ok(None);
    };
    buildings::write(out, prepared, &fused, records, classes)?;
    tracing::info!("{}", buildings::describe(&fused.summary));
    Ok(Some(fused.summary))
}

/// `rtrain buildings DIR`: the per-building step of `predict --out --footprints` for the
/// directory of a finished `predict --out` (footprints that came after the campaign): the
/// prediction files again with each photo's building, the building outputs, the map, and the
/// summary's `buildings`. Holds the directory's lock, as a job does.
pub fn add_buildings(out: &Path, request: &buildings::Request) -> Result<buildings::Summary> {
    let mut summary = Summary::read(out)?;
    let _lock = lock_out_dir(out)?;
    if summary.classes.is_empty() {
        bail!(
            "{}: names no classes (written by an older rtrain): run its `rtrain predict --out` again with \
             --footprints (its finished parts are only merged)",
            out.join(SUMMARY_FILE).display()
        );
    }
    let prepared = buildings::Prepared::read(request)?;
    let path = out.join("predictions.jsonl");
    let bytes =
        read_regular(&path, MAX_PREDICTIONS_BYTES).with_context(|| format!("reading {}", path.display()))?;
    let mut records = outputs::parse_jsonl(&bytes).with_context(|| format!("{}", path.display()))?;
    // The `--top` of the job: every classified record holds that many.
    let top = records.iter().map(|r| r.top.len()).max().unwrap_or(0);
    let written = write_merged(out, &mut records, &summary.classes, top, Some(&prepared))?;
    let buildings = written.context("no buildings' summary with footprints")?;
    summary.buildings = Some(buildings.clone());
    summary.write(out)?;
    Ok(buildings)
}

/// Takes the exclusive lock of the output directory `out` (creating both), or names the job
/// that holds it, as that job wrote itself into the lock file.
fn lock_out_dir(out: &Path) -> Result<std::fs::File> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join(LOCK_FILE);
    let me = format!("pid {} on {}", std::process::id(), cluster::hostname());
    match crate::util::files::lock_with_holder(&path, &me)
        .with_context(|| format!("locking {}", path.display()))?
    {
        Ok(file) => Ok(file),
        Err(holder) => bail!(
            "{} is in use by another rtrain ({holder}): wait for it to finish, or choose another --out",
            out.display()
        ),
    }
}

/// The model's sha256, or for an ensemble the sha256 of its members' sha256s in order.
fn models_sha256(ensemble: &Ensemble) -> String {
    match ensemble.members.as_slice() {
        [only] => only.sha256.clone(),
        members => {
            let mut hasher = Sha256::new();
            for member in members {
                hasher.update(member.sha256.as_bytes());
            }
            hex::encode(hasher.finalize())
        }
    }
}

fn names_digest(inputs: &Inputs) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut hasher = Sha256::new();
    for path in inputs.paths() {
        hasher.update((path.len() as u64).to_le_bytes());
        hasher.update(path.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// Creates `DIR/parts` with the job's key, or checks that the parts there are this job's, and
/// removes the temporaries of writes a killed job left (before any rank writes again). Returns
/// the part size: the existing job's (which `asked`, if given, must equal), or for a new job
/// `asked` or else `new_job`.
fn prepare_parts_dir(parts_dir: &Path, key: &JobKey, asked: Option<usize>, new_job: usize) -> Result<usize> {
    std::fs::create_dir_all(parts_dir).with_context(|| format!("creating {}", parts_dir.display()))?;
    for entry in std::fs::read_dir(parts_dir).with_context(|| format!("listing {}", parts_dir.display()))? {
        let entry = entry.with_context(|| format!("listing {}", parts_dir.display()))?;
        if is_stale_temporary(&entry.file_name()) {
            std::fs::remove_file(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    let job_file = parts_dir.join(JOB_FILE);
    match std::fs::read(&job_file) {
        Ok(bytes) => {
            let found: JobKey = serde_json::from_slice(&bytes)
                .with_context(|| format!("{}: not the key of a prediction job", job_file.display()))?;
            let expected = JobKey { part_size: asked.unwrap_or(found.part_size), ..key.clone() };
            if found != expected {
                bail!(
                    "{} holds the parts of another prediction (model {}, {} images, settings {}, parts of {}; \
                     this one: model {}, {} images, settings {}, parts of {}): choose another --out, or \
                     remove {} to start over",
                    parts_dir.display(),
                    short(&found.model_sha256),
                    found.images,
                    short(&found.config_hash),
                    found.part_size,
                    short(&expected.model_sha256),
                    expected.images,
                    short(&expected.config_hash),
                    expected.part_size,
                    parts_dir.display()
                );
            }
            Ok(found.part_size)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let key = JobKey { part_size: asked.unwrap_or(new_job), ..key.clone() };
            let mut json = serde_json::to_vec_pretty(&key)?;
            json.push(b'\n');
            write_atomic(&job_file, &json)?;
            Ok(key.part_size)
        }
        Err(error) => Err(error).with_context(|| format!("reading {}", job_file.display())),
    }
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(12)]
}

/// Part `part`, checked against its seal and to hold its inputs.
fn read_part(parts_dir: &Path, part: usize, inputs: &Inputs, part_size: usize) -> Result<Part> {
    let path = part_path(parts_dir, part);
    let bytes = std::fs::read(&path).with_context(|| format!("reading part {}", path.display()))?;
    let read = outputs::parse_part(&bytes).with_context(|| format!("{}", path.display()))?;
    let expected = part_range(part, part_size, inputs.len()).map(|i| inputs.name(i));
    if !read.records.iter().map(|r| r.path.as_str()).eq(expected) {
        bail!("{}: does not hold the images of part {part}", path.display());
    }
    Ok(read)
}

/// The stamp of input `index`'s file as it is now (None for a shard sample, or a file that
/// cannot be read).
fn stamp_now(inputs: &Inputs, index: usize) -> Option<FileStamp> {
    inputs.file(index).and_then(|path| std::fs::metadata(path).ok()).map(|metadata| FileStamp::of(&metadata))
}

/// The first input of `part` (which starts at input `first`) that changed since the part was
/// written: a file's size or modification time, or the source photo a shard sample records.
fn changed_since<'i>(part: &Part, inputs: &'i Inputs, first: usize) -> Option<&'i str> {
    let rows = part.records.iter().zip(&part.files).enumerate();
    rows.map(|(offset, (record, stamp))| (first + offset, record, stamp))
        .find(|&(index, record, stamp)| match inputs.shard_source(index) {
            Some(source) => record.sha256.as_deref() != Some(source.sha256.as_str()),
            None => stamp_now(inputs, index) != *stamp,
        })
        .map(|(index, _, _)| inputs.name(index))
}

/// Whether part `part` was finished by an earlier run, is whole, and its photos have not
/// changed since. A part that exists but fails its checks (edited, damaged, another job's) is
/// set aside as `*.invalid`, named in the log, to be classified again: never merged, never
/// lost. A part with a photo changed since is classified again, naming the photo.
fn is_done(parts_dir: &Path, part: usize, inputs: &Inputs, part_size: usize) -> bool {
    let path = part_path(parts_dir, part);
    if !path.exists() {
        return false;
    }
    let error = match read_part(parts_dir, part, inputs, part_size) {
        Ok(read) => {
            let first = part_range(part, part_size, inputs.len()).start;
            let Some(changed) = changed_since(&read, inputs, first) else { return true };
            tracing::warn!(
                "{changed}: changed since {} was written: its images are classified again",
                path.display()
            );
            return false;
        }
        Err(error) => error,
    };
    let mut aside = path.clone().into_os_string();
    aside.push(".invalid");
    match std::fs::rename(&path, &aside) {
        Ok(()) => tracing::warn!(
            "{error:#}: set aside as {}, and its images classified again",
            Path::new(&aside).display()
        ),
        // Overwritten when the part is written again.
        Err(rename) => tracing::warn!("{error:#}: classified again ({rename} setting it aside)"),
    }
    false
}

/// Every part's records, in order, each part checked against its seal and to hold its inputs
/// (a part changed since this run checked it ends the merge, naming it).
fn read_parts(parts_dir: &Path, parts: usize, inputs: &Inputs, part_size: usize) -> Result<Vec<Record>> {
    let mut records = Vec::with_capacity(inputs.len());
    for part in 0..parts {
        let read = read_part(parts_dir, part, inputs, part_size)
            .map_err(|error| anyhow::anyhow!("{error:#}: remove it and run the same command again"))?;
        records.extend(read.records);
    }
    Ok(records)
}

/// The model, with what classifying a part needs.
struct Classifier<'a> {
    ensemble: &'a Ensemble,
    plan: &'a RunPlan,
    top: usize,
}

impl Classifier<'_> {
    /// Classifies `parts` (in order) with one loader per transform, writing each part to
    /// `parts_dir` when its last batch is done; returns the images classified, or None when a
    /// stop signal came first (the part in progress is not written).
    fn parts(
        &self,
        inputs: &Arc<Inputs>,
        parts: &[usize],
        part_size: usize,
        parts_dir: &Path,
        on_bad_image: OnBadImage,
    ) -> Result<Option<usize>> {
        let options = LoaderOptions { skip_bad_samples: true, ..self.plan.eval_loader() };
        let batch_size = options.batch_size;
        let order: Vec<usize> = parts.iter().flat_map(|&p| part_range(p, part_size, inputs.len())).collect();
        let batches = EpochBatches::every_sample(order.len(), batch_size);
        let dataset: Arc<dyn Dataset> = inputs.clone();
        let mut loader = self.ensemble.loaders(&dataset, &order, batches, &options);
        let calibration = self.ensemble.calibration();
        let classes = self.ensemble.classes();
        let mut classified = 0;
        for &part in parts {
            let range = part_range(part, part_size, inputs.len());
            let first = range.start;
            // Hashing and Exif run here while the loader's workers decode ahead.
            let mut described = describe_files(inputs, range.clone(), self.plan.loader_workers.max(1));
            let records = &mut described.records;
            // Part sizes are multiples of the batch size: the part's batches are its own.
            for views in loader.by_ref().take(range.len().div_ceil(batch_size)) {
                if signals::requested().is_some() {
                    return Ok(None);
                }
                let mut views = views?;
                for skipped in std::mem::take(&mut views[0].skipped) {
                    let reason = match skipped.error {
                        DataError::Decode { source, .. } => format!("cannot decode: {source}"),
                        DataError::Io { source, .. } => format!("cannot read: {source}"),
                        other => other.to_string(),
                    };
                    if on_bad_image == OnBadImage::Error {
                        bail!("{}: {reason} (--on-bad-image error)", inputs.name(skipped.index));
                    }
                    records[skipped.index - first].error = Some(reason);
                }
                if views[0].indices.is_empty() {
                    continue;
                }
                let probabilities =
                    self.ensemble.probabilities(&inference::images(&views), &self.plan.compute)?;
                for (index, probabilities) in views[0].indices.iter().zip(inference::rows(&probabilities)?) {
                    records[index - first].predicted(classes, &probabilities, self.top, calibration);
                }
            }
            write_atomic(&part_path(parts_dir, part), &outputs::part_bytes(&described)?)?;
            classified += range.len();
        }
        Ok(Some(classified))
    }
}

/// The record of each input in `range` with what its bytes say (sha256, size, Exif), and the
/// stamp of its file, read on `threads` threads.
fn describe_files(inputs: &Inputs, range: std::ops::Range<usize>, threads: usize) -> Part {
    let indices: Vec<usize> = range.collect();
    let chunk = indices.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = indices
            .chunks(chunk)
            .map(|chunk| {
                scope.spawn(move || chunk.iter().map(|&i| describe_file(inputs, i)).collect::<Vec<_>>())
            })
            .collect();
        let described = handles.into_iter().flat_map(|h| h.join().expect("describing files does not panic"));
        let (records, files) = described.unzip();
        Part { records, files }
    })
}

/// An input's record with what its source says: a file's from its bytes, a shard sample's from
/// the source photo its shard recorded (its sha256, size and Exif, which a `--resize`d copy no
/// longer has) — the same [`SampleSource`] either way. A file's stamp is taken before it is
/// read, so that a file changed meanwhile is seen as changed on a rerun.
fn describe_file(inputs: &Inputs, index: usize) -> (Record, Option<FileStamp>) {
    let name = inputs.name(index).to_string();
    let stamp = stamp_now(inputs, index);
    let source = match inputs.shard_source(index) {
        Some(source) => source,
        None => match inputs.encoded(index) {
            Ok(bytes) => SampleSource::of(Path::new(&name), &bytes),
            // The loader reports why, in the record's error.
            Err(_) => return (Record::new(name, None, None, None), stamp),
        },
    };
    if let Some(problem) = &source.tags.gps_problem {
        tracing::warn!("{name}: GPS block not read ({problem}): no position");
    }
    for problem in &source.tags.exif_problems {
        tracing::warn!("{name}: {problem}");
    }
    let size = source.width.zip(source.height);
    (Record::new(name, Some(source.sha256), size, Some(&source.tags)), stamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_whole_batches_about_four_per_rank() {
        assert_eq!(auto_part_size(160, 2, 4), 20);
        assert_eq!(auto_part_size(160, 2, 16), 32);
        assert_eq!(auto_part_size(3, 8, 64), 64);
        assert_eq!(auto_part_size(1_000_000, 4, 64), 1024);
        assert_eq!(aligned(5, 4), 8);
        assert_eq!(part_range(2, 8, 20), 16..20);
    }
}
