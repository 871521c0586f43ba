"""A flipped TOTALSIZE bit costs small reads, not the bytes it claims, locally and on S3.

CommitLog.checkMessageAndReturnSize reads a record's fixed part and then each length-prefixed field:
that is all it needs to reject a record whose TOTALSIZE was damaged. ``CommitLog.read`` and the
scanner (a record longer than its window: ``record_at``, a remote scan) read the same and no more, and
only a record that passes is read whole. The bytes requested are counted at the source.
"""

from __future__ import annotations

import struct
import tracemalloc

import pyarrow as pa
import pytest

from storelib.errors import StoreError
from storelib.fileio import bytesource
from storelib.fileio.bytesource import ArrowFileSource, LocalSource, resolve
from storelib.format.record import BLANK_MAGIC, Message, encode_message
from storelib.scan.commitlog import CommitLog
from storelib.scan.scanner import CHAIN_WINDOW

SEG = 16 << 20
FLIP = 1 << 23  # one bit of TOTALSIZE: the record claims 8 MiB more than it holds
SMALL = 256 << 10  # what a flipped record may cost in all (a few 64 KiB chunks)


def _records(n: int = 40) -> list[bytes]:
    out = []
    at = 0
    for i in range(n):
        m = Message(topic="T", body=bytes([i]) * 300, queue_offset=i, physical_offset=at, store_timestamp=1 + i,
                    properties={"TAGS": "a", "KEYS": f"k{i}"})
        out.append(encode_message(m))
        at += len(out[-1])
    return out


def _store(tmp_path, bad: int, flip: int = FLIP) -> tuple[str, int, int]:
    """A commitlog with one 16 MiB segment; record ``bad`` has a flipped TOTALSIZE bit. Returns
    (commitlog dir, the bad record's offset, the flipped size)."""
    recs = _records()
    at = sum(len(r) for r in recs[:bad])
    data = bytearray(b"".join(recs))
    total = struct.unpack_from(">i", data, at)[0] ^ flip
    struct.pack_into(">i", data, at, total)
    data += struct.pack(">ii", SEG - len(data), BLANK_MAGIC)
    d = tmp_path / "commitlog"
    d.mkdir()
    with open(d / f"{0:020d}", "wb") as f:
        f.write(data)
        f.truncate(SEG)  # sparse: zeros after the blank record
    return str(d), at, total


class Requests:
    """Every (offset, length) asked of a source: LocalSource.read/read_range, and on S3 each ranged
    request (ArrowFileSource._read_at) and each read-ahead fill."""

    def __init__(self, monkeypatch):
        self.seen: list[tuple[int, int]] = []
        for cls, name in ((LocalSource, "read"), (ArrowFileSource, "_read_at")):
            orig = getattr(cls, name)
            monkeypatch.setattr(cls, name, self._spy(orig))
        orig_fill = bytesource._fill_from

        def fill(f, start, out):
            self.seen.append((start, len(out)))
            return orig_fill(f, start, out)

        monkeypatch.setattr(bytesource, "_fill_from", fill)

    def _spy(self, orig):
        def read(src, offset, length):
            self.seen.append((offset, length))
            return orig(src, offset, length)

        return read

    @property
    def total(self) -> int:
        return sum(n for _, n in self.seen)


def _read(log: CommitLog, at: int, total: int) -> None:
    chk = log.read(at, check_crc=True)
    assert (chk.kind, chk.size) == ("invalid", total)  # a length mismatch: the broker reports TOTALSIZE
    assert chk.reason.startswith("length_mismatch")


def _record_at(log: CommitLog, at: int, total: int) -> None:
    with pytest.raises(StoreError, match="length_mismatch"):
        log.record_at(at)  # a scan with a 64 KiB window from the record


def _scan(log: CommitLog, at: int, total: int) -> None:
    ends: list = []
    rows = sum(b.num_rows for b in log.scan(window=1 << 20, ends=ends))  # 1 MiB windows
    assert rows == 20 and ends[0].reason == "length_mismatch" and ends[0].size == total


OPS = {"read": _read, "record_at": _record_at, "scan": _scan}


