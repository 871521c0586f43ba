"""Shared plumbing for the ``rmqstore`` subcommands: opening stores, output, progress."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

from storelib.broker.settings.store import Store, load_settings
from storelib.errors import StoreError
from storelib.fileio.bytesource import resolve


def plain_doc(doc: str | None) -> str:
    """A module docstring as --help text: without its ````rmqstore X````: lead and reST markup."""
    import re

    text = re.sub(r"^``rmqstore \w+``:\s*", "", doc or "")
    text = text.replace("``", "")
    return text[:1].upper() + text[1:]


def add_store_args(p: argparse.ArgumentParser, store: bool = True) -> None:
    """STORE plus the options every command that opens a store accepts."""
    if store:
        p.add_argument("store", metavar="STORE", help="store root: a local path or a URI (s3://bucket/prefix, ...)")
    add_settings_args(p)
    add_fs_args(p)


def add_settings_args(p: argparse.ArgumentParser, conf: bool = True, line: bool = True) -> None:
    """--broker-conf, --broker-version and --set: where the broker's store settings come from."""
    if conf:
        p.add_argument("--broker-conf", metavar="F", help="broker.conf with the store's settings (defaults otherwise)")
    if line:
        p.add_argument("--broker-version", choices=["4", "5", "auto"], default="auto",
                       help="whose rules apply: 4 = RocketMQ 4.9.x, 5 = 5.x; auto (default) detects the line from "
                            "broker.conf keys only 5.x has, then the store (V2 records, __CRC32# property, 5.x-only "
                            "files), else 4; `rmqstore info` shows what was detected and why")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], dest="set",
                   help="override one broker setting, e.g. --set mappedFileSizeCommitLog=524288 (repeatable)")
    p.add_argument("--dledger-self-id", metavar="ID",
                   help="DLedger mode: read node ID's files (dledger-ID/), needed when the root holds several nodes' "
                        "folders; the same as --set dLegerSelfId=ID")


def add_fs_args(p: argparse.ArgumentParser) -> None:
    """Filesystem options for remote stores."""
    p.add_argument("--s3-endpoint", metavar="URL",
                   help="S3-compatible endpoint (e.g. http://127.0.0.1:9000; default: AWS_ENDPOINT_URL or AWS). "
                        "Credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY[/AWS_SESSION_TOKEN] or ~/.aws")
    p.add_argument("--s3-region", metavar="R", help="S3 region (default: AWS_REGION / AWS_DEFAULT_REGION)")


def fs_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    ep = getattr(args, "s3_endpoint", None)
    if ep:
        scheme, _, host = ep.partition("://")
        opts["endpoint_override"] = host or scheme
        opts["scheme"] = scheme if host else "https"
    if getattr(args, "s3_region", None):
        opts["region"] = args.s3_region
    return opts


def size_arg(text: str) -> int:
    """argparse type: a size with or without a unit (``2GB``, ``512k``, ``1048576``; storelib.units)."""
    from storelib.units import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def rate_arg(text: str) -> float:
    """argparse type: a read rate in MB/s (``50``, ``12.5``) or a size a second (``50MB``, ``1GB/s``) as bytes a
    second (binary units, storelib.units)."""
    from storelib.units import parse_size

    t = str(text).strip().removesuffix("/s")
    try:
        v = float(t) * (1 << 20) if re.fullmatch(r"\d+(\.\d+)?", t) else float(parse_size(t))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"a read rate must be positive, got {text!r}")
    return v


def add_live_args(p: argparse.ArgumentParser, *, lag: bool = False) -> None:
    """The options of a reading command that may run beside a live broker (docs/scheduling.md)."""
    p.add_argument("--expect-stopped", action="store_true",
                   help="a broker running the store (its lock held) is an error: the check before a recovery")
    p.add_argument("--max-read-rate", type=rate_arg, metavar="MB/S",
                   help="read the commitlog at most this fast, for the whole run across workers (MB/s, or e.g. "
                        "64MB); for runs beside a live broker")
    if lag:
        p.add_argument("--max-lag", type=size_arg, metavar="SIZE", default=None,
                       help="a live store's dispatch lag (commitlog bytes written but not in the consume queues "
                            "yet) above this is a warning; below, info (default 256MB)")


