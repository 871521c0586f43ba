"""The checks of ``rmqstore audit``: per-segment record checks (distributable) and cross-file checks.

Per segment (:func:`audit_segment`, one Spark task or one local call per segment): every record is
validated as the broker does (structure, recomputed length), its body CRC and 5.x property CRC are
verified, its PHYSICALOFFSET field is compared with its real position, the blank end record's size
with the bytes left, and after any bad record the scan resynchronises (:mod:`storelib.resync`) so the
rest of the segment is still audited. It returns findings, lost regions, a compact record table (the
columns the cross-file checks need) and the index keys of its records.

Cross-file checks run on the driver over those compact tables: queue offsets per (topic, queue),
ConsumeQueue entries against records both ways, IndexFile entries against records both ways, the
checkpoint against the data, abort/lock markers, config/*.json and consumer offsets.

Consequences are not reported twice: a CQ or index entry pointing into a region already reported as
lost (corrupt region, missing segment) counts against that region instead of raising its own finding.

Healthy stores take shortcuts that reach the same conclusions as the full comparisons (the findings are
identical): index files whose entries are exactly the log's keys in order skip the per-entry lookups
(:class:`_KeySequence`), a queue whose units are exactly its records skips the lookups and the comparisons
that hold by construction (:func:`_queue_records_exactly`), and file holes read as zeros unscanned.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.brokerconf import BrokerSettings
from storelib.bytesource import LocalSource, Location, data_ranges, open_source, resolve
from storelib.consumequeue import batch_cq_topics
from storelib.errors import Finding, StoreError
from storelib.publish import atomic_local_file
from storelib.record import INNER_BATCH_FLAG
from storelib.resync import LostRegion, find_next_record, lost_region
from storelib.scanner import DEFAULT_DELAY_LEVELS_MS, SegmentScan
from storelib.topicname import escape_topic, unsafe_reason, unsafe_topic_finding

SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2, "critical": 3}
MAX_PER_KIND = 50  # findings of one kind per file before they are summarised

# compact record columns shipped from the segment tasks to the driver
RECORD_COLUMNS = ["phy_offset", "size", "physical_offset_field", "topic", "queue_id", "queue_offset",
                  "tran_type", "sys_flag", "tags_code", "store_timestamp", "crc_ok"]
RECORD_SCHEMA = pa.schema([
    ("phy_offset", pa.int64()), ("size", pa.int32()), ("physical_offset_field", pa.int64()),
    ("topic", pa.string()), ("queue_id", pa.int32()), ("queue_offset", pa.int64()), ("tran_type", pa.int8()),
    ("sys_flag", pa.int32()), ("tags_code", pa.int64()), ("store_timestamp", pa.int64()), ("crc_ok", pa.bool_()),
])
# what the segment checks read from a scan (nothing else is decoded)
SCAN_COLUMNS = ["phy_offset", "size", "magic_version", "crc_ok", "queue_id", "queue_offset", "physical_offset_field",
                "sys_flag", "tran_type", "store_timestamp", "topic", "keys", "uniq_key", "tags_code", "prop_crc_ok"]
KEY_SCHEMA = pa.schema([("pos", pa.int64()), ("phy", pa.int64()), ("key_hash", pa.int32())])


# --------------------------------------------------------------------------------------------------
# per-segment work
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentTask:
    """One segment to audit: picklable (a Spark task ships it)."""

    name: str
    base: int
    uri: str
    file_size: int
    segment_size: int
    local: bool = True
    start: int = 0  # incremental: resume at this file offset (records before it were audited)
    end: int | None = None  # a split: only records starting before this file offset (None: to the end)


@dataclass
class AuditOptions:
    """What the segment checks need from the broker settings (plain values: picklable)."""

    delay_levels_ms: list[int] = field(default_factory=lambda: list(DEFAULT_DELAY_LEVELS_MS))
    broker_version: str = "4"
    verify_crc: bool = True
    fs_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class SegmentResult:
    """What one segment task returns (findings as dicts and Arrow IPC bytes keep it picklable)."""

    name: str
    base: int
    file_size: int
    start: int
    end_kind: str = "end_of_data"  # blank | end_of_data | segment_end | invalid | unreadable
    data_end: int = 0  # file offset after the last valid record (or the blank record's position)
    records: int = 0
    bytes_valid: int = 0
    crc_errors: int = 0
    crc_bytes: int = 0  # bytes of the records failing their CRC
    findings: list[dict] = field(default_factory=list)
    regions: list[dict] = field(default_factory=list)
    records_ipc: bytes = b""
    keys_ipc: bytes = b""
    first_ts: int | None = None
    last_ts: int | None = None
    seconds: float = 0.0

    # The tables may instead be held in memory (``_tables``, not a dataclass field, so ``asdict`` and the
    # state file never see them): in-process parts and per-task table files skip an IPC round trip.

    def record_table(self) -> pa.Table:
        t = getattr(self, "_tables", None)
        return t[0] if t is not None else _from_ipc(self.records_ipc, RECORD_SCHEMA)

    def key_table(self) -> pa.Table:
        t = getattr(self, "_tables", None)
        return t[1] if t is not None else _from_ipc(self.keys_ipc, KEY_SCHEMA)

    def set_tables(self, records: pa.Table, keys: pa.Table) -> None:
        self._tables = (records, keys)
        self.records_ipc = self.keys_ipc = b""

    def ipc_bytes(self, compression: str | None = None) -> tuple[bytes, bytes]:
        """The record and key tables as Arrow IPC stream bytes (what the ``--since`` sidecar files hold,
        zstd-compressed there: about a third of the plain size)."""
        if getattr(self, "_tables", None) is None and compression is None:
            return self.records_ipc, self.keys_ipc
        return _to_ipc(self.record_table(), compression), _to_ipc(self.key_table(), compression)


def _to_ipc(table: pa.Table, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes, schema: pa.Schema) -> pa.Table:
    if not data:
        return schema.empty_table()
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


class _Capped:
    """Collects findings, at most MAX_PER_KIND per (kind, file); the rest become one summary each."""

    def __init__(self) -> None:
        self.items: list[Finding] = []
        self.counts: dict[tuple[str, str | None], int] = defaultdict(int)
        self.first: dict[tuple[str, str | None], Finding] = {}

    def add(self, f: Finding) -> None:
        key = (f.kind, f.file)
        self.counts[key] += 1
        if self.counts[key] <= MAX_PER_KIND:
            self.items.append(f)
            self.first.setdefault(key, f)

    def extend(self, fs) -> None:
        for f in fs:
            self.add(f)

    def replay(self, items: list[Finding], counts: dict[tuple[str, str | None], int]) -> None:
        """Add what another collector kept (``items``) and counted (``counts``) as if its findings had been
        added here one by one, in its order: same kept findings, same totals, same summaries."""
        kept: dict[tuple[str, str | None], int] = defaultdict(int)
        for f in items:
            self.add(f)
            kept[(f.kind, f.file)] += 1
        for key, n in counts.items():
            self.counts[key] += n - kept[key]

    def absorb(self, other: _Capped) -> None:
        """Merge a collector filled elsewhere (a concurrent check), as :meth:`replay`."""
        self.replay(other.items, other.counts)

    def done(self) -> list[Finding]:
        out = list(self.items)
        for key, n in self.counts.items():
            if n > MAX_PER_KIND:
                f0 = self.first[key]
                out.append(Finding(f0.kind, f0.severity, f0.file, None,
                                   f"{n - MAX_PER_KIND} more {f0.kind} findings in this file (not listed)",
                                   {"more": n - MAX_PER_KIND, "total": n}))
        return out


def _open_task(task: SegmentTask, opts: AuditOptions):
    if task.local:
        return LocalSource(task.uri)
    loc = resolve(task.uri, **opts.fs_options)
    return open_source(loc, task.file_size)


def _whole(src) -> memoryview:
    """The whole segment as a memoryview (mmap locally; one read remotely, only after a failure)."""
    if isinstance(src, LocalSource):
        return src.view()
    return src.read(0, src.size)


@dataclass
class PartResult:
    """What one split task returns: the raw outcome of its records, merged per segment by
    :func:`finish_segment` (which does what needs the whole segment: CRC/region classification, caps).

    ``exit_pos`` is where the scan left the split (the next record start at or after ``end``, or the
    resync target); the parts of a segment chain like one scan exactly when each part's ``exit_pos`` is
    the next part's start. ``None``: the scan stopped for good (blank end record, end of data, nothing
    valid after a bad record).
    """

    name: str
    start: int
    end: int | None
    end_kind: str = "end_of_data"
    data_end: int = 0
    exit_pos: int | None = None
    unreadable: str | None = None
    items: list[Finding] = field(default_factory=list)  # scan-time findings, first MAX_PER_KIND per kind
    counts: dict[tuple[str, str | None], int] = field(default_factory=dict)
    bad_rows: list[tuple[int, int, bool]] = field(default_factory=list)
    regions: list[LostRegion] = field(default_factory=list)
    records_ipc: bytes = b""
    keys_ipc: bytes = b""
    records_path: str | None = None  # the tables as files in a TableSink (then the *_ipc fields are empty)
    keys_path: str | None = None
    seconds: float = 0.0

    def problem_count(self) -> int:
        """Findings this part will contribute (scan-time findings, CRC failures, lost regions), for the
        progress line: the count the segment's findings are made from, before the per-kind caps."""
        return sum(self.counts.values()) + len(self.bad_rows) + len(self.regions) + (self.unreadable is not None)

    def tables(self) -> tuple[pa.Table, pa.Table]:
        """The record and key tables: held in memory, or decoded from the IPC bytes (zero-copy)."""
        t = getattr(self, "_tables", None)
        if t is not None:
            return t
        return _from_ipc(self.records_ipc, RECORD_SCHEMA), _from_ipc(self.keys_ipc, KEY_SCHEMA)

    def load_tables(self, fs_options: dict[str, Any] | None = None) -> None:
        """Driver side: map the tables a task wrote to a :class:`TableSink` (before its dir is removed)."""
        self._tables = (read_table_file(self.records_path, RECORD_SCHEMA, fs_options),
                        read_table_file(self.keys_path, KEY_SCHEMA, fs_options))


