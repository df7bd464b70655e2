//! The commands that use a trained model from its checkpoint: `rtrain eval` (a split's
//! metrics, with intervals, and per-image results), `rtrain predict` (image files printed; or a campaign's photos into a directory, as
//! a job), `rtrain buildings` (a finished `predict --out` joined to building footprints later),
//! `rtrain explain` (Grad-CAM heatmaps) and `rtrain export` (a torchvision state dict).

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::{exit_code, print, ConfigArgs};
use crate::calibrate::{self, ConformalRequest};
use crate::calibration::ConformalMethod;
use crate::cluster::job;
use crate::config::Config;
use crate::explain;
use crate::inference::{self, Ensemble, Tta};
use crate::plan::RunPlan;
use crate::predict;
use crate::predict::buildings::{self, Fusion};
use crate::predict::campaign::{self, OnBadImage};
use crate::run_dir::checkpoint;
use crate::train::eval;

/// The model a command uses: one file, or several used together (an ensemble).
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A model file (final weights, a checkpoint or a calibrated model), or a run directory, a
    /// run group or a bundle of `rtrain publish` for the final weights of each of its runs.
    /// Repeat for an ensemble: the probabilities are the mean of the members'.
    #[arg(long = "checkpoint", required = true, value_name = "MODEL")]
    pub checkpoints: Vec<PathBuf>,
    /// Test-time augmentation: `flip` averages each image's probabilities with its mirror's.
    #[arg(long, value_enum, default_value_t = Tta::None)]
    pub tta: Tta,
}

impl ModelArgs {
    /// The models, loaded for `plan`'s device, each with its preprocessing resolved against
    /// `config` (the keys in `explicit` win).
    fn load(&self, config: &Config, explicit: &BTreeSet<String>, plan: &RunPlan) -> Result<Ensemble> {
        let files = inference::model_files(&self.checkpoints)?;
        let ensemble = Ensemble::load(&files, config, explicit, &plan.compute, self.tta)?;
        if ensemble.members.len() > 1 {
            tracing::info!("an ensemble of {} models", ensemble.members.len());
        }
        Ok(ensemble)
    }
}

