"""The timer-store audit accepts what RocketMQ 5.3.3's TimerMessageStore writes (deletion markers, records
put straight out, timerlog files its cleaner deleted, a wheel whose num lags after a stop) and still reports
real damage; the streamed check and the partitioned task say the same on every engine. Stores are the
real 5.3.3 sample changed the way the broker would (tests/timer_java_stores.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from storelib.fileio.bytesource import resolve
from storelib.format.timerstore import SLOT_SIZE, read_timerlog, slot_index
from tests import timer_java_stores as J
from tests.conftest import extract_sample

NOW = 1_800_000_000_000
OUTLIVING_IN_SAMPLE = 75  # the sample's pending timers due after fileReservedTime (its export says so)


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    return extract_sample("timer", tmp_path_factory.mktemp("timer-java"))


def _audit(store: Path, **kw) -> dict:
    from jobs.audit import audit_store

    return audit_store(str(store), quiet=True, now_ms=NOW, **kw)


def _timer(rep: dict, severity: str | None = None) -> list[dict]:
    return [f for f in rep["findings"] if f["kind"].startswith("timer") and severity in (None, f["severity"])]


def _kinds(rep: dict, severity: str) -> set[str]:
    return {f["kind"] for f in _timer(rep, severity)}


def _units(store: Path) -> list[dict]:
    return read_timerlog(resolve(str(store)), J.FILE_SIZE).units.to_pylist()


def _slot(store: Path, time_ms: int) -> tuple[int, int, int, int]:
    """(firstPos, lastPos, num, file offset) of the slot of ``time_ms``."""
    off = int(slot_index(time_ms, J.PRECISION)) * SLOT_SIZE
    with open(store / "timerwheel", "rb") as f:
        f.seek(off)
        _, first, last, num, _ = struct.unpack(">qqqii", f.read(SLOT_SIZE))
    return first, last, num, off


# ------------------------------------------------------------------------------------------------
# A: deletion markers


def test_a_slot_holding_a_deletion_marker_counts_it_minus_one_and_audits_clean(sample, tmp_path):
    store = J.copy_store(sample, tmp_path / "s")
    J.with_deletion_marker(store)
    marker = _units(store)[-1]
    assert marker["delete"] and marker["magic"] == 5
    first, last, num, _ = _slot(store, marker["slot_time_ms"])
    units = {u["pos"]: u for u in _units(store)}
    chain, at = [], last
    while at != -1:
        chain.append(units[at])
        at = units[at]["prev_pos"]
    assert last == marker["pos"] and num == len(chain) - 2  # doEnqueue :773-774: the marker counts -1
    rep = _audit(store)
    assert not _timer(rep, "error"), _timer(rep, "error")


def test_a_deleted_timer_and_its_marker_are_not_pending(sample, tmp_path):
    """A rolled pending timer deleted by a marker due when it is: the broker's dequeue of that slot drops it
    (:1618-1623) and puts nothing out for the marker, so neither outlives retention."""
    store = tmp_path / "s"
    J.copy_store(sample, store)
    J.with_deletion_marker(store, rolled=True)
    rep = _audit(store)
    [f] = [f for f in rep["findings"] if f["kind"] == "timer_outlives_retention"]
    assert f["extra"]["count"] == OUTLIVING_IN_SAMPLE - 1
    assert not _timer(rep, "error")


def test_a_marker_slot_whose_num_exceeds_its_units_is_still_an_error(sample, tmp_path):
    store = tmp_path / "s"
    J.copy_store(sample, store)
    J.with_deletion_marker(store)
    off = J.poke_slot(store, _units(store)[-1], num_delta=2)  # more than the slot's normal units
    rep = _audit(store)
    assert ("timerwheel_chain", "timerwheel", off) in {(f["kind"], f["file"], f["offset"]) for f in _timer(rep, "error")}


# ------------------------------------------------------------------------------------------------
# B: records put straight out


def test_b_a_record_due_before_the_next_units_write_time_was_put_straight_out_not_lost(sample, tmp_path):
    store = tmp_path / "s"
    J.copy_store(sample, store)
    J.with_direct_put(store)
    rep = _audit(store)
    assert "timer_record_lost" not in _kinds(rep, "error")
    [f] = [f for f in rep["findings"] if f["kind"] == "timer_record_put_directly"]
    assert f["severity"] == "info" and f["extra"] == {"count": 1, "unsettled": 0}


def test_b_a_record_due_after_the_next_units_write_time_without_a_unit_is_lost(sample, tmp_path):
    store = tmp_path / "s"
    J.copy_store(sample, store)
    phy = J.with_direct_put(store, due_past=False)
    rep = _audit(store)
    got = {(f["kind"], f["file"], f["offset"]) for f in _timer(rep, "error")}
    assert ("timer_record_lost", "commitlog/00000000000000000000", phy) in got


# ------------------------------------------------------------------------------------------------
# D1: timerlog files the broker's cleaner deleted


def _without_first_timerlog_file(sample: Path, store: Path) -> Path:
    """The timerlog's first file gone, as TimerMessageStore's cleaner (:486-488) deletes files from the front."""
    J.copy_store(sample, store)
    (store / "timerlog" / "00000000000000000000").unlink()
    return store


def test_d1_chains_into_a_deleted_timerlog_file_are_info_not_errors(sample, tmp_path):
    store = _without_first_timerlog_file(sample, tmp_path / "s")
    assert any(u["prev_pos"] != -1 and u["prev_pos"] < J.FILE_SIZE for u in _units(store))  # the case is there
    rep = _audit(store)
    assert not _timer(rep, "error"), _timer(rep, "error")
    [f] = [f for f in rep["findings"] if f["kind"] == "timerwheel_chain_truncated"]
    assert f["severity"] == "info" and f["extra"]["count"] > 0


def test_d1_a_prev_pointer_to_no_unit_inside_a_file_that_exists_is_still_an_error(sample, tmp_path):
    store = _without_first_timerlog_file(sample, tmp_path / "s")
    units = _units(store)
    k = next(i for i, u in enumerate(units) if u["prev_pos"] != -1 and u["file"].endswith("16384"))
    with open(store / units[k]["file"], "r+b") as f:  # prevPos into the middle of a unit of a kept file
        f.seek(units[k]["file_offset"] + 4)
        f.write(struct.pack(">q", J.FILE_SIZE + 5))
    rep = _audit(store)
    got = {(f["kind"], f["file"], f["offset"]) for f in _timer(rep, "error")}
    assert ("timerlog_bad_prev", units[k]["file"], units[k]["file_offset"]) in got
    assert "timerwheel_chain" in {k for k, _, _ in got}


def test_d1_delivered_units_pointing_at_expired_records_are_not_called_lost(sample, tmp_path):
    """A delivered unit keeps pointing at its record until the cleaner deletes its timerlog file; only
    pending units before the commitlog's start are lost (timer_unit_expired counts those)."""
    import storelib.checks.timers as timers
    from storelib.checks.segment import Capped
    from storelib.format.timerstore import read_timer_checkpoint

    root = resolve(str(sample / "store"))
    tl = read_timerlog(root, J.FILE_SIZE)
    cp = read_timer_checkpoint(root)
    slot = tl.units.column("slot_time_ms").to_numpy()
    py = tl.units.column("offset_py").to_numpy()
    delivered = int((slot < cp.last_read_time_ms).sum())
    assert 0 < delivered < len(slot)

    class Log:  # the commitlog starting past every unit's record
        log_min, segment_size = int(py.max()) + 1, 1 << 20

    from storelib.broker.settings.store import load_settings

    out = Capped()
    expired = timers._check_pending(root, Log, tl.units, cp, load_settings(None, "5", root=root), out, None)
    assert len(expired) == len(slot) - delivered
    [f] = [f for f in out.items if f.kind == "timer_unit_expired"]
    assert f.extra["count"] == len(slot) - delivered


