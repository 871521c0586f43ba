"""The audit's DLedger checks, as plain functions over plain inputs (a DLedger-mode store's start-up walk,
its queues' ends, the index files a start-up deletes), in words an operator can act on:

* the entry headers of each data file (magic, size, pos = the entry's offset, index contiguous, term never
  decreasing) and, across files, where DLedger's recovery ends the log (:func:`data_file_findings`,
  :func:`ledger_findings`);
* the index file against the entries: the first unit that differs from its entry, which the next start
  rewrites (:func:`data_file_findings`);
* the checkpoint against the entries: the committed index and position, the uncommitted entries
  (:func:`ledger_findings`);
* the message records inside the entries: a record's CRC and structure mean other things in DLedger mode
  (DLedger never checks them; the reput skips the rest of the file after a bad one; only 5.3.3's recovery
  after a crash stops there), so the per-segment findings are restated (:func:`restate_record_findings`);
* consume queues against the committed position and the data's end (:func:`queue_findings`);
* what a start-up deletes: index files newer than the store checkpoint after a crash, which DLedger mode
  never rebuilds (:func:`startup_deletion_findings`), consume-queue tails, data and index files.

The walk's per-file scans and the queue ends run as engine tasks (:mod:`storelib.checks.tasks.dledgertask`);
:func:`audit_findings` turns their merged values into the findings.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from storelib.broker.recovery.dledgerfacts import (
    FACT_COLUMNS,
    FactsBuilder,
    IndexFiles,
    end_from_dict,
    join_ends,
)
from storelib.broker.recovery.resync import LostRegion
from storelib.errors import Finding, StoreError
from storelib.scan.commitlog import at_cut
from storelib.scan.splits import find_entry_start

if TYPE_CHECKING:
    from storelib.broker.recovery.dledgerwalk import DLedgerRecovery
    from storelib.broker.recovery.walkplan import RecoveryResult
    from storelib.broker.settings.store import Store
    from storelib.broker.startup.cqrecovery import QueueReport
    from storelib.broker.startup.startup import IndexFileOnLoad
    from storelib.checks.segment import Capped, SegmentTask
    from storelib.format.checkpoint import Checkpoint
    from storelib.scan.scanner import SegmentEnd


def data_file_findings(dl: DLedgerRecovery, index_folder: str, index_file_size: int) -> list[Finding]:
    """Per data file: an entry header DLedger's recovery rejects (where, why, and whether a start reaches it),
    and the first entry whose index unit differs (named in the index file)."""
    out: list[Finding] = []
    walked = False  # the files a start walks: from DLedger's start file to where its walk ends
    for f in dl.files:
        walked = (walked or f["file"] == dl.start_file) and f["base"] <= dl.data_end
        if f["dledger_end_kind"] == "invalid":
            stop = walked and dl.data_end == f["base"] + f["dledger_end"]
            out.append(Finding(
                "dledger_bad_entry", "critical" if stop else "error", f["file"], f["dledger_end"],
                f"entry header rejected by DLedger's recovery ({f['dledger_end_detail']}) after "
                f"{f['entries']} good entr(ies)" + (
                    ": the next start ends the log here and drops everything after it (rmqstore recover --salvage "
                    "exports it first)" if stop else
                    ": this file lies before DLedger's start file, which a start never checks; a reader or a "
                    "rejoin that reads it stops here"),
                {"entries": f["entries"], "last": f["last"]}))
        mm = f.get("index_mismatch")
        if mm is not None:
            index, off, why = mm
            at = index * 32
            name = f"{index_folder}/{at - at % index_file_size:020d}"
            out.append(Finding(
                "dledger_index_unit_mismatch", "error", name, at % index_file_size,
                f"the unit of entry {index} ({f['file']} @ {off}) does not match it ({why}): DLedger's next start "
                f"truncates its index here and rewrites every later unit from the entries (reads by index before "
                f"that go wrong)", {"entry_index": index, "data_file": f["file"], "data_offset": off}))
    return out


def ledger_findings(dl: DLedgerRecovery, node_dir: str, checkpoint_findings: Iterable[Finding] = ()
                    ) -> list[Finding]:
    """The ledger as a start would load it: the broker not starting at all, the committed index and position
    against the entries on disk, DLedger's checkpoint itself, index files DLedger deletes or creates."""
    out = list(checkpoint_findings)
    if dl.load_failure:
        out.append(Finding("dledger_broker_does_not_start", "critical", None, None, dl.load_failure))
    end = dl.ledger_end_index
    if end >= 0 and dl.committed_index < end:
        n = end - dl.committed_index if dl.committed_index >= dl.ledger_begin_index else end - dl.ledger_begin_index + 1
        frm = max(dl.committed_pos, dl.min_offset)
        out.append(Finding(
            "dledger_uncommitted_entries", "warning", f"{node_dir}/checkpoint", None,
            f"DLedger's checkpoint commits entry {dl.committed_index} (committed position {dl.committed_pos}); the "
            f"{n} entries {end - n + 1}..{end} (physical offsets {frm}..{dl.last_entry_end}) are on disk but "
            f"uncommitted: after a start the broker's max offset is {dl.max_offset} and consumers see them only "
            "once DLedger commits them again (a leader re-commits its log; a rejoining follower may truncate them: "
            "rmqstore recover --salvage exports them)",
            {"committed_index": dl.committed_index, "committed_pos": dl.committed_pos, "ledger_end_index": end,
             "uncommitted": n, "from_phy_offset": frm, "to_phy_offset": dl.last_entry_end,
             "max_offset_after_load": dl.max_offset}))
    cp = dl.checkpoint_committed_index
    if cp is not None and end >= 0 and cp > end:
        out.append(Finding("dledger_committed_past_end", "warning", None, None,
                           f"DLedger's checkpoint says committedIndex {cp}, past the ledger's last entry {end}: the "
                           "entries after it are gone (a truncation after the checkpoint); the load clamps it"))
    if dl.index_delete or dl.index_create:
        out.append(Finding("dledger_index_files_changed", "warning", None, None,
                           f"DLedger's next start deletes index file(s) {', '.join(dl.index_delete) or 'none'} and "
                           f"creates {', '.join(dl.index_create) or 'none'} (its index list follows the ledger)"))
    if dl.data_delete:
        out.append(Finding("dledger_data_files_deleted", "critical", None, None,
                           f"DLedger's next start deletes data file(s) {', '.join(dl.data_delete)}, wholly after "
                           f"its recovery's end {dl.data_end}"))
    return out


