"""The whole commitlog as the cross-file checks see it (:class:`LogView`: the segment tasks' compact record
tables, the lost ranges) and the lookups they share. Healthy stores take shortcuts that reach the same
conclusions as the full comparisons (:func:`queue_records_exactly`, :func:`run_of`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class Unsettled(Exception):
    """The streamed cross-file checks met something only the whole record view can judge (damage, a file
    that disagrees with the records): the audit runs the whole-view checks instead, which say exactly
    what is wrong."""


class ResumeFailed(Exception):
    """An incremental audit's carry cannot settle what changed since: the audit runs in full."""


@dataclass(frozen=True)
class LogSummary:
    """What the report and the checkpoint check need of the whole log: counts and bounds, no records."""

    records: int
    bytes_valid: int
    ts_lo: int | None  # oldest store timestamp (None: no record)
    ts_hi: int | None
    log_min: int
    log_end: int  # physical end of the last valid record
    segment_size: int


@dataclass
class LogView:
    """The whole commitlog as the cross-file checks see it: records in commitlog order, lost ranges."""

    records: pa.Table
    keys: pa.Table
    lost: np.ndarray  # (k, 2) physical [start, end) ranges known lost (corrupt regions, missing segments)
    log_min: int
    log_end: int  # physical end of the last valid record
    segment_size: int = 1 << 30
    gaps: np.ndarray | None = None  # the lost ranges no segment file holds (missing segments)

    def __post_init__(self) -> None:
        r = self.records
        self.phy = r.column("phy_offset").to_numpy()
        self.size = r.column("size").to_numpy().astype(np.int64)
        self.field = r.column("physical_offset_field").to_numpy()
        self.qid = r.column("queue_id").to_numpy()
        self.qoff = r.column("queue_offset").to_numpy()
        self.tran = r.column("tran_type").to_numpy()
        self.tags = r.column("tags_code").to_numpy()
        self.ts = r.column("store_timestamp").to_numpy()
        self.sysflag = r.column("sys_flag").to_numpy()
        enc = pc.dictionary_encode(r.column("topic")).combine_chunks() if r.num_rows else None
        self.topic_idx = (np.asarray(enc.indices, dtype=np.int64) if enc is not None else np.zeros(0, np.int64))
        self.topic_names: list[str] = enc.dictionary.to_pylist() if enc is not None else []
        self.topic_code = {t: i for i, t in enumerate(self.topic_names)}
        # lookup by PHYSICALOFFSET field (what CQ/index entries hold): the fields in sorted order; a healthy
        # log's are sorted already (then no copy, and the order is the identity: ``field_order`` None)
        f = self.field
        if len(f) < 2 or bool(np.all(f[1:] >= f[:-1])):
            self.field_order: np.ndarray | None = None
            self.field_sorted = f
        else:
            self.field_order = np.argsort(f, kind="stable")
            self.field_sorted = f[self.field_order]
        self.field_unique = not bool(np.any(self.field_sorted[1:] == self.field_sorted[:-1]))
        # dispatchable record rows per (topic, queue), commitlog order (filled by check_queue_offsets)
        self.queue_rows: dict[tuple[str, int], np.ndarray] = {}

    def summary(self) -> LogSummary:
        n = len(self.ts)
        return LogSummary(n, int(self.size.sum()) if n else 0, int(self.ts.min()) if n else None,
                          int(self.ts.max()) if n else None, self.log_min, self.log_end, self.segment_size)

    def in_lost(self, phy: np.ndarray) -> np.ndarray:
        if not len(self.lost) or not len(phy):
            return np.zeros(len(phy), bool)
        i = np.searchsorted(self.lost[:, 0], phy, side="right") - 1
        ok = i >= 0
        j = np.clip(i, 0, None)
        return ok & (phy < self.lost[j, 1])

    def lookup_field(self, phy: np.ndarray, hint: np.ndarray | None = None) -> np.ndarray:
        """Record row whose PHYSICALOFFSET field equals ``phy`` (or whose position does), -1 if none.

        ``hint``: a guessed row per value; where that row's field equals the value and fields are unique,
        it is the answer (checked, so a wrong guess costs only the search it did not save)."""
        out = np.full(len(phy), -1, np.int64)
        if not len(self.field_sorted) or not len(phy):
            return out
        if hint is not None and self.field_unique:
            ok = self.field[hint] == phy
            out[ok] = hint[ok]
            rest = np.flatnonzero(~ok)
            if len(rest):
                out[rest] = self.lookup_field(phy[rest])
            return out
        i = np.searchsorted(self.field_sorted, phy)
        ic = np.clip(i, 0, len(self.field_sorted) - 1)
        hit = self.field_sorted[ic] == phy
        out[hit] = ic[hit] if self.field_order is None else self.field_order[ic[hit]]
        miss = np.flatnonzero(~hit)
        if len(miss):
            j = np.searchsorted(self.phy, phy[miss])
            jc = np.clip(j, 0, len(self.phy) - 1)
            h2 = self.phy[jc] == phy[miss]
            out[miss[h2]] = jc[h2]
        return out


