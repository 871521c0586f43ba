"""Two 5.3.3 start-up values the default (non-DLedger) store's plan needs besides the walk: the checkpoint's
confirmPhyOffset after recovery, and where the reput starts (``recheckReputOffsetFromCq``).

confirmPhyOffset: CommitLog.recoverNormally / recoverAbnormally end (outside controller mode) with
``setConfirmOffset(lastValidMsgPhyOffset)`` (5.3.3 CommitLog.java:397, :806), which StoreCheckpoint keeps.
``lastValidMsgPhyOffset`` is the *start* of the last valid record of the window (:354, :748), and when the
window holds none, its initial value: normal recovery ``getConfirmOffset()`` (:347, :655-673): with
duplicationEnable the field loadCheckPoint set from the checkpoint (DefaultMessageStore.java:388); else
``isSyncDiskFlush() ? getFlushedWhere() : getMaxOffset()``, i.e. 0 (MappedFileQueue.java:52, before recovery
sets it) or the end of the last loaded file (each file's wrote position is its size after load,
MappedFileQueue.java:271); abnormal recovery the window's first file base (:737). No commitlog file: neither
sets it (the checkpoint's stays). enableControllerMode (confirm clamped, computed by the HA service) is not
modelled.

The reput: DefaultMessageStore.start (5.3.3 :416) starts it at ``commitLog.getConfirmOffset()``, the log's
end after recovery (processOffset), so by default a start-up re-dispatches nothing. With
``recheckReputOffsetFromCq`` (MessageStoreConfig.java:266, default false) ``doRecheckReputOffsetFromCq``
(:438-489) moves it to the largest ``getMaxPhysicOffset()`` over every loaded queue (consume queues and
BatchConsumeQueues, after recovery and truncateDirtyLogicFiles), raised to the commitlog's min offset (and to
0), and waits until the reput reaches the confirm offset: records from there to processOffset are dispatched
again (those the queues already hold are skipped by the queue writers), and a start past processOffset
dispatches nothing until the log grows past it. 4.9.8 always starts its reput that way (4.9.8 DefaultMessageStore.java:252-277).
"""

from __future__ import annotations

from storelib.broker.recovery.walkplan import DispatchRange, RecoveryResult, WalkPlan
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.errors import Finding
from storelib.format.checkpoint import Checkpoint


def window_has_record(walk: RecoveryResult) -> bool:
    """Did the recovery window (the CRC-checked walk) read at least one valid record?"""
    return any(o.crc_checked and o.records > 0 for o in walk.segments)


def confirm_without_record(settings: BrokerSettings, wplan: WalkPlan, walk: RecoveryResult,
                           cp: Checkpoint) -> int:
    """confirmPhyOffset after a 5.3.3 recovery whose window held no valid record (module docstring)."""
    segs = wplan.segments
    if not segs:  # recover*'s else branch: setConfirmOffset is never called
        return cp.confirm_phy_offset
    if walk.mode == "abnormal":
        return segs[wplan.start_index].base
    if settings.duplication_enable:
        return cp.confirm_phy_offset
    if str(settings.flush_disk_type).strip() == "SYNC_FLUSH":
        return 0
    return segs[-1].base + wplan.inputs.segment_size


def recheck_reput_start(queue_maxes: list[int], min_offset: int) -> int:
    """doRecheckReputOffsetFromCq's reput start: the largest queue maxPhysicOffset (``queue_maxes``, after
    recovery and truncation), at least the commitlog's min offset and 0 (DefaultMessageStore.java:451-469)."""
    return max([min_offset, *queue_maxes, 0])


def recheck_on(settings: BrokerSettings, version: str) -> bool:
    """Does this start-up move the reput to the queues' end (5.3.3 with recheckReputOffsetFromCq)?"""
    return version == "5" and bool(settings.recheck_reput_offset_from_cq)


def recheck_finding(reput_from: int, process_offset: int) -> Finding:
    """What recheckReputOffsetFromCq makes this start-up's reput do, said once."""
    what = (f"re-dispatches the records in [{reput_from}, {process_offset}) before the broker serves (records the "
            "queues already hold are skipped by the queue writers)" if reput_from < process_offset else
            "has nothing to re-dispatch" if reput_from == process_offset else
            f"starts past the log's end {process_offset}: it dispatches nothing until the commitlog grows past "
            f"{reput_from}, and records appended before that are never dispatched")
    return Finding("reput_rechecked_from_cq", "info", None, None,
                   f"recheckReputOffsetFromCq=true: 5.3.3 moves the reput from the confirm offset {process_offset} to "
                   f"the queues' max physical offset {reput_from} (DefaultMessageStore.doRecheckReputOffsetFromCq) and "
                   f"{what}", {"reput_from": reput_from, "process_offset": process_offset})


def never_reput(reput_from: int, window_start: int, gap: list[DispatchRange]) -> list[Finding]:
    """5.3.3 without recheckReputOffsetFromCq: the records between the queues' end and the recovery window
    (``gap``: the ranges a reput from ``reput_from`` would read there) are dispatched by nothing."""
    ranges = [(d.phy_start, min(d.phy_end, window_start)) for d in gap if d.phy_start < min(d.phy_end, window_start)]
    if not ranges:
        return []
    n = sum(b - a for a, b in ranges)
    first = ranges[0][0]
    return [Finding("records_never_dispatched", "warning", None, first,
                    f"{n} bytes of records in [{first}, {window_start}) lie after the consume queues' max physical "
                    f"offset {reput_from} and before the recovery window: 5.3.3's recovery does not read them and its "
                    "reput starts at the log's end, so no consume queue or index entry is made for them "
                    "(recheckReputOffsetFromCq=true would re-dispatch them)",
                    {"from": first, "to": window_start, "bytes": n, "reput_from": reput_from})]
