"""The obvious PyTorch way (and with --best its best way) to classify a folder of photos, for
bench/compare_predict.py.

    python predict_reference.py classify [--best] ARCH NUM_CLASSES WEIGHTS.safetensors SIZE WORKERS THREADS BATCH IMAGE_DIR
        A Dataset over the directory's files (sorted; Pillow open, convert("RGB"),
        Resize((SIZE, SIZE)), ToTensor: the tutorial's evaluation transform), a DataLoader with
        WORKERS worker processes and BATCH images per batch, torchvision's ARCH with the
        weights `rtrain export` wrote, torch.set_num_threads(THREADS), eval mode,
        torch.inference_mode(). Prints {"images", "seconds"} (the loop alone) as JSON.
        --best: torchvision's best mode, each of the ways rtrain is faster done the PyTorch way
        too: Pillow's draft("RGB", (SIZE, SIZE)) before convert (a JPEG is decoded at the
        smallest DCT scale still at least SIZE x SIZE, as rtrain's data.jpeg_draft; other
        formats as before), torch.autocast("cpu", bfloat16), and the model and each batch in
        torch.channels_last.
    python predict_reference.py floor ARCH NUM_CLASSES SIZE THREADS BATCH BATCHES PRECISION
        The same model's forward pass alone on ready random tensors (BATCHES batches after one
        warm-up), fp32 or bf16 autocast: the floor any input pipeline adds to. Prints
        {"images", "seconds"}.
"""
import json
import os
import sys
import time

import torch
import torchvision
from PIL import Image
from torchvision import transforms


class Photos(torch.utils.data.Dataset):
    def __init__(self, root, size, draft=False):
        self.paths = sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files)
        self.size = size
        self.draft = draft
        self.transform = transforms.Compose([transforms.Resize((size, size)), transforms.ToTensor()])

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        with Image.open(self.paths[index]) as image:
            if self.draft:
                # JPEG only (a no-op for other formats): libjpeg's DCT scaling by 1/2, 1/4 or 1/8,
                # the smallest scale that leaves both sides at least `size`.
                image.draft("RGB", (self.size, self.size))
            return self.transform(image.convert("RGB"))


def model_of(arch, num_classes):
    model = getattr(torchvision.models, arch)(weights=None, num_classes=int(num_classes))
    model.eval()
    return model


def classify(*args):
    from safetensors.torch import load_file

    best = "--best" in args
    arch, num_classes, weights, size, workers, threads, batch, root = [a for a in args if a != "--best"]
    torch.set_num_threads(int(threads))
    model = model_of(arch, num_classes)
    model.load_state_dict(load_file(weights), strict=True)
    memory_format = torch.channels_last if best else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    dataset = Photos(root, int(size), draft=best)
    loader = torch.utils.data.DataLoader(dataset, batch_size=int(batch), num_workers=int(workers))
    started = time.perf_counter()
    images = 0
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=best):
        for batch_images in loader:
            model(batch_images.contiguous(memory_format=memory_format)).float().softmax(-1)
            images += len(batch_images)
    print(json.dumps({"images": images, "seconds": time.perf_counter() - started}))


def floor(arch, num_classes, size, threads, batch, batches, precision):
    torch.set_num_threads(int(threads))
    model = model_of(arch, num_classes)
    inputs = torch.rand(int(batch), 3, int(size), int(size))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        model(inputs)
        started = time.perf_counter()
        for _ in range(int(batches)):
            model(inputs).float().softmax(-1)
        seconds = time.perf_counter() - started
    print(json.dumps({"images": int(batch) * int(batches), "seconds": seconds}))


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    {"classify": classify, "floor": floor}[command](*args)
