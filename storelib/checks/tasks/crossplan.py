"""The partitioned cross-file phase on the driver's side: what to schedule and how the tasks' findings and
summaries merge into the report the whole view would give. The driver lists directories and reads index
file headers, plans the tasks, and merges what they return (proportional to queues, files and findings);
it never reads a record. ``run`` is an engine's map (``run(fn, items, label)``: results in the items'
order), so the same plan runs in this process, on a pool or on Spark (jobs.engines.audit_tasks).

Rounds: the queue summaries run beside the segment tasks (:func:`queue_meta_tasks`); then one job holds
every queue group, index file and the timer store (:func:`partitioned_checks`); damaged index files
only add a lookup round and a coverage round."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.geometry import fold_geometry_findings
from storelib.broker.settings.store import Store
from storelib.broker.startup.startup5x import consume_queue_max_phy
from storelib.checks.crossfile import store_findings, unsealed_segments
from storelib.checks.crossstream import CrossResults, lost_ranges, missing_ranges
from storelib.checks.index import index_refs_at
from storelib.checks.livejudge import judge_live
from storelib.checks.logcharts import SizeHistogram, TrafficSeries
from storelib.checks.logview import LogSummary, ResumeFailed, Unsettled
from storelib.checks.metadata import (
    check_checkpoint,
    check_configs,
    check_consumer_offsets,
    check_markers,
    report_abort,
)
from storelib.checks.queues import CQLoad, queue_listing, queues_without_cq, vanished_finding
from storelib.checks.segment import (
    SEVERITY_RANK,
    AuditOptions,
    Capped,
    SegmentResult,
    SegmentTask,
    audit_part,
)
from storelib.checks.tables import TableSink, group_of
from storelib.checks.tasks.carry import (
    group_from_json,
    merge_group,
    new_carry,
    schedule_groups,
    timer_signature,
)
from storelib.checks.tasks.context import CrossContext
from storelib.checks.tasks.dledgertask import (
    DLedgerFileTask,
    DLedgerQueueTask,
    dledger_file_task,
    dledger_queue_task,
)
from storelib.checks.tasks.expire import expire_carry, moved
from storelib.checks.tasks.indexplan import IndexPlan, index_plan, merge_index
from storelib.checks.tasks.indextask import IndexStructureTask, index_structure_task
from storelib.checks.tasks.queuetask import (
    QueueDir,
    QueueGroupResult,
    QueueGroupTask,
    QueueMetaTask,
    queue_group_task,
    queue_meta_task,
)
from storelib.checks.tasks.timertask import TimerTask, timer_task
from storelib.checks.timers import has_timer_store
from storelib.errors import Finding
from storelib.fileio.bytesource import Location

Run = Callable[[Callable[[Any], Any], list, str], list]


@dataclass
class QueuePlan:
    """The store's queue directories, grouped: what the queue summaries run over."""

    listing: CQLoad  # the listing's findings; ``failed`` when consumequeue/ cannot be read
    dirs: list[QueueDir] = field(default_factory=list)
    tasks: list[QueueMetaTask] = field(default_factory=list)


def queue_meta_tasks(store: Store, settings: BrokerSettings, groups: int, fs_options: dict[str, Any],
                     prev: dict[str, dict] | None = None, snapshot: bool = False) -> QueuePlan:
    """List the queue directories (one listing per topic) and make one summary task per non-empty group."""
    plan = QueuePlan(CQLoad())
    listed = queue_listing(store.loc, plan.listing, store.cut)
    if listed is None:
        return plan
    by_group: dict[int, list[QueueDir]] = {}
    for i, (topic, qid, loc) in enumerate(listed):
        d = QueueDir(i, topic, qid, loc.path.rstrip("/").rsplit("/", 1)[-1])
        plan.dirs.append(d)
        by_group.setdefault(group_of(topic, qid, groups), []).append(d)
    for g, dirs in sorted(by_group.items()):
        sub = None if prev is None else {k: v for k, v in prev.items() if _prev_group(k, groups) == g}
        plan.tasks.append(QueueMetaTask(g, store.uri, fs_options, settings, store.commitlog.min_offset, tuple(dirs),
                                        sub, snapshot, store.cut))
    return plan


def _prev_group(key: str, groups: int) -> int:
    qid, topic = key.split("/", 1)
    return group_of(topic, int(qid), groups)


