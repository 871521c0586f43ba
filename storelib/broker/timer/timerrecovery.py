"""What a 5.x broker's start-up does to its timer store (TimerMessageStore.recover, 5.3.3), computed
read-only: where the timerlog ends, which timerlog files it deletes, which wheel slots it rewrites, and
where the timer store resumes reading the timer topic and the wheel.

The steps, as 5.3.3 runs them:

1. ``recoverAndRevise(lastTimerLogFlushPos - the last file's size, check)``: from the last timerlog file
   starting at or before that offset, every unit (size 52, magic 0..15) re-points its wheel slot's
   lastPos at itself (``reviseSlot(time, IGNORE, pos, force)``: a slot holding another time is rewritten
   with first = last = pos); a filler ends a file, the first bad unit ends the walk: the processOffset.
   Files that start past it are deleted (``truncateDirtyFiles``); bytes after it in its file stay.
2. ``reviseQueueOffset``: the last unit's record gives the timer topic's queue offset (checked against the
   timer topic's ConsumeQueue, at most 20 000 units back); reading resumes one after it, bounded by the
   checkpoint's master offset and by the queue's min and max.
3. ``currReadTimeMs = max(lastReadTimeMs, now - 7 d + 60 slots)``; slots due from there whose lastPos
   lies past the processOffset send a second revise pass (no check) from their lowest firstPos.

Without ``config/timercheck`` the broker starts all the same (BrokerController :847 creates it; the
TimerCheckpoint fields start at 0, TimerCheckpoint :58-60): the walk starts at the first timerlog file,
the queue offset is min(x, 0) raised to the timer queue's min offset, so the whole timer queue is read
and enqueued again (records already enqueued or delivered, twice), and the read time is now - 7 days +
60 slots. The plan says so in a ``timercheck_missing`` finding. A timercheck shorter than its 56 bytes of
fields is read the same way past its end (TimerCheckpoint :58 maps 4096 bytes, zeros beyond the file): the
plan works from those values and says so in a ``timercheck_short`` finding.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location, open_source
from storelib.format.timerstore import (
    BLANK_MAGIC,
    SLOT_SIZE,
    SLOTS_TOTAL,
    TIMER_TOPIC,
    UNIT_SIZE,
    TimerCheckpoint,
    list_timerlog_files,
    precision_of,
    read_timer_checkpoint_as_broker,
    slot_index,
)

if TYPE_CHECKING:
    from storelib.broker.settings.brokerconf import BrokerSettings
    from storelib.scan.commitlog import CommitLog

TIMER_BLANK_SLOTS = 60
MAX_CQ_LOOKBACK = 20_000
UNIT_PRE_SIZE_FOR_MSG = 28


def magic_ok(magic: int) -> bool:
    """TimerMessageStore.isMagicOK: only the four flag bits (0 included)."""
    return (magic | 0xF) == 0xF


@dataclass
class TimerRecovery:
    begin_offset: int
    process_offset: int
    stopped_at: int | None  # where the checked walk met a bad unit (None: it ran to the files' end)
    delete_files: list[str]
    slot_changes: list[dict[str, Any]]  # index, time_ms, before [first, last], after [first, last]
    queue_offset: int
    queue_offset_source: str
    read_time_ms: int
    recheck_from: int | None
    wheel_writes: dict[int, bytes] = field(default_factory=dict)  # wheel file offset -> new 24 bytes
    findings: list[Finding] = field(default_factory=list)

    def changes_anything(self) -> bool:
        return bool(self.delete_files or self.wheel_writes)

    def to_json(self) -> dict[str, Any]:
        return {"begin_offset": self.begin_offset, "process_offset": self.process_offset,
                "stopped_at": self.stopped_at, "delete_files": self.delete_files,
                "slots_rewritten": len(self.slot_changes), "slot_changes": self.slot_changes[:200],
                "queue_offset": self.queue_offset, "queue_offset_source": self.queue_offset_source,
                "read_time_ms": self.read_time_ms, "recheck_from": self.recheck_from,
                "findings": [f.to_dict() for f in self.findings]}


class _Wheel:
    """The wheel's slots as the recovery reads and rewrites them (only touched slots are kept)."""

    def __init__(self, loc: Location, precision_ms: int):
        self.loc, self.precision = loc, precision_ms
        info = loc.fs.get_file_info(loc.path)
        self.size = int(info.size or 0) if info.type.name != "NotFound" else 0
        self.slots: dict[int, list[int]] = {}  # index -> [time/precision, first, last]
        self.original: dict[int, tuple[int, int, int]] = {}
        self._src = open_source(loc, self.size) if self.size else None

    def get(self, index: int) -> list[int]:
        if index not in self.slots:
            off = index * SLOT_SIZE
            if self._src is not None and off + 24 <= self.size:
                t, f, la = struct.unpack(">qqq", bytes(self._src.read(off, 24)))
            else:
                t = f = la = 0
            self.slots[index] = [t, f, la]
            self.original[index] = (t, f, la)
        return self.slots[index]

    def revise(self, time_ms: int, pos: int) -> None:
        """reviseSlot(time, IGNORE, pos, force=true)."""
        s = self.get(int(slot_index(time_ms, self.precision)))
        if time_ms // self.precision != s[0]:
            s[:] = [time_ms // self.precision, pos, pos]
        else:
            s[2] = pos

    def used(self) -> list[tuple[int, int, int, int]]:
        """(index, time, first, last) of every slot holding a time (all of the file, for checkPhyPos)."""
        import numpy as np

        if self._src is None:
            return []
        raw = np.frombuffer(bytes(self._src.read(0, self.size - self.size % SLOT_SIZE)),
                            dtype=np.dtype([("t", ">i8"), ("f", ">i8"), ("l", ">i8"), ("n", ">i4"), ("m", ">i4")]))
        idx = np.flatnonzero(raw["t"] != 0)
        out = {int(i): (int(raw["t"][i]), int(raw["f"][i]), int(raw["l"][i])) for i in idx}
        out.update({i: tuple(s) for i, s in self.slots.items() if s[0] != 0})
        return [(i, t, f, la) for i, (t, f, la) in sorted(out.items())]

    def close(self) -> None:
        if self._src is not None:
            self._src.close()


def _revise(root: Location, files: list[tuple[int, str, int]], begin: int, check: bool, wheel: _Wheel,
            end: int | None) -> tuple[int, int | None]:
    """recoverAndRevise: (checkOffset, where a checked walk stopped)."""
    if not files:
        return 0, None
    index = max((i for i, (base, _, _) in enumerate(files) if begin >= base), default=0)
    check_offset = files[index][0]
    for base, name, size in files[index:]:
        limit = size if check or end is None else max(0, min(size, end - base))
        with open_source(root.join("timerlog", name), size) as src:
            data = bytes(src.read(0, min(size, limit + UNIT_SIZE)))
        position, stop = 0, False
        while position < limit:
            if position + 16 > len(data):
                stop = check
                break
            sz, _, magic = struct.unpack_from(">iqi", data, position)
            if magic == BLANK_MAGIC:
                break
            if check and (not magic_ok(magic) or sz != UNIT_SIZE):
                stop = True
                break
            if position + UNIT_PRE_SIZE_FOR_MSG > len(data):
                stop = True
                break
            cw, dt = struct.unpack_from(">qi", data, position + 16)
            if sz == UNIT_SIZE and magic_ok(magic):
                wheel.revise(cw + dt, base + position)
            position += UNIT_SIZE
        check_offset = base + position
        if stop:
            return check_offset, check_offset
    return check_offset, None


def _queue_offset(root: Location, files: list[tuple[int, str, int]], process_offset: int, commitlog: Any,
                  cq: Any) -> int:
    """reviseQueueOffset: the timer topic queue offset of the last unit's record, or -1."""
    at = process_offset - (UNIT_SIZE - UNIT_PRE_SIZE_FOR_MSG)
    f = next(((b, n, s) for b, n, s in files if b <= at < b + s), None)
    if at < 0 or f is None:
        return -1
    with open_source(root.join("timerlog", f[1]), f[2]) as src:
        py, size_py = struct.unpack(">qi", bytes(src.read(at - f[0], 12)))
    try:
        rec = commitlog.record_at(py).to_pylist()[0]
    except (StoreError, IndexError):
        return -1
    if rec["size"] != size_py:
        return -1
    q = int(rec["queue_offset"])
    if cq is None:
        return q
    top = cq.max_offset()
    tmp = q
    for _ in range(MAX_CQ_LOOKBACK):
        if tmp < 0:
            break
        e = cq.entry(tmp) if tmp < top else None
        if e is not None and e[0] == py and e[1] == size_py:
            return tmp
        tmp -= 1
    return q


def plan_timer_recovery(root: Location, settings: BrokerSettings, commitlog: CommitLog, now_ms: int
                        ) -> TimerRecovery | None:
    """The timer store's start-up (module docstring), read-only; None for a store without one."""
    from storelib.broker.settings.cqload import LoadedQueue, min_variant

    files = list_timerlog_files(root)
    if not files:
        return None
    cp, short = read_timer_checkpoint_as_broker(root)
    findings = [] if short is None else [short]
    zero_master = short is not None and "masterTimerQueueOffset" in short.extra["fields_cut"]
    if cp is None:
        zero_master = True
        cp = TimerCheckpoint(0, 0, 0, 0, 0, 0, 0)
        findings.append(Finding("timercheck_missing", "warning", "config/timercheck", None,
                                "no timer checkpoint: the broker starts from zeros (TimerCheckpoint), walks the "
                                "whole timerlog, reads the timer topic again from its first offset (every timer "
                                "record enqueued a second time; those already due are delivered again at once) "
                                "and reads the wheel from now - 7 days; `rebuild --what timer` writes a "
                                "timercheck that says the whole timer topic was read"))
    precision = precision_of(settings)
    wheel = _Wheel(root.join("timerwheel"), precision)
    try:
        begin = max(0, cp.last_timer_log_flush_pos - files[-1][2])
        process, stopped = _revise(root, files, begin, True, wheel, None)
        delete = [f"timerlog/{n}" for b, n, _ in files if b > process]
        cq_loc = root.join("consumequeue", TIMER_TOPIC, "0")
        cq = None
        if root.fs.get_file_info(cq_loc.path).type.name != "NotFound":
            cq = LoadedQueue(cq_loc, segment_size=int(settings.mapped_file_size_consume_queue), topic=TIMER_TOPIC,
                             queue_id=0, phy_limit=commitlog.cut_end)
        try:
            q = _queue_offset(root, files, process, commitlog, cq)
            queue_offset, source = (q + 1, "the last unit's record") if q != -1 else \
                (cp.last_timer_queue_offset, "timercheck lastTimerQueueOffset")
            if zero_master and queue_offset > cp.master_timer_queue_offset:
                source += (f", bounded by masterTimerQueueOffset {cp.master_timer_queue_offset} read "
                           + ("as 0 from a missing timercheck" if short is None else "past a short timercheck's end"))
            queue_offset = min(queue_offset, cp.master_timer_queue_offset)
            if cq is not None:
                lo, hi = cq.min_offset(commitlog.min_offset, variant=min_variant(settings.version)), cq.max_offset()
                queue_offset = max(lo, min(queue_offset, hi))
        finally:
            if cq is not None:
                cq.close()
        read_ms = max(cp.last_read_time_ms,
                      now_ms // precision * precision - SLOTS_TOTAL * precision + TIMER_BLANK_SLOTS * precision)
        start = read_ms // precision
        min_first = min((f for _, t, f, la in wheel.used() if start <= t < start + 2 * SLOTS_TOTAL and la > process),
                        default=None)
        recheck = min_first if min_first is not None and min_first < process else None
        if recheck is not None:
            _revise(root, [f for f in files if f[0] <= process], recheck, False, wheel, process)
        changes, writes = [], {}
        for i, s in sorted(wheel.slots.items()):
            before = wheel.original[i]
            if tuple(s) != before:
                changes.append({"index": i, "time_ms": s[0] * precision, "before": [before[1], before[2]],
                                "after": [s[1], s[2]]})
                writes[i * SLOT_SIZE] = struct.pack(">qqq", *s)
        return TimerRecovery(begin, process, stopped, delete, changes, queue_offset, source, read_ms, recheck, writes,
                             findings)
    finally:
        wheel.close()


__all__ = ["TimerRecovery", "magic_ok", "plan_timer_recovery"]
