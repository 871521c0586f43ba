"""The broker's start-up replayed read-only: what a RocketMQ broker would change in a store when it starts.

One simulation (:func:`simulate`) follows what a broker does at start-up (store-algorithms §8), in
the broker's order, on in-memory models of the files it changes:

1. load (§8.1): ``abort`` decides normal/abnormal; with an abnormal last exit, index files whose
   endTimestamp > checkpoint.indexMsgTimestamp are deleted;
2. ConsumeQueue.recover per queue (§8.2): the recovered end, maxPhysicOffset, later files deleted;
   the store's maxPhyOffsetOfConsumeQueue;
3. the commitlog recovery walk (:mod:`storelib.broker.recovery.walk`): start segment and why, CRC window,
   processOffset, failing record, segments deleted / truncated;
4. records dispatched *during* recovery (abnormal both versions, 5.x normal) go into the CQ models
   (the broker's CQ writer, ``build_consume_queues``) and the index (``build_index_files``);
5. truncateDirtyLogicFiles(processOffset) per queue when maxPhyOffsetOfConsumeQueue >= processOffset
   (§8.6, including the "first entry only" rule and the provisional maxPhysicOffset of emptied queues);
6. 4.9.8 (5.3.3 with recheckReputOffsetFromCq: :mod:`storelib.broker.startup.startup5x`): the reput from
   max(maxPhysicOffset over queues, commitlog min offset) (§8.9) — same writers; 5.3.3 by default from processOffset;
7. lost messages: where the data a start-up drops begins (after processOffset; 4.9.8 reput skipping the
   rest of a segment after an undecodable record); the records themselves are scanned by
   :mod:`storelib.broker.startup.startuplost`.

The checkpoint is rewritten so it never claims more than the store holds: physicMsgTimestamp = store
time of the last valid record, logicsMsgTimestamp = store time of the last record with a CQ entry in
that segment (else min(old, physic)), indexMsgTimestamp = min(old, physic); 5.x also sets
confirmPhyOffset to the start of the last valid record of the recovery window, or what its recovery starts
from when the window holds none (:mod:`storelib.broker.startup.checkpointafter`); bytes 24.. are kept
for 4.9.8 (it never writes them).

A DLedger-mode store follows its own start-up (:mod:`storelib.broker.recovery.dledgerwalk`: DLedger's load
and recover, DLedgerCommitLog's recovery; :mod:`storelib.broker.startup.dledgerstartup`): no commitlog
recovery dispatch except 5.3.3's after a crash, the 4.9.8 reput up to the committed position, the
consume queues cut against the data's end (5.3.3 abnormal: #9084's short offset), DLedger's data tail and
index files; the store checkpoint is judged against the data DLedger keeps.

The result (:class:`Simulation`) is what ``rmqstore recover`` turns into its plan, applies and salvages;
nothing here writes to the store.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.dispatch.cqwriter import build_consume_queues
from storelib.broker.dispatch.dispatch import DISPATCH_COLUMNS
from storelib.broker.index.indexbuild import IndexImage, IndexState, index_dispatched
from storelib.broker.recovery.dledgerwalk import lost_ranges as dledger_lost_ranges
from storelib.broker.recovery.reputpath import outcomes_by_file, reput_ranges
from storelib.broker.recovery.walk import (
    DispatchRange,
    RecoveryInputs,
    RecoveryResult,
    WalkPlan,
    WalkRunner,
    finish_walk,
    plan_recovery,
    serial_walk,
    store_inputs,
)
from storelib.broker.settings.cqload import LoadedQueue, min_variant
from storelib.broker.settings.store import Store
from storelib.broker.settings.storeloads import broker_index_refs, store_load_findings, timer_fails
from storelib.broker.settings.strayload import LOAD_FAILS, STRAY_LOADED, fails_load, judge_queue
from storelib.broker.startup.checkpointafter import checkpoint_after, checkpoint_image
from storelib.broker.startup.cqrecovery import QueueReplay, QueueReport
from storelib.broker.startup.dledgerstartup import DLedgerChanges, dledger_changes, reput_start
from storelib.broker.startup.startup5x import (
    BatchTopics,
    batch_ignored,
    batch_topics,
    confirm_without_record,
    never_reput,
    recheck_finding,
    recheck_on,
    recheck_reput_start,
    start_waits_forever,
    window_has_record,
)
from storelib.broker.timer.timerrecovery import TimerRecovery, plan_timer_recovery
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location
from storelib.format.checkpoint import Checkpoint, as_broker_reads, read_checkpoint_as_broker
from storelib.format.consumequeue import list_queues
from storelib.format.indexdir import IndexFileRef
from storelib.format.indexfile import HEADER_SIZE, IndexHeader
from storelib.format.markers import AbortState, LockState, abort_state, lock_state
from storelib.format.record import OOM_KIND
from storelib.format.topicname import escape_topic, unsafe_reason, unsafe_topic_finding
from storelib.scan.commitlog import Segment
from storelib.scan.scanner import SegmentScan

_ZERO_CHUNK = 4 * 1024 * 1024


@dataclass
class IndexFileOnLoad:
    """One index file as the start-up loads it (header fields None when the header cannot be read)."""

    name: str
    end_timestamp: int | None
    end_phy_offset: int | None
    index_count: int | None
    delete: bool


@dataclass
class Reput:
    """The reput after recovery (§8.9; 4.9.8 reads ``ranges``): where it starts (None: no reput), where it
    ends, what it dispatches."""

    start: int | None
    end: int
    ranges: list[DispatchRange] = field(default_factory=list)


@dataclass
class Simulation:
    """Everything a start-up would do to one store, computed read-only: the file changes (for apply and
    salvage) and the broker's view on the way (for the plan)."""

    store: Store
    version: str
    walk: RecoveryResult
    queues: dict[tuple[str, int], QueueReplay]
    queue_reports: list[QueueReport]  # the queues' final reports, by (topic, queue id)
    index_delete: list[str]
    index_images: list[IndexImage]
    checkpoint_bytes: bytes | None
    commitlog_zero_from: tuple[str, int] | None
    commitlog_delete: list[str]
    lost_ranges: list[tuple]  # (segment, file offset, why[, end]) where lost data starts (and ends)
    timer: TimerRecovery | None  # the 5.x timer store's start-up (storelib.broker.timer.timerrecovery)
    abort: AbortState
    lock: LockState
    checkpoint: Checkpoint  # as the start-up reads it
    checkpoint_after: Checkpoint
    inputs: RecoveryInputs
    index_files: list[IndexFileOnLoad]
    reput: Reput
    recovery_records: int  # records dispatched during recovery
    reput_records: int
    index_keys_added: int  # the broker's
    index_keys_extra: int  # only complete_index adds these
    index_extra_records: int
    complete_index: bool
    findings: list[Finding]
    dledger: DLedgerChanges | None = None  # a DLedger-mode store: DLedger's own file changes
    batch: BatchTopics | None = None  # 5.3.3's BatchConsumeQueues (modelled, never written)

    @property
    def load_failures(self) -> list[Finding]:
        """Entries the broker's load fails on (it does not start: stray entries, segments of the wrong length, a
        record whose check throws OutOfMemoryError in the recovery's window) or maps beyond this model
        (:mod:`storelib.broker.settings.strayload`): this start-up is then not what the broker does.
        DLedger's own load rules are its walk's (``load_failure``)."""
        out: dict[str | None, Finding] = {}  # one per entry (the reader and the walk both size a segment)
        for f in self.findings:
            if f.kind in (LOAD_FAILS, STRAY_LOADED, OOM_KIND) or (self.walk.dledger is None
                                                                  and fails_load(f, self.version)):
                out.setdefault(f.file, f)
        return list(out.values())

    @property
    def commitlog_folder(self) -> str:
        """The commitlog's directory relative to the root (``commitlog`` or ``dledger-<id>/data``)."""
        return self.store.commitlog.folder


