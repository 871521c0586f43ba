"""The DLedger side of :class:`storelib.broker.writer.writer.StoreWriter`: a broker over DLedger 0.3.1.2
appends each record as one entry (DLedgerMmapFileStore.appendAsLeader), a batch's messages as one entry
each, and writes the entry's index unit right after it.

What it owns: the ledger (next index, term), the entry header, DLedger's blank filler when an entry plus
8 bytes does not fit (MmapFileList.preAppend), the index file, and the checkpoint/currterm files a
shutdown writes. The record bytes, queue offsets and store times stay the StoreWriter's.
"""

from __future__ import annotations

import os

from storelib.broker.settings.dledgerlayout import DLedgerLayout
from storelib.errors import StoreError
from storelib.format.dledger.entries import (
    BODY_OFFSET,
    DATA_DIR,
    DEFAULT_INDEX_FILE_SIZE,
    INDEX_DIR,
    INDEX_UNIT_SIZE,
    MIN_BLANK_LEN,
    blank_filler,
    dledger_dir_name,
    encode_entry,
    encode_index_unit,
    needs_blank,
)
from storelib.format.dledger.state import (
    CurrTerm,
    DLedgerCheckpoint,
    write_checkpoint_file,
    write_currterm_file,
)


class DLedgerAppender:
    """Entries, index units and state files of one DLedger node under a store root."""

    def __init__(self, root: str, self_id: str, term: int = 0, index_file_size: int = DEFAULT_INDEX_FILE_SIZE):
        if not self_id or "/" in self_id or self_id in (".", ".."):
            raise StoreError(None, None, "bad_value", f"bad DLedger self id {self_id!r}")
        self.self_id = self_id
        self.term = term
        self.dir = os.path.join(root, dledger_dir_name(self_id))
        self.data_dir = os.path.join(self.dir, DATA_DIR)
        self.index_dir = os.path.join(self.dir, INDEX_DIR)
        os.makedirs(self.data_dir, exist_ok=True)
        os.makedirs(self.index_dir, exist_ok=True)
        self.index_file_size = index_file_size
        self.next_index = 0
        self._ifd: int | None = None
        self._ibase = -1

    def layout(self) -> DLedgerLayout:
        d = dledger_dir_name(self.self_id)
        return DLedgerLayout(self.self_id, d, f"{d}/{DATA_DIR}", "written by StoreWriter (DLedger mode)")

    @staticmethod
    def filler_before(pos: int, segment_size: int, record_len: int) -> bytes | None:
        """preAppend's rule for the entry of a ``record_len``-byte record at ``pos``: None when it fits, else the
        bytes ending the data file (int -1, int bytes left; the zeros are there already)."""
        if not needs_blank(pos, segment_size, BODY_OFFSET + record_len):
            return None
        if pos == 0:
            raise StoreError(None, None, "message_too_large", f"an entry of {record_len + BODY_OFFSET} bytes cannot "
                             f"fit a {segment_size}-byte data file")
        return blank_filler(segment_size - pos)[:MIN_BLANK_LEN]

    def entry(self, record: bytes | bytearray, pos: int) -> bytes:
        """The entry for ``record`` at data position ``pos``; its index unit is written now."""
        data = encode_entry(bytes(record), self.next_index, self.term, pos)
        self._write_unit(self.next_index, encode_index_unit(pos, len(data), self.next_index, self.term))
        self.next_index += 1
        return data

    def _write_unit(self, index: int, unit: bytes) -> None:
        at = index * INDEX_UNIT_SIZE
        base = at - at % self.index_file_size
        if base != self._ibase:
            self.close()
            path = os.path.join(self.index_dir, f"{base:020d}")
            self._ifd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(self._ifd).st_size != self.index_file_size:
                os.ftruncate(self._ifd, self.index_file_size)  # sparse, as DLedger maps it
            self._ibase = base
        os.pwrite(self._ifd, unit, at - base)

    def close(self) -> None:
        if self._ifd is not None:
            os.close(self._ifd)
            self._ifd = None
        self._ibase = -1

    def shutdown(self) -> None:
        """What DLedger's shutdown leaves: the checkpoint (everything committed) and the term file."""
        self.close()
        last = self.next_index - 1
        write_checkpoint_file(self.dir, DLedgerCheckpoint(last, last))
        write_currterm_file(self.dir, CurrTerm(self.term, self.self_id))


__all__ = ["DLedgerAppender"]
