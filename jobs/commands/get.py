"""``rmqstore get``: one message by physical offset, offset msgId, queue position, or key."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import tzinfo
from typing import TYPE_CHECKING

from jobs.common import add_store_args, open_store, time_arg
from storelib.errors import StoreError
from storelib.format.record import decode_msg_id
from storelib.format.uniqkey import decode_uniq_key
from storelib.scan.messagecols import row_to_json
from storelib.units import LOCAL, parse_zone

if TYPE_CHECKING:
    from storelib.broker.settings.store import Store

EXAMPLE = """examples:
  rmqstore get /data/store --offset 1048576
  rmqstore get /data/store --msg-id 0A00000500002A9F0000000000000000
  rmqstore get /data/store --queue OrderEvents:2:17
  rmqstore get /data/store --key ORD562535 --topic OrderEvents
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_store_args(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--offset", type=int, metavar="P", help="physical offset of the record")
    g.add_argument("--msg-id", metavar="ID", help="offset msgId (32 or 56 hex characters)")
    g.add_argument("--queue", metavar="TOPIC:QUEUE_ID:QUEUE_OFFSET", help="consume queue position")
    g.add_argument("--key", metavar="K", help="message key or UNIQ_KEY (needs --topic)")
    p.add_argument("--topic", help="topic for --key")
    p.add_argument("--begin", "--begin-ms", dest="begin_ms", type=time_arg, default=0, metavar="TIME",
                   help="--key: earliest store time (epoch ms or ISO-8601, e.g. 2026-11-24T10:00Z)")
    p.add_argument("--end", "--end-ms", dest="end_ms", type=time_arg, default=2**63 - 1, metavar="TIME",
                   help="--key: latest store time (epoch ms or ISO-8601)")
    p.add_argument("--with-body", action="store_true", help="include the body as base64")
    p.add_argument("--tz", default=LOCAL, metavar="ZONE",
                   help="the producer's time zone, for the UNIQ_KEY's creation time (default: this host's, as "
                        "a JVM here decoding the id would; e.g. Asia/Shanghai, UTC, +08:00)")


def lookup(store: Store, args: argparse.Namespace) -> list[dict]:
    """The matching records as JSON-ready dicts (several for --key)."""
    kw = {"with_body": args.with_body, "delay_levels_ms": store.delay_levels_ms}
    if args.offset is not None:
        return [row_to_json(store.record_at(args.offset, **kw).to_pylist()[0], args.with_body)]
    if args.msg_id is not None:
        try:
            _, phy = decode_msg_id(args.msg_id)
        except ValueError as e:
            raise StoreError(None, None, "bad_msg_id", str(e)) from e
        return [row_to_json(store.record_at(phy, **kw).to_pylist()[0], args.with_body)]
    if args.queue is not None:
        from storelib.broker.index.lookup import lookup_queue

        topic, _, rest = args.queue.rpartition(":")
        topic, _, qid = topic.rpartition(":")
        if not topic:
            raise StoreError(None, None, "bad_argument", "--queue needs TOPIC:QUEUE_ID:QUEUE_OFFSET")
        phy = lookup_queue(store, topic, int(qid), int(rest))
        return [row_to_json(store.record_at(phy, **kw).to_pylist()[0], args.with_body)]
    if not args.topic:
        raise StoreError(None, None, "bad_argument", "--key needs --topic")
    from storelib.broker.index.lookup import lookup_key

    rows = lookup_key(store, args.topic, args.key, args.begin_ms, args.end_ms, with_body=args.with_body)
    return [row_to_json(r, args.with_body) for r in rows]


def with_uniq_key_info(row: dict, tz: tzinfo) -> dict:
    """Add the decoded client message id (client IP, pid, counter, creation time) when it is one.

    ``created_ms`` is getNearlyTimeFromID as a JVM of zone ``tz`` would compute it when the message was
    stored (MessageClientIDSetter :63-88 reads the clock; the store time is the offline stand-in)."""
    k = decode_uniq_key(row["uniq_key"]) if row.get("uniq_key") else None
    if k is not None:
        row["uniq_key_decoded"] = {"client_ip": k.client_ip, "pid": k.pid, "counter": k.counter,
                                   "created_ms": k.created_ms(row["store_timestamp"], tz)}
    return row


def run_args(args: argparse.Namespace) -> int:
    tz = parse_zone(args.tz)  # a bad --tz stops here (ValueError: the CLI prints it)
    store = open_store(args)
    store.require_records("get")  # a mixed store: both logs (Store.record_at)
    try:
        rows = [with_uniq_key_info(r, tz) for r in lookup(store, args)]
    except StoreError as e:
        if e.kind != "expired":  # (a live store: the message's segment expired, during the run or before)
            raise
        print(f"rmqstore get: {e.detail}", file=sys.stderr)
        rows = []
    for f in store.findings:  # and what the broker's index load does with the entries the reader skips
        if f.kind == "expired_during_run" or str(f.file).startswith("index/"):
            print(f"rmqstore get: {f.file}: {f.detail}", file=sys.stderr)
    for r in rows:
        sys.stdout.write(json.dumps(r, ensure_ascii=False) + "\n")
    if not rows:
        print("no message found", file=sys.stderr)
        return 1
    return 0