def phase_one(opts: AuditOptions, sink: TableSink | None,
              item: SegmentTask | QueueMetaTask | IndexStructureTask) -> Any:
    """A task of the segment phase: a segment (or split) audited, a queue group's summaries, or an index
    file's structure (what the cross-file checks read without records, beside the segments)."""
    if isinstance(item, QueueMetaTask):
        return queue_meta_task(item)
    if isinstance(item, IndexStructureTask):
        return index_structure_task(item)
    if isinstance(item, (DLedgerFileTask, DLedgerQueueTask)):  # a DLedger store's data files and queue ends
        return dledger_file_task(item) if isinstance(item, DLedgerFileTask) else dledger_queue_task(item)
    return audit_part(item, opts, sink)


def run_item(ctx: CrossContext, item: Any) -> Any:
    """One task of the partitioned phase, whichever kind (an engine maps this over mixed items)."""
    from storelib.checks.tasks.indextask import (
        CoverageTask,
        IndexFileTask,
        IndexLookupTask,
        KeysTailTask,
        coverage_task,
        index_file_task,
        index_lookup_task,
        keys_tail_task,
    )

    if isinstance(item, QueueGroupTask):
        return queue_group_task(ctx, item)
    if isinstance(item, IndexFileTask):
        return index_file_task(ctx, item)
    if isinstance(item, IndexLookupTask):
        return index_lookup_task(ctx, item)
    if isinstance(item, CoverageTask):
        return coverage_task(ctx, item)
    if isinstance(item, KeysTailTask):
        return keys_tail_task(ctx, item)
    if isinstance(item, TimerTask):
        return timer_task(ctx, item)
    raise TypeError(f"not a cross-file task: {item!r}")


def cross_context(store: Store, settings: BrokerSettings, results: list[SegmentResult], groups: int,
                  fs_options: dict[str, Any], cq_max_phy: int, sink: str | None, *, snapshots: bool = False,
                  resumed: bool = False, cut: Any = None) -> CrossContext:
    """The plain values every task gets: the log's bounds and lost ranges, and where each part's tables are."""
    cl = store.commitlog
    with_recs = [r for r in results if r.records]
    parts = tuple(p for r in results for p in r._parts)
    lo = [r.first_ts for r in with_recs if r.first_ts is not None]
    hi = [r.last_ts for r in with_recs if r.last_ts is not None]
    return CrossContext(store.uri, fs_options, settings, groups, cl.min_offset,
                        max((r.rec_end for r in with_recs), default=cl.min_offset), cl.segment_size,
                        tuple((int(a), int(b)) for a, b in lost_ranges(store, results)),
                        any(p.n_misplaced for p in parts), min(lo, default=None), max(hi, default=None), parts,
                        consume_queue_max_phy(store.loc, settings, cq_max_phy, cut is not None and cut.live),
                        sink, snapshots, resumed, cut,
                        gaps=tuple((int(a), int(b)) for a, b in missing_ranges(store)), cq_ends=log_cq_ends(results))


def log_cq_ends(results: list[SegmentResult]) -> tuple[int, ...]:
    """:func:`storelib.broker.startup.lagdispatch.cq_able_ends` of the whole log from the segments'. A segment
    of an older audit state has none: every valid record counts there (each run's end, as before)."""
    return tuple(sorted(e for r in results if r.records for e in (
        r.cq_ends if r.cq_ends is not None else [r.base + g["start"] for g in r.regions] + [r.rec_end])))


