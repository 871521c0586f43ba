"""Joining per-segment index keys into the broker's index files (store-algorithms §6.1, §7.4).

A task engine parses the commitlog segments in parallel, each with its own keys and slot chains
(:func:`storelib.broker.index.indexstream.local_chains`); the broker indexed them one after another. This module holds
the rules that join the parts: the §6.1 duplicate test across segments (a running maximum of phyOffset),
the global key numbering that fills one file of ``E`` entries after another, the keys and predecessor
of each file (:func:`link_file`: entry 1's timeDiff starts at the previous file's end), the empty only
file or successor a keyless run leaves (:func:`layout`), and the files' names. The engine only schedules
these steps and moves the data; one file is then streamed by :func:`storelib.broker.index.indexstream.stream_index_file`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from storelib.broker.index.indexbuild import IndexImage, IndexState, build_index_files
from storelib.broker.index.indexstream import ChainRun
from storelib.errors import StoreError
from storelib.format.indexdir import index_file_name
from storelib.format.indexfile import ENTRY_DTYPE, IndexGeometry, IndexHeader

# (key hash, PHYSICALOFFSET, store time, record row) of a segment's keys, in dispatch order
KeyArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class SegmentKeys:
    """What one segment's parse tells the merge about its index keys (before the cross-segment test)."""

    rows: int  # records dispatched from the segment
    n_keys: int
    monotone: bool  # PHYSICALOFFSET of its keys never decreases
    p_first: int | None
    p_max: int | None
    last_key_row: int  # record row of its last key, -1 without keys
    last_key: tuple[int, int] | None  # (phy, time) of its last key


def full_file_state(geometry: IndexGeometry, end_phy: int, end_ts: int) -> IndexState:
    """A stand-in for a previous, full index file: what the next file needs from it (its end offset and
    time for the first entry's timeDiff and the duplicate test; no entries are read)."""
    E = geometry.entries_per_file
    hdr = IndexHeader(end_timestamp=end_ts, end_phy_offset=end_phy, index_count=E + 1)
    return IndexState(hdr, np.zeros(0, np.int32), np.broadcast_to(np.zeros(1, ENTRY_DTYPE), (E,)))


def running_max_before(segs: Mapping[int, SegmentKeys], order: Sequence[int]) -> tuple[dict[int, int], bool]:
    """The §6.1 step 2 running maximum of indexed phyOffsets before each segment (in dispatch ``order``),
    and whether every key is kept as parsed (each segment increasing and starting at or past it)."""
    run = 0
    m_before: dict[int, int] = {}
    whole = True
    for i in order:
        m = segs[i]
        m_before[i] = run
        if m.n_keys:
            if not m.monotone or (m.p_first is not None and m.p_first < run):
                whole = False
            run = max(run, m.p_max if m.p_max is not None else run)
    return m_before, whole


def kept_counts(segs: Mapping[int, SegmentKeys], keyed: Sequence[int],
                kept: Mapping[int, tuple[int, int, tuple[int, int] | None]] | None = None
                ) -> tuple[dict[int, int], tuple[int, int, tuple[int, int]] | None]:
    """Kept keys per segment (dispatch order ``keyed``) and the last kept key as (segment, record row,
    (phy, time)): every parsed key when ``kept`` is None (:func:`running_max_before` said so), else each
    segment's (count, record row, key) of the duplicate test's survivors."""
    counts: dict[int, int] = {}
    last = None
    for i in keyed:
        if kept is None:
            counts[i], row, key = segs[i].n_keys, segs[i].last_key_row, segs[i].last_key
        else:
            counts[i], row, key = kept[i]
        if counts[i]:
            last = (i, row, key)
    return counts, last


def kept_keys(keys: KeyArrays, m_before: int) -> KeyArrays:
    """The §6.1 step 2 duplicate test within one segment, given the running max before it: the keys the
    broker indexes (a record whose phyOffset is below the file's endPhyOffset is skipped)."""
    h, p, t, r = keys
    if len(p) == 0:
        return keys
    before = np.maximum.accumulate(np.concatenate(([m_before], p[:-1])))
    idx = np.flatnonzero(p >= before)
    return h[idx], p[idx], t[idx], r[idx]


