"""Photos and what Pillow + torchvision make of them, for the DCT-scaled ("draft") decoding and
Exif orientation tests in tests/preprocessing_reference.rs.

  python draft_exif.py draft DIR
      DIR/<flavour>-<w>x<h>.jpg: photo-sized pictures in every JPEG flavour of
      pil_preprocess.py, and DIR/expected.safetensors with, per file and output size S,
      Pillow's `Image.draft("RGB", (S, S))` (libjpeg's DCT scaling, as rtrain's
      data.jpeg_draft) then torchvision's Resize((S, S)) + ToTensor.
  python draft_exif.py exif DIR
      DIR/orientation-<v>.jpg for every Exif orientation v in 1..8 (the same stored pixels,
      tagged v), and DIR/expected.safetensors with, per v: `upright/<v>`, the pixels of
      `ImageOps.exif_transpose` (H x W x 3, uint8); `resize/<v>`, Resize((24, 24)) + ToTensor of
      them; `crop/<v>`, resized_crop(top 3, left 5, height 20, width 14, [16, 16]) + ToTensor.
"""
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from safetensors.torch import save_file
from torchvision.transforms import functional as F

from pil_preprocess import FLAVOURS, picture

DRAFT_SIZES = [(1200, 800), (808, 1208)]
DRAFT_OUTPUTS = [100, 244, 300]


def draft(out):
    expected = {}
    for index, (flavour, options) in enumerate(FLAVOURS.items()):
        if options["format"] != "JPEG":
            continue
        for width, height in DRAFT_SIZES:
            options = dict(options)
            image = picture(width, height, index)
            if options.pop("mode", None) == "L":
                image = image.convert("L")
            file = out / f"{flavour}-{width}x{height}.jpg"
            image.save(file, **options)
            for size in DRAFT_OUTPUTS:
                with Image.open(file) as im:
                    im.draft("RGB", (size, size))
                    rgb = im.convert("RGB")
                expected[f"{file.stem}/{size}"] = F.to_tensor(F.resize(rgb, [size, size])).contiguous()
    save_file(expected, out / "expected.safetensors")


def exif(out):
    expected = {}
    stored = picture(60, 36, 5)
    for value in range(1, 9):
        file = out / f"orientation-{value}.jpg"
        tags = Image.Exif()
        tags[0x0112] = value
        stored.save(file, quality=92, exif=tags.tobytes())
        with Image.open(file) as im:
            upright = ImageOps.exif_transpose(im).convert("RGB")
        expected[f"upright/{value}"] = torch.from_numpy(np.asarray(upright).copy())
        expected[f"resize/{value}"] = F.to_tensor(F.resize(upright, [24, 24])).contiguous()
        expected[f"crop/{value}"] = F.to_tensor(F.resized_crop(upright, 3, 5, 20, 14, [16, 16])).contiguous()
    save_file(expected, out / "expected.safetensors")


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    {"draft": draft, "exif": exif}[mode](out)
