"""The audit's incremental ``--since`` state: which segments to audit again, which earlier results to
carry forward or extend, and the state file the next run reads.

The state holds each segment's result summary and fingerprint, and the streamed cross-file checks'
carry (:func:`storelib.checks.crossstream.streamed_checks`): each queue's tail and the few messages not
dispatched yet, each consume queue's and index file's checked extent with a fingerprint, the keys not
indexed yet, the report's series, the timer topic's records. It grows with segments, queues and index
files, not with records. A run goes on from it when the store only grew: every segment it saw is
unchanged (size, mtime, head and tail bytes) or grew after its audited end, and the carry can settle
what was written since; anything else (a rewritten segment, damage, a changed consume-queue unit or index
entry) and the run audits the store in full and writes a fresh state.

Segments the broker's cleaner deleted since (the oldest ones: every segment gone lies before every
segment left) are dropped from the state, and with the partitioned checks' carry (``expire_ok``) the run
goes on: the carry drops what pointed into them (:mod:`storelib.checks.tasks.expire`), so the state
stays bounded by what the store holds.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from storelib.broker.settings.store import Store
from storelib.checks.livejudge import segment_gone
from storelib.checks.segment import SegmentResult, SegmentTask
from storelib.errors import StoreError
from storelib.scan.fingerprint import prefix_unchanged

STATE_SCHEMA = "rmqstore.audit-state/3"
OLD_SCHEMAS = ("rmqstore.audit-state/1", "rmqstore.audit-state/2")  # /1 kept record tables in a sidecar
# directory, /2 the driver's streamed carry and no record end per segment: read as no state


Say = Callable[[str], None] | None  # where the state's progress lines go (None: nowhere)


def load_state(path: str | None, say: Say = None) -> dict[str, Any]:
    """The state a previous run left in ``path`` ({} when there is none yet, or one of an older layout:
    everything is audited)."""
    if not path or not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            st = json.load(f)
    except (OSError, ValueError) as e:
        raise StoreError(path, None, "bad_state", f"cannot read the audit state file: {e}") from e
    if st.get("schema") in OLD_SCHEMAS:
        if say is not None:
            say(f"audit: {path} is an older state layout: auditing in full, then writing the new one")
        return {}
    if st.get("schema") != STATE_SCHEMA:
        raise StoreError(path, None, "bad_state", f"not an audit state file (schema {st.get('schema')!r})")
    return st


def save_state(path: str, store: Store, results: list[SegmentResult], fps: dict[str, dict],
               carry: dict | None) -> None:
    """Write the state file atomically (temp + rename); an older layout's sidecar directory goes."""
    from storelib.fileio.publish import atomic_local_file

    segs = {}
    for r in results:
        body = asdict(r)
        body.pop("records_ipc")
        body.pop("keys_ipc")
        segs[r.name] = {"name": r.name, "fingerprint": fps[r.name], "result": body}
    last = max((r.base + r.data_end for r in results), default=0)
    st = {"schema": STATE_SCHEMA, "store": store.uri, "written_at_ms": int(time.time() * 1000),
          "last_offset": last, "segments": segs, "carry": carry}
    with atomic_local_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(st, separators=(",", ":")))  # dumps: the C encoder (dump streams in Python)
    shutil.rmtree(path + ".d", ignore_errors=True)  # the tables an older layout kept


def merge_appended(old: SegmentResult, new: SegmentResult) -> SegmentResult:
    """An appended segment: the earlier part's result plus the new part's (counts and findings: the state
    keeps no records, and the cross-file checks read the new part's, ``new``, alone)."""
    keep = [f for f in old.findings if f["kind"] != "stale_bytes_after_end"]
    out = SegmentResult(new.name, new.base, new.file_size, old.start, new.end_kind, new.data_end,
                        old.records + new.records, old.bytes_valid + new.bytes_valid, old.crc_errors + new.crc_errors,
                        old.crc_bytes + new.crc_bytes, keep + new.findings, old.regions + new.regions)
    ts = [t for t in (old.first_ts, new.first_ts) if t is not None]
    out.first_ts = min(ts) if ts else None
    ts = [t for t in (old.last_ts, new.last_ts) if t is not None]
    out.last_ts = max(ts) if ts else None
    out.seconds = new.seconds
    out.rec_end = max(old.rec_end, new.rec_end)
    out.cq_ends = None if old.cq_ends is None or new.cq_ends is None else old.cq_ends + new.cq_ends
    out._parts = new._parts  # the new part's tables: what the cross-file tasks read of the segment
    return out


