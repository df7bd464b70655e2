"""End-to-end training epochs, rtrain vs the tutorial's way (torchvision ResNet + DDP +
DistributedSampler + DataLoader, bench/ddp_reference.py), side by side in one run.

Both train ResNet-18 on the built-in synthetic damage set stored as JPEGs (`rtrain data synth`),
64x64 crops, batch 32 per rank, SGD, fp32 NCHW, for --epochs epochs: first with one process,
then with two (`mpirun -np 2` for both; the reference uses gloo). Each rank gets an equal share
of the cores for compute; the reference gets --workers DataLoader worker processes, rtrain its
own default (`data.workers = "auto"`: on a CPU, only the cores libtorch leaves free) unless
--rtrain-workers says otherwise. The first epoch is warm-up; the table gives the median of the other epochs' training
time (loader waits included, evaluation and checkpoints not: the reference does neither), and
the ratio rtrain / reference (goal: at most 0.8), and peak memory: the largest resident set of
one process (a rank; for the reference, its DataLoader workers are separate processes and so
not added), measured from outside (bench/measure.py).
Run from the repository root after `scripts/setup --test` and `cargo build --release`:

    .deps/venv/bin/python bench/compare_epoch.py [--epochs 3] [--repeats 2] [--ranks 1 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import measure

ROOT = Path(__file__).resolve().parent.parent
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
          "--mca", "btl_vader_single_copy_mechanism", "none"]


def epoch_seconds(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["seconds"] for r in records if r.get("kind") == "epoch"][1:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--workers", type=int, default=1, help="the reference's DataLoader workers per rank")
    parser.add_argument("--rtrain-workers", default="auto",
                        help="rtrain's data.workers: auto (its default) or a number; --rtrain-workers 1 "
                             "with --workers 1 compares like for like")
    parser.add_argument("--rtrain", default=str(ROOT / "target/release/rtrain"))
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "RUST_LOG": "warn"}

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        data = scratch / "data"
        subprocess.run([args.rtrain, "data", "synth", str(data)], check=True, capture_output=True)
        rows = []
        for ranks in args.ranks:
            threads = max(cores // ranks, 1)
            ours, theirs, memory = [], [], ([], [])
            for repeat in range(args.repeats):
                run = scratch / f"rtrain-{ranks}-{repeat}"
                _, peak = measure.run([*MPIRUN, "-np", str(ranks), args.rtrain, "train", "--run-dir", str(run),
                                "--set", f"data.root=\"{data}\"", "--set", "data.image_size=64",
                                "--set", "data.batch_size=32", "--set", f"train.epochs={args.epochs}",
                                "--set", f"train.threads={threads}", "--set", f"data.workers={args.rtrain_workers}",
                                "--set", 'train.precision="fp32"', "--set", "train.channels_last=false",
                                # ddp_reference.py's recipe: SGD at 0.05, torchvision's init.
                                "--set", 'optim.name="sgd"', "--set", "optim.lr=0.05",
                                "--set", "model.zero_init_residual=false"],
                                      env=env)
                ours += epoch_seconds(run)
                memory[0].append(peak)
                run = scratch / f"pytorch-{ranks}-{repeat}"
                _, peak = measure.run([*MPIRUN, "-np", str(ranks), sys.executable, str(ROOT / "bench/ddp_reference.py"),
                                "--data", str(data), "--run-dir", str(run), "--image-size", "64",
                                "--batch-size", "32", "--epochs", str(args.epochs), "--threads", str(threads),
                                "--workers", str(args.workers)],
                                      env=env)
                theirs += epoch_seconds(run)
                memory[1].append(peak)
            rows.append((ranks, threads, ours, theirs, memory))
            print(f"{ranks} rank(s): rtrain {[round(x, 2) for x in ours]} s, "
                  f"pytorch {[round(x, 2) for x in theirs]} s", file=sys.stderr)

    print(f"\nepoch of ResNet-18 on 800 synthetic JPEGs at 64px, batch 32 per rank, loader workers per rank: "
          f"rtrain {args.rtrain_workers}, tutorial {args.workers}; {args.repeats} alternating runs x "
          f"{args.epochs - 1} timed epochs; seconds median (min-max)")
    print(f"{'ranks':>5} {'threads':>7} {'rtrain':>20} {'tutorial (DDP)':>20} {'rtrain/tutorial':>16} "
          f"{'peak MiB rtrain/tutorial':>25}")
    for ranks, threads, ours, theirs, memory in rows:
        fmt = lambda xs: f"{statistics.median(xs):6.2f} ({min(xs):.2f}-{max(xs):.2f})"  # noqa: E731
        ratio = statistics.median(ours) / statistics.median(theirs)
        peaks = f"{statistics.median(memory[0]):.0f} / {statistics.median(memory[1]):.0f}"
        print(f"{ranks:>5} {threads:>7} {fmt(ours):>20} {fmt(theirs):>20} {ratio:>15.2f}x {peaks:>25}")


if __name__ == "__main__":
    main()
