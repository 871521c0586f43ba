"""The store root's marker files: ``abort``, ``abort.bak`` and ``lock`` (store-format §7).

Whether ``abort`` exists decides how the next broker start recovers (its content never matters), and
the OS lock on byte 0 of ``lock`` is the only reliable sign that a broker is using the store right
now, so an offline tool must probe it before touching anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow.fs as pafs

from storelib.errors import StoreError
from storelib.fileio.bytesource import Location
from storelib.fileio.smallfile_io import (
    PathOrLocation,
    as_location,
    atomic_write,
    file_size,
    local_path,
    read_small,
)

ABORT_FILE = "abort"
ABORT_BAK_FILE = "abort.bak"
LOCK_FILE = "lock"
LOCK_CONTENT = b"lock"
_MAX_MARKER = 4096  # a PID or "lock"; anything bigger is not a marker the broker wrote


@dataclass(frozen=True)
class AbortState:
    """What the abort markers say. Only ``exists`` matters to the broker."""

    exists: bool
    content: str | None = None  # None when absent; "" for a 4.9.8 marker
    pid: int | None = None  # the 5.x broker writes its PID as decimal text
    bak_exists: bool = False
    bak_content: str | None = None
    unusual: str | None = None  # an abort the broker never writes (a directory, a big file): it still counts

    @property
    def last_exit_ok(self) -> bool:
        """The broker's ``lastExitOK``: no abort file."""
        return not self.exists


@dataclass(frozen=True)
class LockState:
    """The ``lock`` file and the result of a non-blocking probe of the broker's lock on byte 0.

    ``held_by_other`` is True when another process holds a conflicting lock (a live broker), False when
    the probe got the lock, None when it could not tell (no file, remote store, locking unsupported).
    A POSIX lock held by *this* process is invisible to the probe.
    """

    exists: bool
    content: bytes | None = None
    content_ok: bool = False
    held_by_other: bool | None = None
    holder_pid: int | None = None
    detail: str = ""


def _root(where: PathOrLocation) -> Location:
    return as_location(where)


def _decode_marker(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _parse_pid(text: str) -> int | None:
    t = text.strip()
    return int(t) if t.isdigit() and len(t) < 12 else None


def _read_marker(loc: Location) -> tuple[bool, bytes | None, str | None]:
    """(exists, content, what is unusual) of a marker: the broker only asks File.exists(), so any size and
    a directory count; content is kept only for what a broker writes (a PID: at most 4096 bytes)."""
    try:
        info = loc.fs.get_file_info(loc.path)
    except OSError as e:
        raise StoreError(loc.path, None, "unreadable", str(e)) from e
    if info.type == pafs.FileType.NotFound:
        return False, None, None
    if info.type != pafs.FileType.File:
        return True, None, f"{loc.path} is a {info.type.name.lower()}, not a file (File.exists() is still true)"
    size = int(info.size or 0)
    if size > _MAX_MARKER:
        return True, None, f"{loc.path} is {size} bytes, no marker a broker writes (its existence is what counts)"
    raw = read_small(loc, _MAX_MARKER)
    return raw is not None, raw, None


def abort_state(root: PathOrLocation) -> AbortState:
    """Read ``abort`` and ``abort.bak`` of a store root (local path, URI or Location)."""
    loc = _root(root)
    exists, raw, unusual = _read_marker(loc.join(ABORT_FILE))
    bak_exists, bak, _ = _read_marker(loc.join(ABORT_BAK_FILE))
    content = _decode_marker(raw) if raw is not None else None
    return AbortState(
        exists=exists,
        content=content,
        pid=_parse_pid(content) if content else None,
        bak_exists=bak_exists,
        bak_content=_decode_marker(bak) if bak is not None else None,
        unusual=unusual,
    )


def write_abort(root: str | os.PathLike | Location, pid: int | None = None) -> str:
    """Create the abort marker, as a broker's createTempFile does after start-up recovery.

    ``pid=None`` is 4.9.8 (File.createNewFile): an empty file, and an existing ``abort`` (a crash's) is
    left as it is. With a PID it is 5.3.3: createNewFile, then MixAll.string2File copies the file's
    content (``""`` when it was just created, else the stale one) to ``abort.bak`` and writes the PID as
    decimal text, so every 5.x start leaves ``abort.bak``. Returns the path of ``abort``.
    """
    base = local_path(root)
    path = os.path.join(base, ABORT_FILE)
    if pid is None:
        if not os.path.lexists(path):
            atomic_write(path, b"")
        return path
    if pid < 0:
        raise StoreError(path, None, "bad_value", f"pid {pid} is negative")
    if os.path.isdir(path):  # file2String opens it: FileNotFoundException, the 5.x start fails
        raise StoreError(path, None, "not_a_file", "abort is a directory: a 5.x broker cannot start on this store")
    prev = b""
    if os.path.exists(path):
        with open(path, "rb") as f:
            prev = f.read()
    atomic_write(os.path.join(base, ABORT_BAK_FILE), prev)
    atomic_write(path, str(pid).encode("ascii"))
    return path


def remove_abort(root: str | os.PathLike | Location) -> bool:
    """Delete ``abort`` (a clean shutdown); ``abort.bak`` stays, the broker never deletes it.

    Returns True when a file was removed.
    """
    path = os.path.join(local_path(root), ABORT_FILE)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise StoreError(path, None, "write_failed", str(e)) from e
    return True


_FLOCK = struct.Struct("hhqqi0q")  # Linux struct flock: l_type, l_whence, l_start, l_len, l_pid (+ padding)


def _probe_lock(path: str) -> tuple[bool | None, int | None, str]:
    """Ask (F_GETLK) whether another process holds a lock on byte 0 that an exclusive lock would meet.

    The JVM's ``FileChannel.tryLock(0, 1, false)`` is an fcntl record lock on Linux (``/proc/locks``
    shows ``POSIX ... WRITE``), so fcntl is the call that sees it. F_GETLK only asks: it takes nothing,
    so a broker starting while we look never finds our lock in its way (its ``tryLock`` would fail and
    the start abort). Needs no write permission. Off Linux the struct's layout differs: not probed.
    """
    if not sys.platform.startswith("linux"):
        return None, None, "lock probe not supported on this platform"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return None, None, f"cannot open: {e}"
    try:
        req = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
        l_type, _, _, _, l_pid = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, req))
    except (OSError, struct.error) as e:
        return None, None, f"lock probe failed: {e}"
    finally:
        os.close(fd)  # we held no lock: closing drops nothing
    if l_type == fcntl.F_UNLCK:
        return False, None, "not locked"
    pid = l_pid if l_pid > 0 else None  # 0: the holder is in another pid namespace
    who = f" (pid {pid})" if pid else ""
    return True, pid, f"another process{who} holds the lock on byte 0: a live broker?"


