"""``audit --since``: the state holds the partitioned checks' carry (per queue group, index file and the
timer store), not records, and a run after the store grew reads only what is new and schedules only the
partitions with something new, with exactly the report of a full audit; whatever the carry cannot settle
(a changed unit, entry or segment, expired segments, damage) is audited in full."""

from __future__ import annotations

import json
import os
from pathlib import Path

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.writer.writer import StoreWriter
from storelib.format.record import Message

from .test_audit import BASE_TS, _comparable, flip, records, run, seg_file, store_fixtures

base_store, store = store_fixtures("auditinc")
NOW = 1_800_000_000_000


def _settings(root: Path) -> BrokerSettings:
    from storelib.broker.settings.store import load_settings

    return load_settings(str(root / "broker.conf"), None, None, None)


def _grow(root: Path, n: int, *, dispatch: bool = True, start: int = 0,
          topics: tuple[str, ...] = ("OrderEvents", "PaymentNotify")) -> None:
    """``n`` more messages written the broker's way (consume queues and index dispatched, or not yet)."""
    w = StoreWriter(str(root), _settings(root))
    try:
        for i in range(start, start + n):
            w.append(Message(topic=topics[i % len(topics)], body=b"grown %d" % i, queue_id=i % 2,
                             born_timestamp=BASE_TS + 10**6 + i, store_timestamp=BASE_TS + 10**6 + i,
                             born_host="10.0.0.7:52011", store_host="10.0.0.1:10911",
                             properties={"KEYS": f"grown-{i}", "UNIQ_KEY": f"{i:032X}", "TAGS": "g"}))
    finally:
        w.close(dispatch=dispatch)


def full_mode(rep: dict) -> bool:
    m = rep["run"]["cross_check_mode"]
    return m.startswith("partitioned: ") and "incremental" not in m


def incremental(rep: dict) -> bool:
    return "incremental: " in rep["run"]["cross_check_mode"]


def _same_as_full(root: Path, state: Path) -> dict:
    inc = run(root, since=str(state), now_ms=NOW)
    full = run(root, now_ms=NOW)
    for f in inc["findings"]:
        f["extra"].pop("carried_forward", None)
    assert _comparable(inc) == _comparable(full)
    return inc


def test_state_holds_no_records_and_an_unchanged_store_is_not_read_again(store, tmp_path):
    state = tmp_path / "audit.state"
    first = run(store, since=str(state), now_ms=NOW)
    assert full_mode(first)
    assert not (tmp_path / "audit.state.d").exists()
    doc = json.loads(state.read_text())
    assert doc["schema"] == "rmqstore.audit-state/3" and doc["carry"]["kind"] == "partitioned/1"
    assert os.path.getsize(state) < 64 * 1024  # segments, queues and index files, not 420 records' tables
    again = _same_as_full(store, state)
    assert again["run"]["segments_audited"] == 0 and incremental(again)
    # nothing new: no queue group, no index file checked again
    assert "incremental: 0 queue group(s) and 0 index file(s) checked" in again["run"]["cross_check_mode"]


def test_growth_written_the_brokers_way_is_audited_alone_with_the_full_report(store, tmp_path):
    state = tmp_path / "audit.state"
    run(store, since=str(state), now_ms=NOW)
    _grow(store, 40)
    inc = _same_as_full(store, state)
    assert incremental(inc)
    assert inc["run"]["segments_audited"] <= 2 and inc["summary"]["records"] == 460
    _grow(store, 300, start=40)  # across a segment end
    inc = _same_as_full(store, state)
    assert incremental(inc) and inc["summary"]["records"] == 760


def test_messages_dispatched_after_the_state_are_checked_against_their_new_units(store, tmp_path):
    state = tmp_path / "audit.state"
    run(store, since=str(state), now_ms=NOW)
    _grow(store, 30, dispatch=False)  # in the commitlog, not in the consume queues or the index yet
    lagging = _same_as_full(store, state)
    kinds = {f["kind"] for f in lagging["findings"]}
    assert {"queue_behind_commitlog", "index_behind_commitlog"} <= kinds
    assert incremental(lagging)
    StoreWriter(str(store), _settings(store)).close()  # the broker dispatches them on its next start
    caught_up = _same_as_full(store, state)
    assert incremental(caught_up)
    assert not {"queue_behind_commitlog", "index_behind_commitlog"} & {f["kind"] for f in caught_up["findings"]}


