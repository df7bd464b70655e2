//! Evaluation: loss, top-1, per-class accuracy and the confusion matrix over a dataset split,
//! with the model in inference mode (BatchNorm running statistics, no gradients). With several
//! ranks the split's batches are dealt out whole (batch b to rank b mod W) and the counts are
//! summed, so the report covers every image exactly once, and every image is in a batch of the
//! same images at any world size: `rtrain eval` gathers per-image results that do not depend
//! on the number of ranks, bit for bit.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tch::{Kind, Reduction, Tensor};

use crate::cluster;
use crate::cluster::Communicator;
use crate::data::dataset::DataError;
use crate::data::dataset::Dataset;
use crate::data::loader::{EpochBatches, Loader, LoaderOptions};
use crate::data::transforms::Transform;
use crate::inference::{self, Ensemble, InferenceError, Tta};
use crate::model::precision::Compute;
use crate::model::Model;
use crate::plan::RunPlan;
use crate::run_dir::checkpoint;
use crate::run_dir::records::EvalReport;
use crate::util::shim::ShimError;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Shim(#[from] ShimError),
    #[error(transparent)]
    Checkpoint(#[from] crate::run_dir::checkpoint::CheckpointError),
    #[error(transparent)]
    Shards(#[from] crate::data::shards::ShardError),
    #[error("{}: classes {found:?} differ from the checkpoint's {expected:?}", dir.display())]
    Classes { dir: std::path::PathBuf, found: Vec<String>, expected: Vec<String> },
    #[error("evaluating {}: a batch's labels or predictions could not be read back: {source}", dir.display())]
    ReadBack { dir: std::path::PathBuf, source: tch::TchError },
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(transparent)]
    Inference(#[from] InferenceError),
    #[error("{}: rank {rank} sees {theirs}, rank 0 {root}: every rank must see the same split", dir.display())]
    RanksDiffer { dir: std::path::PathBuf, rank: usize, theirs: String, root: String },
}

/// Counts predictions against labels; kept apart from the model so it is testable alone.
#[derive(Debug, Clone)]
pub struct Confusion {
    counts: Vec<Vec<u64>>,
    loss_sum: f64,
}

impl Confusion {
    pub fn new(num_classes: usize) -> Confusion {
        Confusion { counts: vec![vec![0; num_classes]; num_classes], loss_sum: 0.0 }
    }

    /// Adds a batch: `loss_sum` is the summed (not mean) loss of its samples.
    pub fn add(&mut self, labels: &[i64], predictions: &[i64], loss_sum: f64) {
        for (&truth, &predicted) in labels.iter().zip(predictions) {
            if let (Ok(t), Ok(p)) = (usize::try_from(truth), usize::try_from(predicted)) {
                if t < self.counts.len() && p < self.counts.len() {
                    self.counts[t][p] += 1;
                }
            }
        }
        self.loss_sum += loss_sum;
    }

    /// Sums the counts and losses of every rank's part (a collective: all ranks call it).
    pub fn all_reduce(&mut self, comm: &dyn Communicator) {
        let mut values: Vec<f64> = self.counts.iter().flatten().map(|&c| c as f64).collect();
        values.push(self.loss_sum);
        comm.all_reduce_sum_f64(&mut values);
        self.loss_sum = values.pop().unwrap_or(0.0);
        for (count, value) in self.counts.iter_mut().flatten().zip(values) {
            // Counts are far below 2^53: exact in f64.
            *count = value as u64;
        }
    }

    pub fn report(&self) -> EvalReport {
        let samples: u64 = self.counts.iter().flatten().sum();
        let correct: u64 = (0..self.counts.len()).map(|i| self.counts[i][i]).sum();
        let per_class = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let total: u64 = row.iter().sum();
                if total == 0 {
                    0.0
                } else {
                    row[i] as f64 / total as f64
                }
            })
            .collect();
        let denominator = samples.max(1) as f64;
        EvalReport {
            samples: samples as usize,
            loss: self.loss_sum / denominator,
            top1: correct as f64 / denominator,
            per_class,
            confusion: self.counts.clone(),
            ordinal: crate::metrics::from_confusion(&self.counts),
        }
    }
}

