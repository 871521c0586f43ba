"""What DLedger's recovery learns from one data file, computed where the file is scanned (a walk task).

DLedgerMmapFileStore.recover (DLedger 0.3.1.2, /work/notes/dledger.md §5) walks entry headers only: the
record inside an entry is never checked, so it keeps entries the record scan (the reput's view) stops
at. Per data file a walk task therefore gives, besides its :class:`SegmentEnd`, the file's
:class:`FileFacts`: the start-file check of the entry at byte 0 (header and its index unit), the
entries DLedger's header walk accepts from byte 0 (first and last index/term, where and why it stops),
the first entry whose index unit differs from it, and the record at byte 48 (5.3.3's start-file probe).
The header walk reuses the scan's entry columns and goes on in Python only past the scan's end (a bad
record whose header is fine), so an intact file costs one vectorised index comparison.
:mod:`storelib.broker.recovery.dledgerwalk` combines the files' facts in the broker's order.
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location
from storelib.format.dledger.entries import (
    BLANK_MAGIC,
    BODY_OFFSET,
    DEFAULT_INDEX_FILE_SIZE,
    HEADER_SIZE,
    INDEX_UNIT_DT,
    INDEX_UNIT_SIZE,
    NOT_A_FILLER,
    first_entry_drops_index,
    first_entry_problem,
    header_problem,
)
from storelib.format.record import BORNHOST_V6_FLAG
from storelib.scan.commitlog import Segment, list_files
from storelib.scan.scanner import SegmentEnd

FACT_COLUMNS = ("size", "dledger_index", "dledger_term", "dledger_pos")
_HDR = struct.Struct(">iiqqqiiii")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_WINDOW = 1 << 20
_LONG = 1 << 63


# ---------------------------------------------------------------------------------------------
# the index file list (MmapFileList over dledger-<id>/index)


@dataclass(frozen=True)
class IndexFiles:
    """The index file list as DLedger loads it (picklable: shipped to walk tasks with the plan)."""

    files: tuple[Segment, ...] = ()
    file_size: int = DEFAULT_INDEX_FILE_SIZE
    findings: tuple[Finding, ...] = ()

    def file_for(self, offset: int) -> Segment | None:
        """The file holding byte ``offset`` of the list (findMappedFileByOffset), or None."""
        if offset < 0:
            return None
        base = offset - offset % self.file_size
        return next((f for f in self.files if f.base == base), None)

    def units(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Units ``first .. first+count-1`` as INDEX_UNIT_DT and a mask of those some file holds."""
        out = np.zeros(count, INDEX_UNIT_DT)
        have = np.zeros(count, bool)
        if count <= 0 or first < 0 or (first + count) * INDEX_UNIT_SIZE >= _LONG:
            return out, have
        F = self.file_size
        lo, hi = first * INDEX_UNIT_SIZE, (first + count) * INDEX_UNIT_SIZE
        pos = lo
        while pos < hi:
            base = pos - pos % F
            n = min(hi, base + F) - pos
            f = self.file_for(pos)
            if f is not None:
                with f.open() as src:
                    raw = bytes(src.read(pos - base, n))
                k = len(raw) // INDEX_UNIT_SIZE
                i = (pos - lo) // INDEX_UNIT_SIZE
                out[i: i + k] = np.frombuffer(raw[: k * INDEX_UNIT_SIZE], INDEX_UNIT_DT)
                have[i: i + k] = True
            pos += n
        return out, have


def valid_index_size(n: int) -> bool:
    """An index file size a DLedger node of ours can be configured with (DLedger's 160 MiB, or a power of two
    of at least one unit): what :func:`configured_index_size` reads back, and the generator accepts."""
    return n == DEFAULT_INDEX_FILE_SIZE or (n >= INDEX_UNIT_SIZE and n & (n - 1) == 0)


def configured_index_size(files: list[Segment]) -> int:
    """DLedgerConfig.mappedFileSizeForEntryIndex of the node that wrote ``files``: 160 MiB on every RocketMQ
    broker (neither 4.9.8 nor 5.3.3 sets it), so a file of another size stops its load. rmqstore's generator
    and test writers configure smaller power-of-two sizes: the spacing of the files' names (checkSelf's rule),
    else their common size, is taken when it is such a size; anything else reads as 160 MiB."""
    ok = valid_index_size
    gaps = {b.base - a.base for a, b in zip(files, files[1:])}
    if len(gaps) == 1 and ok(g := gaps.pop()):
        return g
    sizes = [f.file_size for f in files if ok(f.file_size)]
    return max(set(sizes), key=sizes.count) if sizes else DEFAULT_INDEX_FILE_SIZE


