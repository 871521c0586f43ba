"""``spark.read.format("rocketmq.consumequeue")``: every ConsumeQueue unit of a store, one row each.

Rows are the units of each ``consumequeue/<topic>/<queueId>`` from its first file up to the queue's
end as the broker's recovery sees it (``LoadedQueue.max_offset``), fillers included (phy_offset 0,
size 2147483647). Options: ``brokerConf`` (CQ file size), ``topics`` (comma-separated, prunes queue
directories), ``maxSplitBytes`` (CQ bytes per partition), ``fs.*`` filesystem options.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from storelib.broker.settings.cqload import LoadedQueue
from storelib.format.consumequeue import CQ_UNIT_SIZE, ConsumeQueue, list_queues

from .options import StoreOpen, norm_options, parse_bytes, spark_ddl

CQ_SCHEMA = pa.schema([
    pa.field("topic", pa.string()), pa.field("queue_id", pa.int32()), pa.field("queue_offset", pa.int64()),
    pa.field("phy_offset", pa.int64()), pa.field("size", pa.int32()), pa.field("tags_code", pa.int64()),
    pa.field("file", pa.string()),
])
DEFAULT_CQ_PARTITION_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class CQReadOptions:
    store: StoreOpen
    topics: tuple[str, ...] | None = None
    max_split_bytes: int = DEFAULT_CQ_PARTITION_BYTES

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> CQReadOptions:
        o = norm_options(options)
        unknown = sorted(k for k in o if k not in {"topics", "maxsplitbytes"} and not StoreOpen.is_option(k))
        if unknown:
            raise ValueError(f"unknown rocketmq.consumequeue option(s): {', '.join(unknown)}")
        topics = o.get("topics")
        if topics is not None and not isinstance(topics, (list, tuple)):
            topics = [t.strip() for t in str(topics).split(",") if t.strip()]
        return cls(StoreOpen.parse(options), tuple(topics) if topics is not None else None,
                   parse_bytes("maxSplitBytes", o.get("maxsplitbytes", DEFAULT_CQ_PARTITION_BYTES)))


def plan_queues(opts: CQReadOptions) -> list[list[tuple[str, int]]]:
    """Queues grouped into partitions of about ``max_split_bytes`` of CQ files each (queue order kept). On a
    store a broker is writing each group ends with the query's cut: ``("", limit)`` (units pointing at or
    past it are not read: dispatched after the cut)."""
    store = opts.store.at_cut()
    root = opts.store.location()
    seg = opts.store.settings().mapped_file_size_consume_queue
    groups: list[list[tuple[str, int]]] = []
    cur: list[tuple[str, int]] = []
    size = 0
    for topic, qid, loc in list_queues(root):
        if opts.topics is not None and topic not in opts.topics:
            continue
        cq = ConsumeQueue(loc, segment_size=seg, topic=topic, queue_id=qid)
        qbytes = sum(min(s.size, cq.segment_size) for s in cq.segments)
        cq.close()
        if cur and size + qbytes > opts.max_split_bytes:
            groups.append(cur)
            cur, size = [], 0
        cur.append((topic, qid))
        size += qbytes
    if cur:
        groups.append(cur)
    if store.live:
        groups = [[*g, ("", store.cq_limit)] for g in groups]
    return groups


def read_queues(opts: CQReadOptions, queues: list[tuple[str, int]]) -> Iterator[pa.RecordBatch]:
    """The units of the given queues as batches of :data:`CQ_SCHEMA` (a trailing ``("", limit)``: the cut)."""
    root = opts.store.location()
    limit = None
    if queues and queues[-1][0] == "":  # no queue has an empty topic name: the plan's cut marker
        limit, queues = queues[-1][1], queues[:-1]
        root = replace(root, mapped=False)
    seg_size = opts.store.settings().mapped_file_size_consume_queue
    for topic, qid in queues:
        cq = LoadedQueue(root.join("consumequeue", topic, str(qid)), segment_size=seg_size, topic=topic,
                         queue_id=qid, phy_limit=limit)
        try:
            for first, units in cq.entries():  # from the first file (a negative name: negative offsets)
                n = len(units)
                if not n:
                    continue
                seg = cq.segment_for(first * CQ_UNIT_SIZE)
                name = f"consumequeue/{topic}/{qid}/{seg.name if seg else '?'}"
                yield pa.RecordBatch.from_arrays([
                    pa.repeat(pa.scalar(topic), n),
                    pa.array(np.full(n, qid, np.int32)),
                    pa.array(np.arange(first, first + n, dtype=np.int64)),
                    pa.array(units["phy_offset"].astype(np.int64)),
                    pa.array(units["size"].astype(np.int32)),
                    pa.array(units["tags_code"].astype(np.int64)),
                    pa.repeat(pa.scalar(name), n),
                ], schema=CQ_SCHEMA)
        finally:
            cq.close()


def read_consumequeue(store: str, *, as_pandas: bool = False, **options: Any) -> pa.Table | Any:
    """The ``rocketmq.consumequeue`` rows without Spark."""
    opts = CQReadOptions.parse({**options, "path": store})
    batches = [b for g in plan_queues(opts) for b in read_queues(opts, g)]
    t = pa.Table.from_batches(batches, schema=CQ_SCHEMA)
    return t.to_pandas() if as_pandas else t


class QueuesPartition(InputPartition):
    def __init__(self, queues: list[tuple[str, int]]):
        super().__init__(queues)
        self.queues = queues


class ConsumeQueueReader(DataSourceReader):
    def __init__(self, opts: CQReadOptions):
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        return [QueuesPartition(g) for g in plan_queues(self.opts)] or [QueuesPartition([])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_queues(self.opts, getattr(partition, "queues", []))


class ConsumeQueueDataSource(DataSource):
    """``spark.read.format("rocketmq.consumequeue").load(STORE)``."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq.consumequeue"

    def schema(self) -> str:
        return spark_ddl(CQ_SCHEMA)

    def reader(self, schema: Any) -> DataSourceReader:
        return ConsumeQueueReader(CQReadOptions.parse(self.options))
