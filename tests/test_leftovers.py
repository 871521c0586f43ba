"""Runs leave nothing behind: no shipped-code directories in the temp dir, no stray plan files."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from jobs.cli import main
from jobs.spark.sparkutil import PYFILES_PREFIX, _package_zip, _sweep_pyfiles
from tests.conftest import REPO


def test_a_recover_preview_writes_nothing(tmp_path, sample_498, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = main(["recover", str(sample_498 / "store")])
    capsys.readouterr()
    assert rc in (0, 1) and os.listdir(tmp_path) == []
    rc = main(["recover", str(sample_498 / "store"), "--plan-file", str(tmp_path / "p.json")])
    assert rc in (0, 1) and os.listdir(tmp_path) == ["p.json"]


def test_the_shipped_code_directory_is_removed_when_the_process_exits(tmp_path):
    code = (f"import os, sys; sys.path.insert(0, {str(REPO)!r}); from jobs.spark.sparkutil import _package_zip; "
            "print(os.path.dirname(_package_zip()))")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    made = out.stdout.strip()
    assert os.path.basename(made).startswith(PYFILES_PREFIX) and not os.path.exists(made)


def test_a_dead_runs_directory_is_swept_and_a_live_ones_is_kept(tmp_path):
    dead = tmp_path / f"{PYFILES_PREFIX}999999999-x"
    live = tmp_path / f"{PYFILES_PREFIX}{os.getpid()}-y"
    other = tmp_path / "someone-elses"
    for d in (dead, live, other):
        d.mkdir()
    _sweep_pyfiles(str(tmp_path))
    assert not dead.exists() and live.exists() and other.exists()


def test_package_zip_names_its_directory_after_this_process():
    path = _package_zip()
    assert os.path.basename(os.path.dirname(path)).startswith(f"{PYFILES_PREFIX}{os.getpid()}-")
    assert os.path.dirname(os.path.dirname(path)) == tempfile.gettempdir()
