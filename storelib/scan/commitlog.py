"""CommitLog: segment discovery (MappedFileQueue load rules), random access, whole-log scans.

A missing, mis-named or mis-sized segment is a :class:`Finding`, not a crash: an operator looking at
a broken store needs to see everything that is still readable.

A DLedger-mode store's commitlog is the same object over ``dledger-<selfId>/data`` (``dledger=True``):
its segments are DLedger data files, scanned entry by entry (:class:`SegmentScan` ``dledger``), and
``committed_index`` (from DLedger's checkpoint, when the caller knows it) fills ``dledger_committed``.
Physical offsets are the broker's (entry pos + 48), so lookups by offset work unchanged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.fs as pafs

from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import DEFAULT_WINDOW, Location, open_source, resolve
from storelib.format.dledger.entries import BODY_OFFSET
from storelib.format.record import RecordCheck, check_record
from storelib.scan.messageschema import message_schema
from storelib.scan.recordbytes import SourceBytes
from storelib.scan.scanner import SegmentEnd, SegmentScan

DEFAULT_SEGMENT_SIZE = 1024 * 1024 * 1024
_NAME = re.compile(r"^[0-9]{20}$")


def offset_to_file_name(offset: int) -> str:
    """UtilAll.offset2FileName: the offset as 20 zero-padded decimal digits."""
    if offset < 0:
        raise ValueError("negative offset")
    return f"{offset:020d}"


@dataclass(frozen=True)
class Segment:
    """One commitlog segment file: its name's offset (``base``), location and size on disk."""

    base: int
    name: str
    loc: Location
    file_size: int
    mtime_ms: int | None = None
    folder: str = "commitlog"  # the segment's directory as shown to users (``dledger-n0/data`` in DLedger mode)
    dledger: bool = False  # a DLedger data file: entries, records at +48

    @property
    def path(self) -> str:
        return self.loc.path

    @property
    def display(self) -> str:
        return self.folder + "/" + self.name

    def open(self):
        return open_source(self.loc, self.file_size)


@dataclass(frozen=True)
class Split:
    """A cheap, picklable unit of scan work: records starting in ``[start, end)`` of one segment."""

    segment_base: int
    segment_name: str
    uri: str
    start: int
    end: int
    file_size: int
    dledger: bool = False  # a DLedger data file: ``start`` is an entry start

    @property
    def head(self) -> int:
        """Bytes before a unit's record: 48 for DLedger entries (the record, and phy offset, are at +48)."""
        return BODY_OFFSET if self.dledger else 0


def list_files(loc: Location) -> list[pafs.FileInfo]:
    """Files directly inside a directory Location (empty list when it does not exist)."""
    try:
        infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True, recursive=False))
    except OSError as e:
        raise StoreError(loc.path, None, "unreadable", str(e)) from e
    return sorted(infos, key=lambda i: i.base_name)


def at_cut(end: SegmentEnd, limit: int | None) -> SegmentEnd:
    """A scan stopped at a run's cut (``limit``, a file offset) ends there as data does: what the broker
    wrote after the cut is not this run's (:meth:`CommitLog.limit_of`)."""
    if limit is None or end.kind != "split_end" or end.file_offset < limit:
        return end
    return replace(end, kind="end_of_data", detail="the run's cut: what was written after it is not read")


