"""The 5.x controller-mode ``epochFileCheckpoint`` (+ ``.bak``): read and written as CheckpointFile does.

Layout (common/utils/CheckpointFile.java, EpochFileCache.EpochEntrySerializer): line 1 the entry count,
line 2 the CRC-32 (& 0x7FFFFFFF) of the entry lines, then one ``epoch-startOffset`` line per epoch, each
line ended by ``\\n`` (the JVM's line separator on Linux). The broker rewrites the file in place after
copying the old content to ``.bak`` (MixAll.string2File), so ``.bak`` holds the previous version.

Reading follows CheckpointFile.read: a count or CRC that does not match, or bytes that are not UTF-8, is an
IOException and the broker reads ``.bak``; so is a file with no entries. A first or second line that is
missing or not an integer, or an entry whose parts are not numbers, is a NumberFormatException that the
broker does not catch: it does not start (:attr:`EpochFileLoad.broker_fails`). When both files fail
with an IOException the broker starts with no epochs at all (initCacheFromFile returns false).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location
from storelib.fileio.smallfile_io import PathOrLocation, as_location, atomic_write, local_path, read_small
from storelib.format.crc import body_crc

EPOCH_FILE = "epochFileCheckpoint"
MAX_EPOCH_FILE = 16 * 1024 * 1024  # a few thousand epochs are ~100 KB; anything far larger is not this file
LONG_MAX = 2**63 - 1
_JAVA_INT = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True)
class EpochEntry:
    """One epoch: the controller's epoch number and the commitlog offset where its master started."""

    epoch: int
    start_offset: int

    def line(self) -> str:
        """``EpochEntrySerializer.toLine``: ``"%d-%d"``."""
        return f"{self.epoch}-{self.start_offset}"


def encode_epoch_file(entries: list[EpochEntry]) -> bytes:
    """The file's bytes for ``entries`` (the broker writes nothing for an empty list: neither do we)."""
    if not entries:
        raise StoreError(EPOCH_FILE, None, "empty", "the broker never writes an epoch file without entries")
    for e in entries:
        _check_range(e.epoch, 32, "epoch")
        _check_range(e.start_offset, 64, "start offset")
    lines = "".join(e.line() + "\n" for e in entries)
    crc = _java_int(body_crc(lines.encode()) if lines else 0)
    return f"{len(entries)}\n{crc}\n{lines}".encode()


def _check_range(v: int, bits: int, what: str) -> None:
    if not -(2 ** (bits - 1)) <= int(v) < 2 ** (bits - 1):
        raise StoreError(EPOCH_FILE, None, "bad_value", f"{what} {v} does not fit in a Java {bits}-bit integer")


def _java_int(v: int) -> int:
    return v - 2**32 if v >= 2**31 else v


@dataclass(frozen=True)
class EpochFileParse:
    """One file as CheckpointFile.read sees it.

    ``outcome``: ``ok``, ``missing`` (read as no entries), ``ioerror`` (the broker goes on to ``.bak``) or
    ``fatal`` (a NumberFormatException: the broker does not start). ``problem`` says why, ``offset`` is the
    byte offset of the offending line.
    """

    path: str
    outcome: str
    entries: tuple[EpochEntry, ...] = ()
    count: int | None = None
    stored_crc: int | None = None
    computed_crc: int | None = None
    problem: str | None = None
    offset: int | None = None


def _lines(text: str) -> list[tuple[int, str]]:
    """BufferedReader.readLine over ``text``: lines ended by \\n, \\r or \\r\\n, with their char offsets."""
    out, pos = [], 0
    for m in re.finditer(r"\r\n|\r|\n", text):
        out.append((pos, text[pos:m.start()]))
        pos = m.end()
    if pos < len(text):
        out.append((pos, text[pos:]))
    return out


def _entry(line: str) -> tuple[EpochEntry | None, str | None]:
    """EpochEntrySerializer.fromLine: Java ``split("-")`` drops trailing empty parts; not two parts -> null
    (skipped); parts that are not a Java int/long -> NumberFormatException (returned as a problem)."""
    parts = line.split("-")
    while parts and parts[-1] == "":
        parts.pop()
    if len(parts) != 2:
        return None, None
    a, b = parts
    if not _JAVA_INT.fullmatch(a) or not -(2**31) <= int(a) < 2**31:
        return None, f"epoch {a!r} is not an int"
    if not _JAVA_INT.fullmatch(b) or not -(2**63) <= int(b) < 2**63:
        return None, f"start offset {b!r} is not a long"
    return EpochEntry(int(a), int(b)), None


