"""Rebuild ConsumeQueue and IndexFile files from the commitlog, byte-identical to the broker.

Runnable with ``spark-submit --properties-file spark-conf/spark-defaults.conf jobs/rebuild.py STORE
--out DIR`` and importable (``rmqstore rebuild`` calls :func:`rebuild`).

The target is store-algorithms §7.1: what a broker writes when started on the commitlog with empty
``consumequeue/`` and ``index/`` and no abort file. The recovery walk (storelib.broker.recovery.walk) fixes the
valid end (processOffset) and which records reput dispatches; then:

* every engine (``local``: in this process, ``pool``, ``spark``) runs the same phase tasks
  (storelib.broker.dispatch.rebuildtasks); on Spark: phase A parses every segment on an executor (one task per segment, longest
  first; inside the recovery window with CRC checks, so the walk itself is distributed) into Arrow
  columns of what dispatch needs plus the index keys with their slot chains numbered within the
  segment (storelib.broker.index.indexstream.local_chains); the driver finishes the walk from the per-segment ends.
  Phase B shuffles CQ rows by queue (one partition per core) and each task runs build_consume_queues
  for its queues segment by segment, appending to their files (storelib.broker.dispatch.cqstream: memory holds one
  segment's rows, not the partition's). Phase C numbers the index keys globally (prefix sums of
  per-segment counts), and each index file is built by one task that links the segments' chains
  (each segment's oldest key per slot to the slot table left by the segments before it) and streams
  the file in order, hashing as it writes (storelib.broker.index.indexstream.stream_index_file: two passes that
  load the file's segments one at a time; slices cut by a file boundary or the duplicate test get
  their chains recomputed). Phases B and C are independent and
  run as one Spark job, index files first, so the consume-queue tasks use the cores an index file
  leaves free. Both engines produce the same bytes; both keep freed memory in the malloc heap
  (storelib.fileio.memory.keep_freed_memory) and write index files past the page cache (storelib.fileio.direct_write).

Index file names are not derivable (the broker uses the wall clock at creation): the policy is
``yyyyMMddHHmmssSSS`` of the file's first entry's store time (the empty successor of a full last
file: the last entry's time), bumped by 1 ms to stay strictly increasing
(storelib.format.indexdir.index_file_name), in the zone the broker's JVM names its own files in:
``--tz``, by default this host's (storelib.units.local_zone, as a JVM here would). IndexService sorts
files by name and deleteExpiredFile stops at the first unexpired one, so names in another zone than
the broker's would sort its next files before the rebuilt ones. Compare index files by order.

Output goes to a staging directory next to the destination and is published atomically with a
manifest (``rebuild-manifest.json``: counts, per-file sha256, source fingerprint, settings, the
recovery walk); a directory without a manifest is never complete. ``--in-place`` writes into the
source store only after moving what it replaces into ``rebuild-backup-<time>/``. ``--incremental``
dispatches only what the store's consume queues lack (from their max physical offset, as reput does),
continuing the last CQ segments and the last index file; only changed or new files are output.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from jobs.common import Stage, name_unread
from jobs.engines.rebuild_tasks import run_tasks
from jobs.engines.schedulers import Engine, add_engine_args, make_engine, resolve_engine_name
from storelib.broker.dispatch.rebuildsource import (
    cq_layout_notes,
    rebuild_timer_store,
    run_incremental,
    store_fingerprint,
)
from storelib.broker.dispatch.rebuildtasks import EngineResult, check_supported
from storelib.broker.recovery.walk import (
    rebuild_target,
)
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.broker.settings.store import load_settings as store_settings
from storelib.errors import StoreError
from storelib.fileio.bytesource import Location, resolve
from storelib.fileio.publish import (
    MANIFEST_NAME,
    publish_tree,
)
from storelib.fileio.staging import (
    check_dest,
    check_not_inside,
    drop_staging,
    make_staging,
    publish_in_place,
)
from storelib.units import LOCAL, parse_zone, zone_name

DESCRIPTION = ("Rebuild ConsumeQueue and IndexFile files from the commitlog, byte-identical to the broker (in this "
               "process, on a process pool over all cores, or on Spark: --engine).")
EXAMPLE = """examples:
  rmqstore rebuild /data/store --out /data/rebuilt
  rmqstore rebuild /data/store --out /data/rebuilt --engine spark --master local[4]
  rmqstore rebuild /data/store --in-place --incremental --broker-conf broker.conf
  rmqstore rebuild s3://bucket/store --out s3://bucket/rebuilt --s3-endpoint http://127.0.0.1:9000

