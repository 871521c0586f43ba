"""The export task: one segment (the recovery walk's view of it) written as Parquet files of a snapshot's
staging directory (:mod:`storelib.snapshot.directory`), module-level so that every engine runs it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storelib.broker.recovery.walk import SegmentTask, WalkPlan, iter_task
from storelib.fileio.bytesource import Location, open_source, resolve, sha256_of
from storelib.fileio.memory import keep_freed_memory
from storelib.fileio.pagecare import PageCare, ReadPacer
from storelib.format.topicname import escape_topic
from storelib.scan.arrowcols import group_order
from storelib.scan.commitlog import at_cut
from storelib.scan.messagecols import message_batch
from storelib.scan.scanner import SegmentEnd
from storelib.snapshot.directory import file_schema, partitioning

ROW_GROUP = 128 * 1024  # rows: large enough for the vectorised readers, small enough to prune by
MAX_FILE_ROWS = 4 * ROW_GROUP * 8  # a partition's file of one segment is cut past this
PENDING_ROWS = 4 * ROW_GROUP  # rows held for partitions that have not filled a row group yet
# bytes of taken batches that waiting rows may keep alive: a partition's rows wait as slices of their batch's
# take, and each slice keeps its whole batch (a 1 GB segment's task grew to 820 MB with ~38 batches held)
KEEP_BYTES = 256 << 20


@dataclass(frozen=True)
class TaskCtx:
    """What every export task needs (picklable)."""

    plan: WalkPlan
    staging: str  # path (local) or URI of the run's staging directory
    fs_options: dict[str, Any]
    delay_levels: list[int]
    with_body: bool
    partition_by: tuple[str, ...]
    run: str  # in every file name: a re-exported segment never overwrites the files it replaces
    live: bool = False  # a broker runs the store: files read by ranged reads, one deleted since the listing expired
    read_rate: float | None = None  # bytes a second for the run (read_share) or each task (its even share)
    read_share: str | None = None  # the run's budget file its tasks pace through (ReadPacer; local and pool)


# dictionary encoding only where values repeat (on msg ids, keys and offsets it costs time and bytes);
# min/max statistics where queries filter (offsets, times, queues): 2 GB store, 1.36 M rows: 25% less
# write time and 20% smaller files than Parquet's defaults
DICTIONARY_COLUMNS = ["topic", "tags", "born_host", "store_host", "segment", "magic_version", "queue_id", "flag",
                      "sys_flag", "tran_type", "reconsume_times", "crc_ok", "prop_crc_ok", "tags_code", "properties"]
STATS_COLUMNS = ["phy_offset", "store_timestamp", "store_time", "born_timestamp", "queue_id", "queue_offset",
                 "segment"]
MAX_ENTRY_BYTES = 255  # a directory entry on the usual filesystems (ext4, xfs, S3 keys allow more)


def partition_problem(topic: str | None) -> str | None:
    """Why ``topic`` cannot be a ``topic=`` partition directory (None when it can). The value is
    percent-encoded in the path (a ``/`` or ``..`` is safe there); only the entry's length and an empty
    name, which would read back as null, are problems. The entry is the one the writer makes
    (:class:`_Partitions`: the Hive partitioning's own encoding)."""
    if not topic:
        return "empty topic name (a partition value reads back as null)"
    n = len(partitioning(("topic",)).format(pc.field("topic") == topic)[0].encode("utf-8"))
    return None if n <= MAX_ENTRY_BYTES else f"{n} bytes as a partition directory, more than {MAX_ENTRY_BYTES}"


def take_rows(table: pa.Table, order: np.ndarray) -> pa.Table:
    """``table.take(order)``, the same table, with each map column (``properties``) moved row by row
    (:func:`_take_map`): Arrow's take of a map copies it entry by entry, 60% of the partition sort's take
    (one 65 k-row batch of the generated store: the map 15.8 ms by Arrow, 6.9 ms by rows; the other 28
    columns 10 ms)."""
    idx = pa.array(order)
    cols = []
    for col in table.columns:  # (order is a permutation of the rows: no bounds to check)
        moved = _take_map(col.chunk(0), order, idx) if pa.types.is_map(col.type) and col.num_chunks == 1 else None
        cols.append(pc.take(col, idx, boundscheck=False) if moved is None else moved)
    return pa.Table.from_arrays(cols, schema=table.schema)


def _take_map(arr: pa.MapArray, order: np.ndarray, idx: pa.Array) -> pa.Array | None:
    """A map array's rows in ``order``, by one binary take per buffer: a row's keys, its values and their
    lengths are contiguous byte runs, so one run per row moves them (not one per entry). None where
    this does not apply (nulls anywhere, keys or values not string/binary, a child over 512 M entries):
    the caller takes it the usual way."""
    entries = arr.values
    keys, items = entries.field(0), entries.field(1)
    if arr.null_count or entries.null_count or entries.offset or keys.null_count or items.null_count or not all(
            c.type in (pa.string(), pa.binary()) for c in (keys, items)):
        return None
    offs = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4)
    if int(offs[-1]) >= 1 << 29:  # its lengths as bytes would pass int32 offsets
        return None
    moved = [_strings_by_rows(c, offs, idx) for c in (keys, items)]
    new = np.zeros(len(order) + 1, np.int32)
    np.cumsum(np.diff(offs)[order], out=new[1:])
    return pa.MapArray.from_arrays(pa.array(new), *moved, type=arr.type)


