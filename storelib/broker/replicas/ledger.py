"""A DLedger node's ledger as its load leaves it, and the entry reads the group comparison needs.

DLedgerMmapFileStore.recover walks the data files (the recovery walk's DLedger mode): the ledger ends with
the last entry it accepts (index, term, write position); it begins with the first data file's first entry.
The committed index is DLedger's checkpoint value, -1 below the ledger's begin and clamped to its end
(``updateCommittedIndex``). Entries compared for a rejoin are DLedgerEntry.equals: size, magic, index,
term, pos, channel and body (header bytes 0-35 and 44 on; not the chain and body CRC fields).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from storelib.broker.settings.store import Store
from storelib.errors import StoreError
from storelib.format.dledger.entries import (
    BODY_OFFSET,
    ENTRY_MAGIC,
    INDEX_UNIT_SIZE,
    EntryHeader,
    decode_entry_headers,
    decode_index_units,
    header_problem,
)
from storelib.scan.scanner import SegmentScan

STALE_PROBE = 16 << 20  # bytes of a data file past the ledger's end searched for entries a truncation left
UNIT_PROBE = 4096  # index units past the ledger's end looked at


def ledger_facts(store: Store, end: int, last: tuple[int | None, int | None]) -> dict[str, Any]:
    """The ledger after load: ``end`` the write position the walk reached, ``last`` its last entry's (index,
    term) (None, None: no entry)."""
    d, st = store.dledger, store.dledger_state
    segs = [s for s in store.commitlog.segments if s.file_size > 0]
    begin = -1
    if segs and last[0] is not None:
        with segs[0].open() as src:
            begin = EntryHeader.from_bytes(bytes(src.read(0, BODY_OFFSET)), file=segs[0].display).index
    end_index = -1 if last[0] is None else int(last[0])
    cp = st.committed_index if st is not None else -1
    committed = None if cp is None else (-1 if cp < begin or end_index < 0 else min(cp, end_index))
    ct = st.currterm if st is not None else None
    return {"self_id": d.self_id, "dir": d.dir, "begin_index": begin, "end_index": end_index,
            "end_term": -1 if last[1] is None else int(last[1]), "write_pos": end, "committed_index": committed,
            "checkpoint_committed_index": cp, "term": None if ct is None else ct.curr_term,
            "vote_leader": None if ct is None else ct.vote_leader}


def stale_entries(store: Store, end: int, end_index: int) -> dict[str, Any] | None:
    """Entries still valid on disk past the ledger's end (DLedger's truncate only moves the write position:
    a rejoined node keeps the old bytes after the entries it took from the leader) and index units past the
    end that are not zero; None when there are neither. DLedger's reload ignores them unless they happen to
    continue the chain."""
    out: dict[str, Any] = {}
    seg = store.commitlog.segment_for(end)
    if seg is not None:
        with seg.open() as src:
            pos = end - seg.base
            n = min(src.size - pos, STALE_PROBE)
            a = np.frombuffer(bytes(src.read(pos, n)), np.uint8) if n >= BODY_OFFSET else np.zeros(0, np.uint8)
        first = _first_entry(a, end)
        if first is not None:
            out.update({"from": end, "resumes_at": end + first, **_chain(a, first, end)})
    units = _units_past(store, end_index)
    if units:
        out["index_units_past_end"] = units
    return out or None


def _first_entry(a: np.ndarray, base: int) -> int | None:
    """The first offset of ``a`` (the data file past the ledger's end, ``base`` its position) where an entry
    header passes DLedger's checks (its pos field is where it lies)."""
    n = len(a) - BODY_OFFSET + 1  # offsets with a whole header after them
    if n <= 0:
        return None
    m = np.flatnonzero((a[0:n] == 0) & (a[1:n + 1] == 0) & (a[2:n + 2] == 0) & (a[3:n + 3] == ENTRY_MAGIC))
    if not len(m):
        return None
    h = decode_entry_headers(a, m)
    ok = (h["pos"] == base + m) & (h["size"] == h["body_len"] + BODY_OFFSET) & (h["size"] > 44) \
        & (m + h["size"] <= len(a))
    hit = np.flatnonzero(ok)
    return int(m[hit[0]]) if len(hit) else None


def _chain(a: np.ndarray, p: int, base: int) -> dict[str, Any]:
    """How many entries follow one another from offset ``p`` (index contiguous, each passing the checks)."""
    count, first, last, prev = 0, None, None, None
    buf = a.tobytes()
    while len(buf) - p >= BODY_OFFSET:
        h = EntryHeader.from_bytes(buf, p)
        if header_problem(h.magic, h.size, h.pos, h.body_len, base + p, len(buf) - p) or \
                (prev is not None and h.index != prev + 1):
            break
        first = h.index if first is None else first
        last = prev = h.index
        count += 1
        p += h.size
    return {"entries": count, "first_index": first, "last_index": last, "until": base + p}


def _units_past(store: Store, end_index: int) -> int:
    """How many of the next index units after the ledger's end are not zero."""
    lo = (end_index + 1) * INDEX_UNIT_SIZE
    raw = read_index_bytes(store, lo, UNIT_PROBE * INDEX_UNIT_SIZE)
    if not raw:
        return 0
    n = len(raw) // INDEX_UNIT_SIZE * INDEX_UNIT_SIZE
    u = np.frombuffer(raw[:n], np.uint8).reshape(-1, INDEX_UNIT_SIZE)
    return int(u.any(axis=1).sum())


def read_index_bytes(store: Store, offset: int, length: int) -> bytes:
    """Bytes of the node's index files at an absolute offset (files named by their start offset); empty when
    no file holds it."""
    from storelib.fileio.bytesource import open_source
    from storelib.scan.commitlog import list_files

    loc = store.path(store.dledger.index)
    files = sorted((int(i.base_name), i) for i in list_files(loc) if i.base_name.isdigit() and len(i.base_name) == 20)
    for base, info in files:
        if base <= offset < base + int(info.size or 0):
            with open_source(loc.join(info.base_name), int(info.size)) as src:
                return bytes(src.read(offset - base, min(length, int(info.size) - (offset - base))))
    return b""


def index_unit(store: Store, index: int) -> tuple[int, int] | None:
    """(pos, size) of an entry from its index unit, as DLedger's get() finds it (None: no unit)."""
    raw = read_index_bytes(store, index * INDEX_UNIT_SIZE, INDEX_UNIT_SIZE)
    if len(raw) < INDEX_UNIT_SIZE:
        return None
    u = decode_index_units(raw)[0]
    return (int(u["pos"]), int(u["size"])) if int(u["magic"]) == ENTRY_MAGIC else None


def entry_rows(store: Store, lo: int, hi: int) -> dict[str, np.ndarray]:
    """index, term, pos and size of the entries starting in data positions ``[lo, hi)`` (a scan of them)."""
    cols = ["dledger_index", "dledger_term", "dledger_pos", "size"]
    parts: dict[str, list] = {c: [] for c in cols}
    opts = store.commitlog.scan_options()
    for seg in store.commitlog.segments:
        a, b = max(lo, seg.base), min(hi, seg.base + seg.file_size)
        if a >= b:
            continue
        with seg.open() as src:
            for batch in SegmentScan(src, seg.display, seg.base, a - seg.base, b - seg.base, verify_crc=False,
                                     with_properties=False, columns=cols, **opts):
                for c in cols:
                    parts[c].append(np.asarray(batch.column(c)))
    out = {c: (np.concatenate(v) if v else np.zeros(0, np.int64)) for c, v in parts.items()}
    out["size"] = out["size"].astype(np.int64) + BODY_OFFSET  # the entry's size
    return out


def entry_bytes(store: Store, pos: int, size: int) -> bytes:
    """The bytes DLedgerEntry.equals compares: the header without the chain and body CRCs, and the body."""
    seg = store.commitlog.segment_for(pos)
    if seg is None:
        raise StoreError(store.uri, pos, "no_segment", f"no data file holds position {pos}")
    with seg.open() as src:
        raw = bytes(src.read(pos - seg.base, size))
    return raw[:36] + raw[44:]


__all__ = ["entry_bytes", "entry_rows", "index_unit", "ledger_facts", "read_index_bytes", "stale_entries"]
