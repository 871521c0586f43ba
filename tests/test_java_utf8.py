"""Invalid UTF-8 in topics and properties decodes as the broker's ``new String(bytes, UTF_8)`` does.

The expected UTF-16 units, lengths and hashes below were recorded from JDK 17 (``new String(b,
UTF_8)``, ``length()``, ``hashCode()``); they differ from Python's "replace" on ED A0..BF (a UTF-8
encoded surrogate), which Java replaces with one U+FFFD where Python puts one per byte.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from storelib.broker.writer.writer import StoreWriter
from storelib.format.javahash import java_hashes, java_string_hash
from storelib.format.properties import java_string
from storelib.format.record import Message, blank_record, check_record, encode_message
from storelib.scan.arrowcols import as_utf8
from storelib.scan.scanner import scan_buffer
from tests.test_writer import read_all, small, ticking

# hex bytes -> (Java's UTF-16 units as hex, String.hashCode())
JAVA = {
    "eda080": ("fffd", 65533),
    "61eda08062": ("0061fffd0062", 2124838),
    "eda041": ("fffd0041", 2031588),
    "eda0": ("fffd", 65533),
    "61eda0": ("0061fffd", 68540),
    "edbfbf": ("fffd", 65533),
    "ed9fbf": ("d7ff", 55295),
    "edbf80ed": ("fffdfffd", 2097056),
    "eda0eda080": ("fffdfffd", 2097056),
    "eda080eda0": ("fffdfffd", 2097056),
    "eda0c3a9": ("fffd00e9", 2031756),
    "ed": ("fffd", 65533),
    "ed80": ("fffd", 65533),
    "ff": ("fffd", 65533),
    "80": ("fffd", 65533),
    "c080": ("fffdfffd", 2097056),
    "e08080": ("fffdfffdfffd", 65074269),
    "e0a0": ("fffd", 65533),
    "e0a041": ("fffd0041", 2031588),
    "e28241": ("fffd0041", 2031588),
    "f09080": ("fffd", 65533),
    "f4908080": ("fffdfffdfffdfffd", 2017367872),
    "f48fbfbf": ("dbffdfff", 1803232),
    "f0908080": ("d800dc00", 1770496),
    "f5": ("fffd", 65533),
}
CASES = sorted(JAVA)


def _units(s: str) -> str:
    return s.encode("utf-16-be", "surrogatepass").hex()


@pytest.mark.parametrize("hexbytes", CASES)
def test_java_string_puts_u_fffd_where_java_does(hexbytes):
    s = java_string(bytes.fromhex(hexbytes))
    assert (_units(s), java_string_hash(s)) == JAVA[hexbytes]


def test_column_decode_of_unclean_rows_gives_javas_text():
    raw = [bytes.fromhex(h) for h in CASES] + [b"plain", None]
    col, clean = as_utf8(pa.array(raw, pa.binary()))
    assert not clean
    assert [None if s is None else _units(s) for s in col.to_pylist()] == [JAVA[h][0] for h in CASES] + [
        _units("plain"), None]


def test_hashes_and_lengths_of_invalid_binary_rows_are_javas():
    h, n = java_hashes(pa.array([bytes.fromhex(x) for x in CASES], pa.binary()))
    assert h.tolist() == [JAVA[x][1] for x in CASES]
    assert n.tolist() == [len(JAVA[x][0]) // 4 for x in CASES]


def _segment(records: list[bytes], size: int = 4096) -> bytes:
    out = b"".join(records)
    out += blank_record(size - len(out))
    return out + bytes(size - len(out))


def _with_topic_bytes(msg: Message, placeholder: bytes, raw: bytes) -> bytes:
    rec = bytearray(encode_message(msg))
    i = rec.find(placeholder)
    assert len(placeholder) == len(raw)
    rec[i : i + len(raw)] = raw
    return bytes(rec)


def test_surrogate_bytes_in_tags_and_topic_read_as_one_replacement_everywhere():
    tags = b"a\xed\xa0\x80b".decode("utf-8", "surrogateescape")
    m = Message(topic="aXYZb", body=b"x", properties_raw=f"TAGS\x01{tags}\x02KEYS\x01k\udced\udca0")
    rec = _with_topic_bytes(m, b"aXYZb", b"a\xed\xa0\x80b")
    buf = _segment([rec])
    t, end = scan_buffer(buf, columns=["topic", "tags", "keys", "tags_code", "properties"])
    assert end.kind == "blank"
    row = t.to_pylist()[0]
    assert (row["topic"], row["tags"], row["keys"], row["tags_code"]) == ("a\ufffdb", "a\ufffdb", "k\ufffd", 2124838)
    msg = check_record(buf, 0).message
    assert msg is not None
    assert (msg.topic, msg.properties) == ("a\ufffdb", {"TAGS": "a\ufffdb", "KEYS": "k\ufffd"}) == (
        row["topic"], dict(row["properties"]))


def test_property_names_differing_only_in_invalid_bytes_merge_as_in_java():
    props = "K\udcff\x011\x02K\udcfe\x012\x02Z\x013"  # raw FF and FE bytes: both are "K\ufffd" in Java
    buf = _segment([encode_message(Message(topic="T", body=b"x", properties_raw=props))])
    msg = check_record(buf, 0).message
    assert msg is not None and msg.properties == {"K\ufffd": "2", "Z": "3"}
    t, _ = scan_buffer(buf, columns=["properties"])
    assert dict(t.column("properties")[0].as_py()) == msg.properties


def test_commit_writes_the_replacement_javas_end_transaction_writes(tmp_path):
    s = small()
    with StoreWriter(tmp_path, s, clock=ticking()) as w:
        half = w.prepare(Message("Pay", b"half", 1, properties={"K\udcff": "v\udcfe"}), "pg")
        commit, _ = w.commit(half)
    rows = {r["phy_offset"]: r for r in read_all(tmp_path, s)}
    assert dict(rows[commit.phy_offset]["properties"])["K\ufffd"] == "v\ufffd"
    seg = (tmp_path / "commitlog" / "00000000000000000000").read_bytes()
    size = struct.unpack_from(">i", seg, commit.phy_offset)[0]
    rec = seg[commit.phy_offset : commit.phy_offset + size]
    assert b"K\xef\xbf\xbd\x01v\xef\xbf\xbd" in rec and b"\xff" not in rec and b"\xfe" not in rec


def test_config_json_with_surrogate_bytes_reads_as_the_brokers_file2string(tmp_path):
    """config/*.json is read by MixAll.file2String (new String(data, UTF-8)): a topic name holding a UTF-8
    encoded surrogate (ED A0 80) is one U+FFFD in the broker's table, not three."""
    from storelib.format.configjson import load_config

    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "topics.json").write_bytes(b'{"topicConfigTable":{"a\xed\xa0\x80b":{"topicName":"a\xed\xa0\x80b",'
                                      b'"readQueueNums":4,"writeQueueNums":4,"perm":6}}}')
    ld = load_config(str(tmp_path), "topics.json")
    assert list(ld.data["topicConfigTable"]) == ["a\ufffdb"]
    assert [f.kind for f in ld.findings] == ["config_not_utf8"]
