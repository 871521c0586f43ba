"""A store switched from default mode to DLedger mode keeps its old ``commitlog/`` beside the DLedger data
(4.9.8/5.3.3 DLedgerCommitLog.recover: offsets below ``dividedCommitlogOffset`` are served from the old
log). rmqstore names such a "mixed" store in ``info``, the audit and ``recover``'s plan, and the commands
that would read only one of the two logs refuse in one line."""

from __future__ import annotations

import json
import os

import pytest

from datasources.commitlog_reader import open_commitlog
from datasources.lookup import find_by_offset
from datasources.options import StoreOpen
from storelib.broker.settings.store import load_settings
from storelib.errors import StoreError
from storelib.fileio.bytesource import resolve

from .conftest import run_cli
from .dledger_files import SEG, dledger_entries, gen_mixed

MIXED = "dledger_mixed_commitlog"


@pytest.mark.parametrize("overlap", [False, True])
def test_the_layout_reads_a_mixed_store_in_dledger_mode_with_the_old_log_and_divided_offset(tmp_path, overlap):
    root = gen_mixed(tmp_path, overlap=overlap)
    s = load_settings(None, None, None, resolve(str(root)))
    assert s.dledger is not None and "beside commitlog segments" in s.dledger.reason
    old = s.dledger.old
    assert (old.first, old.end, old.count) == (0, 4 * SEG, 4)
    divided = 0 if overlap else 4 * SEG
    assert old.dledger_first == divided and old.divided == divided  # the first DLedger data file's offset (:275)
    [f] = [f for f in s.dledger.findings if f.kind == MIXED]
    assert f.offset == divided and "DLedgerCommitLog.java:275" in f.detail
    assert ("past the divided offset" in f.detail) == overlap  # an overlap: the old bytes above it are never read
    assert load_settings(None, None, {"enableDLegerCommitLog": "false"}, resolve(str(root))).dledger is None


def test_the_generator_starts_a_switched_nodes_dledger_data_at_the_old_logs_end(tmp_path, capsys):
    root = gen_mixed(tmp_path)
    assert min(p.name for p in (root / "dledger-n0" / "data").iterdir()) == f"{4 * SEG:020d}"
    assert dledger_entries(root)[0][:2] == (0, 4 * SEG)  # entry 0 at the divided offset (DLedgerCommitLog.java:320)
    rc, out, err = run_cli(capsys, "audit", root, "--engine", "local", "--json", "--report-dir", tmp_path / "rep")
    assert [f["kind"] for f in json.loads(out)["findings"] if f["severity"] in ("warning", "error", "critical")] \
        == [MIXED]  # the DLedger part reads clean: its offsets are the broker's


def test_with_no_dledger_data_yet_the_divided_offset_is_the_end_of_the_last_old_segment(tmp_path):
    root = gen_mixed(tmp_path, dledger_data=False)
    s = load_settings(None, None, {"enableDLegerCommitLog": "true"}, resolve(str(root)))
    old = s.dledger.old
    assert old.dledger_first is None and old.divided == old.end == 4 * SEG  # fileFromOffset + fileSize (:309)
    [f] = [f for f in s.dledger.findings if f.kind == MIXED]
    assert "seals that segment with a blank record" in f.detail and "past the divided offset" not in f.detail


