"""Audit of the 5.x timer store against the commitlog (runs after the other cross-file checks), by the
rules RocketMQ 5.3.3's TimerMessageStore writes and reads it with.

* the timer files themselves: bad timerlog units, prevPos chains that leave the log or loop, wheel
  slots whose chain ends elsewhere than ``firstPos`` or holds fewer units than ``num`` counts (a deletion
  marker counts -1; chains that run into timerlog files the broker's cleaner deleted are info; a num
  behind its chain is what the broker's wheel flush and recovery leave: a warning), a wheel of the wrong
  size (storelib.format.timerstore);
* every timerlog unit points (offsetPy, sizePy) at a ``rmq_sys_wheel_timer`` record of that size;
  units pointing past the commitlog's end are what a truncation leaves and what the broker's dequeue
  then retries forever (apache/rocketmq#10668); pending units before the commitlog's start point at
  expired data;
* timer records larger than maxMessageSize + 100 bytes stall the broker's timer pipeline (#9654);
* an unrolled unit's slot is its record's TIMER_OUT_MS (the newest units, read record by record);
* timer records the timer store has read but holds no unit for are lost, unless they were due before
  the broker's write time and so put straight out;
* ``timercheck`` agrees with the timerlog (flush position) and with the timer topic's queue;
* pending timers (not deleted by a marker) due later than fileReservedTime after they were written can
  lose their commitlog segment to time-based retention before delivery (#9006).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.storeloads import without_timer_reader_sizes
from storelib.broker.timer.timerchains import judge_chains
from storelib.broker.timer.timermsg import DEL_KEY, Recalls
from storelib.checks.logview import LogView
from storelib.checks.segment import Capped
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location
from storelib.format.timerstore import (
    TIMER_TOPIC,
    TimerLog,
    precision_of,
    read_timer_checkpoint_as_broker,
    read_timerlog,
    read_wheel,
    timer_checkpoint_as_broker,
)

SHOWN = 10  # findings of one kind listed one by one; the rest are counted in the last

if TYPE_CHECKING:
    from storelib.broker.settings.livecut import StoreCut


def _each(out: Capped, kind: str, severity: str, items: list[tuple[str, int | None, str, dict]]) -> None:
    for file, off, detail, extra in items[:SHOWN]:
        out.add(Finding(kind, severity, file, off, detail, extra))
    if len(items) > SHOWN:
        out.add(Finding(kind, severity, "timerlog", None, f"... and {len(items) - SHOWN} more like these",
                        {"count": len(items)}))


def _props_at(cl: Any, phy: int) -> dict[str, str]:
    """A record's properties ({} when it cannot be read: the checks that need them skip it)."""
    try:
        return dict(cl.record_at(int(phy)).column("properties")[0].as_py() or [])
    except (StoreError, IndexError):
        return {}


MAX_ROLLED_READS = 10_000  # rolled pending units whose TIMER_OUT_MS is read from their record


def _deliver_times(root: Location, log: LogView, u: Any, slot: np.ndarray, last_read_ms: int) -> np.ndarray:
    """Each unit's deliver time: its slot time, except for a pending rolled unit (parked at the roll
    window, due later), whose record's TIMER_OUT_MS is read (bounded number of random reads)."""
    from storelib.scan.commitlog import CommitLog

    due = slot.copy()
    rolled = np.flatnonzero(u.column("roll").to_numpy(zero_copy_only=False) & (slot >= last_read_ms))
    if not len(rolled):
        return due
    cl = CommitLog(root.join("commitlog"), log.segment_size)
    py = u.column("offset_py").to_numpy()
    for i in rolled[:MAX_ROLLED_READS].tolist():
        props = _props_at(cl, py[i])  # {} when unreadable: the slot time stays
        try:
            due[i] = max(due[i], int(props.get("TIMER_OUT_MS", due[i])))
        except ValueError:
            pass
    return due


MAX_DELIVER_CHECKS = 20_000  # the newest units whose record's TIMER_OUT_MS is read (one random read each)