The output directory gets consumequeue/, index/ and rebuild-manifest.json (written last: a
directory without it is incomplete). Index file names follow the first entry's store time (UTC).
"""

WHAT = ("consumequeue", "index", "timer")
DEFAULT_WHAT = ("consumequeue", "index")


@dataclass
class RebuildConfig:
    """Everything one rebuild needs (the CLI and spark-submit arguments)."""

    store: str
    out: str | None = None
    what: tuple[str, ...] = DEFAULT_WHAT
    broker_conf: str | None = None
    broker_version: str = "auto"  # "4", "5" or "auto"
    overrides: dict = field(default_factory=dict)  # broker.conf key -> value (--set)
    engine: str = "local"  # "auto" | "local" | "pool" | "spark"
    workers: int | None = None  # pool engine: worker processes (default: all cores)
    master: str | None = None
    in_place: bool = False
    incremental: bool = False
    partitions: int | None = None
    split_bytes: int | None = None  # phase A's task size on an engine (default: default_split_bytes)
    fs_options: dict[str, Any] = field(default_factory=dict)
    progress: bool = True
    name_tz: str = LOCAL  # the broker JVM's zone for index file names ("local": this host's)


def load_settings(cfg: RebuildConfig, root: Location) -> BrokerSettings:
    return store_settings(cfg.broker_conf, cfg.broker_version, cfg.overrides, root)


def rebuild(cfg: RebuildConfig, spark=None, engine: Engine | None = None) -> dict[str, Any]:
    """Run one rebuild; returns the manifest (also written next to the output).

    ``cfg.engine``: ``local``, ``pool`` and ``spark`` run the same phase tasks in this process, on a process
    pool or on Spark; ``auto`` picks (:func:`jobs.engines.schedulers.resolve_engine_name`); ``--incremental`` continues
    the store's own files with storelib.broker.dispatch.dispatch in this process.
    ``engine``: run the phase tasks on this engine instead (the caller owns it)."""
    what = _checked_what(cfg)
    say = Stage("rebuild", cfg.progress)
    t0 = time.time()
    zone = parse_zone(cfg.name_tz)  # a bad --tz stops here, before any work
    root = resolve(cfg.store, **cfg.fs_options)
    settings = load_settings(cfg, root)
    store = Store(root, settings)
    store.require_records("rebuild", one_log=True)
    layout_notes = cq_layout_notes(root, what, cfg.in_place)
    out = _destination(cfg, store, root)
    segs = store.commitlog.segments
    engine_name = engine.name if engine is not None else resolve_engine_name(
        cfg.engine, master=cfg.master if spark is None else "given", store_bytes=sum(x.file_size for x in segs),
        segments=len(segs))
    if cfg.incremental:
        engine_name = "local"
    say(f"store {store.uri}: {len(segs)} segment(s), broker {settings.version}.x settings, "
        f"engine {engine_name}{' (incremental)' if cfg.incremental else ''}")
    for f in store.commitlog.findings:
        say(f"note: {f}")
    staging = make_staging(cfg.in_place, root, out, engine_name)
    try:
        changed = None
        t_work = time.time()  # from here: work (a Spark session's start is moved out of it below)
        timer = "timer" in what
        what = tuple(w for w in what if w != "timer")  # what the dispatch writes
        if not what:  # --what timer alone: the walk for the manifest, no dispatch
            res = rebuild_target(store, version=settings.version)
            check_supported(res)
            er = EngineResult(res)
        elif cfg.incremental:
            er, changed = run_incremental(store, settings, staging, what, say, zone)
        else:  # every engine runs the same phase tasks (in this process, on a pool, on Spark)
            own = engine is None
            if own:
                engine = make_engine(engine_name, spark=spark, master=cfg.master, workers=cfg.workers,
                                     app_name="rmqstore-rebuild")
                t_work = time.time()
            say(f"engine: {engine.describe()}")
            try:
                er = run_tasks(engine, store, settings, staging, what, say, cfg.fs_options, cfg.partitions, zone,
                               cfg.split_bytes)
            finally:
                if own:
                    engine.close()
        _name_unread(store, root, er)
        if timer:
            er.files.update(rebuild_timer_store(store, settings, staging, say))
        elapsed = time.time() - t0
        work = time.time() - t_work
        manifest = _manifest(cfg, store, settings, engine_name, er, what, timer, layout_notes, elapsed, work)
        say("publishing")
        if cfg.in_place:
            dest = publish_in_place(root, staging, manifest, what, changed)
        else:
            assert out is not None
            dest = publish_tree(staging, out, manifest)
            if not (staging.local and out.local):
                drop_staging(staging)
        manifest["published"] = dest
        return manifest
    except BaseException:
        drop_staging(staging)
        raise


def _name_unread(store: Store, root: Location, er: EngineResult) -> None:
    """Commitlog bytes the rebuild dispatched nothing from though they are no record (random bytes, a
    segment overwritten), and segments it did not read that do not start with one: named on stderr."""
    from storelib.broker.settings.storeroot import unreadable_segments

    first = min((o.base for o in er.recovery.segments), default=None)
    name_unread("rebuild", [*er.recovery.findings, *er.findings, *unreadable_segments(root, first),
                            *(f for f in store.findings if f.kind == "commitlog_head_not_a_record")])


def _checked_what(cfg: RebuildConfig) -> tuple[str, ...]:
    """``--what`` and the destination options, refused with a clear message when they do not go together."""
    what = tuple(cfg.what)
    for w in what:
        if w not in WHAT:
            raise StoreError(None, None, "bad_value", f"--what must be among {','.join(WHAT)}, not {w!r}")
    if "timer" in what and cfg.in_place:
        raise StoreError(None, None, "unsupported", "--what timer writes into --out only (its bytes depend on "
                         "run-time timing; install them by hand after a look)")
    if cfg.in_place == bool(cfg.out):
        raise StoreError(None, None, "bad_value", "give exactly one of --out DIR and --in-place")
    return what


def _destination(cfg: RebuildConfig, store: Store, root: Location) -> Location | None:
    """Where the rebuild goes (None: in place, which needs a local store no live broker holds); an output
    directory is never inside the store nor something other than a rebuild's output."""
    out = None
    if cfg.in_place:
        if not store.local:
            raise StoreError(store.uri, None, "remote_store", "--in-place needs a local store")
        from storelib.format.markers import lock_state

        if lock_state(store.loc).held_by_other:
            raise StoreError("lock", None, "broker_running", "a live broker holds the store lock; stop it first")
    else:
        out = resolve(cfg.out, **cfg.fs_options)
        check_not_inside(out, root)
        check_dest(out)
    return out


