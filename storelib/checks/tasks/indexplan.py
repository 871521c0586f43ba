"""The index files' share of the partitioned cross-file phase on the driver: list the files and read their
headers (:func:`index_plan`: each file's task is told which keys its entries should be), then merge the
tasks' answers into the whole view's findings, in its order (:func:`merge_index`), scheduling the
lookups and the key coverage only when some file's entries are not its keys.

Going on from an earlier run (``--since``): a file it checked that holds as many entries is not checked
again (its entries' sampled CRCs are compared here: a few KB, no record), a grown one only on its new
entries, and the keys it left unindexed lead this run's keys."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.livecut import StoreCut
from storelib.broker.settings.strayload import version_of
from storelib.checks.index import (
    abnormal_start_note,
    add_validate_findings,
    carried_entries,
    expired_head,
    expired_index,
    index_gone,
    index_open_error,
    index_refs_at,
)
from storelib.checks.keystream import behind_finding, pending_table
from storelib.checks.logview import Unsettled
from storelib.checks.segment import Capped
from storelib.checks.tables import TableRef
from storelib.checks.tasks.context import CrossContext
from storelib.checks.tasks.indextask import (
    CoverageTask,
    IndexFileTask,
    IndexLookupTask,
    IndexStructureTask,
    KeySlices,
    KeysTailTask,
    file_info,
)
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location
from storelib.format.checkpoint import Checkpoint
from storelib.format.indexdir import IndexFileRef
from storelib.format.indexfile import IndexGeometry, IndexHeader


@dataclass
class IndexEntry:
    """One listed index file: its header (None: it could not be opened, ``err`` says why)."""

    ref: IndexFileRef
    header: IndexHeader | None
    err: Finding | None
    entries: int = 0
    task: int | None = None  # its task among the plan's ``file_tasks``
    carried: dict | None = None  # an earlier run's snapshot of it (unchanged: ``task`` None)


@dataclass
class IndexPlan:
    """The index files, what each task checks, and what the merge needs of the store."""

    findings: list[Finding]  # the listing's and the size notes, in the whole view's order
    files: list[IndexEntry]
    idx_ts: int | None  # the checkpoint's indexMsgTimestamp
    abort: bool
    sources: list[tuple[TableRef, int, int]]  # the key tables in key order: (table, keys, segment base)
    starts: np.ndarray  # each source's first key's number (and the total last)
    key_base: int = 0  # keys an earlier run matched before this run's first key
    file_tasks: list[IndexFileTask] = field(default_factory=list)
    tail: KeysTailTask | None = None  # the keys after the last file's, for a later run
    matched_to: int = 0  # this run's keys the files should hold (the rest are after the last file's)
    looked: list[int] = field(default_factory=list)  # files looked up entry by entry (filled by the merge)

    @property
    def n_keys(self) -> int:
        return int(self.starts[-1])


def index_structure_tasks(store_uri: str, root: Location, settings: BrokerSettings, fs_options: dict[str, Any],
                          snapshot: bool, cut: StoreCut | None, log_min: int) -> list[IndexStructureTask]:
    """A task per index file for what needs no record (its structure, chains, extent, its entries whose
    records expired): they run beside the segment tasks."""
    refs = index_refs_at(root, [], cut)
    return [IndexStructureTask(r.name, r.size, store_uri, fs_options, settings.max_hash_slot_num,
                               settings.max_index_num, k == len(refs) - 1, snapshot, r.at, log_min)
            for k, r in enumerate(refs)]


def index_plan(ctx: CrossContext, settings: BrokerSettings, cp: Checkpoint | None, abort: bool,
               carry: dict | None = None, structures: list[dict] | None = None) -> IndexPlan:
    """Each index file's header read (no entry) and its task: which keys its entries should be.
    ``carry``: an earlier run's index and key snapshots (raises Unsettled when they no longer hold);
    ``structures``: the files' :func:`index_structure_task` results (their tasks then only compare keys)."""
    checked = {r["name"]: r for r in structures or () if "err" not in r}
    root = ctx.root()
    found: list[Finding] = []
    refs = index_refs_at(root, found, ctx.cut, version_of(settings.version))
    live = ctx.cut is not None and ctx.cut.live
    g = IndexGeometry(settings.max_hash_slot_num, settings.max_index_num)
    sources = _key_sources(ctx, carry)
    plan = IndexPlan(found, [], cp.index_msg_timestamp if cp is not None else None, abort, sources,
                     np.r_[0, np.cumsum([n for _r, n, _b in sources], dtype=np.int64)],
                     carry["keys"]["cur"] if carry is not None else 0)
    carried = carry["index"] if carry is not None else {}
    if set(carried) - {ref.name for ref in refs}:
        raise Unsettled("an index file checked by an earlier run is gone")
    c = 0
    for k, ref in enumerate(refs):
        note = ref.size_finding(g)
        if note is not None:
            found.append(note)
        try:
            f = ref.open(g, strict=False, broker_size=True)
        except StoreError as e:
            if index_gone(ref, live):
                found.extend(expired_index(ref))
                continue
            if carry is not None:
                raise Unsettled(f"index/{ref.name} cannot be opened") from e
            plan.files.append(IndexEntry(ref, None, index_open_error(f"index/{ref.name}", e)))
            continue
        try:
            e = IndexEntry(ref, f.header, None, f.index_count - 1, carried=carried.get(ref.name))
            if e.carried is not None and e.entries == e.carried["count"]:
                if c or plan.file_tasks:
                    raise Unsettled(f"index/{ref.name}: checked by an earlier run, after a file it did not")
                carried_entries(e.carried, f.entries_array(), f"index/{ref.name}")  # unchanged (raises)
                plan.files.append(e)
                continue
            st = checked.get(ref.name) if e.carried is None else None
            st = _skip_now(st, f, ctx.log_min) if st is not None and st["entries"] == e.entries else None
            gone = _grown_expired(e, f, ctx.log_min) if e.carried is not None else 0
            if e.carried is None and st is None:  # (no structure task ran: going on from a carry)
                gone = _expired_head(f, ctx.log_min)
        finally:
            f.close()
        if e.carried is not None and (e.entries < e.carried["count"] or "slots_crc" not in e.carried):
            raise Unsettled(f"index/{ref.name}: changed since an earlier run checked it")
        # entries to match: a grown file's new ones; a file's whose first records expired (the oldest
        # file outlives the segments its first entries point into), those after them, as the stream does
        skip = e.carried["count"] + gone if e.carried is not None else st["skip"] if st is not None else gone
        new = e.entries - skip
        keys = key_slices(plan, c, min(c + new + 1, plan.n_keys)) if c + new <= plan.n_keys else ()
        e.task = len(plan.file_tasks)
        plan.file_tasks.append(IndexFileTask(e.task, ref.name, ref.size, c, new, keys, e.carried,
                                             last=k == len(refs) - 1, structure=st,
                                             skip=skip if e.carried is None else gone, at=ref.at))
        plan.files.append(e)
        c += new
    plan.matched_to = c
    if ctx.snapshots:
        plan.tail = KeysTailTask(key_slices(plan, min(c, plan.n_keys), plan.n_keys))
    return plan


