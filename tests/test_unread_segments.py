"""A commitlog segment of random bytes outside the recovery window is named on stderr by ``messages``,
``rebuild`` and ``recover --plan`` (they used to exit 0 and never mention it); a clean store gets no
such line."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli

SEG = 256 * 1024


@pytest.fixture(scope="module")
def clean_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("unread") / "store"
    rc, _, _ = _gen(root)
    assert rc == 0 and len(os.listdir(root / "commitlog")) >= 8
    return root


def _gen(root: Path):
    from jobs.cli import main

    return main(["gen", str(root), "--messages", "3000", "--segment-size", "256KB", "--seed", "5"]), "", ""


@pytest.fixture
def store(clean_store, tmp_path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(clean_store, root)
    return root


def _randomise(root: Path, k: int = 1) -> str:
    """Segment ``k`` (old: far before the recovery window of the last segments) becomes random bytes."""
    name = sorted(os.listdir(root / "commitlog"))[k]
    path = root / "commitlog" / name
    path.write_bytes(random.Random(k).randbytes(path.stat().st_size))
    return f"commitlog/{name}"


def _named(err: str, command: str, seg: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith(f"rmqstore {command}: {seg} @ 0: ")]


def test_messages_names_a_segment_of_random_bytes(store, capsys):
    rc, out, err = run_cli(capsys, "messages", store)
    assert rc == 0 and "rmqstore messages:" not in err
    clean = len(out.splitlines())
    seg = _randomise(store)
    rc, out, err = run_cli(capsys, "messages", store)
    assert rc == 0 and 0 < len(out.splitlines()) < clean  # the other segments' messages, and said why not all
    (line,) = _named(err, "messages", seg)
    assert "segment_unread" in line and f"the {SEG} bytes" in line


def test_rebuild_names_it_and_keeps_it_in_its_manifest(store, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "rebuild", store, "--out", tmp_path / "clean", "--quiet")
    assert rc == 0 and "rmqstore rebuild:" not in err
    seg = _randomise(store)
    rc, _, err = run_cli(capsys, "rebuild", store, "--out", tmp_path / "out", "--quiet")
    assert rc == 0
    (line,) = _named(err, "rebuild", seg)
    assert "reput_skipped_rest_of_segment" in line and "before the recovery window" in line
    m = json.loads((tmp_path / "out" / "rebuild-manifest.json").read_text())
    assert any("reput_skipped_rest_of_segment" in f and seg in f for f in m["recovery"]["findings"])


def test_recover_plan_names_it_and_puts_it_in_the_plan(store, capsys):
    rc, _, err = run_cli(capsys, "recover", store, "--json")
    assert "rmqstore recover:" not in err
    seg = _randomise(store)
    rc, out, err = run_cli(capsys, "recover", store, "--json")
    (line,) = _named(err, "recover", seg)
    assert "segment_not_records" in line
    plan = json.loads(out)
    assert [f["file"] for f in plan["findings"] if f["kind"] == "segment_not_records"] == [seg]
    assert not plan["changes"]  # the start-up changes nothing for it: the plan just says it is there


def test_an_oldest_segment_of_random_bytes_is_named_once_by_each(store, tmp_path, capsys):
    seg = _randomise(store, 0)
    for argv in (["messages", store], ["rebuild", store, "--out", tmp_path / "o", "--quiet"], ["recover", store]):
        _, _, err = run_cli(capsys, *argv)
        assert len(_named(err, argv[0], seg)) == 1, (argv[0], err)
