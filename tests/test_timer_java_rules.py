"""The timer store's rebuild and recovery follow 5.3.3's TimerMessageStore line by line: recalls (delete
markers), where a restart resumes reading the timer topic, a missing timercheck, the precision and roll
window settings, the flush position of a full timerlog file. The oracle for the enqueue is a test-only
emulation of doEnqueue (tests/timer_java_oracle.py) that reproduces the real sample byte for byte."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.compute as pc
import pytest

from jobs.cli import main
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store, load_settings
from storelib.broker.timer.timermsg import store_timers
from storelib.fileio.bytesource import resolve
from storelib.format.record import Message
from storelib.format.timerstore import TIMER_TOPIC, read_timer_checkpoint, read_timerlog, read_wheel
from tests.conftest import SAMPLES, extract_sample
from tests.timer_java_oracle import java_enqueue, requests_of

CONF = SAMPLES / "rocketmq-5.3.3-timer-small.broker.conf"


@pytest.fixture(scope="module")
def timer_sample(tmp_path_factory) -> Path:
    return extract_sample("timer", tmp_path_factory.mktemp("timer")) / "store"


@pytest.fixture
def copy(timer_sample, tmp_path) -> Path:
    dest = tmp_path / "store"
    shutil.copytree(timer_sample, dest)
    return dest


def _store(root: Path) -> Store:
    return Store(resolve(str(root)), load_settings(str(CONF), "5", root=resolve(str(root))))


def _append(root: Path, msgs: list[Message], at_ms: int) -> None:
    from storelib.broker.writer.writer import StoreWriter

    with StoreWriter(str(root), _store(root).settings, clock=lambda: at_ms) as w:
        for m in msgs:
            w.append(m)


def _record_message(store: Store, phy: int) -> Message:
    rec = store.commitlog.record_at(phy).to_pylist()[0]
    return Message(topic=TIMER_TOPIC, queue_id=0, body=b"", born_timestamp=rec["store_timestamp"],
                   born_host="192.168.0.1:50000", properties=dict(rec["properties"]))


def _rebuild(src: Path, out: Path) -> Path:
    assert main(["rebuild", str(src), "--out", str(out), "--what", "timer", "--quiet"]) == 0
    return out


def _recalled(copy: Path) -> tuple[dict, int]:
    """The sample plus a recall (RecallMessageProcessor) of a pending, not rolled timer: (target row, its slot)."""
    from storelib.generator.timergen import recall_marker

    store = _store(copy)
    rows = store_timers(store).to_pylist()
    target = next(r for r in rows if r["state"] == "pending" and r["rolled"] is False)
    last = max(r["timer_store_timestamp"] for r in rows)
    _append(copy, [recall_marker(_record_message(store, target["timer_phy_offset"]), last + 1000, 1000)], last + 1000)
    return target, target["deliver_time_ms"]


# ------------------------------------------------------------------------------------------------
# A: recalls (TIMER_DEL_UNIQKEY)


def test_a_recalled_timer_is_deleted_and_its_marker_is_neither_pending_nor_delivered(copy, capsys):
    target, _ = _recalled(copy)
    rows = store_timers(_store(copy)).to_pylist()
    by_state = {}
    for r in rows:
        by_state.setdefault(r["state"], []).append(r)
    [deleted] = by_state["deleted"]
    [marker] = by_state["delete_marker"]
    assert deleted["timer_phy_offset"] == target["timer_phy_offset"]
    assert marker["delete_key"] == f"{target['real_topic']}+{target['uniq_key']}"
    assert marker["uniq_key"] == target["uniq_key"] and marker["deliver_time_ms"] == target["deliver_time_ms"]
    assert len(by_state["pending"]) == 181 and len(by_state["delivered"]) == 138
    capsys.readouterr()
    assert main(["timers", str(copy), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["pending"], doc["delivered"], doc["deleted"], doc["delete_markers"]) == (181, 138, 1, 1)


def test_a_marker_in_another_slot_deletes_nothing(copy):
    """The broker matches a marker against the messages read from the same slot only (:1592-1623)."""
    from storelib.generator.timergen import recall_marker

    store = _store(copy)
    rows = store_timers(store).to_pylist()
    target = next(r for r in rows if r["state"] == "pending" and r["rolled"] is False)
    m = recall_marker(_record_message(store, target["timer_phy_offset"]), 1795517102000, 1000)
    m.properties["TIMER_OUT_MS"] = str(target["deliver_time_ms"] + 5000)
    _append(copy, [m], 1795517102000)
    states = {r["timer_phy_offset"]: r["state"] for r in store_timers(_store(copy)).to_pylist()}
    assert states[target["timer_phy_offset"]] == "pending"


def test_timer_out_ms_is_floored_as_the_put_hook_floors_it_for_timers_and_recalls():
    """HookUtils.transformTimerMessage (5.3.3 :200-205): a due time on the precision goes one precision earlier,
    any other is floored; the generator's timers and recall markers take it from timermsg.timer_out_ms."""
    from storelib.broker.timer.timermsg import timer_out_ms
    from storelib.generator.timergen import deliver_ms, recall_marker

    assert [timer_out_ms(t, 1000) for t in (5000, 5001, 5999)] == [4000, 5000, 5000]
    assert timer_out_ms(5200, 200) == 5000 and timer_out_ms(5150, 200) == 5000
    assert deliver_ms(1_700_000_000_000, 5, 1000) == 1_700_000_004_000
    target = Message(topic=TIMER_TOPIC, queue_id=0, body=b"", properties={
        "REAL_TOPIC": "T", "UNIQ_KEY": "K", "TIMER_OUT_MS": "1700000004999"})
    assert recall_marker(target, 1_700_000_000_000, 1000).properties["TIMER_OUT_MS"] == "1700000004000"