def _grown_expired(e: IndexEntry, f, log_min: int) -> int:
    """How many of a grown carried file's new entries lead with records below ``log_min``: keys an earlier
    run left unindexed that the broker indexed before the cleaner deleted their segment (they left the
    carry, :func:`storelib.checks.tasks.expire.expire_keys`)."""
    if e.entries <= e.carried["count"] or e.carried["max_phy"] >= log_min:
        return 0
    n = e.carried["count"]
    return expired_head(f.entries(n + 1, min(f.index_count, n + 1 + (1 << 20))), log_min)


def _skip_now(st: dict, f, log_min: int) -> dict:
    """A structure result whose expired leading entries were counted against an earlier first offset (the
    cleaner deleted segments during the run) counted again against ``log_min``."""
    if st.get("log_min", log_min) == log_min:
        return st
    return {**st, "skip": _expired_head(f, log_min), "log_min": log_min}


def _expired_head(f, log_min: int) -> int:
    """How many leading entries of the file point below ``log_min`` (read only when its header's first
    offset does)."""
    if f.header.begin_phy_offset >= log_min:
        return 0
    return expired_head(f.entries(1, min(f.index_count, (1 << 20) + 1)), log_min)


def _key_sources(ctx: CrossContext, carry: dict | None) -> list[tuple[TableRef, int, int]]:
    """The key tables of this run in key order: an earlier run's unindexed keys, then each part's."""
    out = []
    if carry is not None and carry["keys"]["phy"]:
        t = pending_table(carry["keys"])
        sink = ctx.table_sink()
        path = sink.write("pending.keys", t) if sink is not None else None
        out.append((TableRef(path, None if path else t), t.num_rows, -1))
    out += [(p.keys, p.n_keys, p.base) for p in ctx.parts]
    return out