def _read_ranges(store: Store, ranges: Iterable[DispatchRange], delay_levels: list[int]) -> pa.Table:
    """The dispatch columns of every record in ``ranges`` (PHYSICALOFFSET filters for 5.x ``after`` and
    ``confirm``)."""
    by_base = {s.base: s for s in store.commitlog.segments}
    batches: list[pa.RecordBatch] = []
    opts = store.commitlog.scan_options()
    for d in ranges:
        seg = by_base[d.base]
        with seg.open() as src:
            scan = SegmentScan(src, seg.display, seg.base, d.start, d.end, verify_crc=False, with_properties=False,
                               delay_levels_ms=delay_levels, columns=DISPATCH_COLUMNS, **opts)
            for b in scan:
                if d.after is not None and b.num_rows:
                    b = b.filter(pc.greater(b.column("physical_offset_field"), d.after))
                if d.below is not None and b.num_rows:  # 5.3.3 DLedger abnormal, duplicationEnable (:354-356)
                    b = b.filter(pc.less(b.column("physical_offset_field"), d.below))
                if d.confirm is not None and b.num_rows:  # 5.3.3 abnormal, duplicationEnable (CommitLog.java:752)
                    end = pc.add(b.column("physical_offset_field"), b.column("size").cast(pa.int64()))
                    b = b.filter(pc.less_equal(end, d.confirm))
                if b.num_rows:
                    batches.append(b)
    if not batches:
        from storelib.scan.messageschema import message_schema

        full = message_schema(False, False)
        schema = pa.schema([full.field(c) for c in DISPATCH_COLUMNS])
        return schema.empty_table()
    return pa.Table.from_batches(batches)


