"""The torchvision side of tests/trust.rs: logits and ensemble probabilities of models that
`rtrain export` (or `rtrain calibrate`) wrote, computed the obvious PyTorch way.

Usage:
  python trust_reference.py logits ARCH NUM_CLASSES SIZE WEIGHTS.safetensors IMAGE...
      torchvision's ARCH with the weights, strictly loaded, in eval mode, on Pillow's image
      turned upright (ImageOps.exif_transpose), Resize((SIZE, SIZE)), ToTensor,
      Normalize(ImageNet), in fp32. Prints {image: [logits]}.
  python trust_reference.py ensemble SPEC.json
      SPEC: {"arch", "num_classes", "size", "flip": bool, "images": [...],
             "members": [{"weights": PATH, "temperature": T}, ...]}.
      Each member's softmax(logits / T), averaged with that of the horizontally mirrored
      image when "flip" (timm's and mmdetection's flip TTA), then averaged over members
      (a deep ensemble). Prints {image: [probabilities]}.
"""
import json
import sys

import torch
import torchvision
from PIL import Image, ImageOps
from safetensors.torch import load_file
from torchvision import transforms


def model_of(arch, num_classes, weights):
    model = getattr(torchvision.models, arch)(weights=None, num_classes=int(num_classes))
    model.load_state_dict(load_file(weights), strict=True)
    model.eval()
    return model


def batch_of(images, size):
    transform = transforms.Compose(
        [
            transforms.Resize((int(size), int(size))),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    return torch.stack([transform(ImageOps.exif_transpose(Image.open(p)).convert("RGB")) for p in images])


def logits(arch, num_classes, size, weights, *images):
    model = model_of(arch, num_classes, weights)
    with torch.inference_mode():
        rows = model(batch_of(images, size)).double()
    print(json.dumps({path: row.tolist() for path, row in zip(images, rows)}))


def ensemble(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    batch = batch_of(spec["images"], spec["size"])
    views = [batch, torch.flip(batch, dims=[3])] if spec["flip"] else [batch]
    total = 0
    with torch.inference_mode():
        for member in spec["members"]:
            model = model_of(spec["arch"], spec["num_classes"], member["weights"])
            t = float(member["temperature"])
            total = total + sum((model(v).double() / t).softmax(-1) for v in views) / len(views)
    probabilities = total / len(spec["members"])
    print(json.dumps({path: row.tolist() for path, row in zip(spec["images"], probabilities)}))


if __name__ == "__main__":
    {"logits": logits, "ensemble": ensemble}[sys.argv[1]](*sys.argv[2:])
