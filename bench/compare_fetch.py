"""`rtrain data fetch` vs curl on the same file over loopback, side by side in one run.

Writes a file of random bytes (--mib, default 1024), serves it from a local HTTP server
(Python's http.server, loopback only), and alternates `curl -o`, `curl -o && sha256sum` (what
a careful user does by hand) and `rtrain data fetch --sha256` (streams, hashes, syncs and
renames into place), several repetitions each; prints median seconds, MB/s and ratios.
Run from the repository root after `cargo build --release`:

    python3 bench/compare_fetch.py [--mib 1024] [--repeats 3]
"""
import argparse
import hashlib
import http.server
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(command, **kwargs):
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, **kwargs)
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rtrain", default=str(ROOT / "target/release/rtrain"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        served = scratch / "served"
        served.mkdir()
        payload = served / "blob.bin"
        digest = hashlib.sha256()
        with open(payload, "wb") as f:
            for _ in range(args.mib):
                chunk = os.urandom(1 << 20)
                digest.update(chunk)
                f.write(chunk)
        sha256 = digest.hexdigest()

        handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(served), **k)  # noqa: E731
        http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/blob.bin"

        out = scratch / "out.bin"
        results = {"curl": [], "curl + sha256sum": [], "rtrain fetch": []}
        for _ in range(args.repeats):
            for name, command in [
                ("curl", ["curl", "-sS", "-o", str(out), url]),
                ("curl + sha256sum", ["sh", "-c", f'curl -sS -o "{out}" "{url}" && sha256sum "{out}"']),
                ("rtrain fetch", [args.rtrain, "data", "fetch", url, str(out), "--sha256", sha256, "--no-progress"]),
            ]:
                out.unlink(missing_ok=True)
                results[name].append(timed(command, env={**os.environ, "RUST_LOG": "warn"}))
        server.shutdown()

    size_mb = args.mib * (1 << 20) / 1e6
    print(f"\nfetch of {args.mib} MiB over loopback (Python http.server), {args.repeats} alternating runs; "
          f"seconds median (min-max)")
    curl = statistics.median(results["curl"])
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:>18}: {median:6.2f} ({min(values):.2f}-{max(values):.2f}) s, {size_mb / median:7.0f} MB/s, "
              f"{median / curl:.2f}x curl's time")


if __name__ == "__main__":
    main()
