"""The recovery walk (storelib.broker.recovery.walk) on crafted stores, expectations computed from where records went."""

from __future__ import annotations

import pytest

from storelib.broker.recovery.walk import (
    RecoveryInputs,
    finish_walk,
    iter_task,
    plan_recovery,
    rebuild_target,
    recovery_walk,
    run_tasks,
)
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.format.checkpoint import Checkpoint
from storelib.format.record import MAGIC_V1
from tests.rebuild_storegen import CraftedStore, msg

S = 8192


def _fill(cs: CraftedStore, segments: int, **kw) -> None:
    """Append messages until ``segments`` segments hold data."""
    i = 0
    while True:
        p = cs.append(msg("T", i % 3, body=b"x" * 300, keys=f"k{i}", **kw))
        if p.segment >= segments:
            # undo: the roll made one segment too many; keep it (tests use exact counts via placed)
            break
        i += 1


def _store(tmp_path, cs: CraftedStore, version: str = "4", preallocate: int = 0, **overrides) -> Store:
    root = cs.write(tmp_path / "store", preallocate=preallocate)
    settings = BrokerSettings.defaults(version).with_overrides({"mappedFileSizeCommitLog": S, **overrides})
    return Store(root, settings)


def _inputs(store: Store, **kw) -> RecoveryInputs:
    return RecoveryInputs.from_settings(store.settings, segment_size=S, **kw)


def _run(store: Store, **kw):
    return recovery_walk(store, _inputs(store, **kw))


def _by_segment(cs: CraftedStore, seg: int):
    return [p for p in cs.placed if p.segment == seg]


def _end(p) -> int:
    return p.phy + p.size


@pytest.fixture
def five(tmp_path):
    """A 5-segment store (segments 0..3 end with blanks, 4 partly written)."""
    cs = CraftedStore(S)
    _fill(cs, 4)
    return cs


def test_clean_498_walk_covers_last_three_and_reput_dispatches_everything(tmp_path, five):
    store = _store(tmp_path, five)
    res = _run(store)
    last = five.placed[-1]
    assert res.mode == "normal" and res.start_index == 2 and res.start_base == 2 * S
    assert res.process_offset == _end(last)
    assert res.failure is None and res.delete_segments == () and res.truncate == (4 * S, _end(last) - 4 * S)
    # every record is dispatched, segment by segment, up to its blank
    spans = [(d.base, d.start, d.end) for d in res.dispatch]
    exp = [(i * S, 0, _end(_by_segment(five, i)[-1]) - i * S) for i in range(5)]
    assert spans == exp
    assert [o.crc_checked for o in res.segments] == [False, False, True, True, True]


def test_498_crc_error_before_the_window_is_not_detected(tmp_path, five):
    bad = _by_segment(five, 1)[2]
    five.corrupt(bad.phy, five.body_pos(bad))  # body byte: CRC mismatch only
    res = _run(_store(tmp_path, five))
    assert res.failure is None
    assert res.process_offset == _end(five.placed[-1])
    assert any(d.base == S and d.start == 0 and d.end > bad.phy - S for d in res.dispatch)


def test_498_crc_error_inside_the_window_ends_the_log_and_deletes_later_segments(tmp_path, five):
    bad = _by_segment(five, 3)[1]
    five.corrupt(bad.phy, five.body_pos(bad))
    res = _run(_store(tmp_path, five))
    assert res.process_offset == bad.phy
    assert res.failure is not None and res.failure.reason == "crc_mismatch" and res.failure.base == 3 * S
    assert res.failure.end_offset == bad.phy - 3 * S
    assert res.delete_segments == (4 * S,)
    assert res.truncate == (3 * S, bad.phy - 3 * S)
    assert res.dispatch[-1].phy_end == bad.phy and res.dispatch[-1].base == 3 * S
    assert len(res.dispatch) == 4


def test_498_bad_magic_before_the_window_skips_the_rest_of_that_segment_only(tmp_path, five):
    bad = _by_segment(five, 0)[3]
    five.corrupt(bad.phy, 4, 0x00)  # magic byte 0: -1 for reput
    res = _run(_store(tmp_path, five))
    assert res.failure is None and res.supported
    d0 = res.dispatch[0]
    assert (d0.base, d0.start, d0.end) == (0, 0, bad.phy)
    assert res.dispatch[1].base == S and res.dispatch[1].start == 0
    assert res.segments[0].end_kind == "invalid" and res.segments[0].reason == "bad_magic"


