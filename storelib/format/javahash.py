"""Java ``String.hashCode`` (over UTF-16 code units), scalar and vectorised over Arrow strings; and
Java's long arithmetic (``wrap64``, ``jrem``) where a broker rule computes with numbers read from disk.

tagsCode and every IndexFile key hash is this function; computing it per message in Python would
dominate a scan, so the vectorised form works on an Arrow string array's data buffer with numpy:
h = sum(u_i * 31^(L-1-i)) mod 2^32, which uint32 arithmetic wraps for free. Since 31 is odd it has an
inverse mod 2^32, so with one running sum over the whole buffer ``C[k] = sum_{j<k} u_j * 31^-j`` every
row is ``(C[end] - C[start]) * 31^(end-1)``: one multiply by a contiguous power table and one cumsum
per byte, two gathers and a multiply per row (no per-byte exponent gather). Rows with non-ASCII text
(UTF-16 units differ from bytes) are recomputed exactly over their UTF-16 units, decoded column-wise
when every such row is valid UTF-8 (else by the broker's decode, row by row).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from storelib.format.properties import java_string

INT_MIN = -(2**31)
_POW_CACHE: list[np.ndarray] = [np.ones(1, dtype=np.uint32)]
_INV31 = pow(31, -1, 1 << 32)
_INV_CACHE: list[np.ndarray] = [np.ones(1, dtype=np.uint32)]


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


def inv_pow31(n: int) -> np.ndarray:
    """``31**-k mod 2**32`` for k in [0, n] as uint32 (cached, grown on demand)."""
    table = _INV_CACHE[0]
    if len(table) <= n:
        size = max(n + 1, 2 * len(table), 1 << 16)
        new = np.empty(size, dtype=np.uint32)
        new[0] = 1
        new[1:] = np.cumprod(np.full(size - 1, _INV31, np.uint32), dtype=np.uint32)
        _INV_CACHE[0] = new
        table = new
    return table[: n + 1]


_BLOCK = 1 << 22  # units per running sum: bounds the power tables (16 MiB each) whatever the input


def hash_units(units: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """hashCode (uint32) of each row ``units[offsets[r]:offsets[r+1]]`` (bytes or UTF-16 code units).

    ``offsets`` are int64, start at 0 and end at ``len(units)``. Inputs over ``_BLOCK`` units are
    hashed in blocks of whole rows, so the cached power tables stay bounded by the block size or the
    longest row.
    """
    n = len(units)
    if n > _BLOCK and len(offsets) > 2:
        out = np.empty(len(offsets) - 1, np.uint32)
        r0 = 0
        while r0 < len(offsets) - 1:
            r1 = int(np.searchsorted(offsets, offsets[r0] + _BLOCK, side="right")) - 1
            r1 = max(r1, r0 + 1)  # at least one row (a row longer than the block)
            o0 = int(offsets[r0])
            out[r0:r1] = _hash_block(units[o0 : int(offsets[r1])], offsets[r0 : r1 + 1] - o0)
            r0 = r1
        return out
    return _hash_block(units, offsets)


def _hash_block(units: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    n = len(units)
    p, inv = pow31(n), inv_pow31(n)
    with np.errstate(over="ignore"):
        w = units.astype(np.uint32)  # a fresh copy: multiplied in place (one temporary less)
        w *= inv[:n]
        cs = np.empty(n + 1, np.uint32)
        cs[0] = 0
        np.cumsum(w, dtype=np.uint32, out=cs[1:])
        ends = offsets[1:]
        return (cs[ends] - cs[offsets[:-1]]) * p[np.maximum(ends - 1, 0)]


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


_FIXED_MAX = 256


def _fixed_width_hashes(seg: np.ndarray, lens: np.ndarray) -> np.ndarray | None:
    """Hashes when every non-empty row has the same byte length L (UNIQ_KEYs: 32 hex digits): the
    bytes are then an (rows, L) matrix and the hash one integer matrix-vector product by the powers
    of 31 (uint32 wraps like Java ints), ~5x cheaper than the running sum. None otherwise."""
    if not len(seg):
        return None
    nz = lens > 0
    L = int(lens.max())
    if L > _FIXED_MAX or not (lens[nz] == L).all():
        return None
    weights = pow31(L - 1)[::-1]
    with np.errstate(over="ignore"):
        hv = np.einsum("ij,j->i", seg.reshape(-1, L).astype(np.uint32), weights)
    if nz.all():
        return hv.astype(np.uint32, copy=False)
    out = np.zeros(len(lens), np.uint32)
    out[nz] = hv
    return out


_NEED = np.full(256, -1, np.int8)  # continuation bytes a UTF-8 lead byte takes; -1: not a lead
_NEED[:0x80] = 0
_NEED[0xC2:0xE0] = 1
_NEED[0xE0:0xF0] = 2
_NEED[0xF0:0xF5] = 3


def _utf16_units(b: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(UTF-16 code units as uint32, unit offsets of the rows) of the UTF-8 bytes ``b`` whose rows
    start at ``bounds`` (with the end last); None unless every row is valid UTF-8 (no overlong form,
    surrogate, value past U+10FFFF, or sequence cut by a row end), where decoding needs no choices."""
    n = len(b)
    need = _NEED[b]
    is_cont = (b & 0xC0) == 0x80
    lead = need >= 0
    if not (lead | is_cont).all():
        return None
    lm = np.flatnonzero(need > 0)  # multi-byte leads
    k = need[lm]
    expect = np.zeros(n + 3, bool)  # positions the leads claim as their continuation bytes
    expect[lm + 1] = True
    expect[lm[k >= 2] + 2] = True
    expect[lm[k == 3] + 3] = True
    if expect[n:].any() or not np.array_equal(expect[:n], is_cont) or expect[bounds[:-1]].any():
        return None
    x = b[lm]
    b1 = b[lm + 1]
    if (((x == 0xE0) & (b1 < 0xA0)) | ((x == 0xED) & (b1 > 0x9F))
            | ((x == 0xF0) & (b1 < 0x90)) | ((x == 0xF4) & (b1 > 0x8F))).any():
        return None
    cp = np.where(k == 1, x & 0x1F, np.where(k == 2, x & 0x0F, x & 0x07)).astype(np.int32)
    cp = (cp << 6) | (b1 & 0x3F)
    for j in (2, 3):
        more = np.flatnonzero(k >= j)
        cp[more] = (cp[more] << 6) | (b[lm[more] + j] & 0x3F)
    val = b.astype(np.uint32)
    astral = cp >= 0x10000
    if not astral.any():
        val[lm] = cp
        units = val[lead]
        ucs = np.r_[0, np.cumsum(lead)]
        return units, ucs[bounds]
    count = lead.astype(np.int64)  # units each byte starts: 1 per lead, 2 for U+10000 and up
    count[lm[astral]] = 2
    upos = np.cumsum(count) - count
    units = np.empty(int(count.sum()), np.uint32)
    li = np.flatnonzero(lead)
    units[upos[li]] = val[li]
    units[upos[lm[~astral]]] = cp[~astral]
    c = cp[astral] - 0x10000
    units[upos[lm[astral]]] = 0xD800 + (c >> 10)
    units[upos[lm[astral]] + 1] = 0xDC00 + (c & 0x3FF)
    ucs = np.r_[0, np.cumsum(count)]
    return units, ucs[bounds]


