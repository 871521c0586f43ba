"""Scheduled audits in an operator's tooling: Prometheus textfile metrics that a real parser reads and
that match the JSON report, one run at a time per state file, and recipes whose commands parse."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs.cli import build_parser, main
from jobs.runlock import EXIT_LOCKED, RunLocked, run_lock
from tests.conftest import REPO, broker_conf

CONF = str(broker_conf("4.9.8"))


def samples(path: Path) -> dict[tuple[str, frozenset], float]:
    """Every sample of a metrics file, parsed by prometheus_client's own text parser."""
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        assert fam.type in ("gauge", "counter") and fam.documentation
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def one(ms: dict, name: str, **labels) -> float:
    hits = [v for (n, lab), v in ms.items() if n == name and set(labels.items()) <= lab]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


@pytest.fixture
def damaged(tmp_path, sample_498) -> Path:
    root = tmp_path / "store"
    shutil.copytree(sample_498 / "store", root)
    with open(root / "commitlog" / "00000000000001048576", "r+b") as f:  # a body byte of the record at 199059
        f.seek(199059 + 88 + 5)
        b = f.read(1)[0]
        f.seek(199059 + 88 + 5)
        f.write(bytes([b ^ 1]))
    return root


def test_audit_metrics_parse_and_match_the_json_report(damaged, tmp_path, capsys):
    mf = tmp_path / "metrics" / "rmqstore.prom"
    rc = main(["audit", str(damaged), "--broker-conf", CONF, "--quiet", "--json", "--metrics-file", str(mf)])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 1
    ms = samples(mf)
    store = str(damaged)
    s = rep["summary"]
    assert one(ms, "rmqstore_audit_up", store=store) == 1
    assert one(ms, "rmqstore_audit_exit_code", store=store) == 1
    assert one(ms, "rmqstore_audit_records", store=store) == s["records"] == 2000
    assert one(ms, "rmqstore_audit_valid_bytes", store=store) == s["bytes_valid"]
    assert one(ms, "rmqstore_audit_audited_bytes", store=store) == rep["run"]["bytes_audited"]
    assert one(ms, "rmqstore_audit_segments", store=store) == s["segments"]
    assert one(ms, "rmqstore_audit_bad_region_bytes", store=store) == s["bytes_lost"]
    assert one(ms, "rmqstore_audit_crc_failed_records", store=store) == 1
    assert one(ms, "rmqstore_audit_crc_failed_bytes", store=store) == s["bytes_crc_failed"]
    assert one(ms, "rmqstore_audit_findings", store=store, severity="error", kind="body_crc_mismatch") == 1
    for sev, n in s["by_severity"].items():
        assert one(ms, "rmqstore_audit_findings_by_severity", store=store, severity=sev) == n
    assert one(ms, "rmqstore_audit_oldest_store_time_seconds", store=store) == s["first_store_ts"] / 1000
    assert one(ms, "rmqstore_audit_newest_store_time_seconds", store=store) == s["last_store_ts"] / 1000
    assert one(ms, "rmqstore_audit_startup_loss_messages", store=store) == rep["damage"]["messages_lost"] == 567
    for q in rep["queues"]:
        labels = {"store": store, "topic": q["topic"], "queue_id": str(q["queue_id"])}
        assert one(ms, "rmqstore_audit_queue_lag_messages", **labels) == q["lag"]
    startup = one(ms, "rmqstore_audit_duration_seconds", store=store, phase="startup")
    work = one(ms, "rmqstore_audit_duration_seconds", store=store, phase="work")
    assert startup >= 0 and work > 0
    assert abs(one(ms, "rmqstore_audit_last_success_time_seconds", store=store) - time.time()) < 120
    assert not [p for p in mf.parent.iterdir() if p.name != mf.name]  # the temp file was renamed


def test_a_run_that_cannot_read_the_store_reports_down_and_keeps_the_last_success(tmp_path, sample_498, capsys):
    mf = tmp_path / "m.prom"
    store = tmp_path / "store"
    shutil.copytree(sample_498 / "store", store)
    assert main(["audit", str(store), "--quiet", "--metrics-file", str(mf)]) == 0
    ok_at = one(samples(mf), "rmqstore_audit_last_success_time_seconds", store=str(store))
    shutil.rmtree(store / "commitlog")
    assert main(["audit", str(store), "--quiet", "--metrics-file", str(mf)]) == 2
    ms = samples(mf)
    assert one(ms, "rmqstore_audit_up", store=str(store)) == 0
    assert one(ms, "rmqstore_audit_exit_code", store=str(store)) == 2
    assert one(ms, "rmqstore_audit_last_success_time_seconds", store=str(store)) == ok_at


