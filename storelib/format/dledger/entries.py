"""DLedger 0.3.1.2's data and index files, byte for byte (DLedgerEntryCoder, MmapFileList).

A DLedger-mode broker keeps its commitlog in ``dledger-<selfId>/data/``: files named by their 20-digit
start offset, each a run of *entries* (a 48-byte big-endian header, then one ordinary message record)
closed, when the next entry plus 8 bytes does not fit, by a *blank filler* (int -1, int bytes remaining,
zeros). ``dledger-<selfId>/index/`` holds one 32-byte unit per entry, unit N at byte N * 32. The header
rules here are the ones DLedgerMmapFileStore.recover applies; the walk over a file is the scanner's
(:mod:`storelib.scan.scanner`), and what the broker does with the entries is in ``storelib.broker``.
Research notes with the Java references: /work/notes/dledger.md.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from storelib.errors import StoreError

ENTRY_MAGIC = 1  # DLedgerMmapFileStore.MAGIC_1 = CURRENT_MAGIC
BLANK_MAGIC = -1  # MmapFileList.BLANK_MAGIC_CODE
MIN_BLANK_LEN = 8  # MmapFileList.MIN_BLANK_LEN: an entry must leave room for a filler
POS_OFFSET = 24  # DLedgerEntry.POS_OFFSET
HEADER_SIZE = 44  # DLedgerEntry.HEADER_SIZE: what "size > HEADER_SIZE" checks against
BODY_OFFSET = 48  # DLedgerEntry.BODY_OFFSET: the message record starts here; phy offset = pos + 48
INDEX_UNIT_SIZE = 32  # DLedgerMmapFileStore.INDEX_UNIT_SIZE
DEFAULT_INDEX_FILE_SIZE = INDEX_UNIT_SIZE * 5 * 1024 * 1024  # mappedFileSizeForEntryIndex (no broker.conf key)
DEFAULT_DATA_FILE_SIZE = 1024 * 1024 * 1024  # DLedger's own default; a broker passes mappedFileSizeCommitLog
DATA_DIR = "data"
INDEX_DIR = "index"
DIR_PREFIX = "dledger-"

# the header and the index unit as numpy records (vectorised decode and encode)
ENTRY_HEADER_DT = np.dtype([("magic", ">i4"), ("size", ">i4"), ("index", ">i8"), ("term", ">i8"), ("pos", ">i8"),
                            ("channel", ">i4"), ("chain_crc", ">i4"), ("body_crc", ">i4"), ("body_len", ">i4")])
INDEX_UNIT_DT = np.dtype([("magic", ">i4"), ("pos", ">i8"), ("size", ">i4"), ("index", ">i8"), ("term", ">i8")])
assert ENTRY_HEADER_DT.itemsize == BODY_OFFSET and INDEX_UNIT_DT.itemsize == INDEX_UNIT_SIZE

_HDR = struct.Struct(">iiqqqiiii")
_UNIT = struct.Struct(">iqiqq")
_BLANK = struct.Struct(">ii")


def dledger_dir_name(self_id: str) -> str:
    """``dledger-<selfId>``: DLedgerConfig.getDefaultPath's last part under storePathRootDir."""
    return DIR_PREFIX + self_id


def entry_size(body_len: int) -> int:
    """DLedgerEntry.computeSizeInBytes: header, body length field and body."""
    return BODY_OFFSET + body_len


@dataclass(frozen=True)
class EntryHeader:
    """The 48 bytes before an entry's body, in file order."""

    magic: int
    size: int
    index: int
    term: int
    pos: int
    channel: int
    chain_crc: int
    body_crc: int
    body_len: int

    def to_bytes(self) -> bytes:
        return _HDR.pack(self.magic, self.size, self.index, self.term, self.pos, self.channel, self.chain_crc,
                         self.body_crc, self.body_len)

    @classmethod
    def from_bytes(cls, buf: bytes | memoryview, offset: int = 0, *, file: str | None = None,
                   file_offset: int | None = None) -> EntryHeader:
        """Decode the header at ``offset`` of ``buf`` (StoreError naming file and offset when cut short)."""
        if len(buf) - offset < BODY_OFFSET:
            raise StoreError(file, file_offset if file_offset is not None else offset, "truncated",
                             f"a DLedger entry header needs {BODY_OFFSET} bytes, {max(0, len(buf) - offset)} left")
        return cls(*_HDR.unpack_from(buf, offset))

    def problem(self, abs_pos: int, room: int) -> str | None:
        """Why DLedger's recovery would stop at this header (None when it passes), ``room`` bytes being left
        in the file from the entry's start. Contiguity of index and term is the walk's to check."""
        return header_problem(self.magic, self.size, self.pos, self.body_len, abs_pos, room)


