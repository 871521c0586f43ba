"""One IndexFile (``index/yyyyMMddHHmmssSSS``): layout, geometry, header, reader, validity checks.

Layout (store-format.md §5): a 40-byte header, a slot table of ``hash_slot_num`` big-endian i32 (entry
number of the newest entry of each slot), then ``index_num`` 20-byte entries (entry 0 never used).
The geometry is not stored in the file, so every reader is given it (or infers one number from the
file size).

Two builders produce the same bytes (store-algorithms.md §6, §7.4), sharing the chain and timeDiff
helpers here:

* :func:`storelib.broker.index.indexbuild.build_index_files` — the vectorised rebuild used by the jobs: every
  entry's file number, entry number, timeDiff, prevIndex, slot table and header come from column
  operations (a stable sort by ``(file, slot)`` gives the prevIndex chains), no per-entry Python.
* ``IndexFileWriter`` / ``ScalarIndexService`` (tests/index_oracle.py) — a step-by-step transcription of the
  broker's ``putKey`` / ``buildIndex``, kept in tests/index_oracle.py as an independent oracle.

The ``index/`` directory (listing, file names, the query across files): :mod:`storelib.format.indexdir`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import ByteSource, LocalSource, Location, data_ranges, open_source, resolve
from storelib.format.javahash import index_hash

HEADER_SIZE = 40
SLOT_SIZE = 4
ENTRY_SIZE = 20
DEFAULT_HASH_SLOT_NUM = 5_000_000
DEFAULT_INDEX_NUM = 20_000_000
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
TRAN_ROLLBACK = 3

_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")
_I32 = struct.Struct(">i")

#: One on-disk entry (20 bytes, no padding), big-endian as stored.
ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev_index", ">i4")])
assert ENTRY_DTYPE.itemsize == ENTRY_SIZE


# --------------------------------------------------------------------------------------------------
# geometry and header
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexGeometry:
    """``maxHashSlotNum`` / ``maxIndexNum`` of the broker that wrote the files (not stored in them)."""

    hash_slot_num: int = DEFAULT_HASH_SLOT_NUM
    index_num: int = DEFAULT_INDEX_NUM

    def __post_init__(self) -> None:
        if self.hash_slot_num <= 0 or self.index_num <= 1:
            raise ValueError(f"bad index geometry {self.hash_slot_num}/{self.index_num}")

    @property
    def file_size(self) -> int:
        return HEADER_SIZE + SLOT_SIZE * self.hash_slot_num + ENTRY_SIZE * self.index_num

    @property
    def entries_offset(self) -> int:
        """Byte position of entry 0 (entry n is at ``entries_offset + 20 n``)."""
        return HEADER_SIZE + SLOT_SIZE * self.hash_slot_num

    @property
    def entries_per_file(self) -> int:
        """Usable entries per file: ``indexNum - 1`` (entry 0 is never written)."""
        return self.index_num - 1

    def slot_pos(self, slot: int) -> int:
        return HEADER_SIZE + SLOT_SIZE * slot

    def entry_pos(self, n: int) -> int:
        return self.entries_offset + ENTRY_SIZE * n

    @classmethod
    def infer(
        cls,
        file_size: int,
        *,
        hash_slot_num: int | None = None,
        index_num: int | None = None,
        file: str | None = None,
    ) -> IndexGeometry:
        """The geometry of a file of ``file_size`` bytes given one (or both) of the two numbers.

        With neither given the broker defaults are assumed. A size that no geometry with the given
        number explains is a ``bad_size`` StoreError naming the file.
        """
        if hash_slot_num is None and index_num is None:
            hash_slot_num, index_num = DEFAULT_HASH_SLOT_NUM, DEFAULT_INDEX_NUM
        rest = file_size - HEADER_SIZE
        if hash_slot_num is not None and index_num is None:
            left = rest - SLOT_SIZE * hash_slot_num
            if left > ENTRY_SIZE and left % ENTRY_SIZE == 0:
                index_num = left // ENTRY_SIZE
        elif index_num is not None and hash_slot_num is None:
            left = rest - ENTRY_SIZE * index_num
            if left > 0 and left % SLOT_SIZE == 0:
                hash_slot_num = left // SLOT_SIZE
        if hash_slot_num is None or index_num is None:
            raise StoreError(
                file, None, "bad_size",
                f"size {file_size} fits no index geometry with hashSlotNum={hash_slot_num} indexNum={index_num}",
            )
        geo = cls(hash_slot_num, index_num)
        geo.check_size(file_size, file)
        return geo

    def check_size(self, file_size: int, file: str | None = None) -> None:
        """Raise a StoreError unless a file of ``file_size`` bytes has this geometry."""
        if file_size < HEADER_SIZE:
            raise StoreError(file, file_size, "truncated", f"{file_size} bytes, shorter than the 40-byte header")
        if file_size != self.file_size:
            kind = "truncated" if file_size < self.file_size else "bad_size"
            raise StoreError(
                file, min(file_size, self.file_size), kind,
                f"size {file_size} != {self.file_size} for hashSlotNum={self.hash_slot_num} indexNum={self.index_num}",
            )


@dataclass
class IndexHeader:
    """The 40-byte header (store-format.md §5.3)."""

    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 0

    @classmethod
    def from_bytes(cls, buf: bytes | memoryview, file: str | None = None) -> IndexHeader:
        if len(buf) < HEADER_SIZE:
            raise StoreError(file, len(buf), "truncated", f"index header needs 40 bytes, got {len(buf)}")
        return cls(*_HEADER.unpack_from(buf, 0))

    def to_bytes(self) -> bytes:
        return _HEADER.pack(
            self.begin_timestamp, self.end_timestamp, self.begin_phy_offset, self.end_phy_offset,
            self.hash_slot_count, self.index_count,
        )

    @property
    def loaded_index_count(self) -> int:
        """indexCount as the broker's loader sees it (``<= 0`` read as 1)."""
        return max(self.index_count, 1)