def test_498_preallocated_zero_segment_counts_in_the_last_three(tmp_path, five):
    bad = _by_segment(five, 2)[1]  # third-last data segment: outside the window once a zero file follows
    five.corrupt(bad.phy, five.body_pos(bad))
    store = _store(tmp_path, five, preallocate=1)
    res = _run(store)
    assert res.start_index == 3
    assert res.failure is None
    assert res.process_offset == _end(five.placed[-1])
    # the pre-allocated file is past the valid end: deleted
    assert res.delete_segments == (5 * S,)


def test_5x_empty_cq_checks_crc_from_the_first_segment(tmp_path, five):
    bad = _by_segment(five, 0)[4]
    five.corrupt(bad.phy, five.body_pos(bad))
    res = _run(_store(tmp_path, five, version="5"), version="5")
    assert res.start_index == 0 and res.process_offset == bad.phy
    assert res.delete_segments == (S, 2 * S, 3 * S, 4 * S)
    assert [(d.base, d.start, d.end, d.after) for d in res.dispatch] == [(0, 0, bad.phy, -1)]


def test_5x_normal_start_is_last_segment_at_or_below_cq_max(tmp_path, five):
    store = _store(tmp_path, five, version="5")
    cq_max = 2 * S + 100
    res = _run(store, version="5", cq_max_phy_offset=cq_max)
    assert res.start_index == 2
    assert all(d.after == cq_max for d in res.dispatch)
    assert res.dispatch[0].base == 2 * S
    # exactly at a base: that segment
    assert _run(store, version="5", cq_max_phy_offset=3 * S).start_index == 3
    assert _run(store, version="5", cq_max_phy_offset=10**9).start_index == 4


def test_abnormal_start_segment_uses_checkpoint_min_timestamp_with_3s_margin(tmp_path):
    cs = CraftedStore(S)
    _fill(cs, 3, )
    firsts = [_by_segment(cs, i)[0] for i in range(4)]
    store = _store(tmp_path, cs)
    ts2 = firsts[2].msg.store_timestamp
    # min(physic, logics) - 3000 must reach segment 2's first record
    cp = Checkpoint(physic_msg_timestamp=ts2 + 3000, logics_msg_timestamp=ts2 + 5000)
    res = _run(store, last_exit_ok=False, checkpoint=cp)
    assert res.mode == "abnormal" and res.start_index == 2
    cp = Checkpoint(physic_msg_timestamp=ts2 + 2999, logics_msg_timestamp=ts2 + 5000)
    assert _run(store, last_exit_ok=False, checkpoint=cp).start_index == 1
    # messageIndexSafe: the index checkpoint (0 on a young store) bounds it: no match, first segment
    cp = Checkpoint(physic_msg_timestamp=ts2 + 10_000, logics_msg_timestamp=ts2 + 10_000, index_msg_timestamp=0)
    res = _run(store, last_exit_ok=False, checkpoint=cp, message_index_safe=True)
    assert res.start_index == 0 and "first segment" in res.start_reason
    # abnormal recovery re-dispatches every valid record from the start segment
    res = _run(store, last_exit_ok=False, checkpoint=Checkpoint(ts2 + 3000, ts2 + 3000))
    assert [d.base for d in res.dispatch] == [2 * S, 3 * S] and all(d.by == "recovery" for d in res.dispatch)
    assert res.delay_levels_quirk


def test_abnormal_probe_reads_store_time_after_an_ipv6_born_host(tmp_path):
    cs = CraftedStore(S)
    for i in range(60):
        cs.append(msg("T", 0, body=b"y" * 400, born_host="[2001:db8::1]:7000", keys=f"k{i}"))
    segs = sorted({p.segment for p in cs.placed})
    assert len(segs) >= 3
    first = _by_segment(cs, segs[-1])[0]
    store = _store(tmp_path, cs)
    cp = Checkpoint(first.msg.store_timestamp + 3000, first.msg.store_timestamp + 3000)
    assert _run(store, last_exit_ok=False, checkpoint=cp).start_index == segs[-1]


def test_abnormal_probe_rejects_bad_magic_and_zero_store_time(tmp_path, five):
    first3 = _by_segment(five, 3)[0]
    five.corrupt(first3.phy, 7, (MAGIC_V1 & 0xFF) ^ 1)
    store = _store(tmp_path, five)
    cp = Checkpoint(10**13, 10**13)
    res = _run(store, last_exit_ok=False, checkpoint=cp)
    assert res.start_index == 4
    # segment 4's record has a bad magic now too → skip to 2
    first4 = _by_segment(five, 4)[0]
    five.corrupt(first4.phy, 7, (MAGIC_V1 & 0xFF) ^ 1)
    store = _store(tmp_path / "b", five)
    assert _run(store, last_exit_ok=False, checkpoint=cp).start_index == 2