def is_member(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``np.isin(values, set)`` for a sorted int64 set by binary search: numpy's hash-based unique
    behind ``isin`` takes seconds on millions of 64-bit codes, a searchsorted takes milliseconds."""
    if not len(sorted_set) or not len(values):
        return np.zeros(len(values), bool)
    i = np.searchsorted(sorted_set, values)
    return sorted_set[np.minimum(i, len(sorted_set) - 1)] == values


def queue_records_exactly(log: LogView, recs: np.ndarray | None, phy: np.ndarray, qoffs: np.ndarray
                           ) -> np.ndarray | None:
    """``recs`` (a queue's dispatchable record rows, commitlog order) when the queue's checked units are
    exactly those records in order: same count, each unit's phyOffset its record's PHYSICALOFFSET field and
    its queue offset the record's QUEUEOFFSET. With unique fields that is what :meth:`LogView.lookup_field`
    finds, and topic, queue, queue offset and transaction type then match by construction. Else None."""
    if (recs is None or not len(recs) or len(recs) != len(phy) or not log.field_unique
            or not np.array_equal(log.qoff[recs], qoffs) or not np.array_equal(log.field[recs], phy)):
        return None
    return recs


def queue_hint(log: LogView, key: tuple[str, int], qoffs: np.ndarray) -> np.ndarray | None:
    """Guessed record rows of a queue's CQ units: its record with the same queue offset (a clean queue
    has exactly one), for :meth:`LogView.lookup_field`."""
    recs = log.queue_rows.get(key)
    if recs is None or not len(recs) or not len(qoffs):
        return None
    qo = log.qoff[recs]
    if not bool(np.all(qo[1:] > qo[:-1])):
        return None
    return recs[np.minimum(np.searchsorted(qo, qoffs), len(recs) - 1)]


def _by_runs(fn, q: np.ndarray) -> np.ndarray:
    """``fn(q)`` for an elementwise ``fn`` and ``q`` in ascending order with repeats (a record's keys are
    consecutive): each distinct value is computed once."""
    if len(q) < 2 or not bool(np.all(q[1:] >= q[:-1])):
        return fn(q)
    starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
    return np.repeat(fn(q[starts]), np.diff(np.r_[starts, len(q)]))


def lookup_repeats(log: LogView, phy: np.ndarray) -> np.ndarray:
    """``log.lookup_field(phy)``, each distinct value of sorted ``phy`` once (:func:`_by_runs`)."""
    return _by_runs(log.lookup_field, phy)


def searchsorted_repeats(a: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``np.searchsorted(a, q)``, each distinct value of sorted ``q`` once (:func:`_by_runs`)."""
    return _by_runs(lambda v: np.searchsorted(a, v), q)


def run_of(sorted_vals: np.ndarray, sorted_set: np.ndarray) -> bool:
    """Is ``sorted_vals`` a contiguous run of ``sorted_set`` (so every value is a member)? A sufficient,
    cheap test of ``is_member(vals, set).all()`` for the common case: an index file's entries are the keys
    of a range of records, exactly."""
    if not len(sorted_vals):
        return True
    i = int(np.searchsorted(sorted_set, sorted_vals[0]))
    return bool(np.array_equal(sorted_set[i:i + len(sorted_vals)], sorted_vals))


def rel_path(root: str, path: str | None) -> str | None:
    if path is None:
        return None
    r = root.rstrip("/") + "/"
    return path[len(r):] if path.startswith(r) else path
