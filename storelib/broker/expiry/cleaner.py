"""The broker's file cleaner replayed (store-algorithms §9): :func:`simulate` runs one :class:`Policy` over a
:class:`StoreSnapshot` and :class:`TimeModel` (storelib.broker.expiry.expiry) exactly on the cleaner's 10-s tick grid
without ticking; the model and conventions are in :mod:`storelib.broker.expiry.expiry`'s docstring (a
DLedger-mode store: DLedger's CleanSpaceService, 100 ms after its previous round ended, for the data files,
the broker's queue cleaner on its own ticks).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import numpy as np

from storelib.broker.expiry.diskfull import WriteClock, apply_next_change, check, refusal_summary
from storelib.broker.expiry.expiry import (  # the inputs and the broker's constants
    CQ_UNIT,
    DEFAULT_HORIZON_MS,
    DLEDGER_BATCH_MAX,
    DLEDGER_DELETE_INTERVAL_MS,
    DLEDGER_ERROR_SLEEP_MS,
    DLEDGER_TICK_MS,
    FIRST_RUN_DELAY_MS,
    HOUR_ERROR,
    HOUR_FALSE,
    HOUR_MS,
    HOUR_TRUE,
    MANUAL_DELETE_RUNS,
    MAX_NEW_SEGMENTS,
    QUEUE_KEY_SHIFT,
    Policy,
    StoreSnapshot,
    TimeModel,
    hour_table,
)
from storelib.broker.expiry.losses import GroupLosses
from storelib.broker.expiry.queueclean import QueueCleaning
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.scan.commitlog import offset_to_file_name
from storelib.units import parse_zone

# --------------------------------------------------------------------------------------------------
# the simulation


class CleanerSim(GroupLosses, QueueCleaning):
    """One policy over one snapshot; state advanced tick by tick, jumping over idle ticks."""

    def __init__(self, policy: Policy, snap: StoreSnapshot, model: TimeModel):
        self.p, self.s = policy, snap
        self.t_snap = snap.last_store_ms or int(snap.seg_mtime.max())
        span_ms = snap.last_store_ms - snap.first_store_ms
        observed = (snap.write_pos - snap.first_phy) * 1000.0 / span_ms if span_ms > 0 else 0.0
        self.R = float(observed if model.ingest_bytes_per_s is None else model.ingest_bytes_per_s)
        if self.R < 0:
            raise ValueError("ingest rate must not be negative")
        self.ingest_source = "observed" if model.ingest_bytes_per_s is None else "given"
        self.start = self.t_snap if model.start_ms is None else int(model.start_ms)
        if self.start < self.t_snap:
            raise ValueError(f"--from {self.start} is before the store's snapshot time {self.t_snap} "
                             "(the store's state is only known from then on)")
        self.until = self.start + DEFAULT_HORIZON_MS if model.until_ms is None else int(model.until_ms)
        self.horizon_source = "default (7 days)" if model.until_ms is None else "given (--until)"
        if self.until < self.start:
            raise ValueError("--until is before the simulation start")
        new_segments = self.R * (self.until - self.t_snap) / 1000.0 / snap.segment_size
        if new_segments > MAX_NEW_SEGMENTS and model.until_ms is None:
            # a store written in a burst makes the observed rate absurd over 7 days: answer anyway, over the
            # horizon in which the simulated segments stay worth computing, and say so
            self.until = max(self.start, self.t_snap + int(MAX_NEW_SEGMENTS * snap.segment_size * 1000.0 / self.R))
            self.horizon_source = (f"shortened from 7 days: {self.ingest_source} ingest of {self.R:.0f} bytes/s would "
                                   f"write {new_segments:.0f} segments; the simulation ends after {MAX_NEW_SEGMENTS} "
                                   "(give --ingest or --until to choose)")
            new_segments = MAX_NEW_SEGMENTS
        if new_segments > MAX_NEW_SEGMENTS:
            raise ValueError(
                f"{self.ingest_source} ingest of {self.R:.0f} bytes/s would write {new_segments:.0f} new "
                f"{snap.segment_size}-byte segments before the end of the simulation (a store written in a "
                f"burst?); give --ingest BYTES_PER_S or an earlier --until")
        self.P = policy.clean_resource_interval
        self.T0 = self.start + FIRST_RUN_DELAY_MS
        self.expired = policy.file_reserved_time * HOUR_MS
        self.batch = max(1, policy.delete_file_batch_max)
        self.interval = policy.delete_commit_log_files_interval
        self.dl = snap.dledger
        if self.dl:
            self._dledger_init(policy)
        self.kmax = (self.until - self.T0) // self.P if self.until >= self.T0 else -1
        self.busy_until = self.T0  # when the cleaner's thread is free again (the end of its last run)
        self.table, self.when_problem = hour_table(policy.delete_when)
        self.zone = parse_zone(policy.tz)
        if self.dl:
            self._reanchor(self.start)
        self.S = snap.segment_size
        self.W0 = snap.write_pos
        self.clock = WriteClock(self.t_snap)  # the write position stops while the disk is marked full
        self.flags = {"broker": False, "dledger": False, "disk": False}
        self.refusals: list[dict[str, Any]] = []
        self.n_exist = len(snap.seg_base)
        self.last_exist_base = int(snap.seg_base[-1])
        # queues
        observed_bytes = snap.write_pos - snap.first_phy
        self.mpb = (snap.q_count / observed_bytes) if observed_bytes > 0 else np.zeros(len(snap.q_count))
        self.bound_row = {int(b): i for i, b in enumerate(snap.bounds)}
        self.n0 = int(snap.q_max_offset.sum())
        self.mpb_total = float(self.mpb.sum())
        q_anchor, q_period = (self.broker_T0, self.broker_P) if self.dl else (self.T0, self.P)
        self._init_queue_cleaner(self.dl or policy.version != "4", q_anchor, q_period)
        self.i0 = 0  # first live segment
        self.manual_count = 0
        self.manual_pending = [t for t in policy.manual_deletes]
        # consumers (pairs whose queue exists in the store)
        qindex = {(t, int(q)): i for i, (t, q) in enumerate(zip(snap.q_topic, snap.q_id))}
        self.pairs = snap.groups
        self.pq = np.array([qindex.get((t, q), -1) for (_g, t, q, _o) in self.pairs], np.int64)
        if model.consumption_msgs_per_s is None:
            rate = np.where(self.pq >= 0, self.mpb[np.maximum(self.pq, 0)] * self.R, 0.0) if len(self.pq) else \
                np.zeros(0)
            self.consumption = "observed (each queue's production rate: groups keep their lag)"
        else:
            rate = np.full(len(self.pairs), float(model.consumption_msgs_per_s))
            self.consumption = f"{model.consumption_msgs_per_s} messages/s per queue"
        self.c_rate = rate.astype(np.float64)
        self.lost_msgs = np.zeros(len(self.pairs), np.int64)
        self.lost_bytes = np.zeros(len(self.pairs), np.int64)
        self.first_loss: list[int | None] = [None] * len(self.pairs)
        self.ranges: list[list[list[int]]] = [[] for _ in self.pairs]
        # the pairs whose queue is in the store, as flat per-pair arrays (no per-queue gathers per deletion)
        self.lp = np.flatnonzero(self.pq >= 0)
        lq = self.pq[self.lp]
        self.l_rate = self.c_rate[self.lp]
        self.l_max0 = snap.q_max_offset[lq]
        self.l_mpb = self.mpb[lq]
        self.l_mean = snap.q_mean_size[lq]
        self.l_key = lq.astype(np.int64) << QUEUE_KEY_SHIFT
        self.l_below = snap.below[:, lq]
        self.c_base = np.array([self.pairs[j][3] for j in self.lp], np.float64)
        self.t_base = float(self.t_snap)
        if len(self.lp):
            # losses before the simulation starts are not the policy's doing: start at the min offset
            self._jump(self.t_snap, self._below_pairs(int(snap.seg_base[0])))
        self.deletions: list[dict[str, Any]] = []
        self.disk: list[dict[str, Any]] = []
        self.max_ratio: float | None = None

    def _dledger_init(self, policy: Policy) -> None:
        """DLedger's CleanSpaceService: a 100-ms grid from the start (restarted 100 ms after each round that
        deleted), fileReservedTime + 1 hours (at least one), its ratios as Java floats, 10 files a run
        100 ms apart; the broker's queue cleaner keeps its ticks."""
        f32 = np.float32
        self.broker_P, self.broker_T0 = self.P, self.T0
        self.P, self.T0 = DLEDGER_TICK_MS, self.start  # and _reanchor(start), once the hour table is known
        self.expired = max(1, policy.file_reserved_time + 1) * HOUR_MS
        self.batch, self.interval = DLEDGER_BATCH_MAX, DLEDGER_DELETE_INTERVAL_MS
        self.dl_check = float(f32(f32(policy.disk_max_used_space_ratio) / f32(100)))
        force = f32(policy.dledger_force_ratio)
        self.dl_force = float(max(force, f32(0.5)))
        self.dl_full = float(min(f32(force + f32(0.05)), f32(0.95)))

    # -- geometry over time -----------------------------------------------------------------
    def base(self, i: int) -> int:
        if i < self.n_exist:
            return int(self.s.seg_base[i])
        return self.last_exist_base + (i - self.n_exist + 1) * self.S

    def W(self, t: int) -> int:
        return self.W0 + math.floor(self.R * self.clock.writing_ms(t) / 1000.0) if t > self.t_snap else self.W0

    def fill_time(self, i: int) -> float:
        """When segment i stops being the newest (the write position reaches its end)."""
        if i < self.n_exist - 1:
            return -math.inf
        end = self.base(i) + self.S
        if end <= self.W0:
            return float(self.t_snap)
        if self.R <= 0:
            return math.inf
        return float(self.clock.at_writing_ms(math.ceil((end - self.W0) * 1000.0 / self.R)))

    def newest(self, T: int) -> int:
        """Index of the newest segment at T (the first one the write position has not left)."""
        lo = max(self.i0, self.n_exist - 1)  # older existing segments all have newer ones after them
        if self.fill_time(lo) > T:
            return lo
        # segment i >= n_exist - 1 ends at last_exist_base + (i - n_exist + 2) * S: start from the guess
        i = max(lo, self.n_exist - 2 + (self.W(T) - self.last_exist_base) // self.S)
        while self.fill_time(i) <= T:
            i += 1
        while i > lo and self.fill_time(i - 1) > T:
            i -= 1
        return i

    def mtime(self, i: int) -> float:
        return float(self.s.seg_mtime[i]) if i < self.n_exist - 1 else self.fill_time(i)

    def _proj(self, x: int) -> np.ndarray:
        return self.s.q_max_offset + np.floor((x - self.W0) * self.mpb).astype(np.int64)

    def _below(self, x: int) -> np.ndarray:
        """Per queue: first logical offset whose message starts at or after physical offset x."""
        if x > self.W0:
            return self._proj(x)
        row = self.bound_row.get(x)
        if row is not None:
            return self.s.below[row]
        return self.s.q_max_offset.copy()  # only for boundaries that are not segment bases

    def max_offsets(self, t: int) -> np.ndarray:
        return self._proj(max(self.W(t), self.W0))

    def used(self, t: int) -> tuple[int, int]:
        """(bytes used on the partition, store bytes) at time t.

        CQ bytes are 20 per live unit, with the projected unit count taken over all queues at once
        (a disk model: it differs from the per-queue sum by less than one unit per queue).
        """
        M = self.base(self.i0)
        cl = max(0, self.W(t) - M)
        cq = 0
        if self.s.cq_files:
            units = self.n0 + math.floor((max(self.W(t), self.W0) - self.W0) * self.mpb_total) - self.cq_base_sum
            cq = CQ_UNIT * max(0, units)
        store = cl + cq + self.index_bytes(t)
        return self.p.disk_other_used + store, store

    def major_file_size(self, t: int) -> int:
        """5.3.3 getMajorFileSize (DefaultMessageStore.java:557-574), which isSpaceToDelete divides by the
        partition's total space / replicasPerDiskPartition (:2413-2415): whole mapped files, not written
        bytes — the commit log's files times its file size (MappedFileQueue.java:888-890), every queue's CQ
        files times theirs (ConsumeQueueStore.java:584-592; no CQ ext) and the index files times the first
        one's size (IndexService.java:91-97)."""
        total = self.S * (self.newest(t) - self.i0 + 1)
        if self.s.cq_files and len(self.cq_k):
            last_k = self.last_cq_files(t)
            total += CQ_UNIT * self.E * int(np.maximum(last_k - self.cq_k + 1, 1).sum())
        return total + self.index_total_size(t)

    def phys(self, t: int) -> float:
        """The partition's used ratio at t as Java computes it (ceil to a whole percent); needs a capacity."""
        return -(-100 * self.used(t)[0] // self.p.disk_capacity) / 100

    def ratios(self, t: int) -> tuple[float | None, bool, bool]:
        """(commitlog ratio, isSpaceToDelete, cleanImmediately) as the broker computes them at t."""
        p = self.p
        if p.disk_capacity is None:
            return None, False, False
        used, store = self.used(t)
        pct = -(-100 * used // p.disk_capacity)  # ceil, integers: exact
        phys = pct / 100  # same double as Math.ceil(...) / 100
        if self.dl:  # DLedger: > diskMaxUsedSpaceRatio (a float) checks age, > the force ratio ignores it
            return phys, phys > self.dl_check, phys > self.dl_force
        ratio = p.disk_max_used_space_ratio / 100.0
        warn, force = p.warn_ratio, p.force_ratio
        clean = False
        if p.version == "4":
            # commitlog, then the CQ directory: one partition, so both see the same ratio
            if phys > warn or phys > force:
                clean = True
            return phys, phys > ratio, clean
        if phys > warn or phys > force:
            return phys, True, True
        if p.replicas_per_disk_partition <= 1:
            return phys, phys > ratio, False
        share = p.disk_capacity // p.replicas_per_disk_partition  # partitionLogicalSize: a long division
        major = self.major_file_size(t)
        logical = major / share if share else (math.inf if major else math.nan)  # Java's double division
        if logical > p.logical_force_threshold:
            return phys, True, True
        return phys, logical > ratio, False

    # -- ticks --------------------------------------------------------------------------------
    def tick(self, k: int) -> int:
        return self.T0 + k * self.P

    def k_at(self, t: float) -> int:
        """Index of the first tick at or after t."""
        if t <= self.T0:
            return 0
        return int(-(-(int(math.ceil(t)) - self.T0) // self.P))

    def hour(self, t: int) -> int:
        return datetime.fromtimestamp(t // 1000, self.zone).hour

    def next_hour(self, t: int) -> int:
        off = datetime.fromtimestamp(t // 1000, self.zone).utcoffset()
        off_ms = int(off.total_seconds() * 1000) if off else 0
        nb = ((t + off_ms) // HOUR_MS + 1) * HOUR_MS - off_ms
        return nb if nb > t else t + 1

    def first_tick_where(self, k: int, allowed: tuple[int, ...]) -> int | None:
        """First tick >= k whose isTimeToDelete outcome is in ``allowed``."""
        if not any(x in allowed for x in self.table):
            return None
        while k <= self.kmax:
            t = self.tick(k)
            if self.table[self.hour(t)] in allowed:
                return k
            k = max(k + 1, self.k_at(self.next_hour(t)))
        return None

    def first_tick_pred(self, k: int, pred) -> int | None:
        """First tick >= k where a predicate monotone in time (between deletions) holds: binary search."""
        if k > self.kmax or not pred(self.tick(self.kmax)):
            return None
        lo, hi = k, self.kmax
        while lo < hi:
            mid = (lo + hi) // 2
            if pred(self.tick(mid)):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def next_event(self, k: int) -> int | None:
        if k > self.kmax:
            return None
        cands: list[int] = []
        if not self.dl and (self.manual_count > 0 or (not self.q_own and self.base(self.i0) > self.last_phys_min)):
            return k
        if self.manual_pending and not self.dl:  # DLedger: a manual delete reaches only the broker's idle cleaner
            cands.append(max(k, self.k_at(self.manual_pending[0])))
        F = self.fill_time(self.i0)
        if F != math.inf:
            E = max(F, self.mtime(self.i0) + self.expired)
            kf = max(k, self.k_at(F))
            ke = max(k, self.k_at(E))
            ok_run = (HOUR_FALSE, HOUR_TRUE)
            a = self.first_tick_where(ke, (HOUR_TRUE,))
            if a is not None:
                cands.append(a)
            if self.p.disk_capacity is not None:
                tS = self.first_tick_pred(kf, lambda t: self.ratios(t)[1])
                tC = (self.first_tick_pred(kf, lambda t: self.ratios(t)[2])
                      if self.p.clean_file_forcibly_enable else None)
                if tS is not None:
                    b = self.first_tick_where(max(tS, ke), ok_run)
                    if b is not None:
                        cands.append(b)
                if tC is not None:
                    c = self.first_tick_where(tC, (HOUR_TRUE,))
                    if c is not None:
                        cands.append(c)
                    if tS is not None:
                        d = self.first_tick_where(max(tC, tS), ok_run)
                        if d is not None:
                            cands.append(d)
        cands = [c for c in cands if c <= self.kmax]
        return min(cands) if cands else None

    def run(self) -> None:
        self._sample(self.start)
        k, now = 0, self.start
        while True:
            if not self.dl:
                k = self._catch_up(k)
                now = max(now, min(self.busy_until, self.until))
            ke = self.next_event(k)
            t_ev = self.until if ke is None else self.tick(ke)
            boundary = self.dl and ke is None and self.seg_next <= self.until  # DLedger's spacing changes there
            if boundary:
                t_ev = self.seg_next
            nq = self.next_queue_run() if self.q_own else None
            t_q = nq[0] if nq is not None and nq[0] <= min(t_ev, self.until) else None  # its own runs come first
            changed = apply_next_change(self, now, t_ev if t_q is None else t_q)
            if changed is not None:  # writes stop or resume first: the cleaner's future changes
                now = changed
                continue
            if t_q is not None:
                self._queue_runs(t_q)
                now = max(now, t_q)
                continue
            if boundary:
                self._reanchor(t_ev)
                k, now = 0, t_ev
                continue
            if ke is None:
                break
            k, now = ke, t_ev
            if self.dl:
                end = self._dledger_tick(t_ev)
                if end is not None:  # doWork returns after its last deletion, then waits 100 ms
                    self._reanchor(end + DLEDGER_TICK_MS)
                    k, now = 0, end
                    continue
            else:
                self.run_tick(t_ev)
                now = max(now, self.busy_until)
            k += 1
        self._sample(self.until)

    def _catch_up(self, k: int) -> int:
        """scheduleAtFixedRate never overlaps runs: a tick that passed while the previous run was still
        deleting starts when that run ends (judged then), and the next tick keeps its grid time."""
        while k <= self.kmax and self.tick(k) < self.busy_until <= self.until:
            self.run_tick(self.busy_until)
            k += 1
        return k

    def _reanchor(self, t: int) -> None:
        """DLedger's next doWork is at t (100 ms after a round ended, or the first run in an hour of the other
        kind): its grid restarts there, 100 ms apart, or 200 ms in an hour whose deleteWhen throws (doWork
        catches it and sleeps 200 ms), up to the next hour of the other kind."""
        err = self.table[self.hour(t)] == HOUR_ERROR
        self.T0, self.P = t, DLEDGER_ERROR_SLEEP_MS if err else DLEDGER_TICK_MS
        end = self.next_hour(t)
        for _ in range(25 if any(x == HOUR_ERROR for x in self.table) else 0):
            if (self.table[self.hour(end)] == HOUR_ERROR) != err:
                break
            end = self.next_hour(end)
        else:
            end = self.until + 1  # one kind all day
        self.seg_next = t + -(-(end - t) // self.P) * self.P  # the grid's first run in the other kind
        self.kmax = (min(self.until, self.seg_next - 1) - t) // self.P if self.until >= t else -1

    def _dledger_tick(self, T: int) -> int | None:
        """One CleanSpaceService.doWork at T (a bad deleteWhen throws: nothing that run); the time its
        last deletion happened, or None when it deleted nothing."""
        phys, space, force = self.ratios(T)
        check(self, "dledger", phys, self.dl_full, self.dl_full, T)  # isDiskFull comes before isTimeToDelete
        if self.table[self.hour(T)] == HOUR_ERROR:
            return None
        time_up = self.table[self.hour(T)] == HOUR_TRUE
        if not (time_up or space):
            return None
        pre = self.used(T)
        before = len(self.deletions)
        t_last, reason = self._delete_commitlog(T, time_up, space, force)
        if len(self.deletions) == before:
            return None
        self._sample(T, phys, used=pre)
        self._sample(t_last)
        return t_last

    def run_tick(self, T: int) -> None:
        """One run of the clean task at tick T: commit-log cleaner, then the queue/index cleaner."""
        while self.manual_pending and self.manual_pending[0] <= T:
            self.manual_pending.pop(0)
            self.manual_count = MANUAL_DELETE_RUNS
        if self.q_own:  # 5.x: the queue cleaner's own runs up to now
            self._queue_runs(T)
        outcome = self.table[self.hour(T)]
        moved_by: str | None = None
        t_last = T
        before = len(self.deletions)
        pre = phys = None
        if outcome != HOUR_ERROR:  # otherwise isTimeToDelete throws: the whole run is lost
            phys, space, clean_imm = self.ratios(T)
            check(self, "broker", phys, self.p.warn_ratio, self.p.force_ratio, T)  # isSpaceToDelete marks it
            time_up = outcome == HOUR_TRUE
            manual = self.manual_count > 0
            if time_up or space or manual:
                if manual:
                    self.manual_count -= 1
                pre = self.used(T)
                t_last, moved_by = self._delete_commitlog(T, time_up, space, clean_imm)
        end = t_last
        M = self.base(self.i0)
        if not self.q_own and M > self.last_phys_min:  # 4.9.8: the queue cleaner in the same task, after it
            self.last_phys_min = M
            end = self._clean_queues(t_last, M, moved_by or "startup")
        if len(self.deletions) > before:
            self._sample(T, phys, used=pre)
            self._sample(t_last)
        self.busy_until = end

    def _delete_commitlog(self, T: int, time_up: bool, space: bool, clean_imm: bool) -> tuple[int, str | None]:
        """MappedFileQueue.deleteExpiredFileByTime on the segment list as it is at tick T."""
        clean_at_once = self.p.clean_file_forcibly_enable and clean_imm
        # the list snapshot: segments i0 .. last, where last = newest segment at T
        last = self.newest(T)
        now, i, n = T, self.i0, 0
        reason = None
        while i < last:
            aged = now >= self.mtime(i) + self.expired
            if not (aged or clean_at_once):
                break
            reason = ("time" if time_up else "space" if space else "manual") if aged else "forced"
            self._lose(i, now)
            self.deletions.append({"time_ms": now, "file": f"{self.s.log_folder}/" + offset_to_file_name(self.base(i)),
                                   "kind": "commitlog", "reason": reason})
            n += 1
            self.i0 = i + 1
            self._min_moved(now, self.base(self.i0), reason)
            if n >= self.batch:
                break
            if self.interval > 0 and i + 1 < last:
                now += self.interval
            i += 1
        return now, reason

    def _sample(self, t: int, phys: float | None = None, used: tuple[int, int] | None = None) -> None:
        used, store = used or self.used(t)
        if phys is None and self.p.disk_capacity is not None:
            phys = -(-100 * used // self.p.disk_capacity) / 100
        if phys is not None:
            self.max_ratio = phys if self.max_ratio is None else max(self.max_ratio, phys)
        if self.disk and self.disk[-1]["time_ms"] == t and self.disk[-1]["used_bytes"] == used:
            return
        self.disk.append({"time_ms": int(t), "used_bytes": int(used), "store_bytes": int(store), "ratio": phys})

    # -- output -------------------------------------------------------------------------------
    def result(self) -> dict[str, Any]:
        groups = []
        for j, (g, t, q, off) in enumerate(self.pairs):
            groups.append({"group": g, "topic": t, "queue_id": int(q), "committed_offset": int(off),
                           "lost_messages": int(self.lost_msgs[j]), "lost_bytes": int(self.lost_bytes[j]),
                           "lost_offsets": [list(r) for r in self.ranges[j]], "first_loss_ms": self.first_loss[j],
                           "in_store": bool(self.pq[j] >= 0)})
        cl = [d for d in self.deletions if d["kind"] == "commitlog"]
        losses = [x["first_loss_ms"] for x in groups if x["first_loss_ms"] is not None]
        summary = {
            "commitlog_deleted": len(cl),
            "consumequeue_deleted": sum(1 for d in self.deletions if d["kind"] == "consumequeue"),
            "index_deleted": sum(1 for d in self.deletions if d["kind"] == "index"),
            "index_created": self.index_created(self.W(self.until)),
            "by_reason": {r: sum(1 for d in cl if d["reason"] == r) for r in ("time", "space", "forced", "manual")},
            "first_deletion_ms": cl[0]["time_ms"] if cl else None,
            "lost_messages": int(self.lost_msgs.sum()), "lost_bytes": int(self.lost_bytes.sum()),
            "groups_with_loss": len({x["group"] for x in groups if x["lost_messages"]}),
            "first_loss_ms": min(losses) if losses else None, "max_ratio": self.max_ratio,
            **refusal_summary(self),
        }
        if self.dl:
            summary["cleaner"] = "dledger"
        warnings = [self.when_problem] if self.when_problem else []
        if any(r["by"] == "disk" for r in self.refusals):
            warnings.append("the disk filled up with no disk-full mark refusing writes: the broker's writes fail "
                            "there, which is not modelled (writes are taken as refused until space is freed)")
        if self.dl and self.p.manual_deletes:
            warnings.append("manual deletes reach only the broker's commit-log cleaner, which deletes nothing in DLedger "
                            "mode (DLedgerCommitLog.deleteExpiredFile): they are ignored")
        return {"name": self.p.name, "settings": self.p.settings_dict(), "warnings": warnings,
                "deletions": self.deletions, "disk_usage": self.disk, "write_refusals": self.refusals,
                "groups": groups, "summary": summary}


def simulate(policy: Policy, snap: StoreSnapshot, model: TimeModel | None = None) -> dict[str, Any]:
    """Run one policy over one snapshot: deletion timeline, disk usage and per-group losses (JSON-ready)."""
    sim = CleanerSim(policy, snap, model or TimeModel())
    sim.run()
    return sim.result()


def describe(snap: StoreSnapshot, model: TimeModel | None = None, policy: Policy | None = None) -> dict[str, Any]:
    """The simulation's assumptions for one store (snapshot and time model), for the report."""
    sim = CleanerSim(policy or Policy.from_settings("describe", BrokerSettings()), snap, model or TimeModel())
    return {
        "store": snap.name, "snapshot_ms": sim.t_snap, "start_ms": sim.start, "until_ms": sim.until,
        "horizon_source": sim.horizon_source,
        "first_tick_ms": sim.T0, "segment_size": snap.segment_size, "write_pos": snap.write_pos,
        "ingest_bytes_per_s": sim.R, "ingest_source": sim.ingest_source, "consumption": sim.consumption,
        "mtime_source": snap.mtime_source,
        "cleaner": "dledger" if snap.dledger else "broker",
        "segments": [{"file": f"{snap.log_folder}/" + offset_to_file_name(int(b)), "mtime_ms": int(m),
                      "mtime_source": s}
                     for b, m, s in zip(snap.seg_base, snap.seg_mtime, snap.seg_mtime_source)],
        "queues": len(snap.q_topic), "groups": len(snap.groups),
        "findings": [f.to_dict() for f in snap.findings],
    }
