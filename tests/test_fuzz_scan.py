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
