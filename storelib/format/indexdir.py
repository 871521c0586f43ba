"""The ``index/`` directory: its files listed in the broker's order, their names, and a query across them.

File names are the broker's wall-clock creation times and cannot be reproduced; rebuilt files are
named by :func:`index_file_name` (first entry's store time, bumped to stay strictly increasing) and
compared with originals by order, never by name. One file's format and reader: :mod:`storelib.format.indexfile`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

import pyarrow.fs as pafs

from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import ByteSource, Location, open_source, resolve
from storelib.format.indexfile import HEADER_SIZE, LONG_MAX, IndexFile, IndexGeometry, open_owned
from storelib.format.javahash import index_hash
from storelib.units import parse_zone

INDEX_NAME_RE = re.compile(r"^\d{17}$")


# --------------------------------------------------------------------------------------------------
# listing and naming
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexFileRef:
    """One file of ``index/``: its name, Location and size (from the listing, no extra request)."""

    name: str
    loc: Location
    size: int
    at: bytes | None = None  # the header as a run's cut read it (a live store's file): read as it stood then

    def open(self, geometry: IndexGeometry | None = None, *, broker_size: bool = False, **kw: Any) -> IndexFile:
        """The file read with ``geometry``; ``broker_size``: as the broker maps it, at the configured size
        whatever its length (extra bytes ignored, missing ones read as the zeros its mapping would add)."""
        src: ByteSource = open_source(self.loc, self.size)
        if broker_size and geometry is not None and self.size >= HEADER_SIZE and self.size != geometry.file_size:
            src = BrokerSizedSource(src, geometry.file_size)
        if self.at is not None:
            kw.setdefault("at", self.at)
        return open_owned(IndexFile, src, geometry, name=self.name, **kw)

    def size_finding(self, geometry: IndexGeometry) -> Finding | None:
        """A warning when the file's length differs from the configured size the broker maps it at."""
        if self.size == geometry.file_size or self.size < HEADER_SIZE:
            return None
        longer = self.size > geometry.file_size
        return Finding("index_size_mismatch", "warning", f"index/{self.name}", min(self.size, geometry.file_size),
                       f"{self.size} bytes, configured size {geometry.file_size}: the broker maps it at the configured "
                       + ("size and never reads the extra bytes" if longer else
                          "size, which extends the file with zeros (entries past the end are read as empty)"),
                       {"size": self.size, "expected": geometry.file_size})


class BrokerSizedSource:
    """A source seen at ``size`` bytes: cut when the file is longer, zero-filled where it is shorter."""

    def __init__(self, inner: ByteSource, size: int):
        self.inner, self.size, self.path = inner, size, inner.path

    def read(self, offset: int, length: int) -> memoryview:
        length = max(0, min(length, self.size - offset))
        got = self.inner.read(offset, length) if offset < self.inner.size else memoryview(b"")
        if len(got) >= length:
            return got[:length]
        return memoryview(bytes(got) + bytes(length - len(got)))

    def close(self) -> None:
        self.inner.close()


def list_index_files(store_root: Location | str | os.PathLike, findings: list[Finding] | None = None
                     ) -> list[IndexFileRef]:
    """Files of ``<root>/index`` sorted by name as strings, as the broker's loader orders them.

    Names that are not 17 digits (and sub-directories) are skipped and reported to ``findings``.
    A missing ``index/`` directory is an empty list (the broker creates it).
    """
    root = store_root if isinstance(store_root, Location) else resolve(store_root)
    idx = root.join("index")
    try:
        infos = root.fs.get_file_info(pafs.FileSelector(idx.path, allow_not_found=True))
    except OSError as e:
        raise StoreError("index", None, "unreadable", str(e)) from e
    out: list[IndexFileRef] = []
    for info in infos:
        name = info.base_name
        if info.type != pafs.FileType.File or not INDEX_NAME_RE.match(name):
            if findings is not None:
                what = "directory" if info.type == pafs.FileType.Directory else "file"
                findings.append(Finding("foreign_index_file", "warning", f"index/{name}", None,
                                        f"{what} name is not yyyyMMddHHmmssSSS; ignored",
                                        {"directory": info.type == pafs.FileType.Directory,
                                         "size": int(info.size or 0)}))
            continue
        out.append(IndexFileRef(name, Location(root.fs, info.path, root.local, root.mapped), int(info.size or 0)))
    out.sort(key=lambda r: r.name)
    return out