def test_expiry_metrics_parse_and_match_the_json(sample_498, tmp_path, capsys):
    mf = tmp_path / "expiry.prom"
    pol = tmp_path / "keep1h.conf"
    pol.write_text("fileReservedTime=1\n")
    rc = main(["expiry", str(sample_498 / "store"), "--broker-conf", CONF, "--policy", str(pol), "--disk-capacity",
               "30MB", "--json", "--metrics-file", str(mf)])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0
    ms = samples(mf)
    store = str(sample_498 / "store")
    p = rep["policies"][0]
    labels = {"store": store, "policy": p["name"]}
    assert one(ms, "rmqstore_expiry_lost_messages", **labels) == p["summary"]["lost_messages"]
    assert one(ms, "rmqstore_expiry_next_deletion_time_seconds", **labels) == p["summary"]["first_deletion_ms"] / 1000
    assert one(ms, "rmqstore_expiry_freed_bytes", **labels) == \
        p["summary"]["commitlog_deleted"] * rep["simulation"]["segment_size"]
    assert one(ms, "rmqstore_expiry_deleted_files", **labels, kind="commitlog") == p["summary"]["commitlog_deleted"]


# ------------------------------------------------------------------------------------------------
# one run at a time


def test_a_second_run_is_refused_while_the_first_holds_the_lock(tmp_path, sample_498, capsys):
    state = tmp_path / "audit.state"
    with run_lock(str(state) + ".lock"):
        rc = main(["audit", str(sample_498 / "store"), "--quiet", "--since", str(state)])
        err = capsys.readouterr().err
        assert rc == EXIT_LOCKED == 3
        assert f"pid {os.getpid()}" in err and "another run holds" in err
        assert not state.exists()  # the refused run touched nothing
    assert main(["audit", str(sample_498 / "store"), "--quiet", "--since", str(state)]) == 0
    assert state.exists() and not Path(str(state) + ".lock").exists()


def test_the_lock_is_free_when_the_run_ends_even_while_workers_it_forked_live_on(tmp_path, monkeypatch):
    from jobs.engines.schedulers import PoolEngine

    monkeypatch.setenv("RMQSTORE_POOL_START", "fork")  # forked, whatever threads this test process runs
    lock = str(tmp_path / "audit.lock")
    pool = PoolEngine(2)
    try:
        with run_lock(lock):
            pool.start()  # forked while the lock is held: the workers share its open file
            assert pool.map(abs, [-1, -2]) == [1, 2]
        with run_lock(lock):  # the next run gets it at once, the workers still alive
            assert pool.map(abs, [-3]) == [3]
    finally:
        pool.close()


def test_a_lock_left_by_a_dead_run_is_taken_over(tmp_path, sample_498, capsys):
    lock = tmp_path / "audit.lock"
    code = (f"import sys, time; sys.path.insert(0, {str(REPO)!r}); from jobs.runlock import run_lock\n"
            f"with run_lock({str(lock)!r}):\n    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match=f"pid {holder.pid}"):
            with run_lock(str(lock)):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock.exists()  # a killed run cannot clean up
    rc = main(["audit", str(sample_498 / "store"), "--lock", str(lock)])
    err = capsys.readouterr().err
    assert rc == 0 and f"took over the lock {lock} left by pid {holder.pid}" in err


# ------------------------------------------------------------------------------------------------
# recipes


DOC = REPO / "docs" / "scheduling.md"


def _commands_in_doc() -> list[list[str]]:
    """The rmqstore command lines of the scheduling doc (crontab lines, systemd ExecStart=)."""
    cmds = []
    for line in DOC.read_text().splitlines():
        if "bin/rmqstore " not in line or line.lstrip().startswith("#"):
            continue
        text = line.split("bin/rmqstore ", 1)[1].split(" && ")[0].split(" ||")[0]
        cmds.append(shlex.split(text.replace("\\", "")))
    return cmds


def test_the_scheduling_doc_commands_parse():
    cmds = _commands_in_doc()
    kinds = {c[0] for c in cmds}
    assert {"audit", "expiry"} <= kinds and len(cmds) >= 3
    parser = build_parser()
    for c in cmds:
        args = parser.parse_args(c)
        if c[0] == "audit":
            assert args.metrics_file and (args.since or args.lock)


def test_the_airflow_dag_builds_commands_the_cli_parses():
    pytest.importorskip("airflow")
    import importlib.util

    spec = importlib.util.spec_from_file_location("rmqstore_dag", REPO / "examples" / "airflow_rmqstore_audit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    parser = build_parser()
    tasks = {t.task_id: t for t in mod.dag.tasks}
    assert {"audit_local", "audit_spark"} <= set(tasks)
    local = shlex.split(tasks["audit_local"].bash_command)
    parser.parse_args(local[local.index("audit"):])
    spark_args = list(tasks["audit_spark"].application_args)
    assert tasks["audit_spark"].application.endswith("jobs/audit.py")
    import argparse

    from jobs.audit import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args(spark_args).engine == "spark"


def test_the_dag_commands_parse_without_airflow():
    """The DAG's command lines come from plain functions, checked here even where Airflow is absent."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rmqstore_dag_cmds", REPO / "examples" / "airflow_rmqstore_audit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # without Airflow the module defines no DAG, only the commands
    parser = build_parser()
    local = mod.audit_command("/data/rocketmq/store", "/var/lib/rmqstore")
    parser.parse_args(local[1:])
    import argparse

    from jobs.audit import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args(mod.spark_audit_args("/data/rocketmq/store", "/var/lib/rmqstore")).engine == "spark"
