"""The recovery walk's DLedger mode: DLedgerMmapFileStore's load and recover over the data and index files,
then DLedgerCommitLog's recovery (4.9.8, 5.3.3 normal and abnormal), from the walk tasks' per-file facts.

The order is the broker's (/work/notes/dledger.md §5-6, docs/dledger.md):

1. load: every data and index file must have the configured size (else System.exit(-1)), one file size
   apart (checkSelf, else DISK_ERROR: load() fails);
2. the start file: from the third-last data file down, the first whose entry at byte 0 passes the header
   checks and matches its index unit (file 0 when none does); entries before it are never checked;
3. the header walk (:mod:`storelib.broker.recovery.dledgerfacts`): blank fillers lead to the next file, a
   header failing a check (or an index/term that does not follow) ends the data; the first entry whose
   index unit differs truncates the index list there and every later unit is rewritten from its entry;
4. processOffset more than a file below the last file: System.exit(-1); the data list is cut at
   processOffset (later files deleted, bytes after it kept by the broker), the index list at
   (ledgerEnd + 1) * 32 and below ledgerBegin * 32;
5. committedIndex from DLedger's checkpoint (clamped to the ledger's end; skipped below its begin),
   committedPos = the end of that entry, read through its index unit: the broker's max offset after
   load() (``RecoveryResult.process_offset``);
6. DLedgerCommitLog: 4.9.8 and 5.3.3's normal recovery truncate the consume queues at the data's end when
   their max physical offset reaches it; 5.3.3's abnormal recovery walks the records itself from the
   newest file whose first record is older than the store checkpoint, re-dispatching every valid one,
   and truncates the consume queues at a processOffset short by 48 bytes per entry of the last file it
   walked (apache/rocketmq#9084).

A walk of the *lifetime* kind (``RecoveryInputs.dledger_startup`` off: rebuild, export, the data
sources) dispatches what the reput dispatched as DLedger committed the entries: every entry the load
keeps, each file until its first bad record (the reput skips the rest of that file).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from storelib.broker.recovery.dledgerfacts import (
    BODY_OFFSET,
    DLedgerEnd,
    FileFacts,
    IndexFiles,
    data_list_problems,
    list_index_files,
    walk_headers,
)
from storelib.broker.recovery.reputpath import drift_skips, reput_ranges
from storelib.broker.recovery.walkplan import DispatchRange, RecoveryResult, SegmentOutcome, WalkPlan
from storelib.errors import Finding, StoreError
from storelib.format.dledger.entries import FIRST_ENTRY, INDEX_UNIT_SIZE, NOT_A_FILLER
from storelib.format.record import MAGIC_V1
from storelib.scan.commitlog import Segment, offset_to_file_name
from storelib.scan.recordbytes import check_at
from storelib.scan.scanner import SegmentEnd

if TYPE_CHECKING:
    from storelib.broker.settings.store import Store


@dataclass(frozen=True)
class Abnormal533:
    """5.3.3's own walk after an abnormal exit (dledgerRecoverAbnormally)."""

    start_file: str
    start_reason: str
    files: tuple[str, ...]
    records: int
    process_offset: int  # as 5.3.3 computes it: record sizes only (#9084)
    process_offset_without_bug: int  # the end of what it walked
    supported: bool = True