def _index_header(ref: IndexFileRef) -> IndexHeader | None:
    try:
        with ref.loc.fs.open_input_file(ref.loc.path) as f:
            return IndexHeader.from_bytes(f.read_at(HEADER_SIZE, 0), "index/" + ref.name)
    except (OSError, StoreError):
        return None


def simulate(store: Store, version: str | None = None, *, complete_index: bool = True,
             walk_runner: WalkRunner = serial_walk, records: bool = True) -> Simulation:
    """Replay a broker start-up on ``store`` (read-only); see the module docstring for the order.

    ``complete_index`` (a named deviation, default on): after an abnormal exit also re-index records
    before the recovery start segment whose index file was deleted, which the broker leaves out of
    the index. The simulation keeps both counts (``index_keys_added`` is the broker's).
    ``walk_runner``: runs the commitlog walk's segment scans (default: here, in order; the jobs pass one
    that maps :func:`storelib.broker.recovery.walk.walk_task` on an engine, with the same result).
    ``records=False`` (the audit's damage price): this process reads no record: the walks (on
    ``walk_runner``), where lost data starts and the index files the load deletes are exact; the queue and
    index models get nothing dispatched, and no file image (checkpoint, zeroed tail, DLedger's index
    units, timers) is made, so such a simulation is never applied.
    """
    settings = store.settings
    version = version or ("5" if str(settings.version).startswith("5") else "4")
    findings: list[Finding] = list(store.commitlog.findings)
    delay_levels = list(settings.delay_levels_ms)
    abort = abort_state(store.loc)
    if abort.unusual:  # isTempFileExist is File.exists(): an abnormal exit all the same
        findings.append(Finding("abort_unusual", "warning", "abort", None, abort.unusual))
    lock = lock_state(store.loc)
    cp = _checkpoint_before(store, findings)
    refs = broker_index_refs(store.index_files(findings), findings, version)
    loads = store_load_findings(store.loc, settings)  # the 5.x timer store, batchconsumequeue/
    findings.extend(loads)
    index_files = index_on_load(refs, abort.last_exit_ok, cp)
    index_delete = [f.name for f in index_files if f.delete]
    queues = _load_queues(store, findings, version)
    # 5.3.3 loads and recovers its BatchConsumeQueues beside them (startup5x); 4.9.8 never reads them
    batch = batch_topics(store.loc, settings, {t for t, _ in queues}, findings) if version == "5" else None
    findings.extend(batch_ignored(store.loc) if version == "4" else [])
    cq_max = max([q.report.recovered_max_phy_offset for q in queues.values()] + [-1]
                 + [batch.loaded_max() if batch else -1])

    # §8.3/8.4 the commitlog walk
    inputs = store_inputs(store, version=version, last_exit_ok=abort.last_exit_ok, cq_max_phy_offset=cq_max,
                          checkpoint=cp, dledger_startup=True)
    wplan = plan_recovery(inputs, store.commitlog.segments)
    walk = finish_walk(wplan, walk_runner(wplan, delay_levels))
    findings.extend(walk.findings)
    if walk.dledger is None:  # (DLedger's walk reads every data file)
        findings.extend(_unread_before(store, wplan))
    P = walk.process_offset
    segs = list(wplan.segments)
    new_cp = checkpoint_after(store, cp, version, P, segs, None if window_has_record(walk) else confirm_without_record(
        settings, wplan, walk, cp)) if walk.dledger is None and records else cp  # 5.3.3's reput end with duplication
    dup5 = version == "5" and inputs.duplication_enable and walk.dledger is None and records
    t_rec = _recovery_dispatch(store, walk, segs, queues, findings, records, batch)
    reput, t_rep, reput_walk = _reput(store, version, wplan, walk, queues, findings, t_rec.schema, walk_runner,
                                      records, batch, new_cp.confirm_phy_offset if dup5 else None)
    findings.extend(batch.findings() if batch is not None else [])
    unmodelled = store.cq_unmodelled() if t_rec.num_rows + t_rep.num_rows else None
    if unmodelled is not None:
        findings.append(Finding("cq_unreproduced", "warning", "consumequeue", None,
                                f"the start dispatches {t_rec.num_rows + t_rep.num_rows} record(s) into consume "
                                f"queues, which this plan models without what the broker adds: {unmodelled}",
                                {"supported": False}))
    index_images, keys_added, keys_extra, t_extra = _index_after(
        store, version, refs, index_delete, wplan, walk, (t_rec, t_rep), complete_index and records, reput,
        walk_runner)
    zero_from, delete_names = _commitlog_changes(store, walk, segs, records)
    S = store.commitlog.segment_size
    if walk.dledger is not None:  # what DLedger drops and what no reput dispatches; its data end for the checkpoint
        lost_ranges = dledger_lost_ranges(walk, segs, S)
        new_cp = checkpoint_after(store, cp, "4", walk.dledger.data_end, segs) if records else cp
    else:
        lost_ranges = _lost_ranges(segs, P, reput_walk, S)
        if version == "5" and inputs.duplication_enable and not recheck_on(settings, version):
            reput.start = reput.end = new_cp.confirm_phy_offset  # reputFrom = end (DefaultMessageStore.java:416, 2855)
    cp_bytes = checkpoint_image(store, new_cp, version) if records else None
    timer = plan_timer_recovery(store.loc, settings, store.commitlog, int(time.time() * 1000)) \
        if records and version == "5" and store.exists("timerlog") and not timer_fails(loads) else None
    changes = None
    if walk.dledger is not None:
        changes = dledger_changes(store, walk, inputs.dledger_index) if records else DLedgerChanges(
            index_delete=[f"{store.dledger.index}/{n}" for n in walk.dledger.index_delete] if store.dledger else [])
    return Simulation(
        store, version, walk, queues, _finish_queues(store, queues, delete_names), index_delete, index_images,
        cp_bytes, zero_from, delete_names, lost_ranges, timer, abort=abort, lock=lock, checkpoint=cp,
        checkpoint_after=new_cp, inputs=inputs, index_files=index_files, reput=reput,
        recovery_records=t_rec.num_rows, reput_records=t_rep.num_rows, index_keys_added=keys_added,
        index_keys_extra=keys_extra, index_extra_records=t_extra.num_rows, complete_index=complete_index,
        findings=findings, dledger=changes, batch=batch)


