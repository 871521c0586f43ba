"""Consume queues built from dispatch-ordered chunks and written as they grow (a full rebuild's merge).

:func:`storelib.broker.dispatch.cqwriter.build_consume_queues` over a whole store holds every queue at once (units,
row numbers, the input table): memory grows with the store. :class:`ConsumeQueueStream` runs it chunk
by chunk, carrying each queue's :class:`QueueState` (the broker's writer continues exactly so), and
appends each chunk's units to the queue's open file: a local file is appended to on disk and hashed
as written, so memory holds one chunk, not the queue; a remote file (no appends) keeps its unfinished
file's bytes until it is complete. The files are those :func:`storelib.broker.dispatch.cqwriter.write_consume_queues`
makes from the one-shot build, byte for byte (fresh queues only: nothing is read back).
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from storelib.broker.dispatch.cqwriter import QueueImage, QueueState, build_consume_queues, write_file
from storelib.errors import StoreError
from storelib.fileio.bytesource import Location
from storelib.format.consumequeue import (
    CQ_DTYPE,
    DEFAULT_CQ_SEGMENT_SIZE,
    as_location,
    check_segment_size,
    file_name,
)
from storelib.format.topicname import unsafe_reason

_ZEROS = memoryview(bytes(1 << 20))
CLOSE_THREADS = 2  # hashing threads at close: one more than the task's own core


@dataclass
class _OpenFile:
    """One queue's last file while later chunks may still append to it."""

    target: Location
    base: int
    first: int  # file offset of the first data byte (zeros before it)
    pos: int  # file offset after the last data byte
    sha: Any = None  # local: hash of the bytes so far (zeros before ``first`` included)
    cm: AbstractContextManager | None = None  # local: the temp file's atomic_local_file context
    tmp: str | None = None
    chunks: list[bytes] = field(default_factory=list)  # remote: the data so far


class ConsumeQueueStream:
    """Feed dispatch-ordered CQ rows chunk by chunk (:meth:`feed`), then :meth:`close`; the written paths
    are in ``paths``, their SHA-256 in ``digests`` when given. Use as a context manager: an error
    removes the temp files of files not yet complete."""

    def __init__(self, consumequeue_dir: Location | str, segment_size: int = DEFAULT_CQ_SEGMENT_SIZE,
                 digests: dict[str, str] | None = None):
        self.root = as_location(consumequeue_dir)
        self.S = check_segment_size(segment_size)
        self.digests = digests
        self.state: dict[tuple[str, int], QueueState] = {}
        self.open: dict[tuple[str, int], _OpenFile] = {}
        self.paths: list[str] = []
        self.records = 0

    @property
    def queues(self) -> int:
        return len(self.state)

    def feed(self, records: pa.Table | pa.RecordBatch) -> None:
        """Run the broker's CQ writer over the next rows (dispatch order) and append to the queues' files."""
        self.records += records.num_rows
        images = build_consume_queues(records, segment_size=self.S, state=self.state)
        for key, img in sorted(images.items(), key=lambda kv: kv[0]):
            self.state[key] = img.state
            if unsafe_reason(key[0]) is None:  # an unsafe name is never a path (the caller reports it)
                self._append(key, img)

    def _append(self, key: tuple[str, int], img: QueueImage) -> None:
        if img.prefix is not None:
            raise StoreError(None, None, "internal", "ConsumeQueueStream builds fresh queues only")
        raw = np.ascontiguousarray(img.entries, dtype=CQ_DTYPE).view(np.uint8)
        S = self.S
        for base in img.segment_bases:
            lo, hi = max(base, img.start), min(base + S, img.end)
            data = raw[lo - img.start: hi - img.start] if hi > lo else raw[:0]
            pos = lo - base if hi > lo else 0
            f = self.open.get(key)
            if f is not None and f.base == base and (hi <= lo or pos == f.pos):
                self._write(f, data)
                continue
            if f is not None:
                self._finish(key)
            f = self._start(key, base, pos)
            self._write(f, data)

    def _start(self, key: tuple[str, int], base: int, first: int) -> _OpenFile:
        target = self.root.join(key[0], str(key[1]), file_name(base))
        f = _OpenFile(target, base, first, first)
        if target.local:
            from storelib.fileio.publish import atomic_local_file

            f.cm = atomic_local_file(target.path, durable=False)
            f.tmp = f.cm.__enter__()
            f.sha = hashlib.sha256()
            _hash_zeros(f.sha, first)
        else:
            self.root.fs.create_dir(self.root.join(key[0], str(key[1])).path, recursive=True)
        self.open[key] = f
        return f

    def _write(self, f: _OpenFile, data: np.ndarray) -> None:
        if len(data) == 0:
            return
        if f.tmp is None:
            f.chunks.append(data.tobytes())
        else:
            with open(f.tmp, "r+b") as out:
                out.seek(f.pos)
                out.write(memoryview(data))
            f.sha.update(memoryview(data))
        f.pos += len(data)

    def _finish(self, key: tuple[str, int]) -> None:
        f = self.open.pop(key)
        if f.tmp is None:
            write_file(f.target, f.chunks, f.first, self.S, self.digests)
        else:
            with open(f.tmp, "r+b") as out:
                out.truncate(self.S)  # sparse zero tail, like the broker's freshly mapped file
            _hash_zeros(f.sha, self.S - f.pos)
            f.cm.__exit__(None, None, None)
            if self.digests is not None:
                self.digests[f.target.path] = f.sha.hexdigest()
        self.paths.append(f.target.path)

    def close(self) -> None:
        """Complete every queue's last file. Their zero tails are hashed on threads (hashlib lets go of
        the GIL): at a rebuild's end a core the other tasks left idle takes a share (~5 MB per file)."""
        keys = sorted(self.open)
        local = [self.open[k] for k in keys if self.open[k].tmp is not None]
        try:
            if len(local) > 1:
                with ThreadPoolExecutor(min(len(local), CLOSE_THREADS)) as ex:
                    list(ex.map(self._tail, local))
            for key in keys:
                self._finish(key)
        except BaseException:
            self.abort()  # the files not complete yet lose their temp files
            raise

    def _tail(self, f: _OpenFile) -> None:
        """Hash a local file's zero tail (then complete with nothing left to hash)."""
        _hash_zeros(f.sha, self.S - f.pos)
        f.pos = self.S

    def abort(self) -> None:
        """Drop the temp files of the files not yet complete."""
        err = StoreError(None, None, "internal", "consume-queue build aborted")
        for f in self.open.values():
            if f.cm is not None:
                f.cm.__exit__(StoreError, err, None)  # atomic_local_file removes its temp file
        self.open.clear()

    def __enter__(self) -> ConsumeQueueStream:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _hash_zeros(sha: Any, n: int) -> None:
    while n > 0:
        k = min(n, len(_ZEROS))
        sha.update(_ZEROS[:k])
        n -= k


__all__ = ["ConsumeQueueStream"]
