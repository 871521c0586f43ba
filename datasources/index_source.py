"""``rocketmq.index`` (IndexFile entries), ``rocketmq.checkpoint`` and ``rocketmq.segments`` sources.

* ``rocketmq.index``: one row per used entry (1 .. indexCount-1) of every ``index/`` file, with the
  slot the key hash maps to and the entry's approximate store time (header beginTimestamp +
  timeDiff seconds, store-format §5.9). One partition per index file. The geometry
  (``maxHashSlotNum``/``maxIndexNum``) comes from ``brokerConf``; it is not stored in the files.
* ``rocketmq.checkpoint``: the five checkpoint fields and the recovery minimum timestamp, one row.
* ``rocketmq.segments``: the commitlog segment files (name, base offset, size, first STORETIMESTAMP).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from storelib.errors import StoreError
from storelib.format.checkpoint import Checkpoint, read_checkpoint
from storelib.format.indexdir import IndexFileRef
from storelib.scan.splits import first_store_timestamp

from .options import StoreOpen, norm_options, spark_ddl

INDEX_SCHEMA = pa.schema([
    pa.field("file", pa.string()), pa.field("slot", pa.int32()), pa.field("entry", pa.int32()),
    pa.field("key_hash", pa.int32()), pa.field("phy_offset", pa.int64()), pa.field("time_diff", pa.int32()),
    pa.field("store_timestamp", pa.int64()), pa.field("prev_index", pa.int32()),
])
CHECKPOINT_SCHEMA = pa.schema([
    pa.field("physic_msg_timestamp", pa.int64()), pa.field("logics_msg_timestamp", pa.int64()),
    pa.field("index_msg_timestamp", pa.int64()), pa.field("master_flushed_offset", pa.int64()),
    pa.field("confirm_phy_offset", pa.int64()), pa.field("min_timestamp", pa.int64()),
])
SEGMENTS_SCHEMA = pa.schema([
    pa.field("segment", pa.string()), pa.field("base", pa.int64()), pa.field("file_size", pa.int64()),
    pa.field("first_store_timestamp", pa.int64()),
])
INDEX_BATCH_ENTRIES = 1 << 20


def _store_only(options: Mapping[str, Any], source: str) -> StoreOpen:
    unknown = sorted(k for k in norm_options(options) if not StoreOpen.is_option(k))
    if unknown:
        raise ValueError(f"unknown {source} option(s): {', '.join(unknown)}")
    return StoreOpen.parse(options)


def read_index_file(store: StoreOpen, ref: IndexFileRef) -> Iterator[pa.RecordBatch]:
    """The used entries of one index file as batches of :data:`INDEX_SCHEMA`."""
    geo = store.settings().index_geometry
    try:
        f = ref.open(geo, strict=False, broker_size=True)
    except StoreError as e:
        hint = "" if store.broker_conf else " (pass the brokerConf option: maxHashSlotNum/maxIndexNum)"
        raise StoreError(f"index/{ref.name}", e.offset, e.kind, e.detail + hint) from None
    with f:
        begin = f.header.begin_timestamp
        last = f.index_count
        for lo in range(1, last, INDEX_BATCH_ENTRIES):
            hi = min(last, lo + INDEX_BATCH_ENTRIES)
            e = f.entries(lo, hi)
            n = len(e)
            kh = e["key_hash"].astype(np.int64)
            td = e["time_diff"].astype(np.int64)
            yield pa.RecordBatch.from_arrays([
                pa.repeat(pa.scalar(ref.name), n),
                pa.array(np.mod(kh, geo.hash_slot_num).astype(np.int32)),
                pa.array(np.arange(lo, hi, dtype=np.int32)),
                pa.array(kh.astype(np.int32)),
                pa.array(e["phy_offset"].astype(np.int64)),
                pa.array(td.astype(np.int32)),
                pa.array(begin + td * 1000),
                pa.array(e["prev_index"].astype(np.int32)),
            ], schema=INDEX_SCHEMA)


def _index_refs(store: StoreOpen) -> list[IndexFileRef]:
    """The index files of the query's own cut (on a live store: each read as its header stood then)."""
    store.settings()  # checks the store root (and loads the settings the reads use) before planning
    return store.at_cut().index_files()


