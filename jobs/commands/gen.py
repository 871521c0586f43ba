"""``rmqstore gen``: write a realistic synthetic broker store (commitlog, consume queues, index, config)."""

from __future__ import annotations

import argparse
import importlib.util
import sys

from jobs.common import Progress, add_settings_args, non_negative_int, print_json, print_table, size_arg

EXAMPLE = """example:
  rmqstore gen /tmp/store --messages 100000 --topics 6 --queues 8 --seed 42
  rmqstore gen /tmp/big --size 1GB --version 5 --broker-conf broker.conf --json
  rmqstore gen /tmp/dl --messages 20000 --dledger --dledger-committed-lag 500 --dledger-undispatched 3
"""
def _ratio(text: str) -> float:
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError("a ratio must be between 0 and 1")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="OUT", help="output store root (must not exist, or be empty)")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--messages", type=int, metavar="N", help="number of messages (client sends)")
    size.add_argument("--size", type=size_arg, metavar="BYTES", help="commitlog size to reach, e.g. 1GB")
    p.add_argument("--topics", type=int, default=4, metavar="N", help="number of topics (default 4)")
    p.add_argument("--topic-name", action="append", default=[], metavar="NAME", dest="topic_names",
                   help="a topic by name, any string the store can hold (e.g. 订单事件 or Emoji🚀Topic; repeatable; "
                        "replaces the generated names)")
    p.add_argument("--queues", type=int, default=4, metavar="N", help="queues per topic")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="random seed: the same seed writes the same store")
    p.add_argument("--version", choices=["4", "5"], default="4", help="broker line to emulate (4.9.8 or 5.3.3)")
    p.add_argument("--segment-size", type=size_arg, metavar="BYTES", help="commitlog segment size")
    add_settings_args(p, line=False)
    p.add_argument("--ipv6-ratio", type=_ratio, default=0.03, help="share of IPv6 born hosts (default 0.03)")
    p.add_argument("--tx-ratio", type=_ratio, default=0.02, help="share of transactional sends")
    p.add_argument("--delay-ratio", type=_ratio, default=0.02, help="share of delayed messages")
    p.add_argument("--compressed-ratio", type=_ratio, default=0.01, help="share of compressed bodies (default 0.01)")
    p.add_argument("--no-dispatch", action="store_true", help="write the commitlog only (no CQ / index)")
    p.add_argument("--dup-info", action="store_true",
                   help="every record carries a DUP_INFO property (5.3.3's recovery requires it with duplicationEnable)")
    p.add_argument("--timers", type=int, default=0, metavar="N",
                   help="--version 5: also N timer messages (TIMER_DELAY_SEC from seconds to 5 days) and the timer "
                        "store as 5.3.3 leaves it: the due ones delivered, the rest pending")
    d = p.add_argument_group("DLedger mode (enableDLegerCommitLog=true)")
    d.add_argument("--dledger", action="store_true",
                   help="write a DLedger-mode store: dledger-<selfId>/ (data, index, checkpoint, currterm) instead of "
                        "commitlog/; the node is --dledger-self-id (default n0)")
    d.add_argument("--dledger-term", type=non_negative_int, default=0, metavar="N", help="the entries' term (default 0)")
    d.add_argument("--dledger-committed-lag", type=non_negative_int, default=0, metavar="N",
                   help="crash: DLedger's checkpoint lags the last entry by N entries (it is written every 3 s)")
    d.add_argument("--dledger-undispatched", type=non_negative_int, default=0, metavar="N",
                   help="crash: the last N entries were not dispatched to the ConsumeQueue and IndexFile yet")
    d.add_argument("--dledger-torn-at", type=non_negative_int, default=0, metavar="BYTES",
                   help="crash: the last entry reached the disk only up to BYTES from its start (48: its header)")
    d.add_argument("--crashed", action="store_true", help="crash: leave abort behind (any crash option implies it)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _add_timers(args: argparse.Namespace, settings) -> dict:
    from dataclasses import asdict

    from storelib.broker.settings.store import Store, with_dledger
    from storelib.fileio.bytesource import resolve
    from storelib.generator.timergen import add_timer_messages

    store = Store(resolve(args.out), with_dledger(settings, resolve(args.out), set()))
    last = max((int(b.column("store_timestamp").to_numpy().max()) for b in store.scan(columns=["store_timestamp"])
                if b.num_rows), default=1_700_000_000_000)
    start = last + 1000
    now = start + args.timers * 500 + 120_000  # short delays due by now, long ones pending
    return asdict(add_timer_messages(args.out, store.settings, count=args.timers, seed=args.seed, start_ms=start,
                                     now_ms=now))


def run_args(args: argparse.Namespace) -> int:
    from jobs.common import settings_from_args
    from storelib.generator.gen import generate
    from storelib.generator.genplan import GenConfig

    settings = settings_from_args(args, version=args.version)
    if args.segment_size:
        settings = settings.with_overrides({"mappedFileSizeCommitLog": args.segment_size})
    if args.messages is not None and args.messages <= 0 or args.topics <= 0 or args.queues <= 0:
        print("rmqstore gen: --messages, --topics and --queues must be positive", file=sys.stderr)
        return 2
    cfg = GenConfig(messages=args.messages, size=args.size, topics=args.topics, queues=args.queues,
                    seed=args.seed, version=args.version, ipv6_ratio=args.ipv6_ratio, tx_ratio=args.tx_ratio,
                    delay_ratio=args.delay_ratio, compressed_ratio=args.compressed_ratio,
                    topic_names=tuple(args.topic_names), dup_info=args.dup_info)
    big = (args.size or 0) >= 64 << 20 or (args.messages or 0) >= 50_000
    prog = Progress("gen", total=args.size, force=big)
    last = [0]

    def on_progress(nbytes: int, records: int) -> None:
        prog.update(nbytes - last[0], f"bytes, {records} records")
        last[0] = nbytes

    missing = [m for m in ("lz4", "zstandard") if args.compressed_ratio and importlib.util.find_spec(m) is None]
    if missing:
        print(f"rmqstore gen: compressed bodies need {' and '.join(missing)}: pip install 'rmqstore[gen]' "
              "(or --compressed-ratio 0)", file=sys.stderr)
        return 2
    if args.timers and (args.version != "5" or args.no_dispatch or args.timers < 0):
        print("rmqstore gen: --timers needs --version 5 and dispatch (timer messages are a 5.x feature)",
              file=sys.stderr)
        return 2
    dledger = None
    if args.dledger and args.timers and (args.crashed or args.dledger_committed_lag or args.dledger_undispatched
                                         or args.dledger_torn_at):
        print("rmqstore gen: --timers with --dledger writes a clean DLedger store (no crash options)", file=sys.stderr)
        return 2
    if args.dledger:
        from storelib.generator.dledgergen import DLedgerGen

        dledger = DLedgerGen(self_id=args.dledger_self_id or "n0", term=args.dledger_term,
                             committed_lag=args.dledger_committed_lag, undispatched=args.dledger_undispatched,
                             torn_at=args.dledger_torn_at, crashed=args.crashed)
    elif args.crashed or args.dledger_committed_lag or args.dledger_undispatched or args.dledger_torn_at:
        print("rmqstore gen: the crash options shape a DLedger store: add --dledger", file=sys.stderr)
        return 2
    res = generate(args.out, cfg, settings, progress=on_progress, dispatch=not args.no_dispatch, dledger=dledger)
    prog.close()
    d = res.to_dict()
    if args.timers:
        d["timers"] = _add_timers(args, settings)
    d["mb_per_s"] = round(res.bytes / 1e6 / res.seconds, 1) if res.seconds else None
    if args.json:
        print_json(d)
    else:
        rows = [{"generated": k, "value": v} for k, v in d.items() if k != "per_type"]
        rows = [r for r in rows if r["generated"] != "timers"]
        rows += [{"generated": f"records.{k}", "value": v} for k, v in res.per_type.items()]
        rows += [{"generated": f"timers.{k}", "value": v} for k, v in d.get("timers", {}).items()]
        print_table(rows, ["generated", "value"])
    return 0
