"""Timer messages for a generated 5.x store, written the way 5.3.3's broker writes them.

Each message sent with ``TIMER_DELAY_SEC`` goes through the broker's put hook
(HookUtils.transformTimerMessage): ``TIMER_OUT_MS`` = the deliver time rounded down to the precision (one
precision earlier when it is exact), ``REAL_TOPIC``/``REAL_QID`` added, stored under
``rmq_sys_wheel_timer`` queue 0 (StoreWriter: the broker's encoder, CQ and index dispatch). Messages due
before ``now`` are delivered: the timer store's re-put (TimerMessageStore.convertMessage) writes a copy on
the real topic and queue with the enqueue's properties plus ``TIMER_ENQUEUE_MS``/``TIMER_DEQUEUE_MS``,
born time, host, flag and sysflag kept. The timer files then hold every enqueue as doEnqueue writes it
(storelib.broker.timer.timerrebuild; wheel slots are not cleared by delivery), ``timercheck`` the read position and
queue offsets, ``timermetrics`` the pending count per real topic. ``recalls`` of the timers not yet due are
recalled as RecallMessageProcessor does (5.3.3): a record on the timer topic with ``TIMER_DEL_UNIQKEY`` =
real topic + "+" + UNIQ_KEY, the target's UNIQ_KEY, ``TIMER_DELIVER_MS`` = its ``TIMER_OUT_MS`` + 1 (the
recall handle's "consider of floor") so the put hook floors it back into the target's slot, body "0",
tag ``_RECALL_TAG_``, queue 0; a recalled timer is never delivered.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import pyarrow.compute as pc

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.broker.timer.timermsg import delete_key, store_timers, timer_out_ms
from storelib.broker.timer.timerrebuild import enqueue_units, rebuilt_checkpoint
from storelib.broker.writer.writer import StoreWriter
from storelib.fileio.bytesource import resolve
from storelib.fileio.publish import atomic_local_file
from storelib.format.record import Message
from storelib.format.timerstore import (
    TIMER_TOPIC,
    TimerCheckpoint,
    encode_timer_metrics,
    precision_of,
    timerlog_file_size,
    write_timer_store,
)
from storelib.format.uniqkey import create_uniq_id, month_start_ms

REAL_TOPICS = ("CouponExpiry", "ShipmentTracking")


@dataclass
class TimerGenResult:
    enqueued: int
    delivered: int
    pending: int
    timerlog_files: int


def deliver_ms(now_ms: int, delay_s: int, precision_ms: int) -> int:
    """TIMER_OUT_MS for a TIMER_DELAY_SEC message put at ``now_ms`` (transformTimerMessage)."""
    return timer_out_ms(now_ms + delay_s * 1000, precision_ms)


def recall_marker(target: Message, now_ms: int, precision_ms: int) -> Message:
    """The timer record RecallMessageProcessor.buildMessage puts for ``target`` (a timer-topic record), after
    the put hook's transformTimerMessage: TIMER_OUT_MS floored from the handle's TIMER_OUT_MS + 1."""
    p = target.properties
    topic, uniq = p["REAL_TOPIC"], p["UNIQ_KEY"]
    deliver = int(p["TIMER_OUT_MS"]) + 1
    out = timer_out_ms(deliver, precision_ms)
    props = {"TIMER_DEL_UNIQKEY": delete_key(topic, uniq), "UNIQ_KEY": uniq, "TIMER_DELIVER_MS": str(deliver),
             "BORN_TIMESTAMP": str(now_ms), "TRACE_CONTEXT": "", "PGROUP": "recall_group", "TAGS": "_RECALL_TAG_",
             "TIMER_OUT_MS": str(out), "REAL_TOPIC": topic, "REAL_QID": "0"}
    return Message(topic=TIMER_TOPIC, queue_id=0, body=b"0", born_timestamp=now_ms, born_host=target.born_host,
                   properties=props)


def add_timer_messages(root: str | os.PathLike, settings: BrokerSettings, *, count: int, seed: int = 0,
                       start_ms: int, now_ms: int, max_delay_s: int = 5 * 86_400,
                       topics: tuple[str, ...] = REAL_TOPICS, queues: int = 4, recalls: int = 0) -> TimerGenResult:
    """Append ``count`` timer messages (sent from ``start_ms`` on, 0.5 s apart), recall ``recalls`` of those
    not due by ``now_ms``, deliver the rest that are due, and write the timer store as it would stand at
    ``now_ms``."""
    if settings.version != "5":
        raise ValueError("timer messages are a 5.x feature (gen --version 5)")
    rnd = random.Random(seed)
    precision = precision_of(settings)
    clock = [start_ms]

    def tick() -> int:
        return clock[0]

    sent: list[tuple[int, Message, int]] = []  # (deliver ms, enqueue message, store ms)
    dl = settings.dledger  # a DLedger-mode store goes on as DLedger entries, in the node's term
    term = 0
    if dl is not None:
        from storelib.format.dledger.state import read_currterm_file

        ct = read_currterm_file(os.path.join(str(root), dl.dir))
        term = ct.curr_term if ct is not None else 0
    with StoreWriter(root, settings, clock=tick, dledger_self_id=dl.self_id if dl else None, dledger_term=term) as w:
        for i in range(count):
            clock[0] = start_ms + i * 500
            delay = rnd.choice([rnd.randint(1, 30), rnd.randint(60, 3_600), rnd.randint(3_600, max_delay_s)])
            out = deliver_ms(clock[0], delay, precision)
            topic, qid = rnd.choice(topics), rnd.randrange(queues)
            fixed = f"C0A80{rnd.randrange(16):01X}{rnd.randrange(256):02X}10925F3759DF"  # ip, pid, loader hash
            keys = f"ORD{rnd.randrange(10**6):06d}"
            body = rnd.randbytes(rnd.randint(50, 400))
            born = clock[0] - rnd.randint(1, 20)
            # born times only grow, so each producer JVM's startTime is the UTC month of this born time
            uniq = create_uniq_id(fixed, born, month_start_ms(born), i)
            props = {"CLUSTER": "DefaultCluster", "KEYS": keys, "TAGS": "timer",
                     "TIMER_DELAY_SEC": str(delay), "UNIQ_KEY": uniq, "WAIT": "true", "TIMER_OUT_MS": str(out),
                     "REAL_TOPIC": topic, "REAL_QID": str(qid)}
            msg = Message(topic=TIMER_TOPIC, queue_id=0, body=body, born_timestamp=born,
                          born_host=f"192.168.{rnd.randrange(5)}.{rnd.randrange(1, 30)}:{rnd.randrange(40000, 60000)}",
                          properties=props)
            w.append(msg)
            sent.append((out, msg, clock[0]))
        recalled = [m for d, m, _ in sent if d > now_ms][:recalls]
        for m in recalled:
            clock[0] += 500
            w.append(recall_marker(m, clock[0], precision))
        due = sorted(((d, m, t) for d, m, t in sent if d <= now_ms), key=lambda x: (x[0], x[2]))
        for d, m, t in due:
            clock[0] = max(clock[0], d + rnd.randint(20, 900))
            props = dict(m.properties, TIMER_ENQUEUE_MS=str(t // precision * precision), TIMER_DEQUEUE_MS=str(clock[0]))
            w.append(Message(topic=props["REAL_TOPIC"], queue_id=int(props["REAL_QID"]), body=m.body, flag=m.flag,
                             sys_flag=m.sys_flag, born_timestamp=m.born_timestamp, born_host=m.born_host,
                             properties=props))
    timers = store_timers(Store(resolve(str(root)), settings))
    file_size = timerlog_file_size(settings)
    units, slots = enqueue_units(timers.drop_columns(["state"]), file_size, precision, settings.timer_roll_window_slot)
    queued = count + len(recalled)
    cp = rebuilt_checkpoint(TimerCheckpoint(now_ms // precision * precision, 0, queued, queued, 0, now_ms,
                                            queued + len(due)), units, file_size)
    written = write_timer_store(str(root), units, slots, cp, file_size=file_size, precision_ms=precision)
    pending = timers.filter(pc.equal(timers.column("state"), "pending"))
    counts: dict[str, tuple[int, int]] = {}
    for t in pending.column("real_topic").to_pylist():
        counts[t] = (counts.get(t, (0, now_ms))[0] + 1, now_ms)
    with atomic_local_file(os.path.join(str(root), "config", "timermetrics")) as tmp, open(tmp, "w") as f:
        f.write(encode_timer_metrics(counts, (queued + len(due), 0, now_ms)))
    return TimerGenResult(count, len(due), pending.num_rows, sum(1 for p in written if "/timerlog/" in p))


__all__ = ["TimerGenResult", "add_timer_messages", "deliver_ms", "recall_marker"]
