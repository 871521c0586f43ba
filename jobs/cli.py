"""The ``rmqstore`` command: one entry point over storelib, the data sources and the Spark jobs.

Each subcommand is a module with ``add_arguments(parser)`` and ``run_args(args)`` (:data:`jobs.commands.COMMANDS`).
Exit codes: 0 ok, 1 findings at or above the failure threshold, 2 could not run (bad input, missing
store...). Errors print one line naming the file and offset, never a traceback (``--debug`` shows it).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from jobs.commands import COMMANDS, HELP
from jobs.common import plain_doc
from storelib.errors import StoreError


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rmqstore")
    except PackageNotFoundError:
        return "(not installed)"


class _VersionAction(argparse.Action):
    """``--version``, looked up only when asked (importlib.metadata costs ~20 ms of every command)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"rmqstore {_version()}")
        parser.exit()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``only``, every command but that one is listed by name and help alone, so a
    run imports just its own command's modules (a cron audit does not pay for Parquet and pandas)."""
    p = argparse.ArgumentParser(
        prog="rmqstore",
        description="Read, audit, rebuild and recover Apache RocketMQ broker store files offline.",
        epilog="Run 'rmqstore COMMAND --help' for each command's options and an example.",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    p.add_argument("--version", action=_VersionAction, help="show the program's version number and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=help_)
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        cmd = sub.add_parser(name, help=help_, description=getattr(mod, "DESCRIPTION", None) or plain_doc(mod.__doc__),
                             epilog=getattr(mod, "EXAMPLE", None), formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(cmd)
        cmd.set_defaults(func=mod.run_args)
    return p


def describe_error(e: BaseException) -> str:
    """One line for an OS or value error, without Python's class names: ``PATH: what went wrong``."""
    if isinstance(e, OSError) and e.strerror:
        where = e.filename if e.filename is not None else "<store>"
        return f"{where}: {e.strerror.lower()}" + (f" (and {e.filename2})" if e.filename2 else "")
    return str(e).splitlines()[0] if str(e) else "invalid input"


def _command_of(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (its first word that is not an option: the global options take no
    value), or None (help, version, a typo: the whole parser answers)."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in HELP else None


_READING = ("info", "timers", "expiry", "get", "recover", "messages")  # (messages: its scan skips such a
# segment itself; what it reads before its output starts is read again)


def _reads_only(args: argparse.Namespace) -> bool:
    """Does the command only read the store, its output written once its reads are done?"""
    if args.command == "recover":  # --plan only (the default mode)
        return not (args.apply or args.restore or args.salvage)
    return args.command in _READING


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(_command_of(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if _reads_only(args):  # a file the broker's cleaner deletes under the run: read again (jobs.liveread)
            from jobs.liveread import run_reading

            return int(run_reading(args, args.func) or 0)
        return int(args.func(args) or 0)
    except StoreError as e:
        if args.debug:
            raise
        print(f"rmqstore {args.command}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `rmqstore messages ... | head`
        return 0
    except (OSError, ValueError) as e:
        if args.debug:
            raise
        print(f"rmqstore {args.command}: {describe_error(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rmqstore {args.command}: interrupted", file=sys.stderr)
        return 130


def console_main(argv: list[str] | None = None) -> int:
    """The ``rmqstore`` script: :func:`main` in a process of its own, which never needs pandas
    (:mod:`jobs.engines.nopandas`: ``rmqstore info`` of a small store in 0.33 s instead of 0.54 s)."""
    from jobs.engines.nopandas import hide_pandas

    hide_pandas()
    return main(argv)


if __name__ == "__main__":
    sys.exit(console_main())
