"""The audit's task tables: the compact record and key tables each segment task leaves for the cross-file
checks, where they go (:class:`TableSink`: Arrow IPC files in a work directory every process reaches, or
kept in this process), and how a part's records are laid out by queue group so that each queue-group
task of the cross-file phase reads only its own slice of every part (:func:`group_sort`, :class:`PartRef`).

A queue belongs to one of ``groups`` groups by a hash of its topic and queue id that every process
computes alike (:func:`group_of`; CRC-32, not Python's salted ``hash``); the timer topic's queues all
share one group, the one the timer store's task reads."""

from __future__ import annotations

import os
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.errors import StoreError
from storelib.fileio.bytesource import read_ipc_file, resolve
from storelib.fileio.publish import atomic_local_file
from storelib.format.timerstore import TIMER_TOPIC

# compact record columns shipped from the segment tasks to the cross-file tasks
RECORD_COLUMNS = ["phy_offset", "size", "physical_offset_field", "topic", "queue_id", "queue_offset",
                  "tran_type", "sys_flag", "tags_code", "store_timestamp", "crc_ok"]
RECORD_SCHEMA = pa.schema([
    ("phy_offset", pa.int64()), ("size", pa.int32()), ("physical_offset_field", pa.int64()),
    ("topic", pa.dictionary(pa.int32(), pa.string())),  # codes and names (storelib.scan.arrowcols.with_topic_codes)
    ("queue_id", pa.int32()), ("queue_offset", pa.int64()), ("tran_type", pa.int8()),
    ("sys_flag", pa.int32()), ("tags_code", pa.int64()), ("store_timestamp", pa.int64()), ("crc_ok", pa.bool_()),
])
KEY_SCHEMA = pa.schema([("pos", pa.int64()), ("phy", pa.int64()), ("key_hash", pa.int32())])


def to_ipc(table: pa.Table, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes, schema: pa.Schema) -> pa.Table:
    if not data:
        return schema.empty_table()
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


@dataclass(frozen=True)
class TableSink:
    """A work directory (local path or URI every executor and the driver can reach) where tasks leave
    their tables as Arrow IPC files, so a task returns only its small result through the scheduler (a
    ~150 MB collect of pickled bytes through Spark's JVM costs seconds; a memory-mapped file nothing).
    File names are unique per task attempt (a retried task never collides with the files of an earlier
    attempt, which nothing reads and which go with the directory)."""

    dir: str
    fs_options: dict[str, Any] = field(default_factory=dict)

    def write(self, stem: str, table: pa.Table) -> str | None:
        """Write ``table`` as an IPC file; returns its path/URI (None for an empty table: nothing written)."""
        if table.num_rows == 0:
            return None
        table = table.unify_dictionaries()  # an IPC file holds one dictionary per column (topic codes)
        name = f"{stem}-{uuid.uuid4().hex}.arrow"
        loc = resolve(self.dir, **self.fs_options)
        if loc.local:  # temp + rename: the file appears under its name only when complete (scratch: no fsync)
            path = os.path.join(loc.path, name)
            # no makedirs: a task still running after the driver removed the sink (a cancelled stage)
            # fails here instead of bringing the directory back
            with atomic_local_file(path, durable=False, create_dir=False) as tmp, pa.OSFile(tmp, "wb") as f, \
                    pa.ipc.new_file(f, table.schema) as w:
                w.write_table(table)
            return path
        # object stores: one output stream = one PUT, the object appears only when complete
        with loc.fs.open_output_stream(loc.join(name).path) as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
        return self.dir.rstrip("/") + "/" + name


def read_table_file(path: str | None, schema: pa.Schema, fs_options: dict[str, Any] | None = None) -> pa.Table:
    """A table written by :meth:`TableSink.write`: memory-mapped (zero-copy) when local, read whole otherwise."""
    if path is None:
        return schema.empty_table()
    try:
        return read_ipc_file(resolve(path, **(fs_options or {})))
    except (OSError, pa.ArrowInvalid) as e:
        raise StoreError(path, None, "work_file_unreadable", f"cannot read a task's table file: {e}") from e


# --------------------------------------------------------------------------------------------------
# queue groups
# --------------------------------------------------------------------------------------------------

_GOLDEN = 2654435761  # Knuth's multiplicative constant: spreads consecutive queue ids over the groups


def _topic_crc(topic: str) -> int:
    try:
        raw = topic.encode("utf-8", "surrogateescape")  # a directory name read from a non-UTF-8 disk
    except UnicodeEncodeError:
        raw = topic.encode("utf-8", "surrogatepass")
    return zlib.crc32(raw)


