"""The columnar batch decoder: one commitlog segment (or a split of it) → Arrow record batches.

Every scan in the project goes through :class:`SegmentScan`. Per-message Python work is limited to
the size-chain walk (one ``struct.unpack_from`` of TOTALSIZE per record) and one CRC call per body;
every field is then extracted with numpy over arrays of record offsets (the 88 fixed bytes of the
common IPv4/IPv4 layout in one item gather), strings are gathered into Arrow buffers, and property
lookups, hashes and host formatting are column operations. Only the requested columns are built:
the dispatch columns look up TAGS/KEYS/UNIQ_KEY by comparing the first bytes of every property
segment (:class:`FastProperties`); every pair is parsed only when the ``properties`` map is asked
for (:class:`SplitProperties`).

The scan stops at the first record that fails the broker's validation (CommitLog.
checkMessageAndReturnSize), exactly where the broker would, and reports why in :attr:`SegmentScan.end`.
"""

from __future__ import annotations

import re
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .brokerconf import DEFAULT_DELAY_LEVEL, parse_delay_levels
from .bytesource import DEFAULT_WINDOW, LocalSource
from .crc import MASK, crc32
from .javahash import java_hashes_repeated
from .record import (
    BLANK_MAGIC,
    BORNHOST_V6_FLAG,
    MAGIC_V1,
    MAGIC_V2,
    SCHEDULE_TOPIC,
    STOREHOST_V6_FLAG,
    check_record,
    decode_host,
)

DEFAULT_DELAY_LEVELS_MS = list(parse_delay_levels(DEFAULT_DELAY_LEVEL))
MIN_RECORD_SIZE = 91  # IPv4/IPv4 V1 record with empty body, topic and properties

MESSAGE_FIELDS: list[pa.Field] = [
    pa.field("phy_offset", pa.int64(), False),
    pa.field("size", pa.int32(), False),
    pa.field("magic_version", pa.int8(), False),
    pa.field("body_crc", pa.int32(), False),
    pa.field("crc_ok", pa.bool_()),
    pa.field("queue_id", pa.int32(), False),
    pa.field("flag", pa.int32(), False),
    pa.field("queue_offset", pa.int64(), False),
    pa.field("physical_offset_field", pa.int64(), False),
    pa.field("sys_flag", pa.int32(), False),
    pa.field("tran_type", pa.int8(), False),
    pa.field("born_timestamp", pa.int64(), False),
    pa.field("born_host", pa.string(), False),
    pa.field("store_timestamp", pa.int64(), False),
    pa.field("store_host", pa.string(), False),
    pa.field("reconsume_times", pa.int32(), False),
    pa.field("prepared_transaction_offset", pa.int64(), False),
    pa.field("body_len", pa.int32(), False),
    pa.field("topic", pa.string(), False),
    pa.field("tags", pa.string()),
    pa.field("keys", pa.string()),
    pa.field("uniq_key", pa.string()),
    pa.field("msg_id", pa.string(), False),
    pa.field("tags_code", pa.int64(), False),
    pa.field("properties", pa.map_(pa.string(), pa.string())),
    pa.field("properties_raw", pa.string()),
    pa.field("prop_crc_ok", pa.bool_()),
    pa.field("delay_level", pa.int32()),
    pa.field("body", pa.binary()),
]
MESSAGE_SCHEMA = pa.schema(MESSAGE_FIELDS)


def message_schema(with_body: bool = False, with_properties: bool = True) -> pa.Schema:
    """The scan schema for a choice of optional columns."""
    drop = set()
    if not with_body:
        drop.add("body")
    if not with_properties:
        drop.add("properties")
    return pa.schema([f for f in MESSAGE_FIELDS if f.name not in drop])


FULL_KINDS = ("blank", "segment_end")  # scan ends after which the segment holds no more: the log goes on in the next


@dataclass
class SegmentEnd:
    """How and where a segment (or split) scan ended.

    kind: ``blank`` (end-of-file record), ``end_of_data`` (zeros: nothing written here),
    ``segment_end`` (the file ended exactly at a record boundary), ``split_end`` (the split's end was
    reached), ``invalid`` (a record failed validation: see ``reason``/``detail``).
    """

    kind: str
    file: str
    file_offset: int
    phy_offset: int
    reason: str | None = None
    detail: str | None = None
    size: int | None = None  # TOTALSIZE the broker reports for a length mismatch, else None
    records: int = 0
    crc_errors: int = 0
    first_crc_error: int | None = None  # phy offset of the first body CRC mismatch seen

    @property
    def segment_full(self) -> bool:
        """Did the segment end here (end-of-file record or its last byte), so the log goes on in the next?"""
        return self.kind in FULL_KINDS

    @property
    def valid_end(self) -> int:
        """Physical offset right after the last valid record (the broker's processOffset candidate)."""
        return self.phy_offset

    def to_dict(self) -> dict:
        return dict(self.__dict__)


_HDR_DT = np.dtype(
    [("total", ">i4"), ("magic", ">i4"), ("crc", ">i4"), ("qid", ">i4"), ("flag", ">i4"),
     ("qoff", ">i8"), ("phy", ">i8"), ("sysflag", ">i4"), ("born", ">i8")]
)
# the whole fixed part of an IPv4/IPv4 record (the common layout): 88 bytes, BODYLENGTH last
_V4_DT = np.dtype(
    [("total", ">i4"), ("magic", ">i4"), ("crc", ">i4"), ("qid", ">i4"), ("flag", ">i4"),
     ("qoff", ">i8"), ("phy", ">i8"), ("sysflag", ">i4"), ("born", ">i8"), ("bhost", "V8"), ("sts", ">i8"),
     ("shost", "V8"), ("rc", ">i4"), ("prep", ">i8"), ("bl", ">i4")]
)
_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_PAIR = struct.Struct(">ii")
_I32 = struct.Struct(">i")
_JAVA_INT = re.compile(r"[+-]?\d+")


