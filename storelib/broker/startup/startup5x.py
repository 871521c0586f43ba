"""What a 5.3.3 start-up of a default (non-DLedger) store does besides the walk: the checkpoint's confirmPhyOffset
after recovery, where the reput starts (``recheckReputOffsetFromCq``), and its BatchConsumeQueues
(:class:`BatchTopics`, :mod:`storelib.broker.settings.batchcq`).

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
dispatches nothing until the log grows past it. 4.9.8 always starts its reput that way (4.9.8
DefaultMessageStore.java:252-277).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.recovery.walkplan import DispatchRange, RecoveryResult, WalkPlan, recovery_dispatch_after
from storelib.broker.settings.batchcq import (
    DEFAULT_BCQ_FILE_SIZE,
    BatchQueue,
    load_batch_queues,
    queue_type,
    simple_queue_type_fails,
    store_topics,
)
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.strayload import version_of
from storelib.errors import Finding
from storelib.fileio.bytesource import Location
from storelib.format.checkpoint import Checkpoint
from storelib.format.consumequeue import batch_cq_topics


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
    recovery and truncation), at least the commitlog's min offset and 0 (DefaultMessageStore.java:449-475)."""
    return max([min_offset, *queue_maxes, 0])


def never_dispatched_at(settings: BrokerSettings, version: str, cq_max: int, recovery_max: int, min_offset: int) -> int:
    """The PHYSICALOFFSET of the record a normal start of a default store never dispatches (-1: none).

    5.3.3's recoverNormally dispatches only records past maxPhyOffsetOfConsumeQueue ``cq_max`` (consume and batch
    queues: :func:`storelib.broker.recovery.walkplan.recovery_dispatch_after`), so the record starting there
    is skipped, and its reput starts at the log's end. With recheckReputOffsetFromCq the reput starts at
    :func:`recheck_reput_start` over the queues after recovery: ``cq_max`` and ``recovery_max``, the largest
    max physical offset the recovery's dispatch gives a queue (-1: it dispatches none); it reads that record
    only when nothing past it was dispatched (DefaultMessageStore.java:438-489). 4.9.8 reputs from ``cq_max``."""
    after = recovery_dispatch_after(version, settings.dledger is not None, True, cq_max)
    if after is None:
        return -1
    if recheck_on(settings, version) and recheck_reput_start([cq_max, recovery_max], min_offset) <= after:
        return -1
    return after


def consume_queue_max_phy(root: Location, settings: BrokerSettings, cq_max: int, live: bool) -> int:
    """maxPhyOffsetOfConsumeQueue as a 5.3.3 start takes it: the consume queues' ``cq_max`` with the
    BatchConsumeQueues' :meth:`BatchTopics.loaded_max` (ConsumeQueueStore :294-302; what fails their load is
    the plan's and the audit's load findings). 4.9.8 never reads them; a live store (``live``: no start is
    modelled) keeps the consume queues' alone."""
    if live or version_of(settings.version) != "5":
        return cq_max
    batch = batch_topics(root, settings, set(), [])
    return max(cq_max, batch.loaded_max() if batch is not None else -1)


def recheck_on(settings: BrokerSettings, version: str) -> bool:
    """Does this start-up move the reput to the queues' end (5.3.3 with recheckReputOffsetFromCq)?"""
    return version == "5" and bool(settings.recheck_reput_offset_from_cq)


def recheck_finding(reput_from: int, process_offset: int, ranges: list[DispatchRange], dup: bool = False) -> Finding:
    """What recheckReputOffsetFromCq makes this start-up's reput do (``ranges``: what it reads), said once.
    ``dup``: duplicationEnable, ``process_offset`` is then the confirm offset recovery set (the reput's end)."""
    end = "the confirm offset" if dup else "the log's end"
    what = (f"re-dispatches the records in [{reput_from}, {process_offset}) before the broker serves (records the "
            "queues already hold are skipped by the queue writers)" if ranges else
            f"reads [{reput_from}, {process_offset}), where it finds no record to dispatch"
            if reput_from < process_offset else
            "has nothing to re-dispatch" if reput_from == process_offset else
            f"starts past {end} {process_offset}: it dispatches nothing until "
            f"{'the confirm offset' if dup else 'the commitlog'} grows past {reput_from}, and records appended "
            "before that are never dispatched")
    if dup:
        what += (" (duplicationEnable: the reput ends at the confirm offset, the start of the last valid record, "
                 "getReputEndOffset, DefaultMessageStore.java:2855-2857, 2885; that record is not dispatched)")
    return Finding("reput_rechecked_from_cq", "info", None, None,
                   f"recheckReputOffsetFromCq=true: 5.3.3 moves the reput from the confirm offset {process_offset} to "
                   f"the queues' max physical offset {reput_from} (DefaultMessageStore.doRecheckReputOffsetFromCq) and "
                   f"{what}", {"reput_from": reput_from, "process_offset": process_offset})