def time_arg(text: str) -> int:
    """argparse type: ISO-8601 (UTC unless it says otherwise) or epoch milliseconds, as epoch ms."""
    from storelib.units import parse_time_ms

    try:
        return parse_time_ms(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (``--limit -1`` is a mistake, not "no limit")."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


def overrides(args: argparse.Namespace) -> dict[str, str]:
    """``--set KEY=VALUE`` options as a dict (a malformed one is a one-line error)."""
    out: dict[str, str] = {}
    for item in getattr(args, "set", None) or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise StoreError(None, None, "bad_argument", f"--set needs KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    if getattr(args, "dledger_self_id", None):
        out["dLegerSelfId"] = args.dledger_self_id
    return out


def settings_from_args(args: argparse.Namespace, root=None, version: str | None = None):
    """Broker settings from --broker-conf, --broker-version and --set (storelib.broker.settings.store.load_settings).

    ``version`` applies when the command has no --broker-version (or it says auto): None detects."""
    v = getattr(args, "broker_version", None)
    v = version if v in (None, "auto") else v
    settings = load_settings(getattr(args, "broker_conf", None), v, overrides(args), root)
    for f in settings.conf_findings:  # a typo in broker.conf is silent in the broker: not here
        print(f"rmqstore: {f}", file=sys.stderr)
    return settings


def open_store(args: argparse.Namespace, version: str | None = None, *, cut: bool = True) -> Store:
    """The STORE argument opened with its settings; with ``cut``, read as at the run's cut (a store a broker
    is writing: up to one consistent moment, said once on stderr; storelib.broker.settings.livecut)."""
    loc = resolve(args.store, **fs_options(args))
    store = Store(loc, settings_from_args(args, loc, version), uri=args.store)
    if cut:
        c = store.take_cut()
        if c.live:
            if getattr(args, "expect_stopped", False):
                raise StoreError("lock", 0, "broker_running", f"--expect-stopped: {c.describe()} ({c.broker.evidence})")
            if not getattr(args, "quiet", False):
                print(f"rmqstore: {c.describe()}" + (f" ({c.tail})" if c.tail else ""), file=sys.stderr)
    return store


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, ensure_ascii=False, default=str)
    sys.stdout.write("\n")


def human_ms(ms: int | None) -> str:
    """Epoch milliseconds as UTC text (``-`` for 0/None)."""
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def print_table(rows: list[dict[str, Any]], columns: list[str], out=None) -> None:
    """A plain aligned text table."""
    out = out or sys.stdout
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    out.write("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip() + "\n")
    for row in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() + "\n")


def name_unread(command: str, findings: list) -> None:
    """Say on stderr, whatever ``--quiet`` says, which commitlog bytes are not messages (random bytes, a
    segment overwritten, a record no reader can take): one line each, so no command passes them silently."""
    from storelib.broker.settings.storeroot import UNREAD_KINDS

    named = set()
    for f in findings:
        if f.kind in UNREAD_KINDS and (f.file, f.offset) not in named:  # one line a place, the first saying
            named.add((f.file, f.offset))
            sys.stderr.write(f"rmqstore {command}: {f.file} @ {f.offset}: {f.kind}: {f.detail}\n")


def note(msg: str, quiet: bool = False) -> None:
    """A progress line on stderr, flushed at once (a scheduler's log shows it as it happens); none when quiet."""
    if not quiet:
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()


class Stage:
    """Timed stage lines of a job on stderr (``rebuild [    1.2s] phase A: ...``), flushed at once; none
    when not ``enabled``. Called with the text, as the engines' ``say``."""

    def __init__(self, job: str, enabled: bool = True):
        self.job, self.enabled, self.t0 = job, enabled, time.monotonic()

    def __call__(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(f"{self.job} [{time.monotonic() - self.t0:7.1f}s] {text}\n")
            sys.stderr.flush()


class Progress:
    """Progress lines on stderr (only when stderr is a terminal, or when forced)."""

    def __init__(self, label: str, total: int | None = None, force: bool = False):
        self.label, self.total, self.done = label, total, 0
        self.enabled = force or sys.stderr.isatty()
        self._last = 0.0

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.5 or (self.total and self.done >= self.total)):
            self._last = now
            tot = f"/{self.total}" if self.total else ""
            sys.stderr.write(f"\r{self.label}: {self.done}{tot} {note}".ljust(70))
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
