"""The audit's judgement of a store a broker is writing (a live cut: :mod:`storelib.broker.settings.livecut`).

The readers are held to the run's cut, so nothing the broker writes after it is looked at. What is left
to judge differently is what a running broker always shows and a stopped one does not:

* records the reput thread has not dispatched yet: each queue's missing suffix and the keys not indexed
  yet are dispatch lag, one ``dispatch_lag`` finding (info; a warning over ``--max-lag`` bytes), not
  per-queue warnings;
* the lock held and the abort file are the running broker's own markers: the report's ``live`` block
  says so (``live store (pid N): read up to a cut at offset X taken at T``), no finding does;
* segments the cleaner deletes while the run reads them: "expired during the run" (info, once), and
  the store's first offset moves past them for the cross-file checks.

A store at rest is judged exactly as before: none of this applies.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from storelib.checks.index import key_missing_segment
from storelib.checks.segment import SegmentResult, SegmentTask
from storelib.errors import Finding

if TYPE_CHECKING:
    from storelib.broker.settings.livecut import StoreCut
    from storelib.broker.settings.store import Store

DEFAULT_MAX_LAG = 256 << 20  # bytes of dispatch lag a live store may show before it is a warning


def expect_stopped_finding(cut: StoreCut) -> Finding:
    """``--expect-stopped`` (the check before a recovery) on a store a broker runs: an error."""
    return Finding("broker_not_stopped", "error", "lock", 0,
                   f"--expect-stopped, but a broker runs this store: {cut.describe()} ({cut.broker.evidence}); "
                   "stop it before recovering the store (recover --apply refuses while it holds the lock)",
                   {"pid": cut.broker.pid})


# findings a running broker always gives: its markers (the report's live block says it runs)
MARKER_KINDS = frozenset({"broker_running", "abort_present", "index_deleted_on_abnormal_start"})
LAG_KINDS = frozenset({"queue_behind_commitlog", "index_behind_commitlog"})
# a running DLedger node's progress, not damage: its checkpoint is written every checkPointInterval (3 s,
# DLedgerMmapFileStore.FlushDataService), so the committed index read from it trails the entries (and the
# queues the reput filled from the in-memory committed position); a fresh node has none for its first 3 s
DLEDGER_PROGRESS = {
    "dledger_uncommitted_entries": "a running node: DLedger's checkpoint trails its committed index by up to 3 s",
    "cq_past_committed_position": "a running node: the reput follows the committed index in memory, which DLedger's "
                                  "checkpoint trails by up to 3 s",
    "dledger_checkpoint_missing": "a running node writes its first checkpoint 3 s after its start, and rewrites it "
                                  "by delete and rename (IOUtils.string2File)",
}


# findings about records the cleaner may have taken (with their consume-queue and index files) while the
# checks ran, and where their extra says the record's position
EXPIRABLE = {"cq_file_missing": "last_phy", "index_key_missing": "phy", "index_reput_skipped": "phy",
             "cq_reput_skipped": "last_phy"}
# of those, the kinds filed under their records' commitlog segment (commitlog/<base>): a capped summary of them
# is about that segment's records (a skip warning: the reput-skipped records of that segment, or from it)
BY_SEGMENT = frozenset({"index_key_missing", "index_reput_skipped", "cq_reput_skipped"})


def expired_count(f: Finding, first_now: int, segment_size: int) -> int:
    """How many of the findings ``f`` stands for are about records below ``first_now`` (the commitlog's first
    offset now): a listed one by its record's position (EXPIRABLE); the summary of a kind's findings past the
    cap (:meth:`storelib.checks.segment.Capped.done`: "N more ... in this file", no position) by the file they
    share, which for index_key_missing and the reput-skip warnings is the commitlog segment of their (first) records
    (:func:`storelib.checks.index.key_missing_segment`): all N when that segment is wholly below it, else 0."""
    ex = f.extra or {}
    if "more" in ex:
        base = key_missing_segment(f.file) if f.kind in BY_SEGMENT else None
        return int(ex["more"]) if base is not None and base + segment_size <= first_now else 0
    at = ex.get(EXPIRABLE.get(f.kind, ""))
    return 1 if at is not None and int(at) < first_now else 0


def judge_live(findings: list[Finding], store: Store, max_lag: int | None = None) -> list[Finding]:
    """``findings`` of a run on a live store as the module docstring says (unchanged without a live cut).

    A finding about a record whose segment is gone by now (the cleaner deleted it, then the consume-queue or
    index file pointing into it, while the checks ran) is about expired data: dropped, with one note."""
    cut = store.cut
    if cut is None or not cut.live:
        return findings
    out: list[Finding] = []
    msgs = nbytes = queues = keys = expired = 0
    first_now = _first_offset_now(store) if any(f.kind in EXPIRABLE for f in findings) else None
    for f in findings:
        if f.kind in MARKER_KINDS:
            continue
        gone = expired_count(f, first_now, store.commitlog.segment_size) if first_now is not None else 0
        if gone:
            expired += gone
            continue
        if f.kind == "queue_behind_commitlog":
            ex = f.extra or {}
            msgs += int(ex.get("count", 0))
            nbytes += int(ex.get("bytes", 0))
            queues += 1
            continue
        if f.kind == "index_behind_commitlog":
            keys += int((f.extra or {}).get("count", 0))
            continue
        if f.kind in DLEDGER_PROGRESS and f.severity != "info":  # the store's own copy (its commitlog's findings)
            f = dledger_progress([f])[0]
        out.append(f)
    if expired:
        out.append(Finding("expired_during_run", "info", "commitlog", None,
                           f"{expired} consume-queue or index finding(s) about records below the commitlog's first "
                           f"offset now ({first_now}): the cleaner deleted them during the run", {"count": expired}))
    if msgs or keys:
        over = max_lag is not None and nbytes > max_lag
        what = [f"{msgs} message(s) ({nbytes} bytes) in {queues} queue(s) not in their consume queue yet"] if msgs else []
        if keys:
            what.append(f"{keys} key(s) not indexed yet")
        out.append(Finding("dispatch_lag", "warning" if over else "info", "consumequeue", None,
                           "written before the cut but not dispatched yet (the broker's reput thread follows the "
                           "commitlog): " + "; ".join(what)
                           + (f": more than --max-lag {max_lag} bytes behind" if over else ""),
                           {"messages": msgs, "bytes": nbytes, "queues": queues, "keys": keys, "max_lag": max_lag}))
    return out


def dledger_progress(findings: list[Finding]) -> list[Finding]:
    """A running DLedger node's findings: its checkpoint's lag behind the entries is progress (info, with why)."""
    return [replace(f, severity="info", detail=f"{f.detail} ({DLEDGER_PROGRESS[f.kind]})") if f.kind in
            DLEDGER_PROGRESS else f for f in findings]


def cut_tasks(store: Store, tasks: list[SegmentTask], read_rate: float | None = None,
              read_share: str | None = None) -> list[SegmentTask]:
    """The tasks of a live store read as at its cut (:meth:`Store.take_cut`): each stops at the cut's end in
    its file, reads by ranged reads, and the cold segments (before the one being written) give the page
    cache back what they brought in; ``read_rate``: bytes a second for each task, or for all of them
    together through the budget file ``read_share`` (:class:`storelib.fileio.pagecare.ReadPacer`). At
    rest: ``tasks``."""
    if not store.live and read_rate is None:
        return tasks
    cl = store.commitlog
    by_name = {s.name: s for s in cl.segments}
    end = cl.cut_end
    out = []
    for t in tasks:
        seg = by_name.get(t.name)
        lim = cl.limit_of(seg) if seg is not None else None
        cold = end is not None and seg is not None and seg.base + seg.file_size < end
        out.append(replace(t, limit=lim, live=store.live, page_care=bool(cold and store.live), read_rate=read_rate,
                           read_share=read_share))
    return out


def _first_offset_now(store: Store) -> int:
    """The commitlog's first offset as listed now (the cleaner may have moved it since the cut)."""
    from storelib.broker.settings.store import open_commitlog

    return open_commitlog(store.loc, store.settings).min_offset


