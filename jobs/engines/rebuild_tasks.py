"""The rebuild as tasks on an engine (this process, a process pool or Spark): this module only schedules
storelib.broker.dispatch.rebuildtasks' tasks and merge steps and reports progress. Phase A parses each segment;
then one job runs phase B (ConsumeQueue files, one partition per core) beside phase C (one task per
index file). Intermediates go through files in ``staging/_work`` (or this host's memory filesystem: see
:func:`_work_place`), removed here when the job ends.
"""

from __future__ import annotations

from datetime import tzinfo
from functools import partial
from typing import Any

import pyarrow.fs as pafs

from jobs.common import Stage
from jobs.engines.schedulers import Engine, default_split_bytes, engine_master, fine_tail
from jobs.spark.sparkutil import is_local_master
from storelib.broker.dispatch.rebuildtasks import (
    WORK,
    EngineResult,
    IndexPlan,
    Meta,
    RebuildContext,
    check_supported,
    count_kept,
    cq_jobs,
    dispatched_units,
    first_times,
    join_units,
    phase_a,
    phase_bc,
    rejoin,
    rescan_items,
    segment_items,
    segment_keys,
    unsafe_topic_findings,
    write_extra_index,
)
from storelib.broker.index.indexmerge import kept_counts, layout, name_files, running_max_before
from storelib.broker.recovery.walk import WalkPlan, finish_walk, plan_recovery, store_inputs
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.fileio.bytesource import Location, resolve
from storelib.fileio.memory import scratch_tempdir
from storelib.fileio.staging import drop_staging, remove_files
from storelib.format.checkpoint import Checkpoint
from storelib.scan.splits import segment_cuts


def run_tasks(engine: Engine, store: Store, settings: BrokerSettings, staging: Location, what: tuple[str, ...],
              say: Stage, fs_options: dict[str, Any], partitions: int | None = None,
              name_tz: str | tzinfo = "UTC", split_bytes: int | None = None) -> EngineResult:
    """Phases A/B/C as tasks on ``engine`` (a process pool or Spark); intermediates are exchanged through
    files in ``staging/_work`` (no shuffle or cache of Python objects), which every worker reads and
    writes itself."""
    inputs = store_inputs(store, version=settings.version, last_exit_ok=True, cq_max_phy_offset=-1,
                          checkpoint=Checkpoint())
    plan = plan_recovery(inputs, store.commitlog.segments)
    # one consume-queue partition per core: they run beside the index-file task(s), and a task costs
    # tens of ms of scheduling here, more than finer balancing gains
    P = partitions or engine.parallelism
    work = _work_place(engine, store, staging)
    ctx = RebuildContext.make(plan, settings, staging, what, P, fs_options, work)
    if not plan.tasks:
        drop_staging(work)
        return EngineResult(finish_walk(plan, {}))
    items = segment_items(plan, _cuts(engine, store, plan, split_bytes))
    say(f"phase A: parsing {len(plan.tasks)} segment(s) in {len(items)} task(s) on executors")
    try:
        metas = {m["unit"]: m for m in engine.map(partial(phase_a, ctx), items, "phase A: segments", say)}
        joined = join_units(items, metas)
        if joined.redo:  # a cut one scan never reaches: those segments as one task each
            redo = list(joined.redo)
            say(f"phase A: {len(redo)} segment(s) again as one task: their records run past a cut")
            metas.update({m["unit"]: m for m in engine.map(partial(phase_a, ctx), redo, "phase A: segments again", say)})
            rejoin(joined, metas, redo)
        say(f"phase A: {len(joined.ends)}/{len(plan.tasks)} segments parsed, "
            f"{sum(metas[u]['rows'] for us in joined.units.values() for u in us)} records")
        res = finish_walk(plan, joined.ends)
        check_supported(res)
        say(f"walk: processOffset {res.process_offset} ({res.start_reason})")
        again = rescan_items(plan, res, joined)
        if again:  # the 4.9.8 reput reads around a length mismatch: those segments by its ranges
            say(f"phase A: {len(again)} segment(s) again, as the reput reads them around a length mismatch")
            metas.update({m["unit"]: m for m in engine.map(partial(phase_a, ctx), again, "phase A: reput ranges", say)})
            rejoin(joined, metas, again)
        inc = dispatched_units(plan, res, joined)
        out = EngineResult(res, records=sum(metas[u]["rows"] for u in inc))
        # an unsafe name never reaches an executor's makedirs (write_consume_queues skips it): reported once
        out.findings.extend(unsafe_topic_findings(plan, metas, inc))
        jobs = cq_jobs(metas, inc, P) if ctx.do_cq else []
        ix = _index_plan(engine, metas, inc, ctx, out, say, name_tz) if ctx.do_index else None
        out.files = _run_bc(engine, ctx, jobs, ix, out, say)
        _drop_work(engine, ctx)
        return out
    finally:
        drop_staging(work)


WORK_SHARE = 4  # phase A's intermediate files per store byte, at most about 1/4 (the 2 GB bench store: 0.22)
SHM_PREFIX = "rmqstore-rebuild-"


