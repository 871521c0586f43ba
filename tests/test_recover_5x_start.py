"""rmqstore recover --plan on 5.3.3 default (non-DLedger) stores: recheckReputOffsetFromCq (where the reput starts,
what it re-dispatches or what nothing dispatches), the checkpoint's confirmPhyOffset when the recovery window holds
no valid record, and batchconsumequeue/ (loaded, recovered and truncated by the broker, not written by us)."""

from __future__ import annotations

import json
import shutil

import numpy as np

from jobs.audit import audit_store
from storelib.broker.dispatch.dispatch import dispatch_store
from storelib.broker.settings.brokerconf import load_broker_conf
from storelib.broker.settings.store import Store
from storelib.broker.settings.storeinfo import collect
from storelib.broker.startup import recoveryplan as recover_plan
from storelib.broker.startup.startup import simulate
from storelib.format.checkpoint import Checkpoint, write_checkpoint
from tests.rebuild_storegen import CraftedStore, msg

S = 8192
CONF = {"mappedFileSizeCommitLog": S, "mappedFileSizeConsumeQueue": 20 * 40, "maxHashSlotNum": 16,
        "maxIndexNum": 64}


def _crafted(segments: int) -> CraftedStore:
    cs = CraftedStore(S)
    i = 0
    while cs.seg_index < segments:
        cs.append(msg("T", i % 2, body=bytes([65 + i % 26]) * (300 + i % 5), keys=f"k{i}", uniq=f"U{i:06d}"))
        i += 1
    return cs


def _store(tmp_path, cs: CraftedStore, *, name="s", conf=None, dispatch_to=None, dispatch=True, abort=False,
           cp: Checkpoint | None = None) -> Store:
    root = tmp_path / name
    cs.write(root)
    p = tmp_path / f"{name}.conf"
    p.write_text("".join(f"{k}={v}\n" for k, v in {**CONF, **(conf or {})}.items()))
    settings = load_broker_conf(str(p), "5")
    if dispatch:
        dispatch_store(str(root), settings, to_offset=dispatch_to)
    last = cs.placed[-1].msg.store_timestamp
    write_checkpoint(str(root), cp or Checkpoint(last, last, 0, 0, 123))
    (root / "lock").write_bytes(b"lock")
    if abort:
        (root / "abort").write_bytes(b"")
    return Store(str(root), settings)


def _plan(store: Store) -> dict:
    return recover_plan.plan_document(simulate(store, "5"), lost=False)


def _kinds(plan: dict) -> dict[str, dict]:
    return {f["kind"]: f for f in plan["findings"]}


def _abnormal_from_segment_2_with_its_first_record_corrupt(tmp_path, name: str, conf=None):
    """4 segments, no consume queue, an abnormal exit whose checkpoint points at segment 2, whose first record
    fails its CRC: the recovery window holds no valid record and processOffset is segment 2's base."""
    cs = _crafted(4)
    first2 = next(p for p in cs.placed if p.segment == 2)
    cs.corrupt(first2.phy, cs.body_pos(first2))
    ts2 = first2.msg.store_timestamp
    store = _store(tmp_path, cs, name=name, conf=conf, dispatch=False, abort=True,
                   cp=Checkpoint(ts2 + 3000, ts2 + 3000, 0, 0, 777))
    return cs, store


