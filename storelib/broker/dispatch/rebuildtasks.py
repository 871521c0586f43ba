"""The rebuild's tasks for a task engine (a process pool or Spark) and the merge steps over their results.

Phase A parses each segment the recovery walk's way into dispatch columns and index keys (with their
per-segment slot chains); phase B writes the consume queues of one partition (storelib.broker.dispatch.cqstream);
phase C writes one index file, linking the segments' chains (storelib.broker.index.indexmerge/indexstream).
Intermediates go through Arrow IPC files in ``staging/_work``, never through the scheduler. The task
functions are module-level so that they pickle by reference (the job only maps them on an engine and
reports progress). The in-process engine (storelib.broker.dispatch.dispatch) writes the same bytes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from storelib.broker.dispatch.cqstream import ConsumeQueueStream
from storelib.broker.index.indexbuild import IndexImage, empty_index_count, index_keys
from storelib.broker.index.indexmerge import IndexLayout, SegmentKeys, first_entry_times, kept_keys, link_file
from storelib.broker.index.indexstream import ChainRun, Gathered, local_chains
from storelib.broker.index.indexwrite import write_index_image, write_index_runs
from storelib.broker.recovery.walk import RecoveryResult, SegmentTask, WalkPlan, iter_task
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.errors import StoreError
from storelib.fileio.bytesource import Location, open_source, read_ipc_file, resolve
from storelib.fileio.memory import keep_freed_memory
from storelib.format.indexfile import IndexGeometry
from storelib.format.javahash import java_hash_array
from storelib.format.record import gets_cq_unit
from storelib.format.topicname import unsafe_reason, unsafe_topic_finding
from storelib.scan.arrowcols import with_topic_codes
from storelib.scan.commitlog import Split
from storelib.scan.scanner import TASK_BATCH_ROWS, SegmentEnd

CQ_COLS = ["physical_offset_field", "size", "tags_code", "topic", "queue_id", "queue_offset", "tran_type"]
SCAN_COLS = ["phy_offset", "size", "physical_offset_field", "topic", "queue_id", "queue_offset", "tran_type",
             "store_timestamp", "tags_code", "uniq_key", "keys"]
WORK = "_work"  # intermediate files inside staging (removed before publishing)

Meta = dict[str, Any]  # phase A's small per-unit summary


@dataclass(frozen=True)
class UnitItem:
    """One phase A task: the ``[start, end)`` ranges of one segment (``end`` None: to the scan's end), with
    CRC checks on or off. ``unit`` numbers the units in commitlog order and names their work files: a
    segment cut at verified record starts is several units, joined by :func:`join_units` like one scan;
    a segment the 4.9.8 reput reads around a length mismatch is one unit of several ranges."""

    unit: int
    idx: int  # the segment's index in the walk plan
    split: Split
    crc: bool
    ranges: tuple[tuple[int, int | None], ...]

    @property
    def nbytes(self) -> int:
        return sum((self.split.file_size if b is None else b) - a for a, b in self.ranges)

    @property
    def cost(self) -> int:
        """Its bytes, a quarter more with CRC checks (a body's CRC is ~a fifth of a unit's work)."""
        return self.nbytes * 5 // 4 if self.crc else self.nbytes

    def whole(self, ranges: tuple[tuple[int, int | None], ...] | None = None, crc: bool | None = None) -> UnitItem:
        """This unit's segment as one unit under this unit's number (so called on the segment's first unit),
        from the segment task's start or by ``ranges``."""
        return replace(self, crc=self.crc if crc is None else crc,
                       ranges=ranges if ranges is not None else ((self.split.start, None),))


@dataclass(frozen=True)
class RebuildContext:
    """What every task needs, shipped once per job with the task function (it pickles small: the walk
    plan, the settings' few numbers and where staging is)."""

    plan: WalkPlan
    staging: Location
    geometry: IndexGeometry
    fs_options: dict[str, Any]
    delay_levels: tuple[int, ...]
    do_cq: bool
    do_index: bool
    parts: int  # consume-queue partitions
    cq_size: int
    empty_index_count: int
    work: Location  # where the intermediate files go: staging/_work, or this host's memory filesystem

    @classmethod
    def make(cls, plan: WalkPlan, settings: BrokerSettings, staging: Location, what: tuple[str, ...],
             parts: int, fs_options: dict[str, Any], work: Location | None = None) -> RebuildContext:
        settings.require_reproducible(what)
        return cls(plan=plan, staging=staging, geometry=settings.index_geometry, fs_options=dict(fs_options),
                   delay_levels=tuple(settings.delay_levels_ms), do_cq="consumequeue" in what,
                   do_index="index" in what and bool(settings.message_index_enable), parts=parts,
                   cq_size=int(settings.mapped_file_size_consume_queue),
                   empty_index_count=empty_index_count(settings.version),
                   work=work if work is not None else staging.join(WORK))


def segment_items(plan: WalkPlan, cuts: dict[str, list[int]] | None = None) -> list[UnitItem]:
    """Phase A's items: each segment task, cut at ``cuts`` (segment name -> verified record starts:
    :func:`storelib.scan.splits.segment_cuts`) into units; costliest first (:attr:`UnitItem.cost`), so the
    stage ends with the short units and evenly."""
    items = []
    for t in sorted(plan.tasks, key=lambda t: t.index):
        seg = plan.segments[t.index]
        uri = seg.loc.path if seg.loc.local else f"{seg.loc.fs.type_name}://{seg.loc.path}"
        split = Split(seg.base, seg.name, uri, t.start, seg.file_size, seg.file_size)
        bounds = [t.start, *(c for c in (cuts or {}).get(seg.name, ()) if t.start < c < seg.file_size)]
        for a, b in zip(bounds, [*bounds[1:], None]):
            items.append(UnitItem(len(items), t.index, split, t.crc, ((a, b),)))
    items.sort(key=lambda it: (-it.cost, it.unit))
    return items


def _queue_partition(table: pa.Table, parts: int) -> tuple[np.ndarray, list[str], pa.Table]:
    """Deterministic partition of each CQ row by (topic, queue id) (Java hash; the same on every worker),
    the distinct topics of the rows, and the table with one topic dictionary (the batches' unified). Each
    distinct topic is hashed once."""
    enc = table.column("topic").combine_chunks().dictionary_encode()  # codes already: the batches' unified
    codes = np.asarray(enc.indices)
    th = java_hash_array(enc.dictionary).astype(np.int64)
    h = th[codes]
    q = np.asarray(table.column("queue_id").combine_chunks()).astype(np.int64)
    used = np.flatnonzero(np.bincount(codes, minlength=len(enc.dictionary)))  # a unified dictionary holds more
    table = table.set_column(table.schema.get_field_index("topic"), "topic", enc)
    return ((h * 31 + q) % parts + parts) % parts, enc.dictionary.take(pa.array(used)).to_pylist(), table


def _write_ipc(loc: Location, table: pa.Table) -> None:
    if loc.local:
        os.makedirs(os.path.dirname(loc.path), exist_ok=True)
    with loc.fs.open_output_stream(loc.path) as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)


def _cq_part(work: Location, unit: int, p: int) -> Location:
    return work.join(f"cq-{unit:06d}-{p:05d}.arrow")


def _keys_file(work: Location, unit: int) -> Location:
    return work.join(f"keys-{unit:06d}.arrow")


def _recs_file(work: Location, unit: int) -> Location:
    return work.join(f"recs-{unit:06d}.arrow")


def _write_cq_parts(ctx: RebuildContext, unit: int, cq_tables: list[pa.Table]) -> tuple[list[int], int, list[str]]:
    """A unit's dispatched CQ rows (normal and commit messages), grouped by queue partition, one work
    file per partition; returns (partitions written, rows, distinct topics)."""
    parts: list[int] = []
    if not cq_tables:
        return parts, 0, []
    t = pa.concat_tables(cq_tables)
    tt = np.asarray(t.column("tran_type"))
    keep = np.flatnonzero(gets_cq_unit(tt))
    if len(keep) < t.num_rows:
        t = t.take(pa.array(keep))
    if not t.num_rows:
        return parts, 0, []
    P = ctx.parts
    part, topics, t = _queue_partition(t, P)
    order = np.argsort(part.astype(np.int16 if P < 2**15 else np.int64), kind="stable")  # radix sort
    sp = part[order]
    t = t.take(pa.array(order))  # rows grouped by partition, dispatch order kept within each (topic codes)
    cuts = np.flatnonzero(np.r_[True, sp[1:] != sp[:-1], True])
    for a, b in zip(cuts[:-1], cuts[1:]):
        p = int(sp[a])
        _write_ipc(_cq_part(ctx.work, unit, p), t.slice(int(a), int(b - a)))
        parts.append(p)
    return parts, t.num_rows, topics


def phase_a(ctx: RebuildContext, item: UnitItem) -> Meta:
    """Parse one unit (the walk's view of its ranges): CQ rows per queue partition and the index keys go to
    files under staging/_work; returns the unit's small summary (its scan end, counts, key stats)."""
    unit, idx, split, crc, ranges = item.unit, item.idx, item.split, item.crc, item.ranges
    keep_freed_memory()
    loc = resolve(split.uri, **ctx.fs_options)
    ends: list = []
    cq_tables: list[pa.Table] = []
    hs, rs, rec_p, rec_t = [], [], [], []
    rows = 0
    cols = SCAN_COLS + (["prop_crc_ok"] if ctx.plan.prop_crc and crc else [])
    with open_source(loc, split.file_size) as src:
        for batch in _range_batches(ctx, idx, split, crc, ranges, src, ends, cols):
            if batch.num_rows == 0:
                continue
            batch = with_topic_codes(batch)  # CQ partitions, CQ work files and index keys share them
            if ctx.do_cq:
                cq_tables.append(pa.Table.from_batches([batch.select(CQ_COLS)]))
            if ctx.do_index:
                kr, kh = index_keys(batch)
                hs.append(kh)
                rs.append(kr + rows)
                rec_p.append(np.asarray(batch.column("physical_offset_field")))
                rec_t.append(np.asarray(batch.column("store_timestamp")))
            rows += batch.num_rows
    parts, cq_rows, topics = _write_cq_parts(ctx, unit, cq_tables)
    h = np.concatenate(hs, dtype=np.int32) if hs else np.zeros(0, np.int32)
    ra = np.concatenate(rs, dtype=np.int32) if rs else np.zeros(0, np.int32)
    for done in (cq_tables, hs, rs):  # written or joined: their memory serves the chains' sort
        done.clear()
    p_ = np.zeros(0, np.int64)
    last_key = None
    if ctx.do_index and len(h):
        # the unit's slot chains with local numbers: the index-file task only links them up
        q, e = local_chains(h, ctx.geometry.hash_slot_num)
        _write_ipc(_keys_file(ctx.work, unit), pa.table({"h": h, "r": ra, "q": q, "e": e}))
        # a record's PHYSICALOFFSET and store time are kept once, not once per key (~3 keys a record)
        rp, rt = np.concatenate(rec_p, dtype=np.int64), np.concatenate(rec_t, dtype=np.int64)
        rec_p.clear()
        rec_t.clear()
        _write_ipc(_recs_file(ctx.work, unit), pa.table({"p": rp, "t": rt}))
        p_ = rp[ra]  # each key's PHYSICALOFFSET
        last_key = (int(p_[-1]), int(rt[ra[-1]]))
    mono = bool(len(p_) < 2 or np.all(p_[1:] >= np.maximum.accumulate(p_)[:-1]))
    return {
        "unit": unit, "idx": idx, "end": ends[0], "ranges": tuple((a, ends[k].file_offset) for k, (a, _) in enumerate(ranges)),
        "rows": rows, "cq_rows": cq_rows, "n_keys": len(h), "topics": topics,
        "parts": parts, "p_first": int(p_[0]) if len(p_) else None, "p_max": int(p_.max()) if len(p_) else None,
        "monotone": mono, "last_key_row": int(ra[-1]) if len(ra) else -1, "last_key": last_key,
    }


def _range_batches(ctx: RebuildContext, idx: int, split: Split, crc: bool, ranges, src, ends: list, cols: list[str]):
    """The batches of each ``[start, end)`` range of one segment in turn (``end`` None: to the scan's end),
    each range's scan end appended to ``ends``."""
    for start, end in ranges:
        task = SegmentTask(idx, split.segment_base, split.segment_name, start, crc)
        kw = {} if end is None else {"end": end}
        yield from iter_task(ctx.plan, task, src, delay_levels_ms=list(ctx.delay_levels), ends=ends,
                             with_properties=False, columns=cols, batch_rows=TASK_BATCH_ROWS, **kw)


def dispatch_ranges(plan: WalkPlan, res: RecoveryResult) -> dict[int, tuple[tuple[int, int], ...]]:
    """Each dispatched segment's ``[start, end)`` ranges, in order (segment index -> ranges)."""
    base_to_idx = {s.base: i for i, s in enumerate(plan.segments)}
    out: dict[int, list[tuple[int, int]]] = {}
    for d in res.dispatch:
        out.setdefault(base_to_idx[d.base], []).append((d.start, d.end))
    return {i: tuple(r) for i, r in out.items()}


@dataclass
class Joined:
    """Phase A's units joined per segment (:func:`join_units`)."""

    ends: dict[int, SegmentEnd] = field(default_factory=dict)  # segment -> its scan end, as one scan's
    units: dict[int, list[int]] = field(default_factory=dict)  # segment -> the units that hold its records
    ranges: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)  # segment -> the ranges scanned
    redo: list[UnitItem] = field(default_factory=list)  # segments to scan again as one unit
    first: dict[int, UnitItem] = field(default_factory=dict)  # segment -> its first unit (a rescan's number)


