"""``rmqstore replicas``: compare the stores of one broker group (a master and its slaves, the replicas of a
controller-mode group): where they part, what each holds that no other does, what a rejoin would cut, which
consumer groups stand past another store's end, how their ``config/`` differs; and save what would be lost.

Classic HA copies the master's commitlog bytes to the slave at the same offsets, and so does controller mode:
the stores are compared by CRCs of byte blocks, and only where they part is anything read again. In controller
mode (a store has an ``epochFileCheckpoint``) each store rejoining the one with the newest epoch is cut where
EpochFileCache.findConsistentPoint says, and that is checked against the bytes. In a DLedger group each node
rejoining the leader is cut where DLedger's compare walk and truncate put it. Offsets are physical offsets as
ConsumeQueue units hold them (a DLedger entry's pos + 48). The inputs are only read.

Exit codes: 0 the stores are consistent (each a prefix of another), 1 they diverged, 2 the comparison could not
run.
"""

from __future__ import annotations

import argparse
import json
import sys

from jobs.common import add_fs_args, add_settings_args, note, size_arg
from jobs.engines.schedulers import add_engine_args

EXAMPLE = """examples:
  rmqstore replicas /data/broker-a-master/store /data/broker-a-slave/store
  rmqstore replicas old-master/ new-master/ --json --html group.html --salvage saved/
  rmqstore replicas s3://dump/a/n0 s3://dump/a/n1 --s3-endpoint http://minio:9000 --engine pool
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from storelib.broker.replicas.group import MODES
    from storelib.broker.replicas.salvage import FORMATS, SETS

    p.add_argument("stores", nargs="+", metavar="STORE", help="two or more store roots (local paths or URIs)")
    p.add_argument("--name", action="append", metavar="NAME", help="a name for each store, in order (default: the "
                   "last path component, numbered when they repeat)")
    p.add_argument("--node", action="append", metavar="ID", help="DLedger: each store's node id, in order (when a "
                   "root holds several nodes' dledger-<id>/ folders, give the root once per node)")
    p.add_argument("--mode", choices=MODES, default="auto", help="classic HA, controller mode or a DLedger group "
                   "(default: dledger for DLedger-mode stores, controller when a store has an epochFileCheckpoint)")
    p.add_argument("--json", action="store_true", help="print the whole comparison as JSON (schema rmqstore.replicas/1)")
    p.add_argument("--html", metavar="FILE", help="write the HTML report (and FILE's .json beside it)")
    p.add_argument("--salvage", metavar="DIR", help="save what only one store holds and what a rejoin drops, under DIR")
    p.add_argument("--salvage-format", default=",".join(FORMATS), metavar="LIST",
                   help=f"comma-separated: {', '.join(FORMATS)} (default: all)")
    p.add_argument("--salvage-set", default=",".join(SETS), metavar="LIST",
                   help=f"comma-separated: {', '.join(SETS)} (default: both)")
    p.add_argument("--block", type=size_arg, default=1 << 20, metavar="SIZE", help="CRC block size (default 1MiB)")
    add_settings_args(p)
    add_fs_args(p)
    add_engine_args(p, "comparison", pool_when="more than two stores")


def store_names(stores: list[str], names: list[str] | None) -> list[str]:
    """The given names, else each store's last path component, made unique."""
    from storelib.errors import StoreError

    if names:
        if len(names) != len(stores) or len(set(names)) != len(names):
            raise StoreError(None, None, "bad_argument", "give one distinct --name per store")
        return list(names)
    base = [s.rstrip("/").rsplit("/", 1)[-1] or s for s in stores]
    if len(set(base)) == len(base):
        return base
    parent = [("/".join(s.rstrip("/").rsplit("/", 2)[-2:])) for s in stores]
    return parent if len(set(parent)) == len(parent) else [f"{i + 1}:{b}" for i, b in enumerate(base)]


def run_args(args: argparse.Namespace) -> int:
    from jobs.replicas import Group, engine_for, exit_code, run_groups, specs_for
    from jobs.reports.replicas_report import summary_text, write_reports
    from storelib.errors import StoreError

    if len(args.stores) < 2:
        raise StoreError(None, None, "bad_argument", "give at least two stores to compare")
    if args.node and len(args.node) != len(args.stores):
        raise StoreError(None, None, "bad_argument", "give one --node per store")
    names = store_names(args.stores, args.name or ([f"{s.rstrip('/').rsplit('/', 1)[-1]}:{n}"
                                                    for s, n in zip(args.stores, args.node)] if args.node else None))
    try:
        specs = specs_for(names, args.stores, args, args.node)
    except StoreError as e:
        if e.kind != "several_dledger_nodes":
            raise
        raise StoreError(e.file, e.offset, e.kind, e.detail.split(": pick one")[0] + ": give the root once per node "
                         "with --node ID each (e.g. ROOT ROOT --node n0 --node n1)") from None
    engine = engine_for(args, len(specs))

    def salvage(res: dict, comparison) -> None:
        if args.salvage:
            from storelib.broker.replicas.salvage import salvage as save

            res["salvage"] = save(comparison, args.salvage, _list(args.salvage_format), _list(args.salvage_set))
            note(f"replicas: salvage written under {args.salvage}", args.json)

    try:
        result = run_groups([Group("", specs)], engine, mode=args.mode, block=args.block,
                            say=None if args.json else note, after=salvage)[0]
    finally:
        engine.close()
    if "error" in result:
        raise StoreError(None, None, "could_not_compare", result["error"])
    result.pop("group", None)
    if args.html:
        prefix = args.html[:-5] if args.html.endswith(".html") else args.html
        jp, hp = write_reports(result, prefix)
        note(f"replicas: wrote {hp} and {jp}", args.json)
    if args.json:
        from jobs.reports.audit_report import jsonable

        json.dump(jsonable(result), sys.stdout, indent=1, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        print(summary_text(result))
    return exit_code([result])


def _list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())