# ------------------------------------------------------------------------------------------------
# D2: a wheel written every second, not at shutdown


def _newest_unit_with_a_prev(store: Path) -> dict:
    return next(u for u in reversed(_units(store)) if u["prev_pos"] != -1)


def test_d2_a_num_missing_the_last_enqueue_is_a_warning_naming_the_brokers_behaviour(sample, tmp_path):
    store = tmp_path / "s"
    J.copy_store(sample, store)
    off = J.poke_slot(store, _newest_unit_with_a_prev(store), num_delta=-1)
    rep = _audit(store)
    assert not _timer(rep, "error"), _timer(rep, "error")
    [f] = [f for f in rep["findings"] if f["kind"] == "timerwheel_num_stale"]
    assert (f["severity"], f["file"], f["offset"]) == ("warning", "timerwheel", off)
    assert "reviseSlot" in f["detail"]


def test_d2_a_num_above_the_chains_units_is_an_error(sample, tmp_path):
    store = tmp_path / "s"
    J.copy_store(sample, store)
    off = J.poke_slot(store, _newest_unit_with_a_prev(store), num_delta=1)
    rep = _audit(store)
    assert ("timerwheel_chain", "timerwheel", off) in {(f["kind"], f["file"], f["offset"]) for f in _timer(rep, "error")}


