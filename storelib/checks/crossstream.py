"""The audit's cross-file phase streamed segment by segment, for a store whose files agree: the record and
key tables of one segment at a time (mapped from the tasks' files), the consume queues a segment's worth
of units at a time, the index files one at a time against the streamed keys. Memory is bounded by a
segment, the queues and the index geometry, never by the store: a 1 TB broker disk is audited in the
memory of a few GB of it.

It reports exactly what the whole-view checks (:mod:`storelib.checks.crossfile`) report for such a store:
lag, keys not indexed yet, notes on the small files. The moment it meets anything else (a lost region,
a record away from its PHYSICALOFFSET field, a unit or an index entry that is not its record's) it raises
:class:`~storelib.checks.logview.Unsettled` and the whole view, which can say exactly what is wrong, runs
instead."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.checks.index import check_index, load_index_files
from storelib.checks.keystream import KeyStream, pending_table
from storelib.checks.logcharts import SizeHistogram, TrafficSeries
from storelib.checks.logview import LogSummary, LogView, Unsettled
from storelib.checks.metadata import (
    check_checkpoint,
    check_configs,
    check_consumer_offsets,
    check_markers,
    report_abort,
)
from storelib.checks.queuestream import QueueMetaLoad, QueueStream, load_queue_meta, queue_meta_snapshot
from storelib.checks.segment import RECORD_SCHEMA, Capped, SegmentResult
from storelib.checks.timers import TIMER_TOPIC, check_timer_store, has_timer_store
from storelib.errors import Finding
from storelib.format.checkpoint import Checkpoint


def lost_ranges(store: Store, results: list[SegmentResult]) -> np.ndarray:
    """The physical [start, end) ranges known lost, sorted: corrupt regions and missing segments."""
    lost = [(r.base + g["start"], r.base + g["end"]) for r in results for g in r.regions]
    lost += [(f.extra["from"], f.extra["to"]) for f in store.commitlog.findings if f.kind == "missing_segment"]
    return np.array(sorted(lost), dtype=np.int64).reshape(-1, 2)


def missing_ranges(store: Store) -> np.ndarray:
    """The lost ranges no segment file holds (missing segments), sorted: the reput cannot read past them
    (:func:`storelib.broker.recovery.reputpath.reput_skipped_at`), unlike the corrupt bytes of a file."""
    gaps = [(f.extra["from"], f.extra["to"]) for f in store.commitlog.findings if f.kind == "missing_segment"]
    return np.array(sorted(gaps), dtype=np.int64).reshape(-1, 2)


def streamable(store: Store, results: list[SegmentResult]) -> bool:
    """Can the streamed checks settle this store? Not with lost ranges: what they explain needs the whole
    view."""
    return not len(lost_ranges(store, results))


def summary_of(store: Store, results: list[SegmentResult]) -> LogSummary:
    """The log's counts and bounds from the segments' results (no record read)."""
    with_recs = [r for r in results if r.records]
    lo = [r.first_ts for r in with_recs if r.first_ts is not None]
    hi = [r.last_ts for r in with_recs if r.last_ts is not None]
    cl = store.commitlog
    end = max((r.base + r.data_end for r in with_recs), default=cl.min_offset)
    return LogSummary(sum(r.records for r in results), sum(r.bytes_valid for r in results), min(lo, default=None),
                      max(hi, default=None), cl.min_offset, end, cl.segment_size)


@dataclass
class CrossResults:
    """What the cross-file checks give the report besides their findings (either way they ran)."""

    qstats: dict
    consumers: list[dict]
    idx: dict
    cp: Checkpoint | None
    timers: Any
    summary: LogSummary
    charts: dict[str, Any]  # the report's record-derived series (:mod:`storelib.checks.logcharts`)
    findings: list[Finding] = field(default_factory=list)  # every finding, sorted by severity then place
    mode: str = "streamed"  # how the checks ran: streamed, or the whole view and why
    carry: dict | None = None  # what a later (incremental) run goes on from: streamed runs only


def streamed_checks(store: Store, results: list[SegmentResult], settings: BrokerSettings, now_ms: int, *,
                    threads: bool = True, preload: dict[str, Future] | None = None, resume: dict | None = None,
                    feed: list[SegmentResult] | None = None) -> tuple[Capped, CrossResults]:
    """The cross-file checks streamed: their findings (in the whole view's order) and results, with the
    carry a later run can go on from (``CrossResults.carry``). Raises :class:`Unsettled` (nothing reported)
    when the store needs the whole view.

    ``resume``: an earlier run's carry; then only ``feed`` (the results of what was audited since: new
    segments, an appended tail) have their records read, and the rest is what the carry says."""
    root = store.loc
    pre = preload or {}
    feed = results if feed is None else feed
    summary = summary_of(store, results)
    if resume is not None and (resume["log_min"], resume["segment_size"]) != (summary.log_min, summary.segment_size):
        raise Unsettled("the commitlog starts elsewhere than when the state was written (segments expired)")
    c_qo, c_mk, c_cp, c_cq, c_idx, c_ab, c_cfg, out = (Capped() for _ in range(8))
    cut = store.cut
    abort = check_markers(root, c_mk, cut)
    cp = check_checkpoint(root, summary, c_cp, now_ms, cut)
    meta: QueueMetaLoad = (preloaded(pre.get("cq"), load_queue_meta, root, settings, summary.log_min, None, cut)
                           if resume is None else load_queue_meta(root, settings, summary.log_min, resume["cq"], cut))
    try:
        def index() -> tuple[dict, dict, dict | None]:
            carried = resume["index"] if resume is not None else None
            loaded = (preloaded(pre.get("index"), load_index_files, root, settings, None, cut) if resume is None
                      else load_index_files(root, settings, carried, cut))
            before = [pending_table(resume["keys"])] if resume is not None else []
            n = (resume["keys"]["n"] if resume is not None else 0) + sum(r.key_table().num_rows for r in feed)
            keys = KeyStream(chain(before, (r.key_table() for r in feed)), n,
                             resume["keys"]["cur"] if resume is not None else 0)
            snap: dict[str, dict] = {}
            info = check_index(root, None, settings, c_idx, cp, abort.exists, loaded, stream=keys, carried=carried,
                               snap=snap, log_min=summary.log_min)
            return info, snap, keys.snapshot(KEYS_KEEP, indexed=bool(loaded.files))

        qs = QueueStream(meta, summary.log_min, summary.segment_size, c_qo)
        traffic, sizes = TrafficSeries(summary.ts_lo, summary.ts_hi), SizeHistogram()
        if resume is not None:
            qs.resume(resume["queues"])
            sizes.resume(resume["sizes"])
            if not traffic.resume(resume["traffic"]):
                raise Unsettled("the traffic series' buckets changed width")
        if threads:
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="audit-stream") as pool:
                f_idx = pool.submit(index)
                f_cfg = pool.submit(check_configs, root, c_cfg)
                try:
                    _records_pass(feed, qs, traffic, sizes)
                except Unsettled:
                    f_idx.cancel()
                    raise
                (idx, idx_snap, key_snap), loaded = f_idx.result(), f_cfg.result()
        else:
            _records_pass(feed, qs, traffic, sizes)
            (idx, idx_snap, key_snap), loaded = index(), check_configs(root, c_cfg)
        if (qs.log_end if qs.log_end is not None else summary.log_end) != summary.log_end:
            raise Unsettled("the records end elsewhere than the segments say")
        facts = qs.facts()
        qstats = qs.finish(root, facts, c_cq)
        q_snap, cq_snap = qs.snapshot(), queue_meta_snapshot(meta)
    finally:
        meta.close()
    report_abort(abort, idx, c_ab)
    for c in (c_qo, c_mk, c_cp, c_cq, c_idx, c_ab, c_cfg):
        out.absorb(c)
    consumers = check_consumer_offsets(loaded, qstats, out)
    timers, t_snap = _timers(store, feed, settings, summary, facts, out, resume["timers"] if resume else None)
    charts = {"traffic": traffic.result(qs.topic_names), "sizes": sizes.result()}
    carry = None
    if q_snap is not None and key_snap is not None and (timers is None or t_snap is not None):
        carry = {"log_min": summary.log_min, "segment_size": summary.segment_size, "queues": q_snap, "cq": cq_snap,
                 "keys": key_snap, "index": idx_snap, "traffic": traffic.snapshot(), "sizes": sizes.snapshot(),
                 "timers": t_snap}
    return out, CrossResults(qstats, consumers, idx, cp, timers, summary, charts, carry=carry)


KEYS_KEEP = 300_000  # keys not indexed yet that a run keeps for the next incremental one (more: full)
TIMERS_KEEP = 100_000  # timer-topic records kept likewise


# records taken at a time: the pass's memory (~100 B a record, ~100 MB at most), and how often each queue's
# steps run (per slice); 2.1 GB store of 4.3 M records: 1 << 18 took 1.16 CPU-s, 1 << 20 0.87
ROWS = 1 << 20


def _records_pass(results: list[SegmentResult], qs: QueueStream, traffic: TrafficSeries, sizes: SizeHistogram) -> None:
    """Every record once, in commitlog order, :data:`ROWS` at a time: queue tails and units, the report's
    series."""
    for r in results:
        table = r.record_table()
        for lo in range(0, table.num_rows, ROWS):
            rec = table.slice(lo, ROWS)
            code = qs.topic_codes(rec.column("topic"))
            qs.feed(rec, code)
            traffic.feed(rec.column("store_timestamp").to_numpy(), code, len(qs.topic_names))
            sizes.feed(rec.column("size").to_numpy())
            del rec, code
        del table
        pa.default_memory_pool().release_unused()  # the decoded columns: back to the system


def _timers(store: Store, feed: list[SegmentResult], settings: BrokerSettings, summary: LogSummary,
            facts: dict, out: Capped, carried: dict | None) -> tuple[Any, dict | None]:
    """The timer store against a view of the timer topic's records only (``carried``: an earlier run's,
    before ``feed``'s); a unit that is not one of them needs the whole view (it may be another topic's
    record). Returns the summary and those records for a later run (None: too many to carry)."""
    root = store.loc
    if not has_timer_store(root):
        return None, None
    parts = [pa.table(carried, schema=RECORD_SCHEMA)] if carried else []
    records = pa.concat_tables([*parts, *_timer_records(feed)])
    view = LogView(records, pa.table({"pos": pa.array([], pa.int64())}),
                   np.zeros((0, 2), np.int64), summary.log_min, summary.log_end, summary.segment_size)
    c = Capped()
    timers = check_timer_store(root, view, settings, c, facts, store.cut)
    if any(kind == "timer_unit_mismatch" for kind, _ in c.counts):
        raise Unsettled("a timer unit is not a timer record's")
    out.absorb(c)
    return timers, (records.to_pydict() if records.num_rows <= TIMERS_KEEP else None)


def _timer_records(results: list[SegmentResult]) -> Iterator[pa.Table]:
    yield RECORD_SCHEMA.empty_table()
    for r in results:
        rec = r.record_table()
        if rec.num_rows:
            yield rec.filter(pc.equal(rec.column("topic"), TIMER_TOPIC))


def preloaded(fut: Future | None, fn, *args):
    """A preload's result; one not started yet is cancelled and run here (it is needed now)."""
    if fut is None or fut.cancel():
        return fn(*args)
    return fut.result()
