//! Arithmetic cost of the ResNets, counted from their shapes: how much work one training step
//! is, so a measured step rate can be set against the machine's attainable rate
//! (`rtrain bench peak`) and the share of it that training reaches (`rtrain bench step`).
//!
//! Counted as torchvision counts its published "GFLOPS": multiply-accumulates of convolutions
//! and the classifier, with BatchNorm, ReLU, pooling and the residual additions left out (they
//! are under 1% of the total). A floating-point operation is half a multiply-accumulate, and a
//! training step costs about three forward passes (the backward pass computes gradients with
//! respect to both inputs and weights, each as large as the forward).

use crate::model::Arch;

/// Multiply-accumulates of one convolution: its output's elements times its kernel's.
fn conv_macs(c_in: u64, c_out: u64, kernel: u64, out_side: u64) -> u64 {
    c_in * c_out * kernel * kernel * out_side * out_side
}

/// Side of a convolution's or pooling's output.
fn out_side(side: u64, kernel: u64, stride: u64, padding: u64) -> u64 {
    (side + 2 * padding - kernel) / stride + 1
}

/// Multiply-accumulates of one forward pass of one `image_size`² image through `arch` with
/// `num_classes` outputs.
pub fn forward_macs(arch: Arch, image_size: u64, num_classes: u64) -> u64 {
    let (blocks, bottleneck) = match arch {
        Arch::Resnet18 => ([2, 2, 2, 2], false),
        Arch::Resnet34 => ([3, 4, 6, 3], false),
        Arch::Resnet50 => ([3, 4, 6, 3], true),
        Arch::Resnet101 => ([3, 4, 23, 3], true),
        Arch::Resnet152 => ([3, 8, 36, 3], true),
    };
    let expansion = if bottleneck { 4 } else { 1 };
    let mut side = out_side(image_size, 7, 2, 3);
    let mut macs = conv_macs(3, 64, 7, side);
    side = out_side(side, 3, 2, 1); // max pool
    let mut channels = 64;
    for (stage, &count) in blocks.iter().enumerate() {
        let planes = 64u64 << stage;
        for block in 0..count {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            let out = out_side(side, 3, stride, 1);
            if bottleneck {
                // torchvision v1.5: the stride is on the 3x3 convolution.
                macs += conv_macs(channels, planes, 1, side);
                macs += conv_macs(planes, planes, 3, out);
                macs += conv_macs(planes, planes * expansion, 1, out);
            } else {
                macs += conv_macs(channels, planes, 3, out);
                macs += conv_macs(planes, planes, 3, out);
            }
            if stride != 1 || channels != planes * expansion {
                macs += conv_macs(channels, planes * expansion, 1, out);
            }
            channels = planes * expansion;
            side = out;
        }
    }
    macs + channels * num_classes
}

/// Floating-point operations of one training step (forward, backward, no optimizer) on a batch.
pub fn training_step_flops(arch: Arch, image_size: u64, batch_size: u64, num_classes: u64) -> f64 {
    3.0 * 2.0 * forward_macs(arch, image_size, num_classes) as f64 * batch_size as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// torchvision's model documentation lists these "GFLOPS" (multiply-accumulates) for its
    /// ImageNet weights at 224x224; an independent reference for the counting.
    #[test]
    fn forward_cost_matches_torchvisions_published_figures() {
        for (arch, published) in [
            (Arch::Resnet18, 1.81),
            (Arch::Resnet34, 3.66),
            (Arch::Resnet50, 4.09),
            (Arch::Resnet101, 7.80),
            (Arch::Resnet152, 11.51),
        ] {
            let ours = forward_macs(arch, 224, 1000) as f64 / 1e9;
            assert!((ours - published).abs() / published < 0.01, "{arch}: {ours:.3} vs {published}");
        }
    }

    #[test]
    fn cost_scales_with_pixels_and_batch() {
        // Every layer's output side halves when the input side does (224 -> 112 divides evenly
        // down to the 7x7 -> 4x4 last stage, which rounds up), so about a quarter of the work.
        let full = forward_macs(Arch::Resnet50, 224, 4) as f64;
        let half = forward_macs(Arch::Resnet50, 112, 4) as f64;
        assert!((half / full - 0.25).abs() < 0.05, "{}", half / full);
        let step = training_step_flops(Arch::Resnet18, 64, 32, 4);
        assert_eq!(step, 6.0 * 32.0 * forward_macs(Arch::Resnet18, 64, 4) as f64);
    }
}