def _strings_by_rows(s: pa.Array, rows: np.ndarray, idx: pa.Array) -> pa.Array:
    """A map's key or value child (no nulls) with the entries of row ``idx[i]`` (entries
    ``rows[idx[i]]:rows[idx[i] + 1]``) moved to row ``i``: its bytes and its lengths, each one run per row."""
    co = np.frombuffer(s.buffers()[1], np.int32, len(s) + 1, s.offset * 4)
    lens = np.frombuffer(_runs(pa.py_buffer(np.diff(co)), rows.astype(np.int64) * 4, idx), np.int32)
    off = np.zeros(len(lens) + 1, np.int32)
    np.cumsum(lens, out=off[1:])
    return pa.Array.from_buffers(s.type, len(lens), [None, pa.py_buffer(off), _runs(s.buffers()[2], co[rows], idx)])


def _runs(buf: pa.Buffer | None, bounds: np.ndarray, idx: pa.Array) -> pa.Buffer:
    """The byte runs ``[bounds[i], bounds[i + 1])`` of ``buf`` in the order ``idx``, one buffer (a binary
    token per run, one Arrow take)."""
    base = int(bounds[0])
    if buf is None or int(bounds[-1]) == base:
        return pa.py_buffer(b"")
    tokens = pa.Array.from_buffers(pa.binary(), len(bounds) - 1,
                                   [None, pa.py_buffer((bounds - base).astype(np.int32)), buf.slice(base)])
    out = pc.take(tokens, idx, boundscheck=False).buffers()[2]
    return pa.py_buffer(b"") if out is None else out


