"""The DLedger writer mode of tests/livewriter.py (``LiveConfig(dledger=True)``): the same broker-like writer
process with ``enableDLegerCommitLog=true`` over DLedger 0.3.1.2 (see :class:`DLedgerLiveBroker`)."""

from __future__ import annotations

import os
import time

from tests.livewriter import LiveBroker, LiveConfig, _broker_like_writer


class DLedgerLiveBroker(LiveBroker):
    """The same broker in DLedger mode (rules and Java lines in /work/notes/dledger.md):

    * each record is one entry (48-byte header + the record, PHYSICALOFFSET = pos + 48) copied into the data
      file whole (``DLedgerMmapFileStore.appendAsLeader``: ``dataFileList.append``), then its 32-byte index
      unit (``indexFileList.append``), entry after entry (a batch too); a DLedger blank filler (int -1, int remaining) ends a file the next
      entry + 8 bytes does not fit; data files are created on demand, full size (no allocate-ahead);
    * the committed index trails the ledger end by one reput tick (the quorum ack of a one-node group), and
      the reput dispatches only up to the committed position (``DLedgerCommitLog.getData``);
    * DLedger's checkpoint (``committedIndex``, ``endIndex``) is rewritten every ``dledger_checkpoint_ms``
      the way ``IOUtils.string2File`` does it: ``.tmp`` written, the old content copied to ``.bak``, the file
      deleted, the ``.tmp`` renamed (so for a moment there is no ``checkpoint``);
    * the store checkpoint's physic timestamp is the last *dispatched* message's (``putMessagePositionInfo``
      sets it per dispatch in DLedger mode), as is logics;
    * the cleaner is DLedger's (``CleanSpaceService``): the oldest data file, never the last, then
      ``reviseLedgerBeginIndex`` (index files wholly below the new first entry's unit deleted); the broker's
      queue cleaner then deletes consume-queue and index files below the new first data file's start."""

    HEAD = 48

    def __init__(self, cfg: LiveConfig):
        self.units: list[tuple[int, bytes]] = []  # index units of entries put but not copied in yet
        super().__init__(cfg)
        self.committed_index, self.committed_pos = -1, self.w.write_offset
        self.acked = (-1, self.w.write_offset)  # the ledger end at the last tick: committed at the next
        self.dl_checkpoint_at = 0.0

    def _writer(self):
        w = _broker_like_writer()(self.cfg.root, self.settings, version=self.cfg.version, preallocate=False,
                                  dledger_self_id=self.cfg.dledger_self_id)
        w.dl.index_file_size = self.cfg.dledger_index_file_size
        self._write_unit = w.dl._write_unit
        w.dl._write_unit = lambda index, unit: self.units.append((index, unit))  # after the entry's bytes
        return w

    def _publish(self, results: list) -> None:
        if len(results) > 1:  # a batch (or a commit with its op record): entry after entry, each then its unit
            self._entries_then_units()
        super()._publish(results)  # the entry's bytes (one record: maybe paused halfway)
        for index, unit in self.units:
            self._write_unit(index, unit)
        self.units.clear()

    def _entries_then_units(self) -> None:
        """The buffered entries written one at a time, each followed by its index unit, as
        ``DLedgerMmapFileStore.appendAsLeader`` (0.3.1.2 :353-372) appends them: one entry under one lock, its
        data then its unit (units of entries a file switch already flushed go first: written before)."""
        w = self.w
        start, buf = w._seg_base + w._buf_pos, bytes(w._buf)
        for index, unit in self.units:
            pos, size = int.from_bytes(unit[4:12], "big"), int.from_bytes(unit[12:16], "big")
            if pos >= start:
                os.pwrite(w._fd, buf[pos - start:pos - start + size], w._buf_pos + pos - start)
            self._write_unit(index, unit)
        assert not self.units or pos + size - start == len(buf), "the buffer is not the units' entries"
        w._buf_pos += len(buf)
        w._buf = bytearray()
        self.units.clear()

    def _commit(self) -> None:
        """The committed index moves to where the ledger ended at the previous tick."""
        self.committed_index, self.committed_pos = self.acked
        self.acked = (self.w.dl.next_index - 1, self.w.write_offset)

    def _reput_end(self) -> int:
        return self.committed_pos

    def reput(self) -> None:
        self._commit()
        super().reput()

    def checkpoint(self) -> None:
        from storelib.format.checkpoint import Checkpoint
        from storelib.format.dledger.state import DLedgerCheckpoint

        cp = Checkpoint(self.logics_ts, self.logics_ts, self.index_full_ts)
        os.pwrite(self._fd(os.path.join(self.cfg.root, "checkpoint"), 4096), cp.to_bytes()[:40], 0)
        if time.monotonic() - self.dl_checkpoint_at >= self.cfg.dledger_checkpoint_ms / 1000:
            self.dl_checkpoint_at = time.monotonic()
            data = DLedgerCheckpoint(self.committed_index, self.w.dl.next_index - 1).to_bytes()
            path = os.path.join(self.w.dl.dir, "checkpoint")
            with open(path + ".tmp", "wb") as f:  # IOUtils.string2File, step by step
                f.write(data)
            if os.path.exists(path):
                with open(path, "rb") as f, open(path + ".bak", "wb") as b:
                    b.write(f.read())
                os.unlink(path)
            os.rename(path + ".tmp", path)

    def clean(self) -> None:
        gone = self.counts["deleted_segments"]
        super().clean()  # the oldest data file, then the consume queues and index files below it
        if self.counts["deleted_segments"] == gone:
            return
        data = sorted(n for n in os.listdir(self.w.dl.data_dir) if n.isdigit())
        with open(os.path.join(self.w.dl.data_dir, data[0]), "rb") as f:
            begin = int.from_bytes(f.read(16)[8:16], "big", signed=True)  # the first entry's index
        F = self.w.dl.index_file_size
        for n in sorted(os.listdir(self.w.dl.index_dir)):  # MmapFileList.resetOffset(begin * 32)
            if n.isdigit() and int(n) + F <= begin * 32:
                os.unlink(os.path.join(self.w.dl.index_dir, n))

    def shutdown(self) -> None:
        self._commit()
        self._commit()  # everything put is committed before the last reput
        super().shutdown()
