"""Where 4.9.8's ReputMessageService.doReput reads at start-up, record by record, from its reput offset to
processOffset, including after a record whose TOTALSIZE disagrees with its fields (a length mismatch).

doReput takes one buffer per mapped file (``getData(reputFromOffset)``: from there to the file's read
position) and calls CommitLog.checkMessageAndReturnSize on it again and again. Two positions move: the
buffer's (what the check read) and ``reputFromOffset`` (what the loop adds). They agree until a length
mismatch (``success=false``, size = TOTALSIZE > 0): the loop adds TOTALSIZE to reputFromOffset and logs
"[BUG]read total count not equals msg total size", but the buffer stands where the check left it, after
the fields (calMsgLength bytes from the record), and ``readSize`` is not advanced. So the reput goes on
reading (and dispatching) the records that follow the fields, while reputFromOffset runs ahead (or behind)
by ``TOTALSIZE - calMsgLength``. The drift shows when the buffer is left:

* a blank record: ``rollNextFile(reputFromOffset)``, the file boundary after the drifted offset (a drift
  past the file's end skips whole files);
* the buffer's end, or a record the check fails (-1): ``readSize`` never reaches the buffer's size after a
  mismatch, so the check runs at the end and fails; a master (brokerId 0, or DLedger) adds the buffer's
  size minus ``readSize``, landing ``sum(TOTALSIZE)`` bytes after the buffer's end, maybe inside a record
  of a later file (the next getData reads from there); a slave stops and retries the drifted offset.

The records the broker dispatches are the ones this walk reads; their consume-queue entries come from
their own fields, so only where the walk goes matters. The check is the reput's (``readBody=false``: the
body skipped by position, bounded by the buffer, so BODYLENGTH > TOTALSIZE is a mismatch here, -1 to
recovery), over the buffer only: a record running past the read position fails there (-1), even one a
drifted read finds straddling processOffset.

In DLedger mode (``head`` = 48) each check first reads the entry header: DLedgerCommitLog's check
(4.9.8 ``:342-364``) returns ``size = TOTALSIZE + 48`` for a mismatch and leaves the buffer after the
header and the record's fields, so the drift is the same and the skipped sizes count 48 more each; the
check after the fields reads the middle of the next entry and fails, and the master's
``+= result.getSize() - readSize`` lands ``sum(TOTALSIZE + 48)`` past the buffer's end, usually inside an
entry of the next file, which is then skipped too (:func:`reput_ranges`).

5.3.3 never meets such a record offline: its recovery dispatches itself and stops at it (the truncation
point), so its reput starts past it, and ``rebuild --incremental`` dispatches only what recovery checked.
Its doReput differs in what only a running broker meets: ``reputFromOffset + size > getReputEndOffset()``
stops the loop without moving (a record, or a drifted mismatch, reaching past the confirm/max offset is
retried every 1 ms until the log grows past it), the inner loop also stops once reputFromOffset reaches the end (no reading on after a
drift past it), and ``run()``'s ``catch (Throwable)`` only logs (an OutOfMemoryError of ``new
byte[totalSize]`` is retried forever; 4.9.8 catches Exception, so the Error ends its reput thread). None of these changes what
an offline walk of a 5.3.3 store dispatches; this module follows 4.9.8's loop, also for 5.3.3's reput moved
by ``recheckReputOffsetFromCq`` to the queues' end (:mod:`storelib.broker.startup.startup5x`), which can read
segments before the recovery window as 4.9.8's does (``dispatch_store`` on a 5.x store with an unrecovered
mismatch below its end, and such a rechecked reput meeting one, are where the two loops could differ).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from storelib.broker.recovery.walkplan import DispatchRange, RecoveryResult, SegmentOutcome, WalkPlan
from storelib.errors import Finding, StoreError
from storelib.format.dledger.entries import BODY_OFFSET, ENTRY_MAGIC, EntryHeader
from storelib.format.record import OOM_KIND, OOM_REASON
from storelib.scan.commitlog import Segment
from storelib.scan.recordbytes import check_at
from storelib.scan.scanner import SegmentEnd

ScanFrom = Callable[[int, int, int | None], SegmentEnd]  # (segment index, file offset, readable end) -> its end


def reput_skips_rest(broker_id: int, dledger: bool) -> bool:
    """Does the broker's reput skip the rest of a buffer after a record it cannot decode? A master's does
    (brokerId 0, or DLedger: DefaultMessageStore.doReput, 4.9.8 and 5.3.3); a slave's stops and retries."""
    return broker_id == 0 or dledger


