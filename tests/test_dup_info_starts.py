"""duplicationEnable beyond 5.3.3's default start: 4.9.8 never sets its confirm offset (-1), so its reput breaks
before the first record (DefaultMessageStore.java:2017-2020), its abnormal recovery dispatches only
``commitLogOffset < -1`` (CommitLog.java:500-502) and start() waits forever for the reput (:284-290); `rebuild`
refuses it. 5.3.3 with recheckReputOffsetFromCq re-dispatches from the queues' end up to the confirm offset
(getReputEndOffset, DefaultMessageStore.java:2855-2857), and waits forever when that lies past the log's end.
DLedger mode: 4.9.8's confirm offset is the log's max (no effect); 5.3.3's recovery checks DUP_INFO."""

from __future__ import annotations

import os

import numpy as np

from jobs.common import load_settings
from storelib.broker.settings.brokerconf import load_broker_conf
from storelib.broker.settings.store import Store
from storelib.broker.startup.recoveryplan import plan_document
from storelib.broker.startup.startup import simulate
from storelib.fileio.bytesource import resolve
from storelib.format.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from tests.conftest import run_cli

SEG = 65536


def _gen(capsys, out, version: str, *flags: str) -> str:
    rc, _, err = run_cli(capsys, "gen", out, "--messages", "300", "--version", version, "--segment-size", SEG,
                         "--compressed-ratio", "0", *flags)
    assert rc == 0, err
    return str(out)


def _conf(path, **settings: str) -> str:
    path.write_text("".join(f"{k}={v}\n" for k, v in {"mappedFileSizeCommitLog": SEG, **settings}.items()))
    return str(path)


def _plan(root: str, conf: str, version: str) -> dict:
    return plan_document(simulate(Store(root, load_broker_conf(conf, version))), lost=False)


def _cq_entries(root) -> int:
    """Non-zero 20-byte units in every consume queue under ``root``."""
    n = 0
    for d, _, files in os.walk(os.path.join(root, "consumequeue")):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                units = np.frombuffer(fh.read(), np.uint8).reshape(-1, 20)
            n += int(units.any(axis=1).sum())
    return n


def _kinds(plan: dict) -> set[str]:
    return {f["kind"] for f in plan["findings"]}


def test_4_9_8_duplication_enable_makes_a_normal_start_dispatch_nothing_and_wait_forever(tmp_path, capsys):
    root = _gen(capsys, tmp_path / "s", "4", "--no-dispatch", "--dup-info")  # no consume queue: reput from 0
    for dup in (True, False):
        plan = _plan(root, _conf(tmp_path / f"{dup}.conf", duplicationEnable=str(dup).lower()), "4")
        reput = plan["dispatch"]["reput"]
        P = plan["commitlog"]["process_offset"]
        if dup:
            assert (reput["from"], reput["to"], reput["ranges"], plan["dispatch"]["reput_records"]) == (0, 0, [], 0)
            assert {"duplication_dispatches_nothing", "start_waits_for_reput"} <= _kinds(plan)
            wait = next(f for f in plan["findings"] if f["kind"] == "start_waits_for_reput")
            assert wait["extra"] == {"reput_from": 0, "waits_for": P}
        else:
            assert plan["dispatch"]["reput_records"] >= 300 and reput["to"] == P
            assert not {"duplication_dispatches_nothing", "start_waits_for_reput"} & _kinds(plan)


def test_4_9_8_duplication_enable_makes_an_abnormal_recovery_dispatch_nothing(tmp_path, capsys):
    # queues dispatched to the log's end: the reput starts at processOffset, so the start-up does not wait
    root = _gen(capsys, tmp_path / "s", "4", "--dup-info")
    open(os.path.join(root, "abort"), "wb").close()
    for dup in (True, False):
        plan = _plan(root, _conf(tmp_path / f"{dup}.conf", duplicationEnable=str(dup).lower()), "4")
        assert plan["last_exit"]["clean"] is False
        recovered = plan["dispatch"]["recovery_records"]
        assert (recovered == 0) == dup and ("duplication_dispatches_nothing" in _kinds(plan)) == dup
        assert "start_waits_for_reput" not in _kinds(plan)
        assert plan["dispatch"]["reput_records"] == 0


