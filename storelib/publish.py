"""Atomic writes and publishing: temp file + rename for files, staging + manifest-last for trees.

Nothing the toolkit writes may ever be seen half-written: a file appears under its final name only
once complete (os.replace is atomic on one filesystem), and an output tree counts as published only
when its manifest exists, which is written last.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def atomic_local_file(path: str | os.PathLike, mode: int | None = None) -> Iterator[str]:
    """Yield a temp path beside ``path``; on success fsync and rename it over ``path``, else remove it."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
        _fsync_dir(d)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file and an atomic rename."""
    with atomic_local_file(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def _fsync_dir(d: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