/// One evaluated image: its dataset index, true class, the most probable class, its
/// cross-entropy loss and the probability of every class; for a single model, its logits too
/// (before any temperature: what `rtrain calibrate` fits on).
#[derive(Debug, Clone, PartialEq)]
pub struct ImageResult {
    pub index: usize,
    pub label: usize,
    pub predicted: usize,
    pub loss: f64,
    pub probabilities: Vec<f64>,
    /// Empty for an ensemble.
    pub logits: Vec<f64>,
}

/// This rank's part of `len` samples in batches of `batch_size`: whole batches, batch b to rank
/// b mod W, so that each batch holds the same samples whatever the world size.
fn rank_part(len: usize, batch_size: usize, rank: usize, world_size: usize) -> Vec<usize> {
    let batch_size = batch_size.max(1);
    (0..len.div_ceil(batch_size))
        .skip(rank)
        .step_by(world_size)
        .flat_map(|batch| batch * batch_size..((batch + 1) * batch_size).min(len))
        .collect()
}

/// Every rank's [`ImageResult`]s on every rank, in dataset order: each rank fills its images'
/// rows of a dense table of `len` rows and the tables are summed (adding zeros is exact, so
/// each row arrives as its rank computed it). A collective.
pub fn gather_images(
    comm: &dyn Communicator,
    mine: &[ImageResult],
    len: usize,
    num_classes: usize,
) -> Vec<ImageResult> {
    // Per row: present, label, predicted, loss, has logits, the probabilities, the logits.
    let width = 5 + 2 * num_classes;
    let mut table = vec![0f64; len * width];
    for image in mine {
        let row = &mut table[image.index * width..(image.index + 1) * width];
        let has_logits = f64::from(u8::from(!image.logits.is_empty()));
        row[..5].copy_from_slice(&[1.0, image.label as f64, image.predicted as f64, image.loss, has_logits]);
        row[5..5 + num_classes].copy_from_slice(&image.probabilities);
        if !image.logits.is_empty() {
            row[5 + num_classes..].copy_from_slice(&image.logits);
        }
    }
    comm.all_reduce_sum_f64(&mut table);
    table
        .chunks_exact(width)
        .enumerate()
        .filter(|(_, row)| row[0] == 1.0)
        .map(|(index, row)| ImageResult {
            index,
            label: row[1] as usize,
            predicted: row[2] as usize,
            loss: row[3],
            probabilities: row[5..5 + num_classes].to_vec(),
            logits: if row[4] == 1.0 { row[5 + num_classes..].to_vec() } else { Vec::new() },
        })
        .collect()
}

/// The report of `images` (in the order given, so that the loss is summed in that order).
pub fn report_of(images: &[ImageResult], num_classes: usize) -> EvalReport {
    let mut confusion = Confusion::new(num_classes);
    for image in images {
        confusion.add(&[image.label as i64], &[image.predicted as i64], image.loss);
    }
    confusion.report()
}

