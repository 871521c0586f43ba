"""The audit's DLedger checks as engine tasks (a DLedger-mode store): one task per data file beside the
segment tasks (its scan end and DLedger facts: :func:`storelib.broker.recovery.walk.walk_task`, stopped at
a live store's cut), then, once the driver has chained the files' facts into DLedger's start-up
(:func:`storelib.broker.recovery.walk.finish_walk`, per-file values only), one task per queue group for
the consume queues' ends and what a start-up cuts from them (:class:`QueueReplay` on each queue). The
driver merges findings and a small summary (:mod:`storelib.checks.dledger`); it reads no entry or record.

``--since``: a data file the run carries (unchanged since the state) keeps its facts from the carry while
its entries' index units still fingerprint the same; the others (the file being written) run again."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from storelib.broker.recovery.dledgerfacts import DLedgerEnd, IndexFiles, end_from_dict
from storelib.broker.recovery.walk import finish_walk, plan_recovery, store_inputs, walk_segment
from storelib.broker.recovery.walkplan import RecoveryResult, SegmentTask, WalkPlan
from storelib.broker.settings.cqload import LoadedQueue
from storelib.broker.startup.cqrecovery import QueueReplay, QueueReport
from storelib.checks.dledger import PartWalk
from storelib.checks.segment import AuditOptions, audit_scan_line
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import resolve
from storelib.fileio.sampledcrc import sampled_crc
from storelib.format.dledger.entries import INDEX_UNIT_SIZE
from storelib.scan.commitlog import at_cut
from storelib.scan.scanner import SegmentEnd

if TYPE_CHECKING:
    from storelib.broker.settings.store import Store

Run = Callable[[Callable[[Any], Any], list, str], list]  # (function, items, label) -> results, on the engine


@dataclass(frozen=True)
class DLedgerFileTask:
    """One data file of a DLedger start-up walk: its scan (to ``limit``, a live store's cut) and facts."""

    plan: WalkPlan
    delay_levels_ms: tuple[int, ...]
    task: SegmentTask
    limit: int | None = None
    live: bool = False


def dledger_file_task(item: DLedgerFileTask) -> tuple[str, dict | None]:
    """(data file name, its :class:`DLedgerEnd` as a dict; None: the file is gone, deleted by DLedger's
    cleaner after the listing)."""
    seg = item.plan.segments[item.task.index]
    if item.live and seg.loc.local and not os.path.exists(seg.loc.path):
        return seg.name, None
    kw: dict[str, Any] = {} if item.limit is None or item.limit >= seg.file_size else {"end": item.limit}
    try:
        end = walk_segment(item.plan, item.task, delay_levels_ms=list(item.delay_levels_ms), columns=["phy_offset"],
                           with_properties=False, **kw)
    except (OSError, StoreError):
        if item.live and seg.loc.local and not os.path.exists(seg.loc.path):
            return seg.name, None
        raise
    return seg.name, at_cut(end, item.limit).to_dict()


@dataclass
class DLedgerRun:
    """A DLedger audit in progress: the walk's plan, its file tasks, the ends carried from ``--since``."""

    store: Store
    tasks: list[DLedgerFileTask]
    carried: dict[str, dict] = field(default_factory=dict)  # data file name -> its carry entry
    crc: bool = False


def _plan(store: Store, cq_max: int = -1) -> WalkPlan:
    # a live store: the running broker's abort file is its own; the walk is the one a stop and start replays
    inputs = store_inputs(store, cq_max_phy_offset=cq_max, dledger_startup=True,
                          last_exit_ok=True if store.live else None)
    return plan_recovery(inputs, store.commitlog.segments)


def start(store: Store, carry: dict | None, carried_files: set[str]) -> DLedgerRun:
    """The data files' tasks (a file of ``carried_files`` whose carry entry still holds is not run again)."""
    plan = _plan(store)
    crc = plan.inputs.dledger_crc
    prev = (carry or {}).get("dledger_files") or {}
    index = plan.inputs.dledger_index or IndexFiles()
    limit_of = store.commitlog.limit_of if store.live else (lambda seg: None)
    run = DLedgerRun(store, [], crc=crc)
    for t in plan.tasks:
        seg = plan.segments[t.index]
        p = prev.get(seg.name)
        if p is not None and seg.name in carried_files and p.get("crc") == crc and p.get("units") == \
                units_fingerprint(index, p["end"]):
            run.carried[seg.name] = p
            continue
        run.tasks.append(DLedgerFileTask(plan, tuple(store.delay_levels_ms), t, limit_of(seg), store.live))
    return run


def part_walk(run: DLedgerRun, opts: AuditOptions) -> PartWalk | None:
    """The :class:`PartWalk` that lets the audit's segment parts give each data file's walk facts, so a file is
    read once (None: the walk's record scan is not the audit's: 5.3.3's walk after a crash stops on CRCs, or
    another line's rules)."""
    audit_line = audit_scan_line(opts)
    if not run.tasks:
        return None
    plan = run.tasks[0].plan
    inp = plan.inputs
    if inp.check_crc_on_recover and any(t.task.crc for t in run.tasks):
        return None
    if audit_line != inp.line and not (inp.line == "4" and audit_line is None):
        return None
    folder = plan.segments[run.tasks[0].task.index].display.rsplit("/", 1)[0]
    return PartWalk(inp.dledger_index or IndexFiles(), folder, v2_invalid=audit_line != inp.line)


def ends_from_parts(run: DLedgerRun, joined: dict[str, dict | None], run_on: Run) -> list[tuple[str, dict | None]]:
    """Each walked file's end: joined from its audit parts (``joined``: file name -> end), else (a part
    unusable, damage across a cut, a file audited from past byte 0) read by its own walk task on the engine."""
    out: list[tuple[str, dict | None]] = []
    missing: list[DLedgerFileTask] = []
    for t in run.tasks:
        name = t.plan.segments[t.task.index].name
        e = joined.get(name)
        (out.append((name, e)) if e is not None else missing.append(t))
    return out + list(run_on(dledger_file_task, missing, "audit: DLedger walk of files the segment scans left"))


def units_fingerprint(index: IndexFiles, end: dict) -> list[int] | None:
    """Sampled CRCs of the index units of a data file's entries (:mod:`storelib.fileio.sampledcrc`): its facts
    compare them with the entries, so they are carried only while these hold."""
    facts = end.get("dledger_facts") or {}
    first, last = facts.get("first"), facts.get("last")
    if first is None or last is None:
        return None
    n = int(last[0]) - int(first[0]) + 1
    head, tail = sampled_crc(lambda i, k: index.units(int(first[0]) + i, k)[0].tobytes(), n, INDEX_UNIT_SIZE)
    return [head, tail, n]


def finish(run: DLedgerRun, done: list[tuple[str, dict | None]], cq_max: int
           ) -> tuple[RecoveryResult, dict, WalkPlan]:
    """The start-up walk from the files' ends (the listing as it is now: files DLedger's cleaner deleted
    during the run are out of it), and the carry a later ``--since`` run goes on from."""
    plan = _plan(run.store, cq_max)
    index = plan.inputs.dledger_index or IndexFiles()
    by_name: dict[str, dict] = {n: p["end"] for n, p in run.carried.items()}
    by_name.update({n: e for n, e in done if e is not None})
    ends: dict[int, SegmentEnd] = {t.index: end_from_dict(by_name[plan.segments[t.index].name]) for t in plan.tasks
                                   if plan.segments[t.index].name in by_name}
    walk = finish_walk(plan, ends)
    carry = {}
    for i, e in ends.items():
        if isinstance(e, DLedgerEnd) and e.kind != "split_end":
            d = e.to_dict()
            carry[plan.segments[i].name] = {"end": d, "crc": run.crc, "units": _units_of_live(run, index, d)}
    return walk, carry, plan


def _units_of_live(run: DLedgerRun, index: IndexFiles, end: dict) -> list[int] | None:
    """:func:`units_fingerprint`, or None when DLedger's cleaner deleted the index-unit file since the run
    listed it (a running node: the data file went first, then reviseLedgerBeginIndex): the file's facts are
    then carried without a fingerprint, and the next run reads the file again if it is still there."""
    try:
        return units_fingerprint(index, end)
    except StoreError:
        if not run.store.live:
            raise
        return None


def merge(run: DLedgerRun, files_done: list[tuple[str, dict | None]], qtasks: list[DLedgerQueueTask],
          qdone: list[list[dict]], run_on: Run) -> tuple[list[Finding], dict[str, Any], dict]:
    """The DLedger findings, the report's summary block and the ``--since`` carry, from the tasks' results (the
    queue groups a start-up cuts are asked again, with the cut, on the engine)."""
    from storelib.checks.dledger import audit_findings

    walk, carry, plan = finish(run, files_done, cq_max_of(qdone))
    cut = walk.cq_truncate_offset
    if walk.truncate_consume_queues and cut is not None:
        hit = [i for i, res in enumerate(qdone) if any(r["max_phy"] >= cut for r in res)]
        again = run_on(dledger_queue_task, with_cut([qtasks[i] for i in hit], cut), "audit: DLedger queue cut")
        qdone = [res for i, res in enumerate(qdone) if i not in set(hit)] + list(again)
    index = plan.inputs.dledger_index or IndexFiles()
    found, summary = audit_findings(run.store, walk, queue_reports(qdone), index.file_size, plan.inputs.checkpoint,
                                    run.store.live)
    summary.update(files_walked=len(run.tasks), files_carried=len(run.carried))
    return found, summary, carry


@dataclass(frozen=True)
class DLedgerQueueTask:
    """A queue group's consume queues as a DLedger start-up loads them, and what it cuts at ``cut``."""

    uri: str
    fs_options: dict[str, Any]
    cq_file_size: int
    queues: tuple[tuple[str, int, str], ...]  # (topic, queue id, directory name)
    cut: int | None  # truncateDirtyLogicFiles' offset (None: no cut)
    phy_limit: int | None  # a live store's cut (the queues read as at it)


def dledger_queue_task(t: DLedgerQueueTask) -> list[dict]:
    """Per queue: its recovered max physical offset, and the units a start-up's cut at ``t.cut`` removes."""
    root = resolve(t.uri, **t.fs_options)
    out = []
    for topic, qid, dirname in t.queues:
        loc = root.join("consumequeue", topic, dirname)
        with LoadedQueue(loc, segment_size=t.cq_file_size, topic=topic, queue_id=qid, phy_limit=t.phy_limit) as cq:
            q = QueueReplay(topic, qid, root, t.cq_file_size, cq)
        if t.cut is not None and q.report.recovered_max_phy_offset >= t.cut:
            q.truncate(t.cut)
        out.append({"topic": topic, "qid": qid, "max_offset": q.report.recovered_max_offset,
                    "max_phy": q.report.recovered_max_phy_offset, "truncated": q.report.entries_truncated})
    return out


def queue_tasks(store: Store, fs_options: dict[str, Any], parallelism: int, findings: list[Finding]
                ) -> list[DLedgerQueueTask]:
    """The store's queues in about two groups per core (listed here: a directory listing)."""
    from storelib.format.consumequeue import list_queues

    if not store.exists("consumequeue"):
        return []
    listed = [(topic, qid, os.path.basename(loc.path.rstrip("/"))) for topic, qid, loc in
              list_queues(store.loc, findings)]
    n = max(1, min(len(listed), 2 * max(1, parallelism)))
    size = int(store.settings.mapped_file_size_consume_queue)
    return [DLedgerQueueTask(store.uri, fs_options, size, tuple(listed[i::n]), None, store.cq_limit)
            for i in range(n) if listed[i::n]]


def queue_reports(results: list[list[dict]]) -> list[QueueReport]:
    """The queue tasks' rows as the reports :func:`storelib.checks.dledger.queue_findings` reads, in queue order."""
    rows = sorted((r for res in results for r in res), key=lambda r: (r["topic"], r["qid"]))
    return [QueueReport(r["topic"], r["qid"], r["max_offset"], r["max_phy"], entries_truncated=r["truncated"])
            for r in rows]


def cq_max_of(results: list[list[dict]]) -> int:
    return max((r["max_phy"] for res in results for r in res), default=-1)


def with_cut(tasks: list[DLedgerQueueTask], cut: int) -> list[DLedgerQueueTask]:
    return [replace(t, cut=cut) for t in tasks]


__all__ = ["DLedgerFileTask", "DLedgerQueueTask", "DLedgerRun", "cq_max_of", "dledger_file_task",
           "dledger_queue_task", "ends_from_parts", "finish", "merge", "part_walk", "queue_reports", "queue_tasks",
           "start", "units_fingerprint", "with_cut"]