def read_index(store: str, *, as_pandas: bool = False, **options: Any) -> pa.Table | Any:
    """The ``rocketmq.index`` rows without Spark."""
    so = _store_only({**options, "path": store}, "rocketmq.index")
    t = pa.Table.from_batches([b for r in _index_refs(so) for b in read_index_file(so, r)], schema=INDEX_SCHEMA)
    return t.to_pandas() if as_pandas else t


def checkpoint_batch(store: StoreOpen) -> pa.RecordBatch:
    st = store.at_cut()
    raw = st.checkpoint_bytes() if st.live else None
    cp = Checkpoint.from_bytes(raw[:40]) if raw is not None and len(raw) >= 40 else read_checkpoint(
        store.location(), strict=False)
    vals = [cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp, cp.master_flushed_offset,
            cp.confirm_phy_offset, cp.min_timestamp()]
    return pa.RecordBatch.from_arrays([pa.array([v], pa.int64()) for v in vals], schema=CHECKPOINT_SCHEMA)


def segments_batch(store: StoreOpen) -> pa.RecordBatch:
    cl = store.at_cut().commitlog
    names, bases, sizes, firsts = [], [], [], []
    for seg in cl.segments:
        ts = None
        if seg.file_size:
            with seg.open() as src:
                ts = first_store_timestamp(src, seg.base, 48 if seg.dledger else 0)
        names.append(seg.name)
        bases.append(seg.base)
        sizes.append(seg.file_size)
        firsts.append(ts)
    return pa.RecordBatch.from_arrays([pa.array(names, pa.string()), pa.array(bases, pa.int64()),
                                       pa.array(sizes, pa.int64()), pa.array(firsts, pa.int64())],
                                      schema=SEGMENTS_SCHEMA)


def read_checkpoint_table(store: str, **options: Any) -> pa.Table:
    return pa.Table.from_batches([checkpoint_batch(_store_only({**options, "path": store}, "rocketmq.checkpoint"))])


def read_segments(store: str, **options: Any) -> pa.Table:
    return pa.Table.from_batches([segments_batch(_store_only({**options, "path": store}, "rocketmq.segments"))])


# ------------------------------------------------------------------------------------------------
# Spark


class IndexFilePartition(InputPartition):
    def __init__(self, ref: IndexFileRef | None):
        super().__init__(ref.name if ref else None)
        self.ref = ref


class IndexReader(DataSourceReader):
    def __init__(self, store: StoreOpen):
        self.store = store

    def partitions(self) -> list[InputPartition]:
        return [IndexFilePartition(r) for r in _index_refs(self.store)] or [IndexFilePartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        ref = getattr(partition, "ref", None)
        return read_index_file(self.store, ref) if ref is not None else iter(())


class IndexDataSource(DataSource):
    """``spark.read.format("rocketmq.index").load(STORE)``."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq.index"

    def schema(self) -> str:
        return spark_ddl(INDEX_SCHEMA)

    def reader(self, schema: Any) -> DataSourceReader:
        return IndexReader(_store_only(self.options, "rocketmq.index"))


class _OneBatchReader(DataSourceReader):
    def __init__(self, store: StoreOpen, kind: str):
        self.store = store
        self.kind = kind

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield checkpoint_batch(self.store) if self.kind == "checkpoint" else segments_batch(self.store)


class CheckpointDataSource(DataSource):
    """``spark.read.format("rocketmq.checkpoint").load(STORE)``: one row."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq.checkpoint"

    def schema(self) -> str:
        return spark_ddl(CHECKPOINT_SCHEMA)

    def reader(self, schema: Any) -> DataSourceReader:
        return _OneBatchReader(_store_only(self.options, "rocketmq.checkpoint"), "checkpoint")


class SegmentsDataSource(DataSource):
    """``spark.read.format("rocketmq.segments").load(STORE)``: one row per commitlog segment file."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq.segments"

    def schema(self) -> str:
        return spark_ddl(SEGMENTS_SCHEMA)

    def reader(self, schema: Any) -> DataSourceReader:
        return _OneBatchReader(_store_only(self.options, "rocketmq.segments"), "segments")