/// Evaluates `model` on this rank's part of `dataset` (see [`rank_part`]), the counts summed over ranks; with
/// `kept`, also keeps each of this rank's images' probabilities there (softmax of the logits
/// in f64), for the metrics of [`crate::metrics`]. A collective.
pub fn evaluate(
    model: &Model,
    dataset: Arc<dyn Dataset>,
    transform: Transform,
    options: LoaderOptions,
    compute: &Compute,
    comm: &dyn Communicator,
    mut kept: Option<&mut Vec<ImageResult>>,
) -> Result<EvalReport, EvalError> {
    let topology = comm.topology();
    let dir = dataset.root().to_path_buf();
    let order = rank_part(dataset.len(), options.batch_size, topology.rank, topology.world_size);
    let batches = EpochBatches::every_sample(order.len(), options.batch_size);
    let loader = Loader::new(dataset, order, transform, batches, options);
    let mut confusion = Confusion::new(model.num_classes);
    tch::no_grad(|| {
        for batch in loader {
            let batch = batch?;
            for bad in &batch.skipped {
                tracing::warn!("evaluation skipped an undecodable sample (data.on_bad_sample = skip): {bad}");
            }
            if batch.indices.is_empty() {
                continue;
            }
            let images = compute.input(&batch.images)?;
            let _autocast = compute.autocast()?;
            let logits = model.forward_t(&images, false);
            let loss = logits.cross_entropy_loss::<Tensor>(
                &compute.labels(&batch.labels),
                None,
                Reduction::Sum,
                -100,
                0.0,
            );
            let predictions = logits.argmax(-1, false).to_device(tch::Device::Cpu);
            let read_back = |source| EvalError::ReadBack { dir: dir.clone(), source };
            let labels: Vec<i64> = Vec::try_from(&batch.labels).map_err(read_back)?;
            let predictions: Vec<i64> = Vec::try_from(&predictions).map_err(read_back)?;
            confusion.add(&labels, &predictions, loss.to_kind(Kind::Double).double_value(&[]));
            if let Some(kept) = kept.as_deref_mut() {
                let logits = logits.to_kind(Kind::Double).to_device(tch::Device::Cpu);
                let rows: Vec<Vec<f64>> =
                    Vec::try_from(&logits.softmax(-1, Kind::Double)).map_err(read_back)?;
                let losses =
                    logits.cross_entropy_loss::<Tensor>(&batch.labels, None, Reduction::None, -100, 0.0);
                let losses: Vec<f64> = Vec::try_from(&losses).map_err(read_back)?;
                let per_image = batch.indices.iter().zip(&labels).zip(&predictions).zip(losses).zip(rows);
                for ((((&index, &label), &predicted), loss), probabilities) in per_image {
                    kept.push(ImageResult {
                        index,
                        label: label as usize,
                        predicted: predicted as usize,
                        loss,
                        probabilities,
                        logits: Vec::new(),
                    });
                }
            }
        }
        Ok::<(), EvalError>(())
    })?;
    confusion.all_reduce(comm);
    Ok(confusion.report())
}

/// [`evaluate`] of `split` with the plan's transform, loader and compute. A collective.
pub fn evaluate_split(
    model: &Model,
    split: &Arc<dyn Dataset>,
    plan: &RunPlan,
    comm: &dyn Communicator,
) -> Result<EvalReport, EvalError> {
    evaluate(model, split.clone(), plan.eval_transform(), plan.eval_loader(), &plan.compute, comm, None)
}

/// The run's best checkpoint evaluated again at the end, as the tutorial reloads and evaluates
/// `best_model.pt`: rank 0 reads `best` (checking its digest and values), every rank receives
/// its weights, and the split is evaluated as during training. Returns the epoch (1-based) the
/// checkpoint was taken after (known on rank 0; 0 elsewhere), the report as training's
/// validation makes it (the epoch record's numbers), and every image's result on every rank, as
/// `rtrain eval` has them. A collective.
pub fn evaluate_best(
    plan: &RunPlan,
    classes: &[String],
    split: &Arc<dyn Dataset>,
    comm: &dyn Communicator,
    best: &Path,
) -> Result<(u32, EvalReport, CheckpointEvaluation), EvalError> {
    let arch = plan.model().arch;
    let num_classes = classes.len();
    let model = Model::with_head(arch, num_classes, &plan.model().head_hidden, plan.compute.device)?;
    let mut epoch = 0;
    if comm.topology().is_root() {
        let checkpoint = checkpoint::load(best, Some((arch, num_classes)))?;
        model.restore(&checkpoint.model, best)?;
        epoch = checkpoint.meta.epoch;
    }
    plan.compute.prepare_model(&model)?;
    cluster::broadcast_from_root(comm, model.state_dict().into_values());
    let (report, evaluation) = evaluate_every_image(&model, split, plan, comm, classes, best)?;
    Ok((epoch, report, evaluation))
}