def plan(store: Store, state: dict, state_path: str | None, say: Say = None, expire_ok: bool = False
         ) -> tuple[list[SegmentTask], dict[str, SegmentResult], dict[str, SegmentResult], dict[str, dict], dict | None]:
    """Tasks to run, results carried forward, earlier results to merge appends into, fingerprints, and the
    carry to go on from (None: a full audit, every segment from its start). ``expire_ok``: the carry can
    drop segments the cleaner deleted since (the partitioned checks' can)."""
    cl = store.commitlog
    tasks: list[SegmentTask] = []
    carried: dict[str, SegmentResult] = {}
    partial: dict[str, SegmentResult] = {}
    fps: dict[str, dict] = {}
    prev = (state or {}).get("segments", {})
    last_old = max((e["result"]["base"] for e in prev.values()), default=-1)
    # the last segment an earlier run found data in: it (or an empty one after it, created ahead by the
    # broker's AllocateMappedFileService) is where the log grew since
    last_data = max((e["result"]["base"] for e in prev.values() if e["result"]["data_end"] > 0), default=-1)
    resumable = bool(state_path and (state or {}).get("carry"))
    prev, expired = _drop_expired(prev, cl, resumable and expire_ok)
    if expired is None:
        resumable = False  # segments gone, not only the oldest (deleted, rewritten): the carry no longer holds
    for seg in cl.segments:
        if seg.file_size == 0:
            continue
        old = prev.get(seg.name)
        start = 0
        if old and resumable:
            ofp = old["fingerprint"]
            data_end = old["result"]["data_end"]
            try:
                same = ofp.get("size") == seg.file_size and prefix_unchanged(seg, ofp, data_end)
            except StoreError:
                if not segment_gone(store, seg):
                    raise
                same = False  # deleted by the cleaner since the listing: its task finds it gone (expired)
            # (a live store's segment being written can take bytes within the millisecond of its mtime)
            growing = store.live and old["result"]["end_kind"] == "end_of_data"
            if same and ofp.get("mtime_ms") == seg.mtime_ms and not growing:
                res = SegmentResult(**old["result"])
                for f in res.findings:
                    f.setdefault("extra", {})["carried_forward"] = True
                carried[seg.name] = res
                fps[seg.name] = ofp
                continue
            if same and old["result"]["end_kind"] == "end_of_data" and seg.base >= last_data:
                start = data_end  # appended after the audited end: audit only the new part
                partial[seg.name] = SegmentResult(**old["result"])
            else:
                resumable = False  # an audited segment changed: the carry no longer holds
        elif old is None and resumable and seg.base < last_old:
            resumable = False
        tasks.append(SegmentTask(seg.name, seg.base, seg.loc.path if seg.loc.local else _uri(store, seg),
                                 seg.file_size, cl.segment_size, seg.loc.local, start))
    if not resumable:  # in full: every segment from its start
        tasks = [SegmentTask(seg.name, seg.base, seg.loc.path if seg.loc.local else _uri(store, seg), seg.file_size,
                             cl.segment_size, seg.loc.local, 0) for seg in cl.segments if seg.file_size]
        carried, partial, fps = {}, {}, {}
    if state_path and say is not None and expired and resumable:
        say(f"audit: {len(expired)} segment(s) of the state deleted since by the broker's cleaner "
            f"({expired[0]}{' .. ' + expired[-1] if len(expired) > 1 else ''}): dropped from it")
    if state_path and say is not None:
        say(f"audit: {len(tasks)} segment(s) to audit ({sum(1 for t in tasks if t.start)} appended), "
            f"{len(carried)} unchanged (findings carried forward)"
            + ("" if resumable or not state else "; the state cannot be continued: auditing in full"))
    return tasks, carried, partial, fps, (state["carry"] if resumable else None)


def _drop_expired(prev: dict[str, dict], cl, ok: bool) -> tuple[dict[str, dict], list[str] | None]:
    """The state's segments without those the cleaner deleted since, and their names (None: segments are
    gone that the cleaner did not take: not the oldest, or ``ok`` is False)."""
    listed = [seg.base for seg in cl.segments if seg.file_size]
    gone = sorted(n for n in prev if n not in {seg.name for seg in cl.segments if seg.file_size})
    if not gone:
        return prev, []
    first = min(listed, default=None)
    if not ok or any(first is not None and prev[n]["result"]["base"] >= first for n in gone):
        return prev, None
    return {n: e for n, e in prev.items() if n not in gone}, gone


def _uri(store: Store, seg) -> str:
    """A remote segment's URI (the tasks open it themselves, maybe on another host)."""
    u = store.uri.rstrip("/")
    return u + "/commitlog/" + seg.name if "://" in u else seg.loc.path

