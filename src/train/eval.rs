//! Evaluation: loss, top-1, per-class accuracy and the confusion matrix over a dataset split,
//! with the model in inference mode (BatchNorm running statistics, no gradients). With several
//! ranks each evaluates a disjoint strided part of the split and the counts are summed, so the
//! report covers every image exactly once.

use std::path::Path;
use std::sync::Arc;

use tch::{Kind, Reduction, Tensor};

use crate::cluster;
use crate::cluster::Communicator;
use crate::config::Config;
use crate::data::dataset::DataError;
use crate::data::dataset::Dataset;
use crate::data::loader::{EpochBatches, Loader, LoaderOptions};
use crate::data::transforms::Transform;
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
        }
    }
}

/// One evaluated image: its dataset index, true class and the probability of every class.
#[derive(Debug, Clone)]
pub struct ImageResult {
    pub index: usize,
    pub label: usize,
    pub probabilities: Vec<f64>,
}

/// Evaluates `model` on this rank's strided part of `dataset`, the counts summed over ranks; with
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
    let order: Vec<usize> = (topology.rank..dataset.len()).step_by(topology.world_size).collect();
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
                let probabilities =
                    logits.to_kind(Kind::Double).softmax(-1, Kind::Double).to_device(tch::Device::Cpu);
                let rows: Vec<Vec<f64>> = Vec::try_from(&probabilities).map_err(read_back)?;
                for ((&index, &label), probabilities) in batch.indices.iter().zip(&labels).zip(rows) {
                    kept.push(ImageResult { index, label: label as usize, probabilities });
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
/// checkpoint was taken after (known on rank 0; 0 elsewhere) and the report. A collective.
pub fn evaluate_best(
    plan: &RunPlan,
    num_classes: usize,
    split: &Arc<dyn Dataset>,
    comm: &dyn Communicator,
    best: &Path,
) -> Result<(u32, EvalReport), EvalError> {
    let arch = plan.config.model.arch;
    let model = Model::with_head(arch, num_classes, &plan.config.model.head_hidden, plan.compute.device)?;
    let mut epoch = 0;
    if comm.topology().is_root() {
        let checkpoint = checkpoint::load(best, Some((arch, num_classes)))?;
        model.restore(&checkpoint.model, best)?;
        epoch = checkpoint.meta.epoch;
    }
    plan.compute.prepare_model(&model)?;
    cluster::broadcast_from_root(comm, model.state_dict().into_values());
    Ok((epoch, evaluate_split(&model, split, plan, comm)?))
}

/// What `rtrain eval` found: the report, the checkpoint's class names, the dataset and each
/// image's result in dataset order.
pub struct CheckpointEvaluation {
    pub report: EvalReport,
    pub classes: Vec<String>,
    pub dataset: Arc<dyn Dataset>,
    pub images: Vec<ImageResult>,
}

/// `rtrain eval`: the checkpoint at `path` evaluated on `split` of the data root `root` (a
/// class-per-folder tree or a shard set), in one process on the CPU.
pub fn evaluate_checkpoint(
    config: &Config,
    path: &Path,
    root: &Path,
    split: &str,
) -> Result<CheckpointEvaluation, EvalError> {
    let plan = RunPlan::for_inference(config);
    let (model, meta) = checkpoint::load_model(path)?;
    meta.warn_if_size_differs(path, config.data.image_size);
    plan.compute.prepare_model(&model)?;
    let dataset = crate::data::open_split(root, split)?;
    if dataset.classes() != meta.classes {
        return Err(EvalError::Classes {
            dir: dataset.root().to_path_buf(),
            found: dataset.classes().to_vec(),
            expected: meta.classes,
        });
    }
    let mut images = Vec::with_capacity(dataset.len());
    let report = evaluate(
        &model,
        dataset.clone(),
        plan.eval_transform(),
        plan.eval_loader(),
        &plan.compute,
        cluster::single().as_ref(),
        Some(&mut images),
    )?;
    images.sort_by_key(|image| image.index);
    Ok(CheckpointEvaluation { report, classes: meta.classes, dataset, images })
}

#[cfg(test)]
mod tests {
    use super::*;

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