/// The configuration (or why it could not be loaded, for the job to report) and the keys the
/// user set in it.
fn load_config(args: &ConfigArgs) -> Result<(Result<Config>, BTreeSet<String>)> {
    match args.load() {
        Ok(loaded) => {
            let explicit = loaded.explicit_keys()?;
            Ok((Ok(loaded.config), explicit))
        }
        Err(error) => Ok((Err(error), BTreeSet::new())),
    }
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The split of the data root to evaluate (default: data.val_split), e.g. a held-out `test`.
    #[arg(long)]
    pub split: Option<String>,
    /// Evaluate this class-per-folder tree (or, with --split, this data root or shard set)
    /// instead of data.root's split.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Write metrics.json and predictions.csv (each image's true class, predicted class and
    /// probabilities) into DIR.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Bootstrap resamples of the 95% intervals (0: none; at most 100000, as each is kept).
    #[arg(long, default_value_t = crate::metrics::DEFAULT_BOOTSTRAP, value_parser = bootstrap_resamples)]
    pub bootstrap: usize,
    /// Seed of the bootstrap (default: run.seed): the same seed gives the same intervals.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `eval --bootstrap`: a number of resamples, at most [`crate::metrics::MAX_BOOTSTRAP`].
fn bootstrap_resamples(value: &str) -> Result<usize, String> {
    let resamples: usize = value.parse().map_err(|e| format!("{e}"))?;
    match resamples <= crate::metrics::MAX_BOOTSTRAP {
        true => Ok(resamples),
        false => Err(format!("at most {} resamples", crate::metrics::MAX_BOOTSTRAP)),
    }
}

/// The data root and split that `--data` and `--split` name (by default data.root and
/// data.val_split; `--data TREE` alone is a class-per-folder tree, its last component the split).
fn split_source(
    config: &crate::config::Config,
    data: Option<&PathBuf>,
    split: Option<String>,
) -> (PathBuf, String) {
    match (data, split) {
        (None, split) => (config.data.root.clone(), split.unwrap_or_else(|| config.data.val_split.clone())),
        (Some(root), Some(split)) => (root.clone(), split),
        (Some(root), None) if crate::data::shards::is_shard_dir(root) => {
            (root.clone(), config.data.val_split.clone())
        }
        (Some(tree), None) => {
            let parent = tree.parent().map(PathBuf::from).unwrap_or_default();
            (parent, tree.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
        }
    }
}

impl EvalArgs {
    /// Data-parallel under any launcher, as predict --out: rank 0 reports and writes.
    pub(super) fn run(self) -> Result<()> {
        let (loaded, explicit) = load_config(&self.config)?;
        job::run_in_job(loaded, exit_code, |config, comm| {
            let (root, split) = split_source(config, self.data.as_ref(), self.split.clone());
            let plan = RunPlan::for_prediction(config, comm.topology())?;
            let ensemble = self.model.load(config, &explicit, &plan)?;
            let evaluation = eval::evaluate_ensemble(&plan, comm.as_ref(), &ensemble, &root, &split)?;
            if !comm.topology().is_root() {
                return Ok(());
            }
            let seed = self.seed.unwrap_or(config.run.seed);
            let evaluated = crate::report::evaluation::Evaluated::new(&evaluation, self.bootstrap, seed)?
                .with_trust(&evaluation, &ensemble, self.bootstrap, seed);
            if let Some(out) = &self.out {
                evaluated.write(out, &evaluation)?;
            }
            print::eval_report(&evaluated, self.json)
        })
    }
}

#[derive(Debug, Args)]
pub struct PredictArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub config: ConfigArgs,
    /// How many classes to show per image (default 3); with --out, top-k columns.
    #[arg(long)]
    pub top: Option<usize>,
    /// Print the predictions as JSON (without --out).
    #[arg(long)]
    pub json: bool,
    /// Classify every input into DIR (predictions.csv, .jsonl, .geojson, summary.json) as a
    /// data-parallel, resumable job, instead of printing.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// A file listing inputs, one path per line (with --out; may be repeated).
    #[arg(long, value_name = "FILE", requires = "out")]
    pub from_list: Vec<PathBuf>,
    /// Images per part of the job (rounded up to a multiple of the batch size): the unit a rank
    /// writes, and a rerun skips when done. Default: the continued job's, or for a new job
    /// about four parts per rank, at most 1024 images.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), requires = "out")]
    pub part_size: Option<u32>,
    /// With --out: an unreadable or undecodable image is a row with its error (`row`), or
    /// ends the job (`error`). Without --out any bad image is an error.
    #[arg(long, value_enum, default_value_t = OnBadImage::Row)]
    pub on_bad_image: OnBadImage,
    /// With --out and a model calibrated with --conformal: mark the photos whose prediction
    /// set holds more than one class as abstained (`abstain` column and property; counted).
    #[arg(long, requires = "out")]
    pub abstain: bool,
    /// With --out: building footprints (GeoJSON Polygons and MultiPolygons, WGS 84): each
    /// positioned photo gets its building (columns building_id, assignment, distance_m), and
    /// buildings.geojson, buildings.csv and map.png/.svg hold each building's fused estimate.
    #[arg(long, value_name = "FILE", requires = "out")]
    pub footprints: Option<PathBuf>,
    #[command(flatten)]
    pub building: BuildingArgs,
    /// Image files; with --out also directories (searched recursively) and shard sets.
    #[arg(required_unless_present = "from_list", value_name = "INPUT")]
    pub images: Vec<PathBuf>,
}

/// How photos are joined to footprints and fused (`predict --footprints`, `rtrain buildings`).
#[derive(Debug, Args)]
pub struct BuildingArgs {
    /// The property of each footprint that holds its id.
    #[arg(long = "footprint-id", value_name = "KEY", default_value = "id", requires = "footprints",
          value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub id_key: String,
    /// How far a photo may be from its building, in metres (when it is not inside one).
    #[arg(long, value_name = "M", default_value_t = 30.0, requires = "footprints", value_parser = metres)]
    pub max_distance: f64,
    /// How a building's photos become one estimate: the mean of their probabilities, or their
    /// normalised product (independent evidence).
    #[arg(long, value_enum, default_value_t = Fusion::Mean, requires = "footprints")]
    pub fusion: Fusion,
    /// Write every footprint to buildings.geojson and .csv, those without photos too.
    #[arg(long, requires = "footprints")]
    pub all_footprints: bool,
}

/// The largest `--max-distance`: a photo of a building farther away than this is no photo of
/// it, and the plane the distances are measured in stays true to the ground.
const MAX_DISTANCE_M: f64 = 10_000.0;

/// `--max-distance`: metres, positive and at most [`MAX_DISTANCE_M`].
fn metres(value: &str) -> Result<f64, String> {
    let metres: f64 = value.parse().map_err(|e| format!("{e}"))?;
    match metres > 0.0 && metres <= MAX_DISTANCE_M {
        true => Ok(metres),
        false => Err(format!("a distance in metres above 0 and at most {MAX_DISTANCE_M}")),
    }
}

impl BuildingArgs {
    fn request(&self, footprints: PathBuf) -> buildings::Request {
        buildings::Request {
            footprints,
            id_key: self.id_key.clone(),
            max_distance_m: self.max_distance,
            fusion: self.fusion,
            all_footprints: self.all_footprints,
        }
    }
}

impl PredictArgs {
    pub(super) fn run(self) -> Result<()> {
        let (loaded, explicit) = load_config(&self.config)?;
        let Some(out) = self.out else {
            let config = loaded?;
            let plan = RunPlan::for_inference(&config);
            let ensemble = self.model.load(&config, &explicit, &plan)?;
            let top = self.top.unwrap_or(3);
            let predictions = predict::predict_files(&ensemble, &plan.compute, &self.images, top)?;
            return print::predictions(&predictions, self.json);
        };
        let request = campaign::Request {
            inputs: self.images,
            lists: self.from_list,
            out,
            top: self.top.unwrap_or(0),
            part_size: self.part_size.map(|size| size as usize),
            on_bad_image: self.on_bad_image,
            abstain: self.abstain,
            buildings: self.footprints.map(|footprints| self.building.request(footprints)),
        };
        super::train::install_stop_signals()?;
        job::run_in_job(loaded, exit_code, |config, comm| {
            let plan = RunPlan::for_prediction(config, comm.topology())?;
            let ensemble = self.model.load(config, &explicit, &plan)?;
            if let Some(dir) = campaign::run(&plan, comm, &ensemble, &request)? {
                println!("{}", dir.display());
            }
            Ok(())
        })
    }
}

#[derive(Debug, Args)]
pub struct BuildingsArgs {
    /// The directory of a finished `rtrain predict --out`.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Building footprints (GeoJSON Polygons and MultiPolygons, WGS 84).
    #[arg(long, value_name = "FILE")]
    pub footprints: PathBuf,
    #[command(flatten)]
    pub building: BuildingArgs,
}

impl BuildingsArgs {
    /// One process: the photos are classified already.
    pub(super) fn run(self) -> Result<()> {
        let request = self.building.request(self.footprints);
        campaign::add_buildings(&self.dir, &request)?;
        println!("{}", self.dir.display());
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Write the overlays, maps and index.csv into DIR.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The stage whose activations are weighed (torchvision's layer1-layer4).
    #[arg(long, default_value = "layer4")]
    pub layer: String,
    /// Explain this class (name or index) instead of each image's predicted class.
    #[arg(long, value_name = "C")]
    pub class: Option<String>,
    /// Explain a sample of this split's images (a data root with --split, a class-per-folder
    /// tree, or a shard set) instead of IMG files.
    #[arg(long, value_name = "DIR", conflicts_with = "images")]
    pub data: Option<PathBuf>,
    /// The split of --data (default: data.val_split).
    #[arg(long, requires = "data")]
    pub split: Option<String>,
    /// How many images of --data to explain.
    #[arg(long, default_value_t = 16, requires = "data")]
    pub count: usize,
    /// Seed of the sample of --data (default: run.seed).
    #[arg(long, requires = "data")]
    pub seed: Option<u64>,
    /// Image files, directories (searched recursively) or shard sets.
    #[arg(required_unless_present = "data", value_name = "IMG")]
    pub images: Vec<PathBuf>,
}

impl ExplainArgs {
    pub(super) fn run(self) -> Result<()> {
        let (config, explicit) = load_config(&self.config)?;
        let mut config = config?;
        // Grad-CAM's forward and backward run in fp32 and NCHW: the probabilities (and the
        // predicted class whose map is drawn) come from the same computation, so that a near
        // tie cannot name one class and draw another's map.
        config.train.precision = crate::model::precision::PrecisionSetting::Fp32;
        config.train.channels_last = false;
        let plan = RunPlan::for_inference(&config);
        let ensemble = self.model.load(&config, &explicit, &plan)?;
        let images = match &self.data {
            None => explain::Images::Inputs(self.images),
            Some(data) => {
                let (root, split) = split_source(&config, Some(data), self.split);
                let seed = self.seed.unwrap_or(config.run.seed);
                explain::Images::Sample { root, split, count: self.count, seed }
            }
        };
        let request = explain::Request { images, out: self.out, layer: self.layer, class: self.class };
        let explained = explain::explain(&ensemble, &plan, &request)?;
        print::explained(&explained, &request.out)
    }
}

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// The model to calibrate (one file or run directory).
    #[arg(long, value_name = "MODEL")]
    pub checkpoint: PathBuf,
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The held-out split to fit on (default: data.val_split), never the training split.
    #[arg(long)]
    pub split: Option<String>,
    /// Fit on this class-per-folder tree (or, with --split, this data root or shard set).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// The calibrated model file to write.
    #[arg(long, value_name = "MODEL2")]
    pub out: PathBuf,
    /// Also fit split-conformal prediction sets.
    #[arg(long)]
    pub conformal: bool,
    /// The sets' miscoverage: they hold the true class with probability at least 1 - alpha.
    #[arg(long, default_value_t = 0.1, requires = "conformal", value_parser = miscoverage)]
    pub alpha: f64,
    /// The conformity score: `lac` (smallest sets) or `aps` (adaptive: larger sets for harder
    /// photos), as MAPIE names them.
    #[arg(long, value_enum, default_value_t = ConformalMethod::Lac, requires = "conformal")]
    pub method: ConformalMethod,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `calibrate --alpha`: a share strictly between 0 and 1 (a usage error otherwise, exit 2).
fn miscoverage(value: &str) -> Result<f64, String> {
    let alpha: f64 = value.parse().map_err(|e| format!("{e}"))?;
    match alpha > 0.0 && alpha < 1.0 {
        true => Ok(alpha),
        false => {
            Err("alpha must be in (0, 1), e.g. 0.1 for sets that hold the true class 90% of the time".into())
        }
    }
}

impl CalibrateArgs {
    /// Data-parallel under any launcher, as eval: rank 0 writes the model.
    pub(super) fn run(self) -> Result<()> {
        let (loaded, explicit) = load_config(&self.config)?;
        job::run_in_job(loaded, exit_code, |config, comm| {
            let (root, split) = split_source(config, self.data.as_ref(), self.split.clone());
            if self.data.is_none() && split == config.data.train_split {
                anyhow::bail!(
                    "--split {split}: the training split; calibrate on held-out images (data.val_split)"
                );
            }
            let plan = RunPlan::for_prediction(config, comm.topology())?;
            let model = ModelArgs { checkpoints: vec![self.checkpoint.clone()], tta: Tta::None };
            let ensemble = model.load(config, &explicit, &plan)?;
            let conformal =
                self.conformal.then_some(ConformalRequest { method: self.method, alpha: self.alpha });
            let (calibration, evaluation) =
                calibrate::fit(&plan, comm.as_ref(), &ensemble, &root, &split, conformal)?;
            if !comm.topology().is_root() {
                return Ok(());
            }
            calibrate::write(&ensemble, &calibration, &self.out)?;
            let calibrated = calibrate::Calibrated::new(&ensemble, &evaluation, calibration, &self.out);
            print::calibrated(&calibrated, self.json)
        })
    }
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[arg(long)]
    pub checkpoint: PathBuf,
    pub out: PathBuf,
}

impl ExportArgs {
    pub(super) fn run(self) -> Result<()> {
        let (model, meta) = checkpoint::load_model(&self.checkpoint)?;
        model.write_torchvision(&self.out, meta.global_step, Some(meta.to_metadata()))?;
        println!(
            "{}: torchvision {} state dict, num_classes={} ({})",
            self.out.display(),
            meta.arch,
            meta.num_classes,
            meta.classes.join(", ")
        );
        Ok(())
    }
}