def test_rebuild_enqueues_a_recall_with_magic_delete_and_takes_it_off_its_slots_num(copy, tmp_path):
    target, due = _recalled(copy)
    out = resolve(str(_rebuild(copy, tmp_path / "out")))
    log = read_timerlog(out, 8192)
    wheel, findings = read_wheel(out, log, 1000)
    units = log.units.to_pylist()
    marker = units[-1]
    assert marker["magic"] == 5 and marker["delete"] and marker["slot_time_ms"] == due
    slot = next(s for s in wheel.to_pylist() if s["time_ms"] == due)
    in_slot = [u for u in units if u["slot_time_ms"] == due]
    assert slot["num"] == len(in_slot) - 2 and slot["last_pos"] == marker["pos"]
    # the same bytes as 5.3.3's doEnqueue given the same inputs, in the same order
    timers = store_timers(_store(copy))
    enqueued = timers.filter(pc.is_in(timers.column("timer_phy_offset"), log.units.column("offset_py")))
    ju, js = java_enqueue(requests_of(enqueued), 8192)
    assert log.units.to_pylist() == ju.to_pylist()
    assert wheel.select(["index", "time_ms", "first_pos", "last_pos", "num", "magic"]).to_pylist() == js.to_pylist()


def _with_recalls(root: Path) -> tuple[BrokerSettings, Any]:
    """A generated 5.x store with 40 timers, 3 of them recalled (markers enqueued as the broker does):
    (its settings, add_timer_messages' result)."""
    from storelib.generator.timergen import add_timer_messages

    assert main(["gen", str(root), "--messages", "50", "--version", "5", "--segment-size", "1MB", "--seed", "5",
                 "--set", "mappedFileSizeTimerLog=4096"]) == 0
    settings = load_settings(None, "5", {"mappedFileSizeTimerLog": "4096"}, resolve(str(root)))
    start = 1_795_000_000_000
    return settings, add_timer_messages(str(root), settings, count=40, seed=7, start_ms=start,
                                        now_ms=start + 40 * 500 + 120_000, recalls=3)


def test_generated_recalls_are_written_as_the_broker_does(tmp_path):
    root = tmp_path / "store"
    settings, res = _with_recalls(root)
    timers = store_timers(Store(resolve(str(root)), settings))
    states = timers.column("state").to_pylist()
    assert states.count("deleted") == 3 and states.count("delete_marker") == 3
    assert res.pending == states.count("pending")
    deleted = timers.filter(pc.equal(timers.column("state"), "deleted"))
    assert not any(deleted.column("delivered_records").to_pylist())
    log = read_timerlog(resolve(str(root)), 4096)
    wheel, findings = read_wheel(resolve(str(root)), log, 1000)
    assert not findings and log.units.num_rows == 43
    assert sum(log.units.column("delete").to_pylist()) == 3
    assert sum(wheel.column("num").to_pylist()) == 40 - 3


def test_the_timer_audit_and_the_timer_listing_delete_the_same_recalled_timers(tmp_path):
    """One recall rule (timermsg.Recalls) for both readers: the timerlog units the audit counts as never
    delivering (the markers and the units they delete, checks.timers) point at exactly the records the
    listing calls delete_marker or deleted (timer_messages)."""
    from storelib.checks.timers import _deleted_units, _deliver_times

    root = tmp_path / "store"
    settings, _ = _with_recalls(root)
    loc = resolve(str(root))
    timers = store_timers(Store(loc, settings))
    gone = {phy for phy, state in zip(timers.column("timer_phy_offset").to_pylist(), timers.column("state").to_pylist())
            if state in ("deleted", "delete_marker")}
    units = read_timerlog(loc, 4096).units
    log = SimpleNamespace(segment_size=settings.mapped_file_size_commit_log)
    due = _deliver_times(loc, log, units, units.column("slot_time_ms").to_numpy(), 0)  # every rolled one's too
    dead = _deleted_units(loc, log, units, due, 1000)
    assert len(gone) == 6 and set(units.column("offset_py").to_numpy()[dead].tolist()) == gone


