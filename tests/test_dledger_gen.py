"""``generate(..., dledger=DLedgerGen(...))``: DLedger-mode stores written the broker's way (entries, blank
fillers, index units, checkpoint/currterm), clean or in the shapes a crash leaves."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from storelib.errors import StoreError
from storelib.format.dledger.entries import BODY_OFFSET, decode_index_units
from storelib.format.dledger.state import (
    CurrTerm,
    DLedgerCheckpoint,
    read_checkpoint_file,
    read_currterm_file,
)
from storelib.generator.dledgergen import DLedgerGen
from storelib.generator.gen import generate
from storelib.generator.genplan import GenConfig
from storelib.scan.commitlog import CommitLog

from .dledger_oracle import oracle_walk

SEG = 256 * 1024


def _settings(version: str = "4"):
    from storelib.broker.settings.brokerconf import BrokerSettings

    return BrokerSettings.defaults(version).with_overrides({"mappedFileSizeCommitLog": SEG})


def _gen(tmp_path: Path, n: int = 1500, version: str = "4", dispatch: bool = False, **kw) -> Path:
    out = tmp_path / "store"
    generate(out, GenConfig(messages=n, seed=7, version=version), _settings(version), dispatch=dispatch,
             dledger=DLedgerGen(**kw))
    return out


def _log(root: Path, committed: int | None = None) -> CommitLog:
    return CommitLog(str(root / "dledger-n0" / "data"), SEG, dledger=True, committed_index=committed)


def test_a_clean_generated_store_is_a_contiguous_ledger_with_matching_index_units_and_state(tmp_path):
    root = _gen(tmp_path)
    assert not (root / "commitlog").exists() and not (root / "abort").exists() and (root / "lock").exists()
    ends: list = []
    t = _log(root).read_table(ends=ends)
    n = t.num_rows
    assert t.column("dledger_index").to_pylist() == list(range(n))
    assert [e.kind for e in ends] == ["blank"] * (len(ends) - 1) + ["end_of_data"]
    pos = np.asarray(t.column("dledger_pos"))
    assert (np.asarray(t.column("phy_offset")) == pos + BODY_OFFSET).all()
    assert (np.asarray(t.column("physical_offset_field")) == pos + BODY_OFFSET).all()
    # every file is walked by the scalar DLedger walk to the same entries
    data = sorted((root / "dledger-n0" / "data").iterdir())
    walked = sum(len(oracle_walk(p.read_bytes(), int(p.name)).entries) for p in data)
    assert walked == n and all(p.stat().st_size == SEG for p in data)
    with open(root / "dledger-n0" / "index" / ("0" * 20), "rb") as f:
        units = decode_index_units(f.read((n + 1) * 32))
    assert units["pos"][:n].tolist() == pos.tolist() and units["index"][:n].tolist() == list(range(n))
    assert (units["size"][:n] == np.asarray(t.column("size")) + BODY_OFFSET).all() and units[n].tolist() == (0,) * 5
    d = root / "dledger-n0"
    assert read_checkpoint_file(d) == read_checkpoint_file(d, bak=True) == DLedgerCheckpoint(n - 1, n - 1)
    assert read_currterm_file(d) == CurrTerm(0, "n0")
    blank = data[0].read_bytes()[ends[0].file_offset:]
    assert struct.unpack_from(">ii", blank) == (-1, len(blank)) and blank[8:] == bytes(len(blank) - 8)


def test_crash_shapes_stale_checkpoint_abort_and_a_torn_last_entry(tmp_path):
    root = _gen(tmp_path, committed_lag=40, torn_at=60, term=3, self_id="n2")
    d = root / "dledger-n2"
    assert (root / "abort").exists()
    ends: list = []
    t = CommitLog(str(d / "data"), SEG, dledger=True).read_table(ends=ends)
    last = t.num_rows  # the torn entry is the one after the last the scan returns
    assert ends[-1].kind == "invalid" and ends[-1].last_index == last - 1
    assert read_checkpoint_file(d) == DLedgerCheckpoint(last - 40, last - 40)
    assert read_checkpoint_file(d, bak=True) == DLedgerCheckpoint(last - 80, last - 80)
    assert read_currterm_file(d) == CurrTerm(3, "n2") and set(t.column("dledger_term").to_pylist()) == {3}
    # the torn entry's header survived (DLedger's recovery keeps it), its index unit did not
    p = sorted((d / "data").iterdir())[-1]
    head = p.read_bytes()[ends[-1].file_offset: ends[-1].file_offset + 48]
    assert struct.unpack_from(">iiqq", head)[:3] == (1, struct.unpack_from(">i", head, 4)[0], last)
    with open(d / "index" / ("0" * 20), "rb") as f:
        f.seek(last * 32)
        assert f.read(32) == bytes(32)


def test_a_5x_dledger_store_has_no_crc_property_and_bad_options_are_refused(tmp_path):
    root = _gen(tmp_path, n=300, version="5")
    t = _log(root).read_table()
    assert t.column("prop_crc_ok").null_count == t.num_rows
    with pytest.raises(StoreError):
        DLedgerGen(self_id="../x")
    with pytest.raises(StoreError):
        DLedgerGen(index_file_size=100)


def test_dispatched_generated_stores_have_the_consume_queues_and_index_of_their_entries(tmp_path):
    from storelib.broker.settings.store import Store, load_settings
    from storelib.fileio.bytesource import resolve
    from storelib.format.checkpoint import read_checkpoint

    for name, kw in (("clean", {}), ("behind", {"undispatched": 3, "committed_lag": 5})):
        root = _gen(tmp_path / name, n=900, dispatch=True, **kw)
        loc = resolve(str(root))
        store = Store(loc, load_settings(None, None, None, loc))
        assert store.dledger is not None and store.dledger.self_id == "n0"
        t = store.commitlog.read_table()
        d = store.dledger_state
        assert d.committed_index == t.num_rows - 1 - kw.get("committed_lag", 0)
        assert t.column("dledger_committed").to_pylist().count(False) == kw.get("committed_lag", 0)
        from storelib.format.consumequeue import ConsumeQueue, list_queues

        cq_offsets = []
        for _, _, qloc in list_queues(loc):
            for _, chunk in ConsumeQueue(qloc, segment_size=store.settings.mapped_file_size_consume_queue).entries():
                cq_offsets += chunk["phy_offset"][chunk["size"] > 0].tolist()
        cq_offsets.sort()
        dispatched = t.num_rows - kw.get("undispatched", 0)
        assert cq_offsets == t.column("physical_offset_field").to_pylist()[:dispatched]
        cp = read_checkpoint(loc)
        ts = t.column("store_timestamp").to_pylist()
        assert cp.physic_msg_timestamp == cp.logics_msg_timestamp == ts[dispatched - 1]
        assert (root / "abort").exists() == bool(kw)


def test_gen_command_writes_a_crashed_dledger_store(tmp_path, capsys):
    from .conftest import run_cli

    out = tmp_path / "g"
    rc, o, e = run_cli(capsys, "gen", out, "--messages", "400", "--segment-size", "256k", "--dledger",
                       "--dledger-self-id", "n1", "--dledger-committed-lag", "7", "--dledger-torn-at", "48", "--json")
    assert rc == 0, e
    assert (out / "dledger-n1" / "data").is_dir() and (out / "abort").exists()
    rc, o, e = run_cli(capsys, "gen", tmp_path / "h", "--messages", "10", "--crashed")
    assert rc == 2 and "--dledger" in e


@pytest.mark.parametrize("version", ["4", "5"])
def test_the_generator_writes_exactly_what_the_store_writer_writes_in_dledger_mode(tmp_path, version):
    import os

    from storelib.broker.writer.writer import StoreWriter
    from storelib.generator.gen import iter_plans, replay_plan
    from storelib.generator.genplan import Generator

    from .test_gen import GEOMETRY, files

    s = _settings(version).with_overrides(GEOMETRY)  # enabledAppendPropCRC=true: ignored in DLedger mode
    cfg = GenConfig(messages=1500, seed=11, version=version, tx_ratio=0.1, delay_ratio=0.1, compressed_ratio=0.05,
                    ipv6_ratio=0.1, chunk_ops=400)
    res = generate(tmp_path / "gen", cfg, s, dledger=DLedgerGen(self_id="n1", term=2))
    assert res.segments > 2
    g = Generator(cfg, s)
    plans = list(iter_plans(g))
    times = iter([int(t) for p in plans for t in p.store_ts])
    w = StoreWriter(tmp_path / "w", s, clock=lambda: next(times), store_host=cfg.store_host, dledger_self_id="n1",
                    dledger_term=2)
    replay_plan(g, plans, w)
    w.close()
    for sub in ("dledger-n1/data", "dledger-n1/index", "consumequeue", "index"):
        a, b = files(tmp_path / "gen", sub), files(tmp_path / "w", sub)
        assert a.keys() == b.keys() and a, sub
        diff = [k for k in a if a[k] != b[k]]
        assert not diff, f"{sub}: {diff[:3]}"
    for f in ("dledger-n1/checkpoint", "dledger-n1/currterm", "checkpoint"):
        assert (tmp_path / "gen" / f).read_bytes() == (tmp_path / "w" / f).read_bytes(), f
    assert not os.path.exists(tmp_path / "w" / "commitlog" / "00000000000000000000")
    assert "__CRC32#" not in (tmp_path / "gen" / "dledger-n1" / "data" / ("0" * 20)).read_bytes().decode("latin-1")


def test_the_store_writer_continues_a_dledger_store_where_it_ended(tmp_path):
    from storelib.broker.writer.writer import StoreWriter
    from storelib.format.record import Message

    s = _settings()
    msgs = [Message(topic="T", body=bytes(300 + i), queue_id=i % 2, properties={"KEYS": f"k{i}"}) for i in range(900)]
    with StoreWriter(tmp_path / "a", s, dledger_self_id="n0") as w:
        first = [w.append(m) for m in msgs[:500]]
    with StoreWriter(tmp_path / "a", s, dledger_self_id="n0") as w:
        rest = [w.append(m) for m in msgs[500:]]
    with StoreWriter(tmp_path / "b", s, dledger_self_id="n0") as w:
        once = [w.append(m) for m in msgs]
    assert [(r.phy_offset, r.queue_offset) for r in first + rest] == [(r.phy_offset, r.queue_offset) for r in once]
    t = _log(tmp_path / "a").read_table()
    assert t.column("dledger_index").to_pylist() == list(range(900))
    assert read_checkpoint_file(tmp_path / "a" / "dledger-n0") == DLedgerCheckpoint(899, 899)
    assert read_checkpoint_file(tmp_path / "a" / "dledger-n0", bak=True) == DLedgerCheckpoint(499, 499)


def test_a_5x_dledger_store_holds_v2_records_for_long_topics_and_reads_and_audits_them(tmp_path, capsys):
    """5.3.3 DLedgerCommitLog writes a V2 record (2-byte topic length) for a topic over 127 bytes, inside the
    entry like any record: the scan decodes it at entry pos + 48, the rebuild makes the generated queues, the
    audit is clean."""
    from jobs.rebuild import RebuildConfig, rebuild
    from storelib.broker.settings.store import Store, load_settings
    from storelib.fileio.bytesource import resolve

    from .conftest import run_cli

    long_topic = "T" * 200
    root = tmp_path / "store"
    generate(root, GenConfig(messages=400, seed=3, version="5", topic_names=(long_topic, "Short")),
             _settings("5"), dispatch=True, dledger=DLedgerGen())
    loc = resolve(str(root))
    t = Store(loc, load_settings(None, None, None, loc)).commitlog.read_table(with_properties=False)
    topics, magic = t.column("topic").to_pylist(), t.column("magic_version").to_pylist()
    assert long_topic in topics and "Short" in topics
    assert {m for tp, m in zip(topics, magic) if tp == long_topic} == {2}  # V2 (magic_version)
    assert {m for tp, m in zip(topics, magic) if tp == "Short"} == {1}
    assert (np.asarray(t.column("phy_offset")) == np.asarray(t.column("dledger_pos")) + BODY_OFFSET).all()
    rebuild(RebuildConfig(store=str(root), out=str(tmp_path / "out"), progress=False, engine="local"))
    for q in (root / "consumequeue").rglob("0" * 20):
        assert (tmp_path / "out" / q.relative_to(root)).read_bytes() == q.read_bytes(), q
    rc, out, err = run_cli(capsys, "audit", root, "--engine", "local", "--quiet", "--broker-version", "5")
    assert rc == 0, out + err
