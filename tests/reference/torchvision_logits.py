"""Loads a state dict exported by `rtrain export` into torchvision's ResNet with a strict
load_state_dict, runs it in eval mode on the given input, and writes the logits.

Usage: python torchvision_logits.py ARCH NUM_CLASSES WEIGHTS.safetensors INPUT.safetensors OUT.safetensors
INPUT holds one tensor named "input" (N, 3, H, W); OUT gets "logits".
"""
import sys

import torch
import torchvision
from safetensors.torch import load_file, save_file


def main(arch, num_classes, weights, inputs, out):
    model = getattr(torchvision.models, arch)(weights=None, num_classes=int(num_classes))
    model.load_state_dict(load_file(weights), strict=True)
    model.eval()
    with torch.no_grad():
        logits = model(load_file(inputs)["input"])
    save_file({"logits": logits.contiguous()}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
