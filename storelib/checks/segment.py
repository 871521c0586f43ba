"""The per-segment checks of an audit (one task per segment or split, any engine): every record validated as
the broker does, body and 5.x property CRCs, PHYSICALOFFSET against the position, the end-of-file record;
after a bad record the scan resynchronises (:mod:`storelib.broker.recovery.resync`) so the rest is still audited. A task
returns findings, lost regions, a compact record table and its records' index keys; :func:`finish_segment`
merges a segment's parts. Also the finding collector (:class:`Capped`) the cross-file checks share."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.recovery.reputpath import stop_detail
from storelib.broker.recovery.resync import LostRegion, find_next_record, lost_region
from storelib.broker.startup.lagdispatch import cq_able_ends
from storelib.checks.dledger import PartFacts, PartWalk, dledger_after_end, join_part_ends
from storelib.checks.tables import (
    KEY_SCHEMA,
    RECORD_COLUMNS,
    RECORD_SCHEMA,
    PartRef,
    TableRef,
    TableSink,
    from_ipc,
    group_sort,
    in_commitlog_order,
    read_table_file,
    to_ipc,
)
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import ByteSource, LocalSource, open_source, resolve, zero_tail
from storelib.fileio.memory import keep_freed_memory
from storelib.fileio.pagecare import PageCare, ReadPacer
from storelib.format.delaylevel import DEFAULT_DELAY_LEVELS_MS
from storelib.scan.arrowcols import with_topic_codes
from storelib.scan.commitlog import at_cut
from storelib.scan.scanner import TASK_BATCH_ROWS, SegmentScan
from storelib.scan.splits import segment_cuts

if TYPE_CHECKING:
    from storelib.broker.settings.store import Store

SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2, "critical": 3}
MAX_PER_KIND = 50  # findings of one kind per file before they are summarised

# what the segment checks read from a scan (nothing else is decoded)
SCAN_COLUMNS = ["phy_offset", "size", "magic_version", "crc_ok", "queue_id", "queue_offset", "physical_offset_field",
                "sys_flag", "tran_type", "store_timestamp", "topic", "keys", "uniq_key", "tags_code", "prop_crc_ok"]

# per-segment work ------------------------------------------------------------------------------------


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
    limit: int | None = None  # a live store: the run's cut in this file (records from here are not read)
    live: bool = False  # a broker runs the store: read by ranged reads (never mapped), a vanished file expired
    read_rate: float | None = None  # bytes a second for the run (read_share) or this task (its even share)
    read_share: str | None = None  # the run's budget file its tasks pace through (ReadPacer; local and pool)
    page_care: bool = False  # drop the page-cache pages this task brought in (a cold segment of a live store)


@dataclass
class AuditOptions:
    """What the segment checks need from the broker settings (plain values: picklable)."""

    delay_levels_ms: list[int] = field(default_factory=lambda: list(DEFAULT_DELAY_LEVELS_MS))
    broker_version: str = "4"
    line: str | None = None  # the settings' scan_line: the line whose record check applies (None: not told)
    dup_info: bool = False  # 5.3.3 duplicationEnable: recovery's DUP_INFO check (RecoveryInputs.dup_info)
    verify_crc: bool = True
    fs_options: dict[str, Any] = field(default_factory=dict)
    groups: int = 1  # queue groups the record tables are laid out by (:func:`storelib.checks.tables.group_sort`)
    dledger: bool = False  # DLedger data files: entries scanned, resync on entry starts (storelib.checks.dledger)
    dledger_walk: PartWalk | None = None  # the parts give DLedger's walk its per-file facts (one read per file)


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
    rec_end: int = -1  # end of its last valid record (-1: none); the whole view's log end is their max
    cq_ends: list[int] | None = None  # lagdispatch.cq_able_ends of its records (None: an older state's, unknown)

    # The tables may instead be held in memory (``_tables``, a class-level default, not a dataclass field,
    # so ``asdict`` and the state file never see them): in-process parts and per-task table files skip an
    # IPC round trip. ``_parts``: where the cross-file tasks find each part's tables.
    _tables: ClassVar[tuple[pa.Table, pa.Table] | None] = None
    _parts: ClassVar[tuple[PartRef, ...]] = ()
    dledger_end: ClassVar[dict | None] = None  # DLedger's walk end of the file, joined from its parts' (or None)

    def record_table(self, fs_options: dict[str, Any] | None = None) -> pa.Table:
        """The segment's records in commitlog order (the parts lay theirs out by queue group)."""
        t = self._tables
        if t is None and self._parts:
            return _concat([p.all_records(fs_options) for p in self._parts], RECORD_SCHEMA)
        return in_commitlog_order(t[0] if t is not None else from_ipc(self.records_ipc, RECORD_SCHEMA))

    def key_table(self, fs_options: dict[str, Any] | None = None) -> pa.Table:
        t = self._tables
        if t is None and self._parts:
            return _concat([p.key_table(fs_options) for p in self._parts], KEY_SCHEMA)
        return t[1] if t is not None else from_ipc(self.keys_ipc, KEY_SCHEMA)

    def set_tables(self, records: pa.Table, keys: pa.Table) -> None:
        self._tables = (records, keys)
        self.records_ipc = self.keys_ipc = b""


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    tables = [t for t in tables if t.num_rows]
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables) if tables else schema.empty_table()


