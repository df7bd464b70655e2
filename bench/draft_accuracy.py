"""Does decoding JPEGs at reduced DCT scale (`data.jpeg_draft`) change what a model learns?

Trains the same job on the same synthetic camera photos (`rtrain data synth --layout
designsafe`) with `data.jpeg_draft` on and off, for several seeds, alternating, and prints each
run's validation top-1 after the last epoch and its median training seconds per epoch, then the
mean and spread per setting and the difference of the means against the seed-to-seed spread.
The job learns in minutes on 2 cores: ResNet-18 from scratch, RandomResizedCrop(112, scale
(0.35, 1)) + flip, SGD at 0.05 with batch 32 and the default schedule, bf16 autocast where the CPU has it.

Run from the repository root after `scripts/setup` and `cargo build --release`:

    python3 bench/draft_accuracy.py [--seeds 0 1] [--epochs 6] [--train-images 600] \\
        [--val-images 150] [--photo-scale 0.25] [--json OUT.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(rtrain, data, run_dir, seed, draft, epochs):
    subprocess.run(
        [rtrain, "train", "--run-dir", str(run_dir),
         "--set", f"data.root={data}", "--set", "data.train_split=Train", "--set", "data.val_split=Validation",
         "--set", "data.image_size=112", "--set", f"data.jpeg_draft={'true' if draft else 'false'}",
         "--set", f"run.seed={seed}", "--set", f"train.epochs={epochs}",
         # The recipe BENCHMARKS.md's figures were measured with (the default until CHANGELOG's "default recipe").
         "--set", 'optim.name="sgd"', "--set", "optim.lr=0.05", "--set", "data.batch_size=32",
         "--set", "model.zero_init_residual=false"],
        check=True, capture_output=True, text=True, env={**os.environ, "RUST_LOG": "warn"})
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r.get("kind") == "epoch"]
    return {"seed": seed, "draft": draft, "val_top1": epochs[-1]["val"]["top1"],
            "epoch_seconds": statistics.median(r["seconds"] for r in epochs)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--train-images", type=int, default=600)
    parser.add_argument("--val-images", type=int, default=150)
    parser.add_argument("--photo-scale", type=float, default=0.25)
    parser.add_argument("--rtrain", default=str(ROOT / "target/release/rtrain"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        data = scratch / "photos"
        subprocess.run([args.rtrain, "data", "synth", str(data), "--layout", "designsafe",
                        "--train-images", str(args.train_images), "--val-images", str(args.val_images),
                        "--photo-scale", str(args.photo_scale)], check=True, capture_output=True)
        results = []
        for seed in args.seeds:
            # Alternate the order so that a drift in machine speed does not favour one setting.
            for draft in ([True, False] if seed % 2 == 0 else [False, True]):
                result = run(args.rtrain, data, scratch / f"run-{seed}-{draft}", seed, draft, args.epochs)
                print(f"seed {seed} draft {'on ' if draft else 'off'}: val top-1 {result['val_top1']:.3f}, "
                      f"{result['epoch_seconds']:.1f} s/epoch", flush=True)
                results.append(result)
    print(f"\n{args.train_images} training / {args.val_images} validation photos at scale {args.photo_scale}, "
          f"{args.epochs} epochs, seeds {args.seeds}")
    summary = {}
    for draft in (True, False):
        top1 = [r["val_top1"] for r in results if r["draft"] == draft]
        seconds = [r["epoch_seconds"] for r in results if r["draft"] == draft]
        summary[draft] = (statistics.mean(top1), statistics.stdev(top1) if len(top1) > 1 else 0.0,
                          statistics.median(seconds))
        print(f"draft {'on ' if draft else 'off'}: val top-1 mean {summary[draft][0]:.3f} "
              f"(sd over seeds {summary[draft][1]:.3f}; {', '.join(f'{t:.3f}' for t in top1)}), "
              f"median {summary[draft][2]:.1f} s/epoch")
    difference = summary[True][0] - summary[False][0]
    print(f"on - off: {difference:+.3f} top-1; epoch time on/off {summary[True][2] / summary[False][2]:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "difference": difference}, indent=1))


if __name__ == "__main__":
    main()
