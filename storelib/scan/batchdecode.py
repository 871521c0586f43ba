"""The columnar batch decoder: records at known starts in a view → one Arrow record batch.

The segment walk (:mod:`storelib.scan.scanner`) finds record starts; this validates the rest of each
record as CommitLog.checkMessageAndReturnSize does (structure, body CRC, the DELAY of
SCHEDULE_TOPIC_XXXX records, on 5.3.3 INNER_NUM/INNER_BASE) and builds only the requested columns, every field with numpy over
arrays of record offsets (the 88 fixed bytes of the common IPv4/IPv4 layout in one item gather).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.format.crc import MASK, crc32_ranges
from storelib.format.properties import (
    CRC32,
    CRC32_RESERVED_LEN,
    DUP_INFO,
    INNER_BASE,
    INNER_NUM,
    crc_expected,
    dup_info_error,
    inner_batch_error,
    java_int,
)
from storelib.format.record import BORNHOST_V6_FLAG, MAGIC_V2, SCHEDULE_TOPIC, STOREHOST_V6_FLAG
from storelib.scan.arrowcols import (
    as_utf8,
    fast_host_strings,
    fast_msg_ids,
    gather_be,
    host_codes,
    overlapping,
    rows_at,
    string_parts,
    tags_codes,
    take_ranges,
)
from storelib.scan.propcolumns import FastProperties, PropertyColumns, SplitProperties
from storelib.scan.recordbytes import check_at, outcome

# the whole fixed part of an IPv4/IPv4 record (the common layout): 88 bytes, BODYLENGTH last
_V4_DT = np.dtype(
    [("total", ">i4"), ("magic", ">i4"), ("crc", ">i4"), ("qid", ">i4"), ("flag", ">i4"),
     ("qoff", ">i8"), ("phy", ">i8"), ("sysflag", ">i4"), ("born", ">i8"), ("bhost", "V8"), ("sts", ">i8"),
     ("shost", "V8"), ("rc", ">i4"), ("prep", ">i8"), ("bl", ">i4")]
)
_TAIL_DT = {
    w: np.dtype([("b", f"V{bhw}"), ("sts", ">i8"), ("s", f"V{shw}"), ("rc", ">i4"), ("prep", ">i8"), ("bl", ">i4")])
    for w, (bhw, shw) in {(8, 8): (8, 8), (20, 8): (20, 8), (8, 20): (8, 20), (20, 20): (20, 20)}.items()
}
_SCHED_B = np.frombuffer(SCHEDULE_TOPIC.encode(), np.uint8)
_PROP_COLUMNS = frozenset({"tags", "keys", "uniq_key", "tags_code", "properties", "properties_raw", "prop_crc_ok"})
_M01, _UM = np.frombuffer(b"M\x01UM", "<u2")  # INNER_NUM 0x01's aligned words (see _may_hold_inner_num)
_POW10 = 10 ** np.arange(10, dtype=np.int64)  # __CRC32# digits: least significant first


class ViewCache:
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


class _Layout:
    """Field positions of the records at ``st`` and ``ok``: does each record's structure hold?"""

    def __init__(self, a: np.ndarray, st: np.ndarray):
        # every record is at least MIN_RECORD_SIZE (91) bytes and fits the view (checked by the walk),
        # so the 88 bytes of the IPv4/IPv4 fixed layout are always readable: one item gather per record
        self.raw88 = raw88 = overlapping(a, "V88")[st]
        self.hdr = hdr = raw88.view(_V4_DT)
        self.total = total = hdr["total"].astype(np.int64)
        self.v2 = v2 = hdr["magic"] == MAGIC_V2
        self.sysflag = sysflag = hdr["sysflag"].astype(np.int64)
        self.all_v4 = not (sysflag & (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)).any()
        self.tail: list[np.ndarray] | None = None  # STORETIMESTAMP.. BODYLENGTH when a host is IPv6
        if self.all_v4:
            self.bh = self.sh = 8
            self.p_bh = st + 48
            self.p_sh = st + 64
            p_body = st + 88
            body_len = hdr["bl"].astype(np.int64)
            fixed_ok = None  # 88 <= MIN_RECORD_SIZE: always inside the record
        else:
            self.bh = bh = np.where(sysflag & BORNHOST_V6_FLAG, 20, 8)
            self.sh = sh = np.where(sysflag & STOREHOST_V6_FLAG, 20, 8)
            self.p_bh = st + 48
            self.p_sh = self.p_bh + bh + 8
            p_bl = self.p_sh + sh + 12
            fixed_ok = p_bl + 4 <= st + total  # hosts widen the fixed part by up to 24 bytes
            self.tail = _tail_fields(a, st, bh, sh, fixed_ok)
            body_len = self.tail[3]
            p_body = p_bl + 4
        self.p_body = p_body
        self.blen = blen = np.maximum(body_len, 0)
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
        self.topic_len = topic_len
        self.p_topic = p_topic = p_tl + tl
        p_pl = p_topic + topic_len
        ok &= (topic_len >= 0) & (p_pl + 2 <= rec_end)
        p_pl = np.where(ok, p_pl, st)
        props_len = gather_be(a, p_pl, 2, ">i2")
        self.p_props = p_props = p_pl + 2
        self.plen = plen = np.maximum(props_len, 0)
        ok &= p_props + plen == rec_end  # == the broker's expected size (74 + hosts + lengths) == TOTALSIZE
        self.ok = ok


