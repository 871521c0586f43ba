"""The queue checks as tasks, one per queue group: each consume queue summarised from its files (beside the
segment tasks: :func:`queue_meta_task`; their largest physical offset is the reput position every group
needs), then each group's records, read part by part from the segment tasks' tables, against its queues
(:func:`queue_group_task`): QUEUEOFFSETs, units, lag, and the report's series of its records.

A group is first proved in agreement as :class:`storelib.checks.queuestream.QueueStream` proves a store,
in memory bounded by a part; whatever that cannot settle is judged by the whole view's checks
(:mod:`storelib.checks.queues`) over the group's records and those its units point at
(:func:`storelib.checks.tasks.context.subset_view`), in memory bounded by the group."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.cqload import LoadedQueue
from storelib.broker.settings.livecut import StoreCut
from storelib.checks.logcharts import SizeHistogram, TopicCodes, TrafficSeries
from storelib.checks.logview import Unsettled
from storelib.checks.queues import (
    CQLoad,
    check_queue_offsets,
    check_queue_units,
    load_consume_queues,
    open_queue,
)
from storelib.checks.queuestream import (
    QueueMeta,
    QueueMetaLoad,
    QueueStream,
    UnitStats,
    load_queue_meta,
    queue_meta_snapshot,
)
from storelib.checks.tables import RECORD_SCHEMA, group_of
from storelib.checks.tasks.context import ByQueue, CrossContext, group_slices, subset_view
from storelib.fileio.bytesource import Location, resolve
from storelib.format.consumequeue import filler_mask

# records taken at a time through a group's streamed checks (as the driver's stream took them)
ROWS = 1 << 20
LISTING = "files"  # a queue summary's listing of its directory (remote stores at rest; never carried)


@dataclass(frozen=True)
class QueueDir:
    """One ``consumequeue/<topic>/<dir>`` directory, where the listing put it."""

    idx: int
    topic: str
    qid: int
    dirname: str

    def loc(self, root: Location) -> Location:
        return root.join("consumequeue", self.topic, self.dirname)


@dataclass(frozen=True)
class QueueMetaTask:
    """Summarise a queue group's consume queues from their files (no record needed)."""

    group: int
    uri: str
    fs_options: dict[str, Any]
    settings: BrokerSettings
    log_min: int
    queues: tuple[QueueDir, ...]
    prev: dict[str, dict] | None = None  # an earlier run's :func:`queue_meta_snapshot` of these queues
    snapshot: bool = False  # also what a later run goes on from (``--since``)
    cut: StoreCut | None = None  # a live store's: the queues read as at it


def queue_meta_task(task: QueueMetaTask) -> dict[str, Any]:
    """Each queue's unit summary and offsets, its files' structural findings (by listing position), and
    the group's largest physical offset of a unit (the broker's reput position is the store's); with
    ``prev``, units an earlier run summarised are not read again (``unsettled``: they changed)."""
    try:
        return _queue_meta(task)
    except Unsettled as e:
        return {"group": task.group, "unsettled": str(e)}


def _queue_meta(task: QueueMetaTask) -> dict[str, Any]:
    root = resolve(task.uri, **task.fs_options)
    found: dict[int, list[dict]] = {}
    vanished: dict[int, list[str]] = {}

    def opened() -> Iterator[tuple[str, int, LoadedQueue]]:
        for q in task.queues:
            one = CQLoad()  # this queue's structural findings and files deleted since the listing (live)
            cq = open_queue(root, task.settings, q.topic, q.qid, q.loc(root), one, task.cut)
            found[q.idx], vanished[q.idx] = [f.to_dict() for f in one.findings], one.vanished
            yield q.topic, q.qid, cq

    meta = load_queue_meta(root, task.settings, task.log_min, task.prev, queues=opened())
    try:
        dirs = {(q.topic, q.qid): q.dirname for q in task.queues}  # a repeated queue: the last, as kept
        queues = [{"topic": t, "qid": qid, "dirname": dirs[(t, qid)], "units": asdict(m.units), "cq_max": m.cq_max,
                   "cq_min": m.cq_min} for (t, qid), m in meta.queues.items()]
        if not root.local and not (task.cut is not None and task.cut.live):
            # the group task takes each queue's listing from here: on an object store a listing is a
            # request, and a store at rest does not change within the run (never carried to a later run)
            for q, m in zip(queues, meta.queues.values()):
                q[LISTING] = m.cq.listed
        snap = queue_meta_snapshot(meta) if task.snapshot else None
    finally:
        meta.close()
    return {"group": task.group, "queues": queues, "found": found, "vanished": vanished,
            "cq_max_phy": meta.base.cq_max_phy, "snap": snap}