def _manifest(cfg: RebuildConfig, store: Store, settings: BrokerSettings, engine_name: str, er: EngineResult,
              what: tuple[str, ...], timer: bool, layout_notes: list[str], elapsed: float, work: float
              ) -> dict[str, Any]:
    """The rebuild's manifest: source fingerprint, the settings that decided the bytes, counts, findings,
    timings and every output file's digest."""
    return {
        "tool": "rmqstore rebuild",
        "mode": "incremental" if cfg.incremental else "full",
        "engine": engine_name,
        "created_ms": int(time.time() * 1000),
        "source": store_fingerprint(store),
        "settings": {
            "broker_version": settings.version, "what": list(what) + (["timer"] if timer else []),
            "broker_line": settings.line.to_json() if settings.line else None,
            "mapped_file_size_commit_log": store.commitlog.segment_size,
            "mapped_file_size_consume_queue": int(settings.mapped_file_size_consume_queue),
            "max_hash_slot_num": int(settings.max_hash_slot_num), "max_index_num": int(settings.max_index_num),
            "message_delay_level": settings.message_delay_level,
            "message_index_enable": bool(settings.message_index_enable),
            "index_name_policy": f"first entry store time, yyyyMMddHHmmssSSS in {zone_name(parse_zone(cfg.name_tz))}, "
                                 "+1 ms to stay "
                                 "strictly increasing",
            "broker_conf": cfg.broker_conf,
        },
        "recovery": er.recovery.summary(),
        "counts": {"records": er.records, "cq_records": er.cq_records, "queues": er.queues,
                   "index_keys": er.index_keys,
                   "cq_files": sum(1 for r in er.files if r.startswith("consumequeue/")),
                   "index_files": sum(1 for r in er.files if r.startswith("index/"))},
        "findings": [str(f) for f in er.findings] + layout_notes,
        "skipped_topics": [f.extra for f in er.findings if f.kind == "unsafe_topic_name"],
        "elapsed_s": round(elapsed, 3),
        "startup_s": round(elapsed - work, 3),  # settings, store, planning, Spark session
        "work_s": round(work, 3),  # walk, dispatch, writing and hashing the outputs
        "files": er.files,
    }


