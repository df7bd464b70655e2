"""Training-step throughput, rtrain vs PyTorch eager, side by side in one run.

Alternates `rtrain bench step --json` and bench/step_reference.py (torchvision, same libtorch)
for each configuration, several repetitions each, and prints medians, spread and the ratio
rtrain / PyTorch. Run from the repository root after `scripts/setup --test` and
`cargo build --release`:

    .deps/venv/bin/python bench/compare_step.py [--repeats 3] [--threads 2] [--sizes 64 224]

Each model and size runs in four modes: fp32 and bf16 autocast, each NCHW and channels-last.
The last column compares rtrain's best mode with PyTorch's best mode. The limit: the step's
floating-point rate (src/model/flops.rs counts the work) as a share of this CPU's attainable rate,
measured with large matrix products through the same libtorch (`rtrain bench peak`). Peak
memory is each process's largest resident set, measured from outside (bench/measure.py).
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import measure

ROOT = Path(__file__).resolve().parent.parent


def run(command):
    """The command's last JSON line, with its peak resident memory added as `peak_mib`."""
    out, peak_mib = measure.run(command)
    return {**json.loads(out.strip().splitlines()[-1]), "peak_mib": peak_mib}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--archs", nargs="+", default=["resnet18"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[64, 224])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before the timed ones")
    parser.add_argument("--modes", nargs="+", default=["fp32", "fp32-cl", "bf16", "bf16-cl"],
                        help="precision, with -cl for channels-last")
    parser.add_argument("--rtrain", default=str(ROOT / "target/release/rtrain"))
    args = parser.parse_args()

    # Per precision, the fastest of the repetitions: on a shared machine the slower ones were
    # disturbed.
    peak = {}
    for precision in sorted({mode.partition("-")[0] for mode in args.modes}):
        peak[precision] = run([args.rtrain, "bench", "peak", "--json", "--threads", str(args.threads), "--size",
                               "4096", "--repeats", "5", "--precision", precision])["best_gflops"]
        print(f"attainable: {peak[precision]:.1f} GFLOP/s {precision} (best 4096x4096 matrix product, "
              f"{args.threads} threads)", file=sys.stderr)
    rows = []
    flop_per_step = {}
    for arch in args.archs:
        for size in args.sizes:
            for mode in args.modes:
                precision, _, layout = mode.partition("-")
                common = ["--arch", arch, "--image-size", str(size), "--batch-size", str(args.batch_size),
                          "--threads", str(args.threads), "--warmup", str(args.warmup), "--steps", str(args.steps),
                          "--precision", precision]
                if layout == "cl":
                    common.append("--channels-last")
                ours, theirs, memory = [], [], ([], [])
                for _ in range(args.repeats):
                    result = run([args.rtrain, "bench", "step", "--json", *common])
                    flop_per_step[(arch, size)] = result["gflop_per_step"]
                    ours.append(result["images_per_second"])
                    memory[0].append(result["peak_mib"])
                    result = run([sys.executable, str(ROOT / "bench/step_reference.py"), *common])
                    theirs.append(result["images_per_second"])
                    memory[1].append(result["peak_mib"])
                rows.append((arch, size, mode, ours, theirs, memory))
                print(f"{arch} @{size} {mode}: rtrain {[round(x, 1) for x in ours]} "
                      f"pytorch {[round(x, 1) for x in theirs]}", file=sys.stderr)

    print(f"\ntraining step, batch {args.batch_size}, {args.threads} threads, {args.repeats} alternating runs "
          f"x {args.steps} timed steps; img/s median (min-max)")
    print(f"{'model':<10} {'size':>4} {'mode':<8} {'rtrain':>22} {'pytorch':>22} {'ratio':>6} "
          f"{'peak MiB rtrain/pt':>19}")
    fmt = lambda xs: f"{statistics.median(xs):7.1f} ({min(xs):.1f}-{max(xs):.1f})"  # noqa: E731
    for arch, size, mode, ours, theirs, memory in rows:
        ratio = statistics.median(ours) / statistics.median(theirs)
        peaks = f"{statistics.median(memory[0]):.0f} / {statistics.median(memory[1]):.0f}"
        print(f"{arch:<10} {size:>4} {mode:<8} {fmt(ours):>22} {fmt(theirs):>22} {ratio:6.2f}x {peaks:>19}")
    for arch in args.archs:
        for size in args.sizes:
            group = [r for r in rows if r[0] == arch and r[1] == size]
            best_ours = max(group, key=lambda r: statistics.median(r[3]))
            best_theirs = max(group, key=lambda r: statistics.median(r[4]))
            ratio = statistics.median(best_ours[3]) / statistics.median(best_theirs[4])
            print(f"best vs best, {arch} @{size}: rtrain {best_ours[2]} {statistics.median(best_ours[3]):.1f} / "
                  f"pytorch {best_theirs[2]} {statistics.median(best_theirs[4]):.1f} = {ratio:.2f}x")
            gflops = flop_per_step[(arch, size)] / args.batch_size * statistics.median(best_ours[3])
            precision = best_ours[2].partition("-")[0]
            print(f"limit, {arch} @{size}: {flop_per_step[(arch, size)]:.1f} GFLOP/step, rtrain {best_ours[2]} at "
                  f"{gflops:.1f} GFLOP/s = {100 * gflops / peak[precision]:.0f}% of the attainable "
                  f"{peak[precision]:.1f} GFLOP/s {precision}")


if __name__ == "__main__":
    main()