def pid_alive(pid: int | None) -> bool:
    """Is ``pid`` a running process on this host? (signal 0: no signal sent, only the permission check)"""
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    except OSError:
        return False
    return True


def _read_first(loc: Location, n: int) -> bytes | None:
    """The first ``n`` bytes of a file (fewer if shorter), None when it does not exist."""
    if file_size(loc) is None:
        return None
    try:
        with loc.fs.open_input_file(loc.path) as f:
            return bytes(f.read(n))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StoreError(loc.path, None, "unreadable", str(e)) from e


def lock_state(root: PathOrLocation) -> LockState:
    """Inspect ``lock``: presence, the 4 bytes ``lock``, and whether a live process holds it."""
    loc = _root(root)
    lock_loc = loc.join(LOCK_FILE)
    raw = _read_first(lock_loc, len(LOCK_CONTENT))  # the broker never reads it: any length is fine
    if raw is None:
        return LockState(exists=False, detail="no lock file (never started, or not a store root)")
    ok = raw[:4] == LOCK_CONTENT
    if not loc.local:
        return LockState(True, raw, ok, None, None, "remote store: the OS lock cannot be probed")
    held, holder, detail = _probe_lock(lock_loc.path)
    return LockState(True, raw, ok, held, holder, detail)


@contextlib.contextmanager
def hold_lock(root: str | os.PathLike | Location) -> Iterator[str]:
    """Take the broker's lock (exclusive, non-blocking) for the duration of an offline write.

    Raises StoreError(``locked``) when another process holds it. Creates ``lock`` with the broker's
    content when it is missing; an existing file is not rewritten.
    """
    path = os.path.join(local_path(root), LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StoreError(path, None, "unreadable", str(e)) from e
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
        except (BlockingIOError, PermissionError) as e:
            raise StoreError(
                path, 0, "locked", "another process (a live broker?) holds the store lock"
            ) from e
        if os.fstat(fd).st_size == 0:
            os.pwrite(fd, LOCK_CONTENT, 0)
        yield path
    finally:
        os.close(fd)


def what_broker_does(abort: AbortState) -> str:
    """One line on what the next broker start will do, given the abort markers."""
    if abort.exists:
        who = f" (written by pid {abort.pid})" if abort.pid is not None else ""
        return (
            f"abort file present{who}: the last exit was abnormal, so the broker runs abnormal recovery "
            "(re-scans the commitlog from the newest segment older than checkpoint minTimestamp, re-dispatches "
            "every valid record to consume queues and index, and first deletes index files newer than "
            "indexMsgTimestamp)"
        )
    bak = "; abort.bak is ignored" if abort.bak_exists else ""
    return (
        "no abort file: the last exit was clean, so the broker runs normal recovery (checks the last three "
        f"commitlog segments, truncates after the last valid record, no re-dispatch){bak}"
    )
