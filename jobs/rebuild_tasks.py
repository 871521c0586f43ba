"""The rebuild as tasks on an engine (a process pool or Spark): phase A parses each segment the walk's way
into dispatch columns and index keys (with their per-segment slot chains), then one job runs phase B
(ConsumeQueue files, one partition per core) beside phase C (one task per index file, linking the
segments' chains and streaming the file). Intermediates go through files in ``staging/_work``; the task
functions are module-level so that they pickle by reference. The in-process engine is
:func:`jobs.rebuild.run_local` (storelib.broker.dispatch), same bytes.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from jobs.engines import Engine
from jobs.rebuild_staging import drop_staging, write_index_image, write_index_runs
from storelib.broker.brokerconf import BrokerSettings
from storelib.broker.cqstream import ConsumeQueueStream
from storelib.broker.dispatch import index_geometry
from storelib.broker.indexbuild import IndexImage, empty_index_count, index_key_rows
from storelib.broker.indexmerge import (
    IndexLayout,
    SegmentKeys,
    first_entry_times,
    kept_keys,
    layout,
    link_file,
    name_files,
    running_max_before,
)
from storelib.broker.indexstream import ChainRun, local_chains
from storelib.broker.recovery import (
    RecoveryResult,
    SegmentTask,
    WalkPlan,
    finish_walk,
    iter_task,
    plan_recovery,
    store_inputs,
)
from storelib.broker.store import Store
from storelib.errors import StoreError
from storelib.fileio.bytesource import Location, open_source, resolve
from storelib.format.checkpoint import Checkpoint
from storelib.format.indexfile import IndexGeometry
from storelib.format.javahash import java_hash_array
from storelib.format.topicname import unsafe_reason, unsafe_topic_finding
from storelib.scan.commitlog import Split

CQ_COLS = ["physical_offset_field", "size", "tags_code", "topic", "queue_id", "queue_offset", "tran_type"]


SCAN_COLS = ["phy_offset", "size", "physical_offset_field", "topic", "queue_id", "queue_offset", "tran_type",
             "store_timestamp", "tags_code", "uniq_key", "keys"]


class Reporter:
    """Stage and segment progress lines on stderr."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.t0 = time.monotonic()

    def __call__(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(f"rebuild [{time.monotonic() - self.t0:7.1f}s] {text}\n")
            sys.stderr.flush()


_malloc_kept = False
MALLOC_KEEP = 512 << 20  # bytes of freed memory a rebuild process keeps for reuse (and the largest heap block)


def keep_freed_memory() -> None:
    """Let glibc's malloc serve blocks up to MALLOC_KEEP from the heap and keep that much freed memory.

    By default every array above 32 MB is a fresh mmap and is unmapped when freed: the next task (a
    reused Spark worker) or the next dispatch chunk faults in and zeroes new pages again, and with the
    page cache full of store files each fault can wait on reclaim. Kept in the heap, the memory is
    reused: on the 2 GB bench store the consume-queue tasks took 0.45 CPU-s instead of 0.62 and the
    local engine 9.2-10.0 s instead of 10.2-11.0 s. Once per process; MALLOC_MMAP_THRESHOLD_ /
    MALLOC_TRIM_THRESHOLD_ in the environment (the user's choice) win; no-op without glibc.
    """
    global _malloc_kept
    if _malloc_kept:
        return
    _malloc_kept = True
    if sys.platform != "linux" or "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, MALLOC_KEEP)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, MALLOC_KEEP)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


@dataclass
class EngineResult:
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


# ---------------------------------------------------------------------------------------------
# the task functions (module level so that they pickle by reference)

WORK = "_work"  # intermediate files inside staging (removed before publishing)


def _queue_partition(table: pa.Table, parts: int) -> tuple[np.ndarray, list[str]]:
    """Deterministic partition of each CQ row by (topic, queue id) (Java hash; the same on every worker),
    and the distinct topics. Each distinct topic is hashed once."""
    enc = table.column("topic").combine_chunks().dictionary_encode()
    th = java_hash_array(enc.dictionary).astype(np.int64)
    h = th[np.asarray(enc.indices)]
    q = np.asarray(table.column("queue_id").combine_chunks()).astype(np.int64)
    return ((h * 31 + q) % parts + parts) % parts, enc.dictionary.to_pylist()


def _write_ipc(loc: Location, table: pa.Table) -> None:
    if loc.local:
        os.makedirs(os.path.dirname(loc.path), exist_ok=True)
    with loc.fs.open_output_stream(loc.path) as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)


