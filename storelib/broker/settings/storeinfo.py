"""A store at a glance (``rmqstore info``): its segments and where each scan ends, every queue with its
consume-queue offsets and, after one commitlog scan, its messages, the checkpoint, the markers, the index
files' headers, the config files and the 5.x timer store, with every finding on the way. Plain data; the
command prints it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from storelib.broker.settings.cqload import LoadedQueue
from storelib.broker.settings.geometry import fold_geometry_findings
from storelib.broker.settings.store import Store
from storelib.errors import Finding, StoreError
from storelib.format.checkpoint import read_checkpoint
from storelib.format.configjson import consumer_offsets, load_config
from storelib.format.consumequeue import batch_cq_topics, list_queues
from storelib.format.indexdir import list_index_files
from storelib.format.markers import abort_state, lock_state, what_broker_does

CONFIG_FILES = ["topics.json", "consumerOffset.json", "subscriptionGroup.json", "delayOffset.json"]
OnSegment = Callable[[int, int], None] | None


def _queue_stats(store: Store, on_segment: OnSegment) -> tuple[dict, list[dict]]:
    """Per (topic, queue) message stats from one commitlog scan, plus per-segment results."""
    acc: dict[tuple[str, int], list[int]] = {}
    ends: list = []
    cols = ["topic", "queue_id", "queue_offset", "store_timestamp", "size", "tran_type"]
    records = 0
    for batch in store.scan(verify_crc=False, with_properties=False, columns=cols, ends=ends):
        records += batch.num_rows
        if on_segment is not None:
            on_segment(len(ends), records)
        t = pa.Table.from_batches([batch.select(cols)])
        g = t.group_by(["topic", "queue_id"]).aggregate([
            ("queue_offset", "min"), ("queue_offset", "max"), ("store_timestamp", "min"),
            ("store_timestamp", "max"), ("size", "sum"), ("size", "count")])
        for r in g.to_pylist():
            k = (r["topic"], r["queue_id"])
            a = acc.get(k)
            v = [r["size_count"], r["queue_offset_min"], r["queue_offset_max"], r["store_timestamp_min"],
                 r["store_timestamp_max"], r["size_sum"]]
            if a is None:
                acc[k] = v
            else:
                acc[k] = [a[0] + v[0], min(a[1], v[1]), max(a[2], v[2]), min(a[3], v[3]), max(a[4], v[4]), a[5] + v[5]]
    if on_segment is not None:
        on_segment(len(ends), records)
    return acc, [e.to_dict() for e in ends]


def collect(store: Store, scan: bool = True, on_segment: OnSegment = None) -> dict[str, Any]:
    """Everything ``rmqstore info`` reports, as plain data; ``on_segment(segments scanned, records)`` as the
    scan goes."""
    cl = store.commitlog
    findings: list[Finding] = [*cl.findings, *store.findings]
    out: dict[str, Any] = {"store": store.uri, "local": store.local}
    line = store.settings.line
    out["broker_line"] = line.to_json() if line else None
    if line and line.conflict:
        findings.append(Finding("broker_line_conflict", "warning", None, None, line.conflict))
    out["segment_size"] = cl.segment_size
    out["segments"] = [{"name": s.name, "base": s.base, "size": s.file_size, "mtime_ms": s.mtime_ms} for s in cl.segments]
    stats: dict = {}
    if scan:
        stats, ends = _queue_stats(store, on_segment)
        for seg, e in zip([s for s in cl.segments if s.file_size], ends):
            for d in out["segments"]:
                if d["name"] == seg.name:
                    d.update({"records": e["records"], "end": e["kind"], "end_offset": e["file_offset"],
                              "reason": e["reason"]})
            if e["kind"] == "invalid":
                findings.append(Finding(e["reason"] or "invalid_record", "error", e["file"], e["file_offset"],
                                        e["detail"] or ""))
        out["messages"] = sum(v[0] for v in stats.values())
        out["bytes"] = sum(v[5] for v in stats.values())
        ts = [v[3] for v in stats.values()] + [v[4] for v in stats.values()]
        out["first_store_ms"], out["last_store_ms"] = (min(ts), max(ts)) if ts else (None, None)
    out["queues"] = _queue_rows(store, stats, findings, out)
    try:
        cp = read_checkpoint(store.loc)
        out["checkpoint"] = dict(cp.__dict__)
    except StoreError as e:
        out["checkpoint"] = None
        findings.append(Finding(e.kind, "warning", e.file, e.offset, e.detail))
    ab = abort_state(store.loc)
    out["abort"] = {"exists": ab.exists, "pid": ab.pid, "meaning": what_broker_does(ab)}
    lk = lock_state(store.loc)
    out["lock"] = {"exists": lk.exists, "held_by_other": lk.held_by_other, "detail": lk.detail}
    out["timer_store"] = _timer_summary(store, findings)
    out["index_files"] = _index_rows(store, findings)
    out["config"] = _config_summary(store, findings)
    out["findings"] = [f.to_dict() for f in fold_geometry_findings(findings)]
    return out



def _queue_rows(store: Store, stats: dict, findings: list[Finding], out: dict[str, Any]) -> list[dict[str, Any]]:
    """Every queue with its CQ offsets and, after a scan, its messages; queues only the commitlog knows too
    (sets ``out``'s consume-queue layout and 5.x batch CQ topics)."""
    cl = store.commitlog
    queues = []
    cq_keys = set()
    try:
        listed = list_queues(store.loc, findings)
    except StoreError as e:
        if e.kind != "rocksdb_consumequeue":
            raise
        listed = []  # the queues are still listed from the commitlog below, without CQ offsets
        findings.append(Finding(e.kind, "warning", "consumequeue", None,
                                f"{e.detail}: rmqstore reads file-based consume queues only; the queues below "
                                "come from the commitlog"))
    out["consume_queue_layout"] = "rocksdb" if not listed and any(f.kind == "rocksdb_consumequeue" for f in findings) \
        else "file"
    batch = batch_cq_topics(store.loc)
    if batch:
        out["batch_consume_queue_topics"] = batch
        findings.append(Finding("batch_consume_queue", "warning", "batchconsumequeue", None,
                                f"{len(batch)} topic(s) keep 5.x BatchConsumeQueue files, which rmqstore does not "
                                f"read: {', '.join(sorted(batch)[:5])}"))
    for topic, qid, loc in listed:
        cq = LoadedQueue(loc, segment_size=store.settings.mapped_file_size_consume_queue, topic=topic, queue_id=qid)
        try:
            findings.extend(cq.findings)
            q = {"topic": topic, "queue_id": qid, "cq_min_offset": cq.min_offset(cl.min_offset) if cq.segments else 0,
                 "cq_max_offset": cq.max_offset() if cq.segments else 0}
        finally:
            cq.close()
        s = stats.get((topic, qid))
        if s:
            q.update({"messages": s[0], "min_queue_offset": s[1], "max_queue_offset": s[2]})
        cq_keys.add((topic, qid))
        queues.append(q)
    for (topic, qid), s in stats.items():
        if (topic, qid) not in cq_keys:
            queues.append({"topic": topic, "queue_id": qid, "cq_min_offset": None, "cq_max_offset": None,
                           "messages": s[0], "min_queue_offset": s[1], "max_queue_offset": s[2]})
    return sorted(queues, key=lambda q: (q["topic"], q["queue_id"]))


def _index_rows(store: Store, findings: list[Finding]) -> list[dict[str, Any]]:
    """Each index file's header: entries, time and offset span."""
    geom = store.settings.index_geometry
    idx = []
    for ref in list_index_files(store.loc, findings):
        note = ref.size_finding(geom)
        if note is not None:
            findings.append(note)
        try:
            f = ref.open(geom, strict=False, broker_size=True)
        except StoreError as e:
            findings.append(Finding(e.kind, "error", e.file, e.offset, e.detail))
            continue
        h = f.header
        idx.append({"name": ref.name, "entries": f.entry_count, "begin_ms": h.begin_timestamp,
                    "end_ms": h.end_timestamp, "begin_phy": h.begin_phy_offset, "end_phy": h.end_phy_offset})
        f.close()
    return idx


def _config_summary(store: Store, findings: list[Finding]) -> dict[str, Any]:
    """Per config file: where it was read from and how many topics, groups or entries it holds."""
    cfg = {}
    for name in CONFIG_FILES:
        ld = load_config(store.loc, name)
        findings.extend(ld.findings)
        if ld.source is None:
            continue
        d = ld.data or {}
        summary: dict[str, Any] = {"source": ld.source}
        if name == "topics.json":
            summary["topics"] = len(d.get("topicConfigTable") or {})
        elif name == "consumerOffset.json":
            offs = consumer_offsets(d)
            summary["entries"] = len(offs)
            summary["groups"] = len({g for _, g in offs})
        elif name == "subscriptionGroup.json":
            summary["groups"] = len(d.get("subscriptionGroupTable") or {})
        elif name == "delayOffset.json":
            summary["levels"] = len(d.get("offsetTable") or {})
        cfg[name] = summary
    return cfg


def _timer_summary(store: Store, findings: list[Finding]) -> dict | None:
    """The 5.x timer store at a glance (its own files only, no commitlog scan); None without one."""
    from storelib.format.timerstore import read_timer_metrics, read_timerlog

    if not store.exists("timerlog"):
        return None
    try:
        log = read_timerlog(store.loc, store.settings.mapped_file_size_timer_log)
    except StoreError as e:
        findings.append(Finding(e.kind, "error", e.file, e.offset, e.detail))
        return None
    findings.extend(log.findings)
    pending, mf = read_timer_metrics(store.loc)
    findings.extend(mf)
    return {"timerlog_files": len(log.files), "timerlog_units": log.units.num_rows, "pending_by_topic": pending}


__all__ = ["CONFIG_FILES", "collect"]