def _check_deliver_times(root: Location, log: LogView, u: Any, hit_rows: tuple, out: Capped) -> None:
    """An unrolled unit's slot is its record's deliver time (TIMER_OUT_MS): the newest units (pending ones
    among them) are checked, by reading their records' properties."""
    from storelib.scan.commitlog import CommitLog

    inside, rowc, hit = hit_rows
    roll = u.column("roll").to_numpy(zero_copy_only=False)
    slot = u.column("slot_time_ms").to_numpy()
    py = u.column("offset_py").to_numpy()
    files = u.column("file").to_pylist()
    offs = u.column("file_offset").to_numpy()
    cand = [int(i) for j, i in enumerate(inside.tolist()) if hit[j] and not roll[i]][-MAX_DELIVER_CHECKS:]
    cl = CommitLog(root.join("commitlog"), log.segment_size)
    bad = []
    for i in cand:
        out_ms = _props_at(cl, py[i]).get("TIMER_OUT_MS")  # None when unreadable: not checked
        if out_ms is not None and out_ms.lstrip("-").isdigit() and int(out_ms) != int(slot[i]):
            bad.append((files[i], int(offs[i]), f"slot time {int(slot[i])} but its record's TIMER_OUT_MS is {out_ms}: "
                        "the timer fires at the wrong time", {"offset_py": int(py[i])}))
    _each(out, "timer_unit_deliver_mismatch", "error", bad)


MAX_LOST_READS = 10_000  # unitless timer records whose TIMER_OUT_MS is read (one random read each)


def _check_lost_records(root: Location, log: LogView, timer_code: int, u: Any, read_queue_offset: int,
                        out: Capped) -> None:
    """Timer records the timer store read (queue offset below timercheck's lastTimerQueueOffset) but holds
    no unit for, from the oldest unit's record on (older units may have gone with their timerlog files).

    5.3.3 puts a record whose deliver time is before currWriteTimeMs straight out, with no unit
    (putMessageToTimerWheel :1370-1372; its delivered copy carries TIMER_ENQUEUE_MS=Long.MAX_VALUE).
    currWriteTimeMs only grows (maybeMoveWriteTime), so the next unit's currWriteTime bounds it at the
    record's enqueue: a record due before that bound was put straight out (info); one due at or after it
    was lost (error); after the last unit nothing bounds it (info)."""
    from storelib.scan.commitlog import CommitLog

    unit_py = u.column("offset_py").to_numpy()
    rows = np.flatnonzero(log.topic_idx == timer_code)
    if not len(rows):
        return
    phy, qoff = log.phy[rows], log.qoff[rows]
    missing = rows[(phy >= int(unit_py.min())) & (qoff < read_queue_offset) & ~np.isin(phy, unit_py)]
    if not len(missing):  # every record has its unit: nothing to read
        return
    order = np.argsort(unit_py, kind="stable")
    py_sorted, written = unit_py[order], u.column("curr_write_ms").to_numpy()[order]
    cl = CommitLog(root.join("commitlog"), log.segment_size)
    lost, direct, unsettled = [], 0, 0
    for r in missing.tolist():
        at = int(np.searchsorted(py_sorted, log.phy[r], side="right"))
        if at == len(written) or len(lost) + direct >= MAX_LOST_READS:
            unsettled += 1  # after the last unit nothing bounds currWriteTimeMs (or past the read budget)
            continue
        due = _props_at(cl, log.phy[r]).get("TIMER_OUT_MS")
        if due is not None and due.lstrip("-").isdigit() and int(due) < int(written[at]):
            direct += 1
            continue
        lost.append((f"commitlog/{int(log.phy[r]) // log.segment_size * log.segment_size:020d}",
                     int(log.phy[r]) % log.segment_size,
                     f"timer record (queue offset {int(log.qoff[r])}, TIMER_OUT_MS {due}) read by the timer store "
                     f"(lastTimerQueueOffset {read_queue_offset}) but held by no timerlog unit, though a later unit "
                     f"was written at {int(written[at])}, before it was due: it is never delivered", {}))
    if direct or unsettled:
        out.add(Finding("timer_record_put_directly", "info", "timerlog", None,
                        f"{direct + unsettled} timer record(s) read by the timer store hold no timerlog unit: "
                        f"{direct} were due before the next unit's write time, so the broker put them straight out "
                        "(TimerMessageStore :1370-1372, delivered copy with TIMER_ENQUEUE_MS=Long.MAX_VALUE); "
                        f"{unsettled} came after the last unit (or past {MAX_LOST_READS} reads), where nothing tells "
                        "that from a loss", {"count": direct + unsettled, "unsettled": unsettled}))
    _each(out, "timer_record_lost", "error", lost)


