"""Integrity audit of a RocketMQ store, for scheduled runs: ``spark-submit jobs/audit.py STORE [options]``
or ``rmqstore audit STORE``.

Phase 1 audits every commitlog segment independently (:func:`storelib.checks.segment.audit_part`, merged per
segment by :func:`storelib.checks.segment.finish_segment`): Spark tasks of 128-512 MiB (about two per core) cut at record starts
with ``--engine spark``, whole segments in-process with ``--engine local``, so both engines give the
same findings. Each Spark task returns its findings and leaves its compact record/key tables as Arrow
IPC files in a work directory (a temp dir when the executors share the driver's machine, ``local[N]``;
``--work-dir DIR|URI`` on a cluster), which the driver memory-maps and removes; without a reachable
directory the tables come back in-band with ``collect()``. Meanwhile a low-priority driver thread validates
the index files, then reads the consume queues (neither needs the records); whatever it has not started
when the checks need it is run by the checking thread instead.

Phase 2 runs the cross-file checks on the driver over the record tables: the index checks beside the
queue-offset/consume-queue checks on two threads (their findings merged in a fixed order: the same
report as one after the other). Reports go to ``--report-dir`` (``audit.json`` with a stable schema,
``audit.html`` self-contained); the exit code is 0 (clean), 1 (findings at or above ``--fail-on``), 2
(could not run). With ``--since STATE_FILE`` only new or changed segments are re-audited and earlier
per-segment findings are carried forward.
"""

# ruff: noqa: E402
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

if __package__ in (None, ""):  # spark-submit jobs/audit.py: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dataclasses import asdict, replace
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from jobs.audit_summary import (  # noqa: F401  (summary_text, damage_lines: the audit's public API)
    EXIT_CLEAN,
    EXIT_FAILED,
    EXIT_FINDINGS,
    damage_cost,
    damage_lines,
    exit_code,
    summary_text,
)
from jobs.engines import (
    Engine,
    LocalEngine,
    PoolEngine,
    SparkEngine,
    add_engine_args,
    make_engine,
    resolve_engine_name,
)
from jobs.fingerprint import fingerprint, prefix_unchanged
from storelib.broker.brokerconf import BrokerSettings
from storelib.broker.geometry import fold_geometry_findings
from storelib.broker.store import Store
from storelib.checks.index import check_index, load_index_files
from storelib.checks.logview import LogView
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
    AuditOptions,
    PartResult,
    SegmentResult,
    SegmentTask,
    TableSink,
    _Capped,
    audit_part,
    audit_segment,
    finish_segment,
    merge_v2_findings,
    parts_chain,
)
from storelib.checks.timers import check_timer_store
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import resolve
from storelib.scan.splits import parallel_split_bytes, plan_splits

SCHEMA = "rmqstore.audit/1"
STATE_SCHEMA = "rmqstore.audit-state/1"


def _log(msg: str, quiet: bool = False) -> None:
    if not quiet:
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()


def load_state(path: str | None) -> dict[str, Any]:
    if not path or not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            st = json.load(f)
    except (OSError, ValueError) as e:
        raise StoreError(path, None, "bad_state", f"cannot read the audit state file: {e}") from e
    if st.get("schema") != STATE_SCHEMA:
        raise StoreError(path, None, "bad_state", f"not an audit state file (schema {st.get('schema')!r})")
    return st


def _state_dir(path: str) -> str:
    return path + ".d"


def _cached_result(state_path: str, entry: dict) -> SegmentResult | None:
    """A segment's previous result (findings in the state, record/key tables in the sidecar dir)."""
    d = _state_dir(state_path)
    try:
        with open(os.path.join(d, entry["name"] + ".arrow"), "rb") as f:
            rec_ipc = f.read()
        with open(os.path.join(d, entry["name"] + ".keys.arrow"), "rb") as f:
            key_ipc = f.read()
    except OSError:
        return None
    res = SegmentResult(**{k: v for k, v in entry["result"].items()})
    res.records_ipc, res.keys_ipc = rec_ipc, key_ipc
    return res


def save_state(path: str, store: Store, results: list[SegmentResult], fps: dict[str, dict]) -> None:
    """Write the state file and its sidecar tables atomically (temp + rename each)."""
    from storelib.fileio.publish import atomic_local_file
    from storelib.fileio.smallfile_io import atomic_write

    d = _state_dir(path)
    os.makedirs(d, exist_ok=True)
    segs = {}
    for r in results:
        rec_ipc, key_ipc = r.ipc_bytes("zstd")
        atomic_write(os.path.join(d, r.name + ".arrow"), rec_ipc)
        atomic_write(os.path.join(d, r.name + ".keys.arrow"), key_ipc)
        body = asdict(r)
        body.pop("records_ipc")
        body.pop("keys_ipc")
        segs[r.name] = {"name": r.name, "fingerprint": fps[r.name], "result": body}
    last = max((r.base + r.data_end for r in results), default=0)
    st = {"schema": STATE_SCHEMA, "store": store.uri, "written_at_ms": int(time.time() * 1000),
          "last_offset": last, "segments": segs}
    with atomic_local_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(st, f, indent=1)
    for name in os.listdir(d):  # drop tables of segments that are gone
        seg = name.split(".", 1)[0]
        if seg not in segs:
            os.unlink(os.path.join(d, name))


