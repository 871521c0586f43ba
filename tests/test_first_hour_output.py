"""The first hour, continued: audit output that agrees with itself and says what to do, typed times,
an instant data-source registration, files other users can read, and runs that leave nothing behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jobs.audit import audit_store, summary_text
from tests.conftest import REPO, broker_conf, run_cli

CONF = str(broker_conf("4.9.8"))




@pytest.fixture
def crc_store(tmp_path, sample_498):
    """The 4.9.8 sample with one body byte flipped in the 40th-last record (in the recovery window)."""
    import datasources as ds

    root = tmp_path / "store"
    shutil.copytree(sample_498 / "store", root)
    rows = ds.read_messages(str(root), columns=["phy_offset", "size", "segment", "body_len"]).to_pylist()
    bad = rows[-40]
    assert bad["body_len"] > 8
    path = root / "commitlog" / bad["segment"]
    pos = bad["phy_offset"] - int(bad["segment"]) + 88 + 5  # inside the body (IPv4 hosts: BODY at 88)
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([b ^ 0x10]))
    return root, bad


# ------------------------------------------------------------------------------------------------
# audit output


def test_audit_summary_shows_start_up_and_work_apart(tmp_path, sample_498):
    """The engine's start (pool workers here, a Spark session likewise) is start-up, not work."""
    rep = audit_store(str(sample_498 / "store"), broker_conf=CONF, engine="pool", workers=2, quiet=True,
                      split_bytes=1 << 20)
    run = rep["run"]
    assert run["engine"] == "pool" and run["startup_seconds"] >= 0
    assert run["startup_seconds"] + run["segment_seconds"] + run["cross_check_seconds"] <= run["seconds"] + 0.01
    work = run["segment_seconds"] + run["cross_check_seconds"]
    line = next(ln for ln in summary_text(rep, "error").splitlines() if ln.strip().startswith("engine pool:"))
    assert f"(start-up {run['startup_seconds']:.2f} s, work {work:.2f} s)" in line


def test_console_findings_wrap_at_word_boundaries_and_point_to_the_report():
    detail = " ".join(f"word{i:03d}" for i in range(120))
    rep = {"store": "s", "summary": {"segments": 1, "records": 1, "bytes_valid": 1, "queues": 0, "index_files": 0,
                                     "by_severity": {"error": 2}, "bytes_lost": 0},
           "findings": [{"kind": "k", "severity": "error", "file": "commitlog/0", "offset": 5, "detail": detail},
                        {"kind": "k2", "severity": "error", "file": None, "offset": None,
                         "detail": "a short one that re-scans the commitlog"}]}
    text = summary_text(rep, "error")
    lines = text.splitlines()
    assert all(len(line) <= 110 for line in lines)
    words = " ".join(line.strip() for line in lines).split()
    assert all(re.fullmatch(r"word\d{3}", w) for w in words if w.startswith("word"))  # no word cut in two
    assert "(full text in the report)" in text
    assert "re-scans the commitlog" in text  # a short detail is whole


def test_progress_summary_and_findings_agree_on_a_crc_error(crc_store, capsys):
    root, bad = crc_store
    rep = audit_store(str(root), broker_conf=CONF)
    err = capsys.readouterr().err
    crc = [f for f in rep["findings"] if f["kind"] == "body_crc_mismatch"]
    assert len(crc) == 1 and crc[0]["file"] == f"commitlog/{bad['segment']}"
    task_line = next(line for line in err.splitlines() if f"{bad['segment']}@0:" in line)
    assert re.search(r": 1 findings", task_line), task_line
    assert rep["summary"]["crc_errors"] == 1 and rep["summary"]["bytes_crc_failed"] == bad["size"]
    text = summary_text(rep, "error")
    assert f"1 record(s) failing their CRC ({bad['size']} bytes)" in text


def test_audit_says_what_the_damage_costs_and_the_command_that_salvages_it(crc_store, capsys, tmp_path):
    root, bad = crc_store
    rep = audit_store(str(root), broker_conf=CONF, quiet=True)
    d = rep["damage"]
    rc, out, _ = run_cli(capsys, "recover", root, "--broker-conf", CONF, "--json")
    lost = json.loads(out)["lost"]["totals"]
    assert d["messages_lost"] == lost["messages"] == 40 and d["messages_intact"] == lost["intact"] == 39
    assert d["process_offset"] == bad["phy_offset"]
    salvage = next(c["command"] for c in d["next"] if "--salvage" in c["command"])
    assert any("--apply --backup" in c["command"] for c in d["next"])
    text = summary_text(rep, "error")
    assert "a broker start-up would drop 40 message(s)" in text and salvage in text
    argv = salvage.replace("SALVAGE_DIR", str(tmp_path / "salvaged")).split()[1:]
    assert "--broker-conf" in argv  # the audit's own settings carry over
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 0 and "salvaged 39 intact message(s)" in err + _


def test_a_clean_store_has_no_damage_section(sample_498):
    rep = audit_store(str(sample_498 / "store"), broker_conf=CONF, quiet=True)
    assert rep["damage"] is None and "cost:" not in summary_text(rep, "error")


# ------------------------------------------------------------------------------------------------
# typed times