_MAX_NAME_MS = 253_402_300_799_999 - 14 * 3_600_000  # 9999-12-31 in every zone


def index_file_name(first_ts_ms: int, tz: str | tzinfo = "UTC", *, after: str | None = None) -> str:
    """``yyyyMMddHHmmssSSS`` of ``first_ts_ms`` in ``tz`` (UtilAll.timeMillisToHumanString, which formats in
    the JVM's default zone: :func:`storelib.units.parse_zone` reads ``tz``, ``local`` included).

    The broker names a file by its wall-clock creation time, which no rebuild can know; this policy
    uses the first entry's store time instead. With ``after`` (the previous file's name) the time is
    bumped by 1 ms until the name sorts strictly after it. Store times outside year 1970..9999
    (corrupt records) are clamped; past the end, names continue as ``int(after) + 1`` (the broker
    only sorts names, it never parses them).
    """
    zone = parse_zone(tz)
    ms = min(max(int(first_ts_ms), 0), _MAX_NAME_MS)  # corrupt store times: keep a 17-digit name
    if after is not None:
        try:
            ms = max(ms, parse_index_file_name(after, zone) + 1)
        except StoreError:
            ms = _MAX_NAME_MS + 1  # `after` is not a date: fall back to a numeric successor
    if ms > _MAX_NAME_MS:
        if after is None or int(after) + 1 >= 10**17:
            raise StoreError(after, None, "bad_name", "no 17-digit index file name sorts after this one")
        return f"{int(after) + 1:017d}"
    dt = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)
    dt = dt.astimezone(zone)
    return f"{dt.year:04d}{dt.month:02d}{dt.day:02d}{dt.hour:02d}{dt.minute:02d}{dt.second:02d}{dt.microsecond // 1000:03d}"


def parse_index_file_name(name: str, tz: str | tzinfo = "UTC") -> int:
    """Epoch milliseconds of an index file name read in ``tz``."""
    if not INDEX_NAME_RE.match(name):
        raise StoreError(name, None, "bad_name", "index file name is not yyyyMMddHHmmssSSS")
    zone = parse_zone(tz)
    try:
        dt = datetime(int(name[0:4]), int(name[4:6]), int(name[6:8]), int(name[8:10]), int(name[10:12]),
                      int(name[12:14]), int(name[14:17]) * 1000, tzinfo=zone)
    except ValueError as e:
        raise StoreError(name, None, "bad_name", str(e)) from e
    return (dt - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)


# --------------------------------------------------------------------------------------------------
# query over a store
# --------------------------------------------------------------------------------------------------


def query_index(
    index_files: Iterable[IndexFile],
    topic: str,
    key: str,
    begin_ms: int = 0,
    end_ms: int = LONG_MAX,
    *,
    max_num: int | None = None,
    confirm: Callable[[int], bool] | None = None,
) -> list[int]:
    """Candidate phy offsets for ``topic#key`` (IndexService.queryOffset, store-algorithms §10.3).

    ``index_files`` in name order (as :func:`list_index_files` gives them); walked newest first,
    each file's chain newest first, stopping after a file whose beginTimestamp < ``begin_ms``. No
    cap unless ``max_num`` (the broker uses min(requested, 64)). The index compares hashes only:
    ``confirm(phy) -> bool`` (decode the record, compare its real keys) filters collisions after
    the walk.
    """
    files = list(index_files)
    kh = index_hash(f"{topic}#{key}")
    out: list[int] = []
    for f in reversed(files):
        remaining = None if max_num is None else max_num - len(out)
        out.extend(f.query_hash(kh, begin_ms, end_ms, remaining))
        if f.header.begin_timestamp < begin_ms:
            break
        if max_num is not None and len(out) >= max_num:
            break
    if confirm is not None:
        out = [o for o in out if confirm(o)]
    return out


__all__ = [
    "BrokerSizedSource",
    "IndexFileRef",
    "index_file_name",
    "list_index_files",
    "parse_index_file_name",
    "query_index",
]