def _properties(raw_b: pa.Array, need: frozenset[str]) -> tuple[FastProperties | SplitProperties | PropertyColumns,
                                                              pa.Array]:
    """(the parser for the properties column's bytes, its text): the cheapest that serves ``need``."""
    raw, clean = as_utf8(raw_b)
    if not clean:
        return PropertyColumns(raw), raw
    if "properties" in need:  # every pair is parsed anyway: look names up in that parse
        return SplitProperties(raw_b), raw
    return FastProperties(raw_b), raw


def _may_hold_inner_num(raw_b: pa.Array) -> bool:
    """Could a row hold ``INNER_NUM`` 0x01? Its bytes put "M" 0x01 in an aligned 2-byte word when they
    start at an even offset, "UM" at an odd one: one compare pass over the words (no separator search,
    half the cost of :class:`FastProperties`); a hit only means the exact lookup runs."""
    _, d = string_parts(raw_b)
    w = d[: len(d) // 2 * 2].view("<u2")
    return bool(((w == _M01) | (w == _UM)).any())


def _first_bad_inner(props: FastProperties | SplitProperties | PropertyColumns, bad_row: int | None,
                     why: tuple | None) -> tuple[int | None, tuple | None]:
    """(first bad row, why) with 5.3.3's INNER_NUM/INNER_BASE parse (:func:`inner_batch_error`) added to
    an earlier finding (a DELAY that is not an int); a record's DELAY is read first, so it wins a tie.
    Costs one name lookup when no record holds INNER_NUM; the values are checked in Python only where
    they are not plain short digit strings."""
    if isinstance(props, PropertyColumns):
        rows = np.flatnonzero(np.asarray(props.value(INNER_NUM).is_valid()))
    else:
        rows = props.value_span(INNER_NUM)[0]
    if bad_row is not None:
        rows = rows[rows <= bad_row]
    if not len(rows):
        return bad_row, why
    take = pa.array(rows)
    num, base = props.value(INNER_NUM).take(take), props.value(INNER_BASE).take(take)
    plain = (np.asarray(pc.match_substring_regex(num, "^[0-9]{1,4}$").fill_null(True))
             & np.asarray(pc.match_substring_regex(base, "^[0-9]{1,18}$").fill_null(True)))
    check = np.flatnonzero(~plain)
    for r, n, b in zip(rows[check].tolist(), num.take(pa.array(check)).to_pylist(),
                       base.take(pa.array(check)).to_pylist()):
        err = inner_batch_error(n, b)
        if err is not None:
            if bad_row is not None and r == bad_row:
                return bad_row, why
            return r, (r, "parse_error", err, None)
    return bad_row, why


def _first_bad_dup(props: FastProperties | SplitProperties | PropertyColumns, plen: np.ndarray,
                   bad_row: int | None, why: tuple | None) -> tuple[int | None, tuple | None]:
    """(first bad row, why) with 5.3.3 recovery's DUP_INFO check (duplicationEnable, CommitLog.java:540-545,
    :func:`dup_info_error`): a row with properties whose DUP_INFO, without its trailing "_", does not hold
    exactly one "_". The check runs before DELAY and INNER_NUM are parsed, so it wins a tie."""
    v = props.value(DUP_INFO)
    parts = pc.count_substring(pc.utf8_rtrim(v, characters="_"), "_")
    ok = np.asarray(pc.equal(parts, 1).fill_null(False)) | (plen <= 0)
    rows = np.flatnonzero(~ok)
    if not len(rows) or (bad_row is not None and rows[0] > bad_row):
        return bad_row, why
    r = int(rows[0])
    return r, (r, "dup_info", dup_info_error(v[r].as_py()), None)


class BatchDecoder:
    """Decode records at given view offsets into batches of ``schema``'s columns.

    ``source``/``base``: the segment's ByteSource and physical base offset. ``verify_crc`` computes
    ``crc_ok``; ``stop_on_crc`` additionally ends the batch at the first mismatch (broker recovery).
    ``line``: the broker line whose check classifies a bad record (the walk has already judged the magics);
    ``read_body`` False: the reput's check classifies it (readBody=false). ``dup_info``: 5.3.3 recovery's
    checkDupInfo (:func:`_first_bad_dup`); nothing is paid when it is off.
    """

    def __init__(self, source, base: int, schema: pa.Schema, *, verify_crc: bool, stop_on_crc: bool,
                 delay_levels_ms: Sequence[int], line: str | None = None, read_body: bool = True,
                 dup_info: bool = False):
        self.source = source
        self.dup_info = dup_info
        self.line = line
        self.read_body = read_body
        self.base = base
        self.schema = schema
        self.verify_crc = verify_crc
        self.stop_on_crc = stop_on_crc
        self.delay_levels_ms = delay_levels_ms
        self.need = frozenset(schema.names)

    def decode(self, view: memoryview, view_base: int, st: np.ndarray, a: np.ndarray | None = None,
               pbuf: pa.Buffer | None = None):
        """Decode records at view offsets ``st`` into one batch; returns (batch, first bad, crc bad rows).

        Only the requested columns are built; what decides validity (structure, CRC, the DELAY of
        SCHEDULE_TOPIC_XXXX records, 5.3.3's INNER_NUM/INNER_BASE parse) is always computed.
        """
        if a is None or pbuf is None:
            a, pbuf = ViewCache().get(view)
        need = self.need
        n = len(st)
        lay = _Layout(a, st)
        bad = None
        k = n
        if not lay.ok.all():
            k = int(np.argmin(lay.ok))
            bad = self._classify(view_base, int(st[k]), k)
        # CRC, one call per body (the floor of any scan)
        crc_ok = None
        crc_bad = None
        if self.verify_crc:
            k, bad, crc_ok, crc_bad = self._check_crc(view, view_base, st, lay, k, bad)
        sl = slice(0, k)
        # SCHEDULE_TOPIC_XXXX rows: their DELAY decides validity, so they are found whatever is asked
        sched_cand = np.flatnonzero(lay.topic_len[sl] == len(_SCHED_B))
        is_sched = np.zeros(k, bool)
        if len(sched_cand):
            eq = (rows_at(a, lay.p_topic[sched_cand], len(_SCHED_B)) == _SCHED_B).all(axis=1)
            is_sched[sched_cand[eq]] = True
        any_sched = bool(is_sched.any())
        props: FastProperties | SplitProperties | PropertyColumns | None = None
        raw = None
        inner = self.line == "5"  # setBatchSizeIfNeeded parses INNER_NUM/INNER_BASE (5.3.3 only)
        if any_sched or need & _PROP_COLUMNS:
            props, raw = _properties(take_ranges(pbuf, lay.p_props[sl], lay.plen[sl]), need)
        elif inner:  # parsed for the DUP_INFO check, else only when a row may hold INNER_NUM
            raw_b = take_ranges(pbuf, lay.p_props[sl], lay.plen[sl])
            if self.dup_info or _may_hold_inner_num(raw_b):
                props, raw = _properties(raw_b, need)
        delay = None
        delay_col = pa.nulls(k, pa.int32())
        bad_row, why = None, None
        if any_sched:
            assert props is not None
            delay, delay_col, bad_row, why = self._delays(props, is_sched, k)
        if inner and props is not None:
            bad_row, why = _first_bad_inner(props, bad_row, why)
        if self.dup_info and k:
            if props is None:
                props, raw = _properties(take_ranges(pbuf, lay.p_props[sl], lay.plen[sl]), need)
            bad_row, why = _first_bad_dup(props, lay.plen[sl], bad_row, why)
        if why is not None:  # the broker fails the whole record (NumberFormatException → -1)
            if bad_row == 0:
                return pa.RecordBatch.from_pylist([], schema=self.schema), why, crc_bad
            batch, _, crc_bad2 = self.decode(view, view_base, st[:bad_row], a, pbuf)
            return batch, why, crc_bad2
        cols = self._columns(view, view_base, st, a, pbuf, lay, k, crc_ok, props, raw, delay, delay_col)
        batch = pa.RecordBatch.from_arrays([cols[f.name] for f in self.schema], schema=self.schema)
        return batch, bad, crc_bad

    def _check_crc(self, view: memoryview, view_base: int, st: np.ndarray, lay: _Layout, k: int, bad):
        """Body CRCs of the first ``k`` records: (k, bad, crc_ok, crc_bad), cut at a mismatch with stop_on_crc."""
        p_body, blen = lay.p_body, lay.blen
        bstart = p_body[:k].tolist()
        bend = (p_body[:k] + blen[:k]).tolist()
        crcs = crc32_ranges(view, bstart, bend) & MASK
        crc_ok_arr = (crcs == (lay.hdr["crc"][:k].astype(np.int64))) | (blen[:k] == 0)
        crc_bad = np.flatnonzero(~crc_ok_arr)
        if self.stop_on_crc and len(crc_bad) and (bad is None or crc_bad[0] < k):
            k = int(crc_bad[0])
            b = self.base + view_base + int(st[k])
            bad = (k, "crc_mismatch", f"body CRC mismatch at physical offset {b}", None)
            crc_bad = crc_bad[:0]
        return k, bad, crc_ok_arr[:k], crc_bad

    def _delays(self, props, is_sched: np.ndarray, k: int):
        """DELAY of the SCHEDULE_TOPIC_XXXX rows: (delay, delay column, first bad row, why it is bad)."""
        delay = np.full(k, -(2**62), dtype=np.int64)
        rows = np.flatnonzero(is_sched)
        dv = props.value("DELAY").take(pa.array(rows)).to_pylist()
        bad_delay = None
        for r, text in zip(rows.tolist(), dv):
            if text is None:
                continue
            v = java_int(text)
            if v is None:
                bad_delay = r
                break
            delay[r] = v
        if bad_delay is not None:
            why = (bad_delay, "parse_error", f"DELAY {dv[list(rows).index(bad_delay)]!r} is not a Java int", None)
            return delay, None, bad_delay, why
        dmask = delay > -(2**62)
        return delay, pa.array(np.where(dmask, delay, 0).astype(np.int32), mask=~dmask), None, None

    # one flat "if column asked: build it" per schema column; splitting it would only scatter the list
    def _columns(self, view, view_base, st, a, pbuf, lay: _Layout, k: int, crc_ok, props, raw, delay,
                 delay_col) -> dict[str, pa.Array]:
        need = self.need
        n = len(st)
        sl = slice(0, k)
        stk = st[:k]
        all_v4 = lay.all_v4
        cols: dict[str, pa.Array] = {}
        h = lay.hdr[:k] if k < n else lay.hdr

        def tail(name: str, idx: int) -> np.ndarray:
            if all_v4:
                return h[name]
            assert lay.tail is not None
            return lay.tail[idx][sl]

        if "phy_offset" in need:
            cols["phy_offset"] = pa.array(self.base + view_base + stk)
        if "size" in need:
            cols["size"] = pa.array(h["total"].astype(np.int32))
        if "magic_version" in need:
            cols["magic_version"] = pa.array(np.where(lay.v2[sl], 2, 1).astype(np.int8))
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
            cols["tran_type"] = pa.array(((lay.sysflag[sl] & 0xC) >> 2).astype(np.int8))
        if "born_timestamp" in need:
            cols["born_timestamp"] = pa.array(h["born"].astype(np.int64))
        v6b = np.zeros(k, bool) if all_v4 else lay.bh[sl] == 20
        v6s = np.zeros(k, bool) if all_v4 else lay.sh[sl] == 20
        p_bh, p_sh = lay.p_bh, lay.p_sh
        if "born_host" in need:
            cols["born_host"] = fast_host_strings(
                a, p_bh[sl], v6b, host_codes(a, p_bh[sl], h["bhost"].view(">u8")) if all_v4 else None)
        sh_codes = None
        if all_v4 and ("store_host" in need or "msg_id" in need):
            sh_codes = host_codes(a, p_sh[sl], h["shost"].view(">u8"))
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
            cols["topic"] = as_utf8(take_ranges(pbuf, lay.p_topic[sl], lay.topic_len[sl]))[0]
        tags = None
        if props is not None and ("tags" in need or "tags_code" in need):
            tags = props.value("TAGS")
            cols["tags"] = tags
        if "keys" in need:
            cols["keys"] = props.value("KEYS")
        if "uniq_key" in need:
            cols["uniq_key"] = props.value("UNIQ_KEY")
        if "msg_id" in need:
            phy_b = lay.raw88[:k].view(np.uint8).reshape(-1, 88)[:, 28:36] if all_v4 else None
            cols["msg_id"] = fast_msg_ids(a, p_sh[sl], v6s, stk + 28, sh_codes, phy_b)
        if "tags_code" in need:
            cols["tags_code"] = pa.array(tags_codes(tags, None, store_ts, delay, self.delay_levels_ms))
        if "properties" in need:
            cols["properties"] = props.as_map()
        if "properties_raw" in need:
            cols["properties_raw"] = raw
        if "prop_crc_ok" in need:
            cols["prop_crc_ok"] = self._prop_crc(view, stk, lay.total[sl], props)
        if "delay_level" in need:
            cols["delay_level"] = delay_col
        if "body" in need:
            cols["body"] = take_ranges(pbuf, lay.p_body[sl], lay.blen[sl])
        return cols

    def _prop_crc(self, view: memoryview, st: np.ndarray, total: np.ndarray, props) -> pa.Array:
        """5.3.3 ``__CRC32#`` check (forceVerifyPropCRC): the value read as the broker reads it
        (:func:`crc_expected`) against the masked CRC of the record minus its last 20 bytes; null where
        there is no such property. The 10 ASCII digits the broker writes are read column-wise."""
        k = len(st)
        expected = np.full(k, -1, np.int64)
        present = np.zeros(k, bool)
        if isinstance(props, (FastProperties, SplitProperties)):
            rows, vs, vl = props.value_span(CRC32)
            present[rows] = True
            scalar = np.ones(len(rows), bool)
            ten = np.flatnonzero(vl == 10)
            if len(ten):
                units = rows_at(props.d, vs[ten], 10).astype(np.int64)
                asc = (units < 0x80).all(axis=1)  # one byte, one UTF-16 unit
                e = ((units[asc] - 48) * _POW10).sum(axis=1) & 0xFFFFFFFF
                expected[rows[ten[asc]]] = np.where(e >= 1 << 31, e - (1 << 32), e)
                scalar[ten[asc]] = False
            for i in np.flatnonzero(scalar).tolist():
                s0 = int(vs[i])
                expected[rows[i]] = crc_expected(bytes(props.d[s0 : s0 + int(vl[i])]).decode("utf-8"))
        else:
            values = props.value(CRC32)
            present = np.asarray(values.is_valid()) if k else present
            vals = values.to_pylist()
            for r in np.flatnonzero(present).tolist():
                expected[r] = crc_expected(vals[r])  # already U+FFFD-replaced, as Java decodes
        if not present.any():
            return pa.nulls(k, pa.bool_())
        out = np.zeros(k, dtype=bool)
        sel = np.flatnonzero(expected >= 0)
        if len(sel):
            crcs = crc32_ranges(view, st[sel].tolist(), (st[sel] + total[sel] - CRC32_RESERVED_LEN).tolist()) & MASK
            out[sel] = crcs == expected[sel]
        return pa.array(out, mask=~present)

    def _classify(self, view_base: int, rel: int, k: int):
        """Re-check the first structurally bad record with the scalar validator (the broker's outcome:
        reason and size), over the whole segment: its field reads may run past the record and the view."""
        return (k, *outcome(check_at(self.source, view_base + rel, self.stop_on_crc, self.line, self.read_body,
                                     self.dup_info)))
