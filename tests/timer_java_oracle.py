"""Test-only oracle: 5.3.3's TimerMessageStore.doEnqueue + TimerLog.append + TimerWheel.putSlot, in Python.

From the reviewer's emulation (it reproduces the real 5.3.3 timer sample's timerlog and wheel byte for
byte from the sample's own unit inputs). Kept under tests/ only: storelib must not use it.
Java lines (5.3.3 TimerMessageStore): roll :745-749 (slots divided before multiplying by the precision),
delete :752-754 and :773-774, the roll window setting :191-196.
"""

from __future__ import annotations

import pyarrow as pa

from storelib.format.timerstore import SLOTS_TOTAL, UNIT_SCHEMA, unit_position

TIMER_BLANK_SLOTS = 60


def java_roll_window(configured: int) -> int:
    """TimerMessageStore's constructor: a timerRollWindowSlot above slotsTotal - 60 or below 2 becomes slotsTotal - 60."""
    if configured > SLOTS_TOTAL - TIMER_BLANK_SLOTS or configured < 2:
        return SLOTS_TOTAL - TIMER_BLANK_SLOTS
    return configured


def java_enqueue(reqs: list[dict], file_size: int, precision: int = 1000,
                 window_slots: int = 172800) -> tuple[pa.Table, pa.Table]:
    """reqs (queue order): write_ms (currWriteTimeMs), due (TIMER_OUT_MS), offset_py, size_py, hash, delete.
    Returns (units, slots) as Java leaves them, starting from an empty wheel."""
    wheel: dict[int, list[int]] = {}  # index -> [time/prec, first, last, num, magic]
    cols: dict[str, list] = {f.name: [] for f in UNIT_SCHEMA}
    for k, r in enumerate(reqs):
        w, d = r["write_ms"], r["due"]
        magic = 1
        if d - w >= window_slots * precision:
            magic |= 2
            if d - w - window_slots * precision < (window_slots // 3) * precision:
                d = w + (window_slots // 2) * precision
            else:
                d = w + window_slots * precision
        if r.get("delete"):
            magic |= 4
        idx = int((d // precision) % (SLOTS_TOTAL * 2))
        s = wheel.get(idx)
        slot = s if s is not None and s[0] == d // precision else [-1, -1, -1, 0, 0]
        pos = unit_position(k, file_size)
        delay = ((d - w + 2**31) % 2**32) - 2**31  # the (int) cast
        wheel[idx] = [d // precision, pos if slot[1] == -1 else slot[1], pos,
                      slot[3] - 1 if r.get("delete") else slot[3] + 1, slot[4]]
        for name, v in (("pos", pos), ("file", f"timerlog/{pos - pos % file_size:020d}"),
                        ("file_offset", pos % file_size), ("prev_pos", slot[2]), ("magic", magic),
                        ("roll", bool(magic & 2)), ("delete", bool(magic & 4)), ("curr_write_ms", w),
                        ("delayed_time", delay), ("slot_time_ms", w + delay), ("offset_py", r["offset_py"]),
                        ("size_py", r["size_py"]), ("hash_real_topic", r["hash"]), ("reserved", 0)):
            cols[name].append(v)
    idx = sorted(wheel)
    slots = pa.table({"index": pa.array(idx, pa.int32()),
                      "time_ms": pa.array([wheel[i][0] * precision for i in idx], pa.int64()),
                      "first_pos": pa.array([wheel[i][1] for i in idx], pa.int64()),
                      "last_pos": pa.array([wheel[i][2] for i in idx], pa.int64()),
                      "num": pa.array([wheel[i][3] for i in idx], pa.int32()),
                      "magic": pa.array([wheel[i][4] for i in idx], pa.int32())})
    return pa.table(cols, schema=UNIT_SCHEMA), slots


def requests_of(timers: pa.Table, precision: int = 1000) -> list[dict]:
    """doEnqueue's inputs for timer rows (timermsg), in queue order, write time = the record's store second."""
    from storelib.format.javahash import java_string_hash

    rows = timers.sort_by([("timer_queue_offset", "ascending")]).to_pylist()
    return [{"write_ms": r["timer_store_timestamp"] // precision * precision, "due": r["deliver_time_ms"],
             "offset_py": r["timer_phy_offset"], "size_py": r["timer_size"],
             "hash": java_string_hash(r["real_topic"]), "delete": r.get("delete_key") is not None} for r in rows]
