"""Columnar snapshots (written by ``rmqstore export``): their layout, and readers for pyarrow and Spark.

A snapshot directory holds Hive-partitioned Parquet (``topic=``/``date=``, percent-encoded values) in the
``rocketmq`` source's columns plus ``date`` (UTC store day), and ``_manifest.json`` (schema
:data:`SCHEMA`). Spark reads it with its vectorised Parquet reader and column pruning, which a Python
data source cannot offer: the fast path for repeated SQL over a dump.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

from storelib.errors import StoreError
from storelib.fileio.bytesource import Location, resolve

from .commitlog_reader import output_schema
from .options import spark_ddl

SCHEMA = "rmqstore.snapshot/1"
MANIFEST = "_manifest.json"


def file_schema(with_body: bool) -> pa.Schema:
    """The exported columns: the data source's (``segment`` included, no ``_corrupt``: only valid records
    are exported) plus ``date`` (UTC store date) for partitioning."""
    s = output_schema(with_body)
    return s.remove(s.get_field_index("_corrupt")).append(pa.field("date", pa.string()))


def partitioning(partition_by: tuple[str, ...] | list[str]) -> pads.Partitioning | None:
    """Hive partitions by ``partition_by``, all strings (a topic named ``123`` stays a name)."""
    if not partition_by:
        return None
    return pads.partitioning(pa.schema([pa.field(p, pa.string()) for p in partition_by]), flavor="hive")


def load_manifest(path: str, **fs_options: Any) -> dict[str, Any]:
    """The manifest of the snapshot at ``path``; a clear error when ``path`` is not one."""
    return manifest_at(resolve(path, **fs_options), path)


def manifest_at(snapshot: Location, shown: str) -> dict[str, Any]:
    """The manifest in the snapshot directory ``snapshot`` (``shown``: its path as the user wrote it)."""
    loc = snapshot.join(MANIFEST)
    try:
        with loc.fs.open_input_stream(loc.path) as f:
            doc = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise StoreError(shown, None, "not_a_snapshot", f"no {MANIFEST}: not a snapshot written by rmqstore export") \
            from None
    except (OSError, ValueError) as e:
        raise StoreError(loc.path, None, "bad_manifest", str(e)) from e
    if doc.get("schema") != SCHEMA:
        raise StoreError(loc.path, None, "not_a_snapshot", f"schema {doc.get('schema')!r}, expected {SCHEMA}")
    return doc


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
