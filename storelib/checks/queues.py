"""Queue checks: QUEUEOFFSETs per (topic, queue) in commitlog order, and ConsumeQueue units against the
records both ways (a unit pointing into a region already reported lost counts against that region)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from storelib.broker.dispatch.cqwriter import NO_SLOT
from storelib.broker.recovery.reputpath import SKIP_WHY, reput_skipped_at, reput_skips_rest, stopping_gaps
from storelib.broker.recovery.walkplan import recovery_dispatch_after
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.cqload import LoadedQueue, min_variant
from storelib.broker.settings.strayload import judge_queue, version_of
from storelib.broker.startup.cqrecovery import recovery_tags, writer_slots_of
from storelib.broker.startup.lagdispatch import cq_able_ends, lag_finding, stays_undispatched
from storelib.broker.startup.startup5x import consume_queue_max_phy
from storelib.checks.logview import LogView, is_member, queue_hint, queue_records_exactly, rel_path
from storelib.checks.segment import Capped
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location, data_ranges
from storelib.format.consumequeue import CQ_DTYPE, CQ_UNIT_SIZE, LMQ_PREFIX, batch_cq_topics, list_queues
from storelib.format.record import INNER_BATCH_FLAG, SCHEDULE_TOPIC, gets_cq_unit
from storelib.format.topicname import escape_topic, unsafe_reason, unsafe_topic_finding
from storelib.scan.arrowcols import group_order

if TYPE_CHECKING:
    from storelib.broker.settings.livecut import StoreCut


def check_queue_offsets(log: LogView, out: Capped) -> dict[tuple[str, int], dict]:
    """Per (topic, queue): QUEUEOFFSETs of dispatchable records contiguous and unique, in commitlog order.
    Returns per-queue facts: min/max queue offset and message count in the commitlog."""
    disp = np.flatnonzero(gets_cq_unit(log.tran))
    facts: dict[tuple[str, int], dict] = {}
    if not len(disp):
        return facts
    code = (log.topic_idx[disp] << 32) | (log.qid[disp].astype(np.int64) & 0xFFFFFFFF)
    o = queue_group_order(code, log.topic_idx[disp], log.qid[disp], len(log.topic_names))
    order = disp[o]
    code_s = code[o]
    del code, disp, o  # 8 bytes a record each: not needed past here (the check's peak memory)
    starts = np.flatnonzero(np.r_[True, code_s[1:] != code_s[:-1]])
    stops = np.r_[starts[1:], len(code_s)]
    q = log.qoff[order]
    batch_rec = (log.sysflag[order] & INNER_BATCH_FLAG) != 0
    for a, b in zip(starts.tolist(), stops.tolist()):
        rows = order[a:b]
        topic = log.topic_names[int(log.topic_idx[rows[0]])]
        qid = int(log.qid[rows[0]])
        qq = q[a:b]
        facts[(topic, qid)] = {"cl_min_offset": int(qq.min()), "cl_max_offset": int(qq.max()) + 1, "messages": b - a,
                               "last_phy": int(log.phy[rows[-1]]), "first_phy": int(log.phy[rows[0]])}
        log.queue_rows[(topic, qid)] = rows
        if b - a < 2:
            continue
        d = np.diff(qq)
        skip_batch = batch_rec[a:b - 1]
        for i in np.flatnonzero(d == 0).tolist():
            r = int(rows[i + 1])
            out.add(Finding("duplicate_queue_offset", "error", f"commitlog/{_seg_name(log, r)}", _seg_off(log, r),
                            f"{topic}/{qid}: QUEUEOFFSET {int(qq[i + 1])} already used by the record at "
                            f"{int(log.phy[rows[i]])}; the broker's CQ writer drops this one as a repeat",
                            {"topic": topic, "queue_id": qid, "queue_offset": int(qq[i + 1]), "phy": int(log.phy[r]),
                             "first_phy": int(log.phy[rows[i]])}))
        for i in np.flatnonzero(d < 0).tolist():
            r = int(rows[i + 1])
            out.add(Finding("queue_offset_backwards", "error", f"commitlog/{_seg_name(log, r)}", _seg_off(log, r),
                            f"{topic}/{qid}: QUEUEOFFSET {int(qq[i + 1])} after {int(qq[i])}",
                            {"topic": topic, "queue_id": qid, "phy": int(log.phy[r])}))
        gaps = np.flatnonzero((d > 1) & ~skip_batch)
        for i in gaps.tolist():
            r0, r1 = int(rows[i]), int(rows[i + 1])
            lo, hi = int(log.phy[r0]), int(log.phy[r1])
            if len(log.lost) and np.any((log.lost[:, 0] < hi) & (log.lost[:, 1] > lo)):
                continue  # explained by a lost region between the two records
            out.add(gap_finding(topic, qid, int(qq[i]), int(qq[i + 1]), hi, log.segment_size))
    return facts


def gap_finding(topic: str, qid: int, before: int, after: int, phy: int, segment_size: int) -> Finding:
    """The record at ``phy`` continues its queue at ``after`` where ``before + 1`` was due. No message is
    lost by it: the broker's CQ writer logs "[BUG]logic queue order maybe wrong" and writes the record at
    the queue's next unit (ConsumeQueue.putMessagePositionInfo, 4.9.8 and 5.3.3), so from here on units sit
    below their records' QUEUEOFFSETs (the consume-queue check expects them there: :func:`writer_slots`)."""
    S = segment_size
    k = after - before - 1
    return Finding("queue_offset_gap", "warning", f"commitlog/{phy // S * S:020d}", phy % S,
                   f"{topic}/{qid}: QUEUEOFFSET jumps from {before} to {after} ({k} offsets never written); the "
                   "broker logs \"[BUG]logic queue order maybe wrong\" and puts this record in the queue's next unit, "
                   f"{k} below its QUEUEOFFSET", {"topic": topic, "queue_id": qid, "missing": k, "phy": phy})


