"""The audit's per-segment phase on an engine: segment tasks cut into split tasks, run in-process, on a
process pool or on Spark, their part results merged per segment.

On a pool or Spark the tasks' record/key tables travel through files in a work directory
(:func:`table_sink`) or in-band with the results; in-process they stay in memory. Any engine gives the
same findings: a segment whose parts do not chain is audited again as one task.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

from jobs.common import note
from jobs.engines.schedulers import Engine, SparkEngine
from jobs.spark.sparkutil import is_local_master
from storelib.broker.settings.store import Store
from storelib.checks.segment import (
    AuditOptions,
    SegmentResult,
    SegmentTask,
    TableSink,
    audit_part,
    merge_parts,
    split_tasks,
)
from storelib.fileio.bytesource import resolve
from storelib.scan.splits import parallel_split_bytes

TRANSFERS = ("auto", "files", "collect")
# in this process, the task tables of up to this much store stay in memory (~26 B a record); more go
# through mapped files like the pool's, so a big store audited in-process keeps its memory flat
IN_MEMORY_TABLES = 1 << 30


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
    note(f"audit: task tables go through {path}", quiet)
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


def run_segments(tasks: list[SegmentTask], opts: AuditOptions, eng: Engine, quiet: bool = False,
                 store: Store | None = None, split_bytes: int | None = None, work_dir: str | None = None,
                 transfer: str = "auto") -> list[SegmentResult]:
    """Phase 1 on the given engine (same functions on every engine; the caller starts and closes it). With
    ``split_bytes`` (default on a pool or Spark: :func:`storelib.scan.splits.parallel_split_bytes`, about
    two tasks per core) segments are cut at record starts into split tasks whose results are merged per
    segment.

    In-process the parts keep their tables in memory; on a pool or Spark the tasks' tables come back
    through files (:func:`table_sink`) or in-band with the results; the driver maps the files and
    removes them before returning."""
    if not tasks:
        return []
    if split_bytes is None and eng.name != "local":
        split_bytes = parallel_split_bytes(sum(t.file_size - t.start for t in tasks), eng.parallelism)
    units = split_tasks(store, tasks, split_bytes) if split_bytes and store is not None else tasks
    audited = sum(t.file_size - t.start for t in tasks)
    if eng.name == "local" and audited <= IN_MEMORY_TABLES:
        return _run_in_process(tasks, units, opts, quiet)
    where = eng.sc.master if isinstance(eng, SparkEngine) else "local"
    note(f"audit: {len(units)} task(s) over {len(tasks)} segment(s) on {eng.describe()}", quiet)
    with table_sink(where, work_dir, transfer, opts.fs_options, quiet) as sink:
        t0 = time.monotonic()
        parts = eng.map(partial(audit_part, opts=opts, sink=sink), units, "audit: tasks", None if quiet else note)
        t1 = time.monotonic()
        if sink is not None:
            for p in parts:
                p.load_tables(sink.fs_options)
        out = merge_parts(tasks, parts, opts, None if quiet else note)
        note(f"audit: tasks {t1 - t0:.2f} s (task time {sum(p.seconds for p in parts):.2f} s, "
             f"{sum(p.problem_count() for p in parts)} findings), tables "
             f"{'mapped from files' if sink is not None else 'in-band'}, merged in {time.monotonic() - t1:.2f} s",
             quiet)
        return out


def _run_in_process(tasks: list[SegmentTask], units: list[SegmentTask], opts: AuditOptions,
                    quiet: bool) -> list[SegmentResult]:
    """The local engine: the split tasks one after the other, tables kept in memory, progress per task."""
    parts = []
    t0 = time.monotonic()
    done_bytes = 0
    for i, t in enumerate(units):
        parts.append(audit_part(t, opts, keep_tables=True))
        done_bytes += (t.end if t.end is not None else t.file_size) - t.start
        el = max(time.monotonic() - t0, 1e-9)
        note(f"audit: task {i + 1}/{len(units)} {t.name}@{t.start}: {parts[-1].problem_count()} findings "
             f"({done_bytes / el / 1e6:.0f} MB/s of file)", quiet)
    return merge_parts(tasks, parts, opts, None if quiet else note)

