"""Test-only: timer stores as RocketMQ 5.3.3's broker leaves them in states the real sample does not show,
built from the sample (a copy) with an emulation of TimerMessageStore.doEnqueue / TimerLog.append /
TimerWheel.putSlot (:func:`tests.timer_java_oracle.java_enqueue`, which reproduces the sample's timerlog and wheel
byte for byte).
Never imported by storelib: the audit must judge these stores on its own."""

from __future__ import annotations

import dataclasses
import shutil
import struct
from pathlib import Path

import pyarrow as pa

from storelib.format.timerstore import (
    SLOT_SIZE,
    read_timer_checkpoint,
    read_timerlog,
    slot_index,
    write_timer_store,
)
from tests.timer_java_oracle import java_enqueue

FILE_SIZE = 8192  # the sample's mappedFileSizeTimerLog
PRECISION = 1000
WINDOW = 172_800  # timerRollWindowSlot


def copy_store(sample: Path, dest: Path) -> Path:
    """A writable copy of the sample's store."""
    shutil.copytree(sample / "store", dest)
    return dest


def _props(store: Path, phy: int) -> dict[str, str]:
    from storelib.fileio.bytesource import resolve
    from storelib.scan.commitlog import CommitLog

    cl = CommitLog(resolve(str(store)).join("commitlog"), 1 << 20)
    return dict(cl.record_at(phy).column("properties")[0].as_py() or [])


def _requests(store: Path) -> list[dict]:
    """The sample's enqueues, as doEnqueue saw them (its units' write times, their records' TIMER_OUT_MS)."""
    from storelib.fileio.bytesource import resolve

    units = read_timerlog(resolve(str(store)), FILE_SIZE).units.to_pylist()
    return [{"write_ms": u["curr_write_ms"], "due": int(_props(store, u["offset_py"])["TIMER_OUT_MS"]),
             "offset_py": u["offset_py"], "size_py": u["size_py"], "hash": u["hash_real_topic"]} for u in units]


def _append_timer_record(store: Path, props: dict[str, str], at_ms: int) -> tuple[int, int]:
    """A ``rmq_sys_wheel_timer`` record appended to the commitlog (and its queue): (offset, size)."""
    from storelib.broker.settings.store import load_settings
    from storelib.broker.writer.writer import StoreWriter
    from storelib.fileio.bytesource import resolve
    from storelib.format.record import Message

    settings = load_settings(None, "5", root=resolve(str(store)))
    with StoreWriter(str(store), settings, clock=lambda: at_ms) as w:
        put = w.append(Message(topic="rmq_sys_wheel_timer", queue_id=0, body=b"", born_timestamp=at_ms - 5,
                               properties=props))
    return put.phy_offset, put.size


def _rewrite(store: Path, reqs: list[dict], queue_offsets: int = 0) -> tuple[pa.Table, pa.Table]:
    """The store's timer files replaced by what 5.3.3 writes for ``reqs`` (timercheck: the flush position
    moved to the new end, lastTimerQueueOffset moved by ``queue_offsets``)."""
    from storelib.fileio.bytesource import resolve

    cp = read_timer_checkpoint(resolve(str(store)))
    units, slots = java_enqueue(reqs, FILE_SIZE)
    grow = (units.num_rows - read_timerlog(resolve(str(store)), FILE_SIZE).units.num_rows) * 52
    cp = dataclasses.replace(cp, last_timer_log_flush_pos=cp.last_timer_log_flush_pos + grow,
                             last_timer_queue_offset=cp.last_timer_queue_offset + queue_offsets,
                             master_timer_queue_offset=cp.master_timer_queue_offset + queue_offsets)
    shutil.rmtree(store / "timerlog")
    write_timer_store(str(store), units, slots, cp, file_size=FILE_SIZE)
    return units, slots


def with_deletion_marker(store: Path, rolled: bool = False) -> dict:
    """A client's delete of a pending timer (``rolled``: one due past the roll window): a timer record with
    TIMER_DEL_UNIQKEY (REAL_TOPIC+UNIQ_KEY, buildDeleteKey) due when its target is, enqueued as 5.3.3 does
    (magic DEFAULT|DELETE, plus ROLL when due past the window; its slot's num - 1)."""
    reqs = _requests(store)
    last_ms = max(r["write_ms"] for r in reqs) + 1000
    target = next(r for r in reqs if (r["due"] - last_ms >= WINDOW * PRECISION) == rolled and r["due"] > last_ms)
    tp = _props(store, target["offset_py"])
    props = {"TIMER_DEL_UNIQKEY": tp["REAL_TOPIC"] + "+" + tp["UNIQ_KEY"], "UNIQ_KEY": "C0A8000110925F3759DF7E40DEADBEEF",
             "TIMER_OUT_MS": tp["TIMER_OUT_MS"], "REAL_TOPIC": tp["REAL_TOPIC"], "REAL_QID": tp["REAL_QID"],
             "TIMER_DELIVER_MS": tp["TIMER_OUT_MS"], "WAIT": "true"}
    phy, size = _append_timer_record(store, props, last_ms)
    reqs.append({"write_ms": last_ms // 1000 * 1000, "due": target["due"], "offset_py": phy, "size_py": size,
                 "hash": target["hash"], "delete": True})
    units, _ = _rewrite(store, reqs, queue_offsets=1)
    return {"target_py": target["offset_py"], "marker_py": phy, "marker_pos": units.column("pos")[-1].as_py()}