# --------------------------------------------------------------------------------------------------
# reader
# --------------------------------------------------------------------------------------------------


def index_time_diff(t: int, begin: int) -> int:
    """store-format.md §5.9 for one entry (Java long arithmetic, truncating division, clamping)."""
    x = ((t - begin + 2**63) % 2**64) - 2**63  # Java long wrap-around
    d = 0 if x < 0 else x // 1000  # negative results are clamped to 0 anyway
    if begin <= 0:
        return 0
    return min(d, INT_MAX)


def entry_bytes(entries: np.ndarray) -> memoryview | bytes:
    """The on-disk bytes of index entries, without a copy when they already are contiguous ENTRY_DTYPE."""
    e = np.asarray(entries)
    if e.dtype == ENTRY_DTYPE and e.flags.c_contiguous:
        return memoryview(e.view(np.uint8))
    return np.asarray(e, dtype=ENTRY_DTYPE).tobytes()


def index_time_diffs(t: np.ndarray, begin: int) -> np.ndarray:
    """Vectorised :func:`index_time_diff` of many store times against one beginTimestamp, as int32."""
    if begin <= 0:
        return np.zeros(len(t), dtype=np.int32)
    x = t - np.int64(begin)  # int64 arrays wrap like Java longs
    np.maximum(x, 0, out=x)  # in place: one temporary instead of four (tens of millions of keys)
    np.floor_divide(x, 1000, out=x)
    np.minimum(x, INT_MAX, out=x)
    return x.astype(np.int32)


def time_matched(file_begin: int, file_end: int, begin: int, end: int) -> bool:
    """IndexFile.isTimeMatched: does [file_begin, file_end] overlap the query range (§10.3 2b)."""
    return (
        (begin < file_begin and end > file_end)
        or file_begin <= begin <= file_end
        or file_begin <= end <= file_end
    )


class _FirstOf:
    """A check's hits over chunks: how many, the first one (0-based entry) and a value at it."""

    def __init__(self) -> None:
        self.count = 0
        self.first = -1
        self.value: int | None = None

    def add(self, hits: np.ndarray, lo: int, values: np.ndarray | None = None) -> None:
        if len(hits) and self.count == 0:
            self.first = lo + int(hits[0])
            self.value = int(values[hits[0]]) if values is not None else None
        self.count += len(hits)

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class ProvenChains:
    """What a proof that every entry's prevIndex is the previous entry of its slot
    (storelib.checks.index.proven_chains) also establishes, so :meth:`IndexFile.validate` need not walk the
    entries again: no prevIndex is newer than its entry or in another slot, the newest entry of every
    slot, and the entries with a negative keyHash."""

    newest: np.ndarray  # int32 per slot (hash_slot_num of them, then one for negative keyHashes)
    negatives: int
    first_negative: int  # 0-based entry, -1 when none


