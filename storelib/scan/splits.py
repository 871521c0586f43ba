"""Split planning: cut commitlog segments into independent scan units at verified record starts.

A parallel scan (Spark, or threads) wants units of bounded size, but a record can only be decoded from
its first byte. Each nominal cut point (every ``max_split_bytes``) is moved forward to the first
**verified record start**, found with a windowed search that works on local and remote sources alike:

* a message magic (V1 or V2) at ``p + 4`` and a sane TOTALSIZE (``91 .. bytes left``),
* the PHYSICALOFFSET field (bytes ``p+28 .. p+36``) equal to ``segment base + p`` (what the broker
  wrote; a pattern inside a body practically never satisfies it),
* confirmed by following the size chain for a few records (each again magic + PHYSICALOFFSET, or a
  clean end of the chain: blank end record, zeros, the exact segment end).

The same search is the minimal resync used by permissive readers after a bad record
(:func:`find_record_start`); it is stricter than :mod:`storelib.broker.recovery.resync` (the PHYSICALOFFSET match is
required, not one of two signals) because a false split boundary would silently mis-decode a region,
and it reads through ``ByteSource.read`` windows instead of needing the whole segment in memory.

In a DLedger data file a unit starts at a verified *entry* start: magic 1, the pos field equal to
``base + p``, size = body length + 48, the record at ``p + 48`` passing the tests above (its
PHYSICALOFFSET is ``base + p + 48``), confirmed by the entry chain (:func:`find_entry_start`).

No Spark here: the result is a list of :class:`storelib.scan.commitlog.Split` values, cheap to ship.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from storelib.format.dledger.entries import BLANK_MAGIC as DL_BLANK
from storelib.format.dledger.entries import BODY_OFFSET, ENTRY_MAGIC
from storelib.format.record import BLANK_MAGIC, BORNHOST_V6_FLAG, MAGIC_V1, MAGIC_V2
from storelib.scan.commitlog import CommitLog, Segment, Split
from storelib.scan.scanner import MIN_RECORD_SIZE

DEFAULT_MAX_SPLIT_BYTES = 64 * 1024 * 1024
# bounds of the parallel default (parallel_split_bytes): a unit is one Spark task, and a task costs
# tens of milliseconds of scheduling and worker hand-off, so units are as large as keeping every core
# busy allows; the upper bound keeps one unit's decoded tables small
MIN_PARALLEL_SPLIT_BYTES = 128 * 1024 * 1024
MAX_PARALLEL_SPLIT_BYTES = 512 * 1024 * 1024
MIN_SPLIT_BYTES = 64 * 1024  # floor when min_splits lowers the step
SEARCH_WINDOW = 1024 * 1024
# how far past a nominal cut a record start is looked for: a record is at most maxMessageSize (4 MiB by
# default) plus its header, so data without a start in this range is zeros or garbage (no cut there)
DEFAULT_CUT_SEARCH = 8 * 1024 * 1024
CONFIRM_RECORDS = 3

_HEAD = struct.Struct(">ii")
_PHY = struct.Struct(">q")
_M1 = MAGIC_V1.to_bytes(4, "big", signed=True)
_M2 = MAGIC_V2.to_bytes(4, "big", signed=True)


def _sane_start(head: bytes | memoryview, base: int, pos: int, seg_len: int) -> int:
    """TOTALSIZE when ``head`` (>= 36 bytes at ``pos``) looks like a message written at ``pos``, else 0."""
    if len(head) < 36:
        return 0
    total, magic = _HEAD.unpack_from(head, 0)
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        return 0
    if total < MIN_RECORD_SIZE or total > seg_len - pos:
        return 0
    if _PHY.unpack_from(head, 28)[0] != base + pos:
        return 0
    return total


def _chain_ok(source, base: int, seg_len: int, pos: int, confirm: int) -> bool:
    """Do ``confirm`` records follow ``pos`` by the size chain (a clean chain end also confirms)?"""
    for _ in range(confirm):
        left = seg_len - pos
        if left == 0:
            return True
        if left < 8:
            return False
        head = source.read(pos, min(36, left))
        total, magic = _HEAD.unpack_from(head, 0)
        if magic == BLANK_MAGIC:
            return total == left
        if total == 0 and magic == 0:
            return True
        size = _sane_start(head, base, pos, seg_len)
        if not size:
            return False
        pos += size
    return True


def _candidates(buf: memoryview, lo: int, count: int, base: int, seg_len: int) -> np.ndarray:
    """Positions ``lo + i`` (``i < count``) passing the vectorised tests: magic, TOTALSIZE, PHYSICALOFFSET."""
    a = np.frombuffer(buf, dtype=np.uint8)
    if len(a) < 36:
        return np.zeros(0, np.int64)
    usable = min(count, len(a) - 35)  # header bytes of a candidate must be in the buffer
    if usable <= 0:
        return np.zeros(0, np.int64)
    m = a[4 : usable + 4 + 3]
    first = np.flatnonzero(m[: usable] == 0xDA)
    if not len(first):
        return np.zeros(0, np.int64)
    b1, b2, b3 = m[first + 1], m[first + 2], m[first + 3]
    first = first[(b1 == 0xA3) & (b2 == 0x20) & ((b3 == 0xA7) | (b3 == 0xAB))]
    if not len(first):
        return np.zeros(0, np.int64)
    rows = np.lib.stride_tricks.sliding_window_view(a, 36)[first]
    total = rows[:, 0:4].copy().view(">i4").ravel().astype(np.int64)
    phy = rows[:, 28:36].copy().view(">i8").ravel()
    pos = first.astype(np.int64) + lo
    ok = (total >= MIN_RECORD_SIZE) & (total <= seg_len - pos) & (phy == base + pos)
    return pos[ok]


def find_record_start(source, base: int, start: int, limit: int | None = None, *,
                      confirm: int = CONFIRM_RECORDS, window: int = SEARCH_WINDOW) -> int | None:
    """The first verified record start ``p`` with ``start <= p < limit`` in one segment, or None.

    ``source`` is a ByteSource of the segment, ``base`` its physical offset. Reads ``window``-byte
    windows, so it costs a few ranged requests on a remote store and never maps more than a window.
    """
    seg_len = source.size
    limit = seg_len if limit is None else min(limit, seg_len)
    lo = max(0, start)
    while lo < limit:
        count = min(window, limit - lo)
        buf = source.read(lo, count + 35)
        for p in _candidates(buf, lo, count, base, seg_len).tolist():
            head = buf[p - lo : p - lo + 36]
            total = _sane_start(head, base, p, seg_len)
            if total and _chain_ok(source, base, seg_len, p + total, confirm):
                return p
        lo += count
    return None


_ENTRY = struct.Struct(">iiqqq")  # magic, size, index, term, pos


def _sane_entry(head: bytes | memoryview, base: int, pos: int, seg_len: int) -> int:
    """The entry size when ``head`` (>= 84 bytes at ``pos``) is a DLedger entry written at ``pos`` holding a
    record written at ``pos + 48``, else 0."""
    if len(head) < BODY_OFFSET + 36:
        return 0
    magic, size, _, _, p = _ENTRY.unpack_from(head, 0)
    if magic != ENTRY_MAGIC or p != base + pos or size > seg_len - pos:
        return 0
    if _HEAD.unpack_from(head, 44)[0] + BODY_OFFSET != size:
        return 0
    rec = _sane_start(head[BODY_OFFSET:], base, pos + BODY_OFFSET, seg_len)
    return size if rec and rec + BODY_OFFSET == size else 0


def _entry_chain_ok(source, base: int, seg_len: int, pos: int, confirm: int) -> bool:
    """Do ``confirm`` entries follow ``pos`` (a blank filler or zeros also confirm)?"""
    for _ in range(confirm):
        left = seg_len - pos
        if left < 8:
            return False
        head = source.read(pos, min(BODY_OFFSET + 36, left))
        magic, size = _HEAD.unpack_from(head, 0)
        if magic == DL_BLANK:
            return size == left
        if size == 0:
            return magic == 0
        size = _sane_entry(head, base, pos, seg_len)
        if not size:
            return False
        pos += size
    return True


def find_entry_start(source, base: int, start: int, limit: int | None = None, *,
                     confirm: int = CONFIRM_RECORDS, window: int = SEARCH_WINDOW) -> int | None:
    """:func:`find_record_start` for a DLedger data file: the first verified entry start in
    ``[start, limit)``, found through its record's magic 52 bytes in, or None."""
    seg_len = source.size
    limit = seg_len if limit is None else min(limit, seg_len)
    lo = max(0, start)
    while lo < limit:
        count = min(window, limit - lo)
        buf = source.read(lo, count + BODY_OFFSET + 35)
        if len(buf) > BODY_OFFSET:
            recs = _candidates(buf[BODY_OFFSET:], lo + BODY_OFFSET, count, base, seg_len)
            for p in (recs - BODY_OFFSET).tolist():
                size = _sane_entry(buf[p - lo: p - lo + BODY_OFFSET + 36], base, p, seg_len)
                if size and _entry_chain_ok(source, base, seg_len, p + size, confirm):
                    return p
        lo += count
    return None


