"""The index checks as tasks: one per index file (:func:`index_file_task`: its structure, its chains, and
whether its entries are exactly the keys of its commitlog range, the ones a healthy broker put there).
Only when some file is not (or a record sits away from its PHYSICALOFFSET field) do the whole view's
lookups run: per file against the records its entries point at (:func:`index_lookup_task`), then per
commitlog segment, which of its keys some entry finds (:func:`coverage_task`). The judgement is
:mod:`storelib.checks.index`'s, over views that answer as the whole view does for what they are asked."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from storelib.broker.recovery.reputpath import stopping_gaps
from storelib.checks.index import (
    add_validate_findings,
    broken_chains,
    carried_entries,
    check_chains,
    entries_against_records,
    entries_fingerprint,
    expired_head,
    expired_index,
    file_snapshot,
    index_gone,
    index_open_error,
    key_codes,
    missing_key_findings,
    proven_chains,
    reput_skipped_keys,
    split_missing,
)
from storelib.checks.indexgrowth import grown_file_clean
from storelib.checks.logview import Unsettled, is_member
from storelib.checks.queues import reput_master
from storelib.checks.segment import Capped
from storelib.checks.tables import KEY_SCHEMA, RECORD_SCHEMA, TableRef, TableSink
from storelib.checks.tasks.context import CrossContext, subset_view
from storelib.errors import StoreError
from storelib.fileio.bytesource import resolve
from storelib.format.indexdir import IndexFileRef
from storelib.format.indexfile import IndexFile, IndexGeometry

CHUNK = 1 << 20  # entries compared at a time: no whole-file copy of their columns
PAIR_SCHEMA = pa.schema([("pos", pa.int64()), ("key_hash", pa.int64())])
PHY_SCHEMA = pa.schema([("phy", pa.int64())])


KeySlices = tuple[tuple[TableRef, int, int], ...]  # (a key table, first row, end row), in key order


@dataclass(frozen=True)
class IndexFileTask:
    """One index file against the keys its entries should be: the log's keys ``key_lo`` ..
    ``key_lo + entries`` (of an earlier run's file that grew: only its new entries', ``carried``)."""

    pos: int  # the file's place among the index files
    name: str
    size: int  # as listed
    key_lo: int
    entries: int  # entries it holds (a grown file: its new ones)
    keys: KeySlices  # those keys and the next one; () when the log has fewer
    carried: dict | None = None  # an earlier run's snapshot of the file (it grew since)
    last: bool = False  # the newest file (the one that grows: its snapshot keeps its slot table's CRC)
    structure: dict | None = None  # its :func:`index_structure_task` result (else checked here)
    skip: int = 0  # leading (a grown file: leading new) entries not matched: their records expired
    at: bytes | None = None  # its header as a live store's cut read it


def _ref(ctx: CrossContext, name: str, size: int, at: bytes | None = None) -> IndexFileRef:
    return IndexFileRef(name, ctx.root().join("index", name), size, at)


def _open(ctx: CrossContext, name: str, size: int, at: bytes | None = None) -> IndexFile:
    g = IndexGeometry(ctx.settings.max_hash_slot_num, ctx.settings.max_index_num)
    return _ref(ctx, name, size, at).open(g, strict=False, broker_size=True)


def _key_chunks(ctx: CrossContext, keys: KeySlices) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(record position, PHYSICALOFFSET field, hash) of the keys, a table's slice at a time."""
    for ref, lo, hi in keys:
        k = ref.read(KEY_SCHEMA, ctx.fs_options).slice(lo, hi - lo)
        yield k.column("pos").to_numpy(), k.column("phy").to_numpy(), k.column("key_hash").to_numpy()


def _entries_are_keys(ctx: CrossContext, task: IndexFileTask, ent: np.ndarray) -> tuple[bool, int | None]:
    """Are the entries (phyOffset, keyHash), in entry order, exactly the task's keys? And the position of
    the key after them (None: none, or not read)."""
    m = len(ent)
    if m != task.entries or sum(hi - lo for _r, lo, hi in task.keys) < m:
        return False, None
    at = 0
    for pos, phy, kh in _key_chunks(ctx, task.keys):
        for lo in range(0, len(phy), CHUNK):
            hi = min(lo + CHUNK, len(phy))
            part = ent[at + lo:at + hi]
            k = len(part)
            if (not np.array_equal(phy[lo:lo + k], part["phy_offset"].astype(np.int64))
                    or not np.array_equal(kh[lo:lo + k], part["key_hash"].astype(np.int32))):
                return False, None
            if k < hi - lo:  # past the file's entries: the next key
                return True, int(pos[lo + k])
        at += len(phy)
    return True, None


