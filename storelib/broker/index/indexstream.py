"""One index file streamed from runs whose slot chains were computed per segment (the task engines'
index task): :func:`local_chains` per run, :func:`stream_index_file` links the runs with a slot table
carried from run to run and writes the file in order, one run in memory at a time. The bytes are those
of :func:`storelib.broker.index.indexbuild.build_index_files` (tests/test_indexfile_stream.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from storelib.broker.index.indexchains import slot_chains
from storelib.format.indexfile import (
    ENTRY_DTYPE,
    ENTRY_SIZE,
    IndexGeometry,
    IndexHeader,
    entry_bytes,
    index_time_diff,
    index_time_diffs,
)

if TYPE_CHECKING:
    from storelib.broker.index.indexbuild import IndexState


def local_chains(key_hash: np.ndarray, hash_slot_num: int) -> tuple[np.ndarray, np.ndarray]:
    """Slot chains of a run of keys numbered 0..m-1 as if the slot table were empty.

    Returns ``prev_local`` (int32: the number of the previous key of the same slot in the run, -1
    for the slot's oldest key in the run) and ``is_tail`` (bool: the newest key of its slot in the
    run). A per-segment task computes them before the global entry numbers are known; the file's
    chains are then these plus the run's first entry number, with each run's oldest keys linked
    to the slot table left by the runs before it (:func:`stream_index_file`).
    """
    h = np.asarray(key_hash)
    m = len(h)
    prev = np.empty(m, dtype=np.int32)
    tail = np.zeros(m, dtype=bool)
    if m == 0:
        return prev, tail
    ss, ns = slot_chains(h % hash_slot_num, 0)  # numbers grouped by slot, oldest first
    same = ss[1:] == ss[:-1]  # sorted neighbours in one slot: ns[i] follows ns[i-1]
    del ss
    prev[ns[0]] = -1
    prev[ns[1:]] = np.where(same, ns[:-1], -1)
    tail[ns[:-1][~same]] = True
    tail[ns[-1]] = True
    return prev, tail


class Gathered:
    """``base[rows]``, gathered only where indexed: a run's offsets and times kept once per record (a
    record has ~3 keys) and read by key row. The first pass over a file's runs reads two of them; the
    second gathers one write chunk at a time."""

    def __init__(self, base: np.ndarray, rows: np.ndarray):
        self.base, self.rows = base, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k: int | slice) -> Any:
        return self.base[self.rows[k]]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.base[self.rows]
        return out if dtype is None else out.astype(dtype)


@dataclass
class ChainRun:
    """Consecutive keys of one index file (dispatch order, after the duplicate test) with their
    :func:`local_chains`."""

    key_hash: np.ndarray
    phy_offset: np.ndarray | Gathered
    store_timestamp: np.ndarray | Gathered
    prev_local: np.ndarray
    is_tail: np.ndarray

    @classmethod
    def of(cls, key_hash: np.ndarray, phy_offset: np.ndarray, store_timestamp: np.ndarray,
           hash_slot_num: int) -> ChainRun:
        prev, tail = local_chains(key_hash, hash_slot_num)
        return cls(np.asarray(key_hash), np.asarray(phy_offset), np.asarray(store_timestamp), prev, tail)

    def __len__(self) -> int:
        return len(self.key_hash)


STREAM_CHUNK = 1 << 19  # entries per write: two reused 10 MiB buffers, whatever the file size

# a file's runs, in order: a sequence, or a function that loads them again on each call (one run in
# memory at a time: the task engines' index task, whose file spans many segments)
Runs = Sequence[ChainRun] | Callable[[], Iterable[ChainRun]]


def _run_links(r: ChainRun, n: int, slots: np.ndarray, S: int) -> np.ndarray:
    """The prevIndex of run ``r``'s oldest key per slot (numbered from ``n``) from the slot table left by
    the runs before it (putKey's rule: a value <= 0 or > indexCount at insert reads as empty; values set
    by this build are always older); then the run's newest key per slot goes into ``slots``."""
    heads = np.flatnonzero(r.prev_local < 0)
    old = slots[r.key_hash[heads] % S]
    hp = np.where((old > 0) & (old <= heads + n), old, 0).astype(np.int32)
    tails = np.flatnonzero(r.is_tail)
    slots[r.key_hash[tails] % S] = tails + n
    return hp