def test_rebuild_refuses_4_9_8_duplication_enable_and_writes_nothing(tmp_path, capsys):
    root = _gen(capsys, tmp_path / "s", "4", "--no-dispatch", "--dup-info")
    conf = _conf(tmp_path / "dup.conf", duplicationEnable="true")
    out = tmp_path / "out"
    rc, _, err = run_cli(capsys, "rebuild", root, "--out", out, "--broker-conf", conf, "--broker-version", "4",
                         "--engine", "local")
    assert rc != 0 and "duplicationEnable=true on 4.9.8" in err and "dispatches nothing" in err
    assert not out.exists()
    rc, _, err = run_cli(capsys, "rebuild", root, "--out", out, "--broker-conf", conf, "--broker-version", "4",
                         "--engine", "local", "--set", "duplicationEnable=false")
    assert rc == 0, err
    assert _cq_entries(out) >= 300


def test_5_3_3_recheck_with_duplication_reputs_only_up_to_the_confirm_offset(tmp_path, capsys):
    """A crash with duplicationEnable: recovery dispatches records ending at or before the checkpoint's
    confirmPhyOffset, sets the confirm offset to its last valid record's start; the rechecked reput goes from the
    queues' end up to that (DefaultMessageStore.java:2855-2857, 2885): the last record is never dispatched."""
    root = _gen(capsys, tmp_path / "s", "5", "--no-dispatch", "--dup-info")
    store = Store(root, load_broker_conf(_conf(tmp_path / "x.conf"), "5"))
    phy = [p for b in store.scan(columns=["phy_offset"]) for p in b.column("phy_offset").to_pylist()]
    first = next(b for b in store.scan(columns=["store_timestamp"])).column("store_timestamp")[0].as_py()
    write_checkpoint(root, Checkpoint(first + 3000, first + 3000, 0, 0, phy[100]))  # recovery from segment 0
    open(os.path.join(root, "abort"), "wb").close()
    for dup in (True, False):
        conf = _conf(tmp_path / f"{dup}.conf", duplicationEnable=str(dup).lower(), recheckReputOffsetFromCq="true")
        plan = _plan(root, conf, "5")
        P = plan["commitlog"]["process_offset"]
        assert plan["checkpoint_after"]["confirm_phy_offset"] == phy[-1] < P
        reput = plan["dispatch"]["reput"]
        if dup:
            assert plan["dispatch"]["recovery_records"] == 100
            assert (reput["to"], max(r["to"] for r in reput["ranges"])) == (phy[-1], phy[-1])
            assert reput["from"] <= phy[100] and plan["dispatch"]["reput_records"] >= len(phy) - 101
        else:
            assert plan["dispatch"]["recovery_records"] == len(phy) and (reput["from"], reput["to"]) == (P, P)
        assert "start_waits_for_reput" not in _kinds(plan)


def test_5_3_3_recheck_with_duplication_waits_forever_for_a_confirm_offset_past_the_log(tmp_path, capsys):
    # no DUP_INFO: the window's first record fails, recovery keeps the checkpoint's confirm offset (past the log)
    root = _gen(capsys, tmp_path / "s", "5", "--no-dispatch")
    cp = read_checkpoint(root)
    for recheck in (True, False):
        write_checkpoint(root, Checkpoint(cp.physic_msg_timestamp, cp.logics_msg_timestamp,
                                          cp.index_msg_timestamp, cp.master_flushed_offset, 10 * SEG))
        conf = _conf(tmp_path / f"{recheck}.conf", duplicationEnable="true",
                     recheckReputOffsetFromCq=str(recheck).lower())
        plan = _plan(root, conf, "5")
        P = plan["commitlog"]["process_offset"]
        assert plan["checkpoint_after"]["confirm_phy_offset"] == 10 * SEG > P
        waits = [f for f in plan["findings"] if f["kind"] == "start_waits_for_reput"]
        assert bool(waits) == recheck
        if recheck:
            assert waits[0]["extra"] == {"reput_from": 0, "waits_for": 10 * SEG}
            assert plan["dispatch"]["reput"]["to"] == P