def first_store_timestamp(source, base: int, pos: int) -> int | None:
    """STORETIMESTAMP of the record at ``pos`` (None when no message record starts there)."""
    head = source.read(pos, 80)
    if not _sane_start(head, base, pos, source.size) or len(head) < 80:
        return None
    sysflag = struct.unpack_from(">i", head, 36)[0]
    at = 48 + (20 if sysflag & BORNHOST_V6_FLAG else 8)
    return _PHY.unpack_from(head, at)[0]


@dataclass(frozen=True)
class PlannedSplit:
    """A :class:`Split` plus what the planner learned: the STORETIMESTAMP of its first record."""

    split: Split
    first_timestamp: int | None = None


def _segment_cuts(seg: Segment, source, step: int, search: int, extra: list[int]) -> list[int]:
    """Verified cut positions inside one segment (sorted, unique, excluding 0)."""
    size = seg.file_size
    wanted = sorted({c for c in [*range(step, size, step), *extra] if 0 < c < size})
    cuts: list[int] = []
    find = find_entry_start if seg.dledger else find_record_start
    for c in wanted:
        if cuts and c <= cuts[-1]:
            continue
        p = find(source, seg.base, c, min(size, c + search))
        if p is not None and (not cuts or p > cuts[-1]):
            cuts.append(p)
    return cuts


