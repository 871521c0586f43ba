"""Writing IndexFiles as the broker's dispatch does: the index keys of scanned records, the vectorised
builder (:func:`build_index_files`: every entry's file, number, timeDiff, prevIndex and the slot table
from column operations); one file streamed from runs whose slot chains were computed per segment (the
task engines' index task) is :mod:`storelib.broker.index.indexstream`. Reading is
:mod:`storelib.format.indexfile`; the scalar oracle both are tested against is tests/index_oracle.py.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.index.indexchains import index_chains
from storelib.fileio.direct_write import atomic_direct_file
from storelib.format.indexdir import index_file_name
from storelib.format.indexfile import (  # the file format and the reader's helpers
    ENTRY_DTYPE,
    ENTRY_SIZE,
    HEADER_SIZE,
    INT_MAX,
    TRAN_ROLLBACK,
    IndexFile,
    IndexGeometry,
    IndexHeader,
    entry_bytes,
    index_time_diff,
    index_time_diffs,
)
from storelib.format.javahash import java_hashes, java_hashes_repeated, topic_key_hashes

# --------------------------------------------------------------------------------------------------
# keys from scan batches
# --------------------------------------------------------------------------------------------------

_THREAD_MIN = 1 << 20  # entries per file from which the chains are computed on a second thread


def _col(batch: pa.RecordBatch | pa.Table, name: str) -> pa.Array:
    c = batch.column(name)
    if isinstance(c, pa.ChunkedArray):
        c = c.combine_chunks() if c.num_chunks != 1 else c.chunk(0)
    return c


def _str_col(batch: pa.RecordBatch | pa.Table, name: str) -> pa.Array:
    c = _col(batch, name)
    if not (pa.types.is_string(c.type) or pa.types.is_large_string(c.type)):
        c = c.cast(pa.string())
    return c


def index_keys(batch: pa.RecordBatch | pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(row_index int64, key_hash int32) of every index key of a scan batch, in dispatch order.

    Per record, non-ROLLBACK only: ``topic#UNIQ_KEY`` first (when not null), then ``topic#token``
    for each token of KEYS split on a single U+0020, empty tokens dropped, duplicates kept
    (store-format.md §5.6). Hashes are the non-negative index hash. Column operations only.
    """
    nrows = batch.num_rows
    if nrows == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int32)
    tran = np.asarray(_col(batch, "tran_type").fill_null(0)).astype(np.int8, copy=False)
    ok = tran != TRAN_ROLLBACK
    topic_h = java_hashes_repeated(_col(batch, "topic"))[0]  # names or codes: each distinct topic hashed once

    # hash every value once (nulls give 0) and pick the rows, instead of copying the picked rows out
    uk = _str_col(batch, "uniq_key")
    urows = np.flatnonzero(ok & np.asarray(uk.is_valid()))
    u_h, u_l = java_hashes(uk)

    keys = _str_col(batch, "keys")
    lists = pc.split_pattern(keys, " ")
    tokens = pc.list_flatten(lists)
    parents = np.asarray(pc.list_parent_indices(lists)).astype(np.int64)
    keep = ok[parents] & (np.asarray(pc.binary_length(tokens)) > 0) if len(tokens) else np.zeros(0, bool)
    kidx = np.flatnonzero(keep)
    trows = parents[kidx]
    t_h, t_l = java_hashes(tokens)

    rows = np.concatenate((urows.astype(np.int64), trows))
    part = np.concatenate((np.zeros(len(urows), np.int64), np.ones(len(trows), np.int64)))
    order = np.argsort(rows * 2 + part, kind="stable")
    rows = rows[order]
    kh = np.concatenate((u_h[urows], t_h[kidx]))[order]
    kl = np.concatenate((u_l[urows], t_l[kidx]))[order]
    return rows, topic_key_hashes(topic_h[rows], kh, kl)


def index_key_rows(batch: pa.RecordBatch | pa.Table) -> dict[str, np.ndarray]:
    """Builder input for one batch: row_index, key_hash, phy_offset (the PHYSICALOFFSET field), store_timestamp."""
    rows, kh = index_keys(batch)
    phy = np.asarray(_col(batch, "physical_offset_field")).astype(np.int64, copy=False)
    ts = np.asarray(_col(batch, "store_timestamp")).astype(np.int64, copy=False)
    return {"row_index": rows, "key_hash": kh, "phy_offset": phy[rows], "store_timestamp": ts[rows]}


# --------------------------------------------------------------------------------------------------
# images and the vectorised builder
# --------------------------------------------------------------------------------------------------


