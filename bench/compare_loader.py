"""Input pipeline throughput, rtrain (from shards and from the image tree) vs torchvision's
ImageFolder + DataLoader on the same JPEGs, side by side in one run.

Makes a JPEG tree with `rtrain data synth` (4 classes, --image-size pixels square) and the same
JPEG bytes as shards with `rtrain data prepare`, then alternates the three loaders with the
same worker count, several repetitions each, and prints medians, spread and ratios per core.
Run from the repository root after `scripts/setup --test` and `cargo build --release`:

    .deps/venv/bin/python bench/compare_loader.py [--workers 1 2] [--repeats 3] [--image-size 224]
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# `rtrain bench loader` times training's configured transform; these make it torchvision's
# RandomResizedCrop (scale 0.08-1) on fully decoded, unrotated images, as the reference does.
TORCHVISION_TRANSFORM = ["--set", "data.scale=[0.08, 1.0]", "--set", "data.jpeg_draft=false",
                         "--set", "data.exif_orientation=false"]


def run(command):
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def spread(values):
    return f"{statistics.median(values):8.1f} ({min(values):.1f}-{max(values):.1f})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224, help="training crop")
    parser.add_argument("--stored-size", type=int, default=320, help="side of the stored JPEGs")
    parser.add_argument("--per-class", type=int, default=150)
    parser.add_argument("--rtrain", default=str(ROOT / "target/release/rtrain"))
    parser.add_argument("--work", help="keep the datasets here (default: a temporary directory)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.work or scratch)
        tree, shards = work / "jpeg-tree", work / "shards"
        if not tree.exists():
            subprocess.run([args.rtrain, "data", "synth", str(tree), "--image-size", str(args.stored_size),
                            "--train-per-class", str(args.per_class), "--val-per-class", "1"],
                           check=True, capture_output=True)
        if not shards.exists():
            subprocess.run([args.rtrain, "data", "prepare", str(tree), str(shards)], check=True, capture_output=True)

        rows = []
        for workers in args.workers:
            common = ["--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
                      "--workers", str(workers), "--batches", str(args.batches)]
            results = {"rtrain shards": [], "rtrain tree": [], "pytorch": []}
            memory = {"rtrain shards": [], "rtrain tree": [], "pytorch": []}
            for _ in range(args.repeats):
                for name, command in [
                    ("rtrain shards", [args.rtrain, "bench", "loader", "--json", "--data", str(shards), *common,
                                       *TORCHVISION_TRANSFORM]),
                    ("rtrain tree", [args.rtrain, "bench", "loader", "--json", "--data", str(tree), *common,
                                     *TORCHVISION_TRANSFORM]),
                    ("pytorch", [sys.executable, str(ROOT / "bench/loader_reference.py"),
                                 "--data", str(tree / "train"), *common]),
                ]:
                    result = run(command)
                    results[name].append(result["images_per_second_per_core"])
                    memory[name].append(result["peak_rss_mib"] + result.get("peak_worker_rss_mib", 0) * workers)
            rows.append((workers, results, memory))
            print(f"workers {workers}: " + ", ".join(f"{k} {[round(v, 1) for v in vs]}" for k, vs in results.items()),
                  file=sys.stderr)

    print(f"\nloader, {args.stored_size}px JPEGs -> RandomResizedCrop {args.image_size} + flip + normalise, "
          f"batch {args.batch_size}, {args.repeats} alternating runs x {args.batches} batches; "
          f"img/s per core, median (min-max)")
    print(f"{'workers':>7} {'rtrain shards':>22} {'rtrain tree':>22} {'pytorch':>22} {'shards/pt':>9} {'tree/pt':>8}"
          f" {'peak MiB rtrain/pt':>19}")
    for workers, results, memory in rows:
        pt = statistics.median(results["pytorch"])
        print(f"{workers:>7} {spread(results['rtrain shards']):>22} {spread(results['rtrain tree']):>22} "
              f"{spread(results['pytorch']):>22} {statistics.median(results['rtrain shards']) / pt:>8.2f}x "
              f"{statistics.median(results['rtrain tree']) / pt:>7.2f}x "
              f"{statistics.median(memory['rtrain shards']):>8.0f}/{statistics.median(memory['pytorch']):.0f}")


if __name__ == "__main__":
    main()