def queue_findings(queues: Iterable[QueueReport], dl: DLedgerRecovery) -> list[Finding]:
    """Consume queues against the committed position (units past it are served only after a re-commit) and
    the data's end (the start-up cuts them)."""
    out: list[Finding] = []
    past = [q for q in queues if q.recovered_max_phy_offset > max(dl.committed_pos, dl.max_offset)]
    if past and dl.committed_index < dl.ledger_end_index:
        worst = max(q.recovered_max_phy_offset for q in past)
        out.append(Finding(
            "cq_past_committed_position", "warning", "consumequeue", None,
            f"{len(past)} consume queue(s) reach past the committed position {dl.committed_pos} (up to {worst}): "
            "their last units point at uncommitted entries, which getMessage does not return until DLedger commits "
            "them again", {"queues": [f"{q.topic}/{q.queue_id}" for q in past][:50], "committed_pos": dl.committed_pos}))
    cut = [q for q in queues if q.entries_truncated]
    if cut:
        out.append(Finding(
            "cq_truncated_at_startup", "critical", "consumequeue", None,
            f"the next start cuts {sum(q.entries_truncated for q in cut)} unit(s) from {len(cut)} consume queue(s) "
            f"at physical offset {dl.cq_truncate_offset}"
            + (" (5.3.3's abnormal recovery counts 48 bytes short per entry: apache/rocketmq#9084)"
               if dl.abnormal_533 is not None else " (DLedger's data end)"),
            {"queues": {f"{q.topic}/{q.queue_id}": q.entries_truncated for q in cut}}))
    return out


