"""RocketMQ store files as Spark DataFrames (Spark 4 Python Data Sources) and as pyarrow tables.

``from datasources import register; register(spark)`` makes these formats available to
``spark.read.format(...)`` and to SQL (``CREATE TEMPORARY VIEW m USING rocketmq OPTIONS (path '...')``):

* ``rocketmq``: commitlog messages (:mod:`datasources.commitlog_source`; the reading, Spark-free:
  :mod:`datasources.commitlog_reader`);
* ``rocketmq.consumequeue``: ConsumeQueue units (:mod:`datasources.consumequeue_source`);
* ``rocketmq.index``, ``rocketmq.checkpoint``, ``rocketmq.segments`` (:mod:`datasources.index_source`);
* ``rocketmq.timers``: the 5.x timer messages, pending and delivered (:mod:`datasources.timers_source`).

Without Spark: :func:`read_messages`, :func:`read_consumequeue`, :func:`read_index`,
:func:`read_checkpoint_table`, :func:`read_segments` return the same rows as pyarrow Tables, and
:func:`find_by_key`, :func:`find_by_msg_id`, :func:`find_by_offset` find single messages as the broker
does (:mod:`datasources.lookup`); :func:`snapshot_dataset` and :func:`read_snapshot` read a columnar
snapshot written by ``rmqstore export`` (:mod:`datasources.snapshot`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


# Spark minor versions on which the two-query probe (:func:`datasources.commitlog_source.pushdown_is_isolated`)
# was run and showed a filtered scan's reader leaking into later scans of the same DataFrame: no probe
# job on them, pushdown stays off. Any other Spark with the setting is probed once per Spark version.
PUSHDOWN_LEAKS_ON = frozenset({(4, 3)})
_PROBED: dict[str, bool] = {}

@dataclass(frozen=True)
class Registration:
    """What :func:`register` did: the formats now readable, whether filter pushdown is on, and why."""

    formats: tuple[str, ...]
    pushdown: bool
    reason: str

    def __str__(self) -> str:
        return f"registered {', '.join(self.formats)}; filter pushdown {'on' if self.pushdown else 'off'} ({self.reason})"


def _spark_minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _decide_pushdown(spark: Any, pushdown: bool | None) -> tuple[bool, str]:
    """(pushdown on, why); leaves the session's pushdown setting as it was when the answer is no."""
    if pushdown is False:
        return False, "turned off by the caller"
    try:
        before = spark.conf.get(PUSHDOWN_CONF)
        spark.conf.set(PUSHDOWN_CONF, "true")
        supported = str(spark.conf.get(PUSHDOWN_CONF)).lower() == "true"
    except Exception:  # an older Spark without the setting, or a locked session
        before, supported = None, False
    version = str(getattr(spark, "version", "?"))
    if not supported:
        on, why = False, f"Spark {version} has no filter pushdown for Python data sources"
    elif pushdown:
        on, why = True, "forced by the caller (use a fresh DataFrame per filtered query on a Spark that leaks)"
    elif _spark_minor(version) in PUSHDOWN_LEAKS_ON:
        on, why = False, (f"Spark {version} reuses a filtered scan's reader for later scans of the same DataFrame; "
                          "the reader's options still prune, Spark filters after the scan")
    else:
        if version not in _PROBED:
            from .commitlog_source import pushdown_is_isolated

            _PROBED[version] = pushdown_is_isolated(spark)
        on = _PROBED[version]
        why = f"Spark {version}: a two-query probe {'showed scans isolated' if on else 'showed a leak between scans'}"
    if not on and before is not None:
        spark.conf.set(PUSHDOWN_CONF, before)
    return on, why


def register(spark: Any, *, pushdown: bool | None = None) -> Registration:
    """Register every source on ``spark`` (instant on a Spark whose pushdown behaviour is known).

    ``pushdown`` None (default): use filter pushdown only when this Spark supports it for Python data
    sources **and** isolates it per scan. Spark 4.3 (:data:`PUSHDOWN_LEAKS_ON`) leaks a filtered scan's
    reader into later scans of the same DataFrame, which would silently drop rows, so pushdown stays off
    there without a probe; an unknown newer Spark is probed once (a tiny two-query job, cached per
    version). ``True`` forces pushdown, ``False`` registers the plain reader. Without pushdown the reader
    still prunes by its options (``fromOffset``/``toOffset``/``fromTime``/``toTime``/``topics``) and
    Spark applies SQL filters after the scan. Returns a :class:`Registration` saying what was done.
    """
    from .commitlog_source import RocketMQDataSource, RocketMQPushdownDataSource
    from .consumequeue_source import ConsumeQueueDataSource
    from .index_source import CheckpointDataSource, IndexDataSource, SegmentsDataSource
    from .timers_source import TimersDataSource

    on, why = _decide_pushdown(spark, pushdown)
    messages = RocketMQPushdownDataSource if on else RocketMQDataSource
    sources = (messages, ConsumeQueueDataSource, IndexDataSource, CheckpointDataSource, SegmentsDataSource,
               TimersDataSource)
    for ds in sources:
        spark.dataSource.register(ds)
    return Registration(tuple(ds.name() for ds in sources), on, why)


def read_messages(store: str, **options: Any):
    from .commitlog_reader import read_messages as f

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


def read_timers(store: str, **options: Any):
    from .timers_source import read_timers as f

    return f(store, **options)


def read_segments(store: str, **options: Any):
    from .index_source import read_segments as f

    return f(store, **options)


from .lookup import find_by_key, find_by_msg_id, find_by_offset  # noqa: E402
from .snapshot import read_snapshot, snapshot_dataset  # noqa: E402

__all__ = ["PUSHDOWN_CONF", "Registration", "find_by_key", "find_by_msg_id", "find_by_offset",
           "read_checkpoint_table", "read_consumequeue", "read_index", "read_messages", "read_segments",
           "read_snapshot", "read_timers", "register", "snapshot_dataset"]