def _unread_before(store: Store, wplan: WalkPlan) -> list[Finding]:
    """Segments before the first one the start-up reads that do not start with a record (random bytes, a
    segment overwritten): nothing in a start-up reads or reports them."""
    from storelib.broker.settings.storeroot import unreadable_segments

    tasks = wplan.tasks
    first = tasks[0].base if tasks else None
    head = [f for f in store.findings if f.kind == "commitlog_head_not_a_record"]
    segs = store.commitlog.segments
    return [*(head if segs and (first is None or segs[0].base < first) else []),
            *unreadable_segments(store.loc, first)]


def _finish_queues(store: Store, queues: dict[tuple[str, int], QueueReplay], commitlog_delete: list[str]
                   ) -> list[QueueReport]:
    """Each queue's final report (correctMinOffset against the commitlog that remains), by (topic, queue id);
    after every dispatch, once."""
    remaining = [s for s in store.commitlog.segments if s.name not in commitlog_delete]
    commitlog_min = remaining[0].base if remaining else 0
    variant = min_variant(store.settings.version)  # 5.x: a queue whose every unit expired starts at its max
    return [queues[key].finish(commitlog_min, variant) for key in sorted(queues)]


def _checkpoint_before(store: Store, findings: list[Finding]) -> Checkpoint:
    """The checkpoint the start-up reads: StoreCheckpoint maps 4096 bytes, so a short file's missing bytes
    (or a missing file's) read as zero, with a warning."""
    if store.live:  # read first, before the data (the cut)
        cp, finding = as_broker_reads(store.cut.checkpoint, "checkpoint")
    else:
        cp, finding = read_checkpoint_as_broker(store.loc, "checkpoint")
    if finding is not None:
        findings.append(finding)
    return cp


