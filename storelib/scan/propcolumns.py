"""Property columns: TAGS, KEYS, UNIQ_KEY, ``__CRC32#`` and the full map, parsed column-wise.

Three parsers with one rule (the broker's MessageDecoder.string2messageProperties): a name lookup
over clean UTF-8 (:class:`FastProperties`), every pair for the map (:class:`SplitProperties`), and
Arrow string kernels for rows that needed U+FFFD replacement (:class:`PropertyColumns`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.scan.arrowcols import offsets_from_lens, or_reduce, overlapping, rows_at, string_parts

_U64 = np.uint64


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
                or_reduce(present, par, bits, counts)
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
            starts = offsets_from_lens(counts)
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
        offsets = pa.array(offsets_from_lens(counts).astype(np.int32))
        return pa.MapArray.from_arrays(offsets, names_s, values_s)


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
        ro, d = string_parts(raw)
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
            k = overlapping(d, "<u8")[s8]
            late = np.flatnonzero(s8 != pos)
        else:
            k = np.zeros(len(pos), np.uint64)
            late = np.arange(len(pos))
        if len(late):  # positions in the last 8 bytes: exact bytes, zero padded
            tail = np.zeros(16, np.uint8)
            lo = max(len(d) - 8, 0)
            tail[: len(d) - lo] = d[lo:]
            k[late] = overlapping(tail, "<u8")[pos[late] - lo]
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
        fo, d = string_parts(flat)
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
            or_reduce(present, self.row, bits, counts)
            dup_rows = np.flatnonzero(np.bitwise_count(present).astype(np.int64) != counts)
        else:
            combo = self.row << 32 | code.astype(np.int64)
            order = np.lexsort((np.arange(P), combo))
            sc = combo[order]
            dup_rows = np.unique(self.row[order[1:][sc[1:] == sc[:-1]]])
        value_idx = 4 * np.arange(P, dtype=np.int64) + 2
        if len(dup_rows):
            keep = np.ones(P, bool)
            starts = offsets_from_lens(counts)
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
        return pa.MapArray.from_arrays(pa.array(offsets_from_lens(counts).astype(np.int32)), keys, items)
