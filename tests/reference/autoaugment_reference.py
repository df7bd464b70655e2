#!/usr/bin/env python3
"""torchvision's AutoAugment operations on PIL images, for tests/autoaugment_reference.rs.

Usage: python autoaugment_reference.py OUT_DIR

Writes the inputs OUT_DIR/input.png (37x53, not square), input_square.png (32x32: PIL's
90/270-degree rotate fast path only applies to square images), input_tiny.png (2x3: below the
3x3 smoothing kernel, a constant channel, equalize's degenerate histograms) and input_wide.png
(33000x3, for Pillow's floating-point affine path); one PNG per (input, op, magnitude); and
OUT_DIR/index.json with:
  cases:    input, op, magnitude (and its float64 bits, so nothing is lost to JSON), file;
  policies: AutoAugment._get_policies(policy) for imagenet, cifar10 and svhn;
  bins:     every augmentation space's magnitude bins (float64 bits) for several image sizes.

Each expected image comes from AutoAugment()._apply_image_or_video_transform itself, with
interpolation NEAREST and the transform's own fill (None, so 0): the exact code path
AutoAugment, RandAugment and TrivialAugmentWide take for a PIL image.
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np
import PIL
import PIL.Image
import torch
import torchvision
from torchvision.transforms.v2 import (
    AutoAugment,
    AutoAugmentPolicy,
    InterpolationMode,
    RandAugment,
    TrivialAugmentWide,
)


def f64_bits(value):
    return struct.unpack("<Q", struct.pack("<d", float(value)))[0]


def main_image():
    """37 wide, 53 high: gradients and noise; red stays inside [10, 240] and blue inside [60, 190]
    (so autocontrast really stretches them), green has saturated 0 and 255 blocks."""
    height, width = 53, 37
    y, x = np.mgrid[0:height, 0:width]
    noise = np.random.default_rng(20240611).integers(-25, 26, size=(height, width, 3))
    red = 10 + x * 230 // (width - 1) + noise[..., 0]
    green = y * 255 // (height - 1) + noise[..., 1] * 2
    blue = 60 + ((x * 5 + y * 3) % 131) + noise[..., 2] // 5
    image = np.stack([np.clip(red, 10, 240), np.clip(green, 0, 255), np.clip(blue, 60, 190)], axis=-1)
    image[5:11, 3:9, 1] = 255
    image[40:46, 20:31, 1] = 0
    return PIL.Image.fromarray(image.astype(np.uint8), "RGB")


def square_image():
    y, x = np.mgrid[0:32, 0:32]
    noise = np.random.default_rng(7).integers(0, 256, size=(32, 32, 3))
    image = np.stack([x * 8, y * 8, noise[..., 2]], axis=-1)
    image[::7, :, 0] = noise[::7, :, 0]
    return PIL.Image.fromarray(image.astype(np.uint8), "RGB")


def wide_image():
    """33000x3: Pillow samples in floating point instead of 16.16 fixed point once a corner maps
    beyond +-32768, which only happens with visible pixels on images this wide."""
    noise = np.random.default_rng(3).integers(0, 256, size=(3, 33000, 3))
    return PIL.Image.fromarray(noise.astype(np.uint8), "RGB")


# Geometric cases on the wide image; others would only repeat the small images' at length.
WIDE_MAGNITUDES = {"ShearX": [0.1, -0.001], "ShearY": [0.0005, -0.0001], "Rotate": [0.001, -0.002, 0.5]}


def tiny_image():
    pixels = [[(77, 0, 200), (77, 255, 13)], [(77, 128, 60), (77, 3, 250)], [(77, 90, 90), (77, 200, 1)]]
    return PIL.Image.fromarray(np.array(pixels, dtype=np.uint8), "RGB")


SPACES = [
    ("AutoAugment", AutoAugment, 10),
    ("RandAugment", RandAugment, 31),
    ("TrivialAugmentWide", TrivialAugmentWide, 31),
]

EXTRA_MAGNITUDES = {
    "Identity": [],
    "ShearX": [1.0, -1.0, 5.0, -5.0, 0.5, 1000.0, -1000.0, 1e6],
    "ShearY": [1.0, -1.0, 5.0, -5.0, 0.5, 1000.0, -1000.0, 1e6],
    "TranslateX": [1.0, -1.0, 36.0, 37.0, -37.0, 100.0, -100.0, 1e6],
    "TranslateY": [1.0, -1.0, 52.0, 53.0, -53.0, 100.0, -100.0],
    "Rotate": [45.0, -45.0, 90.0, -90.0, 180.0, -180.0, 270.0, -270.0, 360.0, 720.0, 1.0, -0.5],
    "Brightness": [-1.0, -0.5, 1.0, 1.5, 3.0],
    "Color": [-1.0, -0.5, 1.0, 1.5, 3.0],
    "Contrast": [-1.0, -0.5, 1.0, 1.5, 3.0],
    "Sharpness": [-1.0, -0.5, 1.0, 1.5, 3.0],
    "Posterize": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
    "Solarize": [0.5, 0.25, 1.5, 0.001],
    "AutoContrast": [],
    "Equalize": [],
    "Invert": [],
}


def magnitudes(op, height, width):
    """0 (except for Posterize, where PIL rejects 0 bits), every bin every space can draw for this
    image size (with both signs where the space negates), and a few extremes."""
    values = set() if op == "Posterize" else {0.0}
    for _, cls, num_bins in SPACES:
        if op in cls._AUGMENTATION_SPACE:
            bins_fn, signed = cls._AUGMENTATION_SPACE[op]
            bins = bins_fn(num_bins, height, width)
            if bins is None:
                continue
            for value in bins.tolist():
                values.add(float(value))
                if signed:
                    values.add(-float(value))
    values.update(EXTRA_MAGNITUDES[op])
    return sorted(values)


def space_bins():
    rows = []
    for name, cls, default_bins in SPACES:
        for num_bins in sorted({default_bins, 2, 5, 10, 31}):
            for height, width in [(53, 37), (32, 32), (3, 2), (224, 224), (331, 500), (1080, 1920)]:
                ops = []
                for op, (bins_fn, signed) in cls._AUGMENTATION_SPACE.items():
                    bins = bins_fn(num_bins, height, width)
                    values = None if bins is None else [f64_bits(float(v)) for v in bins.tolist()]
                    ops.append({"op": op, "signed": signed, "values_bits": values})
                rows.append({"space": name, "num_bins": num_bins, "height": height, "width": width, "ops": ops})
    return rows


def policies():
    tables = {}
    for name, policy in [
        ("imagenet", AutoAugmentPolicy.IMAGENET),
        ("cifar10", AutoAugmentPolicy.CIFAR10),
        ("svhn", AutoAugmentPolicy.SVHN),
    ]:
        table = AutoAugment(policy)._get_policies(policy)
        tables[name] = [
            [
                {"op": op, "probability": p, "probability_bits": f64_bits(p), "magnitude_id": m}
                for op, p, m in sub_policy
            ]
            for sub_policy in table
        ]
    return tables


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: autoaugment_reference.py OUT_DIR")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)

    augment = AutoAugment()
    inputs = {"main": ("input.png", main_image()), "square": ("input_square.png", square_image()),
              "tiny": ("input_tiny.png", tiny_image()), "wide": ("input_wide.png", wide_image())}
    cases = []
    for key, (file, image) in inputs.items():
        image.save(out / file)
        width, height = image.size
        for op in EXTRA_MAGNITUDES:
            if key == "wide":
                op_magnitudes = WIDE_MAGNITUDES.get(op, [])
            else:
                op_magnitudes = magnitudes(op, height, width)
            for number, magnitude in enumerate(op_magnitudes):
                result = augment._apply_image_or_video_transform(
                    image, op, magnitude, interpolation=InterpolationMode.NEAREST, fill=augment._fill
                )
                assert isinstance(result, PIL.Image.Image) and result.mode == "RGB" and result.size == image.size
                name = f"{key}_{op}_{number:03d}.png"
                result.save(out / name)
                cases.append({"input": key, "op": op, "magnitude": magnitude,
                              "magnitude_bits": f64_bits(magnitude), "file": name})

    index = {
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__, "pillow": PIL.__version__},
        "inputs": {key: file for key, (file, _) in inputs.items()},
        "cases": cases,
        "policies": policies(),
        "bins": space_bins(),
    }
    (out / "index.json").write_text(json.dumps(index, indent=1))


if __name__ == "__main__":
    main()