def join_units(items: list[UnitItem], metas: dict[int, Meta]) -> Joined:
    """Each segment's units joined like one scan of it. A unit that leaves its range exactly where the
    next one starts passes the walk on to it; a unit whose scan ends inside its range (a bad record, a
    blank, zeros) ends the segment there, as one scan does, and the units after it hold no record of the
    walk. A unit whose records run past the next cut (a cut that one scan never reaches) puts the segment in
    ``redo``: scanned again as one unit, so the result never depends on where the cuts fell."""
    by_seg: dict[int, list[UnitItem]] = {}
    for it in sorted(items, key=lambda it: it.unit):
        by_seg.setdefault(it.idx, []).append(it)
    out = Joined(first={idx: its[0] for idx, its in by_seg.items()})
    for idx, its in by_seg.items():
        units = _reached(its, metas)
        if units is None:
            out.redo.append(its[0].whole())
            continue
        ms = [metas[u] for u in units]
        last = ms[-1]["end"]
        out.ends[idx] = replace(last, records=sum(m["end"].records for m in ms),
                                crc_errors=sum(m["end"].crc_errors for m in ms),
                                first_crc_error=next((m["end"].first_crc_error for m in ms
                                                      if m["end"].first_crc_error is not None), None))
        out.units[idx] = units
        out.ranges[idx] = ms[0]["ranges"] if len(ms) == 1 else ((ms[0]["ranges"][0][0], last.file_offset),)
    return out