@dataclass
class IndexImage:
    """The full content of one index file: header, slot table and used entries 1..count.

    ``entries`` is an ENTRY_DTYPE array whose position i is entry number i+1; everything after it
    is zero. ``name`` is the file name chosen by the naming policy (``None`` when not named).
    """

    geometry: IndexGeometry
    header: IndexHeader
    slots: np.ndarray
    entries: np.ndarray
    name: str | None = None
    first_timestamp: int | None = None

    def to_bytes(self) -> bytes:
        g = self.geometry
        buf = bytearray(g.file_size)
        buf[0:HEADER_SIZE] = self.header.to_bytes()
        buf[HEADER_SIZE:g.entries_offset] = np.asarray(self.slots, dtype=">i4").tobytes()
        e = np.asarray(self.entries, dtype=ENTRY_DTYPE)
        start = g.entry_pos(1)
        buf[start:start + ENTRY_SIZE * len(e)] = e.tobytes()
        return bytes(buf)

    def sha256(self) -> str:
        """Hex SHA-256 of the file :meth:`write` produces, computed from memory (no read-back)."""
        g = self.geometry
        h = hashlib.sha256(self.header.to_bytes())
        h.update(np.asarray(self.slots, dtype=">i4").tobytes())
        ent = np.asarray(self.entries, dtype=ENTRY_DTYPE)
        zeros = bytes(min(g.file_size, 8 << 20))
        done = HEADER_SIZE + 4 * len(self.slots)

        def pad(upto: int) -> int:
            left = upto - done
            while left > 0:
                k = min(left, len(zeros))
                h.update(zeros[:k])
                left -= k
            return upto

        done = pad(g.entry_pos(1))
        step = 1 << 20  # entries per update: bounded temporaries whatever the file size
        for a in range(0, len(ent), step):
            h.update(entry_bytes(ent[a : a + step]))
        done += ENTRY_SIZE * len(ent)
        pad(g.file_size)
        return h.hexdigest()

    def write(self, path: str | os.PathLike) -> None:
        """Write the file atomically (temp file in the same directory, then os.replace).

        The zero tail is produced by extending the file (sparse where the filesystem allows).
        """
        with atomic_direct_file(path) as fh:  # written once, never read back: past the page cache
            fh.write(self.header.to_bytes())
            fh.write(np.asarray(self.slots, dtype=">i4").tobytes())
            fh.write(bytes(ENTRY_SIZE))  # entry 0
            fh.write(entry_bytes(self.entries))
            fh.truncate(self.geometry.file_size)

    def state(self) -> IndexState:
        return IndexState(replace(self.header), np.array(self.slots, dtype=np.int32), self.entries, self.name)


@dataclass
class IndexState:
    """An existing last index file an incremental build continues (header, slots, entries, name)."""

    header: IndexHeader
    slots: np.ndarray
    entries: np.ndarray = field(default_factory=lambda: np.zeros(0, ENTRY_DTYPE))
    name: str | None = None

    @classmethod
    def from_file(cls, f: IndexFile) -> IndexState:
        return cls(replace(f.header), f.slots().astype(np.int32), np.array(f.entries_array()), f.name)

    @property
    def entry_count(self) -> int:
        return len(self.entries)


