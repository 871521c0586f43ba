"""The scanner's fast paths against independent or scalar oracles.

The lean size-chain walk (TOTALSIZE-only loop, magic and fit checked column-wise) vs a walk with the
scalar validator (magic bytes in bodies, garbage tails, splits, windows, batch limits), numpy property parsing vs the scalar broker rules, CRC vs crcmod, the
``__CRC32#`` check vs ``check_record``, column subsets vs the full scan, and release of the source.
"""

from __future__ import annotations

import random
import struct

import crcmod
import numpy as np
import pyarrow as pa
import pytest

from storelib.fileio.bytesource import LocalSource
from storelib.format.crc import body_crc, crc32, crc32_ranges
from storelib.format.properties import parse_properties
from storelib.format.record import BLANK_MAGIC, Message, check_record, encode_message, offset_msg_id
from storelib.scan.arrowcols import as_utf8, take_ranges
from storelib.scan.messageschema import message_schema
from storelib.scan.propcolumns import FastProperties, PropertyColumns, SplitProperties
from storelib.scan.scanner import SegmentScan

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


def _scan(path, **kw) -> tuple[pa.Table, object]:
    src = LocalSource(str(path))
    try:
        scan = SegmentScan(src, "seg", 1_000_000, **kw)
        batches = list(scan)
        table = pa.Table.from_batches(batches, schema=scan.schema)
        return table, scan.end
    finally:
        src.close()


def _write(tmp_path, data: bytes, name: str = "seg"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _reference_walk(data: bytes, start: int = 0, end: int | None = None) -> tuple[list[int], str]:
    """Record starts and how the walk ends, with the scalar validator record by record."""
    end = len(data) if end is None else end
    pos, starts = start, []
    while pos < end:
        chk = check_record(data, pos, check_crc=False)
        if chk.kind != "message":
            return starts, chk.kind if chk.kind == "blank" else (chk.reason or "").split(":")[0]
        starts.append(pos)
        pos += chk.size
    return starts, "segment_end" if end == len(data) else "split_end"


@pytest.mark.parametrize("seed", range(8))
def test_walk_matches_scalar_validator_with_magic_bytes_in_bodies_and_garbage_tails(tmp_path, seed):
    rng = random.Random(seed)
    recs = [_record(rng, i) for i in range(300)]
    tails = [b"blank", b"", struct.pack(">ii", 5000, -626843481), struct.pack(">ii", 50, 0x1234),
             struct.pack(">ii", 200, 0x1234) + b"\0" * 192 + struct.pack(">ii", 100, -626843481),  # chain into a real-looking one
             struct.pack(">ii", 95, -626843481), struct.pack(">ii", 10**6, 0x55), struct.pack(">i", 300)]
    data = _segment(recs, tail=tails[seed % len(tails)])
    p = _write(tmp_path, data)
    for kw in ({}, {"batch_rows": 7}, {"start": len(recs[0]), "end": len(data) // 2}):
        table, end = _scan(p, **kw)
        want, how = _reference_walk(data, kw.get("start", 0), kw.get("end"))
        assert [x - 1_000_000 for x in table.column("phy_offset").to_pylist()] == want
        assert end.records == len(want)
        assert (end.reason or end.kind) == how, (end, how)
    assert table.num_rows > 0


def test_walk_over_bodies_full_of_magics_and_size_fields(tmp_path):
    rng = random.Random(3)
    magic_body = (MAGIC_BYTES[0] + struct.pack(">i", 95)) * 40
    recs = [_record(rng, i, body=magic_body) for i in range(200)]
    data = _segment(recs)
    table, end = _scan(_write(tmp_path, data), batch_rows=64)
    assert table.num_rows == 200 and end.kind == "blank"
    assert [x - 1_000_000 for x in table.column("phy_offset").to_pylist()] == _reference_walk(data)[0]


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


def test_crc_matches_crcmod_and_scan_crc_ok_matches_crcmod(tmp_path):
    rng = random.Random(5)
    bodies = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 700))) for _ in range(200)]
    for b in bodies:
        assert crc32(b) == _crcmod32(b) if b else crc32(b) == 0
        assert body_crc(b) == (_crcmod32(b) & 0x7FFFFFFF if b else 0)
    joined = b"".join(bodies)  # the ranged form the decoder uses: every body of one buffer, empty ones too
    ends = np.cumsum([len(b) for b in bodies]).tolist()
    starts = [0, *ends[:-1]]
    assert crc32_ranges(memoryview(joined), starts, ends).tolist() == [_crcmod32(b) if b else 0 for b in bodies]
    assert crc32_ranges(memoryview(joined), [], []).dtype == np.int64
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
    sp = SplitProperties(arr)
    for name in ("TAGS", "KEYS", "UNIQ_KEY", "DELAY", "__CRC32#", "LONG_PROPERTY_NAME_ABCDEFGH", "a", "x"):
        want = [parse_properties(r).get(name) for r in raws]
        assert fp.value(name).to_pylist() == want, name
        assert sp.value(name).to_pylist() == want, name
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
    zero = bytearray(recs[5])  # ten zeros are the value 0, compared like any other (5.3.3: expectedCRC >= 0)
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
    assert [r["prop_crc_ok"] for r in rows[3:8]] == [None, False, False, None, True]


def test_early_stop_releases_the_source(tmp_path):
    rng = random.Random(6)
    p = _write(tmp_path, _segment([_record(rng, i) for i in range(50)]))
    src = LocalSource(str(p))
    it = iter(SegmentScan(src, "seg", 0, batch_rows=10))
    batch = next(it)
    it.close()
    assert src.mapped
    src.close()  # close() keeps quiet about an export someone still holds: the mapping must really be gone
    assert not src.mapped  # neither the closed scan nor its batch (copied columns) pins the mapping
    assert batch.num_rows == 10


def test_a_held_slice_keeps_the_mapping_and_mapped_says_so(tmp_path):
    src = LocalSource(str(_write(tmp_path, b"x" * 4096)))
    held = src.read(0, 16)
    src.close()
    assert src.mapped and bytes(held) == b"x" * 16
