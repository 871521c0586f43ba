"""The public columns of a message row: one definition for ``rmqstore messages`` (JSONL, table,
Parquet), the ``rocketmq`` data source and the pyarrow readers.

The broker stores times as epoch milliseconds; those columns stay as they are (exact, and what the
broker's tools print), and each has a typed twin (``store_time`` beside ``store_timestamp``): a UTC
timestamp that Spark reads as ``TimestampType`` and Parquet as a timestamp, derived per batch with one
column operation.
"""

from __future__ import annotations

import base64
import datetime as _dt
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.scan.messageschema import DLEDGER_FIELDS, MESSAGE_SCHEMA

# the message columns in their public order (body, and the data source's segment/_corrupt, come after);
# prop_crc_ok: the 5.x ``__CRC32#`` property checked against the record (null where there is none)
MESSAGE_COLUMNS = [
    "phy_offset", "size", "magic_version", "body_crc", "crc_ok", "queue_id", "flag", "queue_offset",
    "physical_offset_field", "sys_flag", "tran_type", "born_timestamp", "born_host", "store_timestamp",
    "store_host", "reconsume_times", "prepared_transaction_offset", "body_len", "topic", "tags", "keys",
    "uniq_key", "msg_id", "tags_code", "properties", "prop_crc_ok", "born_time", "store_time",
]

# a DLedger-mode store's rows also carry their entry's ledger fields (after the message columns)
DLEDGER_COLUMNS = [f.name for f in DLEDGER_FIELDS]
_DLEDGER_SCHEMA = pa.schema(DLEDGER_FIELDS)

# typed twin -> the epoch-ms column it is derived from
TIME_COLUMNS = {"born_time": "born_timestamp", "store_time": "store_timestamp"}
# microseconds, UTC: Spark's own TimestampType unit (a millisecond unit is converted row by row)
TIME_TYPE = pa.timestamp("us", tz="UTC")


def time_fields() -> list[pa.Field]:
    return [pa.field(name, TIME_TYPE) for name in TIME_COLUMNS]


def time_column(ms: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Epoch milliseconds as a UTC timestamp column (nulls stay null)."""
    arr = ms.combine_chunks() if isinstance(ms, pa.ChunkedArray) else ms
    us = pc.multiply(arr.cast(pa.int64()), pa.scalar(1000, pa.int64()))
    return us.cast(TIME_TYPE)


def with_time_columns(batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch | pa.Table:
    """``batch`` plus the typed twin of each epoch-ms column it holds (appended, in :data:`TIME_COLUMNS` order)."""
    for name, src in TIME_COLUMNS.items():
        if src in batch.schema.names and name not in batch.schema.names:
            batch = batch.append_column(pa.field(name, TIME_TYPE), time_column(batch.column(src)))
    return batch


def iso_utc(ms: int | None) -> str | None:
    """Epoch milliseconds as ISO-8601 UTC text with milliseconds (``2026-11-25T12:00:00.123Z``)."""
    if ms is None:
        return None
    t = _dt.datetime.fromtimestamp(0, _dt.timezone.utc) + _dt.timedelta(milliseconds=int(ms))
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def iso_utc_column(ms: pa.Array | pa.ChunkedArray) -> list[str | None]:
    """A column of epoch milliseconds as :func:`iso_utc` texts, formatted by numpy (not per row in Python)."""
    arr = ms.combine_chunks() if isinstance(ms, pa.ChunkedArray) else ms
    valid = np.asarray(arr.is_valid())
    vals = np.asarray(arr.fill_null(0).cast(pa.int64())).astype("datetime64[ms]")
    text = np.datetime_as_string(vals, unit="ms")
    return [t + "Z" if ok else None for t, ok in zip(text.tolist(), valid.tolist())]


def row_to_json(row: dict[str, Any], with_body: bool = False) -> dict[str, Any]:
    """One scanned record as the JSON object `rmqstore messages` prints."""
    out = {k: row.get(k) for k in MESSAGE_COLUMNS}
    for name, src in TIME_COLUMNS.items():  # the typed twins as ISO-8601 UTC text
        out[name] = iso_utc(row.get(src))
    out.update({k: row[k] for k in DLEDGER_COLUMNS if k in row})
    props = row.get("properties")
    if props is not None and not isinstance(props, dict):
        out["properties"] = dict(props)
    elif props is None and row.get("properties_raw") is not None:
        from storelib.format.properties import parse_properties

        out["properties"] = parse_properties(row["properties_raw"])
    if with_body:
        body = row.get("body")
        out["body_base64"] = base64.b64encode(body).decode("ascii") if body is not None else None
    return out


def output_schema(with_body: bool = False, dledger: bool = False) -> pa.Schema:
    """Arrow schema of the rows: message columns (all nullable: corrupt rows), with ``dledger`` the entry
    columns, ``body``, ``segment``, ``_corrupt``."""
    names = MESSAGE_COLUMNS + (DLEDGER_COLUMNS if dledger else []) + (["body"] if with_body else [])
    fields = [pa.field(n, TIME_TYPE) if n in TIME_COLUMNS
              else (_DLEDGER_SCHEMA.field(n) if n in DLEDGER_COLUMNS else MESSAGE_SCHEMA.field(n)).with_nullable(True)
              for n in names]
    fields += [pa.field("segment", pa.string()), pa.field("_corrupt", pa.string())]
    return pa.schema(fields)


def message_batch(batch: pa.RecordBatch, schema: pa.Schema, segment_name: str) -> pa.RecordBatch:
    """A scanner batch in the public columns of ``schema`` (a subset of :func:`output_schema`, in its
    order): typed time twins derived, ``segment`` named, ``_corrupt`` null. The one conversion the data
    source, the pyarrow readers and ``rmqstore export`` share."""
    n = batch.num_rows
    cols = []
    for f in schema:
        if f.name in TIME_COLUMNS:
            cols.append(time_column(batch.column(TIME_COLUMNS[f.name])))
        elif f.name == "segment":
            cols.append(pa.repeat(pa.scalar(segment_name), n))
        elif f.name == "_corrupt":
            cols.append(pa.nulls(n, pa.string()))
        else:
            cols.append(batch.column(f.name))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


__all__ = ["DLEDGER_COLUMNS", "MESSAGE_COLUMNS", "message_batch", "output_schema", "row_to_json", "TIME_COLUMNS", "TIME_TYPE", "iso_utc", "iso_utc_column", "time_column",
           "time_fields", "with_time_columns"]
