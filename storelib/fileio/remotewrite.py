"""Whole-object writes to a remote filesystem: written to a temp object beside the target and moved over
it only once complete, so a reader never sees half a file (the remote analogue of temp-file-then-rename)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from storelib.fileio.bytesource import Location


@contextlib.contextmanager
def remote_output(loc: Location) -> Iterator[Any]:
    """An output stream to a temp object beside ``loc``, moved over it once written (copied where the
    filesystem cannot move); the temp object is removed when writing fails."""
    loc.fs.create_dir(loc.path.rsplit("/", 1)[0], recursive=True)
    tmp = loc.path + f".{uuid.uuid4().hex[:8]}.tmp"
    try:
        with loc.fs.open_output_stream(tmp) as f:
            yield f
    except BaseException:
        with contextlib.suppress(OSError, pa.ArrowException):
            loc.fs.delete_file(tmp)
        raise
    try:
        loc.fs.move(tmp, loc.path)
    except (OSError, NotImplementedError, pa.ArrowException):
        pafs.copy_files(tmp, loc.path, source_filesystem=loc.fs, destination_filesystem=loc.fs)
        loc.fs.delete_file(tmp)