@dataclass(frozen=True)
class QueueGroupTask:
    """Check one queue group: its records (every part's slice) against its consume queues."""

    group: int
    queues: tuple[dict, ...]  # the group's :func:`queue_meta_task` entries, in the store's queue order
    listing_failed: bool = False  # the queue directory could not be read: records only, no unit
    resume: dict | None = None  # an earlier run's stream snapshot: go on from it with the new records alone


@dataclass
class QueueGroupResult:
    """What a queue group hands the driver: per queue its facts, stats and findings, and its series."""

    group: int
    facts: dict[tuple[str, int], dict] = field(default_factory=dict)
    stats: dict[tuple[str, int], dict] = field(default_factory=dict)
    offsets_found: dict[tuple[str, int], dict] = field(default_factory=dict)  # queue-offset findings (json)
    units_found: dict[tuple[str, int], dict] = field(default_factory=dict)  # consume-queue findings (json)
    first_phy: dict[str, int] = field(default_factory=dict)  # each topic's first record here
    traffic: dict[str, list[int]] = field(default_factory=dict)  # per topic, the traffic buckets
    sizes: list[list[int]] = field(default_factory=lambda: [[], []])  # distinct sizes and their counts
    mode: str = "streamed"  # or "whole view: why"; "unsettled: why" when going on from a snapshot failed
    records: int = 0
    expired: int = 0  # carried records the cleaner deleted since (a stream going on from a snapshot)
    snap: dict | None = None  # what a later run goes on from (streamed, when asked: ``ctx.snapshots``)


class _Charts:
    """The report's series over one group's records (topics numbered here; the driver renumbers them)."""

    def __init__(self, ctx: CrossContext) -> None:
        self.codes = TopicCodes()
        self.traffic = TrafficSeries(ctx.ts_lo, ctx.ts_hi)
        self.sizes = SizeHistogram()
        self.first: dict[int, int] = {}

    def feed(self, rec: pa.Table, code: np.ndarray) -> None:
        self.traffic.feed(rec.column("store_timestamp").to_numpy(), code, len(self.codes.names))
        self.sizes.feed(rec.column("size").to_numpy())
        if not len(code):
            return
        for c in np.flatnonzero(np.bincount(code)).tolist():  # topics here (few): their first record
            if c not in self.first:
                self.first[c] = int(rec.column("phy_offset")[int(np.argmax(code == c))].as_py())

    def into(self, res: QueueGroupResult) -> None:
        names = self.codes.names
        res.first_phy = {names[c]: p for c, p in self.first.items()}
        grid = self.traffic.grid
        res.traffic = {names[c]: grid[c].tolist() for c in range(len(grid)) if grid[c].any()}
        res.sizes = self.sizes.snapshot()


def _group_meta(ctx: CrossContext, task: QueueGroupTask, root: Location) -> QueueMetaLoad:
    """The group's queues as the streamed checks take them (the store's reput position, not the group's)."""
    meta = QueueMetaLoad()
    meta.base.failed = task.listing_failed
    meta.base.cq_max_phy = ctx.cq_max_phy
    meta.base.root, meta.base.settings = root, ctx.settings
    meta.base.live = ctx.cut is not None and ctx.cut.live
    for q in task.queues:
        cq = LoadedQueue(root.join("consumequeue", q["topic"], q["dirname"]),
                         segment_size=ctx.settings.mapped_file_size_consume_queue, topic=q["topic"],
                         queue_id=q["qid"], phy_limit=ctx.cut.commitlog_end if meta.base.live else None,
                         listing=None if meta.base.live else q.get(LISTING))
        meta.queues[(q["topic"], q["qid"])] = QueueMeta(cq, UnitStats(**q["units"]), q["cq_max"], q["cq_min"])
    return meta


def queue_group_task(ctx: CrossContext, task: QueueGroupTask) -> QueueGroupResult:
    """One queue group's checks: streamed when the store allows, else (or when the stream meets anything
    it cannot settle) the whole view's judgement over the group's records."""
    res = QueueGroupResult(task.group)
    if task.resume is not None:  # the earlier records are not here: what the stream cannot settle, nothing can
        try:
            _streamed(ctx, task, res)
        except Unsettled as e:
            res = QueueGroupResult(task.group, mode=f"unsettled: {e}")
        return res
    if ctx.streamable:
        try:
            _streamed(ctx, task, res)
            return res
        except Unsettled as e:
            res = QueueGroupResult(task.group, mode=f"whole view: {e}")
    else:
        res.mode = "whole view: lost regions or misplaced records"
    _whole(ctx, task, res)
    return res


