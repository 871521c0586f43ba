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
from jobs.engines.schedulers import Engine, default_split_bytes, engine_master, fine_tail
from jobs.spark.sparkutil import is_local_master
from storelib.broker.settings.store import Store
from storelib.checks.segment import (
    AuditOptions,
    SegmentResult,
    SegmentTask,
    audit_part,
    merge_parts,
    split_tasks,
)
from storelib.checks.tables import TableSink
from storelib.checks.tasks.crossplan import phase_one
from storelib.fileio.bytesource import resolve
from storelib.fileio.memory import scratch_tempdir
from storelib.fileio.staging import remove_files

TRANSFERS = ("auto", "files", "collect")
# in this process, the task tables of up to this much store stay in memory (~26 B a record); more go
# through mapped files like the pool's, so a big store audited in-process keeps its memory flat
IN_MEMORY_TABLES = 1 << 30
SHM_PREFIX = "rmqstore-audit-"
TABLE_SHARE = 4  # task tables per store byte, at most about 1/4 (records ~26 B, keys 20 B each; the bench: 0.18)
GROUP_BYTES = 2 << 30  # store bytes per queue group, at least (a group's whole-view memory)
MAX_GROUPS = 4096


@contextlib.contextmanager
def table_sink(master: str, work_dir: str | None, transfer: str, fs_options: dict[str, Any],
               quiet: bool = False, need: int = 0) -> Iterator[TableSink | None]:
    """Where the Spark tasks put their tables: a fresh directory (under ``work_dir``, or a temp dir when
    the master is local: :func:`storelib.fileio.memory.scratch_dir` for ``need`` bytes of tables), removed
    when the block ends however it ends; None: in-band collect.

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
    if work_dir is None:  # this host's processes alone: in memory when the run's tables are small enough
        path = (scratch_tempdir(SHM_PREFIX, need) if local else None) or tempfile.mkdtemp(prefix=name + "-")
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


def table_place(eng: Engine, tasks: list[SegmentTask], work_dir: str | None, transfer: str, fs_options: dict[str, Any],
                quiet: bool = False) -> contextlib.AbstractContextManager[TableSink | None]:
    """Where the run's task tables live while it lasts: this process's memory (the local engine on a store
    of up to :data:`IN_MEMORY_TABLES`: a null context), else a work directory (:func:`table_sink`; None
    there: Spark's in-band collect)."""
    if in_memory(eng, tasks):
        return contextlib.nullcontext(None)
    need = sum(t.file_size - t.start for t in tasks) // TABLE_SHARE
    return table_sink(engine_master(eng), work_dir, transfer, fs_options, quiet, need)


def in_memory(eng: Engine, tasks: list[SegmentTask]) -> bool:
    """Do the run's task tables stay in this process (the local engine, a store of up to
    :data:`IN_MEMORY_TABLES`)?"""
    return eng.name == "local" and sum(t.file_size - t.start for t in tasks) <= IN_MEMORY_TABLES


def cross_groups(eng: Engine, tasks: list[SegmentTask], in_memory: bool) -> int:
    """Queue groups for the cross-file tasks: about two per core, and at least one per
    :data:`GROUP_BYTES` of store (a group judged by the whole view holds its records); one in memory."""
    if in_memory:
        return 1
    audited = sum(t.file_size - t.start for t in tasks)
    return int(min(MAX_GROUPS, max(2 * eng.parallelism, -(-audited // GROUP_BYTES))))


def run_segments(tasks: list[SegmentTask], opts: AuditOptions, eng: Engine, quiet: bool = False,
                 store: Store | None = None, split_bytes: int | None = None, sink: TableSink | None = None,
                 meta_tasks: list[Any] | None = None, in_memory: bool = False
                 ) -> tuple[list[SegmentResult], list[dict]]:
    """Phase 1 on the given engine (same functions on every engine; the caller starts and closes it), with
    what the cross-file checks read without records (``meta_tasks``: the consume queues' summaries, the
    index files' structure) beside the segments; returns the segments' results and those tasks'. With ``split_bytes`` (default on a
    pool or Spark: :func:`default_split_bytes`, 128 MiB on a pool, two tasks per core on
    Spark) segments
    are cut at record starts into split tasks whose results are merged per segment.

    ``in_memory``: the parts keep their tables in this process; else they go to ``sink`` files (or
    in-band with the results when ``sink`` is None), where the cross-file tasks read them."""
    meta_tasks = meta_tasks or []
    if not tasks:
        return [], [phase_one(opts, sink, m) for m in meta_tasks] if in_memory else eng.map(
            partial(phase_one, opts, sink), meta_tasks, "audit: queue and index summaries")
    if split_bytes is None and eng.name != "local":
        split_bytes = default_split_bytes(eng, sum(t.file_size - t.start for t in tasks))
    units = (split_tasks(store, tasks, split_bytes, fine_tail(eng, split_bytes)) if split_bytes and store is not None
             else tasks)
    if in_memory:
        return _run_in_process(tasks, units, opts, quiet), [phase_one(opts, sink, m) for m in meta_tasks]
    note(f"audit: {len(units)} task(s) over {len(tasks)} segment(s) on {eng.describe()}", quiet)
    t0 = time.monotonic()
    run = partial(phase_one, opts, sink)
    # the summaries first: an index file's structure check costs about a segment's work, and queued last
    # it ran alone on one worker while the others idled (a pool takes tasks in the order given)
    done = eng.map(run, [*meta_tasks, *units], "audit: tasks", None if quiet else note)
    metas, parts = done[:len(meta_tasks)], done[len(meta_tasks):]
    t1 = time.monotonic()
    out = merge_parts(tasks, parts, opts, None if quiet else note,
                      rerun=lambda whole: eng.map(run, whole, "audit: segments again"))
    note(f"audit: tasks {t1 - t0:.2f} s (task time {sum(p.seconds for p in parts):.2f} s, "
         f"{sum(p.problem_count() for p in parts)} findings), tables "
         f"{'in files' if sink is not None else 'in-band'}, merged in {time.monotonic() - t1:.2f} s", quiet)
    return out, metas


def drop_tables(eng: Engine, results: list[SegmentResult], sink: TableSink) -> None:
    """Remove the segment tasks' table files on the engine's workers, a share each: on a local work dir the
    kernel frees their page cache (a quarter of the store's size), work the driver would do in proportion
    to the records when it removes the directory (which it still does, for anything left)."""
    paths = [r.path for res in results for p in res._parts for r in (p.records, p.keys) if r.path]
    if not paths:
        return
    n = max(1, min(len(paths), 2 * eng.parallelism))
    eng.map(partial(remove_files, sink.fs_options), [paths[i::n] for i in range(n)], "audit: work files")


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



def queue_metas_again(eng: Engine, tasks: list, log_min: int, quiet: bool = False) -> list[dict]:
    """The queue summaries made again with the log's first offset ``log_min`` (segments the cleaner deleted
    during the run: units pointing into them are expired now)."""
    from dataclasses import replace

    from storelib.checks.tasks.queuetask import queue_meta_task

    return eng.map(queue_meta_task, [replace(t, log_min=log_min) for t in tasks], "audit: queue summaries",
                   None if quiet else note)