def queue_group_order(code: np.ndarray, topic_idx: np.ndarray, qid: np.ndarray, n_topics: int) -> np.ndarray:
    """``np.argsort(code, kind="stable")`` for ``code = topic_idx << 32 | qid (as uint32)``: when queue ids
    are small and non-negative, (topic, queue) numbered densely in the same order fit 16 bits (a radix
    sort, no ``unique``); otherwise :func:`storelib.scan.arrowcols.group_order`."""
    if len(qid) > 1:
        qmin, qmax = int(qid.min()), int(qid.max())
        if qmin >= 0 and n_topics * (qmax + 1) <= 1 << 16:
            return np.argsort((topic_idx * (qmax + 1) + qid).astype(np.uint16), kind="stable")
    return group_order(code)


def _seg_name(log: LogView, row: int) -> str:
    S = log.segment_size
    return f"{int(log.phy[row]) // S * S:020d}"


def _seg_off(log: LogView, row: int) -> int:
    S = log.segment_size
    return int(log.phy[row]) % S


@dataclass
class CQLoad:
    """The consume queues as read from disk (before any comparison with the records): what
    :func:`check_consume_queues` needs, loadable while the segments are still being audited."""

    findings: list[Finding] = field(default_factory=list)  # structural findings, in the order found
    failed: bool = False  # the queue directory could not be listed (the one finding says why)
    per_queue: dict[tuple[str, int], tuple] = field(default_factory=dict)  # (n, units, files, max, min)
    cq_max_phy: int = -1
    live: bool = False  # read as at a live store's cut: clamped at its end, files the cleaner took left out
    vanished: list[str] = field(default_factory=list)  # CQ files deleted after the listing (live)
    # where the records are and whose rules apply: a 4.9.8 delay unit's other tagsCode is read from its record
    root: Location | None = None
    settings: BrokerSettings | None = None
    cq_ends: list[int] | None = None  # lagdispatch.cq_able_ends of the whole log (a task's view holds part of it)

    def reput_from(self, log_min: int) -> int:
        """Where the broker's reput would start: past every unit. On a live store, whose queues are read one
        after the other while the reput thread moves on, every queue's missing suffix is lag: no position
        before which a message would be "never dispatched again" can be told, so it is the log's start."""
        return max(log_min, 0) if self.live else max(self.cq_max_phy, log_min, 0)

    def never_dispatched(self) -> int:
        """The record a normal start skips (-1: none): where 5.3.3's recovery dispatches only records above
        (walkplan.recovery_dispatch_after; 4.9.8 reputs from it; a live store's reput runs): :meth:`never_in`."""
        s = self.settings
        after = None if s is None or self.live else recovery_dispatch_after(
            version_of(s.version), s.dledger is not None, True, self.cq_max_phy)
        return -1 if after is None else after

    def never_in(self, log: LogView) -> int:
        """:meth:`never_dispatched` when the start does not re-dispatch it either (its record in ``log``):
        :func:`storelib.broker.startup.lagdispatch.stays_undispatched`, on :attr:`cq_ends` or ``log``'s."""
        at = self.never_dispatched()
        if at < 0:
            return -1
        ends = self.cq_ends or cq_able_ends(log.phy, log.size, log.tran)
        r = int(log.lookup_field(np.array([at], np.int64))[0])
        return at if r < 0 or stays_undispatched(self.settings, self.cq_max_phy, log.log_min,
                                                 int(log.phy[r] + log.size[r]), log.log_end, log.lost, ends) else -1