def _reached(its: list[UnitItem], metas: dict[int, Meta]) -> list[int] | None:
    """The units (of one segment, in order) one scan of it reaches; None when a unit's records run past
    the next unit's start."""
    for k, it in enumerate(its):
        e = metas[it.unit]["end"]
        if k + 1 == len(its) or e.kind != "split_end":
            return [u.unit for u in its[:k + 1]]
        if e.file_offset != its[k + 1].ranges[0][0]:
            return None
    return []


def rejoin(joined: Joined, metas: dict[int, Meta], again: list[UnitItem]) -> None:
    """Put segments scanned again as one unit each (``metas`` holds their new summaries) in ``joined``."""
    for it in again:
        m = metas[it.unit]
        joined.ends[it.idx], joined.units[it.idx], joined.ranges[it.idx] = m["end"], [it.unit], m["ranges"]
    done = {it.idx for it in again}
    joined.redo = [r for r in joined.redo if r.idx not in done]


def rescan_items(plan: WalkPlan, res: RecoveryResult, joined: Joined) -> list[UnitItem]:
    """Phase A again for the segments whose dispatch is not their whole scan (the 4.9.8 reput reading around
    a length mismatch: after the record's fields, or from where reputFromOffset landed), by those ranges,
    each as one unit."""
    out = []
    for i, rs in dispatch_ranges(plan, res).items():
        if rs != joined.ranges[i]:  # a 4.9.8 reput dispatches it all: read as it reads (no CRC)
            it = joined.first[i]
            out.append(it.whole(rs, it.crc and plan.reput_from is None))
    return out


