"""CRC-32 as the broker computes it (java.util.zip.CRC32, masked with 0x7FFFFFFF).

zlib-ng is about 4x faster than crcmod per short body; the standard zlib is the fallback and crcmod
stays an independent cross-check in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

try:  # pragma: no cover - import choice depends on the environment
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:  # pragma: no cover
    from zlib import crc32 as _crc32

crc32 = _crc32
MASK = 0x7FFFFFFF


def body_crc(data: bytes | memoryview) -> int:
    """The stored BODYCRC value of ``data`` (UtilAll.crc32: CRC-32 & 0x7FFFFFFF; empty → 0)."""
    if len(data) == 0:
        return 0
    return _crc32(data) & MASK


def crc32_ranges(data: memoryview, starts: Sequence[int], ends: Sequence[int]) -> np.ndarray:
    """Unmasked CRC-32 of ``data[s:e]`` for each pair, as int64: one C call per range, chained with ``map``
    (no Python frame per range: about 20% less per record than a generator expression on 400-byte
    bodies, measured 195 vs 245 ns; the call itself is the floor every scan pays)."""
    return np.fromiter(map(_crc32, map(data.__getitem__, map(slice, starts, ends))), np.int64, len(starts))