def _line_why(line: dict[str, Any] | None) -> str:
    """`` from broker.conf``-style note on where the broker line came from."""
    return f", from {line['source']}" if line else ""


def summary_text(m: dict[str, Any]) -> str:
    """The one-screen summary printed at the end."""
    c, r = m["counts"], m["recovery"]
    el = m.get("work_s") or m["elapsed_s"] or 1e-9
    lines = [
        f"rmqstore rebuild ({m['mode']}, engine {m['engine']}, broker {m['settings']['broker_version']}.x"
        f"{_line_why(m['settings'].get('broker_line'))})",
        f"  source          {m['source']['uri']} ({len(m['source']['segments'])} segment(s))",
        f"  recovery        {r['mode']}, window from {r['window_start']} ({r['start_reason']})",
        f"  valid end       processOffset {r['process_offset']}"
        + (f"; stopped by {r['failure']['reason']} in {r['failure']['segment']} @ {r['failure']['offset']}"
           if r["failure"] else ""),
        f"  records         {c['records']} dispatched ({c['records'] / el:,.0f} msg/s of work)",
        f"  consume queues  {c['queues']} queue(s), {c['cq_records']} entries, {c['cq_files']} file(s)",
        f"  index           {c['index_keys']} key(s), {c['index_files']} file(s)",
        *([f"  timer store     {sum(1 for r in m['files'] if r.startswith('timerlog/'))} timerlog file(s), "
           "timerwheel, config/timercheck (every timer record enqueued, reading resumes after the last)"] if "timer" in m["settings"]["what"] else []),
        f"  output          {m['published']} (manifest {MANIFEST_NAME})",
        f"  elapsed         {m['elapsed_s']:.2f} s"
        + (f" (start-up {m['startup_s']:.2f} s, work {m['work_s']:.2f} s)" if "work_s" in m else ""),
    ]
    if m.get("backup"):
        lines.append(f"  backup          {m['backup']}")
    for f in m["findings"][:5]:
        lines.append(f"  finding         {f}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE", help="store root: local path or URI (s3://bucket/prefix, ...)")
    p.add_argument("--out", metavar="DIR", help="output directory (local path or URI); published atomically")
    p.add_argument("--in-place", action="store_true",
                   help="replace the store's own files (after moving them into rebuild-backup-<time>/)")
    p.add_argument("--what", default="consumequeue,index",
                   help="consumequeue,index (default both); timer: the 5.x timerlog and wheel for the pending timer "
                        "messages (--out only)")
    from jobs.common import add_fs_args, add_settings_args

    add_settings_args(p)
    add_engine_args(p, "dispatch")
    p.add_argument("--incremental", action="store_true",
                   help="only dispatch what the store's consume queues lack (continues the last files)")
    p.add_argument("--partitions", type=int, help="spark engine: consume-queue partitions")
    p.add_argument("--tz", default=LOCAL, metavar="ZONE",
                   help="the broker JVM's time zone, in which it names index files (default: this host's, as a JVM "
                        "here would; e.g. Asia/Shanghai, UTC, +08:00)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON instead of the summary")
    add_fs_args(p)


def config_from_args(args: argparse.Namespace) -> RebuildConfig:
    from jobs.common import fs_options, overrides

    return RebuildConfig(store=args.store, out=args.out, what=tuple(w.strip() for w in args.what.split(",") if w.strip()),
                         broker_conf=args.broker_conf, broker_version=args.broker_version, overrides=overrides(args),
                         engine=args.engine or "auto", workers=args.workers,
                         master=args.master, in_place=args.in_place, incremental=args.incremental,
                         partitions=args.partitions, fs_options=fs_options(args), progress=not args.quiet,
                         name_tz=args.tz)


def run_args(args: argparse.Namespace) -> int:
    import json

    m = rebuild(config_from_args(args))
    if args.json:
        print(json.dumps({k: v for k, v in m.items() if k != "files"}, indent=2, ensure_ascii=False))
    else:
        print(summary_text(m))
    return 1 if m.get("skipped_topics") else 0  # exit 1: rebuilt, but some topic could not be a directory


def main(argv: list[str] | None = None) -> int:
    """spark-submit jobs/rebuild.py ...: the ``rmqstore rebuild`` command."""
    from jobs.cli import main as cli_main

    return cli_main(["rebuild", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from jobs.rebuild import main as _main  # functions pickle by reference to the importable module

    sys.exit(_main())
