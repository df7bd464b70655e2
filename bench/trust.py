"""Probabilities you can trust (issue 51): what temperature scaling, a 3-member ensemble, flip
test-time augmentation and conformal prediction sets do to a model's probabilities, and what
each costs in img/s.

Data: `rtrain data synth --layout designsafe` (classes C0, C2, C4; camera and phone JPEGs of
mixed sizes, some stored sideways). The layout has Train and Validation only, so Validation is
dealt into two held-out halves by file order within each class (even files `cal/`, odd files
`test/`): temperatures and conformal thresholds are fitted on `cal`, every figure is measured
on `test`, which nothing was fitted or chosen on.

Accuracy phase (the default; may run on a busy machine):
  * trains one ResNet-18 per seed (`--seeds`, 1 2 3) from scratch on Train at --image-size px
    (the built-in recipe: AdamW, cosine, bf16 where the CPU has it); `cal` is the validation
    split the trainer reports on, but the final weights (model.safetensors) are what is
    calibrated, and nothing in training depends on `cal` (no early stopping, no plateau);
  * `rtrain calibrate --split cal` per model: temperature only, then `--conformal` with
    `--method lac` and `aps` at each --alpha;
  * `rtrain eval --split test --json --bootstrap 0` per model: uncalibrated, calibrated (whose
    `trust.before_temperature` must equal the uncalibrated scores), each conformal model, the
    calibrated model with `--tta flip` (sets are not applied under flips: they were fitted on one
    view); then the
    ensemble of the calibrated members (`--checkpoint` three times) with and without flip, and of
    the uncalibrated members.
Prints Markdown tables: per-model rows as the median over seeds (min-max); the ensemble is one
model made of all the seeds' members, so its rows are single values.

Cost phase (`--cost`; run it alone on a quiet machine): `rtrain predict --out` over the test
images with one model, the calibrated model, the calibrated model with conformal sets and
`--abstain`, flip TTA, the 3-member ensemble and the ensemble with flip, in an order that
rotates with each of --repeats; img/s is summary.json's (the whole job: start-up, hashing,
decoding, outputs) and peak MiB the largest resident set (measure.py). Needs the accuracy
phase's models in --work.

Run from the repository root after `cargo build --release`:

    python3 bench/trust.py [--work runs/bench-trust] [--seeds 1 2 3] [--epochs 5] [--image-size 64]
    python3 bench/trust.py --cost [--work runs/bench-trust] [--repeats 3] [--cost-images N]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import measure  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
QUIET = {**os.environ, "RUST_LOG": "warn"}
# (method, alpha) of every conformal model.
SET_RULES = [("lac", 0.1), ("lac", 0.05), ("aps", 0.1), ("aps", 0.05)]


def call(command):
    """Runs an rtrain command; returns its stdout. Fails naming the command and its stderr."""
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=QUIET)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, command))} exited with {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout


def make_data(args, work):
    """The synthetic photos, with Validation dealt into `cal` and `test` halves per class."""
    root = work / "data"
    if (root / "test").exists():
        return root
    photos = work / "photos"
    shutil.rmtree(photos, ignore_errors=True)
    call([args.rtrain, "data", "synth", photos, "--layout", "designsafe", "--seed", args.data_seed,
          "--train-images", args.train_images, "--val-images", args.held_out_images,
          "--photo-scale", args.photo_scale])
    staging = work / "data.partial"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(photos / "Train", staging / "Train")
    for class_dir in sorted((photos / "Validation").iterdir()):
        for index, photo in enumerate(sorted(class_dir.iterdir())):
            target = staging / ("cal" if index % 2 == 0 else "test") / class_dir.name
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(photo, target / photo.name)
    staging.rename(root)
    shutil.rmtree(photos)
    return root


def train(args, data, seed, run_dir):
    if (run_dir / "model.safetensors").exists():
        return 0.0
    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.monotonic()
    call([args.rtrain, "train", "--run-dir", run_dir, "--set", f'data.root="{data}"',
          "--set", 'data.train_split="Train"', "--set", 'data.val_split="cal"',
          "--set", f"data.image_size={args.image_size}", "--set", f"train.epochs={args.epochs}",
          "--set", f"run.seed={seed}"])
    return time.monotonic() - start


def calibrate(args, data, model, out, rule=None):
    """Fits on `cal`; returns calibrate's JSON report."""
    command = [args.rtrain, "calibrate", "--checkpoint", model, "--data", data, "--split", "cal",
               "--out", out, "--json"]
    if rule:
        command += ["--conformal", "--method", rule[0], "--alpha", rule[1]]
    return json.loads(call(command))