def _merge(old: SegmentResult, new: SegmentResult) -> SegmentResult:
    """An appended segment: the earlier part's result plus the new part's."""
    keep = [f for f in old.findings if f["kind"] != "stale_bytes_after_end"]
    out = SegmentResult(new.name, new.base, new.file_size, old.start, new.end_kind, new.data_end,
                        old.records + new.records, old.bytes_valid + new.bytes_valid, old.crc_errors + new.crc_errors,
                        old.crc_bytes + new.crc_bytes, keep + new.findings, old.regions + new.regions)
    out.set_tables(pa.concat_tables([old.record_table(), new.record_table()]),
                   pa.concat_tables([old.key_table(), new.key_table()]))
    ts = [t for t in (old.first_ts, new.first_ts) if t is not None]
    out.first_ts = min(ts) if ts else None
    ts = [t for t in (old.last_ts, new.last_ts) if t is not None]
    out.last_ts = max(ts) if ts else None
    out.seconds = new.seconds
    return out


# --------------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------------


def plan(store: Store, state: dict, state_path: str | None, quiet: bool = False
         ) -> tuple[list[SegmentTask], dict[str, SegmentResult], dict[str, SegmentResult], dict[str, dict]]:
    """Tasks to run, results carried forward, earlier results to merge appends into, fingerprints."""
    cl = store.commitlog
    S = cl.segment_size
    tasks: list[SegmentTask] = []
    carried: dict[str, SegmentResult] = {}
    partial: dict[str, SegmentResult] = {}
    fps: dict[str, dict] = {}
    prev = (state or {}).get("segments", {})
    for seg in cl.segments:
        if seg.file_size == 0:
            continue
        old = prev.get(seg.name)
        start = 0
        if old and state_path:
            ofp = old["fingerprint"]
            cached = _cached_result(state_path, old)
            data_end = old["result"]["data_end"]
            same = (cached is not None and ofp.get("size") == seg.file_size
                    and prefix_unchanged(seg, ofp, data_end))
            if same and ofp.get("mtime_ms") == seg.mtime_ms:
                for f in cached.findings:
                    f.setdefault("extra", {})["carried_forward"] = True
                carried[seg.name] = cached
                fps[seg.name] = ofp
                continue
            if same and old["result"]["end_kind"] == "end_of_data":
                start = data_end  # appended after the audited end: audit only the new part
                partial[seg.name] = cached
        tasks.append(SegmentTask(seg.name, seg.base, seg.loc.path if seg.loc.local else _uri(store, seg), seg.file_size,
                                 S, seg.loc.local, start))
    if state_path:
        _log(f"audit: {len(tasks)} segment(s) to audit ({sum(1 for t in tasks if t.start)} appended), "
             f"{len(carried)} unchanged (findings carried forward)", quiet)
    return tasks, carried, partial, fps


def _uri(store: Store, seg) -> str:
    u = store.uri.rstrip("/")
    return u + "/commitlog/" + seg.name if "://" in u else seg.loc.path


def split_tasks(store: Store, tasks: list[SegmentTask], split_bytes: int) -> list[SegmentTask]:
    """Cut segment tasks at verified record starts (:func:`storelib.scan.splits.plan_splits`) into tasks of
    about ``split_bytes``, so every core has work and no task holds a whole segment's tables."""
    names = {t.name for t in tasks}
    cuts: dict[str, list[int]] = {}
    for ps in plan_splits(store.commitlog, split_bytes, segments=names):
        cuts.setdefault(ps.split.segment_name, []).append(ps.split.start)
    out: list[SegmentTask] = []
    for t in tasks:
        bounds = [t.start, *(c for c in cuts.get(t.name, []) if c > t.start)]
        for a, b in zip(bounds, [*bounds[1:], None]):
            out.append(replace(t, start=a, end=b))
    return out


