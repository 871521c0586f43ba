"""Random corruption of a valid segment: the scan and the scalar check agree, and neither raises.

Bad input must end a scan with a reason and an offset (or be read past by resync), never a traceback
from deep inside numpy or Arrow. The column-wise scan (over a ranged source and a mapped file) and
``check_record`` walked record by record give the same records and the same stop on every outcome:
kind, reason, the size the broker reports, offset; with and without the CRC check; under 4.9.8's rules,
5.3.3's and an unknown line's (a V2 record, a blank longer than the rest of the file). The fixture holds
delayed (SCHEDULE_TOPIC_XXXX, whose DELAY the broker parses) and timer records, V2 records from the fifth.
"""

from __future__ import annotations

import struct
import tempfile

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storelib.fileio.bytesource import LocalSource
from storelib.format.record import BLANK_MAGIC, Message, check_record, encode_message
from storelib.scan.scanner import SegmentEnd, SegmentScan, scan_buffer

SEG = 8192
LINES = [None, "4", "5"]


def _message(i: int, at: int) -> Message:
    """Plain, delayed (SCHEDULE_TOPIC_XXXX with DELAY) and timer (rmq_sys_wheel_timer) records, IPv4 and
    IPv6 born hosts, V1 and V2."""
    props = {"TAGS": f"tag{i}", "KEYS": f"k{i} k{i + 1}", "UNIQ_KEY": f"{i:032X}"}
    topic = f"T{i % 3}"
    if i % 4 == 1:
        topic = "SCHEDULE_TOPIC_XXXX"
        props.update({"DELAY": str(1 + i % 18), "REAL_TOPIC": f"T{i % 3}", "REAL_QID": "0"})
    elif i % 4 == 2:
        topic = "rmq_sys_wheel_timer"
        props.update({"TIMER_OUT_MS": str(1_700_000_100_000 + i), "TIMER_DELIVER_MS": str(1_700_000_100_000 + i),
                      "REAL_TOPIC": f"T{i % 3}", "REAL_QID": "1", "TIMER_ENQUEUE_MS": "1700000000000"})
    return Message(topic=topic, body=bytes([i]) * (20 + 7 * i), queue_offset=i, physical_offset=at,
                   store_timestamp=1_700_000_000_000 + i, born_host="10.0.0.1:1" if i % 5 else "[::1]:5",
                   properties=props, magic_version=2 if i % 5 == 4 else 1)


def _segment() -> tuple[bytes, list[int]]:
    out = bytearray()
    fields: list[int] = []  # offsets of the bytes a damaged record most often differs in
    for i in range(12):
        at = len(out)
        m = _message(i, at)
        rec = encode_message(m)
        v6 = m.born_host.startswith("[")
        body_len_at = at + (96 if v6 else 84)
        topic_len_at = body_len_at + 4 + 20 + 7 * i
        tl = m.magic_version
        topic_len = int.from_bytes(rec[topic_len_at - at : topic_len_at - at + tl], "big")
        props_len_at = topic_len_at + tl + topic_len
        fields += [at, at + 3, body_len_at + 2, body_len_at + 3, topic_len_at + tl - 1, props_len_at, props_len_at + 1]
        d = rec.find(b"DELAY\x01")
        if d >= 0:
            fields += [at + d + 6, at + d + 7]
        out += rec
    free = SEG - len(out)
    fields += [len(out), len(out) + 2, len(out) + 3]  # the blank's TOTALSIZE: longer than the rest of the file
    return bytes(out) + struct.pack(">ii", free, BLANK_MAGIC) + b"\0" * (free - 8), fields


BASE, FIELDS = _segment()


def _scalar_walk(buf: bytes, check_crc: bool, line: str | None = None) -> tuple[list[int], tuple]:
    """Record starts and the stop (kind, reason, size) by check_record alone, record by record."""
    pos, starts = 0, []
    while pos < len(buf):
        chk = check_record(buf, pos, check_crc=check_crc, line=line)
        if chk.kind == "message":
            starts.append(pos)
            pos += chk.size
            continue
        if chk.kind == "blank":
            return starts, ("blank", None, None, pos)
        reason = (chk.reason or "").split(":")[0]
        if reason == "end_of_data":
            return starts, ("end_of_data", None, None, pos)
        return starts, ("invalid", reason, chk.size if chk.size > 0 else None, pos)
    return starts, ("segment_end", None, None, pos)


def _scan_local(buf: bytes, **kw) -> tuple[pa.Table, SegmentEnd]:
    with tempfile.NamedTemporaryFile() as f:
        f.write(buf)
        f.flush()
        with LocalSource(f.name) as src:
            scan = SegmentScan(src, "<local>", 0, **kw)
            table = pa.Table.from_batches(list(scan), schema=scan.schema)
    assert scan.end is not None
    return table, scan.end


