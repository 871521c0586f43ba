"""``rmqstore messages``: every record in commitlog order, as JSONL, a table or Parquet.

On a DLedger-mode store every entry on disk is listed (up to where its data ends), each with its
``dledger_index``/``dledger_term``/``dledger_pos`` and ``dledger_committed`` (false past DLedger's
checkpoint committedIndex: data an operator needs to see after a crash)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from jobs.common import (
    Progress,
    add_store_args,
    name_unread,
    non_negative_int,
    open_store,
    print_table,
)
from storelib.broker.settings.storeroot import unread_ends
from storelib.scan.messagecols import iso_utc_column, row_to_json, with_time_columns

if TYPE_CHECKING:
    from storelib.broker.settings.store import Store

EXAMPLE = """example:
  rmqstore messages /data/store --topic OrderEvents --limit 5
  rmqstore messages /data/store --format parquet --out messages.parquet --with-body
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_store_args(p)
    p.add_argument("--topic", help="only this topic")
    p.add_argument("--queue-id", type=int, help="only this queue id")
    p.add_argument("--from-offset", type=int, metavar="P", help="start at this physical offset")
    p.add_argument("--to-offset", type=int, metavar="P", help="stop before this physical offset")
    p.add_argument("--limit", type=non_negative_int, metavar="N", help="at most N messages (N >= 0)")
    p.add_argument("--with-body", action="store_true", help="include the body (base64 in JSONL)")
    p.add_argument("--no-crc", action="store_true", help="skip body CRC verification (crc_ok is null)")
    p.add_argument("--format", choices=["jsonl", "table", "parquet"], default="jsonl")
    p.add_argument("--out", metavar="F", help="output file (required for parquet; stdout otherwise)")


def filtered_batches(store: Store, args: argparse.Namespace) -> Iterator[pa.RecordBatch]:
    """Scan batches with the CLI's topic/queue/offset/limit filters applied column-wise.

    Progress (messages written) goes to stderr when it is a terminal.
    """
    left = args.limit
    progress = Progress("messages", force=False)
    ends: list = []
    try:
        yield from _filtered(store, args, left, progress, ends)
    finally:
        progress.close()
    for f in store.commitlog.findings:  # a segment the broker's cleaner deleted under the scan: said once
        if f.kind == "expired_during_run":
            print(f"rmqstore messages: {len(f.extra['segments'])} segment(s) expired during the run (the broker's "
                  f"cleaner deleted them after this run listed them; first: {f.file}): not listed", file=sys.stderr)
    # bytes the scan could not read as records (a segment of random bytes, a torn record): named, not passed
    sizes = {s.display: s.file_size for cl in (store.commitlog, store.old_commitlog) if cl for s in cl.segments}
    name_unread("messages", [f for f in store.findings if f.kind == "commitlog_head_not_a_record"]
                + unread_ends([e for e in ends if not (e.file_offset == 0 and _head_named(store, e.file))], sizes))


def _head_named(store: Store, file: str) -> bool:
    return any(f.kind == "commitlog_head_not_a_record" and f.file == file for f in store.findings)


def _filtered(store: Store, args: argparse.Namespace, left: int | None, progress: Progress, ends: list
              ) -> Iterator[pa.RecordBatch]:
    for batch in store.scan(from_offset=args.from_offset, to_offset=args.to_offset, with_body=args.with_body,
                            verify_crc=not args.no_crc, ends=ends, skip_expired=True):
        mask = None
        if args.topic is not None:
            mask = pc.equal(batch.column("topic"), args.topic)
        if args.queue_id is not None:
            m = pc.equal(batch.column("queue_id"), args.queue_id)
            mask = m if mask is None else pc.and_(mask, m)
        if mask is not None:
            batch = batch.filter(mask)
        if left is not None:
            batch = batch.slice(0, left)
            left -= batch.num_rows
        if batch.num_rows:
            progress.update(batch.num_rows, "messages")
            yield batch
        if left is not None and left <= 0:
            return


def run_args(args: argparse.Namespace) -> int:
    store = open_store(args)
    store.require_records("messages")  # a mixed store: both logs (Store.scan)
    if args.format == "parquet":
        import pyarrow.parquet as pq

        if not args.out:
            print("rmqstore messages: --format parquet needs --out FILE", file=sys.stderr)
            return 2
        from storelib.fileio.publish import atomic_local_file

        writer = None
        count = 0
        with atomic_local_file(args.out) as tmp:
            for batch in filtered_batches(store, args):
                batch = with_time_columns(batch.drop_columns(["properties_raw"]))
                if writer is None:
                    writer = pq.ParquetWriter(tmp, batch.schema)
                writer.write_batch(batch)
                count += batch.num_rows
            if writer is None:
                from storelib.scan.messageschema import message_schema

                schema = message_schema(args.with_body, dledger=store.dledger is not None)
                schema = with_time_columns(schema.remove(schema.get_field_index("properties_raw")).empty_table()).schema
                writer = pq.ParquetWriter(tmp, schema)
            writer.close()
        print(f"wrote {count} messages to {args.out}", file=sys.stderr)
        return 0
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    try:
        if args.format == "table":
            cols = ["phy_offset", "size", "topic", "queue_id", "queue_offset", "tags", "keys", "store_time", "crc_ok"]
            if store.dledger is not None:  # the entry's ledger index and whether DLedger has committed it
                cols += ["dledger_index", "dledger_committed"]
            rows = []
            for batch in filtered_batches(store, args):
                part = batch.select([c for c in cols if c != "store_time"]).to_pylist()
                for r, t in zip(part, iso_utc_column(batch.column("store_timestamp"))):
                    r["store_time"] = t
                rows.extend(part)
            print_table(rows, cols, out)
            return 0
        for batch in filtered_batches(store, args):
            for row in batch.to_pylist():
                out.write(json.dumps(row_to_json(row, args.with_body), ensure_ascii=False) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0