def _finish(tasks: list[SegmentTask], parts: list[PartResult], opts: AuditOptions, quiet: bool) -> list[SegmentResult]:
    """Merge part results per segment; a segment whose parts do not chain like one scan (corruption
    across a cut) is audited again as one task, so findings never depend on where the cuts fell."""
    by_name: dict[str, list[PartResult]] = {}
    for p in parts:
        by_name.setdefault(p.name, []).append(p)
    out = []
    for t in tasks:
        ps = sorted(by_name.get(t.name, []), key=lambda p: p.start)
        if ps and parts_chain(ps):
            out.append(finish_segment(t, ps))
        else:
            _log(f"audit: {t.name}: splits do not chain (corruption across a cut): auditing it as one task", quiet)
            out.append(audit_segment(t, opts))
    return out


def is_local_master(master: str) -> bool:
    """Do the executors of this Spark master run on the driver's machine (and see its filesystem)?"""
    return master == "local" or master.startswith(("local[", "local-cluster["))


TRANSFERS = ("auto", "files", "collect")


@contextlib.contextmanager
def table_sink(master: str, work_dir: str | None, transfer: str, fs_options: dict[str, Any],
               quiet: bool = False) -> Iterator[TableSink | None]:
    """Where the Spark tasks put their tables: a fresh directory (under ``work_dir``, or a temp dir when
    the master is local), removed when the block ends however it ends; None: in-band collect.

    ``transfer``: ``auto`` (files when ``work_dir`` is given or the master is local, else collect),
    ``files`` (fails without a reachable directory), ``collect`` (always in-band)."""
    if transfer not in TRANSFERS:
        raise ValueError(f"transfer must be one of {TRANSFERS}, not {transfer!r}")
    local = is_local_master(master)
    if transfer == "collect" or (work_dir is None and not local):
        if transfer == "files":
            raise ValueError(f"Spark master {master} runs executors on other hosts: give a --work-dir they share")
        yield None
        return
    name = f"rmqstore-audit-{uuid.uuid4().hex[:12]}"
    if work_dir is None:
        path = tempfile.mkdtemp(prefix=name + "-")
        loc = resolve(path)
    else:
        loc = resolve(work_dir, **fs_options).join(name)
        loc.fs.create_dir(loc.path, recursive=True)
        path = work_dir.rstrip("/") + "/" + name if "://" in work_dir else loc.path
    _log(f"audit: task tables go through {path}", quiet)
    try:
        yield TableSink(path, fs_options if "://" in path else {})
    finally:
        if loc.local:
            _remove_settled(loc.path)
        else:
            with contextlib.suppress(OSError):
                loc.fs.delete_dir(loc.path)


def _remove_settled(path: str, patience_s: float = 10.0) -> None:
    """Remove a sink directory for good. After a failed Spark job, tasks of the cancelled stage may
    still be finishing a file in it while it is removed (rmtree then leaves the directory); they fail
    on their next write (the sink never re-creates it), so a few retries see it empty."""
    deadline = time.monotonic() + patience_s
    while True:
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path) or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def run_segments(tasks: list[SegmentTask], opts: AuditOptions, engine: str | Engine, spark=None,
                 quiet: bool = False, store: Store | None = None, split_bytes: int | None = None,
                 work_dir: str | None = None, transfer: str = "auto", workers: int | None = None,
                 master: str | None = None) -> list[SegmentResult]:
    """Phase 1 on the chosen engine (same functions on every engine). With ``split_bytes`` (default on a
    pool or Spark: :func:`storelib.scan.splits.parallel_split_bytes`, about two tasks per core) segments are
    cut at record starts into split tasks whose results are merged per segment.

    In-process the parts keep their tables in memory; on a pool or Spark the tasks' tables come back
    through files (:func:`table_sink`) or in-band with the results; the driver maps the files and
    removes them before returning."""
    if not tasks:
        return []
    own = not isinstance(engine, (LocalEngine, PoolEngine, SparkEngine))
    eng = make_engine(engine, spark=spark, master=master, workers=workers, app_name="rmqstore-audit") if own \
        else engine
    try:
        if split_bytes is None and eng.name != "local":
            split_bytes = parallel_split_bytes(sum(t.file_size - t.start for t in tasks), eng.parallelism)
        units = split_tasks(store, tasks, split_bytes) if split_bytes and store is not None else tasks
        if eng.name == "local":
            return _run_in_process(tasks, units, opts, quiet)
        where = eng.sc.master if isinstance(eng, SparkEngine) else "local"
        _log(f"audit: {len(units)} task(s) over {len(tasks)} segment(s) on {eng.describe()}", quiet)
        with table_sink(where, work_dir, transfer, opts.fs_options, quiet) as sink:
            t0 = time.monotonic()
            parts = eng.map(partial(audit_part, opts=opts, sink=sink), units, "audit: tasks",
                            None if quiet else _log)
            t1 = time.monotonic()
            if sink is not None:
                for p in parts:
                    p.load_tables(sink.fs_options)
            out = _finish(tasks, parts, opts, quiet)
            _log(f"audit: tasks {t1 - t0:.2f} s (task time {sum(p.seconds for p in parts):.2f} s, "
                 f"{sum(p.problem_count() for p in parts)} findings), tables "
                 f"{'mapped from files' if sink is not None else 'in-band'}, merged in {time.monotonic() - t1:.2f} s",
                 quiet)
            return out
    finally:
        if own:
            eng.close()