def key_slices(plan: IndexPlan, a: int, b: int) -> KeySlices:
    """This run's keys ``a`` .. ``b`` as (table, first row, end row) of the key tables."""
    out = []
    starts = plan.starts
    if b <= a:
        return ()
    i = int(np.searchsorted(starts, a, side="right")) - 1
    while a < b and i < len(starts) - 1:
        lo, hi = int(starts[i]), int(starts[i + 1])
        if hi > a:
            out.append((plan.sources[i][0], a - lo, min(b, hi) - lo))
            a = min(b, hi)
        i += 1
    return tuple(out)


Run = Callable[[Callable[[Any], Any], list, str], list]


@dataclass
class IndexMerge:
    """What the index tasks add up to: their findings, the report's summary, the carry (``--since``)."""

    found: Capped
    info: dict[str, Any]
    carry: dict | None = None


def merge_index(ctx: CrossContext, settings: BrokerSettings, plan: IndexPlan, results: list[dict],
                tail: dict | None, run: Run, task_ctx: CrossContext | None = None) -> IndexMerge:
    """The index findings and the report's index summary from the file tasks' results (scheduling the
    lookups and coverage that damaged files need; raises Unsettled when going on from a carry cannot
    settle them)."""
    out = Capped()
    out.extend(plan.findings)
    res = IndexMerge(out, {"files": []})
    if not plan.files:
        return res
    resumed = plan.key_base or any(e.carried for e in plan.files)
    for r in results:
        if "unsettled" in r or (resumed and not r.get("matched", True)):
            raise Unsettled(r.get("unsettled", "an index file's new entries are not the records' keys in order"))
    # the whole view matches files to the keys in order until one is not its keys; from there on (and with
    # a misplaced record anywhere, from the first file) it looks every entry up
    j = 0 if ctx.misplaced else next((k for k, r in enumerate(results) if not r["matched"]), len(results))
    plan.looked = list(range(j, len(results)))
    tctx = task_ctx or ctx  # what the tasks are sent (:meth:`CrossContext.for_tasks`)
    looked = _lookups(tctx, plan, run)
    max_end_phy = max([*(r["max_phy"] for r in results), *(e.carried["max_phy"] for e in plan.files
                                                           if e.carried and e.task is None)], default=-1)
    snaps = _file_findings(plan, results, looked, out, res.info)
    # (a file's entries less those an earlier run matched or whose records expired: the keys it matched)
    matched = plan.key_base + sum(plan.file_tasks[e.task].entries for e in plan.files if e.task is not None and e.task < j)
    total = plan.key_base + plan.n_keys
    if settings.message_index_enable and total and not (not looked and matched == total):
        _keys_findable(tctx, plan, results, res.info, looked, matched, total, max_end_phy, out, tail, run)
    res.info["max_end_phy"] = max_end_phy
    if ctx.snapshots and not looked and len(snaps) == len(plan.files):
        res.carry = _carry(plan, snaps, matched, total, tail)
    return res


def _lookups(ctx: CrossContext, plan: IndexPlan, run: Run) -> dict[int, dict]:
    from storelib.checks.tasks.crossplan import run_item

    if not plan.looked:
        return {}
    tasks = [IndexLookupTask(k, plan.file_tasks[k].name, plan.file_tasks[k].size, plan.file_tasks[k].at)
             for k in plan.looked]
    return {r["pos"]: r for r in run(partial(run_item, ctx), tasks, "audit: index lookups")}


