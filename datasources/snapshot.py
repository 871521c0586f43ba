"""Columnar snapshots (written by ``rmqstore export``): their layout, and readers for pyarrow and Spark.

A snapshot directory holds Hive-partitioned Parquet (``topic=``/``date=``, percent-encoded values) in the
``rocketmq`` source's columns plus ``date`` (UTC store day), and ``_manifest.json`` (schema
:data:`SCHEMA`). Spark reads it with its vectorised Parquet reader and column pruning, which a Python
data source cannot offer: the fast path for repeated SQL over a dump.
"""

from __future__ import annotations

from typing import Any

import pyarrow.dataset as pads

from storelib.fileio.bytesource import resolve
from storelib.snapshot.directory import (
    MANIFEST,
    SCHEMA,
    file_schema,
    load_manifest,
    manifest_at,
    partitioning,
)

from .options import spark_ddl


def snapshot_dataset(path: str, **fs_options: Any) -> pads.Dataset:
    """The snapshot as a pyarrow dataset (partition columns as strings; ``_`` entries ignored)."""
    m = load_manifest(path, **fs_options)
    loc = resolve(path, **fs_options)
    return pads.dataset(loc.path, format="parquet", filesystem=loc.fs,
                        partitioning=partitioning(tuple(m["partition_by"])), schema=file_schema(m["with_body"]))


def read_snapshot(spark: Any, path: str, view: str | None = None) -> Any:
    """The snapshot as a Spark DataFrame (its schema fixed by the manifest, partition columns strings),
    registered as temporary view ``view`` when given. ``path`` is what Spark reads (a URI for remote)."""
    m = load_manifest(path)
    df = spark.read.schema(spark_ddl(file_schema(m["with_body"]))).parquet(path)
    if view:
        df.createOrReplaceTempView(view)
    return df


__all__ = ["MANIFEST", "SCHEMA", "file_schema", "load_manifest", "manifest_at", "partitioning", "read_snapshot", "snapshot_dataset"]
