"""Audit benchmark: full audit (CRC included) of a generated store, local engine and Spark local[2], same run.

Not part of the test run. ``python -m tests.bench.bench_audit [--size 2GB] [--segment-size 1GB] [--keep DIR]``

The store comes from :func:`storelib.gen.generate` (realistic mix: topics, tags, keys, transactions,
delays, IPv6 hosts, compressed bodies; CQ and index dispatched). Each engine runs twice: a warm-up pass
(page cache) and the measured pass. Printed per engine: wall seconds of the per-segment phase, MB/s and
messages/s over the commitlog bytes, total wall time including the cross-file checks, and whether both
engines produced the same findings. Target: Spark local[2] >= 1.0 GB/s for the full audit with CRC.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from tests.bench.bench_scan import parse_size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=parse_size, default=parse_size("2GB"), help="commitlog bytes (default 2GB)")
    p.add_argument("--segment-size", type=parse_size, default=parse_size("1GB"))
    p.add_argument("--keep", metavar="DIR", help="generate into / reuse DIR instead of a temp dir")
    p.add_argument("--engines", default="local,spark")
    p.add_argument("--out", metavar="F", help="also write the results as JSON here")
    args = p.parse_args(argv)

    from jobs.audit import audit_store
    from storelib.brokerconf import BrokerSettings
    from storelib.gen import GenConfig, generate

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
                from jobs.sparkutil import get_spark

                spark = get_spark(master="local[2]", app_name="bench-audit")
            for _attempt in ("warm-up", "measured"):
                t0 = time.perf_counter()
                rep = audit_store(root, broker_conf=conf, engine=engine, spark=spark, quiet=True)
                wall = time.perf_counter() - t0
            run = rep["run"]
            n = rep["summary"]["records"]
            results[engine] = {"segment_seconds": run["segment_seconds"], "wall_seconds": round(wall, 2),
                               "bytes": run["bytes_audited"], "records": n,
                               "MB_per_s": round(run["bytes_audited"] / run["segment_seconds"] / 1e6, 1),
                               "messages_per_s": round(n / run["segment_seconds"]),
                               "MB_per_s_incl_cross_checks": round(run["bytes_audited"] / wall / 1e6, 1),
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
        target = results.get("spark", {}).get("MB_per_s")
        if target is not None:
            print(f"Spark local[2]: {target / 1000:.2f} GB/s (target 1.0 GB/s: {'met' if target >= 1000 else 'NOT met'})",
                  file=sys.stderr)
    finally:
        if tmp and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