def dispatched_units(plan: WalkPlan, res: RecoveryResult, joined: Joined) -> list[int]:
    """The units that hold the records the walk dispatches, in commitlog order; each dispatched segment's
    units scanned exactly its dispatch ranges."""
    rs = dispatch_ranges(plan, res)
    for i, r in rs.items():
        if r != joined.ranges[i]:
            seg = plan.segments[i]
            raise StoreError("commitlog/" + seg.name, r[-1][1], "internal", "dispatch ranges are not the scans'")
    return [u for i in sorted(rs) for u in joined.units[i]]


def unsafe_topic_findings(plan: WalkPlan, metas: dict[int, Meta], inc: list[int]) -> list[Any]:
    """One finding per topic name no executor may turn into a directory (the CQ writers skip it), naming
    the first segment that has it (``inc``: dispatched units)."""
    unsafe = sorted({(t, plan.segments[metas[u]["idx"]].name) for u in inc for t in metas[u]["topics"]
                     if unsafe_reason(t) is not None}, key=lambda x: (x[0], x[1]))
    out = []
    for topic in dict.fromkeys(t for t, _ in unsafe):
        first = next(seg for t, seg in unsafe if t == topic)
        out.append(unsafe_topic_finding(topic, f"commitlog/{first}", None, None))
    return out