def test_5x_recheck_reput_offset_from_cq_redispatches_from_the_queues_end(tmp_path):
    cs, store = _abnormal_from_segment_2_with_its_first_record_corrupt(tmp_path, "on",
                                                                       {"recheckReputOffsetFromCq": "true"})
    assert store.settings.recheck_reput_offset_from_cq is True
    plan = _plan(store)
    assert plan["commitlog"]["start_base"] == 2 * S and plan["commitlog"]["process_offset"] == 2 * S
    before = [p for p in cs.placed if p.phy < 2 * S]
    # no queue: doRecheckReputOffsetFromCq starts the reput at the commitlog's min offset (0), up to processOffset
    assert plan["dispatch"]["recovery_records"] == 0
    assert plan["dispatch"]["reput"]["from"] == 0 and plan["dispatch"]["reput"]["to"] == 2 * S
    assert plan["dispatch"]["reput_records"] == len(before)
    final = {q["queue_id"]: q["final_max_offset"] for q in plan["consume_queues"]["queues"]}
    assert final == {q: sum(1 for p in before if p.msg.queue_id == q) for q in (0, 1)}
    f = _kinds(plan)["reput_rechecked_from_cq"]
    assert f["extra"] == {"reput_from": 0, "process_offset": 2 * S}
    assert "records_never_dispatched" not in _kinds(plan)


def test_5x_default_reput_starts_at_the_log_end_and_says_what_nothing_dispatches(tmp_path):
    cs, store = _abnormal_from_segment_2_with_its_first_record_corrupt(tmp_path, "off")
    plan = _plan(store)
    assert plan["dispatch"]["reput"]["from"] == 2 * S and plan["dispatch"]["reput_records"] == 0
    assert plan["consume_queues"]["queues"] == []
    f = _kinds(plan)["records_never_dispatched"]
    last_before = max(p.phy + p.size for p in cs.placed if p.phy < 2 * S)
    assert f["extra"]["from"] == 0 and f["extra"]["to"] == 2 * S
    assert (f["file"], f["offset"]) == (f"commitlog/{0:020d}", 0)
    assert f["extra"]["bytes"] == sum(p.size for p in cs.placed if p.phy < 2 * S) and last_before <= 2 * S
    assert "reput_rechecked_from_cq" not in _kinds(plan)


def test_5x_recheck_dispatches_the_record_normal_recovery_skips_at_the_queues_max(tmp_path):
    # the queues end just before the last record: 5.x normal recovery dispatches only PHYSICALOFFSET > that
    # offset, so the last record is skipped; the rechecked reput starts there and dispatches it
    cs = _crafted(2)
    last = cs.append(msg("T", 1, body=b"Z" * 300, keys="kz", uniq="UZ"))
    assert last.phy % S > 0  # not after a file's blank: the queues end where it starts
    off = _plan(_store(tmp_path, cs, name="off", dispatch_to=last.phy))
    on = _plan(_store(tmp_path, cs, name="on", dispatch_to=last.phy, conf={"recheckReputOffsetFromCq": "true"}))
    for plan in (off, on):
        assert plan["commitlog"]["process_offset"] == last.phy + last.size
        assert plan["dispatch"]["recovery_records"] == 0
    assert off["dispatch"]["reput"]["from"] == last.phy + last.size and off["dispatch"]["reput_records"] == 0
    assert on["dispatch"]["reput"]["from"] == last.phy and on["dispatch"]["reput_records"] == 1
    q = next(q for q in on["consume_queues"]["queues"] if q["queue_id"] == last.msg.queue_id)
    assert q["final_max_offset"] == sum(1 for p in cs.placed if p.msg.queue_id == last.msg.queue_id)


def test_5x_confirm_offset_of_an_abnormal_window_is_its_last_record_start_or_without_one_its_base(tmp_path):
    _, store = _abnormal_from_segment_2_with_its_first_record_corrupt(tmp_path, "s")
    plan = _plan(store)
    assert plan["checkpoint"]["confirm_phy_offset"] == 777
    # recoverAbnormally: lastValidMsgPhyOffset starts at the window's first file base and no record moves it
    assert plan["checkpoint_after"]["confirm_phy_offset"] == 2 * S
    # with a valid record in the window: the start of the last one (not its end)
    cs = _crafted(4)
    intact = _plan(_store(tmp_path, cs, name="intact", dispatch=False, abort=True))
    assert intact["commitlog"]["process_offset"] == cs.placed[-1].phy + cs.placed[-1].size
    assert intact["checkpoint_after"]["confirm_phy_offset"] == cs.placed[-1].phy


