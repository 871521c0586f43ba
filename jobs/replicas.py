"""Replica groups compared on any engine, one group (``rmqstore replicas``) or many (a spark-submit job).

    spark-submit --properties-file spark-conf/spark-defaults.conf jobs/replicas.py --groups groups.txt \\
        --out reports/ [--mode auto|classic|controller]

``groups.txt``: one group a line, ``NAME STORE STORE [STORE...]`` (``#`` starts a comment); or
``--dump-root ROOT``: every directory under ROOT is a group, every directory in it one of its stores (a
cluster dump laid out as ``ROOT/<brokerName>/<node>/``). The comparison's steps run across all groups at
once: the stores' facts, then the byte blocks' CRCs, then the scans of what not every replica holds, each a
single ``map`` on the engine (storelib.broker.replicas.group's tasks); the driver compares. A group whose
store cannot be read gets an error entry and the others go on. ``--out`` gets ``<group>.json``,
``<group>.html`` and ``summary.json``. Exit code: 0 when every group is consistent, 1 when one diverged,
2 when one could not be compared.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

if __package__ in (None, ""):  # spark-submit jobs/replicas.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.engines.schedulers import Engine, add_engine_args, make_engine, resolve_engine_name
from storelib.broker.replicas.facts import StoreSpec, store_facts
from storelib.broker.replicas.group import MODES, GroupComparison
from storelib.broker.replicas.holdings import hold_task
from storelib.broker.replicas.ranges import DEFAULT_BLOCK, block_crcs
from storelib.errors import StoreError

EXIT_OK, EXIT_DIVERGED, EXIT_FAILED = 0, 1, 2


class Group(NamedTuple):
    name: str
    specs: list[StoreSpec]


def guarded(fn, item) -> tuple[str, Any]:
    """Run one task; a store that cannot be read becomes ("error", its one line) instead of failing the job."""
    try:
        return "ok", fn(item)
    except (StoreError, OSError, ValueError) as e:
        return "error", str(e).splitlines()[0] if str(e) else type(e).__name__


def _route(items: list, outs: list[tuple[str, Any]], gi_of, comps: dict[int, GroupComparison],
           errors: dict[int, str]) -> dict[int, list]:
    by_group: dict[int, list] = {}
    for it, (status, value) in zip(items, outs):
        gi = gi_of(it)
        if status == "error":
            errors.setdefault(gi, value)
            comps.pop(gi, None)
        else:
            by_group.setdefault(gi, []).append(value)
    return by_group


def run_groups(groups: list[Group], engine: Engine, *, mode: str = "auto", block: int = DEFAULT_BLOCK,
               say=None, after=None) -> list[dict[str, Any]]:
    """Every group compared, its tasks run on ``engine`` (one ``map`` per step over all groups); one result
    a group, in order: the report dict, or ``{"group", "error"}``. ``after(result, comparison)`` runs for
    each group compared, before its comparison is closed (the salvage reads its intervals)."""
    say = _throttled(say) if say is not None else None
    items = [(gi, spec) for gi, g in enumerate(groups) for spec in g.specs]
    outs = engine.map(partial(guarded, _facts), items, "replicas: stores", say)
    errors: dict[int, str] = {}
    facts: dict[int, list] = {}
    for (gi, spec), (status, value) in zip(items, outs):
        if status == "error":
            errors.setdefault(gi, f"{spec.name}: {value}")
        else:
            facts.setdefault(gi, []).append(value)
    comps: dict[int, GroupComparison] = {}
    for gi, g in enumerate(groups):
        if gi in errors:
            continue
        try:
            comps[gi] = GroupComparison(facts[gi], g.specs, mode=mode, block=block, tag=(gi,))
        except StoreError as e:
            errors[gi] = str(e)
    try:
        tasks = [t for c in comps.values() for t in c.block_tasks()]
        blocks = _route(tasks, engine.map(partial(guarded, block_crcs), tasks, "replicas: block CRCs", say),
                        lambda t: t.key[0], comps, errors)
        _step(comps, errors, lambda gi, c: c.take_blocks(blocks.get(gi, [])))
        tasks = [t for c in comps.values() for t in c.hold_tasks()]
        holds = _route(tasks, engine.map(partial(guarded, hold_task), tasks, "replicas: scans", say),
                       lambda t: t.key[0], comps, errors)
        _step(comps, errors, lambda gi, c: c.take_holdings(holds.get(gi, [])))
        out = []
        for gi, g in enumerate(groups):
            if gi in comps:
                try:
                    res = {"group": g.name, **comps[gi].result()}
                    if after is not None:
                        after(res, comps[gi])
                    out.append(res)
                    continue
                except StoreError as e:
                    errors[gi] = str(e)
            out.append({"group": g.name, "error": errors.get(gi, "not compared")})
        return out
    finally:
        for c in comps.values():
            c.close()


def _throttled(say, every: float = 2.0):
    """Progress lines at most every ``every`` seconds, and each step's last one (the local engine reports every
    task)."""
    import time

    last = [0.0]

    def out(text: str) -> None:
        done, _, total = text.rpartition(": ")[2].partition(" done")[0].partition("/")
        now = time.monotonic()
        if done == total or now - last[0] >= every:
            last[0] = now
            say(text)

    return out


def _file_name(group: str) -> str:
    """A group's name as one file name (a name from a groups file is untrusted)."""
    s = "".join(c if c.isalnum() or c in "-_." else "_" for c in group).strip(".")
    return s[:100] or "group"