def start_waits_forever(version: str, reput_from: int, target: int, process_offset: int) -> list[Finding]:
    """The start-up's wait for the reput (``dispatchBehindBytes() <= 0``) that never ends. 4.9.8 start()
    (DefaultMessageStore.java:284-290) waits for ``commitLog.getMaxOffset() - reputFromOffset`` (:2001-2003), its
    ``target`` processOffset, which a reput under duplicationEnable never moves toward. 5.3.3
    doRecheckReputOffsetFromCq (:480-487) waits for ``getConfirmOffset() - reputFromOffset`` (:2838-2840) with
    duplicationEnable ``target`` the confirm offset, which the reput cannot reach when it lies past the log's end
    (getData returns nothing there). (A confirm offset inside a record, which the reput stops before, is not
    judged here.)"""
    if reput_from >= target or (version == "5" and target <= process_offset):
        return []
    how = ("its reput dispatches nothing (duplicationEnable: the confirm offset stays -1)" if version == "4" else
           f"its reput cannot read past the log's end {process_offset} (duplicationEnable: the confirm offset "
           f"{target} kept from the checkpoint is past it)")
    return [Finding("start_waits_for_reput", "critical", None, None,
                    f"the broker's start-up never returns: it waits until the reput (at {reput_from}) reaches "
                    f"{target} and {how}; it logs 'Try to finish doing reput the messages fall behind during the "
                    "starting' every second and never serves", {"reput_from": reput_from, "waits_for": target})]


def never_reput(reput_from: int, window_start: int, gap: list[DispatchRange]) -> list[Finding]:
    """5.3.3 without recheckReputOffsetFromCq: the records between the queues' end and the recovery window
    (``gap``: the ranges a reput from ``reput_from`` would read there) are dispatched by nothing."""
    ranges = [(d.phy_start, min(d.phy_end, window_start)) for d in gap if d.phy_start < min(d.phy_end, window_start)]
    if not ranges:
        return []
    n = sum(b - a for a, b in ranges)
    first = ranges[0][0]
    head = next(d for d in gap if d.phy_start == first)
    return [Finding("records_never_dispatched", "warning", f"commitlog/{head.name}", first - head.base,
                    f"{n} bytes of records in [{first}, {window_start}) lie after the consume queues' max physical "
                    f"offset {reput_from} and before the recovery window: 5.3.3's recovery does not read them and its "
                    "reput starts at the log's end, so no consume queue or index entry is made for them "
                    "(recheckReputOffsetFromCq=true would re-dispatch them)",
                    {"from": first, "to": window_start, "bytes": n, "reput_from": reput_from})]


