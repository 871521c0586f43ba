"""Java ``String.hashCode`` (over UTF-16 code units), scalar and vectorised over Arrow strings.

tagsCode and every IndexFile key hash is this function; computing it per message in Python would
dominate a scan, so the vectorised form works on an Arrow string array's data buffer with numpy:
h = sum(u_i * 31^(L-1-i)) mod 2^32, which uint32 arithmetic wraps for free. Rows with non-ASCII text
(UTF-16 units differ from bytes) are recomputed exactly in Python; they are rare.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

INT_MIN = -(2**31)
_POW_CACHE: list[np.ndarray] = [np.ones(1, dtype=np.uint32)]


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode`` of ``s`` as a signed 32-bit int."""
    h = 0
    b = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(b), 2):
        h = (31 * h + ((b[i] << 8) | b[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def index_hash(key: str) -> int:
    """IndexFile key hash: ``abs(hashCode)`` with Integer.MIN_VALUE mapped to 0."""
    h = java_string_hash(key)
    return 0 if h == INT_MIN else abs(h)


def pow31(n: int) -> np.ndarray:
    """``31**k mod 2**32`` for k in [0, n] as uint32 (cached, grown on demand)."""
    table = _POW_CACHE[0]
    if len(table) <= n:
        size = max(n + 1, 2 * len(table), 1024)
        new = np.empty(size, dtype=np.uint32)
        new[0] = 1
        with np.errstate(over="ignore"):
            # doubling: p[k+m] = p[k] * p[m]; fill by blocks to stay vectorised
            filled = 1
            while filled < size:
                step = min(filled, size - filled)
                new[filled : filled + step] = new[:step] * new[filled - 1] * np.uint32(31)
                filled += step
        _POW_CACHE[0] = new
        table = new
    return table[: n + 1]


def _as_string_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(offsets int64 [n+1], data uint8, validity bool or None) of a string/binary array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        odt = np.int64
    else:
        if not (pa.types.is_string(arr.type) or pa.types.is_binary(arr.type)):
            arr = arr.cast(pa.string())
        odt = np.int32
    bufs = arr.buffers()
    n = len(arr)
    offsets = np.frombuffer(bufs[1], dtype=odt, count=n + 1 + arr.offset)[arr.offset :].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    valid = None
    if arr.null_count:
        valid = np.asarray(arr.is_valid())
    return offsets, data, valid


def utf16_lengths(arr: pa.Array) -> np.ndarray:
    """Number of UTF-16 code units of each string (Java ``String.length``), int64; nulls give 0."""
    offsets, data, valid = _as_string_parts(arr)
    if len(offsets) <= 1:
        return np.zeros(0, dtype=np.int64)
    seg = data[offsets[0] : offsets[-1]]
    units = ((seg & 0xC0) != 0x80).astype(np.int64) + (seg >= 0xF0)
    cs = np.concatenate(([0], np.cumsum(units)))
    rel = offsets - offsets[0]
    out = cs[rel[1:]] - cs[rel[:-1]]
    if valid is not None:
        out[~valid] = 0
    return out


def java_hash_array(arr: pa.Array) -> np.ndarray:
    """Java ``String.hashCode`` of every string in ``arr`` (UTF-8 Arrow strings) as int32.

    Nulls hash to 0 (callers decide what a missing value means). Non-ASCII rows are decoded and
    hashed exactly over UTF-16 units.
    """
    offsets, data, valid = _as_string_parts(arr)
    n = len(offsets) - 1
    if n <= 0:
        return np.zeros(0, dtype=np.int32)
    lo, hi = int(offsets[0]), int(offsets[-1])
    seg = data[lo:hi]
    lens = np.diff(offsets)
    out = np.zeros(n, dtype=np.uint32)
    if hi > lo:
        maxlen = int(lens.max())
        table = pow31(maxlen)
        ends = offsets[1:] - lo
        exps = np.repeat(ends - 1, lens) - np.arange(hi - lo, dtype=np.int64)
        with np.errstate(over="ignore"):
            terms = seg.astype(np.uint32) * table[exps]
            cs = np.concatenate((np.zeros(1, np.uint32), np.cumsum(terms, dtype=np.uint32)))
            rel = offsets - lo
            out = cs[rel[1:]] - cs[rel[:-1]]
        nonascii = np.flatnonzero(seg >= 0x80)
        if len(nonascii):
            rows = np.unique(np.searchsorted(offsets[1:] - lo, nonascii, side="right"))
            for r in rows.tolist():
                s = bytes(seg[offsets[r] - lo : offsets[r + 1] - lo]).decode("utf-8", "replace")
                out[r] = java_string_hash(s) & 0xFFFFFFFF
    if valid is not None:
        out[~valid] = 0
    return out.view(np.int32)


def combine_hash(prefix_hash: np.ndarray, suffix_hash: np.ndarray, suffix_len16: np.ndarray) -> np.ndarray:
    """hashCode(a + b) from hashCode(a), hashCode(b) and len16(b): h(a)*31^len(b) + h(b) mod 2^32."""
    table = pow31(int(suffix_len16.max()) if len(suffix_len16) else 0)
    with np.errstate(over="ignore"):
        r = prefix_hash.view(np.uint32) * table[suffix_len16] + suffix_hash.view(np.uint32)
    return r.astype(np.uint32).view(np.int32)


def to_index_hash(h: np.ndarray) -> np.ndarray:
    """Vectorised ``index_hash`` from signed hashCodes: abs, with INT_MIN mapped to 0, as int32."""
    h64 = h.astype(np.int64)
    r = np.abs(h64)
    r[h64 == INT_MIN] = 0
    return r.astype(np.int32)


def topic_key_hashes(topic_hash: np.ndarray, key_hash: np.ndarray, key_len16: np.ndarray) -> np.ndarray:
    """index hash of ``topic + "#" + key`` given per-row hashCode(topic), hashCode(key), len16(key)."""
    with np.errstate(over="ignore"):
        th = topic_hash.view(np.uint32) * np.uint32(31) + np.uint32(ord("#"))
    return to_index_hash(combine_hash(th.astype(np.uint32).view(np.int32), key_hash, key_len16))
