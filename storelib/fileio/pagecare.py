"""Reading beside a running broker without harming it: a read-rate budget, and leaving the page cache as
the run found it.

A broker serves its consumers from the page cache: the segment being written and the recent ones are hot.
An audit or export reading a cold segment pulls its pages in and, on a host short of memory, pushes the
broker's hot pages out. :class:`PageCare` notes which pages of a file are resident before a read
(``mincore`` over a mapping that is never touched: no page is faulted in, and a file that shrinks under
it costs nothing) and afterwards drops (``posix_fadvise(DONTNEED)``) only the pages of the range read
that were not resident before: pages the broker (or anyone) had in the cache stay. :class:`ReadPacer`
holds a reader to a rate.

Linux only reports page-cache residency of a file to a process that owns it or may write it (5.2,
"mincore: make it more conservative"); where residency cannot be told, nothing is dropped.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import time

import numpy as np

PAGE = mmap.PAGESIZE
READ_AHEAD_SETTLE_S = 0.02
READ_AHEAD_TRIES = 10  # settles of read-ahead still landing after the first drop (at most 0.2 s a file)
_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            lib.mincore.restype = ctypes.c_int
            _LIBC = lib
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC or None


def residency(path: str, lo: int = 0, hi: int | None = None) -> np.ndarray | None:
    """One bool per page of ``[lo, hi)`` of a file: is it in the page cache? None when it cannot be told
    (no mincore, no permission to see it, an empty file)."""
    lib = _libc()
    if lib is None or not hasattr(os, "posix_fadvise"):
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not (os.geteuid() == 0 or st.st_uid == os.geteuid() or os.access(path, os.W_OK)):
            return None  # the kernel would report only our own mappings' pages: blind
        hi = st.st_size if hi is None else min(hi, st.st_size)
        lo = lo - lo % PAGE
        if hi <= lo:
            return None
        with mmap.mmap(fd, hi - lo, access=mmap.ACCESS_READ, offset=lo) as mm:
            pages = -(-(hi - lo) // PAGE)
            vec = np.zeros(pages, np.uint8)
            arr = np.frombuffer(mm, np.uint8)
            try:
                rc = lib.mincore(ctypes.c_void_p(arr.ctypes.data), hi - lo, ctypes.c_void_p(vec.ctypes.data))
            finally:
                del arr
        return (vec & 1).astype(bool) if rc == 0 else None
    except (OSError, ValueError, BufferError):
        return None
    finally:
        os.close(fd)


def drop_pages(path: str, runs: list[tuple[int, int]]) -> int:
    """``posix_fadvise(DONTNEED)`` each byte range; returns the bytes advised."""
    if not runs or not hasattr(os, "posix_fadvise"):
        return 0
    n = 0
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        for a, b in runs:
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, a, b - a, os.POSIX_FADV_DONTNEED)
                n += b - a
    finally:
        os.close(fd)
    return n


class PageCare:
    """Remember which pages of ``path`` are cached now; :meth:`done` drops those of a range read since
    that were not (``path`` None: does nothing)."""

    def __init__(self, path: str | None):
        self.path = path
        self.before = residency(path) if path else None
        self.dropped = 0

    def done(self, lo: int, hi: int) -> int:
        """After reading ``[lo, hi)``: drop the pages it brought in; returns the bytes dropped."""
        if self.path is None or self.before is None or hi <= lo:
            return 0
        p0, p1 = lo // PAGE, min(len(self.before), -(-hi // PAGE))
        if p1 <= p0:
            return 0
        cold = ~self.before[p0:p1]
        edges = np.flatnonzero(np.diff(np.r_[0, cold.astype(np.int8), 0]))
        runs = [((p0 + int(a)) * PAGE, (p0 + int(b)) * PAGE) for a, b in zip(edges[::2], edges[1::2])]
        self.dropped += drop_pages(self.path, runs)
        # the kernel's asynchronous read-ahead of the last reads may still be landing (pages under I/O are
        # not dropped, and on a loaded host it can take longer than one settle): again while any of them is
        # in the cache, up to READ_AHEAD_TRIES times
        for _ in range(READ_AHEAD_TRIES):
            time.sleep(READ_AHEAD_SETTLE_S)
            drop_pages(self.path, runs)
            now = residency(self.path, p0 * PAGE, p1 * PAGE)
            if now is None:
                break
            n = min(len(now), len(cold))
            if not (now[:n] & cold[:n]).any():
                break
        return self.dropped


class ReadPacer:
    """Hold a reader to ``rate`` bytes a second (None: no limit): :meth:`took` sleeps when it runs ahead.

    ``share``: a small file that every reader of one run paces through (processes on this host: the
    local and pool engines), so the run as a whole keeps to ``rate`` however many tasks read at once. It
    holds the next moment (``time.monotonic``, one clock for the host's processes) from which the budget
    is free; a reader that took ``n`` bytes books ``n / rate`` seconds from there under ``flock`` and
    sleeps until its booking starts. Without it (Spark executors on other hosts) each reader keeps its
    own ``rate``, the run's budget split evenly by the caller."""

    def __init__(self, rate: float | None, share: str | None = None):
        self.rate = rate if rate and rate > 0 else None
        self.share = share
        self.t0 = time.monotonic()
        self.bytes = 0
        self.slept = 0.0

    def took(self, n: int) -> None:
        if self.rate is None or n <= 0:
            return
        self.bytes += n
        if self.share is not None:
            ahead = self._book(n / self.rate) - time.monotonic()
        else:
            ahead = self.bytes / self.rate - (time.monotonic() - self.t0)
        if ahead > 0.001:
            time.sleep(ahead)
            self.slept += ahead

    def _book(self, seconds: float) -> float:
        """Book ``seconds`` of the shared budget; the moment the booking starts."""
        import fcntl

        fd = os.open(self.share, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, 32, 0)
            try:
                free = float(raw.decode("ascii").strip() or 0.0)
            except (UnicodeDecodeError, ValueError):
                free = 0.0
            start = max(time.monotonic(), free)
            os.pwrite(fd, f"{start + seconds:<32.6f}".encode("ascii")[:32], 0)
            return start
        finally:
            os.close(fd)  # (releases the flock)


def shared_budget(directory: str) -> str:
    """A fresh budget file for one run's readers (:class:`ReadPacer` ``share``) in ``directory``."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix="rmqstore-read-budget-", dir=directory)
    os.close(fd)
    return path


__all__ = ["PAGE", "PageCare", "ReadPacer", "drop_pages", "residency", "shared_budget"]
