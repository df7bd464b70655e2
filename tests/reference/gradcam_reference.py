"""Grad-CAM by the `grad-cam` package (pytorch-grad-cam) for the images `rtrain explain`
explained, on the torchvision ResNet that `rtrain export` wrote, from the same preprocessed
input (the `input` tensor in each of explain's map files) and for the same class.

Usage: python gradcam_reference.py ARCH NUM_CLASSES WEIGHTS.safetensors HIDDEN LAYER OUT.safetensors MAP...
HIDDEN ("512", "64,32" or "" for torchvision's fc) replaces the head as the DesignSafe tutorial
does. OUT gets, per MAP in order, `cam_<i>`: the package's map before upsampling, as its
`scale_cam_image` normalises it to [0, 1] (its resize to the input's size turned off), and
`probabilities_<i>`: torchvision's softmax for that input.
"""
import sys

import torch
import torchvision
from pytorch_grad_cam import GradCAM
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def model_of(arch, num_classes, weights, hidden):
    model = getattr(torchvision.models, arch)(weights=None, num_classes=num_classes)
    if hidden:
        layers, width = [], model.fc.in_features
        for next_width in map(int, hidden.split(",")):
            layers += [torch.nn.Linear(width, next_width), torch.nn.ReLU()]
            width = next_width
        model.fc = torch.nn.Sequential(*layers, torch.nn.Linear(width, num_classes))
    model.load_state_dict(load_file(weights), strict=True)
    return model.eval()


def main(arch, num_classes, weights, hidden, layer, out, *maps):
    model = model_of(arch, int(num_classes), weights, hidden)
    cam = GradCAM(model=model, target_layers=[getattr(model, layer)[-1]])
    # With no target size, compute_cam_per_layer normalises the map without resizing it.
    cam.get_target_width_height = lambda input_tensor: None
    results = {}
    for i, path in enumerate(maps):
        with safe_open(path, "pt") as f:
            class_index = int(f.metadata()["class_index"])
            image = f.get_tensor("input").unsqueeze(0)
        grayscale = cam(input_tensor=image, targets=[ClassifierOutputTarget(class_index)])
        results[f"cam_{i}"] = torch.from_numpy(grayscale[0]).contiguous()
        with torch.no_grad():
            results[f"probabilities_{i}"] = model(image).softmax(-1)[0].contiguous()
    save_file(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