def test_d2_a_chain_that_misses_first_pos_is_an_error(sample, tmp_path):
    store = tmp_path / "s"
    J.copy_store(sample, store)
    u = _newest_unit_with_a_prev(store)
    first, last, num, off = _slot(store, u["slot_time_ms"])
    with open(store / "timerwheel", "r+b") as f:
        f.seek(off + 8)
        f.write(struct.pack(">q", last))  # firstPos = lastPos, though the chain goes on
    rep = _audit(store)
    assert ("timerwheel_chain", "timerwheel", off) in {(f["kind"], f["file"], f["offset"]) for f in _timer(rep, "error")}


# ------------------------------------------------------------------------------------------------
# every engine


def _scenarios(sample: Path, base: Path) -> dict[str, Path]:
    out = {}
    for name, make in {"marker": J.with_deletion_marker, "direct put": J.with_direct_put,
                       "lost record": lambda s: J.with_direct_put(s, due_past=False)}.items():
        out[name] = J.copy_store(sample, base / name.replace(" ", "_"))
        make(out[name])
    out["deleted timerlog file"] = _without_first_timerlog_file(sample, base / "deleted")
    out["stale num"] = J.copy_store(sample, base / "stale")
    J.poke_slot(out["stale num"], _newest_unit_with_a_prev(out["stale num"]), num_delta=-1)
    return out


def test_every_engine_reports_the_same_on_the_java_timer_stores(sample, tmp_path, spark):
    for name, store in _scenarios(sample, tmp_path).items():
        ref = _audit(store, cross="driver")
        kinds = {f["kind"] for f in _timer(ref)}
        assert kinds & {"timerwheel_num_stale", "timerwheel_chain_truncated", "timer_record_put_directly",
                        "timer_record_lost"} or name == "marker", name
        for kw in ({}, {"engine": "pool", "workers": 2}, {"engine": "spark", "spark": spark}):
            rep = _audit(store, **kw)
            assert rep["run"]["cross_check_mode"].startswith("partitioned"), (name, kw)
            assert (rep["findings"], rep["timer_store"]) == (ref["findings"], ref["timer_store"]), (name, kw)



def test_the_audit_never_counts_a_timer_without_uniq_key_as_recalled(sample, tmp_path):
    """DequeueGetService skips the delete check for a message without UNIQ_KEY (5.3.3 TimerMessageStore
    :1610-1619), so markers naming it REAL_TOPIC+"None" or +"null" leave it pending: the audit counts it
    among the timers outliving retention (it is rolled)."""
    store = J.copy_store(sample, tmp_path / "s")
    J.with_keyless_recall(store)
    [f] = [f for f in _audit(store)["findings"] if f["kind"] == "timer_outlives_retention"]
    assert f["extra"]["count"] == OUTLIVING_IN_SAMPLE + 1


def test_the_timers_listing_never_calls_a_timer_without_uniq_key_deleted(sample, tmp_path, capsys):
    """The same rule in ``rmqstore timers --state``: the keyless timer is pending, its markers are markers."""
    from jobs.cli import main

    store = J.copy_store(sample, tmp_path / "s")
    made = J.with_keyless_recall(store)
    capsys.readouterr()
    rows = {}
    for state in ("deleted", "delete_marker", "pending"):
        assert main(["timers", str(store), "--state", state, "--format", "jsonl"]) == 0
        rows[state] = {r["timer_phy_offset"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["deleted"] == {} and sorted(rows["delete_marker"]) == made["markers"]
    assert rows["pending"][made["keyless_py"]]["uniq_key"] is None
