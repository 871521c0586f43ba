"""DLedger-mode stores as every reading command sees them: detection with the broker line (broker.conf,
--set, --dledger-self-id, the dledger-*/ layout; several nodes need a choice), the Store facade, and
``info``/``messages``/``get`` on both samples against what the broker's own code reported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from storelib.broker.settings.store import Store, load_settings
from storelib.errors import StoreError
from storelib.fileio.bytesource import resolve

from .conftest import SAMPLE_NAMES, SAMPLES, load_expected, run_cli


def _conf(name: str) -> str:
    return str(SAMPLES / f"{SAMPLE_NAMES[name]}.broker.conf")


def _settings(root: Path, conf: str | None = None, **overrides):
    return load_settings(conf, None, overrides or None, resolve(str(root)))


def test_the_layout_alone_or_the_broker_conf_says_dledger(sample_dledger):
    root = sample_dledger / "store"
    by_files = _settings(root)
    assert by_files.dledger is not None and by_files.dledger.self_id == "n0"
    assert "dledger-n0/ and no commitlog segments" in by_files.dledger.reason
    by_conf = _settings(root, _conf("dledger"))
    assert by_conf.dledger.data == "dledger-n0/data" and "enableDLegerCommitLog=true" in by_conf.dledger.reason
    assert by_conf.enable_dleger_commit_log and by_conf.d_leger_group == "broker-a"
    assert by_conf.mapped_file_size_commit_log == 4194304 and by_files.mapped_file_size_commit_log == 4194304
    off = _settings(root, enableDLegerCommitLog="false")
    assert off.dledger is None


def _two_nodes(tmp_path: Path, sample: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(sample / "store", root)
    shutil.copytree(root / "dledger-n0", root / "dledger-n1")
    return root


def test_several_nodes_need_a_choice_and_the_choice_is_honoured(tmp_path, sample_dledger_crashed, capsys):
    root = _two_nodes(tmp_path, sample_dledger_crashed)
    with pytest.raises(StoreError) as e:
        _settings(root)
    assert e.value.kind == "several_dledger_nodes" and "dledger-n0, dledger-n1" in e.value.detail
    assert "--dledger-self-id" in e.value.detail
    rc, out, err = run_cli(capsys, "info", root, "--no-scan")
    assert rc == 2 and "several DLedger nodes" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    rc, out, err = run_cli(capsys, "info", root, "--dledger-self-id", "n1", "--json")
    assert rc == 0, err
    assert json.loads(out)["dledger"]["dir"] == "dledger-n1"
    with pytest.raises(StoreError, match="no dledger-n7/ folder here"):
        _settings(root, dLegerSelfId="n7")


def test_store_path_dledger_commitlog_is_mapped_onto_the_copy(tmp_path, sample_dledger):
    root = tmp_path / "store"
    shutil.copytree(sample_dledger / "store", root)
    (root / "dledger-n0" / "data").rename(root / "dldata")
    conf = tmp_path / "broker.conf"
    conf.write_text("storePathRootDir=/data/rocketmq/store\nenableDLegerCommitLog=true\ndLegerSelfId=n0\n"
                    "storePathDLedgerCommitLog=/data/rocketmq/store/dldata\n")
    s = _settings(root, str(conf))
    assert s.dledger.data == "dldata" and s.dledger.dir == "dledger-n0"
    t = Store(resolve(str(root)), s).commitlog.read_table()
    assert t.num_rows == 2014
    conf.write_text("enableDLegerCommitLog=true\nstorePathDLedgerCommitLog=/elsewhere/data\n")
    with pytest.raises(StoreError, match="no such directory here"):
        _settings(root, str(conf))


def test_commitlog_segments_beside_dledger_data_are_a_mixed_dledger_store(tmp_path, sample_498, sample_dledger):
    root = tmp_path / "store"
    shutil.copytree(sample_498 / "store", root)
    shutil.copytree(sample_dledger / "store" / "dledger-n0", root / "dledger-n0")
    mixed = _settings(root).dledger  # a broker switched to DLedger mode keeps its old commitlog/ (test_dledger_mixed)
    assert mixed.self_id == "n0" and mixed.old is not None and "beside commitlog segments" in mixed.reason
    assert _settings(root, enableDLegerCommitLog="true").dledger.self_id == "n0"
    assert _settings(root, enableDLegerCommitLog="false").dledger is None
    shutil.rmtree(root / "dledger-n0" / "data")  # no DLedger data: the folders alone leave a default store
    (root / "dledger-n0" / "data").mkdir()
    assert _settings(root).dledger is None


def test_the_facade_reads_dledger_state_and_scans_the_node(dledger_sample):
    root = dledger_sample / "store"
    store = Store(resolve(str(root)))  # no settings given: the layout is still found
    st = store.dledger_state
    crashed = "crashed" in dledger_sample.name
    assert st.committed_index == (1005 if crashed else 2013)
    assert st.currterm.curr_term == 0 and st.currterm.vote_leader == "n0"
    exp = load_expected(dledger_sample, "messages.jsonl")
    t = store.commitlog.read_table()
    assert t.num_rows == len(exp) and not [f for f in store.commitlog.findings if f.severity != "info"]
    assert t.column("dledger_committed").to_pylist() == [m["dledgerIndex"] <= st.committed_index for m in exp]


def test_info_reports_the_ledger_the_committed_position_and_what_is_not_committed(dledger_sample, capsys):
    rc, out, err = run_cli(capsys, "info", dledger_sample / "store", "--json")
    assert rc == 0, err
    d = json.loads(out)["dledger"]
    summary = json.loads((dledger_sample / "expected" / "export_summary.json").read_text())
    if "crashed" in dledger_sample.name:
        after = json.loads((dledger_sample / "expected" / "recovery.json").read_text())["afterLoad"]
        java = {**after["dledger"], "storeMaxPhyOffset": after["storeMaxPhyOffset"]}
    else:
        java = {**summary["dledger"], "storeMaxPhyOffset": summary["afterLoad_maxPhyOffset"]}
    assert d["ledger_begin_index"] == java["ledgerBeginIndex"] and d["ledger_end_index"] == java["ledgerEndIndex"]
    assert d["ledger_end_term"] == java["ledgerEndTerm"] and d["term"] == java["memberStateCurrTerm"]
    assert d["committed_index_after_load"] == java["committedIndex"] and d["committed_pos"] == java["committedPos"]
    assert d["write_pos"] == java["writePos"] and d["broker_max_offset"] == java["storeMaxPhyOffset"]
    # the leader as a node's files know it: currterm's voteLeader (a single-node group votes for itself)
    assert d["voted_for"] == "n0" == d["currterm"]["vote_leader"]
    if "crashed" in dledger_sample.name:
        unc = d["uncommitted"]
        assert (unc["entries"], unc["from_index"], unc["to_index"]) == (713, 1006, 1718)
        assert unc["from_phy_offset"] == 1243691 + 48 and unc["end_pos"] == 2096707
        kinds = [f["kind"] for f in json.loads(out)["findings"]]
        assert "dledger_uncommitted_entries" in kinds
    else:
        assert "uncommitted" not in d
    rc, out, err = run_cli(capsys, "info", dledger_sample / "store")
    assert rc == 0 and "DLedger node n0" in out and "broker's max offset after load() is" in out
    assert "term        0, voted for n0 (currterm)" in out


def test_messages_list_every_entry_with_its_committed_state(sample_dledger_crashed, capsys):
    exp = load_expected(sample_dledger_crashed, "messages.jsonl")
    rc, out, err = run_cli(capsys, "messages", sample_dledger_crashed / "store", "--from-offset", 1243691)
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    tail = [m for m in exp if m["phyOffset"] >= 1243691]
    assert [r["phy_offset"] for r in rows] == [m["phyOffset"] for m in tail] and len(rows) == 713
    assert all(r["dledger_committed"] is False for r in rows)
    assert [r["dledger_index"] for r in rows] == [m["dledgerIndex"] for m in tail]
    rc, out, err = run_cli(capsys, "messages", sample_dledger_crashed / "store", "--format", "table", "--limit", "2")
    assert rc == 0 and "dledger_committed" in out.splitlines()[0]


def test_get_by_offset_msg_id_queue_and_key_on_the_broker_offsets(sample_dledger, capsys):
    root = sample_dledger / "store"
    exp = load_expected(sample_dledger, "messages.jsonl")
    m = exp[1234]
    for how in (("--offset", m["phyOffset"]), ("--msg-id", m["offsetMsgId"]),
                ("--queue", f"{m['topic']}:{m['queueId']}:{m['queueOffset']}")):
        rc, out, err = run_cli(capsys, "get", root, *how)
        assert rc == 0, err
        row = json.loads(out)
        assert (row["phy_offset"], row["uniq_key"], row["dledger_index"]) == (m["phyOffset"], m["uniqKey"],
                                                                                m["dledgerIndex"]), how
    queries = [q for q in load_expected(sample_dledger, "index_queries.jsonl") if q["phyOffsets"]][:25]
    for q in queries:
        rc, out, err = run_cli(capsys, "get", root, "--key", q["key"], "--topic", q["topic"])
        assert rc == 0, (q, err)
        assert sorted(json.loads(line)["phy_offset"] for line in out.splitlines()) == sorted(q["phyOffsets"])
    rc, out, err = run_cli(capsys, "get", root, "--offset", m["phyOffset"] - 48)
    assert rc == 2 and "no valid message record" in err


def test_a_dledger_store_on_s3_reads_as_it_does_locally(tmp_path, s3_server):
    from storelib.broker.settings.brokerconf import BrokerSettings
    from storelib.generator.dledgergen import DLedgerGen
    from storelib.generator.gen import generate
    from storelib.generator.genplan import GenConfig

    local = tmp_path / "store"
    generate(local, GenConfig(messages=1500, seed=5),
             BrokerSettings.defaults("4").with_overrides({"mappedFileSizeCommitLog": 256 * 1024}),
             dledger=DLedgerGen(committed_lag=30, index_file_size=64 * 1024))
    uri = s3_server.upload(local, f"{s3_server.new_bucket('dl')}/dump/store")
    s_l, s_r = Store(resolve(str(local))), Store(uri, **s3_server.fs_options())
    assert not s_r.local and s_r.dledger == s_l.dledger and s_r.dledger_state == s_l.dledger_state
    t_l = s_l.commitlog.read_table()
    t_r = s_r.commitlog.read_table(window=64 * 1024)
    assert t_r.equals(t_l) and t_l.column("dledger_committed").to_pylist().count(False) == 30
    phy = t_l.column("phy_offset")[700].as_py()
    assert s_r.commitlog.record_at(phy).column("dledger_index")[0].as_py() == 700


def test_dledger_self_id_or_store_path_alone_say_dledger(tmp_path, sample_dledger_crashed, sample_498,
                                                         sample_dledger):
    """Issue 28 point 1: each of the three broker.conf keys alone chooses DLedger mode (and dLegerSelfId picks the
    node); the reason names the key."""
    root = _two_nodes(tmp_path / "a", sample_dledger_crashed)
    s = _settings(root, dLegerSelfId="n1")
    assert s.dledger.dir == "dledger-n1" and "dLegerSelfId=n1" in s.dledger.reason
    both = tmp_path / "b" / "store"
    shutil.copytree(sample_498 / "store", both)
    shutil.copytree(sample_dledger / "store" / "dledger-n0", both / "dledger-n0")
    s = _settings(both, storePathDLedgerCommitLog="/data/rocketmq/store/dledger-n0/data")
    assert s.dledger is not None and s.dledger.data == "dledger-n0/data"
    assert "storePathDLedgerCommitLog=" in s.dledger.reason
    assert Store(resolve(str(both)), s).commitlog.read_table(with_properties=False).num_rows == 2014


def test_get_on_the_crashed_samples_uncommitted_tail_says_it_is_not_committed(sample_dledger_crashed, capsys):
    """An entry past the committed index (on disk, not served by the broker until DLedger commits it again) is
    found by offset and by msgId, with its entry fields and dledger_committed false; a committed one says true."""
    root = sample_dledger_crashed / "store"
    exp = load_expected(sample_dledger_crashed, "messages.jsonl")
    for m, committed in ((exp[1500], False), (exp[1000], True)):
        assert m["dledgerCommittedPerCheckpointAtCrash"] is committed
        for how in (("--offset", m["phyOffset"]), ("--msg-id", m["offsetMsgId"])):
            rc, out, err = run_cli(capsys, "get", root, *how)
            assert rc == 0, err
            row = json.loads(out)
            assert (row["phy_offset"], row["dledger_index"], row["dledger_pos"], row["dledger_committed"]) == \
                (m["phyOffset"], m["dledgerIndex"], m["dledgerPos"], committed), how
