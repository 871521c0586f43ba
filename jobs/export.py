"""``rmqstore export``: a store as a Parquet dataset (a columnar snapshot) for fast repeated SQL.

Each segment is one task on the chosen engine (in-process, a process pool, Spark): the broker's walk of
it (what a start-up keeps: nothing past the recovery end, nothing after an invalid record) written as
zstd Parquet straight from the scanner's Arrow batches, in the ``rocketmq`` data source's columns, under
Hive partitions (``topic=``/``date=``, UTC). ``--incremental`` exports only segments new or changed since
the manifest (the growing last one from where it ended); an unchanged store writes nothing. The snapshot
directory's rules and the task are storelib.snapshot's; this job schedules and reports.
Also ``spark-submit jobs/export.py STORE --out URI``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from typing import Any

if __package__ in (None, ""):  # spark-submit jobs/export.py: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jobs.common import Stage
from jobs.engines.schedulers import Engine, add_engine_args, make_engine, resolve_engine_name
from jobs.liveread import drop_budget, read_budget
from storelib.broker.recovery.dledgerfacts import end_from_dict, join_ends
from storelib.broker.recovery.walk import finish_walk, plan_recovery, store_inputs
from storelib.broker.settings.store import Store, load_settings
from storelib.errors import StoreError
from storelib.fileio.bytesource import resolve
from storelib.format.checkpoint import Checkpoint
from storelib.snapshot.directory import (
    COMMIT,
    MANIFEST,
    SCHEMA,
    STAGING,
    apply_commit,
    finish_commits,
    read_manifest,
    write_json,
)
from storelib.snapshot.exporttask import TaskCtx, export_segment
from storelib.snapshot.incremental import export_items, manifest_content, same_store, segment_entries

PARTITIONS = ("topic", "date")


@dataclass
class ExportConfig:
    """Everything one export needs (the CLI and spark-submit arguments)."""

    store: str
    out: str
    broker_conf: str | None = None
    broker_version: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    fs_options: dict[str, Any] = field(default_factory=dict)
    engine: str = "auto"
    workers: int | None = None
    master: str | None = None
    with_body: bool = False
    partition_by: tuple[str, ...] = PARTITIONS
    incremental: bool = False
    progress: bool = True
    expect_stopped: bool = False
    max_read_rate: float | None = None  # bytes a second for the whole run


EXPIRED_RETRIES = 3  # runs redone when the broker's cleaner deletes a segment while a run reads it


def export(cfg: ExportConfig, spark: Any = None, engine: Engine | None = None) -> dict[str, Any]:
    """Export (or bring up to date) the snapshot; returns the manifest.

    A store a broker is writing is exported up to the run's cut (:meth:`Store.take_cut`): everything
    written before it, the segment being written included (the next run goes on from there). A segment
    the cleaner deletes while the run reads it expired during the run: the run is done again without it
    (what the snapshot already holds of it stays: an archive keeps what the broker expired)."""
    expired: list[str] = []
    for _ in range(EXPIRED_RETRIES):
        try:
            m = _export(cfg, spark, engine)
        except StoreError as e:
            gone = _vanished_segment(e)
            if gone is None:
                raise
            expired.append(gone)
            continue
        except _Expired as e:
            expired += e.names
            Stage("export", cfg.progress)(f"{len(e.names)} segment(s) expired during the run (the broker's "
                                          "cleaner): exporting again without them")
            continue
        if expired:
            m["run"]["expired_during_run"] = expired
        return m
    raise StoreError(cfg.store, None, "expired", f"segments kept expiring under {EXPIRED_RETRIES} runs in a row "
                     f"({', '.join(expired[-3:])}): the cleaner deletes faster than this export reads")


def _vanished_segment(e: StoreError) -> str | None:
    """The commitlog segment an error could not read because it no longer exists (the cleaner), if so."""
    f = str(e.file or "")
    name = os.path.basename(f.rstrip("/"))
    if ("commitlog" not in f and "dledger-" not in f) or not name.isdigit() or len(name) != 20:  # or a DLedger file
        return None
    return name if f.startswith("/") and not os.path.exists(f) or "No such file" in str(e.detail) else None


class _Expired(Exception):
    def __init__(self, names: list[str]):
        super().__init__(", ".join(names))
        self.names = names


def _export(cfg: ExportConfig, spark: Any = None, engine: Engine | None = None) -> dict[str, Any]:
    """One run of :func:`export` (raises _Expired when the cleaner took a segment it was reading)."""
    say = Stage("export", cfg.progress)
    t0 = time.monotonic()
    for p in cfg.partition_by:
        if p not in PARTITIONS:
            raise StoreError(None, None, "bad_value", f"--partition-by takes {', '.join(PARTITIONS)} or none, not {p!r}")
    root = resolve(cfg.store, **cfg.fs_options)
    settings = load_settings(cfg.broker_conf, cfg.broker_version, cfg.overrides, root)
    store = Store(root, settings, uri=cfg.store)
    store.require_records("export", one_log=True)
    cut = store.take_cut()
    if cut.live:
        if cfg.expect_stopped:
            raise StoreError("lock", 0, "broker_running", f"--expect-stopped: {cut.describe()} ({cut.broker.evidence})")
        say(cut.describe() + (f" ({cut.tail})" if cut.tail else ""))
    out = resolve(cfg.out, **cfg.fs_options)
    if out.local and os.path.realpath(out.path).startswith(os.path.realpath(root.path) + os.sep):
        raise StoreError(cfg.out, None, "bad_output", "the snapshot cannot go inside the store")
    finish_commits(out, say)
    prev = read_manifest(out)
    if prev is not None:
        same_store(store, prev, out)
        if prev.get("with_body") != cfg.with_body or tuple(prev.get("partition_by", ())) != cfg.partition_by:
            if cfg.incremental:
                raise StoreError(out.join(MANIFEST).path, None, "layout_changed",
                                 "the snapshot has other --with-body/--partition-by: run without --incremental")
    inputs = store_inputs(store, version=settings.version, last_exit_ok=True, cq_max_phy_offset=-1,
                          checkpoint=Checkpoint())
    plan = plan_recovery(inputs, store.commitlog.segments)
    prev_segs = (prev or {}).get("segments", {}) if cfg.incremental else {}
    items, carried = export_items(plan, prev_segs, cut if cut.live else None)
    segs = store.commitlog.segments
    name = engine.name if engine is not None else resolve_engine_name(
        cfg.engine, master=cfg.master if spark is None else "given", segments=len(items),
        store_bytes=sum(it[4] - it[5] for it in items))
    run = uuid.uuid4().hex[:10]
    staging = out.join(STAGING + run)
    out.fs.create_dir(staging.path, recursive=True)
    say(f"store {store.uri}: {len(segs)} segment(s); {len(items)} to export, {len(carried)} unchanged; engine {name}")
    own = engine is None
    eng = make_engine(name, spark=spark, master=cfg.master, workers=cfg.workers, app_name="rmqstore-export") \
        if own else engine
    budget = read_budget(eng, cfg.max_read_rate)  # the run's budget, shared by its tasks (jobs.liveread)
    try:
        ctx = TaskCtx(plan, staging.path if staging.local else f"{staging.fs.type_name}://{staging.path}",
                      cfg.fs_options, list(settings.delay_levels_ms), cfg.with_body, cfg.partition_by, run,
                      cut.live, *budget)
        t1 = time.monotonic()
        done = {r["idx"]: r for r in eng.map(partial(export_segment, ctx), items, "export: segments", say)}
        t_work = time.monotonic() - t1
    finally:
        drop_budget(budget)
        if own:
            eng.release()  # its workers exit while this run commits; close() below waits for them
    gone = [r["name"] for r in done.values() if r.get("expired")]
    if gone:
        out.fs.delete_dir(staging.path)
        raise _Expired(gone)
    ends = {i: end_from_dict(p["end"]) for i, p in carried.items()}
    for i, r in done.items():  # a data file the last run read to its cut: its DLedger facts from byte 0
        p = prev_segs.get(r["name"])
        head = end_from_dict(p["end"]) if p and r["start"] and r["end"] else None
        ends[i] = end_from_dict(r["end"]) if head is None else join_ends(head, end_from_dict(r["end"]))
    res = finish_walk(plan, ends)
    P = res.process_offset
    manifest_segs, moves, drop, skipped = segment_entries(plan, prev, prev_segs, carried, done, ends, P,
                                                                   segs, cut)
    manifest = {
        "schema": SCHEMA, "store": store.uri, "created_ms": int(time.time() * 1000),
        "broker_line": settings.line.to_json() if settings.line else None,
        "with_body": cfg.with_body, "partition_by": list(cfg.partition_by), "process_offset": P,
        "dledger": store.dledger is not None,
        "segments": manifest_segs, "skipped": skipped, "live": cut.to_dict(),
        "totals": {"rows": sum(s["rows"] for s in manifest_segs.values()),
                   "files": sum(len(s["files"]) for s in manifest_segs.values()),
                   "bytes": sum(f["bytes"] for s in manifest_segs.values() for f in s["files"])},
    }
    drop = [d for d in dict.fromkeys(drop) if d not in moves]
    unchanged = (prev is not None and not moves and not drop and prev.get("skipped") == skipped
                 and manifest_content(prev.get("segments", {})) == manifest_content(manifest_segs))
    if unchanged:
        out.fs.delete_dir(staging.path)
        say("snapshot up to date: nothing written")
        manifest = prev
    else:
        # staged files not in the manifest (a segment past the recovery end) are dropped with the staging dir
        commit = {"moves": moves, "delete": drop, "manifest": manifest}
        write_json(staging.join(COMMIT), commit)
        apply_commit(out, staging, commit)
    new_rows = sum(r["rows"] for r in done.values() if plan.segments[r["idx"]].base < P)
    new_bytes = sum(f["bytes"] for r in done.values() for f in r["files"])
    manifest = dict(manifest, run={"engine": name, "seconds": round(time.monotonic() - t0, 3),
                                   "work_seconds": round(t_work, 3), "segments_exported": len(items),
                                   "segments_unchanged": len(carried), "rows_written": new_rows,
                                   "bytes_written": new_bytes, "files_written": len(moves),
                                   "files_deleted": len(drop), "unchanged": unchanged})
    if own:
        eng.close()
    return manifest


def summary_text(m: dict[str, Any], out: str) -> str:
    r, t = m["run"], m["totals"]
    lines = [f"rmqstore export: {m['store']} -> {out}",
             f"  snapshot   {t['rows']} rows in {t['files']} file(s), {t['bytes'] / 1e6:.1f} MB; processOffset "
             f"{m['process_offset']}; partitioned by {', '.join(m['partition_by']) or 'nothing'}",
             f"  this run   {r['segments_exported']} segment(s) exported, {r['segments_unchanged']} unchanged; "
             f"{r['rows_written']} rows, {r['files_written']} file(s) written, {r['files_deleted']} deleted"
             + (" (snapshot up to date)" if r["unchanged"] else ""),
             f"  engine     {r['engine']}: {r['seconds']} s ({r['work_seconds']} s exporting)"]
    live = m.get("live") or {}
    if live.get("live"):
        who = f"pid {live['pid']}" if live.get("pid") else "pid unknown"
        lines.append(f"  live store ({who}): read up to a cut at offset {live['cut_offset']} taken at {live['cut_time']}")
    if r.get("expired_during_run"):
        lines.append(f"  expired    {len(r['expired_during_run'])} segment(s) deleted by the broker's cleaner during the run")
    for s in m["skipped"]:
        lines.append(f"  skipped    {s.get('segment', '')} {s['why']}".rstrip())
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# command line (shared with `rmqstore export`)

DESCRIPTION = "A store as a Hive-partitioned Parquet snapshot for fast repeated SQL (incremental)."
EXAMPLE = """examples:
  rmqstore export /data/store --out /data/snapshots/store1
  rmqstore export /data/store --out s3://bucket/snap --incremental --partition-by topic
  spark-submit jobs/export.py /data/store --out hdfs:///snapshots/store1 --with-body

