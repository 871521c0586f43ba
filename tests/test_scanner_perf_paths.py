"""The scanner's fast paths against independent or scalar oracles.

Vectorised size-chain walk vs the scalar walk (false magic candidates in bodies, splits, windows,
batch limits, fallback), numpy property parsing vs the scalar broker rules, CRC vs crcmod, the
``__CRC32#`` check vs ``check_record``, column subsets vs the full scan, and release of the source.
"""

from __future__ import annotations

import random
import struct

import crcmod
import numpy as np
import pyarrow as pa
import pytest

from storelib.bytesource import LocalSource
from storelib.crc import body_crc, crc32
from storelib.properties import parse_properties
from storelib.record import BLANK_MAGIC, Message, check_record, encode_message, offset_msg_id
from storelib.scanner import (
    FastProperties,
    PropertyColumns,
    SegmentScan,
    as_utf8,
    magic_candidates,
    message_schema,
    take_ranges,
)

MAGIC_BYTES = [b"\xda\xa3\x20\xa7", b"\xda\xa3\x20\xab"]
_crcmod32 = crcmod.predefined.mkCrcFun("crc-32")


def _record(rng: random.Random, i: int, *, body: bytes | None = None, **kw) -> bytes:
    if body is None:
        n = rng.randrange(0, 400)
        body = bytes(rng.randrange(256) for _ in range(n))
        if rng.random() < 0.3:  # plant record magics inside the body: false walk candidates
            for _ in range(rng.randrange(1, 4)):
                p = rng.randrange(len(body) + 1)
                body = body[:p] + rng.choice(MAGIC_BYTES) + struct.pack(">i", rng.randrange(-10, 900)) + body[p:]
    props = kw.pop("properties", {"TAGS": f"t{i % 3}", "KEYS": f"k{i} x{i % 7}", "UNIQ_KEY": f"U{i:030d}"})
    m = Message(topic=kw.pop("topic", f"T{i % 4}"), body=body, queue_id=i % 3, queue_offset=i, physical_offset=i * 7,
                born_timestamp=1_000 + i, born_host=kw.pop("born_host", f"10.0.0.{i % 5}:{4000 + i % 3}"),
                store_host=kw.pop("store_host", "10.0.0.9:10911"), store_timestamp=2_000 + i,
                properties=props, magic_version=kw.pop("magic_version", 2 if i % 11 == 0 else 1), **kw)
    return encode_message(m)


def _segment(records: list[bytes], size: int | None = None, tail: bytes = b"blank") -> bytes:
    body = b"".join(records)
    if size is None:
        size = len(body) + 64
    free = size - len(body)
    if tail == b"blank":
        return body + struct.pack(">ii", free, BLANK_MAGIC) + b"\0" * (free - 8)
    return body + tail + b"\0" * (free - len(tail))


def _scan(path, vectorised: bool = True, **kw) -> tuple[pa.Table, object]:
    src = LocalSource(str(path))
    try:
        scan = SegmentScan(src, "seg", 1_000_000, **kw)
        scan._vectorised = vectorised
        batches = list(scan)
        table = pa.Table.from_batches(batches, schema=scan.schema)
        return table, scan.end
    finally:
        src.close()


