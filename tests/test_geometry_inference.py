"""A store copied without its broker.conf reads as it does with it: the files give their own geometry."""

from __future__ import annotations

import json
import shutil
import tarfile

import pytest

from storelib.broker.settings.geometry import index_geometry_of, infer_geometry
from storelib.fileio.bytesource import resolve
from storelib.format.indexfile import HEADER_SIZE
from tests.conftest import SAMPLES, broker_conf, run_cli

TIMER_SAMPLE = "rocketmq-5.3.3-timer-small"




def _conf(path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            k, _, v = line.partition("=")
            if v.strip().isdigit():
                out[k.strip()] = int(v)
    return out


def _version(sample) -> str:
    return "4.9.8" if "4.9.8" in sample.name else "5.3.3"


def test_inferred_geometry_equals_the_broker_conf_that_wrote_each_sample(sample):
    conf = _conf(broker_conf(_version(sample)))
    got = {i.key: i.value for i in infer_geometry(resolve(str(sample / "store")))}
    assert got == {k: conf[k] for k in ("mappedFileSizeConsumeQueue", "maxHashSlotNum", "maxIndexNum")}


def test_the_timer_sample_gives_its_timerlog_size_too(tmp_path):
    with tarfile.open(SAMPLES / f"{TIMER_SAMPLE}.tar.gz") as tf:
        tf.extractall(tmp_path, filter="data")
    got = {i.key: i.value for i in infer_geometry(resolve(str(tmp_path / TIMER_SAMPLE / "store")))}
    conf = _conf(SAMPLES / f"{TIMER_SAMPLE}.broker.conf")
    assert got["mappedFileSizeTimerLog"] == conf["mappedFileSizeTimerLog"] == 8192
    assert (got["maxHashSlotNum"], got["maxIndexNum"]) == (conf["maxHashSlotNum"], conf["maxIndexNum"])


def test_an_index_file_without_entries_tells_nothing():
    header = bytes(HEADER_SIZE)
    assert index_geometry_of(header + bytes(4 * 10 + 20 * 10), HEADER_SIZE + 240) is None


def test_info_without_broker_conf_equals_info_with_it(capsys, sample):
    store = sample / "store"
    _, with_conf, _ = run_cli(capsys, "info", store, "--broker-conf", broker_conf(_version(sample)), "--json")
    rc, without, _ = run_cli(capsys, "info", store, "--json")
    a, b = json.loads(with_conf), json.loads(without)
    assert rc == 0 and b["index_files"] == a["index_files"] and len(b["index_files"]) == 6
    assert b["queues"] == a["queues"]
    bad = [f for f in b["findings"] if f["severity"] in ("warning", "error", "critical")]
    assert bad == []
    assert {f["kind"] for f in b["findings"]} >= {"geometry_inferred"}


def test_get_by_queue_and_by_key_without_broker_conf(capsys, sample_498):
    store = sample_498 / "store"
    rc, out, _ = run_cli(capsys, "get", store, "--queue", "OrderEvents:2:150")
    assert rc == 0 and json.loads(out)["queue_offset"] == 150
    q = json.loads((sample_498 / "expected" / "index_queries.jsonl").read_text().splitlines()[0])
    rc, out, _ = run_cli(capsys, "get", store, "--key", q["key"], "--topic", q["topic"])
    assert rc == 0 and json.loads(out.splitlines()[0])["phy_offset"] == q["phyOffsets"][0]


def test_audit_without_broker_conf_is_clean(capsys, sample):
    rc, out, _ = run_cli(capsys, "audit", sample / "store", "--quiet", "--json")
    report = json.loads(out)
    assert rc == 0 and report["summary"]["index_files"] == 6
    assert [f for f in report["findings"] if f["severity"] != "info"] == []


@pytest.mark.parametrize("sets,folded_kind", [
    (["maxHashSlotNum=300", "maxIndexNum=780"], "index"),  # same file size, wrong slot table
    (["maxHashSlotNum=100"], "index"),  # wrong size
    (["mappedFileSizeConsumeQueue=6000000"], "consumequeue"),
])
def test_a_setting_the_files_contradict_is_one_finding_not_a_wall(capsys, sample_498, sets, folded_kind):
    argv = [a for s in sets for a in ("--set", s)]
    rc, out, _ = run_cli(capsys, "audit", sample_498 / "store", "--quiet", "--json", *argv)
    report = json.loads(out)
    serious = [f for f in report["findings"] if f["severity"] in ("warning", "error", "critical")]
    assert rc == 1 and [f["kind"] for f in serious] == ["geometry_conflict"]
    conflict = serious[0]
    assert conflict["file"].startswith(folded_kind) and conflict["extra"]["folded"] > 0
    assert all(f"--set {s.split('=')[0]}=" in conflict["detail"] for s in sets)


def test_broker_conf_still_wins_over_the_files(tmp_path, sample_498):
    store = tmp_path / "store"
    shutil.copytree(sample_498 / "store", store)
    from storelib.broker.settings.store import load_settings

    s = load_settings(None, None, {"maxHashSlotNum": "300", "maxIndexNum": "780"}, resolve(str(store)))
    assert (s.max_hash_slot_num, s.max_index_num) == (300, 780)
    assert [i.key for i in s.geometry_conflicts] == ["maxHashSlotNum", "maxIndexNum"]