def _run_in_process(tasks: list[SegmentTask], units: list[SegmentTask], opts: AuditOptions,
                    quiet: bool) -> list[SegmentResult]:
    parts = []
    t0 = time.monotonic()
    done_bytes = 0
    for i, t in enumerate(units):
        parts.append(audit_part(t, opts, keep_tables=True))
        done_bytes += (t.end if t.end is not None else t.file_size) - t.start
        el = max(time.monotonic() - t0, 1e-9)
        _log(f"audit: task {i + 1}/{len(units)} {t.name}@{t.start}: {parts[-1].problem_count()} findings "
             f"({done_bytes / el / 1e6:.0f} MB/s of file)", quiet)
    return _finish(tasks, parts, opts, quiet)


def audit_store(store_uri: str, *, broker_conf: str | None = None, engine: str = "local", spark=None,
                since: str | None = None, fs_options: dict | None = None, verify_crc: bool = True,
                quiet: bool = False, now_ms: int | None = None, version: str | None = None,
                split_bytes: int | None = None, overrides: dict[str, Any] | None = None,
                work_dir: str | None = None, transfer: str = "auto", threads: bool = True,
                workers: int | None = None, master: str | None = None) -> dict[str, Any]:
    """Audit a store and return the report dict (the JSON report's content).

    ``work_dir`` (Spark): a directory or URI the driver and every executor reach, where the tasks leave
    their record tables (default: a temp dir when the master is local, else they come back in-band);
    ``transfer`` forces ``files`` or ``collect`` (see :func:`table_sink`). ``threads=False`` runs the
    cross-file checks one after the other (same findings).

    ``split_bytes``: cut segments into tasks of about this size at record starts (default on Spark:
    :func:`storelib.scan.splits.parallel_split_bytes`, about two tasks per core; whole segments locally);
    the findings are the same either way.
    ``run.mb_per_s`` / ``run.messages_per_s`` are over the bytes of the records scanned
    (``run.bytes_scanned``) in the per-segment phase; ``run.file_mb_per_s`` over the file bytes
    audited (``run.bytes_audited``, which counts an unwritten segment tail too).
    """
    t0 = time.monotonic()
    fs_options = fs_options or {}
    from storelib.broker.store import load_settings

    loc = resolve(store_uri, **fs_options)
    store = Store(loc, load_settings(broker_conf, version, overrides, loc), uri=store_uri)
    settings = store.settings
    state = load_state(since)
    tasks, carried, grown, fps = plan(store, state, since, quiet)
    opts = AuditOptions(delay_levels_ms=list(store.delay_levels_ms),
                        broker_version=str(settings.version), verify_crc=verify_crc,
                        fs_options=fs_options)
    # what the cross-file checks read from disk without needing the records (consume queues, index file
    # validation) is loaded on a low-priority driver thread while the segments are audited: it takes the
    # cycles the segment phase leaves idle (Spark local[2] on 2 cores: between tasks; local engine: the
    # second core), so the cross-file phase starts with it done
    pre_pool = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-preload", initializer=_background)
                if threads else None)
    own_engine: Engine | None = None
    try:
        preload = None
        if pre_pool is not None:
            # the index validation first (the longer one: the index checks wait for it); the consume queues
            # after it, taken over by the queue checks if the preload thread has not started them by then
            preload = {"index": pre_pool.submit(load_index_files, store.loc, settings),
                       "cq": pre_pool.submit(load_consume_queues, store.loc, settings, store.commitlog.min_offset)}
        if isinstance(engine, str):
            engine = resolve_engine_name(engine, master=master or (None if spark is None else "given"),
                                         store_bytes=sum(t.file_size - t.start for t in tasks), segments=len(tasks))
            if tasks:  # started here, so start-up (a Spark session, pool workers) is not counted as work
                own_engine = engine = make_engine(engine, spark=spark, master=master, workers=workers,
                                                  app_name="rmqstore-audit")
        t1 = time.monotonic()
        fresh = run_segments(tasks, opts, engine, spark, quiet, store=store, split_bytes=split_bytes,
                             work_dir=work_dir, transfer=transfer, workers=workers, master=master)
        t_seg = time.monotonic() - t1
        report, t_cross = _after_segments(store, settings, tasks, fresh, carried, grown, fps, since, now_ms, quiet,
                                          threads, preload)
    finally:
        if pre_pool is not None:
            pre_pool.shutdown(wait=True, cancel_futures=True)
        if own_engine is not None:
            own_engine.close()
    audited_bytes = sum(t.file_size - t.start for t in tasks)
    scanned = sum(r.bytes_valid for r in fresh)
    report["run"] = {"engine": engine if isinstance(engine, str) else engine.name, "seconds": round(time.monotonic() - t0, 3),
                     "startup_seconds": round(t1 - t0, 3), "segment_seconds": round(t_seg, 3),
                     "cross_check_seconds": round(t_cross, 3),
                     "segments_audited": len(tasks), "segments_carried": len(carried),
                     "bytes_audited": audited_bytes, "bytes_scanned": scanned,
                     "mb_per_s": round(scanned / max(t_seg, 1e-9) / 1e6, 1) if tasks else None,
                     "file_mb_per_s": round(audited_bytes / max(t_seg, 1e-9) / 1e6, 1) if tasks else None,
                     "messages_per_s": round(sum(r.records for r in fresh) / max(t_seg, 1e-9), 1) if tasks else None,
                     "since": since}
    same = [] if not broker_conf else ["--broker-conf", broker_conf]
    if version not in (None, "auto"):
        same += ["--broker-version", str(version)]
    report["damage"] = damage_cost(store, report, quiet, same)
    return report