def partitioned_checks(store: Store, results: list[SegmentResult], settings: BrokerSettings, ctx: CrossContext,
                       queues: QueuePlan, metas: list[dict], *, now_ms: int, run: Run,
                       carry: dict | None = None, structures: list[dict] | None = None,
                       max_lag: int | None = None) -> CrossResults:
    """The cross-file checks as tasks, merged into what the whole view reports (findings in its order).

    ``carry``: go on from an earlier run's (``ctx.parts`` are only what was audited since): only the
    partitions with something new are scheduled; raises ResumeFailed when that cannot settle the store.
    A live store (``ctx.cut``) is read as at its cut and judged as :mod:`storelib.checks.livejudge` says."""
    root = store.loc
    summary = LogSummary(sum(r.records for r in results), sum(r.bytes_valid for r in results), ctx.ts_lo, ctx.ts_hi,
                         ctx.log_min, ctx.log_end, ctx.segment_size)
    c_mk, c_cp, c_ab, c_cfg = (Capped() for _ in range(4))
    abort = check_markers(root, c_mk, ctx.cut)
    cp = check_checkpoint(root, summary, c_cp, now_ms, ctx.cut)
    if any("unsettled" in m for m in metas):
        raise ResumeFailed(next(m["unsettled"] for m in metas if "unsettled" in m))
    try:
        if moved(carry, ctx.log_min):  # the cleaner deleted the oldest segments since the carry was made
            carry = expire_carry(carry, ctx.log_min, {r.name for r in index_refs_at(root, [], ctx.cut)})
        qtasks, kept = schedule_groups(ctx, _group_tasks(ctx, queues, metas), carry)
        ix = index_plan(ctx, settings, cp, abort.exists, carry, structures)
        timer = _timer_task(ctx, root, carry)
        items: list[Any] = [*ix.file_tasks, *qtasks, *([ix.tail] if ix.tail else []), *([timer] if timer else [])]
        tctx = ctx.for_tasks()
        done = run(partial(run_item, tctx), items, "audit: cross-file tasks") if items else []
        n_ix, n_q = len(ix.file_tasks), len(qtasks)
        fresh: list[QueueGroupResult] = done[n_ix:n_ix + n_q]
        tail = done[n_ix + n_q] if ix.tail else None
        t_res = done[-1] if timer else None
        groups = _settled_groups(ctx, carry, fresh, kept)
        c_qo, c_cq, qstats, _facts = _merge_queues(ctx, queues, metas, list(groups.values()))
        ixm = merge_index(ctx, settings, ix, done[:n_ix], tail, run, tctx)
        if t_res is not None and "unsettled" in t_res:
            raise Unsettled(t_res["unsettled"])
    except Unsettled as e:
        raise ResumeFailed(str(e)) from e
    report_abort(abort, ixm.info, c_ab)
    out = Capped()
    store_findings(store, results, settings, out)
    unsealed_segments(results, out)
    loaded = check_configs(root, c_cfg)
    for c in (c_qo, c_mk, c_cp, c_cq, ixm.found, c_ab, c_cfg):
        out.absorb(c)
    consumers = check_consumer_offsets(loaded, qstats, out)
    timers = _timer_result(root, carry, t_res, out)
    res = CrossResults(qstats, consumers, ixm.info, cp, timers["result"]["timers"] if timers else None, summary,
                       _charts(ctx, list(groups.values())), mode=_mode(groups, ix, timer, carry))
    res.findings = sorted(fold_geometry_findings(judge_live(out.done(), store, max_lag)),
                          key=lambda f: (-SEVERITY_RANK.get(f.severity, 0), f.file or "", f.offset or -1, f.kind))
    if ctx.snapshots:
        snaps = {g: (r.snap if g not in kept else carry["queue_groups"][str(g)]["snap"]) for g, r in groups.items()}
        res.carry = new_carry(ctx, groups, snaps, metas, ixm.carry, timers)
    return res


def _settled_groups(ctx: CrossContext, carry: dict | None, fresh: list[QueueGroupResult],
                    kept: dict[int, QueueGroupResult]) -> dict[int, QueueGroupResult]:
    """Every group's result: the tasks' (going on from a carry: added to what it held), the carried ones."""
    out = dict(kept)
    expired = moved(carry, ctx.log_min)
    for r in fresh:
        if r.mode.startswith("unsettled") or (carry is not None and r.mode != "streamed"):
            raise Unsettled(r.mode.split(": ", 1)[-1])
        c = carry["queue_groups"].get(str(r.group)) if carry is not None else None
        out[r.group] = r if c is None else merge_group(group_from_json(r.group, c["result"], ctx, expired), r,
                                                       ctx.log_min if expired else None)
    return dict(sorted(out.items()))


def _timer_task(ctx: CrossContext, root: Location, carry: dict | None) -> TimerTask | None:
    """The timer store's task, when it has something new (a full run: whenever there is a timer store)."""
    if not has_timer_store(root):
        return None
    c = carry.get("timers") if carry is not None else None
    if carry is not None and c is None:
        raise Unsettled("the earlier run kept no timer store")
    if c is not None and not ctx.parts and timer_signature(root) == c["files"]:
        return None
    return TimerTask(c["records"] if c is not None else None)


def _timer_result(root: Location, carry: dict | None, t_res: dict | None, out: Capped) -> dict | None:
    """The timer store's findings into ``out``; what the carry keeps of it (its records, result, files)."""
    if t_res is None:
        c = carry.get("timers") if carry is not None else None
        if c is None:
            return None
        out.replay_json(c["result"]["found"])
        return c
    out.replay_json(t_res["found"])
    result = {"timers": t_res["timers"], "found": t_res["found"]}
    if t_res["records"] is None:
        return {"result": result, "records": None, "files": None}
    return {"result": result, "records": t_res["records"], "files": timer_signature(root)}


