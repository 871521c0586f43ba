"""Engines benchmark: ``rmqstore rebuild`` and ``rmqstore audit`` end to end as a user types them, on each
engine (local, pool, Spark local[2]), against the one-core floor, at one or more store sizes, in one run.

Not part of the test run. ``python -m tests.bench.bench_engines [--sizes 2GB,8GB] [--segment-size 256MB]``

The store is bench_scan's synthetic one (IPv4 hosts, 500-byte records: what the floor walk reads);
``audit`` runs on the same commitlog with the consume queues and index files the broker would have written
beside it (made once by ``rmqstore rebuild``), so its cross-file checks have every file to compare. The
floor is bench_scan.floor_walk: a Python walk of the size chain with one CRC call per body, one core.
Printed per command and engine: wall seconds, the floor's time divided by it (1.0 = floor speed), the CPU-s
of the command and its workers in floors (its CPU over the floor's, walked before and after it: on N cores a
command of M floors runs at most at N / M of the floor's speed, whatever the machine's drift), and the
peak anonymous RSS (RssAnon: memory a process owns, not the store pages it maps) of the driver and of the
largest worker, sampled from /proc every 50 ms. The machine's speed drifts by 10-30% from minute to minute
(a shared 2-core VM), so the floor is walked right before and right after every run (``--repeat`` rounds
of the commands, default 3), and each run is judged against the mean of those two walks; the summary
prints every round's ratio and their median. The store's consume queues and index files (what the audit reads
beside the commitlog the floor walks) are read into the page cache before each run, as after the run
before it: this VM pages out file pages left untouched for about a minute, so the first round's audit
would otherwise read them from disk while the floor never does. Targets (issue "scale-out"): rebuild and audit on the default engine (pool) >= 0.5 of
the floor; Spark <= 4 s over the default engine; peak RSS at the largest size within 1.3x of the smallest.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from tests.bench.bench_scan import build_store, floor_walk, parse_size

ENGINES = ("local", "pool", "spark")


def _anon_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


class Measured(NamedTuple):
    """One command run: wall s, peak RssAnon KB of its own process and of its largest descendant, and the
    CPU-s (user + system) of the command and of every process it waited for (the pool's workers)."""

    wall: float
    driver_kb: int
    worker_kb: int
    cpu: float


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_measured(argv: list[str], env: dict[str, str] | None = None) -> Measured:
    """Run one command as a user types it, measured (:class:`Measured`)."""
    c0 = _children_cpu()  # only this command ends between the two readings (the sampler is a thread)
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    peaks = {"driver": 0, "worker": 0}
    stop = threading.Event()

    def sample() -> None:
        # the process tree is walked (every /proc entry) twice a second, the known processes' RssAnon read
        # every 50 ms: walking it each time took ~1.7 ms, CPU taken from the run measured on 2 cores
        kids: list[int] = []
        n = 0
        while not stop.is_set():
            if n % 10 == 0:
                kids = _children(p.pid)
            n += 1
            peaks["driver"] = max(peaks["driver"], _anon_kb(p.pid))
            for c in kids:
                peaks["worker"] = max(peaks["worker"], _anon_kb(c))
            stop.wait(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    rc = p.wait()
    wall = time.monotonic() - t0
    cpu = _children_cpu() - c0
    stop.set()
    th.join()
    if rc not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} exited {rc}")
    return Measured(wall, peaks["driver"], peaks["worker"], cpu)


def warm_store(src: Path, dirs: tuple[str, ...] = ("commitlog", "consumequeue", "index")) -> None:
    """The store's files under ``dirs`` in the page cache, as after the run before it (read with ``cat``)."""
    files = [str(p) for d in dirs if (src / d).is_dir() for p in sorted((src / d).rglob("*")) if p.is_file()]
    for i in range(0, len(files), 512):
        subprocess.run(["cat", *files[i:i + 512]], stdout=subprocess.DEVNULL, check=True)


def complete_store(store: Path, rmq: list[str]) -> Path:
    """``store``'s commitlog (linked) with the consume queues and index files a rebuild writes: a whole
    store for the audit, made once per size."""
    full = store.parent / (store.name + "-full")
    if not (full / "index").is_dir():
        shutil.rmtree(full, ignore_errors=True)
        out = store.parent / (store.name + "-rebuilt")
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([*rmq, "rebuild", str(store), "--out", str(out), "--quiet"], check=True,
                       stdout=subprocess.DEVNULL)
        full.mkdir()
        (full / "commitlog").symlink_to(store / "commitlog")
        for d in ("consumequeue", "index"):
            (out / d).rename(full / d)
        shutil.rmtree(out)
    return full


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2GB")
    ap.add_argument("--segment-size", default="256MB")
    ap.add_argument("--keep", metavar="DIR")
    ap.add_argument("--commands", default="rebuild,audit", help="comma list of rebuild, audit")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma list of local, pool, spark")
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds of (floor, every command): each run is judged against its round's floor")
    args = ap.parse_args(argv)
    cmds = tuple(c for c in args.commands.split(",") if c)
    engines = tuple(e for e in args.engines.split(",") if e)
    seg = parse_size(args.segment_size)
    work = Path(args.keep or tempfile.mkdtemp(prefix="rmqstore-bench-engines-"))
    rmq = [sys.executable, "-c", "import sys; from jobs.cli import console_main; sys.exit(console_main())"]  # the rmqstore script
    results: dict[tuple[str, str, int], tuple[float, int, int]] = {}
    try:
        for size in [parse_size(s) for s in args.sizes.split(",")]:
            store = work / f"store-{size}"
            if not store.is_dir():
                build_store(store, size, seg)
            for cmd in cmds:
                if cmd == "audit":
                    complete_store(store, rmq)
            floor_walk(store / "commitlog")  # page cache warm
            ratios: dict[tuple[str, str], list[float]] = {}
            msgs, _, f_last, fc_last = floor_walk(store / "commitlog")
            multiples: dict[tuple[str, str], list[float]] = {}
            for rnd in range(max(1, args.repeat)):
                print(f"\n== {size / 1e9:.1f} GB, {msgs} records; round {rnd + 1}: floor {f_last:.2f} s "
                      f"({msgs / f_last:,.0f} msg/s)")
                for cmd in cmds:
                    for eng in engines:
                        wall, drv, wrk, cpu = _run_one(work, store, rmq, cmd, eng)
                        (f_before, fc_before), (f_last, fc_last) = (f_last, fc_last), floor_walk(store / "commitlog")[2:]
                        t_floor = (f_before + f_last) / 2  # the floor walked right before and right after
                        multiples.setdefault((cmd, eng), []).append(cpu / ((fc_before + fc_last) / 2))
                        prev = results.get((cmd, eng, size))
                        results[(cmd, eng, size)] = (min(wall, prev[0]) if prev else wall, max(drv, prev[1] if prev else 0),
                                                     max(wrk, prev[2] if prev else 0))
                        ratios.setdefault((cmd, eng), []).append(t_floor / wall)
                        print(f"{cmd:8s} {eng:6s} {wall:7.2f} s   floor ratio {t_floor / wall:5.2f} (floor {f_before:.2f}"
                              f"/{f_last:.2f} s)   CPU {cpu:5.1f} s = {multiples[(cmd, eng)][-1]:4.2f} floors   "
                              f"peak RssAnon driver {drv / 1024:6.0f} MB, largest worker {wrk / 1024:6.0f} MB")
            print(f"\n== {size / 1e9:.1f} GB: floor ratio per round, median (target: rebuild and audit >= 0.5 on "
                  "the default engine)")
            cores = os.cpu_count() or 1
            for (cmd, eng), rs in ratios.items():
                floors = statistics.median(multiples[(cmd, eng)])
                print(f"{cmd:8s} {eng:6s} {' '.join(f'{r:.2f}' for r in rs)}   median {statistics.median(rs):.2f}   "
                      f"CPU median {floors:.2f} floors (ratio at most {cores / floors:.2f} on {cores} cores)")
            for cmd in cmds:
                if {"spark", "local", "pool"} <= set(engines):
                    d = results[(cmd, "spark", size)][0] - min(results[(cmd, "local", size)][0],
                                                               results[(cmd, "pool", size)][0])
                    print(f"{cmd:8s} spark over the faster default engine (best runs): {d:+.2f} s (target <= +4 s)")
        sizes = sorted({k[2] for k in results})
        if len(sizes) > 1:
            lo, hi = sizes[0], sizes[-1]
            for cmd in cmds:
                for eng in engines:
                    a, b = results[(cmd, eng, lo)], results[(cmd, eng, hi)]
                    print(f"RSS growth {cmd} {eng}: driver {b[1] / max(a[1], 1):.2f}x, worker "
                          f"{b[2] / max(a[2], 1):.2f}x from {lo / 1e9:.0f} to {hi / 1e9:.0f} GB (target <= 1.3x)")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _run_one(work: Path, store: Path, rmq: list[str], cmd: str, eng: str) -> Measured:
    """One command on one engine as a user types it (:class:`Measured`)."""
    out = work / f"out-{cmd}-{eng}"
    shutil.rmtree(out, ignore_errors=True)
    extra = ["--out", str(out)] if cmd == "rebuild" else []
    spark = ["--master", "local[2]"] if eng == "spark" else []
    src = complete_store(store, rmq) if cmd == "audit" else store
    warm_store(src, ("consumequeue", "index"))  # the commitlog: the floor walked it just before
    try:
        return run_measured([*rmq, cmd, str(src), *extra, "--engine", eng, *spark, "--quiet"])
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
