"""The audit's cross-file phase: every check that needs more than one segment or file (queue offsets,
consume queues, index files, checkpoint, markers, config, consumer offsets, the timer store), as merge
steps over the per-segment results (:func:`storelib.checks.segment.audit_part`): streamed segment by
segment first (:mod:`storelib.checks.crossstream`), over the whole record view (:class:`LogView`) for what
the stream cannot settle. The job that schedules the segments and writes the report is jobs/audit.py."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from storelib.broker.settings.batchcq import batch_load_failures
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.geometry import fold_geometry_findings
from storelib.broker.settings.livecut import StoreCut
from storelib.broker.settings.store import Store
from storelib.broker.settings.storeloads import store_load_findings
from storelib.broker.settings.strayload import version_of
from storelib.checks.crossstream import (
    CrossResults,
    lost_ranges,
    missing_ranges,
    preloaded,
    streamable,
    streamed_checks,
)
from storelib.checks.index import check_index, load_index_files
from storelib.checks.livejudge import judge_live
from storelib.checks.logcharts import view_charts
from storelib.checks.logview import LogView, ResumeFailed, Unsettled
from storelib.checks.metadata import (
    check_checkpoint,
    check_configs,
    check_consumer_offsets,
    check_markers,
    report_abort,
)
from storelib.checks.queues import check_consume_queues, check_queue_offsets, load_consume_queues
from storelib.checks.segment import (
    KEY_SCHEMA,
    RECORD_SCHEMA,
    SEVERITY_RANK,
    Capped,
    SegmentResult,
)
from storelib.checks.timers import check_timer_store
from storelib.errors import Finding
from storelib.format.consumequeue import lmq_queues

if TYPE_CHECKING:
    from storelib.broker.settings.brokerline import BrokerLine


def run_cross_checks(store: Store, results: list[SegmentResult], settings: BrokerSettings, *, now_ms: int,
                     threads: bool = True, preload: dict[str, Future] | None = None,
                     stream: bool = True, resume: dict | None = None,
                     feed: list[SegmentResult] | None = None, max_lag: int | None = None) -> CrossResults:
    """The cross-file checks over the segments' results (in commitlog order).

    ``stream``: first the streamed checks (:mod:`storelib.checks.crossstream`: memory bounded by a segment),
    which settle a store whose files agree; the whole record view only for what they cannot settle.
    ``threads``: the index checks (and config reading) beside the queue/consume-queue checks, each into
    its own collector merged in the serial order (findings exactly those of ``threads=False``);
    ``preload``: the index validation / consume-queue summary already started ("index", "cq");
    ``resume``: an earlier streamed run's carry, going on with ``feed`` (what was audited since) alone;
    when the stream cannot settle that, :class:`ResumeFailed` (the caller audits in full: the whole view
    needs every segment's records). A live store (``store.cut``) is read as at its cut and judged as
    :mod:`storelib.checks.livejudge` says (``max_lag``: bytes of dispatch lag before it is a warning)."""
    out = Capped()
    store_findings(store, results, settings, out)
    unsealed_segments(results, out)
    done: CrossResults | None = None
    mode = "whole view: lost regions or missing segments"
    if resume is not None:
        if not streamable(store, results):
            raise ResumeFailed("lost regions or missing segments")
        try:
            c, done = streamed_checks(store, results, settings, now_ms, threads=threads, resume=resume, feed=feed)
        except Unsettled as e:
            raise ResumeFailed(str(e)) from e
        out.absorb(c)
        done.mode = "streamed, incremental"
    elif stream and streamable(store, results):
        try:
            c, done = streamed_checks(store, results, settings, now_ms, threads=threads, preload=preload)
            out.absorb(c)
        except Unsettled as e:
            mode = f"whole view: {e}"
    elif not stream:
        mode = "whole view"
    if done is None:
        pre = {k: v for k, v in (preload or {}).items() if k == "index"}  # "cq" is the streamed summary
        log = _record_view(store, results)
        if threads:
            done = _threaded_checks(store.loc, log, settings, out, now_ms, pre, store.cut)
        else:
            done = _serial_checks(store.loc, log, settings, out, now_ms, store.cut)
        done.mode = mode
    done.findings = sorted(fold_geometry_findings(judge_live(out.done(), store, max_lag)),
                           key=lambda f: (-SEVERITY_RANK.get(f.severity, 0), f.file or "", f.offset or -1, f.kind))
    return done


def store_findings(store: Store, results: list[SegmentResult], settings: BrokerSettings, out: Capped) -> None:
    """The store's and the segments' findings into ``out``."""
    cl = store.commitlog
    loads = store_load_findings(store.loc, settings)
    if version_of(settings.version) == "5":  # queueTypeShouldBe both ways, as info and the plan say it
        seen = {(f.kind, f.file) for f in loads}
        loads += [f for f in batch_load_failures(store.loc, settings.mapper_file_size_batch_consume_queue)
                  if (f.kind, f.file) not in seen]
    for f in [*cl.findings, *store.findings, *loads]:
        out.add(f)
    seg_findings = [Finding.from_dict(fd) for r in results for fd in r.findings]
    for f in merge_v2_findings(seg_findings, settings.line):
        out.add(f)
    # said once each, before the queue findings they explain
    if settings.cq_unreproduced is not None:
        out.add(Finding("cq_unreproduced", "warning", "consumequeue", None,
                        f"consume queues are checked against the records' own topic, queue and tags code, "
                        f"but {settings.cq_unreproduced}: entries made that way show as mismatches (light "
                        "message queues' entries, %LMQ%, are checked as copies)", {"supported": False}))
    lmq = lmq_queues(store.loc)
    if lmq is not None:
        out.add(Finding("lmq_queues", "info", "consumequeue", None,
                        f"{lmq} hold multi-dispatch copies of other queues' records: each entry is checked to "
                        "point at a record start with the same size and tags code, of a dispatched (not "
                        "prepared or rolled back) record, not against the INNER_MULTI_DISPATCH list that put "
                        "it there"))


def _record_view(store: Store, results: list[SegmentResult]) -> LogView:
    """Every segment's record/key tables as one view, with the lost physical ranges (corrupt regions and
    missing segments)."""
    cl = store.commitlog
    lost_arr = lost_ranges(store, results)
    recs = pa.concat_tables([r.record_table() for r in results]) if results else RECORD_SCHEMA.empty_table()
    keys = pa.concat_tables([r.key_table() for r in results]) if results else KEY_SCHEMA.empty_table()
    phy = recs.column("phy_offset").to_numpy()
    size = recs.column("size").to_numpy().astype(np.int64)
    log_end = int((phy + size).max()) if len(phy) else cl.min_offset
    return LogView(recs, keys, lost_arr, cl.min_offset, log_end, cl.segment_size, missing_ranges(store))


def unsealed_segments(results: list[SegmentResult], out: Capped) -> None:
    """Middle segments whose data ends without the end-of-file blank record while later ones hold data."""
    data_segs = [r for r in results if r.records or r.end_kind not in ("end_of_data",) or r.data_end]
    last_data = max((r.base for r in data_segs), default=-1)
    for r in results:
        if r.base < last_data and r.end_kind in ("end_of_data", "invalid") and not r.regions:
            out.add(Finding("segment_not_sealed", "error", f"commitlog/{r.name}", r.data_end,
                            f"data ends at {r.data_end} without the end-of-file blank record, but later segments hold "
                            "data: bytes were lost or the segment was replaced"))


def _serial_checks(root, log: LogView, settings: BrokerSettings, out: Capped, now_ms: int,
                   cut: StoreCut | None = None) -> CrossResults:
    """The checks one after the other into one collector (the reference the threaded path equals)."""
    facts = check_queue_offsets(log, out)
    abort = check_markers(root, out, cut)
    cp = check_checkpoint(root, log.summary(), out, now_ms, cut)
    qstats = check_consume_queues(root, log, settings, out, facts, cut=cut)
    qstats.pop("__reput_from__", None)
    idx = check_index(root, log, settings, out, cp, abort.exists, cut=cut)
    report_abort(abort, idx, out)
    loaded = check_configs(root, out)
    consumers = check_consumer_offsets(loaded, qstats, out)
    timers = check_timer_store(root, log, settings, out, facts, cut)
    return CrossResults(qstats, consumers, idx, cp, timers, log.summary(), view_charts(log))


def _threaded_checks(root, log: LogView, settings: BrokerSettings, out: Capped, now_ms: int,
                     pre: dict[str, Future], cut: StoreCut | None = None) -> CrossResults:
    """The index checks need only the checkpoint and the abort marker, the consume-queue checks only the
    queue-offset facts: both chains run at once (numpy releases the GIL), each into its own collector,
    merged below in the serial order so caps and findings are exactly those of a serial run."""
    c_qo, c_mk, c_cp, c_cq, c_idx, c_ab, c_cfg = (Capped() for _ in range(7))
    abort = check_markers(root, c_mk, cut)
    cp = check_checkpoint(root, log.summary(), c_cp, now_ms, cut)
    extra_box: list[Any] = [None]
    once = threading.Lock()

    def charts_if_first() -> None:  # the report's series on whichever check thread is done first
        if once.acquire(blocking=False):
            extra_box[0] = view_charts(log)

    def index() -> dict:
        r = check_index(root, log, settings, c_idx, cp, abort.exists,
                        preloaded(pre.get("index"), load_index_files, root, settings, None, cut))
        charts_if_first()
        return r

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="audit-check") as pool:
        f_idx = pool.submit(index)
        f_cfg = pool.submit(check_configs, root, c_cfg)
        f_cq = pre.get("cq")
        if f_cq is None or f_cq.cancel():  # not started by the preload: loaded beside the offset check
            f_cq = pool.submit(load_consume_queues, root, settings, log.log_min, cut)
        facts = check_queue_offsets(log, c_qo)
        qstats = check_consume_queues(root, log, settings, c_cq, facts, f_cq.result())
        charts_if_first()
        qstats.pop("__reput_from__", None)
        idx, loaded = f_idx.result(), f_cfg.result()
    report_abort(abort, idx, c_ab)
    for c in (c_qo, c_mk, c_cp, c_cq, c_idx, c_ab, c_cfg):
        out.absorb(c)
    consumers = check_consumer_offsets(loaded, qstats, out)
    timers = check_timer_store(root, log, settings, out, facts, cut)
    return CrossResults(qstats, consumers, idx, cp, timers, log.summary(), extra_box[0])


def merge_v2_findings(findings: list[Finding], line: BrokerLine | None) -> list[Finding]:
    """All ``v2_record_on_4x`` findings as one (first place, total count), with the broker-line conflict.

    Under 4.x rules every V2 record is an error, but only the first matters (4.9.8's recovery stops
    there) and they usually mean the wrong line was chosen: one finding that says so, not one per record.
    A conflict without V2 records is a warning of its own."""
    v2 = [f for f in findings if f.kind == "v2_record_on_4x"]
    out = [f for f in findings if f.kind != "v2_record_on_4x"]
    conflict = line.conflict if line is not None else None
    if v2:
        first = min(v2, key=lambda f: (f.file or "", f.offset or 0))
        n = sum(int((f.extra or {}).get("count", 1)) for f in v2)
        detail = (f"{n} V2 (0xDAA320AB) record(s), the first here: a 4.9.8 broker treats it as corrupt, ends its "
                  "recovery there and drops every message after it")
        if conflict:
            detail += "; the store's own evidence says 5.x wrote it: audit with --broker-version 5 (or auto)"
        out.append(Finding("v2_record_on_4x", "error", first.file, first.offset, detail,
                           {"count": n, "broker_line": line.source if line is not None else None}))
    elif conflict:
        out.append(Finding("broker_line_conflict", "warning", None, None, conflict))
    return out