def mismatch_note(version: str, size: int | None = None, read_length: int | None = None) -> str:
    """What the broker's recovery and reput each do with a length-mismatch record (TOTALSIZE ``size``, its
    fields ``read_length`` bytes, when known), in words an operator can act on."""
    out = ("the broker's recovery (normal or abnormal) stops here: processOffset is this record, the segment is "
           "cut here and every later segment deleted")
    if version != "4":
        return out + ("; 5.3.3's reput never reads it (recovery dispatches up to it and the reput starts after; "
                      "with recheckReputOffsetFromCq it may, as 4.9.8's does, when it lies before the window)")
    total = f"TOTALSIZE {size}" if size is not None else "its TOTALSIZE"
    fields = f"its {read_length} bytes of fields" if read_length is not None else "its fields"
    out += (f"; a 4.9.8 reput (or 5.3.3's with recheckReputOffsetFromCq) that reads it (a segment before the "
            f"recovery window) skips it: reputFromOffset += "
            f"{total} while it reads on after {fields}, so where it goes next is off by the difference "
            "(rmqstore's recover and rebuild follow it)")
    if size is None or size >= 1 << 26:
        out += (f"; 4.9.8 first allocates new byte[{'TOTALSIZE' if size is None else size}]: the default heap "
                "(runbroker.sh -Xmx8g) holds it, a heap that cannot throws OutOfMemoryError, an Error neither "
                "catches: at recovery the broker exits at start-up (BrokerStartup: exit -1), in the reput the "
                "thread dies and nothing more is dispatched until a restart")
    return out


def stop_detail(end: SegmentEnd, line: str | None, file: str, add: Callable[[Finding], None]) -> str:
    """An audit's detail of the invalid record a segment scan ends at (``end``), with what the broker's recovery and
    reput each do with it (a length mismatch: :func:`mismatch_note`); a record whose check throws
    OutOfMemoryError is also given to ``add`` as a critical finding: the broker does not start if its recovery
    reaches it (the audit does not place the recovery's window; ``recover --plan`` does)."""
    detail = end.detail or ""
    if end.reason == "length_mismatch":
        return detail + "; " + mismatch_note("5" if line == "5" else "4", end.size)
    if end.reason == OOM_REASON:
        add(Finding(OOM_KIND, "critical", file, end.file_offset,
                    f"{detail}; a recovery that reaches it (normal or abnormal) throws it out of "
                    "DefaultMessageStore.load: "
                    "the broker does not start (BrokerStartup exits -1) and truncates nothing; a 4.9.8 reput that "
                    "reads it ends its thread"))
    return detail


def read_length(plan: WalkPlan, index: int, pos: int) -> int | None:
    """calMsgLength of the length-mismatch record at ``pos`` of segment ``index``: where the check leaves
    the buffer (one scalar check, small reads)."""
    with plan.segments[index].open() as src:
        return check_at(src, pos, False, plan.inputs.line, read_body=False).read_length


@dataclass
class ReputPath:
    """The reput's dispatch ranges in order, the outcomes of the segments only the reput reads, its
    findings, where reputFromOffset stops, and False in ``supported`` when it cannot be followed."""

    dispatch: list[DispatchRange] = field(default_factory=list)
    outcomes: list[SegmentOutcome] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    supported: bool = True
    end: int = 0


def reput_path(plan: WalkPlan, end_of: Callable[[int], SegmentEnd], process_offset: int, scan_from: ScanFrom,
               length_of: Callable[[int, int], int | None] | None = None) -> ReputPath:
    """4.9.8 after a normal exit: doReput from ``plan.reput_from`` to processOffset (the log's max offset
    after recovery). ``end_of(i)``: the walk's scan of task ``i`` from its start; ``scan_from``: a reput
    scan (no CRC) from any offset, for where a drift lands; ``length_of``: :func:`read_length`."""
    S = plan.inputs.segment_size
    segs = plan.segments
    starts = {t.index: t for t in plan.tasks}
    master = reput_skips_rest(plan.inputs.broker_id, plan.inputs.dledger)
    length_of = length_of or (lambda i, pos: read_length(plan, i, pos))
    out = ReputPath(end=plan.reput_from or 0)
    R = out.end
    while R < process_offset:
        i = next((k for k, s in enumerate(segs) if s.base <= R < s.base + S), None)
        if i is None:
            out.findings.append(Finding("reput_gap", "critical", "commitlog", None,
                                        f"no segment holds physical offset {R}: reput stops there and nothing "
                                        "after it is dispatched"))
            out.supported = False
            break
        seg = segs[i]
        lim = min(S, seg.file_size, process_offset - seg.base)  # the file's read position
        R, go_on = one_buffer(plan, i, R - seg.base, lim, starts, end_of, scan_from, length_of, master, out)
        if not go_on:
            break
    out.end = R
    return out


