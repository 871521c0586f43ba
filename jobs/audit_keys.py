"""Index-key hashes for the audit's segment tasks: the same (row, hash) pairs as
:func:`storelib.indexfile.index_keys`, with cheaper arithmetic (it was ~35% of a segment task).

Java ``String.hashCode`` is ``sum(u_i * 31^(L-1-i)) mod 2^32``. Since 31 is odd it has an inverse mod
2^32, so with one running sum over the whole string buffer ``C[k] = sum_{j<k} u_j * 31^-j`` every row is
``(C[end] - C[start]) * 31^(end-1)``: one multiply by a contiguous power table, one cumsum and two
gathers per row, in uint32 (which wraps exactly like Java ints) — instead of a per-byte exponent
gather. Rows with non-ASCII bytes are re-hashed over their UTF-16 code units (decoded the way
:func:`storelib.javahash.java_hash_array` does, ``errors="replace"``); their Java lengths use the
same byte classification as :func:`storelib.javahash.utf16_lengths`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.indexfile import TRAN_ROLLBACK
from storelib.javahash import topic_key_hashes

_INV31 = pow(31, -1, 1 << 32)
_TABLES: dict[str, np.ndarray] = {"pow": np.ones(1, np.uint32), "inv": np.ones(1, np.uint32)}


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``31^k`` and ``31^-k`` mod 2^32 for k in [0, n] (cached, grown by doubling)."""
    if len(_TABLES["pow"]) <= n:
        size = max(n + 1, 2 * len(_TABLES["pow"]), 1 << 16)
        for name, base in (("pow", 31), ("inv", _INV31)):
            t = np.empty(size, np.uint32)
            t[0] = 1
            t[1:] = np.cumprod(np.full(size - 1, base, np.uint32), dtype=np.uint32)
            _TABLES[name] = t
    return _TABLES["pow"][: n + 1], _TABLES["inv"][: n + 1]


def hash_units(units: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """hashCode (uint32) of each row ``units[offsets[r]:offsets[r+1]]`` of UTF-16 code units."""
    n = len(units)
    p, inv = _powers(n)
    with np.errstate(over="ignore"):
        w = units.astype(np.uint32, copy=False) * inv[:n]
        cs = np.empty(n + 1, np.uint32)
        cs[0] = 0
        np.cumsum(w, dtype=np.uint32, out=cs[1:])
        ends = offsets[1:]
        s = cs[ends] - cs[offsets[:-1]]
        return s * p[np.maximum(ends - 1, 0)]


def _string_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 [n+1], data uint8) of a string/binary array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    if not large and not (pa.types.is_string(arr.type) or pa.types.is_binary(arr.type)):
        arr = arr.cast(pa.string())
    bufs = arr.buffers()
    odt = np.int64 if large else np.int32
    offsets = np.frombuffer(bufs[1], dtype=odt, count=len(arr) + 1 + arr.offset)[arr.offset :].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return offsets, data


def java_hashes(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(hashCode int32, Java length int64) of every string; nulls give (0, 0) like the storelib helpers."""
    offsets, data = _string_parts(arr)
    n = len(offsets) - 1
    if n <= 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    seg = data[lo:hi]
    rel = offsets - lo
    h = hash_units(seg, rel)
    len16 = np.diff(rel)
    if hi > lo and int(seg.max()) >= 0x80:
        rows = np.unique(np.searchsorted(rel[1:], np.flatnonzero(seg >= 0x80), side="right"))
        enc = []
        for r in rows.tolist():
            s = bytes(seg[rel[r] : rel[r + 1]]).decode("utf-8", "replace")
            enc.append(s.encode("utf-16-be", "surrogatepass"))
        units = np.frombuffer(b"".join(enc), dtype=">u2").astype(np.uint32)
        uoff = np.zeros(len(enc) + 1, np.int64)
        np.cumsum([len(e) // 2 for e in enc], out=uoff[1:])
        h[rows] = hash_units(units, uoff)
        # Java length by byte classification (as utf16_lengths): lead bytes count 1, 4-byte leads 2
        starts, lens = rel[rows], rel[rows + 1] - rel[rows]
        idx = np.repeat(starts - np.cumsum(np.r_[0, lens[:-1]]), lens) + np.arange(int(lens.sum()))
        b = seg[idx]
        unit = ((b & 0xC0) != 0x80).astype(np.int64) + (b >= 0xF0)
        bounds = np.r_[0, np.cumsum(lens)]
        cu = np.r_[0, np.cumsum(unit)]
        len16[rows] = cu[bounds[1:]] - cu[bounds[:-1]]
    if arr.null_count:
        invalid = ~np.asarray(arr.is_valid())
        h[invalid] = 0
        len16[invalid] = 0
    return h.view(np.int32), len16


def _col(batch: pa.RecordBatch | pa.Table, name: str) -> pa.Array:
    c = batch.column(name)
    if isinstance(c, pa.ChunkedArray):
        c = c.combine_chunks() if c.num_chunks != 1 else c.chunk(0)
    return c


def audit_index_keys(batch: pa.RecordBatch | pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Exactly :func:`storelib.indexfile.index_keys` (row_index int64, key hash int32, dispatch order):
    ``topic#UNIQ_KEY`` then ``topic#token`` per KEYS token (split on one space, empty tokens dropped,
    duplicates kept), ROLLBACK records skipped."""
    nrows = batch.num_rows
    if nrows == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int32)
    tran = np.asarray(_col(batch, "tran_type").fill_null(0)).astype(np.int8, copy=False)
    ok = tran != TRAN_ROLLBACK
    topic_h, _ = java_hashes(_col(batch, "topic"))

    uk = _col(batch, "uniq_key")
    urows = np.flatnonzero(ok & np.asarray(uk.is_valid()))
    u_h, u_l = java_hashes(uk)

    lists = pc.split_pattern(_col(batch, "keys"), " ")
    tokens = pc.list_flatten(lists)
    parents = np.asarray(pc.list_parent_indices(lists)).astype(np.int64)
    t_h, t_l = java_hashes(tokens)
    blen = np.asarray(pc.binary_length(tokens)) if len(tokens) else np.zeros(0, np.int32)
    kidx = np.flatnonzero(ok[parents] & (blen > 0)) if len(parents) else np.zeros(0, np.int64)
    trows = parents[kidx]

    rows = np.concatenate((urows.astype(np.int64), trows))
    part = np.concatenate((np.zeros(len(urows), np.int64), np.ones(len(trows), np.int64)))
    order = np.argsort(rows * 2 + part, kind="stable")
    rows = rows[order]
    kh = np.concatenate((u_h[urows], t_h[kidx]))[order]
    kl = np.concatenate((u_l[urows], t_l[kidx]))[order]
    return rows, topic_key_hashes(topic_h[rows], kh, kl)