def evaluate(args, data, models, tta="none"):
    """`rtrain eval --json` on `test`; returns the report."""
    command = [args.rtrain, "eval", *(a for m in models for a in ("--checkpoint", m)), "--tta", tta,
               "--data", data, "--split", "test", "--json", "--bootstrap", "0"]
    return json.loads(call(command))


def rule_name(rule):
    return f"{rule[0]}-{rule[1]}"


def summarise(report):
    """The figures the tables use from one eval report."""
    metrics, trust = report["metrics"], report["trust"]
    row = {"top1": metrics["top1"], "macro_f1": metrics["macro_f1"], "ece": metrics["ece"],
           "nll": metrics["log_loss"], "brier": trust["scores"]["brier"],
           "trust_nll": trust["scores"]["nll"], "trust_ece": trust["scores"]["ece"],
           "temperature": trust["temperature"], "images": metrics["images"]}
    if trust["before_temperature"]:
        row["before"] = {k: trust["before_temperature"][k] for k in ("nll", "brier", "ece")}
    if trust["sets"]:
        row["sets"] = {k: trust["sets"][k] for k in ("method", "alpha", "coverage", "mean_set_size",
                                                     "fitted_on_these_images")}
    if trust["uncertain"]:
        row["uncertain_share"] = trust["uncertain"]["share"]
    return row


def same_job(args, work):
    """Refuses a --work directory whose data and models were made with other settings."""
    settings = {k: getattr(args, k) for k in ("seeds", "epochs", "image_size", "train_images",
                                              "held_out_images", "photo_scale", "data_seed")}
    recorded = work / "settings.json"
    if recorded.exists() and json.loads(recorded.read_text()) != settings:
        raise SystemExit(f"{work} holds a job made with {recorded.read_text().strip()}; "
                         f"pass those settings or another --work")
    recorded.write_text(json.dumps(settings))


def accuracy(args, work):
    started = time.monotonic()
    same_job(args, work)
    data = make_data(args, work)
    results = {"seeds": {}, "train_seconds": {}}
    for seed in args.seeds:
        seconds = train(args, data, seed, work / f"run-{seed}")
        results["train_seconds"][seed] = seconds
        print(f"seed {seed}: " + (f"trained in {seconds:.0f} s" if seconds else f"reusing {work / f'run-{seed}'}"),
              file=sys.stderr, flush=True)
    for seed in args.seeds:
        model = work / f"run-{seed}" / "model.safetensors"
        calibrated = {name: work / f"model-{seed}-{name}.safetensors" for name in ["t", *map(rule_name, SET_RULES)]}
        fits = {"t": calibrate(args, data, model, calibrated["t"])}
        for rule in SET_RULES:
            fits[rule_name(rule)] = calibrate(args, data, model, calibrated[rule_name(rule)], rule)
        evals = {"raw": summarise(evaluate(args, data, [model])),
                 "t": summarise(evaluate(args, data, [calibrated["t"]])),
                 "raw-flip": summarise(evaluate(args, data, [model], "flip")),
                 "t-flip": summarise(evaluate(args, data, [calibrated["t"]], "flip"))}
        for rule in SET_RULES:
            evals[rule_name(rule)] = summarise(evaluate(args, data, [calibrated[rule_name(rule)]]))
        results["seeds"][seed] = {"calibrate": fits, "eval": evals}
        print(f"seed {seed}: calibrated and evaluated (T {fits['t']['calibration']['temperature']:.3f}, "
              f"test top-1 {evals['raw']['top1']:.3f})", file=sys.stderr, flush=True)
    members_t = [work / f"model-{seed}-t.safetensors" for seed in args.seeds]
    members_raw = [work / f"run-{seed}" / "model.safetensors" for seed in args.seeds]
    results["ensemble"] = {"t": summarise(evaluate(args, data, members_t)),
                           "t-flip": summarise(evaluate(args, data, members_t, "flip")),
                           "raw": summarise(evaluate(args, data, members_raw))}
    results["seconds"] = time.monotonic() - started
    (work / "accuracy.json").write_text(json.dumps(results, indent=1, default=str))
    print_accuracy(args, results)


def spread(values, digits=3):
    low, high = min(values), max(values)
    between = " to " if low < 0 else "-"
    return f"{statistics.median(values):.{digits}f} ({low:.{digits}f}{between}{high:.{digits}f})"