def _background() -> None:
    """Lowest CPU priority for this thread (Linux: a thread is a schedulable task): it should use only
    the cycles the segment audit leaves idle, never slow it down."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _after_segments(store: Store, settings: BrokerSettings, tasks: list[SegmentTask], fresh: list[SegmentResult],
                    carried: dict[str, SegmentResult], partial: dict[str, SegmentResult], fps: dict[str, dict],
                    since: str | None, now_ms: int | None, quiet: bool, threads: bool,
                    preload: dict[str, Future] | None) -> tuple[dict[str, Any], float]:
    """Merge fresh and carried results, run the cross-file checks, save the state; (report, check seconds)."""
    results: dict[str, SegmentResult] = dict(carried)
    for r in fresh:
        results[r.name] = _merge(partial[r.name], r) if r.name in partial else r
    if since:
        by_name = {s.name: s for s in store.commitlog.segments}
        for r in fresh:
            fps[r.name] = fingerprint(by_name[r.name], results[r.name].data_end)
    ordered = [results[s.name] for s in store.commitlog.segments if s.name in results]
    t2 = time.monotonic()
    report = cross_checks(store, ordered, settings, now_ms=now_ms if now_ms is not None else int(time.time() * 1000),
                          quiet=quiet, threads=threads, preload=preload)
    t_cross = time.monotonic() - t2
    if since:
        save_state(since, store, ordered, fps)
    return report, t_cross


def cross_checks(store: Store, results: list[SegmentResult], settings: BrokerSettings, *, now_ms: int,
                 quiet: bool = False, threads: bool = True, preload: dict[str, Future] | None = None
                 ) -> dict[str, Any]:
    """Phase 2: everything that needs more than one segment or file; builds the report dict.

    ``threads``: run the index checks (and config reading) beside the queue/consume-queue checks; the
    findings are exactly those of ``threads=False``."""
    out = _Capped()
    cl = store.commitlog
    S = cl.segment_size
    root = store.loc
    for f in [*cl.findings, *store.findings]:
        out.add(f)
    seg_findings = [Finding(fd["kind"], fd["severity"], fd["file"], fd["offset"], fd["detail"], fd.get("extra", {}))
                    for r in results for fd in r.findings]
    for f in merge_v2_findings(seg_findings, settings.line):
        out.add(f)
    # lost physical ranges: corrupt regions and missing segments
    lost = [(r.base + g["start"], r.base + g["end"]) for r in results for g in r.regions]
    for f in cl.findings:
        if f.kind == "missing_segment":
            lost.append((f.extra["from"], f.extra["to"]))
    lost_arr = np.array(sorted(lost), dtype=np.int64).reshape(-1, 2)
    recs = pa.concat_tables([r.record_table() for r in results]) if results else RECORD_SCHEMA.empty_table()
    keys = pa.concat_tables([r.key_table() for r in results]) if results else KEY_SCHEMA.empty_table()
    phy = recs.column("phy_offset").to_numpy()
    size = recs.column("size").to_numpy().astype(np.int64)
    log_end = int((phy + size).max()) if len(phy) else cl.min_offset
    log = LogView(recs, keys, lost_arr, cl.min_offset, log_end, S)
    # segments: unsealed middle segments
    data_segs = [r for r in results if r.records or r.end_kind not in ("end_of_data",) or r.data_end]
    last_data = max((r.base for r in data_segs), default=-1)
    for r in results:
        if r.base < last_data and r.end_kind in ("end_of_data", "invalid") and not r.regions:
            out.add(Finding("segment_not_sealed", "error", f"commitlog/{r.name}", r.data_end,
                            f"data ends at {r.data_end} without the end-of-file blank record, but later segments hold "
                            "data: bytes were lost or the segment was replaced"))
    _log("audit: cross-file checks (queue offsets, consume queues, index, checkpoint, config)", quiet)
    charts = None
    if not threads:  # one after the other into one collector (the reference the threaded path equals)
        facts = check_queue_offsets(log, out)
        abort = check_markers(root, out)
        cp = check_checkpoint(root, log, out, now_ms)
        qstats = check_consume_queues(root, log, settings, out, facts)
        qstats.pop("__reput_from__", None)
        idx = check_index(root, log, settings, out, cp, abort.exists)
        report_abort(abort, idx, out)
        loaded = check_configs(root, out)
        consumers = check_consumer_offsets(loaded, qstats, out)
        timers = check_timer_store(root, log, settings, out, facts)
    else:
        # the index checks need only the checkpoint and the abort marker, the consume-queue checks only the
        # queue-offset facts: both chains run at once (numpy releases the GIL), each into its own collector,
        # merged below in the serial order so caps and findings are exactly those of a serial run
        c_qo, c_mk, c_cp, c_cq, c_idx, c_ab, c_cfg = (_Capped() for _ in range(7))
        abort = check_markers(root, c_mk)
        cp = check_checkpoint(root, log, c_cp, now_ms)
        pre = preload or {}
        charts_box: list[dict[str, Any]] = []
        charts_once = threading.Lock()

        def charts_if_first() -> None:  # the report charts on whichever check thread is done first
            if charts_once.acquire(blocking=False):
                charts_box.append(report_charts(log))

        def index() -> dict:
            r = check_index(root, log, settings, c_idx, cp, abort.exists,
                            _preloaded(pre.get("index"), load_index_files, root, settings))
            charts_if_first()
            return r

        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="audit-check") as pool:
            f_idx = pool.submit(index)
            f_cfg = pool.submit(check_configs, root, c_cfg)
            f_cq = pre.get("cq")
            if f_cq is None or f_cq.cancel():  # not started by the preload: loaded beside the offset check
                f_cq = pool.submit(load_consume_queues, root, settings, log.log_min)
            facts = check_queue_offsets(log, c_qo)
            qstats = check_consume_queues(root, log, settings, c_cq, facts, f_cq.result())
            charts_if_first()
            qstats.pop("__reput_from__", None)
            idx, loaded = f_idx.result(), f_cfg.result()
        charts = charts_box[0]
        report_abort(abort, idx, c_ab)
        for c in (c_qo, c_mk, c_cp, c_cq, c_idx, c_ab, c_cfg):
            out.absorb(c)
        consumers = check_consumer_offsets(loaded, qstats, out)
        timers = check_timer_store(root, log, settings, out, facts)
    findings = sorted(fold_geometry_findings(out.done()), key=lambda f: (-SEVERITY_RANK.get(f.severity, 0), f.file or "", f.offset or -1, f.kind))
    report = build_report(store, results, log, findings, qstats, consumers, idx, cp, settings, charts)
    report["timer_store"] = timers
    return report


def _preloaded(fut: Future | None, fn, *args):
    """A preload's result; one the low-priority preload thread has not started yet is cancelled and run
    here instead, at the caller's priority (it is needed now)."""
    if fut is None or fut.cancel():
        return fn(*args)
    return fut.result()


