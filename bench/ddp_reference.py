"""The PyTorch DDP twin of `rtrain train` for scaling comparisons: torchvision ResNet, an
ImageFolder split with the same augmentation (RandomResizedCrop with rtrain's scale and ratio,
horizontal flip, ImageNet normalisation), DistributedSampler, SGD (momentum 0.9, weight decay
5e-4), DistributedDataParallel over gloo -- the seed tutorial's recipe. Launched by mpirun like
rtrain (rank and world from Open MPI's variables; rank 0's address in MASTER_ADDR).

Writes RUN_DIR/summary.json and RUN_DIR/metrics.jsonl (epoch records with `seconds`,
`train_images_per_second` and `phases`) from rank 0, in the shape `rtrain report --scaling`
reads, so both frameworks' runs go through the same report. The phases are host clocks around
the loader, forward, backward and the optimizer step; DDP waits for its last all-reduce inside
backward, so its exposed communication is part of `backward` (`comm_wait` stays 0).

Usage (under mpirun): python ddp_reference.py --data DIR --run-dir DIR [--epochs 3]
    [--max-steps-per-epoch 15] [--batch-size 32] [--image-size 64] [--threads 1] [--workers 0]
"""
import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torchvision
from torchvision import transforms


PHASES = ["data", "copy", "forward", "backward", "comm_wait", "optimizer", "other"]


def stat(values):
    ordered = sorted(values)
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    top = max(range(n), key=lambda r: (values[r], -r))
    return {"rank0": values[0], "min": ordered[0], "median": median, "max": values[top], "max_rank": top}


def phase_report(per_rank, steps):
    """rtrain's phase report (metrics.jsonl) from each rank's seconds per step by phase."""
    report = {name: stat([r[i] for r in per_rank]) for i, name in enumerate(PHASES)}
    step = [sum(r) for r in per_rank]
    report["step"] = stat(step)
    report["busy"] = stat(step)
    report["allreduce"] = stat([0.0 for _ in per_rank])
    slowest = report["busy"]["max_rank"]
    others = [b for r, b in enumerate(step) if r != slowest]
    report.update(steps=steps, slowest_rank=slowest, exposed_comm=0.0,
                  waiting_for_slowest=max(0.0, step[slowest] - stat(others)["median"]) if others else 0.0)
    return report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-steps-per-epoch", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    # DDP's gradient compression hooks (torch.distributed.algorithms.ddp_comm_hooks.default_hooks).
    parser.add_argument("--compress", choices=["none", "bf16", "fp16"], default="none")
    args = parser.parse_args()

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT", "29512")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)

    augment = transforms.Compose([
        transforms.RandomResizedCrop(args.image_size, scale=(0.35, 1.0), ratio=(3 / 4, 4 / 3)),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    dataset = torchvision.datasets.ImageFolder(os.path.join(args.data, "train"), augment)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=world, rank=rank, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                                         num_workers=args.workers, drop_last=True)
    model = getattr(torchvision.models, args.arch)(num_classes=len(dataset.classes))
    model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    if args.compress != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}[args.compress]
        model.register_comm_hook(None, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    run_dir = Path(args.run_dir)
    records = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        dist.barrier()
        started = time.perf_counter()
        images_seen = 0
        loss_sum = 0.0
        sums = dict.fromkeys(PHASES, 0.0)
        steps = 0
        batches = iter(loader)
        lap = time.perf_counter()
        for step in range(len(loader)):
            if args.max_steps_per_epoch and step >= args.max_steps_per_epoch:
                break
            images, labels = next(batches)
            lap = timed(sums, "data", lap)
            optimizer.zero_grad()
            loss = loss_fn(model(images), labels)
            loss_value = loss.item()
            lap = timed(sums, "forward", lap)
            loss.backward()
            lap = timed(sums, "backward", lap)
            optimizer.step()
            lap = timed(sums, "optimizer", lap)
            images_seen += images.shape[0]
            loss_sum += loss_value * images.shape[0]
            steps += 1
            lap = timed(sums, "other", lap)
        seconds = time.perf_counter() - started
        per_rank = [None] * world
        dist.all_gather_object(per_rank, [sums[p] / max(steps, 1) for p in PHASES])
        totals = torch.tensor([images_seen, loss_sum, seconds], dtype=torch.float64)
        dist.all_reduce(totals)
        record = {
            "kind": "epoch",
            "epoch": epoch,
            "train_loss": totals[1].item() / max(totals[0].item(), 1),
            "seconds": totals[2].item() / world,
            "train_images_per_second": totals[0].item() / (totals[2].item() / world),
            "phases": phase_report(per_rank, steps),
        }
        records.append(record)
        if rank == 0:
            print(json.dumps(record), flush=True)
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (run_dir / "summary.json").write_text(json.dumps({
            "framework": "pytorch-ddp-gloo",
            "arch": args.arch,
            "world_size": world,
            "nodes": int(os.environ.get("RTRAIN_BENCH_NODES", world)),
            "global_batch_size": args.batch_size * world,
        }, indent=2))
    # Every rank leaves together; no destroy_process_group: rank 0 hosts the rendezvous store,
    # and a peer still tearing down after rank 0 exits waits for it for ever.
    dist.barrier()


def timed(sums, phase, since):
    now = time.perf_counter()
    sums[phase] += now - since
    return now


if __name__ == "__main__":
    main()