@dataclass(frozen=True)
class TableSink:
    """A work directory (local path or URI every executor and the driver can reach) where split tasks
    leave their record/key tables as Arrow IPC files, so a task returns only its small result through
    Spark (a ~150 MB collect of pickled bytes through the JVM costs seconds; a memory-mapped file
    nothing). File names are unique per task attempt (a retried task never collides with the files of
    an earlier attempt, which the driver never reads and removes with the directory)."""

    dir: str
    fs_options: dict[str, Any] = field(default_factory=dict)

    def write(self, stem: str, table: pa.Table) -> str | None:
        """Write ``table`` as an IPC file; returns its path/URI (None for an empty table: nothing written)."""
        if table.num_rows == 0:
            return None
        name = f"{stem}-{uuid.uuid4().hex}.arrow"
        loc = resolve(self.dir, **self.fs_options)
        if loc.local:  # temp + rename: the file appears under its name only when complete (scratch: no fsync)
            path = os.path.join(loc.path, name)
            # no makedirs: a task still running after the driver removed the sink (a cancelled stage)
            # fails here instead of bringing the directory back
            with atomic_local_file(path, durable=False, create_dir=False) as tmp, pa.OSFile(tmp, "wb") as f, \
                    pa.ipc.new_file(f, table.schema) as w:
                w.write_table(table)
            return path
        # object stores: one output stream = one PUT, the object appears only when complete
        with loc.fs.open_output_stream(loc.join(name).path) as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
        return self.dir.rstrip("/") + "/" + name


def read_table_file(path: str | None, schema: pa.Schema, fs_options: dict[str, Any] | None = None) -> pa.Table:
    """A table written by :meth:`TableSink.write`: memory-mapped (zero-copy) when local, read whole otherwise."""
    if path is None:
        return schema.empty_table()
    loc = resolve(path, **(fs_options or {}))
    try:
        if loc.local:  # the buffers keep the mapping alive after close (no fd held) and the file's removal
            with pa.memory_map(loc.path) as mm:
                return pa.ipc.open_file(mm).read_all()
        with loc.fs.open_input_file(loc.path) as f:
            return pa.ipc.open_file(f.read_buffer()).read_all()
    except (OSError, pa.ArrowInvalid) as e:
        raise StoreError(path, None, "work_file_unreadable", f"cannot read a task's table file: {e}") from e


def _zero_tail(view: memoryview, start: int, chunk: int = 64 << 20, path: str | None = None) -> bool:
    """Are all bytes from ``start`` to the end zero? (the unwritten tail of the last segment: checked at
    memory speed before the byte-wise resync search, which would find nothing there anyway).

    ``path``: the mapped file; its holes (``SEEK_DATA``/``SEEK_HOLE``: a preallocated segment is sparse,
    so most of a young last segment is one hole) read as zeros by definition and are not touched, which
    saves faulting in and scanning up to a whole segment of zero pages."""
    a = np.frombuffer(view, dtype=np.uint8)
    return not any(_nonzero_in(a, lo, hi, chunk) for lo, hi in data_ranges(path, start, len(view)))


