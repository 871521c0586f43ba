"""THE recovery walk: what the broker's commitlog recovery (and the reput that follows it) does.

CommitLog.recoverNormally and recoverAbnormally (store-algorithms §8.3/§8.4, both versions) are one
walk parameterised by its *window*: the start segment, whether CRCs are checked in it, and which
valid records are dispatched. In 4.9.8 the reput thread then dispatches from the CQ's max physical
offset; records before the window are seen only by reput (no CRC; a -1 record skips the rest of its
segment, §4.1). This module computes, without modifying anything:

* the start segment and why it was chosen (``plan_recovery``);
* per segment how far the walk / reput gets (``walk_segment``: one :class:`SegmentScan` each);
* ``process_offset``, the failing record, the segments the broker deletes or truncates, and the
  exact ranges the broker dispatches (``finish_walk``).

The three steps are separate so that the per-segment scans can run anywhere (the Spark rebuild
scans segments on executors and feeds their ends to :func:`finish_walk`); :func:`recovery_walk`
runs them in-process. A rebuild's target (store-algorithms §7.1) is :func:`rebuild_target`: a
normal start with an empty consume queue.

A DLedger-mode store (``RecoveryInputs.dledger``) is walked by :mod:`storelib.broker.recovery.dledgerwalk`
(DLedger's load and recover over every data file, then DLedgerCommitLog's recovery): the same tasks, one
per data file, each also giving the file's DLedger facts (:mod:`storelib.broker.recovery.dledgerfacts`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from storelib.broker.recovery.dledgerfacts import FACT_COLUMNS, FactsBuilder, IndexFiles
from storelib.broker.recovery.dledgerwalk import dledger_inputs, finish_dledger, plan_dledger
from storelib.broker.recovery.reputpath import reput_path
from storelib.broker.recovery.walkplan import (
    DispatchRange,
    RecoveryInputs,
    RecoveryResult,
    SegmentOutcome,
    SegmentTask,
    WalkPlan,
    recovery_dispatch_after,
)
from storelib.errors import Finding, StoreError
from storelib.fileio.prefix import prefix
from storelib.format.checkpoint import Checkpoint
from storelib.format.delaylevel import DEFAULT_DELAY_LEVELS_MS
from storelib.format.record import BORNHOST_V6_FLAG, OOM_KIND, OOM_REASON, message_magics
from storelib.scan.commitlog import Segment
from storelib.scan.scanner import SegmentEnd

if TYPE_CHECKING:
    from storelib.broker.settings.store import Store

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


# ---------------------------------------------------------------------------------------------
# planning


def loaded_segments(segments: Iterable[Segment], version: str, segment_size: int) -> tuple[list[Segment], list[Finding]]:
    """The segments the broker's loader keeps (§8.1 step 2) and what it would complain about.

    A zero-length last file: 5.x deletes it; 4.9.8 refuses to start (reported as an error, skipped
    here so the walk can still say what the rest holds). A file of the wrong size fails both loads
    (reported; it is still walked as far as it goes).
    """
    segs = list(segments)
    found: list[Finding] = []
    if segs and segs[-1].file_size == 0:
        sev = "warning" if version == "5" else "error"
        found.append(Finding("empty_last_segment", sev, segs[-1].display, None,
                             "zero-length last segment: " + ("deleted by the 5.x loader" if version == "5"
                                                             else "the 4.9.8 loader fails on it")))
        segs = segs[:-1]
    for s in segs:
        if s.file_size != segment_size:
            found.append(Finding("wrong_segment_size", "error", s.display, None,
                                 f"{s.file_size} bytes, expected {segment_size}: the broker refuses to load"))
    return segs, found


def _first_record_probe(seg: Segment) -> tuple[int, int] | None:
    """(magic, storeTimestamp) of the record at offset 0 (isMappedFileMatchedRecover), None if unreadable."""
    try:
        with seg.open() as src:
            head = bytes(src.read(0, 76))
    except (OSError, pa.ArrowException, StoreError):
        return None
    if len(head) < 28:
        return None
    magic = _I32.unpack_from(head, 4)[0]
    sysflag = _I32.unpack_from(head, 36)[0]
    pos = 48 + (20 if sysflag & BORNHOST_V6_FLAG else 8)
    if len(head) < pos + 8:
        return magic, 0
    return magic, _I64.unpack_from(head, pos)[0]


def plan_recovery(inputs: RecoveryInputs, segments: Iterable[Segment],
                  probe: Callable[[Segment], tuple[int, int] | None] = _first_record_probe) -> WalkPlan:
    """Choose the start segment and window (§8.3/§8.4) for the loaded ``segments``.

    * normal 4.9.8: the third-last segment (pre-allocated zero segments count); reput covers earlier
      segments from ``max(cq_max_phy_offset, min offset)``;
    * normal 5.x: walking down from the last, the first segment with base <= cq_max_phy_offset (the
      first segment when the CQ is empty); records dispatched when PHYSICALOFFSET > cq_max_phy_offset;
    * abnormal (both): walking down from the last, the first segment whose first record matches
      (a magic the line's check takes: V1, and V2 but under 4.9.8's rules; store time != 0 and <= the
      checkpoint's min timestamp, index-bounded with messageIndexSafe); the first segment when none
      does. Every valid record is re-dispatched.
    """
    if inputs.dledger:  # every data file: DLedger's load, its walk and the reput (dledgerwalk)
        files, mode, why, notes = plan_dledger(inputs, segments)
        return WalkPlan(inputs, files, mode, 0, why, None, None, notes)
    segs, found = loaded_segments(segments, inputs.version, inputs.segment_size)
    n = len(segs)
    cq_max = inputs.cq_max_phy_offset
    reput_from = None
    if inputs.last_exit_ok:
        mode = "normal"
        if inputs.version == "4":
            start = max(0, n - 3)
            why = f"normal 4.9.8: third-last of {n} segment(s)"
            reput_from = max(cq_max, segs[0].base if segs else 0, 0)
        else:
            start = 0
            why = f"normal 5.x: no segment base <= CQ max physical offset {cq_max}: first segment"
            for i in range(n - 1, -1, -1):
                if segs[i].base <= cq_max:
                    start = i
                    why = f"normal 5.x: last segment with base <= CQ max physical offset {cq_max}"
                    break
    else:
        mode = "abnormal"
        cp = inputs.checkpoint
        if inputs.message_index_enable and inputs.message_index_safe:
            limit = cp.min_timestamp_index()
            rule = f"store time <= min(checkpoint min timestamp - 3 s, index timestamp) = {limit}"
        else:
            limit = cp.min_timestamp()
            rule = f"store time <= checkpoint min timestamp - 3 s = {limit}"
        magics = message_magics(inputs.line)  # isMappedFileMatchedRecover: V1 only in 4.9.8
        start = 0
        why = f"abnormal: no segment's first record has {rule}: first segment"
        for i in range(n - 1, -1, -1):
            got = probe(segs[i])
            if got is None:
                continue
            magic, ts = got
            if magic in magics and ts != 0 and ts <= limit:
                start = i
                why = f"abnormal: last segment whose first record has {rule} (store time {ts})"
                break
    dispatch_after = recovery_dispatch_after(inputs.version, inputs.dledger, mode == "normal", cq_max)
    return WalkPlan(inputs, tuple(segs), mode, start, why, reput_from, dispatch_after, tuple(found))


# ---------------------------------------------------------------------------------------------
# per-segment scans


def walk_segment(plan: WalkPlan, task: SegmentTask, *, delay_levels_ms: list[int] | None = None,
                 batches: list[pa.RecordBatch] | None = None, **scan_kw) -> SegmentEnd:
    """Run one task's scan in-process; returns its :class:`SegmentEnd` (records appended to ``batches``)."""
    seg = plan.segments[task.index]
    ends: list[SegmentEnd] = []
    with seg.open() as src:
        for batch in iter_task(plan, task, src, delay_levels_ms=delay_levels_ms, ends=ends, **scan_kw):
            if batches is not None:
                batches.append(batch)
    return ends[0]


def iter_task(plan: WalkPlan, task: SegmentTask, source, *, delay_levels_ms: list[int] | None = None,
              ends: list[SegmentEnd] | None = None, **scan_kw) -> Iterator[pa.RecordBatch]:
    """The batches of one task's scan (the walk's view of the segment) over an open ``source``.

    Inside the window the scan ends at the first CRC failure (or, with 5.x forceVerifyPropCRC, the
    first record whose ``__CRC32#`` property is missing or wrong). The :class:`SegmentEnd` is appended
    to ``ends``.
    """
    check = plan.inputs.check_crc_on_recover and (task.crc or not plan.inputs.dledger)
    prop = plan.prop_crc and check and task.crc
    scan_kw.setdefault("delay_levels_ms", DEFAULT_DELAY_LEVELS_MS if delay_levels_ms is None else delay_levels_ms)
    scan_kw.setdefault("line", plan.inputs.line)
    # recovery reads the window with readBody=true; the reput (segments before it, a DLedger log) with false
    scan_kw.setdefault("read_body", task.crc and not plan.inputs.dledger)
    # recovery's check, never the reput's: a default store's window; every file of 5.3.3's DLedger abnormal walk
    scan_kw.setdefault("dup_info", plan.inputs.dup_info and (task.crc or plan.inputs.dledger))
    seg = plan.segments[task.index]
    facts = cols = None
    if seg.dledger:  # the entry columns feed the file's DLedger facts, then are dropped if not asked for
        scan_kw.update(dledger=True, committed_index=plan.inputs.dledger_committed_index, file=seg.display)
        facts = FactsBuilder(seg.base, plan.inputs.dledger_index or IndexFiles(), task.start, scan_kw.get("end"),
                             cut=scan_kw.get("end") is not None)  # (only a live audit's walk ends a file early)
        cols = scan_kw.get("columns")
        if cols is not None:
            scan_kw["columns"] = list(cols) + [c for c in FACT_COLUMNS if c not in cols]
    scan = task.scan(source, verify_crc=check, prop_crc=prop, **scan_kw)
    end: SegmentEnd | None = None
    rows = 0  # records yielded before this batch: a property-CRC stop counts them as the scan's
    for batch in scan:
        if prop and batch.num_rows:
            ok = np.asarray(batch.column("prop_crc_ok").fill_null(False), dtype=bool)
            bad = np.flatnonzero(~ok)
            if len(bad):
                k = int(bad[0])
                phy = int(batch.column("phy_offset")[k].as_py())
                if seg.dledger:  # the walk ends at the entry (its header), not at the record inside it
                    phy = int(batch.column("dledger_pos")[k].as_py())
                end = SegmentEnd("invalid", scan.file, phy - task.base, phy, "crc_mismatch",
                                 "__CRC32# property missing or wrong (forceVerifyPropCRC)", records=rows + k)
                batch = batch.slice(0, k)
                if facts is not None:
                    facts.add(batch)
                if k:
                    yield batch if cols is None else batch.select(cols)
                break
        if facts is not None:
            facts.add(batch)
            if cols is not None:
                batch = batch.select(cols)
        rows += batch.num_rows
        yield batch
    if end is None:
        end = scan.end
    assert end is not None
    if facts is not None:
        end = facts.finish(source, end)
    if ends is not None:
        ends.append(end)


# ---------------------------------------------------------------------------------------------
# combining


def _outcome(task: SegmentTask, end: SegmentEnd) -> SegmentOutcome:
    return SegmentOutcome(task.base, task.name, task.start, task.crc, end.kind, end.file_offset, end.reason,
                          end.detail, end.size, end.records)


def finish_walk(plan: WalkPlan, ends: Mapping[int, SegmentEnd]) -> RecoveryResult:
    """Combine per-segment scan ends (keyed by segment index) into the :class:`RecoveryResult`.

    ``ends`` must hold every task of ``plan.tasks`` up to where the walk stops (later ones are
    ignored; a DLedger-mode walk needs them all). Raises StoreError(kind="missing_scan") when one is missing.
    """
    if plan.inputs.dledger:
        return finish_dledger(plan, ends)
    inp = plan.inputs
    segs = plan.segments
    found = list(plan.findings)
    n = len(segs)

    def end_of(i: int) -> SegmentEnd:
        if i not in ends:
            raise StoreError(segs[i].display, None, "missing_scan", "no scan result for this segment")
        return ends[i]

    outcomes, process_offset, failure, last_walked = _window_walk(plan, end_of)
    if failure is not None and failure.reason == OOM_REASON:
        found.append(_start_fails(plan, failure))
    supported = True
    reput_outcomes: list[SegmentOutcome] = []
    dispatch: list[DispatchRange] = []
    if n and inp.dispatches_nothing:  # 4.9.8, duplicationEnable: confirmOffset -1, nothing is dispatched
        found.append(_nothing_dispatched(plan, process_offset))
    elif n and plan.reput_from is not None:  # 4.9.8 normal: reput from reput_from to process_offset
        end = process_offset if plan.reput_end is None else min(process_offset, plan.reput_end)
        path = reput_path(plan, end_of, end, _reput_scan(plan))
        dispatch, reput_outcomes, supported = path.dispatch, path.outcomes, path.supported
        found += path.findings
    elif n:  # recovery dispatches (5.x normal, abnormal): valid window records
        for i in range(plan.start_index, last_walked + 1):
            e = end_of(i)
            seg = segs[i]
            stop = min(e.file_offset, process_offset - seg.base)
            if stop > 0:
                dispatch.append(DispatchRange(seg.base, seg.name, 0, stop, plan.dispatch_after, "recovery",
                                              inp.confirm_bound))
        bound = inp.confirm_bound
        if bound is not None and bound < process_offset:
            found.append(Finding(
                "recovery_unconfirmed", "info", "checkpoint", 32,
                f"duplicationEnable: the abnormal recovery dispatches only records ending at or before the "
                f"checkpoint's confirmPhyOffset {bound}; those after it, up to processOffset {process_offset}, "
                "get no consume-queue entry at start-up (the reput starts and ends at the confirm offset recovery sets)"))
    delete, truncate = _truncation(plan, process_offset)
    quirk = inp.version == "4" and plan.mode == "abnormal"
    return RecoveryResult(
        version=inp.version, mode=plan.mode, start_index=plan.start_index,
        start_base=segs[plan.start_index].base if n else None, start_reason=plan.start_reason,
        window_start=segs[plan.start_index].base if n else None,
        crc_checked=inp.check_crc_on_recover and not inp.dledger, process_offset=process_offset, failure=failure,
        segments=tuple(reput_outcomes + outcomes), delete_segments=tuple(delete), truncate=truncate,
        cq_max_phy_offset=inp.cq_max_phy_offset,
        truncate_consume_queues=n > 0 and inp.cq_max_phy_offset >= process_offset,
        dispatch=tuple(dispatch), supported=supported, findings=tuple(found), delay_levels_quirk=quirk,
    )


def _nothing_dispatched(plan: WalkPlan, process_offset: int) -> Finding:
    """4.9.8 with duplicationEnable (RecoveryInputs.dispatches_nothing): what its recovery or reput would have
    dispatched, it does not."""
    who = ("its reput breaks before the first record (duplicationEnable and reputFromOffset >= getConfirmOffset() "
           "= -1, DefaultMessageStore.java:2017-2020)" if plan.mode == "normal" else
           "its abnormal recovery dispatches only records with commitLogOffset < getConfirmOffset() = -1, none "
           "(CommitLog.java:500-502), and its reput then breaks before the first record "
           "(DefaultMessageStore.java:2017-2020)")
    return Finding("duplication_dispatches_nothing", "critical", "broker.conf", None,
                   f"duplicationEnable=true on 4.9.8: nothing in 4.9.8 sets the commitlog's confirm offset, which "
                   f"stays -1 (CommitLog.java:74), so {who}: no record up to processOffset {process_offset} gets a "
                   "consume-queue or index entry at this start-up or ever after (rebuild refuses such settings: "
                   "it would write empty files)",
                   {"process_offset": process_offset})


def _start_fails(plan: WalkPlan, failure: SegmentOutcome) -> Finding:
    """The recovery reaches a record whose check throws OutOfMemoryError: the Error leaves recoverNormally /
    recoverAbnormally and DefaultMessageStore.load; BrokerStartup.createBrokerController's catch (Throwable)
    prints it and exits -1 (BrokerStartup.java: 4.9.8 :246-248, 5.3.3 :255-257). Nothing is truncated: the broker does not start while this record is in its window."""
    seg = next(s for s in plan.segments if s.base == failure.base)
    return Finding(OOM_KIND, "critical", seg.display, failure.end_offset,
                   f"{failure.detail}; the {plan.mode} recovery reaches it at physical offset "
                   f"{failure.base + failure.end_offset}: the broker does not start (it exits at start-up every "
                   "time, and truncates nothing)", {"phy_offset": failure.base + failure.end_offset})


def _window_walk(plan: WalkPlan, end_of: Callable[[int], SegmentEnd]
                 ) -> tuple[list[SegmentOutcome], int, SegmentOutcome | None, int]:
    """§8.3 steps 2-4, the window walk: each segment's outcome, processOffset, the failing segment's
    outcome (None) and the last segment walked."""
    segs = plan.segments
    tasks = {t.index: t for t in plan.tasks}
    outcomes: list[SegmentOutcome] = []
    if not segs:
        return outcomes, 0, None, -1
    failure = None
    i = plan.start_index
    while True:
        e = end_of(i)
        oc = _outcome(tasks[i], e)
        outcomes.append(oc)
        if e.kind == "blank" and i + 1 < len(segs):
            i += 1
            continue
        if e.kind == "invalid":
            failure = oc
        # "segment_end": the next read underflows (-1), the walk stops at the segment's end
        return outcomes, segs[i].base + e.file_offset, failure, i


def _reput_scan(plan: WalkPlan) -> Callable[[int, int, int | None], SegmentEnd]:
    """A reput scan (no CRC, readBody=false) of a segment from any offset, over the getData buffer: the
    file up to ``end`` (its read position) when given, so a record running past it fails there as the
    broker's check does (where a drifted reputFromOffset lands: :mod:`storelib.broker.recovery.reputpath`)."""
    def scan(i: int, start: int, end: int | None) -> SegmentEnd:
        seg = plan.segments[i]
        ends: list[SegmentEnd] = []
        with seg.open() as src:
            for _ in iter_task(plan, SegmentTask(i, seg.base, seg.name, start, False), prefix(src, end),
                               columns=["phy_offset"], with_properties=False, ends=ends):
                pass
        return ends[0]
    return scan


def _truncation(plan: WalkPlan, process_offset: int) -> tuple[list[int], tuple[int, int] | None]:
    """§8.5: the segments wholly after processOffset (deleted) and the one it falls in (truncated there)."""
    S = plan.inputs.segment_size
    delete: list[int] = []
    truncate = None
    for seg in plan.segments:
        if seg.base + S > process_offset:
            if process_offset >= seg.base:
                truncate = (seg.base, process_offset - seg.base)
            else:
                delete.append(seg.base)
    return delete, truncate


# ---------------------------------------------------------------------------------------------
# whole walks over a Store


def store_inputs(store: Store, *, version: str | None = None, last_exit_ok: bool | None = None,
                 cq_max_phy_offset: int | None = None, checkpoint: Checkpoint | None = None,
                 dledger_startup: bool = False) -> RecoveryInputs:
    """RecoveryInputs read from a :class:`~storelib.broker.settings.store.Store` (abort marker, checkpoint, CQ max;
    a DLedger-mode store's index list and state; ``dledger_startup``: replay its start-up, not its lifetime)."""
    from storelib.format.checkpoint import as_broker_reads, read_checkpoint_as_broker
    from storelib.format.markers import abort_state

    if last_exit_ok is None:
        last_exit_ok = abort_state(store.loc).last_exit_ok
    if checkpoint is None:  # StoreCheckpoint maps 4096 bytes: a short (or no) file's missing bytes read as zero
        checkpoint = (as_broker_reads(store.cut.checkpoint, "checkpoint") if store.live
                      else read_checkpoint_as_broker(store.loc, "checkpoint"))[0]
    if cq_max_phy_offset is None:
        cq_max_phy_offset = consume_queue_max_phy_offset(store)
    kw = dict(last_exit_ok=last_exit_ok, checkpoint=checkpoint, cq_max_phy_offset=cq_max_phy_offset,
              segment_size=store.commitlog.segment_size)
    if store.dledger is not None and store.dledger_state is not None:
        kw.update(dledger_inputs(store), dledger_startup=dledger_startup)
    if version is not None:
        kw["version"] = version
    return RecoveryInputs.from_settings(store.settings, **kw)


def consume_queue_max_phy_offset(store: Store) -> int:
    """maxPhyOffsetOfConsumeQueue: the largest recovered maxPhysicOffset over all queues (-1 if none)."""
    from storelib.broker.settings.cqload import LoadedQueue
    from storelib.format.consumequeue import list_queues

    if not store.exists("consumequeue"):
        return -1
    size = store.settings.mapped_file_size_consume_queue
    best = -1
    for topic, qid, loc in list_queues(store.loc):
        with LoadedQueue(loc, segment_size=size, topic=topic, queue_id=qid, phy_limit=store.cq_limit) as cq:
            best = max(best, cq.max_physic_offset())
    return best


def recovery_walk(store: Store, inputs: RecoveryInputs | None = None, *,
                  on_segment: Callable[[SegmentTask, SegmentEnd], None] | None = None) -> RecoveryResult:
    """The broker's recovery of ``store``'s commitlog, computed in-process (read-only).

    ``inputs`` default to :func:`store_inputs`. Segments after the walk's stop are not scanned.
    """
    inputs = inputs or store_inputs(store)
    plan = plan_recovery(inputs, store.commitlog.segments)
    ends = run_tasks(plan, delay_levels_ms=list(store.delay_levels_ms), on_segment=on_segment)
    return finish_walk(plan, ends)


def run_tasks(plan: WalkPlan, *, delay_levels_ms: list[int] | None = None,
              on_segment: Callable[[SegmentTask, SegmentEnd], None] | None = None,
              columns: list[str] | None = None) -> dict[int, SegmentEnd]:
    """Scan the plan's tasks in order, skipping window segments after the walk has stopped.

    Only the segment ends are kept, so by default the scans build one column (validity, CRC and the
    DELAY rule are decided whatever the columns): about half the cost of decoding the usual ones.
    """
    ends: dict[int, SegmentEnd] = {}
    stopped = False
    for t in plan.tasks:
        if t.crc and stopped:
            break
        cols = columns if columns is not None else _walk_columns(plan, t)
        end = walk_segment(plan, t, delay_levels_ms=delay_levels_ms, columns=cols, with_properties=False)
        ends[t.index] = end
        if on_segment:
            on_segment(t, end)
        if t.crc and end.kind != "blank" and not plan.inputs.dledger:
            stopped = True
    return ends


def _walk_columns(plan: WalkPlan, task: SegmentTask) -> list[str]:
    """The one column a walk scan builds (its end is all it keeps), and the 5.x property CRC in the window."""
    return ["phy_offset"] + (["prop_crc_ok"] if plan.prop_crc and task.crc else [])


def walk_task(plan: WalkPlan, delay_levels_ms: list[int], task: SegmentTask) -> tuple[int, SegmentEnd]:
    """One segment of the walk as a task for any engine (module-level, so it pickles by reference):
    (segment index, its end). An engine may scan window segments past the walk's stop; :func:`finish_walk`
    ignores them, so the result is :func:`run_tasks`'."""
    return task.index, walk_segment(plan, task, delay_levels_ms=delay_levels_ms, columns=_walk_columns(plan, task),
                                    with_properties=False)


WalkRunner = Callable[[WalkPlan, list[int]], Mapping[int, SegmentEnd]]  # (plan, delay levels) -> ends


def serial_walk(plan: WalkPlan, delay_levels_ms: list[int]) -> dict[int, SegmentEnd]:
    """The walk's scans in this process, in order, stopping where the walk stops."""
    return run_tasks(plan, delay_levels_ms=delay_levels_ms)


def rebuild_target(store: Store, *, version: str | None = None) -> RecoveryResult:
    """The walk that defines a rebuild (store-algorithms §7.1): normal start, empty CQ, no abort."""
    inputs = store_inputs(store, version=version, last_exit_ok=True, cq_max_phy_offset=-1,
                          checkpoint=Checkpoint())
    return recovery_walk(store, inputs)


__all__ = ["DispatchRange", "RecoveryInputs", "RecoveryResult", "SegmentOutcome", "SegmentTask", "WalkPlan",
           "WalkRunner", "consume_queue_max_phy_offset", "finish_walk", "iter_task", "loaded_segments", "plan_recovery",
           "rebuild_target", "recovery_walk", "run_tasks", "serial_walk", "store_inputs", "walk_segment", "walk_task"]
