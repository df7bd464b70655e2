"""The case study's training job, its original script against rtrain, on the same synthetic
camera photos, side by side in one run.

The original is the Chishiki-AI "cnn-course" (TACC) script scaling_part3/torch_train_distributed.py,
ported to this machine in bench/tutorial_original.py (CPU, gloo, ranks from mpirun; its
docstring lists every change): ResNet-34 from ImageNet weights with an MLP head, AutoAugment ->
Resize((244, 244)) -> ToTensor, Adam 1e-4, batch 16 per rank, CrossEntropyLoss with label
smoothing 0.1, ReduceLROnPlateau on the validation loss, DistributedSampler + DataLoader (4 worker
processes per rank for training and 4 for validation, as the script has them), DDP over gloo,
plain BatchNorm (SyncBatchNorm refuses CPU tensors). Against it: `rtrain train --config
configs/designsafe-tutorial.toml` (sync_batchnorm = true there, so rtrain pays an all-reduce per
BatchNorm layer that the port does not), with `data.jpeg_draft` on (default) or off (--draft).

Data: `rtrain data synth --layout designsafe` writes Train/ and Validation/ with classes C0, C2,
C4 of camera-like JPEGs of mixed sizes (up to 6000x4000 times --photo-scale), some phone photos
with an EXIF orientation tag; or --data names an existing tree (e.g. the real Dataset_2).
Weights: tests/reference/tutorial_reference.py writes a seeded ResNet-34 state dict as
resnet34-<sha256[:8]>.pth into a temporary TORCH_HOME's hub/checkpoints (there is no internet for
torchvision's IMAGENET1K_V1); the port loads that file with load_state_dict, rtrain gets
model.weights="<file name>" and TORCH_HOME.

Both run under `mpirun -np R` (R from --ranks), alternating (rtrain, original, ...; the order
rotates with each repeat). Threads: every rank of both uses cores // R libtorch threads (the
port calls torch.set_num_threads; rtrain's default train.threads does the same) and rtrain's
loader its default data.workers = "auto".

What is timed and measured, per rank count:
  * train s/epoch: the training loop of one epoch (from the start of the epoch's loader to the
    last optimizer step; loader waits included, evaluation and checkpoints not), the mean over
    ranks, median over every epoch of every repeat (the first epoch included). rtrain: the
    epoch records' "seconds" in metrics.jsonl; the port: perf_counter marks around its loop.
  * wall s: the whole mpirun job (start-up, data set scan, weights, every epoch, evaluations,
    checkpoints, the final re-evaluation), median over repeats.
  * train img/s: training images of all ranks per second of the training loop.
  * peak RSS MiB: each rank's resident set, sampled from /proc every --sample-period s; for the
    port, the sum of the rank process and all of its descendants (its DataLoader worker
    processes), the peak of that sum; for rtrain, the rank process (one process; also its
    VmHWM); the largest rank, median over repeats (the issue's definition; see below).
  * val top-1: validation accuracy after the last epoch over all ranks (rtrain's val.top1; for
    the port, its predictions all-reduced after the evaluation, which DistributedSampler pads to
    a multiple of the ranks), with its binomial standard error; and the script's own number
    (rank 0's share, the mean of per-batch accuracies).
  * ratio: rtrain / original (goals: time <= 0.5x, memory <= 0.6x); for val top-1 the
    difference rtrain - original and that difference in standard errors (goal: within noise).
    Summed RSS counts each page a rank shares with its forked workers once per process, which
    inflates the original's figure several times over; --pss adds the summed proportional set
    size (shared pages split among their processes) for both sides, and the table always shows
    the original's rank process alone, for information.
Then the loader alone, on --loader-* photos (large by default): `rtrain bench loader` with the
tutorial config (AutoAugment -> Resize((244, 244))), draft on and off, against the script's
pipeline (ImageFolder + AutoAugment + Resize((244, 244)) + ToTensor + DataLoader, PIL decoding;
`bench/tutorial_original.py loader`), 1 worker, batch 16, img/s per worker (goals: >= 8x with
draft on, >= 1.2x with draft off).

Run from the repository root after `scripts/setup --test` and `cargo build --release`
(defaults take about 20 minutes on 2 cores):

    .deps/venv/bin/python bench/compare_tutorial.py [--ranks 1 2] [--repeats 1] [--epochs 2] \
        [--train-images 264] [--val-images 72] [--photo-scale 0.5] [--draft on|off|both] \
        [--loader-images 48] [--loader-photo-scale 1.0] [--loader-batches 4] [--pss] [--json OUT.json]

The case study's real sizes: --train-images 1322 --val-images 363 --photo-scale 1 --epochs 5
(hours on 2 cores); --data DIR uses an existing tree instead of synthetic photos;
--only original|rtrain runs one side; --skip-loader / --skip-train run one part.
"""
import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
          "--mca", "btl_vader_single_copy_mechanism", "none"]
