"""5.x DLedger-mode stores with timer messages (``timers``, ``rebuild --what timer``, the timer store in
``recover`` and ``expiry``), and ``rebuild --incremental`` of a DLedger store."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from storelib.broker.settings.store import Store, load_settings
from storelib.fileio.bytesource import resolve
from storelib.format.timerstore import TIMER_TOPIC, read_timerlog

from .conftest import run_cli


def _rows(capsys, root: Path) -> list[dict]:
    rc, out, err = run_cli(capsys, "timers", root, "--state", "all", "--format", "jsonl")
    assert rc == 0, err
    return [json.loads(x) for x in out.splitlines() if x.strip()]


def _store(root: Path) -> Store:
    loc = resolve(str(root))
    return Store(loc, load_settings(None, None, None, loc))


@pytest.fixture(scope="module")
def timer_store(tmp_path_factory):
    """A clean 5.x DLedger store with 200 timer messages (some delivered, most pending)."""
    import contextlib
    import io

    from jobs.cli import main

    out = tmp_path_factory.mktemp("dlt") / "store"
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(["gen", str(out), "--messages", "1500", "--version", "5", "--segment-size", "256k", "--dledger",
                   "--timers", "200", "--set", "maxHashSlotNum=500", "--set", "maxIndexNum=4000", "--json"])
    assert rc == 0
    return out


def test_timers_on_a_5x_dledger_store_point_at_records_inside_entries(timer_store, capsys):
    rc, out, err = run_cli(capsys, "timers", timer_store, "--json")
    assert rc == 0, err
    s = json.loads(out)
    assert s["timers"] == 200 and s["pending"] + s["delivered"] == 200 and s["pending"] > 0 and s["delivered"] > 0
    rows = _rows(capsys, timer_store)
    store = _store(timer_store)
    t = store.commitlog.read_table(with_properties=False)
    at = dict(zip(t.column("phy_offset").to_pylist(), zip(t.column("topic").to_pylist(),
                                                            t.column("dledger_pos").to_pylist())))
    for row in rows:
        topic, pos = at[row["timer_phy_offset"]]
        assert topic == TIMER_TOPIC and row["timer_phy_offset"] == pos + 48
    log = read_timerlog(store.loc, store.settings.mapped_file_size_timer_log)
    assert set(log.units.column("offset_py").to_pylist()) == {r["timer_phy_offset"] for r in rows}


def test_rebuild_what_timer_enqueues_every_timer_record_of_a_dledger_store(timer_store, tmp_path, capsys):
    """Every timer record in queue order, pending or delivered (storelib.broker.timer.timerrebuild)."""
    rc, out, err = run_cli(capsys, "rebuild", timer_store, "--what", "timer", "--out", tmp_path / "o", "--quiet")
    assert rc == 0, err
    store = _store(timer_store)
    rows = sorted(_rows(capsys, timer_store), key=lambda r: r["timer_queue_offset"])
    assert any(r["state"] == "pending" for r in rows) and any(r["state"] == "delivered" for r in rows)
    log = read_timerlog(resolve(str(tmp_path / "o")), store.settings.mapped_file_size_timer_log)
    assert log.units.column("offset_py").to_pylist() == [r["timer_phy_offset"] for r in rows]


def test_recover_plans_the_timer_store_of_a_dledger_store_and_changes_nothing(timer_store, capsys):
    rc, out, err = run_cli(capsys, "recover", timer_store, "--json")
    plan = json.loads(out)
    assert rc == 0 and not plan["changes"], err
    assert plan["timer_store"] is not None and plan["timer_store"]["delete_files"] == []
    assert plan["dledger"]["uncommitted"] is None


def test_expiry_counts_the_pending_timers_a_dledger_policy_loses(timer_store, capsys):
    rc, out, err = run_cli(capsys, "expiry", timer_store, "--set", "fileReservedTime=0", "--set", "deleteWhen=0;1;2;3;"
                           "4;5;6;7;8;9;10;11;12;13;14;15;16;17;18;19;20;21;22;23", "--ingest", "100000",
                           "--engine", "local", "--json")
    assert rc == 0, err
    rep = json.loads(out)
    pol = rep["policies"][0]
    dl = [d for d in pol["deletions"] if d["kind"] == "commitlog"]
    assert dl and all(d["file"].startswith("dledger-n0/data/") for d in dl)
    assert pol["summary"]["cleaner"] == "dledger"
    # every pending timer whose data file goes before its deliver time is lost
    from storelib.broker.timer.timermsg import store_timers, timer_losses

    timers = store_timers(_store(timer_store))
    S = 256 * 1024
    gone = {int(d["file"].rsplit("/", 1)[1]): d["time_ms"] for d in dl}
    exp = sum(1 for st, phy, due in zip(timers.column("state").to_pylist(), timers.column("timer_phy_offset").to_pylist(),
                                        timers.column("deliver_time_ms").to_pylist())
              if st == "pending" and phy - phy % S in gone and gone[phy - phy % S] < due)
    assert timer_losses(timers, pol["deletions"], S)["lost_timers"] == exp > 0
    assert pol["timers"]["lost_timers"] == exp


def _hashes(root: Path, sub: str) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / sub).rglob("*")) if p.is_file()}


def test_rebuild_incremental_continues_a_dledger_stores_queues_and_index(tmp_path, capsys):
    src = tmp_path / "s"
    rc, _, err = run_cli(capsys, "gen", src, "--messages", "1200", "--segment-size", "256k", "--dledger",
                         "--dledger-undispatched", "30", "--set", "maxHashSlotNum=500", "--set", "maxIndexNum=4000")
    assert rc == 0, err
    rc, _, err = run_cli(capsys, "rebuild", src, "--incremental", "--out", tmp_path / "inc", "--quiet")
    assert rc == 0, err
    rc, _, err = run_cli(capsys, "rebuild", src, "--out", tmp_path / "full", "--quiet", "--engine", "local")
    assert rc == 0, err
    inc, full = _hashes(tmp_path / "inc", "consumequeue"), _hashes(tmp_path / "full", "consumequeue")
    assert inc and all(full[k] == v for k, v in inc.items())  # what changed equals the full rebuild
    assert _hashes(tmp_path / "inc", "index") == _hashes(tmp_path / "full", "index")
    m = json.loads((tmp_path / "inc" / "rebuild-manifest.json").read_text())
    assert m["counts"]["records"] == 30
