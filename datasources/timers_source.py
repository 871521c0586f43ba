"""``rocketmq.timers``: the timer messages of a 5.x store (pending and delivered, where the timer store
holds them) as a DataFrame, and :func:`read_timers` for pyarrow. Same rows as ``rmqstore timers``
(storelib.broker.timer.timermsg), plus ``deliver_time`` (UTC timestamp beside the epoch ms). One partition: the
timer store is small beside the commitlog, and its rows come from one pass over the commitlog."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from storelib.broker.timer.timermsg import TIMER_SCHEMA, store_timers
from storelib.scan.messagecols import TIME_TYPE, time_column

from .index_source import _store_only
from .options import StoreOpen, spark_ddl

SCHEMA = TIMER_SCHEMA.append(pa.field("deliver_time", TIME_TYPE))


def timers_table(store: StoreOpen) -> pa.Table:
    t = store_timers(store.at_cut())
    return t.append_column(SCHEMA.field("deliver_time"), time_column(t.column("deliver_time_ms")))


def read_timers(store: str, **options: Any) -> pa.Table:
    """The ``rocketmq.timers`` rows without Spark."""
    return timers_table(_store_only({**options, "path": store}, "rocketmq.timers"))


class _TimersReader(DataSourceReader):
    def __init__(self, store: StoreOpen):
        self.store = store

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from timers_table(self.store).to_batches()


class TimersDataSource(DataSource):
    """``spark.read.format("rocketmq.timers").load(STORE)``: one row per timer message."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq.timers"

    def schema(self) -> str:
        return spark_ddl(SCHEMA)

    def reader(self, schema: Any) -> DataSourceReader:
        return _TimersReader(_store_only(self.options, "rocketmq.timers"))


__all__ = ["SCHEMA", "TimersDataSource", "read_timers", "timers_table"]
