"""``rmqstore recover``: replay the broker's start-up recovery offline.

Modes (exactly one): ``--plan`` (default, read-only: prints the plan and writes it as JSON),
``--apply --backup DIR`` (carry the plan out with backups; crash-safe, rerun to finish),
``--restore DIR`` (undo an apply byte for byte), ``--salvage OUT`` (export every intact message a
start-up would drop, the byte ranges lost, and salvaged config JSON).

Exit codes: 0 nothing to do / done, 1 (plan) the start-up would change or lose something,
2 could not run (bad input, live broker, unsupported store).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from jobs.common import add_fs_args, add_settings_args, name_unread, open_store, print_json
from jobs.engines.schedulers import add_engine_args, make_engine, resolve_engine_name, walk_on
from storelib.broker.recovery.walk import WalkRunner
from storelib.broker.settings.store import Store
from storelib.broker.settings.strayload import STRAY_LOADED
from storelib.errors import StoreError

EXAMPLE = """examples:
  rmqstore recover /data/store --broker-conf broker.conf            # plan (read-only)
  rmqstore recover /data/store --plan --plan-file plan.json --json
  rmqstore recover /data/store --apply --backup /backups/recover-1   # rerun the same line after a crash
  rmqstore recover --restore /backups/recover-1                      # undo it
  rmqstore recover /data/store --salvage /tmp/salvaged               # messages the broker would drop
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE", nargs="?", help="store root (local path for --apply)")
    add_settings_args(p)
    add_fs_args(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--plan", action="store_true", help="compute and print the plan (default)")
    mode.add_argument("--apply", action="store_true", help="carry the plan out (needs --backup)")
    mode.add_argument("--restore", metavar="DIR", help="restore the store from an apply's backup directory")
    mode.add_argument("--salvage", metavar="OUT", help="export what a start-up would lose into OUT")
    p.add_argument("--backup", metavar="DIR", help="backup + journal directory for --apply (outside the store)")
    p.add_argument("--plan-file", metavar="F", default=None,
                   help="also write the JSON plan to F (default: none; a preview writes nothing; --apply records "
                        "the plan it carried out in its backup directory)")
    p.add_argument("--broker-exact-index", action="store_true",
                   help="after an abnormal exit, re-index only what the broker would (it loses keys of deleted index "
                        "files before the recovery start); default: re-add them too, so the index stays complete")
    p.add_argument("--force", action="store_true", help="apply even when the plan is marked unsupported")
    p.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    add_engine_args(p, "recovery walk's segment")


def _open(args: argparse.Namespace) -> Store:
    if not args.store:
        raise StoreError(None, None, "bad_args", "STORE is required")
    return open_store(args)


def run_args(args: argparse.Namespace) -> int:
    from storelib.broker.startup.recoverapply import restore

    if args.restore:
        actions = restore(args.restore, os.path.abspath(args.store) if args.store else None)
        if args.json:
            print_json({"restored": actions})
        else:
            changed = [a for a in actions if a["action"] not in ("unchanged", "absent")]
            print(f"restored from {args.restore}: {len(changed)} file change(s) undone; the store is as it was "
                  "before the apply")
        return 0
    if args.apply and not args.backup:  # before any store is read or engine started
        raise StoreError(None, None, "bad_args", "--apply needs --backup DIR")
    store = _open(args)
    store.require_records("recover")
    if args.apply or args.salvage:  # the plan names a mixed store with a finding; changing it needs both logs
        store.require_one_log("recover --apply" if args.apply else "recover --salvage")
    segs = store.commitlog.segments
    engine = make_engine(resolve_engine_name(args.engine, master=args.master, segments=len(segs),
                                             store_bytes=sum(x.file_size for x in segs)),
                         master=args.master, workers=args.workers, app_name="rmqstore-recover")
    try:
        return _run_on(args, store, walk_on(engine))
    finally:
        engine.close()


def _run_on(args: argparse.Namespace, store: Store, walk_runner: WalkRunner) -> int:
    """The plan, apply or salvage of ``store``, its recovery walk's scans run by ``walk_runner``."""
    from storelib.broker.startup.recoverapply import apply
    from storelib.broker.startup.recoveryplan import plan_document
    from storelib.broker.startup.salvage import salvage
    from storelib.broker.startup.startup import simulate
    from storelib.fileio.smallfile_io import atomic_write_json

    if args.apply:

        def progress(msg: str) -> None:
            if sys.stderr.isatty():
                sys.stderr.write(f"\r{msg[:78]}".ljust(79))

        res = apply(store, args.backup, version=None, force=args.force, progress=progress,
                    complete_index=not args.broker_exact_index, walk_runner=walk_runner)
        if args.json:
            print_json({"steps": res.steps, "file_changes": res.file_changes, "done_before": res.done_before,
                        "resumed": res.resumed,
                        "already_complete": res.already_complete, "plan": res.plan})
        else:
            if res.already_complete:
                print(f"already applied (backup {args.backup})")
            else:
                print("\n".join(summary_lines(res.plan)))
                print(f"applied {res.file_changes} file change(s)"
                      + (f" (resumed after {res.done_before} step(s) done earlier)" if res.resumed else "")
                      + f"; backup and manifest in {args.backup} (undo: rmqstore recover --restore {args.backup})")
        return 0
    sim = simulate(store, None, complete_index=not args.broker_exact_index, walk_runner=walk_runner)
    name_unread("recover", sim.findings)
    if args.salvage:
        rep = salvage(sim, args.salvage)
        if args.json:
            print_json(rep)
        else:
            print(f"salvaged {rep['messages']} intact message(s) into {args.salvage}; "
                  f"{len(rep['lost_ranges'])} lost byte range(s), {rep['bytes_unreadable']} bytes unreadable; "
                  f"{sum(len(c['changes']) for c in rep['config'])} config change(s)")
        return 0
    plan = plan_document(sim)
    if args.plan_file and args.plan_file != "-":
        atomic_write_json(args.plan_file, plan)
    if args.json:
        sys.stdout.write(json.dumps(plan, indent=2, default=str) + "\n")
    else:
        print("\n".join(summary_lines(plan)))
        if args.plan_file and args.plan_file != "-":
            print(f"plan written to {args.plan_file}")
    # a broker that would not start is something to act on, like a change (exit 1), even with nothing to change
    return 1 if plan["changes"] or (plan.get("dledger") or {}).get("load_failure") or plan.get("load_failures") else 0


def dledger_lines(dl: dict) -> list[str]:
    """The DLedger part of a plan's summary: what DLedger's load keeps and what the broker serves after it."""
    out = [f"DLedger: start file {dl['start_file']} ({dl['start_reason']}); data ends at {dl['data_end']}"
           + (f" ({dl['stop']})" if dl["stop"] else ""),
           f"  ledger {dl['ledger_begin_index']}..{dl['ledger_end_index']} (term {dl['ledger_end_term']}); committed "
           f"index {dl['committed_index']} at {dl['committed_pos']} ({dl['committed_note']}); the broker's max offset "
           f"after load: {dl['max_offset']}"]
    if dl.get("uncommitted"):
        u = dl["uncommitted"]
        out.append(f"  uncommitted: entries {u['from_index']}..{u['to_index']} ({u['from_phy_offset']}.."
                   f"{u['to_phy_offset']}): not served until DLedger commits them again")
    if dl["index_rewrite_from"] is not None:
        out.append(f"  index: units from entry {dl['index_rewrite_from']} rewritten ({dl['index_rewrite_why']})")
    if dl["index_delete"]:
        out.append(f"  index files deleted: {', '.join(dl['index_delete'])}")
    a = dl.get("abnormal_533")
    if a:
        out.append(f"  5.3.3 abnormal recovery: from {a['start_file']}, {a['records']} record(s) re-dispatched; its "
                   f"processOffset {a['process_offset']} (the walk ended at {a['process_offset_without_bug']}: "
                   "#9084 counts record sizes without the 48-byte entry headers)")
    if dl["load_failure"]:
        out.append(f"  THE BROKER DOES NOT START: {dl['load_failure']}")
    return out


def summary_lines(plan: dict) -> list[str]:
    """A human summary of a plan."""
    c = plan["commitlog"]
    cq = plan["consume_queues"]
    lost = plan.get("lost") or {"totals": {"messages": 0, "intact": 0, "bytes": 0}}
    out = [
        f"store {plan['store']} ({plan['version']} rules)",
        *([f"live store (pid {plan['live']['pid'] or 'unknown'}): a broker runs it; this plans what a crash now "
           f"would do: its start-up over the store as read up to a cut at offset {plan['live']['cut_offset']} "
           f"taken at {plan['live']['cut_time']}"] if plan.get("live") else []),
        f"last exit: {'clean' if plan['last_exit']['clean'] else 'ABNORMAL (abort file)'} -> "
        f"{plan['last_exit']['recovery']} recovery",
        f"checkpoint: physic {plan['checkpoint']['physic_msg_timestamp']} logics "
        f"{plan['checkpoint']['logics_msg_timestamp']} index {plan['checkpoint']['index_msg_timestamp']} "
        f"(trusted up to {plan['checkpoint']['trusted_up_to']}, margin {plan['checkpoint']['safety_margin_ms']} ms)",
        f"start segment: {c['start_segment']} ({c['start_reason']})",
        (f"CRC window: {c['crc_window']['from']} .. {c['crc_window']['to']}" if c["crc_window"]["from"] is not None
         else "CRC window: none (no message CRC is checked at this start-up)"),
        f"processOffset: {c['process_offset']}" + (
            f"  (stopped by {c['failure']['reason']} at {c['failure']['segment']} @ {c['failure']['file_offset']})"
            if c["failure"] else ""),
    ]
    if c["truncate"]:
        out.append(f"commitlog: {c['truncate']['segment']} wrote position -> {c['truncate']['wrote_position']}; "
                   f"{len(c['delete_segments'])} segment(s) deleted")
    t = cq["totals"]
    out.append(f"consume queues: {t['queues']} queue(s), max phy offset {cq['max_phy_offset']}, "
               f"{t['entries_truncated']} entr(ies) truncated, {t['entries_added']} added "
               f"({t['files_written']} file(s) written, {t['files_deleted']} deleted)")
    rp = plan["dispatch"]["reput"]
    waits = (" (past the broker's max offset: it waits for the commitlog to grow)"
             if rp["from"] is not None and rp["from"] > rp["to"] else "")
    out.append(f"dispatch: {plan['dispatch']['recovery_records']} record(s) during recovery, reput from {rp['from']} "
               f"to {rp['to']}: {plan['dispatch']['reput_records']} record(s){waits}")
    ix = plan["index"]
    out.append(f"index: {len(ix['deleted'])} file(s) deleted, {len(ix['written'])} written, "
               f"{ix['entries_added']} entr(ies) added")
    lt = lost["totals"]
    out.append(f"lost: {lt['messages']} message(s) ({lt.get('intact', 0)} intact, salvageable), {lt['bytes']} bytes")
    dl = plan.get("dledger")
    if dl:
        out += dledger_lines(dl)
    ts = plan.get("timer_store")
    if ts:
        out.append(f"timer store: timerlog ends at {ts['process_offset']} ({len(ts['delete_files'])} file(s) deleted), "
                   f"{ts['slots_rewritten']} wheel slot(s) rewritten, the timer topic read from offset "
                   f"{ts['queue_offset']} ({ts['queue_offset_source']})")
        out += [f"  [{f['severity']}] {f['file']}: {f['kind']}: {f['detail']}" for f in ts["findings"]]
    for q in cq["queues"]:
        if q["entries_truncated"] or q["entries_added"] or q["files_deleted_on_load"]:
            out.append(f"  {q['topic']}/{q['queue_id']}: max {q['recovered_max_offset']} -> {q['final_max_offset']}"
                       f" (-{q['entries_truncated']} +{q['entries_added']})")
    failed = plan.get("load_failures") or []
    for f in failed:
        head = "NOT MODELLED" if f["kind"] == STRAY_LOADED else "THE BROKER DOES NOT START"
        out.append(f"  {head}: {f['file']}: {f['detail']}")
    for f in plan["findings"]:
        if f in failed:
            continue
        if f["severity"] in ("error", "critical") or (f.get("extra") or {}).get("supported") is False:
            out.append(f"  [{f['severity']}] {f['file'] or '<store>'}: {f['kind']}: {f['detail']}")
    return out