@dataclass(frozen=True)
class DLedgerRecovery:
    """DLedger's load and recover and DLedgerCommitLog's recovery as one start-up (or, for a lifetime walk,
    the load) runs them: the plan's ``dledger`` section."""

    start_file: str | None
    start_reason: str
    data_end: int  # DLedger's processOffset: the data list's wrote position after load
    last_entry_end: int  # end of the last entry kept (committedPos once DLedger commits every entry)
    stop: str | None  # why DLedger's walk ended where it did
    ledger_begin_index: int
    ledger_end_index: int
    ledger_end_term: int
    checkpoint_committed_index: int | None  # as load() reads it (-1: none; None: unparseable)
    committed_index: int  # after load (-1: none)
    committed_pos: int
    committed_note: str
    min_offset: int
    max_offset: int  # getMaxOffset after load(): the broker's max physical offset
    index_rewrite_from: int | None  # first entry whose index unit DLedger rewrites
    index_rewrite_why: str | None
    index_rewrite_at: tuple[int, int] | None  # (data file base, file offset) of that entry
    index_end: int  # the index list's wrote position after load: (ledgerEnd + 1) * 32
    index_delete: tuple[str, ...]
    index_create: tuple[str, ...]
    data_delete: tuple[str, ...]
    load_failure: str | None
    files: tuple[dict, ...] = ()
    abnormal_533: Abnormal533 | None = None
    cq_truncate_offset: int | None = None
    reput_skips: tuple[tuple[int, int, str], ...] = ()  # (file base, from, why) of records no reput dispatches
    ledger_cut: int | None = None  # a -1 magic in the last file that is no filler: the ledger ends there

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["abnormal_533"] = None if self.abnormal_533 is None else dict(self.abnormal_533.__dict__)
        d["files"] = list(self.files)
        d["reput_skips"] = [list(x) for x in self.reput_skips]
        return d


# ---------------------------------------------------------------------------------------------
# inputs


def dledger_inputs(store: Store) -> dict:
    """RecoveryInputs' DLedger fields read from a DLedger-mode store (index list, load rules, checkpoint)."""
    d, st = store.dledger, store.dledger_state
    assert d is not None and st is not None
    cl = store.commitlog
    index = list_index_files(store.path(d.index), d.index)
    if store.live and index.files and index.files[-1].file_size < index.file_size:
        last = index.files[-1].display  # a running node creates its next index file (short until mapped)
        index = replace(index, findings=tuple(f for f in index.findings if not (
            f.kind == "dledger_load_fails" and f.file == last and f.extra.get("size") is not None)))
    load = tuple(data_list_problems([s for s in cl.segments], cl.segment_size, cl.findings)) + index.findings
    return dict(dledger=True, dledger_committed_index=st.committed_index, dledger_index=index,
                dledger_load_findings=load)


# ---------------------------------------------------------------------------------------------
# the files' facts in order


def _facts(seg: Segment, end: SegmentEnd | None) -> FileFacts:
    """The file's facts (a plain or partial end stands in with the scan's own end: exact for a healthy file)."""
    if isinstance(end, DLedgerEnd) and end.facts is not None and end.facts.from_offset == 0:
        return end.facts
    if end is None:  # a zero-length file: nothing to scan
        return FileFacts("empty file", None, 0, None, None, "invalid", 0, "empty file", None, None, None)
    last = (end.last_index, end.last_term) if end.last_index is not None else None
    kind = end.kind if end.kind in ("blank", "end_of_data") else "invalid"
    return FileFacts(None, None, end.records, None, last, kind, end.file_offset, end.detail, None, None, None, -1)


def _start_file(facts: list[FileFacts]) -> tuple[int, str]:
    """recover()'s start file: from the third-last down, the first whose byte-0 entry passes the checks."""
    n = len(facts)
    first = max(0, n - 3)
    why = []
    for i in range(first, -1, -1):
        if facts[i].start_problem is None:
            return i, (f"file {i} of {n}: recover() starts at the third-last file (or the first)" if i == first else
                       f"the first file down from the third-last whose first entry checks out ({'; '.join(why)})")
        why.append(f"file {i}: {facts[i].start_problem}")
    return 0, f"no file's first entry checks out ({'; '.join(why)}): the first file"


@dataclass
class _Walk:
    data_end: int = 0
    last_end: int = 0
    last: tuple[int, int] | None = None
    stop: str | None = None
    stop_file: int | None = None
    mismatch: tuple[int, int, int, str] | None = None  # (index, file, file offset, why)
    index_dropped: bool = False  # the first entry walked has a negative index: every index file goes
    ledger_cut: int | None = None  # see DLedgerRecovery.ledger_cut
    walked: list[int] = field(default_factory=list)


