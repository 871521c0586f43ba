"""DLedger-mode stores for :func:`storelib.generator.gen.generate`: the index file, the state files, and
the shapes a crash leaves (a stale DLedger checkpoint, abort + lock, entries the reput had not
dispatched, a torn last entry).

The data files are laid out by the generator itself (entries = 48-byte header + the record it already
encodes, blank fillers by MmapFileList.preAppend's rule); this module keeps the ledger's running index,
writes each entry's 32-byte index unit, and shapes the store at the end the way a broker over DLedger
0.3.1.2 leaves it (/work/notes/dledger.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from storelib.broker.recovery.dledgerfacts import valid_index_size
from storelib.errors import StoreError
from storelib.format.dledger.entries import (
    DATA_DIR,
    DEFAULT_INDEX_FILE_SIZE,
    INDEX_DIR,
    INDEX_UNIT_SIZE,
    dledger_dir_name,
    encode_index_units,
)
from storelib.format.dledger.state import (
    CurrTerm,
    DLedgerCheckpoint,
    write_checkpoint_file,
    write_currterm_file,
)


@dataclass(frozen=True)
class DLedgerGen:
    """What DLedger store to write.

    ``self_id``/``term``: the node and the term of every entry. A clean store ends as after a shutdown
    (checkpoint committedIndex = endIndex = the last entry, no abort). The crash options:
    ``committed_lag``: the checkpoint (written every 3 s) lags the last entry by this many entries (its
    ``.bak`` by twice as many); ``undispatched``: the last entries the reput had not dispatched to the
    ConsumeQueue and IndexFile yet; ``torn_at``: the last entry reached the disk only up to this many
    bytes from its start (the rest zeros, its index unit not written either; 0: not torn; 48 keeps just
    the header, whose checks DLedger's recovery still passes); ``crashed``: ``abort`` is left (implied by
    the other options).
    """

    self_id: str = "n0"
    term: int = 0
    committed_lag: int = 0
    undispatched: int = 0
    torn_at: int = 0
    crashed: bool = False
    index_file_size: int = DEFAULT_INDEX_FILE_SIZE
    data_start: int = 0  # the first data file's offset: a broker switched from default mode starts DLedger at the
    # old log's end (4.9.8 DLedgerCommitLog.java:309-320), a multiple of the data file size

    def __post_init__(self) -> None:
        if not self.self_id or "/" in self.self_id or self.self_id in (".", ".."):
            raise StoreError(None, None, "bad_value", f"bad DLedger self id {self.self_id!r}")
        for name in ("term", "committed_lag", "undispatched", "torn_at", "data_start"):
            if getattr(self, name) < 0:
                raise StoreError(None, None, "bad_value", f"{name} must not be negative")
        if not valid_index_size(self.index_file_size):  # what rmqstore reads back as a configured size
            raise StoreError(None, None, "bad_value", "the index file size must be DLedger's 160 MiB or a power "
                                                      "of two >= 32")

    @property
    def is_crash(self) -> bool:
        return self.crashed or bool(self.committed_lag or self.undispatched or self.torn_at)

    def dir_name(self) -> str:
        return dledger_dir_name(self.self_id)


class DLedgerFiles:
    """The ledger side of a generated store: running index, index units, entry starts and sizes kept
    for the finishing touches (the last few only)."""

    def __init__(self, root: str, opts: DLedgerGen):
        self.opts = opts
        self.dir = os.path.join(root, opts.dir_name())
        self.data_dir = os.path.join(self.dir, DATA_DIR)
        os.makedirs(self.data_dir, exist_ok=True)
        os.makedirs(os.path.join(self.dir, INDEX_DIR), exist_ok=True)
        self.next_index = 0
        self._index_fd: int | None = None
        self._index_base = -1
        self.tail_pos = np.zeros(0, np.int64)  # the last entries' positions and sizes (crash shaping)
        self.tail_size = np.zeros(0, np.int64)

    def append(self, pos: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Entries at ``pos`` of ``size`` bytes were laid out: their indexes (and their units written)."""
        n = len(pos)
        idx = np.arange(self.next_index, self.next_index + n, dtype=np.int64)
        units = encode_index_units(pos, size, idx, np.full(n, self.opts.term, np.int64))
        self._write_units(self.next_index * INDEX_UNIT_SIZE, units)
        self.next_index += n
        keep = max(self.opts.committed_lag * 2, self.opts.undispatched, 1) + 1
        self.tail_pos = np.concatenate([self.tail_pos, pos])[-keep:]
        self.tail_size = np.concatenate([self.tail_size, size])[-keep:]
        return idx

    def _write_units(self, at: int, data: bytes) -> None:
        F = self.opts.index_file_size
        off = 0
        while off < len(data):
            base = (at + off) // F * F
            if base != self._index_base:
                self._open_index(base)
            k = min(len(data) - off, base + F - (at + off))
            os.pwrite(self._index_fd, data[off: off + k], at + off - base)
            off += k

    def _open_index(self, base: int) -> None:
        self.close()
        path = os.path.join(self.dir, INDEX_DIR, f"{base:020d}")
        self._index_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self._index_fd).st_size != self.opts.index_file_size:
            os.ftruncate(self._index_fd, self.opts.index_file_size)  # sparse, as DLedger maps it
        self._index_base = base

    def close(self) -> None:
        if self._index_fd is not None:
            os.close(self._index_fd)
            self._index_fd = None
        self._index_base = -1

    # -- the end state --------------------------------------------------------------------------

    @property
    def last_index(self) -> int:
        return self.next_index - 1

    def dispatch_end(self) -> int | None:
        """Where the reput stopped (entry start of the first undispatched entry), None: the log's end."""
        k = self.opts.undispatched + (1 if self.opts.torn_at else 0)
        if not k:
            return None
        if k > len(self.tail_pos):
            return 0
        return int(self.tail_pos[-k])

    def finish(self, root: str) -> None:
        """Tear the last entry, write checkpoint (+ .bak) and currterm, leave abort on a crash."""
        self.close()
        o = self.opts
        if o.torn_at and len(self.tail_pos):
            pos, size = int(self.tail_pos[-1]), int(self.tail_size[-1])
            kept = min(o.torn_at, size - 1)
            self._zero_data(pos + kept, size - kept)
            self._write_units(self.last_index * INDEX_UNIT_SIZE, bytes(INDEX_UNIT_SIZE))
            self.close()
        last = self.last_index
        if o.is_crash:
            older = max(-1, last - 2 * o.committed_lag) if o.committed_lag else last
            write_checkpoint_file(self.dir, DLedgerCheckpoint(older, older))
            cur = max(-1, last - o.committed_lag)
            write_checkpoint_file(self.dir, DLedgerCheckpoint(cur, cur))
            with open(os.path.join(root, "abort"), "wb"):
                pass
        else:  # a periodic checkpoint, then the one shutdown writes (same text: .bak == checkpoint)
            write_checkpoint_file(self.dir, DLedgerCheckpoint(last, last))
            write_checkpoint_file(self.dir, DLedgerCheckpoint(last, last))
        write_currterm_file(self.dir, CurrTerm(o.term, o.self_id))

    def _zero_data(self, at: int, n: int) -> None:
        names = sorted(int(x) for x in os.listdir(self.data_dir))
        base = max(b for b in names if b <= at)
        fd = os.open(os.path.join(self.data_dir, f"{base:020d}"), os.O_RDWR)
        try:
            os.pwrite(fd, bytes(n), at - base)
        finally:
            os.close(fd)


__all__ = ["DLedgerFiles", "DLedgerGen"]
