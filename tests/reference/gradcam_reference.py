"""Grad-CAM by the `grad-cam` package (pytorch-grad-cam) for the photos `rtrain explain`
explained, on the torchvision ResNet that `rtrain export` wrote, from torchvision's own
evaluation transform of each photo (Pillow's decode, Resize(RESIZE), CenterCrop(SIZE),
ToTensor, Normalize with ImageNet's mean and std) and for CLASS: a class index, or
"predicted" for the class torchvision's model predicts for that input.

Usage: python gradcam_reference.py ARCH NUM_CLASSES WEIGHTS.safetensors HIDDEN LAYER SIZE RESIZE CLASS OUT.safetensors PHOTO...
HIDDEN ("512", "64,32" or "" for torchvision's fc) replaces the head as the DesignSafe tutorial
does. OUT gets, per PHOTO in order, `cam_<i>`: the package's map before upsampling, as its
`scale_cam_image` normalises it to [0, 1] (its resize to the input's size turned off),
`probabilities_<i>`: torchvision's softmax for that input, `input_<i>`: the input, and
`class_<i>`: the class explained.
"""
import sys

import torch
import torchvision
from pytorch_grad_cam import GradCAM
from PIL import Image
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from safetensors.torch import load_file, save_file
from torchvision import transforms


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


def main(arch, num_classes, weights, hidden, layer, size, resize, class_, out, *photos):
    model = model_of(arch, int(num_classes), weights, hidden)
    cam = GradCAM(model=model, target_layers=[getattr(model, layer)[-1]])
    # With no target size, compute_cam_per_layer normalises the map without resizing it.
    cam.get_target_width_height = lambda input_tensor: None
    preprocess = transforms.Compose([
        transforms.Resize(int(resize)),
        transforms.CenterCrop(int(size)),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    results = {}
    for i, path in enumerate(photos):
        with open(path, "rb") as f:
            image = preprocess(Image.open(f).convert("RGB")).unsqueeze(0)
        with torch.no_grad():
            probabilities = model(image).softmax(-1)[0]
        class_index = int(probabilities.argmax()) if class_ == "predicted" else int(class_)
        grayscale = cam(input_tensor=image, targets=[ClassifierOutputTarget(class_index)])
        results[f"cam_{i}"] = torch.from_numpy(grayscale[0]).contiguous()
        results[f"probabilities_{i}"] = probabilities.contiguous()
        results[f"input_{i}"] = image[0].contiguous()
        results[f"class_{i}"] = torch.tensor([class_index])
    save_file(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