def _read_ipc(loc: Location) -> pa.Table:
    if loc.local:
        with pa.memory_map(loc.path) as f:
            return pa.ipc.open_file(f).read_all()
    with loc.fs.open_input_file(loc.path) as f:
        return pa.ipc.open_file(f).read_all()


def _cq_part(staging: Location, idx: int, p: int) -> Location:
    return staging.join(WORK, f"cq-{idx:06d}-{p:05d}.arrow")


def _keys_file(staging: Location, idx: int) -> Location:
    return staging.join(WORK, f"keys-{idx:06d}.arrow")


def _recs_file(staging: Location, idx: int) -> Location:
    return staging.join(WORK, f"recs-{idx:06d}.arrow")


def phase_a(ctx: dict[str, Any], item: tuple[int, Split, bool]) -> dict[str, Any]:
    """Parse one segment (the walk's view of it): CQ rows per queue partition and the index keys go to
    files under staging/_work; returns the segment's small summary (its scan end, counts, key stats)."""
    idx, split, crc = item
    keep_freed_memory()
    loc = resolve(split.uri, **ctx["fs_options"])
    plan: WalkPlan = ctx["plan"]
    staging: Location = ctx["staging"]
    task = SegmentTask(idx, split.segment_base, split.segment_name, split.start, crc)
    ends: list = []
    cq_tables: list[pa.Table] = []
    hs, ps, ts, rs, rec_p, rec_t = [], [], [], [], [], []
    rows = 0
    last_key_row = -1
    cols = SCAN_COLS + (["prop_crc_ok"] if plan.prop_crc and crc else [])
    with open_source(loc, split.file_size) as src:
        for batch in iter_task(plan, task, src, delay_levels_ms=ctx["delay_levels"], ends=ends,
                               with_properties=False, columns=cols):
            if batch.num_rows == 0:
                continue
            if ctx["do_cq"]:
                cq_tables.append(pa.Table.from_batches([batch.select(CQ_COLS)]))
            if ctx["do_index"]:
                kr = index_key_rows(batch)
                if len(kr["row_index"]):
                    last_key_row = rows + int(kr["row_index"][-1])
                hs.append(kr["key_hash"])
                ps.append(kr["phy_offset"])
                ts.append(kr["store_timestamp"])
                rs.append(kr["row_index"] + rows)
                rec_p.append(np.asarray(batch.column("physical_offset_field")))
                rec_t.append(np.asarray(batch.column("store_timestamp")))
            rows += batch.num_rows
    parts: list[int] = []
    cq_rows = 0
    topics: list[str] = []
    if cq_tables:
        t = pa.concat_tables(cq_tables)
        tt = np.asarray(t.column("tran_type"))
        keep = np.flatnonzero((tt == 0) | (tt == 2))
        if len(keep) < t.num_rows:
            t = t.take(pa.array(keep))
        cq_rows = t.num_rows
        if cq_rows:
            P = ctx["parts"]
            part, topics = _queue_partition(t, P)
            order = np.argsort(part.astype(np.int16 if P < 2**15 else np.int64), kind="stable")  # radix sort
            sp = part[order]
            t = t.take(pa.array(order))  # rows grouped by partition, dispatch order kept within each
            cuts = np.flatnonzero(np.r_[True, sp[1:] != sp[:-1], True])
            for a, b in zip(cuts[:-1], cuts[1:]):
                p = int(sp[a])
                _write_ipc(_cq_part(staging, idx, p), t.slice(int(a), int(b - a)))
                parts.append(p)
    h = np.concatenate(hs, dtype=np.int32) if hs else np.zeros(0, np.int32)
    p_ = np.concatenate(ps, dtype=np.int64) if ps else np.zeros(0, np.int64)
    tsa = np.concatenate(ts, dtype=np.int64) if ts else np.zeros(0, np.int64)
    ra = np.concatenate(rs, dtype=np.int32) if rs else np.zeros(0, np.int32)
    if ctx["do_index"] and len(h):
        # the segment's slot chains with local numbers: the index-file task only links them up
        q, e = local_chains(h, ctx["geometry"].hash_slot_num)
        # a record's PHYSICALOFFSET and store time are kept once, not once per key (~3 keys a record)
        _write_ipc(_keys_file(staging, idx), pa.table({"h": h, "r": ra, "q": q, "e": e}))
        _write_ipc(_recs_file(staging, idx), pa.table({"p": np.concatenate(rec_p, dtype=np.int64),
                                                       "t": np.concatenate(rec_t, dtype=np.int64)}))
    mono = bool(len(p_) < 2 or np.all(p_[1:] >= np.maximum.accumulate(p_)[:-1]))
    return {
        "idx": idx, "end": ends[0], "rows": rows, "cq_rows": cq_rows, "n_keys": len(h), "topics": topics,
        "parts": parts, "p_first": int(p_[0]) if len(p_) else None, "p_max": int(p_.max()) if len(p_) else None,
        "monotone": mono, "last_key_row": last_key_row,
        "last_key": (int(p_[-1]), int(tsa[-1])) if len(p_) else None,
    }


