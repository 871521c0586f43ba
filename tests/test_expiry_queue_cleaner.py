"""``expiry``'s consume-queue and index cleaner (storelib.broker.expiry.queueclean) follows
CleanConsumeQueueService: a sleep of deleteConsumeQueueFilesInterval after each queue that deleted (4.9.8
DefaultMessageStore.java:1885-1890, 5.3.3 :2508-2513), and in 5.3.3 its own executor beside the commit-log
cleaner's (DefaultMessageStore.java:1862-1867) instead of 4.9.8's one task (:1366-1369)."""

from __future__ import annotations

import dataclasses

import pytest

from storelib.broker.expiry.cleaner import CleanerSim, simulate
from storelib.broker.expiry.expiry import Policy, TimeModel, load_snapshot
from storelib.broker.settings.store import Store
from storelib.fileio.bytesource import resolve
from tests.expiry_storegen import MIN, T0, H, Msg, build_store

STATIC = TimeModel(ingest_bytes_per_s=0, consumption_msgs_per_s=0)
TICK = T0 + 6 * H + 2 * MIN  # the first clean tick (06:02:00): 60 s after the snapshot (06:01:00)


@pytest.fixture
def three_queues(tmp_path):
    """Seven 4096-byte segments of four messages, segment i written at i:00-i:03, the messages round robin
    on A/0, A/1 and B/0 (so each queue's first CQ file of four units spans three segments)."""
    root = tmp_path / "store"
    qs = [("A", 0), ("A", 1), ("B", 0)]
    msgs = [Msg(qs[m % 3][0], qs[m % 3][1], T0 + (m // 4) * H + (m % 4) * MIN) for m in range(26)]
    st = build_store(root, msgs, offsets={"A@g": {0: 0}}, index_ends=[5000, 13000, 26000])
    return root, st


def _run(store, version: str, **over):
    root, st = store
    st = dataclasses.replace(st, version=version).with_overrides({"fileReservedTime": 1, "deleteWhen": "06", **over})
    pol = Policy.from_settings("p", st)
    snap = load_snapshot(Store(resolve(str(root)), st))
    return pol, snap


def _queue_files(res):
    return [(d["time_ms"] - TICK, d["file"]) for d in res["deletions"] if d["kind"] != "commitlog"]


def test_each_queue_that_deletes_is_followed_by_the_consume_queue_interval_then_the_index_files(three_queues):
    # 4.9.8: segments 0-4 go at +0..+400 ms and the commit-log cleaner ends at +500 (it slept before finding
    # segment 5 young); then each of the three queues deletes its first CQ file and the queue cleaner sleeps
    # 100 ms after it, so the queues go 100 ms apart and the index files after the third sleep
    res = simulate(*_run(three_queues, "4"), STATIC)
    assert _queue_files(res)[:5] == [
        (500, "consumequeue/A/0/00000000000000000000"), (600, "consumequeue/A/1/00000000000000000000"),
        (700, "consumequeue/B/0/00000000000000000000"), (800, "index/20240101000000000"),
        (800, "index/20240101000000001")]
    # without the interval they all go when the commit-log cleaner ends
    res0 = simulate(*_run(three_queues, "4", deleteConsumeQueueFilesInterval=0), STATIC)
    assert {t for t, _f in _queue_files(res0)[:5]} == {500}


def test_the_queue_sleeps_lengthen_the_498_clean_task_run(three_queues):
    # one task runs both cleaners: the next tick (scheduleAtFixedRate) waits until the last sleep is over
    pol, snap = _run(three_queues, "4")
    sim = CleanerSim(pol, snap, STATIC)
    sim.run_tick(TICK)
    assert sim.busy_until == TICK + 800


def test_the_533_queue_cleaner_runs_on_its_own_ticks_and_sees_only_files_deleted_before_it_starts(three_queues):
    # 5.3.3: at 06:02:00 both executors start; the queue cleaner reads the min offset before the commit-log
    # cleaner's first file is gone, so it acts at its next tick, 10 s later, with the same 100-ms spacing
    res = simulate(*_run(three_queues, "5"), STATIC)
    cl = [d["time_ms"] - TICK for d in res["deletions"] if d["kind"] == "commitlog"]
    assert cl[:5] == [0, 100, 200, 300, 400]
    assert _queue_files(res)[:5] == [
        (10_000, "consumequeue/A/0/00000000000000000000"), (10_100, "consumequeue/A/1/00000000000000000000"),
        (10_200, "consumequeue/B/0/00000000000000000000"), (10_300, "index/20240101000000000"),
        (10_300, "index/20240101000000001")]


def test_a_533_queue_run_during_a_long_commit_log_run_sees_the_files_deleted_so_far(tmp_path):
    # 5.3.3, cleanResourceInterval 1 s, deleteFileBatchMax 20: the commit-log cleaner deletes segments 0-19 at
    # 60.0-61.9 s and 20-29 at 61.9-62.8 s (the late tick); the queue cleaner's ticks at 61, 62 and 63 s see
    # the min offset as it is then: the CQ files (one per segment) of segments 0-9, then 10-20, then 21-29
    root = tmp_path / "store"
    msgs = [Msg("T", 0, T0 + (m // 4) * 1000 + (m % 4)) for m in range(30 * 4 + 2)]
    st = build_store(root, msgs, offsets={"T@g": {0: 0}})
    st = dataclasses.replace(st, version="5").with_overrides(
        {"fileReservedTime": 1, "deleteWhen": "03", "deleteFileBatchMax": 20, "cleanResourceInterval": 1000})
    start = T0 + 3 * H
    res = simulate(Policy.from_settings("p", st), load_snapshot(Store(resolve(str(root)), st)),
                   dataclasses.replace(STATIC, start_ms=start, until_ms=start + 120_000))
    cq = [(d["time_ms"] - start, int(d["file"].rsplit("/", 1)[1]) // 80) for d in res["deletions"]
          if d["kind"] == "consumequeue"]
    assert cq == [(61_000, k) for k in range(10)] + [(62_000, k) for k in range(10, 21)] + \
        [(63_000, k) for k in range(21, 30)]


@pytest.fixture
def indexed(tmp_path):
    """test_expiry.py's store (segments 0-3 full, the write position 18384 in segment 4) with index headers
    that hold 3 + 3 + 2 entries over commit-log bytes 0..16384: one entry per 2048 bytes; maxIndexNum 4, so
    the last file (indexCount 3) is full 2048 bytes on (20432) and each new one holds 3 entries, 6144 bytes."""
    from storelib.format.indexfile import IndexHeader

    root = tmp_path / "store"
    msgs = [Msg("T", 0, T0 + (m // 4) * H + (m % 4) * MIN) for m in range(18)]
    st = build_store(root, msgs, offsets={"T@g": {0: 0}}, index_ends=[5000, 13000, 16384])
    for f, (begin, end, count) in zip(sorted((root / "index").iterdir()), [(0, 5000, 4), (6000, 13000, 4),
                                                                          (14000, 16384, 3)]):
        raw = f.read_bytes()
        f.write_bytes(IndexHeader(T0, T0, begin, end, 4, count).to_bytes() + raw[40:])
    return root, st


def test_the_index_files_the_broker_creates_while_writing_are_deleted_by_the_min_offset(indexed):
    # 10 bytes/s from 04:01:00: new index files start at 20432 (+204.8 s) and 26576 (+819.2 s); segment 4
    # goes at the +210 s tick (M 20480 passes the old last file's end, 20432, now that a newer one exists),
    # segment 6 at +1030 s (M 28672 passes the first new file's end, 26576; after the queue's 100-ms sleep);
    # the second new one stays. The new file is named by its creation time (04:01:00 + 204.8 s)
    root, st = indexed
    st = st.with_overrides({"fileReservedTime": 0, "deleteWhen": "04"})
    snap = load_snapshot(Store(resolve(str(root)), st))
    t = snap.last_store_ms
    assert snap.index_per_byte == 8 / 16384 and snap.index_last_count == 3
    model = TimeModel(ingest_bytes_per_s=10, consumption_msgs_per_s=0, until_ms=t + 1200_000)
    sim = CleanerSim(Policy.from_settings("p", st), snap, model)
    assert [sim.index_bytes(t + s * 1000) for s in (204, 205, 819, 820)] == [3 * 136, 4 * 136, 4 * 136, 5 * 136]
    res = simulate(Policy.from_settings("p", st), snap, model)
    idx = [(d["time_ms"] - t, d["file"]) for d in res["deletions"] if d["kind"] == "index"]
    assert idx == [(60_400, "index/20240101000000000"), (60_400, "index/20240101000000001"),
                   (210_000, "index/20240101000000002"), (1030_100, "index/20240101040424800")]
    assert res["summary"]["index_created"] == 2


def test_the_533_logical_ratio_counts_whole_mapped_files(tmp_path):
    # replicasPerDiskPartition 2 on a 54000-byte disk: partitionLogicalSize 27000. The store's written bytes
    # (18384 commit log + 360 CQ + 408 index = 19152) are 0.709 of it, but getMajorFileSize counts whole files:
    # 5 x 4096 + 5 CQ files x 80 + 3 index files x 136 = 21288, 0.788 > 0.75: the expired segments go for
    # space at the first tick (04:02:00), not at the 05:00 deleteWhen hour; segment 3 then waits for 05:00
    root = tmp_path / "store"
    msgs = [Msg("T", 0, T0 + (m // 4) * H + (m % 4) * MIN) for m in range(18)]
    st = build_store(root, msgs, offsets={"T@g": {0: 0}}, index_ends=[5000, 13000, 18384])
    st = dataclasses.replace(st, version="5").with_overrides(
        {"fileReservedTime": 1, "deleteWhen": "05", "replicasPerDiskPartition": 2})
    snap = load_snapshot(Store(resolve(str(root)), st))
    sim = CleanerSim(Policy.from_settings("p", st, disk_capacity=54_000), snap, STATIC)
    assert sim.major_file_size(snap.last_store_ms) == 21_288
    res = simulate(Policy.from_settings("p", st, disk_capacity=54_000), snap, STATIC)
    got = [(d["time_ms"] - T0, int(d["file"].rsplit("/", 1)[1]) // 4096, d["reason"]) for d in res["deletions"]
           if d["kind"] == "commitlog"]
    tick = 4 * H + 2 * MIN
    assert got == [(tick, 0, "space"), (tick + 100, 1, "space"), (tick + 200, 2, "space"), (5 * H, 3, "time")]


@pytest.mark.parametrize("version,over", [
    ("4", {"fileReservedTime": 0, "deleteWhen": "04;05", "cleanResourceInterval": 1000}),
    ("5", {"fileReservedTime": 0, "deleteWhen": "04;05", "cleanResourceInterval": 1000}),
    ("5", {"fileReservedTime": 1, "deleteWhen": "09", "replicasPerDiskPartition": 2, "cleanFileForciblyEnable": "false"}),
])
def test_the_event_jumps_match_the_literal_schedule_with_queue_sleeps_new_index_files_and_whole_files(
        indexed, version, over):
    # the queue cleaner's own runs, its sleeps, the index files created on the way and 5.x's logical ratio
    # (all new here) against every tick run in turn
    from tests.test_expiry_java_rules import _literal

    root, st = indexed
    st = dataclasses.replace(st, version=version).with_overrides(over)
    snap = load_snapshot(Store(resolve(str(root)), st))
    pol = Policy.from_settings("p", st, disk_capacity=60_000)
    model = TimeModel(ingest_bytes_per_s=10, consumption_msgs_per_s=0, until_ms=snap.last_store_ms + 2 * H)
    got, want = simulate(pol, snap, model), _literal(pol, snap, model)
    assert got["deletions"] == want["deletions"] and got["summary"] == want["summary"]
    assert got["write_refusals"] == want["write_refusals"]
    assert got["summary"]["index_created"] > 1 and got["summary"]["index_deleted"] > 3