def _file_findings(plan: IndexPlan, results: list[dict], looked: dict[int, dict], out: Capped,
                   info: dict) -> dict[str, dict]:
    """Each file's findings in the whole view's order (its note, its entries', its chains', its
    structure's); returns the files' snapshots a later run goes on from (those the tasks made)."""
    snaps = {}
    for e in plan.files:
        if e.err is not None:
            out.add(e.err)
            continue
        display = f"index/{e.ref.name}"
        if e.task is None:  # unchanged since an earlier run checked it: what it found then
            info["files"].append(e.carried["info"])
            abnormal_start_note(info, out, e.ref.name, e.header, plan.idx_ts, plan.abort)
            out.replay_json(e.carried["found"])
            snaps[e.ref.name] = e.carried
            continue
        r = results[e.task]
        info["files"].append(r.get("info") or file_info(e.ref.name, e.header, e.entries))
        abnormal_start_note(info, out, e.ref.name, e.header, plan.idx_ts, plan.abort)
        lk = looked.get(e.task)
        if lk is not None:
            out.replay_json(lk["found"])
        out.replay_json((lk or r)["chains"])
        add_validate_findings([Finding.from_dict(d) for d in r["validate"]], bool(lk and lk["wrong"]), display, out)
        if r.get("snap") is not None:
            snaps[e.ref.name] = r["snap"]
    return snaps


def _carry(plan: IndexPlan, snaps: dict[str, dict], matched: int, total: int, tail: dict | None) -> dict | None:
    """What a later run goes on from: each file's snapshot and the keys after the last file's."""
    if not any(e.err is None for e in plan.files):
        return None
    if matched == total:
        keys = {"cur": total, "n": total, "phy": [], "hash": []}
    elif tail is None or tail.get("phy") is None:
        return None  # too many keys not indexed yet: the next run goes in full
    else:
        keys = {"cur": matched, "n": total, "phy": tail["phy"], "hash": tail["hash"]}
    return {"index": snaps, "keys": keys}


def _keys_findable(ctx: CrossContext, plan: IndexPlan, results: list[dict], info: dict, looked: dict[int, dict],
                   matched: int, total: int, max_end_phy: int, out: Capped, tail: dict | None, run: Run) -> None:
    """Keys after the files matched in order that no looked-up entry finds: not indexed yet, or missing
    (the whole view's classification, per commitlog segment)."""
    from storelib.checks.tasks.crossplan import run_item

    after = _next_key(plan, results, tail) if not looked else None
    live = ctx.cut is not None and ctx.cut.live  # the cut may fall between two keys of one record
    if after is not None and (after >= max_end_phy if live else after > max_end_phy) and not ctx.lost:
        # after every indexed message: all behind (with lost ranges, the reput may never read some of them:
        # the coverage tasks tell them apart, as the whole view does)
        out.add(behind_finding(total - matched, max_end_phy))
        return
    if plan.key_base or any(e.carried for e in plan.files):
        raise Unsettled("a key at or before the last indexed message is in no index file")
    pairs: dict[int, list] = {}
    wrong: dict[int, list] = {}
    for r in looked.values():
        for base, ref in r["pairs"].items():
            pairs.setdefault(base, []).append(ref)
        for base, ref in r["wrong_phy"].items():
            wrong.setdefault(base, []).append(ref)
    by_seg: dict[int, list[tuple[TableRef, int, int]]] = {}
    for ref, lo, hi in key_slices(plan, matched, total):
        base = next(b for r, _n, b in plan.sources if r is ref)
        by_seg.setdefault(base, []).append((ref, lo, hi))
    first_begin = min((fi["begin_phy"] for fi in info["files"]), default=0)
    tasks = [CoverageTask(base, tuple(ks), tuple(pairs.get(base, ())), tuple(wrong.get(base, ())), max_end_phy,
                          first_begin) for base, ks in sorted(by_seg.items())]
    done = run(partial(run_item, ctx), tasks, "audit: index key coverage") if tasks else []
    behind = sum(d["behind"] for d in done)
    if behind:
        out.add(behind_finding(behind, max_end_phy))
    for d in done:
        out.replay_json(d["found"])


def _next_key(plan: IndexPlan, results: list[dict], tail: dict | None) -> int | None:
    """The position of the first key no file matched, when every file matched its keys: read by the last
    file's task, or by the keys' tail task; None: unknown (the coverage tasks classify the keys)."""
    if tail is not None and tail.get("first") is not None:
        return tail["first"]
    if not plan.file_tasks:
        return None
    return results[-1].get("next_key") if results else None
