"""A store at a glance (``rmqstore info``): its segments and where each scan ends, every queue with its
consume-queue offsets and, after one commitlog scan, its messages, the checkpoint, the markers, the index
files' headers, the config files and the 5.x timer store, with every finding on the way. Plain data; the
command prints it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from storelib.broker.settings.batchcq import batch_load_failures
from storelib.broker.settings.cqload import LoadedQueue, min_variant
from storelib.broker.settings.geometry import fold_geometry_findings
from storelib.broker.settings.store import Store
from storelib.broker.settings.storeloads import judge_index, store_load_findings, without_timer_reader_sizes
from storelib.broker.settings.strayload import judge_queue, version_of
from storelib.errors import Finding, StoreError
from storelib.format.checkpoint import as_broker_reads, read_checkpoint_as_broker
from storelib.format.configjson import consumer_offsets, load_config
from storelib.format.consumequeue import batch_cq_topics, list_queues
from storelib.format.indexdir import list_index_files
from storelib.format.markers import abort_state, lock_state, what_broker_does

CONFIG_FILES = ["topics.json", "consumerOffset.json", "subscriptionGroup.json", "delayOffset.json"]
OnSegment = Callable[[int, int], None] | None


class _LedgerStats:
    """What one scan of a DLedger store's entries tells about its ledger (first/last entry, the committed
    entry's end, the entries past the committed index)."""

    def __init__(self, committed: int | None):
        self.committed = committed
        self.first: int | None = None
        self.last: tuple[int, int, int] | None = None  # index, term, end position of the last entry
        self.committed_end: int | None = None
        self.unc_entries = self.unc_bytes = 0
        self.unc_first_phy: int | None = None
        self.unc_queues: dict[str, int] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows and batch.column("dledger_index").null_count:  # a mixed store's old log: no entries
            batch = batch.filter(batch.column("dledger_index").is_valid())
        if not batch.num_rows:
            return
        idx = batch.column("dledger_index").to_numpy()
        end = batch.column("dledger_pos").to_numpy() + 48 + batch.column("size").to_numpy()
        if self.first is None:
            self.first = int(idx[0])
        self.last = (int(idx[-1]), int(batch.column("dledger_term")[-1].as_py()), int(end[-1]))
        if self.committed is None:
            return
        hit = idx == self.committed
        if hit.any():
            self.committed_end = int(end[hit][0])
        unc = idx > self.committed
        if unc.any():
            self.unc_entries += int(unc.sum())
            self.unc_bytes += int((end[unc] - batch.column("dledger_pos").to_numpy()[unc]).sum())
            if self.unc_first_phy is None:
                self.unc_first_phy = int(batch.column("phy_offset").to_numpy()[unc][0])
            t = pa.Table.from_batches([batch.filter(pa.array(unc))]).group_by(["topic", "queue_id"]).aggregate(
                [("size", "count")])
            for r in t.to_pylist():
                k = f"{r['topic']}:{r['queue_id']}"
                self.unc_queues[k] = self.unc_queues.get(k, 0) + r["size_count"]