def index_on_load(refs: list[IndexFileRef], last_exit_ok: bool, cp: Checkpoint) -> list[IndexFileOnLoad]:
    """§8.1 step 5: index files newer than the index checkpoint are deleted after an abnormal exit."""
    out: list[IndexFileOnLoad] = []
    for r in refs:
        h = _index_header(r)
        delete = (not last_exit_ok) and h is not None and h.end_timestamp > cp.index_msg_timestamp
        out.append(IndexFileOnLoad(r.name, None if h is None else h.end_timestamp,
                                   None if h is None else h.end_phy_offset, None if h is None else h.index_count,
                                   delete))
    return out


def _load_queues(store: Store, findings: list[Finding], version: str) -> dict[tuple[str, int], QueueReplay]:
    """§8.2 ConsumeQueue.recover per queue: a model of each queue as the start-up loads it (and what the
    load says of each queue directory's stray entries)."""
    Scq = int(store.settings.mapped_file_size_consume_queue)
    queues: dict[tuple[str, int], QueueReplay] = {}
    try:
        listed = list_queues(store.loc, findings)
    except StoreError as e:
        if e.kind == "rocksdb_consumequeue":
            raise StoreError("consumequeue", None, "unsupported_layout",
                             f"{e.detail}: recover replays the file-based ConsumeQueue recovery only; a RocksDB "
                             "consume-queue store's start-up is not modelled (rebuild --out and audit still apply)") \
                from None
        raise
    for topic, qid, loc in listed:
        with LoadedQueue(loc, segment_size=Scq, topic=topic, queue_id=qid, phy_limit=store.cq_limit) as cq:
            judge_queue(cq, version)
            findings.extend(cq.findings)
            queues[(topic, qid)] = QueueReplay(topic, qid, store.loc, Scq, cq)
    return queues


def _recovery_dispatch(store: Store, walk: RecoveryResult, segs: list[Segment],
                       queues: dict[tuple[str, int], QueueReplay], findings: list[Finding],
                       records: bool = True, batch: BatchTopics | None = None) -> pa.Table:
    """Records dispatched during recovery (abnormal both versions; 5.x normal) into the queue models (``batch``:
    5.3.3's BatchCQ topics, kept out), then the CQ truncation at processOffset; the records dispatched (none read
    when not ``records``)."""
    delay_levels = list(store.settings.delay_levels_ms)
    rec_ranges = [d for d in walk.dispatch if d.by == "recovery"] if records else []
    t_rec = _read_ranges(store, rec_ranges, [] if walk.delay_levels_quirk else delay_levels)
    _cq_dispatch(queues, t_rec, store.loc, int(store.settings.mapped_file_size_consume_queue), "recovery", findings,
                 batch)
    if not segs:
        for q in queues.values():
            q.destroy()
        if batch is not None:
            batch.destroyed = True
    elif walk.truncate_consume_queues:
        cut = walk.process_offset if walk.cq_truncate_offset is None else walk.cq_truncate_offset
        for q in queues.values():
            q.truncate(cut)
        if batch is not None:
            batch.truncate(cut)
    return t_rec