def group_of(topic: str, qid: int, groups: int) -> int:
    """The queue group of ``topic``/``qid`` (every process computes the same one)."""
    q = 0 if topic == TIMER_TOPIC else qid & 0xFFFFFFFF
    return ((_topic_crc(topic) + q * _GOLDEN) & 0xFFFFFFFF) % max(groups, 1)


def row_groups(topic: pa.ChunkedArray | pa.Array, qid: np.ndarray, groups: int) -> np.ndarray:
    """:func:`group_of` of every row (topics hashed once each), as int64."""
    if groups <= 1 or not len(qid):
        return np.zeros(len(qid), np.int64)
    enc = pc.dictionary_encode(topic)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    names = enc.dictionary.to_pylist()
    crc = np.array([_topic_crc(t) for t in names], np.uint64)
    idx = np.asarray(enc.indices, dtype=np.int64)
    q = qid.astype(np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    if TIMER_TOPIC in names:
        q[idx == names.index(TIMER_TOPIC)] = 0
    with np.errstate(over="ignore"):
        h = (crc[idx] + q * np.uint64(_GOLDEN)) & np.uint64(0xFFFFFFFF)
    return (h % np.uint64(groups)).astype(np.int64)


def group_sort(recs: pa.Table, groups: int) -> tuple[pa.Table, tuple[int, ...]]:
    """``recs`` (commitlog order) laid out group after group, each group's rows in commitlog order, and
    the group boundaries (``groups + 1`` offsets)."""
    if groups <= 1 or recs.num_rows == 0:
        return recs, (0, *([recs.num_rows] * max(groups, 1)))
    g = row_groups(recs.column("topic"), recs.column("queue_id").to_numpy(), groups)
    counts = np.bincount(g, minlength=groups)
    offsets = (0, *np.cumsum(counts).tolist())
    if int(np.count_nonzero(counts)) <= 1:
        return recs, offsets
    order = np.argsort(g.astype(np.uint16) if groups <= 1 << 16 else g, kind="stable")
    return recs.take(order), offsets


# --------------------------------------------------------------------------------------------------
# what the cross-file tasks read of a part
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableRef:
    """One task table: a file in the work directory (read by whichever process needs it) or a table kept
    in this process (the in-process engine, which ships nothing)."""

    path: str | None = None
    table: pa.Table | None = field(default=None, compare=False, repr=False)

    def read(self, schema: pa.Schema, fs_options: dict[str, Any] | None = None) -> pa.Table:
        if self.table is not None:
            return self.table
        return read_table_file(self.path, schema, fs_options)


@dataclass(frozen=True)
class PartRef:
    """One segment task's tables as the cross-file tasks find them (plain values: picklable)."""

    segment: str
    base: int
    start: int  # file offset the part started at
    phy_lo: int  # position of its first record (its start when it has none)
    phy_hi: int  # end of its last record (its start when it has none)
    records: TableRef  # group after group (:func:`group_sort`)
    keys: TableRef  # commitlog order
    offsets: tuple[int, ...]  # group boundaries in ``records``
    n_keys: int = 0
    n_misplaced: int = 0  # records whose PHYSICALOFFSET field is not their position

    def group_rows(self, g: int) -> tuple[int, int]:
        """Rows ``[lo, hi)`` of queue group ``g`` (none for a part without records)."""
        if g + 1 >= len(self.offsets):
            return 0, 0
        return self.offsets[g], self.offsets[g + 1]

    def group_table(self, g: int, fs_options: dict[str, Any] | None = None) -> pa.Table:
        """This part's records of queue group ``g`` (commitlog order)."""
        lo, hi = self.group_rows(g)
        if hi <= lo:
            return RECORD_SCHEMA.empty_table()
        return self.records.read(RECORD_SCHEMA, fs_options).slice(lo, hi - lo)

    def all_records(self, fs_options: dict[str, Any] | None = None) -> pa.Table:
        """Every record of the part, in commitlog order."""
        t = self.records.read(RECORD_SCHEMA, fs_options)
        return in_commitlog_order(t)

    def key_table(self, fs_options: dict[str, Any] | None = None) -> pa.Table:
        return self.keys.read(KEY_SCHEMA, fs_options)


def in_commitlog_order(t: pa.Table) -> pa.Table:
    """A record table back in commitlog order (a group-sorted one; one already in order as it is)."""
    if t.num_rows < 2:
        return t
    phy = t.column("phy_offset").to_numpy()
    if bool(np.all(phy[1:] > phy[:-1])):
        return t
    return t.take(np.argsort(phy, kind="stable"))
