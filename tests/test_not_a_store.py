"""What is not a store is an error with one line, never an empty answer an operator reads as "empty store"."""

from __future__ import annotations

import os
import shutil

import pytest

from jobs.cli import main
from storelib.broker.settings.storeroot import NotAStoreError
from storelib.errors import StoreError
from tests.conftest import run_cli

COMMANDS = [
    ["info", "{p}"], ["messages", "{p}"], ["rebuild", "{p}", "--out", "{tmp}/out"], ["recover", "{p}"],
    ["audit", "{p}", "--quiet"], ["expiry", "{p}"], ["get", "{p}", "--offset", "0"],
]




@pytest.fixture
def random_segment_store(tmp_path):
    root = tmp_path / "rnd"
    (root / "commitlog").mkdir(parents=True)
    (root / "commitlog" / ("0" * 20)).write_bytes(os.urandom(64 * 1024))
    return root


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_an_empty_directory_is_exit_2_with_one_line(capsys, tmp_path, argv):
    (tmp_path / "empty").mkdir()
    rc, out, err = run_cli(capsys, *[a.format(p=tmp_path / "empty", tmp=tmp_path) for a in argv])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "not a RocketMQ store root: no commitlog/ here" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_the_folder_above_a_store_names_the_store(capsys, tmp_path, sample_498, argv):
    rc, _, err = run_cli(capsys, *[a.format(p=sample_498, tmp=tmp_path) for a in argv])
    assert rc == 2 and f"did you mean {sample_498}/store?" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [a for a in COMMANDS if a[0] in ("messages", "rebuild", "recover", "get", "info")],
                         ids=lambda a: a[0])
def test_a_commitlog_of_random_bytes_fails_instead_of_printing_nothing(capsys, tmp_path, random_segment_store, argv):
    rc, _, err = run_cli(capsys, *[a.format(p=random_segment_store, tmp=tmp_path) for a in argv])
    assert rc != 0
    if argv[0] != "info":  # info shows the store and its findings, then exits 1
        assert "not_a_commitlog" in err and "does not start with a record" in err


def test_audit_of_a_random_commitlog_reports_why(capsys, random_segment_store):
    import json

    rc, out, _ = run_cli(capsys, "audit", random_segment_store, "--quiet", "--json")
    kinds = {f["kind"] for f in json.loads(out)["findings"]}
    assert rc == 1 and "commitlog_head_not_a_record" in kinds


def test_python_api_raises_a_typed_error(tmp_path, sample_498):
    from datasources.commitlog_reader import read_messages
    from storelib.broker.settings.store import Store

    with pytest.raises(NotAStoreError, match="does not exist"):
        read_messages(str(tmp_path / "nonexistent"))
    with pytest.raises(NotAStoreError, match="did you mean"):
        read_messages(str(sample_498))
    with pytest.raises(NotAStoreError):
        Store(str(sample_498))
    assert issubclass(NotAStoreError, StoreError)


@pytest.mark.spark
def test_spark_fails_at_planning_with_our_line_first(spark, sample_498):
    from datasources import register

    register(spark)
    with pytest.raises(Exception) as ei:
        spark.read.format("rocketmq").load(str(sample_498)).count()
    first = str(ei.value).splitlines()[0]
    assert "not a RocketMQ store root: no commitlog/ here" in first


def test_negative_limit_is_refused(capsys, sample_498):
    with pytest.raises(SystemExit) as ei:
        main(["messages", str(sample_498 / "store"), "--limit", "-1"])
    assert ei.value.code == 2 and "must be 0 or more" in capsys.readouterr().err


def test_os_errors_name_the_path_without_python_class_names(capsys, sample_498, tmp_path):
    rc, _, err = run_cli(capsys, "messages", sample_498 / "store", "--limit", "1", "--out", tmp_path / "no" / "dir" / "x")
    assert rc == 2 and "Error" not in err and f"{tmp_path}/no/dir/x" in err and "no such file" in err


def test_a_copy_without_the_lock_or_checkpoint_is_still_a_store(capsys, tmp_path, sample_498):
    root = tmp_path / "store"
    shutil.copytree(sample_498 / "store", root)
    (root / "lock").unlink()
    rc, _, _ = run_cli(capsys, "info", root, "--no-scan")
    assert rc == 0
