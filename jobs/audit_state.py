"""The audit's incremental ``--since`` state: which segments to audit again, which earlier results to
carry forward or extend, and the state file (findings as JSON, record/key tables as Arrow files in a
sidecar directory) that the next run reads.

A segment whose size, mtime and audited prefix are unchanged is carried forward; one that only grew
after an ``end_of_data`` end is audited from that end and merged with its earlier result.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from typing import Any

import pyarrow as pa

from jobs.common import note
from jobs.fingerprint import prefix_unchanged
from storelib.broker.store import Store
from storelib.checks.segment import SegmentResult, SegmentTask
from storelib.errors import StoreError

STATE_SCHEMA = "rmqstore.audit-state/1"


def load_state(path: str | None) -> dict[str, Any]:
    """The state a previous run left in ``path`` ({} when there is none yet: everything is audited)."""
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


def merge_appended(old: SegmentResult, new: SegmentResult) -> SegmentResult:
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
        note(f"audit: {len(tasks)} segment(s) to audit ({sum(1 for t in tasks if t.start)} appended), "
             f"{len(carried)} unchanged (findings carried forward)", quiet)
    return tasks, carried, partial, fps


def _uri(store: Store, seg) -> str:
    """A remote segment's URI (the tasks open it themselves, maybe on another host)."""
    u = store.uri.rstrip("/")
    return u + "/commitlog/" + seg.name if "://" in u else seg.loc.path

