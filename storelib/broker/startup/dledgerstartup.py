"""A DLedger-mode start-up's own steps, for :func:`storelib.broker.startup.startup.simulate`: where the 4.9.8
reput starts, the files DLedger's recover() changes (data tail, data and index files deleted, index units
rewritten from their entries), and what a later re-commit would dispatch. The walk itself is
:mod:`storelib.broker.recovery.dledgerwalk`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from storelib.broker.recovery.dledgerfacts import IndexFiles, walk_headers
from storelib.broker.recovery.walk import RecoveryResult
from storelib.broker.settings.store import Store
from storelib.broker.startup.startup5x import recheck_reput_start
from storelib.errors import StoreError
from storelib.format.dledger.entries import INDEX_UNIT_SIZE, encode_index_units
from storelib.scan.commitlog import offset_to_file_name


@dataclass
class DLedgerChanges:
    """What DLedger's recover() changes on disk (rel paths from the store root): index files deleted, index
    units written (rel, file offset, bytes; ``create``: the files made new, at their full size)."""

    index_delete: list[str] = field(default_factory=list)
    index_writes: list[tuple[str, int, bytes]] = field(default_factory=list)
    index_create: dict[str, int] = field(default_factory=dict)  # rel -> file size

    def to_json(self) -> dict:
        return {"index_paths_deleted": self.index_delete, "index_paths_created": sorted(self.index_create),
                "index_units_written": [{"file": rel, "offset": off, "units": len(b) // INDEX_UNIT_SIZE}
                                        for rel, off, b in self.index_writes]}

    @property
    def any(self) -> bool:
        return bool(self.index_delete or self.index_writes)


def reput_start(walk: RecoveryResult, queue_max_physic: list[int]) -> int:
    """4.9.8 start() (5.3.3 doRecheckReputOffsetFromCq): the reput from max(commitlog min offset, every queue's
    maxPhysicOffset), at least 0 (:func:`storelib.broker.startup.startup5x.recheck_reput_start`)."""
    dl = walk.dledger
    assert dl is not None
    return recheck_reput_start(queue_max_physic, dl.min_offset)


def dledger_changes(store: Store, walk: RecoveryResult, index: IndexFiles | None) -> DLedgerChanges:
    """The index side of recover() on disk: deletions (truncateOffset/resetOffset/rebuildWithPos) and the units
    rewritten from their entries after the first mismatch (read back by a header walk from that entry)."""
    dl = walk.dledger
    assert dl is not None and store.dledger is not None
    folder = store.dledger.index
    out = DLedgerChanges(index_delete=[f"{folder}/{n}" for n in dl.index_delete])
    if dl.index_rewrite_from is None or dl.index_rewrite_at is None or index is None:
        return out
    F = index.file_size
    for n in dl.index_create:
        out.index_create[f"{folder}/{n}"] = F
    idx, term, pos, size = _entries_from(store, dl.index_rewrite_at, dl.data_end, dl.ledger_end_index)
    if len(idx) and (int(idx[0]) != dl.index_rewrite_from or int(idx[-1]) != dl.ledger_end_index):
        raise StoreError(store.commitlog.folder, dl.index_rewrite_at[1], "internal",
                         f"the header walk found entries {idx[0]}..{idx[-1]}, not {dl.index_rewrite_from}.."
                         f"{dl.ledger_end_index}")
    units = encode_index_units(pos, size, idx, term)
    at = dl.index_rewrite_from * INDEX_UNIT_SIZE
    done = 0
    while done < len(units):
        base = (at + done) // F * F
        n = min(len(units) - done, base + F - (at + done))
        out.index_writes.append((f"{folder}/{offset_to_file_name(base)}", at + done - base, units[done: done + n]))
        done += n
    return out


def _entries_from(store: Store, at: tuple[int, int], data_end: int, last: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(index, term, pos, size) of the entries from ``at`` (data file base, offset) to DLedger's end, by the
    header walk (a blank filler leads to the next file)."""
    segs = {s.base: s for s in store.commitlog.segments}
    S = store.commitlog.segment_size
    base, off = at
    prev = None
    cols: list[list[int]] = [[], [], [], []]
    while base in segs and base < data_end:
        seg = segs[base]
        with seg.open() as src:
            w = walk_headers(src, base, off, prev, limit=None)
        for c, v in zip(cols, (w.index, w.term, w.pos, w.size)):
            c.extend(v)
        if w.index:
            prev = (w.index[-1], w.term[-1])
        if w.end_kind != "blank" or (cols[0] and cols[0][-1] >= last):
            break
        base, off = base + S, 0
    n = next((k + 1 for k, i in enumerate(cols[0]) if i == last), len(cols[0]))
    return tuple(np.asarray(c[:n], np.int64) for c in cols)  # type: ignore[return-value]


__all__ = ["DLedgerChanges", "dledger_changes", "reput_start"]