def report_charts(log: LogView) -> dict[str, Any]:
    """The report's record-derived series (traffic per topic over time, size distribution)."""
    from jobs.audit_report import size_histogram, traffic_series

    return {"traffic": traffic_series(log), "sizes": size_histogram(log.size)}


def build_report(store: Store, results: list[SegmentResult], log: LogView, findings: list[Finding], qstats: dict,
                 consumers: list[dict], idx: dict, cp: Any, settings: BrokerSettings,
                 charts: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report dict (JSON schema ``rmqstore.audit/1``); ``charts``: :func:`report_charts` if done already."""
    charts = charts if charts is not None else report_charts(log)

    by_sev = {s: 0 for s in SEVERITY_RANK}
    for f in findings:
        by_sev[f.severity] = by_sev.get(f.severity, 0) + 1
    seg_rows = []
    worst: dict[str, str] = {}
    for f in findings:
        if f.file and f.file.startswith("commitlog/"):
            name = f.file.split("/", 1)[1]
            if SEVERITY_RANK.get(f.severity, 0) >= SEVERITY_RANK.get(worst.get(name, "info"), 0):
                worst[name] = f.severity
    for s in store.commitlog.segments:
        r = next((x for x in results if x.name == s.name), None)
        row = {"name": s.name, "base": s.base, "file_size": s.file_size,
               "records": r.records if r else 0, "bytes_valid": r.bytes_valid if r else 0,
               "data_end": r.data_end if r else 0, "end_kind": r.end_kind if r else "skipped",
               "crc_errors": r.crc_errors if r else 0, "bytes_crc_failed": r.crc_bytes if r else 0,
               "bytes_lost": sum(g["end"] - g["start"] for g in (r.regions if r else [])),
               "first_ts": r.first_ts if r else None, "last_ts": r.last_ts if r else None,
               "worst": worst.get(s.name)}
        seg_rows.append(row)
    for f in findings:  # missing segments appear in the map too
        if f.kind == "missing_segment":
            S = log.segment_size
            for b in range(f.extra["from"], f.extra["to"], S):
                seg_rows.append({"name": f"{b:020d}", "base": b, "file_size": 0, "records": 0, "bytes_valid": 0,
                                 "data_end": 0, "end_kind": "missing", "crc_errors": 0, "bytes_lost": S,
                                 "first_ts": None, "last_ts": None, "worst": "critical"})
    seg_rows.sort(key=lambda x: x["base"])
    regions = [{**g, "segment": r.name, "phy_start": r.base + g["start"]} for r in results for g in r.regions]
    queues = sorted(qstats.values(), key=lambda q: (q["topic"], q["queue_id"]))
    return {
        "schema": SCHEMA,
        "store": store.uri,
        "generated_at_ms": int(time.time() * 1000),
        "settings": {"version": settings.version, "commitlog_segment_size": log.segment_size,
                     "broker_line": settings.line.to_json() if settings.line else None,
                     "cq_segment_size": settings.mapped_file_size_consume_queue,
                     "hash_slot_num": settings.max_hash_slot_num, "index_num": settings.max_index_num},
        "summary": {"findings": len(findings), "by_severity": by_sev, "records": int(log.records.num_rows),
                    "bytes_valid": int(log.size.sum()) if len(log.size) else 0,
                    "segments": len([s for s in seg_rows if s["end_kind"] != "missing"]),
                    "queues": len(queues), "index_files": len(idx.get("files", [])),
                    "bytes_lost": sum(g["bytes_lost"] for g in regions),
                    "crc_errors": sum(r.crc_errors for r in results),
                    "bytes_crc_failed": sum(r.crc_bytes for r in results),
                    "commitlog_min_offset": log.log_min, "commitlog_end_offset": log.log_end,
                    "first_store_ts": int(log.ts.min()) if len(log.ts) else None,
                    "last_store_ts": int(log.ts.max()) if len(log.ts) else None},
        "checkpoint": asdict(cp) if cp is not None else None,
        "segments": seg_rows,
        "regions": regions,
        "queues": queues,
        "consumers": consumers,
        "index": idx,
        "traffic": charts["traffic"],
        "sizes": charts["sizes"],
        "findings": [_finding_json(f) for f in findings],
    }


def _finding_json(f: Finding) -> dict[str, Any]:
    """Stable shape: every finding has kind, severity, file, offset, detail and extra."""
    return {"kind": f.kind, "severity": f.severity, "file": f.file, "offset": f.offset, "detail": f.detail,
            "extra": _jsonable(f.extra or {})}


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def write_reports(report: dict[str, Any], report_dir: str, fs_options: dict | None = None) -> tuple[str, str]:
    """``audit.json`` and ``audit.html`` in ``report_dir`` (each written atomically).

    A URI (``s3://bucket/reports/run``) is published with ``storelib.fileio.publish.publish_tree``: staging
    prefix, then the files, then ``audit-manifest.json`` last (no manifest = incomplete report).
    """
    from jobs.audit_report import render_html
    from storelib.fileio.smallfile_io import atomic_write

    if "://" in report_dir and not report_dir.startswith("file://"):
        import tempfile

        from storelib.fileio.bytesource import resolve
        from storelib.fileio.publish import publish_tree

        with tempfile.TemporaryDirectory(prefix="rmqstore-audit-") as tmp:
            write_reports(report, tmp)
            publish_tree(tmp, resolve(report_dir, **(fs_options or {})),
                         {"kind": "audit", "files": ["audit.html", "audit.json"]}, manifest_name="audit-manifest.json")
        base = report_dir.rstrip("/")
        return base + "/audit.json", base + "/audit.html"
    os.makedirs(report_dir, exist_ok=True)
    jp = os.path.join(report_dir, "audit.json")
    hp = os.path.join(report_dir, "audit.html")
    atomic_write(jp, json.dumps(report, indent=1, ensure_ascii=False, default=_jsonable).encode("utf-8"))
    atomic_write(hp, render_html(report).encode("utf-8"))
    return jp, hp


# --------------------------------------------------------------------------------------------------
# command line (shared with `rmqstore audit`)
# --------------------------------------------------------------------------------------------------

EXAMPLE = """examples:
  rmqstore audit /data/store --report-dir /var/reports/audit --fail-on error
  rmqstore audit /data/store --since /var/lib/rmq-audit.state      # only new or changed segments
  spark-submit jobs/audit.py s3://bucket/store --engine spark --report-dir out/

exit codes: 0 clean, 1 findings at or above --fail-on, 2 could not run, 3 another run holds the lock
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from jobs.common import add_store_args

    add_store_args(p)
    add_engine_args(p, "per-segment audit")
    p.add_argument("--report-dir", metavar="D", help="write audit.json and audit.html here")
    p.add_argument("--since", metavar="STATE_FILE",
                   help="incremental: audit only segments new or changed since the run that wrote STATE_FILE "
                        "(a local file, created when missing, updated after the run; the per-segment tables "
                        "live in STATE_FILE.d/ beside it)")
    p.add_argument("--work-dir", metavar="DIR",
                   help="--engine spark: a directory or URI the driver and every executor can reach, where the "
                        "tasks leave their record tables (a subdirectory, removed after the run); default: a temp "
                        "dir with a local master, else the tables come back through Spark")
    p.add_argument("--lock", metavar="F",
                   help="hold lock file F for the run: a second run while it is held exits 3 (default with "
                        "--since: STATE_FILE.lock; a lock left by a dead run is taken over)")
    p.add_argument("--metrics-file", metavar="F",
                   help="write Prometheus metrics (node_exporter textfile format, temp file + rename) to F; "
                        "also when the run fails (rmqstore_audit_up 0); see docs/scheduling.md")
    p.add_argument("--fail-on", choices=list(SEVERITY_RANK), default="error",
                   help="exit 1 when a finding has at least this severity (default error)")
    p.add_argument("--no-crc", action="store_true", help="skip body CRC verification (faster, weaker)")
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run_args(args: argparse.Namespace) -> int:
    """The command: the run under its lock (``--lock``, or beside ``--since``), metrics written however it ends."""
    from jobs.runlock import EXIT_LOCKED, RunLocked, lock_path_for, run_lock

    t0 = time.monotonic()
    lock = args.lock or (lock_path_for(args.since) if args.since else None)
    report: dict[str, Any] | None = None
    code = EXIT_FAILED
    try:
        with run_lock(lock) if lock else contextlib.nullcontext() as held:
            if held is not None and held.took_over:
                _log(f"audit: took over the lock {lock} left by pid {held.took_over.get('pid')} "
                     f"on {held.took_over.get('host')} (no longer running)", args.quiet)
            report, code = _run(args)
    except RunLocked as e:
        print(f"rmqstore audit: {e}", file=sys.stderr)
        return EXIT_LOCKED  # the running audit's metrics stay as they are
    finally:
        if args.metrics_file and code != EXIT_LOCKED:
            from jobs.metrics import audit_families, previous_value, write_textfile

            prev = previous_value(args.metrics_file, "rmqstore_audit_last_success_time_seconds", args.store)
            write_textfile(args.metrics_file, audit_families(args.store, report, exit_code=code,
                                                             wall_seconds=time.monotonic() - t0,
                                                             previous_success=prev))
    return code


def _run(args: argparse.Namespace) -> tuple[dict[str, Any] | None, int]:
    from jobs.common import fs_options, overrides

    try:
        report = audit_store(args.store, broker_conf=args.broker_conf, engine=args.engine,
                             since=args.since, fs_options=fs_options(args), verify_crc=not args.no_crc,
                             quiet=args.quiet, version=args.broker_version, overrides=overrides(args),
                             work_dir=args.work_dir, workers=args.workers, master=args.master)
    except StoreError as e:
        print(f"rmqstore audit: {e}", file=sys.stderr)
        return None, EXIT_FAILED
    if args.report_dir:
        jp, hp = write_reports(report, args.report_dir, fs_options(args))
        _log(f"audit: wrote {jp} and {hp}", args.quiet)
    if args.json:
        json.dump(report, sys.stdout, indent=1, ensure_ascii=False, default=_jsonable)
        sys.stdout.write("\n")
    sys.stderr.write(summary_text(report, args.fail_on) + "\n")
    return report, exit_code(report, args.fail_on)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="audit.py", description=__doc__, epilog=EXAMPLE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run_args(args)
    except (StoreError, OSError, ValueError) as e:
        print(f"rmqstore audit: {e}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
