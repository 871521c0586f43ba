"""The scalar reference of the IndexFile writer: the broker's putKey / buildIndex step by step, literal
and slow on purpose. The vectorised builders in storelib.format.indexfile are tested against it; nothing in the
product uses it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from storelib.broker.index.indexbuild import IndexImage, IndexState
from storelib.format.indexfile import (
    _ENTRY,
    _I32,
    ENTRY_DTYPE,
    HEADER_SIZE,
    TRAN_ROLLBACK,
    IndexFile,
    IndexGeometry,
    IndexHeader,
    index_time_diff,
)
from storelib.format.javahash import index_hash

# --------------------------------------------------------------------------------------------------
# scalar reference (the broker's putKey / buildIndex, step by step)
# --------------------------------------------------------------------------------------------------


class IndexFileWriter:
    """One index file in memory, written by the broker's IndexFile.putKey (store-algorithms §6.2).

    Deliberately scalar and literal: it is the oracle the vectorised builder is tested against.
    """

    def __init__(self, geometry: IndexGeometry, end_phy_offset: int = 0, end_timestamp: int = 0,
                 name: str | None = None):
        self.geometry = geometry
        self.name = name
        self.buf = bytearray(geometry.file_size)
        # IndexFile constructor: header initialised with the previous file's end values (if > 0)
        self.header = IndexHeader()
        if end_phy_offset > 0:
            self.header.begin_phy_offset = end_phy_offset
            self.header.end_phy_offset = end_phy_offset
        if end_timestamp > 0:
            self.header.begin_timestamp = end_timestamp
            self.header.end_timestamp = end_timestamp
        self._write_header(initial=True)
        self.index_count = 1  # in memory; the on-disk field stays 0 until the first put (or a flush)

    @classmethod
    def from_state(cls, geometry: IndexGeometry, state: IndexState | IndexFile) -> IndexFileWriter:
        """Continue an existing file (as the broker does after load)."""
        if isinstance(state, IndexFile):
            state = IndexState.from_file(state)
        w = cls(geometry, name=state.name)
        w.header = replace(state.header)
        w.buf[0:HEADER_SIZE] = state.header.to_bytes()
        w.buf[HEADER_SIZE:geometry.entries_offset] = np.asarray(state.slots, ">i4").tobytes()
        e = np.asarray(state.entries, ENTRY_DTYPE).tobytes()
        start = geometry.entry_pos(1)
        w.buf[start:start + len(e)] = e
        w.index_count = max(state.header.index_count, 1)
        return w

    def _write_header(self, initial: bool = False) -> None:
        h = self.header
        if initial:  # only the begin/end values are written at creation
            struct.pack_into(">qqqq", self.buf, 0, h.begin_timestamp, h.end_timestamp,
                             h.begin_phy_offset, h.end_phy_offset)
        else:
            self.buf[0:HEADER_SIZE] = h.to_bytes()

    def is_full(self) -> bool:
        return self.index_count >= self.geometry.index_num

    def put_key(self, key: str | int, phy_offset: int, store_timestamp: int) -> bool:
        """putKey: False when the file is full. ``key`` is ``topic#key`` or its index hash."""
        g = self.geometry
        cnt = self.index_count
        if cnt >= g.index_num:
            return False
        kh = index_hash(key) if isinstance(key, str) else int(key)
        slot = kh % g.hash_slot_num
        spos = g.slot_pos(slot)
        old = _I32.unpack_from(self.buf, spos)[0]
        if old <= 0 or old > cnt:
            old = 0
        d = index_time_diff(store_timestamp, self.header.begin_timestamp)
        _ENTRY.pack_into(self.buf, g.entry_pos(cnt), kh, phy_offset, d, old)
        _I32.pack_into(self.buf, spos, cnt)
        if cnt <= 1:
            self.header.begin_phy_offset = phy_offset
            self.header.begin_timestamp = store_timestamp
        if old == 0:
            self.header.hash_slot_count += 1
        self.index_count = cnt + 1
        self.header.index_count = cnt + 1
        self.header.end_phy_offset = phy_offset
        self.header.end_timestamp = store_timestamp
        self._write_header()
        return True

    def flush(self) -> None:
        """IndexFile.flush: rewrite all header fields from memory (indexCount 1 for an empty file)."""
        self.header.index_count = self.index_count
        self._write_header()

    def to_bytes(self) -> bytes:
        return bytes(self.buf)

    def image(self) -> IndexImage:
        """The file as an IndexImage (entries 1..indexCount-1)."""
        g = self.geometry
        hdr = IndexHeader.from_bytes(self.buf)
        slots = np.frombuffer(self.buf, ">i4", g.hash_slot_num, HEADER_SIZE).astype(np.int32)
        ents = np.frombuffer(self.buf, ENTRY_DTYPE, self.index_count - 1, g.entry_pos(1)).copy()
        return IndexImage(g, hdr, slots, ents, name=self.name)


class ScalarIndexService:
    """IndexService.buildIndex over a list of IndexFileWriters (store-algorithms §6.1, §6.3)."""

    def __init__(self, geometry: IndexGeometry, files: list[IndexFileWriter] | None = None):
        self.geometry = geometry
        self.files: list[IndexFileWriter] = files if files is not None else []

    def _last_file(self) -> IndexFileWriter:
        if self.files and not self.files[-1].is_full():
            return self.files[-1]
        prev = self.files[-1] if self.files else None
        w = IndexFileWriter(self.geometry, prev.header.end_phy_offset if prev else 0,
                            prev.header.end_timestamp if prev else 0)
        if prev is not None:
            prev.flush()
        self.files.append(w)
        return w

    def build_index(self, topic: str, uniq_key: str | None, keys: str | None, tran_type: int,
                    phy_offset: int, store_timestamp: int) -> None:
        f = self._last_file()
        if phy_offset < f.header.end_phy_offset:
            return
        if tran_type == TRAN_ROLLBACK:
            return
        todo = []
        if uniq_key is not None:
            todo.append(f"{topic}#{uniq_key}")
        if keys:
            todo.extend(f"{topic}#{k}" for k in keys.split(" ") if k)
        for key in todo:
            self.put_key(key, phy_offset, store_timestamp)

    def build_index_hashes(self, key_hashes: Sequence[int], phy_offset: int, store_timestamp: int) -> None:
        """buildIndex for a non-ROLLBACK record whose keys are given as index hashes."""
        f = self._last_file()
        if phy_offset < f.header.end_phy_offset:
            return
        for kh in key_hashes:
            self.put_key(int(kh), phy_offset, store_timestamp)

    def put_key(self, key: str | int, phy_offset: int, store_timestamp: int) -> None:
        f = self._last_file()
        while not f.put_key(key, phy_offset, store_timestamp):
            f = self._last_file()
