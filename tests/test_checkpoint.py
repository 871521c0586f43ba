"""storelib.format.checkpoint against both sample stores and small tmp files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from storelib.errors import StoreError
from storelib.fileio.bytesource import Location
from storelib.format.checkpoint import CHECKPOINT_SIZE, Checkpoint, read_checkpoint, write_checkpoint
from tests.conftest import SAMPLES
from tests.conftest import extract_members as _extract


def test_checkpoint_533_matches_java_export(tmp_path):
    root = _extract(tmp_path, "rocketmq-5.3.3-small", ["store/checkpoint"])
    want = json.loads((SAMPLES / "rocketmq-5.3.3-small.json").read_text())["javaExportSummary"][
        "checkpointFile"
    ]
    cp = read_checkpoint(root / "store")
    assert want["fileSize"] == CHECKPOINT_SIZE
    assert cp == Checkpoint(
        want["physicMsgTimestamp"],
        want["logicsMsgTimestamp"],
        want["indexMsgTimestamp"],
        want["masterFlushedOffset"],
        want["confirmPhyOffset"],
    )
    assert cp.min_timestamp() == min(want["physicMsgTimestamp"], want["logicsMsgTimestamp"]) - 3000
    assert cp.min_timestamp_index() == min(cp.min_timestamp(), want["indexMsgTimestamp"])


def test_checkpoint_498_agrees_with_the_records_it_describes(tmp_path):
    root = _extract(tmp_path, "rocketmq-4.9.8-small", ["store/checkpoint", "expected/messages.jsonl"])
    stamps = set()
    with open(root / "expected/messages.jsonl") as f:
        for line in f:
            d = json.loads(line)
            if "storeTimestamp" in d:
                stamps.add(d["storeTimestamp"])
    cp = read_checkpoint(root / "store/checkpoint")
    assert cp.logics_msg_timestamp == max(stamps)  # last record dispatched to a CQ
    assert cp.physic_msg_timestamp in stamps and cp.index_msg_timestamp in stamps
    assert cp.physic_msg_timestamp <= cp.logics_msg_timestamp
    assert (cp.master_flushed_offset, cp.confirm_phy_offset) == (0, 0)  # 4.9.8 leaves bytes 24-39 zero


def test_checkpoint_write_is_4096_zero_padded_and_reads_back(tmp_path):
    cp = Checkpoint(1_700_000_000_123, 1_700_000_000_456, 0, 2**63 - 1, -1)
    path = write_checkpoint(tmp_path, cp)
    raw = Path(path).read_bytes()
    assert len(raw) == 4096 and raw[40:] == bytes(4056)
    assert raw[:8] == (1_700_000_000_123).to_bytes(8, "big")
    assert read_checkpoint(tmp_path) == cp
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]  # no temp file left behind


def test_checkpoint_rewrite_zeroes_trailing_bytes(tmp_path):
    (tmp_path / "checkpoint").write_bytes(bytes(40) + b"\xff" * 4056)
    write_checkpoint(tmp_path / "checkpoint", Checkpoint(1, 2, 3))
    assert (tmp_path / "checkpoint").read_bytes()[40:] == bytes(4056)


def test_checkpoint_value_out_of_i64_range_is_rejected(tmp_path):
    with pytest.raises(StoreError):
        write_checkpoint(tmp_path, Checkpoint(2**63))


def test_checkpoint_missing_and_short_files(tmp_path):
    with pytest.raises(StoreError) as ei:
        read_checkpoint(tmp_path)
    assert ei.value.kind == "missing"
    (tmp_path / "checkpoint").write_bytes(bytes(39))
    with pytest.raises(StoreError) as ei:
        read_checkpoint(tmp_path)
    assert (ei.value.kind, ei.value.offset) == ("truncated", 39)
    (tmp_path / "checkpoint").write_bytes((5).to_bytes(8, "big") * 5)
    with pytest.raises(StoreError) as ei:
        read_checkpoint(tmp_path)
    assert ei.value.offset == 40
    assert read_checkpoint(tmp_path, strict=False) == Checkpoint(5, 5, 5, 5, 5)


def test_checkpoint_min_timestamp_is_never_negative():
    assert Checkpoint(1000, 5000, 0).min_timestamp() == 0
    assert Checkpoint(10_000, 5000, 100).min_timestamp() == 2000
    assert Checkpoint(10_000, 5000, 100).min_timestamp_index() == 100


def test_checkpoint_read_through_non_local_filesystem(tmp_path):
    write_checkpoint(tmp_path, Checkpoint(7, 8, 9))
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    assert read_checkpoint(Location(fs, "checkpoint", False)) == Checkpoint(7, 8, 9)


def test_min_timestamp_wraps_like_a_java_long():
    """StoreCheckpoint.getMinTimestamp: ``min -= 1000 * 3`` in long arithmetic, then ``if (min < 0) min = 0``."""
    flipped = -(2**63) + 1000  # a store time with its sign bit flipped
    cp = Checkpoint(physic_msg_timestamp=flipped, logics_msg_timestamp=1_700_000_000_000, index_msg_timestamp=5)
    assert cp.min_timestamp() == 2**63 - 2000  # wrapped past Long.MIN_VALUE to near Long.MAX_VALUE
    assert cp.min_timestamp_index() == 5
    assert Checkpoint(-(2**63) + 3000, 0).min_timestamp() == 0  # exactly Long.MIN_VALUE: negative, clamped
    assert Checkpoint(-5, 10).min_timestamp() == 0
    assert Checkpoint(10_000, 20_000).min_timestamp() == 7_000