# ------------------------------------------------------------------------------------------------
# C: where the broker resumes reading the timer topic after a rebuild


def _install_rebuilt(store: Path, out: Path) -> None:
    """The rebuilt timer files in place of the store's own (what an operator does with --out)."""
    shutil.rmtree(store / "timerlog")
    shutil.copytree(out / "timerlog", store / "timerlog")
    shutil.copyfile(out / "timerwheel", store / "timerwheel")
    shutil.copyfile(out / "config" / "timercheck", store / "config" / "timercheck")


def _restart_queue_offset(store: Path, capsys) -> int:
    capsys.readouterr()
    assert main(["recover", str(store), "--json"]) in (0, 1)
    return json.loads(capsys.readouterr().out)["timer_store"]["queue_offset"]


def test_after_a_rebuild_the_broker_reads_no_timer_record_again(copy, tmp_path, capsys):
    """TimerMessageStore.recover resumes at the last unit's record + 1: a log of pending timers only made
    it re-read (and re-deliver) the sample's delivered records 318 and 319."""
    out = _rebuild(copy, tmp_path / "out")
    _install_rebuilt(copy, out)
    assert _restart_queue_offset(copy, capsys) == 320
    cp = read_timer_checkpoint(resolve(str(copy)))
    assert (cp.last_timer_queue_offset, cp.master_timer_queue_offset) == (320, 320)


