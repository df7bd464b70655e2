//! The ResNet layers, torchvision's v1.5 design and names (`conv1`, `layer3.1.bn2`,
//! `layer2.0.downsample.0`, `fc`), with its in-place ReLU and residual addition.
//!
//! tch ships ResNets too, but they allocate a fresh tensor for every ReLU and residual sum;
//! doing those in place, as torchvision does, saves an allocation and a pass over each
//! activation. In place is safe for autograd where torchvision does it: after BatchNorm, whose
//! backward pass does not read its output.

use tch::nn::{self, Conv2D, ModuleT};
use tch::Tensor;

use crate::model::batchnorm::{Norm, SyncGroup};

fn conv(p: nn::Path, c_in: i64, c_out: i64, kernel: i64, stride: i64) -> Conv2D {
    let config = nn::ConvConfig { stride, padding: kernel / 2, bias: false, ..Default::default() };
    nn::conv2d(p, c_in, c_out, kernel, config)
}

/// conv -> BatchNorm, the unit every block is made of.
#[derive(Debug)]
struct ConvBn {
    conv: Conv2D,
    bn: Norm,
}

impl ConvBn {
    fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
        self.bn.forward_t(&xs.apply(&self.conv), train)
    }
}

/// A residual block: `BasicBlock` (two 3x3) or `Bottleneck` (1x1, 3x3 with the stride, 1x1).
#[derive(Debug)]
struct Block {
    convs: Vec<ConvBn>,
    downsample: Option<ConvBn>,
}

impl Block {
    fn new(
        p: &nn::Path,
        c_in: i64,
        width: i64,
        stride: i64,
        bottleneck: bool,
        sync: &SyncGroup,
    ) -> (Block, i64) {
        let (shapes, c_out): (Vec<(i64, i64, i64, i64)>, i64) = if bottleneck {
            (vec![(c_in, width, 1, 1), (width, width, 3, stride), (width, 4 * width, 1, 1)], 4 * width)
        } else {
            (vec![(c_in, width, 3, stride), (width, width, 3, 1)], width)
        };
        let convs = shapes
            .into_iter()
            .enumerate()
            .map(|(i, (a, b, k, s))| ConvBn {
                conv: conv(p / format!("conv{}", i + 1), a, b, k, s),
                bn: Norm::new(p / format!("bn{}", i + 1), b, sync),
            })
            .collect();
        let downsample = (stride != 1 || c_in != c_out).then(|| ConvBn {
            conv: conv(p / "downsample" / "0", c_in, c_out, 1, stride),
            bn: Norm::new(p / "downsample" / "1", c_out, sync),
        });
        (Block { convs, downsample }, c_out)
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
        let last = self.convs.len() - 1;
        let mut out = xs.shallow_clone();
        for (i, unit) in self.convs.iter().enumerate() {
            out = unit.forward(&out, train);
            if i < last {
                let _ = out.relu_();
            }
        }
        match &self.downsample {
            Some(unit) => out += unit.forward(xs, train),
            None => out += xs,
        }
        let _ = out.relu_();
        out
    }
}

#[derive(Debug)]
pub struct ResNet {
    conv1: Conv2D,
    bn1: Norm,
    layers: Vec<Vec<Block>>,
    /// torchvision's `fc`: one Linear, or with hidden widths an `nn.Sequential` of Linear and
    /// ReLU layers whose Linear ones are `fc.0`, `fc.2`, ... (the ReLUs hold no tensors).
    fc: nn::Sequential,
}

impl ResNet {
    /// `blocks` per stage, e.g. [2, 2, 2, 2] for ResNet-18; `bottleneck` for ResNet-50 and up.
    /// Every BatchNorm layer shares `sync`, which turns them into SyncBatchNorm once set.
    pub fn new(
        p: &nn::Path,
        blocks: [usize; 4],
        bottleneck: bool,
        num_classes: i64,
        head_hidden: &[i64],
        sync: &SyncGroup,
    ) -> ResNet {
        let mut channels = 64;
        let mut layers = Vec::new();
        for (stage, &count) in blocks.iter().enumerate() {
            let width = 64 << stage;
            let layer = p / format!("layer{}", stage + 1);
            let mut stage_blocks = Vec::new();
            for index in 0..count {
                let stride = if index == 0 && stage > 0 { 2 } else { 1 };
                let (block, c_out) =
                    Block::new(&(&layer / index.to_string()), channels, width, stride, bottleneck, sync);
                channels = c_out;
                stage_blocks.push(block);
            }
            layers.push(stage_blocks);
        }
        ResNet {
            conv1: conv(p / "conv1", 3, 64, 7, 2),
            bn1: Norm::new(p / "bn1", 64, sync),
            layers,
            fc: head(&(p / "fc"), channels, head_hidden, num_classes),
        }
    }
}

/// The classifier head: `Linear(channels, num_classes)` as `fc`, or Linear-ReLU layers of the
/// `hidden` widths then the classifier, as `nn.Sequential` indexes them.
fn head(p: &nn::Path, channels: i64, hidden: &[i64], num_classes: i64) -> nn::Sequential {
    if hidden.is_empty() {
        return nn::seq().add(nn::linear(p, channels, num_classes, Default::default()));
    }
    let mut seq = nn::seq();
    let mut width = channels;
    for (i, &next) in hidden.iter().enumerate() {
        seq = seq
            .add(nn::linear(p / (2 * i).to_string(), width, next, Default::default()))
            .add_fn(|x| x.relu());
        width = next;
    }
    seq.add(nn::linear(p / (2 * hidden.len()).to_string(), width, num_classes, Default::default()))
}

impl ResNet {
    /// The output of stage `stage` (1 is torchvision's `layer1`, 4 its `layer4`; 0 the stem's
    /// max-pooled output), the activations Grad-CAM weighs.
    pub fn stage_output(&self, xs: &Tensor, stage: usize, train: bool) -> Tensor {
        let mut out = self.bn1.forward_t(&xs.apply(&self.conv1), train);
        let _ = out.relu_();
        let mut out = out.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false);
        for block in self.layers[..stage].iter().flatten() {
            out = block.forward(&out, train);
        }
        out
    }

    /// The logits from stage `stage`'s output: the later stages, pooling and the head. Nothing
    /// here writes into `activations`, so they may be a leaf that requires a gradient.
    pub fn logits_from_stage(&self, activations: &Tensor, stage: usize, train: bool) -> Tensor {
        let mut out = activations.shallow_clone();
        for block in self.layers[stage..].iter().flatten() {
            out = block.forward(&out, train);
        }
        out.adaptive_avg_pool2d([1, 1]).flatten(1, -1).apply(&self.fc)
    }
}

impl ModuleT for ResNet {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        self.logits_from_stage(&self.stage_output(xs, 0, train), 0, train)
    }
}
