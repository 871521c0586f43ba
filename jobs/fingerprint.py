"""Segment fingerprints: how an incremental audit or export knows a segment still holds the bytes it read.

A fingerprint is the segment's size and mtime plus the CRC32 of its head and of the bytes just before the
end the run reached. Both ranges lie inside the part already read, so a later append (a growing last
segment) still matches and only the new bytes need reading; a rewrite or another store's file does not.
"""

from __future__ import annotations

import zlib
from typing import Any

from storelib.scan.commitlog import Segment

HEAD = 64 * 1024
TAIL = 4096


def _crc_range(seg: Segment, lo: int, hi: int) -> int:
    lo, hi = max(0, lo), min(hi, seg.file_size)
    if hi <= lo:
        return 0
    with seg.open() as src:
        return zlib.crc32(bytes(src.read(lo, hi - lo)))


def fingerprint(seg: Segment, data_end: int) -> dict[str, Any]:
    """The fingerprint of a segment read up to ``data_end``."""
    head = min(HEAD, data_end)
    return {"size": seg.file_size, "mtime_ms": seg.mtime_ms, "head_len": head,
            "head_crc": _crc_range(seg, 0, head), "tail_crc": _crc_range(seg, data_end - TAIL, data_end)}


def prefix_unchanged(seg: Segment, fp: dict[str, Any], data_end: int) -> bool:
    """Are the segment's bytes up to ``data_end`` still those ``fp`` saw (same head, same bytes before it)?"""
    if fp.get("head_len") != min(HEAD, data_end):
        return False
    return (fp.get("head_crc") == _crc_range(seg, 0, fp["head_len"])
            and fp.get("tail_crc") == _crc_range(seg, data_end - TAIL, data_end))
