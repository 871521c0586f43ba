"""``rmqstore expiry``: simulate the broker's file expiry policies on a store and report, per consumer
group and queue, the unconsumed messages each policy would delete (store-algorithms §9)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from jobs.common import (
    add_store_args,
    fs_options,
    human_ms,
    print_json,
    print_table,
    settings_from_args,
    size_arg,
    time_arg,
)
from jobs.engines.schedulers import add_engine_args
from jobs.expiry import add_model_args, run_grid_for, time_model
from jobs.reports.expiry_report import ranges_text
from storelib.broker.settings.brokerconf import BrokerSettings, load_conf_over
from storelib.fileio.bytesource import resolve

if TYPE_CHECKING:
    from storelib.broker.settings.store import Store

EXAMPLE = """example:
  rmqstore expiry /data/store --broker-conf broker.conf --policy keep24h.conf --policy keep72h.conf \\
      --disk-capacity 500000000000 --until 2024-02-01T00:00:00Z --html expiry.html
A --policy file holds broker.conf keys (fileReservedTime, deleteWhen, diskMaxUsedSpaceRatio,
cleanFileForciblyEnable, deleteFileBatchMax, ...) overriding --broker-conf, plus optionally
diskCapacity, diskOtherUsed, manualDeleteAt (';'-separated times) and jvmTimeZone.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_store_args(p)
    p.add_argument("--policy", action="append", default=[], metavar="FILE",
                   help="broker.conf-style overrides; one policy per file, named by the file name")
    p.add_argument("--disk-capacity", type=size_arg, metavar="SIZE",
                   help="partition size, e.g. 2GB or 500GB; without it no disk pressure is modelled")
    add_model_args(p)
    p.add_argument("--manual-delete", action="append", default=[], type=time_arg, metavar="T",
                   help="an admin deleteExpiredCommitLog at time T (20 cleaner runs); repeatable")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    p.add_argument("--out", metavar="F", help="also write the JSON result to F (atomically)")
    p.add_argument("--html", metavar="F", help="write a self-contained HTML report with plots to F")
    add_engine_args(p, "policy simulation", pool_when="more than one policy")
    p.add_argument("--metrics-file", metavar="F",
                   help="write Prometheus metrics (textfile-collector format, atomically) to F: per policy the "
                        "next deletion time, bytes freed, unconsumed messages lost (docs/scheduling.md)")


def load_policy(path: str, base: BrokerSettings) -> BrokerSettings:
    """A policy file's keys over the base settings (broker.conf syntax)."""
    return load_conf_over(path, base, "policy file")


def build_policies(args: argparse.Namespace) -> tuple[BrokerSettings, list]:
    from storelib.broker.expiry.expiry import Policy, parse_time_ms

    base = settings_from_args(args, resolve(args.store, **fs_options(args)))
    manual = tuple(parse_time_ms(t) for t in args.manual_delete)
    cap = int(args.disk_capacity) if args.disk_capacity is not None else None
    kw: dict[str, Any] = {"disk_capacity": cap, "disk_other_used": int(args.disk_other_used), "tz": args.tz,
                          "manual_deletes": manual}
    if not args.policy:
        name = os.path.basename(args.broker_conf) if args.broker_conf else "defaults"
        return base, [Policy.from_settings(name, base, **kw)]
    names = [os.path.basename(p) for p in args.policy]
    out = []
    for path, name in zip(args.policy, names):
        if names.count(name) > 1:
            name = path
        out.append(Policy.from_settings(name, load_policy(path, base), **kw))
    return base, out


def _timer_losses(store: Store, report: dict) -> None:
    """Per policy, the pending timer messages it loses (5.x stores with a timer store only)."""
    if not store.exists("timerlog"):
        return
    from storelib.broker.timer.timermsg import store_timers, timer_losses
    from storelib.format.configjson import load_config

    timers = store_timers(store)
    groups: dict[str, list[str]] = {}
    for key in ((load_config(store.loc, "consumerOffset").data or {}).get("offsetTable") or {}):
        topic, _, group = str(key).partition("@")
        groups.setdefault(topic, []).append(group)
    for p in report["policies"]:
        p["timers"] = timer_losses(timers, p["deletions"], store.commitlog.segment_size, groups)


def run_args(args: argparse.Namespace) -> int:
    from jobs.reports.expiry_report import COMPARE_COLUMNS, compare_rows, write_html
    from storelib.broker.settings.store import Store

    base, policies = build_policies(args)
    model = time_model(args)
    store = Store(args.store, base, **fs_options(args))
    store.require_records("expiry", one_log=True)
    cut = store.take_cut()
    if cut.live:
        print(f"rmqstore expiry: {cut.describe()}: the what-if starts from the store as read at the cut",
              file=sys.stderr)
    # the policies run as tasks (storelib.broker.expiry.expirygrid), like the grid job's: one after the other in
    # this process for one policy, on a process pool or Spark for several
    grid = run_grid_for(args, [args.store], policies, model, base, mtimes=args.mtimes, fs_options=fs_options(args),
                        describe=True)
    report = {"simulation": grid.described[args.store],
              "broker_line": base.line.to_json() if base.line else None,
              "policies": [{k: v for k, v in r.items() if k != "store"} for r in grid.results]}
    _timer_losses(store, report)
    if args.out:
        from storelib.fileio.smallfile_io import atomic_write

        atomic_write(args.out, json.dumps(report, ensure_ascii=False).encode("utf-8"))
    if args.html:
        write_html(args.html, report)
    if args.metrics_file:
        from jobs.reports.metrics import expiry_families, write_textfile

        write_textfile(args.metrics_file, expiry_families(args.store, report))
    if args.json:
        print_json(report)
        return 0
    sim = report["simulation"]
    print(f"store {sim['store']}: {len(sim['segments'])} segments, mtimes from {sim['mtime_source']}, "
          f"ingest {sim['ingest_bytes_per_s']:.1f} B/s ({sim['ingest_source']}), consumption {sim['consumption']}")
    print(f"horizon {human_ms(sim['start_ms'])} .. {human_ms(sim['until_ms'])}: {sim['horizon_source']}")
    print_table(compare_rows(report["policies"]), COMPARE_COLUMNS)
    for p in report["policies"]:
        for w in p["warnings"]:
            print(f"{p['name']}: warning: {w}", file=sys.stderr)
        tl = p.get("timers")
        if tl and tl["lost_timers"]:
            print(f"\n{p['name']}: {tl['lost_timers']} of {tl['pending']} pending timer message(s) lose their "
                  "commitlog segment before their deliver time")
            print_table([{"real_topic": k, "lost_timers": v["lost_timers"], "first_loss": human_ms(v["first_loss_ms"]),
                          "groups": ", ".join(v["groups"]) or "-"} for k, v in tl["by_topic"].items()],
                        ["real_topic", "lost_timers", "first_loss", "groups"])
        lost = [g for g in p["groups"] if g["lost_messages"]]
        if lost:
            print(f"\n{p['name']}: unconsumed messages deleted")
            rows = [dict(g, lost_offsets=ranges_text(g["lost_offsets"], 4)) for g in lost]
            print_table(rows, ["group", "topic", "queue_id", "lost_messages", "lost_bytes", "lost_offsets",
                               "first_loss_ms"])
    return 0