def _load_keys(ctx: dict[str, Any], idx: int, m_before: dict[int, int] | None, *, runs: bool = False) -> tuple:
    """(hash, phy, time, record row) of a segment's indexed keys; with ``runs`` also its ChainRun when
    its precomputed chains still hold (every key kept), else None."""
    tb = _read_ipc(_keys_file(ctx["staging"], idx))
    recs = _read_ipc(_recs_file(ctx["staging"], idx))
    h, r = np.asarray(tb.column("h")), np.asarray(tb.column("r"))
    keys = (h, np.asarray(recs.column("p"))[r], np.asarray(recs.column("t"))[r], r)
    if m_before is not None:
        keys = kept_keys(keys, m_before[idx])
    if not runs:
        return keys
    whole = len(keys[0]) == tb.num_rows
    run = ChainRun(*keys[:3], np.asarray(tb.column("q")), np.asarray(tb.column("e"))) if whole else None
    return keys, run


def count_kept(ctx: dict[str, Any], m_before: dict[int, int], idx: int) -> tuple[int, int, int, tuple[int, int] | None]:
    """(segment, kept keys, record row of the last kept key, its (phy, time)) — slow path only."""
    h, p, t, r = _load_keys(ctx, idx, m_before)
    if len(p) == 0:
        return idx, 0, -1, None
    return idx, len(p), int(r[-1]), (int(p[-1]), int(t[-1]))


def first_times(ctx: dict[str, Any], E: int, offsets: dict[int, int], m_before: dict[int, int] | None,
                idx: int) -> list[tuple[int, int]]:
    """(file number, store time of its first entry) for files whose first key is in segment ``idx``."""
    _, _, t, _ = _load_keys(ctx, idx, m_before)
    return first_entry_times(E, offsets[idx], t)


def phase_b(ctx: dict[str, Any], job: tuple[int, list[int]]) -> dict[str, Any]:
    """Build and write the consume queues of partition ``p`` from its per-segment parts, segment by segment
    in dispatch order (storelib.broker.cqstream): memory holds one segment's part, not the partition."""
    p, segs = job
    staging: Location = ctx["staging"]
    digests: dict[str, str] = {}  # hashed as written: reading back sparse files costs page-cache fills
    with ConsumeQueueStream(staging.join("consumequeue"), ctx["cq_size"], digests) as cqs:
        for i in sorted(segs):
            cqs.feed(_read_ipc(_cq_part(staging, i, p)))
    base = staging.path.rstrip("/") + "/"
    files = {path[len(base):]: {"size": ctx["cq_size"], "sha256": digests[path]} for path in cqs.paths}
    return {"queues": cqs.queues, "cq_records": cqs.records, "files": files}


def phase_c(ctx: dict[str, Any], names: list[str], E: int, offsets: dict[int, int], counts: dict[int, int],
            m_before: dict[int, int] | None, f: int) -> dict[str, Any]:
    """Build and write index file ``f`` from the segments that hold its keys (storelib.broker.indexmerge.link_file)."""
    g: IndexGeometry = ctx["geometry"]
    spans = {i: (offsets[i], counts[i]) for i in offsets}
    runs, state = link_file(f, g, spans, lambda idx: _load_keys(ctx, idx, m_before, runs=True))
    name = names[f]
    header, digest = write_index_runs(runs, ctx["staging"].join("index", name), g, state)
    return {"file": f, "rel": f"index/{name}", "size": g.file_size, "sha256": digest,
            "keys": header.index_count - 1}


