"""The audit report's record-derived series (traffic per topic over time, the record size distribution),
accumulated segment by segment: a store of any size is summarised in memory bounded by its topics and
distinct record sizes, never by its records. A whole log fed at once gives the same numbers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAX_TOPICS = 8


def time_buckets(lo: int, hi: int, buckets: int = 60) -> tuple[int, int, int]:
    """(bucket ms, first bucket start ms, bucket count): a round bucket width giving at most about
    ``buckets`` buckets over the store-time span [lo, hi]."""
    span = max(hi - lo, 1)
    nice = [1000, 5000, 10_000, 60_000, 300_000, 600_000, 3_600_000, 6 * 3_600_000, 86_400_000, 7 * 86_400_000]
    bucket = next((b for b in nice if span / b <= buckets), nice[-1] * (span // (nice[-1] * buckets) + 1))
    start = lo - lo % bucket
    return bucket, start, int((hi - start) // bucket) + 1


class TopicCodes:
    """Topics numbered in first-seen order over a stream of record batches (the series' rows)."""

    def __init__(self, names: list[str] | None = None) -> None:
        self.reset(names)

    def reset(self, names: list[str] | None) -> None:
        """Start from ``names`` (an earlier run's numbering), in place."""
        self.names: list[str] = list(names or [])
        self.code: dict[str, int] = {t: i for i, t in enumerate(self.names)}

    def of(self, topics: pa.ChunkedArray | pa.Array) -> np.ndarray:
        """Each row's topic code (new topics numbered as they first appear)."""
        enc = pc.dictionary_encode(topics)
        if isinstance(enc, pa.ChunkedArray):
            enc = enc.combine_chunks()
        local = np.empty(len(enc.dictionary), np.int64)
        for i, t in enumerate(enc.dictionary.to_pylist()):
            c = self.code.get(t)
            if c is None:
                c = self.code[t] = len(self.names)
                self.names.append(t)
            local[i] = c
        return local[np.asarray(enc.indices, dtype=np.int64)]


class TrafficSeries:
    """Messages per topic per time bucket. The span (``lo``..``hi``, the store-time range of every record
    to come) fixes the buckets up front, so each batch is counted once and dropped."""

    def __init__(self, lo: int | None, hi: int | None, buckets: int = 60) -> None:
        self.empty = lo is None or hi is None
        self.bucket, self.start, self.nb = time_buckets(lo, hi, buckets) if not self.empty else (0, 0, 0)
        self.grid = np.zeros((0, self.nb), np.int64)  # a row per topic code, in first-seen order

    def feed(self, ts: np.ndarray, topic_code: np.ndarray, n_topics: int) -> None:
        """``topic_code``: each record's topic as a code numbered in first-seen order over the whole log."""
        if self.empty or not len(ts):
            return
        if n_topics > len(self.grid):
            self.grid = np.vstack([self.grid, np.zeros((n_topics - len(self.grid), self.nb), np.int64)])
        b = (ts - self.start) // self.bucket
        self.grid += np.bincount(topic_code * self.nb + b, minlength=len(self.grid) * self.nb).reshape(self.grid.shape)

    def snapshot(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "start": self.start, "grid": self.grid.tolist(), "empty": self.empty}

    def resume(self, snap: dict[str, Any], drop_before: bool = False) -> bool:
        """Add an earlier run's counts (topic codes numbered the same way). False when its buckets do not
        nest in these (a store whose time span grew past the widest round bucket): count again in full.
        ``drop_before``: buckets before these are dropped (the records in them expired since)."""
        if snap["empty"] or not snap["grid"] or not snap["grid"][0]:
            return True
        old = np.asarray(snap["grid"], np.int64)
        if self.empty or self.bucket % snap["bucket"]:
            return False
        at = (snap["start"] + np.arange(old.shape[1]) * snap["bucket"] - self.start) // self.bucket
        if drop_before:
            old, at = old[:, at >= 0], at[at >= 0]
            if not len(at):
                return True
        if at.min() < 0 or at.max() >= self.nb:
            return False
        if len(old) > len(self.grid):
            self.grid = np.vstack([self.grid, np.zeros((len(old) - len(self.grid), self.nb), np.int64)])
        for j, col in enumerate(at.tolist()):
            self.grid[:len(old), col] += old[:, j]
        return True

    def result(self, topic_names: list[str]) -> dict[str, Any]:
        """Top topics by volume (ties: first seen first), the rest as '(other topics)'."""
        if self.empty or not self.grid.sum():
            return {"bucket_ms": 0, "start_ms": None, "topics": {}}
        counts = self.grid.sum(axis=1)
        top = np.argsort(-counts, kind="stable")[:MAX_TOPICS]
        series: dict[str, list[int]] = {topic_names[ti]: self.grid[ti].tolist() for ti in top.tolist()}
        other = np.ones(len(self.grid), bool)
        other[top] = False
        rest = self.grid[other].sum(axis=0)
        if rest.any():
            series["(other topics)"] = rest.tolist()
        return {"bucket_ms": int(self.bucket), "start_ms": int(self.start), "topics": series}


class SizeHistogram:
    """Record sizes (TOTALSIZE) in power-of-two buckets, with min/max/mean and the 50th/99th percentiles
    exactly as ``np.percentile`` (linear) gives them over all sizes, from each distinct size's count."""

    def __init__(self) -> None:
        self.vals = np.zeros(0, np.int64)  # distinct sizes seen, ascending
        self.cnt = np.zeros(0, np.int64)  # how many records of each

    def _merge(self, v: np.ndarray, c: np.ndarray) -> None:
        allv = np.concatenate([self.vals, v])
        u, inv = np.unique(allv, return_inverse=True)
        self.vals, self.cnt = u, np.bincount(inv, weights=np.concatenate([self.cnt, c]), minlength=len(u)).astype(np.int64)

    def feed(self, sizes: np.ndarray) -> None:
        if not len(sizes):
            return
        lo, hi = int(sizes.min()), int(sizes.max())
        if hi - lo < 1 << 20:  # a count per size in the span: no sort
            c = np.bincount(sizes - lo, minlength=hi - lo + 1)
            v = np.flatnonzero(c)
            v, c = v + lo, c[v]
        else:
            v, c = np.unique(sizes, return_counts=True)
        self._merge(v.astype(np.int64), c.astype(np.int64))

    def snapshot(self) -> list[list[int]]:
        return [self.vals.tolist(), self.cnt.tolist()]

    def resume(self, snap: list[list[int]]) -> None:
        self._merge(np.asarray(snap[0], np.int64), np.asarray(snap[1], np.int64))

    def result(self) -> dict[str, Any]:
        if not len(self.vals):
            return {"buckets": []}
        vals, cnt = self.vals, self.cnt
        n = int(cnt.sum())
        k = np.floor(np.log2(np.maximum(vals, 1))).astype(np.int64)
        c = np.bincount(k, weights=cnt).astype(np.int64)
        p50, p99 = _percentiles(vals, np.cumsum(cnt), n, [50, 99])
        return {"buckets": [{"from": 1 << i, "to": (1 << (i + 1)) - 1, "count": int(m)} for i, m in enumerate(c) if m],
                "min": int(vals[0]), "max": int(vals[-1]), "mean": float(int((vals * cnt).sum()) / n),
                "p50": float(p50), "p99": float(p99)}


def _percentiles(vals: np.ndarray, cum: np.ndarray, n: int, qs: list[float]) -> np.ndarray:
    """``np.percentile(sizes, qs)`` (method linear) from the sorted distinct values and their cumulative
    counts, with numpy's own arithmetic: virtual index (n - 1) * q / 100, then its two-sided lerp."""
    q = np.true_divide(np.asarray(qs, dtype=np.float64), 100)
    virtual = (n - 1) * q
    prev = np.floor(virtual)
    nxt = prev + 1
    above = virtual >= n - 1
    prev[above] = n - 1
    nxt[above] = n - 1
    at = lambda i: vals[np.searchsorted(cum, i.astype(np.int64), side="right")]  # noqa: E731 - value at sorted index
    a, b = at(prev), at(nxt)
    t = virtual - np.floor(virtual)
    diff = b - a
    out = np.add(a, diff * t)
    np.subtract(b, diff * (1 - t), out=out, where=t >= 0.5, casting="unsafe", dtype=out.dtype)
    return out


def traffic_series(ts: np.ndarray, topic_code: np.ndarray, topic_names: list[str], buckets: int = 60) -> dict[str, Any]:
    """The traffic series of a whole log at once."""
    t = TrafficSeries(int(ts.min()) if len(ts) else None, int(ts.max()) if len(ts) else None, buckets)
    t.feed(ts, topic_code, len(topic_names))
    return t.result(topic_names)


def size_histogram(sizes: np.ndarray) -> dict[str, Any]:
    """The size histogram of a whole log at once."""
    h = SizeHistogram()
    h.feed(sizes)
    return h.result()


def view_charts(log) -> dict[str, Any]:
    """The series of a whole record view (:class:`storelib.checks.logview.LogView`)."""
    return {"traffic": traffic_series(log.ts, log.topic_idx, log.topic_names), "sizes": size_histogram(log.size)}
