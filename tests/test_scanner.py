"""The columnar scanner against the real broker-written samples and the scalar validator."""

from __future__ import annotations

import struct

import pytest

from storelib.format.record import BLANK_MAGIC, Message, check_record, encode_message
from storelib.scan.commitlog import CommitLog
from storelib.scan.scanner import scan_buffer
from tests.conftest import load_expected

PAIRS = [
    ("phy_offset", "phyOffset"), ("size", "size"), ("body_crc", "bodyCRC"), ("queue_id", "queueId"),
    ("flag", "flag"), ("queue_offset", "queueOffset"), ("physical_offset_field", "physicalOffsetField"),
    ("sys_flag", "sysFlag"), ("tran_type", "tranType"), ("born_timestamp", "bornTimestamp"),
    ("store_timestamp", "storeTimestamp"), ("reconsume_times", "reconsumeTimes"),
    ("prepared_transaction_offset", "preparedTransactionOffset"), ("body_len", "bodyLen"), ("topic", "topic"),
    ("tags", "tags"), ("keys", "keys"), ("uniq_key", "uniqKey"), ("msg_id", "offsetMsgId"),
    ("tags_code", "tagsCode"), ("properties_raw", "propertiesStringRaw"),
]


def java_host(h: str) -> str:
    """Our "[v6]:port" form → the oracle's Java "v6:port" text."""
    return h[1:].replace("]:", ":", 1) if h.startswith("[") else h


def test_scan_matches_broker_oracle_field_by_field(sample):
    cl = CommitLog(str(sample / "store" / "commitlog"))
    ends = []
    rows = cl.read_table(ends=ends).to_pylist()
    expected = [e for e in load_expected(sample, "messages.jsonl") if e["type"] == "msg"]
    assert len(rows) == len(expected)
    for r, e in zip(rows, expected):
        for ours, theirs in PAIRS:
            assert r[ours] == e[theirs], (ours, r["phy_offset"])
        assert java_host(r["born_host"]) == e["bornHost"]
        assert java_host(r["store_host"]) == e["storeHost"]
        assert dict(r["properties"]) == e["properties"]
        assert r["crc_ok"] is True
        assert r["magic_version"] == (2 if e["magicCode"] == "0xDAA320AB" else 1)
        if "propCrc32Ok" in e:
            assert r["prop_crc_ok"] == e["propCrc32Ok"]
    blanks = [e for e in load_expected(sample, "messages.jsonl") if e["type"] == "blank"]
    assert [x.kind for x in ends] == ["blank"] * len(blanks) + ["end_of_data"]
    assert [x.phy_offset for x in ends[:-1]] == [b["phyOffset"] for b in blanks]


def _msg(**kw) -> bytes:
    kw.setdefault("store_timestamp", 2)
    m = Message(topic=kw.pop("topic", "T"), body=kw.pop("body", b"hello"), born_timestamp=1,
                born_host="10.0.0.1:1", store_host="10.0.0.2:10911", properties=kw.pop("properties", {"TAGS": "a"}), **kw)
    return encode_message(m)


def _segment(records: list[bytes], size: int = 4096) -> bytes:
    body = b"".join(records)
    free = size - len(body)
    return body + struct.pack(">ii", free, BLANK_MAGIC) + b"\0" * (free - 8)


def test_scan_stops_at_bad_magic_with_offset_and_reason():
    r1, r2 = _msg(), _msg(queue_offset=1)
    bad = bytearray(r2)
    bad[4:8] = b"\x12\x34\x56\x78"
    table, end = scan_buffer(_segment([r1, bytes(bad)]))
    assert table.num_rows == 1
    assert (end.kind, end.reason, end.file_offset) == ("invalid", "bad_magic", len(r1))


@pytest.mark.parametrize("size_field,reason,size,line", [
    (-5, "bad_size", None, None), (7, "bad_size", None, None), (10, "length_mismatch", 10, None),
    (10_000, "length_mismatch", 10_000, None), (10_000, "length_mismatch", 10_000, "4"),
    (10_000, "bad_size", None, "5")])
def test_scan_rejects_negative_tiny_or_oversized_totalsize(size_field, reason, size, line):
    # below the minimum with a valid magic the broker still reads the record: new byte[7] cannot take
    # the 8-byte host (-1), new byte[10] can, and every length fits it: (TOTALSIZE, fail); past the
    # segment's end 4.9.8 reads the fields all the same (a mismatch), 5.3.3 checks the size first (-1)
    r = bytearray(_msg())
    r[0:4] = struct.pack(">i", size_field)
    seg = _segment([bytes(r)])
    assert len(seg) < 10_000
    table, end = scan_buffer(seg, line=line)
    chk = check_record(seg, 0, check_crc=False, line=line)
    assert table.num_rows == 0 and end.reason == reason and end.file_offset == 0 and end.size == size
    assert chk.reason.split(":")[0] == reason and chk.size == (size or -1)