class IndexFile:
    """Read-only view of one index file over a :mod:`storelib.fileio.bytesource` source.

    Sizes read from the file (indexCount, slot values, prevIndex) are never trusted for allocation
    or reading: everything is bounded by the geometry, which is checked against the real file size.
    With ``strict`` a header that contradicts the geometry raises; auditors pass ``strict=False``
    and call :meth:`validate`.
    """

    def __init__(
        self,
        source: ByteSource,
        geometry: IndexGeometry | None = None,
        *,
        hash_slot_num: int | None = None,
        index_num: int | None = None,
        name: str | None = None,
        strict: bool = True,
        at: bytes | None = None,
    ):
        self.source = source
        self.path = source.path
        self.name = name if name is not None else os.path.basename(source.path.rstrip("/"))
        if geometry is None:
            geometry = IndexGeometry.infer(
                source.size, hash_slot_num=hash_slot_num, index_num=index_num, file=self.path
            )
        else:
            geometry.check_size(source.size, self.path)
        self.geometry = geometry
        # ``at``: the 40 header bytes as a run's cut read them from a file a broker is still writing;
        # then the file is read as it stood then (:meth:`slots`, :meth:`slot_value`, the tail check)
        self.at_cut = at is not None
        self.header = IndexHeader.from_bytes(at if at is not None else self._read(0, HEADER_SIZE), self.path)
        if strict:
            self._check_header_strict()

    @classmethod
    def open(
        cls,
        where: str | os.PathLike | Location,
        geometry: IndexGeometry | None = None,
        *,
        size: int | None = None,
        **kw: Any,
    ) -> IndexFile:
        """Open a local path, URI or Location."""
        loc = where if isinstance(where, Location) else resolve(where)
        return open_owned(cls, open_source(loc, size), geometry, **kw)

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> IndexFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, offset: int, length: int) -> memoryview:
        buf = self.source.read(offset, length)
        if len(buf) != length:
            raise StoreError(self.path, offset + len(buf), "truncated", f"wanted {length} bytes at {offset}")
        return buf

    def _check_header_strict(self) -> None:
        h, g = self.header, self.geometry
        if h.index_count < 0 or h.index_count > g.index_num:
            raise StoreError(
                self.path, 36, "bad_header", f"indexCount {h.index_count} outside 0..{g.index_num}"
            )
        if h.hash_slot_count < 0 or h.hash_slot_count > min(g.hash_slot_num, max(h.index_count - 1, 0)):
            raise StoreError(
                self.path, 32, "bad_header",
                f"hashSlotCount {h.hash_slot_count} impossible with indexCount {h.index_count}"
                f" and {g.hash_slot_num} slots",
            )

    # -- raw regions ---------------------------------------------------------------------------

    @property
    def index_count(self) -> int:
        """indexCount as loaded by the broker (``<= 0`` → 1), bounded by the geometry."""
        return min(self.header.loaded_index_count, self.geometry.index_num)

    @property
    def entry_count(self) -> int:
        """Number of used entries (1 .. indexCount-1)."""
        return self.index_count - 1

    def slots(self) -> np.ndarray:
        """The whole slot table as ``>i4`` (zero-copy for local files; as at the cut: :meth:`_as_at_cut`)."""
        g = self.geometry
        slots = np.frombuffer(self._read(HEADER_SIZE, SLOT_SIZE * g.hash_slot_num), dtype=">i4")
        return self._as_at_cut(slots) if self.at_cut else slots

    def slot_value(self, slot: int) -> int:
        v = _I32.unpack(self._read(self.geometry.slot_pos(slot), SLOT_SIZE))[0]
        return int(self._as_at_cut(np.array([v], dtype=">i4"))[0]) if self.at_cut else v

    def _as_at_cut(self, slots: np.ndarray) -> np.ndarray:
        """Slot values as they were when the cut read the header: a slot the broker pointed at a newer
        entry since (IndexFile.putKey writes the entry, then the slot, then the header) is followed back
        through the entries' prevIndex (each holds the slot's value before it) until it is older than the
        cut's indexCount. Values outside the geometry are left for :meth:`validate` to report."""
        ic, cap = self.index_count, self.geometry.index_num
        out = slots.astype(np.int32)
        todo = np.flatnonzero((out >= ic) & (out < cap))
        while len(todo):
            v = out[todo]
            prev = np.array([self.entry(int(n))[3] for n in v.tolist()], dtype=np.int32)
            prev = np.where((prev >= 0) & (prev < v), prev, 0)  # a chain that does not go back: ends
            out[todo] = prev
            todo = todo[prev >= ic]
        return out

    def entries(self, first: int = 0, stop: int | None = None) -> np.ndarray:
        """Raw entries ``first .. stop-1`` (entry numbers, bounded by the geometry) as ENTRY_DTYPE."""
        g = self.geometry
        stop = g.index_num if stop is None else min(stop, g.index_num)
        first = max(0, min(first, stop))
        return np.frombuffer(self._read(g.entry_pos(first), ENTRY_SIZE * (stop - first)), dtype=ENTRY_DTYPE)

    def entries_array(self) -> np.ndarray:
        """The used entries 1 .. indexCount-1 (position i holds entry number i+1)."""
        return self.entries(1, self.index_count)

    def entry(self, n: int) -> tuple[int, int, int, int]:
        """(keyHash, phyOffset, timeDiff, prevIndex) of entry number ``n``."""
        if not 0 <= n < self.geometry.index_num:
            raise StoreError(self.path, None, "bad_entry", f"entry {n} outside 0..{self.geometry.index_num - 1}")
        return _ENTRY.unpack(self._read(self.geometry.entry_pos(n), ENTRY_SIZE))

    # -- chains and query ----------------------------------------------------------------------

    def chain(self, slot: int) -> np.ndarray:
        """Entry numbers of a slot's chain, newest first, with the broker's stop rules (§10.3 c).

        The broker could loop forever on a corrupt cyclic chain; this walk stops after indexCount
        steps.
        """
        ic = self.index_count
        v = self.slot_value(slot)
        out: list[int] = []
        if v <= 0 or v > ic or ic <= 1:
            return np.zeros(0, dtype=np.int64)
        cur = v
        for _ in range(ic):
            out.append(cur)
            prev = self.entry(cur)[3]
            if prev <= 0 or prev > ic or prev == cur:
                break
            cur = prev
        return np.asarray(out, dtype=np.int64)

    def query_hash(
        self, key_hash: int, begin_ms: int = 0, end_ms: int = LONG_MAX, max_num: int | None = None
    ) -> list[int]:
        """Phy offsets of entries with ``key_hash`` in the time range: isTimeMatched + selectPhyOffset.

        Exactly §10.3 2b-2c (overlap test, chain walk and its stop rules) except that there is no
        result cap unless ``max_num`` is given. Hash matches only: callers confirm against the log.
        """
        h = self.header
        if not time_matched(h.begin_timestamp, h.end_timestamp, begin_ms, end_ms):
            return []
        ic = self.index_count
        out: list[int] = []
        if max_num is not None and max_num <= 0:
            return out
        v = self.slot_value(key_hash % self.geometry.hash_slot_num)
        if v <= 0 or v > ic or ic <= 1:
            return out
        cur = v
        for _ in range(ic):  # bound: a corrupt cyclic chain would loop forever in the broker
            if max_num is not None and len(out) >= max_num:
                break
            kh, phy, td, prev = self.entry(cur)
            if td < 0:
                break
            t = h.begin_timestamp + td * 1000
            if kh == key_hash and begin_ms <= t <= end_ms:
                out.append(phy)
            if prev <= 0 or prev > ic or prev == cur or t < begin_ms:
                break
            cur = prev
        return out

    def query(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = LONG_MAX,
              max_num: int | None = None) -> list[int]:
        return self.query_hash(index_hash(f"{topic}#{key}"), begin_ms, end_ms, max_num)

    # -- validity ------------------------------------------------------------------------------

    def validate(self, *, check_tail: bool = True, chunk_entries: int = 1 << 20,
                 proven: ProvenChains | None = None) -> list[Finding]:
        """Header and structure checks an auditor reports (never raises for content problems).

        Checks: indexCount within the geometry; slot values within 0..indexCount and pointing at the
        newest entry of their own slot; keyHash non-negative; prevIndex older than its entry and in
        the same slot; hashSlotCount = distinct slots of the entries; begin/end phy offsets equal the
        first/last entry's; the last entry's timeDiff agrees with begin/end timestamps; with
        ``check_tail``, no non-zero entry after indexCount-1 (read in bounded chunks). ``proven``: the
        entries' chains were proved (what that settles is taken from it instead of read again).
        """
        f: list[Finding] = []
        g, h, p = self.geometry, self.header, self.path

        def add(kind: str, sev: str, off: int | None, detail: str, **extra: Any) -> None:
            f.append(Finding(kind, sev, p, off, detail, extra))

        if h.index_count < 0 or h.index_count > g.index_num:
            add("index_count_beyond_geometry", "error", 36,
                f"indexCount {h.index_count} outside 0..{g.index_num}; reading {self.index_count - 1} entries")
        ic = self.index_count
        ent = self.entries_array()
        slots = self.slots().astype(np.int32)
        bad = np.flatnonzero((slots < 0) | (slots > ic))
        if proven is not None:
            expect, used, neg, badp, cross = self._proven_checks(proven)
        else:
            expect, used, neg, badp, cross = self._entry_checks(ent, chunk_entries)
        if len(neg):
            add("negative_key_hash", "error", g.entry_pos(neg.first + 1),
                f"{len(neg)} entries with a negative keyHash (first: entry {neg.first + 1})", count=len(neg))
        if len(bad):
            add("slot_out_of_range", "error", g.slot_pos(int(bad[0])),
                f"{len(bad)} slot values outside 0..{ic} (first: slot {int(bad[0])} = {int(slots[bad[0]])})",
                count=len(bad))
        inrange = (slots >= 0) & (slots <= ic)
        wrong = np.flatnonzero(inrange & (slots != expect))
        if len(wrong):
            s0 = int(wrong[0])
            add("slot_not_newest_entry", "error", g.slot_pos(s0),
                f"{len(wrong)} slots do not hold the newest entry of their slot "
                f"(first: slot {s0} = {int(slots[s0])}, expected {int(expect[s0])})", count=len(wrong))
        if len(badp):
            e0 = badp.first + 1
            add("prev_index_not_older", "error", g.entry_pos(e0) + 16,
                f"{len(badp)} entries whose prevIndex is not < the entry number (first: entry {e0}"
                f" prevIndex {badp.value})", count=len(badp))
        if len(cross):
            e0 = cross.first + 1
            add("prev_index_wrong_slot", "error", g.entry_pos(e0) + 16,
                f"{len(cross)} entries chain to an entry of another slot (first: entry {e0})", count=len(cross))

        self.check_header_fields(ent, int(np.count_nonzero(used)), add)
        if check_tail:
            e0 = self.first_data_beyond_count(chunk_entries)
            if e0 is not None:
                add("data_beyond_index_count", "warning", g.entry_pos(e0),
                    f"non-zero entry {e0} after indexCount {ic} (stale header or foreign data)", entry=e0)
        return f


    def _entry_checks(self, ent: np.ndarray, chunk_entries: int):
        """validate's per-entry checks, a chunk of entries at a time (memory: the slot tables and a chunk,
        not the file): (newest entry per slot, slots used, negative keyHashes, prevIndex not older,
        prevIndex in another slot), each check keeping its count and first entry."""
        g = self.geometry
        expect = np.zeros(g.hash_slot_num, dtype=np.int32)  # newest entry per slot, from the entries
        used = np.zeros(g.hash_slot_num, dtype=bool)
        neg, badp, cross = _FirstOf(), _FirstOf(), _FirstOf()
        for lo in range(0, len(ent), chunk_entries):
            part = ent[lo:lo + chunk_entries]
            n = np.arange(lo + 1, lo + 1 + len(part), dtype=np.int32)
            kh = part["key_hash"].astype(np.int32)
            prev = part["prev_index"].astype(np.int32)
            neg.add(np.flatnonzero(kh < 0), lo)
            okh = kh >= 0
            eslot = np.where(okh, kh % g.hash_slot_num, -1)
            np.maximum.at(expect, eslot[okh], n[okh])
            used[eslot[okh]] = True
            badp.add(np.flatnonzero((prev < 0) | (prev >= n)), lo, prev)
            okp = np.flatnonzero((prev > 0) & (prev < n))
            pk = ent["key_hash"][prev[okp] - 1].astype(np.int32)  # the entries they chain to, any chunk
            pslot = np.where(pk >= 0, pk % g.hash_slot_num, -1)
            cross.add(okp[eslot[okp] != pslot], lo)
        return expect, used, neg, badp, cross

    def _proven_checks(self, proven: ProvenChains):
        """The same from a chain proof: no prevIndex is newer or in another slot, and the newest entry
        of every slot is the proof's."""
        expect = proven.newest[:self.geometry.hash_slot_num]
        neg = _FirstOf()
        neg.count, neg.first = proven.negatives, proven.first_negative
        return expect, expect > 0, neg, _FirstOf(), _FirstOf()

    def check_header_fields(self, ent: np.ndarray, distinct: int, add: Callable[..., None]) -> None:
        """hashSlotCount (``distinct``: slots the entries use), begin/end phy offsets and timestamps
        against the entries (see validate)."""
        h = self.header
        m = len(ent)
        phy = ent["phy_offset"]
        if h.hash_slot_count != distinct:
            add("hash_slot_count_mismatch", "warning", 32,
                f"hashSlotCount {h.hash_slot_count} but the entries use {distinct} distinct slots",
                expected=distinct)

        if m:
            if h.begin_phy_offset != int(phy[0]):
                add("begin_phy_offset_mismatch", "warning", 16,
                    f"beginPhyOffset {h.begin_phy_offset} but entry 1 has {int(phy[0])}", expected=int(phy[0]))
            if h.end_phy_offset != int(phy[-1]):
                add("end_phy_offset_mismatch", "warning", 24,
                    f"endPhyOffset {h.end_phy_offset} but entry {m} has {int(phy[-1])}", expected=int(phy[-1]))
            if m >= 2:
                want = index_time_diff(h.end_timestamp, h.begin_timestamp)
                got = int(ent["time_diff"][-1])
                if want != got:
                    add("end_timestamp_mismatch", "warning", 8,
                        f"last entry timeDiff {got} but (endTimestamp - beginTimestamp)/1000 = {want}",
                        expected=want)
        elif h.hash_slot_count == 0 and (h.begin_timestamp != h.end_timestamp or h.begin_phy_offset != h.end_phy_offset):
            add("empty_file_header_mismatch", "warning", 0,
                "file without entries but begin and end header fields differ")

    def first_data_beyond_count(self, chunk_entries: int) -> int | None:
        """The first non-zero entry at or after indexCount, read in bounded chunks (see validate); none for
        a file read as at a cut (entries after its indexCount were put since)."""
        if self.at_cut:
            return None
        g, ic = self.geometry, self.index_count
        lo, hi = g.entry_pos(ic), g.entry_pos(g.index_num)
        # holes (the unused part of a sparse file) read as zeros: only the file's data is read
        spans = data_ranges(self.source.path, lo, hi) if isinstance(self.source, LocalSource) else [(lo, hi)]
        for a, b in spans:
            pos = max(ic, (a - g.entry_pos(0)) // ENTRY_SIZE)
            end = min(g.index_num, -(-(b - g.entry_pos(0)) // ENTRY_SIZE))
            while pos < end:
                stop = min(end, pos + chunk_entries)
                raw = np.frombuffer(self._read(g.entry_pos(pos), ENTRY_SIZE * (stop - pos)), dtype=np.uint8)
                nz = np.flatnonzero(raw)
                if len(nz):
                    return pos + int(nz[0]) // ENTRY_SIZE
                pos = stop
        return None


def open_owned(cls: type[IndexFile], src: ByteSource, geometry: IndexGeometry | None, **kw: Any) -> IndexFile:
    """Construct over a source we opened; close it again if the file is rejected."""
    try:
        return cls(src, geometry, **kw)
    except BaseException:
        src.close()
        raise


__all__ = [
    "ENTRY_DTYPE",
    "IndexFile",
    "IndexGeometry",
    "IndexHeader",
    "time_matched",
]
