"""RocketMQ store files as Spark DataFrames (Spark 4 Python Data Sources) and as pyarrow tables.

``from datasources import register; register(spark)`` makes these formats available to
``spark.read.format(...)`` and to SQL (``CREATE TEMPORARY VIEW m USING rocketmq OPTIONS (path '...')``):

* ``rocketmq``: commitlog messages (:mod:`datasources.commitlog_source`);
* ``rocketmq.consumequeue``: ConsumeQueue units (:mod:`datasources.consumequeue_source`);
* ``rocketmq.index``, ``rocketmq.checkpoint``, ``rocketmq.segments`` (:mod:`datasources.index_source`).

Without Spark: :func:`read_messages`, :func:`read_consumequeue`, :func:`read_index`,
:func:`read_checkpoint_table`, :func:`read_segments` return the same rows as pyarrow Tables.
"""

from __future__ import annotations

from typing import Any

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any, *, pushdown: bool | None = None) -> bool:
    """Register every source on ``spark``; returns whether filter pushdown is active.

    ``pushdown`` None (default): use pushdown only when this Spark supports it for Python data sources
    **and** isolates it per scan; this call turns ``spark.sql.python.filterPushdown.enabled`` on and
    runs a two-query probe (:func:`datasources.commitlog_source.pushdown_is_isolated`): Spark 4.3
    leaks a filtered scan's reader into later scans of the same DataFrame, which would silently drop
    rows. ``True`` forces pushdown (only safe with a fresh DataFrame per filtered query on such a
    Spark), ``False`` registers the plain reader. Without pushdown the reader still prunes and filters
    by its options (``fromOffset``/``toOffset``/``fromTime``/``toTime``/``topics``) and Spark applies
    SQL filters after the scan.
    """
    from .commitlog_source import RocketMQDataSource, RocketMQPushdownDataSource, pushdown_is_isolated
    from .consumequeue_source import ConsumeQueueDataSource
    from .index_source import CheckpointDataSource, IndexDataSource, SegmentsDataSource

    if pushdown is not False:
        try:
            before = spark.conf.get(PUSHDOWN_CONF)
            spark.conf.set(PUSHDOWN_CONF, "true")
            supported = str(spark.conf.get(PUSHDOWN_CONF)).lower() == "true"
        except Exception:  # an older Spark without the setting, or a locked session
            before, supported = None, False
        if pushdown is None:
            pushdown = supported and pushdown_is_isolated(spark)
        else:
            pushdown = supported
        if not pushdown and before is not None:
            spark.conf.set(PUSHDOWN_CONF, before)  # leave the session as it was
    messages = RocketMQPushdownDataSource if pushdown else RocketMQDataSource
    for ds in (messages, ConsumeQueueDataSource, IndexDataSource, CheckpointDataSource, SegmentsDataSource):
        spark.dataSource.register(ds)
    return bool(pushdown)


def read_messages(store: str, **options: Any):
    from .commitlog_source import read_messages as f

    return f(store, **options)


def read_consumequeue(store: str, **options: Any):
    from .consumequeue_source import read_consumequeue as f

    return f(store, **options)


def read_index(store: str, **options: Any):
    from .index_source import read_index as f

    return f(store, **options)


def read_checkpoint_table(store: str, **options: Any):
    from .index_source import read_checkpoint_table as f

    return f(store, **options)


def read_segments(store: str, **options: Any):
    from .index_source import read_segments as f

    return f(store, **options)


__all__ = ["register", "read_messages", "read_consumequeue", "read_index", "read_checkpoint_table",
           "read_segments", "PUSHDOWN_CONF"]