def file_info(name: str, h: Any, m: int) -> dict[str, Any]:
    return {"name": name, "entries": m, "begin_ts": h.begin_timestamp, "end_ts": h.end_timestamp,
            "begin_phy": h.begin_phy_offset, "end_phy": h.end_phy_offset}


def index_file_task(ctx: CrossContext, task: IndexFileTask) -> dict[str, Any]:
    """Are the file's entries its keys? (``task.structure``: its structure was checked beside the segments,
    :func:`index_structure_task`; else that too, here). A file that is not is looked up later; with
    ``ctx.snapshots``, what a later run goes on from."""
    display = f"index/{task.name}"
    try:
        f = _open(ctx, task.name, task.size, task.at)
    except StoreError as e:
        if not index_gone(_ref(ctx, task.name, task.size, task.at), ctx.cut is not None and ctx.cut.live):
            return {"pos": task.pos, "err": index_open_error(display, e).to_dict()}
        # the cleaner deleted it since the plan: not its keys, so it and the files after it are looked up,
        # where its lookup says it expired (and its keys, of records below the first offset now, expired too)
        return {"pos": task.pos, "entries": 0, "max_phy": -1, "validate": [], "chains": Capped().to_json(),
                "matched": False, "next_key": None}
    try:
        if task.carried is not None:
            return _grown_file(ctx, task, f, display)
        ent = f.entries_array()  # a view of the mapped file
        matched, next_key = _entries_are_keys(ctx, task, ent[task.skip:])
        res = task.structure if task.structure is not None else _structure(f, task.name, task.last, ctx.snapshots)
        return {**res, "pos": task.pos, "matched": matched, "next_key": next_key}
    finally:
        f.close()


@dataclass(frozen=True)
class IndexStructureTask:
    """One index file's structure, chains and extent, which need no record: checked beside the segment
    tasks (the cross-file phase then only compares its entries with the keys)."""

    name: str
    size: int
    uri: str
    fs_options: dict[str, Any]
    hash_slot_num: int
    index_num: int
    last: bool = False
    snapshot: bool = False
    at: bytes | None = None  # its header as a live store's cut read it
    log_min: int | None = None  # the commitlog's first offset: how many leading entries point below it


def index_structure_task(task: IndexStructureTask) -> dict[str, Any]:
    """:meth:`IndexFile.validate`'s findings, the chains' (valid when its entries turn out to be its keys),
    the largest position an entry names, and the file's snapshot for a later run (``snapshot``)."""
    g = IndexGeometry(task.hash_slot_num, task.index_num)
    display = f"index/{task.name}"
    try:
        f = IndexFileRef(task.name, resolve(task.uri, **task.fs_options).join("index", task.name),
                         task.size, task.at).open(g, strict=False, broker_size=True)
    except StoreError as e:
        return {"name": task.name, "err": index_open_error(display, e).to_dict()}
    try:
        res = {"name": task.name, **_structure(f, task.name, task.last, task.snapshot)}
        res["skip"] = expired_head(f.entries_array(), task.log_min) if task.log_min is not None else 0
        res["log_min"] = task.log_min
        return res
    finally:
        f.close()


def _structure(f: IndexFile, name: str, last: bool, snapshot: bool) -> dict[str, Any]:
    display = f"index/{name}"
    ent = f.entries_array()
    m = len(ent)
    # chains that hold settle validate's per-entry checks too: one pass over the entries, not two
    proven = proven_chains(ent, f.geometry.hash_slot_num) if m else None
    vf = f.validate(chunk_entries=1 << 18, proven=proven)
    file_max = _max_phy(ent, 0, -1)
    chains = Capped()
    if m and proven is None:  # the proof failed: say which entries are off
        broken_chains(ent, f.geometry, display, chains)
    res = {"entries": m, "max_phy": file_max, "validate": [x.to_dict() for x in vf], "chains": chains.to_json()}
    if snapshot:  # as it stands if its entries are its keys (the only case a carry is made)
        fc = Capped()
        fc.replay_json(res["chains"])
        add_validate_findings(vf, False, display, fc)
        res["snap"] = file_snapshot(f, ent, file_info(name, f.header, m), file_max, fc, last)
    return res


def _max_phy(ent: np.ndarray, skip: int, start: int) -> int:
    """The largest position an entry names (from entry ``skip`` on; ``start`` for the ones before)."""
    file_max = start
    for lo in range(skip, len(ent), CHUNK):
        file_max = max(file_max, int(ent["phy_offset"][lo:lo + CHUNK].max()))
    return file_max