def ragged_arange(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of ``range(s, s+l)`` for every (s, l), vectorised (int64)."""
    lens = lens.astype(np.int64)
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    excl = np.cumsum(lens) - lens
    return np.repeat(starts.astype(np.int64) - excl, lens) + np.arange(total, dtype=np.int64)


def _overlapping(a: np.ndarray, dtype) -> np.ndarray:
    """``a`` seen as overlapping items of ``dtype``, one starting at every byte (stride 1, zero copy)."""
    dt = np.dtype(dtype)
    return np.ndarray((len(a) - dt.itemsize + 1,), dtype=dt, buffer=a, strides=(1,))


def rows_at(a: np.ndarray, offs: np.ndarray, width: int) -> np.ndarray:
    """(n, width) uint8 copy of ``a[o:o+width]`` for every offset: one gather of ``V{width}`` items
    on a stride-1 view (an item copy per row, several times faster than a 2-D fancy index)."""
    if len(a) < width:
        a = np.concatenate([a, np.zeros(width - len(a), np.uint8)])
    return _overlapping(a, f"V{width}")[offs].view(np.uint8).reshape(-1, width)


def gather_be(a: np.ndarray, offs: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """Big-endian integers of ``width`` bytes at each offset of ``a``, as native int64."""
    if len(a) < width:
        return rows_at(a, offs, width).view(dtype).ravel().astype(np.int64)
    return _overlapping(a, dtype)[offs].astype(np.int64)


def _offsets_from_lens(lens: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=out[1:])
    return out


def view_array(a: np.ndarray, buf, starts: np.ndarray, lens: np.ndarray) -> pa.Array:
    """A ``binary_view`` Arrow array whose rows point into ``buf`` (zero copy; short rows inline)."""
    n = len(starts)
    lens = np.maximum(lens, 0).astype(np.int64)
    v = np.zeros((n, 4), dtype="<i4")
    v[:, 0] = lens
    long = lens > 12
    if long.any():
        v[long, 1] = rows_at(a, starts[long], 4).view("<i4").ravel()
        v[long, 3] = starts[long]
    short = ~long
    if short.any():
        g = rows_at(a, np.minimum(starts[short], max(len(a) - 12, 0)), 12).copy()
        shift = starts[short] - np.minimum(starts[short], max(len(a) - 12, 0))
        if shift.any():  # rows in the last 12 bytes of the buffer: realign (rare)
            for r in np.flatnonzero(shift).tolist():
                g[r] = np.roll(g[r], -int(shift[r]))
        g[np.arange(12) >= lens[short, None]] = 0
        v.view(np.uint8).reshape(n, 16)[short, 4:16] = g
    return pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(v), pa.py_buffer(buf)])


def gather_strings(a: np.ndarray, starts: np.ndarray, lens: np.ndarray, binary: bool = False, buf=None) -> pa.Array:
    """Arrow string (or binary) array of byte ranges of ``a`` (copied by Arrow's C++ cast).

    Invalid UTF-8 is replaced with U+FFFD row by row (Java decodes the same way); such rows are rare.
    """
    views = view_array(a, a if buf is None else buf, starts, lens)
    if binary:
        return views.cast(pa.binary())
    try:
        return views.cast(pa.string())
    except pa.ArrowInvalid:
        raw = views.cast(pa.binary()).to_pylist()
        return pa.array([r.decode("utf-8", "replace") for r in raw], pa.string())


def msg_id_strings(a: np.ndarray, p_sh: np.ndarray, v6: np.ndarray, phy_pos: np.ndarray) -> pa.Array:
    """Offset msgIds: upper-case hex of store host bytes ‖ PHYSICALOFFSET field, column-wise."""
    n = len(p_sh)
    raw = np.concatenate([rows_at(a, p_sh, 8), rows_at(a, phy_pos, 8)], axis=1)
    txt = np.empty((n, 32), dtype=np.uint8)
    txt[:, 0::2] = _HEX[raw >> 4]
    txt[:, 1::2] = _HEX[raw & 15]
    offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
    out = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(txt)])
    if v6.any():
        rows = np.flatnonzero(v6)
        vals = [(a[p : p + 20].tobytes() + a[q : q + 8].tobytes()).hex().upper()
                for p, q in zip(p_sh[rows].tolist(), phy_pos[rows].tolist())]
        out = pc.replace_with_mask(out, pa.array(v6), pa.array(vals, pa.string()))
    return out


def host_strings(a: np.ndarray, starts: np.ndarray, v6: np.ndarray) -> pa.Array:
    """"ip:port" strings for host fields at ``starts`` (8 bytes IPv4, 20 bytes IPv6 where ``v6``).

    A store has few distinct hosts: format each distinct value once, then ``take`` it per row.
    """
    n = len(starts)
    if n == 0:
        return pa.array([], pa.string())
    codes = np.zeros(n, dtype=np.int64)
    texts: list[str] = []
    for mask, width in ((~v6, 8), (v6, 20)):
        rows = np.flatnonzero(mask)
        if not len(rows):
            continue
        raw = np.ascontiguousarray(rows_at(a, starts[rows], width))
        keys = raw.view(">u8").ravel() if width == 8 else raw.view(np.dtype((np.void, width))).ravel()
        uniq, inverse = np.unique(keys, return_inverse=True)
        codes[rows] = inverse.ravel() + len(texts)
        if width == 8:
            texts.extend(decode_host(int(u).to_bytes(8, "big")) for u in uniq)
        else:
            texts.extend(decode_host(u.tobytes()) for u in uniq)
    return pc.take(pa.array(texts, pa.string()), pa.array(codes))


class PropertyColumns:
    """Named property values and the full map, extracted column-wise from raw property strings.

    Splits every properties string on 0x02 once (Arrow), then applies the broker's rules per segment:
    a pair counts when its first 0x01 is strictly inside the segment with a non-empty name and
    value; the last valid occurrence of a name wins.
    """

    def __init__(self, raw: pa.Array):
        self.n = len(raw)
        lists = pc.split_pattern(raw, "\x02")
        self.parents = np.asarray(pc.list_parent_indices(lists))
        self.flat = pc.list_flatten(lists)
        flat_bin = self.flat.cast(pa.binary())
        self.seg_len = np.asarray(pc.binary_length(flat_bin).fill_null(0), dtype=np.int64)
        pos = np.asarray(pc.find_substring(flat_bin, "\x01").fill_null(-1), dtype=np.int64)
        # the segment is valid when 0 < pos < len-1 (search beyond the segment never lands inside it)
        self.pair_ok = (pos > 0) & (pos < self.seg_len - 1)
        self.sep = pos
        self._flat_bin = flat_bin

    def value(self, name: str) -> pa.Array:
        """The value of property ``name`` per row (null when absent), last valid occurrence winning."""
        prefix = name + "\x01"
        hit = np.asarray(pc.starts_with(self.flat, prefix).fill_null(False)) & self.pair_ok
        hit &= self.sep == len(prefix.encode()) - 1
        idx = np.flatnonzero(hit)
        out_idx = np.full(self.n, -1, dtype=np.int64)
        if len(idx):
            par = self.parents[idx]
            last = np.ones(len(idx), dtype=bool)
            last[:-1] = par[:-1] != par[1:]
            out_idx[par[last]] = idx[last]
        taken = pc.take(self.flat, pa.array(np.where(out_idx >= 0, out_idx, 0)))
        vals = pc.utf8_slice_codeunits(taken, len(prefix)) if self.n else taken
        return pc.if_else(pa.array(out_idx >= 0), vals, pa.scalar(None, pa.string()))

    def as_map(self) -> pa.Array:
        """map<string,string> of every valid pair, in stored order, later duplicates winning."""
        ok = self.pair_ok
        idx = np.flatnonzero(ok)
        pairs = pc.split_pattern(pc.take(self.flat, pa.array(idx)), "\x01", max_splits=1)
        names = pc.list_element(pairs, 0)
        values = pc.list_element(pairs, 1)
        par = self.parents[idx]
        counts = np.bincount(par, minlength=self.n)
        names_s = names
        values_s = values
        # duplicate names inside a row are rare: find the rows with a per-row bitmask of name codes
        dup_rows = np.zeros(0, np.int64)
        if len(idx) and counts.max() > 1:
            enc = pc.dictionary_encode(names_s)
            code = np.asarray(enc.indices, dtype=np.int64)
            if len(enc.dictionary) <= 63:
                bits = np.left_shift(np.uint64(1), code.astype(np.uint64))
                present = np.zeros(self.n, dtype=np.uint64)
                _or_reduce(present, par, bits, counts)
                distinct = np.bitwise_count(present).astype(np.int64)
                dup_rows = np.flatnonzero(distinct != counts)
            else:
                combo = par.astype(np.int64) << 32 | code
                order = np.lexsort((np.arange(len(combo)), combo))
                sc = combo[order]
                dup_rows = np.unique(par[order[1:][sc[1:] == sc[:-1]]])
        if len(dup_rows):
            keep = np.ones(len(idx), dtype=bool)
            nl, vl = names_s.to_pylist(), values_s.to_pylist()
            starts = _offsets_from_lens(counts)
            for r in dup_rows.tolist():
                seen: dict[str, int] = {}
                for j in range(starts[r], starts[r + 1]):
                    if nl[j] in seen:
                        keep[j] = False
                        vl[seen[nl[j]]] = vl[j]
                    else:
                        seen[nl[j]] = j
            values_s = pa.array(vl, pa.string())
            keep_a = pa.array(keep)
            names_s = names_s.filter(keep_a)
            values_s = values_s.filter(keep_a)
            counts = np.bincount(par[keep], minlength=self.n)
        offsets = pa.array(_offsets_from_lens(counts).astype(np.int32))
        return pa.MapArray.from_arrays(offsets, names_s, values_s)


_TAIL_DT = {
    w: np.dtype([("b", f"V{bhw}"), ("sts", ">i8"), ("s", f"V{shw}"), ("rc", ">i4"), ("prep", ">i8"), ("bl", ">i4")])
    for w, (bhw, shw) in {(8, 8): (8, 8), (20, 8): (20, 8), (8, 20): (8, 20), (20, 20): (20, 20)}.items()
}


def _tail_fields(a: np.ndarray, st: np.ndarray, bh: np.ndarray, sh: np.ndarray, ok: np.ndarray):
    """STORETIMESTAMP, RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET, BODYLENGTH: one gather per host layout."""
    n = len(st)
    out = [np.zeros(n, np.int64) for _ in range(4)]
    for (bw, sw), dt in _TAIL_DT.items():
        rows = np.flatnonzero((bh == bw) & (sh == sw) & ok)
        if not len(rows):
            continue
        rec = rows_at(a, st[rows] + 48, dt.itemsize).view(dt).ravel()
        for o, name in zip(out, ("sts", "rc", "prep", "bl")):
            o[rows] = rec[name]
    return out


def _or_reduce(out: np.ndarray, par: np.ndarray | None, bits: np.ndarray, counts: np.ndarray) -> None:
    """Per-row OR of ``bits`` (rows are contiguous runs of ``par``), via reduceat over non-empty rows."""
    nz = np.flatnonzero(counts)
    starts = (np.cumsum(counts) - counts)[nz]
    out[nz] = np.bitwise_or.reduceat(bits, starts)


def tags_codes(tags: pa.Array, topics: pa.Array, store_ts: np.ndarray, delay: np.ndarray | None,
               delay_levels_ms: list[int]) -> np.ndarray:
    """CQ tagsCode per record (store-format §4.3): hash of TAGS, or the delivery time for delay records."""
    h = java_hashes_repeated(tags)[0].astype(np.int64)  # few distinct tags; sign-extended: int32 → int64
    if delay is not None:
        max_level = len(delay_levels_ms)
        lv = np.minimum(delay, max_level)
        use = (delay > -(2**40)) & (lv > 0)
        if use.any():
            table = np.asarray([0, *delay_levels_ms], dtype=np.int64)
            h = np.where(use, store_ts + table[np.clip(lv, 0, max_level)], h)
    return h


# --------------------------------------------------------------------------------------------------
# fast paths (see docs in each): strings by one Arrow ``take`` over a
# token array laid on the source buffer, property parsing over byte events with numpy
# --------------------------------------------------------------------------------------------------

_HEX2 = np.array([ord("0123456789ABCDEF"[i >> 4]) | ord("0123456789ABCDEF"[i & 15]) << 8 for i in range(256)],
                 dtype="<u2")
_SCHED_B = np.frombuffer(SCHEDULE_TOPIC.encode(), np.uint8)
_U64 = np.uint64


def take_ranges(buf: pa.Buffer, starts: np.ndarray, lens: np.ndarray) -> pa.Array:
    """Binary array of the byte ranges ``[s, s+l)`` of ``buf`` (ascending, non-overlapping), copied.

    The ranges and the gaps between them form one zero-copy token array over ``buf``; a single Arrow
    ``take`` of the even tokens copies the ranges out (much cheaper than building views row by row).
    """
    n = len(starts)
    if n == 0:
        return pa.array([], pa.binary())
    base = int(starts[0])
    toff = np.empty(2 * n, np.int64)
    toff[0::2] = starts
    toff[1::2] = starts + lens
    toff -= base
    if toff[-1] < 2**31:
        typ, toff = pa.binary(), toff.astype(np.int32)
    else:  # pragma: no cover - batches spanning 2 GiB
        typ = pa.large_binary()
    tokens = pa.Array.from_buffers(typ, 2 * n - 1, [None, pa.py_buffer(toff), buf.slice(base)])
    out = tokens.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))
    return out.cast(pa.binary()) if typ != pa.binary() else out


def _string_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 rebased to 0, data uint8 from the first offset) of a binary/string array."""
    n = len(arr)
    bufs = arr.buffers()
    off = np.frombuffer(bufs[1], np.int32, count=n + 1, offset=4 * arr.offset).astype(np.int64)
    lo, hi = int(off[0]), int(off[-1])
    data = np.frombuffer(bufs[2], np.uint8)[lo:hi] if bufs[2] is not None and hi > lo else np.zeros(0, np.uint8)
    return off - lo, data


def as_utf8(binary: pa.Array) -> tuple[pa.Array, bool]:
    """(string array, clean) of a binary array: zero-copy when valid UTF-8 (ASCII checked with numpy).

    Rows with invalid UTF-8 are decoded with U+FFFD replacement (as Java does); ``clean`` is False then.
    """
    if len(binary) == 0:
        return binary.view(pa.string()), True
    _, data = _string_parts(binary)
    s = binary.view(pa.string())
    if not len(data) or int(data.max()) < 0x80:
        return s, True
    try:
        s.validate(full=True)
        return s, True
    except pa.ArrowInvalid:
        raw = binary.to_pylist()
        return pa.array([None if r is None else r.decode("utf-8", "replace") for r in raw], pa.string()), False


class FastProperties:
    """Named property values over the bytes of a clean (valid UTF-8) binary properties column.

    One numpy pass finds every 0x02. A segment (text between separators, per row) starts at a row
    start or right after a 0x02; it is named ``N`` when it starts with ``N`` + 0x01 (its first 0x01
    then ends the name) and counts when its value (up to the next 0x02 or the row end) is non-empty:
    the broker's rule (first 0x01 strictly inside the segment, non-empty name and value; the last
    valid occurrence of a name wins). A lookup compares the first 8 bytes of every segment with the
    name's, so the dispatch columns (TAGS, KEYS, UNIQ_KEY) never parse the other pairs; the map
    (:meth:`as_map`) is built by :class:`SplitProperties`, which parses every pair. Values are copied
    with one Arrow ``take`` over a token array laid on the bytes.
    """

    def __init__(self, raw: pa.Array):
        self.raw = raw
        n = self.n = len(raw)
        ro, d = _string_parts(raw)
        self.ro, self.d = ro, d
        self.data_buf = raw.buffers()[2]
        self.data_base = int(np.frombuffer(raw.buffers()[1], np.int32, count=1, offset=4 * raw.offset)[0]) if n else 0
        self.e2 = np.flatnonzero(d == 2)
        self._k_row: np.ndarray | None = None
        self._k_sep: np.ndarray | None = None
        self._sep_row: np.ndarray | None = None

    def _key8(self, pos: np.ndarray) -> np.ndarray:
        """The 8 bytes at each position of ``d`` as a little-endian uint64 (zero past the end)."""
        d = self.d
        if len(d) >= 8:
            s8 = np.minimum(pos, len(d) - 8)
            k = _overlapping(d, "<u8")[s8]
            late = np.flatnonzero(s8 != pos)
        else:
            k = np.zeros(len(pos), np.uint64)
            late = np.arange(len(pos))
        if len(late):  # positions in the last 8 bytes: exact bytes, zero padded
            tail = np.zeros(16, np.uint8)
            lo = max(len(d) - 8, 0)
            tail[: len(d) - lo] = d[lo:]
            k[late] = _overlapping(tail, "<u8")[pos[late] - lo]
        return k

    @property
    def sep_row(self) -> np.ndarray:
        """The row of every 0x02 (one search per row, then a repeat: cheaper than a search per hit)."""
        if self._sep_row is None:
            self._sep_row = np.repeat(np.arange(self.n, dtype=np.int64), np.diff(np.searchsorted(self.e2, self.ro)))
        return self._sep_row

    def _match(self, keys: np.ndarray, pos: np.ndarray, pat: bytes) -> np.ndarray:
        """Indices of the positions where ``pat`` (name + 0x01) starts."""
        L = len(pat)
        if L < 8:
            return np.flatnonzero((keys & _U64((1 << (8 * L)) - 1)) == _U64(int.from_bytes(pat, "little")))
        hits = np.flatnonzero(keys == _U64(int.from_bytes(pat[:8], "little")))
        if L > 8 and len(hits):
            s = pos[hits] + 8
            fits = s + (L - 8) <= len(self.d)
            hits, s = hits[fits], s[fits]
            if len(hits):
                hits = hits[(rows_at(self.d, s, L - 8) == np.frombuffer(pat[8:], np.uint8)).all(axis=1)]
        return hits

    def value_span(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows holding ``name``, value starts in ``d``, value lengths) for the last valid occurrences."""
        pat = name.encode() + b"\x01"
        L = len(pat)
        n, ro, e2 = self.n, self.ro, self.e2
        if self._k_row is None:
            self._k_row = self._key8(ro[:-1])
            self._k_sep = self._key8(e2 + 1)
        assert self._k_sep is not None
        start = np.full(n, -1, np.int64)
        end = np.zeros(n, np.int64)
        nsep = len(e2)
        hr = self._match(self._k_row, ro[:-1], pat)  # segments at row starts
        if len(hr):
            s = ro[hr]
            j = np.searchsorted(e2, s)
            e = np.minimum(np.where(j < nsep, e2[np.minimum(j, max(nsep - 1, 0))] if nsep else 0, ro[-1]), ro[hr + 1])
            ok = e - s > L
            start[hr[ok]], end[hr[ok]] = s[ok], e[ok]
        hs = self._match(self._k_sep, e2 + 1, pat)  # segments after a separator: later in their row
        if len(hs):
            s = e2[hs] + 1
            r = self.sep_row[hs]  # the row holding the separator
            nxt = np.where(hs + 1 < nsep, e2[np.minimum(hs + 1, nsep - 1)], ro[-1])
            e = np.minimum(nxt, ro[r + 1])
            ok = e - s > L
            r, s, e = r[ok], s[ok], e[ok]
            if len(r):
                last = np.ones(len(r), bool)
                last[:-1] = r[:-1] != r[1:]
                start[r[last]], end[r[last]] = s[last], e[last]
        rows = np.flatnonzero(start >= 0)
        vs = start[rows] + L
        return rows, vs, end[rows] - vs

    def value(self, name: str) -> pa.Array:
        """The value of property ``name`` per row (null when absent)."""
        rows, vs, vl = self.value_span(name)
        n = self.n
        if not len(rows):
            return pa.nulls(n, pa.string())
        tok = np.empty(2 * len(rows), np.int64)
        tok[0::2] = vs
        tok[1::2] = vs + vl
        if self.data_base:
            tok += self.data_base
        tokens = pa.Array.from_buffers(pa.binary(), 2 * len(rows) - 1,
                                       [None, pa.py_buffer(tok.astype(np.int32)), self.data_buf])
        if len(rows) == n:
            return tokens.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64))).view(pa.string())
        ix = np.zeros(n, np.int64)
        ix[rows] = np.arange(0, 2 * len(rows), 2, dtype=np.int64)
        miss = np.ones(n, bool)
        miss[rows] = False
        return tokens.take(pa.array(ix, mask=miss)).view(pa.string())

    def as_map(self) -> pa.Array:
        """map<string,string> of every valid pair (see :class:`SplitProperties`, which parses every pair)."""
        return SplitProperties(self.raw).as_map()


class SplitProperties:
    """Full property parsing (for the map) over the bytes of a clean (valid UTF-8) binary properties column.

    Arrow splits every row on 0x02 and finds the first 0x01 of each segment (C++); the broker's rule
    (a pair counts when that 0x01 is strictly inside the segment with non-empty name and value; the
    last valid occurrence of a name wins) is then a few numpy operations per segment. Names are
    copied out once (they are the map's keys) and identified by Arrow's hash table (exact, any
    length); values are copied with one Arrow ``take`` from a token array laid over the segments.
    """

    def __init__(self, raw: pa.Array):
        n = self.n = len(raw)
        lists = pc.split_pattern(raw, b"\x02")  # segments (C++), then the first 0x01 of each
        flat = lists.values
        m = len(flat)
        loff = np.frombuffer(lists.buffers()[1], np.int32, count=n + 1, offset=4 * lists.offset)
        fo, d = _string_parts(flat)
        self.data_buf = flat.buffers()[2]
        self.data_base = int(np.frombuffer(flat.buffers()[1], np.int32, count=1, offset=4 * flat.offset)[0]) if m else 0
        self.d = d
        seg_s, seg_e = fo[:-1], fo[1:]
        pos = np.asarray(pc.find_substring(flat, b"\x01")).astype(np.int64) if m else np.zeros(0, np.int64)
        ok = (pos > 0) & (pos < seg_e - seg_s - 1)
        sel = np.flatnonzero(ok)
        self.s, self.e = seg_s[sel], seg_e[sel]
        self.row = np.repeat(np.arange(n, dtype=np.int64), np.diff(loff))[sel]
        self.p1 = self.s + pos[sel]
        self.P = len(sel)
        self._tokens: pa.Array | None = None
        self._names: tuple[pa.Array, np.ndarray, dict[str, int], int] | None = None

    def tokens(self) -> pa.Array:
        """Token array over the properties bytes: per pair name, 0x01, value, gap (4 tokens)."""
        if self._tokens is None:
            t = np.empty(4 * self.P, np.int32)
            t[0::4], t[1::4], t[2::4], t[3::4] = self.s, self.p1, self.p1, self.e
            t[2::4] += 1
            if self.data_base:
                t += self.data_base
            self._tokens = pa.Array.from_buffers(pa.binary(), max(4 * self.P - 1, 0),
                                                 [None, pa.py_buffer(t), self.data_buf])
        return self._tokens

    def names(self) -> tuple[pa.Array, np.ndarray, dict[str, int], int]:
        """(name of every pair, its code, code by name, number of distinct names)."""
        if self._names is None:
            keys = self.tokens().take(pa.array(np.arange(0, 4 * self.P, 4, dtype=np.int64))).view(pa.string())
            enc = pc.dictionary_encode(keys)
            dic = enc.dictionary.to_pylist()
            self._names = (keys, np.asarray(enc.indices), {k: i for i, k in enumerate(dic)}, len(dic))
        return self._names

    def last_pair(self, name: str) -> np.ndarray:
        """Per row, the index of the pair holding the last valid occurrence of ``name``, or -1."""
        out = np.full(self.n, -1, np.int64)
        code = self.names()[2].get(name) if self.P else None
        if code is None:
            return out
        hits = np.flatnonzero(self.names()[1] == code)
        if len(hits):
            r = self.row[hits]
            last = np.ones(len(hits), bool)
            last[:-1] = r[:-1] != r[1:]
            out[r[last]] = hits[last]
        return out

    def value(self, name: str) -> pa.Array:
        """The value of property ``name`` per row (null when absent)."""
        idx = self.last_pair(name)
        miss = idx < 0
        if miss.all():
            return pa.nulls(self.n, pa.string())
        take = pa.array(4 * np.where(miss, 0, idx) + 2, mask=miss if miss.any() else None)
        return self.tokens().take(take).view(pa.string())

    def value_span(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows holding ``name``, value starts in ``d``, value lengths) for the last valid occurrences."""
        idx = self.last_pair(name)
        rows = np.flatnonzero(idx >= 0)
        pairs = idx[rows]
        return rows, self.p1[pairs] + 1, self.e[pairs] - self.p1[pairs] - 1

    def as_map(self) -> pa.Array:
        """map<string,string> of every valid pair in stored order; a repeated name keeps its first
        position and its last value (rows with repeats are found exactly and fixed in Python)."""
        P, n = self.P, self.n
        if not P:
            return pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()),
                                           pa.array([], pa.string()))
        counts = np.bincount(self.row, minlength=n)
        keys, code, _, distinct = self.names()
        if distinct <= 64:
            bits = np.left_shift(_U64(1), code.astype(_U64))
            present = np.zeros(n, _U64)
            _or_reduce(present, self.row, bits, counts)
            dup_rows = np.flatnonzero(np.bitwise_count(present).astype(np.int64) != counts)
        else:
            combo = self.row << 32 | code.astype(np.int64)
            order = np.lexsort((np.arange(P), combo))
            sc = combo[order]
            dup_rows = np.unique(self.row[order[1:][sc[1:] == sc[:-1]]])
        value_idx = 4 * np.arange(P, dtype=np.int64) + 2
        if len(dup_rows):
            keep = np.ones(P, bool)
            starts = _offsets_from_lens(counts)
            for r in dup_rows.tolist():
                seen: dict[int, int] = {}
                for j in range(int(starts[r]), int(starts[r + 1])):
                    c = int(code[j])
                    if c in seen:
                        keep[j] = False
                        value_idx[seen[c]] = value_idx[j]
                    else:
                        seen[c] = j
            keys, value_idx = keys.filter(pa.array(keep)), value_idx[keep]
            counts = np.bincount(self.row[keep], minlength=n)
        items = self.tokens().take(pa.array(value_idx)).view(pa.string())
        return pa.MapArray.from_arrays(pa.array(_offsets_from_lens(counts).astype(np.int32)), keys, items)


HostCodes = tuple[np.ndarray, list[int]]


def _host_codes(a: np.ndarray, starts: np.ndarray, keys: np.ndarray | None = None) -> HostCodes:
    """Per row, the code of its IPv4 host (8 bytes at ``starts``, or the given big-endian ``keys``) and
    the distinct hosts (hash-based)."""
    if keys is None:
        keys = _overlapping(a, ">u8")[starts] if len(a) >= 8 else np.zeros(0, np.uint64)
    enc = pc.dictionary_encode(pa.array(keys.astype(np.uint64)))
    return np.asarray(enc.indices), enc.dictionary.to_pylist()


def fast_host_strings(a: np.ndarray, starts: np.ndarray, v6: np.ndarray, codes: HostCodes | None = None) -> pa.Array:
    """``host_strings`` with hash-based distinct detection (Arrow dictionary_encode) for IPv4 rows."""
    n = len(starts)
    if n == 0 or v6.any():
        return host_strings(a, starts, v6)
    codes, uniq = codes if codes is not None else _host_codes(a, starts)
    texts = [decode_host(int(u).to_bytes(8, "big")) for u in uniq]
    if len(texts) == 1:
        b = texts[0].encode()
        offs = np.arange(0, len(b) * (n + 1), len(b), dtype=np.int32)
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offs), pa.py_buffer(b * n)])
    return pa.array(texts, pa.string()).take(pa.array(codes))