def load_consume_queues(root: Location, settings: BrokerSettings, log_min: int, cut: StoreCut | None = None,
                        queues: Iterable[tuple[str, int, LoadedQueue]] | None = None, res: CQLoad | None = None
                        ) -> CQLoad:
    """Read every consume queue's units (one copy out of the mapped files) and offsets (as at ``cut``;
    ``queues``: only these, opened by the caller into ``res``; default: every queue directory,
    :func:`walk_queues`)."""
    res = res if res is not None else CQLoad()
    res.root, res.settings = root, settings
    for topic, qid, cq in walk_queues(root, settings, res, cut) if queues is None else queues:
        try:
            ns, units, files = [], [], []
            for base, display, u in queue_files(cq, root.path):
                ns.append(base // CQ_UNIT_SIZE + np.arange(len(u), dtype=np.int64))
                units.append(u)
                files.append((base, display))
            n = ns[0] if len(ns) == 1 else np.concatenate(ns) if ns else np.zeros(0, np.int64)
            # one copy out of the mapped files (they are closed below)
            u = (np.array(units[0]) if len(units) == 1 else np.concatenate(units) if units
                 else np.zeros(0, CQ_DTYPE))
            cq_max, mpo = cq.max_offset(), cq.max_physic_offset()
            cq_min = cq.min_offset(log_min, variant=min_variant(settings.version)) if cq.segments else 0
        finally:
            cq.close()
        res.cq_max_phy = max(res.cq_max_phy, mpo)
        res.per_queue[(topic, qid)] = (n, u, files, cq_max, cq_min)
    return res


def walk_queues(root: Location, settings: BrokerSettings, res: CQLoad, cut: StoreCut | None = None
                ) -> Iterator[tuple[str, int, LoadedQueue]]:
    """Every queue directory's :class:`LoadedQueue` (the caller closes it), the listing's and each queue's
    structural findings into ``res.findings`` in the order found; ``res.failed`` when the queue directory
    cannot be listed (or is a RocksDB consume queue, which rmqstore does not read: said once). With a live
    ``cut`` each queue is read as at the cut (units dispatched after it are not there yet) and its files
    deleted by the cleaner since the listing are left out (said once, :attr:`CQLoad.vanished`)."""
    for topic, qid, loc in queue_listing(root, res, cut) or []:
        yield topic, qid, open_queue(root, settings, topic, qid, loc, res, cut)
    vanished_finding(res)
    res.cq_max_phy = consume_queue_max_phy(root, settings, res.cq_max_phy, res.live)


def queue_listing(root: Location, res: CQLoad, cut: StoreCut | None = None
                  ) -> list[tuple[str, int, Location]] | None:
    """The queue directories (:func:`storelib.format.consumequeue.list_queues`), the listing's findings into
    ``res.findings``; None (``res.failed``) when the queue directory cannot be listed or is a RocksDB
    consume queue, which rmqstore does not read (said once). ``res.live``: read as at a live ``cut``."""
    rootp = root.path
    limit = cut.commitlog_end if cut is not None and cut.live else None
    res.live = limit is not None
    list_findings: list[Finding] = []
    try:
        queues = list_queues(root, list_findings)
    except StoreError as e:
        if e.kind == "rocksdb_consumequeue":  # a supported broker layout that rmqstore does not read: say so once
            res.findings.append(Finding(e.kind, "warning", rel_path(rootp, e.file), None,
                                        f"{e.detail}: ConsumeQueue checks skipped (rmqstore reads file-based "
                                        "consume queues only); commitlog, index, checkpoint and config are audited",
                                        {"supported": False}))
        else:
            res.findings.append(Finding(e.kind, "error", rel_path(rootp, e.file), e.offset, e.detail))
        res.failed = True
        return None
    for f in list_findings:
        f.file = rel_path(rootp, f.file)
        res.findings.append(f)
    return queues


def open_queue(root: Location, settings: BrokerSettings, topic: str, qid: int, loc: Location, res: CQLoad,
               cut: StoreCut | None = None) -> LoadedQueue:
    """One queue's files listed (the caller closes it), as at a live ``cut``; their structural findings into
    ``res.findings``, its files the cleaner deleted since the listing into ``res.vanished``."""
    limit = cut.commitlog_end if cut is not None and cut.live else None
    cq = LoadedQueue(loc, segment_size=settings.mapped_file_size_consume_queue, topic=topic, queue_id=qid,
                     phy_limit=limit)
    judge_queue(cq, version_of(settings.version))
    for f in cq.findings:
        f.file = rel_path(root.path, f.file)
        res.findings.append(f)
    if cq.vanished:
        res.vanished += [f"consumequeue/{topic}/{qid}/{n}" for n in cq.vanished]
    return cq


def vanished_finding(res: CQLoad) -> None:
    """The consume-queue files the cleaner deleted after the listing (a live store), said once."""
    if res.vanished:
        res.findings.append(Finding("expired_during_run", "info", "consumequeue", None,
                                    f"{len(res.vanished)} consume-queue file(s) deleted by the broker's cleaner after "
                                    f"this run listed them (first: {res.vanished[0]}): expired during the run",
                                    {"files": res.vanished[:100]}))


def queue_files(cq: LoadedQueue, rootp: str) -> Iterator[tuple[int, str | None, np.ndarray]]:
    """A queue's files in order: (logical byte base, display path, units as mapped). The queue's last file
    is preallocated: its units after the last one with a size are invalid and after every valid unit, so
    no check looks at them (its first unit stays: the queue's first offset)."""
    for i, seg in enumerate(segs := cq.by_offset()):  # by offset, as the checks index units
        u = cq.read_units(seg)
        if i == len(segs) - 1:
            keep = _units_before_invalid_tail(u, seg.loc.path if seg.loc.local else None)
            u = u[:max(keep, 1 if i == 0 else 0)]
        yield seg.base, rel_path(rootp, seg.path), u


def _units_before_invalid_tail(units: np.ndarray, path: str | None) -> int:
    """How many of a CQ file's units come before its trailing units whose size field is zero (invalid:
    a unit is valid only with size > 0). ``path``: the file when local; units in its holes (a
    preallocated file is sparse) are zeros without being read (:func:`storelib.fileio.bytesource.data_ranges`)."""
    n = len(units)
    ranges = data_ranges(path, 0, n * CQ_UNIT_SIZE)
    if not ranges:
        return 0
    n = min(n, -(-ranges[-1][1] // CQ_UNIT_SIZE))
    off = units.dtype.fields["size"][1]
    if units.dtype.itemsize % 4 or off % 4:
        return n
    # the size field of each unit as raw 32-bit words (zero or not, whatever the byte order): no copy
    size = units[:n].view(np.uint32).reshape(n, units.dtype.itemsize // 4)[:, off // 4]
    nz = size[::-1] != 0
    j = int(nz.argmax()) if n else 0
    return n - j if n and nz[j] else 0


def check_consume_queues(root: Location, log: LogView, settings: BrokerSettings, out: Capped, facts: dict,
                         loaded: CQLoad | None = None, cut: StoreCut | None = None) -> dict:
    """ConsumeQueue entries vs records both ways; queue min/max offsets and lag. Returns per-queue stats.

    ``loaded``: the queues read beforehand (:func:`load_consume_queues`, same ``log.log_min``), else they are
    read here (as at ``cut``)."""
    if loaded is None:
        loaded = load_consume_queues(root, settings, log.log_min, cut)
    out.extend(loaded.findings)
    if loaded.failed:
        return {}
    stats, reput_from = check_queue_units(log, out, facts, loaded)
    queues_without_cq(root, log.segment_size, facts, set(loaded.per_queue), reput_from, out, stats)
    stats["__reput_from__"] = reput_from  # type: ignore[index]
    return stats


def check_queue_units(log: LogView, out: Capped, facts: dict, loaded: CQLoad) -> tuple[dict, int]:
    """Each loaded queue's units against the records and its records beyond them: (per-queue stats, the
    reput position). A queue group's task runs this over its own queues."""
    stats: dict[tuple[str, int], dict] = {}
    reput_from = loaded.reput_from(log.log_min)
    never = loaded.never_in(log)
    for (topic, qid), (n, u, files, cq_max, cq_min) in loaded.per_queue.items():
        last_valid, slots = _check_units(log, out, topic, qid, n, u, files, loaded)
        fact = facts.get((topic, qid))
        lag, behind_bytes = _message_side(log, out, topic, qid, n, last_valid, fact, reput_from, slots, never)
        stats[(topic, qid)] = {"topic": topic, "queue_id": qid, "min_offset": cq_min, "max_offset": cq_max,
                               "raw_max_offset": int(n[last_valid]) + 1 if last_valid >= 0 else cq_max,
                               "cl_max_offset": fact["cl_max_offset"] if fact else None,
                               "messages": fact["messages"] if fact else 0, "lag": lag, "lag_bytes": behind_bytes}
    return stats, reput_from


def _check_units(log: LogView, out: Capped, topic: str, qid: int, n: np.ndarray, u: np.ndarray,
                 files: list[tuple[int, str | None]], loaded: CQLoad | None = None) -> tuple[int, WriterSlots | None]:
    """One queue's units against the records: holes before the last valid unit, units pointing past the
    log or at no record start, units whose record disagrees (a record's unit is at the slot the broker's
    writer gives it: :func:`writer_slots`). Returns the last valid unit's index (-1) and those slots."""
    from storelib.format.consumequeue import filler_mask

    bases = np.array([b for b, _ in files], dtype=np.int64)

    def where(k: int, n=n, bases=bases, files=files) -> tuple[str | None, int]:
        byte = int(n[k]) * CQ_UNIT_SIZE
        i = int(np.searchsorted(bases, byte, side="right")) - 1
        return files[i][1], byte - int(bases[i])

    phy = u["phy_offset"].astype(np.int64)
    size = u["size"].astype(np.int64)
    valid = (phy >= 0) & (size > 0)
    filler = filler_mask(u) if len(u) else np.zeros(0, bool)
    last_valid = len(valid) - 1 - int(valid[::-1].argmax()) if valid.any() else -1
    # holes: invalid units before the last valid one
    holes = np.flatnonzero(~valid[: last_valid + 1])
    if len(holes):
        run_starts = holes[np.r_[True, np.diff(holes) > 1]]
        run_lens = np.diff(np.r_[np.flatnonzero(np.r_[True, np.diff(holes) > 1]), len(holes)])
        for k, ln in zip(run_starts.tolist(), run_lens.tolist()):
            f, off = where(k)
            out.add(Finding("cq_entry_missing", "error", f, off,
                            f"{topic}/{qid}: {ln} invalid unit(s) at queue offset {int(n[k])} before later valid "
                            "entries; the broker's queue ends here (recovery truncates it, later entries are lost)",
                            {"topic": topic, "queue_id": qid, "queue_offset": int(n[k]), "count": ln}))
    chk = np.flatnonzero(valid & ~filler)
    rows = queue_records_exactly(log, log.queue_rows.get((topic, qid)), phy[chk], n[chk])
    slots = None if rows is not None or topic.startswith(LMQ_PREFIX) else writer_slots(
        log, log.queue_rows.get((topic, qid)), n, u, valid & ~filler,
        reput_master(s := loaded.settings if loaded is not None else None), s and s.mapped_file_size_consume_queue,
        stopping_gaps(log.gaps, loaded.cq_max_phy if loaded is not None else -1))
    exact = rows is not None
    if rows is None:
        rows = log.lookup_field(phy[chk], queue_hint(log, (topic, qid), n[chk]))
    tcode = log.topic_code.get(topic, -1)
    miss = rows < 0
    mp = phy[chk][miss]
    expired = mp < log.log_min
    lost = log.in_lost(mp)
    past = (mp >= log.log_end) & ~lost
    mid = ~(past | expired | lost)
    ks = chk[miss]
    if past.any():
        k0 = int(ks[past][0])
        f, off = where(k0)
        out.add(Finding("cq_entry_past_commitlog", "error", f, off,
                        f"{topic}/{qid}: {int(past.sum())} entries from queue offset {int(n[k0])} point past the end "
                        f"of the commitlog data ({log.log_end}); recovery truncates them",
                        {"topic": topic, "queue_id": qid, "count": int(past.sum()), "queue_offset": int(n[k0])}))
    for k in ks[mid].tolist():
        f, off = where(k)
        out.add(Finding("cq_entry_not_record_start", "error", f, off,
                        f"{topic}/{qid} offset {int(n[k])}: phyOffset {int(phy[k])} is not the start of a record",
                        {"topic": topic, "queue_id": qid, "queue_offset": int(n[k]), "phy": int(phy[k])}))
    hit = chk[~miss]
    r = rows[~miss]
    if len(hit):
        bad_size = log.size[r] != size[hit]
        if exact:  # the queue's own dispatchable records, with these queue offsets
            bad_topic = bad_qo = bad_tran = np.zeros(len(hit), bool)
        else:
            # a light message queue holds multi-dispatch copies of other queues' records: their topic,
            # queue and offset are not its own (what lists it, INNER_MULTI_DISPATCH, is not read here)
            copies = topic.startswith(LMQ_PREFIX)
            bad_topic = np.zeros(len(hit), bool) if copies else (log.topic_idx[r] != tcode) | (log.qid[r] != qid)
            bad_qo = np.zeros(len(hit), bool) if copies else (
                log.qoff[r] if slots is None else slots.of_rows(r, log.qoff[r])) != n[hit]
            bad_tran = ~gets_cq_unit(log.tran[r])
        bad_tags = log.tags[r] != u["tags_code"][hit].astype(np.int64)
        if topic == SCHEDULE_TOPIC and bad_tags.any() and loaded is not None:
            j = np.flatnonzero(bad_tags)
            bad_tags[j] = recovery_tags(loaded.root, loaded.settings, log.phy[r[j]]) != \
                u["tags_code"][hit[j]].astype(np.int64)
        bad = bad_size | bad_topic | bad_qo | bad_tags | bad_tran
        for j in np.flatnonzero(bad).tolist():
            k, rr = int(hit[j]), int(r[j])
            what = []
            if bad_size[j]:
                what.append(f"size {int(size[k])} vs record {int(log.size[rr])}")
            if bad_topic[j]:
                what.append(f"record is {log.topic_names[int(log.topic_idx[rr])]}/{int(log.qid[rr])}")
            if bad_qo[j]:
                what.append(f"record QUEUEOFFSET {int(log.qoff[rr])}" + _slot_text(slots, rr))
            if bad_tags[j]:
                what.append(f"tagsCode {int(u['tags_code'][k])} vs record {int(log.tags[rr])}")
            if bad_tran[j]:
                what.append("record is a PREPARED/ROLLBACK transaction record (never dispatched)")
            f, off = where(k)
            out.add(Finding("cq_entry_mismatch", "error", f, off,
                            f"{topic}/{qid} offset {int(n[k])} → record at {int(phy[k])}: " + "; ".join(what),
                            {"topic": topic, "queue_id": qid, "queue_offset": int(n[k]), "phy": int(phy[k])}))
    return last_valid, slots


@dataclass
class WriterSlots:
    """Where the broker's CQ writer put a queue's records when slot and QUEUEOFFSET part. putMessagePositionInfo
    (ConsumeQueue.java, 4.9.8 and 5.3.3) writes each unit at the queue's write position whatever the record's
    QUEUEOFFSET (a jump is logged as "[BUG]logic queue order maybe wrong") and drops one below it unless it is
    0 (a repeat); records it never got leave no slot: a master's reput (both lines) skips the rest of a segment after
    a record it cannot decode (``skipped``), and a 5.3.3 normal start never dispatches the record starting at
    the queues' max physical offset (``missing``, as any record with no unit whose slot a later record holds).
    ``slot``: per record of ``recs`` (the queue's dispatchable rows, commitlog order) its unit's queue offset,
    NO_SLOT for none (-1 is a unit's once QUEUEOFFSETs go negative)."""

    recs: np.ndarray
    slot: np.ndarray
    skipped: np.ndarray
    missing: np.ndarray

    def of_rows(self, rows: np.ndarray, default: np.ndarray) -> np.ndarray:
        """The slot of each of ``rows`` (``default`` for a row that is not one of the queue's records)."""
        if not len(self.recs):
            return default
        i = np.minimum(np.searchsorted(self.recs, rows), len(self.recs) - 1)
        return np.where(self.recs[i] == rows, self.slot[i], default)


def writer_slots(log: LogView, recs: np.ndarray | None, n: np.ndarray, u: np.ndarray, ok: np.ndarray,
                 master: bool, segment_size: int | None = None, gaps: np.ndarray | None = None) -> WriterSlots | None:
    """The broker's slots of a queue's records (:class:`WriterSlots`; ``ok``: its valid units that are not
    fillers), None when each record's slot is its QUEUEOFFSET (offsets run on by one, the first and last units
    theirs: every healthy queue). The writer is our rebuild's (cqwriter.build_consume_queues), started at the
    first record's unit (records since expired shift them all), or new (None) when that record has none and a
    file has a negative name (the record created the queue there); a unit in a lost region keeps its slot.
    ``gaps``: the missing segments the reput stops at (:func:`~storelib.broker.recovery.reputpath.stopping_gaps`)."""
    if recs is None or not len(recs) or not len(n) or np.any(log.sysflag[recs] & INNER_BATCH_FLAG):
        return None
    qo, fld, uphy = log.qoff[recs], log.field[recs], u["phy_offset"].astype(np.int64)
    k = min(int(np.searchsorted(n, qo[0])), len(n) - 1)  # a healthy queue: its unit at its QUEUEOFFSET
    at = [k] if ok[k] and int(uphy[k]) == int(fld[0]) else np.flatnonzero(ok & (uphy == int(fld[0])))
    anchor = int(n[at[0]]) if len(at) else int(qo[0])
    start = anchor if len(at) else None if anchor < 0 and int(n[0]) < 0 else max(anchor, 0)
    last = len(ok) - 1 - int(ok[::-1].argmax()) if ok.any() else -1
    j = int(np.searchsorted(qo, n[last])) if last >= 0 else 0
    sk = reput_skipped_at(log.lost, log.phy[recs], log.segment_size, gaps, master)  # never read by the reput
    if anchor == int(qo[0]) and bool(np.all(np.diff(qo) == 1)) and (
            last < 0 or j >= len(qo) or (qo[j] == n[last] and fld[j] == uphy[last])) and \
            not sk[j + 1 if last >= 0 else 0:].any():  # (such records past the last unit are no lag)
        return None
    up = uphy[ok]
    has_unit = is_member(fld, up if bool(np.all(up[1:] >= up[:-1])) else np.sort(up))  # units ascend: no sort
    skipped = sk & ~has_unit  # records the reput never dispatches (after a lost region, or a missing segment)
    gone = np.flatnonzero(ok & log.in_lost(uphy))  # records lost since: their units' slots stay theirs
    lost = (uphy[gone], n[gone])
    slot = writer_slots_of(log.field[recs], log.size[recs], qo, ~skipped, lost, start, segment_size)
    missing = ~has_unit & ~skipped & (slot != NO_SLOT)  # no unit: missing when a later record has its slot
    c = np.flatnonzero(missing)
    if len(c):
        ui = np.minimum(np.searchsorted(n, slot[c]), len(n) - 1)
        missing[c] = (n[ui] == slot[c]) & ok[ui] & (uphy[ui] > fld[c]) & is_member(uphy[ui], np.sort(fld[has_unit]))
    if missing.any():
        slot = writer_slots_of(log.field[recs], log.size[recs], qo, ~skipped & ~missing, lost, start, segment_size)
    return WriterSlots(recs, slot, skipped, missing)


def reput_master(settings: BrokerSettings | None) -> bool:
    """:func:`storelib.broker.recovery.reputpath.reput_skips_rest` for these settings (False without any)."""
    return settings is not None and reput_skips_rest(settings.broker_id, settings.dledger is not None)


def _slot_text(slots: WriterSlots | None, row: int) -> str:
    """Where the broker's writer puts the record of ``row`` when that is not its QUEUEOFFSET."""
    if slots is None or not is_member(np.array([row]), slots.recs)[0]:
        return ""
    s = int(slots.of_rows(np.array([row]), np.array([NO_SLOT]))[0])
    return " (the broker's writer gives it no unit)" if s == NO_SLOT else f" (the broker's writer puts it at {s})"


def _unwritten_findings(log: LogView, out: Capped, topic: str, qid: int, slots: WriterSlots) -> None:
    """A queue's records the broker never wrote a unit for while later ones took their slots: after a lost
    region in their segment (``skipped``: a master's reput, DefaultMessageStore.doReput in 4.9.8 and 5.3.3,
    skips the rest of a segment after a record it cannot decode; the broker's own doing, a warning), or anywhere else
    (``missing``: lost to consumers, an error; 5.3.3 does it to the record starting at the queues' max
    physical offset on a normal start, CommitLog.recoverNormally dispatching only records past it)."""
    S = log.segment_size
    for mask, kind, sev, why in (
            (slots.skipped, "cq_reput_skipped", "warning", SKIP_WHY),
            (slots.missing, "cq_entries_missing_for_messages", "error", "later messages of the queue hold their "
             "slots: the broker never dispatches them again")):
        if mask.any():
            rows = slots.recs[mask]
            p = int(log.phy[rows[0]])
            out.add(Finding(kind, sev, f"commitlog/{p // S * S:020d}", p % S,
                            f"{topic}/{qid}: {len(rows)} message(s) from queue offset {int(log.qoff[rows[0]])} "
                            f"(phy {p}) have no CQ entry; {why}",
                            {"topic": topic, "queue_id": qid, "count": len(rows), "phy": p,
                             "last_phy": int(log.phy[rows[-1]])}))


def _message_side(log: LogView, out: Capped, topic: str, qid: int, n: np.ndarray, last_valid: int,
                  fact: dict | None, reput_from: int, slots: WriterSlots | None = None, never: int = -1
                  ) -> tuple[int, int]:
    """Records of the queue beyond its valid units (lag, or lost to the broker before the reput position)
    and below its first file, by the slot the broker's writer gives each (``slots``; else its QUEUEOFFSET).
    ``never``: :meth:`CQLoad.never_in`. Returns (lag messages, lag bytes)."""
    tcode = log.topic_code.get(topic, -1)
    lag = 0
    behind_bytes = 0
    if fact is not None and tcode >= 0:
        recs = log.queue_rows[(topic, qid)]  # dispatchable records of the queue, commitlog order
        qo = log.qoff[recs] if slots is None else slots.slot
        # no valid unit: every record is beyond it but those the writer drops (NO_SLOT, never above it)
        last_n = int(n[last_valid]) if last_valid >= 0 else NO_SLOT
        beyond = recs[qo > last_n]
        if len(beyond):
            after = log.phy[beyond] >= reput_from
            lag = len(beyond)
            behind_bytes = int(log.size[beyond].sum())
            if after.all():
                at = np.flatnonzero(log.field[beyond] == never) if never >= 0 else []
                out.add(lag_finding(topic, qid, len(beyond), behind_bytes, int(log.qoff[beyond[0]]), reput_from,
                                    (never, int(log.qoff[beyond[at[0]]])) if len(at) else None))
            else:
                b0 = beyond[~after]
                out.add(Finding("cq_entries_missing_for_messages", "error", f"consumequeue/{topic}/{qid}", None,
                                f"{len(b0)} messages from queue offset {int(log.qoff[b0[0]])} (phy {int(log.phy[b0[0]])})"
                                f" have no CQ entry and lie before the reput position {reput_from}: the broker "
                                "never dispatches them again", {"topic": topic, "queue_id": qid, "count": len(b0)}))
        if slots is not None:
            _unwritten_findings(log, out, topic, qid, slots)
        first_n = int(n[0]) if len(n) else None
        if first_n is not None:
            before = recs[(qo < first_n) & (log.phy[recs] >= log.log_min) & ((qo != NO_SLOT) | (slots is None))]
            if len(before):
                out.add(Finding("cq_file_missing", "error", f"consumequeue/{topic}/{qid}", None,
                                f"{len(before)} messages with queue offsets below {first_n} are in the commitlog but "
                                "no CQ file holds their entries", {"topic": topic, "queue_id": qid,
                                                                    "last_phy": int(log.phy[before[-1]])}))
    return lag, behind_bytes


def queues_without_cq(root: Location, segment_size: int, facts: dict, seen_queues: set, reput_from: int,
                      out: Capped, stats: dict) -> None:
    """Queues with dispatchable records and no consume-queue directory: missing, behind, BatchConsumeQueue
    topics (not read), or topics whose name cannot be a directory (their queues' stats say all is lag)."""
    unsafe: dict[str, list[int]] = {}  # topics that cannot be a directory: [records, first phy], one finding each
    batch = batch_cq_topics(root)
    batch_msgs: dict[str, int] = {}
    for key, fact in facts.items():
        if key in seen_queues:
            continue
        topic, qid = key
        if topic in batch:  # its queues are BatchConsumeQueue files: not missing, not read
            batch_msgs[topic] = batch_msgs.get(topic, 0) + int(fact["messages"])
            continue
        if unsafe_reason(topic) is not None:
            u = unsafe.setdefault(topic, [0, int(fact["first_phy"])])
            u[0] += int(fact["messages"])
            u[1] = min(u[1], int(fact["first_phy"]))
            stats[key] = {"topic": topic, "queue_id": qid, "min_offset": 0, "max_offset": 0,
                          "cl_max_offset": fact["cl_max_offset"], "messages": fact["messages"],
                          "lag": fact["messages"], "lag_bytes": 0}
            continue
        sev = "warning" if fact["first_phy"] >= reput_from else "error"
        out.add(Finding("queue_missing" if sev == "error" else "queue_behind_commitlog", sev,
                        f"consumequeue/{topic}/{qid}", None,
                        f"{fact['messages']} dispatchable messages but no consume queue directory"
                        + ("; the broker dispatches them on start" if sev == "warning" else
                           " and they lie before the reput position: the broker never rebuilds it"),
                        {"topic": topic, "queue_id": qid, "count": fact["messages"]}))
    for topic, n in sorted(batch_msgs.items()):
        out.add(Finding("batch_consume_queue", "warning", f"batchconsumequeue/{topic}", None,
                        f"topic {escape_topic(topic)} keeps its queues as 5.x BatchConsumeQueue files "
                        f"({len(batch[topic])} queue(s)), which rmqstore does not audit: its {n} messages are not "
                        "cross-checked against a consume queue (a 5.3.3 start loads and recovers them, and their max "
                        "physical offset helps pick its recovery window: recover --plan models it)",
                        {"topic": topic, "queues": batch[topic], "messages": n, "supported": False}))
    S = segment_size
    for topic, (n, first) in sorted(unsafe.items()):
        out.add(unsafe_topic_finding(topic, f"commitlog/{first - first % S:020d}", first % S, n, first))
