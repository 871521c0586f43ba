"""5.x consume-queue layouts rmqstore does not read (BatchConsumeQueue topics, a RocksDB consume-queue
store) are said plainly: one finding each, never "missing consume queue" errors, no in-place rebuild
beside them, and the commands that cannot model them refuse in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli as cli


@pytest.fixture
def batch_store(tmp_path, sample_498) -> Path:
    root = tmp_path / "store"
    shutil.copytree(sample_498 / "store", root)
    # as 5.3.3 keeps such a topic: configured BatchCQ (queueTypeShouldBe), each queue's files of the batch
    # consume queue's mapped size (doLoad); here empty ones (sparse zeros: no unit written yet)
    shutil.rmtree(root / "consumequeue" / "OrderEvents")
    for q in range(4):
        d = root / "batchconsumequeue" / "OrderEvents" / str(q)
        d.mkdir(parents=True)
        with open(d / f"{0:020d}", "wb") as f:
            f.truncate(46 * 300000)  # mapperFileSizeBatchConsumeQueue's default
    (root / "config" / "topics.json").write_text(json.dumps({"topicConfigTable": {
        "OrderEvents": {"topicName": "OrderEvents", "attributes": {"queue.type": "BatchCQ"}}}}))
    return root


@pytest.fixture
def rocksdb_store(tmp_path, sample_498) -> Path:
    root = tmp_path / "store"
    shutil.copytree(sample_498 / "store", root)
    shutil.rmtree(root / "consumequeue")
    (root / "consumequeue").mkdir()
    (root / "consumequeue" / "CURRENT").write_text("MANIFEST-000005\n")
    for name in ("IDENTITY", "MANIFEST-000005", "000004.log", "OPTIONS-000007"):
        (root / "consumequeue" / name).write_bytes(b"\0" * 16)
    return root


def test_batch_consume_queue_topics_are_one_warning_not_missing_queues(batch_store, capsys):
    rc, out, err = cli(capsys, "audit", batch_store, "--quiet", "--json")
    rep = json.loads(out)
    kinds = [f["kind"] for f in rep["findings"]]
    assert rc == 0 and "queue_missing" not in kinds and kinds.count("batch_consume_queue") == 1
    f = next(f for f in rep["findings"] if f["kind"] == "batch_consume_queue")
    assert f["extra"]["topic"] == "OrderEvents" and f["extra"]["queues"] == [0, 1, 2, 3] and f["extra"]["messages"] > 0
    rc, out, _ = cli(capsys, "info", batch_store, "--json")
    assert json.loads(out)["batch_consume_queue_topics"] == {"OrderEvents": [0, 1, 2, 3]}


def test_rebuild_says_what_it_writes_for_batch_topics_and_refuses_in_place(batch_store, tmp_path, capsys):
    rc, out, _ = cli(capsys, "rebuild", batch_store, "--out", tmp_path / "out", "--quiet")
    assert rc == 0 and "BatchConsumeQueue" in out
    rc, _, err = cli(capsys, "rebuild", batch_store, "--in-place", "--quiet")
    assert rc == 2 and "unsupported_layout" in err and (batch_store / "batchconsumequeue" / "OrderEvents").is_dir()
    assert cli(capsys, "rebuild", batch_store, "--in-place", "--what", "index", "--quiet")[0] == 0


def test_a_rocksdb_consume_queue_store_is_read_where_it_can_be_and_refused_in_one_line_where_not(
        rocksdb_store, tmp_path, capsys):
    rc, out, err = cli(capsys, "audit", rocksdb_store, "--quiet", "--json")
    rep = json.loads(out)
    f = [f for f in rep["findings"] if f["kind"] == "rocksdb_consumequeue"]
    assert rc == 0 and len(f) == 1 and f[0]["severity"] == "warning" and "queue_missing" not in str(rep["findings"])
    assert rep["settings"]["broker_line"]["version"] == "5"  # a RocksDB CQ store is a 5.x store
    rc, out, _ = cli(capsys, "info", rocksdb_store, "--json")
    info = json.loads(out)
    assert rc in (0, 1) and info["consume_queue_layout"] == "rocksdb" and len(info["queues"]) == 12
    rc, _, err = cli(capsys, "recover", rocksdb_store)
    assert rc == 2 and "unsupported_layout" in err and len(err.strip().splitlines()) == 1
    rc, out, _ = cli(capsys, "rebuild", rocksdb_store, "--out", tmp_path / "out", "--quiet")
    assert rc == 0 and "RocksDB" in out
    rc, _, err = cli(capsys, "rebuild", rocksdb_store, "--in-place", "--quiet")
    assert rc == 2 and (rocksdb_store / "consumequeue" / "CURRENT").exists()