def test_info_audit_and_the_recover_plan_name_the_mixed_store(tmp_path, capsys):
    root = gen_mixed(tmp_path)
    rc, out, err = run_cli(capsys, "info", root)
    assert MIXED in out and "mixed store: commitlog/ keeps 4 default-mode segment(s)" in out
    info = json.loads(run_cli(capsys, "info", root, "--json")[1])
    old_rows = [json.loads(x) for x in run_cli(capsys, "messages", tmp_path / "old")[1].splitlines()]
    segs = {d["name"]: d for d in info["segments"]}  # the old log's segments first, each with its own scan's end
    assert [n for n in segs if n.startswith("commitlog/")] == [f"commitlog/{i * SEG:020d}" for i in range(4)]
    assert sum(d["records"] for n, d in segs.items() if n.startswith("commitlog/")) == len(old_rows)
    assert info["messages"] == len(old_rows) + len(dledger_entries(root))
    rc, out, err = run_cli(capsys, "audit", root, "--engine", "local", "--json", "--report-dir", tmp_path / "rep")
    assert MIXED in [f["kind"] for f in json.loads(out)["findings"]]
    rc, out, err = run_cli(capsys, "recover", root, "--json")
    plan = json.loads(out)
    assert MIXED in [f["kind"] for f in plan["findings"]] and plan["supported"] is False
    rc, out, err = run_cli(capsys, "recover", root)
    assert MIXED in out and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["export", "--out", "{tmp}/exp"], ["rebuild", "--out", "{tmp}/rb"],
    ["expiry"], ["timers"], ["recover", "--apply", "--backup", "{tmp}/bk"], ["recover", "--salvage", "{tmp}/sv"],
])
def test_commands_that_read_one_log_refuse_a_mixed_store_in_one_line(tmp_path, capsys, argv):
    root = gen_mixed(tmp_path)
    before = sorted((p, os.path.getsize(p)) for p in map(str, root.rglob("*")) if os.path.isfile(p))
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc, out, err = run_cli(capsys, args[0], root, *args[1:])
    assert rc != 0 and "mixed_dledger_store" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "enableDLegerCommitLog=false" in err
    assert sorted((p, os.path.getsize(p)) for p in map(str, root.rglob("*")) if os.path.isfile(p)) == before


def test_the_commitlog_data_source_refuses_a_mixed_store_and_reads_the_old_log_when_told_default_mode(tmp_path):
    root = gen_mixed(tmp_path)
    with pytest.raises(StoreError, match="mixed store"):
        open_commitlog(StoreOpen.parse({"path": str(root)}))
    assert open_commitlog(StoreOpen.parse({"path": str(root), "set.enableDLegerCommitLog": "false"})).dledger is False


def test_get_and_the_lookup_source_read_each_offset_from_the_log_the_broker_reads_it_from(tmp_path, capsys):
    root = gen_mixed(tmp_path)
    divided = 4 * SEG
    first_old = json.loads(run_cli(capsys, "messages", tmp_path / "old", "--limit", 1)[1])
    rc, out, err = run_cli(capsys, "get", root, "--offset", 0)  # below the divided offset: the old log (:664-676)
    got = json.loads(out.splitlines()[0])
    assert rc == 0 and got["phy_offset"] == 0 and got["uniq_key"] == first_old["uniq_key"]
    assert got.get("dledger_index") is None
    got = json.loads(run_cli(capsys, "get", root, "--offset", divided + 48)[1].splitlines()[0])
    assert got["phy_offset"] == divided + 48 and got["dledger_index"] == 0  # DLedger's entry 0
    t = find_by_offset(str(root), 0)
    assert t.num_rows == 1 and t.column("uniq_key")[0].as_py() == first_old["uniq_key"]
    assert find_by_offset(str(root), divided + 48).column("dledger_index")[0].as_py() == 0


@pytest.mark.parametrize("overlap", [False, True])
def test_messages_reads_the_old_log_below_the_divided_offset_and_dledger_from_it(tmp_path, capsys, overlap):
    root = gen_mixed(tmp_path, overlap=overlap)
    divided = 0 if overlap else 4 * SEG
    rows = [json.loads(line) for line in run_cli(capsys, "messages", root)[1].splitlines()]
    old = [json.loads(line) for line in run_cli(capsys, "messages", tmp_path / "old")[1].splitlines()]
    entries = dledger_entries(root)
    want_old = [r["phy_offset"] for r in old if r["phy_offset"] < divided]  # getData below the divided offset
    assert [r["phy_offset"] for r in rows] == want_old + [pos + 48 for _, pos, _ in entries]
    assert all(r["dledger_index"] is None for r in rows[:len(want_old)])
    assert [r["dledger_index"] for r in rows[len(want_old):]] == [i for i, _, _ in entries]
    assert len(want_old) == (0 if overlap else len(old))
    rc, out, err = run_cli(capsys, "messages", root, "--from-offset", divided - 1 if divided else 0, "--limit", 2,
                           "--format", "parquet", "--out", tmp_path / "m.parquet")
    assert rc == 0 and "wrote 2 messages" in err
