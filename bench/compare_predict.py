"""Classifying a campaign's photos: `rtrain predict --out` against the obvious PyTorch way
(bench/predict_reference.py: a Dataset of Pillow images, Resize((244, 244)) + ToTensor, a
DataLoader with the same workers, torchvision's model with the same weights, threads and
batch, torch.inference_mode()), against torchvision's best mode (the same with Pillow's
draft() before the resize, bf16 autocast and channels-last: what rtrain does by default, done
the PyTorch way), and against the floor both add to (the model's forward pass alone on ready
tensors), side by side in one run. rtrain's rates are given as ratios to both torchvision
modes' medians.

Photos: `rtrain data synth --layout designsafe` (camera and phone JPEGs of mixed sizes, up to
6000x4000 times --photo-scale, some stored sideways with an Exif tag). Models: ResNet-18 and
ResNet-34 (4 classes) from a one-epoch rtrain run, exported for torchvision.

Each repeat runs every configuration once, in an order that rotates with the repeat:
  * rtrain, fp32, data.jpeg_draft on and off; rtrain in its default precision (bf16 where the
    CPU has it natively) with jpeg_draft on;
  * torchvision's default (fp32, full decode) and its best mode (`predict_reference.py
    --best`: Pillow's draft("RGB", (244, 244)), torch.autocast("cpu", bfloat16), channels-last);
  * 1 rank x 2 threads against 2 ranks x 1 thread under mpirun (rtrain, fp32, draft on), whose
    prediction files must be the same bytes.
img/s: rtrain's is the whole job's (summary.json: every input hashed, read, decoded,
classified, and the outputs written, start-up included); torchvision's is its loop alone.
Peak MiB: the largest resident set of the process or any descendant (measure.py's wait4).
Run from the repository root after `scripts/setup --test` and `cargo build --release`:

    .deps/venv/bin/python bench/compare_predict.py [--photos 120] [--photo-scale 0.5] [--repeats 3]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import measure  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "bench/predict_reference.py"
# The tutorial's evaluation transform: Resize((244, 244)) + ToTensor, no Normalize.
TUTORIAL_EVAL = ["--set", "data.image_size=244", "--set", "data.eval_transform=resize", "--set", "data.normalize=false"]
# The two torchvision configurations every rtrain rate is compared with.
TORCHVISION = {"default": "torchvision default", "best": "torchvision best: draft on, channels-last"}


def quiet(command):
    subprocess.run(command, check=True, capture_output=True)


def model_for(rtrain, work, arch):
    """A 4-class model of `arch` from a one-epoch run on tiny images, and its torchvision export."""
    tiny = work / "tiny"
    if not tiny.exists():
        quiet([rtrain, "data", "synth", str(tiny), "--train-per-class", "4", "--val-per-class", "1", "--image-size", "32"])
    run = work / f"model-{arch}"
    if not (run / "model.safetensors").exists():
        quiet([rtrain, "train", "--run-dir", str(run), "--set", f'data.root="{tiny}"', "--set", f"model.arch={arch}",
               "--set", "data.image_size=32", "--set", "train.epochs=1", "--set", "data.batch_size=8"])
        quiet([rtrain, "export", "--checkpoint", str(run / "model.safetensors"), str(run / "torchvision.safetensors")])
    return run / "model.safetensors", run / "torchvision.safetensors"


def rtrain_predict(args, model, photos, out, settings, ranks=1):
    shutil.rmtree(out, ignore_errors=True)
    command = [args.rtrain, "predict", "--checkpoint", str(model), "--out", str(out), *TUTORIAL_EVAL,
               "--set", f"data.eval_batch_size={args.batch}", *settings, str(photos)]
    if ranks > 1:
        command = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", "--allow-run-as-root",
                   "--mca", "btl", "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none", *command]
    _, peak = measure.run(command)
    summary = json.loads((out / "summary.json").read_text())
    return summary["images_per_second"], peak, summary["compute"].split()[0]


def torchvision_predict(args, arch, weights, photos, best=False):
    mode = ["--best"] if best else []
    out, peak = measure.run([sys.executable, str(REFERENCE), "classify", *mode, arch, "4", str(weights), "244",
                             str(args.workers), str(args.cores), str(args.batch), str(photos)])
    result = json.loads(out.strip().splitlines()[-1])
    return result["images"] / result["seconds"], peak, "bf16" if best else "fp32"


def floor(args, arch, precision):
    batches = max(1, -(-args.photos // args.batch))
    out, _ = measure.run([sys.executable, str(REFERENCE), "floor", arch, "4", "244", str(args.cores),
                          str(args.batch), str(batches), precision])
    result = json.loads(out.strip().splitlines()[-1])
    return result["images"] / result["seconds"]


def spread(values):
    return f"{statistics.median(values):7.2f} ({min(values):.2f}-{max(values):.2f})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--photos", type=int, default=120)
    parser.add_argument("--photo-scale", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--arch", nargs="+", default=["resnet18", "resnet34"])
    parser.add_argument("--rtrain", default=str(ROOT / "target/release/rtrain"))
    parser.add_argument("--work", help="keep photos and models here (default: a temporary directory)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.work or scratch)
        work.mkdir(parents=True, exist_ok=True)
        photos = work / "photos"
        if not photos.exists():
            quiet([args.rtrain, "data", "synth", str(photos), "--layout", "designsafe", "--train-images",
                   str(args.photos), "--val-images", "3", "--photo-scale", str(args.photo_scale)])
        campaign = photos / "Train"
        threads = ["--set", f"train.threads={args.cores}", "--set", f"data.workers={args.workers}"]
        per_rank = ["--set", "train.threads=1", "--set", f"data.workers={max(1, args.workers // 2)}"]
        for arch in args.arch:
            model, exported = model_for(args.rtrain, work, arch)
            configs = {
                "rtrain fp32, draft on": lambda: rtrain_predict(
                    args, model, campaign, work / "out-on", [*threads, "--set", "train.precision=fp32"]),
                "rtrain fp32, draft off": lambda: rtrain_predict(
                    args, model, campaign, work / "out-off",
                    [*threads, "--set", "train.precision=fp32", "--set", "data.jpeg_draft=false"]),
                "rtrain auto precision, draft on": lambda: rtrain_predict(
                    args, model, campaign, work / "out-auto", threads),
                TORCHVISION["default"]: lambda: torchvision_predict(args, arch, exported, campaign),
                TORCHVISION["best"]: lambda: torchvision_predict(args, arch, exported, campaign, best=True),
                "rtrain fp32, draft on, 2 ranks x 1 thread": lambda: rtrain_predict(
                    args, model, campaign, work / "out-2ranks", [*per_rank, "--set", "train.precision=fp32"], ranks=2),
            }
            results = {name: ([], [], set()) for name in configs}
            names = list(configs)
            for repeat in range(args.repeats):
                for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                    rate, peak, precision = configs[name]()
                    results[name][0].append(rate)
                    results[name][1].append(peak)
                    results[name][2].add(precision)
                    print(f"  {arch} repeat {repeat}: {name}: {rate:.2f} img/s, {peak:.0f} MiB", file=sys.stderr)
            same = all((work / "out-on" / f).read_bytes() == (work / "out-2ranks" / f).read_bytes()
                       for f in ["predictions.csv", "predictions.jsonl", "predictions.geojson"])
            floors = {p: floor(args, arch, p) for p in ["fp32", "bf16"]}
            # Every ratio is of medians: against torchvision's default and against its best mode.
            torch_rates = {mode: statistics.median(results[name][0]) for mode, name in TORCHVISION.items()}
            torch_peaks = {mode: statistics.median(results[name][1]) for mode, name in TORCHVISION.items()}
            print(f"\n{arch}: {args.photos} photos (scale {args.photo_scale}), batch {args.batch}, "
                  f"{args.workers} loader workers, {args.cores} threads; floor (forward alone): "
                  f"fp32 {floors['fp32']:.2f} img/s, bf16 {floors['bf16']:.2f} img/s")
            print(f"{'':48} {'img/s median (min-max)':>26} {'per core':>8} {'vs tv default':>13} {'vs tv best':>10} "
                  f"{'vs floor':>8} {'peak MiB':>9} {'vs tv default':>13} {'vs tv best':>10}")
            for name in names:
                rates, peaks, precisions = results[name]
                rate, peak = statistics.median(rates), statistics.median(peaks)
                precision = "bf16" if "bf16" in precisions else "fp32"
                print(f"{name + ' [' + precision + ']':48} {spread(rates):>26} {rate / args.cores:8.2f} "
                      f"{rate / torch_rates['default']:12.2f}x {rate / torch_rates['best']:9.2f}x "
                      f"{rate / floors[precision]:7.2f}x {peak:9.0f} "
                      f"{peak / torch_peaks['default']:12.2f}x {peak / torch_peaks['best']:9.2f}x")
            ours = statistics.median(results["rtrain auto precision, draft on"][0])
            print(f"rtrain auto precision, draft on: {ours / torch_rates['default']:.2f}x torchvision's default, "
                  f"{ours / torch_rates['best']:.2f}x its best mode (medians)")
            print(f"2 ranks x 1 thread gives the same prediction bytes as 1 rank x {args.cores} threads: {same}")


if __name__ == "__main__":
    main()
