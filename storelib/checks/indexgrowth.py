"""An index file that grew since an earlier audit found it clean, checked on what changed only: the
entries appended since and the slot table. What :meth:`IndexFile.validate` and the chain check would
conclude over the whole file follows from the earlier run's verdict on the old entries, which are
unchanged (their fingerprint), and three facts about the new ones: each chains to the previous entry of
its slot, a slot's first new entry chains to what the slot held before (the earlier slot table, known by
its CRC: restoring those heads into today's table must give it back exactly), and the slot table now
holds each touched slot's newest entry. Then hashSlotCount is the earlier count plus the slots used for
the first time. The broker's last index file grows with every message; this keeps an incremental audit
from reading all of it again."""

from __future__ import annotations

import zlib

import numpy as np

from storelib.format.indexfile import IndexFile


def slots_crc(slots: np.ndarray) -> int:
    """CRC32 of a slot table (its values as stored, big-endian)."""
    return zlib.crc32(np.ascontiguousarray(slots, dtype=">i4").tobytes())


def grown_file_clean(f: IndexFile, n0: int, old_crc: int, old_distinct: int) -> int | None:
    """For a file that held ``n0`` clean entries with slot table CRC ``old_crc`` and ``old_distinct`` used
    slots: the CRC of today's slot table when the whole file is still clean, else None (check it all)."""
    g, h = f.geometry, f.header
    N = g.hash_slot_num
    ent = f.entries_array()
    m = len(ent)
    if not 0 <= h.index_count <= g.index_num or m <= n0:
        return None
    new = ent[n0:]
    num = np.arange(n0 + 1, m + 1, dtype=np.int64)
    kh = new["key_hash"].astype(np.int64)
    prev = new["prev_index"].astype(np.int64)
    if np.any(kh < 0) or np.any(prev < 0) or np.any(prev >= num):
        return None
    slot = kh % N
    order = np.argsort((slot << 32) | num, kind="stable")
    s_s, n_s, p_s = slot[order], num[order], prev[order]
    head = np.r_[True, s_s[1:] != s_s[:-1]]  # a slot's first new entry
    if not np.array_equal(p_s[1:][~head[1:]], n_s[:-1][~head[1:]]):
        return None  # a new entry not chained to the previous new entry of its slot
    first_slot, first_prev = s_s[head], p_s[head]
    old_tail = first_prev[first_prev > 0]
    if len(old_tail) and not np.array_equal(ent["key_hash"][old_tail - 1].astype(np.int64) % N,
                                            first_slot[first_prev > 0]):
        return None  # chained to an entry of another slot
    slots = f.slots()
    last = np.r_[s_s[1:] != s_s[:-1], True]
    if not np.array_equal(slots[s_s[last]].astype(np.int64), n_s[last]):
        return None  # a touched slot does not hold its newest entry
    before = np.array(slots, dtype=">i4")
    before[first_slot] = first_prev
    if slots_crc(before) != old_crc:
        return None  # other slots changed, or a first new entry does not chain to its slot's old head
    found: list = []
    f.check_header_fields(ent, old_distinct + int(np.count_nonzero(first_prev == 0)),
                          lambda *a, **k: found.append(a))
    if found or f.first_data_beyond_count(1 << 18) is not None:
        return None
    return slots_crc(slots)
