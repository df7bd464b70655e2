"""Giving photos their buildings, rtrain (`rtrain bench assign`) vs geopandas doing the same join:
read the footprints GeoJSON, project footprints and photos into the same metric plane (PROJ's
+proj=ortho on WGS 84 at the centre of the footprints' bounding box, rtrain's), sjoin(within),
then sjoin_nearest(max_distance) for the rest (tests/reference/footprints_reference.py).

Generates a neighbourhood of about 100,000 footprints (row houses sharing walls, courtyard
buildings with holes, house + garage MultiPolygons, irregular shapes) and 50,000 photos without
a heading (inside, near, in courtyards, on shared corners, far), then alternates the two, each
run a fresh process, and prints medians over --repeats runs of the time to read, the time to
project + index + assign (geopandas: to_crs + sjoin + sjoin_nearest), the peak resident memory
(VmHWM on both sides), and the ratios. Run from the repository root after
`scripts/setup --test` and `cargo build --release`:

    .deps/venv/bin/python bench/compare_assign.py [--repeats 3] [--blocks 80] [--photos 50000]
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests/reference"))
import footprints_reference  # noqa: E402


def peak_rss_mib():
    """This process's peak resident memory, VmHWM as rtrain reads it. Not ru_maxrss: Linux
    carries that across fork and exec, so a child of this script (which generated the data)
    would start at the parent's peak."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def geopandas_once(footprints, photos, max_distance):
    """One geopandas run in this process: prints its timings and peak memory as JSON."""
    import geopandas  # noqa: F401  (imported before measuring the baseline)
    import pyproj  # noqa: F401

    before = peak_rss_mib()
    timings = {}
    _, result, _, _ = footprints_reference.assign(footprints, photos, max_distance, timings)
    kinds = {}
    for _, kind, _ in result:
        kinds[kind] = kinds.get(kind, 0) + 1
    print(json.dumps({
        "read_seconds": timings["read_seconds"],
        "join_seconds": timings["join_seconds"],
        "rss_before_mib": before,
        "peak_rss_mib": peak_rss_mib(),
        "kinds": dict(sorted(kinds.items())),
    }))


def run(command):
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def spread(values, digits=2):
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=80, help="blocks per side (80: ~100,000 footprints)")
    parser.add_argument("--photos", type=int, default=50000)
    parser.add_argument("--max-distance", type=float, default=30.0)
    parser.add_argument("--rtrain", default=str(ROOT / "target/release/rtrain"))
    parser.add_argument("--work", help="keep the generated files here (default: a temporary directory)")
    parser.add_argument("--geopandas-once", nargs=2, metavar=("FOOTPRINTS", "PHOTOS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.geopandas_once:
        geopandas_once(*args.geopandas_once, args.max_distance)
        return

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.work or scratch)
        work.mkdir(parents=True, exist_ok=True)
        footprints, photos = work / "footprints.geojson", work / "photos.csv"
        if not footprints.exists():
            started = time.perf_counter()
            count = footprints_reference.generate(str(work), args.blocks, args.blocks, args.photos, 52, headings=False)
            print(f"generated {count} footprints, {args.photos} photos in {time.perf_counter() - started:.0f} s",
                  file=sys.stderr)
        results = {"rtrain": [], "geopandas": []}
        for _ in range(args.repeats):
            results["rtrain"].append(run([args.rtrain, "bench", "assign", "--json", "--footprints", str(footprints),
                                          "--photos", str(photos), "--max-distance", str(args.max_distance)]))
            results["geopandas"].append(run([sys.executable, __file__, "--geopandas-once", str(footprints),
                                             str(photos), "--max-distance", str(args.max_distance)]))
            print(f"rtrain {results['rtrain'][-1]}\ngeopandas {results['geopandas'][-1]}", file=sys.stderr)

    rtrain, geopandas = results["rtrain"], results["geopandas"]
    r_read = [r["read_seconds"] for r in rtrain]
    r_join = [r["index_seconds"] + r["assign_seconds"] for r in rtrain]
    g_read = [g["read_seconds"] for g in geopandas]
    g_join = [g["join_seconds"] for g in geopandas]
    r_mem = [r["peak_rss_mib"] for r in rtrain]
    g_mem = [g["peak_rss_mib"] for g in geopandas]
    median = statistics.median
    print(f"\n{rtrain[0]['footprints']} footprints, {rtrain[0]['photos']} photos without heading, "
          f"max distance {args.max_distance} m; medians (min-max) of {args.repeats} runs")
    print("| | read footprints (s) | project + index + assign (s) | total (s) | peak RSS (MiB) | RSS before reading (MiB) |")
    print("|---|---|---|---|---|---|")
    for name, read, join, mem, runs in [("rtrain", r_read, r_join, r_mem, rtrain),
                                        ("geopandas", g_read, g_join, g_mem, geopandas)]:
        total = [a + b for a, b in zip(read, join)]
        print(f"| {name} | {spread(read)} | {spread(join)} | {spread(total)} | {spread(mem, 0)} | "
              f"{median([r['rss_before_mib'] for r in runs]):.0f} |")
    total_ratio = (median(g_read) + median(g_join)) / (median(r_read) + median(r_join))
    print(f"| geopandas / rtrain | {median(g_read) / median(r_read):.1f}x | {median(g_join) / median(r_join):.1f}x | "
          f"{total_ratio:.1f}x | {median(g_mem) / median(r_mem):.1f}x | |")
    print(f"\nkinds: rtrain {rtrain[0]['kinds']}, geopandas {geopandas[0]['kinds']}")


if __name__ == "__main__":
    main()