@dataclass
class _RunStats:
    """What pass 1 over a file's runs tells the header: key count, first/last key, empty heads."""

    keys: int = 0
    longest: int = 0
    empty_heads: int = 0
    first: tuple[int, int] | None = None  # (store time, phy) of the first key
    last: tuple[int, int] | None = None


def _pass1(runs: Runs, slots: np.ndarray, n0: int, S: int) -> _RunStats:
    """The slot table after every run, and the header's facts. From an empty table (a new file) only
    each run's newest key per slot is needed: every link to an older run's entry is then valid, so the
    heads that found their slot empty are one per slot used, counted from the final table."""
    st = _RunStats()
    n = n0
    fresh = not slots.any()
    for r in (runs() if callable(runs) else runs):
        if not len(r):
            continue
        if fresh:
            tails = np.flatnonzero(r.is_tail)
            slots[r.key_hash[tails] % S] = tails + n
        else:
            hp = _run_links(r, n, slots, S)
            st.empty_heads += len(hp) - int(np.count_nonzero(hp))
        if st.first is None:
            st.first = (int(r.store_timestamp[0]), int(r.phy_offset[0]))
        st.last = (int(r.store_timestamp[-1]), int(r.phy_offset[-1]))
        st.keys += len(r)
        st.longest = max(st.longest, len(r))
        n += len(r)
    if fresh:
        st.empty_heads = int(np.count_nonzero(slots))
    return st


def stream_index_file(
    runs: Runs,
    out: Any,
    *,
    geometry: IndexGeometry,
    prev_state: IndexState | None = None,
    sparse_tail: bool = False,
    chunk_entries: int = STREAM_CHUNK,
) -> tuple[IndexHeader, str]:
    """Write one index file to the binary file object ``out`` in file order; returns (header, sha256).

    The same bytes as the one image :func:`build_index_files` makes for these keys (keys already
    past the duplicate test, all fitting this file), without materialising the file: a first pass
    over the runs' oldest/newest keys per slot gives the slot table and the header; a second pass
    links each run again from a slot table carried the same way and writes and hashes header, slots
    and entries chunk by chunk from two reused buffers (on a second thread while the next chunk is
    filled). ``runs`` may be a function that loads them (called once per pass): memory then holds
    one run and two slot tables, whatever the file's key count.
    ``prev_state``: the previous file when it is full (entry 1's timeDiff starts at its end time),
    or the file being continued. ``sparse_tail``: ``out`` is a local file; the zero tail is made by
    truncating (sparse) instead of written.
    """
    g = geometry
    E, S = g.entries_per_file, g.hash_slot_num
    c0 = 0
    continued = False
    if prev_state is not None:
        c0 = min(max(prev_state.header.index_count, 1) - 1, E)
        continued = c0 < E
    if continued and len(prev_state.entries) < c0:
        raise ValueError(f"prev_state has {len(prev_state.entries)} entries, header says {c0}")
    n0 = c0 + 1 if continued else 1

    def initial_slots() -> np.ndarray:
        return np.array(prev_state.slots, dtype=np.int32) if continued else np.zeros(S, dtype=np.int32)

    slots = initial_slots()
    st = _pass1(runs, slots, n0, S)
    K = st.keys
    if K == 0 or K > E - (c0 if continued else 0):
        raise ValueError(f"{K} keys do not fill one index file of {E - (c0 if continued else 0)} free entries")
    if continued and c0 >= 1:
        begin_ts, begin_phy = prev_state.header.begin_timestamp, prev_state.header.begin_phy_offset
    else:
        begin_ts, begin_phy = st.first
    if continued:
        init_begin = prev_state.header.begin_timestamp
    else:
        init_begin = max(prev_state.header.end_timestamp, 0) if prev_state is not None else 0
    header = IndexHeader(
        begin_timestamp=int(begin_ts), end_timestamp=st.last[0],
        begin_phy_offset=int(begin_phy), end_phy_offset=st.last[1],
        hash_slot_count=int((prev_state.header.hash_slot_count if continued else 0) + st.empty_heads),
        index_count=n0 + K,
    )
    head = header.to_bytes() + slots.astype(">i4").tobytes() + bytes(ENTRY_SIZE)
    del slots
    sha = hashlib.sha256()

    def put(b: Any) -> None:
        out.write(b)
        sha.update(b)

    bufs = [np.empty(min(chunk_entries, st.longest), dtype=ENTRY_DTYPE) for _ in range(2)]
    with ThreadPoolExecutor(1, thread_name_prefix="rmqstore-index-out") as ex:
        done = [ex.submit(put, head)]
        if continued and c0:
            done.append(ex.submit(put, entry_bytes(prev_state.entries[:c0])))
        done += _pass2(runs, ex, put, bufs, initial_slots(), n0, S, begin_ts, init_begin, chunk_entries)
        for f in done:  # every write so far has succeeded (and in order: one worker)
            f.result()
        done = _put_tail(ex, sha.update if sparse_tail else put, out if sparse_tail else None,
                         g.entry_pos(n0 + K), g.file_size)
        for f in done:
            f.result()
    return header, sha.hexdigest()