def _agree(buf: bytes, crc: bool, window: int, line: str | None = None) -> None:
    """The scan (column-wise walk and decoder), over a ranged source and over a mapped file, and the
    scalar walk give the same records and the same stop: kind, reason, size and offset."""
    starts, stop = _scalar_walk(buf, crc, line)
    for table, end in (scan_buffer(buf, verify_crc=crc, stop_on_crc=crc, window=window, line=line),
                       _scan_local(buf, verify_crc=crc, stop_on_crc=crc, line=line)):
        assert table.column("phy_offset").to_pylist() == starts
        assert table.num_rows == end.records
        assert (end.kind, end.reason, end.size, end.file_offset) == stop


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, SEG - 1), st.integers(0, 255)), min_size=1, max_size=8),
       st.integers(16, SEG), st.booleans(), st.sampled_from([64, 300, 4 << 20]), st.sampled_from(LINES))
def test_random_byte_corruption_and_truncation_the_scan_and_the_scalar_check_agree(edits, cut, crc, window, line):
    buf = bytearray(BASE)
    for pos, val in edits:
        buf[pos] = val
    buf = bytes(buf[:cut])
    _agree(buf, crc, window, line)
    check_record(buf, 0)  # the scalar path must not raise either


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(FIELDS), st.integers(0, 255)), min_size=1, max_size=3),
       st.booleans(), st.sampled_from([64, 4 << 20]), st.sampled_from(LINES))
def test_damaged_lengths_sizes_and_delays_the_scan_and_the_scalar_check_agree(edits, crc, window, line):
    buf = bytearray(BASE)
    for pos, val in edits:
        buf[pos] = val
    _agree(bytes(buf), crc, window, line)


@pytest.mark.parametrize("value", ["x", "3 ", "", "99999999999", "+4", "-2", "\u0663"])
def test_a_delay_that_is_no_java_int_fails_both_paths(value):
    """Integer.parseInt(DELAY) of a SCHEDULE_TOPIC_XXXX record: it throws → -1 (an empty value is no
    property, a sign or an Arabic-Indic digit parse)."""
    m = _message(1, 0)
    m.properties["DELAY"] = value
    rec = encode_message(m)
    buf = rec + struct.pack(">ii", 64, BLANK_MAGIC) + b"\0" * 56
    chk = check_record(buf, 0)
    parses = value in ("", "+4", "-2", "\u0663")
    assert chk.kind == ("message" if parses else "invalid")
    _agree(buf, True, 4 << 20)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=600), st.sampled_from(LINES))
def test_garbage_buffers_never_raise(blob, line):
    table, end = scan_buffer(blob, line=line)
    assert end.kind in ("blank", "end_of_data", "segment_end", "invalid") and table.num_rows == end.records
    check_record(blob, 0, line=line)
    _agree(blob, True, 4 << 20, line)


# ------------------------------------------------------------------------------------------------
# the column-wise leading run (scanner.ChainRun) gives exactly the plain walk's starts and ends

def _body_with_fake_records(i: int) -> bytes:
    """A body that holds what looks like record headers: a real record's bytes, and a magic after a
    plausible TOTALSIZE (a store dump inside a message, a forwarded record)."""
    inner = encode_message(Message(topic="Inner", body=b"x" * (5 + i), physical_offset=0, queue_offset=0,
                                   store_timestamp=1_700_000_000_000, born_host="10.0.0.2:2",
                                   properties={"UNIQ_KEY": f"{i:032X}"}))
    fake = struct.pack(">iI", 200 + i, 0xDAA320A7) + struct.pack(">iI", 91, 0xDAA320AB)
    return (b"\xda" * (i % 5)) + inner[: 40 + 9 * i] + fake + bytes([i]) * (i % 7)


def _adversarial_segment(n: int) -> bytes:
    out = bytearray()
    for i in range(n):
        body = _body_with_fake_records(i) if i % 3 != 1 else bytes([0xDA, 0xA3, 0x20, 0xA7]) * (1 + i % 4)
        out += encode_message(Message(topic=f"T{i % 2}", body=body, queue_offset=i, physical_offset=len(out),
                                      store_timestamp=1_700_000_000_000 + i, born_host="10.0.0.1:1",
                                      properties={"UNIQ_KEY": f"{i:032X}"}, magic_version=2 if i % 4 == 3 else 1))
    free = 16384 - len(out)
    return bytes(out) + struct.pack(">ii", free, BLANK_MAGIC) + b"\0" * (free - 8)


ADVERSARIAL = _adversarial_segment(30)


def _plain_walk(monkeypatch):
    from storelib.scan import scanner

    monkeypatch.setattr(scanner.ChainRun, "run", lambda self, a, rel, lim, rel_end, rows: ([], rel))


