"""Random corruption of a valid segment never makes the scanner or the validator raise.

Bad input must end a scan with a reason and an offset (or be read past by resync), never a traceback
from deep inside numpy or Arrow.
"""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storelib.format.record import BLANK_MAGIC, Message, check_record, encode_message
from storelib.scan.scanner import scan_buffer

SEG = 8192


def _segment() -> bytes:
    out = bytearray()
    for i in range(12):
        m = Message(topic=f"T{i % 3}", body=bytes([i]) * (20 + 7 * i), queue_offset=i, physical_offset=len(out),
                    store_timestamp=1_700_000_000_000 + i, born_host="10.0.0.1:1" if i % 4 else "[::1]:5",
                    properties={"TAGS": f"tag{i}", "KEYS": f"k{i} k{i + 1}", "UNIQ_KEY": f"{i:032X}"},
                    magic_version=2 if i % 5 == 0 else 1)
        out += encode_message(m)
    free = SEG - len(out)
    return bytes(out) + struct.pack(">ii", free, BLANK_MAGIC) + b"\0" * (free - 8)


BASE = _segment()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, SEG - 1), st.integers(0, 255)), min_size=1, max_size=8),
       st.integers(16, SEG))
def test_random_byte_corruption_and_truncation_never_raise(edits, cut):
    buf = bytearray(BASE)
    for pos, val in edits:
        buf[pos] = val
    buf = bytes(buf[:cut])
    table, end = scan_buffer(buf)
    assert end.kind in ("blank", "end_of_data", "segment_end", "invalid")
    assert table.num_rows == end.records
    if end.kind == "invalid":
        assert 0 <= end.file_offset <= len(buf) and end.reason
    # every row the scan returned is a record the scalar validator accepts at that position
    for off in table.column("phy_offset").to_pylist():
        assert check_record(buf, off, check_crc=False).kind == "message"
    check_record(buf, 0)  # the scalar path must not raise either


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=600))
def test_garbage_buffers_never_raise(blob):
    table, end = scan_buffer(blob)
    assert end.kind in ("blank", "end_of_data", "segment_end", "invalid") and table.num_rows == end.records
    check_record(blob, 0)


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
                                      properties={"UNIQ_KEY": f"{i:032X}"}, magic_version=2 if i % 4 == 0 else 1))
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
       st.integers(0, 3))
def test_the_leading_run_finds_exactly_the_plain_walks_records(monkeypatch, which, edits, cut, window, rows, split):
    from storelib.scan import scanner

    buf = bytearray(BASE if which == "base" else ADVERSARIAL)
    for pos, val in edits:
        if pos < len(buf):
            buf[pos] = val
    buf = bytes(buf[:cut])
    monkeypatch.setattr(scanner, "CHAIN_WINDOW", window)
    kw = {"batch_rows": rows, "verify_crc": False}
    if split:  # a split: records that start before its end
        kw["end"] = len(buf) * split // 4
    (t_fast, e_fast), (t_plain, e_plain) = _both(buf, monkeypatch, **kw)
    assert e_fast.to_dict() == e_plain.to_dict()
    assert t_fast.equals(t_plain)


def test_the_adversarial_segment_is_read_whole_and_its_fake_records_are_skipped(monkeypatch):
    (t, end), (t_plain, end_plain) = _both(ADVERSARIAL, monkeypatch)
    assert end.kind == "blank" and t.num_rows == 30 and t.equals(t_plain)
    assert t.column("topic").to_pylist() == [f"T{i % 2}" for i in range(30)]
