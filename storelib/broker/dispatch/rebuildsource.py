"""The rebuild's rules about its source store: what identifies it (for the manifest), the consume-queue
layouts a rebuild cannot reproduce, the incremental dispatch that continues the store's own files, and the
5.x timer store rebuilt from the timer records. The jobs schedule and report; these decide."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Callable
from datetime import tzinfo
from typing import Any

from storelib.broker.dispatch.dispatch import dispatch_store
from storelib.broker.dispatch.rebuildtasks import EngineResult, check_supported
from storelib.broker.recovery.walk import recovery_walk, store_inputs
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.errors import StoreError
from storelib.fileio.bytesource import Location
from storelib.fileio.memory import keep_freed_memory
from storelib.fileio.publish import tree_files
from storelib.fileio.staging import hash_tree
from storelib.format.checkpoint import read_checkpoint
from storelib.format.indexdir import list_index_files
from storelib.format.topicname import escape_topic


def store_fingerprint(store: Store) -> dict[str, Any]:
    """What identifies the source: each segment's name, size, mtime and sha256 of its first 64 KiB, the
    checkpoint bytes; plus a digest over all of it."""
    segs = []
    for s in store.commitlog.segments:
        with s.open() as src:
            head = bytes(src.read(0, min(65536, s.file_size))) if s.file_size else b""
        segs.append({"name": s.name, "size": s.file_size, "mtime_ms": s.mtime_ms,
                     "head_sha256": hashlib.sha256(head).hexdigest()})
    cp = None
    with contextlib.suppress(StoreError, OSError):
        c = read_checkpoint(store.loc, strict=False)
        cp = c.__dict__
    digest = hashlib.sha256(repr((segs, cp)).encode()).hexdigest()
    return {"uri": store.uri, "segments": segs, "checkpoint": cp, "digest": digest}


def cq_layout_notes(root: Location, what: tuple[str, ...], in_place: bool) -> list[str]:
    """What the source's ConsumeQueue layout means for a rebuild: the rebuilt files are the file-based
    layout a default store has. In place that would sit beside (or over) a 5.x RocksDB CQ database or a
    BatchConsumeQueue topic the broker reads instead, or drop the light message queues (``%LMQ%``) of a
    multi-dispatch broker: refused."""
    from storelib.format.consumequeue import batch_cq_topics, is_rocksdb_consumequeue, lmq_queues

    if "consumequeue" not in what:
        return []
    notes = []
    if is_rocksdb_consumequeue(root):
        notes.append("[warning] consumequeue: the source keeps its consume queues in RocksDB (storeType=defaultRocksDB); "
                     "the rebuilt consumequeue/ is the file-based layout (storeType=default)")
    batch = batch_cq_topics(root)
    if batch:
        notes.append(f"[warning] batchconsumequeue: topic(s) {', '.join(escape_topic(t) for t in sorted(batch))} use "
                     "5.x BatchConsumeQueue files, which rmqstore does not write; their rebuilt consume queues are "
                     "the file-based layout")
    lmq = lmq_queues(root)
    if lmq:
        notes.append(f"[warning] consumequeue: {lmq} hold the broker's multi-dispatch copies, which the rebuild "
                     "does not write (enableMultiDispatch)")
    if notes and in_place:
        raise StoreError("consumequeue", None, "unsupported_layout",
                         "; ".join(n.split(": ", 1)[1] for n in notes) + ": --in-place would leave the broker "
                         "consume queues other than its own; rebuild into --out, or --what index")
    return notes


def _seed_incremental(root: Location, staging: Location, settings: BrokerSettings, what: tuple[str, ...]
                      ) -> dict[str, tuple[int, int]]:
    """Hard-link (or copy) the files an incremental dispatch continues into staging: the last three
    segments of each queue (enough for the broker's CQ recovery) and the last index file. Writers
    replace files (temp + rename), so a link never lets them modify the source. Returns the seeded
    files' (device, inode) to tell unchanged ones apart afterwards."""
    from storelib.format.consumequeue import ConsumeQueue, list_queues

    seeded: dict[str, tuple[int, int]] = {}

    def link(src: str, rel: str) -> None:
        dst = os.path.join(staging.path, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        st = os.stat(dst)
        seeded[rel] = (st.st_dev, st.st_ino)

    cq_size = int(settings.mapped_file_size_consume_queue)
    for topic, qid, loc in list_queues(root):
        with ConsumeQueue(loc, segment_size=cq_size, topic=topic, queue_id=qid) as cq:
            for seg in cq.segments[-3:]:
                link(seg.path, f"consumequeue/{topic}/{os.path.basename(loc.path)}/{seg.name}")
    if "index" in what:
        refs = list_index_files(root)
        if refs:
            link(refs[-1].loc.path, f"index/{refs[-1].name}")
    return seeded


def run_incremental(store: Store, settings: BrokerSettings, staging: Location, what: tuple[str, ...],
                    say: Callable[[str], None], name_tz: str | tzinfo = "UTC") -> tuple[EngineResult, list[str]]:
    if not store.local:
        raise StoreError(store.uri, None, "unsupported", "--incremental needs a local store")
    keep_freed_memory()
    inputs = store_inputs(store, version=settings.version, last_exit_ok=True)
    res = recovery_walk(store, inputs)
    check_supported(res)
    if inputs.cq_max_phy_offset > res.process_offset:
        raise StoreError("consumequeue", None, "cq_ahead",
                         f"consume queues reach physical offset {inputs.cq_max_phy_offset}, past the valid commitlog "
                         f"end {res.process_offset}: the broker would truncate them; run a full rebuild")
    say(f"incremental: consume queues end at {inputs.cq_max_phy_offset}, commitlog at {res.process_offset}")
    seeded = _seed_incremental(store.loc, staging, settings, what)
    d = dispatch_store(store.loc, settings, from_offset=None, to_offset=res.process_offset, out_root=staging,
                       what=what, name_tz=name_tz, commitlog=store.commitlog)
    if d.unsupported:
        raise StoreError("commitlog", None, "unsupported", "; ".join(str(f) for f in d.findings))
    changed = []
    for rel in tree_files(staging):
        p = os.path.join(staging.path, rel)
        st = os.stat(p)
        if seeded.get(rel) == (st.st_dev, st.st_ino):
            os.unlink(p)  # untouched: not part of the output
        else:
            changed.append(rel)
    for dirpath, _dirs, _ in sorted(os.walk(staging.path), reverse=True):  # drop empty seeded dirs
        if dirpath != staging.path and not os.listdir(dirpath):
            os.rmdir(dirpath)
    say(f"incremental: dispatched {d.records} records from {d.from_offset}; {len(changed)} file(s) changed")
    files = hash_tree(staging, changed)
    queues = len({tuple(r.split("/")[1:3]) for r in changed if r.startswith("consumequeue/")})
    return EngineResult(res, d.records, d.cq_records, queues, d.index_keys, files, list(d.findings)), changed


def rebuild_timer_store(store: Store, settings: BrokerSettings, staging: Location, say: Callable[[str], None]
                         ) -> dict[str, dict[str, Any]]:
    """``--what timer``: timerlog, wheel and timercheck for the timer records (storelib.broker.timer.timerrebuild)."""
    from storelib.broker.timer.timermsg import store_timers
    from storelib.broker.timer.timerrebuild import enqueue_units, rebuilt_checkpoint
    from storelib.format.timerstore import (
        precision_of,
        read_timer_checkpoint,
        timerlog_file_size,
        write_timer_store,
    )

    if not staging.local:
        raise StoreError(None, None, "unsupported", "--what timer writes to a local --out only")
    precision, file_size = precision_of(settings), timerlog_file_size(settings)
    units, slots = enqueue_units(store_timers(store), file_size, precision, settings.timer_roll_window_slot)
    cp = read_timer_checkpoint(store.loc) if store.exists("config", "timercheck") else None
    written = write_timer_store(staging.path, units, slots, rebuilt_checkpoint(cp, units, file_size),
                                file_size=file_size, precision_ms=precision)
    say(f"timer: {units.num_rows} pending timer(s) enqueued into {len([w for w in written if '/timerlog/' in w])} "
        f"timerlog file(s), {slots.num_rows} wheel slot(s)")
    return hash_tree(staging, [os.path.relpath(w, staging.path).replace(os.sep, "/") for w in written])


__all__ = ["cq_layout_notes", "rebuild_timer_store", "run_incremental", "store_fingerprint"]