def _streamed(ctx: CrossContext, task: QueueGroupTask, res: QueueGroupResult) -> None:
    root = ctx.root()
    meta = _group_meta(ctx, task, root)
    charts = _Charts(ctx)
    try:
        offsets = ByQueue()
        qs = QueueStream(meta, ctx.log_min, ctx.segment_size, offsets, codes=charts.codes)
        qs.store_end = ctx.log_end  # the whole log's (a later record of another group moves the queues' end)
        qs.cq_ends = list(ctx.cq_ends)  # and which of them raise a queue's max (lagdispatch.recovery_max_past)
        if task.resume is not None:
            qs.resume(task.resume)
            res.expired = qs.expired
        for table in group_slices(ctx, task.group):
            for lo in range(0, table.num_rows, ROWS):
                rec = table.slice(lo, ROWS)
                code = qs.topic_codes(rec.column("topic"))
                qs.feed(rec, code)
                charts.feed(rec, code)
                res.records += rec.num_rows
            del table
        facts = qs.facts()
        units = ByQueue()
        res.stats = {} if meta.base.failed else qs.finish_queues(facts, units)
        res.snap = qs.snapshot() if ctx.snapshots else None
    finally:
        meta.close()
    res.facts = facts
    res.offsets_found, res.units_found = offsets.per_queue(), units.per_queue()
    charts.into(res)


def _whole(ctx: CrossContext, task: QueueGroupTask, res: QueueGroupResult) -> None:
    """The whole view's queue checks for this group, over its records and the records its units point at."""
    root = ctx.root()
    tables = list(group_slices(ctx, task.group))
    charts = _Charts(ctx)
    for t in tables:
        charts.feed(t, charts.codes.of(t.column("topic")))
        res.records += t.num_rows
    own = pa.concat_tables(tables) if tables else RECORD_SCHEMA.empty_table()
    del tables
    loaded = _group_units(ctx, task, root)
    view = subset_view(ctx, own, _unit_positions(ctx, loaded)).view
    del own
    offsets, units = _Only(ctx, task.group), _Only(ctx, task.group)
    facts = {k: v for k, v in check_queue_offsets(view, offsets).items() if offsets.mine(*k)}
    if not loaded.failed:
        res.stats, _ = check_queue_units(view, units, facts, loaded)
    res.facts = facts
    res.offsets_found, res.units_found = offsets.inner.per_queue(), units.inner.per_queue()
    charts.into(res)


class _Only:
    """A collector of one queue group's findings (the view holds other queues' records too)."""

    def __init__(self, ctx: CrossContext, group: int) -> None:
        self.groups, self.group = ctx.groups, group
        self.inner = ByQueue()

    def mine(self, topic: str, qid: int) -> bool:
        return group_of(topic, qid, self.groups) == self.group

    def add(self, f) -> None:
        if self.mine(f.extra["topic"], int(f.extra["queue_id"])):
            self.inner.add(f)

    def extend(self, fs) -> None:
        for f in fs:
            self.add(f)


def _group_units(ctx: CrossContext, task: QueueGroupTask, root: Location) -> CQLoad:
    """The group's queues' units, loaded whole (the store's reput position, not the group's)."""
    if task.listing_failed:
        loaded = CQLoad()
        loaded.failed = True
        return loaded

    loaded = CQLoad(cq_ends=list(ctx.cq_ends))  # the view holds the group's records only
    loaded.live = ctx.cut is not None and ctx.cut.live

    def opened() -> Iterator[tuple[str, int, LoadedQueue]]:
        for q in task.queues:
            yield q["topic"], q["qid"], open_queue(root, ctx.settings, q["topic"], q["qid"],
                                                   root.join("consumequeue", q["topic"], q["dirname"]), loaded,
                                                   ctx.cut)

    loaded = load_consume_queues(root, ctx.settings, ctx.log_min, ctx.cut, opened(), loaded)
    loaded.findings = []  # reported by the driver, from the summaries (in the store's order)
    loaded.cq_max_phy = ctx.cq_max_phy
    return loaded


def _unit_positions(ctx: CrossContext, loaded: CQLoad) -> np.ndarray:
    """The positions the group's units point at that a whole view would look up (inside the log)."""
    parts = []
    for _n, u, _files, _mx, _mn in loaded.per_queue.values():
        if not len(u):
            continue
        phy = u["phy_offset"].astype(np.int64)
        ok = (phy >= ctx.log_min) & (phy < ctx.log_end) & (u["size"] > 0) & ~filler_mask(u)
        parts.append(phy[ok])
    if not parts:
        return np.zeros(0, np.int64)
    return np.unique(np.concatenate(parts))


__all__ = ["QueueDir", "QueueGroupResult", "QueueGroupTask", "QueueMetaTask", "queue_group_task",
           "queue_meta_task"]
