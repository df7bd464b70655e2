"""Loads a state dict exported by `rtrain export` into torchvision's ResNet with a strict
load_state_dict, runs it in eval mode on the given input, and writes the logits.

Usage: python torchvision_logits.py ARCH NUM_CLASSES WEIGHTS.safetensors INPUT.safetensors OUT.safetensors [HIDDEN]
INPUT holds one tensor named "input" (N, 3, H, W); OUT gets "logits". HIDDEN ("512" or
"64,32") replaces the head as the DesignSafe tutorial does: model.fc = nn.Sequential(Linear,
ReLU, ..., Linear).
"""
import sys

import torch
import torchvision
from safetensors.torch import load_file, save_file


def main(arch, num_classes, weights, inputs, out, hidden=""):
    model = getattr(torchvision.models, arch)(weights=None, num_classes=int(num_classes))
    if hidden:
        layers, width = [], model.fc.in_features
        for next_width in map(int, hidden.split(",")):
            layers += [torch.nn.Linear(width, next_width), torch.nn.ReLU()]
            width = next_width
        model.fc = torch.nn.Sequential(*layers, torch.nn.Linear(width, int(num_classes)))
    model.load_state_dict(load_file(weights), strict=True)
    model.eval()
    with torch.no_grad():
        logits = model(load_file(inputs)["input"])
    save_file({"logits": logits.contiguous()}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
