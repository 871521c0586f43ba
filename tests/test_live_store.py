"""Reading commands against a store a broker-like writer PROCESS is writing (tests/livewriter.py): the lock
held, records copied in (one paused halfway), reput lagging, the checkpoint rewritten in place, the cleaner
deleting the oldest segment. Audits (full and --since alternating), incremental exports and data-source
reads run while it writes; each must be clean, and the snapshot must hold every message exactly once."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time

import pyarrow.dataset as ds
import pytest

from jobs.audit import audit_store
from jobs.reports.audit_summary import exit_code
from tests.livewriter import LiveConfig, LiveWriter, exports_while_writing, journal, settings_overrides

WARN = {"warning", "error", "critical"}


def _cfg(tmp_path, version="4", **kw) -> LiveConfig:
    base = dict(root=str(tmp_path / "store"), version=version, seconds=4.0, rate=1000, body_max=3000,
                segment_size=256 << 10, keep_segments=6, clean_ms=1200, pause_at_s=1.2, pause_ms=250,
                cq_units=1000, index_slots=200, index_num=800, timer_ms=1000)
    base.update(kw)
    return LiveConfig(**base)


def _audits_while_writing(cfg: LiveConfig, tmp_path, engine: str = "local") -> tuple[list, dict]:
    """(writer pid, report) of each audit run while the writer writes (full and --since alternating), and
    the writer's summary."""
    reports = []
    state = str(tmp_path / "audit.state")
    with LiveWriter(cfg) as w:
        i = 0
        while w.running() or i < 2:
            rep = audit_store(cfg.root, overrides=settings_overrides(cfg), engine=engine, quiet=True,
                              since=state if i % 2 else None, threads=i % 3 != 2)
            reports.append((w.pid, rep))
            i += 1
        summary = w.wait()
    return reports, summary


@pytest.mark.parametrize("version", ["4", "5"])
def test_audits_of_a_store_being_written_are_clean_and_say_it_is_live(tmp_path, version):
    # 5.x: timers of 1 s, due well before the cleaner (about 3 s of traffic kept) deletes their records
    cfg = _cfg(tmp_path, version, seconds=6.0, keep_segments=3, segment_size=128 << 10) if version == "4" else _cfg(
        tmp_path, version, seconds=6.0, keep_segments=16, segment_size=128 << 10, timer_delays=(1,))
    runs, summary = _audits_while_writing(cfg, tmp_path)
    live = [(pid, r) for pid, r in runs if r["live"]["live"]]
    assert len(live) >= 2, "the audits did not overlap the writer"
    seen = collections.Counter()
    for pid, r in live:
        bad = [(f["kind"], f["severity"], f["file"], f["detail"][:120]) for f in r["findings"] if f["severity"] in WARN]
        assert not bad and exit_code(r, "warning") == 0, bad
        cut, end = r["live"]["cut_offset"], r["summary"]["commitlog_end_offset"]
        assert r["live"]["pid"] == pid and (cut == end or end < cut and cut % cfg.segment_size == 0)  # (after a blank)
        seen.update(f["kind"] for f in r["findings"])
    assert seen["broker_running"] == seen["abort_present"] == 0
    assert summary["done"]["deleted_segments"] >= 1  # the cleaner ran during the audits


def test_a_live_timer_whose_record_the_cleaner_deleted_before_its_time_is_lost_and_one_due_before_the_cut_unsettled(
        tmp_path):
    # 1 h timers beside 1 s ones, and a cleaner that keeps well under 1 h of traffic: every 1 h timer whose
    # record the cleaner deleted is lost (a warning); a 1 s timer whose record went while the timercheck read
    # was older than its time may have been delivered first (info), never a warning
    cfg = _cfg(tmp_path, "5", seconds=6.0, keep_segments=4, segment_size=128 << 10, timer_delays=(1,),
               long_timers=True, timer_ratio=0.05)
    runs, summary = _audits_while_writing(cfg, tmp_path)
    live = [r for _pid, r in runs if r["live"]["live"]]
    assert len(live) >= 2 and summary["done"]["deleted_segments"] >= 1
    lost = [f for r in live for f in r["findings"] if f["kind"] == "timer_unit_expired"]
    assert lost and all(f["severity"] == "warning" for f in lost)
    for r in live:
        cut_ms = r["live"]["cut_time_ms"]
        for f in r["findings"]:
            if f["kind"] == "timer_unit_expired_unsettled":
                assert f["severity"] == "info" and f["extra"]["count"] >= 1 and cut_ms is not None


def test_expect_stopped_makes_a_running_broker_an_error(tmp_path):
    cfg = _cfg(tmp_path, seconds=2.0, pause_at_s=None)
    with LiveWriter(cfg) as w:
        rep = audit_store(cfg.root, overrides=settings_overrides(cfg), quiet=True, expect_stopped=True)
        w.wait()
    f = [f for f in rep["findings"] if f["kind"] == "broker_not_stopped"]
    assert len(f) == 1 and f[0]["severity"] == "error" and exit_code(rep, "error") == 1


