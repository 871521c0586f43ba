"""The queue checks (:mod:`storelib.checks.queues`) streamed over the segments in commitlog order, in memory
bounded by a segment and the number of queues: each queue carries its tail (last QUEUEOFFSET, message
count, lag) from one segment to the next, and its consume-queue units are read a segment's worth at a time.

This path proves agreement: every record's unit is its record (same position, size, tags code), queue
offsets run on by one, every unit is a record's or expired, and what is left is lag after the reput
position. It then reports exactly what the whole-view checks would (lag warnings, the queues' stats).
Anything else raises :class:`~storelib.checks.logview.Unsettled`: the whole view judges it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.cqload import LoadedQueue, min_variant
from storelib.broker.startup.lagdispatch import lag_finding, stays_undispatched
from storelib.checks.logcharts import TopicCodes
from storelib.checks.logview import Unsettled
from storelib.checks.queues import (
    CQLoad,
    gap_finding,
    queue_files,
    queue_group_order,
    queues_without_cq,
    walk_queues,
)
from storelib.checks.segment import Capped
from storelib.fileio.bytesource import Location
from storelib.fileio.sampledcrc import sampled_crc
from storelib.format.consumequeue import CQ_DTYPE, CQ_UNIT_SIZE, filler_mask
from storelib.format.javahash import wrap64
from storelib.format.record import INNER_BATCH_FLAG, gets_cq_unit

if TYPE_CHECKING:
    from storelib.broker.settings.livecut import StoreCut


@dataclass
class UnitStats:
    """A queue's units summarised as they are read in order (a file's units at a time)."""

    first_n: int | None = None  # queue offset of its first unit (None: no unit)
    last_valid: int | None = None  # queue offset of its last valid unit (None: none; a negative QUEUEOFFSET
    # starts a queue below 0, so any int may be one: ConsumeQueue.putMessagePositionInfo, 4.9.8 :478-530)
    holes: int = 0  # invalid units before the last valid one
    pending: int = 0  # invalid units after the last valid one so far
    checked: int = 0  # valid units that are not fillers (what the checks compare)
    expired: int = 0  # of those, units pointing below the commitlog's first offset

    def add(self, n0: int, u: np.ndarray, log_min: int) -> None:
        """Units ``u`` of queue offsets ``n0``.. (the next ones after those added before)."""
        if self.first_n is None and len(u):
            self.first_n = n0
        phy = u["phy_offset"].astype(np.int64)
        valid = (phy >= 0) & (u["size"] > 0)
        ok = valid & ~filler_mask(u)
        self.checked += int(ok.sum())
        self.expired += int((ok & (phy < log_min)).sum())
        if valid.any():
            j = len(valid) - 1 - int(valid[::-1].argmax())
            self.holes += self.pending + int((~valid[:j]).sum())
            self.pending = len(valid) - 1 - j
            self.last_valid = n0 + j
        else:
            self.pending += len(valid)


@dataclass
class QueueMeta:
    """One consume queue summarised from its files, without holding its units."""

    cq: LoadedQueue  # files listed; mapped on demand, closed after each commitlog segment
    units: UnitStats
    cq_max: int
    cq_min: int


@dataclass
class QueueMetaLoad:
    """Every consume queue summarised (:func:`load_queue_meta`): what the streamed checks need up front."""

    base: CQLoad = field(default_factory=CQLoad)  # findings and failure, as the whole-view load has them
    queues: dict[tuple[str, int], QueueMeta] = field(default_factory=dict)
    log_min: int = 0  # the commitlog's first offset the units were judged against (expired below it)

    def close(self) -> None:
        for m in self.queues.values():
            m.cq.close()


def load_queue_meta(root: Location, settings: BrokerSettings, log_min: int,
                    prev: dict[str, dict] | None = None, cut: StoreCut | None = None,
                    queues: Iterable[tuple[str, int, LoadedQueue]] | None = None) -> QueueMetaLoad:
    """Each queue's first and last valid offsets, holes and unit counts, file by file (a CQ file's units at
    a time, never a queue's): the streamed counterpart of :func:`storelib.checks.queues.load_consume_queues`,
    with the same findings.

    ``prev`` (:func:`queue_meta_snapshot` of an earlier run): a queue found there is read only past the
    last valid unit it had, once the units up to it still fingerprint the same (else Unsettled). ``cut``: a
    live store's, the queues read as at it (:func:`storelib.checks.queues.walk_queues`). ``queues``: only
    these, opened by the caller (default: every queue directory)."""
    res = QueueMetaLoad(log_min=log_min)
    res.base.root, res.base.settings = root, settings
    for topic, qid, cq in walk_queues(root, settings, res.base, cut) if queues is None else queues:
        p = (prev or {}).get(_queue_key(topic, qid))
        try:
            if p is not None and p.get("log_min") != log_min and not _still_counts(cq, p, log_min):
                p = None  # the cleaner deleted records its units point at since: the queue's units read again
            st = _resumed_stats(cq, root.path, p, log_min) if p is not None else None
            if st is not None and not st.holes:
                # no invalid unit before the last valid one: recovery's end is right after it (what
                # ConsumeQueue.recover finds, without reading its last three files again)
                last = _read_units(cq, st.last_valid, 1)
                cq_max, mpo = st.last_valid + 1, wrap64(int(last["phy_offset"][0]) + int(last["size"][0]))
            else:
                if st is None:
                    st = UnitStats()
                    for base, _display, u in queue_files(cq, root.path):
                        st.add(base // CQ_UNIT_SIZE, u, log_min)
                        del u
                cq_max, mpo = cq.max_offset(), cq.max_physic_offset()
            if p is not None and p["cq_min"] == p["units"]["first_n"] == st.first_n:
                cq_min = p["cq_min"]  # correctMinOffset stopped at the first unit, which has not changed
            else:
                cq_min = cq.min_offset(log_min, variant=min_variant(settings.version)) if cq.segments else 0
        finally:
            cq.close()
        res.base.cq_max_phy = max(res.base.cq_max_phy, mpo)
        res.queues[(topic, qid)] = QueueMeta(cq, st, cq_max, cq_min)
    return res


def _still_counts(cq: LoadedQueue, p: dict, log_min: int) -> bool:
    """Does an earlier run's summary of a queue still hold now the log starts at ``log_min``? Only when
    its first file is still there and the units it did not count as expired still point at or past
    ``log_min`` (units ascend: the first of them does)."""
    u = p["units"]
    if len(_read_units(cq, u["first_n"], 1)) != 1:
        return False  # its first file is gone
    first = _read_units(cq, u["first_n"] + u["expired"], 1)  # (a unit before it that is not expired: no match)
    return len(first) == 1 and int(first["size"][0]) > 0 and not filler_mask(first)[0] \
        and int(first["phy_offset"][0]) >= log_min


def _queue_key(topic: str, qid: int) -> str:
    return f"{qid}/{topic}"  # a queue id has no "/"; a topic name may


def _resumed_stats(cq: LoadedQueue, rootp: str, p: dict, log_min: int) -> UnitStats:
    """A queue's stats carried from ``p`` and extended by the units after its last valid one."""
    st = UnitStats(**p["units"])
    if _units_fingerprint(cq, st.first_n, st.last_valid) != p["fp"]:
        raise Unsettled("consume-queue units checked by an earlier run have changed")
    start = st.last_valid + 1
    for base, _display, u in queue_files(cq, rootp):
        n0 = base // CQ_UNIT_SIZE
        if n0 + len(u) > start:
            k = max(0, start - n0)
            st.add(n0 + k, u[k:], log_min)
        del u
    return st