def _header_walk(segs: tuple[Segment, ...], facts: list[FileFacts], start: int, S: int) -> _Walk:
    """recover()'s loop over the files from ``start`` (the files' own walks chained: index and term across a
    blank filler, the first index-unit mismatch)."""
    w = _Walk(data_end=segs[start].base, last_end=segs[start].base)
    for i in range(start, len(segs)):
        f, base = facts[i], segs[i].base
        w.walked.append(i)
        if w.last is not None and f.first is not None and (f.first[0] != w.last[0] + 1 or f.first[1] < w.last[1]):
            w.data_end, w.stop, w.stop_file = base, (
                f"the first entry's index {f.first[0]} / term {f.first[1]} does not follow index {w.last[0]} / "
                f"term {w.last[1]} of the previous file"), i
            return w
        if f.entries:
            w.last, w.last_end = f.last, base + f.end_offset
        if w.mismatch is None and f.index_mismatch is not None:
            w.mismatch = (f.index_mismatch[0], i, f.index_mismatch[1], f.index_mismatch[2])
        if f.end_kind == "blank" and i + 1 < len(segs):
            continue
        if f.end_kind == "blank" and NOT_A_FILLER in (f.end_detail or ""):  # :211-216: the last file, so the end
            w.ledger_cut = base + f.end_offset
        w.data_end = base + (S if f.end_kind == "blank" else f.end_offset)
        w.stop = None if f.end_kind in ("blank", "end_of_data") else f.end_detail
        if w.last is not None and w.stop and FIRST_ENTRY in w.stop and f.entries == 0:  # a file's own first-entry rule
            w.stop = (f"the first entry (index {f.head_index}) does not follow index {w.last[0]} / term {w.last[1]} "
                      f"of the previous file ({w.stop})")
        w.stop_file = i
        w.index_dropped = w.last is None and f.drops_index
        return w
    return w  # pragma: no cover - the last file always returns


# ---------------------------------------------------------------------------------------------
# the index list after recover()


def index_changes(index: IndexFiles, rewrite_from: int | None, ledger_end: int, ledger_begin: int,
                  has_data: bool) -> tuple[list[int], list[int]]:
    """(bases deleted, bases created) of the index list by recover(): truncateOffset at the first mismatch
    and rebuildWithPos when no file holds that offset, the rewritten units' files, resetOffset below the
    ledger's begin and truncateOffset after its end (MmapFileList)."""
    F = index.file_size
    live = {f.base for f in index.files}
    deleted: set[int] = set()
    created: set[int] = set()

    def truncate(off: int) -> None:
        for b in sorted(live):
            if b + F > off and off < b:
                live.discard(b)
                (created.discard(b) if b in created else deleted.add(b))

    if not has_data:
        truncate(0)
        return sorted(deleted), sorted(created)
    if rewrite_from is not None:
        off = rewrite_from * INDEX_UNIT_SIZE
        truncate(off)
        last = max(live) if live else None
        wrote = None if last is None else (off if last <= off < last + F else last + F)
        if wrote != off:  # rebuildWithPos: every file goes, one is created at the offset's file
            for b in list(live):
                live.discard(b)
                deleted.add(b)
            live.add(off - off % F)
            created.add(off - off % F)
        end = (ledger_end + 1) * INDEX_UNIT_SIZE
        b = off - off % F
        while b < end:
            if b not in live:
                live.add(b)
                created.add(b)
            b += F
    if ledger_end >= 0:
        boff = ledger_begin * INDEX_UNIT_SIZE
        for b in sorted(live):
            if b <= boff and boff >= b + F:
                live.discard(b)
                (created.discard(b) if b in created else deleted.add(b))
    truncate((ledger_end + 1) * INDEX_UNIT_SIZE)
    return sorted(deleted), sorted(created)