def one_buffer(plan: WalkPlan, i: int, pos: int, lim: int, starts: dict, end_of, scan_from: ScanFrom,
               length_of, master: bool, out: ReputPath, head: int = 0, by: str = "reput") -> tuple[int, bool]:
    """One getData buffer ``[pos, lim)`` of segment ``i``: its dispatch ranges, and (reputFromOffset after
    it, whether doReput goes on). ``head``: bytes before each record (48: a DLedger entry header)."""
    S = plan.inputs.segment_size
    seg = plan.segments[i]
    t = starts.get(i)
    at, drift, skipped = pos, 0, 0  # buffer position; reputFromOffset - buffer; sum of TOTALSIZEs skipped
    while True:
        whole = t is not None and at == t.start and (t.crc or lim >= seg.file_size)
        e = end_of(i) if whole else scan_from(i, at, lim if lim < seg.file_size else None)
        if whole and not t.crc:
            out.outcomes.append(SegmentOutcome(seg.base, seg.name, at, False, e.kind, e.file_offset, e.reason,
                                               e.detail, e.size, e.records))
        stop = min(e.file_offset, lim)
        if stop > at:
            out.dispatch.append(DispatchRange(seg.base, seg.name, at, stop, None, by))
        if e.reason == OOM_REASON and stop < lim:  # run() catches Exception only (4.9.8 :2122): the thread ends
            out.findings.append(Finding(
                "reput_out_of_memory", "critical", e.file, stop,
                f"{e.detail}; 4.9.8's reput reads it after the start-up: the Error ends the reput thread at "
                f"reputFromOffset {seg.base + stop + drift}, nothing after it is dispatched until a restart "
                "(which stops there again)", {"phy_offset": seg.base + stop}))
            return seg.base + stop + drift, False
        if e.kind == "blank" and stop < lim:
            x = seg.base + stop + drift
            return x + S - x % S, True  # rollNextFile(reputFromOffset)
        if e.kind == "invalid" and e.size is not None and e.size > 0 and stop < lim:
            L = length_of(i, stop + head)
            if L is None:  # cannot happen for a mismatch the scan reported; say so rather than guess
                out.findings.append(Finding("reput_unfollowed", "critical", e.file, stop, "no field length"))
                out.supported = False
                return seg.base + stop + drift, False
            out.findings.append(Finding(
                "reput_length_mismatch", "critical", e.file, stop,
                f"{e.detail}: {mismatch_note('4', e.size, L)}",
                {"phy_offset": seg.base + stop, "total_size": e.size, "read_length": L,
                 "reput_from_after": seg.base + stop + drift + e.size + head}))
            drift += e.size - L
            skipped += e.size + head
            at = stop + head + L
            continue
        if stop >= lim and not skipped:  # readSize reached the buffer's size: the next buffer
            return seg.base + lim, True
        # the check fails (-1), at a bad record or at the buffer's end after a mismatch
        if not master:
            out.findings.append(Finding("reput_stopped", "error", e.file, stop,
                                        f"{e.reason or e.kind}: a slave's reput retries offset "
                                        f"{seg.base + stop + drift} forever"))
            return seg.base + stop + drift, False
        nxt = seg.base + lim + skipped  # reputFromOffset += size - readSize
        if skipped:
            out.findings.append(Finding(
                "reput_drift_skip", "error", e.file, stop,
                f"the reput leaves this file with reputFromOffset {nxt}, {skipped} bytes past its readable end "
                "(the TOTALSIZEs it skipped): it goes on reading from there",
                {"phy_offset": seg.base + stop, "next": nxt}))
        elif e.kind == "invalid" and not (t is not None and t.crc):
            out.findings.append(_unread_rest(seg.display, e, seg.file_size, seg.base + stop))
        return nxt, True


