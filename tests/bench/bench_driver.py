"""Driver benchmark: how much of ``rmqstore audit``, ``rebuild`` and ``export`` stays in the driver as a store
grows, and what the run costs at 1 and 2 workers, in one run.

Not part of the test run. ``python -m tests.bench.bench_driver [--sizes 2GB,8GB] [--segment-size 1GB]
[--commands audit,rebuild,export] [--workers 1,2] [--repeat 2] [--keep DIR]``

The store is bench_scan's synthetic one, in the broker's default 1 GB segments; ``audit`` runs on it with
the consume queues and index files a rebuild writes beside it (bench_engines.complete_store). Each
command runs as a user types it (the ``rmqstore`` script), on the default engine (a process pool here),
and reports at exit the CPU seconds of its own process (``os.times``: the driver alone, not its workers
or their children). Printed per command and size: wall seconds, driver CPU seconds, peak anonymous RSS
(RssAnon, sampled every 50 ms) of the driver and of the largest other process; then the driver's
marginal CPU per GB as the slope between the smallest and the largest size (each the least of ``--repeat``
runs, every file of the store warmed before each), and the RSS growth (the greatest); then
each command at each worker count on the smallest store. Targets (issue "scale-out"): driver slope
<= 0.08 CPU-s per GB for audit, rebuild and export; peak RssAnon of any process within 1.3x from the
smallest to the largest size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from tests.bench.bench_engines import complete_store, run_measured, warm_store
from tests.bench.bench_scan import build_store, parse_size

# the rmqstore script, reporting its own process's CPU seconds (user, system) at exit
SCRIPT = ("import atexit, json, os, sys\n"
          "def _times():\n"
          "    t = os.times()\n"
          "    with open(os.environ['RMQ_BENCH_TIMES'], 'w') as f:\n"
          "        json.dump([t.user, t.system], f)\n"
          "atexit.register(_times)\n"
          "from jobs.cli import console_main\n"
          "sys.exit(console_main())\n")


def run_driver(argv: list[str]) -> dict[str, float]:
    """Run one command: wall seconds, the driver's own CPU seconds, peak RssAnon (MB) of the driver and of
    the largest descendant."""
    fd, times = tempfile.mkstemp(prefix="rmq-bench-times-")
    os.close(fd)
    wall, driver_kb, worker_kb, _ = run_measured([sys.executable, "-c", SCRIPT, *argv],
                                              env={**os.environ, "RMQ_BENCH_TIMES": times})
    with open(times) as f:
        user, system = json.load(f)
    os.unlink(times)
    return {"wall": wall, "cpu": user + system, "driver_mb": driver_kb / 1024, "worker_mb": worker_kb / 1024}


def _argv(cmd: str, store: Path, out: Path, workers: int | None, rmq: list[str]) -> tuple[list[str], Path]:
    src = complete_store(store, rmq) if cmd == "audit" else store
    extra = ["--out", str(out)] if cmd in ("rebuild", "export") else []
    w = ["--workers", str(workers)] if workers else []
    return [cmd, str(src), *extra, *w, "--quiet"], src


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2GB,8GB")
    ap.add_argument("--segment-size", default="1GB")
    ap.add_argument("--commands", default="audit,rebuild,export")
    ap.add_argument("--workers", default="1,2", help="worker counts to run each command at (smallest store)")
    ap.add_argument("--keep", metavar="DIR", help="keep (and reuse) the generated stores here")
    ap.add_argument("--repeat", type=int, default=2,
                    help="runs of each command and size: the driver's CPU is their least (what the code costs, "
                         "without a cold file or a busy neighbour), peak RSS their greatest")
    args = ap.parse_args(argv)
    cmds = [c for c in args.commands.split(",") if c]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    seg = parse_size(args.segment_size)
    work = Path(args.keep or tempfile.mkdtemp(prefix="rmqstore-bench-driver-"))
    rmq = [sys.executable, "-c", "import sys; from jobs.cli import console_main; sys.exit(console_main())"]
    got: dict[tuple[str, int], dict[str, float]] = {}
    try:
        for size in sizes:
            store = work / f"store-{size}-{seg}"
            if not store.is_dir():
                build_store(store, size, seg)
            gb = sum(f.stat().st_size for f in (store / "commitlog").iterdir()) / 1e9
            print(f"\n== {gb:.2f} GB in {len(os.listdir(store / 'commitlog'))} segment(s)", flush=True)
            for cmd in cmds:
                out = work / f"out-{cmd}"
                a, src = _argv(cmd, store, out, None, rmq)
                runs = []
                for _ in range(max(1, args.repeat)):
                    shutil.rmtree(out, ignore_errors=True)
                    warm_store(src)  # a cold consume queue or index file: ~0.2 driver CPU-s more at 8 GB
                    runs.append(run_driver(a))
                    shutil.rmtree(out, ignore_errors=True)
                r = got[(cmd, size)] = {"wall": min(x["wall"] for x in runs), "cpu": min(x["cpu"] for x in runs),
                                        "driver_mb": max(x["driver_mb"] for x in runs),
                                        "worker_mb": max(x["worker_mb"] for x in runs), "gb": gb}
                each = " ".join(f"{x['cpu']:.2f}" for x in runs)
                print(f"{cmd:8s} {r['wall']:7.2f} s   driver CPU {r['cpu']:6.2f} s ({r['cpu'] / gb:.3f} s/GB; runs "
                      f"{each})   peak RssAnon driver {r['driver_mb']:6.0f} MB, "
                      f"largest other {r['worker_mb']:6.0f} MB", flush=True)
        if len(sizes) > 1:
            lo, hi = min(sizes), max(sizes)
            print("\n== the driver's marginal CPU per GB (slope between the sizes) and RSS growth")
            for cmd in cmds:
                a, b = got[(cmd, lo)], got[(cmd, hi)]
                slope = (b["cpu"] - a["cpu"]) / (b["gb"] - a["gb"])
                print(f"{cmd:8s} {slope:+.3f} CPU-s/GB (target <= 0.08)   RssAnon driver "
                      f"{b['driver_mb'] / max(a['driver_mb'], 1):.2f}x, largest other "
                      f"{b['worker_mb'] / max(a['worker_mb'], 1):.2f}x (target <= 1.3x)")
        workers = [int(w) for w in args.workers.split(",") if w]
        if workers:
            size = min(sizes)
            store = work / f"store-{size}-{seg}"
            print(f"\n== at 1 and 2 workers, {got[(cmds[0], size)]['gb']:.2f} GB" if cmds else "")
            for cmd in cmds:
                line = []
                for w in workers:
                    out = work / f"out-{cmd}"
                    shutil.rmtree(out, ignore_errors=True)
                    r = run_driver(_argv(cmd, store, out, w, rmq)[0])
                    line.append(f"{w} worker(s) {r['wall']:6.2f} s")
                    shutil.rmtree(out, ignore_errors=True)
                print(f"{cmd:8s} " + "   ".join(line), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