def with_keyless_recall(store: Path) -> dict:
    """A rolled pending timer record without UNIQ_KEY (a copy of a sample timer's properties minus it) and two
    recall markers due when it is, naming it the two ways a missing key can be spelled (REAL_TOPIC + "+None",
    + "+null"), all enqueued as 5.3.3 does. The dequeue never deletes a message without UNIQ_KEY
    (TimerMessageStore :1610-1619). Returns the keyless record's and the markers' commitlog offsets."""
    reqs = _requests(store)
    last_ms = max(r["write_ms"] for r in reqs) + 1000
    target = next(r for r in reqs if r["due"] - last_ms >= WINDOW * PRECISION)
    tp = _props(store, target["offset_py"])
    base = {"TIMER_OUT_MS": tp["TIMER_OUT_MS"], "REAL_TOPIC": tp["REAL_TOPIC"], "REAL_QID": tp["REAL_QID"],
            "TIMER_DELIVER_MS": tp["TIMER_OUT_MS"], "WAIT": "true"}
    out: dict = {"markers": []}
    for i, key in enumerate([None, f"{tp['REAL_TOPIC']}+None", f"{tp['REAL_TOPIC']}+null"]):
        props = dict(base) if key is None else {**base, "TIMER_DEL_UNIQKEY": key,
                                                "UNIQ_KEY": f"C0A8000110925F3759DF7E40DEADBE{i:02X}"}
        phy, size = _append_timer_record(store, props, last_ms)
        reqs.append({"write_ms": last_ms // 1000 * 1000, "due": target["due"], "offset_py": phy, "size_py": size,
                     "hash": target["hash"], **({} if key is None else {"delete": True})})
        if key is None:
            out["keyless_py"] = phy
        else:
            out["markers"].append(phy)
    _rewrite(store, reqs, queue_offsets=3)
    return out


def with_direct_put(store: Path, due_past: bool = True) -> int:
    """A timer record whose deliver time had already passed when the timer store read it: 5.3.3 puts it
    straight out with no unit (putMessageToTimerWheel :1370-1372); a later timer record gets its unit as
    usual (currWriteTimeMs one second on). With ``due_past`` False it was due after that unit was written,
    so Java enqueued it and its missing unit is a loss. Returns the unitless record's commitlog offset."""
    reqs = _requests(store)
    last_ms = max(r["write_ms"] for r in reqs) + 1000
    tp = _props(store, reqs[-1]["offset_py"])
    due = last_ms - 60_000 if due_past else last_ms + 3_600_000
    base = {"REAL_TOPIC": tp["REAL_TOPIC"], "REAL_QID": tp["REAL_QID"], "WAIT": "true"}
    phy, _ = _append_timer_record(store, {**base, "UNIQ_KEY": "C0A8000110925F3759DF7E40FEEDBEEF",
                                          "TIMER_OUT_MS": str(due), "TIMER_DELIVER_MS": str(due)}, last_ms)
    later = last_ms + 7_200_000
    nxt, size = _append_timer_record(store, {**base, "UNIQ_KEY": "C0A8000110925F3759DF7E40FEEDBEF0",
                                             "TIMER_OUT_MS": str(later), "TIMER_DELIVER_MS": str(later)}, last_ms)
    reqs.append({"write_ms": last_ms // 1000 * 1000, "due": later, "offset_py": nxt, "size_py": size,
                 "hash": reqs[-1]["hash"]})
    _rewrite(store, reqs, queue_offsets=2)
    return phy


def poke_slot(store: Path, unit: dict, *, num_delta: int = 0) -> int:
    """The wheel slot of ``unit`` with num moved by ``num_delta``; returns the slot's file offset."""
    off = int(slot_index(unit["slot_time_ms"], PRECISION)) * SLOT_SIZE
    with open(store / "timerwheel", "r+b") as f:
        f.seek(off)
        t, first, last, num, magic = struct.unpack(">qqqii", f.read(SLOT_SIZE))
        f.seek(off)
        f.write(struct.pack(">qqqii", t, first, last, num + num_delta, magic))
    return off
