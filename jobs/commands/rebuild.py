"""``rmqstore rebuild``: rebuild ConsumeQueue and IndexFile files from the commitlog, byte-identical to the
broker (local engine, or Spark executors with ``--engine spark``)."""

from __future__ import annotations

import argparse

from jobs.commands import HELP
from jobs.common import plain_doc

EXAMPLE = """examples:
  rmqstore rebuild /data/store --out /data/rebuilt
  rmqstore rebuild /data/store --out /data/rebuilt --engine spark --master local[4]
  rmqstore rebuild /data/store --in-place --incremental --broker-conf broker.conf
  rmqstore rebuild s3://bucket/store --out s3://bucket/rebuilt --s3-endpoint http://127.0.0.1:9000

The output directory gets consumequeue/, index/ and rebuild-manifest.json (written last: a
directory without it is incomplete). Index file names follow the first entry's store time (UTC).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    from jobs.rebuild import add_arguments

    p = sub.add_parser("rebuild", help=HELP["rebuild"],
                       description=plain_doc(__doc__), epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from jobs.rebuild import run_args

    return run_args(args)