def _normal_last_segment_first_record_corrupt(tmp_path, name: str, conf=None):
    cs = _crafted(3)
    n = cs.seg_index + 1
    first = next(p for p in cs.placed if p.segment == n - 1)
    store = _store(tmp_path, cs, name=name, conf=conf)  # queues hold every record: the window is the last file
    cs.corrupt(first.phy, cs.body_pos(first))
    cs.write(tmp_path / name)
    return cs, n, Store(store.loc.path, store.settings)


def test_5x_confirm_offset_of_a_normal_window_without_a_valid_record_is_the_flush_or_max_offset(tmp_path):
    cs, n, store = _normal_last_segment_first_record_corrupt(tmp_path, "async")
    plan = _plan(store)
    assert plan["last_exit"]["recovery"] == "normal"
    assert plan["commitlog"]["start_base"] == (n - 1) * S and plan["commitlog"]["process_offset"] == (n - 1) * S
    # recoverNormally: lastValidMsgPhyOffset starts at getConfirmOffset(): ASYNC_FLUSH -> getMaxOffset(), the
    # end of the last loaded file (its wrote position is the file size after load)
    assert plan["checkpoint_after"]["confirm_phy_offset"] == n * S
    _, _, sync = _normal_last_segment_first_record_corrupt(tmp_path, "sync", {"flushDiskType": "SYNC_FLUSH"})
    # SYNC_FLUSH -> getFlushedWhere(), still 0 before recovery sets it
    assert _plan(sync)["checkpoint_after"]["confirm_phy_offset"] == 0


# ---------------------------------------------------------------------------------------------
# batchconsumequeue/: loaded, recovered and truncated by 5.3.3, modelled and never written here

BCQ_FILE = 46 * 40
# BatchConsumeQueue.java:49-63, written here independently of the reader
BCQ_DTYPE = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags", ">i8"), ("time", ">i8"), ("base", ">i8"),
                      ("batch", ">i2"), ("compacted", ">i4"), ("reserved", ">i4")])


