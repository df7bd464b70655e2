"""Writes test images to DIR in several JPEG flavours and as PNG, and what torchvision + Pillow
make of each, for tests/preprocessing_reference.rs:

- DIR/<name>.jpg|png, the images;
- DIR/cases.json, one entry per (image, transform): the eval transform Resize(R) +
  CenterCrop(S), or resized_crop at given (top, left, height, width) to S x S, then a
  horizontal flip or not (the training transform with its random draws fixed);
- DIR/expected.safetensors, each case's output after ToTensor + Normalize(ImageNet).

Usage: python pil_preprocess.py DIR
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from torchvision import transforms as T
from torchvision.transforms import functional as F

NORMALISE = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


def picture(width, height, seed):
    """Gradients, a checkerboard and noise: every flavour of JPEG has work to do."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([np.sin(x / 7 + seed) * 90, np.cos(y / 5) * 90, ((x // 9 + y // 6) % 2) * 120], -1) + 128
    return Image.fromarray((base + rng.normal(0, 12, base.shape)).clip(0, 255).astype(np.uint8))


FLAVOURS = {
    "baseline-420": dict(format="JPEG", quality=90, subsampling=2),
    "baseline-422": dict(format="JPEG", quality=75, subsampling=1),
    "baseline-444": dict(format="JPEG", quality=95, subsampling=0),
    "progressive": dict(format="JPEG", quality=85, progressive=True),
    "grey": dict(format="JPEG", quality=90, mode="L"),
    "png": dict(format="PNG"),
}


def main(out):
    out = Path(out)
    cases, expected = [], {}
    for index, (flavour, options) in enumerate(FLAVOURS.items()):
        for width, height in [(173, 131), (96, 240)]:
            options = dict(options)
            image = picture(width, height, index)
            if options.pop("mode", None) == "L":
                image = image.convert("L")
            file = out / f"{flavour}-{width}x{height}.{'png' if options['format'] == 'PNG' else 'jpg'}"
            image.save(file, **options)
            # What torchvision's ImageFolder loader does.
            with open(file, "rb") as f:
                rgb = Image.open(f).convert("RGB")
            transforms = [("eval", dict(resize=40, size=32), lambda im: F.center_crop(F.resize(im, 40), 32))]
            for k, (top, left, h, w, flip) in enumerate(
                [(0, 0, height, width, False), (7, 13, 61, 45, True), (height - 50, width - 70, 50, 70, False),
                 (3, 2, 25, 90, True)]
            ):
                def crop(im, top=top, left=left, h=h, w=w, flip=flip):
                    im = F.resized_crop(im, top, left, h, w, [48, 48])
                    return F.hflip(im) if flip else im
                transforms.append((f"crop{k}", dict(crop=[top, left, h, w], flip=flip, size=48), crop))
            for name, params, transform in transforms:
                key = f"{file.stem}/{name}"
                expected[key] = NORMALISE(F.to_tensor(transform(rgb))).contiguous()
                cases.append(dict(key=key, file=file.name, **params))
    (out / "cases.json").write_text(json.dumps(cases, indent=1))
    save_file(expected, out / "expected.safetensors")


if __name__ == "__main__":
    main(*sys.argv[1:])
