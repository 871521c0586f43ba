"""Whole-file reads and atomic writes for the store's small files (checkpoint, markers, config, broker.conf).

The big segment files go through :mod:`storelib.fileio.bytesource` ranged reads; the small ones are read whole,
but still through the Location's filesystem so a store on S3/HDFS works the same, and never with a size
larger than the caller's cap (a corrupt or hostile file must not make us allocate gigabytes).
Writes are local only: temp file in the same directory, fsync, ``os.replace``, fsync of the directory.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pyarrow.fs as pafs

from storelib.errors import StoreError
from storelib.fileio.bytesource import Location, resolve

PathOrLocation = str | os.PathLike | Location

DEFAULT_MAX_SMALL_FILE = 256 * 1024 * 1024


def as_location(where: PathOrLocation) -> Location:
    """A Location for a local path, a URI or an existing Location."""
    if isinstance(where, Location):
        return where
    return resolve(where)


def child(where: PathOrLocation, *parts: str) -> Location:
    """``where`` joined with ``parts`` (a store root plus a relative file name)."""
    loc = as_location(where)
    return loc.join(*parts) if parts else loc


def file_size(loc: Location) -> int | None:
    """Size of a regular file, None when it does not exist (a directory is an error)."""
    try:
        info = loc.fs.get_file_info(loc.path)
    except OSError as e:
        raise StoreError(loc.path, None, "unreadable", str(e)) from e
    if info.type == pafs.FileType.NotFound:
        return None
    if info.type != pafs.FileType.File:
        raise StoreError(loc.path, None, "not_a_file", f"expected a regular file, found {info.type.name}")
    return int(info.size) if info.size is not None else 0


def read_small(loc: Location, max_size: int = DEFAULT_MAX_SMALL_FILE) -> bytes | None:
    """The whole content of a small file, or None when it does not exist.

    Raises StoreError(``too_large``) rather than allocating more than ``max_size`` bytes.
    """
    size = file_size(loc)
    if size is None:
        return None
    if size > max_size:
        raise StoreError(loc.path, None, "too_large", f"{size} bytes, more than the {max_size} bytes allowed")
    try:
        with loc.fs.open_input_file(loc.path) as f:
            data = f.read(size)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StoreError(loc.path, None, "unreadable", str(e)) from e
    return bytes(data)


def local_path(where: PathOrLocation) -> str:
    """The OS path of a local path or local Location (writers only work on local files)."""
    if isinstance(where, Location):
        if not where.local:
            raise StoreError(where.path, None, "unsupported", "writing is only supported on local files")
        return where.path
    s = os.fspath(where)
    if "://" in s:
        loc = resolve(s)
        if not loc.local:
            raise StoreError(s, None, "unsupported", "writing is only supported on local files")
        return loc.path
    return os.path.abspath(s)


def fsync_dir(directory: str) -> None:
    """fsync a directory so a rename inside it is durable (best effort: some filesystems refuse)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_file_fsync(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (created or truncated) and fsync it; no rename."""
    try:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise StoreError(path, None, "write_failed", str(e)) from e


def process_umask() -> int:
    """The process umask, read without changing it where Linux shows it (``/proc/self/status``), else by
    the set-and-restore dance (not thread-safe, hence the first choice)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def output_mode(path: str) -> int:
    """The permission bits a replaced file keeps, or a new file gets from the umask like ``open`` would
    (0644 under the usual 022): a temp file from ``mkstemp`` is 0600, which would hide reports, exports
    and store files from the other users who read them."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return 0o666 & ~process_umask()


def atomic_write(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: unique temp file beside it, fsync, os.replace."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".rmqtmp", dir=directory)
    except OSError as e:
        raise StoreError(path, None, "write_failed", str(e)) from e
    try:
        os.fchmod(fd, output_mode(path))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StoreError(path, None, "write_failed", str(e)) from e
    fsync_dir(directory)


def atomic_write_json(path: str, obj: Any) -> None:
    """``obj`` as indented JSON text, written atomically (:func:`atomic_write`), its directory made."""
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    atomic_write(path, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode("utf-8"))
