"""One scheduled run at a time per state file: a lock file held with ``flock`` for the whole run.

A run that finds the lock held by a live process exits with :data:`EXIT_LOCKED` and says who holds it
(pid, host, since when). The kernel releases a ``flock`` when its process dies, so the lock of a killed
run is stale the moment it dies and the next run takes it over (and says so). The lock file records
its holder as JSON for the message; it is removed when the run ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

EXIT_LOCKED = 3


class RunLocked(Exception):
    """Another live run holds the lock."""

    def __init__(self, path: str, holder: dict):
        self.path, self.holder = path, holder
        who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
        since = holder.get("started_at")
        super().__init__(f"another run holds {path} ({who}"
                         + (f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(since))}Z" if since else "")
                         + "): not starting a second one over the same store and state")


@dataclass
class Held:
    path: str
    took_over: dict | None  # the holder recorded by a run that died holding the lock


def lock_path_for(state_path: str) -> str:
    """The default lock beside a ``--since`` state file."""
    return state_path + ".lock"


def _read_holder(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 4096)
        return json.loads(data.decode("utf-8")) if data.strip() else {}
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def run_lock(path: str) -> Iterator[Held]:
    """Hold ``path`` for the block; raises :class:`RunLocked` when a live process holds it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunLocked(path, holder) from None
        # the file may have been removed (and recreated) by the holder that just finished: lock the
        # file that is at the path now, not an unlinked one
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    previous = _read_holder(fd)
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()}
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(me).encode("utf-8"))
    try:
        yield Held(path, previous or None)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        # released explicitly: a pool worker forked during the run shares this open file (and its lock)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


__all__ = ["EXIT_LOCKED", "Held", "RunLocked", "lock_path_for", "run_lock"]