def _batch_store(tmp_path, name: str, *, batch_cq: bool = True, beyond: bool = False):
    """Topic T in consume queues that end at ``mid`` (the records after it are not dispatched yet), topic B in a
    BatchConsumeQueue holding every B record (``beyond``: and one unit past the log's end)."""
    cs = CraftedStore(S)
    i = 0
    while cs.seg_index < 3:
        cs.append(msg("B" if i % 4 == 3 else "T", 0, body=bytes([65 + i % 26]) * 300, keys=f"k{i}", uniq=f"U{i:06d}"))
        i += 1
    b_recs = [p for p in cs.placed if p.msg.topic == "B"]
    mid = next(p for p in cs.placed if p.segment == 1 and p.msg.topic == "T").phy
    store = _store(tmp_path, cs, name=name, conf={"mapperFileSizeBatchConsumeQueue": BCQ_FILE}, dispatch_to=mid)
    root = tmp_path / name
    shutil.rmtree(root / "consumequeue" / "B", ignore_errors=True)
    units = np.zeros(BCQ_FILE // 46, dtype=BCQ_DTYPE)
    for k, p in enumerate(b_recs):
        units[k] = (p.phy, p.size, 0, p.msg.store_timestamp, k, 1, 0, 0)
    if beyond:
        units[len(b_recs)] = (10 * S, 300, 0, 0, len(b_recs), 1, 0, 0)
    (root / "batchconsumequeue" / "B" / "0").mkdir(parents=True)
    (root / "batchconsumequeue" / "B" / "0" / f"{0:020d}").write_bytes(units.tobytes())
    (root / "config").mkdir(exist_ok=True)
    attrs = {"queue.type": "BatchCQ"} if batch_cq else {}
    (root / "config" / "topics.json").write_text(json.dumps({"topicConfigTable": {
        "T": {"topicName": "T"}, "B": {"topicName": "B", "attributes": attrs}}}))
    return cs, b_recs, mid, Store(str(root), store.settings)


def test_5x_batch_consume_queue_max_counts_in_the_recovery_window_and_its_records_get_no_cq_entry(tmp_path):
    cs, b_recs, mid, store = _batch_store(tmp_path, "b")
    plan = _plan(store)
    bmax = b_recs[-1].phy  # BatchConsumeQueue.getMaxPhysicOffset: the last unit's phyOffset (a record's start)
    assert plan["consume_queues"]["max_phy_offset"] == bmax > mid
    assert plan["commitlog"]["start_base"] == bmax - bmax % S
    # 5.x normal recovery dispatches only PHYSICALOFFSET > maxPhyOffsetOfConsumeQueue: T's records between the
    # consume queues' end and the batch queue's max are not dispatched by this start
    assert plan["dispatch"]["recovery_records"] == sum(1 for p in cs.placed if p.phy > bmax)
    [bq] = plan["consume_queues"]["batch_queues"]
    assert bq["path"] == "batchconsumequeue/B/0" and bq["units"] == len(b_recs) and bq["max_physic_offset"] == bmax
    assert [q["topic"] for q in plan["consume_queues"]["queues"]] == ["T"]  # no consumequeue/B is planned
    assert not any("/B/" in f["path"] for f in plan["consume_queues"]["files"])
    assert any(f["kind"] == "batch_consume_queue" for f in plan["findings"])
    assert plan["load_failures"] == []


def test_5x_batch_consume_queue_ahead_of_the_log_truncates_every_queue_and_is_reported_not_written(tmp_path):
    cs, b_recs, _, store = _batch_store(tmp_path, "b", beyond=True)
    before = (tmp_path / "b" / "batchconsumequeue" / "B" / "0" / f"{0:020d}").read_bytes()
    plan = _plan(store)
    assert plan["consume_queues"]["max_phy_offset"] == 10 * S
    assert plan["consume_queues"]["truncate_at_process_offset"] is True
    [bq] = plan["consume_queues"]["batch_queues"]
    assert bq["truncate"] == {"max_physic_offset": b_recs[-1].phy, "units_dropped": 1, "files_deleted": []}
    assert bq["supported"] is False
    f = next(f for f in plan["findings"] if f["kind"] == "batch_consume_queue")
    assert f["severity"] == "warning" and "never writes batch consume queues" in f["detail"]
    assert (tmp_path / "b" / "batchconsumequeue" / "B" / "0" / f"{0:020d}").read_bytes() == before


def test_5x_batch_consume_queue_of_a_topic_not_configured_batch_fails_the_broker_load_in_plan_and_info(tmp_path):
    _, _, _, store = _batch_store(tmp_path, "b", batch_cq=False)
    plan = _plan(store)
    assert [f["file"] for f in plan["load_failures"]] == ["batchconsumequeue/B/0"]
    assert plan["supported"] is False
    info = collect(store, scan=False)
    assert [f["file"] for f in info["findings"] if f["kind"] == "broker_load_fails"] == ["batchconsumequeue/B/0"]
    rep = audit_store(str(tmp_path / "b"), broker_conf=str(tmp_path / "b.conf"), version="5", quiet=True,
                      cross="driver")
    assert [f["file"] for f in rep["findings"] if f["kind"] == "broker_load_fails"] == ["batchconsumequeue/B/0"]


def test_5x_consume_queue_topic_configured_batch_fails_the_broker_load_in_plan_audit_and_info(tmp_path):
    # queueTypeShouldBe (ConsumeQueueStore.java:259-267) the other way: consumequeue/T of a topic that is BatchCQ
    _, _, _, store = _batch_store(tmp_path, "b")
    root = tmp_path / "b"
    (root / "config" / "topics.json").write_text(json.dumps({"topicConfigTable": {
        "T": {"topicName": "T", "attributes": {"queue.type": "BatchCQ"}},
        "B": {"topicName": "B", "attributes": {"queue.type": "BatchCQ"}}}}))
    plan = _plan(store)
    assert [f["file"] for f in plan["load_failures"]] == ["consumequeue/T"]
    info = collect(store, scan=False)
    assert [f["file"] for f in info["findings"] if f["kind"] == "broker_load_fails"] == ["consumequeue/T"]
    for cross in ("tasks", "driver"):
        rep = audit_store(str(root), broker_conf=str(tmp_path / "b.conf"), version="5", quiet=True, cross=cross)
        got = [f for f in rep["findings"] if f["kind"] == "broker_load_fails"]
        assert [(f["file"], f["severity"]) for f in got] == [("consumequeue/T", "critical")], cross
        assert "queueTypeShouldBe" in got[0]["detail"]


# ---------------------------------------------------------------------------------------------
# the audit's lag judgement on the plan's rules (storelib.broker.startup.lagdispatch)

def _audits(tmp_path, name: str) -> list[dict]:
    """The audit's findings, the partitioned tasks' and the driver's."""
    return [audit_store(str(tmp_path / name), broker_conf=str(tmp_path / f"{name}.conf"), version="5", quiet=True,
                        cross=cross)["findings"] for cross in ("tasks", "driver")]


def _queue_findings(findings: list[dict], topic: str, qid: int) -> list[dict]:
    return [f for f in findings if f["file"] == f"consumequeue/{topic}/{qid}" and f["severity"] != "info"]


def test_audit_lag_finding_follows_recheck_reput_offset_from_cq_as_the_plan_does(tmp_path):
    cs = _crafted(2)
    prev = cs.append(msg("T", 0, body=b"Y" * 300, keys="ky", uniq="UY"))
    last = cs.append(msg("T", 1, body=b"Z" * 300, keys="kz", uniq="UZ"))
    assert prev.phy % S > 0 and last.segment == prev.segment  # the queues end where each starts
    cases = {"off": (last, {}), "on": (last, {"recheckReputOffsetFromCq": "true"}),
             "later": (prev, {"recheckReputOffsetFromCq": "true"})}
    for name, (skipped, conf) in cases.items():
        plan = _plan(_store(tmp_path, cs, name=name, dispatch_to=skipped.phy, conf=conf))
        redispatched = plan["dispatch"]["reput_records"] == 1
        # "on": nothing past the skipped record, the rechecked reput reads it; "later": the recovery dispatches
        # the last record, the reput starts past it
        assert redispatched == (name == "on")
        for findings in _audits(tmp_path, name):
            [lag] = _queue_findings(findings, "T", skipped.msg.queue_id)
            assert lag["kind"] == "queue_behind_commitlog"
            if redispatched:
                assert "never_dispatched" not in lag["extra"] and "dispatches them on start" in lag["detail"]
            else:
                assert lag["extra"]["never_dispatched"] == skipped.phy, name


def test_audit_counts_the_batch_consume_queues_max_in_the_reput_position_as_the_plan_does(tmp_path):
    cs, b_recs, mid, store = _batch_store(tmp_path, "b")
    bmax = b_recs[-1].phy
    plan = _plan(store)
    assert plan["dispatch"]["recovery_records"] == sum(1 for p in cs.placed if p.phy > bmax)
    skipped = [p for p in cs.placed if p.msg.topic == "T" and mid <= p.phy < bmax]
    for findings in _audits(tmp_path, "b"):
        # T's records up to the batch queue's max: 5.3.3's recovery skips them, its reput starts past them
        [f] = _queue_findings(findings, "T", 0)
        assert f["kind"] == "cq_entries_missing_for_messages" and f["extra"]["count"] == len(skipped)
        assert f"(phy {skipped[0].phy})" in f["detail"] and f"reput position {bmax}" in f["detail"]