/// [`evaluate`] of `dataset` keeping every image's result, gathered on every rank: the report
/// as the counts give it, and the [`CheckpointEvaluation`] of `checkpoint` (its report made
/// from the images in dataset order). A collective.
fn evaluate_every_image(
    model: &Model,
    dataset: &Arc<dyn Dataset>,
    plan: &RunPlan,
    comm: &dyn Communicator,
    classes: &[String],
    checkpoint: &Path,
) -> Result<(EvalReport, CheckpointEvaluation), EvalError> {
    let mut mine = Vec::new();
    let transform = plan.eval_transform();
    let counted = evaluate(
        model,
        dataset.clone(),
        transform.clone(),
        plan.eval_loader(),
        &plan.compute,
        comm,
        Some(&mut mine),
    )?;
    let topology = comm.topology();
    if topology.world_size > 1 {
        tracing::info!("rank {} evaluated {} of {} images", topology.rank, mine.len(), dataset.len());
    }
    let images = gather_images(comm, &mine, dataset.len(), classes.len());
    let evaluation = CheckpointEvaluation {
        report: report_of(&images, classes.len()),
        classes: classes.to_vec(),
        dataset: dataset.clone(),
        images,
        checkpoint: checkpoint.to_path_buf(),
        transform,
    };
    Ok((counted, evaluation))
}

/// What `rtrain eval` found: the report, the checkpoint's class names, the dataset and each
/// image's result in dataset order; the checkpoint and the transform its images were seen
/// through, for Grad-CAM of its mistakes.
pub struct CheckpointEvaluation {
    pub report: EvalReport,
    pub classes: Vec<String>,
    pub dataset: Arc<dyn Dataset>,
    pub images: Vec<ImageResult>,
    pub checkpoint: PathBuf,
    pub transform: Transform,
}