def test_blank_at_the_end_of_the_last_segment_keeps_its_position(tmp_path):
    cs = CraftedStore(S)
    _fill(cs, 1)
    cs.segments = cs.segments[:1]  # segment 0 ends with a blank, nothing after
    store = _store(tmp_path, cs)
    res = _run(store)
    blank_at = _end(_by_segment(cs, 0)[-1])
    assert res.process_offset == blank_at and res.segments[-1].end_kind == "blank"
    assert res.truncate == (0, blank_at)


def test_force_verify_prop_crc_5x_ends_at_a_record_without_crc_property(tmp_path):
    cs = CraftedStore(S, version="5")
    good = [cs.append(msg("T", 0, keys=f"k{i}"), prop_crc=True) for i in range(5)]
    plain = cs.append(msg("T", 0, keys="nocrc"))
    cs.append(msg("T", 0, keys="after"), prop_crc=True)
    store = _store(tmp_path, cs, version="5")
    res = _run(store, version="5", force_verify_prop_crc=True)
    assert res.process_offset == plain.phy == _end(good[-1])
    assert res.failure is not None and res.failure.reason == "crc_mismatch"
    assert _run(store, version="5").process_offset == _end(cs.placed[-1])


def test_a_property_crc_stop_counts_the_records_of_earlier_batches(tmp_path):
    """The walk's end after a forceVerifyPropCRC failure counts every record before it, not only those
    of the failing batch (a rebuild unit's records are summed per segment from these counts)."""
    cs = CraftedStore(S, version="5")
    for i in range(5):
        cs.append(msg("T", 0, keys=f"k{i}"), prop_crc=True)
    cs.append(msg("T", 0, keys="nocrc"))
    store = _store(tmp_path, cs, version="5")
    plan = plan_recovery(_inputs(store, version="5", force_verify_prop_crc=True), store.commitlog.segments)
    task = plan.tasks[0]
    ends: list = []
    with plan.segments[task.index].open() as src:
        rows = sum(b.num_rows for b in iter_task(plan, task, src, ends=ends, batch_rows=2,
                                                  columns=["phy_offset", "prop_crc_ok"]))
    assert rows == 5 and ends[0].reason == "crc_mismatch" and ends[0].records == 5


def test_check_crc_on_recover_false_keeps_crc_failures(tmp_path, five):
    bad = _by_segment(five, 3)[1]
    five.corrupt(bad.phy, five.body_pos(bad))
    res = _run(_store(tmp_path, five), check_crc_on_recover=False)
    assert res.failure is None and res.process_offset == _end(five.placed[-1])


def test_rebuild_target_ignores_abort_and_existing_cq(tmp_path, five):
    store = _store(tmp_path, five, version="5")
    (tmp_path / "store" / "abort").write_bytes(b"")
    res = rebuild_target(store, version="5")
    assert res.mode == "normal" and res.start_index == 0 and res.cq_max_phy_offset == -1


def test_no_segments(tmp_path):
    (tmp_path / "store" / "commitlog").mkdir(parents=True)
    store = Store(tmp_path / "store", BrokerSettings.defaults("4"))
    res = recovery_walk(store, RecoveryInputs())
    assert res.process_offset == 0 and res.dispatch == () and res.start_base is None


def test_walk_stops_scanning_after_the_failing_segment(tmp_path, five):
    bad = _by_segment(five, 2)[0]
    five.corrupt(bad.phy, five.body_pos(bad))
    store = _store(tmp_path, five)
    plan = plan_recovery(_inputs(store), store.commitlog.segments)
    seen = []
    ends = run_tasks(plan, on_segment=lambda t, e: seen.append(t.index))
    assert seen == [0, 1, 2]
    res = finish_walk(plan, ends)
    assert res.process_offset == bad.phy and res.delete_segments == (3 * S, 4 * S)


def test_walk_parts_compose_like_the_whole(tmp_path, five):
    store = _store(tmp_path, five)
    plan = plan_recovery(_inputs(store), store.commitlog.segments)
    ends = run_tasks(plan)
    assert finish_walk(plan, ends) == _run(store)


def test_abnormal_start_with_a_sign_flipped_checkpoint_time_is_the_last_segment(tmp_path):
    """min(physic, logics) - 3000 wraps (Java long) to near Long.MAX_VALUE: every first record is older,
    so the broker starts from the last segment, not the first."""
    cs = CraftedStore(S)
    _fill(cs, 3)
    store = _store(tmp_path, cs)
    ts = cs.placed[-1].msg.store_timestamp
    cp = Checkpoint(physic_msg_timestamp=-(2**63) + 1000, logics_msg_timestamp=ts)
    res = _run(store, last_exit_ok=False, checkpoint=cp)
    assert res.mode == "abnormal" and res.start_index == 3 and "last segment" in res.start_reason