def local_parallelism() -> int:
    """Cores this process may run on (its CPU affinity, which container limits narrow)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def parallel_split_bytes(total_bytes: int, parallelism: int) -> int:
    """Unit size for a parallel scan of ``total_bytes``: about two units per core, 128-512 MiB each.

    Two per core lets a core that finishes early take another unit; fewer, larger units than Spark's
    own 128 MiB file splits because a Python task costs far more to start than a JVM one (measured on
    local[2]: a 2 GiB count() took 4.8 s in 32 units of 64 MiB, 3.7 s in 4 of 512 MiB).
    """
    want = -(-max(0, total_bytes) // max(1, 2 * parallelism))
    return max(MIN_PARALLEL_SPLIT_BYTES, min(MAX_PARALLEL_SPLIT_BYTES, want))


def plan_splits(commitlog: CommitLog, max_split_bytes: int | None = DEFAULT_MAX_SPLIT_BYTES, *,
                min_splits: int = 1, from_offset: int | None = None, to_offset: int | None = None,
                segments: set[str] | None = None, with_timestamps: bool = False,
                cut_search: int = DEFAULT_CUT_SEARCH, parallelism: int | None = None) -> list[PlannedSplit]:
    """Scan units over the commitlog, in commitlog order: at least one per non-empty segment.

    ``max_split_bytes`` bounds a unit's byte range (lowered so there are at least ``min_splits`` units
    when the log is small); ``None`` picks :func:`parallel_split_bytes` for the bytes in range and
    ``parallelism`` cores (default: this machine's). Cuts move forward to verified record starts, and a cut that finds none
    (zeros, garbage, a huge record) is dropped, so a unit can be longer. ``from_offset``/``to_offset``
    (physical offsets, end exclusive) add cuts there and drop units outside the range; ``segments``
    keeps only the named segment files. Records in a unit start in ``[start, end)``.
    """
    segs = [s for s in commitlog.segments if s.file_size > 0 and (segments is None or s.name in segments)]
    if from_offset is not None:
        segs = [s for s in segs if s.base + s.file_size > from_offset]
    if to_offset is not None:
        segs = [s for s in segs if s.base < to_offset]
    total = sum(s.file_size for s in segs)
    if max_split_bytes is None:
        lo, hi = from_offset or 0, to_offset
        in_range = sum(max(0, (s.base + s.file_size if hi is None else min(s.base + s.file_size, hi))
                           - max(s.base, lo)) for s in segs)
        max_split_bytes = parallel_split_bytes(in_range, parallelism or local_parallelism())
    step = max(1, int(max_split_bytes))
    if min_splits > 1 and total:
        step = min(step, max(MIN_SPLIT_BYTES, -(-total // min_splits)))
    out: list[PlannedSplit] = []
    for seg in segs:
        head = BODY_OFFSET if seg.dledger else 0  # a unit starts at the entry of its first record
        extra = [o - seg.base - head for o in (from_offset, to_offset) if o is not None]
        src = seg.open()
        try:
            cuts = _segment_cuts(seg, src, step, cut_search, extra)
            bounds = [0, *cuts, seg.file_size]
            for a, b in zip(bounds[:-1], bounds[1:]):
                if from_offset is not None and seg.base + b + head <= from_offset:
                    continue
                if to_offset is not None and seg.base + a + head >= to_offset:
                    continue
                ts = first_store_timestamp(src, seg.base, a + head) if with_timestamps else None
                out.append(PlannedSplit(Split(seg.base, seg.name, seg.path, a, b, seg.file_size, seg.dledger), ts))
        finally:
            src.close()
    return out


FINE_SHARE = 4  # the units that end a run are this many times smaller than the others


def written_end(source, size: int, block: int = 4096) -> int:
    """About where a segment's written bytes end (to a block): its size when its last block holds data,
    else found by bisection over all-zero blocks, a commitlog file being written from its start. A run of
    zeros inside the data can make it answer short: it only places cuts, never decides a result."""
    def zero(at: int) -> bool:
        b = source.read(at, min(block, size - at))
        return b == bytes(len(b))

    if size <= 0 or not zero(max(0, size - block)):
        return max(0, size)
    if zero(0):
        return 0
    lo, hi = 0, (size - 1) // block  # block lo holds data, block hi is zeros
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if zero(mid * block) else (mid, hi)
    return hi * block


def segment_cuts(commitlog: CommitLog, split_bytes: int, segments: set[str], fine_tail: int = 0) -> dict[str, list[int]]:
    """Verified record starts (file offsets, ascending) about every ``split_bytes`` inside each named
    segment: where a segment's scan may be cut into tasks whose results join like one scan's.

    ``fine_tail``: the last this many bytes of the named segments (in commitlog order) are cut
    :data:`FINE_SHARE` times finer. Units taken in order end a run with these short ones, so the cores
    finish within a short unit of one another instead of one idling for up to a whole unit."""
    segs = [s for s in commitlog.segments if s.file_size > 0 and s.name in segments]
    fine_step = max(1, split_bytes // FINE_SHARE)
    cuts: dict[str, list[int]] = {}
    left = max(0, fine_tail)
    for seg in reversed(segs):
        src = seg.open()
        try:
            extra: list[int] = []
            if left > 0:  # the fine cuts go before a young segment's zeros, where its records are
                end = written_end(src, seg.file_size)
                fine = min(left, end)
                left -= fine
                extra = list(range(end - fine, end, fine_step))
            found = _segment_cuts(seg, src, max(1, int(split_bytes)), DEFAULT_CUT_SEARCH, extra)
        finally:
            src.close()
        if found:
            cuts[seg.name] = found
    return cuts


def prune_by_time(planned: list[PlannedSplit], lo: int | None, hi: int | None) -> list[PlannedSplit]:
    """Drop units that cannot hold a STORETIMESTAMP in ``[lo, hi]`` (inclusive bounds, None = open).

    The broker assigns STORETIMESTAMP inside the append lock, so it does not decrease along the log;
    a unit's records then lie between its first timestamp and the next unit's. When the sampled first
    timestamps are missing or ever decrease (clock stepped back, foreign data), nothing is pruned.
    """
    if lo is None and hi is None:
        return planned
    known = [p.first_timestamp for p in planned if p.first_timestamp is not None]
    if any(b < a for a, b in zip(known, known[1:])):
        return planned
    keep = []
    nxt: int | None = None  # first timestamp of the next unit that has one
    for p in reversed(planned):
        t = p.first_timestamp
        drop = t is not None and ((hi is not None and t > hi) or (lo is not None and nxt is not None and nxt < lo))
        if not drop:  # a unit without a readable first record is always kept (it may resync later)
            keep.append(p)
        if t is not None:
            nxt = t
    return keep[::-1]
