"""Audit benchmark: full audit (CRC included) of a generated store, local engine and Spark local[2], same run.

Not part of the test run. ``python -m tests.bench.bench_audit [--size 2GB] [--segment-size 1GB] [--keep DIR]``

The store comes from :func:`storelib.generator.gen.generate` (realistic mix: topics, tags, keys, transactions,
delays, IPv6 hosts, compressed bodies; CQ and index dispatched). Each engine runs twice: a warm-up pass
(page cache) and the measured pass. Printed per engine: wall seconds of the per-segment phase, MB/s and
messages/s over the bytes of the records scanned (``MB_per_s``; ``file_MB_per_s`` divides the file bytes,
which include the unwritten tail of the last segment), the same over the whole run including the
cross-file checks, peak RSS and CPU seconds of the process tree (driver, JVM, Python workers) during
the measured pass, the machine load, and whether both engines produced the same findings. Target: Spark local[2] >= 1.0
GB/s for the full audit with CRC.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

from tests.bench.bench_scan import parse_size


def _tree_rss(root_pid: int) -> int:
    """Resident bytes of ``root_pid`` and all its descendants (Linux /proc)."""
    return _tree(root_pid)[0]


def _tree_cpu(root_pid: int) -> float:
    """CPU seconds (user + system, reaped children included) of ``root_pid`` and its descendants."""
    return _tree(root_pid)[1]


def _tree(root_pid: int) -> tuple[int, float]:
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    cpu: dict[int, float] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    tick = os.sysconf("SC_CLK_TCK")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(d))
        rss[int(d)] = int(fields[21]) * page
        cpu[int(d)] = sum(int(x) for x in fields[11:15]) / tick
    total, secs, todo = 0, 0.0, [root_pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        secs += cpu.get(p, 0.0)
        todo.extend(kids.get(p, []))
    return total, secs


class PeakRss:
    """Samples the process tree's RSS every ``every`` seconds while active; ``peak`` in bytes."""

    def __init__(self, every: float = 0.2) -> None:
        self.every, self.peak = every, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss(os.getpid()))
            self._stop.wait(self.every)

    def __enter__(self) -> PeakRss:
        self.cpu0 = _tree_cpu(os.getpid())
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _tree_rss(os.getpid()))
        self.cpu = _tree_cpu(os.getpid()) - self.cpu0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=parse_size, default=parse_size("2GB"), help="commitlog bytes (default 2GB)")
    p.add_argument("--segment-size", type=parse_size, default=parse_size("1GB"))
    p.add_argument("--keep", metavar="DIR", help="generate into / reuse DIR instead of a temp dir")
    p.add_argument("--engines", default="local,spark")
    p.add_argument("--out", metavar="F", help="also write the results as JSON here")
    p.add_argument("--split-size", type=parse_size, help="split tasks of this size (default on Spark: about two per core, "
                   "128-512 MB; whole segments locally)")
    args = p.parse_args(argv)

    from jobs.audit import audit_store
    from storelib.broker.settings.brokerconf import BrokerSettings
    from storelib.generator.gen import generate
    from storelib.generator.genplan import GenConfig

    tmp = None
    root = args.keep or os.path.join(tmp := tempfile.mkdtemp(prefix="bench-audit-"), "store")
    conf = os.path.join(os.path.dirname(root.rstrip("/")), "bench-broker.conf")
    settings = BrokerSettings.defaults("4").with_overrides({"mappedFileSizeCommitLog": args.segment_size})
    os.makedirs(os.path.dirname(conf), exist_ok=True)
    with open(conf, "w") as f:
        f.write(f"mappedFileSizeCommitLog={args.segment_size}\n")
    try:
        if not os.path.isdir(os.path.join(root, "commitlog")):
            t0 = time.perf_counter()
            res = generate(root, GenConfig(size=args.size, seed=1), settings)
            print(f"generated {res.bytes / 1e9:.2f} GB, {res.records} records, {res.segments} segments "
                  f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        results = {}
        reports = {}
        for engine in args.engines.split(","):
            spark = None
            if engine == "spark":
                from jobs.spark.sparkutil import get_spark

                spark = get_spark(master="local[2]", app_name="bench-audit", batch_job=True)  # as `rmqstore audit` does
            for attempt in ("warm-up", "measured"):
                load = os.getloadavg()[0]
                with PeakRss() as mem:
                    t0 = time.perf_counter()
                    rep = audit_store(root, broker_conf=conf, engine=engine, spark=spark, quiet=True,
                                      split_bytes=args.split_size)
                    wall = time.perf_counter() - t0
                print(f"{engine} {attempt}: {wall:.1f} s (load {load:.1f})", file=sys.stderr)
            run = rep["run"]
            n = rep["summary"]["records"]
            scanned = run["bytes_scanned"]
            results[engine] = {"segment_seconds": run["segment_seconds"], "wall_seconds": round(wall, 2),
                               "cross_check_seconds": run.get("cross_check_seconds"),
                               "bytes_scanned": scanned, "file_bytes": run["bytes_audited"], "records": n,
                               "MB_per_s": round(scanned / run["segment_seconds"] / 1e6, 1),
                               "messages_per_s": round(n / run["segment_seconds"]),
                               "file_MB_per_s": round(run["bytes_audited"] / run["segment_seconds"] / 1e6, 1),
                               "MB_per_s_incl_cross_checks": round(scanned / wall / 1e6, 1),
                               "messages_per_s_incl_cross_checks": round(n / wall),
                               "peak_rss_MB": round(mem.peak / 1e6), "load_1min_at_start": round(load, 2),
                               "cpu_seconds": round(mem.cpu, 1),
                               # record MB per CPU-second of the whole run (driver, JVM, workers): a figure
                               # the machine's load barely moves, unlike the wall-clock ones above
                               "MB_per_cpu_second": round(scanned / max(mem.cpu, 1e-9) / 1e6, 1),
                               "findings": rep["summary"]["by_severity"]}
            reports[engine] = rep["findings"]
            print(f"{engine:6s}: {json.dumps(results[engine])}", file=sys.stderr)
        if len(reports) == 2:
            a, b = reports.values()
            results["same_findings"] = a == b
        print(json.dumps(results, indent=1))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
        sp = results.get("spark")
        if sp is not None:
            for label, v in (("per-segment phase", sp["MB_per_s"]), ("whole run", sp["MB_per_s_incl_cross_checks"])):
                print(f"Spark local[2] {label}: {v / 1000:.2f} GB/s of records scanned "
                      f"(target 1.0 GB/s: {'met' if v >= 1000 else 'NOT met'})", file=sys.stderr)
    finally:
        if tmp and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
