"""Dispatch: commitlog records → ConsumeQueue and IndexFile files, as ReputMessageService does.

This module is the single place that turns scan batches into CQ and index files. Everything that
writes consume queues or index files (the StoreWriter, the generator, the rebuild job's local engine)
calls :func:`dispatch_store`.

API
---

``dispatch_store(store_root, settings=None, from_offset=None, to_offset=None, out_root=None,
what=("consumequeue", "index"), emit_empty_index=True, ...) -> DispatchResult``

* ``store_root``: the store whose ``commitlog/`` is read (never written).
* ``out_root``: where ``consumequeue/`` and ``index/`` are written (default: ``store_root``). Existing
  queues and the last index file there are **continued** (reput semantics): each queue's state is
  recovered from its files (``QueueState.from_existing``) and the last index file is extended, so a
  dispatch in several steps writes the same bytes as one dispatch over the whole range.
* ``from_offset``: the reput position (a record start). ``None`` computes it like a 4.9.8 broker at
  start-up (store-algorithms §8.9): the largest ``maxPhysicOffset`` over the consume queues under
  ``out_root``, at least the commitlog min offset (so 0 for an empty ``consumequeue/``).
* ``to_offset``: the log's end: records starting at or after it are not read (e.g. recovery's
  ``processOffset``). ``None``: the end of the log.
* ``what``: any of ``"consumequeue"``, ``"index"``.
* ``emit_empty_index``: records were dispatched but none had keys → write the broker's one empty index
  file (store-algorithms §7.4 step 6).

Reput rules (store-algorithms §4.1): the loop is :func:`storelib.broker.recovery.reputpath.reput_path`, the
one model of 4.9.8's ReputMessageService.doReput (the recovery walk uses it too), each getData buffer it reads
scanned straight into the dispatcher with the reput's check (no CRC, ``readBody=false``), over the file up to
its read position (``to_offset`` or the log's end: a record running past it fails there):

* blank record → rollNextFile (the next segment's base, from reputFromOffset);
* a record the broker decodes as size −1 (bad magic, zeros, truncated, parse error): a master
  (``brokerId == 0`` or DLedger) skips the rest of the buffer (finding ``reput_skipped_rest_of_segment``),
  a slave stops there (``reput_stopped``); at the log's end it is simply the end;
* a length mismatch (positive size; finding ``reput_length_mismatch``): reputFromOffset += TOTALSIZE while
  the buffer reads on after the record's fields, and the drift shows where the buffer is left
  (``reput_drift_skip``). ``DispatchResult.unsupported`` is True only where the path cannot be followed
  (no segment holds the offset the reput goes to: ``reput_gap``).

The log's end (the broker's maxOffset, a record boundary) is ``to_offset`` moved to the end of the record
that starts before it, or (``None``) the end of the records of the last segment holding data.

Not supported (raise ``StoreError(kind="unsupported")``): consume queues under ConsumeQueueExt or multi-dispatch
(LMQ copies); the index files alone are written under both.
5.x BatchConsumeQueue topics are not routed (their records get ordinary CQ entries).

Memory bound
------------

Records are accumulated ``chunk_rows`` at a time (default 1 Mi) and then written, so memory holds:
the seven CQ columns of one chunk (about 45 bytes + the topic text per record), the index keys of one
chunk (key hash, phy offset, store time: 20 bytes per key, plus sort temporaries), the CQ units written
for the chunk (20 bytes per entry, plus one segment per queue while it is written), and the index file
being continued (header + slots + entries: at most ``40 + 4 * maxHashSlotNum + 20 * maxIndexNum``
bytes, 420 MB at the default geometry). Bodies and property maps are never held.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import tzinfo
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.dispatch.cqwriter import QueueState, build_consume_queues, write_queue_image
from storelib.broker.index.indexbuild import IndexState, build_index_files, empty_index_count, index_key_rows
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.cqload import LoadedQueue
from storelib.broker.settings.store import open_commitlog
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location, resolve
from storelib.fileio.prefix import prefix
from storelib.format.consumequeue import list_queues
from storelib.format.dledger.entries import BLANK_MAGIC as DL_BLANK
from storelib.format.dledger.entries import BODY_OFFSET
from storelib.format.indexdir import list_index_files
from storelib.format.indexfile import IndexGeometry, IndexHeader
from storelib.format.record import BLANK_MAGIC, MAGIC_V1, MAGIC_V2, gets_cq_unit
from storelib.format.topicname import unsafe_reason, unsafe_topic_finding
from storelib.scan.commitlog import CommitLog, Segment
from storelib.scan.recordbytes import check_at
from storelib.scan.scanner import SegmentEnd, SegmentScan

DISPATCH_COLUMNS = [
    "phy_offset", "size", "physical_offset_field", "topic", "queue_id", "queue_offset", "tran_type",
    "store_timestamp", "tags_code", "uniq_key", "keys",
]
CQ_COLUMNS = ["physical_offset_field", "size", "tags_code", "topic", "queue_id", "queue_offset", "tran_type",
              "store_timestamp"]
DEFAULT_CHUNK_ROWS = 1 << 20
WHAT = ("consumequeue", "index")


@dataclass
class DispatchResult:
    """What one dispatch did.

    ``end_offset`` is the reput position afterwards (pass it as the next ``from_offset``).
    ``last_cq_store_timestamp``: store time of the last record that got a CQ entry (the broker's
    checkpoint.logicsMsgTimestamp); ``index_msg_timestamp``: endTimestamp of the newest index file
    that is followed by another one (full and flushed: checkpoint.indexMsgTimestamp), 0 if none.
    """

    from_offset: int
    end_offset: int
    records: int = 0
    cq_records: int = 0
    index_keys: int = 0
    last_store_timestamp: int = 0
    last_cq_store_timestamp: int = 0
    index_msg_timestamp: int = 0
    cq_files: list[str] = field(default_factory=list)
    index_files: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    unsupported: bool = False
    queue_states: dict[tuple[str, int], QueueState] = field(default_factory=dict)
    index_state: IndexState | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "from_offset": self.from_offset, "end_offset": self.end_offset, "records": self.records,
            "cq_records": self.cq_records, "index_keys": self.index_keys,
            "last_store_timestamp": self.last_store_timestamp,
            "last_cq_store_timestamp": self.last_cq_store_timestamp,
            "index_msg_timestamp": self.index_msg_timestamp, "cq_files": len(self.cq_files),
            "index_files": len(self.index_files), "unsupported": self.unsupported,
            "findings": [f.to_dict() for f in self.findings],
        }


def _settings(settings: BrokerSettings | None, version: str | None = None) -> BrokerSettings:
    if settings is not None:
        return settings
    return BrokerSettings.defaults(version or "4")


def _loc(where: str | os.PathLike | Location) -> Location:
    return where if isinstance(where, Location) else resolve(where)


def _first_record_present(seg: Segment) -> bool:
    """Does the segment start with a message record (not zeros/garbage)? Reads 8 bytes (a DLedger
    entry's record, or its blank filler, 56)."""
    head_len = BODY_OFFSET if seg.dledger else 0
    src = seg.open()
    try:
        head = bytes(src.read(0, head_len + 8))
    finally:
        src.close()
    if len(head) < head_len + 8:
        return False
    if seg.dledger and int.from_bytes(head[:4], "big", signed=True) == DL_BLANK:
        return True
    magic = int.from_bytes(head[head_len + 4:head_len + 8], "big", signed=True)
    return magic in (MAGIC_V1, MAGIC_V2, BLANK_MAGIC)


class _Dispatcher:
    """Accumulates dispatch columns chunk by chunk and writes CQ/index files with continued state."""

    def __init__(self, out: Location, settings: BrokerSettings, what: Sequence[str], emit_empty_index: bool,
                 name_tz: str | tzinfo | None, result: DispatchResult, queue_states: dict[tuple[str, int], QueueState],
                 index_state: IndexState | None):
        self.out = out
        self.settings = settings
        self.do_cq = "consumequeue" in what
        self.do_index = "index" in what and bool(settings.message_index_enable)
        self.emit_empty_index = emit_empty_index
        self.name_tz = name_tz
        self.result = result
        self.cq_size = int(settings.mapped_file_size_consume_queue)
        self.geometry = settings.index_geometry
        self.qstate = queue_states
        self.istate = index_state
        self.empty_index_count = empty_index_count(settings.version)
        self.batches: list[pa.RecordBatch] = []
        self.keys: list[dict[str, np.ndarray]] = []
        self.rows = 0
        self.any_dispatched = False
        # the newest index image is written once, when a later one follows it or at the end: its
        # state (slots + entries) is held for continuation anyway, and rewriting a file of up to
        # 420 MB after every chunk cost more than building it
        self.pending_index: Any = None
        self._cq_seen: set[str] = set()
        # topics that cannot be a directory: topic -> [records, first phy offset], reported by finish()
        self.unsafe: dict[str, list[int]] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        r = self.result
        r.records += batch.num_rows
        ts = batch.column("store_timestamp")
        r.last_store_timestamp = int(ts[-1].as_py())
        tt = np.asarray(batch.column("tran_type"))
        cq_rows = np.flatnonzero(gets_cq_unit(tt))
        r.cq_records += len(cq_rows)
        if len(cq_rows):
            r.last_cq_store_timestamp = int(ts[int(cq_rows[-1])].as_py())
        if self.do_index:
            kr = index_key_rows(batch)
            kr["n_rows"] = np.array([batch.num_rows])
            self.keys.append(kr)
        if self.do_cq:
            self.batches.append(batch.select(CQ_COLUMNS))
        self.rows += batch.num_rows

    def flush(self) -> None:
        if self.rows == 0:
            return
        if self.do_cq and self.batches:
            self._flush_cq()
        if self.do_index:
            self._flush_index()
        self.batches, self.keys, self.rows = [], [], 0

    def _flush_cq(self) -> None:
        table = pa.Table.from_batches(self.batches)
        self._unsafe_chunk: set[str] = set()
        images = build_consume_queues(table, segment_size=self.cq_size, state=self.qstate)
        root = self.out.join("consumequeue")
        for key, img in sorted(images.items(), key=lambda kv: kv[0]):
            topic, qid = key
            if unsafe_reason(topic) is not None:
                self._note_unsafe(table, topic)
                continue
            files = write_queue_image(img, root.join(topic, str(qid)), self.cq_size)
            self.result.cq_files += [f for f in files if f not in self._cq_seen]
            self._cq_seen.update(files)
            self.qstate[key] = img.state

    def _note_unsafe(self, table: pa.Table, topic: str) -> None:
        """Count a skipped topic's records in this chunk (once per chunk: every queue of it is skipped)."""
        if topic in self._unsafe_chunk:
            return
        self._unsafe_chunk.add(topic)
        phy = np.asarray(table.column("physical_offset_field"))[np.asarray(pc.equal(table.column("topic"), topic))]
        seen = self.unsafe.setdefault(topic, [0, int(phy.min())])
        seen[0] += len(phy)

    def unsafe_findings(self, segment_size: int) -> list[Finding]:
        return [unsafe_topic_finding(t, f"commitlog/{first - first % segment_size:020d}", first % segment_size, n,
                                     first) for t, (n, first) in sorted(self.unsafe.items())]

    def _flush_index(self) -> None:
        # global row numbers across the chunk's batches → was anything dispatched after the last key?
        hs, ps, ts = [], [], []
        last_key_row = -1
        base = 0
        for kr in self.keys:
            if len(kr["row_index"]):
                last_key_row = base + int(kr["row_index"][-1])
            hs.append(kr["key_hash"])
            ps.append(kr["phy_offset"])
            ts.append(kr["store_timestamp"])
            base += int(kr["n_rows"][0])
        key_rows = {
            "key_hash": np.concatenate(hs) if hs else np.zeros(0, np.int32),
            "phy_offset": np.concatenate(ps) if ps else np.zeros(0, np.int64),
            "store_timestamp": np.concatenate(ts) if ts else np.zeros(0, np.int64),
        }
        self.result.index_keys += len(key_rows["key_hash"])
        trailing = last_key_row < base - 1
        images = build_index_files(
            key_rows, geometry=self.geometry, prev_state=self.istate,
            emit_empty=self.emit_empty_index, trailing_dispatch=trailing,
            empty_index_count=self.empty_index_count, name_tz=self.name_tz or "UTC",
        )
        if not images:
            return
        d = self.out.join("index")
        if not d.local:
            raise StoreError(d.path, None, "unsupported", "index files are only written to local paths")
        if self.pending_index is not None and images[0].name != self.pending_index.name:
            self._write_index(self.pending_index)
        for im in images[:-1]:
            self._write_index(im)
        self.pending_index = images[-1]
        self.istate = images[-1].state()

    def _write_index(self, im: Any) -> None:
        d = self.out.join("index")
        os.makedirs(d.path, exist_ok=True)
        path = os.path.join(d.path, im.name)
        im.write(path)
        if path not in self.result.index_files:
            self.result.index_files.append(path)

    def finish(self) -> None:
        """Flush what is accumulated and write the pending index file."""
        self.flush()
        if self.pending_index is not None:
            self._write_index(self.pending_index)
            self.pending_index = None


def _existing_queue_states(out: Location, cq_size: int, findings: list[Finding]) -> dict[tuple[str, int], QueueState]:
    states: dict[tuple[str, int], QueueState] = {}
    for topic, qid, loc in list_queues(out, findings):
        cq = LoadedQueue(loc, segment_size=cq_size, topic=topic, queue_id=qid)
        try:
            findings.extend(cq.findings)
            if cq.segments:
                states[(topic, qid)] = QueueState.from_existing(cq)
        finally:
            cq.close()
    return states


def _existing_index_state(out: Location, geometry: IndexGeometry) -> IndexState | None:
    refs = list_index_files(out)
    if not refs:
        return None
    f = refs[-1].open(geometry, broker_size=True)
    try:
        return IndexState.from_file(f)
    finally:
        f.close()


def _index_msg_timestamp(out: Location, geometry: IndexGeometry) -> int:
    refs = list_index_files(out)
    if len(refs) < 2:
        return 0
    ref = refs[-2]
    src_loc = ref.loc
    with src_loc.fs.open_input_file(src_loc.path) as f:
        head = f.read_at(40, 0)
    return IndexHeader.from_bytes(head, ref.name).end_timestamp


def dispatch_store(
    store_root: str | os.PathLike | Location,
    settings: BrokerSettings | None = None,
    from_offset: int | None = None,
    to_offset: int | None = None,
    out_root: str | os.PathLike | Location | None = None,
    what: Iterable[str] = WHAT,
    emit_empty_index: bool = True,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    name_tz: str | tzinfo | None = "UTC",
    commitlog: CommitLog | None = None,
    progress: Callable[[int], None] | None = None,
) -> DispatchResult:
    """Dispatch the commitlog of ``store_root`` from ``from_offset`` into CQ and index files.

    See the module docstring for every parameter and rule. Returns a :class:`DispatchResult`.
    """
    settings = _settings(settings)
    what = tuple(what)
    _check_supported(settings, what)
    root = _loc(store_root)
    out = _loc(out_root) if out_root is not None else root
    cl = commitlog or open_commitlog(root, settings)
    S = cl.segment_size
    findings: list[Finding] = []
    geometry = settings.index_geometry

    qstates: dict[tuple[str, int], QueueState] = {}
    if "consumequeue" in what or from_offset is None:
        qstates = _existing_queue_states(out, int(settings.mapped_file_size_consume_queue), findings)
    istate = _existing_index_state(out, geometry) if "index" in what else None

    segs = [s for s in cl.segments if s.file_size > 0]
    if from_offset is None:
        from_offset = max([st.max_physic_offset for st in qstates.values()] + [0])
        from_offset = max(from_offset, cl.min_offset)
    pos = max(int(from_offset), cl.min_offset if segs else 0)
    result = DispatchResult(from_offset=pos, end_offset=pos, findings=findings)
    disp = _Dispatcher(out, settings, what, emit_empty_index, name_tz, result, qstates, istate)
    pos = _reput(disp, segs, S, pos, to_offset, settings, chunk_rows, progress, cl.scan_options())
    disp.finish()
    findings.extend(disp.unsafe_findings(S))
    result.end_offset = pos
    result.queue_states = disp.qstate
    result.index_state = disp.istate
    if "index" in what:
        result.index_msg_timestamp = _index_msg_timestamp(out, geometry)
    return result


def _check_supported(settings: BrokerSettings, what: tuple[str, ...]) -> None:
    """Refuse what the dispatch cannot reproduce (an unknown output; consume queues under ConsumeQueueExt
    or multi-dispatch: :attr:`BrokerSettings.cq_unreproduced`)."""
    for w in what:
        if w not in WHAT:
            raise StoreError(None, None, "bad_value", f"what must be among {WHAT}, not {w!r}")
    settings.require_reproducible(what)


def _reput(disp: _Dispatcher, segs: list[Segment], S: int, pos: int, to_offset: int | None, settings: BrokerSettings,
           chunk_rows: int, progress: Callable[[int], None] | None, scan_opts: dict[str, Any]) -> int:
    """The ReputMessageService loop from ``pos`` to the log's end, as :func:`reput_path` follows it (the one
    model of the reput: getData buffers, a length mismatch's drift, rollNextFile, master vs slave), every
    buffer it reads scanned straight into the dispatcher. Returns where reputFromOffset stops."""
    from storelib.broker.recovery.reputpath import reput_path
    from storelib.broker.recovery.walkplan import RecoveryInputs, WalkPlan

    if not segs:
        return pos
    delay_levels = list(settings.delay_levels_ms)
    inputs = RecoveryInputs.from_settings(settings, segment_size=S, dledger=bool(scan_opts.get("dledger")))
    plan = WalkPlan(inputs, tuple(segs), "reput", len(segs), "dispatch: the reput alone", pos, None)
    line = scan_opts.get("line")

    def scan_from(i: int, start: int, end: int | None) -> SegmentEnd:
        return _scan_into(disp, segs[i], start, end, delay_levels, chunk_rows, progress, scan_opts)

    starts = {t.index: t.start for t in plan.tasks}

    def length_of(i: int, at: int) -> int | None:
        with segs[i].open() as src:
            return check_at(src, at, False, line, read_body=False).read_length

    end = _log_end(segs, S, pos, to_offset, scan_opts)
    path = reput_path(plan, lambda i: scan_from(i, starts[i], None), end, scan_from, length_of)
    disp.result.findings.extend(path.findings)
    disp.result.unsupported = not path.supported
    return path.end


def _log_end(segs: list[Segment], S: int, pos: int, to_offset: int | None, scan_opts: dict[str, Any]) -> int:
    """The log's end for this reput (the broker's maxOffset: a record boundary): the end of the last record
    that starts before ``to_offset`` (or of the records of the last segment holding data), read from where
    the reput first reads that segment."""
    if to_offset is None:
        held = [s for s in segs if _first_record_present(s)]
        seg = held[-1] if held else segs[-1]
        limit = None
    else:
        seg = next((s for s in reversed(segs) if s.base < to_offset), segs[0])
        limit = max(to_offset - seg.base, 0)
    if pos >= seg.base + S or (limit is not None and pos >= seg.base + limit):
        return pos  # the reput starts at or after the end: it reads nothing
    start = max(pos - seg.base, 0)
    with seg.open() as src:
        scan = SegmentScan(src, seg.display, seg.base, start, limit, verify_crc=False, with_properties=False,
                           columns=["phy_offset", "size"], read_body=False, **scan_opts)
        last = None
        for b in scan:
            if b.num_rows:
                last = int(b.column("phy_offset")[-1].as_py()) + int(b.column("size")[-1].as_py())
    assert scan.end is not None
    if scan.end.segment_full:
        return seg.base + S
    return last if scan.end.kind == "split_end" and last is not None else scan.end.phy_offset


def _scan_into(disp: _Dispatcher, seg: Segment, start: int, end: int | None, delay_levels: list[int], chunk_rows: int,
               progress: Callable[[int], None] | None, scan_opts: dict[str, Any]) -> SegmentEnd:
    """One getData buffer (the segment from ``start`` to ``end``, its read position, or its end) into the
    dispatcher (flushed ``chunk_rows`` at a time), read as the reput reads (readBody=false); its end."""
    src = seg.open()
    try:
        scan = SegmentScan(prefix(src, end), seg.display, seg.base, start, verify_crc=False, with_properties=False,
                           delay_levels_ms=delay_levels, columns=DISPATCH_COLUMNS, read_body=False, **scan_opts)
        for batch in scan:
            disp.add(batch)
            if disp.rows >= chunk_rows:
                disp.flush()
            if progress is not None and batch.num_rows:
                progress(int(batch.column("phy_offset")[-1].as_py()))
    finally:
        src.close()
    assert scan.end is not None
    return scan.end


__all__ = ["DISPATCH_COLUMNS", "DispatchResult", "dispatch_store"]