def _reput(store: Store, version: str, wplan: WalkPlan, walk: RecoveryResult,
           queues: dict[tuple[str, int], QueueReplay], findings: list[Finding], schema: pa.Schema,
           walk_runner: WalkRunner = serial_walk, records: bool = True, batch: BatchTopics | None = None,
           confirm: int | None = None) -> tuple[Reput, pa.Table, RecoveryResult | None]:
    """4.9.8 reput (§8.9; 5.3.3 with recheckReputOffsetFromCq) from the queues' maxPhysicOffset after recovery
    (``batch``: with the BatchConsumeQueues'), into the queue models; (where it ran, the records dispatched, the
    reput's walk or None). Not ``records``: where it starts and its walk (on ``walk_runner``) only. ``confirm``: 5.3.3
    with duplicationEnable, the confirm offset recovery set, where the reput's dispatch ends (getReputEndOffset,
    DefaultMessageStore.java:2855-2857). 4.9.8 with duplicationEnable dispatches nothing."""
    extra_maxes = batch.maxes() if batch is not None else []
    P = walk.process_offset
    segs = list(wplan.segments)
    delay_levels = list(store.settings.delay_levels_ms)
    reput = Reput(None, P)
    t_rep = schema.empty_table()
    reput_walk = None
    if walk.dledger is not None:  # 4.9.8 (5.3.3 with recheckReputOffsetFromCq): from the queues to the committed
        # position; 5.3.3: from the committed position (DefaultMessageStore.start)
        if (version == "4" or recheck_on(store.settings, version)) and segs:
            reput.start = reput_start(walk, [q.state.max_physic_offset for q in queues.values()] + extra_maxes)
            if not records:  # DLedger's lost data does not depend on the reput
                return reput, t_rep, None
            outcomes = outcomes_by_file(wplan, walk)
            reput.ranges, more = reput_ranges(wplan, outcomes, walk.dledger.data_end, reput.start, P)
            findings.extend(more)
            t_rep = _read_ranges(store, reput.ranges, delay_levels)
            _cq_dispatch(queues, t_rep, store.loc, int(store.settings.mapped_file_size_consume_queue), "reput",
                         findings, batch)
        else:
            reput.start = P
        return reput, t_rep, None
    recheck = recheck_on(store.settings, version)
    if not segs:
        reput.start = P if version == "5" else None
        return reput, t_rep, reput_walk
    reput_from = recheck_reput_start([q.state.max_physic_offset for q in queues.values()] + extra_maxes, segs[0].base)
    if wplan.inputs.dispatches_nothing:  # 4.9.8 duplicationEnable: the reput breaks at once, and start() waits
        reput.start = reput.end = reput_from
        findings.extend(start_waits_forever("4", reput_from, P, P))
        return reput, t_rep, reput_walk
    if version == "5" and not recheck:  # DefaultMessageStore.start: from the confirm offset, the log's end
        reput.start = P
        # what recheck would re-dispatch, when records are read (an audit's damage price does not walk it)
        if records and walk.window_start is not None and reput_from < walk.window_start:
            p2 = replace(wplan, reput_from=reput_from)
            gap = [d for d in finish_walk(p2, walk_runner(p2, delay_levels)).dispatch
                   if d.by == "reput" and d.phy_start < walk.window_start]
            findings.extend(never_reput(reput_from, walk.window_start, gap))
        return reput, t_rep, reput_walk
    reput.start = reput_from  # 4.9.8, and 5.3.3's doRecheckReputOffsetFromCq (startup5x)
    end = P if confirm is None else min(P, confirm)  # 5.3.3 duplicationEnable: up to the confirm offset
    if confirm is not None:  # and the wait for the confirm offset (doRecheckReputOffsetFromCq)
        reput.end = max(reput_from, end)
        findings.extend(start_waits_forever("5", reput_from, confirm, P))
    if reput_from < end:
        p2 = replace(wplan, reput_from=reput_from, reput_end=confirm)
        reput_walk = finish_walk(p2, walk_runner(p2, delay_levels))
        rr = [d for d in reput_walk.dispatch if d.by == "reput"]
        reput.ranges = rr
        findings.extend(f for f in reput_walk.findings if f.kind.startswith("reput"))
        t_rep = _read_ranges(store, rr if records else [], delay_levels)
        _cq_dispatch(queues, t_rep, store.loc, int(store.settings.mapped_file_size_consume_queue), "reput", findings,
                     batch)
    elif reput_from > P and confirm is None:
        findings.append(Finding("reput_from_beyond_end", "warning", None, None,
                                f"the consume queues' maxPhysicOffset {reput_from} is past processOffset {P}: "
                                "reput dispatches nothing until the commitlog grows past it"))
    if recheck:
        findings.append(recheck_finding(reput_from, P if confirm is None else confirm, reput.ranges,
                                        confirm is not None))
    return reput, t_rep, reput_walk