/// `rtrain eval` and `rtrain calibrate`: `ensemble` (one model or several, with its
/// preprocessing, temperatures and test-time flips) evaluated on `split` of the data root
/// `root` (a class-per-folder tree or a shard set), data-parallel over the job's ranks. Every
/// rank returns every image's result, in dataset order, and the report made from them, the
/// same at any world size. A shard set's shards must still have the sha256 they were prepared
/// with, as in training. A collective.
pub fn evaluate_ensemble(
    plan: &RunPlan,
    comm: &dyn Communicator,
    ensemble: &Ensemble,
    root: &Path,
    split: &str,
) -> Result<CheckpointEvaluation, EvalError> {
    let dataset = crate::data::open_split(root, split, plan.class_order())?;
    crate::data::shards::check_recorded_sha256(dataset.as_ref())?;
    if dataset.classes() != ensemble.classes() {
        return Err(EvalError::Classes {
            dir: dataset.root().to_path_buf(),
            found: dataset.classes().to_vec(),
            expected: ensemble.classes().to_vec(),
        });
    }
    let seen = format!("{} images", dataset.len());
    let everyone = cluster::gather_strings(comm, &seen);
    if let Some(rank) = everyone.iter().position(|other| *other != everyone[0]) {
        return Err(EvalError::RanksDiffer {
            dir: dataset.root().to_path_buf(),
            rank,
            theirs: everyone[rank].clone(),
            root: everyone[0].clone(),
        });
    }
    let topology = comm.topology();
    let options = plan.eval_loader();
    let order = rank_part(dataset.len(), options.batch_size, topology.rank, topology.world_size);
    let batches = EpochBatches::every_sample(order.len(), options.batch_size);
    let dir = dataset.root().to_path_buf();
    let mut mine = Vec::with_capacity(order.len());
    for views in ensemble.loaders(&dataset, &order, batches, &options) {
        let views = views?;
        for bad in &views[0].skipped {
            tracing::warn!("evaluation skipped an undecodable sample (data.on_bad_sample = skip): {bad}");
        }
        if views[0].indices.is_empty() {
            continue;
        }
        let read_back = |source| EvalError::ReadBack { dir: dir.clone(), source };
        let labels: Vec<i64> = Vec::try_from(&views[0].labels).map_err(read_back)?;
        // A single model's one forward pass gives its logits (what calibrate fits on) and its
        // loss from the log-softmax, exact where a probability underflows (with --tta flip, the
        // log of the mean); an ensemble's loss is the log of its mean.
        let (probabilities, log_probabilities, logits) = match ensemble.members.as_slice() {
            [member] => {
                let images = &views[0].images;
                let logits = member.logits(images, &plan.compute)?;
                let probabilities =
                    member.probabilities_given(&logits, images, ensemble.tta, &plan.compute)?;
                let log_probabilities = match ensemble.tta {
                    Tta::None => (&logits / member.temperature()).log_softmax(-1, Kind::Double),
                    Tta::Flip => probabilities.log(),
                };
                (probabilities, log_probabilities, inference::rows(&logits)?)
            }
            _ => {
                let probabilities = ensemble.probabilities(&inference::images(&views), &plan.compute)?;
                let log_probabilities = probabilities.log();
                (probabilities, log_probabilities, vec![Vec::new(); labels.len()])
            }
        };
        let losses: Vec<f64> =
            Vec::try_from(-log_probabilities.gather(1, &views[0].labels.unsqueeze(1), false).squeeze_dim(1))
                .map_err(read_back)?;
        let rows = inference::rows(&probabilities)?;
        let per_image = views[0].indices.iter().zip(&labels).zip(losses).zip(rows).zip(logits);
        for ((((&index, &label), loss), probabilities), logits) in per_image {
            mine.push(ImageResult {
                index,
                label: label as usize,
                predicted: crate::metrics::argmax(&probabilities),
                loss,
                probabilities,
                logits,
            });
        }
    }
    if topology.world_size > 1 {
        tracing::info!("rank {} evaluated {} of {} images", topology.rank, mine.len(), dataset.len());
    }
    let images = gather_images(comm, &mine, dataset.len(), ensemble.classes().len());
    let first = ensemble.first();
    Ok(CheckpointEvaluation {
        report: report_of(&images, ensemble.classes().len()),
        classes: ensemble.classes().to_vec(),
        dataset,
        images,
        checkpoint: first.path.clone(),
        transform: first.transform.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_get_whole_batches_in_turn() {
        // 10 samples in batches of 3: [0,1,2] [3,4,5] [6,7,8] [9].
        assert_eq!(rank_part(10, 3, 0, 1), (0..10).collect::<Vec<_>>());
        assert_eq!(rank_part(10, 3, 0, 2), vec![0, 1, 2, 6, 7, 8]);
        assert_eq!(rank_part(10, 3, 1, 2), vec![3, 4, 5, 9]);
        assert_eq!(rank_part(10, 3, 2, 3), vec![6, 7, 8]);
        assert!(rank_part(2, 3, 1, 2).is_empty());
    }

    #[test]
    fn confusion_counts_and_rates() {
        let mut confusion = Confusion::new(3);
        confusion.add(&[0, 0, 1, 2, 2, 2], &[0, 1, 1, 2, 0, 2], 6.0);
        let report = confusion.report();
        assert_eq!(report.samples, 6);
        assert_eq!(report.confusion, vec![vec![1, 1, 0], vec![0, 1, 0], vec![1, 0, 2]]);
        assert!((report.top1 - 4.0 / 6.0).abs() < 1e-12);
        assert_eq!(report.per_class[0], 0.5);
        assert_eq!(report.per_class[1], 1.0);
        assert!((report.per_class[2] - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(report.loss, 1.0);
    }
}