def cq_jobs(metas: dict[int, Meta], inc: list[int], parts: int) -> list[tuple[int, list[int]]]:
    """Phase B's items: each non-empty partition with the units (``inc``, in commitlog order) that have rows
    in it."""
    jobs = [(p, [i for i in inc if p in metas[i]["parts"]]) for p in range(parts)]
    return [j for j in jobs if j[1]]


def _load_keys(ctx: RebuildContext, unit: int, m_before: dict[int, int] | None, *, runs: bool = False) -> tuple:
    """(hash, phy, time, record row) of a unit's indexed keys; with ``runs`` also its ChainRun when
    its precomputed chains still hold (every key kept), else None."""
    tb = read_ipc_file(_keys_file(ctx.work, unit))
    recs = read_ipc_file(_recs_file(ctx.work, unit))
    h, r = np.asarray(tb.column("h")), np.asarray(tb.column("r"))
    p, t = np.asarray(recs.column("p")), np.asarray(recs.column("t"))
    if m_before is not None:
        keys = kept_keys((h, p[r], t[r], r), m_before[unit])
    elif runs:  # every key kept: gathered by the index file's passes as they read them
        keys = (h, Gathered(p, r), Gathered(t, r), r)
    else:
        keys = (h, p[r], t[r], r)
    if not runs:
        return keys
    whole = len(keys[0]) == tb.num_rows
    run = ChainRun(*keys[:3], np.asarray(tb.column("q")), np.asarray(tb.column("e"))) if whole else None
    return keys, run


def count_kept(ctx: RebuildContext, m_before: dict[int, int], unit: int) -> tuple[int, int, int, tuple[int, int] | None]:
    """(unit, kept keys, record row of the last kept key, its (phy, time)) — slow path only."""
    h, p, t, r = _load_keys(ctx, unit, m_before)
    if len(p) == 0:
        return unit, 0, -1, None
    return unit, len(p), int(r[-1]), (int(p[-1]), int(t[-1]))


def first_times(ctx: RebuildContext, E: int, offsets: dict[int, int], m_before: dict[int, int] | None,
                unit: int) -> list[tuple[int, int]]:
    """(file number, store time of its first entry) for files whose first key is in ``unit``."""
    if m_before is None:  # every parsed key kept: look up only the keys that start a file
        r = read_ipc_file(_keys_file(ctx.work, unit)).column("r")
        t = read_ipc_file(_recs_file(ctx.work, unit)).column("t")
        return first_entry_times(E, offsets[unit], len(r), lambda k: t[r[k].as_py()].as_py())
    _, _, tk, _ = _load_keys(ctx, unit, m_before)
    return first_entry_times(E, offsets[unit], len(tk), lambda k: tk[k])