def _index_after(store: Store, version: str, refs: list[IndexFileRef], index_delete: list[str],
                 wplan: WalkPlan, walk: RecoveryResult, dispatched: tuple[pa.Table, pa.Table], complete_index: bool,
                 reput: Reput, walk_runner: WalkRunner = serial_walk) -> tuple[list[IndexImage], int, int, pa.Table]:
    """The index: remaining files loaded, the last one continued with every dispatched record's keys;
    (index images, keys the broker adds, keys only ``complete_index`` adds, the records it re-indexes)."""
    settings = store.settings
    t_rec, t_rep = dispatched
    delay_levels = list(settings.delay_levels_ms)
    segs = list(wplan.segments)
    geometry = settings.index_geometry
    index_images: list[IndexImage] = []
    keys_added = keys_extra = 0
    t_extra = t_rec.schema.empty_table()
    dl = walk.dledger
    lost_keys = dl is not None and bool(index_delete) and complete_index  # DLedger: keys lost, nothing dispatched
    if not (settings.message_index_enable and (t_rec.num_rows + t_rep.num_rows or lost_keys)):
        return index_images, keys_added, keys_extra, t_extra
    remaining = [r for r in refs if r.name not in index_delete]
    prev = None
    if remaining:
        f = remaining[-1].open(geometry, broker_size=True)
        try:
            prev = IndexState.from_file(f)
        finally:
            f.close()
    if t_rec.num_rows + t_rep.num_rows:
        index_images, keys_added = index_dispatched(prev, (t_rec, t_rep), geometry=geometry, version=version)
    # deviation (named, on by default): the broker re-indexes only from the recovery start segment, so keys
    # of earlier records that were in a deleted index file are lost from the index (store-algorithms §8.4);
    # complete_index re-adds them from the end of the last kept index file
    P = walk.process_offset
    idx_from = max(prev.header.end_phy_offset if prev is not None else 0, segs[0].base if segs else 0)
    start_base = walk.start_base if walk.start_base is not None else P
    if dl is not None:  # the broker indexes what its recovery walk or its reput dispatches, from there on
        start_base = walk.window_start if walk.window_start is not None else (
            reput.start if reput.start is not None else P)
    if complete_index and index_delete and segs and idx_from < start_base:
        if dl is not None:
            outcomes = outcomes_by_file(wplan, walk)
            extra = reput_ranges(wplan, outcomes, dl.data_end, idx_from, min(start_base, dl.last_entry_end))[0]
        else:
            p3 = replace(wplan, reput_from=idx_from)
            w3 = finish_walk(p3, walk_runner(p3, delay_levels))
            extra = [replace(d, end=min(d.end, start_base - d.base)) for d in w3.dispatch
                     if d.by == "reput" and d.phy_start < start_base]
        t_extra = _read_ranges(store, extra, delay_levels)
        if t_extra.num_rows:
            index_images, total = index_dispatched(prev, (t_extra, t_rec, t_rep), geometry=geometry,
                                                    version=version)
            keys_extra = total - keys_added
    return index_images, keys_added, keys_extra, t_extra