def _units_fingerprint(cq: LoadedQueue, first_n: int, last_valid: int) -> list[int]:
    """Sampled CRCs of units ``first_n..last_valid`` (:mod:`storelib.fileio.sampledcrc`) and their count: a
    later run trusts those units while they match."""
    n = last_valid - first_n + 1
    head, tail = sampled_crc(lambda i, k: _read_units(cq, first_n + i, k).tobytes(), n, CQ_UNIT_SIZE)
    cq.close()
    return [head, tail, n]


def queue_meta_snapshot(meta: QueueMetaLoad) -> dict[str, dict]:
    """What :func:`load_queue_meta` needs to read a later run's units only past these."""
    out = {}
    for (topic, qid), m in meta.queues.items():
        u = m.units
        if u.first_n is None or u.last_valid is None or u.holes:
            continue
        out[_queue_key(topic, qid)] = {"units": {**asdict(u), "pending": 0}, "cq_min": m.cq_min,
                                       "fp": _units_fingerprint(m.cq, u.first_n, u.last_valid),
                                       "log_min": meta.log_min}
    return out


@dataclass
class _Tail:
    """What one queue carries from segment to segment."""

    min_qo: int
    max_qo: int
    messages: int
    first_phy: int
    last_phy: int
    matched: int = 0  # records whose unit was compared equal
    lag: int = 0
    lag_bytes: int = 0
    lag_first: int | None = None  # queue offset of the first record past the last valid unit
    never: tuple[int, int] | None = None  # the lagging record a 5.3.3 normal start skips (position, queue offset)
    lag_recs: list[np.ndarray] = field(default_factory=list)  # those records (qoff, phy, size, tags), kept while
    # few (:data:`LAG_KEEP`): a later run checks them again against the units written since

    def to_json(self) -> list:
        recs = np.concatenate(self.lag_recs, axis=1) if self.lag_recs else np.zeros((4, 0), np.int64)
        return [self.min_qo, self.max_qo, self.messages, self.first_phy, self.last_phy, self.matched,
                recs.tolist()]

    @classmethod
    def from_json(cls, v: list) -> _Tail:
        return cls(*v[:6], lag_recs=[np.asarray(v[6], np.int64).reshape(4, -1)])


