"""CommitLog layout findings and bad input at the storelib level: findings, not crashes; input untouched."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import struct

from storelib.format.record import BLANK_MAGIC, Message, encode_message
from storelib.scan.commitlog import CommitLog, offset_to_file_name
from storelib.scan.scanner import scan_buffer

SEG = 4096


def _segment(base: int, n: int) -> bytes:
    out = bytearray()
    for i in range(n):
        m = Message(topic="T", body=b"x" * 50, queue_offset=i, physical_offset=base + len(out), store_timestamp=1,
                    properties={"TAGS": "t"})
        out += encode_message(m)
    free = SEG - len(out)
    return bytes(out) + struct.pack(">ii", free, BLANK_MAGIC) + b"\0" * (free - 8)


def _store(tmp_path, segments: int = 3):
    d = tmp_path / "commitlog"
    d.mkdir()
    for k in range(segments):
        (d / offset_to_file_name(k * SEG)).write_bytes(_segment(k * SEG, 5))
    return d


def _digest(d) -> dict[str, str]:
    return {p: hashlib.sha256(open(os.path.join(d, p), "rb").read()).hexdigest() for p in sorted(os.listdir(d))}


def test_missing_middle_segment_is_a_critical_finding_and_the_rest_is_still_read(tmp_path):
    d = _store(tmp_path)
    os.unlink(d / offset_to_file_name(SEG))
    cl = CommitLog(str(d), SEG)
    kinds = [(f.kind, f.severity, f.file) for f in cl.findings]
    assert ("missing_segment", "critical", "commitlog/" + offset_to_file_name(2 * SEG)) in kinds
    assert cl.read_table().num_rows == 10


def test_wrong_segment_size_and_bad_names_are_findings(tmp_path):
    d = _store(tmp_path)
    with open(d / offset_to_file_name(SEG), "r+b") as f:
        f.truncate(SEG - 100)
    (d / "notes.txt").write_text("x")
    (d / "123").write_bytes(b"")
    cl = CommitLog(str(d), SEG)
    kinds = {f.kind for f in cl.findings}
    assert {"wrong_segment_size", "bad_segment_name"} <= kinds
    assert len(cl.segments) == 3


def test_zero_length_last_segment_is_reported_not_fatal(tmp_path):
    d = _store(tmp_path)
    (d / offset_to_file_name(3 * SEG)).write_bytes(b"")
    cl = CommitLog(str(d), SEG)
    assert any(f.kind == "empty_last_segment" for f in cl.findings)
    assert cl.read_table().num_rows == 15


def test_scans_and_lookups_never_write_to_the_input(tmp_path):
    d = _store(tmp_path)
    before, mtimes = _digest(d), {p: os.stat(d / p).st_mtime_ns for p in os.listdir(d)}
    cl = CommitLog(str(d), SEG)
    cl.read_table(with_body=True)
    cl.record_at(0)
    assert _digest(d) == before and {p: os.stat(d / p).st_mtime_ns for p in os.listdir(d)} == mtimes


def test_garbage_properties_never_crash_and_follow_the_broker_rules():
    rnd = random.Random(7)
    alphabet = [b"\x01", b"\x02", b"A", b"=", b"\xff", b"\xc3\xa9", b" "]
    for _ in range(200):
        blob = b"".join(rnd.choice(alphabet) for _ in range(rnd.randrange(0, 40)))
        m = Message(topic="T", body=b"b", store_timestamp=1, properties_raw=blob.decode("utf-8", "surrogateescape"))
        rec = encode_message(m)
        table, end = scan_buffer(rec + struct.pack(">ii", 64, BLANK_MAGIC) + b"\0" * 56)
        assert table.num_rows == 1 and end.kind == "blank"
        from storelib.format.properties import parse_properties

        expect = parse_properties(blob.decode("utf-8", "replace"))
        assert dict(table.column("properties")[0].as_py()) == expect


def test_corrupt_copy_is_read_from_a_copy_not_modified(tmp_path):
    d = _store(tmp_path)
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    with open(bad / offset_to_file_name(SEG), "r+b") as f:
        f.seek(4)
        f.write(b"\0\0\0\0")
    ends = []
    rows = CommitLog(str(bad), SEG).read_table(ends=ends).num_rows
    assert rows == 10 and ends[1].kind == "invalid" and ends[1].file_offset == 0


def test_missing_commitlog_dir_is_an_error_and_an_empty_one_a_warning(tmp_path):
    cl = CommitLog(str(tmp_path / "commitlog"))
    assert [(f.kind, f.severity) for f in cl.findings] == [("no_commitlog_dir", "error")] and cl.segments == []
    (tmp_path / "commitlog").mkdir()
    cl = CommitLog(str(tmp_path / "commitlog"))
    assert [(f.kind, f.severity) for f in cl.findings] == [("no_commitlog_segments", "warning")]