def test_a_record_the_timer_store_had_not_read_is_enqueued_once(copy, tmp_path, capsys):
    ts = 1795517101500
    _append(copy, [Message(topic=TIMER_TOPIC, queue_id=0, body=b"x" * 40, born_timestamp=ts - 5, properties={
        "UNIQ_KEY": "C0A8000110925F3759DF7E40FEEDF00D", "TIMER_DELAY_SEC": "3600", "WAIT": "true",
        "TIMER_OUT_MS": str((ts + 3_600_000) // 1000 * 1000), "REAL_TOPIC": "CouponExpiry", "REAL_QID": "1"})], ts)
    assert read_timer_checkpoint(resolve(str(copy))).last_timer_queue_offset == 320  # not read yet
    out = _rebuild(copy, tmp_path / "out")
    new = store_timers(_store(copy)).filter(pc.equal(pc.field("timer_queue_offset"), 320))
    units = read_timerlog(resolve(str(out)), 8192).units
    assert units.filter(pc.equal(units.column("offset_py"), new.column("timer_phy_offset")[0])).num_rows == 1
    _install_rebuilt(copy, out)
    assert _restart_queue_offset(copy, capsys) == 321  # not read (and enqueued) a second time


def test_a_rebuild_without_timercheck_says_everything_was_read(copy, tmp_path):
    (copy / "config" / "timercheck").unlink()
    out = resolve(str(_rebuild(copy, tmp_path / "out")))
    cp = read_timer_checkpoint(out)
    timers = store_timers(_store(copy))
    pending = timers.filter(pc.equal(timers.column("state"), "pending"))
    units = read_timerlog(out, 8192).units
    first_due = min(u["slot_time_ms"] for u in units.to_pylist()
                    if u["offset_py"] in set(pending.column("timer_phy_offset").to_pylist()))
    assert (cp.last_timer_queue_offset, cp.master_timer_queue_offset) == (320, 320)
    assert cp.last_read_time_ms == first_due  # delivered units lie before it: not fired again


# ------------------------------------------------------------------------------------------------
# E: a missing timercheck


def test_without_timercheck_the_broker_re_reads_the_whole_timer_queue_from_zeros(copy, capsys):
    import time

    (copy / "config" / "timercheck").unlink()
    before = int(time.time() * 1000)
    capsys.readouterr()
    assert main(["recover", str(copy), "--json"]) in (0, 1)
    ts = json.loads(capsys.readouterr().out)["timer_store"]
    after = int(time.time() * 1000)
    assert ts is not None and [f["kind"] for f in ts["findings"]] == ["timercheck_missing"]
    assert (ts["begin_offset"], ts["process_offset"], ts["delete_files"]) == (0, 16696, [])
    assert ts["queue_offset"] == 0  # min(320, masterTimerQueueOffset 0), the timer queue's min offset
    week_back = 7 * 86_400_000 - 60_000
    assert before // 1000 * 1000 - week_back <= ts["read_time_ms"] <= after // 1000 * 1000 - week_back


# ------------------------------------------------------------------------------------------------
# F: timerPrecisionMs as MessageStoreConfig.setTimerPrecisionMs leaves it


@pytest.mark.parametrize("configured, used", [("2000", 1000), ("300", 200), ("50", 100), ("999", 500),
                                              ("500", 500), ("100", 100), ("1000", 1000)])
def test_timer_precision_is_snapped_down_to_100_200_500_or_1000(configured, used, tmp_path):
    from storelib.broker.settings.brokerconf import BrokerSettings
    from storelib.format.timerstore import precision_of

    s = BrokerSettings.from_properties({"timerPrecisionMs": configured}, "5")
    assert s.timer_precision_ms == used and precision_of(s) == used
    conf = tmp_path / "broker.conf"
    conf.write_text(f"timerPrecisionMs={configured}\n")
    assert load_settings(str(conf), "5").timer_precision_ms == used


def test_a_timer_precision_beyond_a_java_int_is_a_clear_error(tmp_path):
    from storelib.errors import StoreError

    conf = tmp_path / "broker.conf"
    conf.write_text("timerPrecisionMs=3000000000\n")
    with pytest.raises(StoreError, match="broker.conf"):
        load_settings(str(conf), "5")


# ------------------------------------------------------------------------------------------------
# G: the roll window


@pytest.mark.parametrize("configured", [None, 0, 1, -5, 2, 100, 101, 172_800, 604_740, 604_741, 10**7])
def test_the_roll_window_setting_is_taken_as_the_broker_takes_it(configured):
    from storelib.broker.timer.timerrebuild import roll_window_slots
    from tests.timer_java_oracle import java_roll_window

    assert roll_window_slots(configured) == java_roll_window(172_800 if configured is None else configured)


@pytest.mark.parametrize("window_slots, precision", [(101, 1000), (100, 1000), (7, 200), (172_800, 1000)])
def test_a_rolled_timer_parks_where_do_enqueue_parks_it(window_slots, precision):
    import pyarrow as pa

    from storelib.broker.timer.timerrebuild import enqueue_units

    write = 1_795_517_090_000
    w = window_slots * precision
    delays = [w, w + w // 3 - precision, w + w // 3 + precision, w + 33_200, 2 * w, w - precision]
    rows = pa.Table.from_pylist([
        {"timer_queue_offset": i, "timer_store_timestamp": write + 1, "deliver_time_ms": write + d,
         "timer_phy_offset": 1000 * i, "timer_size": 300, "real_topic": "T", "delete_key": None}
        for i, d in enumerate(delays)])
    units, slots = enqueue_units(rows, 8192, precision, window_slots)
    ju, js = java_enqueue(requests_of(rows, precision), 8192, precision, window_slots)
    assert units.to_pylist() == ju.to_pylist() and slots.to_pylist() == js.to_pylist()


# ------------------------------------------------------------------------------------------------
# H: the flush position of a full timerlog file


@pytest.mark.parametrize("n, flushed", [(157, 8164), (158, 8192 + 52), (1, 52), (314, 8192 + 8164)])
def test_the_rebuilt_flush_position_is_the_last_units_end(n, flushed):
    import pyarrow as pa

    from storelib.broker.timer.timerrebuild import enqueue_units, rebuilt_checkpoint
    from storelib.format.timerstore import TimerCheckpoint

    write = 1_795_517_090_000
    rows = pa.Table.from_pylist([
        {"timer_queue_offset": i, "timer_store_timestamp": write, "deliver_time_ms": write + 60_000,
         "timer_phy_offset": 1000 * i, "timer_size": 300, "real_topic": "T", "delete_key": None} for i in range(n)])
    units, _ = enqueue_units(rows, 8192)
    cp = rebuilt_checkpoint(TimerCheckpoint(write, 0, n, n, 0, 0, 0), units, 8192)
    assert cp.last_timer_log_flush_pos == flushed


def test_timers_command_lists_recalled_timers_and_their_markers_by_state(tmp_path, capsys):
    root = tmp_path / "store"
    _with_recalls(root)
    capsys.readouterr()
    conf = ["--broker-version", "5", "--set", "mappedFileSizeTimerLog=4096"]
    rows = {}
    for state in ("deleted", "delete_marker", "pending"):
        assert main(["timers", str(root), *conf, "--state", state, "--format", "jsonl"]) == 0
        rows[state] = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(rows["deleted"]) == 3 and {r["state"] for r in rows["deleted"]} == {"deleted"}
    assert len(rows["delete_marker"]) == 3 and {r["state"] for r in rows["delete_marker"]} == {"delete_marker"}
    assert not {r["uniq_key"] for r in rows["deleted"]} & {r["uniq_key"] for r in rows["pending"]}