def test_messages_carry_typed_utc_times_beside_the_epoch_ms(sample_498, capsys, tmp_path):
    import datasources as ds

    store = sample_498 / "store"
    t = ds.read_messages(str(store), columns=["store_timestamp", "store_time", "born_timestamp", "born_time"])
    assert str(t.schema.field("store_time").type) == "timestamp[us, tz=UTC]"
    first = t.slice(0, 1).to_pylist()[0]
    assert int(first["store_time"].timestamp() * 1000) == first["store_timestamp"]
    assert int(first["born_time"].timestamp() * 1000) == first["born_timestamp"]
    rc, out, _ = run_cli(capsys, "messages", store, "--limit", "2", "--format", "table")
    assert "store_time" in out.splitlines()[0] and "store_timestamp" not in out
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", out)
    rc, out, _ = run_cli(capsys, "messages", store, "--limit", "1")
    row = json.loads(out)
    assert row["store_time"].endswith("Z") and row["store_timestamp"] == first["store_timestamp"]
    rc, _, _ = run_cli(capsys, "messages", store, "--format", "parquet", "--out", tmp_path / "m.parquet")
    assert str(pq.read_schema(tmp_path / "m.parquet").field("store_time").type) == "timestamp[us, tz=UTC]"


def test_get_takes_iso_times(capsys, sample_498):
    import datasources as ds

    row = ds.read_messages(str(sample_498 / "store"), columns=["topic", "keys", "store_time"]).to_pylist()[100]
    key = row["keys"].split()[0]
    day = row["store_time"].strftime("%Y-%m-%d")
    rc, out, _ = run_cli(capsys, "get", sample_498 / "store", "--key", key, "--topic", row["topic"],
                         "--begin", f"{day}T00:00:00Z")
    assert rc == 0 and key in out
    rc, out, _ = run_cli(capsys, "get", sample_498 / "store", "--key", key, "--topic", row["topic"],
                         "--end", "2001-01-01T00:00:00Z")
    assert rc == 1


@pytest.mark.spark
def test_data_source_time_columns_are_spark_timestamps(spark, sample_498):
    from pyspark.sql.types import TimestampType

    import datasources as ds

    ds.register(spark)
    df = spark.read.format("rocketmq").load(str(sample_498 / "store"))
    assert isinstance(df.schema["store_time"].dataType, TimestampType)
    bad = df.filter("CAST(unix_millis(store_time) AS BIGINT) != store_timestamp").count()
    assert bad == 0


@pytest.mark.spark
def test_register_is_instant_and_says_what_it_did(spark):
    import datasources as ds

    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(None))
    reg = ds.register(spark)
    assert set(tracker.getJobIdsForGroup(None)) == before  # no probe job
    assert "rocketmq" in reg.formats and "rocketmq.consumequeue" in reg.formats
    minor = tuple(int(x) for x in spark.version.split(".")[:2])
    if minor in ds.PUSHDOWN_LEAKS_ON:
        assert reg.pushdown is False and spark.version in reg.reason
    assert str(reg).startswith("registered rocketmq")


# ------------------------------------------------------------------------------------------------
# files and noise


def _umask_run(mask: int, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    code = f"import os, sys; os.umask({mask}); from jobs.cli import main; sys.exit(main({argv!r}))"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o027, 0o640)])
def test_outputs_follow_the_umask(crc_store, tmp_path, mask, mode):
    root, _ = crc_store
    out = tmp_path / f"out{mask:o}"
    runs = [["recover", str(root), "--broker-conf", CONF, "--salvage", str(out / "salvage")],
            ["messages", str(root), "--format", "parquet", "--out", str(out / "m.parquet")],
            ["audit", str(root), "--broker-conf", CONF, "--quiet", "--since", str(out / "state.json"),
             "--report-dir", str(out / "report")]]
    for argv in runs:
        _umask_run(mask, argv, tmp_path)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files) and any("state" in p.name for p in files)
    assert {p.relative_to(out).as_posix(): oct(p.stat().st_mode & 0o777) for p in files} == \
        {p.relative_to(out).as_posix(): oct(mode) for p in files}


def test_project_metadata_builds_without_deprecation_warnings():
    text = (REPO / "pyproject.toml").read_text()  # (tomllib is 3.11+, the project supports 3.10)
    assert re.search(r'^license = "Apache-2.0"$', text, re.M)  # an SPDX string, not the deprecated table
    assert re.search(r'^requires = \["setuptools>=(7[7-9]|[89]\d)', text, re.M)


@pytest.mark.spark
def test_a_spark_run_is_quiet_and_leaves_nothing_in_the_temp_dir(tmp_path, sample_498):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}
    env.pop("RMQSTORE_DEBUG", None)
    p = subprocess.run([sys.executable, "-c", "import sys; from jobs.cli import main; sys.exit(main())", "audit",
                        str(sample_498 / "store"), "--broker-conf", CONF, "--engine", "spark", "--master", "local[1]",
                        "--quiet"], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "incubator" not in p.stderr and p.stderr.startswith("rmqstore audit:"), p.stderr[:500]
    assert sorted(os.listdir(tmp)) == []
