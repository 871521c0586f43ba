"""storelib.format.markers: abort / abort.bak / lock, including a live-lock probe against another process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from storelib.errors import StoreError
from storelib.fileio.bytesource import Location
from storelib.format.markers import (
    abort_state,
    hold_lock,
    lock_state,
    remove_abort,
    what_broker_does,
    write_abort,
)
from tests.conftest import extract_members as _extract


def test_sample_533_has_only_abort_bak_so_last_exit_was_clean(tmp_path):
    root = _extract(tmp_path, "rocketmq-5.3.3-small", ["store/abort.bak", "store/lock"]) / "store"
    st = abort_state(root)
    assert (st.exists, st.bak_exists, st.bak_content, st.last_exit_ok) == (False, True, "", True)
    assert "normal recovery" in what_broker_does(st) and "abort.bak is ignored" in what_broker_does(st)
    ls = lock_state(root)
    assert ls.exists and ls.content == b"lock" and ls.content_ok and ls.held_by_other is False


def test_abort_4x_style_is_empty_and_means_abnormal_recovery(tmp_path):
    write_abort(tmp_path)
    st = abort_state(tmp_path)
    assert (st.exists, st.content, st.pid, st.bak_exists) == (True, "", None, False)
    assert "abnormal recovery" in what_broker_does(st)
    assert remove_abort(tmp_path) is True and remove_abort(tmp_path) is False
    assert not abort_state(tmp_path).exists


def test_abort_5x_style_writes_pid_and_keeps_previous_in_bak(tmp_path):
    write_abort(tmp_path)
    write_abort(tmp_path, pid=4242)
    st = abort_state(tmp_path)
    assert (st.exists, st.content, st.pid, st.bak_exists, st.bak_content) == (True, "4242", 4242, True, "")
    assert "pid 4242" in what_broker_does(st)
    write_abort(tmp_path, pid=77)
    assert abort_state(tmp_path).bak_content == "4242"
    remove_abort(tmp_path)
    st = abort_state(tmp_path)
    assert not st.exists and st.bak_exists  # the broker never deletes abort.bak


def test_lock_state_without_lock_file(tmp_path):
    ls = lock_state(tmp_path)
    assert (ls.exists, ls.held_by_other) == (False, None)


_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
print("locked", flush=True)
sys.stdin.read()
"""


def test_lock_probe_sees_a_lock_held_by_another_process(tmp_path):
    (tmp_path / "lock").write_bytes(b"lock")
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path / "lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        ls = lock_state(tmp_path)
        assert ls.held_by_other is True and ls.content_ok
        if sys.platform.startswith("linux"):
            assert ls.holder_pid == proc.pid
        with pytest.raises(StoreError) as ei:
            with hold_lock(tmp_path):
                pass
        assert ei.value.kind == "locked"
    finally:
        proc.stdin.close()
        proc.wait()
    assert lock_state(tmp_path).held_by_other is False


def test_hold_lock_creates_lock_file_with_broker_content(tmp_path):
    with hold_lock(tmp_path) as path:
        assert Path(path).read_bytes() == b"lock"
    st = os.stat(tmp_path / "lock")
    assert st.st_size == 4


def test_lock_state_on_non_local_store_cannot_probe(tmp_path):
    (tmp_path / "lock").write_bytes(b"lock")
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    ls = lock_state(Location(fs, "", False))
    assert ls.exists and ls.content_ok and ls.held_by_other is None


def test_lock_probe_only_asks_and_never_takes_a_lock(tmp_path, monkeypatch):
    """A broker starting while a run reads its store must never meet a lock of ours in its tryLock: the
    probe asks with F_GETLK and takes nothing (not even a shared lock for a moment)."""
    import fcntl

    (tmp_path / "lock").write_bytes(b"lock")
    taken = []
    real_fcntl = fcntl.fcntl

    def spy(fd, cmd, *a):
        taken.append(cmd)
        return real_fcntl(fd, cmd, *a)

    def refuse(*a, **k):
        raise AssertionError("the probe took a lock")

    monkeypatch.setattr(fcntl, "lockf", refuse)
    monkeypatch.setattr(fcntl, "flock", refuse)
    monkeypatch.setattr(fcntl, "fcntl", spy)
    ls = lock_state(tmp_path)
    assert ls.held_by_other is False
    if sys.platform.startswith("linux"):
        assert taken and set(taken) == {fcntl.F_GETLK}


_JAVA_HOLDER = """
import java.io.RandomAccessFile;
import java.nio.channels.FileLock;
public class Holder {
    public static void main(String[] a) throws Exception {
        RandomAccessFile f = new RandomAccessFile(a[0], "rw");
        FileLock lock = f.getChannel().tryLock(0, 1, false);  // DefaultMessageStore.start()
        System.out.println(lock != null && lock.isValid() ? "locked " + ProcessHandle.current().pid() : "failed");
        System.out.flush();
        System.in.read();
    }
}
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or not shutil.which("java"), reason="needs a JVM on Linux")
def test_lock_probe_sees_the_jvm_filechannel_lock_a_broker_takes(tmp_path):
    src = tmp_path / "Holder.java"
    src.write_text(_JAVA_HOLDER)
    (tmp_path / "lock").write_bytes(b"lock")
    proc = subprocess.Popen(["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", str(src), str(tmp_path / "lock")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        assert line and line[0] == "locked", line
        ls = lock_state(tmp_path)
        assert ls.held_by_other is True and ls.holder_pid == int(line[1])
    finally:
        proc.stdin.close()
        proc.wait()
    assert lock_state(tmp_path).held_by_other is False
