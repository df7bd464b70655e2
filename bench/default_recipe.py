"""The default run a newcomer sees: the default recipe against the one it replaced.

Runs the quick start's job (`rtrain train`, the built-in synthetic damage-level set) with the
built-in defaults and with the previous recipe (SGD at 0.05, batch 32, torchvision's default
init: `optim.name = "sgd"`, `optim.lr = 0.05`, `data.batch_size = 32`,
`model.zero_init_residual = false`), alternating the two for each seed so that a drift in
machine speed does not favour either. Prints each run's validation loss and top-1 after every
epoch and its wall time, then per recipe the mean final top-1, the largest validation loss
after the first epoch, and the median time, and the ratio of the medians.

Run from the repository root after `scripts/setup` and `cargo build --release`:

    python3 bench/default_recipe.py [--seeds 0 1 2] [--precision auto|fp32] [--json OUT.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PREVIOUS = ['optim.name="sgd"', "optim.lr=0.05", "data.batch_size=32", "model.zero_init_residual=false"]


def run(rtrain, run_dir, seed, recipe, precision):
    overrides = [f"run.seed={seed}", f'train.precision="{precision}"', *(PREVIOUS if recipe == "previous" else [])]
    start = time.monotonic()
    subprocess.run([rtrain, "train", "--run-dir", str(run_dir), *(a for o in overrides for a in ("--set", o))],
                   check=True, capture_output=True, text=True, env={**os.environ, "RUST_LOG": "warn"}, cwd=ROOT)
    seconds = time.monotonic() - start
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r.get("kind") == "epoch"]
    return {"seed": seed, "recipe": recipe, "seconds": seconds,
            "val_loss": [r["val"]["loss"] for r in epochs], "val_top1": [r["val"]["top1"] for r in epochs]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto")
    parser.add_argument("--rtrain", default=str(ROOT / "target/release/rtrain"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for seed in args.seeds:
            for recipe in (["default", "previous"] if seed % 2 == 0 else ["previous", "default"]):
                result = run(args.rtrain, Path(scratch) / f"{recipe}-{seed}", seed, recipe, args.precision)
                print(f"seed {seed} {recipe:8}: {result['seconds']:.1f} s; val loss "
                      f"{' '.join(f'{v:.2f}' for v in result['val_loss'])}; top-1 "
                      f"{' '.join(f'{v:.3f}' for v in result['val_top1'])}", flush=True)
                results.append(result)
    summary = {}
    for recipe in ("default", "previous"):
        runs = [r for r in results if r["recipe"] == recipe]
        summary[recipe] = {
            "final_top1": [r["val_top1"][-1] for r in runs],
            "worst_loss_after_first_epoch": max(max(r["val_loss"][1:], default=0.0) for r in runs),
            "median_seconds": statistics.median(r["seconds"] for r in runs),
        }
        s = summary[recipe]
        print(f"{recipe:8}: final top-1 mean {statistics.mean(s['final_top1']):.3f} "
              f"({', '.join(f'{t:.3f}' for t in s['final_top1'])}), largest val loss after epoch 1 "
              f"{s['worst_loss_after_first_epoch']:.2f}, median {s['median_seconds']:.1f} s")
    ratio = summary["default"]["median_seconds"] / summary["previous"]["median_seconds"]
    print(f"time default/previous {ratio:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "summary": summary, "time_ratio": ratio}, indent=1))


if __name__ == "__main__":
    main()