def _write(tmp_path, data: bytes, name: str = "seg"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_walk_matches_scalar_walk_with_magic_bytes_in_bodies(tmp_path, seed):
    rng = random.Random(seed)
    recs = [_record(rng, i) for i in range(300)]
    tails = [b"blank", b"", struct.pack(">ii", 5000, -626843481), struct.pack(">ii", 50, 0x1234)]
    data = _segment(recs, tail=tails[seed % len(tails)])
    p = _write(tmp_path, data)
    for kw in ({}, {"batch_rows": 7}, {"start": len(recs[0]), "end": len(data) // 2}):
        fast, fend = _scan(p, True, **kw)
        slow, send = _scan(p, False, **kw)
        assert fast.equals(slow)
        assert fend == send
    assert fast.num_rows > 0


def test_vectorised_walk_falls_back_when_bodies_are_full_of_magics(tmp_path):
    rng = random.Random(3)
    magic_body = (MAGIC_BYTES[0] + struct.pack(">i", 95)) * 40
    recs = [_record(rng, i, body=magic_body) for i in range(200)]
    p = _write(tmp_path, _segment(recs))
    src = LocalSource(str(p))
    try:
        scan = SegmentScan(src, "seg", 0)
        rows = sum(b.num_rows for b in scan)
        assert rows == 200 and scan.end.kind == "blank"
        assert scan._vectorised is False  # too many false candidates: the scalar loop took over
    finally:
        src.close()
    fast, _ = _scan(p, True)
    slow, _ = _scan(p, False)
    assert fast.equals(slow)


def test_windowed_source_scan_matches_local_scan(tmp_path):
    rng = random.Random(9)
    recs = [_record(rng, i) for i in range(120)]
    data = _segment(recs)
    p = _write(tmp_path, data)
    local, lend = _scan(p)

    class Windowed:
        def __init__(self, b: bytes):
            self.path, self.size, self._b = "w", len(b), memoryview(b)

        def read(self, offset: int, length: int) -> memoryview:
            return self._b[offset : offset + length]

        def close(self) -> None:
            pass

    scan = SegmentScan(Windowed(data), "seg", 1_000_000, window=3000)
    table = pa.Table.from_batches(list(scan), schema=scan.schema)
    assert table.equals(local)
    assert scan.end == lend


def test_magic_candidates_find_every_magic_position():
    rng = np.random.default_rng(1)
    buf = bytearray(rng.integers(0, 256, 5000, dtype=np.uint8).tobytes())
    want = []
    for p in sorted(rng.choice(4900, 40, replace=False).tolist()):
        if want and p < want[-1] + 8:
            continue
        buf[p + 4 : p + 8] = MAGIC_BYTES[p % 2]
        want.append(p)
    a = np.frombuffer(bytes(buf), np.uint8)
    m = np.flatnonzero((a[4:-3] == 0xDA) & (a[5:-2] == 0xA3) & (a[6:-1] == 0x20) & np.isin(a[7:], [0xA7, 0xAB]))
    got = magic_candidates(pa.py_buffer(bytes(buf)), a, 0, len(buf), len(buf))
    assert got.tolist() == m.tolist() and set(want) <= set(got.tolist())
    lo, hi = 1000, 3000
    sub = magic_candidates(pa.py_buffer(bytes(buf)), a, lo, hi, len(buf))
    assert sub.tolist() == [x for x in m.tolist() if lo <= x < hi]


def test_crc_matches_crcmod_and_scan_crc_ok_matches_crcmod(tmp_path):
    rng = random.Random(5)
    bodies = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 700))) for _ in range(200)]
    for b in bodies:
        assert crc32(b) == _crcmod32(b) if b else crc32(b) == 0
        assert body_crc(b) == (_crcmod32(b) & 0x7FFFFFFF if b else 0)
    recs = []
    expect = []
    for i, b in enumerate(bodies):
        good = i % 4 != 0 or not b
        stored = (_crcmod32(b) & 0x7FFFFFFF) if good else ((_crcmod32(b) + 1) & 0x7FFFFFFF)
        m = Message(topic="T", body=b, body_crc=stored, store_timestamp=1, properties={"TAGS": "a"})
        recs.append(encode_message(m))
        expect.append(good)
    table, end = _scan(_write(tmp_path, _segment(recs)))
    assert table.column("crc_ok").to_pylist() == expect
    assert end.crc_errors == expect.count(False)


PROP_ALPHABET = ["\x01", "\x02", "a", "TAGS", "KEYS", "UNIQ_KEY", "DELAY", "é", "\x00", " ", "x\x01y", "__CRC32#",
                 "LONG_PROPERTY_NAME_ABCDEFGH"]


def _random_props(rng: random.Random) -> str:
    return "".join(rng.choice(PROP_ALPHABET) for _ in range(rng.randrange(0, 14)))


def test_fast_property_parse_matches_broker_rules_on_random_strings():
    rng = random.Random(11)
    raws = [_random_props(rng) for _ in range(3000)]
    raws += ["", "\x02", "\x01", "TAGS\x01a\x02TAGS\x01\x02\x01x\x02KEYS\x01k\x01z\x02TAGS\x01b",
             "A\x01b\x02A\x01c\x02B\x01d\x02", "TAGS\x01v"]
    arr = pa.array([r.encode() for r in raws], pa.binary())
    fp = FastProperties(arr)
    maps = fp.as_map().to_pylist()
    for name in ("TAGS", "KEYS", "UNIQ_KEY", "DELAY", "__CRC32#"):
        got = fp.value(name).to_pylist()
        assert got == [parse_properties(r).get(name) for r in raws], name
    for r, m in zip(raws, maps):
        assert dict(m) == parse_properties(r)
        assert [k for k, _ in m] == list(parse_properties(r))  # first position kept, no repeats
    old = PropertyColumns(pa.array(raws, pa.string())).as_map().to_pylist()
    assert [dict(m) for m in old] == [dict(m) for m in maps]


