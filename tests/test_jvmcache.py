"""The Spark driver JVM's class-data archive: dumped once in the background, published only when a JVM
starts with it, mapped by later sessions, never on our output, and a damaged one is never fatal."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.spark import jvmcache

pytestmark = pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                                reason="no Java runtime")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("RMQSTORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RMQSTORE_JVM_CDS", "1")
    return tmp_path / "cache" / "jvm"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_first_start_dumps_under_a_lock_and_a_second_concurrent_start_runs_without(cache):
    first = jvmcache.plan_archive()
    assert first.dump_to is not None and any(o.startswith("-XX:ArchiveClassesAtExit=") for o in first.options)
    second = jvmcache.plan_archive()  # the lock is held by the first plan's descriptor
    assert second.options == () and second.dump_to is None
    os.close(first.lock_fd)
    third = jvmcache.plan_archive()
    assert third.dump_to == first.dump_to
    os.close(third.lock_fd)


def test_off_by_environment(cache, monkeypatch):
    monkeypatch.setenv("RMQSTORE_JVM_CDS", "0")
    assert jvmcache.plan_archive().options == ()
    assert not cache.exists()


def test_a_dump_cut_short_is_never_published(cache):
    cache.mkdir(parents=True)
    tmp, final = cache / "x.jsa.tmp", cache / "x.jsa"
    tmp.write_bytes(b"\x00" * 4096)  # a JVM killed before writing the header
    assert not jvmcache.publish_when_done(_dead_pid(), tmp, final)
    assert not tmp.exists() and not final.exists()


def _spark_child(tmp_path: Path) -> subprocess.CompletedProcess:
    code = ("from jobs.spark.sparkutil import get_spark\n"
            "s = get_spark('local[1]', app_name='cds-test')\n"
            "print(s.range(3).count())\n")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])


def test_archive_dumped_in_the_background_then_mapped_quietly(cache, tmp_path):
    first = _spark_child(tmp_path)
    assert first.returncode == 0, first.stderr
    key = jvmcache.archive_key()
    deadline = time.monotonic() + 240
    while not (cache / key).exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert (cache / key).exists(), sorted(os.listdir(cache))
    assert jvmcache.valid_archive(cache / key) and jvmcache.maps_cleanly(cache / key)
    assert not (cache / f"{key}.tmp").exists()
    plan = jvmcache.plan_archive()
    assert plan.options[0] == f"-XX:SharedArchiveFile={cache / key}" and plan.dump_to is None
    second = _spark_child(tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines() == ["3"]  # nothing of the JVM's CDS logging on our output
    assert "cds" not in second.stderr.lower()
    # a damaged archive (truncated: the JVM aborts on it rather than ignoring it) is never published,
    # and one found in place is dropped while the session starts without it, silently
    damaged = cache / "damaged.tmp"
    damaged.write_bytes((cache / key).read_bytes()[: (cache / key).stat().st_size // 2])
    assert not jvmcache.maps_cleanly(damaged)
    assert not jvmcache.publish_when_done(_dead_pid(), damaged, cache / "other.jsa")
    damaged.write_bytes((cache / key).read_bytes()[: (cache / key).stat().st_size // 2])
    os.replace(damaged, cache / key)
    third = _spark_child(tmp_path)
    assert third.returncode == 0, third.stderr
    assert third.stdout.splitlines() == ["3"]
    assert not (cache / key).exists()