@dataclass
class BatchTopics:
    """A 5.3.3 start-up's BatchConsumeQueues (:mod:`storelib.broker.settings.batchcq`): the queues loaded, the
    BatchCQ topics (loaded, or configured so: findOrCreateConsumeQueue makes a BatchConsumeQueue for them), the
    records dispatched to them (kept out of the consume-queue models) and their truncation at processOffset."""

    topics: frozenset[str]
    queues: list[BatchQueue]
    dispatched: dict[str, int] = field(default_factory=dict)
    dispatched_max: int = -1  # the last dispatched record's start: a BatchConsumeQueue's max physical offset
    truncated: dict[str, tuple[int, int, list[str]]] = field(default_factory=dict)  # by path
    destroyed: bool = False  # no commitlog file: ConsumeQueueStore.destroy takes them too

    def take(self, table: pa.Table) -> pa.Table:
        """``table`` without the records of BatchCQ topics, which are counted."""
        if not self.topics or table.num_rows == 0:
            return table
        mask = pc.fill_null(pc.is_in(table.column("topic"), value_set=pa.array(sorted(self.topics))), False)
        hit = table.filter(mask)
        if hit.num_rows:
            for t in hit.column("topic").to_pylist():
                self.dispatched[t] = self.dispatched.get(t, 0) + 1
            self.dispatched_max = max(self.dispatched_max, int(pc.max(hit.column("phy_offset")).as_py()))
        return table.filter(pc.invert(mask))

    def truncate(self, phy: int) -> None:
        """truncateDirtyLogicFiles(``phy``) over every BatchConsumeQueue (computed, never written)."""
        self.truncated = {q.path: q.truncate(phy) for q in self.queues}

    def loaded_max(self) -> int:
        """Their largest getMaxPhysicOffset after load and recover (-1: none): counted in
        maxPhyOffsetOfConsumeQueue (ConsumeQueueStore.java:294-302), which picks the recovery window."""
        return max([q.max_physic_offset for q in self.queues] + [-1])

    def maxes(self) -> list[int]:
        """Their getMaxPhysicOffset after recovery and truncation (doRecheckReputOffsetFromCq counts them)."""
        if self.destroyed:
            return []
        out = [self.truncated[q.path][0] if q.path in self.truncated else q.max_physic_offset for q in self.queues]
        return out + ([self.dispatched_max] if self.dispatched_max >= 0 else [])

    def docs(self) -> list[dict]:
        """Each BatchConsumeQueue as this start-up leaves it (the plan's ``consume_queues.batch_queues``)."""
        out = []
        for q in self.queues:
            max_after, dropped, gone = self.truncated.get(q.path, (q.max_physic_offset, 0, []))
            out.append({"path": q.path, "topic": q.topic, "queue_id": q.queue_id, "units": q.units,
                        "max_physic_offset": q.max_physic_offset, "deleted_on_recover": q.deleted_on_recover,
                        "destroyed": self.destroyed,
                        "truncate": {"max_physic_offset": max_after, "units_dropped": dropped, "files_deleted": gone}
                        if q.path in self.truncated else None,
                        "supported": not (q.deleted_on_recover or dropped or gone or self.destroyed)})
        return out

    def findings(self) -> list[Finding]:
        """What the start-up does to each BatchConsumeQueue, which rmqstore leaves as it is."""
        out = []
        for d in self.docs():
            does = [f"loads and recovers it: {d['units']} valid unit(s) from its third-last file, max physical "
                    f"offset {d['max_physic_offset']} (counted in maxPhyOffsetOfConsumeQueue, which picks the "
                    "recovery window)"]
            if d["deleted_on_recover"]:
                does.append(f"deletes {', '.join(d['deleted_on_recover'])} after its end")
            t = d["truncate"]
            if d["destroyed"]:
                does.append("destroys it with every queue (no commitlog file)")
            elif t and (t["units_dropped"] or t["files_deleted"]):
                does.append(f"truncateDirtyLogicFiles drops {t['units_dropped']} unit(s) at or past processOffset"
                            + (f" (deleting {', '.join(t['files_deleted'])})" if t["files_deleted"] else "")
                            + f"; its max becomes {t['max_physic_offset']}")
            out.append(Finding("batch_consume_queue", "info" if d["supported"] else "warning", d["path"], None,
                               f"5.3.3 {'; '.join(does)}. rmqstore models these offsets but never writes batch "
                               "consume queues: recover --apply leaves the files as they are", d))
        for t, n in sorted(self.dispatched.items()):
            out.append(Finding("batch_consume_queue_dispatch", "warning", f"batchconsumequeue/{t}", None,
                               f"{n} record(s) of BatchCQ topic {t!r} dispatched by this start-up go to its "
                               "BatchConsumeQueue, which rmqstore does not write: no consume-queue entry is planned "
                               "for them (their index entries are)", {"topic": t, "records": n, "supported": False}))
        return out


def batch_topics(root: Location, settings: BrokerSettings, cq_topics: set[str], findings: list[Finding]
                 ) -> BatchTopics | None:
    """5.3.3's BatchConsumeQueues and BatchCQ topics of the store at ``root`` (None when it has neither), and
    what fails the load on them (queueTypeShouldBe, a file of the wrong length) into ``findings``."""
    topics = store_topics(root)
    findings.extend(simple_queue_type_fails(topics, cq_topics))
    size = settings.mapper_file_size_batch_consume_queue or DEFAULT_BCQ_FILE_SIZE
    queues = load_batch_queues(root, int(size), topics, findings)
    names = {q.topic for q in queues} | {t for t in topics if queue_type(topics, t) == "BatchCQ"}
    return BatchTopics(frozenset(names), queues) if names else None


def batch_ignored(root: Location) -> list[Finding]:
    """4.9.8 has no BatchConsumeQueue: a ``batchconsumequeue/`` directory is never read by its start-up."""
    topics = batch_cq_topics(root)
    return [Finding("batch_consume_queue", "info", "batchconsumequeue", None,
                    f"{len(topics)} topic(s) have 5.x BatchConsumeQueue files, which 4.9.8 never reads: its start-up "
                    "ignores them (their records get consume-queue entries if dispatched)",
                    {"topics": sorted(topics)})] if topics else []