def fast_msg_ids(a: np.ndarray, p_sh: np.ndarray, v6: np.ndarray, phy_pos: np.ndarray,
                 codes: HostCodes | None = None, phy_bytes: np.ndarray | None = None) -> pa.Array:
    """Offset msgIds (upper-case hex of store host ‖ PHYSICALOFFSET field): the host part once per
    distinct host, the offset part with one 256-entry table lookup per byte. ``codes`` (store host
    codes) and ``phy_bytes`` ((n, 8) field bytes) may be passed when already at hand."""
    n = len(p_sh)
    if n == 0 or v6.any():
        return msg_id_strings(a, p_sh, v6, phy_pos)
    codes, uniq = codes if codes is not None else _host_codes(a, p_sh)
    host_hex = _HEX2[np.array(uniq, dtype=">u8").view(np.uint8).reshape(-1, 8)].view(np.uint8).reshape(-1, 16)
    txt = np.empty((n, 32), np.uint8)
    txt[:, :16] = host_hex[0] if len(uniq) == 1 else host_hex[codes]
    txt[:, 16:] = _HEX2[rows_at(a, phy_pos, 8) if phy_bytes is None else phy_bytes].view(np.uint8).reshape(n, 16)
    offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(txt)])


_PROP_COLUMNS = frozenset({"tags", "keys", "uniq_key", "tags_code", "properties", "properties_raw", "prop_crc_ok"})
CRC32_NAME = "__CRC32#"