class CommitLog:
    """The commitlog of a store: ``commitlog/`` under the root, or any directory Location; with
    ``dledger`` a DLedger data directory (``folder`` names it in findings and segment names). ``line``:
    the broker line whose record check its scans and reads apply (:class:`SegmentScan`; None: not known).

    ``cut_end``: the physical offset a run's cut ends at, on a store a broker is writing (records starting
    at or after it are not read; None: no cut, everything is)."""

    def __init__(self, loc: Location | str, segment_size: int | None = None, *, dledger: bool = False,
                 folder: str | None = None, committed_index: int | None = None, line: str | None = None):
        self.loc = resolve(loc) if isinstance(loc, str) else loc
        self.dledger = dledger
        self.line = line
        self.folder = folder or ("dledger/data" if dledger else "commitlog")
        self.committed_index = committed_index
        self.findings: list[Finding] = []
        self.segments: list[Segment] = []
        self.cut_end: int | None = None
        kind = self.loc.fs.get_file_info(self.loc.path).type
        f = self.folder
        if kind == pafs.FileType.NotFound:
            self.findings.append(Finding("no_commitlog_dir", "error", f, None,
                                         f"no {f}/ directory: not a broker store root (or the wrong path)"))
        infos = list_files(self.loc)
        # every entry as listed, [name, size, is a directory]: the broker's load judges them all, strays included
        self.listed: list[list] = [[i.base_name, int(i.size or 0), i.type == pafs.FileType.Directory] for i in infos]
        if kind == pafs.FileType.Directory and not any(i.type == pafs.FileType.File for i in infos):
            self.findings.append(Finding("no_commitlog_segments", "warning", f, None,
                                         f"{f}/ holds no segment files: the store has no messages"))
        for info in infos:
            if info.type == pafs.FileType.Directory:
                self.findings.append(Finding("unexpected_directory", "info", f"{f}/{info.base_name}", None,
                                             f"sub-directory in {f}/: not read here (whether the broker's "
                                             "load accepts it: the audit and recover --plan)"))
                continue
            if not _NAME.match(info.base_name):
                self.findings.append(Finding("bad_segment_name", "warning", f"{f}/{info.base_name}", None,
                                             "not a 20-digit segment name: not read here (whether the "
                                             "broker's load accepts it: the audit and recover --plan)"))
                continue
            mtime = int(info.mtime.timestamp() * 1000) if info.mtime is not None else None
            self.segments.append(Segment(int(info.base_name), info.base_name, self.loc.join(info.base_name),
                                         int(info.size or 0), mtime, f, dledger))
        self.segments.sort(key=lambda s: s.base)
        self.segment_size = segment_size or self._infer_segment_size()
        self._check_layout()

    def _infer_segment_size(self) -> int:
        sizes = [s.file_size for s in self.segments if s.file_size > 0]
        if not sizes:
            return DEFAULT_SEGMENT_SIZE
        return max(set(sizes), key=sizes.count)

    def _check_layout(self) -> None:
        S = self.segment_size
        prev: Segment | None = None
        for i, seg in enumerate(self.segments):
            last = i == len(self.segments) - 1
            if seg.file_size != S:
                if seg.file_size == 0 and last:
                    self.findings.append(Finding("empty_last_segment", "warning", seg.display, None,
                                                 "zero-length last segment (a 5.x broker deletes it; 4.9.8 fails to load)"))
                else:
                    self.findings.append(Finding("wrong_segment_size", "error", seg.display, None,
                                                 f"{seg.file_size} bytes, expected {S} (the broker refuses to load)",
                                                 {"size": seg.file_size, "expected": S}))
            if seg.base % S:
                self.findings.append(Finding("misaligned_segment", "error", seg.display, None,
                                             f"name offset {seg.base} is not a multiple of the segment size {S}"))
            if prev is not None and seg.base != prev.base + S:
                if seg.base > prev.base + S:
                    missing = (seg.base - prev.base) // S - 1
                    self.findings.append(Finding("missing_segment", "critical", seg.display, None,
                                                 f"gap after {prev.name}: {missing} segment(s) missing "
                                                 f"({prev.base + S}..{seg.base})",
                                                 {"from": prev.base + S, "to": seg.base}))
                else:
                    self.findings.append(Finding("overlapping_segment", "critical", seg.display, None,
                                                 f"overlaps {prev.name}"))
            prev = seg

    # -- lookups ------------------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.segments[0].base if self.segments else 0

    def limit_of(self, seg: Segment) -> int | None:
        """The file offset in ``seg`` where reading stops at the cut (None without one)."""
        if self.cut_end is None:
            return None
        return max(0, min(seg.file_size, self.cut_end - seg.base))

    def _before_cut(self, phy_offset: int) -> None:
        if self.cut_end is not None and phy_offset >= self.cut_end:
            raise StoreError("commitlog", phy_offset, "past_cut",
                             f"offset {phy_offset} is at or after this run's cut ({self.cut_end}): written since")

    def segment_for(self, phy_offset: int) -> Segment | None:
        """The segment holding ``phy_offset`` (MappedFileQueue.findMappedFileByOffset), or None."""
        S = self.segment_size
        lo, hi = 0, len(self.segments)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.segments[mid].base <= phy_offset:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return None
        seg = self.segments[lo - 1]
        return seg if phy_offset < seg.base + max(S, seg.file_size) else None

    def scan_options(self) -> dict:
        """What a :class:`SegmentScan` of this log's segments needs beyond the defaults (the broker line,
        DLedger mode)."""
        opts: dict = {"line": self.line}
        if self.dledger:
            opts.update(dledger=True, committed_index=self.committed_index)
        return opts

    def read(self, phy_offset: int, *, check_crc: bool = True) -> RecordCheck:
        """Validate and decode the record at ``phy_offset`` (random access; the record only, not its entry).

        The broker's check reads the fixed part and each length-prefixed field in small reads
        (:class:`SourceBytes`), never TOTALSIZE at once: a damaged size costs a few KiB, and only a
        record that passes is taken whole.
        """
        self._before_cut(phy_offset)
        seg = self.segment_for(phy_offset)
        if seg is None:
            raise self._no_segment(phy_offset)
        pos = phy_offset - seg.base
        with seg.open() as src:
            if pos >= src.size:
                raise StoreError(seg.display, pos, "past_end", f"offset past the end of the {src.size}-byte file")
            return check_record(SourceBytes(src), pos, check_crc=check_crc, file=seg.display, file_offset=pos,
                                line=self.line)

    def _no_segment(self, phy_offset: int) -> StoreError:
        """No segment holds ``phy_offset``; on a live store, one below the first segment expired (the
        broker's cleaner deleted its segment, perhaps during this run)."""
        if self.cut_end is not None and self.segments and phy_offset < self.segments[0].base:
            return StoreError(self.folder, phy_offset, "expired",
                              f"physical offset {phy_offset} is below the commitlog's first offset "
                              f"{self.segments[0].base}: the broker's cleaner deleted its segment (it expired)")
        return StoreError(self.folder, phy_offset, "no_segment", f"no segment holds physical offset {phy_offset}")

    def record_at(self, phy_offset: int, **kw) -> pa.RecordBatch:
        """The record starting at ``phy_offset`` as a one-row batch of the scan schema.

        Raises a StoreError naming the segment and offset when no valid record starts there.
        """
        self._before_cut(phy_offset)
        seg = self.segment_for(phy_offset)
        if seg is None:
            raise self._no_segment(phy_offset)
        pos = phy_offset - seg.base
        head = BODY_OFFSET if self.dledger else 0
        if pos < head:
            raise StoreError(seg.display, pos, "no_record", f"no DLedger entry can hold a record at file offset {pos}")
        src = seg.open()
        try:
            kw.setdefault("window", 1 << 16)  # remote: one small ranged read, grown only for a long record
            kw = {**self.scan_options(), **kw}  # a caller may choose another line
            scan = SegmentScan(src, seg.display, seg.base, pos - head, pos - head + 1, **kw)
            batches = [b for b in scan if b.num_rows]
        finally:
            src.close()
        if not batches:
            end = scan.end
            why = f"{end.reason or end.kind}: {end.detail or ''}".strip() if end else "no record"
            raise StoreError(seg.display, pos, "no_record", f"no valid message record starts here ({why})")
        return batches[0].slice(0, 1)

    # -- scans --------------------------------------------------------------------------------------
    def scan(self, *, from_offset: int | None = None, to_offset: int | None = None,
             ends: list[SegmentEnd] | None = None, skip_expired: bool = False, **kw) -> Iterator[pa.RecordBatch]:
        """Every valid record in commitlog order, segment by segment (memory stays flat).

        Each segment is read from offset 0 until its blank record, end of data or first invalid record,
        and the scan goes on with the next segment (so one bad record loses at most the rest of its
        segment, not the store). ``ends`` collects each segment's :class:`SegmentEnd`. DLedger data files
        carry the ledger on (index contiguity) from a file that ended in its blank filler. ``skip_expired``:
        a live store's segment the broker's cleaner deleted after the cut listed it is skipped (said once
        in :attr:`findings`) instead of raising (for a caller that streams what it reads).
        """
        kw = {**self.scan_options(), **kw}  # a caller may choose another line
        prev: tuple[int, int] | None = None
        for i, seg in enumerate(self.segments):
            if seg.file_size == 0:
                continue
            if to_offset is not None and seg.base >= to_offset:
                break
            if from_offset is not None and seg.base + seg.file_size <= from_offset:
                continue
            limit = self.limit_of(seg)
            if limit == 0:
                break  # the cut ends before this segment
            try:
                src = seg.open()
            except StoreError:
                if not (skip_expired and self._expired(seg)):
                    raise
                continue  # the cleaner deleted it after the run listed it: the scan goes on past it
            try:
                nxt = self.segments[i + 1] if i + 1 < len(self.segments) else None
                if nxt is not None and hasattr(src, "read_ahead"):  # remote: no stall between segments
                    src.read_ahead(kw.get("window", DEFAULT_WINDOW), then=(nxt.path, nxt.file_size))
                if self.dledger:
                    kw["prev_entry"] = prev
                scan = SegmentScan(src, seg.display, seg.base, end=limit, **kw)
                for batch in scan:
                    if from_offset is not None or to_offset is not None:
                        batch = _clip(batch, from_offset, to_offset)
                        if batch.num_rows == 0:
                            continue
                    yield batch
                if ends is not None and scan.end is not None:
                    ends.append(at_cut(scan.end, limit))
                e = scan.end
                prev = (e.last_index, e.last_term) if e is not None and e.kind == "blank" and e.last_index is not None                     else None
            finally:
                src.close()

    def _expired(self, seg: Segment) -> bool:
        """Did the broker's cleaner delete ``seg`` after the run's cut listed it (a live store's segment
        that no longer exists)? Said once, as an ``expired_during_run`` finding in :attr:`findings`."""
        if self.cut_end is None or not seg.loc.local or os.path.exists(seg.path):
            return False
        f = next((f for f in self.findings if f.kind == "expired_during_run"), None)
        if f is None:
            self.findings.append(Finding("expired_during_run", "info", seg.display, None,
                                         "deleted by the broker's cleaner after this run listed it (it expired "
                                         "during the run): not read", {"segments": [seg.name]}))
        else:
            f.extra["segments"].append(seg.name)
        return True

    def read_table(self, **kw) -> pa.Table:
        """The whole commitlog as one table (small stores and tests only)."""
        schema = message_schema(kw.get("with_body", False), kw.get("with_properties", True), self.dledger)
        return pa.Table.from_batches(list(self.scan(**kw)), schema=schema)


def _clip(batch: pa.RecordBatch, lo: int | None, hi: int | None) -> pa.RecordBatch:
    import pyarrow.compute as pc

    col = batch.column("phy_offset")
    mask = None
    if lo is not None:
        mask = pc.greater_equal(col, lo)
    if hi is not None:
        m2 = pc.less(col, hi)
        mask = m2 if mask is None else pc.and_(mask, m2)
    return batch.filter(mask) if mask is not None else batch
