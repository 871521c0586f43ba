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
from storelib.format.dledger.entries import BLANK_MAGIC as DL_BLANK
from storelib.format.dledger.entries import BODY_OFFSET, ENTRY_HEADER_DT, ENTRY_MAGIC, header_problem
from storelib.format.record import (
    BLANK_MAGIC,
    LINES,
    MAGIC_V1,
    MAGIC_V2,
    allocation_fails,
    blank_fits,
    magic_text,
    message_magics,
    oom_note,
    oversized_blank,
)
from storelib.scan.arrowcols import overlapping
from storelib.scan.batchdecode import BatchDecoder, ViewCache
from storelib.scan.messageschema import DLEDGER_NAMES, message_schema
from storelib.scan.recordbytes import check_at, outcome

MIN_RECORD_SIZE = 91  # IPv4/IPv4 V1 record with empty body, topic and properties
MIN_ENTRY_SIZE = BODY_OFFSET + MIN_RECORD_SIZE  # a DLedger entry holding the smallest record


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
    last_index: int | None = None  # DLedger data file: index and term of the last good entry
    last_term: int | None = None

    @property
    def segment_full(self) -> bool:
        """Did the segment end here (end-of-file record or its last byte), so the log goes on in the next?"""
        return self.kind in FULL_KINDS

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        for k in ("last_index", "last_term"):
            if d[k] is None:
                del d[k]
        return d


_PAIR = struct.Struct(">ii")
_I32 = struct.Struct(">i")

# bytes searched for record starts at a time: the bool scratch stays in a core's L2 (a 256 MB segment's
# search took 117 ms with 4 MiB, 107 ms with 1 MiB, 124 ms with 256 KiB: more calls)
CHAIN_WINDOW = 1 << 20
# rows a task's scan decodes at a time where the task consumes the batches itself (the rebuild's phase A, the
# audit's segment tasks): the memory-bound steps (size chain, header and tail gathers, CRCs, copies) then
# work on ~8 MB of records that stay in cache. Interleaved A/B on the 2.4 GB bench store, 6 rounds each:
# rebuild 0.531 (16 k) / 0.525 (8 k) / 0.514 (32 k) against 0.520 (64 k) of the floor, then 0.521 and
# 0.50 against 0.505 and 0.50; audit 0.566 and 0.52 against 0.539 and 0.51. Small, never worse. Readers
# that hand their batches on (the data source, export, messages) keep 64 k.
TASK_BATCH_ROWS = 16384
MAGIC_HEAD = 0xDA  # the first byte of both record magics, 0xDAA320A7 (V1) and 0xDAA320AB (V2)
CROWDED = 16  # a window with a 0xDA in more than one byte of this many is left to the plain walk