def _committed(plan: WalkPlan, facts: list[FileFacts], w: _Walk, begin: int, end: int,
               index_deleted: set[int]) -> tuple[int, int, str, str | None]:
    """(committedIndex, committedPos, why, load failure) after recover(): updateCommittedIndex with the
    checkpoint's value (a lifetime walk: every entry committed, as a leader re-commits them)."""
    inp = plan.inputs
    if end < 0:
        return -1, -1, "the ledger is empty", None
    if not inp.dledger_startup:
        return end, w.last_end, "every entry committed (as once a leader re-commits them)", None
    ci = inp.dledger_committed_index
    if ci is None:
        return -1, -1, "checkpoint committedIndex unparseable", \
            "DLedger's checkpoint holds a committedIndex Long.valueOf rejects: recover() throws and load() fails"
    if ci == -1:
        return -1, -1, "no committedIndex in DLedger's checkpoint: committedPos stays -1", None
    if ci < begin:
        return -1, -1, f"the checkpoint's committedIndex {ci} is below the ledger's begin {begin}: ignored", None
    c = min(ci, end)
    note = f"committedIndex {ci} from DLedger's checkpoint" + (f", clamped to the ledger's end {end}" if ci > end else "")
    if c == end:
        return c, w.last_end, note, None
    index: IndexFiles = inp.dledger_index
    F = index.file_size
    if (c * INDEX_UNIT_SIZE) // F * F in index_deleted:
        return -1, -1, note, (f"the index file holding committed entry {c}'s unit is deleted by recover(): "
                              "updateCommittedIndex fails with DISK_ERROR and load() fails")
    if w.mismatch is not None and c >= w.mismatch[0]:  # a rewritten unit: the entry's own position and size
        return c, _entry_end(plan, facts, w, c), note, None
    u, have = index.units(c, 1)
    if not have[0]:  # getEntryPosAndSize: getData returns null, PreConditions throws DISK_ERROR
        at = c * INDEX_UNIT_SIZE
        folder = index.files[0].folder if index.files else "index"
        return -1, -1, note, (f"no index file holds committed entry {c}'s unit ({folder}/"
                              f"{offset_to_file_name(at - at % F)} @ {at % F}): updateCommittedIndex fails with "
                              "DISK_ERROR and the broker's load() fails (4.9.8 DefaultMessageStore.load :221-223)")
    return c, int(u[0]["pos"]) + int(u[0]["size"]), note + " (position and size from its index unit)", None


def _entry_end(plan: WalkPlan, facts: list[FileFacts], w: _Walk, c: int) -> int:
    """pos + size of entry ``c`` (a walked entry), by its file's header walk (only after an index rewrite)."""
    for i in w.walked:
        f = facts[i]
        if f.first is not None and f.last is not None and f.first[0] <= c <= f.last[0]:
            seg = plan.segments[i]
            with seg.open() as src:
                hw = walk_headers(src, seg.base, 0, None, limit=c - f.first[0] + 1)
            return hw.pos[-1] + hw.size[-1]
    raise StoreError(None, None, "internal", f"entry {c} is not in the walked files")


# ---------------------------------------------------------------------------------------------
# plan and finish (called by storelib.broker.recovery.walk in DLedger mode)


def dledger_mode(inputs) -> str:
    """The walk's mode: ``dledger`` (a lifetime walk) or the start-up's ``normal`` / ``abnormal``."""
    if not inputs.dledger_startup:
        return "dledger"
    return "normal" if inputs.last_exit_ok else "abnormal"


