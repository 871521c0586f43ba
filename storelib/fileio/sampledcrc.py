"""How a run knows that bytes an earlier run checked are still the bytes it read, without reading them all
again: the CRC32 of the first 64 KB and of the last 4 KB of the range. An append after the range keeps
both; a rewrite or another store's file does not. One policy for commitlog segments (incremental audit
and export), consume-queue units and index entries (incremental audit)."""

from __future__ import annotations

import zlib
from collections.abc import Callable

HEAD = 64 * 1024
TAIL = 4096


def sampled_crc(read: Callable[[int, int], bytes], size: int, item: int = 1) -> tuple[int, int]:
    """(CRC32 of the head, CRC32 of the tail) of ``size`` items of ``item`` bytes each;
    ``read(first, count)`` gives items ``first .. first + count - 1`` as bytes."""
    head = min(size, HEAD // item)
    tail = min(size, TAIL // item)
    return zlib.crc32(read(0, head)), zlib.crc32(read(size - tail, tail))
