"""The `rmqstore` command on the real samples: info, messages (jsonl/table/parquet), get, errors."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from tests.conftest import broker_conf, load_expected, run_cli


def _version(sample) -> str:
    return "4.9.8" if "4.9.8" in sample.name else "5.3.3"




def test_info_json_counts_messages_and_queue_ranges(capsys, sample):
    rc, out, _ = run_cli(capsys, "info", sample / "store", "--broker-conf", broker_conf(_version(sample)), "--json")
    info = json.loads(out)
    expected = [e for e in load_expected(sample, "messages.jsonl") if e["type"] == "msg"]
    assert rc == 0 and info["messages"] == len(expected)
    summary = json.loads((sample / "expected" / "export_summary.json").read_text())
    for q in info["queues"]:
        s = summary["afterLoad_queues"][q["topic"]][str(q["queue_id"])]
        assert (q["cq_min_offset"], q["cq_max_offset"]) == (s["minOffset"], s["maxOffset"])
        assert q["max_queue_offset"] + 1 == s["maxOffset"]
    assert info["abort"]["exists"] is False and len(info["index_files"]) == 6


def test_messages_jsonl_has_the_documented_fields(capsys, sample_498):
    rc, out, _ = run_cli(capsys, "messages", sample_498 / "store", "--topic", "OrderEvents", "--limit", "5", "--with-body")
    rows = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and len(rows) == 5 and {r["topic"] for r in rows} == {"OrderEvents"}
    assert list(rows[0])[:4] == ["phy_offset", "size", "magic_version", "body_crc"]
    assert "body_base64" in rows[0] and isinstance(rows[0]["properties"], dict)


def test_messages_parquet_export_round_trips(tmp_path, capsys, sample_533):
    out = tmp_path / "m.parquet"
    rc, _, _ = run_cli(capsys, "messages", sample_533 / "store", "--format", "parquet", "--out", out)
    t = pq.read_table(out)
    assert rc == 0 and t.num_rows == 2018 and t.column("magic_version").to_pylist().count(2) == 39


def test_get_by_msg_id_queue_and_key(capsys, sample_498):
    store = sample_498 / "store"
    conf = broker_conf("4.9.8")
    rc, out, _ = run_cli(capsys, "get", store, "--msg-id", "0A00000500002A9F00000000000000F7")
    row = json.loads(out)
    assert rc == 0 and row["phy_offset"] == 247
    assert row["uniq_key_decoded"]["client_ip"] == "192.168.1.14" and row["uniq_key_decoded"]["pid"] == 4242
    cq = load_expected(sample_498, "consumequeue_entries.jsonl")[5]
    rc, out, _ = run_cli(capsys, "get", store, "--broker-conf", conf, "--queue",
                         f"{cq['topic']}:{cq['queueId']}:{cq['queueOffset']}")
    assert rc == 0 and json.loads(out)["phy_offset"] == cq["phyOffset"]
    q = load_expected(sample_498, "index_queries.jsonl")[0]
    rc, out, _ = run_cli(capsys, "get", store, "--broker-conf", conf, "--key", q["key"], "--topic", q["topic"])
    assert rc == 0 and [json.loads(line)["phy_offset"] for line in out.splitlines()] == sorted(q["phyOffsets"])


def test_every_sample_index_query_is_answered_exactly(sample):
    from storelib.broker.index.lookup import lookup_key
    from storelib.broker.settings.store import Store

    store = Store(sample / "store", broker_conf=str(broker_conf(_version(sample))))
    for q in load_expected(sample, "index_queries.jsonl")[::7]:
        assert sorted(r["phy_offset"] for r in lookup_key(store, q["topic"], q["key"])) == sorted(q["phyOffsets"])


@pytest.mark.parametrize("argv,needle", [
    (["get", "{store}", "--offset", "5"], "commitlog/00000000000000000000 @ 5: no_record"),
    (["get", "{store}", "--msg-id", "XYZ"], "bad_msg_id"),
    (["info", "{missing}"], "not_found"),
    (["get", "{store}", "--queue", "../../etc:0:1"], "unsafe_topic_name"),
])
def test_errors_are_one_line_with_file_and_offset(capsys, tmp_path, sample_498, argv, needle):
    argv = [a.format(store=sample_498 / "store", missing=tmp_path / "nope") for a in argv]
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2 and needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_set_overrides_each_broker_setting_like_a_broker_conf(capsys, sample_498):
    store = sample_498 / "store"
    _, by_conf, _ = run_cli(capsys, "info", store, "--broker-conf", broker_conf("4.9.8"), "--json")
    rc, by_set, _ = run_cli(capsys, "info", store, "--json", "--set", "mappedFileSizeCommitLog=524288",
                            "--set", "mappedFileSizeConsumeQueue=2000", "--set", "maxHashSlotNum=200",
                            "--set", "maxIndexNum=800")
    a, b = json.loads(by_conf), json.loads(by_set)
    assert rc == 0 and a["queues"] == b["queues"] and a["index_files"] == b["index_files"]
    rc, _, err = run_cli(capsys, "info", store, "--set", "maxIndexNum")
    assert rc == 2 and "--set needs KEY=VALUE" in err
    rc, _, err = run_cli(capsys, "info", store, "--set", "maxIndexNum=lots")
    assert rc == 2 and "maxIndexNum" in err and "Traceback" not in err


def test_segment_size_is_inferred_from_the_files_without_broker_conf_but_an_explicit_value_wins(capsys, sample_498):
    store = sample_498 / "store"
    rc, out, _ = run_cli(capsys, "info", store, "--json")
    info = json.loads(out)
    assert rc == 0 and info["segment_size"] == 524288 and info["messages"] == 2000
    assert "segment_size_inferred" in [f["kind"] for f in info["findings"]]
    rc, out, _ = run_cli(capsys, "info", store, "--json", "--set", "mappedFileSizeCommitLog=1073741824")
    kinds = [f["kind"] for f in json.loads(out)["findings"]]
    assert "segment_size_inferred" not in kinds and "wrong_segment_size" in kinds


def test_importing_jobs_turns_numpy_hugepage_madvise_off_unless_the_user_chose():
    import subprocess
    import sys

    code = ("import numpy as np, os, jobs; "
            "print(os.environ['NUMPY_MADVISE_HUGEPAGE'], np._core.multiarray._set_madvise_hugepage(False))")
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=repo)
    assert out.stdout.split() == ["0", "False"]  # set for child processes, and switched off in this one
    out = subprocess.run([sys.executable, "-c", code], env={**env, "NUMPY_MADVISE_HUGEPAGE": "1"},
                         capture_output=True, text=True, check=True, cwd=repo)
    assert out.stdout.split() == ["1", "True"]  # an explicit choice is left alone


def test_local_sessions_load_log4j_by_absolute_path_and_keep_the_other_jvm_options_of_spark_defaults():
    from jobs.spark.sparkutil import SPARK_CONF, read_defaults, session_settings

    s = session_settings()
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        opts = s[key].split()
        assert opts[0] == f"-Dlog4j2.configurationFile=file:{SPARK_CONF / 'log4j2.properties'}"
        assert os.path.isabs(opts[0].split("file:", 1)[1])
        assert "-XX:+UseParallelGC" in opts and "-XX:+UseParallelGC" in read_defaults()[key]
        assert sum("log4j2" in o for o in opts) == 1
    assert session_settings({"spark.driver.extraJavaOptions": "-Xss4m"})["spark.driver.extraJavaOptions"] == "-Xss4m"


def test_batch_job_sessions_add_the_c1_only_jit_option_and_other_sessions_do_not():
    from jobs.spark.sparkutil import BATCH_JOB_JVM_OPTIONS, session_settings

    job, plain = session_settings(batch_job=True), session_settings()
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        assert all(o in job[key].split() for o in BATCH_JOB_JVM_OPTIONS)
        assert not any(o in plain[key].split() for o in BATCH_JOB_JVM_OPTIONS)
        assert "-XX:+UseParallelGC" in job[key].split()  # spark-defaults' own options stay