def _unread_rest(file: str, e: SegmentEnd, file_size: int, phy: int) -> Finding:
    """A segment before the recovery window whose records end at an invalid one: the reput dispatches
    nothing after it (a master goes on with the next segment, a slave stops), and no start-up checks it."""
    left = max(file_size - e.file_offset, 0)
    return Finding("reput_skipped_rest_of_segment", "error", file, e.file_offset,
                   f"{e.reason or 'invalid record'} ({e.detail or 'not a record'}): the reput dispatches none of the "
                   f"{left} bytes after it (a master skips to the next segment, a slave stops); the segment lies "
                   "before the recovery window, so no start-up reports it", {"bytes": left, "phy": phy})


# ---------------------------------------------------------------------------------------------
# DLedger mode: what the reput dispatches (storelib.broker.recovery.dledgerwalk's walk)


def reput_ranges(plan: WalkPlan, outcomes: Mapping[int, SegmentOutcome], data_end: int, lo: int, hi: int,
                 by: str = "reput") -> tuple[list[DispatchRange], list[Finding]]:
    """The reput over the data files from ``lo`` to ``hi`` (getData: up to the file's wrote position and
    the committed position): good entries are dispatched, a -1 filler rolls to the next file, a bad record
    skips the rest of the file's buffer ([BUG] in doReput). ``outcomes``: each file's record scan from
    byte 0 (a start past a file's scan end is scanned from there)."""
    S = plan.inputs.segment_size
    files = {s.base: (i, s) for i, s in enumerate(plan.segments)}
    out: list[DispatchRange] = []
    found: list[Finding] = []
    pos = lo
    while pos < hi:
        base = pos - pos % S
        if base not in files or files[base][0] not in outcomes:
            break
        i, seg = files[base]
        wrote = data_end - base if base <= data_end < base + S else S
        end_buf = min(base + wrote, hi)
        if pos >= end_buf:
            break
        rel = pos - base
        e, kind = outcomes[i].end_offset, outcomes[i].end_kind
        try:
            inside = rel != e and not _entry_at(seg, rel)
        except StoreError:
            if seg.loc.local and not os.path.exists(seg.loc.path):  # DLedger's cleaner deleted it since its scan
                pos = base + S
                continue
            raise
        if inside:
            found.append(Finding("reput_inside_entry", "warning", seg.display, rel,
                                 f"the reput starts at {pos}, where no entry starts: it reads no record there and skips "
                                 "the rest of the file"))
            pos = end_buf if end_buf < base + S else base + S
            continue
        reason, size = outcomes[i].reason, outcomes[i].size
        if rel > e:
            se = _reput_scan(plan)(i, rel, None)
            e, kind, reason, size = se.file_offset, se.kind, se.reason, se.size
        stop = min(e, end_buf - base)
        if stop > rel:
            out.append(DispatchRange(base, seg.name, rel, stop, None, by))
        pos = base + max(stop, rel)
        if pos >= end_buf:
            continue
        if kind == "blank":
            pos = base + S
        elif reason == "length_mismatch" and (size or 0) > 0:  # "[BUG]" in doReput: reputpath's drift
            rp = ReputPath()
            pos, _ = one_buffer(plan, i, stop, end_buf - base, {}, None, _reput_scan(plan),
                                lambda k, at: read_length(plan, k, at), True, rp, BODY_OFFSET, by)
            out += rp.dispatch
            found += rp.findings
        else:
            pos = end_buf  # a failing record: the rest of the buffer is skipped
    return out, found


def _reput_scan(plan: WalkPlan):
    """reputpath's ``scan_from`` over DLedger data files: where a record scan from any offset ends."""
    def scan(i: int, at: int, end: int | None) -> SegmentEnd:
        from storelib.scan.scanner import SegmentScan

        seg = plan.segments[i]
        with seg.open() as src:
            sc = SegmentScan(src, seg.display, seg.base, at, end, verify_crc=False, with_properties=False,
                             columns=["phy_offset"], dledger=True, line=plan.inputs.line)
            for _ in sc:
                pass
        assert sc.end is not None
        return sc.end
    return scan


def outcomes_by_file(plan: WalkPlan, result: RecoveryResult) -> dict[int, SegmentOutcome]:
    """The walk's record-scan outcomes keyed by data file index (for :func:`reput_ranges`)."""
    at = {s.base: i for i, s in enumerate(plan.segments)}
    return {at[o.base]: o for o in result.segments if o.base in at}