def startup_deletion_findings(index_files: Iterable[IndexFileOnLoad], index_msg_timestamp: int) -> list[Finding]:
    """Index files the next start deletes (IndexService.load after a crash: end time past the store checkpoint's
    index time), named: in DLedger mode nothing re-indexes what they held."""
    out = []
    for f in index_files:
        if f.delete:
            out.append(Finding(
                "index_deleted_at_startup", "error", f"index/{f.name}", None,
                f"the abort file is present: the next start deletes index/{f.name} (end time {f.end_timestamp} > the "
                f"store checkpoint's index time {index_msg_timestamp}) and never rebuilds it, so its keys stop "
                "answering (apache/rocketmq#7477); rmqstore recover --apply deletes it and re-indexes the records",
                {"end_timestamp": f.end_timestamp, "index_msg_timestamp": index_msg_timestamp,
                 "entries": None if f.index_count is None else max(0, f.index_count - 1)}))
    return out


def dledger_after_end(src, task: SegmentTask, end: SegmentEnd, display: str, found: Capped,
                      regions: list[LostRegion]) -> int | None:
    """Where the audit's scan of a DLedger data file goes on after ``end`` (None: the file is done): the -1
    filler must say how many bytes are left; zeros must be the unwritten rest (else the next verified entry
    start resumes after a ``zeroed`` region); a bad entry or record is a lost region up to the next verified
    entry start (:func:`storelib.scan.splits.find_entry_start`)."""
    n = src.size
    if end.kind == "blank":
        left = n - end.file_offset
        got = int.from_bytes(bytes(src.read(end.file_offset + 4, 4)), "big", signed=True) if left >= 8 else None
        if got != left:
            found.add(Finding("bad_blank_record", "warning", display, end.file_offset,
                              f"DLedger's end-of-file filler says {got} bytes, {left} are left (DLedger reads only its "
                              "-1 magic)", {"total_size": got}))
        return None
    nxt = find_entry_start(src, task.base, end.file_offset + (0 if end.kind == "end_of_data" else 1))
    if end.kind == "end_of_data":
        if nxt is None:
            return None
        regions.append(LostRegion(display, end.file_offset, nxt, task.base + end.file_offset, "zeroed",
                                  "zero bytes where an entry should start; valid entries follow", "message"))
        return nxt
    stop = _data_end(src, end.file_offset, n) if nxt is None else nxt
    regions.append(LostRegion(display, end.file_offset, stop, task.base + end.file_offset,
                              end.reason or "invalid", end.detail or "", "none" if nxt is None else "message"))
    return nxt


def _data_end(src, start: int, n: int, chunk: int = 4 << 20) -> int:
    """The offset after the last non-zero byte of ``[start, n)`` (``start`` + 1 at least): what a dead end lost."""
    import numpy as np

    last, pos = start + 1, start
    while pos < n:
        a = np.frombuffer(bytes(src.read(pos, min(chunk, n - pos))), np.uint8)
        nz = np.flatnonzero(a)
        if len(nz):
            last = pos + int(nz[-1]) + 1
        pos += max(1, len(a))
    return last


_NOTES = {
    "queue_behind_commitlog": "the reput dispatches only committed entries: these only once DLedger commits them",
    "index_behind_commitlog": "the reput indexes only committed entries: these only once DLedger commits them",
    "abort_present": "DLedger's recovery checks its entries' headers only; 4.9.8 re-dispatches nothing at recovery "
                     "(its reput resumes at the consume queues' end, up to the committed position), 5.3.3 re-walks "
                     "and re-dispatches the records from the newest data file older than the checkpoint",
}
_RESTATED = {
    "body_crc_mismatch": "the record inside this entry fails its body CRC: DLedger keeps the entry (it checks no record)"
                         " and the reput dispatches it; a 5.3.3 start after a crash stops its recovery walk here",
    "torn_tail": "the last entry's record is torn: DLedger keeps the entry if its header passes; the reput skips it",
    "corrupt_region": "a record inside an entry is damaged: the reput skips the rest of this file (DLedger keeps the "
                      "entries if their headers pass)",
}