def _commitlog_changes(store: Store, walk: RecoveryResult, segs: list[Segment], records: bool = True
                       ) -> tuple[tuple[str, int] | None, list[str]]:
    """(segment and position to zero from, when bytes follow the truncation point; segments deleted). Not
    ``records``: the tail is not read (no zeroing said)."""
    zero_from = None
    if walk.truncate is not None and records:
        base, pos = walk.truncate
        seg = next(s for s in segs if s.base == base)
        if _has_nonzero(seg, pos):
            zero_from = (seg.name, pos)
    delete_names = [s.name for s in segs if s.base in set(walk.delete_segments)]
    if walk.dledger is None:  # DLedger does not delete an empty file: its load fails on it
        delete_names += [s.name for s in store.commitlog.segments if s.file_size == 0 and s.name not in delete_names]
    return zero_from, delete_names


def _lost_ranges(segs: list[Segment], P: int, reput_walk: RecoveryResult | None, S: int
                 ) -> list[tuple[Segment, int, str]]:
    """Where lost data starts: after processOffset, and (4.9.8) what reput skips."""
    lost_ranges: list[tuple[Segment, int, str]] = []
    for s in segs:
        if s.base + S > P:
            lost_ranges.append((s, max(0, P - s.base), "after_process_offset"))
    if reput_walk is not None and any(f.kind == "reput_length_mismatch" for f in reput_walk.findings):
        lost_ranges += _reput_gaps(segs, reput_walk, P, S)
    elif reput_walk is not None:
        for o in reput_walk.segments:
            if not o.crc_checked and o.end_kind == "invalid" and not (o.size and o.size > 0):
                seg = next(s for s in segs if s.base == o.base)
                if seg.base + S <= P:
                    lost_ranges.append((seg, o.end_offset, "reput_skipped_rest_of_segment"))
    return lost_ranges


def _reput_gaps(segs: list[Segment], reput_walk: RecoveryResult, P: int, S: int) -> list[tuple]:
    """What a 4.9.8 reput that met a length mismatch leaves undispatched before processOffset: the gaps
    between the ranges it reads (storelib.broker.recovery.reputpath), as (segment, start, why, end)."""
    rr = sorted((d for d in reput_walk.dispatch if d.by == "reput"), key=lambda d: d.phy_start)
    gaps = [(a.phy_end, b.phy_start) for a, b in zip(rr, rr[1:])] + ([(rr[-1].phy_end, P)] if rr else [])
    out: list[tuple] = []
    for g0, g1 in gaps:
        for s in segs:
            if g0 < g1 and s.base < g1 and s.base + S > g0:
                out.append((s, max(g0 - s.base, 0), "reput_skipped_by_length_mismatch", min(g1 - s.base, S)))
    return out


def _has_nonzero(seg: Segment, pos: int) -> bool:
    """Any non-zero byte from ``pos`` to the end of the segment (local mmap or ranged remote reads)."""
    with seg.open() as src:
        while pos < src.size:
            b = src.read(pos, _ZERO_CHUNK)
            n, nonzero = len(b), bool(np.frombuffer(b, dtype=np.uint8).any())
            b.release()
            if nonzero:
                return True
            pos += n
        return False


def _cq_dispatch(queues: dict[tuple[str, int], QueueReplay], table: pa.Table, root: Location, S: int,
                 by: str, findings: list[Finding], batch: BatchTopics | None = None) -> None:
    """Dispatch ``table`` into the queue models; a topic that cannot be a directory is a finding, never a path;
    records of 5.3.3's BatchCQ topics go to their BatchConsumeQueue (``batch`` counts them, nothing is written)."""
    if batch is not None:
        table = batch.take(table)
    if table.num_rows == 0:
        return
    states = {k: q.state for k, q in queues.items()}
    images = build_consume_queues(table, segment_size=S, state=states)
    for key, img in images.items():
        if unsafe_reason(key[0]) is not None:
            if not any(f.kind == "unsafe_topic_name" and f.extra.get("topic_escaped") == escape_topic(key[0], 1000)
                       for f in findings):
                findings.append(unsafe_topic_finding(key[0], None, None, None))
            continue
        q = queues.get(key)
        if q is None:
            q = queues[key] = QueueReplay(key[0], key[1], root, S, None)
        q.put(img, by)