def _queue_stats(store: Store, on_segment: OnSegment, ledger: _LedgerStats | None = None) -> tuple[dict, list[dict]]:
    """Per (topic, queue) message stats from one commitlog scan, plus per-segment results."""
    acc: dict[tuple[str, int], list[int]] = {}
    ends: list = []
    cols = ["topic", "queue_id", "queue_offset", "store_timestamp", "size", "tran_type"]
    scan_cols = cols + (["phy_offset", "dledger_index", "dledger_term", "dledger_pos"] if ledger is not None else [])
    records = 0
    for batch in store.scan(verify_crc=False, with_properties=False, columns=scan_cols, ends=ends):
        records += batch.num_rows
        if ledger is not None:
            ledger.add(batch)
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
    findings: list[Finding] = [*cl.findings, *store.findings, *store_load_findings(store.loc, store.settings)]
    out: dict[str, Any] = {"store": store.uri, "local": store.local}
    line = store.settings.line
    out["broker_line"] = line.to_json() if line else None
    if line and line.conflict:
        findings.append(Finding("broker_line_conflict", "warning", None, None, line.conflict))
    out["segment_size"] = cl.segment_size
    old = store.old_commitlog  # a mixed store's default-mode segments, listed first (storelib.broker.settings.mixedlog)
    out["segments"] = [{"name": f"commitlog/{s.name}", "base": s.base, "size": s.file_size, "mtime_ms": s.mtime_ms,
                        "old_log": True} for s in (old.segments if old is not None else [])]
    out["segments"] += [{"name": s.name, "base": s.base, "size": s.file_size, "mtime_ms": s.mtime_ms} for s in cl.segments]
    stats: dict = {}
    st = store.dledger_state
    ledger = _LedgerStats(st.committed_index if st is not None else None) if store.dledger is not None else None
    if scan:
        stats, ends = _queue_stats(store, on_segment, ledger)
        rows = {d["name"]: d for d in out["segments"]}
        for e in ends:  # each scanned segment's end, by its file (a mixed store's old segments: commitlog/<name>)
            d = rows.get(e["file"]) or rows.get(e["file"].rsplit("/", 1)[-1])
            if d is not None:
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
    out["live"] = store.cut.to_dict() if store.cut is not None else None
    try:  # as the broker reads it: a short file's missing bytes are zeros (and a warning says so)
        cp, short = (as_broker_reads(store.cut.checkpoint, store.path("checkpoint").path) if store.live
                     else read_checkpoint_as_broker(store.loc))
        if short is not None and short.kind == "checkpoint_missing":
            raise StoreError(short.file, None, "missing", "no checkpoint file")
        out["checkpoint"] = dict(cp.__dict__)
        if short is not None:
            findings.append(short)
    except StoreError as e:
        out["checkpoint"] = None
        findings.append(Finding(e.kind, "warning", e.file, e.offset, e.detail))
    ab = abort_state(store.loc)
    if ab.unusual:
        findings.append(Finding("abort_unusual", "warning", store.path("abort").path, None, ab.unusual))
    meaning = what_broker_does(ab) if store.dledger is None else dledger_restart(store.settings.version, ab.exists)
    out["abort"] = {"exists": ab.exists, "pid": ab.pid, "meaning": meaning}
    if store.dledger is not None:
        out["dledger"] = dledger_summary(store, ledger if scan else None, findings)
    lk = lock_state(store.loc)
    out["lock"] = {"exists": lk.exists, "held_by_other": lk.held_by_other, "detail": lk.detail}
    out["timer_store"] = _timer_summary(store, findings)
    out["index_files"] = _index_rows(store, findings)
    out["config"] = _config_summary(store, findings)
    out["findings"] = [f.to_dict() for f in fold_geometry_findings(findings)]
    return out



def dledger_restart(version: str, abnormal: bool) -> str:
    """What a start-up does to a DLedger-mode store (DLedgerCommitLog.recover; /work/notes/dledger.md §6)."""
    if not abnormal:
        return ("no abort file: a clean exit; DLedger recovers its data and index files and reads its checkpoint, "
                "and the consume queues are cut only where they point past the data's end")
    if version == "4":
        return ("abort file present: the last exit was abnormal; 4.9.8's DLedgerCommitLog recovers exactly as after a "
                "clean exit (DLedger's own recovery, no message re-scan or re-dispatch), but IndexService.load first "
                "deletes index files newer than the checkpoint's indexMsgTimestamp and they are not rebuilt")
    return ("abort file present: the last exit was abnormal; 5.3.3's DLedgerCommitLog re-walks the messages from the "
            "newest data file older than the checkpoint, re-dispatching them, and truncates the consume queues at "
            "its processOffset; IndexService.load first deletes index files newer than indexMsgTimestamp")