class Capped:
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

    def to_json(self) -> dict:
        """The kept findings and the counts, as JSON (an incremental run replays them: :meth:`replay_json`)."""
        return {"items": [f.to_dict() for f in self.items], "counts": [[k, f, n] for (k, f), n in self.counts.items()]}

    def replay_json(self, j: dict) -> None:
        self.replay([Finding.from_dict(d) for d in j["items"]], {(k, f): n for k, f, n in j["counts"]})

    def absorb(self, other: Capped) -> None:
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


def audit_scan_line(opts: AuditOptions) -> str | None:
    """The line the audit's scans apply: the store's, but V2 records are read under 4.x rules too (4.9.8
    stops at the first one, which ``v2_record_on_4x`` reports once, with its cost), so that the rest of
    the log and the queues pointing at them are still audited rather than lost to a flood of regions."""
    return None if opts.line == "4" else opts.line


def _open_task(task: SegmentTask, opts: AuditOptions):
    if task.local and not task.live:
        return LocalSource(task.uri)
    loc = resolve(task.uri, **opts.fs_options)
    return open_source(replace(loc, mapped=False) if task.live else loc, task.file_size)


def _vanished(task: SegmentTask) -> bool:
    """Has the segment been deleted (the broker's cleaner) since the run listed it?"""
    return task.live and task.local and not os.path.exists(task.uri)


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
    offsets: tuple[int, ...] = ()  # queue-group boundaries of the record table (:func:`group_sort`)
    n_records: int = 0
    n_keys: int = 0
    n_misplaced: int = 0  # records whose PHYSICALOFFSET field is not their position
    phy_lo: int = -1  # position of the first record and end of the last (-1: no record)
    dledger_end: dict | None = None  # DLedger's walk end of this part (AuditOptions.dledger_walk)
    phy_hi: int = -1
    cq_ends: list[int] = field(default_factory=list)  # lagdispatch.cq_able_ends of its records
    bytes_valid: int = 0
    first_ts: int | None = None
    last_ts: int | None = None
    _tables: ClassVar[tuple[pa.Table, pa.Table] | None] = None  # held in memory (as SegmentResult's)

    def problem_count(self) -> int:
        """Findings this part will contribute (scan-time findings, CRC failures, lost regions), for the
        progress line: the count the segment's findings are made from, before the per-kind caps."""
        return sum(self.counts.values()) + len(self.bad_rows) + len(self.regions) + (self.unreadable is not None)

    def tables(self) -> tuple[pa.Table, pa.Table]:
        """The record and key tables: held in memory, or decoded from the IPC bytes (zero-copy)."""
        if self._tables is not None:
            return self._tables
        return from_ipc(self.records_ipc, RECORD_SCHEMA), from_ipc(self.keys_ipc, KEY_SCHEMA)

    def load_tables(self, fs_options: dict[str, Any] | None = None) -> None:
        """Driver side: map the tables a task wrote to a :class:`TableSink` (before its dir is removed)."""
        self._tables = (read_table_file(self.records_path, RECORD_SCHEMA, fs_options),
                        read_table_file(self.keys_path, KEY_SCHEMA, fs_options))

    def ref(self, base: int) -> PartRef:
        """Where the cross-file tasks find this part's tables: its files, or the tables held here."""
        held = self._tables
        if held is None and (self.records_ipc or self.keys_ipc):  # in-band: decoded here, kept in this process
            held = self.tables()
        recs = TableRef(self.records_path, held[0] if held is not None else None)
        keys = TableRef(self.keys_path, held[1] if held is not None else None)
        lo = self.phy_lo if self.n_records else base + self.start
        hi = self.phy_hi if self.n_records else base + self.start
        return PartRef(self.name, base, self.start, lo, hi, recs, keys, self.offsets or (0, self.n_records),
                       self.n_keys, self.n_misplaced)


