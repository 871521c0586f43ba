"""ConsumeQueue and IndexFile rebuilt from DLedger stores byte for byte as the broker's dispatch wrote them,
on every engine (in-process, pool, Spark); the export and the ``rocketmq`` data source over DLedger
entries, with the committed column."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from jobs.rebuild import RebuildConfig, rebuild
from storelib.format.consumequeue import CQ_DTYPE
from storelib.format.indexfile import HEADER_SIZE

from .conftest import SAMPLE_NAMES, SAMPLES, load_expected

SLOTS = 2000  # the samples' maxHashSlotNum


def _conf(sample: Path) -> str:
    name = "dledger-crashed" if "crashed" in sample.name else "dledger"
    return str(SAMPLES / f"{SAMPLE_NAMES[name]}.broker.conf")


def _files(root: Path, sub: str) -> dict[str, bytes]:
    d = root / sub
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _index(root: Path) -> bytes:
    files = sorted((root / "index").iterdir())
    assert len(files) == 1
    return files[0].read_bytes()


_SPARK: dict = {}


@pytest.fixture
def with_spark(spark):
    _SPARK["s"] = spark
    yield spark
    _SPARK.pop("s", None)


def _rebuild(sample: Path, out: Path, engine: str) -> dict:
    cfg = RebuildConfig(store=str(sample / "store"), out=str(out), broker_conf=_conf(sample), progress=False,
                        engine=engine)
    return rebuild(cfg, spark=_SPARK.get("s"))


def _check_clean(sample: Path, out: Path) -> None:
    assert _files(out, "consumequeue") == _files(sample / "store", "consumequeue")
    assert _index(out) == _index(sample / "store")


def _check_crashed(sample: Path, out: Path) -> None:
    """The crashed store rebuilt = what the broker's own start() dispatched on a copy (every entry on disk
    is committed again once the node leads): its consume queues' sha256 after the restart; the index file
    the broker wrote before the crash is a prefix of the rebuilt one (the last two entries were dispatched
    only after the restart, into a new file)."""
    rec = json.loads((sample / "expected" / "recovery.json").read_text())
    after = {f["path"][len("copy/"):]: f["sha256"] for f in rec["filesAfterRecoveryRestartShutdown"]}
    got = {k: hashlib.sha256(v).hexdigest() for k, v in _files(out, "consumequeue").items()}
    assert got == {k[len("consumequeue/"):]: v for k, v in after.items() if k.startswith("consumequeue/")}
    old, new = _index(sample / "store"), _index(out)
    n_old = struct.unpack_from(">i", old, 36)[0]
    assert n_old > 3000 and struct.unpack_from(">i", new, 36)[0] > n_old
    entries = HEADER_SIZE + 4 * SLOTS
    assert new[entries: entries + 20 * n_old] == old[entries: entries + 20 * n_old]
    assert new[:8] == old[:8] and new[16:24] == old[16:24]  # same begin timestamp and begin offset
    # the consume queues the Java side read before the restart are the rebuilt ones minus the two undispatched
    units = {}
    for rel, data in _files(out, "consumequeue").items():
        topic, qid, _ = rel.split("/")
        units[(topic, int(qid))] = np.frombuffer(data, CQ_DTYPE)
    exp = load_expected(sample, "consumequeue_entries.jsonl")
    for e in exp:
        u = units[(e["topic"], e["queueId"])][e["queueOffset"]]
        assert (int(u["phy_offset"]), int(u["size"]), int(u["tags_code"])) == (e["phyOffset"], e["size"], e["tagsCode"])
    assert sum(int((u["size"] > 0).sum()) for u in units.values()) == len(exp) + 2


@pytest.mark.parametrize("engine", ["local", "pool"])
def test_rebuild_equals_the_brokers_files_on_both_samples(tmp_path, dledger_sample, engine):
    m = _rebuild(dledger_sample, tmp_path / "out", engine)
    assert m["engine"] == engine and m["recovery"]["mode"] == "dledger" and m["counts"]["records"] == len(
        load_expected(dledger_sample, "messages.jsonl"))
    if "crashed" in dledger_sample.name:
        _check_crashed(dledger_sample, tmp_path / "out")
    else:
        _check_clean(dledger_sample, tmp_path / "out")


@pytest.mark.spark
def test_rebuild_on_spark_equals_the_brokers_files(tmp_path, sample_dledger, sample_dledger_crashed, with_spark):
    m = _rebuild(sample_dledger, tmp_path / "a", "spark")
    assert m["engine"] == "spark"
    _check_clean(sample_dledger, tmp_path / "a")
    _rebuild(sample_dledger_crashed, tmp_path / "b", "spark")
    _check_crashed(sample_dledger_crashed, tmp_path / "b")


def test_clean_sample_consume_queue_entries_field_by_field(tmp_path, sample_dledger):
    _rebuild(sample_dledger, tmp_path / "out", "local")
    for e in load_expected(sample_dledger, "consumequeue_entries.jsonl"):
        data = (tmp_path / "out" / "consumequeue" / e["topic"] / str(e["queueId"]) / ("0" * 20)).read_bytes()
        u = np.frombuffer(data, CQ_DTYPE)[e["queueOffset"]]
        assert (int(u["phy_offset"]), int(u["size"]), int(u["tags_code"])) == (e["phyOffset"], e["size"], e["tagsCode"])


def test_export_holds_every_entry_with_the_committed_column(tmp_path, dledger_sample, capsys):
    """The export of both samples holds the broker's records field by field (expected/messages.jsonl, bodies by
    sha256), at the broker's offsets, with every entry to the ledger's end and the committed column."""
    from datasources.snapshot import snapshot_dataset

    from .conftest import run_cli

    crashed = "crashed" in dledger_sample.name
    rc, out, err = run_cli(capsys, "export", dledger_sample / "store", "--out", tmp_path / "snap", "--with-body",
                           "--engine", "local", "--quiet", "--json")
    assert rc == 0, err
    manifest = json.loads(out)
    assert manifest["dledger"] is True and manifest["process_offset"] == (2096707 if crashed else 4960165)
    t = snapshot_dataset(str(tmp_path / "snap")).to_table().sort_by("phy_offset")
    exp = load_expected(dledger_sample, "messages.jsonl")
    assert t.num_rows == len(exp) == (1719 if crashed else 2014)
    fields = {"phy_offset": "phyOffset", "size": "size", "queue_id": "queueId", "queue_offset": "queueOffset",
              "physical_offset_field": "physicalOffsetField", "sys_flag": "sysFlag", "born_timestamp": "bornTimestamp",
              "store_timestamp": "storeTimestamp", "body_crc": "bodyCRC", "body_len": "bodyLen", "topic": "topic",
              "tags": "tags", "keys": "keys", "uniq_key": "uniqKey", "msg_id": "offsetMsgId",
              "tags_code": "tagsCode", "dledger_index": "dledgerIndex", "dledger_term": "dledgerTerm",
              "dledger_pos": "dledgerPos"}
    for col, key in fields.items():
        assert t.column(col).to_pylist() == [m.get(key) for m in exp], col
    assert [hashlib.sha256(b).hexdigest() for b in t.column("body").to_pylist()] == [m["bodySha256"] for m in exp]
    want = [m["dledgerCommittedPerCheckpointAtCrash"] for m in exp] if crashed else [True] * len(exp)
    assert t.column("dledger_committed").to_pylist() == want


def test_the_pyarrow_reader_and_lookups_carry_the_entry_columns(sample_dledger_crashed):
    from datasources import find_by_offset, read_messages

    store = str(sample_dledger_crashed / "store")
    exp = load_expected(sample_dledger_crashed, "messages.jsonl")
    t = read_messages(store, maxSplitBytes="256k")
    assert t.column("dledger_index").to_pylist() == [m["dledgerIndex"] for m in exp]
    assert t.column("segment").to_pylist()[0] == "0" * 20
    part = read_messages(store, columns=["phy_offset", "dledger_committed"], fromOffset=1243691, toOffset=1244719)
    assert part.to_pylist() == [{"phy_offset": m["phyOffset"], "dledger_committed": False} for m in exp
                                if 1243691 <= m["phyOffset"] < 1244719]
    one = find_by_offset(store, exp[5]["phyOffset"])
    assert one.column("dledger_pos").to_pylist() == [exp[5]["dledgerPos"]]


@pytest.mark.spark
def test_the_spark_data_source_reads_dledger_entries(spark, sample_dledger_crashed):
    from datasources import register

    register(spark)
    store = str(sample_dledger_crashed / "store")
    df = spark.read.format("rocketmq").option("maxSplitBytes", "256k").load(store)
    assert {"dledger_index", "dledger_committed"} <= set(df.columns)
    assert df.count() == 1719 and df.filter("dledger_committed = false").count() == 713
    rows = df.filter("dledger_index = 1006").select("phy_offset", "dledger_pos").collect()
    assert [(r.phy_offset, r.dledger_pos) for r in rows] == [(1243739, 1243691)]
