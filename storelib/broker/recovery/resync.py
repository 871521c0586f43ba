"""Corrupt-region resynchronisation: from a bad position in a commitlog segment, find where valid records
start again, so one bad byte does not hide the rest of a segment.

The broker stops at the first record that fails validation (and recovery truncates there). An auditor,
a salvage job or a permissive reader wants to know what lies after it. :func:`find_next_record` looks
for the next position where

* a message magic (V1 ``DAA320A7`` / V2 ``DAA320AB``) sits at +4 and TOTALSIZE is sane (at least the
  smallest record, at most what is left of the segment),
* the record passes the broker's validation (:func:`storelib.format.record.check_record`, body CRC included),
* and it is confirmed: its PHYSICALOFFSET field equals ``base + position`` (a strong signal the
  broker wrote it there), or the size chain continues with ``confirm`` more valid records (a clean end
  of the chain — blank record, zeros, exact segment end — also confirms),

or where the segment's blank end record sits (blank magic with TOTALSIZE equal to the bytes left).

Candidates are found with numpy (``np.flatnonzero`` over a bounded window for the magic's first byte,
then column tests on the following bytes); only candidates that pass the cheap tests are validated one
by one, in position order. Memory is bounded by the window size, whatever the segment size.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from storelib.format.record import BLANK_MAGIC, MAGIC_V1, MAGIC_V2, check_record

MIN_RECORD_SIZE = 91  # V1, IPv4/IPv4, empty body, topic and properties
DEFAULT_WINDOW = 8 * 1024 * 1024
_I32 = struct.Struct(">i")
_PAIR = struct.Struct(">ii")
_M1 = MAGIC_V1.to_bytes(4, "big", signed=True)
_M2 = MAGIC_V2.to_bytes(4, "big", signed=True)
_MB = BLANK_MAGIC.to_bytes(4, "big", signed=True)


@dataclass(frozen=True)
class Resync:
    """Where valid data resumes after a bad position.

    ``kind``: ``message`` (a confirmed record starts at ``pos``), ``blank`` (the segment's end record
    is at ``pos``), ``none`` (nothing valid until ``limit``). ``data_end`` is the position after the
    last non-zero byte seen in ``[start, pos)`` (equals ``pos`` when resuming at a record), so
    ``data_end - start`` is what was lost and the rest up to ``pos`` was never written.
    ``phy_match``: the PHYSICALOFFSET field of the record found equals its real position.
    """

    start: int
    pos: int
    kind: str
    data_end: int
    phy_match: bool = False

    @property
    def bytes_lost(self) -> int:
        """Bytes between the bad position and where valid data resumes (zeros at a dead end excluded)."""
        return (self.pos if self.kind != "none" else self.data_end) - self.start


@dataclass(frozen=True)
class LostRegion:
    """One bad region of a segment: file offsets ``[start, end)``, its physical start, why it began."""

    file: str
    start: int
    end: int
    phy_start: int
    reason: str
    detail: str = ""
    resumed: str = "none"  # what follows: message | blank | none

    @property
    def bytes_lost(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict:
        return {"file": self.file, "start": self.start, "end": self.end, "phy_start": self.phy_start,
                "bytes_lost": self.bytes_lost, "reason": self.reason, "detail": self.detail,
                "resumed": self.resumed}


def _valid_at(buf, pos: int, check_crc: bool) -> int:
    """TOTALSIZE of a valid message record at ``pos`` (broker validation), else 0."""
    n = len(buf)
    if n - pos < MIN_RECORD_SIZE:
        return 0
    total, magic = _PAIR.unpack_from(buf, pos)
    if magic not in (MAGIC_V1, MAGIC_V2) or total < MIN_RECORD_SIZE or total > n - pos:
        return 0
    chk = check_record(buf[pos : pos + total], 0, check_crc=check_crc)
    return total if chk.kind == "message" else 0


def _chain_ok(buf, pos: int, confirm: int, check_crc: bool) -> bool:
    """Do ``confirm`` valid records follow from ``pos`` (a clean end of the chain also confirms)?"""
    n = len(buf)
    for _ in range(confirm):
        left = n - pos
        if left == 0:
            return True  # exact segment end
        if left < 8:
            return False
        total, magic = _PAIR.unpack_from(buf, pos)
        if magic == BLANK_MAGIC:
            return total == left
        if total == 0 and magic == 0:
            return True  # end of data
        size = _valid_at(buf, pos, check_crc)
        if not size:
            return False
        pos += size
    return True


def _candidates(a: np.ndarray, lo: int, hi: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Record starts in ``[lo, hi)`` whose magic (at +4) is a message or blank magic, and a flag 'blank'.

    Cheap vectorised filters: magic bytes, TOTALSIZE sane for messages, TOTALSIZE = bytes left for
    blanks. ``a`` is the whole segment as uint8.
    """
    m_lo, m_hi = lo + 4, min(hi + 4, n - 3)
    if m_hi <= m_lo:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    w = a[m_lo : m_hi + 3]
    first = np.flatnonzero((w[:-3] == 0xDA) | (w[:-3] == 0xCB))
    if not len(first):
        return np.zeros(0, np.int64), np.zeros(0, bool)
    b0, b1, b2, b3 = w[first], w[first + 1], w[first + 2], w[first + 3]
    is_msg = (b0 == 0xDA) & (b1 == 0xA3) & (b2 == 0x20) & ((b3 == 0xA7) | (b3 == 0xAB))
    is_blank = (b0 == 0xCB) & (b1 == 0xD4) & (b2 == 0x31) & (b3 == 0x94)
    keep = is_msg | is_blank
    first, is_blank = first[keep], is_blank[keep]
    starts = first.astype(np.int64) + lo  # record start = magic position - 4
    if not len(starts):
        return starts, is_blank
    tot = a[starts[:, None] + np.arange(4)].astype(np.int64)
    total = (tot[:, 0] << 24) | (tot[:, 1] << 16) | (tot[:, 2] << 8) | tot[:, 3]
    total = np.where(total >= 2**31, total - 2**32, total)
    left = n - starts
    sane = np.where(is_blank, total == left, (total >= MIN_RECORD_SIZE) & (total <= left))
    return starts[sane], is_blank[sane]


