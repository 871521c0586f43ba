"""``expiry`` follows the Java cleaners' scheduling and disk-full rules that the event-jumping simulation
could get wrong: a delete round that outlasts its period (DLedger's CleanSpaceService waits 100 ms after
a round ENDS; the broker's scheduleAtFixedRate never overlaps runs), and writes refused while the disk is
marked full."""

from __future__ import annotations

import dataclasses

import pytest

from storelib.broker.expiry.cleaner import CleanerSim, simulate
from storelib.broker.expiry.diskfull import check
from storelib.broker.expiry.expiry import HOUR_ERROR, Policy, TimeModel, load_snapshot
from storelib.broker.settings.store import Store, with_dledger
from storelib.fileio.bytesource import resolve
from tests.expiry_storegen import MIN, T0, H, Msg, build_store

STATIC = TimeModel(ingest_bytes_per_s=0, consumption_msgs_per_s=0)


def _cl(res, start):
    return [(d["time_ms"] - start, int(d["file"].rsplit("/", 1)[1])) for d in res["deletions"]
            if d["kind"] == "commitlog"]


def test_dledger_starts_its_next_round_100ms_after_the_previous_one_ends(tmp_path):
    # 25 old data files (4 entries each) and a partial 26th: DLedger deletes 10 a round, 100 ms apart,
    # then waits 100 ms: 0..900, 1000..1900, 2000..2400 (not three overlapping rounds on a 100-ms grid)
    root = tmp_path / "store"
    msgs = [Msg("T", 0, T0 + (m // 4) * MIN + (m % 4) * 1000) for m in range(25 * 4 + 2)]
    st = build_store(root, msgs, offsets={"T@g": {0: 0}}, dledger=True)
    st = with_dledger(st, resolve(str(root)), set())
    pol = Policy.from_settings("p", st.with_overrides({"fileReservedTime": 0, "deleteWhen": "03"}))
    start = T0 + 3 * H
    res = simulate(pol, load_snapshot(Store(resolve(str(root)), st)),
                   dataclasses.replace(STATIC, start_ms=start, until_ms=start + 10_000))
    got = _cl(res, start)
    assert got == [(i * 100, i * 4096) for i in range(25)]


def test_a_broker_tick_that_passes_during_a_long_run_starts_when_that_run_ends(tmp_path):
    # 5.x, deleteFileBatchMax 20, cleanResourceInterval 1 s: the first run deletes files 0..19 from 60.0 s
    # to 61.9 s; the tick due at 61.0 s starts at 61.9 s (fixed-rate catch-up), never while the first
    # run still deletes, so no time goes backwards and the second batch starts where the first ended
    root = tmp_path / "store"
    msgs = [Msg("T", 0, T0 + (m // 4) * 1000 + (m % 4)) for m in range(30 * 4 + 2)]
    st = build_store(root, msgs, offsets={"T@g": {0: 0}})
    st = dataclasses.replace(st, version="5").with_overrides(
        {"fileReservedTime": 1, "deleteWhen": "03", "deleteFileBatchMax": 20, "cleanResourceInterval": 1000})
    pol = Policy.from_settings("p", st)
    start = T0 + 3 * H
    res = simulate(pol, load_snapshot(Store(resolve(str(root)), st)),
                   dataclasses.replace(STATIC, start_ms=start, until_ms=start + 120_000))
    got = _cl(res, start)
    times = [t for t, _ in got]
    assert times == sorted(times)
    assert got[:20] == [(60_000 + i * 100, i * 4096) for i in range(20)]
    assert got[20:] == [(61_900 + i * 100, (20 + i) * 4096) for i in range(10)]


@pytest.fixture
def small(tmp_path):
    """The tiny store of test_expiry.py: five 4096-byte segments, segment i written at i:00-i:03."""
    root = tmp_path / "store"
    msgs = [Msg("T", 0, T0 + (m // 4) * H + (m % 4) * MIN) for m in range(18)]
    st = build_store(root, msgs, offsets={"T@lag": {0: 2}}, index_ends=[5000, 13000, 18384])
    return root, st


def _sim(small, version="4", capacity=30_000, ingest=2, hours=4, **over):
    root, st = small
    st = dataclasses.replace(st, version=version).with_overrides(over)
    snap = load_snapshot(Store(resolve(str(root)), st))
    pol = Policy.from_settings("p", st, disk_capacity=capacity)
    model = TimeModel(ingest_bytes_per_s=ingest, consumption_msgs_per_s=0, until_ms=snap.last_store_ms + hours * H)
    return pol, snap, model


def _literal(pol, snap, model):
    """The broker's schedule tick by tick (the oracle for the event jumps): every cleaner tick (a late one when
    the previous run ends), and on 4.9.8 the 10-s disk check from 1 s after the start; a check is taken
    before a cleaner tick of the same time, after a run that ends then, and not during a run."""
    sim = CleanerSim(pol, snap, model)
    sim._sample(sim.start)
    checks = list(range(sim.start + 1000, sim.until + 1, 10_000)) if pol.version == "4" else []
    ci = 0
    for k in range(sim.kmax + 1):
        s = max(sim.tick(k), sim.busy_until)
        if s > sim.until:
            break
        while ci < len(checks) and (checks[ci] < s or (checks[ci] == s and sim.tick(k) == s)):
            if checks[ci] >= sim.busy_until:
                check(sim, "broker", sim.phys(checks[ci]), pol.warn_ratio, pol.warn_ratio, checks[ci])
            ci += 1
        sim.run_tick(s)
    for c in checks[ci:]:
        if c >= sim.busy_until:
            check(sim, "broker", sim.phys(c), pol.warn_ratio, pol.warn_ratio, c)
    sim._sample(sim.until)
    return sim.result()


def test_writes_stop_while_the_disk_is_full_instead_of_filling_it_past_100_percent(small):
    # nothing can go (fileReservedTime 1000 h, no forcible cleaning): 4.9.8 marks the disk full at the first
    # check above 0.90 and refuses every write from then on, so the disk stays at 0.91 (not 2.32)
    pol, snap, model = _sim(small, capacity=40_000, ingest=10, hours=2, fileReservedTime=1000, deleteWhen="04",
                            cleanFileForciblyEnable="false")
    res = simulate(pol, snap, model)
    assert res["summary"]["max_ratio"] == 0.91
    (r,) = res["write_refusals"]
    assert r["to_ms"] is None and res["summary"]["writes_refused_ms"] == r["from_ms"]
    assert res["summary"]["writes_refused_total_ms"] == model.until_ms - r["from_ms"]
    assert res["disk_usage"][-1]["ratio"] == 0.91
    from jobs.reports.expiry_report import compare_rows

    (row,) = compare_rows([res])  # the text table says it too
    assert row["writes_refused"].endswith(f"({(model.until_ms - r['from_ms']) / 1000:.0f} s)")


def test_writes_resume_at_the_first_check_after_deletions_free_the_disk(small):
    # 4.9.8, deletes only at 06:00: full from about 05:05, the 06:00 run deletes the old segments (it sees the
    # disk still full when it starts), and the 10-s disk check at 06:00:01 clears the flag
    pol, snap, model = _sim(small, fileReservedTime=1, deleteWhen="06", cleanFileForciblyEnable="false",
                            diskMaxUsedSpaceRatio=95)
    res = simulate(pol, snap, model)
    (r,) = res["write_refusals"]
    assert r["by"] == "broker" and T0 + 5 * H < r["from_ms"] < T0 + 6 * H and r["to_ms"] == T0 + 6 * H + 1000
    assert res["summary"]["max_ratio"] == 0.91 and res["summary"]["commitlog_deleted"] == 6
    after = [d["used_bytes"] for d in res["disk_usage"] if d["time_ms"] >= r["to_ms"]]
    assert after[-1] > after[0]  # writing again


@pytest.mark.parametrize("version,ingest,over", [
    ("4", 2, {"fileReservedTime": 1, "deleteWhen": "06", "cleanFileForciblyEnable": "false",
              "diskMaxUsedSpaceRatio": 95}),
    ("4", 2, {"fileReservedTime": 1000, "deleteWhen": "04", "cleanFileForciblyEnable": "false"}),
    ("4", 2, {"fileReservedTime": 0, "deleteWhen": "05;x", "diskMaxUsedSpaceRatio": 95}),
    ("4", 10, {"fileReservedTime": 3, "deleteWhen": "05;x", "diskMaxUsedSpaceRatio": 95,
               "cleanFileForciblyEnable": "false"}),
    ("5", 10, {"fileReservedTime": 5, "deleteWhen": "23", "cleanFileForciblyEnable": "false"}),
    ("5", 2, {"fileReservedTime": 1000, "deleteWhen": "04", "cleanFileForciblyEnable": "false"}),
])
def test_the_event_jumps_match_the_literal_schedule_with_the_disk_full_flag(small, version, ingest, over):
    # includes runs that refuse writes and resume them (several times on 5.x, whose flag only the cleaner sets)
    pol, snap, model = _sim(small, version=version, ingest=ingest, **over)
    got, want = simulate(pol, snap, model), _literal(pol, snap, model)
    assert got["write_refusals"] == want["write_refusals"]
    assert got["deletions"] == want["deletions"] and got["summary"] == want["summary"]


def test_a_533_broker_whose_deletewhen_always_throws_never_marks_its_disk_full_but_the_disk_still_ends(small):
    # 5.3.3 sets the flag only in the cleaner run, after isTimeToDelete, which throws outside 23:00: no mark,
    # the writes go on until the partition is full (ratio 1.00), and the report says this is past the model
    pol, snap, model = _sim(small, version="5", ingest=10, fileReservedTime=5, deleteWhen="23;x")
    res = simulate(pol, snap, model)
    assert res["summary"]["max_ratio"] == 1.0
    assert [r["by"] for r in res["write_refusals"]] == ["disk"]
    assert any("disk filled up" in w for w in res["warnings"])


def test_dledger_marks_its_disk_full_even_in_an_hour_whose_deletewhen_throws(tmp_path):
    # doWork sets isDiskFull before isTimeToDelete throws (DLedgerMmapFileStore.java:710-711): a bad deleteWhen
    # deletes nothing but still refuses writes from the first run (the start) when the disk is past its mark
    root = tmp_path / "store"
    msgs = [Msg("T", 0, T0 + (m // 4) * H + (m % 4) * MIN) for m in range(18)]
    st = build_store(root, msgs, offsets={"T@lag": {0: 2}}, index_ends=[5000, 13000, 18384], dledger=True)
    st = with_dledger(st, resolve(str(root)), set())
    snap = load_snapshot(Store(resolve(str(root)), st))
    pol = Policy.from_settings("p", st.with_overrides({"deleteWhen": "x", "fileReservedTime": 1000}), disk_capacity=20_000)
    res = simulate(pol, snap, dataclasses.replace(STATIC, until_ms=snap.last_store_ms + 60_000))
    assert res["summary"]["commitlog_deleted"] == 0
    assert res["summary"]["writes_refused_ms"] == snap.last_store_ms
    assert res["write_refusals"][0]["by"] == "dledger"


def _dledger_literal(pol, snap, model):
    """DLedger's CleanSpaceService run by run (the oracle): doWork, then 100 ms after it returns, or 200 ms
    after a deleteWhen that throws (its catch sleeps 200); the broker's queue cleaner before each run."""
    sim = CleanerSim(pol, snap, model)
    sim._sample(sim.start)
    t = sim.start
    while t <= sim.until:
        sim._queue_runs(t)
        end = sim._dledger_tick(t)
        t = t + 200 if sim.table[sim.hour(t)] == HOUR_ERROR else (t if end is None else end) + 100
    sim._queue_runs(sim.until)
    sim._sample(sim.until)
    return sim.result()


@pytest.mark.parametrize("when", ["05;x", "05", "x;05", "04;06;x"])
def test_dledger_runs_200ms_apart_in_hours_whose_deletewhen_throws(tmp_path, when):
    # started at 04:01:00.100: with "05;x" every hour but 05 throws, so the runs are 200 ms apart until the
    # first one at or after 05:00 (05:00:00.100), then 100 ms apart: the data files go from 05:00:00.100
    root = tmp_path / "store"
    msgs = [Msg("T", 0, T0 + (m // 4) * H + (m % 4) * MIN) for m in range(18)]
    st = build_store(root, msgs, offsets={"T@lag": {0: 2}}, index_ends=[5000, 13000, 18384], dledger=True)
    st = with_dledger(st, resolve(str(root)), set())
    snap = load_snapshot(Store(resolve(str(root)), st))
    pol = Policy.from_settings("p", st.with_overrides({"deleteWhen": when, "fileReservedTime": 0}))
    model = dataclasses.replace(STATIC, start_ms=snap.last_store_ms + 100, until_ms=snap.last_store_ms + 3 * H)
    got = simulate(pol, snap, model)
    assert got == _dledger_literal(pol, snap, model)
    if when == "05;x":
        assert got["summary"]["first_deletion_ms"] == T0 + 5 * H + 100


class _ListClock:
    """Reference for WriteClock: the pauses walked one by one (what it did before it bisected)."""

    def __init__(self, t0: int):
        self.t0, self.p = t0, []

    def writing_ms(self, t: float) -> float:
        w = t - self.t0
        for a, e in self.p:
            if a >= t:
                break
            w -= min(e, t) - a
        return w

    def at_writing_ms(self, w: float) -> float:
        t = self.t0 + w
        for a, e in self.p:
            if a >= t:
                break
            t += e - a
        return t

    def stop(self, t: int) -> None:
        self.p.append((t, float("inf")))

    def resume(self, t: int) -> None:
        a, _ = self.p.pop()
        if t > a:
            self.p.append((a, t))


def test_the_write_clock_bisects_to_the_same_times_as_walking_every_pause():
    """A disk that fills and is freed again and again makes many pauses: the clock bisects them (a walk over
    every pause at every step made a 7-day simulation on a 2 MB disk quadratic) and gives the same times."""
    import random

    from storelib.broker.expiry.diskfull import WriteClock

    for seed in range(200):
        r = random.Random(seed)
        t0 = r.randint(0, 100)
        clock, ref, t = WriteClock(t0), _ListClock(t0), t0
        n = r.randint(0, 12)
        for i in range(n):  # stops and resumes alternate (set_flag); the last pause may stay open
            t += r.randint(0, 50)
            clock.stop(t), ref.stop(t)
            if i < n - 1 or r.random() < 0.7:
                t += r.randint(0, 50)
                clock.resume(t), ref.resume(t)
        for q in [r.randint(t0 - 5, t + 100) for _ in range(30)] + [t0, t]:
            assert clock.writing_ms(q) == ref.writing_ms(q)
        for w in [r.randint(0, t - t0 + 100) for _ in range(30)] + [0]:
            assert clock.at_writing_ms(w) == ref.at_writing_ms(w)
