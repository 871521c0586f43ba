"""The expiry policy grid job: a grid of policies over one or more stores, on any engine (in-process, a
process pool, Spark); also a spark-submit job.

    spark-submit --properties-file spark-conf/spark-defaults.conf jobs/expiry.py STORE [STORE...] \\
        --broker-conf broker.conf --reserved 24,48,72 --delete-when 04 --delete-when "04;16" \\
        --max-ratio 60,75,90 --capacity 500e9,1e12 --until 2024-02-01T00:00:00Z --out grid.jsonl

Every (store, policy) pair is one simulation (``storelib.broker.expiry.cleaner.simulate``, the same pure function the
``rmqstore expiry`` command runs); the slices and their task are storelib.broker.expiry.expirygrid's. Without a
master (or spark-submit) the grid runs on a process pool.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

if __package__ in (None, ""):  # spark-submit jobs/expiry.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.common import size_arg, time_arg
from jobs.engines.schedulers import Engine, add_engine_args, make_engine, resolve_engine_name
from storelib.broker.expiry.expiry import Policy, TimeModel
from storelib.broker.expiry.expirygrid import (
    GridContext,
    grid_policies,
    grid_slices,
    merge_slices,
    simulate_slice,
)
from storelib.broker.settings.brokerconf import BrokerSettings


class GridRun(NamedTuple):
    """A grid's simulations in (store, policy) order, each tagged ``store``; with ``describe`` each store's
    simulation assumptions (storelib.broker.expiry.cleaner.describe) by store."""

    results: list[dict[str, Any]]
    described: dict[str, dict[str, Any]]


def run_grid(engine: Engine, stores: list[str], policies: list[Policy], model: TimeModel, settings: BrokerSettings,
             *, mtimes: str = "auto", slices: int | None = None, summary_only: bool = False,
             fs_options: dict[str, Any] | None = None, describe: bool = False) -> GridRun:
    """Simulate every policy on every store on ``engine`` (storelib.broker.expiry.expirygrid's tasks): the same on
    every engine. ``rmqstore expiry`` runs its policies through this too."""
    parts = grid_slices(stores, len(policies), slices or engine.parallelism * 2)
    ctx = GridContext(policies, model, settings, mtimes, summary_only, fs_options or {}, describe)
    return GridRun(*merge_slices(stores, engine.map(partial(simulate_slice, ctx), parts, "expiry: slices")))


def run_grid_for(args: argparse.Namespace, stores: list[str], policies: list[Policy], model: TimeModel,
                 settings: BrokerSettings, **kw: Any) -> GridRun:
    """:func:`run_grid` on the engine the command line chooses (``--engine/--master/--workers``; ``auto``: the
    pool for more than one (store, policy) pair), started and closed here."""
    name = resolve_engine_name(args.engine, master=args.master, tasks=len(stores) * len(policies))
    engine = make_engine(name, master=args.master, workers=args.workers, app_name="rmqstore-expiry")
    try:
        return run_grid(engine, stores, policies, model, settings, **kw)
    finally:
        engine.close()


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The simulation's interval, rates and clock: the same on the command and the grid job."""
    p.add_argument("--from", dest="start", type=time_arg, metavar="T", help="simulation start (ISO-8601 or epoch "
                   "ms); default: the store's last message time")
    p.add_argument("--until", type=time_arg, metavar="T", help="simulation end (ISO-8601 or epoch ms); default: "
                   "start + 7 days, shortened when the observed ingest would write more segments than are worth "
                   "simulating (the output says so)")
    p.add_argument("--disk-other-used", type=size_arg, default=0, metavar="SIZE",
                   help="bytes used on the partition by other data, e.g. 10GB (default 0)")
    p.add_argument("--ingest", default="observed", metavar="observed|SIZE_PER_S",
                   help="commitlog growth per second, e.g. 5MB (default: observed over the store's message times)")
    p.add_argument("--consumption", default="observed", metavar="observed|MSGS_PER_S",
                   help="per-queue consumer speed (default: each queue's production rate, i.e. constant lag)")
    p.add_argument("--tz", default="local", help="the broker JVM's time zone for deleteWhen: UTC, an "
                   "offset or an IANA name (default: this host's zone, as a JVM here uses; give the broker's for a copy)")
    p.add_argument("--mtimes", choices=["auto", "file", "store-time"], default="auto",
                   help="segment last-modified times: file mtimes, last message store times, or auto-detect "
                        "mtimes lost in a copy (default)")


def _rate(text: str, what: str) -> float | None:
    """'observed' (None), or a rate: a plain number, or a size per second for --ingest (``5MB``, ``5MB/s``)."""
    if text == "observed":
        return None
    try:
        v = float(text)
    except ValueError:
        from storelib.units import parse_size

        try:
            v = float(parse_size(str(text).removesuffix("/s")))
        except ValueError:
            raise ValueError(f"--{what} must be 'observed' or a rate such as 5MB (per second), not {text!r}") from None
    if v < 0 or v != v:
        raise ValueError(f"--{what} must not be negative")
    return v


def time_model(args: argparse.Namespace) -> TimeModel:
    """The simulation's time model from --from, --until, --ingest and --consumption."""
    from storelib.broker.expiry.expiry import parse_time_ms

    return TimeModel(start_ms=parse_time_ms(args.start) if args.start else None,
                     until_ms=parse_time_ms(args.until) if args.until else None,
                     ingest_bytes_per_s=_rate(args.ingest, "ingest"),
                     consumption_msgs_per_s=_rate(args.consumption, "consumption"))


def _ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def _caps(text: str) -> list[int | None]:
    return [None if x.strip().lower() in ("none", "-") else int(float(x)) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="expiry.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stores", nargs="+", metavar="STORE")
    from jobs.common import add_fs_args, add_settings_args

    add_settings_args(p)
    add_fs_args(p)
    p.add_argument("--reserved", type=_ints, default=[72], help="fileReservedTime hours, comma-separated")
    p.add_argument("--delete-when", action="append", help="a deleteWhen value (repeat for several)")
    p.add_argument("--max-ratio", type=_ints, default=[75], help="diskMaxUsedSpaceRatio %%, comma-separated")
    p.add_argument("--capacity", type=_caps, default=[None], help="disk capacities in bytes ('none' = no model)")
    add_model_args(p)
    p.add_argument("--summary-only", action="store_true", help="drop timelines from the output")
    p.add_argument("--out", metavar="F", help="JSON lines, one per (store, policy), written atomically")
    p.add_argument("--html", metavar="F", help="HTML report (first store)")
    add_engine_args(p, "policy simulation", pool_when="more than one (store, policy) pair")
    return p


def main(argv: list[str] | None = None) -> int:
    from jobs.common import fs_options, print_table, settings_from_args
    from jobs.reports.expiry_report import COMPARE_COLUMNS, compare_rows, write_html
    from storelib.fileio.bytesource import resolve
    from storelib.fileio.smallfile_io import atomic_write

    args = build_parser().parse_args(argv)
    fs = fs_options(args)
    # the first store names the segment size when no --broker-conf/--set does (a grid shares settings)
    base = settings_from_args(args, resolve(args.stores[0], **fs) if args.stores else None)
    policies = grid_policies(base, args.reserved, args.delete_when or [base.delete_when], args.max_ratio,
                             args.capacity, tz=args.tz, disk_other_used=int(args.disk_other_used))
    html = bool(args.html) and not args.summary_only
    grid = run_grid_for(args, args.stores, policies, time_model(args), base, mtimes=args.mtimes,
                        summary_only=args.summary_only, fs_options=fs, describe=html)
    if args.out:
        atomic_write(args.out, "".join(json.dumps(r) + "\n" for r in grid.results).encode("utf-8"))
    for store in args.stores:
        mine = [r for r in grid.results if r["store"] == store]
        print(f"\n{store}: {len(mine)} policies")
        print_table(compare_rows(mine), COMPARE_COLUMNS)
    if html and grid.results:
        first = args.stores[0]
        write_html(args.html, {"simulation": grid.described[first],
                               "policies": [r for r in grid.results if r["store"] == first]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
