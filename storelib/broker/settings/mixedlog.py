"""A mixed store's two logs read as one, split where the broker splits them.

A broker switched from default mode to DLedger mode reads a physical offset below its
``dividedCommitlogOffset`` from the old ``commitlog/`` and the rest from DLedger (4.9.8
DLedgerCommitLog.java getData :244-269, getMessage :664-676; 5.3.3 :248-290, :801). The divided offset
is :class:`storelib.broker.settings.dledgerlayout.OldCommitLog`'s. Rows of the old log carry null DLedger
columns (they are no entry); each part keeps its own physical offsets, which are the broker's.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from storelib.scan.commitlog import CommitLog
from storelib.scan.messageschema import DLEDGER_FIELDS, DLEDGER_NAMES


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) if f.name in DLEDGER_NAMES else f for f in schema])


def _old_rows(batch: pa.RecordBatch, columns: list[str] | None) -> pa.RecordBatch:
    """An old-log batch with null DLedger columns, in the DLedger scan's column order (or ``columns``')."""
    wanted = [f for f in DLEDGER_FIELDS if columns is None or f.name in columns]
    fields = _nullable(pa.schema(list(batch.schema) + wanted))
    arrays = dict(zip(fields.names, batch.columns + [pa.nulls(batch.num_rows, f.type) for f in wanted]))
    order = fields.names if columns is None else list(columns)
    return pa.RecordBatch.from_arrays([arrays[c] for c in order], schema=pa.schema([fields.field(c) for c in order]))


def mixed_scan(old: CommitLog, new: CommitLog, divided: int, *, from_offset: int | None = None,
               to_offset: int | None = None, **kw) -> Iterator[pa.RecordBatch]:
    """Every valid record below ``divided`` from ``old``, then DLedger's from ``divided`` on, in offset order
    (the old log's bytes at or above ``divided``, when it reaches past it, are never read: the broker's are
    DLedger's there). ``kw``: :meth:`CommitLog.scan`'s (``ends`` collects both parts' segment ends)."""
    columns = kw.get("columns")
    if from_offset is None or from_offset < divided:
        stop = divided if to_offset is None else min(to_offset, divided)
        old_kw = kw if columns is None else {**kw, "columns": [c for c in columns if c not in DLEDGER_NAMES]}
        for b in old.scan(from_offset=from_offset, to_offset=stop, **old_kw):
            yield _old_rows(b, columns)
    if to_offset is None or to_offset > divided:
        start = divided if from_offset is None else max(from_offset, divided)
        for b in new.scan(from_offset=start, to_offset=to_offset, **kw):
            yield pa.RecordBatch.from_arrays(b.columns, schema=_nullable(b.schema))


def mixed_record_at(old: CommitLog, new: CommitLog, divided: int, phy_offset: int, **kw) -> pa.RecordBatch:
    """The record at ``phy_offset``: the old log's below ``divided`` (getMessage, 4.9.8 :664-676), else
    DLedger's; one row of the joined scan's schema."""
    if phy_offset < divided:
        return _old_rows(old.record_at(phy_offset, **kw), None)
    b = new.record_at(phy_offset, **kw)
    return pa.RecordBatch.from_arrays(b.columns, schema=_nullable(b.schema))


__all__ = ["mixed_record_at", "mixed_scan"]
