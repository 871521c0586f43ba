"""Consume queues built chunk by chunk (storelib.broker.dispatch.cqstream, the rebuild's phase B) equal the one-shot build's
files byte for byte, with the same digests: the merge's memory is one chunk, not the store."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from storelib.broker.dispatch.cqstream import ConsumeQueueStream
from storelib.broker.dispatch.cqwriter import build_consume_queues, write_consume_queues
from storelib.fileio.bytesource import Location

S = 20 * 8  # 8 units a file: queues roll over several files


def _records(n: int = 400, seed: int = 3) -> pa.Table:
    """Dispatch-ordered CQ rows over a few queues: regular ones, one starting past offset 0 (fillers), one
    with duplicates, repeats and a gap (the irregular writer), one prepared transaction (no entry)."""
    rng = np.random.default_rng(seed)
    topics = np.array(["a", "b", "c", "%RETRY%g"])[rng.integers(0, 4, n)]
    qids = rng.integers(0, 3, n).astype(np.int32)
    phy = np.cumsum(rng.integers(100, 300, n)).astype(np.int64)
    size = rng.integers(100, 200, n).astype(np.int32)
    qoff = np.zeros(n, np.int64)
    nxt: dict[tuple[str, int], int] = {("b", 1): 13}
    for i in range(n):
        k = (str(topics[i]), int(qids[i]))
        qoff[i] = nxt.get(k, 0)
        nxt[k] = qoff[i] + 1
    c = np.flatnonzero((topics == "c") & (qids == 2))
    qoff[c[5]] = qoff[c[4]]  # a repeat
    qoff[c[12]] += 4  # a gap
    phy[c[15]], size[c[15]] = phy[c[14]], size[c[14]]  # a duplicate
    tran = np.zeros(n, np.int32)
    tran[7] = 1
    return pa.table({"physical_offset_field": phy, "size": size, "tags_code": rng.integers(0, 1 << 40, n),
                     "topic": topics.tolist(), "queue_id": qids, "queue_offset": qoff, "tran_type": tran})


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("chunk", [1, 7, 64, 400])
def test_stream_in_chunks_equals_one_shot(tmp_path: Path, chunk: int) -> None:
    t = _records()
    want_d: dict[str, str] = {}
    write_consume_queues(build_consume_queues(t, segment_size=S), str(tmp_path / "one"), S, digests=want_d)
    got_d: dict[str, str] = {}
    with ConsumeQueueStream(str(tmp_path / "chunks"), S, got_d) as cqs:
        for a in range(0, t.num_rows, chunk):
            cqs.feed(t.slice(a, chunk))
    want, got = _files(tmp_path / "one"), _files(tmp_path / "chunks")
    assert len(want) > 20 and got == want
    assert cqs.records == t.num_rows and cqs.queues == 12
    assert {os.path.relpath(p, tmp_path / "chunks"): d for p, d in got_d.items()} == {
        os.path.relpath(p, tmp_path / "one"): d for p, d in want_d.items()}
    assert all(got_d[p] == hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in got_d)


def test_stream_to_a_remote_filesystem_equals_one_shot(tmp_path: Path) -> None:
    """A filesystem without appends (not ``local``) keeps each queue's unfinished file until it is complete."""
    t = _records(seed=5)
    write_consume_queues(build_consume_queues(t, segment_size=S), str(tmp_path / "one"), S)
    remote = Location(pafs.LocalFileSystem(), str(tmp_path / "remote"), False)
    digests: dict[str, str] = {}
    with ConsumeQueueStream(remote, S, digests) as cqs:
        for a in range(0, t.num_rows, 50):
            cqs.feed(t.slice(a, 50))
    assert _files(tmp_path / "remote") == _files(tmp_path / "one")
    assert set(digests) == set(cqs.paths)


def test_an_error_leaves_no_temp_files(tmp_path: Path) -> None:
    t = _records()
    with pytest.raises(RuntimeError), ConsumeQueueStream(str(tmp_path / "out"), S) as cqs:
        cqs.feed(t.slice(0, 100))
        raise RuntimeError("boom")
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file() and p.name.endswith(".tmp")]


def test_an_error_while_closing_leaves_no_temp_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last files' zero tails are hashed on threads at close: a failure there removes every temp file
    not yet complete and reaches the caller."""
    import storelib.broker.dispatch.cqstream as cqstream

    calls = []

    def failing(sha, n: int) -> None:
        calls.append(n)
        if len(calls) > 3:
            raise OSError("disk gone")

    with pytest.raises(OSError), ConsumeQueueStream(str(tmp_path / "out"), 20 * 64) as cqs:
        cqs.feed(_records())  # 400 rows in 12 queues: one open file each at close
        monkeypatch.setattr(cqstream, "_hash_zeros", failing)
    assert len(calls) > 3
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