class _ViewCache:
    """numpy and Arrow views of the current source view (made once per view, not per batch)."""

    def __init__(self) -> None:
        self._view = None
        self._a: np.ndarray | None = None
        self._buf: pa.Buffer | None = None

    def get(self, view) -> tuple[np.ndarray, pa.Buffer]:
        if view is not self._view:
            self._view = view
            self._a = np.frombuffer(view, dtype=np.uint8)
            self._buf = pa.py_buffer(view)
        assert self._a is not None and self._buf is not None
        return self._a, self._buf


class SegmentScan:
    """Decode the records of one segment, or of ``[start, end)`` of it, into Arrow batches.

    ``source``: a ByteSource of the segment file; ``file``: its display path; ``base``: the segment's
    physical base offset. ``end`` is exclusive for record *starts* (a split owns the records that start
    inside it). ``verify_crc`` computes ``crc_ok``; ``stop_on_crc`` additionally ends the scan at the
    first mismatch, as the broker's recovery does.
    """

    def __init__(
        self,
        source,
        file: str,
        base: int,
        start: int = 0,
        end: int | None = None,
        *,
        verify_crc: bool = True,
        stop_on_crc: bool = False,
        with_body: bool = False,
        with_properties: bool = True,
        delay_levels_ms: list[int] | None = None,
        batch_rows: int = 65536,
        window: int = DEFAULT_WINDOW,
        columns: list[str] | None = None,
    ):
        self.source = source
        self.file = file
        self.base = base
        self.start = start
        self.seg_len = source.size
        self.stop = self.seg_len if end is None else min(end, self.seg_len)
        self.verify_crc = verify_crc
        self.stop_on_crc = stop_on_crc
        self.with_body = with_body
        self.with_properties = with_properties
        self.delay_levels_ms = DEFAULT_DELAY_LEVELS_MS if delay_levels_ms is None else delay_levels_ms
        self.batch_rows = batch_rows
        self.window = window
        self.schema = message_schema(with_body, with_properties)
        if columns is not None:
            self.schema = pa.schema([self.schema.field(c) for c in columns])
        self.end: SegmentEnd | None = None
        self._need = frozenset(self.schema.names)

    # -- the walk ---------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[pa.RecordBatch]:
        pos = self.start
        records = 0
        crc_errors = 0
        first_crc: int | None = None
        local = isinstance(self.source, LocalSource)
        if not local and self.stop - self.start > self.window and hasattr(self.source, "read_ahead"):
            # remote sequential scan: window k+1 is fetched in the background while k is decoded
            self.source.read_ahead(self.window)
        view_base = 0
        view = self.source.view() if local else memoryview(b"")
        views = _ViewCache()
        while True:
            if not local and (pos - view_base + 8 > len(view) or pos + 8 > view_base + len(view)):
                view_base = pos
                view = self.source.read(pos, self.window)
            a, pbuf = views.get(view)
            stop_kind, stop_detail, starts, pos, need = self._walk(view, view_base, pos, a, pbuf)
            if len(starts):
                st = starts - view_base
                batch, bad, crc_bad = self._decode(view, view_base, st, a, pbuf)
                if crc_bad is not None and len(crc_bad):
                    crc_errors += len(crc_bad)
                    if first_crc is None:
                        first_crc = self.base + view_base + int(st[crc_bad[0]])
                if bad is not None:
                    k, reason, detail, size = bad
                    if k:
                        yield batch.slice(0, k)
                    records += k
                    bad_pos = view_base + int(st[k])
                    self.end = SegmentEnd("invalid", self.file, bad_pos, self.base + bad_pos, reason, detail,
                                          size, records, crc_errors, first_crc)
                    return
                records += batch.num_rows
                yield batch
            if need:  # the next record does not fit the current window: read a window starting at it
                view_base = pos
                view = self.source.read(pos, max(self.window, need))
                continue
            if stop_kind is None:
                continue
            if stop_kind == "invalid":
                reason, detail, size = stop_detail
                self.end = SegmentEnd("invalid", self.file, pos, self.base + pos, reason, detail, size,
                                      records, crc_errors, first_crc)
            else:
                self.end = SegmentEnd(stop_kind, self.file, pos, self.base + pos, None, stop_detail, None,
                                      records, crc_errors, first_crc)
            return

    def _walk(self, view: memoryview, view_base: int, pos: int, a: np.ndarray | None = None,
              pbuf: pa.Buffer | None = None):
        """Follow the size chain from ``pos``; returns (stop kind, detail, starts, new pos, bytes needed).

        The chain is inherently sequential, so this is one tight Python loop that reads only TOTALSIZE
        (the cheapest per-record step measured: cheaper than searching every byte for magic candidates
        and chaining them with numpy). MAGIC and "the record fits" are then checked column-wise, and
        the walk is cut at the first record that fails them; the reason is classified exactly as the
        broker would. Everything else is validated in :meth:`_decode`. ``starts`` are absolute offsets.
        """
        seg_len, stop, rows = self.seg_len, self.stop, self.batch_rows
        vend = view_base + len(view)
        rel = pos - view_base
        rel_stop = min(stop, vend) - view_base
        rel_end = min(vend, seg_len) - view_base
        # the lean loop: TOTALSIZE only (one unpack, one append per record); magic and fit are
        # checked column-wise below, and the loop stops at the first size too small to be a record
        lim = min(rel_stop, rel_end - 7)  # rel < lim  <=>  rel < rel_stop and rel + 8 <= rel_end
        found = array("q")
        append = found.append
        unpack = _I32.unpack_from
        mn = MIN_RECORD_SIZE
        for _ in range(rows):
            if rel >= lim:
                break
            total = unpack(view, rel)[0]
            if total < mn:
                break
            append(rel)
            rel += total
        starts = np.frombuffer(found, np.int64) if len(found) else np.zeros(0, np.int64)
        if len(starts):
            if a is None:
                a = np.frombuffer(view, np.uint8)
            magic = _overlapping(a, ">i4")[starts + 4]
            good = (magic == MAGIC_V1) | (magic == MAGIC_V2)
            if rel > rel_end:  # the last record does not fit: it is where the walk stops
                good[-1] = False
            if not good.all():
                j = int(np.argmin(good))
                rel = int(starts[j])
                starts = starts[:j]
        cnt = len(starts)
        if view_base:
            starts = starts + view_base
        pos = rel + view_base
        # why did the walk stop?
        if pos >= stop:
            return ("split_end" if stop < seg_len else "segment_end"), None, starts, pos, 0
        if cnt >= rows:
            return None, None, starts, pos, 0
        left = seg_len - pos
        if left < 8:  # TOTALSIZE and MAGIC do not fit: the broker's read of MAGIC fails (-1)
            return "invalid", ("truncated", f"{left} bytes left in the segment, no room for a record", None), starts, pos, 0
        if pos + 8 > vend:
            return None, None, starts, pos, (0 if len(starts) else 8)
        total, magic = _PAIR.unpack_from(view, pos - view_base)
        if magic == MAGIC_V1 or magic == MAGIC_V2:
            if total < MIN_RECORD_SIZE or total > left:
                return "invalid", ("bad_size", f"TOTALSIZE {total} (record must be {MIN_RECORD_SIZE}..{left} bytes here)", None), starts, pos, 0
            return None, None, starts, pos, (0 if len(starts) else total)  # does not fit the window
        if magic == BLANK_MAGIC:
            return "blank", f"blank record, TOTALSIZE {total}", starts, pos, 0
        if total == 0 and magic == 0:
            return "end_of_data", "zeros: no record written here", starts, pos, 0
        return "invalid", ("bad_magic", f"magic 0x{magic & 0xFFFFFFFF:08X}, TOTALSIZE {total}", None), starts, pos, 0

    # -- the columnar decode ---------------------------------------------------------------------------
    def _decode(self, view: memoryview, view_base: int, st: np.ndarray, a: np.ndarray | None = None,
                pbuf: pa.Buffer | None = None):
        """Decode records at view offsets ``st`` into one batch; returns (batch, first bad, crc bad rows).

        Only the requested columns are built; what decides validity (structure, CRC, the DELAY of
        SCHEDULE_TOPIC_XXXX records) is always computed.
        """
        if a is None or pbuf is None:
            a, pbuf = _ViewCache().get(view)
        need = self._need
        n = len(st)
        # every record is at least MIN_RECORD_SIZE (91) bytes and fits the view (checked by the walk),
        # so the 88 bytes of the IPv4/IPv4 fixed layout are always readable: one item gather per record
        raw88 = _overlapping(a, "V88")[st]
        hdr = raw88.view(_V4_DT)
        total = hdr["total"].astype(np.int64)
        v2 = hdr["magic"] == MAGIC_V2
        sysflag = hdr["sysflag"].astype(np.int64)
        all_v4 = not (sysflag & (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)).any()
        if all_v4:
            bh = sh = 8
            p_bh = st + 48
            p_sh = st + 64
            p_body = st + 88
            body_len = hdr["bl"].astype(np.int64)
            fixed_ok = None  # 88 <= MIN_RECORD_SIZE: always inside the record
        else:
            bh = np.where(sysflag & BORNHOST_V6_FLAG, 20, 8)
            sh = np.where(sysflag & STOREHOST_V6_FLAG, 20, 8)
            p_bh = st + 48
            p_sh = p_bh + bh + 8
            p_bl = p_sh + sh + 12
            rec_end = st + total
            fixed_ok = p_bl + 4 <= rec_end  # hosts widen the fixed part by up to 24 bytes
            store_ts_, reconsume_, prep_, body_len = _tail_fields(a, st, bh, sh, fixed_ok)
            p_body = p_bl + 4
        blen = np.maximum(body_len, 0)
        p_tl = p_body + blen
        rec_end = st + total
        any_v2 = bool(v2.any())
        tl = np.where(v2, 2, 1) if any_v2 else 1
        ok = p_tl + tl <= rec_end
        if fixed_ok is not None:
            ok &= fixed_ok
        p_tl_s = np.where(ok, p_tl, st)
        if any_v2:
            topic_len = np.where(v2, gather_be(a, p_tl_s, 2, ">i2"), a[p_tl_s].view(np.int8).astype(np.int64))
        else:
            topic_len = a[p_tl_s].view(np.int8).astype(np.int64)
        p_topic = p_tl + tl
        p_pl = p_topic + topic_len
        ok &= (topic_len >= 0) & (p_pl + 2 <= rec_end)
        p_pl = np.where(ok, p_pl, st)
        props_len = gather_be(a, p_pl, 2, ">i2")
        p_props = p_pl + 2
        plen = np.maximum(props_len, 0)
        ok &= p_props + plen == rec_end  # == the broker's expected size (74 + hosts + lengths) == TOTALSIZE
        bad = None
        k = n
        if not ok.all():
            k = int(np.argmin(ok))
            bad = self._classify(view, view_base, int(st[k]), k)
        # CRC, one call per body (the floor of any scan)
        crc_ok = None
        crc_bad = None
        if self.verify_crc:
            mv = view
            bstart = p_body[:k].tolist()
            bend = (p_body[:k] + blen[:k]).tolist()
            crcs = np.fromiter((crc32(mv[s:e]) for s, e in zip(bstart, bend)), np.int64, k) & MASK
            crc_ok_arr = (crcs == (hdr["crc"][:k].astype(np.int64))) | (blen[:k] == 0)
            crc_bad = np.flatnonzero(~crc_ok_arr)
            if self.stop_on_crc and len(crc_bad) and (bad is None or crc_bad[0] < k):
                k = int(crc_bad[0])
                b = self.base + view_base + int(st[k])
                bad = (k, "crc_mismatch", f"body CRC mismatch at physical offset {b}", None)
                crc_bad = crc_bad[:0]
            crc_ok = crc_ok_arr[:k]
        sl = slice(0, k)
        stk = st[:k]
        # SCHEDULE_TOPIC_XXXX rows: their DELAY decides validity, so they are found whatever is asked
        sched_cand = np.flatnonzero(topic_len[sl] == len(_SCHED_B))
        is_sched = np.zeros(k, bool)
        if len(sched_cand):
            eq = (rows_at(a, p_topic[sched_cand], len(_SCHED_B)) == _SCHED_B).all(axis=1)
            is_sched[sched_cand[eq]] = True
        any_sched = bool(is_sched.any())
        props: FastProperties | SplitProperties | PropertyColumns | None = None
        raw = None
        if any_sched or need & _PROP_COLUMNS:
            raw_b = take_ranges(pbuf, p_props[sl], plen[sl])
            raw, clean = as_utf8(raw_b)
            if not clean:
                props = PropertyColumns(raw)
            elif "properties" in need:  # every pair is parsed anyway: look names up in that parse
                props = SplitProperties(raw_b)
            else:
                props = FastProperties(raw_b)
        delay = None
        delay_col = pa.nulls(k, pa.int32())
        if any_sched:
            assert props is not None
            delay = np.full(k, -(2**62), dtype=np.int64)
            rows = np.flatnonzero(is_sched)
            dv = props.value("DELAY").take(pa.array(rows)).to_pylist()
            bad_delay = None
            for r, text in zip(rows.tolist(), dv):
                if text is None:
                    continue
                if not _JAVA_INT.fullmatch(text) or not (-(2**31) <= int(text) < 2**31):
                    bad_delay = r
                    break
                delay[r] = int(text)
            if bad_delay is not None:  # the broker fails the whole record (NumberFormatException → -1)
                why = (bad_delay, "parse_error", f"DELAY {dv[list(rows).index(bad_delay)]!r} is not a Java int", None)
                if bad_delay == 0:
                    return pa.RecordBatch.from_pylist([], schema=self.schema), why, crc_bad
                batch, _, crc_bad2 = self._decode(view, view_base, st[:bad_delay], a, pbuf)
                return batch, why, crc_bad2
            dmask = delay > -(2**62)
            delay_col = pa.array(np.where(dmask, delay, 0).astype(np.int32), mask=~dmask)

        cols: dict[str, pa.Array] = {}
        h = hdr[:k] if k < n else hdr

        def tail(name: str, idx: int) -> np.ndarray:
            if all_v4:
                return h[name]
            return (store_ts_, reconsume_, prep_, body_len)[idx][sl]

        if "phy_offset" in need:
            cols["phy_offset"] = pa.array(self.base + view_base + stk)
        if "size" in need:
            cols["size"] = pa.array(h["total"].astype(np.int32))
        if "magic_version" in need:
            cols["magic_version"] = pa.array(np.where(v2[sl], 2, 1).astype(np.int8))
        if "body_crc" in need:
            cols["body_crc"] = pa.array(h["crc"].astype(np.int32))
        if "crc_ok" in need:
            cols["crc_ok"] = pa.array(crc_ok) if crc_ok is not None else pa.nulls(k, pa.bool_())
        if "queue_id" in need:
            cols["queue_id"] = pa.array(h["qid"].astype(np.int32))
        if "flag" in need:
            cols["flag"] = pa.array(h["flag"].astype(np.int32))
        if "queue_offset" in need:
            cols["queue_offset"] = pa.array(h["qoff"].astype(np.int64))
        if "physical_offset_field" in need:
            cols["physical_offset_field"] = pa.array(h["phy"].astype(np.int64))
        if "sys_flag" in need:
            cols["sys_flag"] = pa.array(h["sysflag"].astype(np.int32))
        if "tran_type" in need:
            cols["tran_type"] = pa.array(((sysflag[sl] & 0xC) >> 2).astype(np.int8))
        if "born_timestamp" in need:
            cols["born_timestamp"] = pa.array(h["born"].astype(np.int64))
        v6b = np.zeros(k, bool) if all_v4 else bh[sl] == 20
        v6s = np.zeros(k, bool) if all_v4 else sh[sl] == 20
        if "born_host" in need:
            cols["born_host"] = fast_host_strings(
                a, p_bh[sl], v6b, _host_codes(a, p_bh[sl], h["bhost"].view(">u8")) if all_v4 else None)
        sh_codes = None
        if all_v4 and ("store_host" in need or "msg_id" in need):
            sh_codes = _host_codes(a, p_sh[sl], h["shost"].view(">u8"))
        store_ts = None
        if "store_timestamp" in need or "tags_code" in need:
            store_ts = tail("sts", 0).astype(np.int64)
        if "store_timestamp" in need:
            cols["store_timestamp"] = pa.array(store_ts)
        if "store_host" in need:
            cols["store_host"] = fast_host_strings(a, p_sh[sl], v6s, sh_codes)
        if "reconsume_times" in need:
            cols["reconsume_times"] = pa.array(tail("rc", 1).astype(np.int32))
        if "prepared_transaction_offset" in need:
            cols["prepared_transaction_offset"] = pa.array(tail("prep", 2).astype(np.int64))
        if "body_len" in need:
            cols["body_len"] = pa.array(tail("bl", 3).astype(np.int32))
        if "topic" in need:
            cols["topic"] = as_utf8(take_ranges(pbuf, p_topic[sl], topic_len[sl]))[0]
        tags = None
        if props is not None and ("tags" in need or "tags_code" in need):
            tags = props.value("TAGS")
            cols["tags"] = tags
        if "keys" in need:
            cols["keys"] = props.value("KEYS")
        if "uniq_key" in need:
            cols["uniq_key"] = props.value("UNIQ_KEY")
        if "msg_id" in need:
            phy_b = raw88[:k].view(np.uint8).reshape(-1, 88)[:, 28:36] if all_v4 else None
            cols["msg_id"] = fast_msg_ids(a, p_sh[sl], v6s, stk + 28, sh_codes, phy_b)
        if "tags_code" in need:
            cols["tags_code"] = pa.array(tags_codes(tags, None, store_ts, delay, self.delay_levels_ms))
        if "properties" in need:
            cols["properties"] = props.as_map()
        if "properties_raw" in need:
            cols["properties_raw"] = raw
        if "prop_crc_ok" in need:
            cols["prop_crc_ok"] = self._prop_crc(view, stk, total[sl], props)
        if "delay_level" in need:
            cols["delay_level"] = delay_col
        if "body" in need:
            cols["body"] = take_ranges(pbuf, p_body[sl], blen[sl])
        batch = pa.RecordBatch.from_arrays([cols[f.name] for f in self.schema], schema=self.schema)
        return batch, bad, crc_bad

    def _prop_crc(self, view: memoryview, st: np.ndarray, total: np.ndarray, props) -> pa.Array:
        """5.x ``__CRC32#`` check: stored digits (least significant first) vs CRC of the record minus 20."""
        k = len(st)
        if isinstance(props, (FastProperties, SplitProperties)):
            rows, vs, vl = props.value_span(CRC32_NAME)
            if not len(rows):
                return pa.nulls(k, pa.bool_())
            present = np.zeros(k, bool)
            present[rows] = True
            out = np.zeros(k, dtype=bool)
            ten = np.flatnonzero(vl == 10)
            if len(ten):
                dig = rows_at(props.d, vs[ten], 10).astype(np.int64) - 48
                digit_ok = ((dig >= 0) & (dig <= 9)).all(axis=1)
                stored = (dig * (10 ** np.arange(10, dtype=np.int64))).sum(axis=1)
                r = rows[ten[digit_ok]]
                stored = stored[digit_ok]
                s0 = st[r].tolist()
                s1 = (st[r] + total[r] - 20).tolist()
                crcs = np.array([crc32(view[x:y]) for x, y in zip(s0, s1)], dtype=np.int64) & MASK
                out[r] = (stored == 0) | (stored == crcs)
            return pa.array(out, mask=~present)
        values = props.value(CRC32_NAME)
        present = np.asarray(values.is_valid()) if k else np.zeros(0, bool)
        if not present.any():
            return pa.nulls(k, pa.bool_())
        out = np.zeros(k, dtype=bool)
        vals = values.to_pylist()
        for r in np.flatnonzero(present).tolist():
            d = vals[r]
            if len(d) != 10 or not d.isdigit():
                continue
            stored = int(d[::-1])
            s = int(st[r])
            out[r] = stored == 0 or stored == (crc32(view[s : s + int(total[r]) - 20]) & MASK)
        return pa.array(out, mask=~present)

    def _classify(self, view: memoryview, view_base: int, rel: int, k: int):
        """Re-check the first structurally bad record with the scalar validator for an exact reason."""
        seg_view = view[rel:]
        if isinstance(self.source, LocalSource):
            seg_view = self.source.view()[view_base + rel :]
        chk = check_record(seg_view, 0, check_crc=False)
        reason = (chk.reason or "parse_error: fields do not fit the record").split(":", 1)
        kind = reason[0].strip()
        detail = reason[1].strip() if len(reason) > 1 else ""
        size = chk.size if chk.size > 0 else None
        return (k, kind, detail, size)


def scan_buffer(buf: bytes, base: int = 0, **kw) -> tuple[pa.Table, SegmentEnd]:
    """Scan an in-memory segment image (tests, small tools): all batches as one table plus the end."""

    class _Mem:
        def __init__(self, b: bytes):
            self.path = "<memory>"
            self.size = len(b)
            self._b = memoryview(b)

        def read(self, offset: int, length: int) -> memoryview:
            return self._b[offset : offset + length]

        def close(self) -> None:
            pass

    scan = SegmentScan(_Mem(buf), "<memory>", base, **kw)
    batches = list(scan)
    table = pa.Table.from_batches(batches, schema=scan.schema)
    assert scan.end is not None
    return table, scan.end