def restate_record_findings(findings: Iterable[Finding], folder: str) -> list[Finding]:
    """The audit's findings on a DLedger store in DLedger's terms: ``commitlog/NAME`` is the data file
    ``folder/NAME``, a record finding says what a start does there, and the default store's note on index
    files an abnormal start deletes gives way to :func:`startup_deletion_findings`."""
    out = []
    for f in findings:
        if f.kind == "index_deleted_on_abnormal_start":
            continue
        file = f"{folder}/{f.file[len('commitlog/'):]}" if f.file and f.file.startswith("commitlog/") else f.file
        why = _RESTATED.get(f.kind) or _NOTES.get(f.kind)
        out.append(Finding(f.kind, f.severity, file, f.offset, f"{f.detail}; in DLedger mode: {why}" if why else
                           f.detail, f.extra))
    return out


def ledger_summary(dl: DLedgerRecovery) -> dict[str, Any]:
    """The report's DLedger block."""
    return {"start_file": dl.start_file, "data_end": dl.data_end, "ledger_begin_index": dl.ledger_begin_index,
            "ledger_end_index": dl.ledger_end_index, "ledger_end_term": dl.ledger_end_term,
            "checkpoint_committed_index": dl.checkpoint_committed_index, "committed_index": dl.committed_index,
            "committed_pos": dl.committed_pos, "max_offset_after_load": dl.max_offset,
            "uncommitted_entries": max(0, dl.ledger_end_index - max(dl.committed_index, dl.ledger_begin_index - 1)),
            "index_rewrite_from": dl.index_rewrite_from, "load_failure": dl.load_failure}


def audit_findings(store: Store, walk: RecoveryResult, queues: list[QueueReport], index_file_size: int,
                   checkpoint: Checkpoint, live: bool = False) -> tuple[list[Finding], dict[str, Any]]:
    """Every DLedger finding of a DLedger store's start-up walk (``walk``: from the data files' facts) and its
    queues' ends (``queues``), and the report's summary block: per-file and per-queue values only. The index
    files a start-up deletes are judged from their headers; ``live``: a running broker's abort file is its
    own, so no start-up deletion is said."""
    from storelib.broker.startup.startup import index_on_load
    from storelib.format.markers import abort_state

    dl = walk.dledger
    assert dl is not None and store.dledger is not None
    if live:  # index files wholly past the cut's last entry hold the units of entries written after the cut
        from dataclasses import replace

        dl = replace(dl, index_delete=tuple(n for n in dl.index_delete if int(n) < dl.index_end))
    st = store.dledger_state
    out = data_file_findings(dl, store.dledger.index, index_file_size)
    out += ledger_findings(dl, store.dledger.dir, st.findings if st is not None else ())
    out += queue_findings(queues, dl)
    deleted: list[str] = []
    if not live:
        cp = checkpoint
        on_load = index_on_load(store.index_files(), abort_state(store.loc).last_exit_ok, cp)
        out += startup_deletion_findings(on_load, cp.index_msg_timestamp)
        deleted = [f.name for f in on_load if f.delete]
    out += [f for f in walk.findings if f.kind == "dledger_data_truncated"]
    if live:
        from storelib.checks.livejudge import dledger_progress

        out = dledger_progress(out)
    summary = ledger_summary(dl)
    summary["index_files_deleted_at_startup"] = deleted
    return out, summary


__all__ = ["audit_findings", "data_file_findings", "ledger_findings", "ledger_summary", "queue_findings",
           "restate_record_findings", "startup_deletion_findings"]


# ---------------------------------------------------------------------------------------------
# DLedger's per-file facts from the audit's own segment scan (one read per data file)


