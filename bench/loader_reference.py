"""The input pipeline the PyTorch tutorial uses, timed as `rtrain bench loader` times its own:
torchvision ImageFolder + DataLoader (PIL decoding), RandomResizedCrop + horizontal flip +
ToTensor + Normalize, shuffled, `--workers` worker processes (0: the main process). Prints one
JSON line. One warm-up batch (worker start-up) is not timed.

    .deps/venv/bin/python bench/loader_reference.py --data DIR/train --workers 1 --batches 20
"""
import argparse
import json
import resource
import time

import torch
from torchvision import datasets, transforms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, help="an ImageFolder split directory")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()

    torch.set_num_threads(1)
    transform = transforms.Compose([
        transforms.RandomResizedCrop(args.image_size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    dataset = datasets.ImageFolder(args.data, transform=transform)
    wanted = (args.batches + 1) * args.batch_size
    # Cycle a seeded permutation when the split is shorter than the run, as rtrain does.
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(dataset), generator=generator).tolist()
    order = (order * (wanted // len(order) + 1))[:wanted]
    extra = {"prefetch_factor": args.prefetch, "persistent_workers": False} if args.workers > 0 else {}
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=order,
                                         num_workers=args.workers, drop_last=True, **extra)
    batches = iter(loader)
    next(batches)
    started = time.perf_counter()
    images = 0
    for images_batch, _ in batches:
        images += images_batch.shape[0]
    seconds = time.perf_counter() - started
    rate = images / seconds
    # Peak RSS of this process and (separately) its largest worker.
    peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({
        "framework": "pytorch", "source": "image tree", "workers": args.workers,
        "image_size": args.image_size, "images": images, "seconds": seconds,
        "images_per_second": rate, "images_per_second_per_core": rate / max(args.workers, 1),
        "peak_rss_mib": peak_self, "peak_worker_rss_mib": peak_children,
    }))


if __name__ == "__main__":
    main()
