"""Spark job: evaluate a grid of expiry policies over one or more stores in parallel.

    spark-submit --properties-file spark-conf/spark-defaults.conf jobs/expiry.py STORE [STORE...] \\
        --broker-conf broker.conf --reserved 24,48,72 --delete-when 04 --delete-when "04;16" \\
        --max-ratio 60,75,90 --capacity 500e9,1e12 --until 2024-02-01T00:00:00Z --out grid.jsonl

Every (store, policy) pair is one simulation (``storelib.broker.cleaner.simulate``, the same pure function the
``rmqstore expiry`` command runs). Tasks are sorted by store and cut into contiguous slices, so a
worker reads a store's snapshot (CQ units, segment times, consumer offsets) once per slice and then
runs its policies from memory.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # spark-submit jobs/expiry.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storelib.broker.brokerconf import BrokerSettings
from storelib.broker.cleaner import simulate
from storelib.broker.expiry import Policy, TimeModel, load_snapshot, parse_time_ms


def grid_policies(base: BrokerSettings, reserved: list[int], delete_when: list[str], max_ratio: list[int],
                  capacity: list[int | None], *, tz: str = "UTC", disk_other_used: int = 0) -> list[Policy]:
    """The cartesian grid fileReservedTime × deleteWhen × diskMaxUsedSpaceRatio × capacity."""
    out = []
    for r, w, m, c in itertools.product(reserved, delete_when, max_ratio, capacity):
        s = base.with_overrides({"fileReservedTime": r, "deleteWhen": w, "diskMaxUsedSpaceRatio": m})
        name = f"reserved={r}h when={w} max={m}% cap={'-' if c is None else c}"
        out.append(Policy.from_settings(name, s, disk_capacity=c, tz=tz, disk_other_used=disk_other_used))
    return out


def _open_store(uri: str, settings: BrokerSettings):
    from storelib.broker.store import Store

    return Store(uri, settings)


def run_grid(spark, stores: list[str], policies: list[Policy], model: TimeModel, settings: BrokerSettings, *,
             mtimes: str = "auto", slices: int | None = None, summary_only: bool = False) -> list[dict[str, Any]]:
    """Simulate every policy on every store; results in (store, policy) order, each tagged ``store``."""
    tasks = [(s, i) for s in stores for i in range(len(policies))]
    if not tasks:
        return []
    sc = spark.sparkContext
    n = slices or max(1, min(len(tasks), sc.defaultParallelism * 2))
    shared = sc.broadcast((policies, model, settings, mtimes, summary_only))

    def work(part):
        pols, mdl, st, mt, brief = shared.value
        snaps: dict[str, Any] = {}
        for store, i in part:
            snap = snaps.get(store)
            if snap is None:
                snaps.clear()  # slices are sorted by store: keep only the current one in memory
                snap = snaps[store] = load_snapshot(_open_store(store, st), mtimes=mt)
            res = simulate(pols[i], snap, mdl)
            if brief:
                res = {k: v for k, v in res.items() if k not in ("deletions", "disk_usage")}
            yield store, i, json.dumps(res)

    rows = sc.parallelize(tasks, n).mapPartitions(work).collect()
    shared.unpersist()
    rows.sort(key=lambda r: (stores.index(r[0]), r[1]))
    return [dict(json.loads(r[2]), store=r[0]) for r in rows]


def _ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def _caps(text: str) -> list[int | None]:
    return [None if x.strip().lower() in ("none", "-") else int(float(x)) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="expiry.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stores", nargs="+", metavar="STORE")
    from jobs.common import add_settings_args

    add_settings_args(p)
    p.add_argument("--reserved", type=_ints, default=[72], help="fileReservedTime hours, comma-separated")
    p.add_argument("--delete-when", action="append", help="a deleteWhen value (repeat for several)")
    p.add_argument("--max-ratio", type=_ints, default=[75], help="diskMaxUsedSpaceRatio %%, comma-separated")
    p.add_argument("--capacity", type=_caps, default=[None], help="disk capacities in bytes ('none' = no model)")
    p.add_argument("--disk-other-used", type=float, default=0)
    p.add_argument("--from", dest="start")
    p.add_argument("--until")
    p.add_argument("--ingest", default="observed")
    p.add_argument("--consumption", default="observed")
    p.add_argument("--tz", default="UTC")
    p.add_argument("--mtimes", choices=["auto", "file", "store-time"], default="auto")
    p.add_argument("--summary-only", action="store_true", help="drop timelines from the output")
    p.add_argument("--out", metavar="F", help="JSON lines, one per (store, policy), written atomically")
    p.add_argument("--html", metavar="F", help="HTML report (first store)")
    p.add_argument("--master", help="Spark master (default: spark-submit's)")
    return p


def main(argv: list[str] | None = None) -> int:
    from jobs.commands.expiry import _rate
    from jobs.common import print_table
    from jobs.expiry_report import COMPARE_COLUMNS, compare_rows, write_html
    from jobs.sparkutil import get_spark

    args = build_parser().parse_args(argv)
    from jobs.common import fs_options, settings_from_args
    from storelib.fileio.bytesource import resolve

    # the first store names the segment size when no --broker-conf/--set does (a grid shares settings)
    base = settings_from_args(args, resolve(args.stores[0], **fs_options(args)) if args.stores else None)
    policies = grid_policies(base, args.reserved, args.delete_when or [base.delete_when], args.max_ratio,
                             args.capacity, tz=args.tz, disk_other_used=int(args.disk_other_used))
    model = TimeModel(start_ms=parse_time_ms(args.start) if args.start else None,
                      until_ms=parse_time_ms(args.until) if args.until else None,
                      ingest_bytes_per_s=_rate(args.ingest, "ingest"),
                      consumption_msgs_per_s=_rate(args.consumption, "consumption"))
    spark = get_spark(args.master, app_name="rmqstore-expiry")
    from jobs.sparkutil import ship_code

    ship_code(spark.sparkContext)
    results = run_grid(spark, args.stores, policies, model, base, mtimes=args.mtimes,
                       summary_only=args.summary_only)
    if args.out:
        from jobs.expiry_report import write_text_atomic

        write_text_atomic(args.out, "".join(json.dumps(r) + "\n" for r in results))
    for store in args.stores:
        mine = [r for r in results if r["store"] == store]
        print(f"\n{store}: {len(mine)} policies")
        print_table(compare_rows(mine), COMPARE_COLUMNS)
    if args.html and results and not args.summary_only:
        from storelib.broker.cleaner import describe

        snap = load_snapshot(_open_store(args.stores[0], base), mtimes=args.mtimes)
        write_html(args.html, {"simulation": describe(snap, model, policies[0]),
                               "policies": [r for r in results if r["store"] == args.stores[0]]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