def phase_b(ctx: RebuildContext, job: tuple[int, list[int]]) -> dict[str, Any]:
    """Build and write the consume queues of partition ``p`` from its per-unit parts, unit by unit in
    dispatch order (storelib.broker.dispatch.cqstream): memory holds one unit's part, not the partition."""
    p, units = job
    staging = ctx.staging
    digests: dict[str, str] = {}  # hashed as written: reading back sparse files costs page-cache fills
    with ConsumeQueueStream(staging.join("consumequeue"), ctx.cq_size, digests) as cqs:
        for u in sorted(units):
            cqs.feed(read_ipc_file(_cq_part(ctx.work, u, p)))
    base = staging.path.rstrip("/") + "/"
    files = {path[len(base):]: {"size": ctx.cq_size, "sha256": digests[path]} for path in cqs.paths}
    return {"queues": cqs.queues, "cq_records": cqs.records, "files": files}


def phase_c(ctx: RebuildContext, names: list[str], E: int, offsets: dict[int, int], counts: dict[int, int],
            m_before: dict[int, int] | None, f: int) -> dict[str, Any]:
    """Build and write index file ``f`` from the units that hold its keys (storelib.broker.index.indexmerge.link_file)."""
    g = ctx.geometry
    spans = {i: (offsets[i], counts[i]) for i in offsets}
    runs, state = link_file(f, g, spans, lambda u: _load_keys(ctx, u, m_before, runs=True))
    name = names[f]
    header, digest = write_index_runs(runs, ctx.staging.join("index", name), g, state)
    return {"file": f, "rel": f"index/{name}", "size": g.file_size, "sha256": digest,
            "keys": header.index_count - 1}


def phase_bc(ctx: RebuildContext, index_args: tuple | None, item: tuple[str, Any]) -> tuple[str, dict[str, Any]]:
    """One task of the combined phase B/C job: a consume-queue partition or an index file."""
    kind, arg = item
    keep_freed_memory()
    t0 = time.monotonic()
    if kind == "cq":
        res = phase_b(ctx, arg)
    else:
        names, E, offsets, counts, m_before = index_args
        res = phase_c(ctx, names, E, offsets, counts, m_before, arg)
    res["seconds"] = round(time.monotonic() - t0, 3)
    return kind, res


@dataclass
class EngineResult:
    """What a rebuild dispatched and wrote, whichever engine ran it (or the incremental dispatch)."""

    recovery: RecoveryResult
    records: int = 0
    cq_records: int = 0
    queues: int = 0
    index_keys: int = 0
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: list[Any] = field(default_factory=list)


def check_supported(res: RecoveryResult) -> None:
    if not res.supported:
        why = "; ".join(str(f) for f in res.findings if f.severity == "critical")
        raise StoreError("commitlog", None, "unsupported", f"the broker's dispatch cannot be reproduced: {why}")


@dataclass
class IndexPlan:
    """The index files' layout (storelib.broker.index.indexmerge), their names and the duplicate test's bounds when
    the tasks must apply it (None: every key is kept as parsed)."""

    layout: IndexLayout
    m_before: dict[int, int] | None
    names: list[str]

    @property
    def nfiles(self) -> int:
        return len(self.names)

    @property
    def keys(self) -> int:
        return self.layout.keys

    @property
    def extra(self) -> list[IndexImage]:
        return self.layout.extra

    def job_args(self) -> tuple:
        return self.names, self.layout.E, self.layout.offsets, self.layout.counts, self.m_before


def segment_keys(m: Meta) -> SegmentKeys:
    """A phase A summary as indexmerge's per-segment key stats."""
    return SegmentKeys(m["rows"], m["n_keys"], m["monotone"], m["p_first"], m["p_max"], m["last_key_row"],
                       m["last_key"])


def write_extra_index(ix: IndexPlan, staging: Location) -> dict[str, dict[str, Any]]:
    """The empty successor/only file the broker would have (built on the driver, no keys)."""
    files = {}
    for im in ix.extra:
        write_index_image(im, staging.join("index", im.name))
        # hashed from memory: the file is all but empty, and reading back its holes fills page cache
        files[f"index/{im.name}"] = {"size": im.geometry.file_size, "sha256": im.sha256()}
    return files