@dataclass(frozen=True)
class PartWalk:
    """Set on the audit's options when the walk's record scan of a data file is the audit's first scan of it
    (no CRC stop in the walk): each segment part then gives DLedger's walk its facts
    (:class:`storelib.broker.recovery.dledgerfacts.FactsBuilder` over the same batches), and the walk's file
    task is not run. ``v2_invalid``: the walk reads under 4.9.8's rules and the audit leniently, so a V2
    record makes the part's facts unusable (the walk's task reads the file instead)."""

    index: IndexFiles
    folder: str  # the data files' folder as the walk names them ("dledger-n0/data")
    v2_invalid: bool = False


class PartFacts:
    """One audit part's DLedger facts, fed the batches of its first scan (from the part's start, an entry
    start, to its end or the run's cut)."""

    def __init__(self, walk: PartWalk, task: SegmentTask):
        self.walk, self.task = walk, task
        bound = task.end if task.end is not None else task.limit
        self.bound = bound if bound is not None and bound < task.file_size else None
        cut = task.live and task.end is None and self.bound is not None  # the part the run's cut ends
        self.builder = FactsBuilder(task.base, walk.index, task.start, self.bound, cut=cut)
        self.usable = True

    def columns(self, cols: list[str]) -> list[str]:
        return list(cols) + [c for c in FACT_COLUMNS if c not in cols]

    def feed(self, scan: Iterable[Any], cols: list[str]) -> Iterator[Any]:
        """The scan's batches, taken in, with ``cols`` only (the audit's own columns)."""
        for batch in scan:
            if self.walk.v2_invalid and batch.num_rows and pc.any(pc.equal(batch.column("magic_version"), 2)).as_py():
                self.usable = False
            if self.usable:
                try:
                    self.builder.add(batch)
                except (OSError, StoreError):
                    if not self._gone():
                        raise
                    self.usable = False
            yield batch.select(cols)

    def _gone(self) -> bool:
        """Has DLedger's cleaner deleted this data file since the part opened it (then its index units:
        reviseLedgerBeginIndex)? Its facts are then unusable and the file expired: the read goes on, on the
        unlinked file, drop_expired leaves it out and the walk's task finds it gone."""
        t = self.task
        return t.live and t.local and not os.path.exists(t.uri)

    def finish(self, src: Any, end: SegmentEnd | None) -> dict | None:
        """The walk's :class:`DLedgerEnd` of this part as a dict (None: unusable, or a split part whose scan
        did not reach its end: DLedger's header walk would go on into the next part)."""
        if end is None or not self.usable or (self.task.end is not None and (
                end.kind != "split_end" or end.file_offset != self.task.end)):
            return None
        try:
            done = self.builder.finish(src, end)
        except (OSError, StoreError):
            if not self._gone():
                raise
            return None
        done = replace(done, file=f"{self.walk.folder}/{self.task.name}", crc_errors=0, first_crc_error=None)
        return at_cut(done, self.task.limit).to_dict()


def join_part_ends(parts: list[tuple[int, dict | None]]) -> dict | None:
    """A data file's walk end from its audit parts' (``(start, end dict)`` in file order), as the walk's own
    task of the whole file gives it; None when they do not make one (a part missing or unusable, the first not
    at byte 0, or an entry index / term that does not follow across a cut: the walk's task reads the file)."""
    if not parts or parts[0][0] != 0 or any(d is None for _, d in parts):
        return None
    head = end_from_dict(parts[0][1])  # type: ignore[arg-type]
    for start, d in parts[1:]:
        tail = end_from_dict(d)  # type: ignore[arg-type]
        hf, tf = getattr(head, "facts", None), getattr(tail, "facts", None)
        if hf is None or tf is None or head.kind != "split_end" or head.file_offset != start:
            return None
        if hf.last is not None and tf.first is not None and (tf.first[0] != hf.last[0] + 1 or tf.first[1] < hf.last[1]):
            return None
        joined = join_ends(head, tail)
        if joined is tail:
            return None
        head = replace(joined, records=head.records + tail.records)
    return head.to_dict()
