//! ResNet-18/34/50/101/152 with torchvision's parameter names, initialisation and state dicts.
//!
//! The layers are in `resnet.rs`. This module adds what a training tool needs around them: torchvision's
//! initialisation, loading a torchvision `.safetensors` state dict (re-initialising the head
//! when the class count differs), freezing the backbone, and exporting a state dict that
//! `torchvision.models.resnetXX(num_classes=K).load_state_dict` accepts as is.

pub mod batchnorm;
pub mod flops;
pub mod precision;
pub mod resnet;
pub mod weights;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::batchnorm::{SumOverRanks, SyncGroup};
use crate::model::resnet::ResNet;
use crate::util::files::{self, FileError};
use tch::nn::{ModuleT, VarStore};
use tch::{Device, Kind, Tensor};

/// The classifier head's prefix in torchvision's ResNets.
const HEAD_PREFIX: &str = "fc.";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Resnet18,
    Resnet34,
    Resnet50,
    Resnet101,
    Resnet152,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Resnet18 => "resnet18",
            Arch::Resnet34 => "resnet34",
            Arch::Resnet50 => "resnet50",
            Arch::Resnet101 => "resnet101",
            Arch::Resnet152 => "resnet152",
        }
    }

    pub fn parse(name: &str) -> Option<Arch> {
        [Arch::Resnet18, Arch::Resnet34, Arch::Resnet50, Arch::Resnet101, Arch::Resnet152]
            .into_iter()
            .find(|arch| arch.name() == name)
    }

    /// Blocks per stage (`layer1` to `layer4`), as torchvision's constructors give them.
    fn blocks(self) -> [usize; 4] {
        match self {
            Arch::Resnet18 => [2, 2, 2, 2],
            Arch::Resnet34 | Arch::Resnet50 => [3, 4, 6, 3],
            Arch::Resnet101 => [3, 4, 23, 3],
            Arch::Resnet152 => [3, 8, 36, 3],
        }
    }

    /// Bottleneck blocks (1x1, 3x3, 1x1) rather than BasicBlocks (two 3x3).
    fn bottleneck(self) -> bool {
        !matches!(self, Arch::Resnet18 | Arch::Resnet34)
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: tch::TchError },
    #[error("{path}: not a {arch} state dict: {problems}")]
    Incompatible { path: PathBuf, arch: Arch, problems: String },
    #[error("model {arch} with {num_classes} classes: {source}")]
    Torch { arch: Arch, num_classes: usize, source: tch::TchError },
    /// Boxed: a failed download's error is large, and every result that can hold a
    /// ModelError would carry its size.
    #[error(transparent)]
    Weights(Box<weights::WeightsError>),
}

impl From<weights::WeightsError> for ModelError {
    fn from(error: weights::WeightsError) -> Self {
        ModelError::Weights(Box::new(error))
    }
}

/// What loading a pretrained state dict did, for the log.
#[derive(Debug, Default, PartialEq)]
pub struct LoadReport {
    pub loaded: usize,
    /// Head tensors left at their fresh initialisation because their shape differs.
    pub reinitialised: Vec<String>,
    /// torchvision's `num_batches_tracked` counters, which tch's BatchNorm does not keep, and
    /// the file's head tensors that this model's head has no place for.
    pub ignored: Vec<String>,
}

pub struct Model {
    pub arch: Arch,
    pub num_classes: usize,
    /// The MLP head's hidden widths (`model.head_hidden`); empty for torchvision's `fc`.
    pub head_hidden: Vec<usize>,
    pub vs: VarStore,
    net: ResNet,
    /// Set by [`Model::sync_batchnorm`]: the job whose batches BatchNorm's statistics cover.
    sync: SyncGroup,
    /// BatchNorm uses its running statistics even in training (see `freeze_batchnorm`).
    batchnorm_frozen: bool,
}

impl Model {
    /// A freshly initialised model; call `tch::manual_seed` first for a reproducible init.
    pub fn new(arch: Arch, num_classes: usize, device: Device) -> Result<Model, ModelError> {
        Model::with_head(arch, num_classes, &[], device)
    }

