"""The prevIndex chains of index files being written, as IndexService.putKey links them: each entry to the
previous entry of its hash slot, the slot table holding each slot's newest entry (new files, a continued
file, and the per-segment chain runs of the task rebuild)."""

from __future__ import annotations

import numpy as np

from storelib.scan.arrowcols import radix_order


def slot_chains(slot: np.ndarray, n0: int) -> tuple[np.ndarray, np.ndarray]:
    """Entries grouped by slot, oldest first: (slot, entry number) pairs sorted by slot then number
    (the slots in their own integer type).

    Entry ``n0 + i`` has slot ``slot[i]`` (below 2**31): a stable order by slot
    (:func:`storelib.scan.arrowcols.radix_order`, counting-sort passes) keeps each slot's entries in
    number order.
    """
    slot = np.asarray(slot)
    order = radix_order(slot)
    # gathered in the slots' own integer width (an int64 copy of 1.6 M int32 slots first cost 14 ms)
    return slot[order], (order if n0 == 0 else order + n0).astype(np.int32)


def index_chains(hs: np.ndarray, n0: int, S: int, old_slots: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """prevIndex of entries ``n0, n0+1, ...`` with index hashes ``hs``, and the resulting slot table.

    ``old_slots``: the slot table of the file being continued (None for a new file).
    """
    m = len(hs)
    slot = hs % S
    # entries sorted by (slot, number); within a slot the previous (older) number is the link
    ss, ns = slot_chains(slot, n0)
    del slot
    first = np.ones(m, dtype=bool)
    first[1:] = ss[1:] != ss[:-1]
    prev_sorted = np.empty(m, dtype=np.int32)
    prev_sorted[1:] = ns[:-1]
    if old_slots is not None:
        slots = old_slots.astype(np.int32).copy()
        old = slots[ss[first]].astype(np.int64)
        # putKey: a slot value <= 0 or > indexCount (= n at insert) reads as empty
        prev_sorted[first] = np.where((old > 0) & (old <= ns[first]), old, 0)
    else:
        slots = np.zeros(S, dtype=np.int32)
        prev_sorted[first] = 0
    prev = np.empty(m, dtype=np.int32)
    prev[ns - n0] = prev_sorted
    last = np.empty(m, dtype=bool)
    last[:-1] = first[1:]
    last[-1] = True
    slots[ss[last]] = ns[last]  # the newest entry of each slot
    return prev, slots