def test_gaps_and_carried_findings_stay_in_the_report(store, tmp_path):
    state = tmp_path / "audit.state"
    rec = records(store)[17]
    path, name, off = seg_file(store, rec["phy_offset"])
    flip(path, off + 88 + 5)  # a body CRC error: the stream settles the store all the same
    first = run(store, since=str(state), now_ms=NOW)
    assert full_mode(first)
    _grow(store, 10)
    inc = _same_as_full(store, state)
    assert incremental(inc)
    assert any(f["kind"] == "body_crc_mismatch" for f in inc["findings"])


def test_a_changed_unit_or_entry_checked_before_is_caught_by_a_full_audit(store, tmp_path):
    state = tmp_path / "audit.state"
    run(store, since=str(state), now_ms=NOW)
    cq = sorted((store / "consumequeue" / "OrderEvents" / "0").iterdir())[0]
    flip(cq, 20 * 3 + 7)  # a unit the first run compared with its record
    _grow(store, 5)
    inc = _same_as_full(store, state)
    assert full_mode(inc) and "(1 by the whole view's checks)" in inc["run"]["cross_check_mode"]
    assert any(f["kind"].startswith("cq_entry") for f in inc["findings"])


def test_a_changed_index_entry_is_caught_by_a_full_audit(store, tmp_path):
    state = tmp_path / "audit.state"
    run(store, since=str(state), now_ms=NOW)
    flip(sorted((store / "index").iterdir())[0], 40 + 64 * 4 + 20 * 2 + 3, 0x10)
    inc = _same_as_full(store, state)
    assert inc["run"]["segments_audited"] == len(inc["segments"])
    assert any(f["kind"] == "index_entry_wrong_hash" for f in inc["findings"])


def test_expired_segments_mean_a_full_audit(store, tmp_path):
    state = tmp_path / "audit.state"
    run(store, since=str(state), now_ms=NOW)
    sorted((store / "commitlog").iterdir())[0].unlink()  # the broker's cleaner took the oldest segment
    inc = _same_as_full(store, state)
    assert inc["run"]["segments_audited"] == len([s for s in inc["segments"] if s["end_kind"] != "missing"])


def test_an_older_state_layout_is_replaced_by_a_full_audit(store, tmp_path):
    state = tmp_path / "audit.state"
    state.write_text(json.dumps({"schema": "rmqstore.audit-state/1", "segments": {}}))
    (tmp_path / "audit.state.d").mkdir()
    (tmp_path / "audit.state.d" / "x.arrow").write_bytes(b"old tables")
    first = run(store, since=str(state), now_ms=NOW)
    assert first["run"]["segments_audited"] == len(first["segments"])
    assert json.loads(state.read_text())["schema"] == "rmqstore.audit-state/3"
    assert not (tmp_path / "audit.state.d").exists()


def _index_pair(tmp_path: Path, store: Path, n0: int):
    """The same index file after the first ``n0`` records' keys and after all of them (the broker's last
    file as an earlier audit saw it, and as it is now)."""
    from storelib.broker.index.indexbuild import build_index_files, index_key_rows
    from storelib.format.indexfile import IndexFile, IndexGeometry
    from storelib.scan.commitlog import CommitLog

    from .test_audit import SEG

    table = CommitLog(str(store / "commitlog"), SEG).read_table()
    g = IndexGeometry(64, 5000)
    paths = []
    for k, name in ((n0, "before"), (table.num_rows, "after")):
        (im,) = build_index_files(index_key_rows(table.slice(0, k)), geometry=g)
        im.write(tmp_path / name)
        paths.append(tmp_path / name)
    return [IndexFile.open(str(p), g) for p in paths], g


def test_a_grown_index_file_is_checked_on_its_new_entries_and_slots(store, tmp_path):
    from storelib.checks.indexgrowth import grown_file_clean, slots_crc

    (before, after), g = _index_pair(tmp_path, store, 250)
    n0 = len(before.entries_array())
    assert 0 < n0 < len(after.entries_array())
    assert not after.validate()
    crc = grown_file_clean(after, n0, slots_crc(before.slots()), before.header.hash_slot_count)
    assert crc == slots_crc(after.slots())
    assert grown_file_clean(after, n0, slots_crc(before.slots()) ^ 1, before.header.hash_slot_count) is None
    assert grown_file_clean(after, n0, slots_crc(before.slots()), before.header.hash_slot_count + 1) is None
    before.close()
    after.close()