LAG_KEEP = 100_000  # lagging records a run keeps for the next incremental one (more: that one runs in full)


class QueueStream:
    """Feed each segment's record table in commitlog order (:meth:`feed`), then :meth:`finish`."""

    def __init__(self, meta: QueueMetaLoad, log_min: int, segment_size: int, out: Capped,
                 codes: TopicCodes | None = None) -> None:
        self.meta = meta
        self.log_min = log_min
        self.segment_size = segment_size
        self.out = out  # the queue-offset findings (gaps), in the whole view's order
        self.reput_from = meta.base.reput_from(log_min)
        self.never = meta.base.never_dispatched()  # the record a 5.3.3 normal start skips (-1: none)
        self.never_end: int | None = None  # where that record ends, once fed
        self.store_end: int | None = None  # the log's end when these records are not all of it (a queue group's)
        self.cq_end: int | None = -1  # end of the last record fed that gets a unit (None: an old carry's, unknown)
        self.cq_ends: list[int] | None = None  # cq_able_ends of the whole log when not all of it is fed here
        self._codes = codes if codes is not None else TopicCodes()  # may be shared with the report's series
        self.tails: dict[tuple[int, int], _Tail] = {}
        self.last_phy = -1
        self.log_end: int | None = None
        self.lag_kept = 0  # lagging records kept in the tails (:data:`LAG_KEEP`)
        self.expired = 0  # carried records the cleaner deleted since (:meth:`resume`)

    def topic_codes(self, topics: pa.ChunkedArray) -> np.ndarray:
        """Each record's topic as a code numbered in first-seen order over the whole log."""
        return self._codes.of(topics)

    @property
    def topic_names(self) -> list[str]:
        return self._codes.names

    @property
    def topic_code(self) -> dict[str, int]:
        return self._codes.code

    def feed(self, rec: pa.Table, code: np.ndarray) -> None:
        """One segment's records (``code``: :meth:`topic_codes` of them)."""
        col = lambda name: rec.column(name).to_numpy()  # noqa: E731
        phy = col("phy_offset")
        if not len(phy):
            return
        if not np.array_equal(col("physical_offset_field"), phy):
            raise Unsettled("a record's PHYSICALOFFSET field is not its position")
        if int(phy[0]) <= self.last_phy or not bool(np.all(phy[1:] > phy[:-1])):
            raise Unsettled("record positions do not ascend")
        size = col("size").astype(np.int64)
        self.last_phy = int(phy[-1])
        self.log_end = int(phy[-1] + size[-1])
        tran = col("tran_type")
        disp = np.flatnonzero(gets_cq_unit(tran))
        if not len(disp):
            return
        if self.cq_end is not None:  # no lost range in a streamed store: one run (lagdispatch.cq_able_ends)
            self.cq_end = int(phy[disp[-1]] + size[disp[-1]])
        if np.any(col("sys_flag")[disp] & INNER_BATCH_FLAG):
            raise Unsettled("inner-batch records (queue offsets advance by the batch)")
        qid = col("queue_id")[disp]
        gcode = (code[disp] << 32) | (qid.astype(np.int64) & 0xFFFFFFFF)
        order = queue_group_order(gcode, code[disp], qid, len(self.topic_names))
        rows = disp[order]
        g = gcode[order]
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        stops = np.r_[starts[1:], len(g)]
        qoff, tags = col("queue_offset"), col("tags_code")
        touched: list[LoadedQueue] = []
        try:
            for a, b in zip(starts.tolist(), stops.tolist()):
                r = rows[a:b]
                key = (int(code[r[0]]), int(qid[order[a]]))
                self._queue(key, qoff[r], phy[r], size[r], tags[r], touched)
        finally:
            for cq in touched:  # unmap what this segment read (reopened on demand)
                cq.release_mapped()

    def _queue(self, key: tuple[int, int], qq: np.ndarray, phy: np.ndarray, size: np.ndarray, tags: np.ndarray,
               touched: list[LoadedQueue]) -> None:
        """One queue's records of one segment (commitlog order) against its tail and its units."""
        t = self.tails.get(key)
        topic, qid = self.topic_names[key[0]], key[1]
        d = np.diff(qq if t is None else np.r_[t.max_qo, qq])
        if np.any(d < 1):
            raise Unsettled("a queue's QUEUEOFFSETs repeat or go backwards")
        q_prev = qq[:-1] if t is None else np.r_[t.max_qo, qq[:-1]]
        after = qq[1:] if t is None else qq
        here = phy[1:] if t is None else phy
        for i in np.flatnonzero(d > 1).tolist():  # no lost region in a streamed store: every gap is one
            self.out.add(gap_finding(topic, qid, int(q_prev[i]), int(after[i]), int(here[i]), self.segment_size))
        if t is None:
            t = self.tails[key] = _Tail(int(qq[0]), int(qq[-1]), 0, int(phy[0]), int(phy[-1]))
        t.max_qo, t.messages, t.last_phy = int(qq[-1]), t.messages + len(qq), int(phy[-1])
        self._units(t, topic, qid, qq, phy, size, tags, touched)

    def _units(self, t: _Tail, topic: str, qid: int, qq: np.ndarray, phy: np.ndarray, size: np.ndarray,
               tags: np.ndarray, touched: list[LoadedQueue]) -> None:
        """Records of a queue (ascending offsets) against its units: equal where a valid unit exists, lag
        after the reput position past the last one."""
        m = None if self.meta.base.failed else self.meta.queues.get((topic, qid))
        if m is None:
            self._keep_undispatched(t, qq, phy, size, tags)
            return
        q0 = int(qq[0])
        if m.units.first_n is not None and q0 < m.units.first_n:
            raise Unsettled("records below a queue's first unit")
        last = m.units.last_valid
        k = 0 if last is None else int(np.searchsorted(qq, last, side="right"))  # records that have a unit
        if k:
            u = _read_units(m.cq, q0, int(qq[k - 1]) - q0 + 1)
            touched.append(m.cq)
            if len(u) != int(qq[k - 1]) - q0 + 1:
                raise Unsettled("a consume queue file is missing or short")
            u = u[qq[:k] - q0]
            if not _same_units(u, phy[:k], size[:k], tags[:k]) and self.meta.base.live \
                    and int(qq[k - 1]) == m.units.last_valid:  # the queue's last unit may be in its copy
                u = np.array(u)
                u[k - 1:k] = m.cq.settle_unit(int(qq[k - 1]))
            if not _same_units(u, phy[:k], size[:k], tags[:k]) or int(phy[0]) < self.log_min:
                raise Unsettled("a consume-queue unit differs from its record")
            t.matched += k
        if k < len(qq):  # past the last valid unit: lag, if after the reput position
            if int(phy[k]) < self.reput_from:
                raise Unsettled("messages without a unit before the reput position")
            t.lag += len(qq) - k
            t.lag_bytes += int(size[k:].sum())
            if t.lag_first is None:
                t.lag_first = int(qq[k])
            if self.never >= int(phy[k]) and t.never is None:
                at = np.flatnonzero(phy[k:] == self.never)
                t.never = (self.never, int(qq[k + at[0]])) if len(at) else None
                if len(at):
                    self.never_end = self.never + int(size[k + at[0]])
            self.lag_kept += len(qq) - k
            if self.lag_kept <= LAG_KEEP:
                t.lag_recs.append(np.stack([qq[k:], phy[k:], size[k:], tags[k:]]).astype(np.int64))

    def _keep_undispatched(self, t: _Tail, qq: np.ndarray, phy: np.ndarray, size: np.ndarray,
                           tags: np.ndarray) -> None:
        """A queue without a consume queue yet (a new topic's first records, the reput behind them): kept as
        lagging records while every record of its tail is kept and past the reput position, so that a later
        run checks them against the units the broker writes for them (or drops the ones the cleaner took).
        The report is unchanged (:func:`queues_without_cq` reports such a queue); only the carry grows."""
        if self.meta.base.failed or int(phy[0]) < self.reput_from or self.lag_kept + len(qq) > LAG_KEEP:
            return
        if t.messages != len(qq) + sum(r.shape[1] for r in t.lag_recs):
            return  # an earlier part of the tail was not kept: a later run cannot settle the queue from it
        self.lag_kept += len(qq)
        t.lag_recs.append(np.stack([qq, phy, size, tags]).astype(np.int64))

    def snapshot(self) -> dict | None:
        """What a later run needs to go on from the end of this log (None: too much lag to carry)."""
        if self.lag_kept > LAG_KEEP:
            return None
        return {"topics": self.topic_names, "last_phy": self.last_phy, "log_end": self.log_end, "cq_end": self.cq_end,
                "tails": [[tc, qid, *t.to_json()] for (tc, qid), t in self.tails.items()],
                "gaps": self.out.to_json(), "log_min": self.log_min}

    def resume(self, snap: dict) -> None:
        """Go on from a :meth:`snapshot`: the tails back (without the records the cleaner deleted since, when
        the log's first offset moved: :meth:`_expire`), and the lagging records checked again against the
        units the broker may have written for them since."""
        self._codes.reset(snap["topics"])
        self.last_phy, self.log_end, self.cq_end = snap["last_phy"], snap["log_end"], snap.get("cq_end")
        self.out.replay_json(snap["gaps"])
        moved = self.log_min > snap.get("log_min", self.log_min)
        self.expired = 0  # records of the carried tails that the cleaner deleted since
        touched: list[LoadedQueue] = []
        try:
            for tc, qid, *v in snap["tails"]:
                t = _Tail.from_json(v)
                recs, t.lag_recs = t.lag_recs[0], []
                if moved and t.first_phy < self.log_min:
                    if _any_gap(snap["gaps"]):
                        raise Unsettled("queue-offset gaps in records the cleaner may have deleted since")
                    recs = self._expire(t, self.topic_names[tc], qid, recs, touched)
                    if recs is None:
                        continue  # every record of the queue expired: as if never seen
                self.tails[(tc, qid)] = t
                if recs.shape[1]:
                    self._units(t, self.topic_names[tc], qid, *recs, touched)
        finally:
            for cq in touched:
                cq.release_mapped()

    def _expire(self, t: _Tail, topic: str, qid: int, recs: np.ndarray,
                touched: list[LoadedQueue]) -> np.ndarray | None:
        """Drop a carried tail's records below the log's first offset (the cleaner deleted them): their
        queue offsets are consecutive, the first ``matched`` of them are their units (an earlier run proved
        it) and the rest are the lagging ``recs`` (no unit yet then), so the first record left is found by
        the units' positions, which ascend, then by the lagging records' own. Lagging records the cleaner
        took are gone as a full audit sees them: whatever units the broker wrote for them since point below
        the log's first offset (expired). Returns the lagging records left; None: no record is left.
        Unsettled when that does not hold (a gap, no consume queue now, or none when the carry was made and
        its records were not kept: :meth:`_keep_undispatched`)."""
        m = None if self.meta.base.failed else self.meta.queues.get((topic, qid))
        if m is None or t.messages != t.max_qo - t.min_qo + 1 or t.messages != t.matched + recs.shape[1]:
            raise Unsettled(f"records of {topic}/{qid} the cleaner deleted cannot be told from the carry")
        touched.append(m.cq)
        lo, hi = 0, t.matched  # the first of the matched records whose unit points at or past log_min
        while lo < hi:
            mid = (lo + hi) // 2
            u = _read_units(m.cq, t.min_qo + mid, 1)  # a file the cleaner deleted: its units expired
            if len(u) and int(u["phy_offset"][0]) >= self.log_min:
                hi = mid
            else:
                lo = mid + 1
        gone = int(np.searchsorted(recs[1], self.log_min)) if lo == t.matched else 0  # lagging ones taken
        recs = recs[:, gone:]
        lo += gone
        self.expired += lo
        if lo == t.messages:
            return None
        if lo < t.matched:
            u = _read_units(m.cq, t.min_qo + lo, 1)
            t.first_phy = int(u["phy_offset"][0])
        else:  # every record with a unit expired: the first lagging one left leads
            t.first_phy = int(recs[1][0])
        t.min_qo += lo
        t.messages -= lo
        t.matched -= min(lo, t.matched)
        return recs

    def facts(self) -> dict[tuple[str, int], dict]:
        """Per-queue facts as :func:`storelib.checks.queues.check_queue_offsets` gives them (same order)."""
        out = {}
        for (tc, qid) in sorted(self.tails, key=lambda k: (k[0], k[1] & 0xFFFFFFFF)):
            t = self.tails[(tc, qid)]
            out[(self.topic_names[tc], qid)] = {"cl_min_offset": t.min_qo, "cl_max_offset": t.max_qo + 1,
                                                "messages": t.messages, "last_phy": t.last_phy,
                                                "first_phy": t.first_phy}
        return out

    def finish(self, root: Location, facts: dict, out: Capped) -> dict:
        """Settle every queue (each valid unit a record's or expired; no hole); the queues' stats, with
        the findings :func:`storelib.checks.queues.check_consume_queues` would make, into ``out``."""
        out.extend(self.meta.base.findings)
        if self.meta.base.failed:
            return {}
        stats = self.finish_queues(facts, out)
        queues_without_cq(root, self.segment_size, facts, set(self.meta.queues), self.reput_from, out, stats)
        return stats

    def finish_queues(self, facts: dict, out: Capped) -> dict:
        """:meth:`finish` for the queues that have consume-queue files (a queue group's task runs this)."""
        stats: dict[tuple[str, int], dict] = {}
        end = max(self.store_end or 0, self.log_end or 0)
        ends = self.cq_ends if self.cq_ends is not None else None if self.cq_end is None else \
            [self.cq_end] if self.cq_end >= 0 else []
        skips = self.never_end is not None and stays_undispatched(self.meta.base.settings, self.meta.base.cq_max_phy,
                                                                  self.log_min, self.never_end, end, None, ends)
        for (topic, qid), m in self.meta.queues.items():
            tc = self.topic_code.get(topic)
            t = self.tails.get((tc, qid)) if tc is not None else None
            if m.units.holes or m.units.checked != (t.matched if t else 0) + m.units.expired:
                raise Unsettled(f"consume queue {topic}/{qid} holds units no record accounts for")
            fact = facts.get((topic, qid))
            if t is not None and t.lag:
                out.add(lag_finding(topic, qid, t.lag, t.lag_bytes, t.lag_first, self.reput_from,
                                    t.never if skips else None))
            stats[(topic, qid)] = {"topic": topic, "queue_id": qid, "min_offset": m.cq_min, "max_offset": m.cq_max,
                                   "raw_max_offset": m.cq_max if m.units.last_valid is None
                                   else m.units.last_valid + 1,
                                   "cl_max_offset": fact["cl_max_offset"] if fact else None,
                                   "messages": fact["messages"] if fact else 0,
                                   "lag": t.lag if t else 0, "lag_bytes": t.lag_bytes if t else 0}
        return stats