def test_incremental_exports_hold_every_message_once_including_those_the_cleaner_deleted(tmp_path):
    cfg = _cfg(tmp_path, seconds=5.0, keep_segments=4)
    snap = str(tmp_path / "snap")
    runs = exports_while_writing(cfg, snap)
    assert sum(1 for m in runs if m["live"]["live"]) >= 3
    want = [j["phy"] for j in journal(cfg)]
    got = collections.Counter(ds.dataset(snap, format="parquet", partitioning="hive")
                              .to_table(columns=["phy_offset"]).column("phy_offset").to_pylist())
    assert sorted(got) == sorted(want) and max(got.values()) == 1
    first_now = min(int(n) for n in os.listdir(os.path.join(cfg.root, "commitlog")))
    expired = [p for p in want if p < first_now]
    assert expired and all(got[p] == 1 for p in expired)  # the archive kept what the broker expired
    last = runs[-1]
    assert any(e.get("expired") for e in last["segments"].values())


def test_data_source_reads_a_consistent_prefix_up_to_its_cut(tmp_path):
    from datasources.commitlog_reader import read_messages

    cfg = _cfg(tmp_path, seconds=3.0)
    opts = {f"set.{k}": str(v) for k, v in settings_overrides(cfg).items()}
    tables = []
    with LiveWriter(cfg) as w:
        while w.running():
            tables.append(read_messages(cfg.root, columns=["phy_offset", "msg_id"], **opts))
            time.sleep(0.3)
        w.wait()
    want = sorted(j["phy"] for j in journal(cfg))
    assert len(tables) >= 3
    for t in tables:
        got = t.column("phy_offset").to_pylist()
        assert got == sorted(set(got))
        lo, hi = got[0], got[-1]
        # every record written between the first one still there and the last one read: no hole, no torn tail
        assert got == [p for p in want if lo <= p <= hi]


def test_spark_query_reads_up_to_its_own_cut(tmp_path, spark):
    from datasources import register

    register(spark)
    cfg = _cfg(tmp_path, seconds=6.0, keep_segments=1000, pause_at_s=None)
    opts = {f"set.{k}": str(v) for k, v in settings_overrides(cfg).items()}
    with LiveWriter(cfg) as w:
        time.sleep(1.0)
        df = spark.read.format("rocketmq").options(**opts).load(cfg.root).select("phy_offset")
        rows = sorted(r[0] for r in df.collect())
        w.wait()
    want = sorted(j["phy"] for j in journal(cfg))
    assert rows and rows == want[:len(rows)]


def test_commands_that_write_into_a_store_refuse_while_its_broker_runs(tmp_path):
    cfg = _cfg(tmp_path, seconds=30.0, pause_at_s=None)
    sets = [a for k, v in settings_overrides(cfg).items() for a in ("--set", f"{k}={v}")]
    env = dict(os.environ)
    rmq = [sys.executable, "-m", "jobs.cli"]
    with LiveWriter(cfg):
        cmds = [["recover", cfg.root, "--apply", "--backup", str(tmp_path / "bk")],
                ["rebuild", cfg.root, "--in-place"]]
        for c in cmds:
            p = subprocess.run(rmq + c + sets, capture_output=True, text=True, env=env)
            assert p.returncode == 2 and "lock" in p.stderr, (c, p.stderr[-300:])
        p = subprocess.run(rmq + ["recover", cfg.root, "--plan", "--json"] + sets, capture_output=True, text=True,
                           env=env)
        plan = json.loads(p.stdout)
        assert plan["live"]["live"] and plan["last_exit"]["clean"] is False  # what a crash now would do
        p = subprocess.run(rmq + ["info", cfg.root] + sets, capture_output=True, text=True, env=env)
        assert p.returncode == 0 and "live        live store (pid" in p.stdout
        p = subprocess.run(rmq + ["messages", cfg.root, "--topic", "LiveTopic1"] + sets, capture_output=True, text=True,
                           env=env)
        rows = [json.loads(line) for line in p.stdout.splitlines()]
        assert p.returncode == 0 and rows and "live store (pid" in p.stderr
        last = rows[-1]
        for how in (["--offset", str(last["phy_offset"])], ["--msg-id", last["msg_id"]],
                    ["--queue", f"LiveTopic1:{last['queue_id']}:{last['queue_offset']}"],
                    ["--key", last["keys"].split()[0], "--topic", "LiveTopic1"]):
            p = subprocess.run(rmq + ["get", cfg.root, *how] + sets, capture_output=True, text=True, env=env)
            assert p.returncode == 0 and json.loads(p.stdout.splitlines()[0])["phy_offset"] == last["phy_offset"], how
        for c in (["timers", cfg.root], ["expiry", cfg.root, "--json"]):
            p = subprocess.run(rmq + c + sets, capture_output=True, text=True, env=env)
            assert p.returncode == 0, (c, p.stderr[-300:])
    assert not os.path.exists(tmp_path / "bk")