def audit_part(task: SegmentTask, opts: AuditOptions, sink: TableSink | None = None,
               keep_tables: bool = False) -> PartResult:
    """Audit the records of ``task`` that start in ``[task.start, task.end)`` (the whole rest of the
    segment when ``end`` is None); never raises for content problems.

    The tables go to ``sink`` files when given, stay in memory with ``keep_tables`` (in-process
    callers), else travel as IPC bytes in the result (Spark's in-band collect)."""
    t0 = time.monotonic()
    if not keep_tables:  # a worker process (in-process callers keep the tables): its arrays reuse freed pages
        keep_freed_memory()
    display = "commitlog/" + task.name
    res = PartResult(task.name, task.start, task.end, data_end=task.start)
    found = Capped()
    try:
        src = _open_task(task, opts)
    except StoreError as e:
        res.end_kind = "expired" if _vanished(task) else "unreadable"
        res.unreadable = e.detail
        return res
    pacer = ReadPacer(task.read_rate, task.read_share)
    care = PageCare(task.uri if task.local and task.page_care else None)
    rec_parts: list[pa.Table] = []
    key_parts: list[pa.Table] = []
    regions: list[LostRegion] = []
    bad_rows: list[tuple[int, int, bool]] = []  # (file offset, size, prop-only) of CRC failures
    S = task.segment_size
    try:
        pos = task.start
        seg_len = src.size
        stop = min([seg_len, *(b for b in (task.end, task.limit) if b is not None)])
        res.exit_pos = pos
        facts = PartFacts(opts.dledger_walk, task) if opts.dledger_walk is not None else None  # the first scan's
        while pos < stop:
            scan = SegmentScan(src, display, task.base, pos, None if task.end is None and task.limit is None else stop,
                               verify_crc=opts.verify_crc, with_properties=False, delay_levels_ms=opts.delay_levels_ms,
                               columns=SCAN_COLUMNS if facts is None else facts.columns(SCAN_COLUMNS), line=audit_scan_line(opts),
                               dup_info=opts.dup_info, dledger=opts.dledger, batch_rows=TASK_BATCH_ROWS)
            for batch in scan if facts is None else facts.feed(scan, SCAN_COLUMNS):
                _check_batch(batch, task, opts, display, found, bad_rows, rec_parts, key_parts)
                pacer.took(_batch_bytes(batch))
            if facts is not None:
                res.dledger_end, facts = facts.finish(src, scan.end), None
            end = at_cut(scan.end, task.limit if stop == task.limit else None)
            assert end is not None
            res.end_kind, res.data_end = end.kind, end.file_offset
            res.exit_pos = None
            if task.limit is not None and end.kind == "end_of_data" and end.file_offset >= task.limit:
                break  # the run's cut: what the broker wrote after it is not this run's
            if opts.dledger and end.kind not in ("segment_end", "split_end"):
                pos = res.exit_pos = dledger_after_end(src, task, end, display, found, regions)
                if pos is None:
                    break
                continue
            if end.kind == "blank":
                _check_blank(src, end.file_offset, S, display, found)
                break
            if end.kind in ("segment_end", "split_end"):
                res.exit_pos = end.file_offset
                break
            view = _whole(src)
            if end.kind == "end_of_data":
                if zero_tail(view, end.file_offset, path=task.uri if task.local else None):
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
            detail = stop_detail(end, opts.line, display, found.add)  # what recovery and the reput each do with it
            region, r = lost_region(view, display, task.base, end.file_offset, reason, detail)
            regions.append(region)
            if r.kind == "message":
                pos = res.exit_pos = r.pos
                continue
            if r.kind == "blank":
                res.end_kind, res.data_end = "blank", r.pos
            break
    finally:
        care.done(task.start, src.size)  # read-ahead windows go past the records: all this task may have read
        src.close()
    res.items, res.counts = found.items, dict(found.counts)
    res.bad_rows, res.regions = bad_rows, regions
    res.n_misplaced = found.counts.get(("physical_offset_mismatch", display), 0)
    _keep_tables(res, task, opts, sink, keep_tables, rec_parts, key_parts)
    res.seconds = time.monotonic() - t0
    return res