    /// [`Model::new`] with an MLP head of the `head_hidden` widths (see `model.head_hidden`).
    pub fn with_head(
        arch: Arch,
        num_classes: usize,
        head_hidden: &[usize],
        device: Device,
    ) -> Result<Model, ModelError> {
        let torch_err = |source| ModelError::Torch { arch, num_classes, source };
        let classes = i64::try_from(num_classes)
            .map_err(|_| torch_err(tch::TchError::Convert("class count".into())))?;
        let vs = VarStore::new(device);
        let root = vs.root();
        let hidden: Vec<i64> = head_hidden.iter().map(|&w| i64::try_from(w).unwrap_or(i64::MAX)).collect();
        let sync = SyncGroup::default();
        let net = ResNet::new(&root, arch.blocks(), arch.bottleneck(), classes, &hidden, &sync);
        let model = Model {
            arch,
            num_classes,
            head_hidden: head_hidden.to_vec(),
            vs,
            net,
            sync,
            batchnorm_frozen: false,
        };
        model.init_like_torchvision().map_err(torch_err)?;
        Ok(model)
    }

    /// torchvision initialises convolutions with kaiming_normal_(mode="fan_out",
    /// nonlinearity="relu") and BatchNorm with weight 1, bias 0; the head keeps nn.Linear's
    /// default, which tch's linear layer already uses.
    fn init_like_torchvision(&self) -> Result<(), tch::TchError> {
        tch::no_grad(|| {
            for (name, mut tensor) in self.state_dict() {
                let size = tensor.size();
                let is_weight = name.ends_with(".weight");
                if size.len() == 4 && is_weight {
                    let fan_out = (size[0] * size[2] * size[3]) as f64;
                    let _ = tensor.f_normal_(0.0, (2.0 / fan_out).sqrt())?;
                } else if size.len() == 1 && is_weight {
                    // BatchNorm scale: tch draws it uniformly from [0, 1); torchvision uses 1.
                    let _ = tensor.f_fill_(1.0)?;
                } else if size.len() == 1 && name.ends_with(".bias") && !name.starts_with(HEAD_PREFIX) {
                    let _ = tensor.f_zero_()?;
                }
            }
            Ok(())
        })
    }

    /// SyncBatchNorm (`model.sync_batchnorm`): from now on, BatchNorm in training mode takes its
    /// statistics over the batches of every rank, summing per-channel values with
    /// `sum_over_ranks` (which every rank must reach in the same order).
    pub fn sync_batchnorm(&self, sum_over_ranks: SumOverRanks) {
        // Set once per model; a second call keeps the first, which serves the same job.
        let _ = self.sync.set(sum_over_ranks);
    }

    pub fn forward_t(&self, images: &Tensor, train: bool) -> Tensor {
        // The flag only switches BatchNorm between batch and running statistics (no dropout).
        self.net.forward_t(images, train && !self.batchnorm_frozen)
    }

    /// Evaluation mode's output of stage `stage` (1-4: torchvision's `layer1`-`layer4`).
    pub fn stage_output(&self, images: &Tensor, stage: usize) -> Tensor {
        self.net.stage_output(images, stage, false)
    }

    /// Evaluation mode's logits from the output of stage `stage` (see [`Model::stage_output`]).
    pub fn logits_from_stage(&self, activations: &Tensor, stage: usize) -> Tensor {
        self.net.logits_from_stage(activations, stage, false)
    }

    /// Every parameter and buffer, sorted by name (torchvision's names).
    pub fn state_dict(&self) -> BTreeMap<String, Tensor> {
        self.vs.variables().into_iter().collect()
    }

    /// Parameters that receive gradients, sorted by name.
    pub fn trainable(&self) -> Vec<(String, Tensor)> {
        self.state_dict().into_iter().filter(|(_, t)| t.requires_grad()).collect()
    }