def check(results):
    """What must hold between the reports, whatever the numbers; returns the failures."""
    problems = []
    for seed, per in results["seeds"].items():
        evals, fits = per["eval"], per["calibrate"]
        raw, t = evals["raw"], evals["t"]
        for key in ("nll", "ece", "brier"):
            if abs(t["before"][key] - raw[key]) > 1e-6:
                problems.append(f"seed {seed}: calibrated model's before_temperature.{key} "
                                f"{t['before'][key]:.6f} != uncalibrated model's {raw[key]:.6f}")
        temperatures = {name: fit["calibration"]["temperature"] for name, fit in fits.items()}
        if max(temperatures.values()) - min(temperatures.values()) > 1e-9:
            problems.append(f"seed {seed}: the calibrate runs fitted different temperatures {temperatures}")
        for name, row in evals.items():
            if abs(row["nll"] - row["trust_nll"]) > 1e-9 or abs(row["ece"] - row["trust_ece"]) > 1e-9:
                problems.append(f"seed {seed} {name}: metrics and trust.scores disagree")
            if row.get("sets", {}).get("fitted_on_these_images"):
                problems.append(f"seed {seed} {name}: sets evaluated on the images they were fitted on")
    return problems


def print_accuracy(args, results):
    seeds = results["seeds"]
    per = lambda name, key: [seeds[s]["eval"][name][key] for s in seeds]  # noqa: E731
    before = lambda key: [seeds[s]["eval"]["t"]["before"][key] for s in seeds]  # noqa: E731
    ensemble = results["ensemble"]
    images = next(iter(seeds.values()))["eval"]["raw"]["images"]
    cal_images = next(iter(seeds.values()))["calibrate"]["t"]["calibration"]["fitted_on"]["images"]
    print(f"\n{len(seeds)} ResNet-18s (seeds {', '.join(map(str, seeds))}), {args.epochs} epochs at "
          f"{args.image_size} px on {args.train_images} `data synth --layout designsafe` photos "
          f"(scale {args.photo_scale}); fitted on `cal` ({cal_images} images), measured on `test` "
          f"({images} images). Model rows: median over seeds (min-max); ensemble rows: one ensemble "
          f"of all {len(seeds)}.")
    temperatures = [seeds[s]["calibrate"]["t"]["calibration"]["temperature"] for s in seeds]
    print(f"\nTemperature scaling (fitted T: {spread(temperatures)})\n")
    print("| | NLL | ECE | Brier |")
    print("|---|---|---|---|")
    print(f"| before T | {spread(before('nll'))} | {spread(before('ece'))} | {spread(before('brier'))} |")
    print(f"| after T | {spread(per('t', 'nll'))} | {spread(per('t', 'ece'))} | {spread(per('t', 'brier'))} |")
    print(f"| after T, change per seed | {spread([a - b for a, b in zip(per('t', 'nll'), before('nll'))], 4)} "
          f"| {spread([a - b for a, b in zip(per('t', 'ece'), before('ece'))], 4)} "
          f"| {spread([a - b for a, b in zip(per('t', 'brier'), before('brier'))], 4)} |")
    print("\nEnsemble and flip TTA\n")
    print("| | top-1 | macro-F1 | ECE | NLL |")
    print("|---|---|---|---|---|")

    def model_row(label, name):
        print(f"| {label} | {spread(per(name, 'top1'))} | {spread(per(name, 'macro_f1'))} | "
              f"{spread(per(name, 'ece'))} | {spread(per(name, 'nll'))} |")

    def ensemble_row(label, name):
        e = ensemble[name]
        print(f"| {label} | {e['top1']:.3f} | {e['macro_f1']:.3f} | {e['ece']:.3f} | {e['nll']:.3f} |")

    model_row("one model", "raw")
    model_row("one model, flip TTA", "raw-flip")
    model_row("one calibrated model (a member)", "t")
    model_row("one calibrated model, flip TTA", "t-flip")
    ensemble_row(f"ensemble of {len(seeds)} calibrated members", "t")
    ensemble_row(f"ensemble of {len(seeds)} calibrated members, flip TTA", "t-flip")
    ensemble_row(f"ensemble of {len(seeds)} uncalibrated members", "raw")
    print("\nConformal prediction sets (split conformal on `cal`, one calibrated model)\n")
    print("| method, alpha | promised coverage | coverage | mean set size | top-1 |")
    print("|---|---|---|---|---|")
    names = [(rule_name(r), f"{r[0].upper()}, {r[1]}", r[1]) for r in SET_RULES]
    for name, label, alpha in names:
        coverage = [seeds[s]["eval"][name]["sets"]["coverage"] for s in seeds]
        size = [seeds[s]["eval"][name]["sets"]["mean_set_size"] for s in seeds]
        print(f"| {label} | >= {1 - alpha:.2f} | {spread(coverage)} | {spread(size, 2)} | {spread(per(name, 'top1'))} |")
    problems = check(results)
    print("\nChecks (before_temperature = the uncalibrated model's scores; one T per seed across "
          f"calibrate runs; metrics = trust.scores; no set tested on its own images): "
          f"{'all hold' if not problems else 'FAILED'}")
    for problem in problems:
        print(f"  - {problem}")
    train_seconds = [s for s in results["train_seconds"].values() if s]
    if train_seconds:
        print(f"Training: {', '.join(f'{s:.0f}' for s in train_seconds)} s per model; ", end="")
    print(f"accuracy phase {results['seconds'] / 60:.1f} min in all (raw reports: accuracy.json)")