def finish_dledger(plan: WalkPlan, ends: Mapping[int, SegmentEnd]) -> RecoveryResult:
    """Combine the data files' scan ends and facts into the :class:`RecoveryResult` of a DLedger-mode walk
    (every data file's end is needed: DLedger's own walk reads them all)."""
    inp = plan.inputs
    S, segs = inp.segment_size, plan.segments
    found = list(plan.findings)
    n = len(segs)
    for i, seg in enumerate(segs):
        if i not in ends and seg.file_size:
            raise StoreError(seg.display, None, "missing_scan", "no scan result for this data file")
    facts = [_facts(seg, ends.get(i)) for i, seg in enumerate(segs)]
    outcomes = {i: SegmentOutcome(seg.base, seg.name, 0, inp.dledger_crc, e.kind, e.file_offset, e.reason,
                                  e.detail, e.size, e.records) for i, seg in enumerate(segs) if (e := ends.get(i))}
    load_failure = next((f.detail for f in found if f.kind == "dledger_load_fails"), None)
    if n == 0:  # recover() :144-149: the index list's truncateOffset(0) keeps file 0 only
        gone = index_changes(inp.dledger_index or IndexFiles(), None, -1, -1, False)[0]
        dl = DLedgerRecovery(None, "no data files", 0, 0, None, -1, -1, -1, inp.dledger_committed_index, -1, -1,
                             "the ledger is empty", 0, 0, None, None, None, 0,
                             tuple(offset_to_file_name(b) for b in gone), (), (), load_failure)
        return RecoveryResult(inp.version, dledger_mode(inp), 0, None, "no data files", None, False, 0, None, (),
                              (), None, inp.cq_max_phy_offset, False, (), load_failure is None, tuple(found),
                              dledger=dl)
    start, start_why = _start_file(facts)
    w = _header_walk(segs, facts, start, S)
    end_index, end_term = w.last if w.last is not None else (-1, -1)
    begin = -1
    if end_index >= 0:
        begin = facts[0].head_index if facts[0].head_index is not None else (facts[0].first or (0, 0))[0]
    if segs[-1].base - w.data_end > S:
        load_failure = load_failure or (
            f"DLedger's walk ends at {w.data_end}, more than a file below the last data file {segs[-1].name}: "
            "recover() stops the JVM (System.exit(-1)) instead of truncating")
    index: IndexFiles = inp.dledger_index or IndexFiles()
    rewrite = w.mismatch[0] if w.mismatch is not None else None
    if w.index_dropped:  # truncateOffset(index * 32 < 0) in recover()'s catch; rebuildWithPos then fails
        idx_del, idx_new = [f.base for f in index.files], []
    else:
        idx_del, idx_new = index_changes(index, rewrite, end_index, begin, True)
    committed, cpos, cnote, fail = _committed(plan, facts, w, begin, end_index, set(idx_del))
    load_failure = load_failure or fail
    data_delete = tuple(s.base for s in segs if s.base > w.data_end)
    cut = next((s for s in segs if s.base <= w.data_end < s.base + S), None)
    truncate = (cut.base, w.data_end - cut.base) if cut is not None else None
    kept = [i for i, s in enumerate(segs) if s.base not in data_delete]
    min_offset = segs[kept[0]].base if kept else 0
    max_offset = cpos if cpos > 0 else (min_offset if min_offset > 0 else 0)
    dispatch, abn, cq_cut, life = [], None, w.data_end, []
    if not inp.dledger_startup:
        dispatch, life = reput_ranges(plan, outcomes, w.data_end, min_offset, w.last_end)
        found += life
    elif any(o.reason == "length_mismatch" and (o.size or 0) > 0 for o in outcomes.values()):
        life = reput_ranges(plan, outcomes, w.data_end, min_offset, w.last_end)[1]  # what the drift skips
    elif inp.version == "5" and not inp.last_exit_ok:
        abn, dispatch = _abnormal_533(plan, facts, outcomes, kept, found,
                                      max_offset if inp.duplication_enable else None)
        cq_cut = abn.process_offset
    skips = tuple((segs[i].base, o.end_offset, "reput_skips_rest_of_file") for i, o in outcomes.items()
                  if o.end_kind == "invalid" and o.reason != "dup_info" and i in kept and segs[i].base + o.end_offset < w.data_end
                  and o.end_offset < (facts[i].end_offset if facts[i].from_offset >= 0 else S)) + drift_skips(segs, life, S)
    failure = None
    if w.stop is not None and w.stop_file is not None:
        sf = segs[w.stop_file]
        failure = SegmentOutcome(sf.base, sf.name, 0, False, "invalid", w.data_end - sf.base, "bad_entry",
                                 f"DLedger's recovery stops here: {w.stop}")
        found.append(Finding("dledger_data_truncated", "critical", sf.display, w.data_end - sf.base,
                             f"DLedger's recovery ends the data here ({w.stop}): {_bytes_after(segs, w.data_end, S)} "
                             "bytes after it are dropped"))
    if w.ledger_cut is not None:
        sf = segs[w.stop_file or 0]
        found.append(Finding("dledger_data_truncated", "critical", sf.display, w.ledger_cut - sf.base,
                             "a -1 magic that is no blank filler in the last data file: DLedger's recovery takes it "
                             "for one and ends the ledger here (processOffset is the file's end, DLedgerMmapFileStore "
                             f":211-216): the entries in the {sf.base + S - w.ledger_cut} bytes after it are dropped"))
    if load_failure:
        found.append(Finding("dledger_broker_does_not_start", "critical", None, None, load_failure))
    files = tuple({"file": s.display, "base": s.base, "entries": facts[i].entries, "first": facts[i].first, "last": facts[i].last,
                   "start_check": facts[i].start_problem or "ok", "dledger_end": facts[i].end_offset,
                   "dledger_end_kind": facts[i].end_kind, "dledger_end_detail": facts[i].end_detail,
                   "records_end": outcomes[i].end_offset if i in outcomes else None,
                   "records_end_reason": outcomes[i].reason if i in outcomes else None,
                   "index_mismatch": facts[i].index_mismatch}
                  for i, s in enumerate(segs))
    dl = DLedgerRecovery(
        segs[start].display, start_why, w.data_end, w.last_end, w.stop, begin, end_index, end_term,
        inp.dledger_committed_index, committed, cpos, cnote, min_offset, max_offset, rewrite,
        None if w.mismatch is None else f"{segs[w.mismatch[1]].display} @ {w.mismatch[2]}: {w.mismatch[3]}",
        None if w.mismatch is None else (segs[w.mismatch[1]].base, w.mismatch[2]),
        (end_index + 1) * INDEX_UNIT_SIZE, tuple(offset_to_file_name(b) for b in idx_del),
        tuple(offset_to_file_name(b) for b in idx_new), tuple(offset_to_file_name(b) for b in data_delete),
        load_failure, files, abn, cq_cut if inp.dledger_startup else None, skips, w.ledger_cut)
    truncate_cq = inp.dledger_startup and inp.cq_max_phy_offset >= cq_cut
    supported = load_failure is None and (abn is None or abn.supported)
    return RecoveryResult(
        version=inp.version, mode=dledger_mode(inp), start_index=start, start_base=segs[start].base,
        start_reason=f"DLedger: {start_why}", window_start=None if abn is None else segs[kept[0]].base,
        crc_checked=inp.dledger_crc, process_offset=max_offset, failure=failure,
        segments=tuple(outcomes[i] for i in sorted(outcomes)), delete_segments=data_delete, truncate=truncate,
        cq_max_phy_offset=inp.cq_max_phy_offset, truncate_consume_queues=truncate_cq, dispatch=tuple(dispatch),
        supported=supported, findings=tuple(found), dledger=dl, cq_truncate_offset=cq_cut if truncate_cq else None)


