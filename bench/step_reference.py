"""The PyTorch eager twin of `rtrain bench step`: torchvision ResNet, random input, the same
step (zero_grad, forward in train mode, cross-entropy, backward, SGD momentum 0.9 with weight
decay 5e-4), the same warm-up and timing, optionally under torch.autocast("cpu", bfloat16) and
in channels-last, on the CPU or a GPU (--device). Prints one JSON line like `rtrain bench step
--json`.

Usage: python step_reference.py --arch resnet18 --image-size 64 --batch-size 32 --threads 2
"""
import argparse
import json
import statistics
import time

import torch
import torchvision


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.arch)(num_classes=10).to(device)
    model.train()
    torch.backends.cudnn.benchmark = device.type == "cuda"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    labels = torch.randint(10, (args.batch_size,)).to(device)
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for i in range(args.warmup + args.steps):
        started = time.perf_counter()
        optimizer.zero_grad()
        with autocast:
            loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - started)
    median = statistics.median(times)
    print(json.dumps({
        "framework": "pytorch",
        "arch": args.arch,
        "image_size": args.image_size,
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "precision": args.precision,
        "channels_last": args.channels_last,
        "device": str(device),
        "step_seconds": times,
        "median_step_seconds": median,
        "images_per_second": args.batch_size / median,
    }))


if __name__ == "__main__":
    main()
