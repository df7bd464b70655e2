"""torchvision weights as PyTorch writes them, for rtrain's `.pth` reader and weight fetching.

Usage:
  python torchvision_pth.py write ARCH OUT_DIR
      torch.save()s the state dict of torchvision's ARCH (seeded, ImageNet-shaped: 1000
      classes) as OUT_DIR/ARCH-<first 8 hex digits of its sha256>.pth, the name torch.hub
      checks, and the same tensors as OUT_DIR/expected.safetensors; prints the .pth's name.
  python torchvision_pth.py published
      prints torchvision's published ResNet weights as JSON: {"resnet34": {"IMAGENET1K_V1":
      "resnet34-b627a593.pth"}, ...}.
"""
import hashlib
import json
import os
import sys

import torch
import torchvision
from safetensors.torch import save_file


def write(arch, out_dir):
    torch.manual_seed(7)
    model = getattr(torchvision.models, arch)(weights=None)
    # Train-mode statistics so the buffers are not just zeros and ones.
    model.train()
    with torch.no_grad():
        model(torch.randn(4, 3, 64, 64))
    state = model.state_dict()
    temporary = os.path.join(out_dir, "unnamed.pth")
    torch.save(state, temporary)
    with open(temporary, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    name = f"{arch}-{digest[:8]}.pth"
    os.replace(temporary, os.path.join(out_dir, name))
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(out_dir, "expected.safetensors"))
    print(name)


def published():
    table = {}
    for arch in ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]:
        weights = torchvision.models.get_model_weights(arch)
        table[arch] = {w.name: w.url.rsplit("/", 1)[1] for w in weights}
    print(json.dumps(table))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "published":
        published()
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}: expected write or published")