def _nonzero_in(a: np.ndarray, lo: int, hi: int, chunk: int) -> bool:
    """Is any byte of ``a[lo:hi]`` non-zero? (8 bytes at a time, in chunks: bounded temporaries)."""
    head = min(hi, (lo + 7) // 8 * 8)
    if a[lo:head].any():
        return True
    lo = head
    while lo + 8 <= hi:
        stop = min(hi - (hi - lo) % 8, lo + chunk)
        if a[lo:stop].view(np.uint64).any():
            return True
        lo = stop
    return bool(a[lo:hi].any())


def audit_part(task: SegmentTask, opts: AuditOptions, sink: TableSink | None = None,
               keep_tables: bool = False) -> PartResult:
    """Audit the records of ``task`` that start in ``[task.start, task.end)`` (the whole rest of the
    segment when ``end`` is None); never raises for content problems.

    The tables go to ``sink`` files when given, stay in memory with ``keep_tables`` (in-process
    callers), else travel as IPC bytes in the result (Spark's in-band collect)."""
    t0 = time.monotonic()
    display = "commitlog/" + task.name
    res = PartResult(task.name, task.start, task.end)
    found = _Capped()
    try:
        src = _open_task(task, opts)
    except StoreError as e:
        res.end_kind = "unreadable"
        res.unreadable = e.detail
        return res
    rec_parts: list[pa.Table] = []
    key_parts: list[pa.Table] = []
    regions: list[LostRegion] = []
    bad_rows: list[tuple[int, int, bool]] = []  # (file offset, size, prop-only) of CRC failures
    S = task.segment_size
    try:
        pos = task.start
        seg_len = src.size
        stop = seg_len if task.end is None else min(task.end, seg_len)
        res.exit_pos = pos
        while pos < stop:
            scan = SegmentScan(src, display, task.base, pos, None if task.end is None else stop,
                               verify_crc=opts.verify_crc, with_properties=False,
                               delay_levels_ms=opts.delay_levels_ms, columns=SCAN_COLUMNS)
            for batch in scan:
                _check_batch(batch, task, opts, display, found, bad_rows, rec_parts, key_parts)
            end = scan.end
            assert end is not None
            res.end_kind, res.data_end = end.kind, end.file_offset
            res.exit_pos = None
            if end.kind == "blank":
                left = seg_len - end.file_offset
                total = int.from_bytes(bytes(src.read(end.file_offset, 4)), "big", signed=True)
                if total != min(left, S - end.file_offset) or seg_len != S and total != S - end.file_offset:
                    found.add(Finding("bad_blank_record", "warning", display, end.file_offset,
                                      f"end-of-file blank record says {total} bytes, {S - end.file_offset} are left"
                                      " (readers skip it without checking)", {"total_size": total}))
                break
            if end.kind in ("segment_end", "split_end"):
                res.exit_pos = end.file_offset
                break
            view = _whole(src)
            if end.kind == "end_of_data":
                if _zero_tail(view, end.file_offset, path=task.uri if task.local else None):
                    break  # nothing but zeros up to the segment end: no record, no stale bytes
                r = find_next_record(view, end.file_offset, base=task.base)
                if r.kind == "message":  # zeros inside the data: a zeroed/unwritten hole
                    region = LostRegion(display, end.file_offset, r.pos, task.base + end.file_offset,
                                        "zeroed", "zero bytes where a record should start; valid records follow",
                                        "message")
                    regions.append(region)
                    pos = res.exit_pos = r.pos
                    continue
                if r.data_end > end.file_offset:
                    found.add(Finding("stale_bytes_after_end", "info", display, end.file_offset,
                                      f"{r.data_end - end.file_offset} non-zero bytes after the end of data hold no "
                                      "valid record (left by an earlier truncation or a torn write)",
                                      {"bytes": r.data_end - end.file_offset}))
                break
            # invalid record: report it and resynchronise
            reason = end.reason or "invalid"
            region, r = lost_region(view, display, task.base, end.file_offset, reason, end.detail or "")
            regions.append(region)
            if r.kind == "message":
                pos = res.exit_pos = r.pos
                continue
            if r.kind == "blank":
                res.end_kind, res.data_end = "blank", r.pos
            break
    finally:
        src.close()
    res.items, res.counts = found.items, dict(found.counts)
    res.bad_rows, res.regions = bad_rows, regions
    recs = pa.concat_tables(rec_parts) if rec_parts else RECORD_SCHEMA.empty_table()
    keys = pa.concat_tables(key_parts) if key_parts else KEY_SCHEMA.empty_table()
    if sink is not None:
        stem = f"{task.name}-{task.start}"
        res.records_path, res.keys_path = sink.write(stem + ".records", recs), sink.write(stem + ".keys", keys)
    elif keep_tables:
        res._tables = (recs, keys)
    else:
        res.records_ipc, res.keys_ipc = _to_ipc(recs), _to_ipc(keys)
    res.seconds = time.monotonic() - t0
    return res


def parts_chain(parts: list[PartResult]) -> bool:
    """Do the parts of one segment (in order) chain like one scan? Each part must leave its range
    exactly at the next part's start; otherwise (corruption across a boundary, a cut the whole-segment
    scan would not reach) the segment is audited again as one task."""
    return all(a.exit_pos is not None and a.exit_pos == b.start for a, b in zip(parts, parts[1:]))


def audit_segment(task: SegmentTask, opts: AuditOptions) -> SegmentResult:
    """Audit one commitlog segment from ``task.start``; never raises for content problems."""
    whole = SegmentTask(task.name, task.base, task.uri, task.file_size, task.segment_size, task.local, task.start)
    return finish_segment(whole, [audit_part(whole, opts, keep_tables=True)])


def finish_segment(task: SegmentTask, parts: list[PartResult]) -> SegmentResult:
    """One segment's result from its parts (in order, chaining: :func:`parts_chain`): what needs the
    whole segment — classifying CRC failures and lost regions, the per-kind caps — happens here."""
    display = "commitlog/" + task.name
    res = SegmentResult(task.name, task.base, task.file_size, task.start)
    bad = next((p for p in parts if p.unreadable is not None), None)
    if bad is not None:
        res.end_kind = "unreadable"
        res.findings = [Finding("segment_unreadable", "critical", display, None, bad.unreadable).to_dict()]
        return res
    found = _Capped()
    for p in parts:  # replay the scan-time findings: same caps and order as one scan
        found.replay(p.items, p.counts)
    regions = [rg for p in parts for rg in p.regions]
    bad_rows = [b for p in parts for b in p.bad_rows]
    res.end_kind, res.data_end = parts[-1].end_kind, parts[-1].data_end
    # classify CRC failures and lost regions: a failure followed by nothing valid is a torn tail
    tail_dead = res.end_kind in ("end_of_data", "invalid") and not (regions and regions[-1].resumed == "message")
    last_good_end = res.data_end
    for off, size, prop_only in bad_rows:
        torn = tail_dead and off + size == last_good_end and not regions
        if torn:
            found.add(Finding("torn_tail", "error", display, off,
                              f"the last record ({size} bytes) fails its CRC and only zeros follow: a write torn by a "
                              "crash; recovery truncates the commitlog here", {"size": size, "phy": task.base + off}))
        elif prop_only:
            found.add(Finding("prop_crc_mismatch", "error", display, off,
                              "5.x __CRC32# property does not match the record bytes (body CRC is fine: a header "
                              "or property byte changed)", {"phy": task.base + off}))
        else:
            found.add(Finding("body_crc_mismatch", "error", display, off,
                              f"body CRC mismatch: recovery (checkCRCOnRecover) stops here and truncates the "
                              f"commitlog at physical offset {task.base + off}", {"size": size, "phy": task.base + off}))
    for i, rg in enumerate(regions):
        last = i == len(regions) - 1
        if rg.reason == "zeroed":
            found.add(Finding("zeroed_region", "critical", display, rg.start,
                              f"{rg.bytes_lost} zero bytes inside the data, valid records resume at {rg.end}; the broker "
                              "stops at the zeros and loses everything after", _region_extra(rg)))
        elif last and rg.resumed == "none":
            found.add(Finding("torn_tail", "error", display, rg.start,
                              f"invalid record ({rg.reason}: {rg.detail}) with nothing valid after it: {rg.bytes_lost} "
                              "bytes lost at the end of the data", _region_extra(rg)))
        else:
            found.add(Finding("corrupt_region", "critical", display, rg.start,
                              f"{rg.reason} ({rg.detail}); {rg.bytes_lost} bytes lost, valid data resumes at "
                              f"{rg.end} ({rg.resumed}); the broker stops at the first bad record", _region_extra(rg)))
    res.regions = [r.to_dict() for r in regions]
    tabs = [p.tables() for p in parts]  # chunks of the parts' tables, no copy
    recs = tabs[0][0] if len(tabs) == 1 else pa.concat_tables([t[0] for t in tabs])
    res.set_tables(recs, tabs[0][1] if len(tabs) == 1 else pa.concat_tables([t[1] for t in tabs]))
    res.records = recs.num_rows
    if recs.num_rows:
        res.bytes_valid = int(pc.sum(recs.column("size")).as_py())
        ts = recs.column("store_timestamp")
        res.first_ts, res.last_ts = int(pc.min(ts).as_py()), int(pc.max(ts).as_py())
    res.crc_errors = len(bad_rows)
    res.crc_bytes = sum(size for _, size, _ in bad_rows)
    res.findings = [f.to_dict() for f in found.done()]
    res.seconds = sum(p.seconds for p in parts)
    return res


def _region_extra(rg: LostRegion) -> dict:
    return {"end": rg.end, "bytes_lost": rg.bytes_lost, "phy": rg.phy_start, "reason": rg.reason,
            "resumed": rg.resumed}


def _check_batch(batch: pa.RecordBatch, task: SegmentTask, opts: AuditOptions, display: str, found: _Capped,
                 bad_rows: list, rec_parts: list, key_parts: list) -> None:
    """Column checks of one scan batch, and its compact columns for the cross-file checks."""
    from storelib.indexfile import index_keys

    phy = batch.column("phy_offset").to_numpy()
    field_ = batch.column("physical_offset_field").to_numpy()
    size = batch.column("size").to_numpy()
    mism = np.flatnonzero(field_ != phy)
    for i in mism.tolist():
        found.add(Finding("physical_offset_mismatch", "error", display, int(phy[i]) - task.base,
                          f"PHYSICALOFFSET field says {int(field_[i])}, the record is at {int(phy[i])}; dispatch "
                          "trusts the field, so CQ/index entries and msgIds point to the wrong place",
                          {"field": int(field_[i]), "phy": int(phy[i])}))
    if opts.verify_crc:
        crc_ok = np.asarray(batch.column("crc_ok").fill_null(True))
        for i in np.flatnonzero(~crc_ok).tolist():
            bad_rows.append((int(phy[i]) - task.base, int(size[i]), False))
        pco = batch.column("prop_crc_ok")
        if pco.null_count < len(pco):
            bad_p = np.flatnonzero(~np.asarray(pco.fill_null(True)) & crc_ok)
            for i in bad_p.tolist():
                bad_rows.append((int(phy[i]) - task.base, int(size[i]), True))
    if opts.broker_version.startswith("4"):
        v2 = np.flatnonzero(batch.column("magic_version").to_numpy() == 2)
        if len(v2):  # one finding per batch (merged into one for the store by merge_v2_findings)
            found.add(Finding("v2_record_on_4x", "error", display, int(phy[v2[0]]) - task.base,
                              "V2 (0xDAA320AB) record: a 4.9.8 broker treats it as corrupt and stops here",
                              {"count": int(len(v2))}))
    rec_parts.append(pa.Table.from_batches([batch.select(RECORD_COLUMNS)]).cast(RECORD_SCHEMA))
    rows, kh = index_keys(batch)
    if len(rows):
        key_parts.append(pa.table({"pos": pa.array(phy[rows].astype(np.int64)),
                                   "phy": pa.array(field_[rows].astype(np.int64)),
                                   "key_hash": pa.array(kh.astype(np.int32))}, schema=KEY_SCHEMA))


def merge_v2_findings(findings: list[Finding], line: Any) -> list[Finding]:
    """All ``v2_record_on_4x`` findings as one (first place, total count), with the broker-line conflict.

    Under 4.x rules every V2 record is an error, but only the first matters (4.9.8's recovery stops
    there) and they usually mean the wrong line was chosen: one finding that says so, not one per record.
    A conflict without V2 records is a warning of its own."""
    v2 = [f for f in findings if f.kind == "v2_record_on_4x"]
    out = [f for f in findings if f.kind != "v2_record_on_4x"]
    conflict = getattr(line, "conflict", None)
    if v2:
        first = min(v2, key=lambda f: (f.file or "", f.offset or 0))
        n = sum(int((f.extra or {}).get("count", 1)) for f in v2)
        detail = (f"{n} V2 (0xDAA320AB) record(s), the first here: a 4.9.8 broker treats it as corrupt, ends its "
                  "recovery there and drops every message after it")
        if conflict:
            detail += "; the store's own evidence says 5.x wrote it: audit with --broker-version 5 (or auto)"
        out.append(Finding("v2_record_on_4x", "error", first.file, first.offset, detail,
                           {"count": n, "broker_line": getattr(line, "source", None)}))
    elif conflict:
        out.append(Finding("broker_line_conflict", "warning", None, None, conflict))
    return out


# --------------------------------------------------------------------------------------------------
# cross-file checks (driver)
# --------------------------------------------------------------------------------------------------


@dataclass
class LogView:
    """The whole commitlog as the cross-file checks see it: records in commitlog order, lost ranges."""

    records: pa.Table
    keys: pa.Table
    lost: np.ndarray  # (k, 2) physical [start, end) ranges known lost (corrupt regions, missing segments)
    log_min: int
    log_end: int  # physical end of the last valid record
    segment_size: int = 1 << 30

    def __post_init__(self) -> None:
        r = self.records
        self.phy = r.column("phy_offset").to_numpy()
        self.size = r.column("size").to_numpy().astype(np.int64)
        self.field = r.column("physical_offset_field").to_numpy()
        self.qid = r.column("queue_id").to_numpy()
        self.qoff = r.column("queue_offset").to_numpy()
        self.tran = r.column("tran_type").to_numpy()
        self.tags = r.column("tags_code").to_numpy()
        self.ts = r.column("store_timestamp").to_numpy()
        self.sysflag = r.column("sys_flag").to_numpy()
        enc = pc.dictionary_encode(r.column("topic")).combine_chunks() if r.num_rows else None
        self.topic_idx = (np.asarray(enc.indices, dtype=np.int64) if enc is not None else np.zeros(0, np.int64))
        self.topic_names: list[str] = enc.dictionary.to_pylist() if enc is not None else []
        self.topic_code = {t: i for i, t in enumerate(self.topic_names)}
        # lookup by PHYSICALOFFSET field (what CQ/index entries hold): sorted copy
        self.field_order = np.argsort(self.field, kind="stable")
        self.field_sorted = self.field[self.field_order]
        self.field_unique = not bool(np.any(self.field_sorted[1:] == self.field_sorted[:-1]))
        # dispatchable record rows per (topic, queue), commitlog order (filled by check_queue_offsets)
        self.queue_rows: dict[tuple[str, int], np.ndarray] = {}

    def in_lost(self, phy: np.ndarray) -> np.ndarray:
        if not len(self.lost) or not len(phy):
            return np.zeros(len(phy), bool)
        i = np.searchsorted(self.lost[:, 0], phy, side="right") - 1
        ok = i >= 0
        j = np.clip(i, 0, None)
        return ok & (phy < self.lost[j, 1])

    def lookup_field(self, phy: np.ndarray, hint: np.ndarray | None = None) -> np.ndarray:
        """Record row whose PHYSICALOFFSET field equals ``phy`` (or whose position does), -1 if none.

        ``hint``: a guessed row per value; where that row's field equals the value and fields are unique,
        it is the answer (checked, so a wrong guess costs only the search it did not save)."""
        out = np.full(len(phy), -1, np.int64)
        if not len(self.field_sorted) or not len(phy):
            return out
        if hint is not None and self.field_unique:
            ok = self.field[hint] == phy
            out[ok] = hint[ok]
            rest = np.flatnonzero(~ok)
            if len(rest):
                out[rest] = self.lookup_field(phy[rest])
            return out
        i = np.searchsorted(self.field_sorted, phy)
        ic = np.clip(i, 0, len(self.field_sorted) - 1)
        hit = self.field_sorted[ic] == phy
        out[hit] = self.field_order[ic[hit]]
        miss = np.flatnonzero(~hit)
        if len(miss):
            j = np.searchsorted(self.phy, phy[miss])
            jc = np.clip(j, 0, len(self.phy) - 1)
            h2 = self.phy[jc] == phy[miss]
            out[miss[h2]] = jc[h2]
        return out


def _member(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``np.isin(values, set)`` for a sorted int64 set by binary search: numpy's hash-based unique
    behind ``isin`` takes seconds on millions of 64-bit codes, a searchsorted takes milliseconds."""
    if not len(sorted_set) or not len(values):
        return np.zeros(len(values), bool)
    i = np.searchsorted(sorted_set, values)
    return sorted_set[np.minimum(i, len(sorted_set) - 1)] == values


def _queue_records_exactly(log: LogView, recs: np.ndarray | None, phy: np.ndarray, qoffs: np.ndarray
                           ) -> np.ndarray | None:
    """``recs`` (a queue's dispatchable record rows, commitlog order) when the queue's checked units are
    exactly those records in order: same count, each unit's phyOffset its record's PHYSICALOFFSET field and
    its queue offset the record's QUEUEOFFSET. With unique fields that is what :meth:`LogView.lookup_field`
    finds, and topic, queue, queue offset and transaction type then match by construction. Else None."""
    if (recs is None or not len(recs) or len(recs) != len(phy) or not log.field_unique
            or not np.array_equal(log.qoff[recs], qoffs) or not np.array_equal(log.field[recs], phy)):
        return None
    return recs


def _queue_hint(log: LogView, key: tuple[str, int], qoffs: np.ndarray) -> np.ndarray | None:
    """Guessed record rows of a queue's CQ units: its record with the same queue offset (a clean queue
    has exactly one), for :meth:`LogView.lookup_field`."""
    recs = log.queue_rows.get(key)
    if recs is None or not len(recs) or not len(qoffs):
        return None
    qo = log.qoff[recs]
    if not bool(np.all(qo[1:] > qo[:-1])):
        return None
    return recs[np.minimum(np.searchsorted(qo, qoffs), len(recs) - 1)]


def _by_runs(fn, q: np.ndarray) -> np.ndarray:
    """``fn(q)`` for an elementwise ``fn`` and ``q`` in ascending order with repeats (a record's keys are
    consecutive): each distinct value is computed once."""
    if len(q) < 2 or not bool(np.all(q[1:] >= q[:-1])):
        return fn(q)
    starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
    return np.repeat(fn(q[starts]), np.diff(np.r_[starts, len(q)]))


def _lookup_repeats(log: LogView, phy: np.ndarray) -> np.ndarray:
    """``log.lookup_field(phy)``, each distinct value of sorted ``phy`` once (:func:`_by_runs`)."""
    return _by_runs(log.lookup_field, phy)


def _searchsorted_repeats(a: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``np.searchsorted(a, q)``, each distinct value of sorted ``q`` once (:func:`_by_runs`)."""
    return _by_runs(lambda v: np.searchsorted(a, v), q)


def _run_of(sorted_vals: np.ndarray, sorted_set: np.ndarray) -> bool:
    """Is ``sorted_vals`` a contiguous run of ``sorted_set`` (so every value is a member)? A sufficient,
    cheap test of ``_member(vals, set).all()`` for the common case: an index file's entries are the keys
    of a range of records, exactly."""
    if not len(sorted_vals):
        return True
    i = int(np.searchsorted(sorted_set, sorted_vals[0]))
    return bool(np.array_equal(sorted_set[i:i + len(sorted_vals)], sorted_vals))


def _rel(root: str, path: str | None) -> str | None:
    if path is None:
        return None
    r = root.rstrip("/") + "/"
    return path[len(r):] if path.startswith(r) else path


def check_queue_offsets(log: LogView, out: _Capped) -> dict[tuple[str, int], dict]:
    """Per (topic, queue): QUEUEOFFSETs of dispatchable records contiguous and unique, in commitlog order.

    Returns per-queue facts: min/max queue offset and message count in the commitlog.
    """
    disp = np.flatnonzero((log.tran == 0) | (log.tran == 2))
    facts: dict[tuple[str, int], dict] = {}
    if not len(disp):
        return facts
    code = (log.topic_idx[disp] << 32) | (log.qid[disp].astype(np.int64) & 0xFFFFFFFF)
    o = _queue_group_order(code, log.topic_idx[disp], log.qid[disp], len(log.topic_names))
    order = disp[o]
    code_s = code[o]
    starts = np.flatnonzero(np.r_[True, code_s[1:] != code_s[:-1]])
    stops = np.r_[starts[1:], len(code_s)]
    q = log.qoff[order]
    batch_rec = (log.sysflag[order] & INNER_BATCH_FLAG) != 0
    for a, b in zip(starts.tolist(), stops.tolist()):
        rows = order[a:b]
        topic = log.topic_names[int(log.topic_idx[rows[0]])]
        qid = int(log.qid[rows[0]])
        qq = q[a:b]
        facts[(topic, qid)] = {"cl_min_offset": int(qq.min()), "cl_max_offset": int(qq.max()) + 1, "messages": b - a,
                               "last_phy": int(log.phy[rows[-1]]), "first_phy": int(log.phy[rows[0]])}
        log.queue_rows[(topic, qid)] = rows
        if b - a < 2:
            continue
        d = np.diff(qq)
        skip_batch = batch_rec[a:b - 1]
        for i in np.flatnonzero(d == 0).tolist():
            r = int(rows[i + 1])
            out.add(Finding("duplicate_queue_offset", "error", f"commitlog/{_seg_name(log, r)}", _seg_off(log, r),
                            f"{topic}/{qid}: QUEUEOFFSET {int(qq[i + 1])} already used by the record at "
                            f"{int(log.phy[rows[i]])}; the broker's CQ writer drops this one as a repeat",
                            {"topic": topic, "queue_id": qid, "queue_offset": int(qq[i + 1]), "phy": int(log.phy[r]),
                             "first_phy": int(log.phy[rows[i]])}))
        for i in np.flatnonzero(d < 0).tolist():
            r = int(rows[i + 1])
            out.add(Finding("queue_offset_backwards", "error", f"commitlog/{_seg_name(log, r)}", _seg_off(log, r),
                            f"{topic}/{qid}: QUEUEOFFSET {int(qq[i + 1])} after {int(qq[i])}",
                            {"topic": topic, "queue_id": qid, "phy": int(log.phy[r])}))
        gaps = np.flatnonzero((d > 1) & ~skip_batch)
        for i in gaps.tolist():
            r0, r1 = int(rows[i]), int(rows[i + 1])
            lo, hi = int(log.phy[r0]), int(log.phy[r1])
            if len(log.lost) and np.any((log.lost[:, 0] < hi) & (log.lost[:, 1] > lo)):
                continue  # explained by a lost region between the two records
            out.add(Finding("queue_offset_gap", "error", f"commitlog/{_seg_name(log, r1)}", _seg_off(log, r1),
                            f"{topic}/{qid}: QUEUEOFFSET jumps from {int(qq[i])} to {int(qq[i + 1])} "
                            f"({int(d[i]) - 1} offsets never written)",
                            {"topic": topic, "queue_id": qid, "missing": int(d[i]) - 1, "phy": hi}))
    return facts


def _queue_group_order(code: np.ndarray, topic_idx: np.ndarray, qid: np.ndarray, n_topics: int) -> np.ndarray:
    """``np.argsort(code, kind="stable")`` for ``code = topic_idx << 32 | qid (as uint32)``: when queue ids
    are small and non-negative, (topic, queue) numbered densely in the same order fit 16 bits (a radix
    sort, no ``unique``); otherwise :func:`_stable_group_order`."""
    if len(qid) > 1:
        qmin, qmax = int(qid.min()), int(qid.max())
        if qmin >= 0 and n_topics * (qmax + 1) <= 1 << 16:
            return np.argsort((topic_idx * (qmax + 1) + qid).astype(np.uint16), kind="stable")
    return _stable_group_order(code)


def _stable_group_order(code: np.ndarray) -> np.ndarray:
    """``np.argsort(code, kind="stable")`` for a column of few distinct values (topic/queue codes): their
    dense ranks fit 16 bits, where numpy's stable argsort is a radix sort (several times faster)."""
    if len(code) > 1:
        lo, hi = int(code.min()), int(code.max())
        if hi - lo < 1 << 16:
            return np.argsort((code - lo).astype(np.uint16), kind="stable")
        uniq, inv = np.unique(code, return_inverse=True)
        if len(uniq) <= 1 << 16:
            return np.argsort(inv.astype(np.uint16), kind="stable")
    return np.argsort(code, kind="stable")


def _seg_name(log: LogView, row: int) -> str:
    S = log.segment_size
    return f"{int(log.phy[row]) // S * S:020d}"


def _seg_off(log: LogView, row: int) -> int:
    S = log.segment_size
    return int(log.phy[row]) % S


@dataclass
class CQLoad:
    """The consume queues as read from disk (before any comparison with the records): what
    :func:`check_consume_queues` needs, loadable while the segments are still being audited."""

    findings: list[Finding] = field(default_factory=list)  # structural findings, in the order found
    failed: bool = False  # the queue directory could not be listed (the one finding says why)
    per_queue: dict[tuple[str, int], tuple] = field(default_factory=dict)  # (n, units, files, max, min)
    cq_max_phy: int = -1


def load_consume_queues(root: Location, settings: BrokerSettings, log_min: int) -> CQLoad:
    """Read every consume queue's units (one copy out of the mapped files) and offsets."""
    from storelib.consumequeue import CQ_UNIT_SIZE, ConsumeQueue, list_queues

    rootp = root.path
    S = settings.mapped_file_size_consume_queue
    res = CQLoad()
    list_findings: list[Finding] = []
    try:
        queues = list_queues(root, list_findings)
    except StoreError as e:
        if e.kind == "rocksdb_consumequeue":  # a supported broker layout that rmqstore does not read: say so once
            res.findings.append(Finding(e.kind, "warning", _rel(rootp, e.file), None,
                                        f"{e.detail}: ConsumeQueue checks skipped (rmqstore reads file-based "
                                        "consume queues only); commitlog, index, checkpoint and config are audited",
                                        {"supported": False}))
        else:
            res.findings.append(Finding(e.kind, "error", _rel(rootp, e.file), e.offset, e.detail))
        res.failed = True
        return res
    for f in list_findings:
        f.file = _rel(rootp, f.file)
        res.findings.append(f)
    for topic, qid, loc in queues:
        cq = ConsumeQueue(loc, segment_size=S, topic=topic, queue_id=qid)
        try:
            for f in cq.findings:
                f.file = _rel(rootp, f.file)
                res.findings.append(f)
            ns, units, files = [], [], []
            for i, seg in enumerate(cq.segments):
                u = cq.read_units(seg)
                if i == len(cq.segments) - 1:
                    # the queue's last file is preallocated: its units after the last one with a size are
                    # invalid and after every valid unit, so no check looks at them; its first unit stays
                    # (the queue's first offset)
                    keep = _units_before_invalid_tail(u, seg.loc.path if seg.loc.local else None)
                    u = u[:max(keep, 1 if i == 0 else 0)]
                ns.append(seg.base // CQ_UNIT_SIZE + np.arange(len(u), dtype=np.int64))
                units.append(u)
                files.append((seg.base, _rel(rootp, seg.path)))
            n = ns[0] if len(ns) == 1 else np.concatenate(ns) if ns else np.zeros(0, np.int64)
            # one copy out of the mapped files (they are closed below)
            u = (np.array(units[0]) if len(units) == 1 else np.concatenate(units) if units
                 else np.zeros(0, dtype=[("phy_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")]))
            cq_max = cq.max_offset()
            mpo = cq.max_physic_offset()
            cq_min = cq.min_offset(log_min) if cq.segments else 0
        finally:
            cq.close()
        res.cq_max_phy = max(res.cq_max_phy, mpo)
        res.per_queue[(topic, qid)] = (n, u, files, cq_max, cq_min)
    return res


def _units_before_invalid_tail(units: np.ndarray, path: str | None) -> int:
    """How many of a CQ file's units come before its trailing units whose size field is zero (invalid:
    a unit is valid only with size > 0). ``path``: the file when local; units in its holes (a
    preallocated file is sparse) are zeros without being read (:func:`storelib.bytesource.data_ranges`)."""
    from storelib.consumequeue import CQ_UNIT_SIZE

    n = len(units)
    ranges = data_ranges(path, 0, n * CQ_UNIT_SIZE)
    if not ranges:
        return 0
    n = min(n, -(-ranges[-1][1] // CQ_UNIT_SIZE))
    off = units.dtype.fields["size"][1]
    if units.dtype.itemsize % 4 or off % 4:
        return n
    # the size field of each unit as raw 32-bit words (zero or not, whatever the byte order): no copy
    size = units[:n].view(np.uint32).reshape(n, units.dtype.itemsize // 4)[:, off // 4]
    nz = size[::-1] != 0
    j = int(nz.argmax()) if n else 0
    return n - j if n and nz[j] else 0


def check_consume_queues(root: Location, log: LogView, settings: BrokerSettings, out: _Capped, facts: dict,
                         loaded: CQLoad | None = None) -> dict:
    """ConsumeQueue entries vs records both ways; queue min/max offsets and lag. Returns per-queue stats.

    ``loaded``: the queues read beforehand (:func:`load_consume_queues`, same ``log.log_min``)."""
    from storelib.consumequeue import CQ_UNIT_SIZE, filler_mask

    if loaded is None:
        loaded = load_consume_queues(root, settings, log.log_min)
    out.extend(loaded.findings)
    if loaded.failed:
        return {}
    per_queue = loaded.per_queue
    stats: dict[tuple[str, int], dict] = {}
    reput_from = max(loaded.cq_max_phy, log.log_min, 0)

    seen_queues = set()
    for (topic, qid), (n, u, files, cq_max, cq_min) in per_queue.items():
        seen_queues.add((topic, qid))
        bases = np.array([b for b, _ in files], dtype=np.int64)

        def where(k: int, n=n, bases=bases, files=files) -> tuple[str | None, int]:
            byte = int(n[k]) * CQ_UNIT_SIZE
            i = int(np.searchsorted(bases, byte, side="right")) - 1
            return files[i][1], byte - int(bases[i])

        phy = u["phy_offset"].astype(np.int64)
        size = u["size"].astype(np.int64)
        valid = (phy >= 0) & (size > 0)
        filler = filler_mask(u) if len(u) else np.zeros(0, bool)
        last_valid = len(valid) - 1 - int(valid[::-1].argmax()) if valid.any() else -1
        # holes: invalid units before the last valid one
        holes = np.flatnonzero(~valid[: last_valid + 1])
        if len(holes):
            run_starts = holes[np.r_[True, np.diff(holes) > 1]]
            run_lens = np.diff(np.r_[np.flatnonzero(np.r_[True, np.diff(holes) > 1]), len(holes)])
            for k, ln in zip(run_starts.tolist(), run_lens.tolist()):
                f, off = where(k)
                out.add(Finding("cq_entry_missing", "error", f, off,
                                f"{topic}/{qid}: {ln} invalid unit(s) at queue offset {int(n[k])} before later valid "
                                "entries; the broker's queue ends here (recovery truncates it, later entries are lost)",
                                {"topic": topic, "queue_id": qid, "queue_offset": int(n[k]), "count": ln}))
        chk = np.flatnonzero(valid & ~filler)
        rows = _queue_records_exactly(log, log.queue_rows.get((topic, qid)), phy[chk], n[chk])
        exact = rows is not None
        if rows is None:
            rows = log.lookup_field(phy[chk], _queue_hint(log, (topic, qid), n[chk]))
        tcode = log.topic_code.get(topic, -1)
        miss = rows < 0
        mp = phy[chk][miss]
        expired = mp < log.log_min
        lost = log.in_lost(mp)
        past = (mp >= log.log_end) & ~lost
        mid = ~(past | expired | lost)
        ks = chk[miss]
        if past.any():
            k0 = int(ks[past][0])
            f, off = where(k0)
            out.add(Finding("cq_entry_past_commitlog", "error", f, off,
                            f"{topic}/{qid}: {int(past.sum())} entries from queue offset {int(n[k0])} point past the end "
                            f"of the commitlog data ({log.log_end}); recovery truncates them",
                            {"topic": topic, "queue_id": qid, "count": int(past.sum()), "queue_offset": int(n[k0])}))
        for k in ks[mid].tolist():
            f, off = where(k)
            out.add(Finding("cq_entry_not_record_start", "error", f, off,
                            f"{topic}/{qid} offset {int(n[k])}: phyOffset {int(phy[k])} is not the start of a record",
                            {"topic": topic, "queue_id": qid, "queue_offset": int(n[k]), "phy": int(phy[k])}))
        hit = chk[~miss]
        r = rows[~miss]
        if len(hit):
            bad_size = log.size[r] != size[hit]
            if exact:  # the queue's own dispatchable records, with these queue offsets
                bad_topic = bad_qo = bad_tran = np.zeros(len(hit), bool)
            else:
                bad_topic = (log.topic_idx[r] != tcode) | (log.qid[r] != qid)
                bad_qo = log.qoff[r] != n[hit]
                bad_tran = ~((log.tran[r] == 0) | (log.tran[r] == 2))
            bad_tags = log.tags[r] != u["tags_code"][hit].astype(np.int64)
            bad = bad_size | bad_topic | bad_qo | bad_tags | bad_tran
            for j in np.flatnonzero(bad).tolist():
                k, rr = int(hit[j]), int(r[j])
                what = []
                if bad_size[j]:
                    what.append(f"size {int(size[k])} vs record {int(log.size[rr])}")
                if bad_topic[j]:
                    what.append(f"record is {log.topic_names[int(log.topic_idx[rr])]}/{int(log.qid[rr])}")
                if bad_qo[j]:
                    what.append(f"record QUEUEOFFSET {int(log.qoff[rr])}")
                if bad_tags[j]:
                    what.append(f"tagsCode {int(u['tags_code'][k])} vs record {int(log.tags[rr])}")
                if bad_tran[j]:
                    what.append("record is a PREPARED/ROLLBACK transaction record (never dispatched)")
                f, off = where(k)
                out.add(Finding("cq_entry_mismatch", "error", f, off,
                                f"{topic}/{qid} offset {int(n[k])} → record at {int(phy[k])}: " + "; ".join(what),
                                {"topic": topic, "queue_id": qid, "queue_offset": int(n[k]), "phy": int(phy[k])}))
        # message side: records of this queue beyond the queue's valid units
        fact = facts.get((topic, qid))
        lag = 0
        behind_bytes = 0
        if fact is not None and tcode >= 0:
            recs = log.queue_rows[(topic, qid)]  # dispatchable records of the queue, commitlog order
            qo = log.qoff[recs]
            last_n = int(n[last_valid]) if last_valid >= 0 else -1
            beyond = recs[qo > last_n]
            if len(beyond):
                after = log.phy[beyond] >= reput_from
                lag = len(beyond)
                behind_bytes = int(log.size[beyond].sum())
                if after.all():
                    out.add(Finding("queue_behind_commitlog", "warning", f"consumequeue/{topic}/{qid}", None,
                                    f"{len(beyond)} messages ({behind_bytes} bytes) from queue offset "
                                    f"{int(log.qoff[beyond[0]])} are not in the consume queue yet; the broker dispatches "
                                    f"them on start (reput from {reput_from})",
                                    {"topic": topic, "queue_id": qid, "count": len(beyond), "bytes": behind_bytes}))
                else:
                    b0 = beyond[~after]
                    out.add(Finding("cq_entries_missing_for_messages", "error", f"consumequeue/{topic}/{qid}", None,
                                    f"{len(b0)} messages from queue offset {int(log.qoff[b0[0]])} (phy {int(log.phy[b0[0]])})"
                                    f" have no CQ entry and lie before the reput position {reput_from}: the broker "
                                    "never dispatches them again", {"topic": topic, "queue_id": qid, "count": len(b0)}))
            first_n = int(n[0]) if len(n) else None
            if first_n is not None:
                before = recs[(qo < first_n) & (log.phy[recs] >= log.log_min)]
                if len(before):
                    out.add(Finding("cq_file_missing", "error", f"consumequeue/{topic}/{qid}", None,
                                    f"{len(before)} messages with queue offsets below {first_n} are in the commitlog but "
                                    "no CQ file holds their entries", {"topic": topic, "queue_id": qid}))
        stats[(topic, qid)] = {"topic": topic, "queue_id": qid, "min_offset": cq_min, "max_offset": cq_max,
                               "raw_max_offset": int(n[last_valid]) + 1 if last_valid >= 0 else cq_max,
                               "cl_max_offset": fact["cl_max_offset"] if fact else None,
                               "messages": fact["messages"] if fact else 0, "lag": lag, "lag_bytes": behind_bytes}
    unsafe: dict[str, list[int]] = {}  # topics that cannot be a directory: [records, first phy], one finding each
    batch = batch_cq_topics(root)
    batch_msgs: dict[str, int] = {}
    for key, fact in facts.items():
        if key in seen_queues:
            continue
        topic, qid = key
        if topic in batch:  # its queues are BatchConsumeQueue files: not missing, not read
            batch_msgs[topic] = batch_msgs.get(topic, 0) + int(fact["messages"])
            continue
        if unsafe_reason(topic) is not None:
            u = unsafe.setdefault(topic, [0, int(fact["first_phy"])])
            u[0] += int(fact["messages"])
            u[1] = min(u[1], int(fact["first_phy"]))
            continue
        sev = "warning" if fact["first_phy"] >= reput_from else "error"
        out.add(Finding("queue_missing" if sev == "error" else "queue_behind_commitlog", sev,
                        f"consumequeue/{topic}/{qid}", None,
                        f"{fact['messages']} dispatchable messages but no consume queue directory"
                        + ("; the broker dispatches them on start" if sev == "warning" else
                           " and they lie before the reput position: the broker never rebuilds it"),
                        {"topic": topic, "queue_id": qid, "count": fact["messages"]}))
    for topic, n in sorted(batch_msgs.items()):
        out.add(Finding("batch_consume_queue", "warning", f"batchconsumequeue/{topic}", None,
                        f"topic {escape_topic(topic)} keeps its queues as 5.x BatchConsumeQueue files "
                        f"({len(batch[topic])} queue(s)), which rmqstore does not read: its {n} messages are not "
                        "cross-checked against a consume queue", {"topic": topic, "queues": batch[topic],
                                                                  "messages": n, "supported": False}))
    S = log.segment_size
    for topic, (n, first) in sorted(unsafe.items()):
        out.add(unsafe_topic_finding(topic, f"commitlog/{first - first % S:020d}", first % S, n, first))
        stats[key] = {"topic": topic, "queue_id": qid, "min_offset": 0, "max_offset": 0,
                      "cl_max_offset": fact["cl_max_offset"], "messages": fact["messages"], "lag": fact["messages"],
                      "lag_bytes": 0}
    stats["__reput_from__"] = reput_from  # type: ignore[index]
    return stats


@dataclass
class IndexLoad:
    """The index files' headers and structural findings (:meth:`IndexFile.validate`), which need no
    record: loadable while the segments are still being audited. Entries are read again when compared."""

    findings: list[Finding] = field(default_factory=list)  # from listing index/
    files: list[tuple[Any, Any, list[Finding] | None, Finding | None]] = field(default_factory=list)
    # per file: (ref, header, validate findings, or the finding that it could not be opened)


def _index_open_error(display: str, e: StoreError) -> Finding:
    return Finding("index_bad_size" if e.kind in ("bad_size", "truncated") else e.kind, "error", display,
                   e.offset, e.detail)


def load_index_files(root: Location, settings: BrokerSettings) -> IndexLoad:
    """List, open and validate every index file (headers and structure; entries are not kept)."""
    from storelib.indexfile import IndexGeometry, list_index_files

    res = IndexLoad()
    refs = list_index_files(root, res.findings)
    g = IndexGeometry(settings.max_hash_slot_num, settings.max_index_num)
    for ref in refs:
        size_note = ref.size_finding(g)
        if size_note is not None:
            res.findings.append(size_note)
        try:
            f = ref.open(g, strict=False, broker_size=True)
        except StoreError as e:
            res.files.append((ref, None, None, _index_open_error(f"index/{ref.name}", e)))
            continue
        try:
            res.files.append((ref, f.header, f.validate(), None))
        finally:
            f.close()
    return res


@dataclass
class KeyCodes:
    """Every record key as one int64 code, (rank of its record by PHYSICALOFFSET field) << 31 | hash,
    -1 when its record is not in the table; what index entries are matched against."""

    kphy: np.ndarray  # record position of each key
    khash: np.ndarray
    rank: np.ndarray  # record row -> rank by PHYSICALOFFSET field
    kcode: np.ndarray
    kcode_sorted: np.ndarray
    kpos: np.ndarray  # the sorted codes >= 0 (keys whose record was found)


def key_codes(log: LogView) -> KeyCodes:
    kphy = log.keys.column("pos").to_numpy()
    khash = log.keys.column("key_hash").to_numpy().astype(np.int64)
    krow = _searchsorted_repeats(log.phy, kphy) if len(kphy) else np.zeros(0, np.int64)
    if len(krow):
        krow = np.where(log.phy[np.clip(krow, 0, len(log.phy) - 1)] == kphy, krow, -1)
    rank = np.empty(len(log.field_order), np.int64)
    rank[log.field_order] = np.arange(len(log.field_order))
    kcode = np.where(krow >= 0, (rank[np.clip(krow, 0, None)] << 31) | khash, -1) if len(krow) else np.zeros(0, np.int64)
    kcode_sorted = np.sort(kcode)
    return KeyCodes(kphy, khash, rank, kcode, kcode_sorted, kcode_sorted[np.searchsorted(kcode_sorted, 0):])


def _chunked_equal(col: pa.ChunkedArray, start: int, values: np.ndarray) -> bool:
    """``col[start : start + len(values)] == values`` (same values, any integer widths), chunk by chunk
    without copying the column. Nulls never match."""
    end = start + len(values)
    if end > len(col):
        return False
    pos = 0
    for ch in col.chunks:
        lo, hi = max(start, pos), min(end, pos + len(ch))
        if lo < hi:
            part = ch.slice(lo - pos, hi - lo)
            if part.null_count or not np.array_equal(part.to_numpy(), values[lo - start: hi - start]):
                return False
        pos += len(ch)
        if pos >= end:
            break
    return True


class _KeySequence:
    """The log's index keys in dispatch order, matched against index files one after the other.

    A healthy store's index files hold exactly these keys, in this order (the broker indexes each record's
    keys as it dispatches it): when a file's entries equal the next keys (PHYSICALOFFSET, hash), every
    entry points at the start of its record with the hash of one of its keys, which is what the per-entry
    lookups of :func:`check_index` would conclude, so they are skipped. Only when record positions are
    unique, ascending and equal to the records' PHYSICALOFFSET fields (then a lookup by field finds that
    record); once a file does not match, the rest go through the lookups."""

    def __init__(self, log: LogView) -> None:
        k = log.keys
        self.n = k.num_rows
        # the key columns stay in their per-task chunks (compared in place: one copy of them cost
        # ~0.1 s, on the index check's path, which the cross-file phase waits for)
        self.field = k.column("phy")
        self.hash = k.column("key_hash")
        phy = log.phy
        # keys come from the records of the same batches (:func:`_check_batch`): each pos is a record's
        self.aligned = log.field_unique and bool(np.all(phy[1:] > phy[:-1]))
        at = 0
        for ch in k.column("pos").chunks:
            if not self.aligned:
                break
            self.aligned = _chunked_equal(self.field, at, ch.to_numpy())
            at += len(ch)
        self.cur = 0
        self.spans: list[tuple[int, int]] = []  # key ranges matched by files

    def next_are(self, e_phy: np.ndarray, e_kh: np.ndarray) -> bool:
        """Are these entries (one file's, in entry order) the next keys? Advances past them if so."""
        a, b = self.cur, self.cur + len(e_phy)
        if (self.aligned and b <= self.n and _chunked_equal(self.field, a, e_phy)
                and _chunked_equal(self.hash, a, e_kh)):
            self.spans.append((a, b))
            self.cur = b
            return True
        self.aligned = False
        return False

    def all_matched(self) -> bool:
        """Did the files, in order, hold every key exactly (so every key is findable)?"""
        return self.aligned and self.cur == self.n


def check_index(root: Location, log: LogView, settings: BrokerSettings, out: _Capped, checkpoint: Any, abort: bool,
                loaded: IndexLoad | None = None) -> dict:
    """IndexFile headers, entries vs records, keys findable; files an abnormal start would delete.

    Needs nothing from the consume-queue checks, so it runs beside them (:func:`jobs.audit.cross_checks`);
    ``loaded``: the files validated beforehand (:func:`load_index_files`)."""
    from storelib.indexfile import IndexGeometry

    if loaded is None:
        loaded = load_index_files(root, settings)
    out.extend(loaded.findings)
    info: dict[str, Any] = {"files": []}
    if not loaded.files:
        return info
    g = IndexGeometry(settings.max_hash_slot_num, settings.max_index_num)
    keys = _KeySequence(log)
    k_: KeyCodes | None = None  # computed only when some file's entries are not the keys' sequence
    all_codes: list[np.ndarray] = []  # per file: its entries' codes (entries pointing at a record), sorted
    wrong_phy: list[np.ndarray] = []
    max_end_phy = -1
    idx_ts = checkpoint.index_msg_timestamp if checkpoint is not None else None
    for ref, h, vf, err in loaded.files:
        display = f"index/{ref.name}"
        if err is not None:
            out.add(err)
            continue
        try:
            f = ref.open(g, strict=False, broker_size=True)
        except StoreError as e:  # changed since it was validated
            out.add(_index_open_error(display, e))
            continue
        try:
            ent = f.entries_array()
            # the three columns used, in native byte order (copies: the mapping is closed below)
            e_phy = ent["phy_offset"].astype(np.int64)
            e_kh = ent["key_hash"].astype(np.int64)
            e_prev = ent["prev_index"].astype(np.int64)
            m = len(ent)
            del ent
        finally:
            f.close()
        info["files"].append({"name": ref.name, "entries": m, "begin_ts": h.begin_timestamp,
                              "end_ts": h.end_timestamp, "begin_phy": h.begin_phy_offset, "end_phy": h.end_phy_offset})
        if m:
            max_end_phy = max(max_end_phy, int(e_phy.max()))
        if idx_ts is not None and h.end_timestamp > idx_ts:
            info.setdefault("deleted_on_abnormal_start", []).append(ref.name)
            out.add(Finding("index_deleted_on_abnormal_start", "info", display, 8,
                            f"endTimestamp {h.end_timestamp} > checkpoint indexMsgTimestamp {idx_ts}: "
                            + ("the abort file is present, so the next start deletes this file and re-indexes only "
                               "from the recovery start segment" if abort else
                               "an abnormal start (abort file) would delete this file"),
                            {"end_timestamp": h.end_timestamp, "index_msg_timestamp": idx_ts}))
        e_n = np.arange(1, m + 1)
        consequences: list[str] = []
        if keys.next_are(e_phy, e_kh):
            # the file holds exactly the next keys of the log, in order: every entry points at its record
            # with one of its keys' hashes, so no entry finding (the comparison below would find none)
            wrong = np.zeros(0, np.int64)
        else:
            if k_ is None:
                k_ = key_codes(log)
            rows = _lookup_repeats(log, e_phy)
            found = rows >= 0
            if len(k_.rank):
                codes = np.where(found, (k_.rank[np.clip(rows, 0, None)] << 31) | np.clip(e_kh, 0, None), -2)
            else:  # no record at all (every segment gone): no entry can point at one
                codes = np.full(len(rows), -2, dtype=np.int64)
            cs = np.sort(codes[found])
            all_codes.append(cs)
            if _run_of(cs, k_.kpos):  # every entry's code is a key's code: nothing to look up one by one
                wrong = np.zeros(0, np.int64)
            else:
                wrong = np.flatnonzero(found & ~_member(codes, k_.kcode_sorted))
            wrong_phy.append(e_phy[wrong])
            miss = np.flatnonzero(~found)
            mp = e_phy[miss]
            expired = mp < log.log_min
            lost = log.in_lost(mp)
            past = (mp >= log.log_end) & ~lost
            for k in miss[~(expired | lost | past)].tolist():
                out.add(Finding("index_entry_bad_offset", "error", display, g.entry_pos(int(e_n[k])),
                                f"entry {int(e_n[k])}: phyOffset {int(e_phy[k])} is not the start of a record",
                                {"entry": int(e_n[k]), "phy": int(e_phy[k])}))
            if past.any():
                k0 = int(miss[past][0])
                # the broker's recovery truncates the commitlog and the consume queues but never an index
                # file (IndexService.load keeps every entry after a clean exit; 4.9.8 and 5.3.3): such
                # entries are what a recovered store holds, so they are graded as the broker lives with them
                out.add(Finding("index_entry_past_commitlog", "warning", display, g.entry_pos(int(e_n[k0])),
                                f"{int(past.sum())} entries point past the end of the commitlog data ({log.log_end}): "
                                "the broker keeps them (its recovery never truncates index files); once new messages "
                                "are written there, a query by key may return them and the client drops those whose "
                                "key does not match; `rmqstore rebuild --what index` writes an index without them",
                                {"count": int(past.sum())}))
        if len(wrong):
            consequences = ["slot_not_newest_entry", "prev_index_wrong_slot", "hash_slot_count_mismatch",
                            "index_chain_broken"]
        for k in wrong.tolist():
            out.add(Finding("index_entry_wrong_hash", "error", display, g.entry_pos(int(e_n[k])),
                            f"entry {int(e_n[k])}: keyHash {int(e_kh[k])} is not the hash of any key of the record at "
                            f"{int(e_phy[k])}; a query for the real key cannot find it (slot chains disagree as a "
                            "consequence)", {"entry": int(e_n[k]), "phy": int(e_phy[k]), "key_hash": int(e_kh[k])}))
        # chain structure: the broker links each entry to the previous entry of its slot
        if m and not len(wrong):
            # entries grouped by slot, entry number ascending: one sort of (slot << 32 | entry number)
            # (== a stable argsort by slot, several times faster); slot -1 (negative hash) sorts first.
            # In-place steps: fresh 20 MB temporaries cost page faults as much as the arithmetic.
            sk = e_kh % g.hash_slot_num
            sk[e_kh < 0] = -1
            sk <<= 32
            sk |= e_n
            sk.sort()
            n_s = sk & 0xFFFFFFFF
            sk >>= 32  # the slots, sorted
            exp_prev = np.empty_like(n_s)
            exp_prev[0] = 0
            exp_prev[1:] = n_s[:-1]
            exp_prev[1:][sk[1:] != sk[:-1]] = 0  # the first entry of its slot has no previous one
            order = n_s
            order -= 1
            got = e_prev[order]
            brk = np.flatnonzero(exp_prev != got)
            if len(brk):
                k = int(order[brk[0]])
                out.add(Finding("index_chain_broken", "error", display, g.entry_pos(int(e_n[k])) + 16,
                                f"{len(brk)} entries whose prevIndex is not the previous entry of their slot (first: "
                                f"entry {int(e_n[k])}); entries off the chain cannot be found by queries",
                                {"count": len(brk)}))
        for vfi in vf:
            if vfi.kind in consequences:
                continue
            vfi.file = display
            if vfi.kind == "slot_not_newest_entry" and not len(wrong):
                consequences.append("index_chain_broken")
            out.add(vfi)
    # every keyed message findable
    if settings.message_index_enable and keys.n and not keys.all_matched():
        if k_ is None:
            k_ = key_codes(log)
        kphy, khash, kcode, kpos = k_.kphy, k_.khash, k_.kcode, k_.kpos
        # the files whose entries were the keys' sequence: their codes are those keys' codes
        all_codes.extend(np.sort(k_.kcode[a:b]) for a, b in keys.spans)
        if len(all_codes) == 1:
            have = all_codes[0]
        else:  # sorted runs: the stable sort (timsort) merges them
            have = np.sort(np.concatenate(all_codes), kind="stable") if all_codes else np.zeros(0, np.int64)
        if np.array_equal(kpos, have):  # every key's code is some entry's: none missing
            missing = np.zeros(0, np.int64)
        else:
            missing = np.flatnonzero(~_member(kcode, have) & (kcode >= 0))
        if len(missing):
            mphy = kphy[missing]
            first_begin = min((fi["begin_phy"] for fi in info["files"]), default=0)
            explained = log.in_lost(mphy) | (mphy < log.log_min)
            if wrong_phy:
                wp = np.concatenate(wrong_phy)
                explained |= _member(mphy, np.sort(wp))
            behind = ~explained & (mphy > max_end_phy)
            real = ~explained & ~behind
            if behind.any():
                out.add(Finding("index_behind_commitlog", "warning", "index", None,
                                f"{int(behind.sum())} keys of messages after the last indexed message "
                                f"({max_end_phy}) are not indexed yet; the broker indexes them when it dispatches",
                                {"count": int(behind.sum())}))
            for j in np.flatnonzero(real).tolist():
                p = int(mphy[j])
                S = log.segment_size
                sev = "warning" if p < first_begin else "error"
                out.add(Finding("index_key_missing", sev, f"commitlog/{p // S * S:020d}", p % S,
                                f"a key of the message at {p} (hash {int(khash[missing[j]])}) is not findable "
                                "through any index file", {"phy": p, "key_hash": int(khash[missing[j]])}))
    info["max_end_phy"] = max_end_phy
    return info


def check_checkpoint(root: Location, log: LogView, out: _Capped, now_ms: int):
    """Checkpoint timestamps within the data's store-time range (and not in the future)."""
    from storelib.checkpoint import read_checkpoint

    try:
        cp = read_checkpoint(root, strict=False)
    except StoreError as e:
        sev = "warning" if e.kind == "missing" else "error"
        out.add(Finding("checkpoint_" + e.kind, sev, "checkpoint", e.offset, e.detail))
        return None
    if len(log.ts) == 0:
        return cp
    lo, hi = int(log.ts.min()), int(log.ts.max())
    for name, off in (("physic_msg_timestamp", 0), ("logics_msg_timestamp", 8), ("index_msg_timestamp", 16)):
        v = getattr(cp, name)
        if v > now_ms + 60_000:
            out.add(Finding("checkpoint_in_future", "error", "checkpoint", off,
                            f"{name} {v} is after the current time {now_ms}", {"field": name, "value": v}))
        elif v > hi:
            out.add(Finding("checkpoint_ahead_of_data", "error", "checkpoint", off,
                            f"{name} {v} is after the newest store timestamp in the commitlog ({hi}): the checkpoint "
                            "claims data that is not there; abnormal recovery would trust segments it should re-check",
                            {"field": name, "value": v, "data_max": hi}))
        elif 0 < v < lo and name != "index_msg_timestamp":
            out.add(Finding("checkpoint_behind_data", "info", "checkpoint", off,
                            f"{name} {v} is before the oldest store timestamp ({lo}): abnormal recovery would re-scan "
                            "from the first segment", {"field": name, "value": v, "data_min": lo}))
    if cp.confirm_phy_offset and cp.confirm_phy_offset > log.log_end:
        out.add(Finding("confirm_offset_past_data", "warning", "checkpoint", 32,
                        f"confirmPhyOffset {cp.confirm_phy_offset} is past the end of the data ({log.log_end})"))
    return cp


def check_markers(root: Location, out: _Capped):
    """lock marker (a live broker?); returns the abort state (reported by :func:`report_abort`)."""
    from storelib.markers import abort_state, lock_state

    ab = abort_state(root)
    try:
        lk = lock_state(root)
    except StoreError:
        return ab
    if lk.held_by_other:
        out.add(Finding("broker_running", "critical", "lock", 0,
                        f"another process{f' (pid {lk.holder_pid})' if lk.holder_pid else ''} holds the store lock: "
                        "a live broker is writing this store; the audit saw a moving target"))
    elif lk.exists and not lk.content_ok:
        out.add(Finding("lock_content", "info", "lock", 0, "lock file does not hold the 4 bytes 'lock'"))
    return ab


def report_abort(ab, idx_info: dict, out: _Capped) -> None:
    """An abort file: say what the next broker start does, including the index files it deletes."""
    from storelib.markers import what_broker_does

    if not ab.exists:
        return
    dele = idx_info.get("deleted_on_abnormal_start", [])
    more = (f"; {len(dele)} index file(s) would be deleted ({', '.join(dele[:5])}"
            f"{'…' if len(dele) > 5 else ''})" if dele else "")
    out.add(Finding("abort_present", "warning", "abort", None,
                    "the broker was not shut down cleanly: " + what_broker_does(ab) + more,
                    {"pid": ab.pid, "index_files_deleted": dele}))


CONFIG_FILES = ["topics.json", "consumerOffset.json", "subscriptionGroup.json", "delayOffset.json",
                "consumerFilter.json", "lmqConsumerOffset.json"]


def check_configs(root: Location, out: _Capped) -> dict[str, Any]:
    """config/*.json readable (fastjson quirks), ``.bak`` agreeing or older; returns the loaded data."""
    from storelib.configjson import load_config
    from storelib.smallfile_io import read_small

    loaded: dict[str, Any] = {}
    for name in CONFIG_FILES:
        loc = root.join("config", name)
        present = [root.fs.get_file_info(p).type.name != "NotFound" for p in (loc.path, loc.path + ".bak",
                                                                                   loc.path + ".tmp")]
        if not any(present):
            continue
        ld = load_config(root, name)
        for f in ld.findings:
            f.file = _rel(root.path, f.file)
            if f.kind in ("config_unparseable", "config_empty") and f.severity == "warning":
                f.severity = "error" if ld.source is None else "warning"
            if f.kind == "config_missing" and ld.source == "bak":
                f.severity = "warning"
            out.add(f)
        loaded[name] = ld.data
        if ld.source == "file" and present[1]:
            try:
                from storelib.configjson import parse_fastjson

                raw = read_small(Location(loc.fs, loc.path + ".bak", loc.local))
                bak = parse_fastjson(raw.decode("utf-8", "replace")) if raw else None
            except StoreError:
                bak = None
            if bak is not None and ld.data is not None:
                _compare_bak(name, ld.data, bak, out)
    return loaded


def _compare_bak(name: str, data: dict, bak: dict, out: _Capped) -> None:
    dv, bv = data.get("dataVersion") or {}, bak.get("dataVersion") or {}
    if isinstance(dv, dict) and isinstance(bv, dict) and dv.get("counter") is not None and bv.get("counter") is not None:
        try:
            if int(bv["counter"]) > int(dv["counter"]):
                out.add(Finding("config_bak_newer", "warning", f"config/{name}.bak", None,
                                f".bak dataVersion counter {bv['counter']} is newer than the file's {dv['counter']}: "
                                "the last persist may have been lost"))
        except (TypeError, ValueError):
            pass
        return
    if name in ("consumerOffset.json", "lmqConsumerOffset.json"):
        from storelib.configjson import consumer_offsets

        a, b = consumer_offsets(data), consumer_offsets(bak)
        newer = [(k, q) for k, qs in b.items() for q, o in qs.items() if a.get(k, {}).get(q, o) < o]
        if newer:  # offsets can be reset by an admin, so this is a note, not a warning
            (tg, q) = newer[0]
            out.add(Finding("config_bak_offsets_ahead", "info", f"config/{name}.bak", None,
                            f"{len(newer)} offsets in .bak are ahead of the file (first: {tg[0]}@{tg[1]} queue {q}): "
                            "unless offsets were reset, the file looks older than its backup"))


def check_consumer_offsets(loaded: dict, qstats: dict, out: _Capped) -> list[dict]:
    """Consumer offsets within their queues' [min, max]; returns per-group lag rows for the report."""
    from storelib.configjson import consumer_offsets, delay_offsets

    rows: list[dict] = []
    for name in ("consumerOffset.json", "lmqConsumerOffset.json"):
        data = loaded.get(name)
        if not data:
            continue
        for (topic, group), qs in consumer_offsets(data, include_lmq=name.startswith("lmq")).items():
            for qid, off in sorted(qs.items()):
                st = qstats.get((topic, qid))
                where = f"config/{name}"
                ex = {"topic": topic, "group": group, "queue_id": qid, "offset": off}
                if st is None:  # offset 0 on a queue never written (e.g. %RETRY% of a subscribed group) is normal
                    out.add(Finding("consumer_offset_unknown_queue", "info" if off == 0 else "warning", where, None,
                                    f"{group} has offset {off} for {topic}/{qid}, which has no consume queue", ex))
                    continue
                mx, mn = st["max_offset"], st["min_offset"]
                rows.append({**ex, "max_offset": mx, "lag": max(0, mx - off)})
                # a hole in the queue (reported as cq_entry_missing) lowers the broker's max: compare with
                # the units actually on disk so the hole is not reported twice
                if off > max(mx, st.get("raw_max_offset", mx)):
                    out.add(Finding("consumer_offset_past_queue", "error", where, None,
                                    f"{group} on {topic}/{qid}: offset {off} is past the queue's max offset {mx}",
                                    {**ex, "max_offset": mx}))
                elif off < mn:
                    out.add(Finding("consumer_offset_below_min", "warning", where, None,
                                    f"{group} on {topic}/{qid}: offset {off} is below the queue's min offset {mn}: "
                                    f"{mn - off} messages expired before they were consumed", {**ex, "min_offset": mn}))
    d = loaded.get("delayOffset.json")
    if d:
        for level, off in delay_offsets(d).items():
            st = qstats.get(("SCHEDULE_TOPIC_XXXX", level - 1))
            if st is not None and off > st["max_offset"]:
                out.add(Finding("delay_offset_past_queue", "error", "config/delayOffset.json", None,
                                f"delay level {level}: offset {off} is past SCHEDULE_TOPIC_XXXX/{level - 1} max "
                                f"{st['max_offset']}", {"level": level, "offset": off}))
    return rows


def severity_at_least(sev: str, threshold: str) -> bool:
    return SEVERITY_RANK.get(sev, 0) >= SEVERITY_RANK[threshold]