def _as_arrays(key_rows: Mapping[str, Any] | pa.Table | pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    def get(name: str) -> np.ndarray:
        c = key_rows[name] if isinstance(key_rows, Mapping) else key_rows.column(name)
        if isinstance(c, pa.ChunkedArray | pa.Array):
            c = c.to_numpy()
        return np.asarray(c)

    h = np.asarray(get("key_hash"), dtype=np.int64)  # no copy when already int64 (never written to)
    p = np.asarray(get("phy_offset"), dtype=np.int64)
    t = np.asarray(get("store_timestamp"), dtype=np.int64)
    if not (len(h) == len(p) == len(t)):
        raise ValueError("key_hash, phy_offset and store_timestamp must have the same length")
    if len(h) and (h.min() < 0 or h.max() > INT_MAX):
        raise ValueError("key_hash must be the non-negative index hash")
    return h, p, t


def build_index_files(
    key_rows: Mapping[str, Any] | pa.Table | pa.RecordBatch,
    *,
    geometry: IndexGeometry,
    prev_state: IndexState | IndexFile | None = None,
    emit_empty: bool = True,
    trailing_dispatch: bool = False,
    empty_index_count: int = 0,
    name_tz: str | Any | None = "UTC",
) -> list[IndexImage]:
    """Broker-exact index files for keys given in global dispatch order (store-algorithms §7.4).

    ``key_rows`` holds ``key_hash`` (index hash), ``phy_offset`` (the record's PHYSICALOFFSET
    field) and ``store_timestamp`` per key. Returns the images of every file this build writes: with
    ``prev_state`` (the current last file) that file continued first (same bytes as a one-shot
    build), then new files; nothing when nothing changes.

    * The duplicate test of §6.1 step 2 (phyOffset < current endPhyOffset → record skipped) is
      applied exactly: a key is kept iff its phyOffset ≥ every earlier key's (and the previous
      state's endPhyOffset) — the running maximum equals the last indexed offset because a
      skipped key never raises it; a no-op for a clean log with increasing offsets.
    * ``emit_empty``: records were dispatched but none had keys → the broker still has one file,
      all-zero header (no effect when there is a ``prev_state`` or any key). Pass False when
      nothing at all was dispatched.
    * ``trailing_dispatch``: a record was dispatched after the last key; if the last file is then
      exactly full the broker has already created its (empty) successor, emitted too. Keys
      dropped by the duplicate test after the last kept key imply it.
    * ``empty_index_count``: indexCount of such an empty file on disk: 0 (4.9.8, unflushed) or 1
      (5.x, flushed at clean shutdown, differences-4x-5x row 22).
    * ``name_tz``: zone of the naming policy (:func:`index_file_name`); None leaves names unset.
    """
    g = geometry
    E = g.entries_per_file
    S = g.hash_slot_num
    h, p, t = _as_arrays(key_rows)

    if isinstance(prev_state, IndexFile):
        prev_state = IndexState.from_file(prev_state)
    prev_end_phy = prev_state.header.end_phy_offset if prev_state else 0
    prev_end_ts = prev_state.header.end_timestamp if prev_state else 0

    had_rows = len(p) > 0
    h, p, t, dropped_last = _kept_keys(h, p, t, prev_end_phy)
    trailing_dispatch = trailing_dispatch or dropped_last
    K = len(h)

    c0 = 0  # entries already in the continued file
    continued = False
    if prev_state is not None:
        c0 = min(max(prev_state.header.index_count, 1) - 1, E)
        if len(prev_state.entries) < c0:
            raise ValueError(f"prev_state has {len(prev_state.entries)} entries, header says {c0}")
        continued = c0 < E

    images: list[IndexImage] = []
    if K:
        # one file at a time: memory stays bounded by one file's entries, whatever K is
        base = c0 if continued else 0
        prev_file_end_ts = prev_end_ts if prev_end_ts > 0 else 0
        for fi in range((K - 1 + base) // E + 1):
            lo, hi = max(0, fi * E - base), min(K, (fi + 1) * E - base)
            img = _file_image(g, h[lo:hi], p[lo:hi], t[lo:hi], prev_state if continued and fi == 0 else None, c0,
                              prev_file_end_ts)
            images.append(img)
            prev_file_end_ts = img.header.end_timestamp
        last_full = images[-1].header.index_count - 1 == E
        last_end = (int(p[-1]), int(t[-1]))
    else:
        last_full = prev_state is not None and c0 >= E
        last_end = (prev_end_phy, prev_end_ts)
        if prev_state is None and (emit_empty or had_rows):
            images.append(IndexImage(g, IndexHeader(index_count=empty_index_count),
                                     np.zeros(S, np.int32), np.zeros(0, ENTRY_DTYPE), first_timestamp=0))

    if trailing_dispatch and last_full:
        images.append(_successor(g, last_end, empty_index_count))
    if name_tz is not None:
        name_images(images, name_tz, after=prev_state.name if prev_state is not None else None)
    return images


def _kept_keys(h: np.ndarray, p: np.ndarray, t: np.ndarray, prev_end_phy: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """§6.1 step 2: keys of records whose phyOffset < endPhyOffset at their dispatch are skipped; and
    whether a dropped key came after the last kept one (a record dispatched after the last key)."""
    if not len(p):
        return h, p, t, False
    before = np.maximum.accumulate(np.concatenate(([prev_end_phy], p[:-1])))
    keep = p >= before
    if keep.all():
        return h, p, t, False
    kept_at = np.flatnonzero(keep)
    return h[keep], p[keep], t[keep], len(kept_at) == 0 or kept_at[-1] < len(keep) - 1


def _file_image(g: IndexGeometry, hs: np.ndarray, ps: np.ndarray, ts: np.ndarray, cont: IndexState | None,
                c0: int, prev_file_end_ts: int) -> IndexImage:
    """One file's image for its keys: a new file, or ``cont`` (holding ``c0`` entries) continued."""
    n0 = c0 + 1 if cont is not None else 1  # entry number of the first new entry
    m = len(hs)
    S = g.hash_slot_num
    # prevIndex chains and the slot table on a second thread (numpy sorts and scatters release the GIL)
    # while this one fills the other entry fields
    old_slots = cont.slots if cont is not None else None
    pool = ThreadPoolExecutor(1, thread_name_prefix="rmqstore-index") if m >= _THREAD_MIN else None
    chains = pool.submit(index_chains, hs, n0, S, old_slots) if pool is not None else None
    if chains is None:
        prev, slots = index_chains(hs, n0, S, old_slots)

    # timeDiff: entry 1 is measured from the file's initial beginTimestamp (the previous file's end),
    # later entries from the file's beginTimestamp (its entry 1)
    if cont is not None and c0 >= 1:
        begin_ts, begin_phy = cont.header.begin_timestamp, cont.header.begin_phy_offset
    else:
        begin_ts, begin_phy = int(ts[0]), int(ps[0])
    init_begin = cont.header.begin_timestamp if cont is not None else prev_file_end_ts
    td = index_time_diffs(ts, begin_ts)
    if n0 == 1:
        td[0] = index_time_diff(int(ts[0]), init_begin)

    ent = np.empty(n0 - 1 + m, dtype=ENTRY_DTYPE)
    if cont is not None:
        ent[: n0 - 1] = cont.entries[: n0 - 1]
    new = ent[n0 - 1:]
    new["key_hash"] = hs
    new["phy_offset"] = ps
    new["time_diff"] = td
    if pool is not None:
        try:
            prev, slots = chains.result()
        finally:
            pool.shutdown()
    new["prev_index"] = prev
    hsc0 = cont.header.hash_slot_count if cont is not None else 0
    header = IndexHeader(
        begin_timestamp=int(begin_ts), end_timestamp=int(ts[-1]),
        begin_phy_offset=int(begin_phy), end_phy_offset=int(ps[-1]),
        hash_slot_count=int(hsc0 + np.count_nonzero(prev == 0)), index_count=n0 + m,
    )
    return IndexImage(g, header, slots, ent, name=cont.name if cont is not None else None,
                      first_timestamp=None if cont is not None else int(ts[0]))


def _successor(g: IndexGeometry, last_end: tuple[int, int], empty_index_count: int) -> IndexImage:
    """The empty file the broker creates after a full one when a record is dispatched after the last key."""
    ep, et = last_end
    hdr = IndexHeader(
        begin_timestamp=et if et > 0 else 0, end_timestamp=et if et > 0 else 0,
        begin_phy_offset=ep if ep > 0 else 0, end_phy_offset=ep if ep > 0 else 0,
        hash_slot_count=0, index_count=empty_index_count,
    )
    return IndexImage(g, hdr, np.zeros(g.hash_slot_num, np.int32), np.zeros(0, ENTRY_DTYPE),
                      first_timestamp=max(et, 0))


def empty_index_count(version: str) -> int:
    """indexCount of an index file without entries as found on disk: 4.9.8 never flushes it (0), 5.x
    flushes it at a clean shutdown (1) (differences-4x-5x row 22)."""
    return 1 if str(version).startswith("5") else 0


def index_dispatched(prev: IndexState | None, tables: Sequence[pa.Table], *, geometry: IndexGeometry,
                     version: str, name_tz: str | Any | None = "UTC") -> tuple[list[IndexImage], int]:
    """The index files after dispatching the record ``tables`` (in order) onto ``prev``, the last index
    file kept (or none), and how many keys were added: the start-up's view of the index, built by
    :func:`build_index_files` (a trailing keyless record can roll a full file, an empty run still
    leaves one file)."""
    tables = [t for t in tables if t.num_rows]
    parts = [index_key_rows(t) for t in tables]
    kr = {k: np.concatenate([p[k] for p in parts]) for k in ("key_hash", "phy_offset", "store_timestamp")}
    last_key_row = -1
    base_row = 0
    for t, p in zip(tables, parts):
        if len(p["row_index"]):
            last_key_row = base_row + int(p["row_index"][-1])
        base_row += t.num_rows
    images = build_index_files(kr, geometry=geometry, prev_state=prev, emit_empty=True,
                               trailing_dispatch=last_key_row < base_row - 1,
                               empty_index_count=empty_index_count(version), name_tz=name_tz)
    cont = prev is not None and images and images[0].name == prev.name
    before = prev.entry_count if cont else 0
    return images, sum(len(im.entries) for im in images) - before


def name_images(images: Sequence[IndexImage], tz: str | Any = "UTC", *, after: str | None = None) -> None:
    """Give unnamed images names by the policy of :func:`index_file_name`, strictly increasing."""
    last = after
    for im in images:
        if im.name is None:
            ts = im.first_timestamp if im.first_timestamp is not None else im.header.begin_timestamp
            im.name = index_file_name(ts, tz, after=last)
        last = im.name

__all__ = ["IndexImage", "IndexState", "build_index_files", "empty_index_count", "index_dispatched", "index_key_rows",
           "index_keys", "name_images"]
