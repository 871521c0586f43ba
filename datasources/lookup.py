"""Find messages the way the broker does, as pyarrow Tables of the ``rocketmq`` columns: by key through
the index files, by msgId (offset message id), by physical offset, by queue position.

Public API for notebooks and scripts (``datasources.find_by_key`` ...); the same store options as the
data sources (``brokerConf``, ``brokerVersion``, ``set.KEY``, ``fs.KEY``).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from storelib.broker.settings.store import Store
from storelib.errors import StoreError
from storelib.format.record import decode_msg_id
from storelib.scan.messagecols import TIME_COLUMNS, time_column
from storelib.units import parse_time_ms

from .commitlog_reader import output_schema
from .options import StoreOpen


def open_store(store: str, **options: Any) -> Store:
    """The store facade with the data sources' options (settings loaded and detected like the CLI's)."""
    so = StoreOpen.parse({**options, "path": store})
    return Store(so.location(), so.settings(), uri=store)


def _table(rows: list[dict[str, Any]], with_body: bool, st: Store) -> pa.Table:
    """Rows of :func:`storelib.scan.commitlog.CommitLog.record_at` as the ``rocketmq`` schema (segment named)."""
    schema = output_schema(with_body, st.dledger is not None)
    size = st.commitlog.segment_size
    cols = {}
    for f in schema:
        if f.name in TIME_COLUMNS:
            cols[f.name] = time_column(pa.array([r.get(TIME_COLUMNS[f.name]) for r in rows], pa.int64()))
        elif f.name == "segment":
            cols[f.name] = pa.array([f"{r['phy_offset'] // size * size:020d}" for r in rows], pa.string())
        else:
            cols[f.name] = pa.array([r.get(f.name) for r in rows], f.type)
    return pa.table(cols, schema=schema)


def find_by_key(store: str, topic: str, key: str, *, begin: Any = 0, end: Any = None, with_body: bool = False,
                **options: Any) -> pa.Table:
    """Messages of ``topic`` whose UNIQ_KEY or a KEYS token is ``key`` (index lookup, every hit confirmed
    against the commitlog); ``begin``/``end``: store-time bounds (epoch ms or ISO-8601)."""
    from storelib.broker.index.lookup import LONG_MAX, lookup_key

    st = open_store(store, **options)
    lo = parse_time_ms(begin) if begin not in (None, 0) else 0
    hi = parse_time_ms(end) if end is not None else LONG_MAX
    return _table(lookup_key(st, topic, key, lo, hi, with_body=with_body), with_body, st)


def find_by_offset(store: str, phy_offset: int, *, with_body: bool = False, **options: Any) -> pa.Table:
    """The record at a physical commitlog offset (one row)."""
    st = open_store(store, **options)
    row = st.record_at(int(phy_offset), with_body=with_body, delay_levels_ms=st.delay_levels_ms).to_pylist()
    return _table(row, with_body, st)


def find_by_msg_id(store: str, msg_id: str, *, with_body: bool = False, **options: Any) -> pa.Table:
    """The record an offset msgId (store host + physical offset, 32 or 56 hex digits) points to."""
    try:
        _, phy = decode_msg_id(msg_id)
    except ValueError as e:
        raise StoreError(None, None, "bad_msg_id", str(e)) from e
    return find_by_offset(store, phy, with_body=with_body, **options)


__all__ = ["find_by_key", "find_by_msg_id", "find_by_offset", "open_store"]