def _cuts(engine: Engine, store: Store, plan: WalkPlan, split_bytes: int | None) -> dict[str, list[int]]:
    """Where phase A cuts the segments into tasks (verified record starts about every ``split_bytes``,
    default :func:`default_split_bytes`), so that every core has work to the end and a task's memory follows the
    unit, not the segment; none in a DLedger log (its entries carry the walk's state across a file)."""
    if plan.inputs.dledger or not plan.tasks:
        return {}
    names = {plan.segments[t.index].name for t in plan.tasks}
    total = sum(plan.segments[t.index].file_size - t.start for t in plan.tasks)
    unit = split_bytes or default_split_bytes(engine, total)
    return segment_cuts(store.commitlog, unit, names, fine_tail=fine_tail(engine, unit))


def _work_place(engine: Engine, store: Store, staging: Location) -> Location:
    """Where phase A's intermediate files go: this host's memory filesystem when every task runs on this
    host and they fit (:func:`storelib.fileio.memory.scratch_dir`: written, read once and deleted within
    seconds, they skip the disk filesystem's block allocation and journal), else ``staging/_work``."""
    if staging.local and is_local_master(engine_master(engine)):
        path = scratch_tempdir(SHM_PREFIX, sum(s.file_size for s in store.commitlog.segments) // WORK_SHARE)
        if path is not None:
            return resolve(path)
    return staging.join(WORK)


def _drop_work(engine: Engine, ctx: RebuildContext) -> None:
    """Remove phase A's intermediate files on the workers, a share each (on a local disk freeing their
    page cache is work in proportion to the records); the driver removes the directory after."""
    work = ctx.work
    paths = [Location(work.fs, i.path, work.local)
             for i in work.fs.get_file_info(pafs.FileSelector(work.path, allow_not_found=True, recursive=True))
             if i.type == pafs.FileType.File]
    if paths:
        n = max(1, min(len(paths), 2 * engine.parallelism))
        engine.map(partial(remove_files, ctx.fs_options), [paths[i::n] for i in range(n)], "rebuild: work files")


def _run_bc(engine: Engine, ctx: RebuildContext, jobs: list[tuple[int, list[int]]], ix: IndexPlan | None,
            out: EngineResult, say: Stage) -> dict[str, dict[str, Any]]:
    """Phases B and C in one engine job; returns the written files' {rel: {size, sha256}}, sorted."""
    # phases B and C are independent: one Spark job runs both, index files first (one long task
    # per file) so the consume-queue tasks fill the other cores around them
    work: list[tuple[str, Any]] = [("index", f) for f in range(ix.nfiles if ix else 0)]
    work += [("cq", j) for j in jobs]
    if ctx.do_cq:
        say(f"phase B: consume queues in {len(jobs)} partition(s)")
    if ix is not None and ix.nfiles:
        say(f"phase C: {ix.keys} index keys → {ix.nfiles} index file(s)")
    results = []
    if work:
        results = engine.map(partial(phase_bc, ctx, ix.job_args() if ix else None), work, "phases B/C: tasks", say)
    files: dict[str, dict[str, Any]] = {}
    for kind, s in results:
        if kind == "cq":
            files.update(s["files"])
            out.queues += s["queues"]
            out.cq_records += s["cq_records"]
        else:
            files[s["rel"]] = {"size": s["size"], "sha256": s["sha256"]}
    if ctx.do_cq:
        say(f"phase B: {out.queues} queues, {out.cq_records} entries, "
            f"{sum(1 for r in files if r.startswith('consumequeue/'))} files "
            f"(task seconds: {sum(s['seconds'] for k, s in results if k == 'cq'):.1f})")
    if any(k == "index" for k, _ in results):
        say(f"phase C: longest index-file task {max(s['seconds'] for k, s in results if k == 'index'):.1f} s")
    if ix is not None:
        files.update(write_extra_index(ix, ctx.staging))
        say(f"phase C: {sum(1 for r in files if r.startswith('index/'))} index file(s) written")
    return dict(sorted(files.items()))


def _index_plan(engine: Engine, metas: dict[int, Meta], inc: list[int], ctx: RebuildContext, out: EngineResult,
                say: Stage, name_tz: str | tzinfo) -> IndexPlan:
    """Schedule the index merge steps over phase A's units (``inc``, in dispatch order): the duplicate
    test's counts (on the engine when a unit needs it), the layout, each file's first time (for its name)."""
    g = ctx.geometry
    E = g.entries_per_file
    segs = {i: segment_keys(metas[i]) for i in inc}
    keyed = [i for i in inc if segs[i].n_keys]
    m_before, whole = running_max_before(segs, inc)
    mb = None if whole else m_before
    kept = None
    if not whole:
        say("phase C: PHYSICALOFFSET fields are not increasing: applying the broker's duplicate test")
        kept = {i: (c, lr, lk) for i, c, lr, lk in engine.map(partial(count_kept, ctx, m_before), keyed,
                                                             "phase C: duplicate test")}
    counts, last = kept_counts(segs, keyed, kept)
    ix = layout(g, inc, segs, counts, last, out.records, ctx.empty_index_count)
    out.index_keys = ix.keys
    firsts: dict[int, int] = {}
    if ix.nfiles:
        with_keys = [i for i in keyed if ix.counts[i]]
        if ctx.staging.local:  # memory-mapped key files: the driver reads one time per file itself
            firsts = dict(pair for i in with_keys for pair in first_times(ctx, E, ix.offsets, mb, i))
        else:
            firsts = dict(pair for lst in engine.map(partial(first_times, ctx, E, ix.offsets, mb), with_keys,
                                                     "phase C: first times")
                          for pair in lst)
    return IndexPlan(ix, mb, name_files(ix, firsts, name_tz))
