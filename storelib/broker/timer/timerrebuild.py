"""The timer store rebuilt from the commitlog (``rebuild --what timer``): the timerlog, the wheel and the
timercheck the broker would hold had it read every record of the timer topic.

Every timer record (storelib.broker.timer.timermsg: the newest record of each timer message, pending,
delivered or deleted, and each recall marker) is enqueued as 5.3.3's TimerMessageStore.doEnqueue does,
in the timer topic's queue order: the unit's prevPos is its slot's lastPos (-1 for a slot holding another
time), a delay of at least the roll window (timerRollWindowSlot) is parked with magic DEFAULT|ROLL at
write time + the window (+ half of it when less than a third of a window remains beyond it), the slot's
firstPos/lastPos/num follow, and the timerlog files close with the filler as TimerLog.append does. A
recall (``TIMER_DEL_UNIQKEY``) is enqueued with magic |= DELETE and takes 1 off its slot's num (doEnqueue
:752-754, :773-774), and the message it deletes stays beside it, as in the broker's wheel (the broker
skips it when the slot is read). Delivered messages keep their units too, in slots already read, as the
broker's own files do (wheel slots are not cleared by delivery). The write time is run-time state the
store does not keep: the enqueue record's store time rounded down to the precision stands in for it
(5.3.3's own enqueue, 300 of the 320 units of the real sample, took the same second; the rest the next
one), so the bytes can differ from the broker's while the content is the same. The checkpoint
(:func:`rebuilt_checkpoint`) says the whole timer topic was read.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.timer.timermsg import PENDING_STATES
from storelib.format.javahash import java_string_hash
from storelib.format.timerstore import (
    MAGIC_DEFAULT,
    MAGIC_DELETE,
    MAGIC_ROLL,
    SLOTS_TOTAL,
    UNIT_SCHEMA,
    UNIT_SIZE,
    TimerCheckpoint,
    slot_index,
    unit_position,
)

TIMER_BLANK_SLOTS = 60


def roll_window_slots(configured: int | None) -> int:
    """timerRollWindowSlots as TimerMessageStore's constructor sets it (:191-196): the setting (None: the
    default, 2 days of slots), but below 2 or above the wheel less its blank slots it is the latter."""
    want = 2 * 86_400 if configured is None else int(configured)
    return SLOTS_TOTAL - TIMER_BLANK_SLOTS if want < 2 or want > SLOTS_TOTAL - TIMER_BLANK_SLOTS else want


NEXT_QUEUE_OFFSET = b"rmqstore.next_timer_queue_offset"  # units' schema metadata, for rebuilt_checkpoint
FIRST_DUE_MS = b"rmqstore.first_due_ms"
PRECISION_MS = b"rmqstore.precision_ms"


def enqueue_units(timers: pa.Table, file_size: int, precision_ms: int = 1000,
                  roll_slots: int | None = None) -> tuple[pa.Table, pa.Table]:
    """(units, slots) for every row of ``timers`` (storelib.broker.timer.timermsg rows, any order: sorted by
    timer queue offset). The units' schema metadata carries the queue offset after the last unit's record
    and the earliest slot still to be read (a pending, deleted or marker row's), for :func:`rebuilt_checkpoint`."""
    slots_in_window = roll_window_slots(roll_slots)
    window = slots_in_window * precision_ms
    rows = timers.sort_by([("timer_queue_offset", "ascending")]).to_pylist()
    first_due: int | None = None
    slots: dict[int, list[int]] = {}  # index -> [time/precision, first, last, num]
    cols: dict[str, list] = {f.name: [] for f in UNIT_SCHEMA}
    for k, r in enumerate(rows):
        write = (r["timer_store_timestamp"] // precision_ms) * precision_ms
        due = int(r["deliver_time_ms"])
        magic = MAGIC_DEFAULT
        if due - write >= window:
            magic |= MAGIC_ROLL
            # doEnqueue :745-749: slots are divided before the precision multiplies them
            third, half = slots_in_window // 3 * precision_ms, slots_in_window // 2 * precision_ms
            due = write + half if due - write - window < third else write + window
        step = 1
        if r.get("delete_key") is not None:  # a recall: magic |= DELETE, the slot's num - 1 (doEnqueue :752, :773)
            magic, step = magic | MAGIC_DELETE, -1
        pos = unit_position(k, file_size)
        idx = int(slot_index(due, precision_ms))
        s = slots.get(idx)
        prev = s[2] if s is not None and s[0] == due // precision_ms else -1
        if s is None or s[0] != due // precision_ms:
            slots[idx] = [due // precision_ms, pos, pos, step]
        else:
            s[2], s[3] = pos, s[3] + step
        if r.get("state", "pending") in PENDING_STATES:
            first_due = due if first_due is None else min(first_due, due)
        for name, v in (("pos", pos), ("file", f"timerlog/{pos - pos % file_size:020d}"), ("file_offset", pos % file_size),
                        ("prev_pos", prev), ("magic", magic), ("roll", bool(magic & MAGIC_ROLL)),
                        ("delete", bool(magic & MAGIC_DELETE)),
                        ("curr_write_ms", write), ("delayed_time", due - write), ("slot_time_ms", due),
                        ("offset_py", r["timer_phy_offset"]), ("size_py", r["timer_size"]),
                        ("hash_real_topic", java_string_hash(r["real_topic"]) if r["real_topic"] is not None else 0),
                        ("reserved", 0)):
            cols[name].append(v)
    meta = {NEXT_QUEUE_OFFSET: str(rows[-1]["timer_queue_offset"] + 1 if rows else -1).encode(),
            PRECISION_MS: str(precision_ms).encode()}
    if first_due is not None:
        meta[FIRST_DUE_MS] = str(first_due).encode()
    units = pa.table(cols, schema=UNIT_SCHEMA.with_metadata(meta))
    idx = sorted(slots)
    slot_table = pa.table({
        "index": pa.array(idx, pa.int32()), "time_ms": pa.array([slots[i][0] * precision_ms for i in idx], pa.int64()),
        "first_pos": pa.array([slots[i][1] for i in idx], pa.int64()),
        "last_pos": pa.array([slots[i][2] for i in idx], pa.int64()),
        "num": pa.array([slots[i][3] for i in idx], pa.int32()), "magic": pa.array([0] * len(idx), pa.int32())})
    return units, slot_table


def rebuilt_checkpoint(cp: TimerCheckpoint | None, units: pa.Table, file_size: int) -> TimerCheckpoint:
    """The checkpoint beside a rebuilt log (:func:`enqueue_units`' units): the whole timer topic read.

    On restart 5.3.3 resumes reading the timer topic at min(the last unit's record's queue offset + 1,
    masterTimerQueueOffset) (TimerMessageStore.recover :288-294, reviseQueueOffset), whatever
    lastTimerQueueOffset says. Keeping the old offsets therefore cannot keep records the rebuild
    enqueued from being read again (twice enqueued, twice delivered), and a log of pending timers only
    makes the broker re-read, and re-deliver, every delivered record after the last pending one (in the
    real sample, queue offsets 318 and 319). So the rebuild enqueues every record, read or not, and
    both offsets go to the one after the last unit's record: the restart reads only what comes after.
    The read time is kept; without a checkpoint it is the earliest slot still to be read (the broker
    would start 7 days back and fire delivered units again). The flush position is the end of the
    last unit (never the next file's start).
    """
    meta = units.schema.metadata or {}
    nxt = int(meta.get(NEXT_QUEUE_OFFSET, b"-1"))
    # the last unit's end: a file that just took its last unit gets its filler only when the next one
    # comes (TimerLog.append), so 157 units of an 8192-byte file end at 8164, not 8192
    end = unit_position(units.num_rows - 1, file_size) + UNIT_SIZE if units.num_rows else 0
    if cp is None:
        due = meta.get(FIRST_DUE_MS)
        read = int(due) if due is not None else 0
        if due is None and units.num_rows:  # nothing left to fire: past every slot written
            read = int(pc.max(units.column("slot_time_ms")).as_py()) + int(meta.get(PRECISION_MS, b"1000"))
        q = max(nxt, 0)
        return TimerCheckpoint(read, end, q, q, 0, 0, 0)
    q_last = cp.last_timer_queue_offset if nxt < 0 else nxt
    q_master = cp.master_timer_queue_offset if nxt < 0 else nxt
    return TimerCheckpoint(cp.last_read_time_ms, end, q_last, q_master, cp.state_version, cp.timestamp, cp.counter)


__all__ = ["FIRST_DUE_MS", "NEXT_QUEUE_OFFSET", "enqueue_units", "rebuilt_checkpoint", "roll_window_slots"]