def header_problem(magic: int, size: int, pos: int, body_len: int, abs_pos: int, room: int) -> str | None:
    """DLedgerMmapFileStore.recover's checks of one entry, in its order (pos, size/body, fit, magic, size)."""
    if pos != abs_pos:
        return f"pos field {pos} != the entry's offset {abs_pos}"
    if body_len + BODY_OFFSET != size:
        return f"size {size} != body length {body_len} + {BODY_OFFSET}"
    if size > room or size < 0:
        return f"entry of {size} bytes does not fit the {room} bytes left in the file"
    if magic != ENTRY_MAGIC:
        return f"magic {magic} (DLedger 0.3.1.2 writes {ENTRY_MAGIC})"
    if size <= HEADER_SIZE:
        return f"size {size} should be > {HEADER_SIZE}"
    return None


FIRST_ENTRY = "of the first entry walked"  # in first_entry_problem's reasons
NOT_A_FILLER = "its length field says"  # in the reason of a -1 magic whose length is not the bytes left


def first_entry_problem(index: int, term: int) -> str | None:
    """The rules only the first entry DLedger's recover() walks meets (0.3.1.2 DLedgerMmapFileStore :202-203,
    :248, :252-273): it starts with lastEntryTerm = -1, so a term below -1 fails; a negative index makes the
    index-unit lookup fail, and the catch block's truncateOffset below 0 deletes every index file before
    rebuildWithPos fails, which ends the walk. Later entries meet both through the contiguity and term rules."""
    if term < -1:
        return f"term {term} {FIRST_ENTRY} is below -1 (recover() starts with lastEntryTerm = -1)"
    if index < 0:
        return (f"index {index} {FIRST_ENTRY} is negative: no index unit holds it; recover()'s catch "
                "truncates the index list below 0 (every index file is deleted) and rebuildWithPos fails")
    return None


def first_entry_drops_index(index: int, term: int) -> bool:
    """Does the first entry's failure delete every index file (:func:`first_entry_problem`: a negative index
    with a term recover() accepts)?"""
    return index < 0 and term >= -1


def encode_entry(body: bytes, index: int, term: int, pos: int, *, magic: int = ENTRY_MAGIC, channel: int = 0,
                 chain_crc: int = 0, body_crc: int = 0) -> bytes:
    """DLedgerEntryCoder.encode: one entry as appended at ``pos`` (chain/body CRCs are 0 in 0.3.1.2)."""
    return _HDR.pack(magic, entry_size(len(body)), index, term, pos, channel, chain_crc, body_crc, len(body)) + body


def encode_entry_headers(size: np.ndarray, index: np.ndarray, term: np.ndarray, pos: np.ndarray,
                         magic: int = ENTRY_MAGIC) -> np.ndarray:
    """Headers of many entries at once: an ``(n, 48)`` uint8 array (the generator's prefix)."""
    h = np.zeros(len(size), ENTRY_HEADER_DT)
    h["magic"] = magic
    h["size"] = size
    h["index"] = index
    h["term"] = term
    h["pos"] = pos
    h["body_len"] = np.asarray(size) - BODY_OFFSET
    return h.view(np.uint8).reshape(-1, BODY_OFFSET)