class _Partitions:
    """A segment's rows written into the snapshot's Hive partition directories: each batch grouped by
    partition with one stable sort (dispatch order kept inside a partition) and one take of the other
    columns, a partition's rows buffered up to a row group (or until the batches they keep alive pass
    :data:`KEEP_BYTES`), one file per partition and segment (another
    past :data:`MAX_FILE_ROWS`). pyarrow.dataset's partitioned writer does the same at about twice the
    cost on this data (one segment of a generated store, 172 k rows, one process: its write 0.38 s,
    this one 0.29 s, the decode before either 0.33 s); the directory names are its own
    (``Partitioning.format``)."""

    def __init__(self, staging: Location, partition_by: tuple[str, ...], schema: pa.Schema, stem: str) -> None:
        self.staging, self.by, self.stem = staging, tuple(partition_by), stem
        self.part = partitioning(self.by)
        self.schema = pa.schema([f for f in schema if f.name not in self.by])  # partition values: in the path
        names = set(self.schema.names)
        self.options = {"compression": "zstd", "use_dictionary": [c for c in DICTIONARY_COLUMNS if c in names],
                        "write_statistics": [c for c in STATS_COLUMNS if c in names]}
        self.pending: dict[str, list[pa.Table]] = {}
        self.rows: dict[str, int] = {}
        self.born: dict[str, int] = {}  # the batch of a partition's oldest waiting rows
        self.batches: list[int] = []  # the bytes of each batch taken so far
        self.open: dict[str, tuple[pq.ParquetWriter, str, int]] = {}  # dir -> (writer, path, rows in it)
        self.done: list[dict[str, Any]] = []
        self.files = 0

    def add(self, batch: pa.RecordBatch, keys: dict[str, pa.DictionaryArray] | None = None) -> None:
        """A batch's rows into their partitions; ``keys``: partition columns already dictionary-encoded
        (those the batch need not hold), the others are encoded here."""
        data = pa.Table.from_batches([batch]).select(self.schema.names)
        if not self.by:
            self.batches.append(data.nbytes)
            self._push("", data)
            return
        keys = keys or {}
        codes = [keys[c] if c in keys else pc.dictionary_encode(batch.column(c)) for c in self.by]
        key = np.zeros(batch.num_rows, np.int64)
        for enc in codes:
            key = key * len(enc.dictionary) + np.asarray(enc.indices, dtype=np.int64)
        order = group_order(key)  # dispatch order kept inside a partition
        sk = key[order]
        cuts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1], True])
        data = take_rows(data, order)
        self.batches.append(data.nbytes)
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            r = int(order[a])
            expr = None
            for c, enc in zip(self.by, codes):
                e = pc.field(c) == enc.dictionary[enc.indices[r].as_py()].as_py()
                expr = e if expr is None else expr & e
            self._push(self.part.format(expr)[0], data.slice(a, b - a))
        self._let_go()

    def _let_go(self) -> None:
        """Flush the partitions holding the oldest batches while the batches from the oldest one waited on
        to the newest pass :data:`KEEP_BYTES` (a bound on what the slices keep alive, copying nothing)."""
        while self.born:
            d = min(self.born, key=self.born.__getitem__)
            if sum(self.batches[self.born[d]:]) <= KEEP_BYTES:
                return
            self._flush(d)

    def _push(self, d: str, t: pa.Table) -> None:
        self.pending.setdefault(d, []).append(t)
        self.born.setdefault(d, len(self.batches) - 1)
        self.rows[d] = self.rows.get(d, 0) + t.num_rows
        if self.rows[d] >= ROW_GROUP:
            self._flush(d)
        elif sum(self.rows.values()) > PENDING_ROWS:  # many small partitions: the biggest goes out
            self._flush(max(self.rows, key=self.rows.__getitem__))

    def _flush(self, d: str) -> None:
        t = pa.concat_tables(self.pending.pop(d))
        del self.rows[d]
        self.born.pop(d, None)
        while t.num_rows:
            w = self.open.get(d)
            if w is not None and w[2] >= MAX_FILE_ROWS:
                self._close(d)
                w = None
            if w is None:
                folder = self.staging.join(*d.split("/")) if d else self.staging
                self.staging.fs.create_dir(folder.path, recursive=True)
                path = folder.join(f"{self.stem}-{self.files}.parquet").path
                self.files += 1
                w = (pq.ParquetWriter(path, self.schema, filesystem=self.staging.fs, **self.options), path, 0)
            part = t.slice(0, MAX_FILE_ROWS - w[2])
            w[0].write_table(part, row_group_size=ROW_GROUP)
            self.open[d] = (w[0], w[1], w[2] + part.num_rows)
            t = t.slice(part.num_rows)

    def _close(self, d: str) -> None:
        w, path, n = self.open.pop(d)
        w.close()
        self.done.append({"path": path, "rows": n})

    def close(self) -> list[dict[str, Any]]:
        """Everything written out; the files (path, rows) in the order they were started."""
        try:
            for d in list(self.pending):
                self._flush(d)
        finally:
            for d in list(self.open):
                self._close(d)
        return self.done


def _topic_keys(batch: pa.RecordBatch, skipped: dict[str, int]) -> tuple[pa.RecordBatch, pa.DictionaryArray]:
    """The batch without rows whose topic cannot be a partition directory (counted in ``skipped`` by
    escaped name), and its topic column dictionary-encoded (one hash pass serves both)."""
    enc = pc.dictionary_encode(batch.column("topic"), null_encoding="encode")
    bad = [i for i, t in enumerate(enc.dictionary.to_pylist()) if partition_problem(t) is not None]
    if not bad:
        return batch, enc
    codes = np.asarray(enc.indices)
    for i in bad:
        t = escape_topic(enc.dictionary[i].as_py())
        skipped[t] = skipped.get(t, 0) + int(np.count_nonzero(codes == i))
    keep = pa.array(~np.isin(codes, bad))
    return batch.filter(keep), enc.filter(keep)


