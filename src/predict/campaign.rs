//! `rtrain predict --out DIR`: a whole campaign's photos classified as one rank of a job,
//! resumably, with rank 0 merging the outputs.
//!
//! The inputs, in their sorted order, are cut into parts of `--part-size` images; part `p`
//! belongs to rank `p % world_size`, and is classified in batches of `data.eval_batch_size`
//! through the evaluation loader and transform. Parts are cut the same way at any world
//! size, so each batch holds the same images and the numbers are the same bytes. A finished
//! part is written atomically to `DIR/parts/part-NNNNNN.jsonl`; a rerun of the same command
//! (same model, inputs and settings, checked against `DIR/parts/job.json`) skips the parts
//! that exist. A stop signal ends the part in progress without writing it, and every rank stops
//! at the same round (one small all-reduce per round of parts), with exit status 75. When every
//! part exists, rank 0 writes the merged files, each atomically.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tch::{Kind, Tensor};

use super::inputs::Inputs;
use super::outputs::{self, Record};
use crate::cluster::signals::{self, StoppedBySignal};
use crate::cluster::{self, Communicator};
use crate::config::Config;
use crate::data::dataset::Dataset;
use crate::data::loader::{EpochBatches, Loader, LoaderOptions};
use crate::data::photo::{self, PhotoTags};
use crate::model::Model;
use crate::plan::RunPlan;
use crate::run_dir::checkpoint;
use crate::util::files::{is_stale_temporary, sha256_file, write_atomic};

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
    pub checkpoint: PathBuf,
    pub inputs: Vec<PathBuf>,
    pub lists: Vec<PathBuf>,
    pub out: PathBuf,
    /// Columns for the `top` most likely classes (0: none).
    pub top: usize,
    pub part_size: usize,
    pub on_bad_image: OnBadImage,
}

/// What identifies a job's parts: a rerun continues only the same job.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
struct JobKey {
    rtrain_version: String,
    model_sha256: String,
    /// sha256 over the inputs' names, in order.
    inputs_sha256: String,
    images: usize,
    /// The configuration's hash (image size, transform, batch size, precision...).
    config_hash: String,
    top: usize,
    part_size: usize,
}

/// `summary.json`.
#[derive(Debug, Serialize)]
struct Summary {
    model: PathBuf,
    model_sha256: String,
    rtrain_version: String,
    inputs: Vec<PathBuf>,
    #[serde(flatten)]
    counts: outputs::Counts,
    /// Files met in directories that are not images, left out.
    ignored_files: usize,
    parts: usize,
    /// Parts found finished by an earlier run of the same command.
    parts_resumed: usize,
    ranks: usize,
    compute: String,
    /// This run's time, and the images it classified per second (resumed parts excluded).
    wall_seconds: f64,
    images_per_second: f64,
}

const JOB_FILE: &str = "job.json";

fn part_path(parts_dir: &Path, part: usize) -> PathBuf {
    parts_dir.join(format!("part-{part:06}.jsonl"))
}