    /// BatchNorm as torchvision's FrozenBatchNorm2d: normalise with the running statistics,
    /// never update them, and stop training its scale and shift (every 1-d parameter outside
    /// the head is a BatchNorm one in a ResNet).
    pub fn freeze_batchnorm(&mut self) {
        self.batchnorm_frozen = true;
        for (name, tensor) in self.state_dict() {
            if tensor.dim() == 1 && !name.starts_with(HEAD_PREFIX) && tensor.requires_grad() {
                let _ = tensor.set_requires_grad(false);
            }
        }
    }

    /// torchvision's `zero_init_residual`: the last BatchNorm scale of every residual block
    /// (`bn2` of a BasicBlock, `bn3` of a Bottleneck) starts at zero, so each block starts as
    /// the identity and the network as a shallow one (Goyal et al. 2017). Call before loading
    /// starting weights, which replace it.
    pub fn zero_init_residual(&self) -> Result<(), ModelError> {
        let last_bn = if self.arch.bottleneck() { ".bn3.weight" } else { ".bn2.weight" };
        tch::no_grad(|| {
            for (name, mut tensor) in self.state_dict() {
                if name.starts_with("layer") && name.ends_with(last_bn) {
                    let _ = tensor.f_zero_()?;
                }
            }
            Ok(())
        })
        .map_err(|source| ModelError::Torch {
            arch: self.arch,
            num_classes: self.num_classes,
            source,
        })
    }

    /// Stops gradients for everything but the classifier head.
    pub fn freeze_backbone(&self) {
        for (name, tensor) in self.state_dict() {
            if !name.starts_with(HEAD_PREFIX) && tensor.requires_grad() {
                let _ = tensor.set_requires_grad(false);
            }
        }
    }

    /// Loads a torchvision-format state dict, from safetensors or a `torch.save` `.pth`. Tensors
    /// of the head whose shape differs (another class count) keep their fresh initialisation;
    /// any other missing, extra or mismatched tensor is an error, since it means the file is
    /// for another architecture.
    pub fn load_pretrained(&self, path: &Path) -> Result<LoadReport, ModelError> {
        let mut file = weights::read_state_dict(path)?;
        let mut report = LoadReport::default();
        let mut problems = Vec::new();
        let mut pairs = Vec::new();
        for (name, tensor) in self.state_dict() {
            match file.remove(&name) {
                Some(source) if source.size() == tensor.size() => pairs.push((tensor, source)),
                Some(source) if name.starts_with(HEAD_PREFIX) => {
                    let _ = source;
                    report.reinitialised.push(name);
                }
                Some(source) => problems.push(format!(
                    "{name} has shape {:?}, expected {:?}",
                    source.size(),
                    tensor.size()
                )),
                None if name.starts_with(HEAD_PREFIX) => report.reinitialised.push(name),
                None => problems.push(format!("{name} is missing")),
            }
        }
        for name in file.keys() {
            // The file's own head (e.g. ImageNet's `fc`) where this model has another shape of
            // head (an MLP's `fc.0`, `fc.2`): replaced, as torchvision users replace `model.fc`.
            if name.ends_with(".num_batches_tracked") || name.starts_with(HEAD_PREFIX) {
                report.ignored.push(name.clone());
            } else {
                problems.push(format!("unexpected key {name}"));
            }
        }
        if !problems.is_empty() {
            let shown = problems.iter().take(5).cloned().collect::<Vec<_>>().join("; ");
            let more = problems.len().saturating_sub(5);
            let problems = if more > 0 { format!("{shown}; and {more} more") } else { shown };
            return Err(ModelError::Incompatible { path: path.to_path_buf(), arch: self.arch, problems });
        }
        tch::no_grad(|| {
            for (mut target, source) in pairs {
                target
                    .f_copy_(&source.to_kind(target.kind()))
                    .map_err(|source| ModelError::Read { path: path.to_path_buf(), source })?;
                report.loaded += 1;
            }
            Ok::<_, ModelError>(())
        })?;
        Ok(report)
    }

