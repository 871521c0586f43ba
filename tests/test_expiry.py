"""Expiry simulator: hand-computed timelines on tiny stores (store-algorithms §9).

The base store: 18 messages of 1000 bytes on T/0, four per 4096-byte segment, so segments 0..3 are
full and segment 4 (base 16384) holds offsets 16 and 17; message m of segment i was stored at
00:00 UTC + i h + m min on 2024-01-01, so the snapshot time is 04:01:00 and the cleaner's first run
is at 04:02:00 (+60 s), then every 10 s. File mtimes are each segment's last message time + 1 s
(i:03:01), so segment i passes a 1-hour reserved time at (i+1):03:01. CQ files hold 4 units (80 bytes).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from jobs.cli import main as cli_main
from storelib.broker.expiry.cleaner import describe, simulate
from storelib.broker.expiry.expiry import (
    Policy,
    TimeModel,
    hour_table,
    java_parse_int,
    load_snapshot,
    parse_time_ms,
)
from storelib.broker.settings.store import Store
from storelib.errors import StoreError
from tests.expiry_storegen import MIN, T0, H, Msg, broker_conf_text, build_store

SNAP = T0 + 4 * H + MIN  # 04:01:00
STATIC = TimeModel(ingest_bytes_per_s=0, consumption_msgs_per_s=0)


def at(h: int, m: int = 0, s: int = 0, ms: int = 0) -> int:
    return T0 + h * H + m * MIN + s * 1000 + ms


def base_messages() -> list[Msg]:
    return [Msg("T", 0, T0 + (m // 4) * H + (m % 4) * MIN) for m in range(18)]


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    st = build_store(root, base_messages(), offsets={"T@lag": {0: 2}, "T@fresh": {0: 18}},
                     index_ends=[5000, 13000, 18384])
    return root, st


def run(store, model=STATIC, **over):
    root, st = store
    pol = Policy.from_settings("p", st.with_overrides({k: v for k, v in over.items() if not k.startswith("_")}),
                               disk_capacity=over.get("_capacity"), manual_deletes=over.get("_manual", ()))
    return simulate(pol, load_snapshot(Store(root, st), mtimes=over.get("_mtimes", "auto")), model)


def cl_deletions(res):
    return [(d["time_ms"], d["file"].split("/")[-1], d["reason"]) for d in res["deletions"] if d["kind"] == "commitlog"]


def seg(i: int) -> str:
    return f"{i * 4096:020d}"


def test_time_deletion_waits_for_the_delete_when_hour_and_spaces_files_by_the_delete_interval(store):
    res = run(store, fileReservedTime=1, deleteWhen="05")
    # 05:00:00 is tick 348 (04:02:00 + 3480 s); all four old segments are past 1 h by then
    assert cl_deletions(res) == [(at(5), seg(0), "time"), (at(5, ms=100), seg(1), "time"),
                                 (at(5, ms=200), seg(2), "time"), (at(5, ms=300), seg(3), "time")]


def test_time_deletion_inside_the_hour_follows_each_segments_reserved_time(store):
    res = run(store, fileReservedTime=1, deleteWhen="04")
    # 04:02:00: segments 0-2 expired (their limits are 01:03:01, 02:03:01, 03:03:01); segment 3 only at
    # 04:03:01, so the next tick after that, 04:03:10
    assert cl_deletions(res) == [(at(4, 2), seg(0), "time"), (at(4, 2, ms=100), seg(1), "time"),
                                 (at(4, 2, ms=200), seg(2), "time"), (at(4, 3, 10), seg(3), "time")]


def test_newest_segment_is_never_deleted_even_when_expired(store):
    res = run(store, fileReservedTime=0, deleteWhen="04")
    names = [f for _t, f, _r in cl_deletions(res)]
    assert names == [seg(i) for i in range(4)]


def test_disk_pressure_deletes_outside_the_delete_when_hour(store):
    # used = 18384 (commitlog) + 18 * 20 (CQ) + 3 * 136 (index) = 19152; ceil(100*19152/24000) = 80 -> 0.80:
    # above 0.75 (space), below 0.85 (not forced): only expired files go, at the first tick
    res = run(store, fileReservedTime=1, deleteWhen="05", _capacity=24_000)
    assert cl_deletions(res) == [(at(4, 2), seg(0), "space"), (at(4, 2, ms=100), seg(1), "space"),
                                 (at(4, 2, ms=200), seg(2), "space"), (at(5), seg(3), "time")]
    assert res["disk_usage"][0]["ratio"] == 0.80
    assert res["summary"]["max_ratio"] == 0.80


def test_forced_cleaning_above_the_forcible_ratio_ignores_age(store):
    # 19152 / 21000 -> 92 % > 0.85: cleanImmediately; nothing is old (72 h) yet all but the newest go
    res = run(store, deleteWhen="05", _capacity=21_000)
    assert cl_deletions(res) == [(at(4, 2, ms=100 * i), seg(i), "forced") for i in range(4)]


def test_forced_cleaning_off_keeps_young_files(store):
    res = run(store, deleteWhen="05", cleanFileForciblyEnable="false", _capacity=21_000)
    # space-triggered runs delete only expired files: the first goes once 72 h have passed (a tick
    # after 03:03:01 on Jan 4th, while the disk is still over 75 %)
    assert cl_deletions(res)[0] == (at(72, 3, 10), seg(0), "space")


def test_batch_limit_per_round(tmp_path, store):
    root, st = store
    st5 = st.__class__.defaults("5").with_overrides(
        {"mappedFileSizeCommitLog": 4096, "mappedFileSizeConsumeQueue": 80, "maxHashSlotNum": 4,
         "maxIndexNum": 4, "fileReservedTime": 1, "deleteWhen": "05", "deleteFileBatchMax": 3})
    res = simulate(Policy.from_settings("b", st5), load_snapshot(Store(root, st5)), STATIC)
    assert cl_deletions(res) == [(at(5), seg(0), "time"), (at(5, ms=100), seg(1), "time"),
                                 (at(5, ms=200), seg(2), "time"), (at(5, 0, 10), seg(3), "time")]
    # 4.9.8 ignores deleteFileBatchMax (constant 10)
    res4 = run(store, fileReservedTime=1, deleteWhen="05", deleteFileBatchMax=3)
    assert len({t // 1000 for t, _f, _r in cl_deletions(res4)}) == 1


def test_consume_queue_and_index_files_follow_the_new_min_offset(store):
    res = run(store, fileReservedTime=1, deleteWhen="04")
    rest = [(d["time_ms"], d["file"]) for d in res["deletions"] if d["kind"] != "commitlog"]
    # after 04:02:00.200, M = 12288: CQ files 0..2 hold offsets 0..11 (all below M); index files with
    # endPhyOffset 5000 and 13000 -> only the first goes (13000 >= M); the last index file never goes
    # (the cleaner slept 100 ms after segment 2 because segment 3 was still a candidate: 04:02:00.300)
    t1 = at(4, 2, ms=300)
    # after 04:03:10, M = 16384: CQ file 3 (offsets 12..15) and index file 2 (13000 < M) go; CQ file 4
    # holds the queue's last entry and stays
    t2 = at(4, 3, 10)
    # the queue that deleted is followed by deleteConsumeQueueFilesInterval (100 ms), then the index files
    assert rest == [(t1, "consumequeue/T/0/00000000000000000000"), (t1, "consumequeue/T/0/00000000000000000080"),
                    (t1, "consumequeue/T/0/00000000000000000160"), (t1 + 100, "index/20240101000000000"),
                    (t2, "consumequeue/T/0/00000000000000000240"), (t2 + 100, "index/20240101000000001")]


def test_lagging_group_loses_an_exact_offset_range_and_an_up_to_date_group_nothing(store):
    res = run(store, fileReservedTime=1, deleteWhen="04")
    g = {x["group"]: x for x in res["groups"]}
    assert g["lag"]["lost_offsets"] == [[2, 15]]
    assert g["lag"]["lost_messages"] == 14
    assert g["lag"]["lost_bytes"] == 14 * 1000
    assert g["lag"]["first_loss_ms"] == at(4, 2)
    assert g["fresh"]["lost_messages"] == 0 and g["fresh"]["lost_offsets"] == []
    assert res["summary"]["groups_with_loss"] == 1


def test_consuming_group_loses_only_what_it_had_not_read_at_each_deletion(store):
    # 1 msg/s: at 04:02:00 the group (offset 2 at 04:01:00) is at 62 -> capped at the queue end (18)
    res = run(store, TimeModel(ingest_bytes_per_s=0, consumption_msgs_per_s=0.05), fileReservedTime=1,
              deleteWhen="04")
    g = {x["group"]: x for x in res["groups"]}
    # 0.05 msg/s: offset 2 at 04:01:00 -> 5 at 04:02:00, so segment 0 (offsets 0..3) costs nothing;
    # segment 1 at .100 loses 5..7 and the group resumes at 8; segment 2 at .200 loses 8..11, resume at
    # 12; at 04:03:10 it has read 12 + 0.05 * 69.8 = 15.49 -> offset 15: segment 3 loses only 15
    assert g["lag"]["lost_offsets"] == [[5, 11], [15, 15]]
    assert g["lag"]["lost_messages"] == 8


def test_mtimes_lost_in_a_copy_are_rebuilt_from_store_times(tmp_path):
    root = tmp_path / "store"
    st = build_store(root, base_messages(), mtimes={i: 0 for i in range(5)})  # tar with epoch dates
    snap = load_snapshot(Store(root, st))
    assert snap.mtime_source == "store_time"
    assert [int(x) for x in snap.seg_mtime[:4]] == [at(i, 3) for i in range(4)]
    pol = Policy.from_settings("p", st.with_overrides({"fileReservedTime": 1, "deleteWhen": "04"}))
    res = simulate(pol, snap, STATIC)
    # segment 3 expires at 04:03:00 exactly: a tick (04:02:00 + 60 s) -> deleted then, not at 04:03:10
    assert cl_deletions(res)[-1] == (at(4, 3), seg(3), "time")
    # a copy that set every mtime to the copy time (later than the next segment's first message)
    root2 = tmp_path / "store2"
    build_store(root2, base_messages(), mtimes={i: at(30) for i in range(5)})
    assert load_snapshot(Store(root2, st)).mtime_source == "store_time"
    assert load_snapshot(Store(root2, st), mtimes="file").mtime_source == "file"


def test_manual_delete_runs_the_cleaner_twenty_times_outside_the_hour(store):
    res = run(store, fileReservedTime=1, deleteWhen="09", _manual=(at(4, 5),))
    assert cl_deletions(res) == [(at(4, 5, ms=100 * i), seg(i), "manual") for i in range(4)]
    # a manual request whose 20 runs (04:02:00..04:05:10) end before anything expires deletes nothing
    res = run(store, fileReservedTime=5, deleteWhen="09", _manual=(at(4, 2),))
    assert [d for d in cl_deletions(res) if d[0] < at(9)] == []


def test_segments_arriving_at_the_ingest_rate_expire_after_they_fill(store):
    # 1000 B/s from 04:01:00, W0 = 18384: segment k (base 4096 k) fills at +(4096 (k+1) - 18384) ms, i.e.
    # segments 4..8 at +2.096, +6.192, +10.288, +14.384, +18.480 s; with a 1 h reserved time and every
    # hour a deleteWhen hour, each goes at the first tick (or 100-ms step in it) after fill + 1 h
    every = ";".join(str(h) for h in range(24))
    res = run(store, TimeModel(ingest_bytes_per_s=1000, consumption_msgs_per_s=0,
                               until_ms=at(5, 1, 25)), fileReservedTime=1, deleteWhen=every)
    late = [d for d in cl_deletions(res) if d[0] > at(5)]
    assert late == [(at(5, 1, 10), seg(4), "time"), (at(5, 1, 10, 100), seg(5), "time"),
                    (at(5, 1, 20), seg(6), "time"), (at(5, 1, 20, 100), seg(7), "time"),
                    (at(5, 1, 20, 200), seg(8), "time")]
    g = {x["group"]: x for x in res["groups"]}
    # projected positions: 18 messages per 18384 bytes, so segment 9 (base 36864) starts at offset
    # 18 + floor(18480 * 18 / 18384) = 36; a stopped consumer loses everything before it
    assert g["lag"]["lost_offsets"] == [[2, 35]]
    assert g["fresh"]["lost_offsets"] == [[18, 35]] and g["fresh"]["lost_messages"] == 18
    assert g["fresh"]["lost_bytes"] == 18 * 1000  # projected messages have the queue's mean size


def test_delete_when_parsing_matches_integer_parse_int():
    table, problem = hour_table("04;x")
    assert table[4] == 1 and table[5] == 2 and problem
    # "+4" parses as 4 (Integer.parseInt takes a sign) and String.split drops the trailing empty parts,
    # so only hour 4 deletes and no part throws
    table, problem = hour_table("+4;;")
    assert table == [1 if h == 4 else 0 for h in range(24)] and problem is None
    assert hour_table(";4")[0][4] == 2  # empty first part throws before "4" is reached
    assert hour_table("4;")[0][4] == 1  # trailing empty parts are dropped by String.split
    assert java_parse_int("+07") == 7
    for bad in (" 4", "4 ", "", "0x4", "2147483648"):
        with pytest.raises(ValueError):
            java_parse_int(bad)


def test_bad_delete_when_part_aborts_the_whole_run_including_space_deletion(store):
    res = run(store, fileReservedTime=1, deleteWhen="05;x", _capacity=24_000)
    # 04:xx: "05" does not match, "x" throws -> no run at all, not even for disk space; at 05:00 the
    # first part matches before "x" is reached
    assert [t for t, _f, _r in cl_deletions(res)][0] == at(5)
    assert res["warnings"]


def test_jvm_time_zone_moves_the_delete_when_hour(store):
    root, st = store
    pol = Policy.from_settings("tz", st.with_overrides({"fileReservedTime": 1, "deleteWhen": "06"}),
                               tz="Europe/Berlin")  # 06:00 CET = 05:00 UTC
    res = simulate(pol, load_snapshot(Store(root, st)), STATIC)
    assert cl_deletions(res)[0][0] == at(5)


def test_v5_clamps_ratios_and_space_flow(store):
    root, st = store
    st5 = st.__class__.defaults("5").with_overrides(
        {"mappedFileSizeCommitLog": 4096, "mappedFileSizeConsumeQueue": 80, "maxHashSlotNum": 4,
         "maxIndexNum": 4, "deleteWhen": "09", "diskSpaceCleanForciblyRatio": 95, "diskMaxUsedSpaceRatio": 99})
    pol = Policy.from_settings("v5", st5, disk_capacity=21_000)
    assert pol.force_ratio == 0.85 and pol.disk_max_used_space_ratio == 95
    res = simulate(pol, load_snapshot(Store(root, st5)), STATIC)
    assert [r for _t, _f, r in cl_deletions(res)] == ["forced"] * 4


def test_time_parsing():
    assert parse_time_ms("2024-01-01T04:00:00Z") == at(4)
    assert parse_time_ms("2024-01-01T05:00:00+01:00") == at(4)
    assert parse_time_ms(str(at(4))) == at(4)


def test_cli_json_and_html(store, tmp_path, capsys):
    root, st = store
    conf = tmp_path / "broker.conf"
    conf.write_text(broker_conf_text(st))
    p1 = tmp_path / "keep1h.conf"
    p1.write_text("fileReservedTime=1\ndeleteWhen=05\n")
    p2 = tmp_path / "forced.conf"
    p2.write_text("deleteWhen=05\ndiskCapacity=21000\n")
    html = tmp_path / "r.html"
    rc = cli_main(["expiry", str(root), "--broker-conf", str(conf), "--policy", str(p1), "--policy", str(p2),
                   "--ingest", "0", "--consumption", "0", "--json", "--html", str(html)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    names = [p["name"] for p in out["policies"]]
    assert names == ["keep1h.conf", "forced.conf"]
    first = out["policies"][0]
    assert [d["file"] for d in first["deletions"] if d["kind"] == "commitlog"] == [
        f"commitlog/{seg(i)}" for i in range(4)]
    assert {d["reason"] for d in out["policies"][1]["deletions"] if d["kind"] == "commitlog"} == {"forced"}
    lag = next(g for g in first["groups"] if g["group"] == "lag")
    assert lag["lost_offsets"] == [[2, 15]] and lag["first_loss_ms"] == at(5)
    text = html.read_text()
    assert "<svg" in text and "keep1h.conf" in text
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    rc = cli_main(["expiry", str(root), "--broker-conf", str(conf), "--policy", str(p1), "--ingest", "0"])
    assert rc == 0
    assert "keep1h.conf" in capsys.readouterr().out


def test_cli_policies_run_on_every_engine_with_the_same_report(store, tmp_path, capsys):
    root, st = store
    conf = tmp_path / "broker.conf"
    conf.write_text(broker_conf_text(st))
    policies = []
    for i, text in enumerate(["fileReservedTime=1\ndeleteWhen=05\n", "deleteWhen=05\ndiskCapacity=21000\n",
                              "fileReservedTime=0\ndeleteWhen=04;05;06\n"]):
        (tmp_path / f"p{i}.conf").write_text(text)
        policies += ["--policy", str(tmp_path / f"p{i}.conf")]
    reports = {}
    for engine in ("local", "pool", "auto"):  # auto: three policies, no master -> the pool
        assert cli_main(["expiry", str(root), "--broker-conf", str(conf), *policies, "--ingest", "0",
                         "--consumption", "0", "--json", "--engine", engine, "--workers", "2"]) == 0
        reports[engine] = json.loads(capsys.readouterr().out)
    assert reports["local"] == reports["pool"] == reports["auto"]
    assert [p["name"] for p in reports["local"]["policies"]] == ["p0.conf", "p1.conf", "p2.conf"]
    assert reports["local"]["simulation"]["segments"]  # described once, from the store's snapshot
    assert len({json.dumps(p["summary"]) for p in reports["local"]["policies"]}) == 3


def test_cli_bad_input_is_one_line_error(store, tmp_path, capsys):
    root, _st = store
    assert cli_main(["expiry", str(root), "--ingest", "fast"]) == 2
    assert "--ingest" in capsys.readouterr().err
    assert cli_main(["expiry", str(tmp_path / "nope")]) == 2


def test_no_consume_queue_falls_back_to_a_commitlog_scan(store):
    root, st = store
    import shutil

    shutil.rmtree(Path(root) / "consumequeue")
    res = run(store, fileReservedTime=1, deleteWhen="04")
    g = {x["group"]: x for x in res["groups"]}
    assert g["lag"]["lost_offsets"] == [[2, 15]]
    assert not [d for d in res["deletions"] if d["kind"] == "consumequeue"]  # no CQ files to delete


def _ticking(policy, snap, model):
    """The broker's literal schedule: every tick run, no skipping, a tick that passed during a long run
    starting when it ends (the oracle for the event jumps)."""
    from storelib.broker.expiry.cleaner import CleanerSim

    sim = CleanerSim(policy, snap, model)
    sim._sample(sim.start)
    for k in range(sim.kmax + 1):
        t = max(sim.tick(k), sim.busy_until)
        if t <= sim.until:
            sim.run_tick(t)
    sim._sample(sim.until)
    return sim.result()


@pytest.mark.parametrize("over", [
    {"fileReservedTime": 1, "deleteWhen": "05;17"},
    {"fileReservedTime": 0, "deleteWhen": "04;x"},
    {"fileReservedTime": 2, "deleteWhen": "9", "_capacity": 40_000},
    {"fileReservedTime": 72, "deleteWhen": "05", "_capacity": 30_000},
    {"fileReservedTime": 1, "deleteWhen": "23", "diskMaxUsedSpaceRatio": 50, "_capacity": 60_000,
     "cleanFileForciblyEnable": "false"},
    {"fileReservedTime": 3, "deleteWhen": "05", "_manual": (at(4, 30), at(7, 0, 5))},
])
def test_event_jumps_equal_running_every_tick(store, over):
    root, st = store
    pol = Policy.from_settings("p", st.with_overrides({k: v for k, v in over.items() if not k.startswith("_")}),
                               disk_capacity=over.get("_capacity"), manual_deletes=over.get("_manual", ()))
    snap = load_snapshot(Store(root, st))
    model = TimeModel(ingest_bytes_per_s=2.5, consumption_msgs_per_s=0.001, until_ms=at(30))
    fast = simulate(pol, snap, model)
    assert fast == _ticking(pol, snap, model)
    assert fast["summary"]["commitlog_deleted"] > 0


def _generated_store(root: Path):
    """A busier store: 400 messages on two topics x two queues, sizes 402..1301 bytes, one every 90 s."""
    msgs = [Msg("A" if m % 3 else "B", m % 2, T0 + m * 90_000, body=300 + (m * 37) % 900) for m in range(400)]
    st = build_store(root, msgs, offsets={"A@g1": {0: 10, 1: 50}, "B@g2": {0: 0, 1: 60}, "A@g3": {0: 200, 1: 200},
                                          "Gone@g4": {0: 5}}, index_ends=[20000, 100000, 200000])
    return st


def test_the_policy_grid_equals_each_policy_run_alone_on_every_engine(tmp_path, spark):
    from jobs.engines.schedulers import LocalEngine, PoolEngine, SparkEngine
    from jobs.expiry import run_grid
    from storelib.broker.expiry.expirygrid import grid_policies

    root = tmp_path / "gen"
    st = _generated_store(root)
    every = ";".join(str(h) for h in range(24))
    policies = grid_policies(st, [0, 1, 6, 24], ["04", "05;17", "x;3", every], [40, 75, 95],
                             [None, 150_000, 400_000])
    assert len(policies) >= 100
    model = TimeModel(ingest_bytes_per_s=2.0, consumption_msgs_per_s=0.004, until_ms=T0 + 3 * 24 * H)
    snap = load_snapshot(Store(root, st))
    alone = [json.loads(json.dumps(simulate(p, snap, model))) for p in policies]
    for engine in (LocalEngine(), PoolEngine(2), SparkEngine(spark)):
        try:
            grid = run_grid(engine, [str(root)], policies, model, st, slices=6, describe=True)
        finally:
            engine.close()
        assert [dict((k, v) for k, v in r.items() if k != "store") for r in grid.results] == alone, engine.name
        # each store described once, by the slice holding its first policy
        assert grid.described == {str(root): json.loads(json.dumps(describe(snap, model, policies[0])))}, engine.name
    # the grid is not degenerate: policies differ, with every kind of deletion and some losses
    reasons = {k for r in alone for k, v in r["summary"]["by_reason"].items() if v}
    assert reasons >= {"time", "space", "forced"}
    assert len({json.dumps(r["summary"]) for r in alone}) > 20
    assert any(r["summary"]["lost_messages"] for r in alone)


def test_real_sample_copy_has_lost_mtimes_and_a_burst_shortens_the_default_horizon(sample_498):
    from storelib.broker.settings.brokerconf import load_broker_conf
    from tests.conftest import broker_conf

    st = load_broker_conf(str(broker_conf("4.9.8")))
    snap = load_snapshot(Store(sample_498 / "store", st))
    # the tarball carries 1970 dates: every closed segment's time comes from its last message
    assert snap.mtime_source == "store_time"
    assert all(m > 1_600_000_000_000 for m in snap.seg_mtime)
    pol = Policy.from_settings("p", st.with_overrides({"deleteWhen": "04"}), disk_capacity=3_000_000)
    # written in about a second: the observed rate is not a forecast; with the defaults the what-if still
    # answers, over the horizon in which the simulated segments stay worth computing, and says so
    sim = describe(snap, TimeModel(), pol)
    assert sim["horizon_source"].startswith("shortened from 7 days")
    assert sim["until_ms"] - sim["snapshot_ms"] < 7 * 24 * H
    assert simulate(pol, snap)["summary"]["commitlog_deleted"] > 0
    with pytest.raises(ValueError, match="ingest"):  # an explicit --until that far is refused, with the fix
        simulate(pol, snap, TimeModel(until_ms=snap.last_store_ms + 7 * 24 * H))
    res = simulate(pol, snap, TimeModel(ingest_bytes_per_s=100, until_ms=snap.last_store_ms + 2 * 24 * H))
    assert res["summary"]["by_reason"]["forced"] > 0
    assert all(d["file"] != "commitlog/" + f"{int(snap.seg_base[-1]):020d}" or d["time_ms"] > snap.last_store_ms
               for d in res["deletions"])


def test_the_grid_job_runs_without_spark_and_writes_one_line_per_store_and_policy(tmp_path, capsys):
    from jobs.expiry import main

    root = tmp_path / "gen"
    _generated_store(root)
    outs = {}
    for engine in ("local", "auto"):  # auto: no master, more than one pair -> the process pool
        out = tmp_path / f"grid-{engine}.jsonl"
        assert main([str(root), "--reserved", "1,24", "--max-ratio", "40,95", "--until", "2024-01-04T00:00:00Z",
                     "--disk-other-used", "1k", "--out", str(out), "--engine", engine]) == 0  # the command's units
        outs[engine] = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(outs["local"]) == 4 and outs["local"] == outs["auto"]
    assert [r["name"] for r in outs["local"]] == [f"reserved={h}h when=04 max={m}% cap=-" for h in (1, 24) for m in (40, 95)]
    assert "4 policies" in capsys.readouterr().out


@pytest.mark.parametrize("tz,hour", [("+01:00", 5), ("GMT+1", 5), ("UTC-02:30", 8), ("Z", 6), ("GMT", 6)])
def test_jvm_time_zone_takes_offsets_and_utc_spellings(store, tz, hour):
    """``--tz``/``jvmTimeZone`` read by storelib.units.parse_zone, as ``rebuild --tz`` is: offsets too."""
    root, st = store
    pol = Policy.from_settings("tz", st.with_overrides({"fileReservedTime": 1, "deleteWhen": "06"}), tz=tz)
    res = simulate(pol, load_snapshot(Store(root, st)), STATIC)
    first = cl_deletions(res)[0][0]
    assert first == at(hour, 30 if tz == "UTC-02:30" else 0)


def test_a_bad_jvm_time_zone_is_the_policys_error(store):
    root, st = store
    with pytest.raises(StoreError, match="not a time zone"):
        Policy.from_settings("tz", st, tz="Mars/Olympus")


def test_the_commands_default_zone_is_the_hosts_as_a_jvm_here_would_use(store, monkeypatch):
    """``expiry --tz`` defaults to ``local`` (like ``rebuild --tz``): deleteWhen fires in the JVM's zone."""
    from jobs.expiry import add_model_args

    root, st = store
    p = argparse.ArgumentParser()
    add_model_args(p)
    default = p.parse_args([]).tz
    assert default == "local"
    monkeypatch.setenv("TZ", "Etc/GMT-1")  # POSIX sign: one hour east of UTC, like +01:00
    pol = Policy.from_settings("tz", st.with_overrides({"fileReservedTime": 1, "deleteWhen": "06"}), tz=default)
    res = simulate(pol, load_snapshot(Store(root, st)), STATIC)
    assert cl_deletions(res)[0][0] == at(5, 0)
