"""The broker's consume-queue and index cleaner (CleanConsumeQueueService) for the retention simulation
(:mod:`storelib.broker.expiry.cleaner`). A mixin of the simulation's state.

What it does on a run (4.9.8 DefaultMessageStore.java:1872-1896, 5.3.3 DefaultMessageStore.java:2496-2518):
read the commit log's min offset M once; if M moved past the last one seen, walk every consume queue
(ConsumeQueue.deleteExpiredFile: its files whose last unit is below M, never the last one) and, after each
queue that deleted a file, sleep ``deleteConsumeQueueFilesInterval`` (100 ms); then the index files below M.
So the n-th queue that deletes does so n x 100 ms after the run started, the index files go after the last
sleep, and the run lasts that long. The queues are walked in the snapshot's order (topic, queue id); the
broker walks its ConcurrentHashMaps in hash order, which depends on the table's history: only the order
among queues is not modelled, the count and the spacing are.

When it runs:

* 4.9.8: in the clean task, right after the commit-log cleaner (cleanFilesPeriodically,
  DefaultMessageStore.java:1366-1369): it sees the min offset the commit-log cleaner left, and its sleeps
  lengthen the task's run (a tick that passes meanwhile starts when it ends);
* 5.3.3: on its own single-thread executor, scheduleAtFixedRate(cleanQueueFilesPeriodically, 60 s,
  cleanResourceInterval) (DefaultMessageStore.java:1862-1867, executor :216-217), beside the commit-log
  cleaner's (:1820-1825): both start at the same ticks and run at once, so a run reads the min offset as the
  commit-log cleaner has left it so far (the files deleted before the run's start; one deleted at that very
  time is not yet gone: destroy and the list's update come after), and a run that outlasts its period
  delays the next one the same way;
* DLedger mode (either version): the broker's commit-log cleaner deletes nothing, so the queue cleaner reads
  DLedger's min offset on the broker's clean ticks, as in 5.3.3.

Index files written during the simulation: the broker indexes each message as it dispatches it
(IndexService.buildIndex); a file is full at indexCount >= maxIndexNum (IndexFile.isWriteFull,
IndexFile.java:105-107; indexCount starts at 1, so a file holds maxIndexNum - 1 entries) and the next key
creates a new one (getAndCreateLastIndexFile, IndexService.java:292-330 in 4.9.8), named by its creation
time in the JVM's zone. With the snapshot's observed entries per commit-log byte, the last file fills at a
known write position and each new one spans (maxIndexNum - 1) / rate bytes; its endPhyOffset is taken as
that position (the last indexed message starts just before it). IndexService.deleteExpiredFile
(IndexService.java:90-121, the same in 5.3.3) deletes, when the first file's endPhyOffset is below M,
the files in order whose endPhyOffset is below M, never the last one. A new file counts its whole size on
the disk from its creation, as the existing ones do (mmap'd files).
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from storelib.broker.expiry.expiry import CQ_UNIT
from storelib.format.indexdir import index_file_name
from storelib.scan.commitlog import offset_to_file_name


class QueueCleaning:
    """CleanConsumeQueueService; needs the simulation's policy and snapshot (``p``, ``s``), its timeline
    (``deletions``, ``until``, ``_sample``) and geometry (``_below``, ``max_offsets``)."""

    def _init_queue_cleaner(self, own: bool, anchor: int, period: int) -> None:
        """The CQ and index files of the snapshot (``self.s``) and the cleaner's schedule. ``own``: on its own
        schedule (5.x, DLedger mode) from ``anchor`` every ``period`` ms; else run by the clean task (4.9.8).
        The commit log's min offset moves are kept in time order: a run reads the one in force at its start."""
        snap = self.s
        self.E = snap.cq_entries_per_file
        self.cq_k = snap.q_first_cq_seg.copy()  # per queue: number of its first live CQ file
        self.cq_base_sum = int((self.cq_k * self.E).sum())
        self.idx_first = 0
        self.idx_bytes = sum(f[2] for f in snap.index_files)
        self.last_phys_min = 0  # lastPhysicalMinOffset
        self.q_own, self.q_T0, self.q_P = own, anchor, period
        self.q_interval = self.p.delete_consume_queue_files_interval
        min_offset = int(snap.seg_base[0])
        self.q_k = -1  # grid index of the last run
        self.q_busy = -math.inf  # when the last run ended
        self.mv_t: list[float] = [-math.inf]
        self.mv_m: list[int] = [min_offset]
        self.mv_r: list[str] = ["startup"]
        # index files created while the simulation writes: new file j >= 1 starts when the write position
        # passes ix_fill + (j - 1) * ix_span and ends (is full) at ix_fill + j * ix_span
        n = snap.index_num
        self.ix_on = bool(snap.index_files) and snap.index_per_byte > 0 and n > 1 and snap.index_file_size > 0
        self.ix_span = (n - 1) / snap.index_per_byte if self.ix_on else math.inf
        self.ix_fill = self.W0 + max(0, n - snap.index_last_count) / snap.index_per_byte if self.ix_on else math.inf
        self.ix_gone = 0  # new files deleted (the first ones)

    def index_created(self, w: float) -> int:
        """How many new index files the broker has created by write position w."""
        if w <= self.ix_fill:
            return 0
        return int(math.ceil((w - self.ix_fill) / self.ix_span))

    def index_bytes(self, t: int) -> int:
        """Bytes of the live index files at t."""
        return self.idx_bytes + self.s.index_file_size * (self.index_created(self.W(t)) - self.ix_gone)

    def _min_moved(self, t: int, m: int, reason: str) -> None:
        """The commit log's min offset became ``m`` at t (a file deleted)."""
        self.mv_t.append(t)
        self.mv_m.append(m)
        self.mv_r.append(reason)

    def next_queue_run(self) -> tuple[int, int] | None:
        """(start, grid index) of the queue cleaner's next run that sees a min offset it has not acted on, or
        None. Runs start on their grid, or when the previous run ends if it outlasted a tick (fixed rate:
        the ticks it covered then run at once, and only the first can see something new)."""
        if self.mv_m[-1] <= self.last_phys_min:
            return None
        c = self.mv_t[bisect.bisect_right(self.mv_m, self.last_phys_min)]  # the first move not acted on
        j = self.q_k + 1
        if self.q_T0 + j * self.q_P <= self.q_busy:
            if self.q_busy > c:
                return int(self.q_busy), j
            j = int((self.q_busy - self.q_T0) // self.q_P) + 1
        if c != -math.inf:
            j = max(j, int((c - self.q_T0) // self.q_P) + 1)  # the first tick after the move
        return self.q_T0 + j * self.q_P, j

    def index_total_size(self, t: int) -> int:
        """5.3.3 IndexService.getTotalSize at t: the first live file's size times the number of files."""
        files = self.s.index_files
        n = len(files) - self.idx_first + self.index_created(self.W(t)) - self.ix_gone
        first = files[self.idx_first][2] if self.idx_first < len(files) else self.s.index_file_size
        return n * first if n > 0 else 0

    def _queue_runs(self, upto: int) -> None:
        """Every queue-cleaner run (own schedule) that starts at or before ``upto`` and has work."""
        while (nxt := self.next_queue_run()) is not None and nxt[0] <= min(upto, self.until):
            s, j = nxt
            i = bisect.bisect_left(self.mv_t, s) - 1  # the min offset as it is at s
            self.q_k = j
            self.q_busy = s
            if self.mv_m[i] > self.last_phys_min:
                self.last_phys_min = self.mv_m[i]
                self.q_busy = self._clean_queues(s, self.mv_m[i], self.mv_r[i])
                self._sample(s)

    def last_cq_files(self, t: int) -> np.ndarray:
        """Each queue's CQ file (index) holding its last unit at t (an empty queue: its first file)."""
        mx = self.max_offsets(t)
        return np.where(mx > 0, (mx - 1) // self.E, self.cq_k)

    def _clean_queues(self, t: int, M: int, reason: str) -> int:
        """One run that acts on min offset M from t: CQ files whose last unit is below M, each deleting queue
        followed by a sleep, then index files; the time the run ends."""
        if self.s.cq_files and len(self.cq_k):
            below = self._below(M)
            last_k = self.last_cq_files(t)
            new_k = np.maximum(self.cq_k, np.minimum(last_k, below // self.E))
            for qi in np.flatnonzero(new_k > self.cq_k):
                d = f"consumequeue/{self.s.q_topic[qi]}/{int(self.s.q_id[qi])}/"
                for kk in range(int(self.cq_k[qi]), int(new_k[qi])):
                    self.deletions.append({"time_ms": t, "file": d + offset_to_file_name(kk * self.E * CQ_UNIT),
                                           "kind": "consumequeue", "reason": reason})
                t += max(0, self.q_interval)
            self.cq_k = new_k
            self.cq_base_sum = int((self.cq_k * self.E).sum())
        self._clean_index(t, M, reason)
        return t

    def _clean_index(self, t: int, M: int, reason: str) -> None:
        """IndexService.deleteExpiredFile(M) at t: the snapshot's files, then the ones created since."""
        files = self.s.index_files
        made = self.index_created(self.W(t))
        last = len(files) + made - 1  # the last file (never deleted): existing ones first, then the new
        i = self.idx_first + self.ix_gone
        while i < last:
            end = files[i][1] if i < len(files) - 1 else self.ix_fill + (i - len(files) + 1) * self.ix_span
            if not end < M:
                break
            if i < len(files):
                name, size = files[i][0], files[i][2]
                self.idx_bytes -= size
                self.idx_first += 1
            else:
                j = i - len(files) + 1  # new file j was created when the write position passed its start
                start = self.ix_fill + (j - 1) * self.ix_span
                name = index_file_name(int(self.clock.at_writing_ms(math.ceil((start - self.W0) * 1000.0 / self.R))),
                                       self.zone)
                self.ix_gone += 1
            self.deletions.append({"time_ms": t, "file": "index/" + name, "kind": "index", "reason": reason})
            i += 1


__all__ = ["QueueCleaning"]
