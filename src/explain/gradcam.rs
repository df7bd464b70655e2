//! Grad-CAM (Selvaraju et al. 2017): where in an image a class's score comes from. The
//! activations of a stage are weighted, channel by channel, by the mean gradient of the class's
//! logit with respect to them, summed over channels and clipped at zero; computed as the
//! `grad-cam` package (pytorch-grad-cam) computes it for a torchvision ResNet's `layerN[-1]`,
//! in fp32, and drawn as its `show_cam_on_image` draws it: jet colours over the image, half
//! and half.

use image::{Rgb, RgbImage};
use tch::{Kind, Tensor};

use crate::data::transforms::{IMAGENET_MEAN, IMAGENET_STD};
use crate::model::Model;

/// One image's Grad-CAM for one class.
pub struct GradCam {
    /// The map at the stage's resolution (7x7 from `layer4` of a 224-pixel input), after the
    /// ReLU and before any normalisation or upsampling.
    pub map: Tensor,
    /// The class explained: the one asked for, or the predicted one.
    pub class: usize,
    /// The model's softmax over the classes for this image.
    pub probabilities: Vec<f32>,
}

/// Grad-CAM of `class` (default: the predicted class) at stage `stage` (1-4, torchvision's
/// `layer1`-`layer4`) for `input`, one image of shape `[1, 3, H, W]`, in evaluation mode.
pub fn grad_cam(
    model: &Model,
    input: &Tensor,
    stage: usize,
    class: Option<usize>,
) -> Result<GradCam, tch::TchError> {
    // Only the part of the network after the stage needs a graph: the stage's output becomes
    // the leaf the gradient is taken with respect to (as torch.autograd.grad, the model's own
    // parameters receive nothing).
    let activations = tch::no_grad(|| model.stage_output(input, stage)).detach().set_requires_grad(true);
    let logits = model.logits_from_stage(&activations, stage);
    let probabilities: Vec<f32> = Vec::try_from(logits.detach().softmax(-1, Kind::Float).view([-1]))?;
    let predicted = crate::metrics::argmax(&probabilities);
    let class = class.unwrap_or(predicted);
    let score = logits.f_select(1, class as i64)?.f_sum(Kind::Float)?;
    let gradients = Tensor::f_run_backward(&[score], &[&activations], false, false)?;
    let weights = gradients[0].f_mean_dim([2, 3].as_slice(), true, Kind::Float)?;
    let map = (weights * activations.detach())
        .f_sum_dim_intlist([1].as_slice(), false, Kind::Float)?
        .f_relu()?
        .f_squeeze_dim(0)?;
    Ok(GradCam { map, class, probabilities })
}

/// `map` scaled to [0, 1] as pytorch-grad-cam's `scale_cam_image` scales it:
/// `(m - min) / (1e-7 + max(m - min))`.
pub fn normalised(map: &Tensor) -> Tensor {
    let shifted = map - map.min();
    &shifted / (shifted.max() + 1e-7)
}

/// The image as the model saw it (`pixels`: its `3 x size x size` input, ImageNet-normalised
/// when `normalize`) under the map's jet colours, upsampled bilinearly to the image's size.
pub fn overlay(pixels: &[f32], size: u32, normalize: bool, map: &Tensor) -> Result<RgbImage, tch::TchError> {
    let (height, width) = (map.size()[0], map.size()[1]);
    let side = i64::from(size);
    let upsampled = normalised(map)
        .f_view([1, 1, height, width])?
        .f_upsample_bilinear2d([side, side].as_slice(), false, None, None)?
        .f_clamp(0.0, 1.0)?;
    let heat: Vec<f32> = Vec::try_from(upsampled.view([-1]))?;
    let plane = (side * side) as usize;
    let mut blended = vec![[0f32; 3]; plane];
    for (i, (slot, &value)) in blended.iter_mut().zip(&heat).enumerate() {
        let jet = jet(value);
        for c in 0..3 {
            let x = pixels[c * plane + i];
            let photo = if normalize { x * IMAGENET_STD[c] + IMAGENET_MEAN[c] } else { x };
            slot[c] = 0.5 * jet[c] + 0.5 * photo.clamp(0.0, 1.0);
        }
    }
    // show_cam_on_image divides by the brightest value, so the result spans the full range.
    let brightest = blended.iter().flatten().fold(f32::MIN_POSITIVE, |a, &b| a.max(b));
    Ok(RgbImage::from_fn(size, size, |x, y| {
        let value = blended[(y * size + x) as usize];
        Rgb(value.map(|v| (255.0 * v / brightest).round().clamp(0.0, 255.0) as u8))
    }))
}

/// The jet colour map (blue, cyan, yellow, red) at `value` in [0, 1], as RGB in [0, 1].
fn jet(value: f32) -> [f32; 3] {
    let ramp = |centre: f32| (1.5 - (4.0 * value - centre).abs()).clamp(0.0, 1.0);
    [ramp(3.0), ramp(2.0), ramp(1.0)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jet_runs_from_blue_through_green_to_red() {
        assert_eq!(jet(0.0), [0.0, 0.0, 0.5]);
        assert_eq!(jet(0.5), [0.5, 1.0, 0.5]);
        assert_eq!(jet(1.0), [0.5, 0.0, 0.0]);
    }

    #[test]
    fn normalised_maps_span_zero_to_one() {
        let map = Tensor::from_slice(&[2.0f32, 4.0, 6.0, 10.0]).view([2, 2]);
        let values: Vec<f32> = Vec::try_from(normalised(&map).view([-1])).unwrap();
        let expected = [0.0, 0.25, 0.5, 1.0];
        for (v, e) in values.iter().zip(expected) {
            assert!((v - e).abs() < 1e-6, "{values:?}");
        }
    }
}
