"""The ``checkpoint`` a broker session leaves: StoreCheckpoint as the broker that wrote StoreWriter's records had it.

StoreCheckpoint (4.9.8 StoreCheckpoint.java:39-83, 5.3.3 :42-92) maps the file's first 4096 bytes
read-write, loads its fields and on every flush writes back only the fields it holds: 4.9.8 three
(bytes 0-23), 5.3.3 five (0-39). Nothing else in the page or past it is ever written, so a continued
store keeps those bytes as found; a short file is extended with zeros by the map. Who sets what:

* physicMsgTimestamp: CommitLog's flush, with the store time of the last record it flushed (5.3.3
  CommitLog.java:1549/1685/1797, 4.9.8 :1130/1243); a session that appends nothing leaves it as loaded.
  DLedgerCommitLog runs no flush service (start/shutdown only drive the DLedger server), so in DLedger
  mode the ConsumeQueue put sets it with logicsMsgTimestamp (4.9.8 ConsumeQueue.java:406-410, 5.3.3 :699-703);
* logicsMsgTimestamp: each ConsumeQueue unit put (5.3.3 ConsumeQueue.java:703), written by the queue
  flush (DefaultMessageStore.java:2684); loaded value when nothing was dispatched;
* indexMsgTimestamp: IndexService.flush of a full index file (5.3.3 IndexService.java:371);
* masterFlushedOffset (5.x): only HA / the controller (DefaultMessageStore.java:695): kept;
* confirmPhyOffset (5.x): CommitLog.setConfirmOffset (:693-696). Start-up loads it
  (DefaultMessageStore.loadCheckPoint :388), then recoverNormally/recoverAbnormally set it, outside
  controller mode, to the start offset of the last valid message (:347-397, :722-806); appends never
  touch it. DLedgerCommitLog.setConfirmOffset only logs (5.3.3 DLedgerCommitLog.java:180-182); controller
  mode's HA-computed value is not modelled (kept as loaded).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from storelib.fileio.smallfile_io import atomic_write
from storelib.format.checkpoint import CHECKPOINT_FILE, CHECKPOINT_SIZE, FIELDS_SIZE, Checkpoint


@dataclass
class CheckpointSession:
    """The checkpoint fields of one broker session over a store; None: not set in this session."""

    loaded: Checkpoint
    old: bytes  # the file as found (b"" when there was none)
    v5: bool
    dledger: bool = False
    last_append: int | None = None
    physic: int | None = None
    logics: int | None = None
    index: int | None = None
    confirm: int | None = None

    @classmethod
    def load(cls, root: str, v5: bool, dledger: bool) -> CheckpointSession:
        """StoreCheckpoint's constructor: the fields of the file as found (zeros past its end)."""
        path = os.path.join(root, CHECKPOINT_FILE)
        old = b""
        if os.path.isfile(path):
            with open(path, "rb") as f:
                old = f.read()
        return cls(Checkpoint.from_bytes(old[:FIELDS_SIZE].ljust(FIELDS_SIZE, b"\0"), path), old, v5, dledger)

    def recovered(self, last_valid_phy: int | None, broker_extra: Mapping[str, str]) -> None:
        """Start-up recovery's setConfirmOffset(lastValidMsgPhyOffset) (5.x, not DLedger, not controller mode;
        :mod:`storelib.broker.startup.startup5x` models the whole recovery window, this the writer's case: a
        store it could scan whole). ``last_valid_phy`` None (no record) keeps the loaded value."""
        controller = str(broker_extra.get("enableControllerMode", "")).strip().lower() == "true"
        if self.v5 and not self.dledger and not controller and last_valid_phy is not None:
            self.confirm = last_valid_phy

    def appended(self, store_ts: int) -> None:
        """A record went into the commit log (flushed at the latest by the shutdown flush)."""
        self.last_append = store_ts
        if not self.dledger:
            self.physic = store_ts

    def dispatched(self, last_cq_ts: int, index_ts: int = 0) -> None:
        """A reput pass: the last ConsumeQueue unit's store time (0: none) and a full index file's end (0: none)."""
        if last_cq_ts:
            self.logics = last_cq_ts
            if self.dledger:
                self.physic = last_cq_ts
        if index_ts:
            self.index = index_ts

    def fields(self) -> Checkpoint:
        """What StoreCheckpoint.flush writes at shutdown."""
        old = self.loaded
        pick = [old.physic_msg_timestamp if self.physic is None else self.physic,
                old.logics_msg_timestamp if self.logics is None else self.logics,
                old.index_msg_timestamp if self.index is None else self.index,
                old.master_flushed_offset, old.confirm_phy_offset if self.confirm is None else self.confirm]
        return Checkpoint(*pick)

    def image(self) -> bytes:
        """The file after the shutdown flush: the page as mapped with the session's fields put in."""
        page = bytearray(self.old[:CHECKPOINT_SIZE].ljust(CHECKPOINT_SIZE, b"\0"))
        head = self.fields().to_bytes()
        width = FIELDS_SIZE if self.v5 else 24
        struct.pack_into(f"{width}s", page, 0, head[:width])
        return bytes(page) + self.old[CHECKPOINT_SIZE:]

    def write(self, root: str) -> str:
        path = os.path.join(root, CHECKPOINT_FILE)
        atomic_write(path, self.image())
        return path
