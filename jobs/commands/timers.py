"""``rmqstore timers``: the 5.x timer store: pending and delivered timer messages, where the timer store
holds them (timerlog units, wheel slot), deliver-time histograms, and the timer files' own state."""

from __future__ import annotations

import argparse
import json
import sys

import pyarrow as pa
import pyarrow.compute as pc

from jobs.common import add_store_args, open_store, print_table, time_arg
from storelib.broker.timer.timermsg import deliver_histogram, timer_store_summary
from storelib.scan.messagecols import iso_utc, iso_utc_column

EXAMPLE = """examples:
  rmqstore timers /data/store                                  # summary + pending timers
  rmqstore timers /data/store --state delivered --topic CouponExpiry --format jsonl
  rmqstore timers /data/store --until 2026-11-26T00:00Z --format parquet --out due.parquet
  rmqstore timers /data/store --json                           # summary, files, histogram
"""

TABLE_COLUMNS = ["state", "real_topic", "real_queue_id", "deliver_time", "uniq_key", "timer_phy_offset",
                 "timerlog_positions", "wheel_slot"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_store_args(p)
    p.add_argument("--state", choices=["pending", "delivered", "deleted", "delete_marker", "all"], default="pending",
                   help="which timer messages to list (default pending; deleted: recalled timers; delete_marker: "
                        "the recalls themselves, late ones included)")
    p.add_argument("--topic", help="only timers of this real topic")
    p.add_argument("--from", dest="start", type=time_arg, metavar="T", help="deliver time at or after T")
    p.add_argument("--until", type=time_arg, metavar="T", help="deliver time before T")
    p.add_argument("--format", choices=["table", "jsonl", "parquet"], default="table")
    p.add_argument("--out", metavar="F", help="output file (required for parquet)")
    p.add_argument("--json", action="store_true", help="print the summary, files and histogram as JSON")


def _filtered(timers: pa.Table, args: argparse.Namespace) -> pa.Table:
    t = timers
    if args.state == "delete_marker":  # delete_marker_late too: a recall that came after its delivery
        t = t.filter(pc.starts_with(t.column("state"), "delete_marker"))
    elif args.state != "all":
        t = t.filter(pc.equal(t.column("state"), args.state))
    if args.topic:
        t = t.filter(pc.equal(t.column("real_topic"), args.topic))
    if args.start is not None:
        t = t.filter(pc.greater_equal(t.column("deliver_time_ms"), args.start))
    if args.until is not None:
        t = t.filter(pc.less(t.column("deliver_time_ms"), args.until))
    return t.sort_by([("deliver_time_ms", "ascending"), ("timer_phy_offset", "ascending")])


def run_args(args: argparse.Namespace) -> int:
    store = open_store(args)
    store.require_records("timers", one_log=True)
    if not store.exists("timerlog") and not store.exists("timerwheel"):
        print(f"rmqstore timers: {args.store} has no timer store (timerlog/, timerwheel): a 4.x store, or a 5.x "
              "broker with timerWheelEnable=false; timer topic records are still listed", file=sys.stderr)
    got = timer_store_summary(store)
    rows = _filtered(got["timers"], args)
    if args.json:
        hist = deliver_histogram(got["timers"]).to_pylist()
        doc = {**got["summary"], "histogram_hourly": hist, "findings": [f.to_dict() for f in got["findings"]]}
        json.dump(doc, sys.stdout, indent=1, ensure_ascii=False, default=str)
        sys.stdout.write("\n")
        return 0
    if args.format == "parquet":
        if not args.out:
            print("rmqstore timers: --format parquet needs --out FILE", file=sys.stderr)
            return 2
        import pyarrow.parquet as pq

        from storelib.fileio.publish import atomic_local_file

        with atomic_local_file(args.out) as tmp:
            pq.write_table(rows, tmp, compression="zstd")
        print(f"wrote {rows.num_rows} timer message(s) to {args.out}", file=sys.stderr)
        return 0
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    try:
        if args.format == "jsonl":
            for r in rows.to_pylist():
                r["deliver_time"] = iso_utc(r["deliver_time_ms"])
                out.write(json.dumps(r, ensure_ascii=False) + "\n")
            return 0
        s = got["summary"]
        out.write(f"timer store: {s['timerlog_units']} timerlog unit(s) in {len(s['timerlog_files'])} file(s), "
                  f"{s['wheel_slots_used']} wheel slot(s) used; {s['timers']} timer message(s): {s['pending']} pending, "
                  f"{s['delivered']} delivered\n")
        if s["pending_by_topic"]:
            out.write("pending by real topic: " + ", ".join(f"{k} {v}" for k, v in s["pending_by_topic"].items())
                      + f" (timermetrics says {s['timermetrics_timing_count'] or 'nothing'})\n")
        for f in got["findings"][:10]:
            out.write(f"  {f}\n")
        table = rows.select([c for c in TABLE_COLUMNS if c != "deliver_time"] + ["deliver_time_ms"]).to_pylist()
        for r, t in zip(table, iso_utc_column(rows.column("deliver_time_ms"))):
            r["deliver_time"] = t
        print_table(table, TABLE_COLUMNS, out)
    finally:
        if out is not sys.stdout:
            out.close()
    return 0
