"""DLedger's two small state files: ``checkpoint`` (committedIndex, endIndex) and ``currterm`` (currTerm,
voteLeader), both java.util.Properties text, with the ``.bak`` DLedger keeps of the previous content.

DLedger writes them with IOUtils.properties2String (``key=value\\n`` per entry, no date line, no
escaping) through IOUtils.string2File (tmp file, previous content copied to ``.bak``, rename). The
checkpoint is rewritten every 3 s and at shutdown, so after a crash it lags the entries on disk; only
``committedIndex`` is ever read back (DLedgerMmapFileStore.recover), never ``endIndex`` nor the
``.bak``. Parsing follows DLedger's reads exactly (a value the broker cannot parse is a StoreError,
because the broker's load() fails on it); see /work/notes/dledger.md section 4.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from storelib.errors import StoreError
from storelib.fileio.bytesource import Location
from storelib.fileio.smallfile_io import PathOrLocation, as_location, atomic_write, local_path, read_small
from storelib.format.javaprops import parse_properties_text, properties_text

CHECKPOINT_FILE = "checkpoint"
CURRTERM_FILE = "currterm"
BAK_SUFFIX = ".bak"
COMMITTED_INDEX_KEY = "committedIndex"
END_INDEX_KEY = "endIndex"
TERM_KEY = "currTerm"
VOTE_KEY = "voteLeader"
MAX_STATE_FILE = 64 * 1024  # a few dozen bytes in practice: anything bigger is not DLedger's

_JAVA_LONG = re.compile(r"[+-]?\d+")
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


def _java_long(text: str) -> int | None:
    """Long.valueOf's accepted inputs (sign, decimal digits, in range), else None."""
    if not _JAVA_LONG.fullmatch(text):
        return None
    v = int(text)
    return v if _LONG_MIN <= v <= _LONG_MAX else None


def _java_trim(s: str) -> str:
    """String.trim: strips every char <= U+0020 at both ends."""
    i, j = 0, len(s)
    while i < j and s[i] <= " ":
        i += 1
    while j > i and s[j - 1] <= " ":
        j -= 1
    return s[i:j]


def _props(data: bytes, file: str | None) -> dict[str, str] | str:
    """Properties.load over the bytes (ISO-8859-1, as DLedger's string2Properties ends up reading them), or
    why it throws (a malformed \\uXXXX): string2Properties then returns null (IOUtils :147-156)."""
    try:
        return {k: v for k, (v, _, _) in parse_properties_text(properties_text(data), file=file).items()}
    except StoreError as e:
        return e.detail


def _properties_text(pairs: list[tuple[str, object]]) -> str:
    return "".join(f"{k}={v}\n" for k, v in pairs)


@dataclass(frozen=True)
class DLedgerCheckpoint:
    """``checkpoint``: what DLedger's recover() takes from it. ``committed_index`` is None when the key is
    absent or blank (the broker then keeps committedIndex -1); ``end_index`` is informational only."""

    committed_index: int | None
    end_index: int | None = None
    unreadable: str | None = None  # Properties.load throws: loadCheckPoint returns null (committedIndex -1)

    @property
    def committed_or_minus_one(self) -> int:
        return -1 if self.committed_index is None else self.committed_index

    def to_text(self, *, java8_order: bool = False) -> str:
        """The file as properties2String writes it: Java 9+ iterates committedIndex first (observed on the
        samples), Java 8's Hashtable endIndex first. A None field is written as -1 (DLedger's initial)."""
        pairs: list[tuple[str, object]] = [(COMMITTED_INDEX_KEY, self.committed_or_minus_one),
                                           (END_INDEX_KEY, -1 if self.end_index is None else self.end_index)]
        return _properties_text(pairs[::-1] if java8_order else pairs)

    def to_bytes(self, *, java8_order: bool = False) -> bytes:
        return self.to_text(java8_order=java8_order).encode("ascii")

    @classmethod
    def from_bytes(cls, data: bytes, file: str | None = CHECKPOINT_FILE) -> DLedgerCheckpoint:
        """DLedgerMmapFileStore.recover's read: ``Long.valueOf(committedIndex.trim())``; a value it cannot
        parse raises StoreError (``bad_value``), as the broker's load() fails there."""
        props = _props(data, file)
        if isinstance(props, str):
            return cls(None, None, f"{props}: Properties.load throws, loadCheckPoint returns null and recover() "
                                   "keeps committedIndex -1")
        committed = None
        raw = props.get(COMMITTED_INDEX_KEY)
        if raw is not None and _java_trim(raw):
            committed = _java_long(_java_trim(raw))
            if committed is None:
                raise StoreError(file, _key_offset(data, COMMITTED_INDEX_KEY), "bad_value",
                                 f"{COMMITTED_INDEX_KEY}={raw!r} is not a Java long: the broker's load() fails on it")
        end_raw = props.get(END_INDEX_KEY)
        end = _java_long(_java_trim(end_raw)) if end_raw is not None else None
        return cls(committed, end)