    /// The state dict as torchvision names it, with the `num_batches_tracked` buffers tch does
    /// not keep (strict `load_state_dict` requires them); `steps` is how many training steps
    /// updated BatchNorm, which is what torchvision counts there.
    pub fn torchvision_state_dict(&self, steps: u64) -> Vec<(String, Tensor)> {
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        for (name, tensor) in self.state_dict() {
            if let Some(prefix) = name.strip_suffix(".running_var") {
                let counter = Tensor::from(i64::try_from(steps).unwrap_or(i64::MAX));
                tensors.push((format!("{prefix}.num_batches_tracked"), counter));
            }
            tensors.push((name, tensor.detach().to_device(Device::Cpu).to_kind(Kind::Float).contiguous()));
        }
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        tensors
    }

    /// Copies saved tensors (a checkpoint's, read from `path`) into the model, which must find
    /// every one of its own among them.
    pub fn restore(&self, tensors: &BTreeMap<String, Tensor>, path: &Path) -> Result<(), ModelError> {
        tch::no_grad(|| {
            for (name, mut target) in self.state_dict() {
                let source = tensors.get(&name).ok_or_else(|| ModelError::Incompatible {
                    path: path.to_path_buf(),
                    arch: self.arch,
                    problems: format!("{name} is missing"),
                })?;
                target
                    .f_copy_(source)
                    .map_err(|source| ModelError::Read { path: path.to_path_buf(), source })?;
            }
            Ok(())
        })
    }

    /// Writes [`Self::torchvision_state_dict`] to a `.safetensors` file, atomically, with
    /// `metadata` in its header.
    pub fn write_torchvision(
        &self,
        path: &Path,
        steps: u64,
        metadata: Option<HashMap<String, String>>,
    ) -> Result<(), FileError> {
        files::write_safetensors(path, &self.torchvision_state_dict(steps), metadata).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_torchvision() {
        let model = Model::new(Arch::Resnet18, 4, Device::Cpu).unwrap();
        let names: Vec<String> = model.state_dict().into_keys().collect();
        // 62 parameters + 40 BatchNorm running statistics in torchvision's resnet18 (without
        // the 20 num_batches_tracked counters tch does not keep).
        assert_eq!(names.len(), 102);
        for expected in
            ["conv1.weight", "layer1.0.bn2.running_var", "layer2.0.downsample.0.weight", "fc.bias"]
        {
            assert!(names.iter().any(|n| n == expected), "missing {expected}");
        }
        assert_eq!(model.state_dict()["fc.weight"].size(), vec![4, 512]);
        let exported = model.torchvision_state_dict(7);
        assert_eq!(exported.len(), 122);
        let counter = &exported.iter().find(|(n, _)| n == "bn1.num_batches_tracked").unwrap().1;
        assert_eq!(counter.int64_value(&[]), 7);
    }

    #[test]
    fn conv_init_is_kaiming_fan_out() {
        tch::manual_seed(1);
        let model = Model::new(Arch::Resnet50, 10, Device::Cpu).unwrap();
        let weight = &model.state_dict()["layer3.0.conv2.weight"];
        let size = weight.size();
        let expected = (2.0 / (size[0] * size[2] * size[3]) as f64).sqrt();
        let std = weight.std(true).double_value(&[]);
        assert!((std - expected).abs() / expected < 0.02, "std {std} vs {expected}");
        assert_eq!(model.state_dict()["bn1.weight"].mean(Kind::Float).double_value(&[]), 1.0);
    }

    #[test]
    fn zero_init_residual_zeroes_each_blocks_last_batchnorm_scale() {
        // torchvision: Bottleneck's bn3, BasicBlock's bn2, in every block (8 in resnet18's
        // [2, 2, 2, 2], 16 in resnet50's [3, 4, 6, 3]); nothing else changes.
        for (arch, last, blocks) in [(Arch::Resnet18, "bn2", 8), (Arch::Resnet50, "bn3", 16)] {
            // One model, copied before: the global RNG is shared with tests running in parallel.
            let model = Model::new(arch, 5, Device::Cpu).unwrap();
            let reference: BTreeMap<String, Tensor> =
                model.state_dict().into_iter().map(|(name, tensor)| (name, tensor.copy())).collect();
            model.zero_init_residual().unwrap();
            let changed: Vec<String> = model
                .state_dict()
                .into_iter()
                .filter(|(name, tensor)| !tensor.equal(&reference[name]))
                .map(|(name, tensor)| {
                    assert_eq!(tensor.abs().sum(Kind::Float).double_value(&[]), 0.0, "{name}");
                    name
                })
                .collect();
            assert_eq!(changed.len(), blocks, "{arch}: {changed:?}");
            assert!(changed.iter().all(|name| name.ends_with(&format!(".{last}.weight"))), "{changed:?}");
            assert!(changed.contains(&format!("layer4.1.{last}.weight")), "{changed:?}");
        }
    }

    #[test]
    fn freeze_leaves_only_the_head() {
        let model = Model::new(Arch::Resnet18, 3, Device::Cpu).unwrap();
        model.freeze_backbone();
        let names: Vec<String> = model.trainable().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, vec!["fc.bias".to_string(), "fc.weight".to_string()]);
    }