def test_scan_reports_length_mismatch_with_the_broker_size():
    r = bytearray(_msg(body=b"x" * 20))
    r[-8:-6] = struct.pack(">h", 5)  # properties length lies: fields no longer add up to TOTALSIZE
    seg = _segment([bytes(r)])
    table, end = scan_buffer(seg)
    chk = check_record(seg, 0, check_crc=False)
    assert table.num_rows == 0 and end.reason == "length_mismatch" and chk.size == len(r) == end.size


def test_a_length_past_totalsize_is_minus_one_as_the_broker_read_throws():
    r = bytearray(_msg(body=b"x" * 20))
    r[84:88] = struct.pack(">i", 10)  # body length lies: the topic length is then 'x' = 120 > TOTALSIZE 118
    seg = _segment([bytes(r)])
    table, end = scan_buffer(seg)
    chk = check_record(seg, 0, check_crc=False)
    assert len(r) == 118 and (chk.kind, chk.size) == ("invalid", -1)  # byteBuffer.get(new byte[118], 0, 120)
    assert table.num_rows == 0 and end.reason == "parse_error" and end.size is None


def test_scan_marks_crc_mismatch_and_can_stop_there():
    r1 = bytearray(_msg(body=b"payload"))
    r1[88] ^= 0xFF
    seg = _segment([_msg(), bytes(r1), _msg()])
    table, end = scan_buffer(seg)
    assert table.column("crc_ok").to_pylist() == [True, False, True] and end.crc_errors == 1
    table, end = scan_buffer(seg, stop_on_crc=True)
    assert table.num_rows == 1 and end.reason == "crc_mismatch"


def test_scan_truncated_segment_tail_is_reported():
    """A record cut by the segment's end is -1 in both lines: 5.3.3 by its size check, 4.9.8 (and an untold
    line) where its reads of the fields run out of bytes."""
    seg = _msg() + _msg()[:50]
    for line, reason in ((None, "bad_size"), ("4", "bad_size"), ("5", "bad_size")):
        table, end = scan_buffer(seg, line=line)
        assert table.num_rows == 1 and (end.kind, end.reason, end.size) == ("invalid", reason, None)


def test_non_utf8_topic_and_properties_decode_with_replacement():
    r = bytearray(_msg(topic="Tx", properties={"TAGS": "ab"}))
    pos = r.index(b"Tx")
    r[pos + 1] = 0xFF
    table, _ = scan_buffer(_segment([bytes(r)]))
    assert table.column("topic").to_pylist() == ["T\ufffd"]


def test_ipv6_hosts_and_v2_records_decode():
    m = Message(topic="t" * 200, body=b"b", born_host="[2001:db8:0:0:0:0:0:5]:1234", store_host="[::1]:10911",
                store_timestamp=5, magic_version=2, properties={"KEYS": "k1 k2"})
    table, end = scan_buffer(_segment([encode_message(m)], 8192))
    row = table.to_pylist()[0]
    assert row["magic_version"] == 2 and row["topic"] == "t" * 200
    assert row["born_host"] == "[2001:db8:0:0:0:0:0:5]:1234" and row["store_host"] == "[0:0:0:0:0:0:0:1]:10911"
    assert len(row["msg_id"]) == 56 and row["keys"] == "k1 k2"


def test_property_rules_last_valid_duplicate_wins_and_empty_values_ignored():
    raw = "TAGS\x01a\x02TAGS\x01\x02\x01x\x02KEYS\x01k\x01z\x02TAGS\x01b"
    m = Message(topic="T", properties_raw=raw, store_timestamp=1)
    table, _ = scan_buffer(_segment([encode_message(m)]))
    row = table.to_pylist()[0]
    assert row["tags"] == "b" and row["keys"] == "k\x01z"
    assert dict(row["properties"]) == {"TAGS": "b", "KEYS": "k\x01z"}


def test_delay_tags_code_in_schedule_topic_and_bad_delay_invalidates():
    good = _msg(topic="SCHEDULE_TOPIC_XXXX", properties={"DELAY": "3", "TAGS": "x"}, store_timestamp=1_700_000_000_123)
    table, _ = scan_buffer(_segment([good]))
    assert table.column("tags_code").to_pylist() == [1_700_000_010_123]
    bad = _msg(topic="SCHEDULE_TOPIC_XXXX", properties={"DELAY": "three"})
    table, end = scan_buffer(_segment([good, bad]))
    assert table.num_rows == 1 and end.reason == "parse_error"


def test_an_error_while_a_view_of_the_mapping_is_held_is_the_error_reported(tmp_path):
    """Closing a mapped source whose bytes an array still views must not replace the error that ended the
    work (a BufferError from deep inside would hide it)."""
    import pyarrow as pa

    from storelib.fileio.bytesource import open_source, resolve

    f = tmp_path / "seg"
    f.write_bytes(b"\x01" * 4096)
    held = []
    with pytest.raises(ValueError, match="the real problem"):
        with open_source(resolve(str(f))) as src:
            held.append(pa.py_buffer(src.view()))  # what the scanner's column builders hold
            raise ValueError("the real problem")
    assert held[0].to_pybytes()[:4] == b"\x01" * 4
