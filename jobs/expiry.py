"""The expiry policy grid job: a grid of policies over one or more stores, on any engine (in-process, a
process pool, Spark); also a spark-submit job.

    spark-submit --properties-file spark-conf/spark-defaults.conf jobs/expiry.py STORE [STORE...] \\
        --broker-conf broker.conf --reserved 24,48,72 --delete-when 04 --delete-when "04;16" \\
        --max-ratio 60,75,90 --capacity 500e9,1e12 --until 2024-02-01T00:00:00Z --out grid.jsonl

Every (store, policy) pair is one simulation (``storelib.broker.cleaner.simulate``, the same pure function the
``rmqstore expiry`` command runs); the slices and their task are storelib.broker.expirygrid's. Without a
master (or spark-submit) the grid runs on a process pool.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # spark-submit jobs/expiry.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.engines import Engine, add_engine_args, make_engine, resolve_engine_name
from storelib.broker.brokerconf import BrokerSettings
from storelib.broker.expiry import Policy, TimeModel, load_snapshot, parse_time_ms
from storelib.broker.expirygrid import GridContext, grid_policies, grid_slices, merge_slices, simulate_slice
from storelib.broker.store import Store


def run_grid(engine: Engine, stores: list[str], policies: list[Policy], model: TimeModel, settings: BrokerSettings,
             *, mtimes: str = "auto", slices: int | None = None, summary_only: bool = False) -> list[dict[str, Any]]:
    """Simulate every policy on every store on ``engine`` (storelib.broker.expirygrid's tasks); results in
    (store, policy) order, each tagged ``store``: the same on every engine."""
    parts = grid_slices(stores, len(policies), slices or engine.parallelism * 2)
    ctx = GridContext(policies, model, settings, mtimes, summary_only)
    return merge_slices(stores, engine.map(partial(simulate_slice, ctx), parts, "expiry: slices"))


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
    add_engine_args(p, "policy simulation", pool_when="more than one (store, policy) pair")
    return p


def main(argv: list[str] | None = None) -> int:
    from jobs.commands.expiry import _rate
    from jobs.common import print_table
    from jobs.expiry_report import COMPARE_COLUMNS, compare_rows, write_html
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
    pairs = len(args.stores) * len(policies)
    name = resolve_engine_name(args.engine, master=args.master, tasks=pairs)
    engine = make_engine(name, master=args.master, workers=args.workers, app_name="rmqstore-expiry")
    try:
        results = run_grid(engine, args.stores, policies, model, base, mtimes=args.mtimes,
                           summary_only=args.summary_only)
    finally:
        engine.close()
    if args.out:
        from jobs.expiry_report import write_text_atomic

        write_text_atomic(args.out, "".join(json.dumps(r) + "\n" for r in results))
    for store in args.stores:
        mine = [r for r in results if r["store"] == store]
        print(f"\n{store}: {len(mine)} policies")
        print_table(compare_rows(mine), COMPARE_COLUMNS)
    if args.html and results and not args.summary_only:
        from storelib.broker.cleaner import describe

        snap = load_snapshot(Store(args.stores[0], base), mtimes=args.mtimes)
        write_html(args.html, {"simulation": describe(snap, model, policies[0]),
                               "policies": [r for r in results if r["store"] == args.stores[0]]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