def _live_expired(slot: np.ndarray, expired: np.ndarray, times: tuple[int, int], log_min: int,
                  out: Capped) -> np.ndarray:
    """Of the units whose records the cleaner deleted, those a live broker has certainly not delivered.

    The timercheck the cut read is up to a flush interval old: a unit due between its read time and the
    cut's wall clock may have been delivered since (its record read, then deleted), so it is unsettled
    (info). One due after the cut cannot have been delivered yet: its message is lost."""
    last_read_ms, cut_ms = times
    pending = expired[slot[expired] >= last_read_ms]
    unsettled = pending[slot[pending] <= cut_ms]
    if len(unsettled):
        out.add(Finding("timer_unit_expired_unsettled", "info", "timerlog", None,
                        f"{len(unsettled)} unit(s) due before the cut point before the commitlog's first offset "
                        f"{log_min}: the timer checkpoint read is older than their time, so the "
                        "broker may have delivered them before the cleaner deleted their records",
                        {"count": int(len(unsettled))}))
    return pending[slot[pending] > cut_ms]


def has_timer_store(root: Location) -> bool:
    """Does the store keep a 5.x timer store (a ``timerlog/``)?"""
    return root.fs.get_file_info(root.join("timerlog").path).type.name != "NotFound"


def _units_against_records(log: LogView, py: np.ndarray, size_py: np.ndarray, files: list, offs: np.ndarray,
                           out: Capped) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each unit inside the log points (offsetPy, sizePy) at a timer record of that size; (the units inside,
    their record rows, whether a record starts there)."""
    inside = np.flatnonzero((py >= log.log_min) & (py < log.log_end))
    row = np.searchsorted(log.phy, py[inside])
    rowc = np.clip(row, 0, max(len(log.phy) - 1, 0))
    hit = (row < len(log.phy)) & (log.phy[rowc] == py[inside]) if len(log.phy) else np.zeros(len(inside), bool)
    timer_code = log.topic_code.get(TIMER_TOPIC, -1)
    bad: list[tuple[str, int | None, str, dict]] = []
    for j, i in enumerate(inside.tolist()):
        if not hit[j]:
            if not log.in_lost(np.array([py[i]]))[0]:
                bad.append((files[i], int(offs[i]), f"offsetPy {int(py[i])} is not the start of a record", {}))
            continue
        r = int(rowc[j])
        if int(log.topic_idx[r]) != timer_code:
            bad.append((files[i], int(offs[i]), f"offsetPy {int(py[i])} is a record of topic "
                        f"{log.topic_names[int(log.topic_idx[r])]!r}, not {TIMER_TOPIC}", {}))
        elif int(log.size[r]) != int(size_py[i]):
            bad.append((files[i], int(offs[i]), f"sizePy {int(size_py[i])} but the record at {int(py[i])} has "
                        f"{int(log.size[r])} bytes", {}))
    _each(out, "timer_unit_mismatch", "error", bad)
    return inside, rowc, hit


def _timercheck_ahead(cp: Any, log_end: int, facts: dict[tuple[str, int], dict], out: Capped) -> None:
    """timercheck past the timerlog's end, or past the timer topic's messages in the commitlog."""
    if cp.last_timer_log_flush_pos > log_end:
        out.add(Finding("timercheck_ahead", "error", "config/timercheck", 8,
                        f"lastTimerLogFlushPos {cp.last_timer_log_flush_pos} is past the timerlog's end {log_end}"))
    cq = facts.get((TIMER_TOPIC, 0))
    cl_max = cq["cl_max_offset"] if cq else 0
    if cp.last_timer_queue_offset > cl_max:
        out.add(Finding("timercheck_ahead", "error", "config/timercheck", 16,
                        f"lastTimerQueueOffset {cp.last_timer_queue_offset} is past the timer topic's "
                        f"{cl_max} messages in the commitlog"))


def _settled_wheel_findings(wheel: pa.Table, wf: list[Finding], tl: TimerLog) -> list[Finding]:
    """A running broker appends a timer unit to the timerlog, then points its wheel slot at it
    (TimerMessageStore.doEnqueue, 5.3.3 :769 then :773): a wheel read after the timerlog may name units past the timerlog's last
    read one. Such a slot's chain is in flight, not broken; every other finding stands."""
    pos = tl.units.column("pos").to_numpy()
    read_to = int(pos.max()) if len(pos) else -1
    rows = wheel.filter(pc.invert(wheel.column("chain_ok")))
    flight = {int(o) for o, last in zip(rows.column("file_offset").to_pylist(), rows.column("last_pos").to_pylist())
              if last > read_to}
    return [f for f in wf if not (f.kind == "timerwheel_chain" and f.offset in flight)]