def _check_blank(src: ByteSource, at: int, segment_size: int, display: str, found: Capped) -> None:
    """The end-of-file blank record's TOTALSIZE against what is left of the segment."""
    seg_len, S = src.size, segment_size
    total = int.from_bytes(bytes(src.read(at, 4)), "big", signed=True)
    if total != min(seg_len - at, S - at) or seg_len != S and total != S - at:
        found.add(Finding("bad_blank_record", "warning", display, at,
                          f"end-of-file blank record says {total} bytes, {S - at} are left"
                          " (readers skip it without checking)", {"total_size": total}))


def _keep_tables(res: PartResult, task: SegmentTask, opts: AuditOptions, sink: TableSink | None, keep_tables: bool,
                 rec_parts: list[pa.Table], key_parts: list[pa.Table]) -> None:
    """The part's record table laid out by queue group (:func:`storelib.checks.tables.group_sort`) and its
    key table, into ``sink`` files, kept in memory, or as IPC bytes in the result."""
    recs = pa.concat_tables(rec_parts) if rec_parts else RECORD_SCHEMA.empty_table()
    keys = pa.concat_tables(key_parts) if key_parts else KEY_SCHEMA.empty_table()
    res.n_records, res.n_keys = recs.num_rows, keys.num_rows
    if recs.num_rows:
        phy = recs.column("phy_offset")
        res.phy_lo, res.phy_hi = int(phy[0].as_py()), int(phy[-1].as_py()) + int(recs.column("size")[-1].as_py())
        res.cq_ends = cq_able_ends(*(recs.column(c).to_numpy() for c in ("phy_offset", "size", "tran_type")))
        res.bytes_valid = int(pc.sum(recs.column("size")).as_py())
        ts = recs.column("store_timestamp")
        res.first_ts, res.last_ts = int(pc.min(ts).as_py()), int(pc.max(ts).as_py())
    recs, res.offsets = group_sort(recs, opts.groups)
    if sink is not None:
        stem = f"{task.name}-{task.start}"
        res.records_path, res.keys_path = sink.write(stem + ".records", recs), sink.write(stem + ".keys", keys)
    elif keep_tables:
        res._tables = (recs, keys)
    else:
        res.records_ipc, res.keys_ipc = to_ipc(recs), to_ipc(keys)


def parts_chain(parts: list[PartResult]) -> bool:
    """Do the parts of one segment (in order) chain like one scan? Each part must leave its range
    exactly at the next part's start; otherwise (corruption across a boundary, a cut the whole-segment
    scan would not reach) the segment is audited again as one task."""
    return all(a.exit_pos is not None and a.exit_pos == b.start for a, b in zip(parts, parts[1:]))


def audit_segment(task: SegmentTask, opts: AuditOptions) -> SegmentResult:
    """Audit one commitlog segment from ``task.start``; never raises for content problems."""
    whole = replace(task, end=None)
    return finish_segment(whole, [audit_part(whole, opts, keep_tables=True)])


def finish_segment(task: SegmentTask, parts: list[PartResult]) -> SegmentResult:
    """One segment's result from its parts (in order, chaining: :func:`parts_chain`): what needs the
    whole segment — classifying CRC failures and lost regions, the per-kind caps — happens here."""
    display = "commitlog/" + task.name
    res = SegmentResult(task.name, task.base, task.file_size, task.start)
    bad = next((p for p in parts if p.unreadable is not None), None)
    if bad is not None and bad.end_kind == "expired":
        res.end_kind = "expired"
        res.findings = [expired_finding(display).to_dict()]
        return res
    if bad is not None:
        res.end_kind = "unreadable"
        res.findings = [Finding("segment_unreadable", "critical", display, None, bad.unreadable).to_dict()]
        return res
    found = Capped()
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
    res._parts = tuple(p.ref(task.base) for p in parts)  # the tables stay where the tasks left them
    res.dledger_end = join_part_ends([(p.start, p.dledger_end) for p in parts])
    res.records = sum(p.n_records for p in parts)
    res.bytes_valid = sum(p.bytes_valid for p in parts)
    firsts = [p.first_ts for p in parts if p.first_ts is not None]
    lasts = [p.last_ts for p in parts if p.last_ts is not None]
    res.first_ts, res.last_ts = min(firsts, default=None), max(lasts, default=None)
    res.rec_end = max((p.phy_hi for p in parts if p.n_records), default=-1)
    res.cq_ends = [e for p in parts for e in p.cq_ends]
    res.crc_errors = len(bad_rows)
    res.crc_bytes = sum(size for _, size, _ in bad_rows)
    res.findings = [f.to_dict() for f in found.done()]
    res.seconds = sum(p.seconds for p in parts)
    return res