def _mode(groups: dict[int, QueueGroupResult], ix: IndexPlan, timer: TimerTask | None, carry: dict | None) -> str:
    whole = sum(1 for g in groups.values() if g.mode.startswith("whole"))
    ran = sum(1 for g in groups.values() if g.mode != "carried")
    files = sum(1 for e in ix.files if e.err is None)
    text = (f"partitioned: {len(groups)} queue group(s) ({whole} by the whole view's checks), {files} "
            f"index file(s) ({len(ix.looked)} looked up){', the timer store' if timer else ''}")
    if carry is not None:
        text += (f", incremental: {ran} queue group(s) and {len(ix.file_tasks)} index file(s) checked, "
                 "the rest carried")
    return text


def _group_tasks(ctx: CrossContext, queues: QueuePlan, metas: list[dict]) -> list[QueueGroupTask]:
    """One task per queue group that holds a consume queue or some part's records."""
    by_group = {m["group"]: m for m in metas}
    with_records = {g for p in ctx.parts for g in range(ctx.groups) if p.group_rows(g)[1] > p.group_rows(g)[0]}
    return [QueueGroupTask(g, tuple(by_group[g]["queues"]) if g in by_group else (), queues.listing.failed)
            for g in sorted({*by_group, *with_records})]


def _merge_queues(ctx: CrossContext, queues: QueuePlan, metas: list[dict], groups: list[QueueGroupResult]
                  ) -> tuple[Capped, Capped, dict, dict]:
    """The queue findings in the whole view's order: offsets queue by queue (topics in first-seen order),
    then the consume queues' (listing order), then queues without one; their stats and facts."""
    first: dict[str, int] = {}
    for g in groups:
        for t, p in g.first_phy.items():
            first[t] = min(p, first.get(t, p))
    rank = {t: i for i, t in enumerate(sorted(first, key=lambda t: first[t]))}
    facts_all = {k: v for g in groups for k, v in g.facts.items()}
    offsets_found = {k: v for g in groups for k, v in g.offsets_found.items()}
    order = sorted(facts_all, key=lambda k: (rank[k[0]], k[1] & 0xFFFFFFFF))
    facts = {k: facts_all[k] for k in order}
    c_qo = Capped()
    for k in order:
        if k in offsets_found:
            c_qo.replay_json(offsets_found[k])
    c_cq = Capped()
    c_cq.extend(queues.listing.findings)
    if queues.listing.failed:
        return c_qo, c_cq, {}, facts
    found = {i: fl for m in metas for i, fl in m["found"].items()}
    vanished = {i: v for m in metas for i, v in m.get("vanished", {}).items()}
    listing = CQLoad()  # the files a live store's cleaner deleted after the listing, said once after the rest
    for d in queues.dirs:
        c_cq.extend(Finding.from_dict(f) for f in found.get(d.idx, []))
        listing.vanished += vanished.get(d.idx, [])
    vanished_finding(listing)
    c_cq.extend(listing.findings)
    stats_all = {k: v for g in groups for k, v in g.stats.items()}
    units_found = {k: v for g in groups for k, v in g.units_found.items()}
    keys = list(dict.fromkeys((d.topic, d.qid) for d in queues.dirs))  # a repeated queue: its first place
    stats: dict = {}
    for k in keys:
        if k in units_found:
            c_cq.replay_json(units_found[k])
        if k in stats_all:
            stats[k] = stats_all[k]
    listing.cq_max_phy, listing.live = ctx.cq_max_phy, ctx.cut is not None and ctx.cut.live
    reput_from = listing.reput_from(ctx.log_min)
    queues_without_cq(ctx.root(), ctx.segment_size, facts, set(keys), reput_from, c_cq, stats)
    return c_qo, c_cq, stats, facts


def _charts(ctx: CrossContext, groups: list[QueueGroupResult]) -> dict[str, Any]:
    """The report's series from the groups' (topics renumbered in first-seen order over the whole log)."""
    first: dict[str, int] = {}
    rows: dict[str, np.ndarray] = {}
    sizes = SizeHistogram()
    for g in groups:
        for t, p in g.first_phy.items():
            first[t] = min(p, first.get(t, p))
        for t, row in g.traffic.items():
            r = np.asarray(row, np.int64)
            rows[t] = rows[t] + r if t in rows else r
        if g.sizes[0]:
            sizes.resume(g.sizes)
    names = sorted(first, key=lambda t: first[t])
    traffic = TrafficSeries(ctx.ts_lo, ctx.ts_hi)
    if names and not traffic.empty:
        traffic.grid = np.stack([rows.get(t, np.zeros(traffic.nb, np.int64)) for t in names])
    return {"traffic": traffic.result(names), "sizes": sizes.result()}


__all__ = ["IndexPlan", "QueuePlan", "cross_context", "partitioned_checks", "queue_meta_tasks", "run_item"]
