"""``rmqstore info``: what is in a store: segments, messages, topics/queues, checkpoint, markers, index, config."""

from __future__ import annotations

import argparse
import sys

from jobs.common import Progress, add_store_args, human_ms, open_store, print_json, print_table
from storelib.broker.settings.storeinfo import collect
from storelib.errors import StoreError

EXAMPLE = """example:
  rmqstore info /data/store --broker-conf /opt/rocketmq/conf/broker.conf
  rmqstore info s3://dumps/broker-a/store --s3-endpoint http://127.0.0.1:9000 --json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_store_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-scan", action="store_true", help="skip the commitlog scan (no message counts)")


def _dledger_lines(dl: dict, w) -> None:
    """The ledger: term and vote, entries, what load() commits, what is on disk but not committed."""
    cp, bak = dl.get("checkpoint"), dl.get("checkpoint_bak")
    w(f"term        {dl.get('term')}, voted for {dl.get('voted_for') or '-'} (currterm)\n")
    if "ledger_end_index" in dl:
        w(f"ledger      entries {dl['ledger_begin_index']}..{dl['ledger_end_index']} ({dl['entries']}), end term "
          f"{dl['ledger_end_term']}, data end {dl['write_pos']}\n")
    where = (f"checkpoint committedIndex={cp['committed_index']}" if cp else "no checkpoint") + \
        (f", .bak {bak['committed_index']}" if bak else "")
    if "committed_index_after_load" in dl:
        w(f"committed   index {dl['committed_index_after_load']} ({where}), position {dl['committed_pos']}: the "
          f"broker's max offset after load() is {dl['broker_max_offset']}\n")
    else:
        w(f"committed   {where}\n")
    unc = dl.get("uncommitted")
    if unc:
        w(f"uncommitted {unc['entries']} entries (index {unc['from_index']}..{unc['to_index']}, {unc['bytes']} bytes "
          f"from physical offset {unc['from_phy_offset']}) on disk past the committed index\n")


def run_args(args: argparse.Namespace) -> int:
    store = open_store(args)
    try:
        store.require_records("info")
        empty_log = False
    except StoreError:
        empty_log = True  # still shown in full below; the exit code says the commitlog holds no records
    progress = Progress("info: scanning commitlog", total=len(store.commitlog.segments))
    info = collect(store, scan=not args.no_scan,
                   on_segment=lambda done, records: progress.update(done - progress.done, f"segments, {records} records"))
    progress.close()
    if args.json:
        print_json(info)
        return 1 if empty_log else 0
    w = sys.stdout.write
    w(f"store       {info['store']}\n")
    bl = info.get("broker_line")
    if bl:
        why = "; ".join(bl["reasons"])
        w(f"broker      {bl['version']}.x rules ({bl['source']}: {why})\n")
    segs = info["segments"]
    dl = info.get("dledger")
    if dl:
        w(f"commitlog   DLedger node {dl['self_id']}: {dl['data']}, {len(segs)} data file(s) of {info['segment_size']} "
          f"bytes ({dl['reason']})\n")
        _dledger_lines(dl, w)
    else:
        w(f"commitlog   {len(segs)} segment(s) of {info['segment_size']} bytes\n")
    if "messages" in info:
        w(f"messages    {info['messages']} ({info['bytes']} bytes), stored {human_ms(info['first_store_ms'])} .. "
          f"{human_ms(info['last_store_ms'])}\n")
    cp = info["checkpoint"]
    if cp:
        w(f"checkpoint  physic {human_ms(cp['physic_msg_timestamp'])}  logics {human_ms(cp['logics_msg_timestamp'])}"
          f"  index {human_ms(cp['index_msg_timestamp'])}\n")
    w(f"abort       {'present' if info['abort']['exists'] else 'absent'}: {info['abort']['meaning']}\n")
    lk = info["lock"]
    w(f"lock        {'present' if lk['exists'] else 'absent'}"
      f"{'; HELD BY A RUNNING PROCESS' if lk['held_by_other'] else ''}\n")
    live = info.get("live") or {}
    if live.get("live"):
        who = f"pid {live['pid']}" if live.get("pid") else "pid unknown"
        w(f"live        live store ({who}): read up to a cut at offset {live['cut_offset']} taken at "
          f"{live['cut_time']}\n")
    ix = info["index_files"]
    w(f"index       {len(ix)} file(s), {sum(i['entries'] for i in ix)} entries\n")
    ts = info.get("timer_store")
    if ts:
        w(f"timers      {ts['timerlog_units']} timerlog unit(s) in {ts['timerlog_files']} file(s); pending per "
          f"timermetrics: {ts['pending_by_topic'] or 'none'} (rmqstore timers lists them)\n")
    for name, c in info["config"].items():
        extra = ", ".join(f"{k} {v}" for k, v in c.items() if k != "source")
        w(f"config      {name} (from {c['source']}){': ' + extra if extra else ''}\n")
    w("\n")
    print_table(segs, [c for c in ["name", "size", "records", "end", "end_offset", "reason"] if any(c in s for s in segs)])
    w("\n")
    print_table(info["queues"], ["topic", "queue_id", "messages", "min_queue_offset", "max_queue_offset",
                                 "cq_min_offset", "cq_max_offset"])
    if info["findings"]:
        w(f"\n{len(info['findings'])} finding(s):\n")
        for f in info["findings"]:
            w(f"  [{f['severity']}] {f['file'] or '<store>'}{' @ ' + str(f['offset']) if f['offset'] is not None else ''}:"
              f" {f['kind']}: {f['detail']}\n")
    return 1 if empty_log else 0