class ChainRun:
    """The size chain's leading run found column-wise, so per-record Python work is left to what follows
    an irregularity. A record's MAGIC sits 4 bytes after its start: every V1/V2 magic in a window of the
    segment is found with numpy, and the candidates that link to one another by TOTALSIZE from ``rel``
    are taken at once; the plain walk goes on where the run ends (a magic inside a body, a record the
    broker rejects, the window's end). Every start of the run is one the walk would reach first and pass
    (magic, size, fit), so the starts are identical by construction. Measured on 256 MB segments of
    538 k records: 0.16-0.26 s of walk -> ~0.08 s. ``v2``: a V2 magic links records (not under 4.9.8's rules)."""

    def __init__(self, v2: bool = True) -> None:
        self._scratch = np.empty(0, dtype=bool)
        self.v2 = v2

    def run(self, a: np.ndarray, rel: int, lim: int, rel_end: int, rows: int,
            head: int = 0) -> tuple[list[np.ndarray], int]:
        """Starts (relative to ``a``) of the leading run from ``rel``, at most ``rows``, in arrays, and
        where the walk goes on. ``lim``: starts must be below it; ``rel_end``: records end by it.
        ``head`` > 0: DLedger entries, the record ``head`` bytes after the start and the entry's size
        at byte 4 (what links them is checked by the caller's header rules)."""
        out: list[np.ndarray] = []
        n = 0
        i4 = overlapping(a, ">i4")
        while n < rows and rel < lim:
            lo, hi = rel + 4 + head, min(rel + 4 + head + CHAIN_WINDOW, rel_end - 3)  # MAGIC lies below rel_end
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
            tail = (last == 0xA7) | (last == 0xAB) if self.v2 else last == 0xA7
            idx = idx[(a[idx + 1] == 0xA3) & (a[idx + 2] == 0x20) & tail]
            c = idx - 4 - head if head else idx - 4
            if not len(c) or c[0] != rel:
                break
            c = c[:rows - n]
            nxt = c + (i4[c + 4] if head else i4[c])
            # what the walk checks of each record (size, fit, start before the limit), then the links
            bad = np.flatnonzero((nxt - c < MIN_RECORD_SIZE + head) | (nxt > rel_end) | (c >= lim))
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

    ``dledger``: the file is a DLedger data file (:mod:`storelib.format.dledger`): its entries are walked
    by DLedger's recovery rules (an entry failing them ends the scan, reason ``bad_entry``), the record in
    each is decoded at ``phy_offset`` = entry pos + 48, and the DLedger columns are added
    (``dledger_committed``: index <= ``committed_index`` when given). ``start`` is then an entry start,
    and ``prev_entry`` the (index, term) of the entry before it, when known, for the contiguity rules.

    ``line``: the broker line whose check judges the records, where the two differ: "4" (4.9.8: a V2
    record is an illegal magic), "5" (5.3.3: a blank record longer than the rest of the file is -1), or
    None when the line is not known (4.9.8's blank rule; V2 taken, as only 5.x writes it). ``read_body``
    False: records are judged as the reput reads them (``readBody=false``: a BODYLENGTH past TOTALSIZE
    is a length mismatch, not -1); True as recovery and every reader of messages do. ``dup_info``: 5.3.3
    recovery's checkDupInfo (duplicationEnable): a record with properties but no well-formed DUP_INFO is -1.
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
        dledger: bool = False,
        committed_index: int | None = None,
        prev_entry: tuple[int, int] | None = None,
        line: str | None = None,
        read_body: bool = True,
        dup_info: bool = False,
    ):
        if line is not None and line not in LINES:
            raise ValueError(f"line must be one of {LINES} or None, not {line!r}")
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
        self.schema = message_schema(with_body, with_properties, dledger)
        if columns is not None:
            self.schema = pa.schema([self.schema.field(c) for c in columns])
        self.end: SegmentEnd | None = None
        self.line = line
        self.read_body = read_body
        self.dup_info = dup_info
        self._magics = message_magics(line)
        self._v2 = MAGIC_V2 in self._magics
        self._chain = ChainRun(self._v2)
        self.dledger = dledger
        self.committed_index = committed_index
        self._prev = prev_entry
        self._hdr = np.zeros(0, ENTRY_HEADER_DT)  # headers of the entries the last DLedger walk found

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
        dl = self.dledger
        schema = pa.schema([f for f in self.schema if f.name not in DLEDGER_NAMES]) if dl else self.schema
        decoder = BatchDecoder(self.source, self.base, schema, verify_crc=self.verify_crc,
                               stop_on_crc=self.stop_on_crc, delay_levels_ms=self.delay_levels_ms, line=self.line,
                               read_body=self.read_body, dup_info=self.dup_info)
        walk = self._walk_dledger if dl else self._walk
        head = BODY_OFFSET if dl else 0
        while True:
            if not local and (pos - view_base + 8 > len(view) or pos + 8 > view_base + len(view)):
                view_base = pos
                view = self.source.read(pos, self.window)
            a, pbuf = views.get(view)
            stop_kind, stop_detail, starts, pos, need = walk(view, view_base, pos, a, pbuf)
            if len(starts):
                st = starts - view_base
                batch, bad, crc_bad = decoder.decode(view, view_base, st + head if dl else st, a, pbuf)
                if crc_bad is not None and len(crc_bad):
                    crc_errors += len(crc_bad)
                    if first_crc is None:
                        first_crc = self.base + view_base + int(st[crc_bad[0]]) + head
                if dl:
                    batch = self._with_entry_columns(batch)
                if bad is not None:
                    k, reason, detail, size = bad
                    if k:
                        yield batch.slice(0, k)
                    records += k
                    bad_pos = view_base + int(st[k])
                    self.end = SegmentEnd("invalid", self.file, bad_pos, self.base + bad_pos, reason, detail,
                                          size, records, crc_errors, first_crc,
                                          *(self._last_entry(k) if dl else (None, None)))
                    return
                records += batch.num_rows
                yield batch
            if need:  # the next record does not fit the current window: read a window starting at it
                if need > self.window:
                    # longer than a window (a valid record, or a damaged TOTALSIZE): the broker's check
                    # first, which reads the record's own lengths in small reads; only a record that
                    # passes it is read whole
                    chk = check_at(self.source, pos + head, self.stop_on_crc, self.line, self.read_body,
                                   self.dup_info)  # an entry's record
                    if chk.kind != "message":
                        reason, detail, size = outcome(chk)
                        self.end = SegmentEnd("invalid", self.file, pos, self.base + pos, reason, detail, size,
                                              records, crc_errors, first_crc,
                                              *(self._last_entry(None) if dl else (None, None)))
                        return
                view_base = pos
                view = self.source.read(pos, max(self.window, need))
                continue
            if stop_kind is None:
                continue
            last = self._last_entry(None) if dl else (None, None)
            if stop_kind == "invalid":
                reason, detail, size = stop_detail
                self.end = SegmentEnd("invalid", self.file, pos, self.base + pos, reason, detail, size,
                                      records, crc_errors, first_crc, *last)
            else:
                self.end = SegmentEnd(stop_kind, self.file, pos, self.base + pos, None, stop_detail, None,
                                      records, crc_errors, first_crc, *last)
            return

    # -- DLedger data files -----------------------------------------------------------------------
    def _with_entry_columns(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch with the DLedger columns of its entries (the walk's headers, one per row)."""
        h = self._hdr[: batch.num_rows]
        idx = h["index"].astype(np.int64)
        cols = {"dledger_index": pa.array(idx), "dledger_term": pa.array(h["term"].astype(np.int64)),
                "dledger_pos": pa.array(h["pos"].astype(np.int64)),
                "dledger_committed": (pa.nulls(len(h), pa.bool_()) if self.committed_index is None
                                      else pa.array(idx <= self.committed_index))}
        names = batch.schema.names
        return pa.RecordBatch.from_arrays(
            [batch.column(names.index(f.name)) if f.name in names else cols[f.name] for f in self.schema],
            schema=self.schema)

    def _last_entry(self, k: int | None) -> tuple[int | None, int | None]:
        """(index, term) of the last good entry: before row ``k`` of the last walk, or the carried one."""
        if k is not None and k > 0:
            return int(self._hdr[k - 1]["index"]), int(self._hdr[k - 1]["term"])
        if k is not None and len(self._hdr):  # row 0 of the walk failed: the entry before the walk
            return self._before_walk
        return self._prev if self._prev is not None else (None, None)

    def _entries_ok(self, a: np.ndarray, starts: np.ndarray, view_base: int, rel_end: int) -> np.ndarray:
        """Which entries at ``starts`` (relative to ``a``) pass DLedger's recovery checks and carry a
        message record that fits them (magic, TOTALSIZE == the body length)."""
        h = overlapping(a, ENTRY_HEADER_DT)[starts]
        self._hdr = h
        size = h["size"].astype(np.int64)
        idx, term = h["index"], h["term"]
        ok = (h["pos"] == self.base + view_base + starts) & (h["body_len"].astype(np.int64) + BODY_OFFSET == size)
        ok &= (starts + size <= rel_end) & (h["magic"] == ENTRY_MAGIC) & (size > BODY_OFFSET - 4)
        prev_idx = idx[0] - 1 if self._prev is None else self._prev[0]
        prev_term = term[0] if self._prev is None else self._prev[1]
        ok &= idx == np.r_[prev_idx, idx[:-1]] + 1
        ok &= term >= np.r_[prev_term, term[:-1]]
        i4 = overlapping(a, ">i4")
        rmag, rtot = i4[starts + BODY_OFFSET + 4], i4[starts + BODY_OFFSET]
        ok &= ((rmag == MAGIC_V1) | (rmag == MAGIC_V2) if self._v2 else rmag == MAGIC_V1)
        ok &= (rtot == h["body_len"]) & (rtot >= MIN_RECORD_SIZE)
        return ok

    def _walk_dledger(self, view: memoryview, view_base: int, pos: int, a: np.ndarray | None = None,
                      pbuf: pa.Buffer | None = None):
        """:meth:`_walk` for a DLedger data file: the entry size chain (column-wise run first, then one
        unpack per entry), every entry checked column-wise by :meth:`_entries_ok`, cut at the first that
        fails; why the walk stopped is told by :meth:`_dledger_stop`. ``starts`` are entry starts."""
        seg_len, stop, rows = self.seg_len, self.stop, self.batch_rows
        vend = view_base + len(view)
        rel = pos - view_base
        rel_stop = min(stop, vend) - view_base
        rel_end = min(vend, seg_len) - view_base
        lim = min(rel_stop, rel_end - BODY_OFFSET - 7)  # the header and the record's TOTALSIZE/MAGIC in view
        if a is None:
            a = np.frombuffer(view, np.uint8)
        run, rel = self._chain.run(a, rel, lim, rel_end, rows, BODY_OFFSET) if rel < lim else ([], rel)
        found = array("q")
        append = found.append
        unpack = _I32.unpack_from
        mn = MIN_ENTRY_SIZE
        for _ in range(rows - sum(len(r) for r in run)):
            if rel >= lim:
                break
            size = unpack(view, rel + 4)[0]
            if size < mn:
                break
            append(rel)
            rel += size
        starts = np.frombuffer(found, np.int64) if len(found) else np.zeros(0, np.int64)
        if run:
            starts = np.concatenate([*run, starts])
        self._before_walk = self._prev if self._prev is not None else (None, None)
        if len(starts):
            good = self._entries_ok(a, starts, view_base, rel_end)
            if not good.all():
                j = int(np.argmin(good))
                rel = int(starts[j])
                starts = starts[:j]
                self._hdr = self._hdr[:j]
            if len(starts):
                self._prev = (int(self._hdr[-1]["index"]), int(self._hdr[-1]["term"]))
        else:
            self._hdr = self._hdr[:0]
        cnt = len(starts)
        if view_base:
            starts = starts + view_base
        pos = rel + view_base
        kind, detail, need = self._dledger_stop(view, view_base, pos, cnt)
        return kind, detail, starts, pos, need

    def _dledger_stop(self, view: memoryview, view_base: int, pos: int, cnt: int):
        """Why the DLedger walk stopped at ``pos``: (kind, detail, bytes needed in a new window)."""
        seg_len, stop = self.seg_len, self.stop
        if pos >= stop and stop < seg_len:
            return "split_end", None, 0
        if cnt >= self.batch_rows:
            return None, None, 0
        left = seg_len - pos
        if left < 4:  # DLedger's getInt of the next magic underflows: its recovery stops at this file
            return "invalid", ("truncated", f"{left} bytes left in the file: no room for an entry or a "
                               "blank filler (DLedger's recovery stops here)", None), 0
        want = min(left, BODY_OFFSET + 8)
        if pos + want > view_base + len(view):
            return None, None, (0 if cnt else want)
        rel = pos - view_base
        magic = _I32.unpack_from(view, rel)[0]
        if magic == DL_BLANK:
            rest = _I32.unpack_from(view, rel + 4)[0] if left >= 8 else None
            note = "" if rest == left else f" (its length field says {rest}, {left} bytes are left)"
            return "blank", f"blank filler, {left} bytes to the end of the file{note}", 0
        if left < 8:
            return "invalid", ("truncated", f"{left} bytes left in the file: no room for an entry header", None), 0
        size = _I32.unpack_from(view, rel + 4)[0]
        if size == 0:
            what = "zeros: nothing written here" if magic == 0 else f"entry size 0 (magic {magic}): DLedger stops here"
            return "end_of_data", what, 0
        if left < BODY_OFFSET:
            return "invalid", ("truncated", f"an entry header needs {BODY_OFFSET} bytes, {left} left in the file",
                               None), 0
        m, size, index, term, p, _, _, _, blen = struct.unpack_from(">iiqqqiiii", view, rel)
        why = header_problem(m, size, p, blen, self.base + pos, left)
        if why is None and self._prev is not None and index != self._prev[0] + 1:
            why = f"index {index} does not follow {self._prev[0]}"
        if why is None and self._prev is not None and term < self._prev[1]:
            why = f"term {term} is lower than the previous entry's {self._prev[1]}"
        if why is not None:
            return "invalid", ("bad_entry", f"DLedger's recovery stops here: {why}", None), 0
        rtot, rmag = _PAIR.unpack_from(view, rel + BODY_OFFSET)
        if rmag not in self._magics:
            return "invalid", ("bad_magic", f"the entry's record has magic {magic_text(rmag, self.line)}, TOTALSIZE "
                               f"{rtot}", None), 0
        if allocation_fails(rtot, left - BODY_OFFSET, self.line):  # DLedgerCommitLog's check catches Throwable
            return "invalid", ("bad_size", f"{oom_note(rtot)}, but DLedgerCommitLog's check catches Throwable "
                               "(4.9.8 :366, 5.3.3 :518): -1", None), 0
        if rtot != blen:
            return "invalid", ("length_mismatch", f"record TOTALSIZE {rtot} != the entry's body length {blen}",
                               rtot if rtot > 0 else None), 0
        if rtot < MIN_RECORD_SIZE:
            return "invalid", ("bad_size", f"TOTALSIZE {rtot} (a record is at least {MIN_RECORD_SIZE} bytes)", None), 0
        return None, None, (0 if cnt else size)  # a good entry that does not fit the window

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
            good = (magic == MAGIC_V1) | (magic == MAGIC_V2) if self._v2 else magic == MAGIC_V1
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
        if magic == MAGIC_V1 or magic == MAGIC_V2 and self._v2:
            if MIN_RECORD_SIZE <= total <= left:  # does not fit the window: the caller reads (bounded)
                return None, None, starts, pos, (0 if len(starts) else total)
            # too small to be a record, or past the segment: the broker's outcome (-1, or TOTALSIZE for a
            # length mismatch), by the scalar check
            chk = check_at(self.source, pos, self.stop_on_crc, self.line, self.read_body, self.dup_info)
            return "invalid", outcome(chk), starts, pos, 0
        if magic == BLANK_MAGIC:
            if blank_fits(total, left, self.line):
                return "blank", f"blank record, TOTALSIZE {total}", starts, pos, 0
            return "invalid", ("bad_size", oversized_blank(total, left), None), starts, pos, 0
        if total == 0 and magic == 0:
            return "end_of_data", "zeros: no record written here", starts, pos, 0
        return "invalid", ("bad_magic", f"magic {magic_text(magic, self.line)}, TOTALSIZE {total}", None), starts, pos, 0


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