def _grown_file(ctx: CrossContext, task: IndexFileTask, f: IndexFile, display: str) -> dict[str, Any]:
    """A file an earlier run found clean that has grown since: its old entries unchanged (their sampled
    CRCs), its new ones the next keys, its slots what the old ones and the new give
    (:func:`storelib.checks.indexgrowth.grown_file_clean`). Anything else: ``unsettled``."""
    c = task.carried
    ent = f.entries_array()
    try:
        skip = carried_entries(c, ent, display)
    except Unsettled as e:
        return {"pos": task.pos, "unsettled": str(e)}
    matched, next_key = _entries_are_keys(ctx, task, ent[skip + task.skip:])  # (new entries whose records expired: not keys)
    crc = grown_file_clean(f, skip, c["slots_crc"], c["distinct"]) if matched else None
    if crc is None:
        return {"pos": task.pos, "unsettled": f"{display}: its new entries or slots need the whole file checked"}
    file_max = _max_phy(ent, skip, c["max_phy"])
    info = file_info(task.name, f.header, len(ent))
    snap = {**c, "count": len(ent), "index_count": f.header.index_count, "fp": entries_fingerprint(ent, len(ent)),
            "info": info, "max_phy": file_max, "slots_crc": crc, "distinct": f.header.hash_slot_count}
    return {"pos": task.pos, "entries": len(ent) - skip - task.skip, "max_phy": file_max, "matched": True, "validate": [],
            "chains": Capped().to_json(), "next_key": next_key, "snap": snap, "info": info}


@dataclass(frozen=True)
class IndexLookupTask:
    """One index file whose entries are looked up record by record, as the whole view does."""

    pos: int
    name: str
    size: int
    at: bytes | None = None


def index_lookup_task(ctx: CrossContext, task: IndexLookupTask) -> dict[str, Any]:
    """The file's entry findings (bad offsets, entries past the log, wrong hashes), its chains when no
    hash is wrong, and for the key coverage: which (record, key hash) each entry finds and the positions
    of wrong-hash entries, per commitlog segment."""
    display = f"index/{task.name}"
    try:
        f = _open(ctx, task.name, task.size, task.at)
    except StoreError as e:  # (a live store's cleaner may delete it between the file task and this one)
        ref = _ref(ctx, task.name, task.size, task.at)
        gone = index_gone(ref, ctx.cut is not None and ctx.cut.live)
        found = Capped()
        found.extend(expired_index(ref) if gone else [index_open_error(display, e)])
        return {"pos": task.pos, "found": found.to_json(), "wrong": 0, "chains": Capped().to_json(), "pairs": {},
                "wrong_phy": {}}
    try:
        ent = np.array(f.entries_array())
        g = f.geometry
    finally:
        f.close()
    e_phy = ent["phy_offset"].astype(np.int64)
    lost = ctx.lost_array()
    inside = (e_phy >= ctx.log_min) & (e_phy < ctx.log_end)
    wanted = np.unique(e_phy[inside])
    if len(lost) and len(wanted):
        i = np.searchsorted(lost[:, 0], wanted, side="right") - 1
        wanted = wanted[~((i >= 0) & (wanted < lost[np.clip(i, 0, None), 1]))]
    view = subset_view(ctx, RECORD_SCHEMA.empty_table(), wanted, with_keys=True).view
    out, chains = Capped(), Capped()
    all_codes: list[np.ndarray] = []
    wrong_phy: list[np.ndarray] = []
    wrong = entries_against_records(view, key_codes(view), ent, g, display, out, all_codes, wrong_phy)
    if len(ent) and not len(wrong):
        check_chains(ent, g, display, chains)
    codes = all_codes[0]
    rank = codes >> 31
    row = rank if view.field_order is None else view.field_order[rank]
    pos = view.phy[row] if len(row) else np.zeros(0, np.int64)
    sink = ctx.table_sink()
    pairs = _buckets(ctx, sink, f"{task.name}.pairs", pos, pa.table({"pos": pos, "key_hash": codes & 0x7FFFFFFF}))
    wp = wrong_phy[0]
    wrongs = _buckets(ctx, sink, f"{task.name}.wrong", wp, pa.table({"phy": wp}))
    return {"pos": task.pos, "found": out.to_json(), "wrong": int(len(wrong)), "chains": chains.to_json(),
            "pairs": pairs, "wrong_phy": wrongs}