def _pass2(runs: Runs, ex: ThreadPoolExecutor, put: Callable[[Any], None], bufs: list[np.ndarray], slots: np.ndarray,
           n0: int, S: int, begin_ts: int, init_begin: int, chunk_entries: int) -> list[Future]:
    """Link each run again (the slot table carried as in pass 1) and submit its entries chunk by chunk."""
    pending: list[Future | None] = [None, None]
    done: list[Future] = []
    n, turn = n0, 0
    for r in (runs() if callable(runs) else runs):
        m = len(r)
        if not m:
            continue
        hp = _run_links(r, n, slots, S)
        hi = 0  # heads of this run used so far
        for a in range(0, m, chunk_entries):
            b = min(m, a + chunk_entries)
            if pending[turn] is not None:
                pending[turn].result()
            e = bufs[turn][: b - a]
            e["key_hash"] = r.key_hash[a:b]
            e["phy_offset"] = r.phy_offset[a:b]
            td = index_time_diffs(np.asarray(r.store_timestamp[a:b], dtype=np.int64), begin_ts)
            if n + a == 1:
                td[0] = index_time_diff(int(r.store_timestamp[0]), init_begin)
            e["time_diff"] = td
            pl = r.prev_local[a:b]
            pv = pl + np.int32(n)
            hm = pl < 0
            k = int(np.count_nonzero(hm))
            pv[hm] = hp[hi: hi + k]
            hi += k
            e["prev_index"] = pv
            pending[turn] = ex.submit(put, memoryview(e.view(np.uint8)))
            done.append(pending[turn])
            turn ^= 1
        n += m
    return done


def _put_tail(ex: ThreadPoolExecutor, put_zeros: Callable[[Any], None],
              sparse_out: Any, tail_at: int, file_size: int) -> list[Future]:
    """The zero tail after the last entry: written, or (``sparse_out``) made by truncating and only hashed."""
    if sparse_out is not None:
        sparse_out.flush()
        sparse_out.truncate(file_size)
    zeros = bytes(min(file_size - tail_at, 8 << 20))
    left = file_size - tail_at
    done = []
    while left > 0:
        k = min(left, len(zeros))
        done.append(ex.submit(put_zeros, memoryview(zeros)[:k]))
        left -= k
    return done


__all__ = ["STREAM_CHUNK", "ChainRun", "Gathered", "Runs", "local_chains", "stream_index_file"]