def _facts(item: tuple[int, StoreSpec]):
    return store_facts(item[1])


def _step(comps: dict[int, GroupComparison], errors: dict[int, str], fn) -> None:
    for gi in list(comps):
        try:
            fn(gi, comps[gi])
        except StoreError as e:
            errors[gi] = str(e)
            comps.pop(gi).close()


def exit_code(results: list[dict[str, Any]]) -> int:
    """2 when a group could not be compared, else 1 when one diverged, else 0."""
    if any("error" in r for r in results):
        return EXIT_FAILED
    return EXIT_DIVERGED if any(not r["consistent"] for r in results) else EXIT_OK


def engine_for(args: argparse.Namespace, stores: int) -> Engine:
    """The engine the command line asks for (``auto``: the pool for more than a few stores)."""
    name = resolve_engine_name(args.engine, master=args.master, tasks=stores if stores > 2 else 0)
    return make_engine(name, master=args.master, workers=args.workers, app_name="rmqstore-replicas")


def specs_for(names: list[str], uris: list[str], args: argparse.Namespace,
              nodes: list[str] | None = None) -> list[StoreSpec]:
    """Each store's settings from the shared options and its own files (segment size, broker line, DLedger
    node); ``nodes``: each store's DLedger node id (a root holding several nodes' folders)."""
    from jobs.common import fs_options, settings_from_args
    from storelib.fileio.bytesource import resolve

    fs = fs_options(args)
    out = []
    for k, (n, u) in enumerate(zip(names, uris)):
        a = argparse.Namespace(**{**vars(args), "dledger_self_id": nodes[k]}) if nodes else args
        out.append(StoreSpec(n, u, settings_from_args(a, resolve(u, **fs)), fs))
    return out


def read_groups(args: argparse.Namespace) -> list[Group]:
    """Groups from ``--groups FILE`` and/or ``--dump-root ROOT``."""
    raw: list[tuple[str, list[str]]] = []
    if args.groups:
        with open(args.groups, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                words = line.split("#", 1)[0].split()
                if not words:
                    continue
                if len(words) < 3:
                    raise StoreError(args.groups, n, "bad_argument", "a group line is NAME STORE STORE [STORE...]")
                raw.append((words[0], words[1:]))
    if args.dump_root:
        root = args.dump_root
        for g in sorted(os.listdir(root)):
            d = os.path.join(root, g)
            stores = sorted(os.path.join(d, s) for s in os.listdir(d) if os.path.isdir(os.path.join(d, s))) \
                if os.path.isdir(d) else []
            if len(stores) >= 2:
                raw.append((g, stores))
    if not raw:
        raise StoreError(None, None, "bad_argument", "no groups: give --groups FILE or --dump-root ROOT")
    return [Group(name, specs_for([os.path.basename(u.rstrip("/")) or u for u in uris], uris, args))
            for name, uris in raw]


def build_parser() -> argparse.ArgumentParser:
    from jobs.common import add_fs_args, add_settings_args, size_arg

    p = argparse.ArgumentParser(prog="replicas.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", metavar="FILE", help="one group a line: NAME STORE STORE [STORE...]")
    p.add_argument("--dump-root", metavar="ROOT", help="ROOT/<group>/<store>/ directories (local)")
    p.add_argument("--out", metavar="DIR", required=True, help="where <group>.json, <group>.html and summary.json go")
    p.add_argument("--mode", choices=MODES, default="auto")
    p.add_argument("--block", type=size_arg, default=DEFAULT_BLOCK, help="CRC block size (default 1 MiB)")
    add_settings_args(p)
    add_fs_args(p)
    add_engine_args(p, "comparison", pool_when="more than two stores")
    return p


def main(argv: list[str] | None = None) -> int:
    from jobs.common import Stage
    from jobs.reports.replicas_report import summary_row, write_reports
    from storelib.fileio.smallfile_io import atomic_write_json

    args = build_parser().parse_args(argv)
    try:
        groups = read_groups(args)
    except (StoreError, OSError) as e:
        print(f"replicas: {e}", file=sys.stderr)
        return EXIT_FAILED
    stage = Stage("replicas")
    engine = engine_for(args, sum(len(g.specs) for g in groups))
    try:
        results = run_groups(groups, engine, mode=args.mode, block=args.block, say=stage)
    finally:
        engine.close()
    os.makedirs(args.out, exist_ok=True)
    for r in results:
        if "error" not in r:
            write_reports(r, os.path.join(args.out, _file_name(r["group"])))
    atomic_write_json(os.path.join(args.out, "summary.json"), {"groups": [summary_row(r) for r in results]})
    for r in results:
        stage(f"{r['group']}: " + (r["error"] if "error" in r else
                                   ("consistent" if r["consistent"] else f"diverged at {r['diverged_at']}")))
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