def _entry_at(seg: Segment, rel: int) -> bool:
    """Does an entry written at file offset ``rel`` start there (magic 1, its pos field = its offset)?"""
    with seg.open() as src:
        head = bytes(src.read(rel, BODY_OFFSET))
    if len(head) < BODY_OFFSET:
        return False
    h = EntryHeader.from_bytes(head)
    return h.magic == ENTRY_MAGIC and h.pos == seg.base + rel


def drift_skips(segs: tuple[Segment, ...], found: list[Finding], S: int) -> tuple[tuple[int, int, str], ...]:
    """Files a reput's "[BUG]" drift never dispatches: those it jumps over, and the one it lands in the middle
    of an entry of (it reads nothing there and skips the rest)."""
    inside = {f.file for f in found if f.kind == "reput_inside_entry"}
    out = []
    for f in found:
        if f.kind == "reput_drift_skip":
            nxt, src = f.extra["next"], f.extra["phy_offset"] - f.extra["phy_offset"] % S
            out += [(s.base, 0, "reput_drift_skips_file") for s in segs if src < s.base and (
                s.base + S <= nxt or (s.base <= nxt and s.display in inside))]
    return tuple(out)


# why the audits' reput-skip warnings (cq_reput_skipped, index_reput_skipped) say the broker never dispatches
# their records (:func:`reput_skipped_at`)
SKIP_WHY = ("they lie after a lost region the broker's reput does not read past: a master's skips the rest of each "
            "segment such a region reaches into, and every reput stops at a missing segment")


def stopping_gaps(gaps: np.ndarray | None, reached: int) -> np.ndarray | None:
    """Of the missing-segment ranges ``gaps``, those a reput whose dispatcher's output reaches ``reached`` (the
    consume queues' max physical offset, the last indexed message) can be stuck at: those starting at or after
    it. A reput stuck at a gap dispatched nothing past it; output past a gap's start says the reput went past
    before the segment went (or started after it: DefaultMessageStore.start sets reputFromOffset from the queues'
    max physical offset, 4.9.8 :252-276; 5.3.3 from the confirm offset, :416, or the queues' with
    recheckReputOffsetFromCq, :455-475), so the records after it are lag or missing as anywhere else."""
    return None if gaps is None else gaps[gaps[:, 0] >= reached]


def reput_skipped_at(lost: np.ndarray, phy: np.ndarray, segment_size: int, gaps: np.ndarray | None = None,
                     master: bool = True) -> np.ndarray:
    """Which records at ``phy`` a broker's reput that read up to them never dispatches. Shared by the consume-queue
    and index audits, as both are dispatchers of that one reput (DefaultMessageStore.doDispatch).

    ``lost``: sorted (k, 2) [start, end) ranges of unreadable bytes. On a master, a record at a region's start
    fails the check (size -1) and doReput adds the rest of the buffer (4.9.8 DefaultMessageStore.java:2063-2074,
    5.3.3 :2916-2927), to the file's end, so the rest of that segment is skipped (in the last file the end is
    its read position, the log's max offset: isCommitLogAvailable turns false and the loop waits there for new
    records, so the skipped ones stay skipped); a region running on into later
    files makes the reput start each of them (the next file start) inside unreadable bytes, which skips each
    such file's records up to its end too: a record is skipped when the last region starting at or before it
    reaches into its segment. A slave stops at the region (it retries the offset): nothing is skipped.
    ``gaps``: [start, end) ranges no segment file holds (missing segments, part of ``lost``; those the reput can
    be stuck at: :func:`stopping_gaps`): getData finds no
    file there and returns null (MappedFileQueue.findMappedFileByOffset, 4.9.8 :476-518, 5.3.3 :671-713),
    so doReput stops (4.9.8 DefaultMessageStore.java:2080-2082, 5.3.3 :2873-2875) and retries the gap's start every 1 ms, while
    isCommitLogAvailable (reputFromOffset < the max offset) stays true: a master's or a slave's reput never
    dispatches a record after a gap."""
    out = np.zeros(len(phy), bool)
    if master and len(lost):
        i = np.searchsorted(lost[:, 0], phy, side="right") - 1
        out = (i >= 0) & (lost[np.clip(i, 0, None), 1] > phy - phy % segment_size)
    if gaps is not None and len(gaps):
        out |= phy >= int(gaps[:, 0].min())
    return out