def decode_entry_headers(a: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The headers at byte offsets ``starts`` of the uint8 array ``a`` (each needs 48 bytes there)."""
    if not len(starts):
        return np.zeros(0, ENTRY_HEADER_DT)
    rows = np.lib.stride_tricks.sliding_window_view(a, BODY_OFFSET)[starts]
    return np.ascontiguousarray(rows).view(ENTRY_HEADER_DT).ravel()


# -- blank filler and the append rule (MmapFileList.preAppend) -----------------------------------


def needs_blank(wrote_pos: int, file_size: int, entry_len: int) -> bool:
    """Does an entry of ``entry_len`` bytes go to the next file (``len + 8 > bytes left``)?"""
    return entry_len + MIN_BLANK_LEN > file_size - wrote_pos


def blank_filler(remaining: int) -> bytes:
    """The bytes preAppend writes in a file's last ``remaining`` bytes: int -1, int remaining, zeros."""
    if remaining < MIN_BLANK_LEN:
        raise StoreError(None, None, "bad_value", f"a blank filler needs {MIN_BLANK_LEN} bytes, {remaining} left")
    return _BLANK.pack(BLANK_MAGIC, remaining) + bytes(remaining - MIN_BLANK_LEN)


def read_blank(buf: bytes | memoryview, offset: int) -> int | None:
    """The filler's remaining-bytes field when a blank filler starts at ``offset``, else None."""
    if len(buf) - offset < MIN_BLANK_LEN:
        return None
    magic, remaining = _BLANK.unpack_from(buf, offset)
    return remaining if magic == BLANK_MAGIC else None


# -- index units ---------------------------------------------------------------------------------


def encode_index_unit(pos: int, size: int, index: int, term: int, magic: int = ENTRY_MAGIC) -> bytes:
    """DLedgerEntryCoder.encodeIndex: magic, pos, size, index, term."""
    return _UNIT.pack(magic, pos, size, index, term)


def encode_index_units(pos: np.ndarray, size: np.ndarray, index: np.ndarray, term: np.ndarray,
                       magic: int = ENTRY_MAGIC) -> bytes:
    """The units of many entries, back to back (vectorised)."""
    u = np.zeros(len(pos), INDEX_UNIT_DT)
    u["magic"] = magic
    u["pos"] = pos
    u["size"] = size
    u["index"] = index
    u["term"] = term
    return u.tobytes()


def decode_index_units(buf: bytes | memoryview, *, file: str | None = None, file_offset: int = 0) -> np.ndarray:
    """32-byte units of ``buf`` as a structured array (``buf`` must hold whole units)."""
    if len(buf) % INDEX_UNIT_SIZE:
        raise StoreError(file, file_offset + len(buf) - len(buf) % INDEX_UNIT_SIZE, "truncated",
                         f"{len(buf) % INDEX_UNIT_SIZE} bytes of a partial 32-byte index unit")
    return np.frombuffer(buf, INDEX_UNIT_DT)


def index_unit_problem(unit: np.void | tuple, header: EntryHeader, abs_pos: int) -> str | None:
    """DLedger's recovery comparison of an index unit with its entry (magic, size, index, term, pos)."""
    magic, pos, size, index, term = (int(x) for x in unit)
    for name, got, want in (("magic", magic, header.magic), ("size", size, header.size),
                            ("index", index, header.index), ("term", term, header.term), ("pos", pos, abs_pos)):
        if got != want:
            return f"index unit {name} {got} != entry {name} {want}"
    return None


__all__ = [
    "BLANK_MAGIC", "BODY_OFFSET", "DATA_DIR", "DEFAULT_DATA_FILE_SIZE", "DEFAULT_INDEX_FILE_SIZE", "DIR_PREFIX",
    "ENTRY_HEADER_DT", "ENTRY_MAGIC", "FIRST_ENTRY", "NOT_A_FILLER", "HEADER_SIZE", "INDEX_DIR", "INDEX_UNIT_DT", "INDEX_UNIT_SIZE",
    "MIN_BLANK_LEN", "POS_OFFSET", "EntryHeader", "blank_filler", "decode_entry_headers", "decode_index_units",
    "dledger_dir_name", "encode_entry", "encode_entry_headers", "encode_index_unit", "encode_index_units",
    "entry_size", "first_entry_problem", "header_problem", "index_unit_problem", "needs_blank", "read_blank",
]