def utc_days(store_time: pa.Array) -> pa.DictionaryArray:
    """The UTC day (``YYYY-MM-DD``) of each store time, dictionary-encoded: the cast to days on the naive
    timestamp (the same UTC instants; the zoned cast looks the zone up row by row, 4x the cost) and the
    text of each distinct day only."""
    days = pc.dictionary_encode(pc.cast(store_time.cast(pa.timestamp(store_time.type.unit)), pa.date32()))
    return pa.DictionaryArray.from_arrays(days.indices, days.dictionary.cast(pa.string()))


def export_segment(ctx: TaskCtx, item: tuple[int, str, int, str, int, int, bool, int | None]) -> dict[str, Any]:
    """One segment from ``start`` (up to ``stop`` when given): the walk's scan of it, written as Parquet
    files under the staging directory. Returns the scan end, rows, files and skipped rows."""
    idx, name, base, uri, file_size, start, crc, stop = item  # stop: the run's cut in this file (a live store)
    t0 = time.monotonic()
    keep_freed_memory()
    loc = resolve(uri, **ctx.fs_options)
    if ctx.live:
        loc = replace(loc, mapped=False)
        if loc.local and not os.path.exists(loc.path):  # the broker's cleaner took it after the listing
            return {"idx": idx, "name": name, "start": start, "end": None, "rows": 0, "files": [],
                    "skipped_topics": {}, "seconds": time.monotonic() - t0, "expired": True}
    pacer = ReadPacer(ctx.read_rate, ctx.read_share)
    # a cold segment of a live store (wholly before the cut): give the page cache back what this task reads
    care = PageCare(loc.path if ctx.live and loc.local and stop == file_size else None)
    schema = file_schema(ctx.with_body, ctx.plan.inputs.dledger)
    scan_schema = pa.schema([f for f in schema if f.name != "date"])
    task = SegmentTask(idx, base, name, start, crc)
    ends: list[SegmentEnd] = []
    skipped: dict[str, int] = {}
    rows = 0

    def batches():
        nonlocal rows
        with open_source(loc, file_size) as src:
            kw = {"end": stop} if stop is not None else {}
            for b in iter_task(ctx.plan, task, src, delay_levels_ms=ctx.delay_levels, ends=ends,
                               with_body=ctx.with_body, verify_all=True, **kw):
                if not b.num_rows:
                    continue
                pacer.took(int(pc.sum(b.column("size")).as_py() or 0))
                out = message_batch(b, scan_schema, name)
                keys = {}
                if "topic" in ctx.partition_by:
                    out, keys["topic"] = _topic_keys(out, skipped)
                    if not out.num_rows:
                        continue
                day = utc_days(out.column("store_time"))
                if "date" in ctx.partition_by:  # in the path only: the partitions take the codes
                    keys["date"] = day
                else:
                    out = pa.RecordBatch.from_arrays([*out.columns, day.dictionary_decode()], schema=schema)
                rows += out.num_rows
                yield out, keys

    staging = resolve(ctx.staging, **ctx.fs_options)
    out = _Partitions(staging, ctx.partition_by, schema, f"part-{name}-{start:012d}-{ctx.run}")
    try:
        for b, keys in batches():
            out.add(b, keys)
    finally:
        written = out.close()
        care.done(start, file_size)
    prefix = staging.path.rstrip("/") + "/"
    files = []
    for w in written:
        info = staging.fs.get_file_info(w["path"])
        files.append({"path": w["path"][len(prefix):], "rows": w["rows"], "bytes": info.size,
                      "sha256": sha256_of(Location(staging.fs, w["path"], staging.local))[0]})
    end = at_cut(ends[0], stop) if ends else None
    return {"idx": idx, "name": name, "start": start, "end": None if end is None else end.to_dict(), "rows": rows,
            "files": files, "skipped_topics": skipped, "seconds": time.monotonic() - t0}


__all__ = ["DICTIONARY_COLUMNS", "ROW_GROUP", "STATS_COLUMNS", "TaskCtx", "export_segment", "partition_problem",
           "take_rows"]