def test_damage_in_a_grown_index_file_sends_it_to_the_whole_check(store, tmp_path):
    from storelib.checks.indexgrowth import grown_file_clean, slots_crc
    from storelib.format.indexfile import IndexFile

    (before, after), g = _index_pair(tmp_path, store, 250)
    n0, crc0, d0 = len(before.entries_array()), slots_crc(before.slots()), before.header.hash_slot_count
    m = len(after.entries_array())
    before.close()
    after.close()
    for pos, mask in ((g.entry_pos(m - 3) + 19, 0x01),  # a new entry's prevIndex
                      (g.entry_pos(n0 + 2) + 3, 0x02),  # a new entry's keyHash
                      (g.slot_pos(7) + 3, 0x01),  # a slot
                      (g.entry_pos(m + 1) + 5, 0x01)):  # data past indexCount
        p = tmp_path / "after"
        data = bytearray(p.read_bytes())
        data[pos] ^= mask
        (tmp_path / "damaged").write_bytes(bytes(data))
        f = IndexFile.open(str(tmp_path / "damaged"), g)
        assert f.validate(), pos  # the whole check finds it...
        assert grown_file_clean(f, n0, crc0, d0) is None, pos  # ...and so the grown check hands it over
        f.close()


def test_an_incremental_run_validates_no_index_file_again_when_nothing_went_wrong(store, tmp_path, monkeypatch):
    from storelib.format.indexfile import IndexFile

    state = tmp_path / "audit.state"
    run(store, since=str(state), now_ms=NOW)
    _grow(store, 25)
    calls = []
    real = IndexFile.validate
    monkeypatch.setattr(IndexFile, "validate", lambda self, **kw: calls.append(self.path) or real(self, **kw))
    inc = run(store, since=str(state), now_ms=NOW)
    assert incremental(inc) and calls == []
    monkeypatch.undo()
    _same_as_full(store, state)


def test_a_timer_store_is_carried_with_its_timer_records(tmp_path):
    import tarfile

    from jobs.audit import audit_store

    from .conftest import SAMPLES

    with tarfile.open(SAMPLES / "rocketmq-5.3.3-timer-small.tar.gz") as tf:
        tf.extractall(tmp_path, filter="data")
    root = next(p.parent for p in tmp_path.rglob("commitlog"))
    conf = str(SAMPLES / "rocketmq-5.3.3-timer-small.broker.conf")
    state = tmp_path / "audit.state"
    first = audit_store(str(root), broker_conf=conf, quiet=True, now_ms=NOW, since=str(state))
    assert json.loads(state.read_text())["carry"]["timers"]["records"]
    again = audit_store(str(root), broker_conf=conf, quiet=True, now_ms=NOW, since=str(state))
    assert incremental(again) and again["run"]["segments_audited"] == 0
    for f in again["findings"]:
        f["extra"].pop("carried_forward", None)
    assert _comparable(again) == _comparable(first) and again["timer_store"]["timerlog_units"] > 0


def test_a_run_from_the_state_checks_only_the_partitions_with_something_new(store, tmp_path, monkeypatch):
    """Four queues in four groups, task tables in files: after messages for one queue only, one queue
    group and the growing index file are checked again; the rest is the carry's, and the report a full
    audit's."""
    import jobs.engines.audit_tasks as audit_tasks

    monkeypatch.setattr(audit_tasks, "IN_MEMORY_TABLES", 0)
    monkeypatch.setattr(audit_tasks, "cross_groups", lambda eng, tasks, in_memory: 8)
    state = tmp_path / "audit.state"
    first = run(store, since=str(state), now_ms=NOW)
    assert first["run"]["cross_check_mode"].startswith("partitioned: 4 queue group(s)")
    w = StoreWriter(str(store), _settings(store))
    try:
        for i in range(20):
            w.append(Message(topic="PaymentNotify", body=b"one queue %d" % i, queue_id=1,
                             born_timestamp=BASE_TS + 10**6 + i, store_timestamp=BASE_TS + 10**6 + i,
                             born_host="10.0.0.7:52011", store_host="10.0.0.1:10911",
                             properties={"KEYS": f"pay-{i}", "UNIQ_KEY": f"{i:032X}"}))
    finally:
        w.close(dispatch=True)
    inc = _same_as_full(store, state)
    assert "incremental: 1 queue group(s) and 1 index file(s) checked" in inc["run"]["cross_check_mode"]
    assert inc["summary"]["records"] == 440


def test_the_lagging_records_kept_are_bounded_for_the_store_not_per_group(store, tmp_path, monkeypatch):
    """Each queue group keeps at most LAG_KEEP lagging records, and so does the whole state: past that the
    state keeps no carry and the next run audits in full (with the full report)."""
    import jobs.engines.audit_tasks as audit_tasks
    import storelib.checks.queuestream as queuestream

    monkeypatch.setattr(audit_tasks, "IN_MEMORY_TABLES", 0)
    monkeypatch.setattr(audit_tasks, "cross_groups", lambda eng, tasks, in_memory: 8)
    monkeypatch.setattr(queuestream, "LAG_KEEP", 20)  # each of the two lagging queues' groups keeps 15
    _grow(store, 30, dispatch=False)
    state = tmp_path / "audit.state"
    first = run(store, since=str(state), now_ms=NOW)
    assert {"queue_behind_commitlog"} <= {f["kind"] for f in first["findings"]}
    assert json.loads(state.read_text())["carry"] is None
    monkeypatch.setattr(queuestream, "LAG_KEEP", 40)
    run(store, since=str(state), now_ms=NOW)
    assert json.loads(state.read_text())["carry"] is not None
    again = _same_as_full(store, state)
    assert incremental(again)


