"""Where store bytes come from: mmap for local files, ranged reads through ``pyarrow.fs`` otherwise.

Every reader in storelib takes a :class:`ByteSource`, so a segment on S3, GCS, HDFS or a mounted
share is scanned by the same code as a local one. Local files are mapped read-only (zero copy, the
fast path); remote files are read in large sequential windows so a scan streams at network speed
without ever holding a whole segment in memory.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Protocol

import pyarrow.fs as pafs

from .errors import StoreError

DEFAULT_WINDOW = 64 * 1024 * 1024


class ByteSource(Protocol):
    """Random-access, read-only bytes of one file."""

    path: str
    size: int

    def read(self, offset: int, length: int) -> memoryview:
        """Up to ``length`` bytes at ``offset`` (fewer only at end of file)."""
        ...

    def close(self) -> None: ...


class LocalSource:
    """A local file mapped read-only; ``read`` returns zero-copy slices of the mapping."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._fh = open(path, "rb")
        except OSError as e:
            raise StoreError(path, None, "unreadable", str(e)) from e
        self.size = os.fstat(self._fh.fileno()).st_size
        self._mm: mmap.mmap | None = None
        self._view: memoryview | None = None
        if self.size:
            self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._view = memoryview(self._mm)

    def view(self) -> memoryview:
        """The whole file as one memoryview (local fast path)."""
        return self._view if self._view is not None else memoryview(b"")

    def read(self, offset: int, length: int) -> memoryview:
        if offset < 0:
            raise StoreError(self.path, offset, "bad_offset", "negative offset")
        return self.view()[offset : offset + max(0, length)]

    def close(self) -> None:
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a caller still holds a slice; the OS unmaps at exit
                pass
            self._mm = None
        self._fh.close()

    def __enter__(self) -> LocalSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ArrowFileSource:
    """A file on any ``pyarrow.fs`` filesystem, read with ranged requests."""

    def __init__(self, fs: pafs.FileSystem, path: str, size: int | None = None):
        self.fs = fs
        self.path = path
        try:
            self._f = fs.open_input_file(path)
        except OSError as e:
            raise StoreError(path, None, "unreadable", str(e)) from e
        self.size = self._f.size() if size is None else size

    def read(self, offset: int, length: int) -> memoryview:
        if offset < 0:
            raise StoreError(self.path, offset, "bad_offset", "negative offset")
        length = max(0, min(length, self.size - offset))
        if length == 0:
            return memoryview(b"")
        return memoryview(self._f.read_at(length, offset))

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> ArrowFileSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Location:
    """A resolved store location: a filesystem plus a path on it (``local`` when it is the OS's)."""

    fs: pafs.FileSystem
    path: str
    local: bool

    def join(self, *parts: str) -> Location:
        return Location(self.fs, "/".join([self.path.rstrip("/"), *parts]), self.local)


def resolve(uri: str | os.PathLike, filesystem: pafs.FileSystem | None = None, **fs_options: object) -> Location:
    """Turn a path or URI (``s3://bucket/prefix``, ``gs://``, ``hdfs://``, ``file://``) into a Location.

    ``fs_options`` (endpoint_override, region, access_key, secret_key, scheme...) are passed to the
    filesystem constructor for S3; otherwise pyarrow picks credentials up from the environment.
    """
    s = os.fspath(uri)
    if filesystem is not None:
        local = isinstance(filesystem, pafs.LocalFileSystem)
        return Location(filesystem, os.path.abspath(s) if local else s, local)
    if "://" not in s:
        return Location(pafs.LocalFileSystem(), os.path.abspath(s), True)
    scheme, rest = s.split("://", 1)
    if scheme == "file":
        return Location(pafs.LocalFileSystem(), os.path.abspath("/" + rest.lstrip("/")), True)
    if scheme in ("s3", "s3a") and fs_options:
        opts = {k: v for k, v in fs_options.items() if v is not None}
        return Location(pafs.S3FileSystem(**opts), rest.rstrip("/"), False)
    fs, path = pafs.FileSystem.from_uri(s.replace("s3a://", "s3://", 1))
    return Location(fs, path.rstrip("/"), isinstance(fs, pafs.LocalFileSystem))


def open_source(loc: Location, size: int | None = None) -> LocalSource | ArrowFileSource:
    """Open one file of a Location for reading."""
    if loc.local:
        return LocalSource(loc.path)
    return ArrowFileSource(loc.fs, loc.path, size)