def phase_bc(ctx: dict[str, Any], index_args: tuple | None, item: tuple[str, Any]) -> tuple[str, dict[str, Any]]:
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



def run_tasks(engine: Engine, store: Store, settings: BrokerSettings, staging: Location, what: tuple[str, ...],
              say: Reporter, fs_options: dict[str, Any], partitions: int | None = None,
              name_tz: str = "UTC") -> EngineResult:
    """Phases A/B/C as tasks on ``engine`` (a process pool or Spark); intermediates are exchanged through
    files in ``staging/_work`` (no shuffle or cache of Python objects), which every worker reads and
    writes itself."""
    inputs = store_inputs(store, version=settings.version, last_exit_ok=True, cq_max_phy_offset=-1,
                          checkpoint=Checkpoint())
    plan = plan_recovery(inputs, store.commitlog.segments)
    tasks = plan.tasks
    # one consume-queue partition per core: they run beside the index-file task(s), and a task costs
    # tens of ms of scheduling here, more than finer balancing gains
    P = partitions or engine.parallelism
    do_index = "index" in what and bool(settings.message_index_enable)
    g = index_geometry(settings)
    ctx = {"plan": plan, "fs_options": fs_options, "delay_levels": list(settings.delay_levels_ms),
           "do_cq": "consumequeue" in what, "do_index": do_index, "parts": P,
           "cq_size": int(settings.mapped_file_size_consume_queue), "staging": staging, "geometry": g,
           "empty_index_count": empty_index_count(settings.version)}
    if not tasks:
        return EngineResult(finish_walk(plan, {}))
    items = []
    for t in tasks:
        seg = plan.segments[t.index]
        uri = seg.loc.path if seg.loc.local else f"{seg.loc.fs.type_name}://{seg.loc.path}"
        items.append((t.index, Split(seg.base, seg.name, uri, t.start, seg.file_size, seg.file_size), t.crc))
    # longest first (segments scanned with CRC checks, then the biggest): the stage ends evenly
    items.sort(key=lambda it: (not it[2], -it[1].file_size, it[0]))
    say(f"phase A: parsing {len(items)} segment(s) on executors")
    try:
        metas = {m["idx"]: m for m in engine.map(partial(phase_a, ctx), items, "phase A: segments", say)}
        say(f"phase A: {len(metas)}/{len(items)} segments parsed, {sum(m['rows'] for m in metas.values())} records")
        res = finish_walk(plan, {i: m["end"] for i, m in metas.items()})
        check_supported(res)
        say(f"walk: processOffset {res.process_offset} ({res.start_reason})")
        base_to_idx = {s.base: i for i, s in enumerate(plan.segments)}
        inc = sorted({base_to_idx[d.base] for d in res.dispatch})
        for d in res.dispatch:  # a full rebuild dispatches whole segment scans
            m = metas[base_to_idx[d.base]]
            if d.start != 0 or d.end != m["end"].file_offset:
                raise StoreError("commitlog/" + d.name, d.end, "internal", "dispatch range is not a whole scan")
        out = EngineResult(res, records=sum(metas[i]["rows"] for i in inc))
        # an unsafe name never reaches an executor's makedirs (write_consume_queues skips it): reported once
        unsafe = sorted({(t, plan.segments[i].name) for i in inc for t in metas[i]["topics"]
                         if unsafe_reason(t) is not None}, key=lambda x: (x[0], x[1]))
        for topic in dict.fromkeys(t for t, _ in unsafe):
            first = next(seg for t, seg in unsafe if t == topic)
            out.findings.append(unsafe_topic_finding(topic, f"commitlog/{first}", None, None))
        files: dict[str, dict[str, Any]] = {}
        cq_jobs: list[tuple[int, list[int]]] = []
        if ctx["do_cq"]:
            cq_jobs = [(p, [i for i in inc if p in metas[i]["parts"]]) for p in range(P)]
            cq_jobs = [j for j in cq_jobs if j[1]]
        ix = _index_plan(engine, metas, inc, ctx, out, say, name_tz) if do_index else None
        # phases B and C are independent: one Spark job runs both, index files first (one long task
        # per file) so the consume-queue tasks fill the other cores around them
        work: list[tuple[str, Any]] = [("index", f) for f in range(ix.nfiles if ix else 0)]
        work += [("cq", j) for j in cq_jobs]
        if ctx["do_cq"]:
            say(f"phase B: consume queues in {len(cq_jobs)} partition(s)")
        if ix is not None and ix.nfiles:
            say(f"phase C: {ix.keys} index keys → {ix.nfiles} index file(s)")
        results = []
        if work:
            results = engine.map(partial(phase_bc, ctx, ix.job_args() if ix else None), work, "phases B/C: tasks", say)
        for kind, s in results:
            if kind == "cq":
                files.update(s["files"])
                out.queues += s["queues"]
                out.cq_records += s["cq_records"]
            else:
                files[s["rel"]] = {"size": s["size"], "sha256": s["sha256"]}
        if ctx["do_cq"]:
            say(f"phase B: {out.queues} queues, {out.cq_records} entries, "
                f"{sum(1 for r in files if r.startswith('consumequeue/'))} files "
                f"(task seconds: {sum(s['seconds'] for k, s in results if k == 'cq'):.1f})")
        if any(k == "index" for k, _ in results):
            say(f"phase C: longest index-file task {max(s['seconds'] for k, s in results if k == 'index'):.1f} s")
        if ix is not None:
            files.update(_write_extra_index(ix, staging))
            say(f"phase C: {sum(1 for r in files if r.startswith('index/'))} index file(s) written")
        out.files = dict(sorted(files.items()))
        return out
    finally:
        drop_staging(staging.join(WORK))