    #[test]
    fn pretrained_with_other_head_reinitialises_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("source.safetensors");
        tch::manual_seed(3);
        let source = Model::new(Arch::Resnet18, 1000, Device::Cpu).unwrap();
        source.write_torchvision(&path, 5, None).unwrap();
        tch::manual_seed(4);
        let target = Model::new(Arch::Resnet18, 4, Device::Cpu).unwrap();
        let report = target.load_pretrained(&path).unwrap();
        assert_eq!(report.reinitialised, vec!["fc.bias".to_string(), "fc.weight".to_string()]);
        assert_eq!(report.loaded, 100);
        assert_eq!(report.ignored.len(), 20, "the num_batches_tracked counters");
        let (a, b) =
            (&source.state_dict()["layer4.1.conv2.weight"], &target.state_dict()["layer4.1.conv2.weight"]);
        assert!(a.equal(b));
    }

    #[test]
    fn an_mlp_head_is_named_as_nn_sequential_and_replaces_a_pretrained_fc() {
        let model = Model::with_head(Arch::Resnet34, 3, &[512], Device::Cpu).unwrap();
        let head: Vec<(String, Vec<i64>)> = model
            .state_dict()
            .into_iter()
            .filter(|(name, _)| name.starts_with(HEAD_PREFIX))
            .map(|(name, tensor)| (name, tensor.size()))
            .collect();
        let expected = [
            ("fc.0.bias", vec![512]),
            ("fc.0.weight", vec![512, 512]),
            ("fc.2.bias", vec![3]),
            ("fc.2.weight", vec![3, 512]),
        ];
        assert_eq!(head, expected.map(|(n, s)| (n.to_string(), s)));
        let logits = tch::no_grad(|| {
            model.forward_t(&Tensor::randn([2, 3, 32, 32], (Kind::Float, Device::Cpu)), false)
        });
        assert_eq!(logits.size(), [2, 3]);
        // ImageNet weights (a plain fc) into the tutorial's model: the backbone loads, the
        // file's fc is set aside, the MLP head keeps its fresh initialisation.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("imagenet.safetensors");
        Model::new(Arch::Resnet34, 1000, Device::Cpu).unwrap().write_torchvision(&path, 0, None).unwrap();
        let report = model.load_pretrained(&path).unwrap();
        assert_eq!(report.reinitialised, ["fc.0.bias", "fc.0.weight", "fc.2.bias", "fc.2.weight"]);
        assert!(
            report.ignored.contains(&"fc.weight".to_string())
                && report.ignored.contains(&"fc.bias".to_string())
        );
        model.freeze_backbone();
        let trainable: Vec<String> = model.trainable().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            trainable,
            ["fc.0.bias", "fc.0.weight", "fc.2.bias", "fc.2.weight"],
            "the whole head trains"
        );
    }

    #[test]
    fn pretrained_of_other_arch_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r34.safetensors");
        Model::new(Arch::Resnet34, 4, Device::Cpu).unwrap().write_torchvision(&path, 0, None).unwrap();
        let target = Model::new(Arch::Resnet18, 4, Device::Cpu).unwrap();
        let err = target.load_pretrained(&path).err().unwrap().to_string();
        assert!(err.contains("r34.safetensors") && err.contains("resnet18"), "{err}");
    }
}
