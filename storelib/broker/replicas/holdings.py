"""What one replica holds outside the part every other replica shares: scanned as tasks, one segment range
each, and summed per interval, topic and queue.

A store's data ``[min, end)`` is cut at the ends of what it shares with each other store (and at the
offset a rejoin cuts it at) into intervals; every message of an interval is held by the same set of other
stores. A task scans one segment range and returns, per (interval, topic, queue): messages, bytes, first
and last queue offset, first and last physical offset, first and last store time. Only the ranges outside
the part shared by every store are scanned: what agrees everywhere is never read record by record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.fileio.bytesource import open_source, resolve
from storelib.scan.scanner import SegmentScan

COLUMNS = ["phy_offset", "size", "topic", "queue_id", "queue_offset", "tran_type", "store_timestamp"]
AGG_SCHEMA = pa.schema([("interval", pa.int32()), ("topic", pa.string()), ("queue_id", pa.int32()),
                        ("messages", pa.int64()), ("bytes", pa.int64()),
                        ("first_queue_offset", pa.int64()), ("last_queue_offset", pa.int64()),
                        ("first_offset", pa.int64()), ("last_offset", pa.int64()),
                        ("first_store_ts", pa.int64()), ("last_store_ts", pa.int64())])


@dataclass(frozen=True)
class HoldTask:
    """Scan the records starting in ``[start, end)`` (file offsets) of one segment; label each by the
    interval of ``bounds`` (sorted absolute offsets) its physical offset falls in."""

    key: tuple
    uri: str
    file_size: int
    base: int
    start: int
    end: int
    bounds: tuple[int, ...]
    delay_levels_ms: tuple[int, ...] = ()
    fs_options: dict[str, Any] = field(default_factory=dict)
    dledger: bool = False  # a DLedger data file: ``start``/``end`` are entry starts, rows at entry pos + 48
    line: str | None = None  # the store's broker line (settings.scan_line): whose record check applies


def _aggregate(tables: list[pa.Table]) -> pa.Table:
    """Per (interval, topic, queue) sums and extremes of per-message rows or of earlier aggregates."""
    t = pa.concat_tables(tables) if tables else AGG_SCHEMA.empty_table()
    if t.num_rows == 0:
        return AGG_SCHEMA.empty_table()
    g = t.group_by(["interval", "topic", "queue_id"], use_threads=False).aggregate([
        ("messages", "sum"), ("bytes", "sum"), ("first_queue_offset", "min"), ("last_queue_offset", "max"),
        ("first_offset", "min"), ("last_offset", "max"), ("first_store_ts", "min"), ("last_store_ts", "max")])
    cols = {f.name: g.column(n) for f, n in zip(AGG_SCHEMA, ["interval", "topic", "queue_id", "messages_sum", "bytes_sum",
                                                            "first_queue_offset_min", "last_queue_offset_max",
                                                            "first_offset_min", "last_offset_max",
                                                            "first_store_ts_min", "last_store_ts_max"])}
    return pa.table(cols).cast(AGG_SCHEMA).sort_by([("interval", "ascending"), ("topic", "ascending"),
                                                  ("queue_id", "ascending")])


def _rows(batch: pa.RecordBatch, bounds: np.ndarray) -> pa.Table:
    phy = np.asarray(batch.column("phy_offset"))
    interval = np.searchsorted(bounds, phy, side="right").astype(np.int32) - 1
    tt = np.asarray(batch.column("tran_type"))
    qoff = pa.array(np.asarray(batch.column("queue_offset")), mask=(tt == 1) | (tt == 3))  # no CQ entry, offset 0
    size = batch.column("size").cast(pa.int64())
    ts = batch.column("store_timestamp")
    return pa.table({"interval": pa.array(interval), "topic": batch.column("topic"), "queue_id": batch.column("queue_id"),
                     "messages": pa.array(np.ones(len(phy), np.int64)), "bytes": size,
                     "first_queue_offset": qoff, "last_queue_offset": qoff,
                     "first_offset": batch.column("phy_offset"), "last_offset": batch.column("phy_offset"),
                     "first_store_ts": ts, "last_store_ts": ts})


def hold_task(task: HoldTask) -> tuple[tuple, pa.Table, int]:
    """(key, aggregates, file offset where the scan stopped) for one segment range (a task for any engine)."""
    bounds = np.asarray(task.bounds, np.int64)
    src = open_source(resolve(task.uri, **task.fs_options), task.file_size)
    try:
        scan = SegmentScan(src, task.uri.rsplit("/", 1)[-1], task.base, task.start, task.end, verify_crc=False,
                           with_properties=False, columns=COLUMNS,
                           delay_levels_ms=list(task.delay_levels_ms) or None, dledger=task.dledger, line=task.line)
        parts = [_aggregate([_rows(b, bounds)]) for b in scan if b.num_rows]
        stop = scan.end.file_offset if scan.end is not None else task.end
    finally:
        src.close()
    return task.key, _aggregate(parts), stop


def merge(tables: list[pa.Table]) -> pa.Table:
    """The aggregates of many tasks (of one store) summed."""
    return _aggregate(tables)


def summarise(agg: pa.Table, intervals: list[int]) -> dict[str, Any]:
    """Messages, bytes, first/last offset and per-queue rows over the given intervals of a store's aggregate."""
    sel = agg.filter(pc.is_in(agg.column("interval"), pa.array(intervals, pa.int32()))) if intervals else agg.slice(0, 0)
    if sel.num_rows == 0:
        return {"messages": 0, "bytes": 0, "first_offset": None, "last_offset": None, "queues": []}
    per_q = sel.group_by(["topic", "queue_id"], use_threads=False).aggregate([
        ("messages", "sum"), ("bytes", "sum"), ("first_queue_offset", "min"), ("last_queue_offset", "max"),
        ("first_offset", "min"), ("last_offset", "max"), ("first_store_ts", "min"), ("last_store_ts", "max")])
    per_q = per_q.sort_by([("topic", "ascending"), ("queue_id", "ascending")])
    queues = [{"topic": r["topic"], "queue_id": r["queue_id"], "messages": r["messages_sum"], "bytes": r["bytes_sum"],
               "first_queue_offset": r["first_queue_offset_min"], "last_queue_offset": r["last_queue_offset_max"],
               "first_offset": r["first_offset_min"], "last_offset": r["last_offset_max"],
               "first_store_ts": r["first_store_ts_min"], "last_store_ts": r["last_store_ts_max"]}
              for r in per_q.to_pylist()]
    return {"messages": int(pc.sum(sel.column("messages")).as_py()), "bytes": int(pc.sum(sel.column("bytes")).as_py()),
            "first_offset": pc.min(sel.column("first_offset")).as_py(),
            "last_offset": pc.max(sel.column("last_offset")).as_py(), "queues": queues}


def queue_extremes(agg: pa.Table, intervals: list[int]) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """{(topic, queue): (first queue offset, last queue offset)} over the given intervals."""
    out: dict[tuple[str, int], tuple[int | None, int | None]] = {}
    if not intervals or agg.num_rows == 0:
        return out
    sel = agg.filter(pc.is_in(agg.column("interval"), pa.array(intervals, pa.int32())))
    if sel.num_rows == 0:
        return out
    g = sel.group_by(["topic", "queue_id"], use_threads=False).aggregate(
        [("first_queue_offset", "min"), ("last_queue_offset", "max")])
    for r in g.to_pylist():
        out[(r["topic"], r["queue_id"])] = (r["first_queue_offset_min"], r["last_queue_offset_max"])
    return out


__all__ = ["AGG_SCHEMA", "HoldTask", "hold_task", "merge", "queue_extremes", "summarise"]
