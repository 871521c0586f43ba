"""``expiry`` follows the Java cleaners' scheduling and disk-full rules that the event-jumping simulation
could get wrong: a delete round that outlasts its period (DLedger's CleanSpaceService waits 100 ms after
a round ENDS; the broker's scheduleAtFixedRate never overlaps runs), and writes refused while the disk is
marked full."""

from __future__ import annotations

import dataclasses

from storelib.broker.expiry.cleaner import simulate
from storelib.broker.expiry.expiry import Policy, TimeModel, load_snapshot
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