def test_fast_property_parse_on_sliced_input_and_many_distinct_names():
    names = [f"N{i}" for i in range(100)]
    raws = ["\x02".join(f"{n}\x01{i}" for n in names[i % 7 : i % 7 + 70]) + "\x02N3\x01last" for i in range(50)]
    arr = pa.array([r.encode() for r in raws], pa.binary()).slice(5, 40)
    fp = FastProperties(arr)
    maps = fp.as_map().to_pylist()
    assert [dict(m) for m in maps] == [parse_properties(r) for r in raws[5:45]]


def test_take_ranges_and_utf8_replacement():
    data = b"xxhelloyy\xffzzworld"
    buf = pa.py_buffer(data)
    out = take_ranges(buf, np.array([2, 9, 12]), np.array([5, 3, 5]))
    assert out.to_pylist() == [b"hello", b"\xffzz", b"world"]
    s, clean = as_utf8(out)
    assert not clean and s.to_pylist() == ["hello", "\ufffdzz", "world"]
    s, clean = as_utf8(take_ranges(buf, np.array([2, 12]), np.array([5, 5])))
    assert clean and s.to_pylist() == ["hello", "world"]


def test_non_utf8_properties_use_the_replacement_path(tmp_path):
    r = bytearray(_record(random.Random(1), 1, body=b"b", properties={"TAGS": "ab", "KEYS": "k"}))
    pos = r.index(b"TAGS\x01ab") + 6
    r[pos] = 0xFF
    table, _ = _scan(_write(tmp_path, _segment([bytes(r), _record(random.Random(2), 2)])))
    rows = table.to_pylist()
    assert rows[0]["tags"] == "a\ufffd" and rows[0]["keys"] == "k"
    assert dict(rows[0]["properties"])["TAGS"] == "a\ufffd"


def test_column_subsets_equal_the_full_scan(tmp_path):
    rng = random.Random(4)
    recs = [_record(rng, i) for i in range(200)]
    recs.append(_record(rng, 200, topic="SCHEDULE_TOPIC_XXXX", properties={"DELAY": "3", "TAGS": "x"}))
    p = _write(tmp_path, _segment(recs))
    full, _ = _scan(p)
    names = message_schema().names
    for cols in (["phy_offset", "tags_code", "keys", "uniq_key"], ["topic"], ["msg_id", "born_host"],
                 ["delay_level", "size"], names[::-1]):
        sub, _ = _scan(p, columns=cols)
        assert sub.column_names == cols
        for c in cols:
            assert sub.column(c).equals(full.column(c)), c


def test_bad_delay_invalidates_even_when_delay_columns_are_not_requested(tmp_path):
    rng = random.Random(2)
    good = _record(rng, 0)
    bad = _record(rng, 1, topic="SCHEDULE_TOPIC_XXXX", properties={"DELAY": "x1"})
    table, end = _scan(_write(tmp_path, _segment([good, bad, good])), columns=["phy_offset"])
    assert table.num_rows == 1 and end.reason == "parse_error"


def test_hosts_msg_ids_and_prop_crc_match_scalar_decoder(tmp_path):
    rng = random.Random(8)
    recs = []
    for i in range(60):
        m = Message(topic="T", body=bytes(rng.randrange(256) for _ in range(rng.randrange(1, 50))),
                    born_host=f"192.168.{i % 4}.{i % 9}:{1000 + i}", store_host=f"10.1.1.{i % 2}:10911",
                    physical_offset=i * 1000 + 7, store_timestamp=5, properties={"TAGS": "a"})
        recs.append(encode_message(m, trailing_sep=True, prop_crc=i % 3 != 0))
    bad = bytearray(recs[4])  # stored digits that do not match
    bad[-5] = ord("9") if bad[-5] != ord("9") else ord("8")
    recs[4] = bytes(bad)
    zero = bytearray(recs[5])
    zero[-11:-1] = b"0000000000"
    recs[5] = bytes(zero)
    seg = _segment(recs)
    table, _ = _scan(_write(tmp_path, seg))
    rows = table.to_pylist()
    pos = 0
    for rec, row in zip(recs, rows):
        chk = check_record(seg, pos, check_crc=False)
        m = chk.message
        assert row["born_host"] == m.born_host and row["store_host"] == m.store_host
        assert row["msg_id"] == offset_msg_id(m._store_host_bytes, m.physical_offset)
        assert row["prop_crc_ok"] == chk.prop_crc_ok
        pos += len(rec)
    assert [r["prop_crc_ok"] for r in rows[3:6]] == [None, False, True]


def test_early_stop_releases_the_source(tmp_path):
    rng = random.Random(6)
    p = _write(tmp_path, _segment([_record(rng, i) for i in range(50)]))
    src = LocalSource(str(p))
    it = iter(SegmentScan(src, "seg", 0, batch_rows=10))
    next(it)
    it.close()
    src.close()  # no BufferError: the scan holds no export of the mapping once closed