def test_lagging_records_of_the_state_that_the_cleaner_took_are_dropped_and_the_run_goes_on(base_store, tmp_path):
    """A state taken while the reput lagged carries records without units. The broker dispatches them later
    and its cleaner deletes their segment: a full audit sees neither them nor anything but expired units
    for them, and the incremental run now says the same and goes on from the state (it audited in full
    before: "records ... the cleaner deleted cannot be told from the carry"). Written by the broker's write
    path alone, so every store time is the writer's clock and the report's traffic buckets keep nesting."""
    import shutil

    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(base_store / "broker.conf", store / "broker.conf")
    state = tmp_path / "audit.state"
    _grow(store, 300)
    run(store, since=str(state), now_ms=NOW)
    _grow(store, 40, dispatch=False, start=300)  # in the commitlog, not in the consume queues or the index yet
    lagging = run(store, since=str(state), now_ms=NOW)
    assert incremental(lagging) and "queue_behind_commitlog" in {f["kind"] for f in lagging["findings"]}
    last_lagging = max(int(p.name) for p in (store / "commitlog").iterdir())  # the newest segment then
    _grow(store, 900, start=340)  # the reput catches up, and the log rolls on past that segment
    for p in sorted((store / "commitlog").iterdir()):
        if int(p.name) <= last_lagging:
            p.unlink()  # the broker's cleaner: the oldest segments, the lagging records' one included
    assert min(int(p.name) for p in (store / "commitlog").iterdir()) > last_lagging
    inc = run(store, since=str(state), now_ms=NOW)
    full = run(store, now_ms=NOW)
    assert incremental(inc), inc["run"]["cross_check_mode"]
    for f in inc["findings"]:
        f["extra"].pop("carried_forward", None)
    # what a full audit reports (the charts of a run after the cleaner are documented as approximate)
    for part in ("findings", "queues", "consumers", "summary", "index", "checkpoint"):
        assert inc[part] == full[part], part


def test_a_new_topics_records_without_a_consume_queue_yet_are_carried_and_settled_when_the_broker_writes_it(
        base_store, tmp_path):
    """A state taken while a new topic's first records had no consume queue yet (the reput behind them)
    carries them as lagging records: once the broker has written the queue, the next run checks them
    against its units and goes on from the state; after the cleaner deleted their segment too, it drops
    them (it audited in full before: "records ... the cleaner deleted cannot be told from the carry", or
    "holds units no record accounts for"). Both runs report what a full audit reports."""
    import shutil

    fresh = ("OrderEvents", "PaymentNotify", "BrandNewTopic")
    for clean in (False, True):
        store = tmp_path / f"store{int(clean)}"
        store.mkdir()
        shutil.copy(base_store / "broker.conf", store / "broker.conf")
        state = tmp_path / f"audit{int(clean)}.state"
        _grow(store, 300)
        run(store, since=str(state), now_ms=NOW)
        _grow(store, 42, dispatch=False, start=300, topics=fresh)  # BrandNewTopic: no consume queue yet
        assert not (store / "consumequeue" / "BrandNewTopic").exists()
        lagging = run(store, since=str(state), now_ms=NOW)
        assert incremental(lagging)
        assert "consumequeue/BrandNewTopic/0" in {f["file"] for f in lagging["findings"]
                                                  if f["kind"] == "queue_behind_commitlog"}
        last_lagging = max(int(p.name) for p in (store / "commitlog").iterdir())
        _grow(store, 900 if clean else 30, start=342, topics=fresh)  # the reput writes its queues
        assert (store / "consumequeue" / "BrandNewTopic" / "0").exists()
        if clean:
            for p in sorted((store / "commitlog").iterdir()):
                if int(p.name) <= last_lagging:
                    p.unlink()  # the broker's cleaner: the new topic's first records' segment included
        inc = run(store, since=str(state), now_ms=NOW)
        full = run(store, now_ms=NOW)
        assert incremental(inc), (clean, inc["run"]["cross_check_mode"])
        for f in inc["findings"]:
            f["extra"].pop("carried_forward", None)
        for part in ("findings", "queues", "consumers", "summary", "index", "checkpoint"):
            assert inc[part] == full[part], (clean, part)