@dataclass
class IndexLayout:
    """Where each index file's keys come from (global key numbering) and the keyless files to add."""

    E: int
    offsets: dict[int, int]  # segment -> number of its first kept key
    counts: dict[int, int]  # segment -> kept keys
    extra: list[IndexImage]  # the empty only file, or the empty successor of a full last file
    keys: int

    @property
    def nfiles(self) -> int:
        return -(-self.keys // self.E) if self.keys else 0


def layout(geometry: IndexGeometry, order: Sequence[int], segs: Mapping[int, SegmentKeys], counts: Mapping[int, int],
           last: tuple[int, int, tuple[int, int]] | None, records: int, empty_index_count: int) -> IndexLayout:
    """Number the kept keys across segments (dispatch ``order``) and add the keyless files the broker has.

    ``last``: (segment, record row, (phy, time)) of the last kept key, None without keys. With no key
    at all but records dispatched the broker still has one empty file; when a record was dispatched
    after the last key and the last file is exactly full, its empty successor exists too.
    """
    E = geometry.entries_per_file
    offsets: dict[int, int] = {}
    K = 0
    for i in order:
        offsets[i] = K
        K += counts.get(i, 0)
    if last is None:
        trailing = False
    else:
        seg, row, _ = last
        later_rows = sum(segs[i].rows for i in order if i > seg)
        trailing = later_rows > 0 or row < segs[seg].rows - 1
    extra: list[IndexImage] = []
    empty = {"key_hash": [], "phy_offset": [], "store_timestamp": []}
    if K == 0:
        if records:
            extra = build_index_files(empty, geometry=geometry, emit_empty=True, empty_index_count=empty_index_count,
                                      name_tz=None)
    elif trailing and K % E == 0 and last is not None:
        extra = build_index_files(empty, geometry=geometry, prev_state=full_file_state(geometry, *last[2]),
                                  emit_empty=False, trailing_dispatch=True, empty_index_count=empty_index_count,
                                  name_tz=None)
    return IndexLayout(E, offsets, {i: counts.get(i, 0) for i in order}, extra, K)


def first_entry_times(E: int, offset: int, n: int, time_of: Callable[[int], int]) -> list[tuple[int, int]]:
    """(file number, store time of its first entry) for the files whose first key is among a segment's
    ``n`` kept keys (numbered from ``offset``; ``time_of(k)`` is the store time of its k-th): the time
    that names the file. Only those few keys are looked up."""
    out = []
    f = -(-offset // E)
    while f * E < offset + n:
        out.append((f, int(time_of(f * E - offset))))
        f += 1
    return out


def name_files(ix: IndexLayout, firsts: Mapping[int, int], tz: str | Any = "UTC") -> list[str]:
    """The files' names by the naming policy (:func:`index_file_name`, strictly increasing), from each
    file's first store time; the keyless extra files are named after them (their names set in place)."""
    names: list[str] = []
    last = None
    for f in range(ix.nfiles):
        last = index_file_name(firsts[f], tz, after=last)
        names.append(last)
    for im in ix.extra:
        im.name = index_file_name(im.first_timestamp or 0, tz, after=last)
        last = im.name
    return names


def link_file(f: int, geometry: IndexGeometry, spans: Mapping[int, tuple[int, int]],
              load: Callable[[int], tuple[KeyArrays, ChainRun | None]]
              ) -> tuple[Callable[[], Iterator[ChainRun]], IndexState | None]:
    """The runs of index file ``f`` (keys ``[f*E, (f+1)*E)``) and the state it continues from.

    ``spans``: segment -> (number of its first kept key, kept keys); ``load(segment)``: its kept keys and
    their precomputed ChainRun when still whole (else None: the chains of the slice are computed here).
    The runs come as a function that loads them one segment at a time on each call
    (:func:`storelib.broker.index.indexstream.stream_index_file` makes two passes): a file of up to 20 M keys is never
    held at once. The state stands for the previous full file (its last key's offset and time), None
    for file 0.
    """
    E = geometry.entries_per_file
    lo, hi = f * E, (f + 1) * E
    prev = None
    if f > 0:
        for idx in sorted(spans):
            o, c = spans[idx]
            if c and o <= lo - 1 < o + c:
                (_, p, t, _), _ = load(idx)
                prev = (int(p[lo - 1 - o]), int(t[lo - 1 - o]))
                del p, t
                break
        if prev is None:
            raise StoreError("index", None, "internal", f"index file {f}: previous file's last key is missing")
    segs = [i for i in sorted(spans) if spans[i][1] and spans[i][0] < hi and spans[i][0] + spans[i][1] > lo]

    def runs() -> Iterator[ChainRun]:
        for idx in segs:
            o, c = spans[idx]
            (h, p, t, _), run = load(idx)
            a, b = max(lo, o) - o, min(hi, o + c) - o
            if run is None or b - a < c:  # filtered or cut by a file boundary: chains of the slice
                run = ChainRun.of(h[a:b], p[a:b], t[a:b], geometry.hash_slot_num)
            del h, p, t
            yield run
            del run  # the next segment is loaded without this one

    return runs, full_file_state(geometry, prev[0], prev[1]) if prev is not None else None


__all__ = ["IndexLayout", "KeyArrays", "SegmentKeys", "first_entry_times", "full_file_state", "kept_counts", "kept_keys", "layout",
           "link_file", "name_files", "running_max_before"]
