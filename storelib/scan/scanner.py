"""Segment walking: one commitlog segment (or a split of it) → Arrow record batches, and how it ended.

Every scan in the project goes through :class:`SegmentScan`. The size chain is followed column-wise
for its leading run of well-formed records (:class:`ChainRun`), and record by record in Python (one
``struct.unpack_from`` of TOTALSIZE each) only from where that run ends; the records found are
decoded column-wise by :class:`storelib.scan.batchdecode.BatchDecoder`, which builds only the requested
columns (:mod:`storelib.scan.messageschema`).

The scan stops at the first record that fails the broker's validation (CommitLog.
checkMessageAndReturnSize), exactly where the broker would, and reports why in :attr:`SegmentScan.end`.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from storelib.fileio.bytesource import DEFAULT_WINDOW, LocalSource
from storelib.format.delaylevel import DEFAULT_DELAY_LEVELS_MS
from storelib.format.record import BLANK_MAGIC, MAGIC_V1, MAGIC_V2
from storelib.scan.arrowcols import overlapping
from storelib.scan.batchdecode import BatchDecoder, ViewCache
from storelib.scan.messageschema import message_schema
from storelib.scan.recordbytes import check_at, outcome

MIN_RECORD_SIZE = 91  # IPv4/IPv4 V1 record with empty body, topic and properties


FULL_KINDS = ("blank", "segment_end")  # scan ends after which the segment holds no more: the log goes on in the next


@dataclass
class SegmentEnd:
    """How and where a segment (or split) scan ended.

    kind: ``blank`` (end-of-file record), ``end_of_data`` (zeros: nothing written here),
    ``segment_end`` (the file ended exactly at a record boundary), ``split_end`` (the split's end was
    reached), ``invalid`` (a record failed validation: see ``reason``/``detail``).
    """

    kind: str
    file: str
    file_offset: int
    phy_offset: int
    reason: str | None = None
    detail: str | None = None
    size: int | None = None  # TOTALSIZE the broker reports for a length mismatch, else None
    records: int = 0
    crc_errors: int = 0
    first_crc_error: int | None = None  # phy offset of the first body CRC mismatch seen

    @property
    def segment_full(self) -> bool:
        """Did the segment end here (end-of-file record or its last byte), so the log goes on in the next?"""
        return self.kind in FULL_KINDS

    def to_dict(self) -> dict:
        return dict(self.__dict__)


_PAIR = struct.Struct(">ii")
_I32 = struct.Struct(">i")

CHAIN_WINDOW = 4 << 20  # bytes searched for record starts at a time (a reused bool scratch of this size)
MAGIC_HEAD = 0xDA  # the first byte of both record magics, 0xDAA320A7 (V1) and 0xDAA320AB (V2)
CROWDED = 16  # a window with a 0xDA in more than one byte of this many is left to the plain walk


class ChainRun:
    """The size chain's leading run found column-wise, so per-record Python work is left to what follows
    an irregularity. A record's MAGIC sits 4 bytes after its start: every V1/V2 magic in a window of the
    segment is found with numpy, and the candidates that link to one another by TOTALSIZE from ``rel``
    are taken at once; the plain walk goes on where the run ends (a magic inside a body, a record the
    broker rejects, the window's end). Every start of the run is one the walk would reach first and pass
    (magic, size, fit), so the starts are identical by construction. Measured on 256 MB segments of
    538 k records: 0.16-0.26 s of walk -> ~0.08 s."""

    def __init__(self) -> None:
        self._scratch = np.empty(0, dtype=bool)

    def run(self, a: np.ndarray, rel: int, lim: int, rel_end: int, rows: int) -> tuple[list[np.ndarray], int]:
        """Starts (relative to ``a``) of the leading run from ``rel``, at most ``rows``, in arrays, and
        where the walk goes on. ``lim``: starts must be below it; ``rel_end``: records end by it."""
        out: list[np.ndarray] = []
        n = 0
        i4 = overlapping(a, ">i4")
        while n < rows and rel < lim:
            lo, hi = rel + 4, min(rel + 4 + CHAIN_WINDOW, rel_end - 3)  # a MAGIC's 4 bytes lie below rel_end
            if hi <= lo:
                break
            if len(self._scratch) < hi - lo:
                self._scratch = np.empty(CHAIN_WINDOW, dtype=bool)
            hit = self._scratch[:hi - lo]
            np.equal(a[lo:hi], MAGIC_HEAD, out=hit)
            idx = np.flatnonzero(hit)
            if not len(idx) or len(idx) * CROWDED > hi - lo:
                break
            idx += lo
            last = a[idx + 3]
            idx = idx[(a[idx + 1] == 0xA3) & (a[idx + 2] == 0x20) & ((last == 0xA7) | (last == 0xAB))]
            c = idx - 4
            if not len(c) or c[0] != rel:
                break
            c = c[:rows - n]
            nxt = c + i4[c]
            # what the walk checks of each record (size, fit, start before the limit), then the links
            bad = np.flatnonzero((nxt - c < MIN_RECORD_SIZE) | (nxt > rel_end) | (c >= lim))
            k = int(bad[0]) if len(bad) else len(c)  # c[k] is left to the walk
            broken = np.flatnonzero(nxt[:k - 1] != c[1:k]) if k > 1 else bad[:0]
            if len(broken):  # record j links to no candidate: the run ends after it
                j = int(broken[0])
                out.append(c[:j + 1])
                return out, int(nxt[j])
            out.append(c[:k])
            n += k
            if not k:
                return out, rel
            rel = int(nxt[k - 1])
            if k < len(c):  # c[k] fails a check: the walk judges what follows c[k - 1]
                return out, rel
        return out, rel


class SegmentScan:
    """Decode the records of one segment, or of ``[start, end)`` of it, into Arrow batches.

    ``source``: a ByteSource of the segment file; ``file``: its display path; ``base``: the segment's
    physical base offset. ``end`` is exclusive for record *starts* (a split owns the records that start
    inside it). ``verify_crc`` computes ``crc_ok``; ``stop_on_crc`` additionally ends the scan at the
    first mismatch, as the broker's recovery does.
    """

    def __init__(
        self,
        source,
        file: str,
        base: int,
        start: int = 0,
        end: int | None = None,
        *,
        verify_crc: bool = True,
        stop_on_crc: bool = False,
        with_body: bool = False,
        with_properties: bool = True,
        delay_levels_ms: Sequence[int] | None = None,
        batch_rows: int = 65536,
        window: int = DEFAULT_WINDOW,
        columns: list[str] | None = None,
    ):
        self.source = source
        self.file = file
        self.base = base
        self.start = start
        self.seg_len = source.size
        self.stop = self.seg_len if end is None else min(end, self.seg_len)
        self.verify_crc = verify_crc
        self.stop_on_crc = stop_on_crc
        self.with_body = with_body
        self.with_properties = with_properties
        self.delay_levels_ms = DEFAULT_DELAY_LEVELS_MS if delay_levels_ms is None else delay_levels_ms
        self.batch_rows = batch_rows
        self.window = window
        self.schema = message_schema(with_body, with_properties)
        if columns is not None:
            self.schema = pa.schema([self.schema.field(c) for c in columns])
        self.end: SegmentEnd | None = None
        self._chain = ChainRun()

    # -- the walk ---------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[pa.RecordBatch]:
        pos = self.start
        records = 0
        crc_errors = 0
        first_crc: int | None = None
        local = isinstance(self.source, LocalSource)
        if not local and self.stop - self.start > self.window and hasattr(self.source, "read_ahead"):
            # remote sequential scan: window k+1 is fetched in the background while k is decoded
            self.source.read_ahead(self.window)
        view_base = 0
        view = self.source.view() if local else memoryview(b"")
        views = ViewCache()
        decoder = BatchDecoder(self.source, self.base, self.schema, verify_crc=self.verify_crc,
                               stop_on_crc=self.stop_on_crc, delay_levels_ms=self.delay_levels_ms)
        while True:
            if not local and (pos - view_base + 8 > len(view) or pos + 8 > view_base + len(view)):
                view_base = pos
                view = self.source.read(pos, self.window)
            a, pbuf = views.get(view)
            stop_kind, stop_detail, starts, pos, need = self._walk(view, view_base, pos, a, pbuf)
            if len(starts):
                st = starts - view_base
                batch, bad, crc_bad = decoder.decode(view, view_base, st, a, pbuf)
                if crc_bad is not None and len(crc_bad):
                    crc_errors += len(crc_bad)
                    if first_crc is None:
                        first_crc = self.base + view_base + int(st[crc_bad[0]])
                if bad is not None:
                    k, reason, detail, size = bad
                    if k:
                        yield batch.slice(0, k)
                    records += k
                    bad_pos = view_base + int(st[k])
                    self.end = SegmentEnd("invalid", self.file, bad_pos, self.base + bad_pos, reason, detail,
                                          size, records, crc_errors, first_crc)
                    return
                records += batch.num_rows
                yield batch
            if need:  # the next record does not fit the current window: read a window starting at it
                if need > self.window:
                    # longer than a window (a valid record, or a damaged TOTALSIZE): the broker's check
                    # first, which reads the record's own lengths in small reads; only a record that
                    # passes it is read whole
                    chk = check_at(self.source, pos, self.stop_on_crc)
                    if chk.kind != "message":
                        reason, detail, size = outcome(chk)
                        self.end = SegmentEnd("invalid", self.file, pos, self.base + pos, reason, detail, size,
                                              records, crc_errors, first_crc)
                        return
                view_base = pos
                view = self.source.read(pos, max(self.window, need))
                continue
            if stop_kind is None:
                continue
            if stop_kind == "invalid":
                reason, detail, size = stop_detail
                self.end = SegmentEnd("invalid", self.file, pos, self.base + pos, reason, detail, size,
                                      records, crc_errors, first_crc)
            else:
                self.end = SegmentEnd(stop_kind, self.file, pos, self.base + pos, None, stop_detail, None,
                                      records, crc_errors, first_crc)
            return

    def _walk(self, view: memoryview, view_base: int, pos: int, a: np.ndarray | None = None,
              pbuf: pa.Buffer | None = None):
        """Follow the size chain from ``pos``; returns (stop kind, detail, starts, new pos, bytes needed).

        The leading run of well-formed records is found column-wise (:class:`ChainRun`); from where it
        ends, one tight Python loop reads only TOTALSIZE. MAGIC and "the record fits" are then checked
        column-wise for what the loop found, and the walk is cut at the first record that fails them;
        the reason is classified exactly as the broker would. Everything else is validated by
        :class:`BatchDecoder`. ``starts`` are absolute offsets.
        """
        seg_len, stop, rows = self.seg_len, self.stop, self.batch_rows
        vend = view_base + len(view)
        rel = pos - view_base
        rel_stop = min(stop, vend) - view_base
        rel_end = min(vend, seg_len) - view_base
        # the lean loop: TOTALSIZE only (one unpack, one append per record); magic and fit are
        # checked column-wise below, and the loop stops at the first size too small to be a record
        lim = min(rel_stop, rel_end - 7)  # rel < lim  <=>  rel < rel_stop and rel + 8 <= rel_end
        if a is None:
            a = np.frombuffer(view, np.uint8)
        run, rel = self._chain.run(a, rel, lim, rel_end, rows) if rel < lim else ([], rel)
        found = array("q")
        append = found.append
        unpack = _I32.unpack_from
        mn = MIN_RECORD_SIZE
        for _ in range(rows - sum(len(r) for r in run)):
            if rel >= lim:
                break
            total = unpack(view, rel)[0]
            if total < mn:
                break
            append(rel)
            rel += total
        starts = np.frombuffer(found, np.int64) if len(found) else np.zeros(0, np.int64)
        if len(starts):
            magic = overlapping(a, ">i4")[starts + 4]
            good = (magic == MAGIC_V1) | (magic == MAGIC_V2)
            if rel > rel_end:  # the last record does not fit: it is where the walk stops
                good[-1] = False
            if not good.all():
                j = int(np.argmin(good))
                rel = int(starts[j])
                starts = starts[:j]
        if run:
            starts = np.concatenate([*run, starts])
        cnt = len(starts)
        if view_base:
            starts = starts + view_base
        pos = rel + view_base
        # why did the walk stop?
        if pos >= stop:
            return ("split_end" if stop < seg_len else "segment_end"), None, starts, pos, 0
        if cnt >= rows:
            return None, None, starts, pos, 0
        left = seg_len - pos
        if left < 8:  # TOTALSIZE and MAGIC do not fit: the broker's read of MAGIC fails (-1)
            return "invalid", ("truncated", f"{left} bytes left in the segment, no room for a record", None), starts, pos, 0
        if pos + 8 > vend:
            return None, None, starts, pos, (0 if len(starts) else 8)
        total, magic = _PAIR.unpack_from(view, pos - view_base)
        if magic == MAGIC_V1 or magic == MAGIC_V2:
            if MIN_RECORD_SIZE <= total <= left:  # does not fit the window: the caller reads (bounded)
                return None, None, starts, pos, (0 if len(starts) else total)
            # too small to be a record, or past the segment: the broker's outcome (-1, or TOTALSIZE for a
            # length mismatch), by the scalar check
            return "invalid", outcome(check_at(self.source, pos, self.stop_on_crc)), starts, pos, 0
        if magic == BLANK_MAGIC:
            return "blank", f"blank record, TOTALSIZE {total}", starts, pos, 0
        if total == 0 and magic == 0:
            return "end_of_data", "zeros: no record written here", starts, pos, 0
        return "invalid", ("bad_magic", f"magic 0x{magic & 0xFFFFFFFF:08X}, TOTALSIZE {total}", None), starts, pos, 0


def scan_buffer(buf: bytes, base: int = 0, **kw) -> tuple[pa.Table, SegmentEnd]:
    """Scan an in-memory segment image (tests, small tools): all batches as one table plus the end."""

    class _Mem:
        def __init__(self, b: bytes):
            self.path = "<memory>"
            self.size = len(b)
            self._b = memoryview(b)

        def read(self, offset: int, length: int) -> memoryview:
            return self._b[offset : offset + length]

        def close(self) -> None:
            pass

    scan = SegmentScan(_Mem(buf), "<memory>", base, **kw)
    batches = list(scan)
    table = pa.Table.from_batches(batches, schema=scan.schema)
    assert scan.end is not None
    return table, scan.end
