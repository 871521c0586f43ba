"""Offline replay of the broker's start-up recovery: plan it, apply it with backups, salvage the rest.

One simulation (:func:`simulate`) follows what a broker does at start-up (store-algorithms §8), in
the broker's order, on in-memory models of the files it changes:

1. load (§8.1): ``abort`` decides normal/abnormal; with an abnormal last exit, index files whose
   endTimestamp > checkpoint.indexMsgTimestamp are deleted;
2. ConsumeQueue.recover per queue (§8.2): the recovered end, maxPhysicOffset, later files deleted;
   the store's maxPhyOffsetOfConsumeQueue;
3. the commitlog recovery walk (:mod:`storelib.broker.recovery`): start segment and why, CRC window,
   processOffset, failing record, segments deleted / truncated;
4. records dispatched *during* recovery (abnormal both versions, 5.x normal) go into the CQ models
   (the broker's CQ writer, ``build_consume_queues``) and the index (``build_index_files``);
5. truncateDirtyLogicFiles(processOffset) per queue when maxPhyOffsetOfConsumeQueue >= processOffset
   (§8.6, including the "first entry only" rule and the provisional maxPhysicOffset of emptied queues);
6. 4.9.8: the reput from max(maxPhysicOffset over queues, commitlog min offset) (§8.9) — same writers;
7. lost messages: every record a start-up drops (after processOffset; 4.9.8 reput skipping the rest of
   a segment after an undecodable record), found by resynchronising over corrupt regions
   (:mod:`storelib.broker.resync`).

``--plan`` turns the simulation into a JSON document (schema ``rmqstore.recover.plan/1``).

``--apply`` carries it out without a broker, crash-safely (see :func:`apply`): all new file contents
are first *staged* in the backup directory, then each step backs up what it touches
(:class:`storelib.fileio.backup.Backup`) and performs one idempotent operation, and is marked done in a
journal. A rerun after a kill continues from the journal with the staged plan (never re-plans from
a half-changed store).

Truncating the commitlog offline: the broker only moves its write position and leaves the bytes after
processOffset on disk (the next start would find them again only if they were valid, which they are
not — except that a *later* corruption fix or a different window could resurrect them). Offline there
is no write position to move, so apply **zeroes** the segment from processOffset to its end (in place,
zeros written front to back, so at every instant the record at processOffset is invalid and a broker
started mid-way sees the same valid end). ConsumeQueue tails after the new write position are zeroed
the same way (stale units would otherwise be recovered as valid on the next start). The exact
original bytes are in the backup, so ``--restore`` is byte-identical.

The checkpoint is rewritten so it never claims more than the store holds: physicMsgTimestamp = store
time of the last valid record, logicsMsgTimestamp = store time of the last record with a CQ entry in
that segment (else min(old, physic)), indexMsgTimestamp = min(old, physic); 5.x also sets
confirmPhyOffset to the start of the last valid record (as its recovery does); bytes 24.. are kept
for 4.9.8 (it never writes them).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.cqrecovery import QueueReplay
from storelib.broker.cqwriter import build_consume_queues
from storelib.broker.dispatch import DISPATCH_COLUMNS, index_geometry
from storelib.broker.indexbuild import IndexImage, IndexState, index_dispatched
from storelib.broker.recovery import (
    DispatchRange,
    RecoveryResult,
    finish_walk,
    plan_recovery,
    run_tasks,
    store_inputs,
)
from storelib.broker.resync import find_next_record, lost_region
from storelib.broker.timerrecovery import TimerRecovery, plan_timer_recovery
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import LocalSource, Location
from storelib.fileio.smallfile_io import atomic_write, read_small
from storelib.format.checkpoint import CHECKPOINT_SIZE, RECOVERY_SAFETY_MS, Checkpoint, read_checkpoint
from storelib.format.consumequeue import (
    ConsumeQueue,
    list_queues,
)
from storelib.format.indexdir import list_index_files
from storelib.format.indexfile import HEADER_SIZE, IndexHeader
from storelib.format.markers import abort_state, lock_state
from storelib.format.topicname import escape_topic, unsafe_reason, unsafe_topic_finding
from storelib.scan.commitlog import Segment
from storelib.scan.scanner import SegmentScan

PLAN_SCHEMA = "rmqstore.recover.plan/1"
MARKER = ".rmqstore-recover"  # in the store root while an apply is under way (names the backup dir)
JOURNAL = "journal.jsonl"
PLAN_FILE = "plan.json"
STEPS_FILE = "steps.json"
STAGED = "staged"
_ZERO_CHUNK = 4 * 1024 * 1024
LOST_COLUMNS = ["phy_offset", "size", "topic", "queue_id", "queue_offset", "keys", "uniq_key", "tags",
                "store_timestamp", "crc_ok"]

# ---------------------------------------------------------------------------------------------
# the simulation


@dataclass
class Simulation:
    """Everything a start-up would do to one store, computed read-only."""

    store: Any
    version: str
    plan: dict
    walk: RecoveryResult
    queues: dict[tuple[str, int], QueueReplay]
    index_delete: list[str]
    index_images: list[IndexImage]
    checkpoint_bytes: bytes | None
    commitlog_zero_from: tuple[str, int] | None
    commitlog_delete: list[str]
    lost_ranges: list[tuple[Segment, int, str]]  # (segment, file offset, why) where lost data starts
    timer: TimerRecovery | None = None  # the 5.x timer store's start-up (storelib.broker.timerrecovery)


def _read_ranges(store, ranges: Iterable[DispatchRange], delay_levels: list[int]) -> pa.Table:
    """The dispatch columns of every record in ``ranges`` (PHYSICALOFFSET filter for 5.x ``after``)."""
    by_base = {s.base: s for s in store.commitlog.segments}
    batches: list[pa.RecordBatch] = []
    for d in ranges:
        seg = by_base[d.base]
        with seg.open() as src:
            scan = SegmentScan(src, seg.display, seg.base, d.start, d.end, verify_crc=False, with_properties=False,
                               delay_levels_ms=delay_levels, columns=DISPATCH_COLUMNS)
            for b in scan:
                if d.after is not None and b.num_rows:
                    b = b.filter(pc.greater(b.column("physical_offset_field"), d.after))
                if b.num_rows:
                    batches.append(b)
    if not batches:
        from storelib.scan.messageschema import message_schema

        full = message_schema(False, False)
        schema = pa.schema([full.field(c) for c in DISPATCH_COLUMNS])
        return schema.empty_table()
    return pa.Table.from_batches(batches)


def _last_records(store, P: int) -> tuple[int, int, int] | None:
    """(start, store time, store time of the last CQ-able record or 0) of the last record before P."""
    segs = [s for s in store.commitlog.segments if s.base < P and s.file_size > 0]
    for seg in reversed(segs):
        with seg.open() as src:
            scan = SegmentScan(src, seg.display, seg.base, 0, P - seg.base, verify_crc=False, with_properties=False,
                               columns=["phy_offset", "store_timestamp", "tran_type"])
            last = None
            last_cq = 0
            for b in scan:
                if b.num_rows:
                    last = (int(b.column("phy_offset")[-1].as_py()), int(b.column("store_timestamp")[-1].as_py()))
                    tt = np.asarray(b.column("tran_type"))
                    cq = np.flatnonzero((tt == 0) | (tt == 2))
                    if len(cq):
                        last_cq = int(b.column("store_timestamp")[int(cq[-1])].as_py())
            if last is not None:
                return last[0], last[1], last_cq
    return None


def _index_header(ref) -> IndexHeader | None:
    try:
        with ref.loc.fs.open_input_file(ref.loc.path) as f:
            return IndexHeader.from_bytes(f.read_at(HEADER_SIZE, 0), "index/" + ref.name)
    except (OSError, StoreError):
        return None


def _segment_dict(s: Segment) -> dict:
    return {"name": s.name, "base": s.base, "size": s.file_size}


def simulate(store, version: str | None = None, *, lost: bool = True, complete_index: bool = True) -> Simulation:
    """Replay a broker start-up on ``store`` (read-only); see the module docstring for the order.

    ``complete_index`` (a named deviation, default on): after an abnormal exit also re-index records
    before the recovery start segment whose index file was deleted, which the broker leaves out of
    the index. The plan reports both counts (``index.entries_added`` is the broker's).
    """
    settings = store.settings
    version = version or ("5" if str(settings.version).startswith("5") else "4")
    root = store.loc
    findings: list[Finding] = list(store.commitlog.findings)
    cl = store.commitlog
    Scq = int(settings.mapped_file_size_consume_queue)
    delay_levels = list(settings.delay_levels_ms)

    abort = abort_state(store.loc)
    lock = lock_state(store.loc)
    last_exit_ok = abort.last_exit_ok
    if store.exists("checkpoint"):
        cp = read_checkpoint(store.loc, strict=False)
    else:
        cp = Checkpoint()
        findings.append(Finding("checkpoint_missing", "warning", "checkpoint", None,
                                "no checkpoint file: every timestamp reads as 0"))

    # §8.1 step 5: index files newer than the index checkpoint are deleted after an abnormal exit
    refs = list_index_files(store.loc, findings)
    idx_rows: list[dict] = []
    index_delete: list[str] = []
    for r in refs:
        h = _index_header(r)
        delete = (not last_exit_ok) and h is not None and h.end_timestamp > cp.index_msg_timestamp
        if delete:
            index_delete.append(r.name)
        idx_rows.append({"name": r.name, "end_timestamp": None if h is None else h.end_timestamp,
                         "end_phy_offset": None if h is None else h.end_phy_offset,
                         "index_count": None if h is None else h.index_count,
                         "action": "delete" if delete else "keep"})

    # §8.2 ConsumeQueue.recover per queue
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
        with ConsumeQueue(loc, segment_size=Scq, topic=topic, queue_id=qid) as cq:
            findings.extend(cq.findings)
            queues[(topic, qid)] = QueueReplay(topic, qid, root, Scq, cq)
    cq_max = max([q.report.recovered_max_phy_offset for q in queues.values()] + [-1])

    # §8.3/8.4 the commitlog walk
    inputs = store_inputs(store, version=version, last_exit_ok=last_exit_ok, cq_max_phy_offset=cq_max,
                          checkpoint=cp)
    wplan = plan_recovery(inputs, cl.segments)
    walk = finish_walk(wplan, run_tasks(wplan, delay_levels_ms=delay_levels))
    findings.extend(walk.findings)
    P = walk.process_offset
    segs = list(wplan.segments)

    # recovery dispatch (abnormal both versions; 5.x normal), then CQ truncation
    rec_ranges = [d for d in walk.dispatch if d.by == "recovery"]
    t_rec = _read_ranges(store, rec_ranges, [] if walk.delay_levels_quirk else delay_levels)
    _cq_dispatch(queues, t_rec, root, Scq, "recovery", findings)
    if not segs:
        for q in queues.values():
            q.destroy()
    elif walk.truncate_consume_queues:
        for q in queues.values():
            q.truncate(P)

    # 4.9.8 reput (§8.9): from the queues' maxPhysicOffset after recovery
    reput: dict[str, Any] = {"from": None, "to": P, "ranges": []}
    t_rep = t_rec.schema.empty_table()
    reput_walk = None
    if version == "4" and segs:
        reput_from = max([q.state.max_physic_offset for q in queues.values()] + [segs[0].base, 0])
        reput["from"] = reput_from
        if reput_from < P:
            p2 = replace(wplan, reput_from=reput_from)
            reput_walk = finish_walk(p2, run_tasks(p2, delay_levels_ms=delay_levels))
            rr = [d for d in reput_walk.dispatch if d.by == "reput"]
            reput["ranges"] = [_range_dict(d) for d in rr]
            findings.extend(f for f in reput_walk.findings if f.kind.startswith("reput"))
            t_rep = _read_ranges(store, rr, delay_levels)
            _cq_dispatch(queues, t_rep, root, Scq, "reput", findings)
        elif reput_from > P:
            findings.append(Finding("reput_from_beyond_end", "warning", None, None,
                                    f"the consume queues' maxPhysicOffset {reput_from} is past processOffset {P}: "
                                    "reput dispatches nothing until the commitlog grows past it"))
    if version == "5":
        reput["from"] = P

    # index: load remaining files, continue the last one with every dispatched record's keys
    geometry = index_geometry(settings)
    index_images: list[IndexImage] = []
    keys_added = keys_extra = 0
    t_extra = t_rec.schema.empty_table()
    if settings.message_index_enable and (t_rec.num_rows + t_rep.num_rows):
        remaining = [r for r in refs if r.name not in index_delete]
        prev = None
        if remaining:
            f = remaining[-1].open(geometry, broker_size=True)
            try:
                prev = IndexState.from_file(f)
            finally:
                f.close()
        index_images, keys_added = index_dispatched(prev, (t_rec, t_rep), geometry=geometry, version=version)
        # deviation (named, on by default): the broker re-indexes only from the recovery start segment, so keys
        # of earlier records that were in a deleted index file are lost from the index (store-algorithms §8.4);
        # complete_index re-adds them from the end of the last kept index file
        idx_from = max(prev.header.end_phy_offset if prev is not None else 0, segs[0].base if segs else 0)
        start_base = walk.start_base if walk.start_base is not None else P
        if complete_index and index_delete and segs and idx_from < start_base:
            p3 = replace(wplan, reput_from=idx_from)
            w3 = finish_walk(p3, run_tasks(p3, delay_levels_ms=delay_levels))
            extra = [replace(d, end=min(d.end, start_base - d.base)) for d in w3.dispatch
                     if d.by == "reput" and d.phy_start < start_base]
            t_extra = _read_ranges(store, extra, delay_levels)
            if t_extra.num_rows:
                index_images, total = index_dispatched(prev, (t_extra, t_rec, t_rep), geometry=geometry,
                                                        version=version)
                keys_extra = total - keys_added

    # commitlog changes
    S = cl.segment_size
    zero_from = None
    if walk.truncate is not None:
        base, pos = walk.truncate
        seg = next(s for s in segs if s.base == base)
        if _has_nonzero(seg, pos):
            zero_from = (seg.name, pos)
    delete_names = [s.name for s in segs if s.base in set(walk.delete_segments)]
    delete_names += [s.name for s in cl.segments if s.file_size == 0 and s.name not in delete_names]

    # lost data ranges: after processOffset, and (4.9.8) what reput skips
    lost_ranges: list[tuple[Segment, int, str]] = []
    for s in segs:
        if s.base + S > P:
            lost_ranges.append((s, max(0, P - s.base), "after_process_offset"))
    if reput_walk is not None:
        for o in reput_walk.segments:
            if not o.crc_checked and o.end_kind == "invalid" and not (o.size and o.size > 0):
                seg = next(s for s in segs if s.base == o.base)
                if seg.base + S <= P:
                    lost_ranges.append((seg, o.end_offset, "reput_skipped_rest_of_segment"))

    # checkpoint after
    last = _last_records(store, P) if segs else None
    if last is None:
        new_cp = replace(cp, physic_msg_timestamp=0, logics_msg_timestamp=0, index_msg_timestamp=0)
    else:
        start, t_last, t_cq = last
        new_cp = replace(cp, physic_msg_timestamp=t_last,
                         logics_msg_timestamp=t_cq if t_cq else min(cp.logics_msg_timestamp, t_last),
                         index_msg_timestamp=min(cp.index_msg_timestamp, t_last))
        if version == "5":
            new_cp = replace(new_cp, confirm_phy_offset=start)
    cp_bytes = _checkpoint_image(store, new_cp, version)

    timer = plan_timer_recovery(store.loc, settings, store.commitlog, int(time.time() * 1000)) \
        if version == "5" and store.exists("timerlog") else None
    sim = Simulation(store, version, {}, walk, queues, index_delete, index_images, cp_bytes, zero_from,
                     delete_names, lost_ranges, timer)
    sim.plan = _plan_dict(sim, settings=settings, abort=abort, lock=lock, cp=cp, new_cp=new_cp, inputs=inputs,
                          idx_rows=idx_rows, reput=reput, t_rec=t_rec, t_rep=t_rep, keys_added=keys_added,
                          keys_extra=keys_extra, extra_records=t_extra.num_rows, complete_index=complete_index,
                          findings=findings, lost=lost)
    return sim


def _range_dict(d: DispatchRange) -> dict:
    return {"segment": d.name, "from": d.phy_start, "to": d.phy_end, "by": d.by,
            "only_physical_offset_above": d.after}


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


def _checkpoint_image(store, cp: Checkpoint, version: str) -> bytes:
    """The new 4096-byte checkpoint: fields patched into the existing page (4.9.8 keeps bytes 24..)."""
    old = read_small(store.path("checkpoint"), 1 << 20)
    page = bytearray(old[:CHECKPOINT_SIZE]) if old else bytearray(CHECKPOINT_SIZE)
    if len(page) < CHECKPOINT_SIZE:
        page += bytes(CHECKPOINT_SIZE - len(page))
    n = 40 if version == "5" else 24
    page[:n] = cp.to_bytes()[:n]
    return bytes(page)


def _cq_dispatch(queues: dict[tuple[str, int], QueueReplay], table: pa.Table, root: Location, S: int,
                 by: str, findings: list[Finding]) -> None:
    """Dispatch ``table`` into the queue models; a topic that cannot be a directory is a finding, never a path."""
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


def _plan_dict(sim: Simulation, *, settings, abort, lock, cp: Checkpoint, new_cp: Checkpoint, inputs, idx_rows,
               reput, t_rec, t_rep, keys_added, keys_extra, extra_records, complete_index, findings, lost) -> dict:
    store, walk = sim.store, sim.walk
    cl = store.commitlog
    S = cl.segment_size
    fail = walk.failure
    segs_max = max([s.base + s.file_size for s in cl.segments] + [0])
    qreps = []
    commitlog_min = cl.segments[0].base if cl.segments else 0
    remaining = [s for s in cl.segments if s.name not in sim.commitlog_delete]
    commitlog_min = remaining[0].base if remaining else 0
    for key in sorted(sim.queues):
        qreps.append(sim.queues[key].finish(commitlog_min).__dict__.copy())
    files = [{"path": rel, "action": "write" if data is not None else "delete"}
             for q in sim.queues.values() for rel, data in q.outputs()]
    lost_doc = scan_lost(sim, with_body=False) if lost else None
    plan = {
        "schema": PLAN_SCHEMA,
        "store": store.loc.path,
        "version": "5.x" if sim.version == "5" else "4.9.x",
        "broker_line": store.settings.line.to_json() if store.settings.line else None,
        "created_ms": int(time.time() * 1000),
        "last_exit": {
            "clean": abort.last_exit_ok, "abort_file": abort.exists, "abort_content": abort.content,
            "recovery": walk.mode,
            "lock": {"exists": lock.exists, "held_by_other": lock.held_by_other, "holder_pid": lock.holder_pid},
        },
        "checkpoint": {
            "physic_msg_timestamp": cp.physic_msg_timestamp, "logics_msg_timestamp": cp.logics_msg_timestamp,
            "index_msg_timestamp": cp.index_msg_timestamp, "master_flushed_offset": cp.master_flushed_offset,
            "confirm_phy_offset": cp.confirm_phy_offset, "safety_margin_ms": RECOVERY_SAFETY_MS,
            "min_timestamp": cp.min_timestamp(), "min_timestamp_index": cp.min_timestamp_index(),
            "message_index_enable": inputs.message_index_enable, "message_index_safe": inputs.message_index_safe,
            "trusted_up_to": cp.min_timestamp_index() if inputs.message_index_enable and inputs.message_index_safe
            else cp.min_timestamp(),
        },
        "commitlog": {
            "segment_size": S,
            "segments": [_segment_dict(s) for s in cl.segments],
            "min_offset": cl.segments[0].base if cl.segments else 0,
            "start_segment": None if walk.start_base is None else file_name_cl(walk.start_base),
            "start_base": walk.start_base,
            "start_reason": walk.start_reason,
            "crc_window": {"from": walk.window_start, "to": walk.process_offset, "crc_checked": walk.crc_checked,
                           "segments": [o.name for o in walk.segments if o.crc_checked]},
            "process_offset": walk.process_offset,
            "failure": None if fail is None else {
                "segment": fail.name, "file_offset": fail.end_offset, "phy_offset": fail.base + fail.end_offset,
                "reason": fail.reason, "detail": fail.detail},
            "delete_segments": sim.commitlog_delete,
            "truncate": None if walk.truncate is None else {
                "segment": file_name_cl(walk.truncate[0]), "wrote_position": walk.truncate[1],
                "bytes_after": S - walk.truncate[1],
                "zero_tail": sim.commitlog_zero_from is not None},
            "bytes_dropped": max(0, segs_max - walk.process_offset) if cl.segments else 0,
            "supported": walk.supported,
        },
        "consume_queues": {
            "max_phy_offset": walk.cq_max_phy_offset,
            "truncate_at_process_offset": walk.truncate_consume_queues,
            "queues": qreps,
            "files": files,
            "totals": {
                "queues": len(qreps),
                "entries_truncated": sum(r["entries_truncated"] for r in qreps),
                "entries_added": sum(r["entries_added"] for r in qreps),
                "files_written": sum(1 for f in files if f["action"] == "write"),
                "files_deleted": sum(1 for f in files if f["action"] == "delete"),
            },
        },
        "dispatch": {
            "recovery": [_range_dict(d) for d in walk.dispatch if d.by == "recovery"],
            "recovery_records": t_rec.num_rows,
            "delay_levels_quirk": walk.delay_levels_quirk,
            "reput": reput,
            "reput_records": t_rep.num_rows,
        },
        "index": {
            "files": idx_rows,
            "deleted": sim.index_delete,
            "written": [im.name for im in sim.index_images],
            "entries_added": keys_added,
            "complete_index": complete_index,
            "extra_records_indexed": extra_records,
            "entries_the_broker_would_lose": keys_extra,
        },
        "checkpoint_after": {
            "physic_msg_timestamp": new_cp.physic_msg_timestamp, "logics_msg_timestamp": new_cp.logics_msg_timestamp,
            "index_msg_timestamp": new_cp.index_msg_timestamp, "confirm_phy_offset": new_cp.confirm_phy_offset,
        },
        "abort_remove": abort.exists,
        "lost": lost_doc,
        "timer_store": sim.timer.to_json() if sim.timer is not None else None,
        "findings": [f.to_dict() for f in findings],
    }
    plan["changes"] = bool(
        plan["commitlog"]["delete_segments"] or sim.commitlog_zero_from or files or sim.index_delete
        or sim.index_images or abort.exists or (lost_doc and lost_doc["totals"]["messages"])
        or (sim.timer is not None and sim.timer.changes_anything()))
    return plan


def file_name_cl(offset: int) -> str:
    return f"{offset:020d}"


# ---------------------------------------------------------------------------------------------
# lost messages and salvage scans


def _scan_from(seg: Segment, start: int, why: str, *, with_body: bool, delay_levels: list[int],
               batches: list[pa.Table], regions: list[dict]) -> None:
    """Every structurally valid record from ``start`` to the segment's end, resynchronising after
    each corrupt region (records with a bad body CRC are kept, flagged ``crc_ok=false``)."""
    src = seg.open()
    try:
        view = src.view() if isinstance(src, LocalSource) else memoryview(bytes(src.read(0, src.size)))
        n = len(view)
        pos = start
        while pos < n:
            scan = SegmentScan(src, seg.display, seg.base, pos, verify_crc=True, stop_on_crc=False,
                               with_body=with_body, with_properties=True, delay_levels_ms=delay_levels)
            for b in scan:
                if b.num_rows:
                    batches.append(pa.Table.from_batches([b]).append_column("why", pa.array([why] * b.num_rows)))
            e = scan.end
            assert e is not None
            if e.kind in ("segment_end", "split_end", "blank"):
                return
            if e.kind == "end_of_data":
                r = find_next_record(view, e.file_offset, base=seg.base)
                if r.kind == "message":
                    regions.append({"file": seg.display, "start": e.file_offset, "end": r.pos,
                                    "phy_start": seg.base + e.file_offset, "bytes_lost": r.pos - e.file_offset,
                                    "reason": "zeroed", "detail": "zeros inside the data", "resumed": "message",
                                    "why": why})
                    pos = r.pos
                    continue
                return
            region, r = lost_region(view, seg.display, seg.base, e.file_offset, e.reason or "invalid", e.detail or "")
            d = region.to_dict()
            d["why"] = why
            regions.append(d)
            if r.kind != "message":
                return
            pos = r.pos
    finally:
        with contextlib.suppress(Exception):
            del view
        src.close()


def _lost_table(sim: Simulation, with_body: bool) -> tuple[pa.Table | None, list[dict]]:
    batches: list[pa.Table] = []
    regions: list[dict] = []
    delay = list(sim.store.settings.delay_levels_ms)
    for seg, start, why in sim.lost_ranges:
        if seg.file_size:
            _scan_from(seg, start, why, with_body=with_body, delay_levels=delay, batches=batches, regions=regions)
    table = pa.concat_tables(batches) if batches else None
    if table is not None:
        bad = table.filter(pc.equal(table.column("crc_ok"), False))
        for ph, sz, why in zip(bad.column("phy_offset").to_pylist(), bad.column("size").to_pylist(),
                               bad.column("why").to_pylist()):
            seg_base = ph - ph % sim.store.commitlog.segment_size
            regions.append({"file": "commitlog/" + file_name_cl(seg_base), "start": ph - seg_base,
                            "end": ph - seg_base + sz, "phy_start": ph, "bytes_lost": sz, "reason": "crc_mismatch",
                            "detail": "body CRC does not match: record not salvaged", "resumed": "message",
                            "why": why})
    regions.sort(key=lambda r: r["phy_start"])
    return table, regions


def scan_lost(sim: Simulation, *, with_body: bool = False) -> dict:
    """The plan's ``lost`` section: every record a start-up drops, corrupt byte ranges, totals."""
    table, regions = _lost_table(sim, with_body)
    msgs: list[dict] = []
    if table is not None:
        t = table.select(LOST_COLUMNS + ["why"])
        msgs = [dict(r, intact=bool(r.pop("crc_ok"))) for r in t.to_pylist()]
    intact = [m for m in msgs if m["intact"]]
    by_topic: dict[str, int] = {}
    for m in msgs:
        by_topic[m["topic"]] = by_topic.get(m["topic"], 0) + 1
    return {
        "messages": msgs,
        "ranges": regions,
        "totals": {"messages": len(msgs), "intact": len(intact), "corrupt": len(msgs) - len(intact),
                   "bytes": sum(m["size"] for m in msgs), "bytes_unreadable": sum(r["bytes_lost"] for r in regions),
                   "by_topic": dict(sorted(by_topic.items()))},
    }


# ---------------------------------------------------------------------------------------------
# plan output


def write_json_atomic(path: str, obj: Any) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    atomic_write(path, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode("utf-8"))


def summary_lines(plan: dict) -> list[str]:
    """A human summary of a plan."""
    c = plan["commitlog"]
    cq = plan["consume_queues"]
    lost = plan.get("lost") or {"totals": {"messages": 0, "intact": 0, "bytes": 0}}
    out = [
        f"store {plan['store']} ({plan['version']} rules)",
        f"last exit: {'clean' if plan['last_exit']['clean'] else 'ABNORMAL (abort file)'} -> "
        f"{plan['last_exit']['recovery']} recovery",
        f"checkpoint: physic {plan['checkpoint']['physic_msg_timestamp']} logics "
        f"{plan['checkpoint']['logics_msg_timestamp']} index {plan['checkpoint']['index_msg_timestamp']} "
        f"(trusted up to {plan['checkpoint']['trusted_up_to']}, margin {plan['checkpoint']['safety_margin_ms']} ms)",
        f"start segment: {c['start_segment']} ({c['start_reason']})",
        f"CRC window: {c['crc_window']['from']} .. {c['crc_window']['to']}",
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
    out.append(f"dispatch: {plan['dispatch']['recovery_records']} record(s) during recovery, reput from {rp['from']} "
               f"to {rp['to']}: {plan['dispatch']['reput_records']} record(s)")
    ix = plan["index"]
    out.append(f"index: {len(ix['deleted'])} file(s) deleted, {len(ix['written'])} written, "
               f"{ix['entries_added']} entr(ies) added")
    lt = lost["totals"]
    out.append(f"lost: {lt['messages']} message(s) ({lt.get('intact', 0)} intact, salvageable), {lt['bytes']} bytes")
    ts = plan.get("timer_store")
    if ts:
        out.append(f"timer store: timerlog ends at {ts['process_offset']} ({len(ts['delete_files'])} file(s) deleted), "
                   f"{ts['slots_rewritten']} wheel slot(s) rewritten, the timer topic read from offset "
                   f"{ts['queue_offset']} ({ts['queue_offset_source']})")
    for q in cq["queues"]:
        if q["entries_truncated"] or q["entries_added"] or q["files_deleted_on_load"]:
            out.append(f"  {q['topic']}/{q['queue_id']}: max {q['recovered_max_offset']} -> {q['final_max_offset']}"
                       f" (-{q['entries_truncated']} +{q['entries_added']})")
    for f in plan["findings"]:
        if f["severity"] in ("error", "critical"):
            out.append(f"  [{f['severity']}] {f['file'] or '<store>'}: {f['kind']}: {f['detail']}")
    return out


__all__ = ["PLAN_SCHEMA", "Simulation", "scan_lost", "simulate", "summary_lines", "write_json_atomic"]