@pytest.mark.parametrize("op", list(OPS))
def test_a_flipped_totalsize_costs_small_reads_on_a_local_segment(tmp_path, monkeypatch, op):
    d, at, total = _store(tmp_path, 20)
    log = CommitLog(d)
    OPS[op](log, at, total)  # warm: imports and caches are not the record's cost
    req = Requests(monkeypatch)
    tracemalloc.start()
    try:
        OPS[op](log, at, total)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert req.total <= SMALL, req.seen
    scratch = 0 if op == "read" else CHAIN_WINDOW  # a scan's fixed magic-search buffer, whatever it reads
    assert peak < (1 << 20) + scratch  # no copy of the 8 MiB the size claims
    good = log.read(0)
    assert good.kind == "message" and good.message.body == bytes([0]) * 300


def test_a_totalsize_far_past_the_segment_is_read_as_4x_does_in_small_reads(tmp_path, monkeypatch):
    """TOTALSIZE ~1 GiB in a 16 MiB segment: 4.9.8 (and an untold line) allocates new byte[TOTALSIZE] and reads
    the fields, which fit: a length mismatch of that size, said with the allocation; 5.3.3 fails its size check
    (-1). Either way the record costs small reads and no allocation of what it claims."""
    d, at, total = _store(tmp_path, 20, 1 << 30)
    assert total > SEG
    logs = {line: CommitLog(d, line=line) for line in (None, "4", "5")}
    logs[None].read(at)  # warm
    req = Requests(monkeypatch)
    tracemalloc.start()
    try:
        for line in (None, "4"):
            chk = logs[line].read(at, check_crc=True)
            assert (chk.kind, chk.size) == ("invalid", total) and chk.reason.startswith("length_mismatch")
            assert f"new byte[{total}]" in chk.reason and "past the end of the segment" in chk.reason
            ends: list = []
            assert sum(b.num_rows for b in logs[line].scan(window=1 << 20, ends=ends)) == 20
            assert (ends[0].reason, ends[0].size) == ("length_mismatch", total)
        chk = logs["5"].read(at, check_crc=True)
        assert (chk.kind, chk.size) == ("invalid", -1) and chk.reason.startswith("bad_size")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < (1 << 20) + CHAIN_WINDOW
    assert max(n for _, n in req.seen) <= 1 << 20


@pytest.mark.parametrize("op", list(OPS))
def test_a_flipped_totalsize_costs_small_reads_on_s3(tmp_path, monkeypatch, s3_server, op):
    d, at, total = _store(tmp_path, 20)
    uri = s3_server.upload(d, f"{s3_server.new_bucket('flip')}/store/commitlog")
    log = CommitLog(resolve(uri, **s3_server.fs_options()))
    req = Requests(monkeypatch)
    OPS[op](log, at, total)
    if op == "scan":  # the first window and the one read ahead, then small reads for the record
        assert max(n for _, n in req.seen) <= 1 << 20 and req.total <= (2 << 20) + SMALL, req.seen
    else:
        assert req.total <= SMALL, req.seen
    assert log.read(0).kind == "message"


def test_a_valid_record_longer_than_the_window_is_still_read_whole(tmp_path, monkeypatch, s3_server):
    """The bound is the record's own lengths: a 3 MiB message that passes is read and decoded."""
    big = Message(topic="Big", body=b"\x07" * (3 << 20), store_timestamp=5, properties={"TAGS": "b"})
    rec = encode_message(big)
    d = tmp_path / "commitlog"
    d.mkdir()
    with open(d / f"{0:020d}", "wb") as f:
        f.write(rec + struct.pack(">ii", SEG - len(rec), BLANK_MAGIC))
        f.truncate(SEG)
    uri = s3_server.upload(str(d), f"{s3_server.new_bucket('big')}/store/commitlog")
    log = CommitLog(resolve(uri, **s3_server.fs_options()))
    row = log.record_at(0, with_body=True)
    assert row.column("body")[0].as_py() == big.body
    assert log.read(0).message.body == big.body
    table = pa.Table.from_batches(list(log.scan(window=1 << 20, with_body=True)))
    assert table.num_rows == 1 and table.column("body")[0].as_py() == big.body
