"""Every topic the broker wrote is rebuilt as the broker would: non-ASCII and emoji names are directories."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest

from storelib.format.topicname import escape_topic, unsafe_reason
from tests.conftest import run_cli

ODD_TOPICS = ["订单事件_テスト_ñ", "Emoji🚀Topic", "with space.and dot", "Plain"]




def _tree(root: Path, *parts: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for part in parts for p in (root / part).rglob("*") if p.is_file())


def _gen(capsys, out: Path, topics: list[str], version: str = "4") -> None:
    argv = ["gen", out, "--messages", "1500", "--segment-size", "256KB", "--version", version, "--seed", "3",
            "--set", "mappedFileSizeConsumeQueue=2000", "--set", "maxHashSlotNum=100", "--set", "maxIndexNum=400"]
    for t in topics:
        argv += ["--topic-name", t]
    rc, _, _ = run_cli(capsys, *argv)
    assert rc == 0


@pytest.mark.parametrize("engine", ["local", pytest.param("spark", marks=pytest.mark.spark)])
@pytest.mark.parametrize("version", ["4", "5"])
def test_gen_then_rebuild_is_byte_identical_for_non_ascii_and_emoji_topics(capsys, tmp_path, engine, version, request):
    if engine == "spark":
        request.getfixturevalue("spark")
    store, out = tmp_path / "store", tmp_path / "out"
    _gen(capsys, store, ODD_TOPICS, version)
    assert {t for t in ODD_TOPICS} <= {p.name for p in (store / "consumequeue").iterdir()}
    argv = ["rebuild", store, "--out", out, "--engine", engine, "--quiet"]
    if engine == "spark":
        argv += ["--master", "local[2]"]
    rc, _, _ = run_cli(capsys, *argv)
    assert rc == 0
    files = _tree(store, "consumequeue", "index")
    assert files == _tree(out, "consumequeue", "index") and files
    assert all(filecmp.cmp(store / f, out / f, shallow=False) for f in files)


def test_an_unsafe_topic_is_one_finding_the_rest_is_rebuilt_and_exit_is_1(capsys, tmp_path):
    store, out = tmp_path / "store", tmp_path / "out"
    _gen(capsys, store, ["Fine", "../escape"])
    rc, outp, _ = run_cli(capsys, "rebuild", store, "--out", out, "--engine", "local", "--json")
    m = json.loads(outp)
    assert rc == 1 and [s["topic_escaped"] for s in m["skipped_topics"]] == ["'../escape'"]
    assert "Fine" in {p.name for p in (out / "consumequeue").iterdir()}
    assert not (tmp_path / "escape").exists() and not (out / "escape").exists()
    files = _tree(store, "consumequeue", "index")  # the generator's own dispatch skips it the same way
    assert all(filecmp.cmp(store / f, out / f, shallow=False) for f in files)


def test_audit_reports_an_unsafe_topic_once_not_per_queue(capsys, tmp_path):
    store = tmp_path / "store"
    _gen(capsys, store, ["Fine", "../escape"])
    rc, out, _ = run_cli(capsys, "audit", store, "--quiet", "--json")
    kinds = [(f["kind"], f["extra"].get("topic")) for f in json.loads(out)["findings"]]
    assert rc == 1 and sum(k == "unsafe_topic_name" for k, _ in kinds) == 1
    assert not any(k == "queue_missing" for k, _ in kinds)


def test_audit_queue_rows_of_an_unsafe_topic_are_its_own_and_all_lag(capsys, tmp_path):
    """Each queue of a topic that cannot be a directory has its row (every message is lag); no other
    queue's row is overwritten by it."""
    store = tmp_path / "store"
    _gen(capsys, store, ["Fine", "../escape"])
    rc, out, _ = run_cli(capsys, "audit", store, "--quiet", "--json")
    queues = json.loads(out)["queues"]
    bad = [q for q in queues if q["topic"] == "../escape"]
    fine = [q for q in queues if q["topic"] == "Fine"]
    assert {q["queue_id"] for q in bad} == {q["queue_id"] for q in fine} and len(bad) == len(fine)
    assert all(q["lag"] == q["messages"] > 100 and q["max_offset"] == 0 for q in bad)
    finding = next(f for f in json.loads(out)["findings"] if f["kind"] == "unsafe_topic_name")
    assert sum(q["messages"] for q in bad) == finding["extra"]["records"]
    assert fine and all(q["lag"] == 0 and q["max_offset"] == q["messages"] for q in fine)


def test_get_by_queue_works_for_an_emoji_topic_and_refuses_a_path(capsys, tmp_path):
    store = tmp_path / "store"
    _gen(capsys, store, ["Emoji🚀Topic"])
    rc, out, _ = run_cli(capsys, "get", store, "--queue", "Emoji🚀Topic:0:0")
    assert rc == 0 and json.loads(out)["topic"] == "Emoji🚀Topic"
    rc, _, err = run_cli(capsys, "get", store, "--queue", "../x:0:0")
    assert rc == 2 and "unsafe_topic_name" in err and len(err.strip().splitlines()) == 1


def test_escaped_names_are_printable_and_bounded():
    assert escape_topic("a\nb") == "'a\\nb'" and len(escape_topic("x" * 5000)) < 130
    assert unsafe_reason("é" * 128) and unsafe_reason("é" * 127) is None
