"""A timerlog and wheel for the pending timer messages, rebuilt from the commitlog (``rebuild --what timer``).

Each pending timer (storelib.broker.timer.timermsg: an enqueue record without a delivered copy) is enqueued as 5.3.3's
TimerMessageStore.doEnqueue does, in the timer topic's queue order: the unit's prevPos is its slot's
lastPos (-1 for a slot holding another time), a delay of at least the roll window (timerRollWindowSlot)
is parked with magic DEFAULT|ROLL at write time + the window (+ half of it when less than a third of a
window remains beyond it), the slot's firstPos/lastPos/num follow, and the timerlog files close with the
filler as TimerLog.append does. A recall (``TIMER_DEL_UNIQKEY``) is enqueued with magic |= DELETE and takes
1 off its slot's num (doEnqueue :752-754, :773-774), and the message it deletes stays beside it, as in the
broker's wheel (the broker skips it when the slot is read). The write time is run-time state the store does not keep: the enqueue
record's store time rounded down to the precision stands in for it (5.3.3's own enqueue, 300 of the 320
units of the real sample, took the same second; the rest the next one), so the bytes can differ from the
broker's while the content is the same: every pending timer has one unit, in the slot of its deliver
time unless rolled, chained as the broker chains them. The checkpoint's read position and queue offsets
are kept, its flush position is the rebuilt log's end.
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
    TimerCheckpoint,
    slot_index,
    unit_position,
)

TIMER_BLANK_SLOTS = 60


def roll_window_slots(configured: int | None) -> int:
    """timerRollWindowSlots: the setting (default 2 days of slots), at most the wheel less its blank slots."""
    want = int(configured) if configured else 2 * 86_400
    return min(want, SLOTS_TOTAL - TIMER_BLANK_SLOTS)


def enqueue_units(pending: pa.Table, file_size: int, precision_ms: int = 1000,
                  roll_slots: int | None = None) -> tuple[pa.Table, pa.Table]:
    """(units, slots) for ``pending`` timers (storelib.broker.timer.timermsg rows, any order: sorted by timer queue offset)."""
    window = roll_window_slots(roll_slots) * precision_ms
    p = pending.filter(pc.is_in(pending.column("state"), pa.array(PENDING_STATES))) \
        if "state" in pending.schema.names else pending
    rows = p.sort_by([("timer_queue_offset", "ascending")]).to_pylist()
    slots: dict[int, list[int]] = {}  # index -> [time/precision, first, last, num]
    cols: dict[str, list] = {f.name: [] for f in UNIT_SCHEMA}
    for k, r in enumerate(rows):
        write = (r["timer_store_timestamp"] // precision_ms) * precision_ms
        due = int(r["deliver_time_ms"])
        magic = MAGIC_DEFAULT
        if due - write >= window:
            magic |= MAGIC_ROLL
            due = write + window // 2 if due - write - window < window // 3 else write + window
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
        for name, v in (("pos", pos), ("file", f"timerlog/{pos - pos % file_size:020d}"), ("file_offset", pos % file_size),
                        ("prev_pos", prev), ("magic", magic), ("roll", bool(magic & MAGIC_ROLL)),
                        ("delete", bool(magic & MAGIC_DELETE)),
                        ("curr_write_ms", write), ("delayed_time", due - write), ("slot_time_ms", due),
                        ("offset_py", r["timer_phy_offset"]), ("size_py", r["timer_size"]),
                        ("hash_real_topic", java_string_hash(r["real_topic"]) if r["real_topic"] is not None else 0),
                        ("reserved", 0)):
            cols[name].append(v)
    units = pa.table(cols, schema=UNIT_SCHEMA)
    idx = sorted(slots)
    slot_table = pa.table({
        "index": pa.array(idx, pa.int32()), "time_ms": pa.array([slots[i][0] * precision_ms for i in idx], pa.int64()),
        "first_pos": pa.array([slots[i][1] for i in idx], pa.int64()),
        "last_pos": pa.array([slots[i][2] for i in idx], pa.int64()),
        "num": pa.array([slots[i][3] for i in idx], pa.int32()), "magic": pa.array([0] * len(idx), pa.int32())})
    return units, slot_table


def rebuilt_checkpoint(cp: TimerCheckpoint | None, units: pa.Table, file_size: int) -> TimerCheckpoint:
    """The checkpoint beside a rebuilt log: read position and queue offsets kept, flush position = its end."""
    end = unit_position(units.num_rows, file_size) if units.num_rows else 0
    if cp is None:
        return TimerCheckpoint(0, end, 0, 0, 0, 0, 0)
    return TimerCheckpoint(cp.last_read_time_ms, end, cp.last_timer_queue_offset, cp.master_timer_queue_offset,
                           cp.state_version, cp.timestamp, cp.counter)


__all__ = ["enqueue_units", "rebuilt_checkpoint", "roll_window_slots"]
