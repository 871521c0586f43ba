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

Phase 2 runs the cross-file checks on the driver, streamed over the record tables segment by segment
(storelib.checks.crossstream; the whole record view only for what that cannot settle): the index checks
beside the queue-offset/consume-queue checks on two threads (their findings merged in a fixed order: the
same report as one after the other). Reports go to ``--report-dir`` (``audit.json`` with a stable schema,
``audit.html`` self-contained); the exit code is 0 (clean), 1 (findings at or above ``--fail-on``), 2
(could not run). With ``--since STATE_FILE`` only what was written since the state is read (new segments,
an appended tail) and the streamed checks go on from the state's carry; earlier findings are carried
forward.

Here: :func:`audit_store`, the cross-file checks and the command; the segment phase on the engines is
:mod:`jobs.engines.audit_tasks`, the ``--since`` state :mod:`storelib.checks.auditstate`, the report dict and page
:mod:`jobs.reports.audit_report`.
"""


# ruff: noqa: E402
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass

if __package__ in (None, ""):  # spark-submit jobs/audit.py: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from typing import Any

import jobs.engines.audit_tasks as audit_tasks
from jobs.common import note
from jobs.engines.schedulers import (
    Engine,
    LocalEngine,
    add_engine_args,
    make_engine,
    map_on,
    resolve_engine_name,
    walk_on,
)
from jobs.liveread import drop_budget, read_budget
from jobs.reports.audit_report import add_dledger, build_report, jsonable, render_html
from jobs.reports.audit_summary import EXIT_FAILED, damage_cost, exit_code, summary_text
from storelib.broker.recovery.walkplan import RecoveryInputs
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.checks.auditstate import load_state, merge_appended, plan, save_state
from storelib.checks.crossfile import run_cross_checks
from storelib.checks.livejudge import (
    DEFAULT_MAX_LAG,
    cut_tasks,
    drop_expired,
    expect_stopped_finding,
    segment_gone,
)
from storelib.checks.logview import ResumeFailed
from storelib.checks.segment import (
    SEVERITY_RANK,
    AuditOptions,
    SegmentResult,
)
from storelib.checks.tasks import dledgertask
from storelib.checks.tasks.carry import CARRY_KIND
from storelib.checks.tasks.crossplan import QueuePlan, cross_context, partitioned_checks, queue_meta_tasks
from storelib.checks.tasks.indexplan import index_structure_tasks
from storelib.errors import StoreError
from storelib.fileio.bytesource import resolve
from storelib.scan.fingerprint import fingerprint


def audit_store(store_uri: str, *, broker_conf: str | None = None, engine: str | Engine = "local", spark=None,
                since: str | None = None, fs_options: dict | None = None, verify_crc: bool = True,
                quiet: bool = False, now_ms: int | None = None, version: str | None = None,
                split_bytes: int | None = None, overrides: dict[str, Any] | None = None,
                work_dir: str | None = None, transfer: str = "auto", threads: bool = True,
                workers: int | None = None, master: str | None = None, cross: str = "tasks",
                expect_stopped: bool = False, max_lag: int | None = DEFAULT_MAX_LAG,
                max_read_rate: float | None = None) -> dict[str, Any]:
    """Audit a store and return the report dict (the JSON report's content).

    ``cross``: the cross-file checks as partitioned tasks on the engine (``tasks``, the default; the driver
    merges their findings and summaries), or all on this process (``driver``: streamed, the whole view
    for what that cannot settle; the reference the tasks' reports are tested against). Spark's in-band
    collect (no shared work dir) runs them on the driver too.

    ``work_dir`` (Spark): a directory or URI the driver and every executor reach, where the tasks leave
    their record tables (default: a temp dir when the master is local, else they come back in-band);
    ``transfer`` forces ``files`` or ``collect`` (see :func:`jobs.engines.audit_tasks.table_sink`). ``threads=False`` runs the
    cross-file checks one after the other (same findings).

    ``split_bytes``: cut segments into tasks of about this size at record starts (default on Spark:
    :func:`storelib.scan.splits.parallel_split_bytes`, about two tasks per core; whole segments locally);
    the findings are the same either way.
    ``run.mb_per_s`` / ``run.messages_per_s`` are over the bytes of the records scanned
    (``run.bytes_scanned``) in the per-segment phase; ``run.file_mb_per_s`` over the file bytes
    audited (``run.bytes_audited``, which counts an unwritten segment tail too).

    A store a broker is writing is read as at one cut taken at the start (:mod:`storelib.broker.settings.livecut`)
    and judged as :mod:`storelib.checks.livejudge` says (``max_lag``: bytes of dispatch lag before it is a
    warning); ``expect_stopped``: a running broker is an error finding. ``max_read_rate``: commitlog bytes
    a second for the whole run, shared by the engine's workers.
    """
    kw = dict(broker_conf=broker_conf, engine=engine, spark=spark, fs_options=fs_options, verify_crc=verify_crc,
              quiet=quiet, now_ms=now_ms, version=version, split_bytes=split_bytes, overrides=overrides,
              work_dir=work_dir, transfer=transfer, threads=threads, workers=workers, master=master, cross=cross,
              expect_stopped=expect_stopped, max_lag=max_lag, max_read_rate=max_read_rate)
    state = load_state(since, None if quiet else note)
    try:
        return _audit(store_uri, since, state, **kw)
    except ResumeFailed as e:  # the carry cannot settle what changed: the whole store, then a fresh state
        note(f"audit: the --since state cannot be continued ({e}): auditing in full", quiet)
        return _audit(store_uri, since, {}, **kw)


def _audit(store_uri: str, since: str | None, state: dict[str, Any], *, broker_conf: str | None,
           engine: str | Engine, spark, fs_options: dict | None, verify_crc: bool, quiet: bool, now_ms: int | None,
           version: str | None, split_bytes: int | None, overrides: dict[str, Any] | None, work_dir: str | None,
           transfer: str, threads: bool, workers: int | None, master: str | None, cross: str,
           expect_stopped: bool, max_lag: int | None, max_read_rate: float | None) -> dict[str, Any]:
    """One audit run (:func:`audit_store`) from ``state`` ({}: in full)."""
    t0 = time.monotonic()
    fs_options = fs_options or {}
    from storelib.broker.settings.store import load_settings

    loc = resolve(store_uri, **fs_options)
    store = Store(loc, load_settings(broker_conf, version, overrides, loc), uri=store_uri)
    cut = store.take_cut()
    if cut.live:
        note(f"audit: {cut.describe()}" + (f" ({cut.tail})" if cut.tail else ""), quiet)
        if expect_stopped:
            store.findings.append(expect_stopped_finding(cut))
    settings = store.settings
    if (state.get("carry") or {}).get("kind", "") != (CARRY_KIND if cross == "tasks" else ""):
        state = {**state, "carry": None}  # an earlier run's carry of the other way of checking: in full
    tasks, carried, grown, fps, resume = plan(store, state, since, None if quiet else note, expire_ok=cross == "tasks")
    tasks = cut_tasks(store, tasks)
    opts = AuditOptions(delay_levels_ms=list(store.delay_levels_ms),
                        broker_version=str(settings.version), line=settings.scan_line, verify_crc=verify_crc,
                        dup_info=RecoveryInputs.from_settings(settings, dledger=store.dledger is not None).dup_info,
                        fs_options=fs_options, dledger=store.dledger is not None)
    own_engine: Engine | None = None
    budget: tuple[float | None, str | None] = (None, None)
    eng: Engine
    try:
        if isinstance(engine, str):
            engine = resolve_engine_name(engine, master=master or (None if spark is None else "given"),
                                         store_bytes=sum(t.file_size - t.start for t in tasks), segments=len(tasks))
            # started here, so start-up (a Spark session, pool workers) is not counted as work; with nothing
            # to audit the cross-file tasks run in this process
            eng = own_engine = (make_engine(engine, spark=spark, master=master, workers=workers,
                                            app_name="rmqstore-audit") if tasks else LocalEngine())
        else:
            eng = engine
        t1 = time.monotonic()
        budget = read_budget(eng, max_read_rate)  # the run's budget, shared by its tasks (jobs.liveread)
        if max_read_rate:
            tasks = cut_tasks(store, tasks, *budget)
        with audit_tasks.table_place(eng, tasks, work_dir, transfer, fs_options, quiet) as sink:
            report, t_seg, t_cross, fresh = _phases(store, settings, tasks, opts, eng, sink, carried, grown, fps,
                                                    resume, since=since, now_ms=now_ms, quiet=quiet, threads=threads,
                                                    cross=cross, split_bytes=split_bytes, max_lag=max_lag)
        same = [] if not broker_conf else ["--broker-conf", broker_conf]
        if version not in (None, "auto"):
            same += ["--broker-version", str(version)]
        for key, value in (overrides or {}).items():  # the next commands read the store as this run did
            same += ["--set", f"{key}={value}"]
        # the start-up replay that prices damage scans its segments on the engine too
        damage = damage_cost(store, report, quiet, same, walk_on(eng), map_on(eng, "damage: lost ranges"))
    finally:
        drop_budget(budget)
        if own_engine is not None:
            own_engine.close()
    audited_bytes = sum(t.file_size - t.start for t in tasks)
    scanned = sum(r.bytes_valid for r in fresh)
    report["run"] = {"engine": engine if isinstance(engine, str) else engine.name, "seconds": round(time.monotonic() - t0, 3),
                     "startup_seconds": round(t1 - t0, 3), "segment_seconds": round(t_seg, 3),
                     "cross_check_seconds": round(t_cross, 3),
                     "cross_check_mode": report.pop("cross_check_mode", None),
                     "segments_audited": len(tasks), "segments_carried": len(carried),
                     "bytes_audited": audited_bytes, "bytes_scanned": scanned,
                     "mb_per_s": round(scanned / max(t_seg, 1e-9) / 1e6, 1) if tasks else None,
                     "file_mb_per_s": round(audited_bytes / max(t_seg, 1e-9) / 1e6, 1) if tasks else None,
                     "messages_per_s": round(sum(r.records for r in fresh) / max(t_seg, 1e-9), 1) if tasks else None,
                     "since": since}
    report["live"] = {**cut.to_dict(), "max_lag": max_lag if cut.live else None}
    report["damage"] = damage
    return report


def _phases(store: Store, settings: BrokerSettings, tasks: list, opts: AuditOptions, eng: Engine, sink: Any,
            carried: dict[str, SegmentResult], grown: dict[str, SegmentResult], fps: dict[str, dict],
            resume: dict | None, *, since: str | None, now_ms: int | None, quiet: bool, threads: bool, cross: str,
            split_bytes: int | None, max_lag: int | None) -> tuple[dict[str, Any], float, float, list[SegmentResult]]:
    """The segment phase, with what the cross-file checks read without records beside it (the consume
    queues' summaries, the index files' structure), then the cross-file checks, while the task tables are
    where ``sink`` says; (report, segment seconds, cross-file seconds, the fresh segment results)."""
    t1 = time.monotonic()
    in_memory = audit_tasks.in_memory(eng, tasks)
    tasked = cross == "tasks" and (in_memory or sink is not None)
    if resume is not None and not tasked:
        raise ResumeFailed("the state was written by the partitioned checks, which cannot run here")
    opts.groups = (resume["groups"] if resume is not None else
                   audit_tasks.cross_groups(eng, tasks, in_memory) if tasked else 1)
    queues = queue_meta_tasks(store, settings, opts.groups, opts.fs_options, prev=resume["cq"] if resume else None,
                              snapshot=bool(since)) if tasked else None
    beside: list = [*queues.tasks] if queues else []
    if tasked and resume is None:
        beside += index_structure_tasks(store.uri, store.loc, settings, opts.fs_options, bool(since), store.cut,
                                        store.commitlog.min_offset)
    n_q, n_s = len(queues.tasks) if queues else 0, len(beside)
    dl = _DLedger.start(store, resume, set(carried), opts.fs_options, eng) if store.dledger is not None else None
    if dl is not None:  # DLedger's walk per data file (from the segment parts' own scans when it can) and the
        opts.dledger_walk = dledgertask.part_walk(dl.run, opts)  # queue ends, beside the segments
        dl.in_parts = opts.dledger_walk is not None
        beside += [*([] if dl.in_parts else dl.run.tasks), *dl.queue_tasks]
    fresh, done = audit_tasks.run_segments(tasks, opts, eng, quiet, store=store, split_bytes=split_bytes,
                                           sink=sink, meta_tasks=beside, in_memory=in_memory)
    metas, structures = done[:n_q], done[n_q:n_s]
    if dl is not None:
        dl.done(done[n_s:], fresh, quiet)
    t_seg = time.monotonic() - t1
    on = (CrossOn(eng, sink.dir if sink is not None else None, queues, metas, opts.groups, opts.fs_options, quiet,
                  bool(since), structures) if tasked else None)
    report, t_cross = _after_segments(store, settings, fresh, carried, grown, fps, since, now_ms, quiet, threads,
                                      resume, on, max_lag, dl)
    if sink is not None:  # the tables' files go on the workers (freeing their pages is the kernel's work)
        audit_tasks.drop_tables(eng, fresh, sink)
    return report, t_seg, t_cross, fresh


@dataclass
class _DLedger:
    """A DLedger store's checks on the engine (storelib.checks.tasks.dledgertask): the walk's file tasks and
    the queue-end tasks run beside the segments; the driver merges their findings and summaries."""

    run: dledgertask.DLedgerRun
    queue_tasks: list
    engine: Engine
    files_done: list = dataclasses.field(default_factory=list)
    queues_done: list = dataclasses.field(default_factory=list)
    in_parts: bool = False  # the segment parts give the walk its files' facts (each data file read once)

    @classmethod
    def start(cls, store: Store, resume: dict | None, carried: set[str], fs_options: dict, eng: Engine) -> _DLedger:
        run = dledgertask.start(store, resume, carried)
        return cls(run, dledgertask.queue_tasks(store, fs_options, eng.parallelism, []), eng)

    def done(self, results: list, fresh: list[SegmentResult], quiet: bool) -> None:
        n = 0 if self.in_parts else len(self.run.tasks)
        self.files_done, self.queues_done = list(results[:n]), list(results[n:])
        if self.in_parts:
            self.files_done = dledgertask.ends_from_parts(self.run, {r.name: r.dledger_end for r in fresh},
                                                          self._run_on(quiet))

    def _run_on(self, quiet: bool):
        def run_on(fn, items, label):
            return self.engine.map(fn, items, label, None if quiet else note) if items else []

        return run_on

    def merge(self, quiet: bool) -> tuple[list, dict[str, Any], dict]:
        note(f"audit: DLedger's start-up walk ({len(self.run.tasks)} data file(s) read, {len(self.run.carried)} "
             "carried), its index units, checkpoint and what a start-up deletes", quiet)
        return dledgertask.merge(self.run, self.files_done, self.queue_tasks, self.queues_done, self._run_on(quiet))


@dataclass
class CrossOn:
    """Where the partitioned cross-file tasks run: the engine, the work dir the segment tasks left their
    tables in (None: this process holds them), the queue summaries made beside the segments."""

    engine: Engine
    sink: str | None
    queues: QueuePlan
    metas: list[dict]
    groups: int
    fs_options: dict[str, Any]
    quiet: bool
    snapshots: bool  # make the carry a later run goes on from (``--since``)
    structures: list[dict]  # the index files' structure, checked beside the segments

    def run(self, fn, items: list, label: str) -> list:
        return self.engine.map(fn, items, label, None if self.quiet else note)


def _after_segments(store: Store, settings: BrokerSettings, fresh: list[SegmentResult],
                    carried: dict[str, SegmentResult], partial: dict[str, SegmentResult], fps: dict[str, dict],
                    since: str | None, now_ms: int | None, quiet: bool, threads: bool,
                    resume: dict | None, on: CrossOn | None, max_lag: int | None = None, dl: _DLedger | None = None
                    ) -> tuple[dict[str, Any], float]:
    """Merge fresh and carried results, run the cross-file checks, save the state; (report, check seconds)."""
    results: dict[str, SegmentResult] = dict(carried)
    for r in fresh:
        results[r.name] = merge_appended(partial[r.name], r) if r.name in partial else r
    kept, gone = drop_expired(store, list(results.values()))  # a live store's cleaner at work
    if gone:
        note(f"audit: {len(gone)} segment(s) expired during the run (deleted by the broker's cleaner)", quiet)
        results = {r.name: r for r in kept}
        fresh = [r for r in fresh if r.name in results]
        if resume is not None and on is None:
            raise ResumeFailed("segments expired during the run")
        if on is not None:  # the queues' summaries judged again against the log's first offset now
            on.metas = audit_tasks.queue_metas_again(on.engine, on.queues.tasks, store.commitlog.min_offset, quiet)
    if since:
        by_name = {s.name: s for s in store.commitlog.segments}
        for r in fresh:
            try:
                fps[r.name] = fingerprint(by_name[r.name], results[r.name].data_end)
            except StoreError:
                if not segment_gone(store, by_name[r.name]):
                    raise
                fps[r.name] = {}  # deleted by the cleaner since it was read: the next run drops it (expired)
    ordered = [results[s.name] for s in store.commitlog.segments if s.name in results]
    t2 = time.monotonic()
    report, carry = cross_checks(store, ordered, settings,
                                 now_ms=now_ms if now_ms is not None else int(time.time() * 1000), quiet=quiet,
                                 threads=threads, resume=resume,
                                 feed=sorted(fresh, key=lambda r: r.base) if resume is not None else None, on=on,
                                 max_lag=max_lag)
    t_cross = time.monotonic() - t2
    if dl is not None:  # after the cleaner's deletions are known: the walk over the files left
        found, summary, files = dl.merge(quiet)
        add_dledger(report, found, summary, store.commitlog.folder)
        if isinstance(carry, dict):
            carry = {**carry, "dledger_files": files}
    if since:
        save_state(since, store, ordered, fps, carry)
    return report, t_cross


def cross_checks(store: Store, results: list[SegmentResult], settings: BrokerSettings, *, now_ms: int,
                 quiet: bool = False, threads: bool = True, resume: dict | None = None,
                 feed: list[SegmentResult] | None = None, on: CrossOn | None = None, max_lag: int | None = None
                 ) -> tuple[dict[str, Any], dict | None]:
    """Phase 2 (everything that needs more than one segment or file), then the report dict, and the carry
    an incremental run goes on from.

    ``on``: as partitioned tasks on an engine (storelib.checks.tasks); else on this process
    (storelib.checks.crossfile: streamed, the whole record view for what that cannot settle; ``threads``:
    the index checks beside the queue checks, same findings). ``resume``/``feed``: go on from an earlier
    run's carry with the records audited since (raises ResumeFailed when that cannot settle the store)."""
    note("audit: cross-file checks (queue offsets, consume queues, index, checkpoint, config)", quiet)
    if on is not None:
        ctx = cross_context(store, settings, results, on.groups, on.fs_options,
                            max((m.get("cq_max_phy", -1) for m in on.metas), default=-1), on.sink,
                            snapshots=on.snapshots, resumed=resume is not None, cut=store.cut)
        done = partitioned_checks(store, results, settings, ctx, on.queues, on.metas, now_ms=now_ms, run=on.run,
                                  carry=resume, structures=on.structures, max_lag=max_lag)
    else:
        done = run_cross_checks(store, results, settings, now_ms=now_ms, threads=threads, resume=resume, feed=feed,
                                max_lag=max_lag)
    report = build_report(store, results, done.summary, done.findings, done.qstats, done.consumers, done.idx, done.cp,
                          settings, done.charts)
    report["timer_store"] = done.timers
    report["cross_check_mode"] = done.mode
    return report, done.carry


def write_reports(report: dict[str, Any], report_dir: str, fs_options: dict | None = None) -> tuple[str, str]:
    """``audit.json`` and ``audit.html`` in ``report_dir`` (each written atomically).

    A URI (``s3://bucket/reports/run``) is published with ``storelib.fileio.publish.publish_tree``: staging
    prefix, then the files, then ``audit-manifest.json`` last (no manifest = incomplete report).
    """
    from storelib.fileio.smallfile_io import atomic_write

    if "://" in report_dir and not report_dir.startswith("file://"):
        import tempfile

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
    atomic_write(jp, json.dumps(report, indent=1, ensure_ascii=False, default=jsonable).encode("utf-8"))
    atomic_write(hp, render_html(report).encode("utf-8"))
    return jp, hp


# --------------------------------------------------------------------------------------------------
# command line (shared with `rmqstore audit`)
# --------------------------------------------------------------------------------------------------

DESCRIPTION = "Integrity audit of a store (CRCs, structure, cross-file consistency) with reports."
EXAMPLE = """examples:
  rmqstore audit /data/store --report-dir /var/reports/audit --fail-on error
  rmqstore audit /data/store --since /var/lib/rmq-audit.state      # only new or changed segments
  spark-submit jobs/audit.py s3://bucket/store --engine spark --report-dir out/

exit codes: 0 clean, 1 findings at or above --fail-on, 2 could not run, 3 another run holds the lock
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from jobs.common import add_live_args, add_store_args

    add_store_args(p)
    add_engine_args(p, "per-segment audit")
    p.add_argument("--report-dir", metavar="D", help="write audit.json and audit.html here")
    p.add_argument("--since", metavar="STATE_FILE",
                   help="incremental: read only what was written since the run that wrote STATE_FILE (a local "
                        "file, created when missing, updated after the run: per segment a summary, per queue and "
                        "index file where the checks stopped, no records; kilobytes per GB of store). A store "
                        "that changed otherwise (rewritten or expired segments, damage) is audited in full")
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
    add_live_args(p, lag=True)
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
                note(f"audit: took over the lock {lock} left by pid {held.took_over.get('pid')} "
                     f"on {held.took_over.get('host')} (no longer running)", args.quiet)
            report, code = _run(args)
    except RunLocked as e:
        print(f"rmqstore audit: {e}", file=sys.stderr)
        return EXIT_LOCKED  # the running audit's metrics stay as they are
    finally:
        if args.metrics_file and code != EXIT_LOCKED:
            from jobs.reports.metrics import audit_families, previous_value, write_textfile

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
                             work_dir=args.work_dir, workers=args.workers, master=args.master,
                             expect_stopped=args.expect_stopped, max_read_rate=args.max_read_rate,
                             max_lag=DEFAULT_MAX_LAG if args.max_lag is None else args.max_lag)
    except StoreError as e:
        print(f"rmqstore audit: {e}", file=sys.stderr)
        return None, EXIT_FAILED
    if args.report_dir:
        jp, hp = write_reports(report, args.report_dir, fs_options(args))
        note(f"audit: wrote {jp} and {hp}", args.quiet)
    if args.json:
        json.dump(report, sys.stdout, indent=1, ensure_ascii=False, default=jsonable)
        sys.stdout.write("\n")
    sys.stderr.write(summary_text(report, args.fail_on) + "\n")
    return report, exit_code(report, args.fail_on)


def main(argv: list[str] | None = None) -> int:
    """spark-submit jobs/audit.py ...: the ``rmqstore audit`` command."""
    from jobs.cli import main as cli_main

    return cli_main(["audit", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
