"""``rmqstore export``: a store as a Hive-partitioned Parquet snapshot for fast repeated SQL (incremental)."""

from __future__ import annotations

import argparse

from jobs.commands import HELP
from jobs.common import plain_doc


def add_parser(sub: argparse._SubParsersAction) -> None:
    from jobs.export import EXAMPLE, add_arguments

    p = sub.add_parser("export", help=HELP["export"],
                       description=plain_doc(__doc__), epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from jobs.export import run_args

    return run_args(args)