def list_index_files(loc: Location, folder: str, file_size: int | None = None) -> IndexFiles:
    """``dledger-<id>/index`` as MmapFileList.load reads it: every file, by name, each of the configured size
    (:func:`configured_index_size` unless ``file_size`` says). What would make DLedger's load fail is a finding."""
    found: list[Finding] = []
    files: list[Segment] = []
    try:
        infos = list_files(loc)
    except StoreError as e:
        return IndexFiles((), file_size or DEFAULT_INDEX_FILE_SIZE, (Finding(e.kind, "error", folder, None, e.detail),))
    for info in infos:
        rel = f"{folder}/{info.base_name}"
        name = info.base_name
        if info.type != pafs.FileType.File or not (name.isascii() and name.isdigit()) or int(name) >= _LONG:
            found.append(Finding("dledger_load_fails", "critical", rel, None,
                                 "not a DLedger index file (DLedger's load maps every entry of the folder and fails "
                                 "on this one, so the broker does not start)"))
            continue
        files.append(Segment(int(info.base_name), info.base_name, loc.join(info.base_name), int(info.size or 0),
                             None, folder))
    files.sort(key=lambda s: s.base)
    F = file_size or configured_index_size(files)
    return IndexFiles(tuple(files), F, tuple(found) + tuple(_list_problems(files, F, "index file")))


def _list_problems(files: list[Segment] | tuple[Segment, ...], F: int, what: str) -> list[Finding]:
    """MmapFileList.load's size rule (System.exit(-1) on a file of another size) and checkSelf's order rule
    (consecutive files one file size apart, else DISK_ERROR and the broker's load fails)."""
    out = []
    for i, f in enumerate(files):
        if f.file_size != F:
            out.append(Finding("dledger_load_fails", "critical", f.display, min(f.file_size, F),
                               f"{f.file_size} bytes, not the {F} every {what} must have (MmapFileList.doLoad): "
                               "DLedger's load stops the JVM (System.exit(-1))", {"size": f.file_size, "expected": F}))
        if i and f.base - files[i - 1].base != F:
            out.append(Finding("dledger_load_fails", "critical", f.display, None,
                               f"follows {files[i - 1].name} at {f.base - files[i - 1].base} bytes, not {F}: "
                               f"DLedger's checkSelf fails with DISK_ERROR and the broker's load fails"))
    return out


def data_list_problems(segments: tuple[Segment, ...] | list[Segment], F: int, findings: list[Finding]) -> list[Finding]:
    """The data list's load rules over the loaded files, plus names DLedger cannot map (from the lister's
    findings: every entry of the folder is mapped, a non-numeric name throws)."""
    out = [Finding("dledger_load_fails", "critical", f.file, None,
                   "DLedger's load maps every entry of the data folder and fails on this one, so the broker does "
                   "not start") for f in findings if f.kind in ("bad_segment_name", "unexpected_directory")]
    return out + _list_problems(segments, F, "data file")


# ---------------------------------------------------------------------------------------------
# one file's facts