def _buckets(ctx: CrossContext, sink: TableSink | None, stem: str, where: np.ndarray, table: pa.Table) -> dict[int, TableRef]:
    """``table``'s rows by the commitlog segment of ``where``: files in the work dir (or kept here)."""
    S = ctx.segment_size
    out: dict[int, TableRef] = {}
    if not table.num_rows:
        return out
    seg = where // S * S
    order = np.argsort(seg, kind="stable")
    seg_s = seg[order]
    starts = np.flatnonzero(np.r_[True, seg_s[1:] != seg_s[:-1]])
    for a, b in zip(starts.tolist(), [*starts[1:].tolist(), len(seg_s)]):
        part = table.take(order[a:b])
        base = int(seg_s[a])
        out[base] = TableRef(sink.write(f"{stem}-{base}", part)) if sink is not None else TableRef(table=part)
    return out


@dataclass(frozen=True)
class CoverageTask:
    """One commitlog segment's keys that no file matched in order: is some entry theirs?"""

    base: int
    keys: KeySlices  # those keys
    pairs: tuple[TableRef, ...]  # (record position, key hash) the looked-up entries find in this segment
    wrong: tuple[TableRef, ...]  # positions named by entries with a wrong hash, in this segment
    max_end_phy: int  # the largest position any entry names
    first_begin: int  # the oldest index file's first position


def coverage_task(ctx: CrossContext, task: CoverageTask) -> dict[str, Any]:
    """How many of the segment's keys are not indexed yet, and the ones missing for good (findings, in
    key order)."""
    kp, kh = [], []
    for pos, _phy, h in _key_chunks(ctx, task.keys):
        kp.append(pos)
        kh.append(h)
    kphy = np.concatenate(kp) if kp else np.zeros(0, np.int64)
    khash = np.concatenate(kh).astype(np.int64) if kh else np.zeros(0, np.int64)
    pairs = [r.read(PAIR_SCHEMA, ctx.fs_options) for r in task.pairs]
    have = np.sort(np.concatenate([((t.column("pos").to_numpy() - task.base) << 31) | t.column("key_hash").to_numpy()
                                   for t in pairs])) if pairs else np.zeros(0, np.int64)
    kcode = ((kphy - task.base) << 31) | khash
    known = khash >= 0
    missing = np.flatnonzero(~is_member(kcode, have) & known)
    out = Capped()
    behind_n = 0
    if len(missing):
        mphy = kphy[missing]
        lost = ctx.lost_array()
        explained = mphy < ctx.log_min
        if len(lost):
            i = np.searchsorted(lost[:, 0], mphy, side="right") - 1
            explained |= (i >= 0) & (mphy < lost[np.clip(i, 0, None), 1])
        wrongs = [r.read(PHY_SCHEMA, ctx.fs_options).column("phy").to_numpy() for r in task.wrong]
        if wrongs:
            explained |= is_member(mphy, np.sort(np.concatenate(wrongs)))
        behind, real = split_missing(mphy, explained, task.max_end_phy, ctx.cut is not None and ctx.cut.live)
        # (the segment's keys only: whether a message was dispatched needs no other segment's)
        skipped = reput_skipped_keys(kphy, missing, real | behind, known, lost, ctx.segment_size,
                                     reput_master(ctx.settings), stopping_gaps(ctx.gaps_array(), task.max_end_phy))
        behind_n = int((behind & ~skipped).sum())  # the reput never reads the skipped: not "not indexed yet"
        missing_key_findings(mphy, khash[missing], real & ~skipped, skipped, task.first_begin, ctx.segment_size, out)
    return {"base": task.base, "behind": behind_n, "found": out.to_json()}




KEYS_KEEP = 300_000  # keys not indexed yet that a run keeps for the next incremental one (more: full)


@dataclass(frozen=True)
class KeysTailTask:
    """The keys after the last index file's: what a later (``--since``) run matches new entries against."""

    keys: KeySlices


def keys_tail_task(ctx: CrossContext, task: KeysTailTask) -> dict[str, Any]:
    """The first one's position, and their PHYSICALOFFSET fields and hashes (None: more than
    :data:`KEYS_KEEP`)."""
    n = sum(hi - lo for _r, lo, hi in task.keys)
    first, phy, kh = None, [], []
    for pos, p, h in _key_chunks(ctx, task.keys[:1] if n > KEYS_KEEP else task.keys):
        first = int(pos[0]) if first is None and len(pos) else first
        phy.append(p)
        kh.append(h)
    if n > KEYS_KEEP:
        return {"first": first, "phy": None, "hash": None}
    return {"first": first, "phy": np.concatenate(phy).tolist() if phy else [],
            "hash": np.concatenate(kh).tolist() if kh else []}
