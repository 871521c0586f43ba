"""``spark.read.format("rocketmq")``: the commitlog as a DataFrame, one row per message record.

The rows are exactly what :class:`storelib.scan.scanner.SegmentScan` decodes (the columns and names of
``rmqstore messages``, ``body`` as binary only with ``withBody``), plus ``segment`` (the segment file
name) and ``_corrupt``. Work is planned by :func:`storelib.scan.splits.plan_splits` (at least one unit per
segment, big segments cut at verified record starts) and each unit is read into Arrow record batches
by :mod:`datasources.commitlog_reader`, which works without Spark (:func:`read_messages`: the same rows
as a pyarrow Table or pandas DataFrame for notebooks and tools).

Modes, as Spark's own file sources: ``PERMISSIVE`` (default) turns a record that fails the broker's
validation into a row with null message columns, ``phy_offset`` = where it starts and ``_corrupt`` =
the reason, then goes on at the next verified record start in the unit (or the next unit/segment);
``DROPMALFORMED`` does the same without the row; ``FAILFAST`` raises a ``CorruptRecordError`` naming
the segment file and byte offset. A body CRC mismatch is not malformed: the row has ``crc_ok = false``.
A zero-filled region or a blank record ends a segment's data, as for the broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from storelib.scan.commitlog import Split

from .commitlog_reader import (
    PUSHABLE,
    MessageReadOptions,
    Pred,
    output_schema,
    plan,
    read_split,
    with_user_schema,
)
from .options import spark_ddl


class SplitPartition(InputPartition):
    """One scan unit with everything needed to read it: the split, the options, the pushed predicates.

    ``read`` uses only the partition value: Spark 4.3 may hand a query the read function of another
    query over the same DataFrame (observed: a plain ``df.count()`` after ``df.filter(...)`` reused
    the filtered reader), while partition values are planned per query.
    """

    def __init__(self, split: Split | None, opts: MessageReadOptions, pushed: list[Pred]):
        super().__init__(split)
        self.split = split
        self.opts = opts
        self.pushed = list(pushed)


def filter_to_pred(f: Any) -> Pred | None:
    """A pushed Spark filter as a :class:`Pred`, or None when this source does not evaluate it."""
    ops = {EqualTo: "=", GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<", LessThanOrEqual: "<="}
    attr = getattr(f, "attribute", ())
    if len(attr) != 1 or attr[0] not in PUSHABLE:
        return None
    if type(f) in ops:
        v = f.value
        if v is None or isinstance(v, (list, tuple, dict, bytes, float)):
            return None
        return Pred(attr[0], ops[type(f)], v)
    if isinstance(f, In):
        vals = tuple(f.value)
        if not vals or any(v is None or isinstance(v, (list, tuple, dict, bytes, float)) for v in vals):
            return None
        return Pred(attr[0], "in", vals)
    return None


class RocketMQReader(DataSourceReader):
    """Plans units once on the driver side; each Spark task reads one unit into Arrow batches."""

    def __init__(self, opts: MessageReadOptions):
        self.opts = opts
        self.pushed: list[Pred] = []

    def partitions(self) -> list[InputPartition]:
        splits = plan(self.opts, self.pushed)
        return [SplitPartition(s, self.opts, self.pushed) for s in splits] or [
            SplitPartition(None, self.opts, self.pushed)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        split = getattr(partition, "split", None)
        if split is None:
            return iter(())
        return read_split(partition.opts, split, partition.pushed)


class RocketMQPushdownReader(RocketMQReader):
    """The reader with filter pushdown (needs ``spark.sql.python.filterPushdown.enabled``)."""

    def pushFilters(self, filters: list) -> list:  # noqa: N802 (Spark's name)
        rest = []
        for f in filters:
            p = filter_to_pred(f)
            if p is None:
                rest.append(f)
            else:
                self.pushed.append(p)
        return rest


class RocketMQDataSource(DataSource):
    """``spark.read.format("rocketmq").load(STORE)``: commitlog messages (options: module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> str:
        opts = MessageReadOptions.parse(self.options)
        return spark_ddl(output_schema(opts.with_body, opts.dledger))

    def reader(self, schema: Any) -> DataSourceReader:
        return RocketMQReader(with_user_schema(MessageReadOptions.parse(self.options), schema))


class RocketMQPushdownDataSource(RocketMQDataSource):
    """The same source, pushing offset/time/topic/segment filters into planning and reading."""

    def reader(self, schema: Any) -> DataSourceReader:
        return RocketMQPushdownReader(with_user_schema(MessageReadOptions.parse(self.options), schema))


__all__ = ["RocketMQDataSource", "RocketMQPushdownDataSource", "pushdown_is_isolated"]


# ------------------------------------------------------------------------------------------------
# pushdown probe: is filter pushdown safe on this Spark?


class _ProbeReader(DataSourceReader):
    def __init__(self) -> None:
        self.below: int | None = None

    def pushFilters(self, filters: list) -> list:  # noqa: N802 (Spark's name)
        rest = []
        for f in filters:
            if isinstance(f, LessThan) and f.attribute == ("v",):
                self.below = int(f.value)
            else:
                rest.append(f)
        return rest

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        vals = [v for v in range(3) if self.below is None or v < self.below]
        yield pa.RecordBatch.from_pydict({"v": pa.array(vals, pa.int64())})


class PushdownProbeSource(DataSource):
    """Three rows; pushes ``v < n``. Used once by ``register`` to test pushdown isolation."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq_pushdown_probe"

    def schema(self) -> str:
        return "v BIGINT"

    def reader(self, schema: Any) -> DataSourceReader:
        return _ProbeReader()


def pushdown_is_isolated(spark: Any) -> bool:
    """True when a filtered query's pushdown does not leak into a later query on the same DataFrame.

    Spark 4.3 stores the read function planned during filter pushdown on the data source object that
    every scan of a DataFrame shares, so ``df.filter(...).count()`` followed by ``df.count()`` reads the
    filtered rows twice (fixed upstream by scoping it to the scan). Pushdown is only used when this
    two-query probe shows the fix.
    """
    spark.dataSource.register(PushdownProbeSource)
    df = spark.read.format(PushdownProbeSource.name()).load()
    return df.filter("v < 1").count() == 1 and df.count() == 3
