"""The obvious PyTorch way to classify a folder of photos, for bench/compare_predict.py.

    python predict_reference.py classify ARCH NUM_CLASSES WEIGHTS.safetensors SIZE WORKERS THREADS BATCH IMAGE_DIR
        A Dataset over the directory's files (sorted; Pillow open, convert("RGB"),
        Resize((SIZE, SIZE)), ToTensor: the tutorial's evaluation transform), a DataLoader with
        WORKERS worker processes and BATCH images per batch, torchvision's ARCH with the
        weights `rtrain export` wrote, torch.set_num_threads(THREADS), eval mode,
        torch.inference_mode(). Prints {"images", "seconds"} (the loop alone) as JSON.
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
    def __init__(self, root, size):
        self.paths = sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files)
        self.transform = transforms.Compose([transforms.Resize((size, size)), transforms.ToTensor()])

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        with Image.open(self.paths[index]) as image:
            return self.transform(image.convert("RGB"))


def model_of(arch, num_classes):
    model = getattr(torchvision.models, arch)(weights=None, num_classes=int(num_classes))
    model.eval()
    return model


def classify(arch, num_classes, weights, size, workers, threads, batch, root):
    from safetensors.torch import load_file

    torch.set_num_threads(int(threads))
    model = model_of(arch, num_classes)
    model.load_state_dict(load_file(weights), strict=True)
    dataset = Photos(root, int(size))
    loader = torch.utils.data.DataLoader(dataset, batch_size=int(batch), num_workers=int(workers))
    started = time.perf_counter()
    images = 0
    with torch.inference_mode():
        for batch_images in loader:
            model(batch_images).softmax(-1)
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