def _dledger_plan(root: str, version: str, dup: bool) -> dict:
    settings = load_settings(None, version, {"duplicationEnable": str(dup).lower(), "mappedFileSizeCommitLog": SEG},
                             resolve(root))
    return plan_document(simulate(Store(resolve(root), settings), version), lost=False)


def test_5_3_3_dledger_abnormal_recovery_checks_dup_info_and_keeps_dledgers_own_facts(tmp_path, capsys):
    """dledgerRecoverAbnormally passes checkDupInfo to its record check (DLedgerCommitLog.java:319/348): without
    DUP_INFO its walk ends at the first record (processOffset 0: the consume queues are cut there), while
    DLedger's load and recover (data end, committed position), which read entry headers, are unchanged."""
    root = _gen(capsys, tmp_path / "s", "5", "--dledger", "--crashed")
    on, off = _dledger_plan(root, "5", True), _dledger_plan(root, "5", False)
    for k in ("data_end", "last_entry_end", "committed_pos", "max_offset"):
        assert on["dledger"][k] == off["dledger"][k], k
    facts = [[{k: v for k, v in f.items() if not k.startswith("records_end")} for f in p["dledger"]["files"]]
             for p in (on, off)]
    assert facts[0] == facts[1] and on["dledger"]["files"][0]["records_end_reason"] == "dup_info"
    assert off["dispatch"]["recovery_records"] >= 300 and on["dispatch"]["recovery_records"] == 0
    assert (on["dledger"]["abnormal_533"]["records"], on["dledger"]["abnormal_533"]["process_offset"]) == (0, 0)
    assert on["commitlog"]["process_offset"] == off["commitlog"]["process_offset"] > 0
    normal = _gen(capsys, tmp_path / "n", "5", "--dledger")  # normal recovery walks no record: no check
    assert _dledger_plan(normal, "5", True)["dledger"] == _dledger_plan(normal, "5", False)["dledger"]


def test_5_3_3_dledger_abnormal_recovery_with_duplication_dispatches_only_below_the_committed_position(
        tmp_path, capsys):
    # commitLogOffset < getConfirmOffset() = DLedger's max offset, its committed position (:354-356, :175-177)
    root = _gen(capsys, tmp_path / "s", "5", "--dledger", "--crashed", "--dup-info", "--dledger-committed-lag", "5")
    on, off = _dledger_plan(root, "5", True), _dledger_plan(root, "5", False)
    assert on["dledger"]["abnormal_533"]["records"] == off["dledger"]["abnormal_533"]["records"]
    assert off["dispatch"]["recovery_records"] - on["dispatch"]["recovery_records"] == 5
    committed = on["dledger"]["max_offset"]
    assert {r["only_physical_offset_below"] for r in on["dispatch"]["recovery"]} == {committed}
    assert "recovery_uncommitted_not_dispatched" in _kinds(on) and "recovery_uncommitted_not_dispatched" not in _kinds(off)


def test_4_9_8_dledger_duplication_enable_changes_nothing(tmp_path, capsys):
    # 4.9.8 DLedgerCommitLog.getConfirmOffset is getMaxOffset (:172-174) and its recovery checks no DUP_INFO
    root = _gen(capsys, tmp_path / "s", "4", "--dledger", "--crashed", "--dledger-undispatched", "5")
    on, off = _dledger_plan(root, "4", True), _dledger_plan(root, "4", False)
    assert on["dispatch"] == off["dispatch"] and on["dispatch"]["reput_records"] > 0
    assert on["findings"] == off["findings"]
    out = tmp_path / "out"  # and the rebuild, which refuses 4.9.8's duplicationEnable outside DLedger mode, runs
    rc, _, err = run_cli(capsys, "rebuild", root, "--out", out, "--broker-version", "4", "--engine", "local",
                         "--set", "duplicationEnable=true", "--set", f"mappedFileSizeCommitLog={SEG}")
    assert rc == 0, err
    assert _cq_entries(out) > 0
