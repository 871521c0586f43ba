"""A damaged store still gets an answer: a finding that says what the broker does, not exit 2 or a traceback."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.conftest import broker_conf, run_cli


@pytest.fixture
def store(tmp_path, sample_498):
    root = tmp_path / "store"
    shutil.copytree(sample_498 / "store", root)
    return root


CONF = ["--broker-conf", str(broker_conf("4.9.8"))]


@pytest.mark.parametrize("delta", [+1, +7, -3])
def test_an_index_file_of_the_wrong_length_is_read_as_the_broker_maps_it(capsys, store, tmp_path, delta):
    name = sorted(os.listdir(store / "index"))[-1]  # the newest: not full, so the cut bytes were unused
    path = store / "index" / name
    size = path.stat().st_size
    os.truncate(path, size + delta)
    rc, out, _ = run_cli(capsys, "recover", store, *CONF, "--json", "--plan-file", "-")
    assert rc in (0, 1) and json.loads(out)["store"]
    rc, out, _ = run_cli(capsys, "info", store, *CONF, "--json")
    info = json.loads(out)
    assert rc == 0 and len(info["index_files"]) == 6
    notes = [f for f in info["findings"] if f["kind"] == "index_size_mismatch"]
    assert len(notes) == 1 and notes[0]["file"] == f"index/{name}" and notes[0]["severity"] == "warning"
    rc, out, _ = run_cli(capsys, "audit", store, *CONF, "--quiet", "--json")
    report = json.loads(out)
    assert rc == 0 and report["summary"]["index_files"] == 6
    assert [f["kind"] for f in report["findings"] if f["severity"] in ("error", "critical")] == []


def test_a_lock_file_grown_past_a_page_is_ignored_like_the_broker_does(capsys, store):
    with open(store / "lock", "ab") as f:
        f.write(os.urandom(10_000))
    rc, out, _ = run_cli(capsys, "info", store, *CONF, "--json", "--no-scan")
    assert rc == 0 and json.loads(out)["lock"]["exists"] is True
    rc, _, err = run_cli(capsys, "recover", store, *CONF, "--plan-file", "-")
    assert rc in (0, 1) and "too_large" not in err


def test_audit_with_every_segment_gone_but_index_files_left_gives_a_report(capsys, store, tmp_path):
    for name in os.listdir(store / "commitlog"):
        os.unlink(store / "commitlog" / name)
    rc, out, err = run_cli(capsys, "audit", store, *CONF, "--quiet", "--json")
    report = json.loads(out)
    assert rc == 1 and "Traceback" not in err and report["summary"]["records"] == 0
    assert report["summary"]["index_files"] == 6
    assert any(f["kind"] == "cq_entry_past_commitlog" for f in report["findings"])