def _same_units(u: np.ndarray, phy: np.ndarray, size: np.ndarray, tags: np.ndarray) -> bool:
    """Are units ``u`` the records' (no filler, same position, size and tags code)?"""
    return len(u) == len(phy) and not np.any(filler_mask(u)) and np.array_equal(u["phy_offset"].astype(np.int64), phy) \
        and np.array_equal(u["size"].astype(np.int64), size) and np.array_equal(u["tags_code"].astype(np.int64), tags)


def _any_gap(gaps: dict | list) -> bool:
    """Does a snapshot's queue-offset findings hold any (a :class:`Capped`'s JSON, or a per-queue list)?"""
    return bool(gaps["counts"]) if isinstance(gaps, dict) else any(c["counts"] for _t, _q, c in gaps)


def _read_units(cq: LoadedQueue, first: int, count: int) -> np.ndarray:
    """Units of queue offsets [first, first + count) copied out of the mapped files (fewer when a file is
    missing or short)."""
    parts = []
    n = first
    while n < first + count:
        seg = cq.segment_for(n * CQ_UNIT_SIZE)
        if seg is None:
            break
        i = (n * CQ_UNIT_SIZE - seg.base) // CQ_UNIT_SIZE
        u = cq.read_units(seg, i, first + count - n)
        if not len(u):
            break
        parts.append(np.array(u))
        n += len(u)
    if not parts:
        return np.zeros(0, CQ_DTYPE)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