@dataclass(frozen=True)
class FileFacts:
    """DLedger's view of one data file, from byte 0 with no entry before it (the walk's combination adds the
    file-to-file rules). ``start_problem``: why the entry at byte 0 fails the start-file check (None: it
    passes); ``head_index``: the index field at byte 0, as reviseLedgerBeginIndex reads it unchecked;
    ``first``/``last``: (index, term) of the first and last entry the header walk accepts; ``end_*``:
    where it stops and why (``blank``, ``end_of_data``, ``invalid``); ``index_mismatch``: (index, file
    offset, why) of the first accepted entry whose index unit differs; ``record_magic``/``record_time``:
    the record at byte 48 (5.3.3's isMmapFileMatchedRecover); ``from_offset``: where the facts begin (0
    unless the task scanned a tail only: then they are partial); ``drops_index``: the walk stops at this
    file's first entry, whose negative index deletes every index file if it is the first entry recover()
    walks (:func:`storelib.format.dledger.entries.first_entry_problem`)."""

    start_problem: str | None
    head_index: int | None
    entries: int
    first: tuple[int, int] | None
    last: tuple[int, int] | None
    end_kind: str
    end_offset: int
    end_detail: str | None
    index_mismatch: tuple[int, int, str] | None
    record_magic: int | None
    record_time: int | None
    from_offset: int = 0
    drops_index: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> FileFacts:
        d = dict(d)
        for k in ("first", "last", "index_mismatch"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        return cls(**d)


@dataclass
class DLedgerEnd(SegmentEnd):
    """A DLedger data file's scan end with the file's :class:`FileFacts` (None: a plain end, e.g. read back
    from an older manifest; the walk then takes the scan's end for DLedger's)."""

    facts: FileFacts | None = None

    def to_dict(self) -> dict:
        d = super().to_dict()
        d.pop("facts", None)
        if self.facts is not None:
            d["dledger_facts"] = self.facts.to_dict()
        return d


def join_ends(head: SegmentEnd, tail: SegmentEnd) -> SegmentEnd:
    """A data file scanned in two parts (an incremental export goes on where the last run's cut stopped): the
    tail's end with facts from byte 0: the head's first entry, entry count and first differing unit, the tail's
    last entry and stop (byte 0's start check and index are read by every part). ``tail`` as it is when the
    parts do not join (no facts, or the tail did not start where the head's facts end)."""
    h = head.facts if isinstance(head, DLedgerEnd) else None
    t = tail.facts if isinstance(tail, DLedgerEnd) else None
    if h is None or t is None or h.from_offset != 0 or t.from_offset != h.end_offset or h.end_kind != "end_of_data":
        return tail
    facts = replace(t, entries=h.entries + t.entries, first=h.first or t.first, last=t.last or h.last,
                    index_mismatch=h.index_mismatch or t.index_mismatch, from_offset=0,
                    drops_index=t.drops_index and h.last is None)
    return replace(tail, facts=facts)


def end_from_dict(d: dict) -> SegmentEnd:
    """A :class:`SegmentEnd` (or :class:`DLedgerEnd`) back from its ``to_dict``."""
    d = dict(d)
    facts = d.pop("dledger_facts", None)
    if facts is None:
        return SegmentEnd(**d)
    return DLedgerEnd(**d, facts=FileFacts.from_dict(facts))


@dataclass
class HeaderWalk:
    """Entries a header-only walk accepted (arrays) and why it stopped."""

    index: list[int] = field(default_factory=list)
    term: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    end_kind: str = "invalid"
    end_offset: int = 0
    end_detail: str | None = None
    drops_index: bool = False  # stopped at a first entry with a negative index (see FileFacts)


def walk_headers(source, base: int, start: int, prev: tuple[int, int] | None, *,
                 limit: int | None = None) -> HeaderWalk:
    """DLedgerMmapFileStore.recover's loop over one file from ``start`` (an entry start), headers only, in its
    order: -1 magic (a blank: next file), size 0 (end), a header that cannot be read, then pos, size/body,
    fit, magic, contiguity with ``prev``, term, size > 44. Python per entry: the scan's columns cover the
    run up to its end, this goes on past a bad record (rare). ``limit``: stop before this many entries."""
    w = HeaderWalk()
    n = source.size
    pos = start
    buf, at = memoryview(b""), 0
    while limit is None or len(w.index) < limit:
        w.end_offset = pos
        left = n - pos
        if pos + min(left, BODY_OFFSET) > at + len(buf):
            at, buf = pos, source.read(pos, min(_WINDOW, left))
        rel = pos - at
        if left < 4:
            w.end_detail = f"{left} bytes left in the file: reading the next magic underflows"
            return w
        magic = _I32.unpack_from(buf, rel)[0]
        if magic == BLANK_MAGIC:
            w.end_kind, w.end_detail = "blank", f"blank filler, {left} bytes to the end of the file"
            rest = _I32.unpack_from(buf, rel + 4)[0] if left >= 8 else left
            if rest != left:  # the scanner's wording: a -1 magic that is no filler DLedger wrote
                w.end_detail += f" ({NOT_A_FILLER} {rest}, {left} bytes are left)"
            return w
        if left < 8:
            w.end_detail = f"{left} bytes left in the file: reading the entry size underflows"
            return w
        size = _I32.unpack_from(buf, rel + 4)[0]
        if size == 0:
            w.end_kind, w.end_detail = "end_of_data", "entry size 0: the end of the data"
            return w
        if left < BODY_OFFSET:
            w.end_detail = f"an entry header needs {BODY_OFFSET} bytes, {left} left in the file"
            return w
        m, size, index, term, p, _, _, _, blen = _HDR.unpack_from(buf, rel)
        why = header_problem(m, size, p, blen, base + pos, left)
        if why is None and prev is not None and index != prev[0] + 1:
            why = f"index {index} does not follow {prev[0]}"
        if why is None and prev is not None and term < prev[1]:
            why = f"term {term} is lower than the previous entry's {prev[1]}"
        if why is None and prev is None:
            why = first_entry_problem(index, term)
            w.drops_index = why is not None and first_entry_drops_index(index, term)
        if why is not None:
            w.end_detail = why
            return w
        w.index.append(index)
        w.term.append(term)
        w.pos.append(base + pos)
        w.size.append(size)
        prev = (index, term)
        pos += size
    return w


def start_problem(head: bytes, base: int, index_files: IndexFiles) -> str | None:
    """The start-file check of recover() on the entry at byte 0 (magic not -1 and >= 1, size > 44, pos = the
    file's start, body + 48 = size, and its index unit equal in magic, size, index, term and pos)."""
    if len(head) < BODY_OFFSET:
        return f"only {len(head)} bytes: no entry header"
    magic, size, index, term, pos, _, _, _, blen = _HDR.unpack_from(head, 0)
    if magic == BLANK_MAGIC or magic < 1:
        return f"magic {magic}"
    if size <= HEADER_SIZE:
        return f"size {size} should be > {HEADER_SIZE}"
    if pos != base:
        return f"pos {pos} != the file's start {base}"
    if blen + BODY_OFFSET != size:
        return f"size {size} != body length {blen} + {BODY_OFFSET}"
    u, have = index_files.units(index, 1)
    if not have[0]:
        return f"no index file holds unit {index}"
    got = (int(u[0]["magic"]), int(u[0]["size"]), int(u[0]["index"]), int(u[0]["term"]), int(u[0]["pos"]))
    for name, a, b in zip(("magic", "size", "index", "term", "pos"), got, (magic, size, index, term, base)):
        if a != b:
            return f"index unit {name} {a} != {b}"
    return None


def unit_mismatches(index_files: IndexFiles, idx: np.ndarray, term: np.ndarray, pos: np.ndarray,
                    size: np.ndarray) -> tuple[int, str] | None:
    """The first of these entries (contiguous indexes) whose unit is not (1, pos, size, index, term), with why."""
    if not len(idx):
        return None
    u, have = index_files.units(int(idx[0]), len(idx))
    bad = ~have | (u["magic"] != 1) | (u["pos"] != pos) | (u["size"] != size) | (u["index"] != idx) | \
        (u["term"] != term)
    if not bad.any():
        return None
    k = int(np.argmax(bad))
    if not have[k]:
        return k, f"no index file holds unit {int(idx[k])}"
    for name, a, b in (("magic", u["magic"][k], 1), ("size", u["size"][k], size[k]), ("index", u["index"][k], idx[k]),
                       ("term", u["term"][k], term[k]), ("pos", u["pos"][k], pos[k])):
        if int(a) != int(b):
            return k, f"index unit {name} {int(a)} != entry {name} {int(b)}"
    return k, "index unit differs"  # pragma: no cover - one field always differs


class FactsBuilder:
    """Collects a DLedger data file's facts from the scan batches of a walk task (the entry columns, each
    batch's units compared as it comes: memory is a batch), then finishes them past the scan's end
    (:meth:`finish`)."""

    def __init__(self, base: int, index_files: IndexFiles, start: int = 0, limit: int | None = None,
                 cut: bool = False):
        self.base, self.index_files, self.start = base, index_files, start  # the data file's start offset
        self.limit = limit  # a run's cut in this file (a live store): nothing after it is read
        self.cut = cut  # ``limit`` is a live store's cut (not a split's end): see :meth:`_unit_in_flight`
        self.entries = 0
        self.first: tuple[int, int] | None = None
        self.last: tuple[int, int] | None = None
        self.mismatch: tuple[int, int, str] | None = None
        self.bad_first: HeaderWalk | None = None  # the first entry fails the first-entry rules: the walk ends there

    def _take(self, idx: np.ndarray, term: np.ndarray, pos: np.ndarray, size: np.ndarray) -> None:
        if not len(idx) or self.bad_first is not None:
            return
        if self.first is None:
            # the scan (a reader's view) does not hold a file's first entry to recover()'s start values: checked here
            why = first_entry_problem(int(idx[0]), int(term[0]))
            if why is not None:
                self.bad_first = HeaderWalk(end_offset=int(pos[0]) - self.base, end_detail=why,
                                            drops_index=first_entry_drops_index(int(idx[0]), int(term[0])))
                return
            self.first = (int(idx[0]), int(term[0]))
        self.last = (int(idx[-1]), int(term[-1]))
        self.entries += len(idx)
        if self.mismatch is None:
            m = unit_mismatches(self.index_files, idx, term, pos, size)
            if m is not None:
                self.mismatch = (int(idx[m[0]]), int(pos[m[0]]) - self.base, m[1])

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            rsize, idx, term, pos = (np.asarray(batch.column(c), np.int64) for c in FACT_COLUMNS)
            self._take(idx, term, pos, rsize + BODY_OFFSET)

    def finish(self, source, end: SegmentEnd) -> DLedgerEnd:
        """The scan's end with the file's facts (reads byte 0's header and record, and the headers past the
        scan's end until DLedger's walk stops)."""
        if self.bad_first is not None:
            tail = self.bad_first
        elif self.limit is not None and end.file_offset >= self.limit:  # the run's cut: written since
            tail = HeaderWalk(end_kind="end_of_data", end_offset=end.file_offset,
                              end_detail="the run's cut: what was written after it is not read")
        else:
            tail = walk_headers(source, self.base, end.file_offset, self.last)
        self._take(*(np.asarray(x, np.int64) for x in (tail.index, tail.term, tail.pos, tail.size)))
        if self._unit_in_flight(end):
            self.mismatch = None
        head = bytes(source.read(0, min(source.size, BODY_OFFSET + 80)))
        magic, ts = _record_probe(head)
        facts = FileFacts(
            start_problem=start_problem(head, self.base, self.index_files),
            head_index=_I64.unpack_from(head, 8)[0] if len(head) >= 16 else None,
            entries=self.entries, first=self.first, last=self.last,
            end_kind=tail.end_kind, end_offset=tail.end_offset, end_detail=tail.end_detail,
            index_mismatch=self.mismatch, record_magic=magic, record_time=ts, from_offset=self.start,
            drops_index=tail.drops_index and self.last is None)
        return DLedgerEnd(**end.__dict__, facts=facts)


    def _unit_in_flight(self, end: SegmentEnd) -> bool:
        """Is the first unit that differs that of the last entry before a live store's cut, and not written
        yet (no file holds it, or all zeros)? DLedgerMmapFileStore.appendAsLeader (0.3.1.2 :353-372) appends
        one entry at a time under one lock, its data then its unit: only that entry's unit can be in flight."""
        if not (self.cut and self.mismatch is not None and self.last is not None and self.limit is not None
                and end.file_offset >= self.limit and self.mismatch[0] == self.last[0]):
            return False
        u, have = self.index_files.units(self.mismatch[0], 1)
        return not have[0] or not u.tobytes().strip(b"\0")


def _record_probe(head: bytes) -> tuple[int | None, int | None]:
    """(magic, store timestamp) of the record at byte 48 as 5.3.3's isMmapFileMatchedRecover reads them."""
    r = BODY_OFFSET
    if len(head) < r + 40:
        return None, None
    magic = _I32.unpack_from(head, r + 4)[0]
    sysflag = _I32.unpack_from(head, r + 36)[0]
    at = r + 56 + (12 if sysflag & BORNHOST_V6_FLAG else 0)
    return magic, (_I64.unpack_from(head, at)[0] if len(head) >= at + 8 else None)


__all__ = ["FACT_COLUMNS", "DLedgerEnd", "FactsBuilder", "FileFacts", "HeaderWalk", "IndexFiles",
           "configured_index_size", "data_list_problems", "end_from_dict", "join_ends", "list_index_files", "start_problem", "unit_mismatches",
           "walk_headers"]