def parse_epoch_file(data: bytes | None, path: str = EPOCH_FILE) -> EpochFileParse:
    """Parse one epoch file's bytes (None: the file does not exist) exactly as CheckpointFile.read does."""
    if data is None:
        return EpochFileParse(path, "missing")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return EpochFileParse(path, "ioerror", problem="not UTF-8 (MalformedInputException)", offset=e.start)
    lines = _lines(text)
    head: list[int] = []
    for i, what in ((0, "entry count"), (1, "CRC")):
        if len(lines) <= i:
            return EpochFileParse(path, "fatal", problem=f"no {what} line (Integer.parseInt(null))", offset=len(data))
        pos, s = lines[i]
        if not _JAVA_INT.fullmatch(s) or not -(2**31) <= int(s) < 2**31:
            return EpochFileParse(path, "fatal", problem=f"{what} line {s[:40]!r} is not an int",
                                  offset=len(text[:pos].encode()))
        head.append(int(s))
    entries: list[EpochEntry] = []
    joined = []
    for pos, s in lines[2:]:
        joined.append(s + "\n")
        e, bad = _entry(s)
        if bad:
            return EpochFileParse(path, "fatal", count=head[0], stored_crc=head[1], problem=f"entry line {s[:60]!r}: {bad}",
                                  offset=len(text[:pos].encode()))
        if e is not None:
            entries.append(e)
    crc = _java_int(body_crc("".join(joined).encode()))
    base = dict(count=head[0], stored_crc=head[1], computed_crc=crc, entries=tuple(entries))
    if len(entries) != head[0]:
        return EpochFileParse(path, "ioerror", problem=f"expects {head[0]} entries, holds {len(entries)}", **base)
    if head[1] != 0 and head[1] != crc:
        return EpochFileParse(path, "ioerror", problem=f"entries CRC {crc} differs from the stored {head[1]}", **base)
    return EpochFileParse(path, "ok", **base)


@dataclass
class EpochFileLoad:
    """What the broker's EpochFileCache.initCacheFromFile ends up with, and why.

    ``entries``: the epochs the broker loads (empty when it falls back to none); ``source``: ``file``,
    ``bak`` or None; ``broker_fails``: the broker would not start (an uncaught NumberFormatException).
    ``present``: either file exists (a store in controller mode has one once it has been a master or a
    synced slave).
    """

    entries: list[EpochEntry]
    source: str | None
    main: EpochFileParse
    bak: EpochFileParse | None
    broker_fails: bool = False
    findings: list[Finding] = field(default_factory=list)

    @property
    def present(self) -> bool:
        return self.main.outcome != "missing" or (self.bak is not None and self.bak.outcome != "missing")


def _read(loc: Location) -> bytes | None:
    return read_small(loc, MAX_EPOCH_FILE)


def load_epoch_file(where: PathOrLocation, name: str = EPOCH_FILE) -> EpochFileLoad:
    """Load a store root's epoch file (or a file path/Location) with the broker's ``.bak`` fallback."""
    loc = as_location(where)
    if loc.fs.get_file_info(loc.path).type == pafs.FileType.Directory:
        loc = loc.join(name)
    bak_loc = Location(loc.fs, loc.path + ".bak", loc.local)
    main = parse_epoch_file(_read(loc), loc.path)
    findings: list[Finding] = []
    if main.outcome == "fatal":
        findings.append(Finding("epoch_file_unreadable", "critical", loc.path, main.offset,
                                f"{main.problem}: the broker throws NumberFormatException reading it and does not start "
                                "(it never tries the .bak)"))
        return EpochFileLoad([], None, main, None, True, findings)
    if main.outcome == "ok" and main.entries:
        return EpochFileLoad(list(main.entries), "file", main, None, False, findings)
    bak = parse_epoch_file(_read(bak_loc), bak_loc.path)
    if main.outcome == "ioerror":
        findings.append(Finding("epoch_file_bad", "error", loc.path, main.offset,
                                f"{main.problem}: the broker reads {os.path.basename(bak_loc.path)} instead"))
    elif main.outcome == "ok":
        findings.append(Finding("epoch_file_empty", "warning", loc.path, None,
                                "no entries: the broker reads the .bak instead"))
    elif bak.outcome != "missing":
        findings.append(Finding("epoch_file_missing", "warning", loc.path, None,
                                "missing while its .bak exists: the broker reads the .bak"))
    if bak.outcome == "fatal":
        findings.append(Finding("epoch_file_unreadable", "critical", bak_loc.path, bak.offset,
                                f"{bak.problem}: the broker throws NumberFormatException reading it and does not start"))
        return EpochFileLoad([], None, main, bak, True, findings)
    if bak.outcome == "ok":
        return EpochFileLoad(list(bak.entries), "bak" if bak.entries else None, main, bak, False, findings)
    if bak.outcome == "ioerror":
        findings.append(Finding("epoch_file_bad", "error", bak_loc.path, bak.offset,
                                f"{bak.problem}: the broker starts with no epochs (as a new replica)"))
    elif main.outcome == "ioerror":
        findings.append(Finding("epoch_file_bad", "error", loc.path, None,
                                "no .bak to fall back on: the broker starts with no epochs (as a new replica)"))
    return EpochFileLoad([], None, main, bak, False, findings)


def write_epoch_file(path: str | os.PathLike | Location, entries: list[EpochEntry], *, keep_bak: bool = True) -> str:
    """Write ``entries`` as the broker does (the old content first to ``.bak`` when ``keep_bak``), each file
    through a temp file and an atomic rename. Returns the path written; a directory means its epoch file."""
    target = local_path(path)
    if os.path.isdir(target):
        target = os.path.join(target, EPOCH_FILE)
    data = encode_epoch_file(entries)
    if keep_bak and os.path.exists(target):
        with open(target, "rb") as f:
            atomic_write(target + ".bak", f.read())
    atomic_write(target, data)
    return target


__all__ = ["EPOCH_FILE", "LONG_MAX", "EpochEntry", "EpochFileLoad", "EpochFileParse", "encode_epoch_file",
           "load_epoch_file", "parse_epoch_file", "write_epoch_file"]