def expired_finding(display: str) -> Finding:
    """A file of a live store that the broker's cleaner deleted after the run listed it: said once."""
    return Finding("expired_during_run", "info", display, None,
                   "deleted by the broker's cleaner after this run listed it (it expired during the run): not read")


def _batch_bytes(batch: pa.RecordBatch) -> int:
    sizes = batch.column("size")
    return int(pc.sum(sizes).as_py() or 0) if batch.num_rows else 0


def _region_extra(rg: LostRegion) -> dict:
    return {"end": rg.end, "bytes_lost": rg.bytes_lost, "phy": rg.phy_start, "reason": rg.reason,
            "resumed": rg.resumed}


def _check_batch(batch: pa.RecordBatch, task: SegmentTask, opts: AuditOptions, display: str, found: Capped,
                 bad_rows: list, rec_parts: list, key_parts: list) -> None:
    """Column checks of one scan batch, and its compact columns for the cross-file checks."""
    from storelib.broker.index.indexbuild import index_keys

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
    batch = with_topic_codes(batch)  # the index keys, the queue groups and the queue tasks use the codes
    rec_parts.append(pa.Table.from_batches([batch.select(RECORD_COLUMNS)]).cast(RECORD_SCHEMA))
    rows, kh = index_keys(batch)
    if len(rows):
        key_parts.append(pa.table({"pos": pa.array(phy[rows].astype(np.int64)),
                                   "phy": pa.array(field_[rows].astype(np.int64)),
                                   "key_hash": pa.array(kh.astype(np.int32))}, schema=KEY_SCHEMA))


def split_tasks(store: Store, tasks: list[SegmentTask], split_bytes: int, fine_tail: int = 0) -> list[SegmentTask]:
    """Cut segment tasks at verified record starts (:func:`storelib.scan.splits.segment_cuts`) into tasks of
    about ``split_bytes`` (the last ``fine_tail`` bytes finer), so every core has work to the end and no
    task holds a whole segment's tables."""
    cuts = segment_cuts(store.commitlog, split_bytes, {t.name for t in tasks}, fine_tail)
    out: list[SegmentTask] = []
    for t in tasks:
        lim = t.limit if t.limit is not None else t.file_size
        bounds = [t.start, *(c for c in cuts.get(t.name, []) if t.start < c < lim)]
        for a, b in zip(bounds, [*bounds[1:], None]):
            out.append(replace(t, start=a, end=b))
    return out


def merge_parts(tasks: list[SegmentTask], parts: list[PartResult], opts: AuditOptions,
                say: Callable[[str], None] | None = None,
                rerun: Callable[[list[SegmentTask]], list[PartResult]] | None = None) -> list[SegmentResult]:
    """Merge part results per segment; a segment whose parts do not chain like one scan (corruption
    across a cut) is audited again as one task (``rerun``: on the engine; default: here), so findings
    never depend on where the cuts fell."""
    by_name: dict[str, list[PartResult]] = {}
    for p in parts:
        by_name.setdefault(p.name, []).append(p)
    ordered = {t.name: sorted(by_name.get(t.name, []), key=lambda p: p.start) for t in tasks}
    redo = [t for t in tasks if not (ordered[t.name] and parts_chain(ordered[t.name]))]
    if redo and say is not None:
        for t in redo:
            say(f"audit: {t.name}: splits do not chain (corruption across a cut): auditing it as one task")
    whole = {t.name: replace(t, end=None) for t in redo}
    again = dict(zip(whole, rerun(list(whole.values())))) if rerun is not None and redo else {}
    out = []
    for t in tasks:
        if t.name not in whole:
            out.append(finish_segment(t, ordered[t.name]))
        elif t.name in again:
            out.append(finish_segment(whole[t.name], [again[t.name]]))
        else:
            out.append(audit_segment(t, opts))
    return out
