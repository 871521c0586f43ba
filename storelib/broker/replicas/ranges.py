"""Byte ranges of replica commitlogs compared without reading them record by record.

A classic-HA slave's commitlog is a byte copy of its master's at the same offsets (HAConnection sends
raw file bytes, HAClient appends them), and so is a controller-mode replica's. Two stores therefore agree
up to the first byte that differs. Each store's data is cut into blocks (``block`` bytes from each segment's
base, the last one clipped at the store's end) and a task computes the CRC-32 of every block of one
segment; blocks whose CRCs agree are taken as equal, and only the first block that differs is read again,
from both stores, and bisected (CRC of halves) down to its first differing byte. The record that holds
that byte is where the stores part (:func:`divergence_record`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from storelib.errors import StoreError
from storelib.fileio.bytesource import open_source, resolve
from storelib.format.crc import crc32, crc32_ranges

DEFAULT_BLOCK = 1 << 20  # CRC granularity: a 1 TB store is 1 M CRCs (8 MB) on the driver
READ_WINDOW = 16 << 20  # bytes read at a time from a remote segment
BISECT_FLOOR = 4096  # below this the last range is compared byte for byte


@dataclass(frozen=True)
class BlockTask:
    """CRCs of the blocks of ``[0, length)`` of one segment file (picklable: an engine ships it).

    ``key`` is the caller's tag (group, store, segment base), handed back with the result.
    """

    key: tuple
    uri: str
    file_size: int
    length: int
    block: int = DEFAULT_BLOCK
    fs_options: dict[str, Any] = field(default_factory=dict)


def block_crcs(task: BlockTask) -> tuple[tuple, np.ndarray]:
    """(key, unmasked CRC-32 of each block) for one segment: memory is one read window, whatever its size."""
    n = -(-task.length // task.block)
    out = np.empty(n, np.int64)
    loc = resolve(task.uri, **task.fs_options)
    src = open_source(loc, task.file_size)
    try:
        if task.length > src.size:
            raise StoreError(task.uri, src.size, "truncated", f"file holds {src.size} bytes, {task.length} expected")
        window = max(task.block, READ_WINDOW // task.block * task.block)
        if hasattr(src, "read_ahead") and task.length > window:
            src.read_ahead(window)
        done = 0
        for pos in range(0, task.length, window):
            m = min(window, task.length - pos)
            view = src.read(pos, m)
            starts = np.arange(0, m, task.block)
            ends = np.minimum(starts + task.block, m)
            out[done:done + len(starts)] = crc32_ranges(view, starts, ends)
            done += len(starts)
            del view
    finally:
        src.close()
    return task.key, out


Reader = Callable[[int, int], bytes]  # (phy offset, length) -> bytes of one store


def first_difference(read_a: Reader, read_b: Reader, lo: int, hi: int) -> int | None:
    """The first offset in ``[lo, hi)`` where two stores' bytes differ (None: equal), bisecting by the CRCs of
    halves. ``[lo, hi)`` lies in one segment and is at most a block or two: both sides are read once."""
    a, b = bytes(read_a(lo, hi - lo)), bytes(read_b(lo, hi - lo))
    if len(a) != hi - lo or len(b) != hi - lo:
        raise StoreError(None, lo, "truncated", f"could not read {hi - lo} bytes at {lo} from both stores")
    if a == b:
        return None
    s, e = 0, hi - lo
    va, vb = memoryview(a), memoryview(b)
    while e - s > BISECT_FLOOR:  # [s, e) holds the first difference: halve it by the CRCs of its first half
        mid = (s + e) // 2
        if crc32(va[s:mid]) != crc32(vb[s:mid]):
            e = mid
        else:
            s = mid
    d = _first_unequal(a, b, s, e)
    if d is None or a[:d] != b[:d]:  # a CRC collision sent the bisection past a difference: look at all of it
        d = _first_unequal(a, b, 0, hi - lo)
    return None if d is None else lo + d


def _first_unequal(a: bytes, b: bytes, s: int, e: int) -> int | None:
    diff = np.flatnonzero(np.frombuffer(a, np.uint8, e - s, s) != np.frombuffer(b, np.uint8, e - s, s))
    return s + int(diff[0]) if len(diff) else None


@dataclass(frozen=True)
class Extent:
    """Where one store's commitlog data lies: ``[min_offset, end)`` over segments of ``segment_size``."""

    min_offset: int
    end: int
    segment_size: int
    bases: tuple[int, ...]


def segment_lengths(ext: Extent) -> dict[int, int]:
    """Bytes of each segment that hold the store's data (the CRC tasks' lengths)."""
    return {b: min(ext.segment_size, ext.end - b) for b in ext.bases if b < ext.end and b + ext.segment_size > ext.min_offset}


def pair_difference(x: Extent, cx: dict[int, np.ndarray], read_x: Reader, y: Extent, cy: dict[int, np.ndarray],
                    read_y: Reader, block: int) -> tuple[int | None, int, int]:
    """(first differing byte or None, overlap start, overlap end) of two stores' data.

    The overlap is ``[max(min offsets), min(ends))``; a segment one store lacks inside it differs at its
    base. Blocks are compared by CRC; the first that differs, and a block the overlap's end cuts, are
    compared byte by byte.
    """
    if x.segment_size != y.segment_size:
        raise StoreError(None, None, "segment_size_mismatch",
                         f"commitlog segments of {x.segment_size} and {y.segment_size} bytes: not copies of one log")
    S = x.segment_size
    lo, hi = max(x.min_offset, y.min_offset), min(x.end, y.end)
    if lo >= hi:
        return None, lo, hi
    for base in range(lo - lo % S, hi, S):
        if base not in cx or base not in cy:
            return max(base, lo), lo, hi
        seg_hi = min(base + S, hi)
        full = (seg_hi - base) // block  # blocks wholly inside the overlap (and so computed whole by both)
        a, b = cx[base][:full], cy[base][:full]
        bad = np.flatnonzero(a != b)
        if len(bad):
            s = base + int(bad[0]) * block
            d = first_difference(read_x, read_y, s, min(s + block, seg_hi))
            if d is not None:
                return d, lo, hi
            # equal bytes under different CRCs cannot happen; a read that changed under us would: go on
        tail = base + full * block
        if tail < seg_hi:
            d = first_difference(read_x, read_y, tail, seg_hi)
            if d is not None:
                return d, lo, hi
    return None, lo, hi


def divergence_record(scan_starts: Callable[[int, int], tuple[np.ndarray, np.ndarray]], seg_base: int, d: int) -> int:
    """The offset of the record that holds byte ``d`` (where two stores that agree before ``d`` part).

    ``scan_starts(seg_base, d)`` gives the (starts, sizes) of the segment's records that start at or before
    ``d``. The last record start at or before ``d`` is it when the record reaches past ``d``; when ``d`` lies
    after the last record (in one store's blank end-of-file record) the stores part where that record ends.
    Both stores walk the same chain up to there, so either store's records serve.
    """
    starts, sizes = scan_starts(seg_base, d)
    if not len(starts):
        return seg_base
    i = int(np.searchsorted(starts, d, side="right")) - 1
    if i < 0:
        return seg_base
    s, n = int(starts[i]), int(sizes[i])
    return s if s + n > d else s + n


__all__ = ["DEFAULT_BLOCK", "BlockTask", "Extent", "block_crcs", "divergence_record", "first_difference",
           "pair_difference", "segment_lengths"]