def dledger_summary(store: Store, ledger: _LedgerStats | None, findings: list[Finding]) -> dict[str, Any]:
    """The ledger at a glance: DLedger's state files, the entries' first and last index, the committed index
    and position a load() ends with, the broker's max offset, and what is on disk but not committed."""
    d, st = store.dledger, store.dledger_state
    assert d is not None and st is not None
    findings.extend(st.findings)
    out: dict[str, Any] = {**d.to_json(), **st.to_json()}
    out.pop("findings", None)
    if st.currterm is not None:
        out["term"], out["voted_for"] = st.currterm.curr_term, st.currterm.vote_leader
    if ledger is None or ledger.last is None:
        return out
    begin, (end, end_term, write_pos) = ledger.first, ledger.last
    cp = st.committed_index
    committed = None if cp is None else (-1 if cp < begin else min(cp, end))
    committed_pos = -1 if committed is None or committed < 0 else (write_pos if committed == end else ledger.committed_end)
    min_offset = store.commitlog.min_offset
    out.update({"ledger_begin_index": begin, "ledger_end_index": end, "ledger_end_term": end_term,
                "entries": end - begin + 1, "write_pos": write_pos, "committed_index_after_load": committed,
                "committed_pos": committed_pos,
                "broker_max_offset": committed_pos if committed_pos and committed_pos > 0 else (min_offset if min_offset > 0 else 0)})
    if committed is not None and committed < end:
        unc = {"entries": ledger.unc_entries, "bytes": ledger.unc_bytes, "from_index": committed + 1, "to_index": end,
               "from_phy_offset": ledger.unc_first_phy, "end_pos": write_pos, "queues": ledger.unc_queues}
        out["uncommitted"] = unc
        findings.append(Finding(
            "dledger_uncommitted_entries", "warning", f"{d.dir}/checkpoint", None,
            f"{unc['entries']} entries (index {committed + 1}..{end}, {unc['bytes']} bytes from physical offset "
            f"{ledger.unc_first_phy}) are on disk past DLedger's committed index {committed}: after load() the broker's "
            f"max offset is {out['broker_max_offset']}, not {write_pos}; consumers see them only once DLedger commits "
            "them again", {"committed_index": committed, "ledger_end_index": end}))
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
                                f"{len(batch)} topic(s) keep 5.x BatchConsumeQueue files, which rmqstore neither "
                                "lists nor writes (a 5.3.3 start loads, recovers and may truncate them: recover "
                                f"--plan models that): {', '.join(sorted(batch)[:5])}"))
    if str(store.settings.version).startswith("5"):  # queueTypeShouldBe, a batch file of the wrong length
        findings.extend(batch_load_failures(store.loc, store.settings.mapper_file_size_batch_consume_queue,
                                            {t for t, _, _ in listed}))
    for topic, qid, loc in listed:
        cq = LoadedQueue(loc, segment_size=store.settings.mapped_file_size_consume_queue, topic=topic, queue_id=qid,
                         phy_limit=cl.cut_end)
        try:
            judge_queue(cq, version_of(store.settings.version))
            findings.extend(cq.findings)
            q = {"topic": topic, "queue_id": qid, "cq_min_offset": cq.min_offset(
                     cl.min_offset, variant=min_variant(store.settings.version)) if cq.segments else 0,
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
    idx, gone = [], []
    refs = list_index_files(store.loc, findings)
    judge_index(findings, [r.name for r in refs], version_of(store.settings.version))
    for ref in store.cut.index_refs(refs) if store.cut is not None else refs:
        note = ref.size_finding(geom)
        if note is not None:
            findings.append(note)
        try:
            f = ref.open(geom, strict=False, broker_size=True)
        except StoreError as e:
            if not (store.live and store.loc.fs.get_file_info(ref.loc.path).type.name == "NotFound"):
                findings.append(Finding(e.kind, "error", e.file, e.offset, e.detail))
            else:  # (on a live store: deleted by the cleaner since the listing)
                gone.append(ref.name)
            continue
        h = f.header
        idx.append({"name": ref.name, "entries": f.entry_count, "begin_ms": h.begin_timestamp,
                    "end_ms": h.end_timestamp, "begin_phy": h.begin_phy_offset, "end_phy": h.end_phy_offset})
        f.close()
    if gone:  # said once
        findings.append(Finding("expired_during_run", "info", "index", None,
                                f"{len(gone)} index file(s) deleted by the broker's cleaner after this run listed them "
                                f"(first: {gone[0]}): they expired during the run", {"files": gone}))
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
    findings.extend(without_timer_reader_sizes(log.findings, store.settings))
    pending, mf = read_timer_metrics(store.loc)
    findings.extend(mf)
    return {"timerlog_files": len(log.files), "timerlog_units": log.units.num_rows, "pending_by_topic": pending}


__all__ = ["CONFIG_FILES", "collect"]