then, e.g.: spark.read.parquet("/data/snapshots/store1"), pyarrow.dataset.dataset(..., partitioning="hive"),
or datasources.read_snapshot(spark, path)
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from jobs.common import add_live_args, add_store_args

    add_store_args(p)
    add_live_args(p)
    p.add_argument("--out", required=True, metavar="DIR|URI", help="the snapshot directory (created; a snapshot "
                   "there is replaced, or brought up to date with --incremental)")
    add_engine_args(p, "export")
    p.add_argument("--with-body", action="store_true", help="include message bodies (binary column body)")
    p.add_argument("--partition-by", default="topic,date", metavar="COLS",
                   help="Hive partition columns: topic,date (default), topic, date or none")
    p.add_argument("--incremental", action="store_true",
                   help="export only segments new or changed since the snapshot's manifest")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def config_from_args(args: argparse.Namespace) -> ExportConfig:
    from jobs.common import fs_options, overrides

    parts = tuple(x.strip() for x in args.partition_by.split(",") if x.strip() and x.strip() != "none")
    v = args.broker_version
    return ExportConfig(store=args.store, out=args.out, broker_conf=args.broker_conf,
                        broker_version=None if v in (None, "auto") else v, overrides=overrides(args),
                        fs_options=fs_options(args), engine=args.engine, workers=args.workers, master=args.master,
                        with_body=args.with_body, partition_by=parts, incremental=args.incremental,
                        progress=not args.quiet, expect_stopped=args.expect_stopped,
                        max_read_rate=args.max_read_rate)


def run_args(args: argparse.Namespace) -> int:
    import json

    m = export(config_from_args(args))
    if args.json:
        print(json.dumps({k: v for k, v in m.items() if k != "segments"}, indent=1, ensure_ascii=False))
    else:
        print(summary_text(m, args.out))
    return 0


def main(argv: list[str] | None = None) -> int:
    """spark-submit jobs/export.py ...: the ``rmqstore export`` command."""
    from jobs.cli import main as cli_main

    return cli_main(["export", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
