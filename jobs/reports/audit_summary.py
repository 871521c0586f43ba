"""The audit's verdict for people and for schedulers: the exit code, the one-screen console summary
(findings wrapped at words, the full text in the report), and what the damage costs at a broker
start-up with the commands that salvage or repair it."""

from __future__ import annotations

import shlex
import sys
import textwrap
from typing import Any

from storelib.broker.settings.store import Store
from storelib.broker.settings.strayload import LOAD_FAILS, STRAY_LOADED
from storelib.checks.segment import SEVERITY_RANK
from storelib.errors import StoreError

EXIT_CLEAN, EXIT_FINDINGS, EXIT_FAILED = 0, 1, 2


def exit_code(report: dict[str, Any], fail_on: str) -> int:
    """0 clean, 1 findings at or above ``fail_on``."""
    th = SEVERITY_RANK[fail_on]
    return EXIT_FINDINGS if any(SEVERITY_RANK.get(f["severity"], 0) >= th for f in report["findings"]) else EXIT_CLEAN


def summary_text(report: dict[str, Any], fail_on: str) -> str:
    """The one-screen summary printed at the end of a run."""
    s = report["summary"]
    run = report.get("run", {})
    sev = s["by_severity"]
    lines = [
        f"rmqstore audit: {report['store']}",
        f"  {s['segments']} segments, {s['records']} records ({s['bytes_valid'] / 1e6:.1f} MB), {s['queues']} queues, "
        f"{s['index_files']} index files",
        f"  findings: {sev.get('critical', 0)} critical, {sev.get('error', 0)} error, {sev.get('warning', 0)} warning, "
        f"{sev.get('info', 0)} info",
        f"  damaged data: {s['bytes_lost']} bytes in corrupt regions, {s.get('crc_errors', 0)} record(s) "
        f"failing their CRC ({s.get('bytes_crc_failed', 0)} bytes)",
    ]
    live = report.get("live") or {}
    if live.get("live"):
        who = f"pid {live['pid']}" if live.get("pid") else "pid unknown"
        lines.append(f"  live store ({who}): read up to a cut at offset {live['cut_offset']} taken at {live['cut_time']}"
                     + (f"; {live['tail']}" if live.get("tail") else ""))
    if run:
        rate = f", {run['mb_per_s']} MB/s" if run.get("mb_per_s") else ""
        split = ""
        if run.get("startup_seconds") is not None:
            work = float(run.get("segment_seconds") or 0) + float(run.get("cross_check_seconds") or 0)
            split = f" (start-up {run['startup_seconds']:.2f} s, work {work:.2f} s)"
        lines.append(f"  engine {run['engine']}: {run['seconds']} s{split}; {run['segments_audited']} segments audited, "
                     f"{run['segments_carried']} carried forward{rate}")
    shown = [f for f in report["findings"] if SEVERITY_RANK.get(f["severity"], 0) >= 1][:12]
    for f in shown:
        where = f["file"] or "<store>"
        if f["offset"] is not None:
            where += f" @ {f['offset']}"
        lines.extend(_wrapped(f"  [{f['severity']}] {where}: {f['kind']}: {f['detail']}"))
    more = sum(1 for f in report["findings"] if SEVERITY_RANK.get(f["severity"], 0) >= 1) - len(shown)
    if more > 0:
        lines.append(f"  ... {more} more (see the JSON/HTML report: --report-dir D or --json)")
    lines.extend(damage_lines(report.get("damage")))
    code = exit_code(report, fail_on)
    lines.append(f"  result: {'CLEAN' if code == 0 else 'FINDINGS'} (fail-on {fail_on}, exit {code})")
    return "\n".join(lines)


SUMMARY_WIDTH = 110
DETAIL_LINES = 4


def _wrapped(line: str, indent: str = "      ") -> list[str]:
    """A finding on the console: wrapped at word boundaries, at most :data:`DETAIL_LINES` lines, a cut
    one ending in an ellipsis that points to the report (which holds the whole text)."""
    return textwrap.wrap(line, SUMMARY_WIDTH, subsequent_indent=indent, max_lines=DETAIL_LINES,
                         placeholder=" ... (full text in the report)", break_on_hyphens=False)


def damage_lines(damage: dict[str, Any] | None) -> list[str]:
    """What the damage costs and what to run next (the report's ``damage`` section), for the console."""
    if not damage:
        return []
    if damage.get("error"):
        return [f"  cost: could not replay a start-up ({damage['error']})"]
    end = (f"DLedger's data would end at {damage['data_end']} and the broker serve up to its committed position "
           f"{damage['process_offset']}" if damage.get("data_end") is not None else
           f"the commitlog would end at physical offset {damage['process_offset']}")
    out = _wrapped(f"  cost: a broker start-up would drop {damage['messages_lost']} message(s) "
                   f"({damage['messages_intact']} intact and salvageable, {damage['bytes_lost']} bytes); {end}",
                   "        ")
    for c in damage["next"]:
        out.append(f"  next: {c['command']}")
        out.extend(_wrapped(f"        {c['why']}", "        "))
    return out


COMMITLOG_DAMAGE = frozenset({"body_crc_mismatch", "prop_crc_mismatch", "torn_tail", "corrupt_region", "zeroed_region",
                              "missing_segment", "segment_unreadable", "segment_not_sealed"})
DERIVED_DAMAGE_PREFIXES = ("consumequeue/", "index/")


