"""Generator: byte-identical to StoreWriter, realistic content, readable by the scanner, CLI contract."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from jobs.cli import main as cli_main
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.cqload import LoadedQueue
from storelib.broker.settings.store import Store
from storelib.broker.writer.writer import StoreWriter
from storelib.format.configjson import consumer_offsets, load_config
from storelib.generator.gen import generate, iter_plans, replay_plan
from storelib.generator.genplan import GenConfig, Generator

GEOMETRY = {"mappedFileSizeCommitLog": 262144, "mappedFileSizeConsumeQueue": 2000, "maxHashSlotNum": 200,
            "maxIndexNum": 800, "enabledAppendPropCRC": "true"}


def files(root: Path, sub: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root / sub):
        for n in names:
            p = Path(dirpath) / n
            out[str(p.relative_to(root / sub))] = p.read_bytes()
    return out


@pytest.mark.parametrize("version", ["4", "5"])
def test_generator_writes_exactly_what_store_writer_writes(tmp_path, version):
    s = BrokerSettings.defaults(version).with_overrides(GEOMETRY)
    cfg = GenConfig(messages=1500, seed=11, version=version, tx_ratio=0.1, delay_ratio=0.1, compressed_ratio=0.05,
                    ipv6_ratio=0.1, chunk_ops=400)
    res = generate(tmp_path / "gen", cfg, s)
    assert res.segments > 2  # rolling with blank records happened
    g = Generator(cfg, s)
    plans = list(iter_plans(g))
    times = iter([int(t) for p in plans for t in p.store_ts])
    w = StoreWriter(tmp_path / "w", s, clock=lambda: next(times), store_host=cfg.store_host)
    replay_plan(g, plans, w)
    w.close()
    for sub in ("commitlog", "consumequeue", "index"):
        a, b = files(tmp_path / "gen", sub), files(tmp_path / "w", sub)
        assert a.keys() == b.keys(), sub
        diff = [k for k in a if a[k] != b[k]]
        assert not diff, f"{sub}: {diff[:3]}"


def test_generated_store_has_the_promised_variety(tmp_path):
    s = BrokerSettings.defaults("5").with_overrides(GEOMETRY)
    cfg = GenConfig(messages=3000, seed=3, version="5", topics=4, queues=3, tx_ratio=0.05, delay_ratio=0.05,
                    compressed_ratio=0.03, ipv6_ratio=0.05)
    res = generate(tmp_path / "g", cfg, s)
    t = Store(tmp_path / "g", s).commitlog.read_table(verify_crc=True)
    assert t.num_rows == res.records
    assert pc.all(t.column("crc_ok")).as_py() and pc.all(t.column("prop_crc_ok")).as_py()
    topics = set(t.column("topic").to_pylist())
    assert {"SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC"} <= topics
    assert 2 in t.column("magic_version").to_pylist()  # a topic longer than 127 characters
    sysf = np.asarray(t.column("sys_flag"))
    assert (sysf & 0x10).any() and (sysf & 0x1).any() and set(np.unique(sysf[sysf & 1 == 1] >> 8)) == {1, 2, 3}
    assert 2 in t.column("tran_type").to_pylist()
    raw = t.column("properties_raw").to_pylist()
    assert any("TAGS\x01\x02" in r for r in raw)  # empty tag
    assert any("主键" in r for r in raw) and any(len(k or "") > 1000 for k in t.column("keys").to_pylist())
    uniq = [u for u in t.column("uniq_key").to_pylist() if u]
    assert all(len(u) == 32 and u == u.upper() for u in uniq)
    assert all(int(u[:2], 16) == 0xC0 for u in uniq)  # the producer's IPv4 address comes first
    # config files: topics and plausible consumer offsets (≤ the queue's max offset)
    topics_json = load_config(tmp_path / "g", "topics.json").data
    assert set(topics_json["topicConfigTable"]) >= set(Generator(cfg, s).user_topics)
    offs = consumer_offsets(load_config(tmp_path / "g", "consumerOffset.json").data)
    for (topic, _group), qs in offs.items():
        if topic.startswith("%RETRY%"):
            continue
        for q, off in qs.items():
            cq = LoadedQueue(tmp_path / "g" / "consumequeue" / topic / str(q), segment_size=2000)
            assert 0 <= off <= cq.max_offset()
            cq.close()


def test_size_target_stops_close_to_the_requested_bytes(tmp_path):
    s = BrokerSettings.defaults("4").with_overrides(GEOMETRY)
    res = generate(tmp_path / "g", GenConfig(size=3 << 20, seed=1, chunk_ops=2000), s, dispatch=False)
    assert 3 << 20 <= res.bytes < (3 << 20) + 300_000
    assert not (tmp_path / "g" / "consumequeue").exists()


def test_output_must_be_new_or_empty(tmp_path):
    from storelib.errors import StoreError

    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("keep")
    with pytest.raises(StoreError):
        generate(tmp_path / "x", GenConfig(messages=5), BrokerSettings.defaults("4").with_overrides(GEOMETRY))
    assert (tmp_path / "x" / "f").read_text() == "keep"


def test_cli_gen_prints_counts_the_scanner_reads_back(tmp_path, capsys):
    conf = tmp_path / "broker.conf"
    conf.write_text("mappedFileSizeConsumeQueue=2000\nmaxHashSlotNum=200\nmaxIndexNum=800\n")
    rc = cli_main(["gen", str(tmp_path / "s"), "--messages", "700", "--segment-size", "256KB", "--seed", "5",
                   "--broker-conf", str(conf), "--tx-ratio", "0.1", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    s = BrokerSettings.defaults("4").with_overrides({**GEOMETRY, "enabledAppendPropCRC": "false"})
    t = Store(tmp_path / "s", s).commitlog.read_table()
    assert t.num_rows == out["records"] and out["messages"] == 700
    assert out["cq_records"] == t.num_rows
    assert sum(out["per_type"].values()) == out["records"]
    assert cli_main(["gen", str(tmp_path / "s"), "--messages", "1"]) == 2  # refuses a non-empty OUT