def predict(args, models, photos, out, tta="none", abstain=False):
    shutil.rmtree(out, ignore_errors=True)
    command = [args.rtrain, "predict", *(a for m in models for a in ("--checkpoint", str(m))), "--tta", tta,
               "--out", str(out), *(["--abstain"] if abstain else []), *photos]
    _, peak = measure.run(command, env=QUIET)
    summary = json.loads((out / "summary.json").read_text())
    return summary["images_per_second"], peak, summary["passes_per_image"], summary["images"]


def cost(args, work):
    started = time.monotonic()
    same_job(args, work)
    data = work / "data"
    seeds = args.seeds
    needed = [work / f"run-{seeds[0]}" / "model.safetensors", work / f"model-{seeds[0]}-t.safetensors",
              work / f"model-{seeds[0]}-{rule_name(SET_RULES[0])}.safetensors",
              *(work / f"model-{s}-t.safetensors" for s in seeds)]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        raise SystemExit(f"run the accuracy phase with --work {work} first; missing: {', '.join(missing)}")
    photos = [str(data / "test")]
    if args.cost_images:
        # Across the classes, in name order, so that a few images still span them.
        by_class = [sorted(c.iterdir()) for c in sorted((data / "test").iterdir())]
        chosen = [p for group in zip(*by_class) for p in group][:args.cost_images]
        listing = work / "cost-images.txt"
        listing.write_text("".join(f"{p}\n" for p in chosen))
        photos = ["--from-list", str(listing)]
    single, calibrated, with_sets = needed[:3]
    members = needed[3:]
    configs = {
        "one model": lambda out: predict(args, [single], photos, out),
        "one calibrated model (T)": lambda out: predict(args, [calibrated], photos, out),
        f"calibrated + {SET_RULES[0][0].upper()} sets, --abstain":
            lambda out: predict(args, [with_sets], photos, out, abstain=True),
        "one calibrated model, flip TTA": lambda out: predict(args, [calibrated], photos, out, "flip"),
        f"ensemble of {len(members)}": lambda out: predict(args, members, photos, out),
        f"ensemble of {len(members)}, flip TTA": lambda out: predict(args, members, photos, out, "flip"),
    }
    names = list(configs)
    results = {name: {"rates": [], "peaks": [], "passes": None, "images": None} for name in names}
    for repeat in range(args.repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            rate, peak, passes, images = configs[name](work / "cost-out")
            r = results[name]
            r["rates"].append(rate)
            r["peaks"].append(peak)
            r["passes"], r["images"] = passes, images
            print(f"  repeat {repeat}: {name}: {rate:.2f} img/s, {peak:.0f} MiB", file=sys.stderr, flush=True)
    shutil.rmtree(work / "cost-out", ignore_errors=True)
    (work / "cost.json").write_text(json.dumps(results, indent=1))
    base = statistics.median(results[names[0]]["rates"])
    images = results[names[0]]["images"]
    print(f"\n`rtrain predict --out` over {images} test images, {args.repeats} repeats in rotating order; "
          f"img/s: the whole job's (summary.json), median (min-max); peak: largest resident set.\n")
    print("| | passes per image | img/s | vs one model | peak MiB |")
    print("|---|---|---|---|---|")
    for name in names:
        r = results[name]
        rate = statistics.median(r["rates"])
        print(f"| {name} | {r['passes']} | {spread(r['rates'], 2)} | {rate / base:.2f}x "
              f"| {statistics.median(r['peaks']):.0f} |")
    print(f"\ncost phase {time.monotonic() - started:.0f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cost", action="store_true", help="the img/s phase (alone on a quiet machine)")
    parser.add_argument("--work", type=Path, default=ROOT / "runs/bench-trust",
                        help="data, models and reports; the cost phase reads the accuracy phase's models here")
    parser.add_argument("--rtrain", default=str(ROOT / "target/release/rtrain"))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--train-images", type=int, default=600)
    parser.add_argument("--held-out-images", type=int, default=400, help="dealt into cal/ and test/ halves")
    parser.add_argument("--photo-scale", type=float, default=0.1)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cost-images", type=int, default=0, help="the first N test images (0: all)")
    args = parser.parse_args()
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.cost:
        cost(args, args.work)
    else:
        accuracy(args, args.work)


if __name__ == "__main__":
    main()