def _both(buf: bytes, monkeypatch, **kw):
    from storelib.scan import scanner

    fast = scan_buffer(buf, **kw)
    with monkeypatch.context() as m:
        _plain_walk(m)
        plain = scan_buffer(buf, **kw)
    assert scanner.ChainRun.run is not None
    return fast, plain


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["base", "adversarial"]),
       st.lists(st.tuples(st.integers(0, 16383), st.integers(0, 255)), min_size=0, max_size=6),
       st.integers(16, 16384), st.sampled_from([8, 24, 64, 300, 4 << 20]), st.sampled_from([1, 2, 5, 65536]),
       st.integers(0, 3), st.sampled_from(LINES))
def test_the_leading_run_finds_exactly_the_plain_walks_records(monkeypatch, which, edits, cut, window, rows, split,
                                                               line):
    from storelib.scan import scanner

    buf = bytearray(BASE if which == "base" else ADVERSARIAL)
    for pos, val in edits:
        if pos < len(buf):
            buf[pos] = val
    buf = bytes(buf[:cut])
    monkeypatch.setattr(scanner, "CHAIN_WINDOW", window)
    kw = {"batch_rows": rows, "verify_crc": False, "line": line}
    if split:  # a split: records that start before its end
        kw["end"] = len(buf) * split // 4
    (t_fast, e_fast), (t_plain, e_plain) = _both(buf, monkeypatch, **kw)
    assert e_fast.to_dict() == e_plain.to_dict()
    assert t_fast.equals(t_plain)


def test_the_adversarial_segment_is_read_whole_and_its_fake_records_are_skipped(monkeypatch):
    (t, end), (t_plain, end_plain) = _both(ADVERSARIAL, monkeypatch)
    assert end.kind == "blank" and t.num_rows == 30 and t.equals(t_plain)
    assert t.column("topic").to_pylist() == [f"T{i % 2}" for i in range(30)]


# ------------------------------------------------------------------------------------------------
# where 4.9.8 and 5.3.3 differ: V2 records, a blank record longer than the rest of the file


def test_a_v2_record_is_an_illegal_magic_under_4x_rules_only():
    """4.9.8's checkMessageAndReturnSize knows only MESSAGE_MAGIC_CODE (V1): a V2 record is -1 there, and the
    walk stops at it; 5.3.3 and an unknown line read it. Both paths, and the column-wise leading run."""
    v2_at = [i for i, m in enumerate(_fuzz_messages()) if m.magic_version == 2]
    first = _starts()[v2_at[0]]
    for line, stop in ((None, ("blank", None, None, _blank_at())), ("5", ("blank", None, None, _blank_at())),
                       ("4", ("invalid", "bad_magic", None, first))):
        _agree(BASE, True, 4 << 20, line)
        _agree(BASE, True, 64, line)
        table, end = scan_buffer(BASE, line=line)
        assert (end.kind, end.reason, end.size, end.file_offset) == stop
        assert table.num_rows == (v2_at[0] if line == "4" else 12)
    assert "4.9.8 knows only V1" in scan_buffer(BASE, line="4")[1].detail
    assert check_record(BASE, first, line="4").reason.startswith("bad_magic: 0xDAA320AB (V2")


@pytest.mark.parametrize("total,left", [(8192, 8191), (2**31 - 1, 8), (-(2**31), 64), (-(2**31) + 3, 64),
                                        (-(2**31) + 4, 64), (64, 64), (9, 64), (0, 64), (-1, 64)])
def test_a_blank_record_longer_than_the_rest_of_the_file_is_invalid_under_5x_rules_only(total, left):
    """5.3.3 checks ``remaining < totalSize - 4`` (Java int: INT_MIN..INT_MIN+3 wrap to large positives)
    before the magic, so such a blank is -1; 4.9.8 (and an unknown line) read the magic first: blank (0)."""
    buf = b"\1" * (SEG - left) + struct.pack(">ii", total, BLANK_MAGIC) + bytes(left - 8)
    too_long = total > left or total < -(2**31) + 4
    for line in LINES:
        chk = check_record(buf, SEG - left, line=line)
        invalid = line == "5" and too_long
        assert (chk.kind, chk.size) == (("invalid", -1) if invalid else ("blank", 0))
        table, end = scan_buffer(buf, start=SEG - left, line=line)
        assert table.num_rows == 0 and end.file_offset == SEG - left
        assert (end.kind, end.reason) == (("invalid", "bad_size") if invalid else ("blank", None))
    # and at the end of a segment of records, both paths
    grown = bytearray(BASE)
    grown[_blank_at(): _blank_at() + 4] = struct.pack(">i", SEG - _blank_at() + 1)
    for line in LINES:
        _agree(bytes(grown), True, 4 << 20, line)
    assert scan_buffer(bytes(grown), line="5")[1].detail.startswith(f"blank record, TOTALSIZE {SEG - _blank_at() + 1}")


def _fuzz_messages() -> list[Message]:
    out, at = [], 0
    for i in range(12):
        m = _message(i, at)
        out.append(m)
        at += len(encode_message(m))
    return out


def _starts() -> list[int]:
    return _scalar_walk(BASE, True)[0]


def _blank_at() -> int:
    return _scalar_walk(BASE, True)[1][3]