MAX_DELETE_READS = 10_000  # records read to match deletion markers with their targets


def _deleted_units(root: Location, log: LogView, u: Any, due: np.ndarray, precision: int) -> np.ndarray:
    """Units that will never deliver a message: deletion markers (magic DELETE) and the units they delete,
    by the one recall rule (:class:`storelib.broker.timer.timermsg.Recalls`: a marker's TIMER_DEL_UNIQKEY
    names its target, met in the slot of both deliver times; a rolled unit meets its marker in the slot of
    its deliver time). The broker puts no message out for the marker itself. Only units of a marker's slot
    and real-topic hash are read (a marker's REAL_TOPIC is its target's)."""
    from storelib.scan.commitlog import CommitLog

    dead = u.column("delete").to_numpy(zero_copy_only=False).copy()
    marks = np.flatnonzero(dead)
    if not len(marks):
        return dead
    cl = CommitLog(root.join("commitlog"), log.segment_size)
    py = u.column("offset_py").to_numpy()
    hashes = u.column("hash_real_topic").to_numpy()
    tick = due // precision
    recalls = Recalls(precision)
    keyed = []
    for m in marks.tolist():
        key = _props_at(cl, py[m]).get(DEL_KEY)
        if key is not None:
            recalls.mark(key, int(due[m]))
            keyed.append(m)
    reads = 0
    for m in keyed:
        for i in np.flatnonzero(~dead & (tick == tick[m]) & (hashes == hashes[m])).tolist():
            reads += 1
            if reads > MAX_DELETE_READS:
                return dead
            props = _props_at(cl, py[i])
            if recalls.deletes(props.get("REAL_TOPIC"), props.get("UNIQ_KEY"), int(due[i])):
                dead[i] = True
    return dead


def _check_pending(root: Location, log: LogView, u: Any, cp: Any, settings: BrokerSettings, out: Capped,
                   cut: StoreCut | None) -> np.ndarray:
    """Pending units (the wheel has not read their slot: #9006) whose records are gone or may go before
    they are due; deleted timers (:func:`_deleted_units`) are not pending. Returns the expired pending units
    (every unit before the commitlog's start when there is no timercheck)."""
    py = u.column("offset_py").to_numpy()
    expired = np.flatnonzero(py < log.log_min)
    if cp is None or not u.num_rows:
        if len(expired):
            out.add(Finding("timer_unit_expired", "warning", "timerlog", None,
                            f"{len(expired)} unit(s) point before the commitlog's first offset {log.log_min} "
                            "(no timercheck tells delivered ones apart)", {"count": int(len(expired))}))
        return expired
    slot = u.column("slot_time_ms").to_numpy()
    due = _deliver_times(root, log, u, slot, cp.last_read_time_ms)
    alive = (slot >= cp.last_read_time_ms) & ~_deleted_units(root, log, u, due, precision_of(settings))
    expired = expired[alive[expired]]
    if cut is not None:
        expired = _live_expired(slot, expired, (cp.last_read_time_ms, cut.taken_ms), log.log_min, out)
    if len(expired):
        out.add(Finding("timer_unit_expired", "warning", "timerlog", None,
                        f"{len(expired)} pending unit(s) point before the commitlog's first offset {log.log_min}: "
                        "their messages were deleted before delivery", {"count": int(len(expired))}))
    reserved_ms = int(settings.file_reserved_time) * 3_600_000
    outlive = np.flatnonzero(alive & (due - u.column("curr_write_ms").to_numpy() > reserved_ms))
    if len(outlive):
        out.add(Finding("timer_outlives_retention", "warning", "timerlog", None,
                        f"{len(outlive)} pending timer(s) fall due more than fileReservedTime "
                        f"({settings.file_reserved_time} h) after they were written: time-based retention can "
                        "delete their commitlog segment before delivery (apache/rocketmq#9006); "
                        "rmqstore expiry says which a policy loses",
                        {"count": int(len(outlive)), "first_pos": int(u.column("pos").to_numpy()[outlive[0]])}))
    return expired


