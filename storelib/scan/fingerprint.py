"""Segment fingerprints: how an incremental audit or export knows a segment still holds the bytes it read.

A fingerprint is the segment's size and mtime plus the CRC32 of its head and of the bytes just before the
end the run reached. Both ranges lie inside the part already read, so a later append (a growing last
segment) still matches and only the new bytes need reading; a rewrite or another store's file does not.
"""

from __future__ import annotations

from typing import Any

from storelib.fileio.sampledcrc import HEAD, sampled_crc
from storelib.scan.commitlog import Segment


def _crcs(seg: Segment, data_end: int) -> tuple[int, int]:
    """(head CRC, tail CRC) of the segment's bytes up to ``data_end``."""
    if data_end <= 0:
        return 0, 0
    with seg.open() as src:
        return sampled_crc(lambda lo, n: bytes(src.read(lo, n)) if n else b"", data_end)


def fingerprint(seg: Segment, data_end: int) -> dict[str, Any]:
    """The fingerprint of a segment read up to ``data_end``."""
    head_crc, tail_crc = _crcs(seg, data_end)
    return {"size": seg.file_size, "mtime_ms": seg.mtime_ms, "head_len": min(HEAD, data_end),
            "head_crc": head_crc, "tail_crc": tail_crc}


def prefix_unchanged(seg: Segment, fp: dict[str, Any], data_end: int) -> bool:
    """Are the segment's bytes up to ``data_end`` still those ``fp`` saw (same head, same bytes before it)?"""
    if fp.get("head_len") != min(HEAD, data_end):
        return False
    return (fp.get("head_crc"), fp.get("tail_crc")) == _crcs(seg, data_end)
