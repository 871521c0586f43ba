"""What a start-up dispatches of a consume queue's records past its last unit: the audit's lag judgement, on
the plan's rules (:func:`storelib.broker.startup.startup5x.never_dispatched_at`).

A normal 5.3.3 start of a default store dispatches, during recovery, only the records past the consume and
batch queues' max physical offset (CommitLog.recoverNormally :351): the record starting exactly there is skipped
and, its reput starting at the log's end, never dispatched, unless recheckReputOffsetFromCq moves the reput back
to the queues' end and nothing later was dispatched (DefaultMessageStore.java:438-489). 4.9.8 reputs from the
queues' end; an abnormal start re-dispatches every valid record of its window.

The audit reads no start-up: the recovery dispatches the valid records after that record up to the log's end
or the first lost range, and of those only NOT and COMMIT transaction records raise a queue's max physical
offset (CommitLogDispatcherBuildConsumeQueue.dispatch, DefaultMessageStore 5.3.3 :2174-2189); a tail of
PREPARED/ROLLBACK records moves no queue (:func:`recovery_max_past`). Each audit path tells that from the same
summary, the end of the last such record of every run of contiguous records (:func:`cq_able_ends`).
"""

from __future__ import annotations

import numpy as np

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.strayload import version_of
from storelib.broker.startup.startup5x import never_dispatched_at
from storelib.errors import Finding
from storelib.format.record import gets_cq_unit


def cq_able_ends(phy: np.ndarray, size: np.ndarray, tran: np.ndarray) -> list[int]:
    """For each run of contiguous records (``phy`` ascending; a lost range breaks a run), the end of its last
    record the consume-queue dispatcher writes a unit for (runs without one: none). Small (one per lost
    range), so a segment task carries it; the concatenation over any split of the log tells
    :func:`recovery_max_past` the same."""
    if not len(phy):
        return []
    end = phy.astype(np.int64) + size.astype(np.int64)
    run = np.r_[0, np.cumsum(end[:-1] != phy[1:])]  # run number of each record
    rows = np.flatnonzero(gets_cq_unit(tran))
    if not len(rows):
        return []
    last = rows[np.r_[run[rows][1:] != run[rows][:-1], True]]  # last CQ-able row of each run
    return end[last].tolist()


def recovery_max_past(record_end: int, log_end: int, lost: np.ndarray | None,
                      cq_ends: list[int] | None = None) -> int:
    """The largest max physical offset a recovery's dispatch gives a queue past a record ending at
    ``record_end``: the end of the last CQ-able record (``cq_ends``: :func:`cq_able_ends` of the log) before
    the recovery stops (the log's end ``log_end``, or the first ``lost`` range's start past it); -1 when it
    dispatches none. ``cq_ends`` None (an older audit state's segments): every valid record counts."""
    stop = log_end
    if lost is not None and len(lost):
        starts = lost[:, 0][lost[:, 0] >= record_end]
        stop = min(stop, int(starts.min())) if len(starts) else stop
    if cq_ends is not None:
        stop = max([e for e in cq_ends if e <= stop], default=-1)
    return stop if stop > record_end else -1


def stays_undispatched(settings: BrokerSettings | None, cq_max: int, log_min: int, record_end: int, log_end: int,
                       lost: np.ndarray | None = None, cq_ends: list[int] | None = None) -> bool:
    """Is the record at ``cq_max`` (ending at ``record_end``), which 5.3.3's normal recovery skips, never
    dispatched by this start either (the module docstring)?"""
    if settings is None:
        return False
    return never_dispatched_at(settings, version_of(settings.version), cq_max,
                               recovery_max_past(record_end, log_end, lost, cq_ends), log_min) >= 0


def lag_finding(topic: str, qid: int, count: int, nbytes: int, first_offset: int, reput_from: int,
                never: tuple[int, int] | None = None) -> Finding:
    """A queue's messages past its last consume-queue unit, all after the reput position: dispatched on start,
    but for ``never`` (position, queue offset), the one a 5.3.3 normal start skips and does not re-dispatch
    (:func:`stays_undispatched`)."""
    how = f"the broker dispatches them on start (reput from {reput_from})"
    if never is not None:
        how = (f"a 5.x broker's normal start dispatches the {count - 1} after phy {never[0]} during recovery "
               f"(CommitLog.recoverNormally: only records past the queues' max physical offset) and its reput starts "
               f"past it (at the log's end; with recheckReputOffsetFromCq at the queues' end after that recovery): "
               f"the message at {never[0]} (queue offset {never[1]}) is never dispatched and the later ones take its "
               "slot (an abnormal start dispatches all)")
    return Finding("queue_behind_commitlog", "warning", f"consumequeue/{topic}/{qid}", None,
                   f"{count} messages ({nbytes} bytes) from queue offset {first_offset} are not in the consume "
                   f"queue yet; {how}", {"topic": topic, "queue_id": qid, "count": count, "bytes": nbytes,
                                         **({"never_dispatched": never[0]} if never is not None else {})})
