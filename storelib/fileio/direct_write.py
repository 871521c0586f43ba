"""Sequential writes of big new files that bypass the page cache (O_DIRECT), for files written once.

An index file is 420 MB at the default geometry. Written through the page cache, every 4 KiB page is
allocated (and later evicted) by the kernel: on the benchmark VM a buffered 330 MB write costs ~0.5
CPU-s of system time, with O_DIRECT ~0.03 s (the device takes 2 GB/s). The data is gathered in one
page-aligned buffer and written in whole blocks; the last block is padded with zeros and the file is
then truncated to its real length (zeros and sparse tails are what the files hold there anyway).

Where O_DIRECT is not available (other systems, tmpfs, some network filesystems) the same object
writes through the page cache. Readers see the data either way (the kernel keeps O_DIRECT writes and
cached pages coherent).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import uuid
from collections.abc import Iterator
from typing import Any

from storelib.fileio.smallfile_io import fsync_dir

BLOCK = 4096  # alignment of O_DIRECT offsets, lengths and buffer addresses (covers 512-byte devices)
DEFAULT_BUFFER = 8 << 20


class DirectFileWriter:
    """A write-only, sequential binary file over ``fd`` (opened for writing, empty, position 0).

    ``write`` copies into an aligned buffer that is written out in whole blocks; ``flush`` writes the
    rest (padded to a block) and ends the stream; ``truncate(size)`` sets the final length. ``fd`` is
    not closed (see :func:`open_direct`).
    """

    def __init__(self, fd: int, *, direct: bool, buffer_size: int = DEFAULT_BUFFER):
        self.fd = fd
        self.direct = direct
        size = max(BLOCK, buffer_size // BLOCK * BLOCK)
        self._buf = mmap.mmap(-1, size)  # page-aligned, reused for the whole file
        self._view = memoryview(self._buf)
        self._fill = 0
        self._pos = 0  # file offset of the buffer's first byte
        self._done = False

    def write(self, data: Any) -> int:
        if self._done:
            raise ValueError("write after flush: a DirectFileWriter is written once, front to back")
        src = memoryview(data).cast("B")
        n = len(src)
        i = 0
        cap = len(self._buf)
        while i < n:
            k = min(cap - self._fill, n - i)
            self._view[self._fill: self._fill + k] = src[i: i + k]
            self._fill += k
            i += k
            if self._fill == cap:
                self._drain(cap)
        return n

    def _drain(self, length: int) -> None:
        """Write the first ``length`` bytes of the buffer (a multiple of BLOCK) at the current offset."""
        done = 0
        while done < length:
            try:
                w = os.pwrite(self.fd, self._view[done:length], self._pos + done)
            except OSError as e:
                if e.errno != errno.EINVAL or not self.direct:
                    raise
                self._buffered()  # the filesystem refuses O_DIRECT after all: go through the cache
                continue
            done += w
        self._pos += length
        self._fill = 0

    def _buffered(self) -> None:
        import fcntl

        flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~getattr(os, "O_DIRECT", 0))
        self.direct = False

    def flush(self) -> None:
        """Write what is buffered (padded with zeros to a block) and end the stream."""
        if self._done:
            return
        end = self._pos + self._fill
        if self._fill:
            padded = -(-self._fill // BLOCK) * BLOCK
            self._view[self._fill: padded] = bytes(padded - self._fill)
            self._drain(padded)
        os.ftruncate(self.fd, end)  # the padding is not part of the file
        self._pos = end
        self._done = True

    def truncate(self, size: int) -> None:
        self.flush()
        os.ftruncate(self.fd, size)

    def close(self) -> None:
        self.flush()
        self._view.release()
        self._buf.close()

    def __enter__(self) -> DirectFileWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:  # an error: release the buffer, leave the (temp) file to the caller
            self._view.release()
            self._buf.close()


def open_direct(path: str | os.PathLike, *, buffer_size: int = DEFAULT_BUFFER) -> tuple[int, DirectFileWriter]:
    """Create ``path`` (must not exist) for a :class:`DirectFileWriter`; returns (fd, writer).

    O_DIRECT when the platform and filesystem take it, else an ordinary file. The caller closes ``fd``
    (after an fsync if it wants one) once the writer is closed.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    o_direct = getattr(os, "O_DIRECT", 0)
    if o_direct:
        try:
            fd = os.open(path, flags | o_direct, 0o644)
            return fd, DirectFileWriter(fd, direct=True, buffer_size=buffer_size)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    fd = os.open(path, flags, 0o644)
    return fd, DirectFileWriter(fd, direct=False, buffer_size=buffer_size)


@contextlib.contextmanager
def atomic_direct_file(path: str | os.PathLike, *, buffer_size: int = DEFAULT_BUFFER) -> Iterator[DirectFileWriter]:
    """A :class:`DirectFileWriter` over a temp file beside ``path``: on success it is flushed, fsynced and
    renamed over ``path`` (then the directory is fsynced); on any error the temp file is removed."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        fd, fh = open_direct(tmp, buffer_size=buffer_size)
        try:
            with fh:
                yield fh
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(d)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


__all__ = ["BLOCK", "DirectFileWriter", "atomic_direct_file", "open_direct"]
