"""Timer messages of a 5.x store, pending and delivered, from the commitlog and the timer store.

An enqueue record is a ``rmq_sys_wheel_timer`` record (``REAL_TOPIC``, ``REAL_QID``, ``TIMER_OUT_MS``); a
delivered copy is a record on a real topic with ``TIMER_DEQUEUE_MS`` (the timer store's re-put), matched
by UNIQ_KEY. A message is pending while no delivered copy exists; the timerlog units that point at its
enqueue record (``offsetPy``) and the wheel slot of the last one say where the timer store holds it.

A recall (RecallMessageProcessor, 5.3.3) is a timer record with ``TIMER_DEL_UNIQKEY`` = real topic + "+" +
UNIQ_KEY and the target's ``TIMER_OUT_MS`` (it carries the target's UNIQ_KEY too). The broker enqueues it
with magic DELETE and num - 1 (TimerMessageStore.doEnqueue :752-774), never puts it on a topic (:957-958,
:1088-1090), and skips the message it names when both are read from the same slot (:1592-1623). So a
marker is state ``delete_marker`` (``delete_marker_late`` when its target was delivered anyway: it came
after the slot was read), and a message with a marker in its slot and no delivered copy is ``deleted``.
The commitlog is scanned once, segment by segment, keeping only the timer rows. A 5.x DLedger-mode store's
timer store is the same (TimerMessageStore reads through DLedgerCommitLog.getMessage: ``offsetPy`` is the
record's offset, the entry's pos + 48).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.timer.timerchains import judge_chains
from storelib.format.timerstore import (
    TIMER_TOPIC,
    TimerLog,
    precision_of,
    read_timer_checkpoint_as_broker,
    read_timer_metrics,
    read_timerlog,
    read_wheel,
    slot_index,
)

if TYPE_CHECKING:
    from storelib.broker.settings.store import Store

TIMER_COLUMNS = ["phy_offset", "size", "topic", "queue_id", "queue_offset", "uniq_key", "msg_id", "store_timestamp",
                 "properties"]
TIMER_SCHEMA = pa.schema([
    ("uniq_key", pa.string()), ("state", pa.string()), ("real_topic", pa.string()), ("real_queue_id", pa.int32()),
    ("deliver_time_ms", pa.int64()), ("timer_phy_offset", pa.int64()), ("timer_size", pa.int32()),
    ("timer_queue_offset", pa.int64()), ("timer_msg_id", pa.string()), ("timer_store_timestamp", pa.int64()), ("timerlog_positions", pa.list_(pa.int64())),
    ("wheel_slot", pa.int32()), ("rolled", pa.bool_()), ("delivered_phy_offset", pa.int64()),
    ("delivered_size", pa.int32()), ("delivered_topic", pa.string()), ("delivered_queue_id", pa.int32()),
    ("delivered_queue_offset", pa.int64()), ("delivered_store_timestamp", pa.int64()),
    ("delivered_msg_id", pa.string()), ("enqueue_ms", pa.int64()), ("dequeue_ms", pa.int64()),
    ("delivered_records", pa.int32()), ("delete_key", pa.string()),
])
DEL_KEY = "TIMER_DEL_UNIQKEY"
PENDING_STATES = ("pending", "deleted", "delete_marker")  # what the wheel still holds (not yet read out)


def _prop(batch: pa.RecordBatch, key: str) -> pa.Array:
    return pc.map_lookup(batch.column("properties"), pa.scalar(key), "first")


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def scan_timer_rows(store: Store) -> tuple[list[dict], list[dict]]:
    """(enqueue rows, delivered rows) of the commitlog: only timer rows leave the batch as Python."""
    enq: list[dict] = []
    dlv: list[dict] = []
    for b in store.scan(columns=TIMER_COLUMNS, verify_crc=False):
        if not b.num_rows:
            continue
        is_timer = pc.equal(b.column("topic"), TIMER_TOPIC)
        t = b.filter(is_timer)
        if t.num_rows:
            cols = {k: t.column(k).to_pylist() for k in ("phy_offset", "size", "queue_offset", "uniq_key", "msg_id",
                                                          "store_timestamp")}
            cols["real_topic"] = _prop(t, "REAL_TOPIC").to_pylist()
            cols["real_qid"] = _prop(t, "REAL_QID").to_pylist()
            cols["out"] = _prop(t, "TIMER_OUT_MS").to_pylist()
            cols["deliver"] = _prop(t, "TIMER_DELIVER_MS").to_pylist()
            cols["del_key"] = _prop(t, DEL_KEY).to_pylist()
            enq.extend(dict(zip(cols, vals)) for vals in zip(*cols.values()))
        deq = _prop(b, "TIMER_DEQUEUE_MS")
        d = b.filter(pc.and_(pc.invert(is_timer), pc.is_valid(deq)))
        if d.num_rows:
            cols = {k: d.column(k).to_pylist() for k in ("phy_offset", "size", "topic", "queue_id", "queue_offset",
                                                          "uniq_key", "msg_id", "store_timestamp")}
            cols["enqueue"] = _prop(d, "TIMER_ENQUEUE_MS").to_pylist()
            cols["dequeue"] = _prop(d, "TIMER_DEQUEUE_MS").to_pylist()
            dlv.extend(dict(zip(cols, vals)) for vals in zip(*cols.values()))
    return enq, dlv


def timer_out_ms(deliver_ms: int, precision_ms: int) -> int:
    """TIMER_OUT_MS the broker's put hook writes for a message due at ``deliver_ms``: floored to the
    precision, and one precision earlier when already on it (HookUtils.transformTimerMessage, 5.3.3
    :200-205; a recall's marker goes through the same hook)."""
    return deliver_ms - precision_ms if deliver_ms % precision_ms == 0 else deliver_ms // precision_ms * precision_ms


def delete_key(real_topic: str | None, uniq_key: str | None) -> str | None:
    """The key the dequeue looks a message up by among its slot's TIMER_DEL_UNIQKEYs: real topic + "+" +
    UNIQ_KEY (TimerMessageStore.buildDeleteKey, 5.3.3 :1930-1932; a missing REAL_TOPIC concatenates as "null",
    getRealTopic :1171-1176). None for a message without UNIQ_KEY (getUniqID reads the property, null when
    absent): DequeueGetService tests ``null != uniqueKey`` before building the key (:1610-1619), so no marker
    deletes such a message, whatever its TIMER_DEL_UNIQKEY says."""
    if uniq_key is None:
        return None
    return f"{'null' if real_topic is None else real_topic}+{uniq_key}"


class Recalls:
    """What the recall markers of a timer store delete: the one rule of TIMER_DEL_UNIQKEY.

    The broker's dequeue of a slot reads the slot's markers first and collects their keys (5.3.3
    TimerMessageStore.dequeue :955-959, :980-986; DequeueGetService :1592-1606), then drops every message of
    that slot whose :func:`delete_key` is among them (:1618-1623). A marker and its target meet when both
    are due in the same slot: the same deliver time // precision. Used by :func:`timer_messages` (states)
    and the timer audit (``storelib.checks.timers``: which units never deliver)."""

    def __init__(self, precision_ms: int) -> None:
        self.precision_ms = int(precision_ms)
        self.slots: dict[str, set[int]] = {}  # delete key -> slots (deliver time // precision) holding a marker

    def mark(self, del_key: str, due_ms: int) -> None:
        """A marker carrying ``del_key``, due at ``due_ms``."""
        self.slots.setdefault(del_key, set()).add(int(due_ms) // self.precision_ms)

    def deletes(self, real_topic: str | None, uniq_key: str | None, due_ms: int | None) -> bool:
        """Does a marker delete the message of ``real_topic``/``uniq_key`` due at ``due_ms`` (None: never;
        no UNIQ_KEY: never, :func:`delete_key`)?"""
        key = delete_key(real_topic, uniq_key)
        return key is not None and due_ms is not None and int(due_ms) // self.precision_ms in self.slots.get(key, ())


def _state(r: dict, delivered: bool, recalls: Recalls) -> str:
    """pending / delivered / deleted (a marker shares its slot) / delete_marker(_late) (module docstring)."""
    if r["del_key"] is not None:
        return "delete_marker_late" if delivered else "delete_marker"
    if delivered:
        return "delivered"
    return "deleted" if recalls.deletes(r["real_topic"], r["uniq_key"], _int(r["out"]) or _int(r["deliver"])) \
        else "pending"


def timer_messages(store: Store, log: TimerLog, precision_ms: int = 1000) -> pa.Table:
    """One row per timer message (its newest enqueue record) and per delete marker: its state, where it is held."""
    enq, dlv = scan_timer_rows(store)
    delivered: dict[str, list[dict]] = {}
    for r in dlv:
        delivered.setdefault(r["uniq_key"], []).append(r)
    latest: dict[str, dict] = {}
    recalls = Recalls(precision_ms)
    for r in enq:  # commitlog order: a re-put (roll) replaces the earlier record
        if r["del_key"] is not None:  # shares the target's UNIQ_KEY: kept apart, by what it deletes
            latest[f"del:{r['del_key']}"] = r
            due = _int(r["out"]) or _int(r["deliver"])
            if due is not None:
                recalls.mark(r["del_key"], due)
        else:
            latest[r["uniq_key"] or f"@{r['phy_offset']}"] = r
    targets = {delete_key(r["real_topic"], r["uniq_key"]): bool(delivered.get(r["uniq_key"])) for r in latest.values()
               if r["del_key"] is None and r["uniq_key"] is not None}  # delete key -> delivered (no key: no target)
    units = log.units
    by_py: dict[int, list[int]] = {}
    slot_time: dict[int, tuple[int, bool]] = {}
    if units.num_rows:
        order = np.argsort(units.column("pos").to_numpy(), kind="stable")
        pys = units.column("offset_py").to_numpy()[order].tolist()
        poss = units.column("pos").to_numpy()[order].tolist()
        sts = units.column("slot_time_ms").to_numpy()[order].tolist()
        rolls = units.column("roll").to_numpy()[order].tolist()
        for py, p, st, rl in zip(pys, poss, sts, rolls):
            by_py.setdefault(py, []).append(p)
            slot_time[py] = (st, rl)
    rows = []
    for r in latest.values():
        marker = r["del_key"] is not None
        d = [] if marker else (delivered.get(r["uniq_key"]) or [])
        was_delivered = targets.get(r["del_key"], False) if marker else bool(d)
        first = d[0] if d else {}
        st = slot_time.get(r["phy_offset"])
        rows.append({
            "uniq_key": r["uniq_key"], "state": _state(r, was_delivered, recalls),
            "real_topic": r["real_topic"],
            "real_queue_id": _int(r["real_qid"]), "deliver_time_ms": _int(r["out"]) or _int(r["deliver"]),
            "timer_phy_offset": r["phy_offset"], "timer_size": r["size"], "timer_queue_offset": r["queue_offset"],
            "timer_msg_id": r["msg_id"], "timer_store_timestamp": r["store_timestamp"], "timerlog_positions": by_py.get(r["phy_offset"], []),
            "wheel_slot": int(slot_index(st[0], precision_ms)) if st else None, "rolled": st[1] if st else None,
            "delivered_phy_offset": first.get("phy_offset"), "delivered_size": first.get("size"),
            "delivered_topic": first.get("topic"), "delivered_queue_id": first.get("queue_id"),
            "delivered_queue_offset": first.get("queue_offset"),
            "delivered_store_timestamp": first.get("store_timestamp"), "delivered_msg_id": first.get("msg_id"),
            "enqueue_ms": _int(first.get("enqueue")), "dequeue_ms": _int(first.get("dequeue")),
            "delivered_records": len(d), "delete_key": r["del_key"]})
    return pa.Table.from_pylist(rows, schema=TIMER_SCHEMA)


def store_timers(store: Store) -> pa.Table:
    """:func:`timer_messages` of a store with its own settings (timerlog file size, precision)."""
    s = store.settings
    return timer_messages(store, read_timerlog(store.loc, s.mapped_file_size_timer_log), precision_of(s))


def deliver_histogram(timers: pa.Table, bucket_ms: int = 3_600_000) -> pa.Table:
    """Pending timers per real topic and deliver-time bucket (UTC, ``bucket_ms`` wide)."""
    p = timers.filter(pc.equal(timers.column("state"), "pending"))
    if not p.num_rows:
        return pa.table({"real_topic": pa.array([], pa.string()), "bucket_start_ms": pa.array([], pa.int64()),
                         "pending": pa.array([], pa.int64())})
    b = pc.multiply(pc.divide(p.column("deliver_time_ms"), bucket_ms), bucket_ms)
    g = pa.table({"real_topic": p.column("real_topic"), "bucket_start_ms": b}).group_by(
        ["real_topic", "bucket_start_ms"]).aggregate([("bucket_start_ms", "count")])
    g = g.rename_columns(["real_topic", "bucket_start_ms", "pending"])
    return g.sort_by([("real_topic", "ascending"), ("bucket_start_ms", "ascending")])


def timer_losses(timers: pa.Table, deletions: list[dict], segment_size: int,
                 groups_by_topic: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Pending timers an expiry policy loses: the commitlog segment holding the timer record is deleted
    before the deliver time, so the broker has nothing to re-put when the slot comes due.

    ``deletions``: the policy's deletion timeline (``{"time_ms", "file": "<log folder>/<20 digits>", "kind"}``;
    the log folder is ``commitlog`` or a DLedger node's data folder).
    Per real topic: lost timers, the first loss, and the consumer groups of that topic that never see them.
    """
    deleted_at: dict[int, int] = {}
    for d in deletions:
        f = d.get("file", "")
        if d.get("kind", "commitlog") == "commitlog" and f.rsplit("/", 1)[-1].isdigit():
            deleted_at.setdefault(int(f.rsplit("/", 1)[-1]), int(d["time_ms"]))
    by_topic: dict[str, dict[str, Any]] = {}
    p = timers.filter(pc.equal(timers.column("state"), "pending"))
    for phy, due, topic in zip(p.column("timer_phy_offset").to_pylist(), p.column("deliver_time_ms").to_pylist(),
                               p.column("real_topic").to_pylist()):
        gone = deleted_at.get(phy - phy % segment_size)
        if gone is None or due is None or gone >= due:
            continue
        t = by_topic.setdefault(topic, {"lost_timers": 0, "first_loss_ms": gone,
                                        "groups": sorted((groups_by_topic or {}).get(topic, []))})
        t["lost_timers"] += 1
        t["first_loss_ms"] = min(t["first_loss_ms"], gone)
    return {"pending": p.num_rows, "lost_timers": sum(t["lost_timers"] for t in by_topic.values()),
            "first_loss_ms": min((t["first_loss_ms"] for t in by_topic.values()), default=None),
            "by_topic": dict(sorted(by_topic.items()))}


def _count(timers: pa.Table, state: str) -> int:
    return int(pc.sum(pc.equal(timers.column("state"), state)).as_py() or 0)


def timer_store_summary(store: Store) -> dict[str, Any]:
    """The timer store at a glance, read once (``rmqstore timers``): the timerlog, the wheel, every timer
    message (:func:`timer_messages`), the files' findings and a summary dict."""
    s = store.settings
    precision = precision_of(s)
    log = read_timerlog(store.loc, s.mapped_file_size_timer_log)
    wheel, wfind = read_wheel(store.loc, log, precision)
    cp, short = read_timer_checkpoint_as_broker(store.loc)
    metrics, mfind = read_timer_metrics(store.loc)
    timers = timer_messages(store, log, precision)
    pending = timers.filter(pc.equal(timers.column("state"), "pending"))
    counts = pc.value_counts(pc.drop_null(pending.column("real_topic")))  # one pass, no Python loop
    by_topic = dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()))
    # the wheel's chains as the broker reads them (the audit's judge), not the format reader's strict rules
    found = judge_chains(log, wheel, [*log.findings, *wfind], None if cp is None else cp.last_read_time_ms)
    return {"log": log, "wheel": wheel, "timers": timers, "findings": [*found, *mfind, *filter(None, [short])],
            "summary": {"timerlog_files": log.files, "timerlog_units": log.units.num_rows,
                        "wheel_slots_used": wheel.num_rows, "wheel_units": int(pc.sum(wheel.column("num")).as_py() or 0),
                        "timers": timers.num_rows, "pending": pending.num_rows,
                        "delivered": _count(timers, "delivered"), "deleted": _count(timers, "deleted"),
                        "delete_markers": _count(timers, "delete_marker") + _count(timers, "delete_marker_late"),
                        "pending_by_topic": dict(sorted(by_topic.items())),
                        "timermetrics_timing_count": metrics,
                        "timercheck": None if cp is None else cp.__dict__, "precision_ms": precision}}


__all__ = ["DEL_KEY", "PENDING_STATES", "TIMER_SCHEMA", "Recalls", "delete_key", "deliver_histogram", "scan_timer_rows", "store_timers", "timer_losses", "timer_messages", "timer_out_ms",
           "timer_store_summary"]