/// Runs this rank's share of the job; rank 0 returns the directory the outputs were merged into.
pub fn run(config: &Config, comm: Arc<dyn Communicator>, request: &Request) -> Result<Option<PathBuf>> {
    let started = Instant::now();
    signals::install().context("installing the stop-signal handlers")?;
    let topology = comm.topology().clone();
    let plan = RunPlan::for_prediction(config, &topology)?;
    let inputs = Arc::new(Inputs::gather(&request.inputs, &request.lists)?);
    let inputs_sha256 = names_digest(&inputs);
    let seen = cluster::gather_strings(comm.as_ref(), &inputs_sha256);
    if let Some(rank) = seen.iter().position(|digest| *digest != seen[0]) {
        bail!(
            "rank {rank} found other inputs than rank 0 ({} images here): every rank must see the same files",
            inputs.len()
        );
    }
    let (model, meta) = checkpoint::load_model_on(&request.checkpoint, plan.compute.device)?;
    meta.warn_if_size_differs(&request.checkpoint, config.data.image_size);
    plan.compute.prepare_model(&model)?;
    let key = JobKey {
        rtrain_version: env!("CARGO_PKG_VERSION").to_string(),
        model_sha256: sha256_file(&request.checkpoint)?,
        inputs_sha256,
        images: inputs.len(),
        config_hash: config.hash()?,
        top: request.top,
        part_size: request.part_size.max(1),
    };
    let parts_dir = request.out.join("parts");
    let prepared = if topology.is_root() { prepare_parts_dir(&parts_dir, &key) } else { Ok(()) };
    cluster::agree(comm.as_ref(), prepared.map_err(|e| format!("{e:#}")))
        .map_err(|failures| anyhow::anyhow!("{}", cluster::describe_failures(&failures)))?;

    let parts = inputs.len().div_ceil(key.part_size);
    let world = topology.world_size;
    let mut classified = 0usize;
    let mut resumed = 0usize;
    let classifier = Classifier { model: &model, classes: &meta.classes, plan: &plan, top: request.top };
    for round in 0..parts.div_ceil(world) {
        let part = round * world + topology.rank;
        let mut stopped = false;
        if part < parts {
            let path = part_path(&parts_dir, part);
            if path.exists() {
                resumed += 1;
            } else {
                let range = part * key.part_size..((part + 1) * key.part_size).min(inputs.len());
                let count = range.len();
                match classifier.part(&inputs, range, request.on_bad_image)? {
                    Some(records) => {
                        write_atomic(&path, &outputs::jsonl_bytes(&records)?)?;
                        classified += count;
                    }
                    None => stopped = true,
                }
            }
        }
        // Every rank takes part in every round, so all stop at the same one.
        let mut stop = [f64::from(u8::from(stopped || signals::requested().is_some()))];
        comm.all_reduce_sum_f64(&mut stop);
        if stop[0] > 0.0 {
            let done = (0..parts).filter(|&p| part_path(&parts_dir, p).exists()).count();
            return Err(StoppedBySignal {
                what: format!("prediction into {} ({done} of {parts} parts done)", request.out.display()),
            }
            .into());
        }
    }
    let mut resumed_total = [resumed as f64, classified as f64];
    comm.all_reduce_sum_f64(&mut resumed_total);
    if !topology.is_root() {
        return Ok(None);
    }
    let records = read_parts(&parts_dir, parts, &inputs, key.part_size)?;
    let classes = &meta.classes;
    let out = &request.out;
    write_atomic(&out.join("predictions.csv"), &outputs::csv_bytes(&records, classes, request.top)?)?;
    write_atomic(&out.join("predictions.jsonl"), &outputs::jsonl_bytes(&records)?)?;
    write_atomic(&out.join("predictions.geojson"), &outputs::geojson_bytes(&records, classes)?)?;
    let wall_seconds = started.elapsed().as_secs_f64();
    let summary = Summary {
        model: request.checkpoint.clone(),
        model_sha256: key.model_sha256.clone(),
        rtrain_version: key.rtrain_version.clone(),
        inputs: request.inputs.iter().chain(&request.lists).cloned().collect(),
        counts: outputs::counts(&records, classes),
        ignored_files: inputs.ignored,
        parts,
        parts_resumed: resumed_total[0] as usize,
        ranks: world,
        compute: plan.compute.to_string(),
        wall_seconds,
        images_per_second: resumed_total[1] / wall_seconds.max(1e-9),
    };
    let mut json = serde_json::to_vec_pretty(&summary)?;
    json.push(b'\n');
    write_atomic(&out.join("summary.json"), &json)?;
    let counts = &summary.counts;
    tracing::info!(
        "classified {} of {} images into {} ({} refused, {} without GPS), {:.1} img/s",
        counts.classified,
        counts.images,
        out.display(),
        counts.refused,
        counts.without_gps,
        summary.images_per_second
    );
    Ok(Some(out.clone()))
}

fn names_digest(inputs: &Inputs) -> String {
    let mut hasher = Sha256::new();
    for name in inputs.names() {
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// Creates `DIR/parts` with the job's key, or checks that the parts there are this job's and
/// removes the temporaries of writes a killed job left (before any rank writes again).
fn prepare_parts_dir(parts_dir: &Path, key: &JobKey) -> Result<()> {
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
            if found != *key {
                bail!(
                    "{} holds the parts of another prediction (model {}, {} images, settings {}; this one: \
                     model {}, {} images, settings {}): choose another --out, or remove {} to start over",
                    parts_dir.display(),
                    short(&found.model_sha256),
                    found.images,
                    short(&found.config_hash),
                    short(&key.model_sha256),
                    key.images,
                    short(&key.config_hash),
                    parts_dir.display()
                );
            }
            Ok(())
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let mut json = serde_json::to_vec_pretty(key)?;
            json.push(b'\n');
            write_atomic(&job_file, &json)?;
            Ok(())
        }
        Err(error) => Err(error).with_context(|| format!("reading {}", job_file.display())),
    }
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(12)]
}