@dataclass(frozen=True)
class CurrTerm:
    """``currterm``: MemberState.loadTerm's view. ``curr_term`` None when absent or not a Java long (no
    trim: DLedger logs the error and keeps term 0, and then does not read voteLeader either)."""

    curr_term: int | None
    vote_leader: str | None = None
    problem: str | None = None

    def to_text(self, *, java8_order: bool = False) -> str:
        """persistTerm's text: voteLeader first on Java 9+ (observed), currTerm first on Java 8."""
        pairs: list[tuple[str, object]] = [(VOTE_KEY, self.vote_leader or ""),
                                           (TERM_KEY, 0 if self.curr_term is None else self.curr_term)]
        return _properties_text(pairs[::-1] if java8_order else pairs)

    def to_bytes(self, *, java8_order: bool = False) -> bytes:
        return self.to_text(java8_order=java8_order).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, file: str | None = CURRTERM_FILE) -> CurrTerm:
        props = _props(data, file)
        if isinstance(props, str):
            return cls(None, None, f"{props}: Properties.load throws, MemberState.loadTerm keeps term 0")
        if TERM_KEY in props:
            term = _java_long(props[TERM_KEY])
            if term is None:
                return cls(None, None, f"{TERM_KEY}={props[TERM_KEY]!r} is not a Java long: DLedger keeps term 0")
        else:
            term = None
        vote = props.get(VOTE_KEY) or None
        return cls(term, vote)


def _key_offset(data: bytes, key: str) -> int | None:
    at = data.find(key.encode("ascii"))
    return at if at >= 0 else None


def _dir(where: PathOrLocation) -> Location:
    return as_location(where)


def read_checkpoint_file(dledger_dir: PathOrLocation, *, bak: bool = False) -> DLedgerCheckpoint | None:
    """``<dledger_dir>/checkpoint`` (or its ``.bak``) as DLedger reads it; None when the file is missing."""
    loc = _dir(dledger_dir).join(CHECKPOINT_FILE + (BAK_SUFFIX if bak else ""))
    data = read_small(loc, MAX_STATE_FILE)
    return None if data is None else DLedgerCheckpoint.from_bytes(data, loc.path)


def read_currterm_file(dledger_dir: PathOrLocation, *, bak: bool = False) -> CurrTerm | None:
    """``<dledger_dir>/currterm`` (or its ``.bak``); None when the file is missing."""
    loc = _dir(dledger_dir).join(CURRTERM_FILE + (BAK_SUFFIX if bak else ""))
    data = read_small(loc, MAX_STATE_FILE)
    return None if data is None else CurrTerm.from_bytes(data, loc.path)


def write_state_file(dledger_dir: str | os.PathLike | Location, name: str, data: bytes) -> str:
    """IOUtils.string2File's outcome, each step atomic: the previous content (if any) becomes
    ``<name>.bak``, then ``<name>`` holds ``data``. Returns the path written."""
    d = local_path(dledger_dir)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, name)
    prev = read_small(as_location(path), MAX_STATE_FILE)
    if prev is not None:
        atomic_write(path + BAK_SUFFIX, prev)
    atomic_write(path, data)
    return path


def write_checkpoint_file(dledger_dir: str | os.PathLike | Location, cp: DLedgerCheckpoint, *,
                          java8_order: bool = False) -> str:
    return write_state_file(dledger_dir, CHECKPOINT_FILE, cp.to_bytes(java8_order=java8_order))


def write_currterm_file(dledger_dir: str | os.PathLike | Location, ct: CurrTerm, *, java8_order: bool = False) -> str:
    return write_state_file(dledger_dir, CURRTERM_FILE, ct.to_bytes(java8_order=java8_order))


__all__ = [
    "BAK_SUFFIX", "CHECKPOINT_FILE", "COMMITTED_INDEX_KEY", "CURRTERM_FILE", "END_INDEX_KEY", "TERM_KEY", "VOTE_KEY",
    "CurrTerm", "DLedgerCheckpoint", "read_checkpoint_file", "read_currterm_file", "write_checkpoint_file",
    "write_currterm_file", "write_state_file",
]
