"""The 5.x timer store, read: the real 5.3.3 timer sample (written by 5.3.3's own TimerMessageStore and
exported by that code) matches field by field; hostile timer files give findings, never a crash or a hang."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jobs.cli import main
from storelib.broker.settings.store import Store, load_settings
from storelib.broker.timer.timermsg import timer_messages
from storelib.fileio.bytesource import resolve
from storelib.format.timerstore import (
    UNIT_SIZE,
    read_timer_checkpoint,
    read_timer_metrics,
    read_timerlog,
    read_wheel,
)
from tests.conftest import extract_sample


@pytest.fixture(scope="module")
def timer_sample(tmp_path_factory) -> Path:
    return extract_sample("timer", tmp_path_factory.mktemp("timer"))


def expected(sample: Path, name: str):
    p = sample / "expected" / name
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return json.loads(p.read_text())


UNIT_FIELDS = {"pos": "pos", "file": "file", "fileOffset": "file_offset", "prevPos": "prev_pos", "magic": "magic",
               "currWriteTimeMs": "curr_write_ms", "delayedTime": "delayed_time", "slotTimeMs": "slot_time_ms",
               "offsetPy": "offset_py", "sizePy": "size_py", "hashCodeOfRealTopic": "hash_real_topic",
               "reserved": "reserved"}


def test_timerlog_units_match_the_broker_export_field_by_field(timer_sample):
    log = read_timerlog(resolve(str(timer_sample / "store")), 8192)
    want = [u for u in expected(timer_sample, "timerlog.jsonl") if u["type"] == "unit"]
    got = log.units.to_pylist()
    assert len(got) == len(want) == 320 and not log.findings
    for w, g in zip(want, got):
        assert {k: w[k] for k in UNIT_FIELDS} == {k: g[v] for k, v in UNIT_FIELDS.items()}
        assert g["roll"] == ("ROLL" in w["magicFlags"])
    blanks = [u for u in expected(timer_sample, "timerlog.jsonl") if u["type"] == "blank"]
    ends = [(f["file"], f["end"], f["end_offset"]) for f in log.files]
    assert [(b["file"], "blank", b["fileOffset"]) for b in blanks] == ends[:2]
    summary = expected(timer_sample, "export_summary.json")
    assert [f["units"] for f in log.files] == [f["units"] for f in summary["timerlogFiles"]]


def test_wheel_slots_and_their_chains_match(timer_sample):
    root = resolve(str(timer_sample / "store"))
    log = read_timerlog(root, 8192)
    wheel, findings = read_wheel(root, log, 1000)
    want = expected(timer_sample, "timerwheel.json")
    got = {r["index"]: r for r in wheel.to_pylist()}
    assert not findings and len(got) == want["nonEmptySlotCount"] == 78
    assert sum(r["num"] for r in got.values()) == want["sumNum"] == 320
    for s in want["slots"]:
        g = got[s["index"]]
        assert (g["time_ms"], g["first_pos"], g["last_pos"], g["num"], g["magic"], g["file_offset"]) == \
            (s["timeMs"], s["firstPos"], s["lastPos"], s["num"], s["magic"], s["fileOffset"])
        assert g["index_matches_time"] == s["getSlotConsistent"] and g["chain_length"] == s["chainLength"]
        assert g["chain_ok"]


def test_timercheck_and_timermetrics_match(timer_sample):
    root = resolve(str(timer_sample / "store"))
    cp = read_timer_checkpoint(root)
    want = expected(timer_sample, "timercheck.json")
    assert (cp.last_read_time_ms, cp.last_timer_log_flush_pos, cp.last_timer_queue_offset,
            cp.master_timer_queue_offset) == (want["lastReadTimeMs"], want["lastTimerLogFlushPos"],
                                              want["lastTimerQueueOffset"], want["masterTimerQueueOffset"])
    assert (cp.state_version, cp.timestamp, cp.counter) == (want["dataVersion"]["stateVersion"],
                                                            want["dataVersion"]["timestamp"], want["dataVersion"]["counter"])
    counts, findings = read_timer_metrics(root)
    assert counts == expected(timer_sample, "timermetrics.json")["timingCount"] and not findings


def test_pending_and_delivered_timers_match_field_by_field(timer_sample):
    root = resolve(str(timer_sample / "store"))
    store = Store(root, load_settings(None, None, None, root))
    rows = {r["uniq_key"]: r for r in timer_messages(store, read_timerlog(root, 8192)).to_pylist()}
    pending, delivered = expected(timer_sample, "pending.jsonl"), expected(timer_sample, "delivered.jsonl")
    assert len(rows) == len(pending) + len(delivered) == 320
    for e in pending:
        g = rows[e["uniqKey"]]
        assert (g["state"], g["real_topic"], g["real_queue_id"], g["deliver_time_ms"], g["timer_phy_offset"],
                g["timer_size"], g["timer_queue_offset"], g["timerlog_positions"]) == \
            ("pending", e["realTopic"], e["realQueueId"], e["deliverTimeMs"], e["timerTopicPhyOffset"],
             e["timerTopicSize"], e["timerTopicQueueOffset"], e["timerlogUnitPositions"])
    for e in delivered:
        g = rows[e["uniqKey"]]
        assert (g["state"], g["delivered_phy_offset"], g["delivered_size"], g["delivered_topic"],
                g["delivered_queue_id"], g["delivered_queue_offset"], g["delivered_store_timestamp"],
                g["delivered_msg_id"], str(g["enqueue_ms"]), str(g["dequeue_ms"]), g["delivered_records"]) == \
            ("delivered", e["deliveredPhyOffset"], e["deliveredSize"], e["deliveredTopic"], e["deliveredQueueId"],
             e["deliveredQueueOffset"], e["deliveredStoreTimestamp"], e["deliveredOffsetMsgId"], e["timerEnqueueMs"],
             e["timerDequeueMs"], e["deliveredRecordCount"])


def test_the_timers_command(timer_sample, tmp_path, capsys):
    store = timer_sample / "store"
    assert main(["timers", str(store)]) == 0
    out = capsys.readouterr().out
    assert "182 pending, 138 delivered" in out and "CouponExpiry 89, ShipmentTracking 93" in out
    assert main(["timers", str(store), "--state", "delivered", "--topic", "CouponExpiry", "--format", "jsonl"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines and all(r["state"] == "delivered" and r["real_topic"] == "CouponExpiry" for r in lines)
    assert main(["timers", str(store), "--until", "2026-11-25T00:00:00Z", "--format", "parquet", "--out",
                 str(tmp_path / "due.parquet")]) == 0
    t = pq.read_table(tmp_path / "due.parquet")
    assert t.num_rows and max(t.column("deliver_time_ms").to_pylist()) < 1795651200000
    assert main(["timers", str(store), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["pending"] == 182 and sum(h["pending"] for h in doc["histogram_hourly"]) == 182


def test_a_store_without_a_timer_store_says_so(sample_498, capsys):
    assert main(["timers", str(sample_498 / "store")]) == 0
    assert "has no timer store" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# hostile timer files


@pytest.fixture
def copy(timer_sample, tmp_path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(timer_sample / "store", root)
    return root


def _poke(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_a_bad_unit_is_a_finding_and_the_next_units_are_still_read(copy):
    _poke(copy / "timerlog" / "00000000000000000000", 5 * UNIT_SIZE + 12, struct.pack(">i", 0x55))
    log = read_timerlog(resolve(str(copy)), 8192)
    assert [f.kind for f in log.findings][:1] == ["bad_timerlog_unit"] and log.findings[0].offset == 5 * UNIT_SIZE
    assert log.units.num_rows == 319


def test_chains_that_loop_or_leave_the_timerlog_are_findings_not_hangs(copy):
    root = resolve(str(copy))
    log = read_timerlog(root, 8192)
    u = log.units.to_pylist()
    last = u[-1]
    # the last unit points at itself (a loop) and another unit points past the timerlog
    _poke(copy / "timerlog" / "00000000000000016384", last["file_offset"] + 4, struct.pack(">q", last["pos"]))
    _poke(copy / "timerlog" / "00000000000000000000", 4, struct.pack(">q", 10**9))
    log = read_timerlog(root, 8192)
    assert sum(f.kind == "timerlog_bad_prev" for f in log.findings) == 2
    wheel, findings = read_wheel(root, log, 1000)
    assert wheel.num_rows == 78 and any(f.kind == "timerwheel_chain" for f in findings)


def test_a_slot_outside_the_wheel_is_clear(copy):
    with open(copy / "timerwheel", "r+b") as f:
        f.truncate(1000)
    root = resolve(str(copy))
    _, findings = read_wheel(root, read_timerlog(root, 8192), 1000)
    assert findings[0].kind == "timerwheel_size"


# ------------------------------------------------------------------------------------------------
# audit


def _audit(root: Path) -> dict:
    from jobs.audit import audit_store

    return audit_store(str(root), quiet=True)


def test_audit_of_the_real_timer_store_has_no_errors_and_reports_it(timer_sample):
    rep = _audit(timer_sample / "store")
    assert not [f for f in rep["findings"] if f["severity"] in ("error", "critical")]
    assert rep["timer_store"]["timerlog_units"] == 320 and rep["timer_store"]["wheel_slots_used"] == 78


def test_audit_finds_units_past_the_commitlog_mismatched_units_and_a_checkpoint_ahead(copy):
    tl = copy / "timerlog" / "00000000000000000000"
    _poke(tl, 0 * UNIT_SIZE + 28, struct.pack(">q", 10**12))  # offsetPy of unit 0: past the commitlog's end
    _poke(tl, 1 * UNIT_SIZE + 36, struct.pack(">i", 7))  # sizePy of unit 1
    _poke(copy / "config" / "timercheck", 16, struct.pack(">q", 10_000))  # lastTimerQueueOffset
    rep = _audit(copy)
    got = {(f["kind"], f["file"], f["offset"]) for f in rep["findings"] if f["kind"].startswith("timer")}
    assert ("timer_unit_past_commitlog", "timerlog/00000000000000000000", 0) in got
    assert ("timer_unit_mismatch", "timerlog/00000000000000000000", UNIT_SIZE) in got
    assert ("timercheck_ahead", "config/timercheck", 16) in got
    assert rep["timer_store"]["units_past_commitlog"] == 1


# ------------------------------------------------------------------------------------------------
# data source


def test_read_timers_has_the_commands_rows_and_a_typed_deliver_time(timer_sample):
    import datasources as ds

    t = ds.read_timers(str(timer_sample / "store"))
    assert t.num_rows == 320 and str(t.schema.field("deliver_time").type) == "timestamp[us, tz=UTC]"
    r = t.slice(0, 1).to_pylist()[0]
    assert int(r["deliver_time"].timestamp() * 1000) == r["deliver_time_ms"]


@pytest.mark.spark
def test_rocketmq_timers_data_source(spark, timer_sample):
    import datasources as ds

    ds.register(spark)
    df = spark.read.format("rocketmq.timers").load(str(timer_sample / "store"))
    got = {r.state: r.n for r in df.groupBy("state").count().withColumnRenamed("count", "n").collect()}
    assert got == {"pending": 182, "delivered": 138}
    assert dict(df.dtypes)["timerlog_positions"] == "array<bigint>"


# ------------------------------------------------------------------------------------------------
# expiry


def test_timer_losses_count_pending_timers_whose_segment_goes_before_their_deliver_time():
    import pyarrow as pa

    from storelib.broker.timer.timermsg import TIMER_SCHEMA, timer_losses

    rows = [{"uniq_key": k, "state": st, "real_topic": t, "deliver_time_ms": due, "timer_phy_offset": phy}
            for k, st, t, due, phy in [("a", "pending", "T1", 5_000, 10), ("b", "pending", "T1", 1_000, 20),
                                      ("c", "pending", "T2", 9_000, 1_048_576 + 5), ("d", "delivered", "T1", 9_000, 30)]]
    t = pa.Table.from_pylist(rows, schema=TIMER_SCHEMA)
    dels = [{"time_ms": 2_000, "file": "commitlog/00000000000000000000", "kind": "commitlog"}]
    got = timer_losses(t, dels, 1_048_576, {"T1": ["g2", "g1"]})
    assert got["lost_timers"] == 1 and got["pending"] == 3  # "a": due 5000 after the deletion at 2000
    assert got["by_topic"] == {"T1": {"lost_timers": 1, "first_loss_ms": 2_000, "groups": ["g1", "g2"]}}


def test_expiry_reports_lost_timers_per_policy_and_as_a_metric(timer_sample, tmp_path, capsys):
    from prometheus_client.parser import text_string_to_metric_families

    pol = tmp_path / "keep1h.conf"
    pol.write_text("fileReservedTime=1\n")
    mf = tmp_path / "m.prom"
    assert main(["expiry", str(timer_sample / "store"), "--policy", str(pol), "--disk-capacity", "2MB", "--json",
                 "--metrics-file", str(mf)]) == 0
    rep = json.loads(capsys.readouterr().out)
    tl = rep["policies"][0]["timers"]
    assert tl["pending"] == 182 and tl["lost_timers"] == 182
    assert set(tl["by_topic"]) == {"CouponExpiry", "ShipmentTracking"}
    fams = {f.name: f for f in text_string_to_metric_families(mf.read_text())}
    assert fams["rmqstore_expiry_lost_timers"].samples[0].value == 182


def test_audit_counts_pending_timers_that_outlive_retention_as_the_export_says(timer_sample):
    units = {u["pos"]: u for u in expected(timer_sample, "timerlog.jsonl") if u["type"] == "unit"}
    want = sum(1 for r in expected(timer_sample, "pending.jsonl")
               if r["deliverTimeMs"] - units[r["timerlogUnitPositions"][-1]]["currWriteTimeMs"] > 72 * 3_600_000)
    rep = _audit(timer_sample / "store")
    f = [f for f in rep["findings"] if f["kind"] == "timer_outlives_retention"]
    assert want > 0 and len(f) == 1 and f[0]["extra"]["count"] == want and f[0]["severity"] == "warning"


# ------------------------------------------------------------------------------------------------
# writers: the bytes 5.3.3 wrote


def test_timer_files_written_from_what_was_read_are_byte_identical_to_the_brokers(timer_sample, tmp_path):
    import filecmp

    from storelib.format.timerstore import encode_timer_metrics, write_timer_store

    store = timer_sample / "store"
    root = resolve(str(store))
    log = read_timerlog(root, 8192)
    wheel, _ = read_wheel(root, log, 1000)
    written = write_timer_store(str(tmp_path), log.units, wheel, read_timer_checkpoint(root), file_size=8192)
    rels = [os.path.relpath(p, tmp_path) for p in written]
    assert rels == ["timerlog/00000000000000000000", "timerlog/00000000000000008192", "timerlog/00000000000000016384",
                    "timerwheel", "config/timercheck"]
    for rel in rels:
        assert filecmp.cmp(tmp_path / rel, store / rel, shallow=False), rel
    m = json.loads((store / "config" / "timermetrics").read_text())
    text = encode_timer_metrics({k: (v["count"], v["timeStamp"]) for k, v in m["timingCount"].items()},
                                (m["dataVersion"]["counter"], m["dataVersion"]["stateVersion"],
                                 m["dataVersion"]["timestamp"]))
    assert text == (store / "config" / "timermetrics").read_text()


# ------------------------------------------------------------------------------------------------
# recovery (TimerMessageStore.recover)


def test_recover_plan_of_the_clean_timer_store_changes_nothing(timer_sample, capsys):
    assert main(["recover", str(timer_sample / "store"), "--json"]) in (0, 1)
    ts = json.loads(capsys.readouterr().out)["timer_store"]
    assert ts["process_offset"] == 16696 == read_timer_checkpoint(resolve(str(timer_sample / "store"))).last_timer_log_flush_pos
    assert ts["delete_files"] == [] and ts["slots_rewritten"] == 0 and ts["queue_offset"] == 320


def test_a_torn_unit_and_a_dirty_file_are_recovered_as_the_broker_does_and_restored(copy, timer_sample, tmp_path,
                                                                                     capsys):
    _poke(copy / "timerlog" / "00000000000000016384", 312 - UNIT_SIZE, b"\0" * UNIT_SIZE)  # the last unit torn
    shutil.copyfile(copy / "timerlog" / "00000000000000016384", copy / "timerlog" / "00000000000000024576")
    units = {u["pos"]: u for u in expected(timer_sample, "timerlog.jsonl") if u["type"] == "unit"}
    queue_of = {m["phyOffset"]: m["queueOffset"] for m in expected(timer_sample, "messages.jsonl") if m["type"] == "msg"}
    assert main(["recover", str(copy), "--json"]) == 1
    ts = json.loads(capsys.readouterr().out)["timer_store"]
    last_good = 16384 + 312 - 2 * UNIT_SIZE
    assert ts["process_offset"] == last_good + UNIT_SIZE
    assert ts["delete_files"] == ["timerlog/00000000000000024576"]
    assert ts["queue_offset"] == queue_of[units[last_good]["offsetPy"]] + 1
    backup = tmp_path / "backup"
    assert main(["recover", str(copy), "--apply", "--backup", str(backup)]) == 0
    assert not (copy / "timerlog" / "00000000000000024576").exists()
    capsys.readouterr()
    assert main(["recover", str(copy), "--json"]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["timer_store"]["delete_files"] == []
    assert main(["recover", "--restore", str(backup)]) == 0
    assert (copy / "timerlog" / "00000000000000024576").exists()


def test_recovery_re_points_a_stale_slot_at_the_last_unit_it_scans(copy, capsys):
    from storelib.format.timerstore import SLOT_SIZE

    index = 470692  # slot 1795517092000: firstPos 936, lastPos 14744 in the broker's files
    _poke(copy / "timerwheel", index * SLOT_SIZE + 16, struct.pack(">q", 13184))  # a stale lastPos
    assert main(["recover", str(copy), "--json"]) == 1
    ts = json.loads(capsys.readouterr().out)["timer_store"]
    assert ts["slot_changes"] == [{"index": index, "time_ms": 1795517092000, "before": [936, 13184],
                                   "after": [936, 14744]}]


# ------------------------------------------------------------------------------------------------
# rebuild --what timer


def test_rebuild_timer_enqueues_every_timer_record_as_the_broker_does(timer_sample, tmp_path, capsys):
    """Every record of the timer topic, pending or delivered, in queue order (the broker's own log holds
    them all, and its restart resumes after the last unit's record: see timerrebuild.rebuilt_checkpoint)."""
    store = timer_sample / "store"
    assert main(["rebuild", str(store), "--out", str(tmp_path / "out"), "--what", "consumequeue,index,timer",
                 "--quiet"]) == 0
    assert "timer store" in capsys.readouterr().out
    out = resolve(str(tmp_path / "out"))
    log = read_timerlog(out, 8192)
    wheel, findings = read_wheel(out, log, 1000)
    assert not log.findings and not findings and all(wheel.column("chain_ok").to_pylist())
    assert log.units.num_rows == 320 == sum(wheel.column("num").to_pylist())
    broker = read_timerlog(resolve(str(store)), 8192).units.to_pylist()
    orig = {u["offset_py"]: u for u in broker}
    got = log.units.to_pylist()
    assert [u["offset_py"] for u in got] == [u["offset_py"] for u in broker]
    pending = {r["timerTopicPhyOffset"] for r in expected(timer_sample, "pending.jsonl")}
    assert pending < {u["offset_py"] for u in got}
    assert all(u["roll"] == orig[u["offset_py"]]["roll"] for u in got)
    # the slot is the deliver time's unless rolled; a rolled one parks relative to the write second, which
    # the store does not keep (5.3.3 itself took the record's second for 300 of its 320 units)
    assert all(u["slot_time_ms"] == orig[u["offset_py"]]["slot_time_ms"] for u in got if not u["roll"])
    assert all(abs(u["slot_time_ms"] - orig[u["offset_py"]]["slot_time_ms"]) <= 1000 for u in got)
    cp, was = read_timer_checkpoint(out), read_timer_checkpoint(resolve(str(store)))
    assert (cp.last_read_time_ms, cp.last_timer_queue_offset, cp.master_timer_queue_offset) == \
        (was.last_read_time_ms, 320, 320)
    assert cp.last_timer_log_flush_pos == was.last_timer_log_flush_pos == 2 * 8192 + (320 - 2 * 157) * UNIT_SIZE
    assert (tmp_path / "out" / "consumequeue").is_dir()


def test_rebuild_timer_in_place_is_refused(timer_sample, capsys):
    assert main(["rebuild", str(timer_sample / "store"), "--in-place", "--what", "timer", "--quiet"]) == 2
    assert "--out only" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# generated 5.x stores with timers


@pytest.fixture(scope="module")
def gen_timers(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gentimers") / "store"
    assert main(["gen", str(root), "--messages", "1500", "--version", "5", "--segment-size", "1MB", "--seed", "3",
                 "--timers", "300", "--set", "mappedFileSizeTimerLog=4096"]) == 0
    return root


def test_gen_writes_timer_messages_and_a_consistent_timer_store(gen_timers, capsys):
    capsys.readouterr()
    assert main(["timers", str(gen_timers), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["timers"] == 300 and doc["pending"] + doc["delivered"] == 300
    assert 0 < doc["delivered"] < 300 and doc["timerlog_units"] == 300 and len(doc["timerlog_files"]) >= 3
    assert doc["timermetrics_timing_count"] == doc["pending_by_topic"]
    assert doc["timercheck"]["last_timer_queue_offset"] == 300
    assert [f["end"] for f in doc["timerlog_files"][:-1]] == ["blank"] * (len(doc["timerlog_files"]) - 1)
    root = resolve(str(gen_timers))
    wheel, findings = read_wheel(root, read_timerlog(root, 4096), 1000)
    assert not findings and all(wheel.column("chain_ok").to_pylist()) and sum(wheel.column("num").to_pylist()) == 300


def test_a_generated_timer_store_audits_clean_and_recovers_to_itself(gen_timers, capsys):
    from jobs.audit import audit_store

    rep = audit_store(str(gen_timers), quiet=True)
    assert not [f for f in rep["findings"] if f["severity"] in ("error", "critical")]
    capsys.readouterr()
    main(["recover", str(gen_timers), "--json"])
    ts = json.loads(capsys.readouterr().out)["timer_store"]
    assert ts["delete_files"] == [] and ts["slots_rewritten"] == 0 and ts["queue_offset"] == 300


def test_a_crash_mid_enqueue_is_found_and_recovered(gen_timers, tmp_path, capsys):
    from jobs.audit import audit_store

    root = tmp_path / "store"
    shutil.copytree(gen_timers, root)
    last = sorted((root / "timerlog").iterdir())[-1]
    data = last.read_bytes()
    end = max(i for i in range(0, len(data) - UNIT_SIZE + 1, UNIT_SIZE) if data[i:i + 4] == struct.pack(">i", UNIT_SIZE))
    _poke(last, end, b"\0" * UNIT_SIZE)  # the last enqueue never reached the file
    rep = audit_store(str(root), quiet=True)
    assert any(f["kind"] == "timercheck_ahead" for f in rep["findings"])
    capsys.readouterr()
    main(["recover", str(root), "--json"])
    ts = json.loads(capsys.readouterr().out)["timer_store"]
    assert ts["process_offset"] == int(last.name) + end and ts["queue_offset"] == 299


def test_audit_finds_a_unit_firing_at_the_wrong_time_and_a_timer_record_the_store_lost(copy):
    tl = copy / "timerlog" / "00000000000000000000"
    root = resolve(str(copy))
    units = read_timerlog(root, 8192).units.to_pylist()
    k = next(i for i, u in enumerate(units) if not u["roll"] and i > 2)
    _poke(tl, k * UNIT_SIZE + 24, struct.pack(">i", units[k]["delayed_time"] + 5000))  # fires 5 s late
    lost = units[1]
    _poke(tl, 1 * UNIT_SIZE + 28, struct.pack(">qi", units[2]["offset_py"], units[2]["size_py"]))  # unit 1 -> record 2
    rep = _audit(copy)
    got = {(f["kind"], f["file"], f["offset"]) for f in rep["findings"]}
    assert ("timer_unit_deliver_mismatch", "timerlog/00000000000000000000", k * UNIT_SIZE) in got
    assert ("timer_record_lost", "commitlog/00000000000000000000", lost["offset_py"]) in got


def test_on_a_live_store_an_expired_timer_due_before_the_cut_is_unsettled_and_one_due_after_it_lost():
    import numpy as np

    from storelib.checks.segment import Capped
    from storelib.checks.timers import _live_expired

    # units 0-3 point before the first offset: 0 delivered before the timercheck's read time, 1 and 2 due
    # between that read time and the cut (perhaps delivered since), 3 due after the cut (cannot have been)
    slot = np.array([1_000, 2_000, 3_000, 9_000, 9_000], dtype=np.int64)
    out = Capped()
    lost = _live_expired(slot, np.array([0, 1, 2, 3]), (1_500, 5_000), 4096, out)
    assert lost.tolist() == [3]
    [f] = out.items
    assert (f.kind, f.severity, f.extra["count"]) == ("timer_unit_expired_unsettled", "info", 2)


def test_a_live_wheel_slot_naming_units_past_the_timerlog_read_is_in_flight_not_a_broken_chain():
    """A running broker appends a timer unit, then points its wheel slot at it (TimerMessageStore.doEnqueue,
    5.3.3 :769 then :773); the audit reads the wheel after the timerlog (seen in CI under load: a false
    timerwheel_chain error). A slot whose lastPos lies past the last unit read is in flight; a broken chain
    inside what was read, and every other finding, stand."""
    import pyarrow as pa

    from storelib.checks.timers import _settled_wheel_findings
    from storelib.errors import Finding
    from storelib.format.timerstore import TimerLog

    log = TimerLog(pa.table({"pos": [0, 52, 104]}))
    wheel = pa.table({"file_offset": [0, 16, 32], "last_pos": [156, 52, 104], "chain_ok": [False, False, True]})
    wf = [Finding("timerwheel_chain", "error", "timerwheel", 0, "past the read"),
          Finding("timerwheel_chain", "error", "timerwheel", 16, "broken inside"),
          Finding("timerwheel_slot_time", "error", "timerwheel", 0, "other kind")]
    kept = _settled_wheel_findings(wheel, wf, log)
    assert [(f.kind, f.offset) for f in kept] == [("timerwheel_chain", 16), ("timerwheel_slot_time", 0)]
    empty = TimerLog(pa.table({"pos": pa.array([], pa.int64())}))  # nothing read yet: every chain in flight
    assert [(f.kind, f.offset) for f in _settled_wheel_findings(wheel, wf, empty)] == [("timerwheel_slot_time", 0)]