def find_next_record(buf, start: int, *, base: int = 0, limit: int | None = None, confirm: int = 2,
                     check_crc: bool = True, window: int = DEFAULT_WINDOW) -> Resync:
    """The first position ``> start`` (or ``== start`` when ``start`` itself is valid) where valid data
    resumes in the segment image ``buf`` (bytes/memoryview/mmap of the whole segment).

    ``base`` is the segment's physical offset (for the PHYSICALOFFSET signal); ``limit`` bounds the
    search (default: the segment end); ``confirm`` is how many following records must validate when
    the PHYSICALOFFSET field does not match. Works through ``window``-byte windows, so a 1 GiB segment
    is never copied.
    """
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    n = len(mv)
    limit = n if limit is None else min(limit, n)
    a = np.frombuffer(mv, dtype=np.uint8)
    data_end = start
    lo = max(0, start)
    while lo < limit:
        hi = min(limit, lo + window)
        starts, blank = _candidates(a, lo, hi, n)
        for p, is_blank in zip(starts.tolist(), blank.tolist()):
            if p < start:
                continue
            if is_blank:
                return Resync(start, p, "blank", max(data_end, _last_nonzero(a, lo, p, data_end)), False)
            size = _valid_at(mv, p, check_crc)
            if not size:
                continue
            phy_match = struct.unpack_from(">q", mv, p + 28)[0] == base + p
            if phy_match or _chain_ok(mv, p + size, confirm, check_crc):
                return Resync(start, p, "message", p, phy_match)
        data_end = _last_nonzero(a, lo, hi, data_end)
        lo = hi
    return Resync(start, limit, "none", data_end, False)


def _last_nonzero(a: np.ndarray, lo: int, hi: int, default: int) -> int:
    """Position after the last non-zero byte of ``a[lo:hi]``, or ``default`` when it is all zeros.

    An all-zero window says nothing about where data ended, so it must not move ``data_end``.
    """
    if hi <= lo:
        return default
    nz = np.flatnonzero(a[lo:hi])
    return max(default, lo + int(nz[-1]) + 1) if len(nz) else default


def lost_region(buf, file: str, base: int, start: int, reason: str, detail: str = "", **kw) -> tuple[LostRegion, Resync]:
    """Resynchronise after a bad record at ``start`` and describe the region lost.

    Returns the region (``[start, end)`` where ``end`` is where valid data resumes, or the end of the
    non-zero bytes when nothing valid follows) and the :class:`Resync` (``pos`` to continue scanning).
    """
    r = find_next_record(buf, start + 1, base=base, **kw)
    end = r.pos if r.kind != "none" else max(r.data_end, min(start + 1, len(buf)))
    return LostRegion(file, start, end, base + start, reason, detail, r.kind), r


def scan_regions(buf, file: str, base: int = 0, start: int = 0, **kw) -> list[LostRegion]:
    """Every bad region of a segment image, walking the size chain and resynchronising after each
    failure (a convenience for salvage and tests; the audit does the same with the columnar scanner)."""
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    n = len(mv)
    pos = start
    out: list[LostRegion] = []
    check_crc = kw.get("check_crc", True)
    while pos < n:
        if n - pos < 8:
            break
        total, magic = _PAIR.unpack_from(mv, pos)
        if magic == BLANK_MAGIC or (total == 0 and magic == 0):
            if magic == 0:  # zeros: anything valid later means a zeroed/unwritten hole
                r = find_next_record(mv, pos, base=base, **kw)
                if r.kind == "message":
                    out.append(LostRegion(file, pos, r.pos, base + pos, "zeroed", "zeros inside the data", r.kind))
                    pos = r.pos
                    continue
            break
        size = _valid_at(mv, pos, check_crc)
        if size:
            pos += size
            continue
        chk = check_record(mv, pos, check_crc=check_crc)
        reason = (chk.reason or "invalid").split(":", 1)[0]
        region, r = lost_region(mv, file, base, pos, reason, chk.reason or "", **kw)
        out.append(region)
        if r.kind != "message":
            break
        pos = r.pos
    return out