def damage_cost(store: Store, report: dict[str, Any], quiet: bool = True,
                same_args: list[str] | None = None, walk_runner: Any = None,
                task_map: Any = None) -> dict[str, Any] | None:
    """What the findings cost and what to run next; None on a store without damage at error or above.

    The cost is the one recovery walk ``rmqstore recover`` shows (read-only): the messages a broker
    start-up would drop (its CRC check truncates the commitlog at the first bad record of the recovery
    window and everything after it goes), how many of them are intact (salvageable), and where the
    commitlog would end. A CRC error in a segment the start-up does not re-check costs nothing at start-up.
    ``walk_runner``: where the walk's segment scans run, ``task_map`` (fn, items) -> results: where the lost
    ranges are scanned (the audit's engine; default: here). The replay reads no record in this process
    (``simulate(records=False)``): nothing it prices needs the queue and index models.
    """
    serious = [f for f in report["findings"] if SEVERITY_RANK.get(f["severity"], 0) >= SEVERITY_RANK["error"]]
    fails = [f for f in serious if f["kind"] in (LOAD_FAILS, STRAY_LOADED)]  # the broker does not load
    stray = [f["file"] for f in fails if not (f.get("extra") or {}).get("own_file")]  # entries to move out
    own = [f["file"] for f in fails if (f.get("extra") or {}).get("own_file")]  # its own file, mis-sized
    serious = [f for f in serious if f["kind"] not in (LOAD_FAILS, STRAY_LOADED)]
    log_damage = any(f["kind"] in COMMITLOG_DAMAGE for f in serious)
    derived = any((f["file"] or "").startswith(DERIVED_DAMAGE_PREFIXES) for f in serious)
    if not (log_damage or derived or stray or own):
        return None
    from storelib.broker.startup.startup import simulate
    from storelib.broker.startup.startuplost import scan_lost, truncation_failures

    quoted = " ".join(shlex.quote(a) for a in [store.uri, *(same_args or [])])  # the audit's own settings
    if not quiet:
        sys.stderr.write("audit: replaying a broker start-up (read-only) to price the damage\n")
    try:
        sim = simulate(store, records=False) if walk_runner is None else simulate(store, walk_runner=walk_runner,
                                                                                  records=False)
        totals = (scan_lost(sim) if task_map is None else scan_lost(sim, run=task_map))["totals"]
    except (StoreError, OSError, ValueError) as e:
        return {"error": str(e), "next": [{"command": f"rmqstore recover {quoted}",
                                           "why": "preview what a broker start-up would do"}]}
    steps: list[dict[str, str]] = []
    if stray:
        where = stray[0] if stray[0].startswith("/") else f"{store.uri.rstrip('/')}/{stray[0]}"
        steps.append({"command": f"mv {shlex.quote(where)} MOVED_DIR/",
                      "why": f"the broker's load fails on {len(stray)} stray entr(ies) of a mapped-file directory "
                             f"(first: {stray[0]}): move them out before it starts; recover --apply refuses until then"})
    if own:
        steps.append({"command": f"rmqstore recover {quoted}",
                      "why": f"the broker's load fails on {len(own)} of its own file(s) of the wrong length (first: "
                             f"{own[0]}): it does not start until they are restored or replaced by hand; recover "
                             "--apply refuses until then"})
    if totals["messages"]:
        steps.append({"command": f"rmqstore recover {quoted} --salvage SALVAGE_DIR",
                      "why": f"export the {totals['messages']} message(s) a start-up would drop "
                             f"({totals['intact']} intact) before anything changes"})
    oom = truncation_failures(sim)
    if log_damage and oom:
        steps.append({"command": f"rmqstore recover {quoted} --apply --force --backup BACKUP_DIR",
                      "why": f"the broker does not start on the record at {oom[0].file} @ {oom[0].offset} (an "
                             "OutOfMemoryError): truncate the log there and re-dispatch, keeping a backup; "
                             "rmqstore recover without --apply previews it"})
    elif log_damage:
        steps.append({"command": f"rmqstore recover {quoted} --apply --backup BACKUP_DIR",
                      "why": "do what the broker's start-up would (truncate, re-dispatch), keeping a backup; "
                             "rmqstore recover without --apply previews it"})
    if derived:
        if sim.walk.dledger is not None and sim.index_delete:
            steps.append({"command": f"rmqstore recover {quoted} --apply --backup BACKUP_DIR",
                          "why": "a start-up deletes index file(s) it never rebuilds in DLedger mode: the apply deletes "
                                 "them and re-indexes their records"})
        unreproduced = store.settings.cq_unreproduced_setting  # the rebuild refuses such consume queues
        steps.append({"command": f"rmqstore rebuild {quoted} --out REBUILT_DIR", "why": "rebuild ConsumeQueue and "
                      "index files from the commitlog, as the broker's dispatch writes them"} if unreproduced is None
                     else {"command": f"rmqstore rebuild {quoted} --what index --out REBUILT_DIR",
                           "why": "rebuild the index files from the commitlog, as the broker's dispatch writes them "
                                  f"(not its consume queues: {unreproduced}=true)"})
    return {"messages_lost": totals["messages"], "messages_intact": totals["intact"], "bytes_lost": totals["bytes"],
            "bytes_unreadable": totals["bytes_unreadable"], "by_topic": totals["by_topic"],
            "process_offset": sim.walk.process_offset, "next": steps,
            "data_end": None if sim.walk.dledger is None else sim.walk.dledger.data_end}


__all__ = ["EXIT_CLEAN", "EXIT_FAILED", "EXIT_FINDINGS", "damage_cost", "damage_lines", "exit_code", "summary_text"]