def java_hashes(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(``String.hashCode`` int32, ``String.length`` int64) of every string of ``arr`` in one pass.

    Nulls give (0, 0). Rows with non-ASCII bytes are hashed over their UTF-16 units; rows of invalid
    UTF-8 (a binary array) as the broker's ``new String(bytes, UTF_8)`` has them (:func:`java_string`).
    """
    offsets, data, valid = _as_string_parts(arr)
    n = len(offsets) - 1
    if n <= 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    seg = data[lo:hi]
    rel = offsets - lo
    len16 = np.diff(rel)
    h = _fixed_width_hashes(seg, len16)
    if h is None:
        h = hash_units(seg, rel)
    if hi > lo and int(seg.max()) >= 0x80:
        rows = np.unique(np.searchsorted(rel[1:], np.flatnonzero(seg >= 0x80), side="right"))
        starts, lens = rel[rows], rel[rows + 1] - rel[rows]
        b = seg[np.repeat(starts - np.cumsum(np.r_[0, lens[:-1]]), lens) + np.arange(int(lens.sum()))]
        bounds = np.r_[0, np.cumsum(lens)]
        fast = _utf16_units(b, bounds)
        if fast is not None:  # valid UTF-8: its UTF-16 units, column-wise
            units, uoff = fast
            h[rows] = hash_units(units, uoff)
            len16[rows] = np.diff(uoff)
        else:  # some row is not valid UTF-8: the broker's decode (java_string) decides, row by row
            enc = [java_string(seg[rel[r] : rel[r + 1]]).encode("utf-16-be", "surrogatepass") for r in rows.tolist()]
            uoff = np.zeros(len(enc) + 1, np.int64)
            np.cumsum([len(e) // 2 for e in enc], out=uoff[1:])
            h[rows] = hash_units(np.frombuffer(b"".join(enc), dtype=">u2").astype(np.uint32), uoff)
            len16[rows] = np.diff(uoff)  # the decoded String's length (one unit per U+FFFD)
    if valid is not None:
        h[~valid] = 0
        len16[~valid] = 0
    return h.view(np.int32), len16


def java_hash_array(arr: pa.Array) -> np.ndarray:
    """Java ``String.hashCode`` of every string in ``arr`` (UTF-8 Arrow strings) as int32.

    Nulls hash to 0 (callers decide what a missing value means). Non-ASCII rows are decoded and
    hashed exactly over UTF-16 units.
    """
    return java_hashes(arr)[0]


def java_hashes_repeated(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """:func:`java_hashes` for columns with few distinct values (topics, tags): each distinct value
    is hashed once (Arrow's hash table finds them, unless ``arr`` is dictionary-encoded already) and the
    results are gathered per row."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if len(arr) == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    enc = arr.dictionary_encode()  # a DictionaryArray returns itself
    dh, dl = java_hashes(enc.dictionary)
    idx = enc.indices
    if idx.null_count:
        codes = np.asarray(idx.fill_null(len(dh)))
        dh, dl = np.append(dh, np.int32(0)), np.append(dl, 0)
    else:
        codes = np.asarray(idx)
    return dh[codes], dl[codes]


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


# ---------------------------------------------------------------------------------------------
# Java long arithmetic: Python ints neither overflow nor round remainders toward zero; a rule that
# computes with a value read from a damaged file (a checkpoint time with its sign bit flipped, an
# offset near the long range) must do what the JVM does with it, or it picks another file than the broker

I64_MIN = -(2**63)


def wrap64(x: int) -> int:
    """``x`` as a Java long: two's complement wrap-around at 64 bits."""
    return ((x - I64_MIN) % 2**64) + I64_MIN


def jrem(a: int, b: int) -> int:
    """Java ``a % b``: the remainder takes the sign of the dividend."""
    r = abs(a) % abs(b)
    return -r if a < 0 else r