def _bytes_after(segs: tuple[Segment, ...], at: int, S: int) -> int:
    return sum(max(0, min(s.base + S, s.base + s.file_size) - max(at, s.base)) for s in segs if s.base + S > at)


def _abnormal_533(plan: WalkPlan, facts: list[FileFacts], outcomes: Mapping[int, SegmentOutcome], kept: list[int],
                  found: list[Finding], below: int | None = None) -> tuple[Abnormal533, list[DispatchRange]]:
    """dledgerRecoverAbnormally's own walk (5.3.3): the start file by isMmapFileMatchedRecover, every valid
    record re-dispatched file by file, and its processOffset summing record sizes only (#9084). With
    duplicationEnable (``below``: DLedger's max offset) the walk's record check also fails a record without a
    well-formed DUP_INFO (checkDupInfo, DLedgerCommitLog.java:319/348: the scans' ``dup_info``) and only records
    whose commitLogOffset < getConfirmOffset() = getMaxOffset() are dispatched (:354-356, :175-177, :151-159)."""
    inp = plan.inputs
    cp = inp.checkpoint
    if inp.message_index_enable and inp.message_index_safe:
        limit, rule = cp.min_timestamp_index(), "min(checkpoint min timestamp - 3 s, index timestamp)"
    else:
        limit, rule = cp.min_timestamp(), "checkpoint min timestamp - 3 s"
    s, why = 0, f"no data file's first record is a V1 message stored at or before {rule} = {limit}: the first file"
    for k in range(len(kept) - 1, -1, -1):
        f = facts[kept[k]]
        if f.record_magic == MAGIC_V1 and f.record_time and f.record_time <= limit:
            s, why = k, f"the newest data file whose first record was stored at or before {rule} = {limit}"
            break
    dispatch: list[DispatchRange] = []
    walked: list[str] = []
    records = 0
    last = kept[s]
    for k in range(s, len(kept)):
        i = kept[k]
        seg, o = plan.segments[i], outcomes.get(i)
        walked.append(seg.name)
        last = i
        if o is None:
            break
        records += o.records
        if o.end_offset > 0:
            dispatch.append(DispatchRange(seg.base, seg.name, 0, o.end_offset, None, "recovery", below=below))
        if o.end_kind != "blank" or k + 1 >= len(kept):
            break
    seg, o = plan.segments[last], outcomes.get(last)
    e, recs = (o.end_offset, o.records) if o is not None else (0, 0)
    supported = True
    if o is not None and o.reason == "bad_entry":
        with seg.open() as src:
            if e + BODY_OFFSET < src.size and check_at(src, e + BODY_OFFSET, inp.dledger_crc).kind == "message":
                supported = False
                found.append(Finding("dledger_533_reads_past_entry", "critical", seg.display, e,
                                     "5.3.3's abnormal recovery reads records, not entry headers: it goes on past this "
                                     "damaged header (its record is intact), which rmqstore does not replay"))
    if below is not None and dispatch and dispatch[-1].phy_end > below:
        found.append(Finding("recovery_uncommitted_not_dispatched", "info", plan.segments[kept[s]].display, None,
                             "duplicationEnable: 5.3.3's DLedger abnormal recovery dispatches only records whose "
                             f"commitLogOffset is below DLedger's max offset {below} (its committed position, "
                             "DLedgerCommitLog.java:354-356, :175-177); the records it walks after that get no "
                             "consume-queue or index entry at start-up", {"below": below}))
    return Abnormal533(plan.segments[kept[s]].display, why, tuple(walked), records,
                       seg.base + e - BODY_OFFSET * recs, seg.base + e, supported), dispatch