@dataclass
class IndexPlan:
    """The index files' layout (storelib.broker.indexmerge), their names and the duplicate test's bounds when
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


def _segment_keys(m: dict[str, Any]) -> SegmentKeys:
    return SegmentKeys(m["rows"], m["n_keys"], m["monotone"], m["p_first"], m["p_max"], m["last_key_row"],
                       m["last_key"])


def _index_plan(engine: Engine, metas: dict[int, dict], inc: list[int], ctx: dict[str, Any], out: EngineResult,
                say: Reporter, name_tz: str) -> IndexPlan:
    """Schedule the index merge steps: the duplicate test's counts (on the engine when a segment needs it),
    the layout, each file's first time (for its name)."""
    g: IndexGeometry = ctx["geometry"]
    E = g.entries_per_file
    segs = {i: _segment_keys(metas[i]) for i in inc}
    keyed = [i for i in inc if segs[i].n_keys]
    m_before, whole = running_max_before(segs, inc)
    counts: dict[int, int] = {}
    last = None  # (segment, record row, (phy, time)) of the last kept key
    mb = None
    if whole:
        for i in keyed:
            counts[i] = segs[i].n_keys
            last = (i, segs[i].last_key_row, segs[i].last_key)
    else:
        say("phase C: PHYSICALOFFSET fields are not increasing: applying the broker's duplicate test")
        got = {i: (c, lr, lk) for i, c, lr, lk in engine.map(partial(count_kept, ctx, m_before), keyed,
                                                            "phase C: duplicate test")}
        for i in keyed:
            counts[i] = got[i][0]
            if counts[i]:
                last = (i, got[i][1], got[i][2])
        mb = m_before
    ix = layout(g, inc, segs, counts, last, out.records, ctx["empty_index_count"])
    out.index_keys = ix.keys
    firsts: dict[int, int] = {}
    if ix.nfiles:
        with_keys = [i for i in keyed if ix.counts[i]]
        if ctx["staging"].local:  # memory-mapped key files: the driver reads one time per file itself
            firsts = dict(pair for i in with_keys for pair in first_times(ctx, E, ix.offsets, mb, i))
        else:
            firsts = dict(pair for lst in engine.map(partial(first_times, ctx, E, ix.offsets, mb), with_keys,
                                                     "phase C: first times")
                          for pair in lst)
    return IndexPlan(ix, mb, name_files(ix, firsts, name_tz))


def _write_extra_index(ix: IndexPlan, staging: Location) -> dict[str, dict[str, Any]]:
    """The empty successor/only file the broker would have (built on the driver, no keys)."""
    files = {}
    for im in ix.extra:
        write_index_image(im, staging.join("index", im.name))
        # hashed from memory: the file is all but empty, and reading back its holes fills page cache
        files[f"index/{im.name}"] = {"size": im.geometry.file_size, "sha256": im.sha256()}
    return files