/// Every part's records, in order, each part checked to hold its inputs.
fn read_parts(parts_dir: &Path, parts: usize, inputs: &Inputs, part_size: usize) -> Result<Vec<Record>> {
    let mut records = Vec::with_capacity(inputs.len());
    for part in 0..parts {
        let path = part_path(parts_dir, part);
        let bytes = std::fs::read(&path).with_context(|| format!("reading part {}", path.display()))?;
        let part_records = outputs::parse_jsonl(&bytes)
            .with_context(|| format!("{}: not a part of predictions", path.display()))?;
        let expected = (part * part_size..((part + 1) * part_size).min(inputs.len())).map(|i| inputs.name(i));
        if !part_records.iter().map(|r| r.path.as_str()).eq(expected) {
            bail!("{} does not hold the images of part {part}: remove it and run again", path.display());
        }
        records.extend(part_records);
    }
    Ok(records)
}

/// The model, with what classifying a part needs.
struct Classifier<'a> {
    model: &'a Model,
    classes: &'a [String],
    plan: &'a RunPlan,
    top: usize,
}

impl Classifier<'_> {
    /// The records of inputs `range`, or None when a stop signal came first.
    fn part(
        &self,
        inputs: &Arc<Inputs>,
        range: std::ops::Range<usize>,
        on_bad_image: OnBadImage,
    ) -> Result<Option<Vec<Record>>> {
        let first = range.start;
        let mut records = describe_files(inputs, range.clone(), self.plan.loader_workers.max(1));
        let options = LoaderOptions { skip_bad_samples: true, ..self.plan.eval_loader() };
        let order: Vec<usize> = range.collect();
        let batches = EpochBatches::every_sample(order.len(), options.batch_size);
        let dataset: Arc<dyn Dataset> = inputs.clone();
        let loader = Loader::new(dataset, order, self.plan.eval_transform(), batches, options);
        let compute = &self.plan.compute;
        for batch in loader {
            if signals::requested().is_some() {
                return Ok(None);
            }
            let batch = batch?;
            for skipped in batch.skipped {
                let reason = match skipped.error {
                    crate::data::dataset::DataError::Decode { source, .. } => {
                        format!("cannot decode: {source}")
                    }
                    crate::data::dataset::DataError::Io { source, .. } => format!("cannot read: {source}"),
                    other => other.to_string(),
                };
                if on_bad_image == OnBadImage::Error {
                    bail!("{}: {reason} (--on-bad-image error)", inputs.name(skipped.index));
                }
                records[skipped.index - first].error = Some(reason);
            }
            if batch.indices.is_empty() {
                continue;
            }
            let probabilities = tch::no_grad(|| -> Result<Tensor> {
                let images = compute.input(&batch.images)?;
                let _autocast = compute.autocast()?;
                Ok(self.model.forward_t(&images, false).to_kind(Kind::Float).softmax(-1, Kind::Float))
            })?;
            let probabilities = probabilities.to_device(tch::Device::Cpu).contiguous();
            let flat: Vec<f32> =
                Vec::try_from(probabilities.view([-1])).context("reading probabilities back")?;
            for (&index, row) in batch.indices.iter().zip(flat.chunks(self.classes.len())) {
                records[index - first].predicted(self.classes, row.to_vec(), self.top);
            }
        }
        Ok(Some(records))
    }
}

/// The record of each input in `range` with what its bytes say (sha256, size, Exif), read on
/// `threads` threads.
fn describe_files(inputs: &Inputs, range: std::ops::Range<usize>, threads: usize) -> Vec<Record> {
    let indices: Vec<usize> = range.collect();
    let chunk = indices.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = indices
            .chunks(chunk)
            .map(|chunk| {
                scope.spawn(move || chunk.iter().map(|&i| describe_file(inputs, i)).collect::<Vec<_>>())
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("describing files does not panic")).collect()
    })
}

/// A file's record from its bytes; a shard sample's from the source photo its shard recorded
/// (its sha256, size and Exif, which a `--resize`d copy no longer has).
fn describe_file(inputs: &Inputs, index: usize) -> Record {
    let name = inputs.name(index).to_string();
    if let Some(source) = inputs.shard_source(index) {
        warn_gps_problem(&name, &source.tags);
        let size = source.width.zip(source.height);
        return Record::new(name, Some(source.sha256), size, Some(&source.tags));
    }
    let Ok(bytes) = inputs.encoded(index) else {
        // The loader reports why, in the record's error.
        return Record::new(name, None, None, None);
    };
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let size = photo::stored_size(&bytes);
    let tags = PhotoTags::of(&bytes);
    warn_gps_problem(&name, &tags);
    Record::new(name, Some(sha256), size, Some(&tags))
}

fn warn_gps_problem(name: &str, tags: &PhotoTags) {
    if let Some(problem) = &tags.gps_problem {
        tracing::warn!("{name}: GPS block not read ({problem}): no position");
    }
}