def plan_dledger(inputs, segments) -> tuple[tuple[Segment, ...], str, str, tuple[Finding, ...]]:
    """(files, mode, why, findings) of a DLedger-mode walk: every data file is scanned from byte 0."""
    mode = dledger_mode(inputs)
    why = {"dledger": "DLedger: every data file (the reput as entries were committed)",
           "normal": "DLedger start-up after a clean shutdown", "abnormal": "DLedger start-up after a crash"}[mode]
    return tuple(segments), mode, why, tuple(inputs.dledger_load_findings)


def lost_ranges(result: RecoveryResult, segs: tuple[Segment, ...] | list[Segment], S: int
                ) -> list[tuple[Segment, int, str]]:
    """Where data a DLedger start-up drops (after DLedger's end) or no reput ever dispatches (after a bad record,
    to DLedger's end in that file) begins."""
    dl = result.dledger
    assert dl is not None
    out: list[tuple[Segment, int, str]] = []
    by_base = {s.base: s for s in segs}
    for base, off, why in dl.reput_skips:
        out.append((by_base[base], off, why))
    if dl.ledger_cut is not None:  # one byte past the -1 magic (a lost scan stops at one): no entry starts there,
        cut = dl.ledger_cut + 1     # so the scan resyncs on the next entry start
        out += [(s, cut - s.base, "dledger_truncated") for s in segs if s.base <= cut < s.base + S]
    for s in segs:
        if s.base + S > dl.data_end:
            out.append((s, max(0, dl.data_end - s.base), "dledger_truncated"))
    return out
