"""Reading commands on a store whose broker runs: a commitlog segment, consume-queue or index file that the
broker's cleaner deletes after the run listed it (4.9.8 ``DefaultMessageStore.java:1674-1706``,
``:1872-1896``, ``index/IndexService.java:90-120``: whole files, oldest first, an unlink) expired during
the run. The command says so once and reads the store again from a fresh cut, where the file is no longer
listed (a run's output is written only once its reads are done: nothing is printed twice). ``messages``,
which streams its output, has its scan skip such a segment instead
(:meth:`storelib.scan.commitlog.CommitLog.scan`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable

from storelib.errors import StoreError

RETRIES = 3  # runs redone in a row before the cleaner is said to delete faster than the command reads
_FOLDERS = ("commitlog", "consumequeue", "index")


def vanished_file(e: BaseException, root: str) -> str | None:
    """The store file (under ``root``'s commitlog/, consumequeue/ or index/) that ``e`` could not read
    because it no longer exists, relative to ``root``; else None."""
    path = e.file if isinstance(e, StoreError) else e.filename if isinstance(e, OSError) else None
    if not isinstance(path, str) or not path:
        return None
    full = path if os.path.isabs(path) else os.path.join(root, path)
    rel = os.path.relpath(os.path.realpath(full), os.path.realpath(root))
    if rel.startswith("..") or rel.split(os.sep, 1)[0] not in _FOLDERS or os.path.exists(full):
        return None
    missing = isinstance(e, FileNotFoundError) or "No such file" in str(e) or "not found" in str(e).lower()
    return rel.replace(os.sep, "/") if missing else None


def is_live(root: str) -> bool:
    """Does a broker run the store (its lock held, or a 5.x abort naming a live pid)?"""
    from storelib.broker.settings.livecut import live_broker
    from storelib.fileio.bytesource import resolve

    try:
        return live_broker(resolve(root)) is not None
    except (OSError, StoreError):
        return False


def run_reading(args: argparse.Namespace, func: Callable[[argparse.Namespace], int]) -> int:
    """``func(args)``, read again from a fresh cut when the cleaner deleted a file it listed (a local
    store a broker runs); the file is named once on stderr."""
    root = getattr(args, "store", None)
    if not isinstance(root, str) or not os.path.isdir(root):
        return func(args)
    gone: list[str] = []
    for _ in range(RETRIES):
        try:
            return func(args)
        except (StoreError, OSError) as e:
            name = vanished_file(e, root)
            if name is None or not is_live(root):
                raise
            gone.append(name)
            print(f"rmqstore {args.command}: {name} expired during the run (the broker's cleaner deleted it after "
                  "this run listed it): reading the store again from a fresh cut", file=sys.stderr)
    raise StoreError(root, None, "expired", f"files kept expiring under {RETRIES} runs in a row "
                     f"({', '.join(gone)}): the cleaner deletes faster than this command reads")


def read_budget(eng, rate: float | None) -> tuple[float | None, str | None]:
    """``--max-read-rate`` for a run's readers: (bytes a second, the budget file they share). The local and
    pool engines' workers are processes on this host: they pace through one file, so the run keeps to
    ``rate`` however many read at once; Spark executors (other hosts) each keep an even share of it."""
    if not rate:
        return None, None
    if eng.name in ("local", "pool"):
        import tempfile

        from storelib.fileio.pagecare import shared_budget

        return rate, shared_budget(tempfile.gettempdir())
    return rate / max(1, eng.parallelism), None


def drop_budget(budget: tuple[float | None, str | None]) -> None:
    """Remove a run's budget file (:func:`read_budget`)."""
    if budget[1] is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(budget[1])


__all__ = ["drop_budget", "is_live", "read_budget", "run_reading", "vanished_file"]
