"""dispatch's write paths that exist for speed: the local CQ writer (continued segments read only
up to their first hole) against cqwriter.write_queue_image, and chunked dispatch (the newest
index file written once) against a one-shot dispatch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from storelib.broker.dispatch.cqwriter import (
    QueueState,
    _data_prefix,
    _write_queue_image_local,
    build_consume_queues,
    write_queue_image,
)
from storelib.broker.dispatch.dispatch import dispatch_store
from storelib.format.consumequeue import file_name
from tests.test_dispatch import SMALL, index_files, tree

S = 200  # 10 units per segment


def _records(n: int, start_phy: int = 0, qoff0: int = 0) -> pa.Table:
    return pa.table({
        "physical_offset_field": pa.array(start_phy + 100 * np.arange(n), pa.int64()),
        "size": pa.array(np.full(n, 100), pa.int32()),
        "tags_code": pa.array(np.arange(n) * 7, pa.int64()),
        "topic": pa.array(["T"] * n),
        "queue_id": pa.array(np.zeros(n), pa.int32()),
        "queue_offset": pa.array(qoff0 + np.arange(n), pa.int64()),
        "tran_type": pa.array(np.zeros(n), pa.int8()),
    })


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if not p.name.startswith(".")}


def test_local_writer_equals_write_queue_image_fresh_and_continued(tmp_path):
    first = build_consume_queues(_records(14), segment_size=S)[("T", 0)]
    a, b = tmp_path / "a", tmp_path / "b"
    write_queue_image(first, str(a), S)
    _write_queue_image_local(first, str(b), S)
    assert _files(a) == _files(b) and len(_files(a)) == 2
    # continue the half-full second segment (b's file is sparse after its data)
    nxt = build_consume_queues(_records(13, 1400, 14), segment_size=S, state={("T", 0): first.state})[("T", 0)]
    write_queue_image(nxt, str(a), S)
    _write_queue_image_local(nxt, str(b), S)
    assert _files(a) == _files(b) and len(_files(a)) == 3
    assert all(len(v) == S for v in _files(b).values())


def test_local_writer_keeps_stale_bytes_of_an_existing_fully_written_segment(tmp_path):
    first = build_consume_queues(_records(4), segment_size=S)[("T", 0)]
    stale = bytes(i % 250 + 1 for i in range(S))  # a fully written file: no holes
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        full = bytearray(stale)
        full[: 80] = np.asarray(first.entries).tobytes()
        (tmp_path / d / file_name(0)).write_bytes(bytes(full))
    st = QueueState(max_physic_offset=300, last_base=0, write_pos=80, backing=None)
    nxt = build_consume_queues(_records(2, 400, 4), segment_size=S, state={("T", 0): st})[("T", 0)]
    write_queue_image(nxt, str(tmp_path / "a"), S)
    _write_queue_image_local(nxt, str(tmp_path / "b"), S)
    got = _files(tmp_path / "b")
    assert got == _files(tmp_path / "a")
    assert got[file_name(0)][120:] == stale[120:]  # bytes after the new units are kept


def test_data_prefix_reads_up_to_the_first_hole_only_when_nothing_follows(tmp_path):
    p = tmp_path / "f"
    with open(p, "wb") as f:
        f.write(b"abc")
        f.truncate(1 << 20)
    got = _data_prefix(str(p), 1 << 20)
    assert got.rstrip(b"\0") == b"abc"  # (all of it where the filesystem reports no holes)
    q = tmp_path / "g"
    q.write_bytes(b"x" * 10 + bytes(5000) + b"y")  # data after zeros: read it all
    assert _data_prefix(str(q), 5011) == q.read_bytes()
    assert _data_prefix(str(tmp_path / "missing"), 10) == b""


def test_chunked_dispatch_equals_one_shot_cq_and_index_bytes(tmp_path, sample_498):
    from storelib.broker.settings.brokerconf import load_broker_conf
    from tests.conftest import broker_conf

    small = {k: v for k, v in SMALL.items() if k != "mappedFileSizeCommitLog"}
    settings = load_broker_conf(broker_conf("4.9.8"), "4").with_overrides(small)
    src = sample_498 / "store"
    outs = {}
    for name, chunk in (("one", 1 << 20), ("chunked", 5)):
        out = tmp_path / name
        res = dispatch_store(src, settings, out_root=out, chunk_rows=chunk)
        assert len(res.index_files) == len(set(res.index_files)) == len(index_files(out))
        assert len(res.cq_files) == len(set(res.cq_files))
        outs[name] = (tree(out, "consumequeue"), index_files(out))
    assert outs["one"] == outs["chunked"]
    assert len(outs["one"][1]) > 2  # several index files rolled
