"""Scratch of one run on this host (the audit's task tables on the local and pool engines): in the memory
filesystem when it is there and the run's scratch fits a small share of the host's memory, on disk
otherwise or where the user set TMPDIR, and never left behind in memory by a killed run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import storelib.fileio.memory as memory
from jobs.audit import audit_store

from .test_audit import store_fixtures

base_store, store = store_fixtures("scratch")


def test_scratch_goes_to_memory_only_when_it_fits_and_the_user_set_no_tmpdir(tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.setattr(memory, "_mem_available", lambda: 8000)
    assert memory.scratch_dir(1000, str(shm)) == str(shm)  # 1/8 of the available memory
    assert memory.scratch_dir(1001, str(shm)) is None
    assert memory.scratch_dir(10, str(tmp_path / "none")) is None  # no memory filesystem here
    monkeypatch.setattr(memory, "_mem_available", lambda: None)
    assert memory.scratch_dir(10, str(shm)) is None  # how much memory is free cannot be told
    monkeypatch.setattr(memory, "_mem_available", lambda: 8000)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert memory.scratch_dir(10, str(shm)) is None  # the user's choice wins


def test_the_scratch_of_a_killed_run_is_swept_and_a_live_ones_kept(tmp_path):
    ns = memory._pid_namespace()
    if not ns:
        pytest.skip("the PID namespace cannot be told here")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = [f"rmqstore-audit-p{pid}.{ns}-abc" for pid in (dead.pid, os.getpid())]
    names += [f"rmqstore-audit-p{dead.pid}.1{ns}-abc",  # a process of another PID namespace: not judged
              "rmqstore-audit-other"]  # not named by a process: not ours to judge
    for n in names:
        (tmp_path / n).mkdir()
        (tmp_path / n / "t.arrow").write_bytes(b"x")
    assert memory.scratch_stem("rmqstore-audit-") == f"rmqstore-audit-p{os.getpid()}.{ns}-"
    assert memory.sweep_dead_scratch(str(tmp_path), "rmqstore-audit-") == 1
    assert {p.name for p in tmp_path.iterdir()} == set(names[1:])


def test_a_pool_audit_of_a_small_store_keeps_its_task_tables_in_memory_and_removes_them(store, monkeypatch,
                                                                                         capsys):
    monkeypatch.delenv("TMPDIR", raising=False)
    if memory.scratch_dir(1) is None:
        pytest.skip("no writable memory filesystem on this host")
    rep = audit_store(str(store), quiet=False, engine="pool", workers=2)
    said = [ln for ln in capsys.readouterr().err.splitlines() if "task tables go through" in ln]
    assert len(said) == 1 and f"{memory.SHM_DIR}/{memory.scratch_stem('rmqstore-audit-')}" in said[0], said
    where = said[0].split("go through ", 1)[1].strip()
    assert not os.path.exists(where)
    assert rep["summary"]["records"] > 0


def test_a_rebuild_on_this_host_puts_its_intermediate_files_in_memory_and_writes_the_same_bytes(
        store, tmp_path, monkeypatch):
    """Phase A's intermediate files (consume-queue parts, keys, records) go to the memory filesystem on
    the local and pool engines, are gone afterwards, and the output is the bytes written through
    ``staging/_work`` (where they go with TMPDIR set)."""
    import jobs.engines.rebuild_tasks as rebuild_tasks
    from jobs.rebuild import RebuildConfig, rebuild

    monkeypatch.delenv("TMPDIR", raising=False)
    if memory.scratch_dir(1) is None:
        pytest.skip("no writable memory filesystem on this host")
    places: list = []
    real = rebuild_tasks._work_place
    monkeypatch.setattr(rebuild_tasks, "_work_place", lambda *a: places.append(real(*a)) or places[-1])

    def tree(root):
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file() and "manifest" not in p.name}

    for engine in ("local", "pool"):
        rebuild(RebuildConfig(store=str(store), out=str(tmp_path / engine), engine=engine, progress=False))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    rebuild(RebuildConfig(store=str(store), out=str(tmp_path / "disk"), engine="pool", progress=False))
    shm = f"{memory.SHM_DIR}/{memory.scratch_stem('rmqstore-rebuild-')}"
    assert [p.path.startswith(shm) for p in places] == [True, True, False]
    assert places[2].path.endswith("/_work") and places[2].path.startswith(str(tmp_path))  # staging's
    assert not any(os.path.exists(p.path) for p in places)
    assert tree(tmp_path / "local") == tree(tmp_path / "pool") == tree(tmp_path / "disk")
    assert tree(tmp_path / "local")  # consume queues and index files were written