CONFIG = ROOT / "configs/designsafe-tutorial.toml"
ORIGINAL = ROOT / "bench/tutorial_original.py"
PAGE = os.sysconf("SC_PAGE_SIZE")


class Failed(RuntimeError):
    """A benchmark command exited with an error; the message carries its output's tail."""


# --- memory, sampled from /proc -----------------------------------------------------------

def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _parents():
    """pid -> parent pid of every process now."""
    parents = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _read(f"/proc/{entry.name}/stat")
        if stat:
            # comm, in parentheses, may hold spaces: the fields after the last ')' are fixed.
            fields = stat[stat.rfind(b")") + 2:].split()
            parents[int(entry.name)] = int(fields[1])
    return parents


def _rss_mib(pid):
    statm = _read(f"/proc/{pid}/statm")
    return int(statm.split()[1]) * PAGE / 2**20 if statm else 0.0


def _pss_mib(pid):
    rollup = _read(f"/proc/{pid}/smaps_rollup")
    for line in (rollup or b"").splitlines():
        if line.startswith(b"Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _hwm_mib(pid):
    status = _read(f"/proc/{pid}/status")
    for line in (status or b"").splitlines():
        if line.startswith(b"VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class RankMemory(threading.Thread):
    """Samples, every `period` s, the resident set of each rank under `root` (mpirun): a rank is
    the topmost process whose argv `is_rank` accepts; its value is the sum over it and all its
    descendants (DataLoader workers). Keeps each rank's peak, the peak of the rank process alone,
    its VmHWM, and with `pss` the peak of the summed proportional set sizes (shared pages split
    between the processes that share them; costs a page-table walk per process and sample)."""

    def __init__(self, root, is_rank, period, pss=False):
        super().__init__(daemon=True)
        self.root, self.is_rank, self.period, self.pss = root, is_rank, period, pss
        self.peaks, self.alone, self.pss_peaks, self.hwm, self.argv = {}, {}, {}, {}, {}
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(self.period):
            try:
                self.sample()
            except Exception as e:  # a process that vanished mid-scan: the next sample sees it gone
                print(f"memory sample skipped: {e}", file=sys.stderr)

    def _argv(self, pid):
        raw = _read(f"/proc/{pid}/cmdline")
        return [a.decode(errors="replace") for a in raw.split(b"\0") if a] if raw else []

    def sample(self):
        children = {}
        for pid, parent in _parents().items():
            children.setdefault(parent, []).append(pid)

        def subtree(pid):
            out, todo = [], [pid]
            while todo:
                p = todo.pop()
                out.append(p)
                todo.extend(children.get(p, []))
            return out

        todo = list(children.get(self.root, []))
        while todo:
            pid = todo.pop()
            if self.is_rank(self._argv(pid)):
                members = subtree(pid)
                total = sum(_rss_mib(p) for p in members)
                self.peaks[pid] = max(self.peaks.get(pid, 0.0), total)
                self.alone[pid] = max(self.alone.get(pid, 0.0), _rss_mib(pid))
                if self.pss:
                    self.pss_peaks[pid] = max(self.pss_peaks.get(pid, 0.0), sum(_pss_mib(p) for p in members))
                self.hwm[pid] = max(self.hwm.get(pid, 0.0), _hwm_mib(pid))
                self.argv.setdefault(pid, self._argv(pid))
            else:
                todo.extend(children.get(pid, []))

    def per_rank(self, count_hwm):
        """Peak MiB per rank process seen; with count_hwm, at least the rank's own VmHWM."""
        return sorted((max(peak, self.hwm.get(pid, 0.0)) if count_hwm else peak)
                      for pid, peak in self.peaks.items())

    def details(self):
        """Per rank (largest first): the rank process alone, its VmHWM, and the PSS sum."""
        return {"rank_process_alone_peak_mib": sorted(self.alone.values()),
                "rank_process_vmhwm_mib": sorted(self.hwm.values()),
                "pss_sum_peak_mib": sorted(self.pss_peaks.values()) if self.pss else None}


def run_job(command, env, cwd, log, is_rank, period, count_hwm, pss=False, details=None):
    """Runs an mpirun job, sampling its ranks' memory; returns (wall seconds, per-rank peak MiB).
    `details`, a dict, receives RankMemory.details()."""
    with open(log, "w") as out:
        started = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, text=True)
        sampler = RankMemory(child.pid, is_rank, period, pss)
        sampler.start()
        code = child.wait()
        wall = time.perf_counter() - started
        sampler.done.set()
        sampler.join()
    if code != 0:
        tail = Path(log).read_text(errors="replace")[-4000:]
        raise Failed(f"{' '.join(map(str, command))} exited with {code}:\n{tail}")
    if details is not None:
        details.update(sampler.details())
    return wall, sampler.per_rank(count_hwm)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the two training jobs ----------------------------------------------------------------

def run_rtrain(args, ranks, draft, data, weights_name, run, env):
    command = [*MPIRUN, "-np", str(ranks), args.rtrain, "train", "--config", str(CONFIG), "--run-dir", str(run),
               "--set", f"data.root=\"{data}\"", "--set", f"model.weights=\"{weights_name}\"",
               "--set", f"train.epochs={args.epochs}", "--set", f"data.jpeg_draft={'true' if draft else 'false'}"]
    for setting in args.rtrain_set:
        command += ["--set", setting]
    exe = os.path.basename(args.rtrain)
    memory = {}
    # The rank: argv[0] is rtrain (or argv[1], where an interpreter or wrapper runs it).
    wall, peaks = run_job(command, env, ROOT, f"{run}.log",
                          lambda argv: exe in [os.path.basename(x) for x in argv[:2]], args.sample_period,
                          count_hwm=True, pss=args.pss, details=memory)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    epochs = [r for r in records if r.get("kind") == "epoch"]
    summary = json.loads((run / "summary.json").read_text())
    last = epochs[-1]["val"]
    return {
        "wall_seconds": wall, "peak_rss_mib_per_rank": peaks,
        "epoch_seconds": [e["seconds"] for e in epochs],
        "train_images_per_second": [e["train_images_per_second"] for e in epochs],
        "val_top1": last["top1"], "val_samples": last["samples"],
        "val_top1_per_epoch": [e["val"]["top1"] for e in epochs],
        "best_eval_top1": (summary.get("best_eval") or {}).get("top1"),
        "rtrain_wall_seconds": summary.get("wall_seconds"), "threads": summary.get("threads"),
        "rtrain_peak_rss_mib": summary.get("peak_rss_mib"), "memory": memory,
    }


def run_original(args, ranks, data, weights_file, run, env):
    run.mkdir(parents=True)
    command = [*MPIRUN, "-np", str(ranks), sys.executable, str(ORIGINAL), "train", "--data", str(data),
               "--weights", str(weights_file), "--epochs", str(args.epochs), "--workers", str(args.workers),
               "--metrics-dir", str(run)]
    env = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    memory = {}
    wall, peaks = run_job(command, env, run, f"{run}.log", lambda argv: len(argv) > 1 and
                          argv[1].endswith("tutorial_original.py"), args.sample_period, count_hwm=True,
                          pss=args.pss, details=memory)
    records = [json.loads(line) for path in sorted(run.glob("original-rank*.jsonl"))
               for line in path.read_text().splitlines() if line.strip()]
    epochs = sorted({r["epoch"] for r in records if r["kind"] == "epoch"})
    per_epoch = [[r for r in records if r["kind"] == "epoch" and r["epoch"] == e] for e in epochs]
    for rows in per_epoch:
        if len(rows) != ranks:
            raise Failed(f"{run}: {len(rows)} epoch records from {ranks} ranks")
    seconds = [statistics.mean(r["train_seconds"] for r in rows) for rows in per_epoch]
    images = [sum(r["train_images"] for r in rows) for rows in per_epoch]
    last = per_epoch[-1][0]
    final = next((r for r in records if r["kind"] == "final"), {})
    rank0_last = next(r for r in per_epoch[-1] if r["rank"] == 0)
    return {
        "wall_seconds": wall, "peak_rss_mib_per_rank": peaks,
        "epoch_seconds": seconds,
        "epoch_seconds_with_eval": [statistics.mean(r["epoch_seconds"] for r in rows) for rows in per_epoch],
        "train_images_per_second": [n / s for n, s in zip(images, seconds)],
        "val_top1": last["val_correct_all_ranks"] / max(last["val_samples_all_ranks"], 1),
        "val_samples": last["val_samples_all_ranks"],
        "val_top1_per_epoch": [rows[0]["val_correct_all_ranks"] / max(rows[0]["val_samples_all_ranks"], 1)
                               for rows in per_epoch],
        "script_val_accuracy_rank0": rank0_last["val_accuracy"],
        "best_eval_top1_rank0": final.get("best_val_accuracy"),
        "threads": final.get("threads"), "workers": args.workers, "memory": memory,
    }


# --- the loaders --------------------------------------------------------------------------

def last_json(command, env=None):
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise Failed(f"{' '.join(map(str, command))} exited with {done.returncode}:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def loader_runs(args, data, env):
    common = ["--workers", "1", "--batch-size", "16", "--batches", str(args.loader_batches)]
    jobs = {
        "torchvision": [sys.executable, str(ORIGINAL), "loader", "--data", str(data / "Train"), *common],
        "rtrain draft on": [args.rtrain, "bench", "loader", "--data", str(data), "--split", "Train",
                            "--config", str(CONFIG), "--set", "data.jpeg_draft=true", *common, "--json"],
        "rtrain draft off": [args.rtrain, "bench", "loader", "--data", str(data), "--split", "Train",
                             "--config", str(CONFIG), "--set", "data.jpeg_draft=false", *common, "--json"],
    }
    if args.only == "original":
        jobs = {"torchvision": jobs["torchvision"]}
    elif args.only == "rtrain":
        jobs.pop("torchvision")
    results = {name: [] for name in jobs}
    names = list(jobs)
    for repeat in range(args.repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            result = last_json(jobs[name], env)
            results[name].append(result)
            print(f"loader {name}: {result['images_per_second_per_core']:.2f} img/s per core", file=sys.stderr)
    return results


# --- tables -------------------------------------------------------------------------------

def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def summarise(runs):
    """Medians over repeats (epoch values over every epoch of every repeat)."""
    if not runs:
        return None
    return {
        "train_seconds_per_epoch": median([s for r in runs for s in r["epoch_seconds"]]),
        "wall_seconds": median([r["wall_seconds"] for r in runs]),
        "train_images_per_second": median([x for r in runs for x in r["train_images_per_second"]]),
        "peak_rss_mib_largest_rank": median([max(r["peak_rss_mib_per_rank"], default=None) for r in runs]),
        "rank_process_alone_peak_mib": median([max(r["memory"]["rank_process_alone_peak_mib"], default=None)
                                               for r in runs]),
        "pss_sum_peak_mib": median([max(r["memory"]["pss_sum_peak_mib"] or [], default=None) for r in runs]),
        "val_top1": median([r["val_top1"] for r in runs]),
        "val_samples": runs[-1]["val_samples"],
        "script_val_accuracy_rank0": median([r.get("script_val_accuracy_rank0") for r in runs]),
    }


def print_training(args, table):
    cores = len(os.sched_getaffinity(0))
    for ranks, sides in table.items():
        original = summarise(sides.get("original"))
        variants = [name for name in sides if name != "original"]
        print(f"\n{ranks} rank(s), {max(cores // ranks, 1)} libtorch threads per rank; "
              f"{args.epochs} epochs x {args.repeats} repeat(s), alternating; original: {args.workers} DataLoader "
              f"workers per rank, plain BatchNorm; rtrain: configs/designsafe-tutorial.toml")
        header = f"{'':34} {'original':>10}"
        for name in variants:
            header += f" {name:>18} {'ratio':>7}"
        print(header)
        rows = [
            ("train s/epoch (loop, median)", "train_seconds_per_epoch", 2, "goal <= 0.5x"),
            ("wall s (whole job)", "wall_seconds", 1, ""),
            ("train img/s (all ranks)", "train_images_per_second", 2, ""),
            ("peak RSS MiB (largest rank)", "peak_rss_mib_largest_rank", 0, "goal <= 0.6x"),
            ("val top-1, last epoch (all ranks)", "val_top1", 3, "ratio column: rtrain - original"),
        ]
        for label, key, digits, goal in rows:
            line = f"{label:34} {fmt(original and original[key], digits):>10}"
            for name in variants:
                ours = summarise(sides[name])
                if key == "val_top1":  # a difference, not a ratio
                    gap = None if not original or ours[key] is None else ours[key] - original[key]
                    line += f" {fmt(ours[key], digits):>18} {'-' if gap is None else f'{gap:+.3f}':>7}"
                    continue
                r = ratio(ours[key], original and original[key])
                line += f" {fmt(ours[key], digits):>18} {fmt(r, 2) + 'x' if r is not None else '-':>7}"
            print(line + (f"  {goal}" if goal else ""))
        if original:
            print(f"{'  rank process alone, peak RSS MiB':34} {fmt(original['rank_process_alone_peak_mib'], 0):>10}"
                  "  (without its DataLoader workers, for information)")
            if args.pss:
                line = f"{'  peak PSS MiB (rank + workers)':34} {fmt(original['pss_sum_peak_mib'], 0):>10}"
                for name in variants:
                    ours = summarise(sides[name])["pss_sum_peak_mib"]
                    r = ratio(ours, original["pss_sum_peak_mib"])
                    line += f" {fmt(ours, 0):>18} {fmt(r, 2) + 'x' if r is not None else '-':>7}"
                print(line)
            print(f"{'  script val acc (rank 0 share)':34} {fmt(original['script_val_accuracy_rank0'], 3):>10}")
        # Noise: the binomial standard error of each top-1 and the gap in those units.
        for name in variants:
            ours = summarise(sides[name])
            if original and ours and ours["val_top1"] is not None:
                def se(p, n):
                    return math.sqrt(max(p * (1 - p), 1e-12) / max(n, 1))
                spread = math.hypot(se(ours["val_top1"], ours["val_samples"]),
                                    se(original["val_top1"], original["val_samples"]))
                gap = ours["val_top1"] - original["val_top1"]
                print(f"  val top-1 {name} - original: {gap:+.3f} ({gap / spread:+.1f} standard errors; "
                      f"{ours['val_samples']} / {original['val_samples']} images)")


def print_loader(args, results):
    med = {name: median([r["images_per_second_per_core"] for r in rs]) for name, rs in results.items()}
    print(f"\nloader: 1 worker, batch 16, {args.loader_batches} batches after 1 warm-up, {args.repeats} "
          f"alternating run(s); AutoAugment -> Resize((244, 244)) -> ToTensor; img/s per core, median (min-max)")
    for name, rs in results.items():
        values = [r["images_per_second_per_core"] for r in rs]
        line = f"  {name:18} {med[name]:8.2f} ({min(values):.2f}-{max(values):.2f})"
        if name != "torchvision" and "torchvision" in med:
            goal = ">= 8x" if name.endswith("on") else ">= 1.2x"
            line += f"  {med[name] / med['torchvision']:6.2f}x torchvision (goal {goal})"
        print(line)


# --- main ---------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-images", type=int, default=264, help="the case study: 1322")
    parser.add_argument("--val-images", type=int, default=72, help="the case study: 363")
    parser.add_argument("--photo-scale", type=float, default=0.5, help="1: photos up to 6000x4000")
    parser.add_argument("--data", type=Path, help="an existing tree with Train/ and Validation/ (no synthesis)")
    parser.add_argument("--draft", choices=["on", "off", "both"], default="on",
                        help="rtrain's data.jpeg_draft in the training runs")
    parser.add_argument("--workers", type=int, default=4, help="the original's DataLoader workers (the script: 4)")
    parser.add_argument("--rtrain-set", action="append", default=[], metavar="KEY=VALUE",
                        help="more --set for rtrain train (e.g. model.sync_batchnorm=false)")
    parser.add_argument("--loader-images", type=int, default=48, help="training photos of the loader data")
    parser.add_argument("--loader-photo-scale", type=float, default=1.0)
    parser.add_argument("--loader-data", type=Path, help="an existing tree for the loader (default: synthesised, "
                        "or --data when given)")
    parser.add_argument("--loader-batches", type=int, default=4)
    parser.add_argument("--skip-loader", action="store_true")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--only", choices=["original", "rtrain"], help="run one side only")
    parser.add_argument("--sample-period", type=float, default=0.2, help="seconds between memory samples")
    parser.add_argument("--pss", action="store_true", help="also sample the summed PSS (shared pages counted "
                        "once; a little more CPU per sample)")
    parser.add_argument("--rtrain", default=str(ROOT / "target/release/rtrain"))
    parser.add_argument("--work", type=Path, help="keep data, weights and runs here (default: a temporary "
                        "directory, removed at the end)")
    parser.add_argument("--json", type=Path, help="write every number (per run, per epoch) here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        work = (args.work or Path(scratch)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        torch_home = work / "torch-home"
        checkpoints = torch_home / "hub" / "checkpoints"
        checkpoints.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
               "RUST_LOG": "warn", "TORCH_HOME": str(torch_home)}

        def synth(out, train, val, scale):
            if not (out / "Train").exists():
                print(f"rtrain data synth {out.name}: {train} + {val} photos at scale {scale}", file=sys.stderr)
                subprocess.run([args.rtrain, "data", "synth", str(out), "--layout", "designsafe",
                                "--train-images", str(train), "--val-images", str(val),
                                "--photo-scale", str(scale), "--seed", "0"], check=True, env=env, stdout=sys.stderr)
            return out

        data = args.data.resolve() if args.data else None
        report = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  "cores": len(os.sched_getaffinity(0)), "training": {}, "loader": {}}

        table = {}
        if not args.skip_train:
            if data is None:
                data = synth(work / f"photos-{args.train_images}-{args.val_images}-{args.photo_scale}",
                             args.train_images, args.val_images, args.photo_scale)
            names = sorted(p.name for p in checkpoints.glob("resnet34-*.pth"))
            if not names:
                names = [subprocess.run([sys.executable, str(ROOT / "tests/reference/tutorial_reference.py"),
                                         "weights", str(checkpoints), "imagenet"], check=True, capture_output=True,
                                        text=True, env=env).stdout.strip()]
            weights_name = names[0]
            drafts = {"on": [True], "off": [False], "both": [True, False]}[args.draft]
            for ranks in args.ranks:
                sides = {}
                jobs = []
                if args.only != "original":
                    jobs += [(f"rtrain draft {'on' if d else 'off'}", d) for d in drafts]
                if args.only != "rtrain":
                    jobs.insert(1 if jobs else 0, ("original", None))
                for repeat in range(args.repeats):
                    shift = repeat % len(jobs)
                    for name, draft in jobs[shift:] + jobs[:shift]:
                        run = work / "runs" / f"{name.replace(' ', '-')}-np{ranks}-r{repeat}"
                        if run.exists():
                            raise SystemExit(f"{run} exists: give a fresh --work")
                        run.parent.mkdir(parents=True, exist_ok=True)
                        print(f"{ranks} rank(s), repeat {repeat}: {name}", file=sys.stderr)
                        if name == "original":
                            result = run_original(args, ranks, data, checkpoints / weights_name, run, env)
                        else:
                            result = run_rtrain(args, ranks, draft, data, weights_name, run, env)
                        print(f"  train s/epoch {[round(s, 1) for s in result['epoch_seconds']]}, wall "
                              f"{result['wall_seconds']:.1f} s, peak MiB per rank "
                              f"{[round(p) for p in result['peak_rss_mib_per_rank']]}, val top-1 "
                              f"{result['val_top1']:.3f}", file=sys.stderr)
                        sides.setdefault(name, []).append(result)
                table[ranks] = {name: sides[name] for name, _ in jobs}
                report["training"][str(ranks)] = {name: {"runs": runs, "median": summarise(runs)}
                                                  for name, runs in table[ranks].items()}

        loader = {}
        if not args.skip_loader:
            loader_data = args.loader_data.resolve() if args.loader_data else (
                args.data.resolve() if args.data else
                synth(work / f"loader-photos-{args.loader_images}-{args.loader_photo_scale}",
                      args.loader_images, 3, args.loader_photo_scale))
            loader = loader_runs(args, loader_data, env)
            report["loader"] = {name: {"runs": rs, "median_images_per_second_per_core":
                                       median([r["images_per_second_per_core"] for r in rs])}
                                for name, rs in loader.items()}

        if table:
            print_training(args, table)
        if loader:
            print_loader(args, loader)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
