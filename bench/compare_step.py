"""Training-step throughput, rtrain vs PyTorch eager, side by side in one run.

Alternates `rtrain bench step --json` and bench/step_reference.py (torchvision, same libtorch)
for each configuration, several repetitions each, and prints medians, spread and the ratio
rtrain / PyTorch. Run from the repository root after `scripts/setup --test` and
`cargo build --release`:

    .deps/venv/bin/python bench/compare_step.py [--repeats 3] [--threads 2] [--sizes 64 224]
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(command):
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--archs", nargs="+", default=["resnet18"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[64, 224])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rtrain", default=str(ROOT / "target/release/rtrain"))
    args = parser.parse_args()

    rows = []
    for arch in args.archs:
        for size in args.sizes:
            common = ["--arch", arch, "--image-size", str(size), "--batch-size", str(args.batch_size),
                      "--threads", str(args.threads), "--steps", str(args.steps)]
            ours, theirs = [], []
            for _ in range(args.repeats):
                ours.append(run([args.rtrain, "bench", "step", "--json", *common])["images_per_second"])
                theirs.append(run([sys.executable, str(ROOT / "bench/step_reference.py"), *common])["images_per_second"])
            rows.append((arch, size, ours, theirs))
            print(f"{arch} @{size}: rtrain {[round(x, 1) for x in ours]} pytorch {[round(x, 1) for x in theirs]}",
                  file=sys.stderr)

    print(f"\ntraining step, batch {args.batch_size}, {args.threads} threads, {args.repeats} alternating runs "
          f"x {args.steps} timed steps; img/s median (min-max)")
    print(f"{'model':<10} {'size':>4} {'rtrain':>22} {'pytorch':>22} {'ratio':>6}")
    for arch, size, ours, theirs in rows:
        ratio = statistics.median(ours) / statistics.median(theirs)
        fmt = lambda xs: f"{statistics.median(xs):7.1f} ({min(xs):.1f}-{max(xs):.1f})"
        print(f"{arch:<10} {size:>4} {fmt(ours):>22} {fmt(theirs):>22} {ratio:6.2f}x")


if __name__ == "__main__":
    main()