def check_timer_store(root: Location, log: LogView, settings: BrokerSettings, out: Capped,
                      facts: dict[tuple[str, int], dict], cut: StoreCut | None = None) -> dict[str, Any] | None:
    """The timer store's findings into ``out``; a small summary for the report (None without a timerlog).

    A live store's (``cut``): its timercheck is the one the cut read before the commitlog's end (the
    timer threads flush it after the timerlog, so the timerlog read later holds what it claims), and its
    units may point past the cut (enqueued since: in flight); of the units pointing before the commitlog's
    first offset only pending ones are lost (delivered ones wait for the timerlog's own cleaner)."""
    live = cut is not None and cut.live
    if not has_timer_store(root):
        return None
    precision = precision_of(settings)
    try:
        tl = read_timerlog(root, settings.mapped_file_size_timer_log)
    except StoreError as e:
        out.add(Finding(e.kind, "error", e.file, e.offset, e.detail))
        return None
    wheel, wf = read_wheel(root, tl, precision)
    cp, short = None, None
    try:
        cp, short = timer_checkpoint_as_broker(cut.timercheck) if live and cut.timercheck is not None else (
            (None, None) if live else read_timer_checkpoint_as_broker(root))
    except StoreError as e:
        out.add(Finding(e.kind, "error", e.file, e.offset, e.detail))
    if short is not None:
        out.add(short)
    judged = judge_chains(tl, wheel, without_timer_reader_sizes(list(tl.findings) + wf, settings),
                          None if cp is None else cp.last_read_time_ms)
    for f in _settled_wheel_findings(wheel, judged, tl) if live else judged:
        out.add(f)
    u = tl.units
    py = u.column("offset_py").to_numpy()
    size_py = u.column("size_py").to_numpy().astype(np.int64)
    files = u.column("file").to_pylist()
    offs = u.column("file_offset").to_numpy()

    past = np.flatnonzero(py >= log.log_end)
    if live:
        past = past[:0]
    _each(out, "timer_unit_past_commitlog", "error", [
        (files[i], int(offs[i]), f"points at commitlog offset {int(py[i])}, past its end {log.log_end}: the broker's "
         "dequeue retries it forever (apache/rocketmq#10668)", {"offset_py": int(py[i])}) for i in past.tolist()])
    inside, rowc, hit = _units_against_records(log, py, size_py, files, offs, out)
    timer_code = log.topic_code.get(TIMER_TOPIC, -1)

    big_limit = int(settings.max_message_size) + 100
    if timer_code >= 0:
        big = np.flatnonzero((log.topic_idx == timer_code) & (log.size > big_limit))
        _each(out, "timer_record_too_big", "warning", [
            (f"commitlog/{int(log.phy[r]) // log.segment_size * log.segment_size:020d}",
             int(log.phy[r]) % log.segment_size, f"a {int(log.size[r])}-byte timer record, over maxMessageSize + 100 "
             f"({big_limit}): the broker's timer pipeline stalls on it (apache/rocketmq#9654)", {})
            for r in big.tolist()])

    _check_deliver_times(root, log, u, hit_rows=(inside, rowc, hit), out=out)

    if cp is not None and timer_code >= 0 and u.num_rows:
        _check_lost_records(root, log, timer_code, u, cp.last_timer_queue_offset, out)
    expired = _check_pending(root, log, u, cp, settings, out, cut if live else None)
    if cp is not None:
        _timercheck_ahead(cp, max((f["base"] + f["end_offset"] for f in tl.files), default=0), facts, out)
    return {"timerlog_units": u.num_rows, "timerlog_files": len(tl.files), "wheel_slots_used": wheel.num_rows,
            "units_past_commitlog": int(len(past)), "units_expired": int(len(expired)),
            "checkpoint": None if cp is None else cp.__dict__}


__all__ = ["check_timer_store", "has_timer_store"]