def segment_gone(store: Store, seg: Any) -> bool:
    """Has the cleaner of a live store deleted this segment (of the run's listing) since?"""
    return store.live and seg.loc.local and not os.path.exists(seg.path)


def drop_expired(store: Store, results: list[SegmentResult]) -> tuple[list[SegmentResult], list[str]]:
    """Segments of a live store the cleaner deleted during the run (a task found its file gone, or it is
    gone now), with every segment before them: the cleaner deletes oldest first, and the consume-queue
    and index files pointing into them go next, so the cross-file checks treat them as expired. They
    leave ``results`` and the store's commitlog listing; one info finding names them (said once)."""
    if not store.live:
        return results, []
    cl = store.commitlog
    gone = [r.base for r in results if r.end_kind == "expired"]
    gone += [s.base for s in cl.segments if segment_gone(store, s)]
    if not gone:
        return results, []
    upto = max(gone)
    names = [s.name for s in cl.segments if s.base <= upto]
    cl.segments = [s for s in cl.segments if s.base > upto]
    who = "DLedger's cleaner" if store.dledger is not None else "the broker's cleaner"
    store.findings.append(Finding(
        "expired_during_run", "info", cl.folder, None,
        f"{len(names)} segment(s) deleted by {who} while this run read the store "
        f"({names[0]}{' .. ' + names[-1] if len(names) > 1 else ''}): they expired during the run; the "
        "checks start after them", {"segments": names}))
    return [r for r in results if r.base > upto], names


__all__ = ["DEFAULT_MAX_LAG", "DLEDGER_PROGRESS", "cut_tasks", "dledger_progress", "LAG_KINDS", "MARKER_KINDS", "drop_expired", "expect_stopped_finding", "expired_count", "judge_live", "segment_gone"]
