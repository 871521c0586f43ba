"""The index files' share of the partitioned cross-file phase on the driver: list the files and read their
headers (:func:`index_plan`: each file's task is told which keys its entries should be), then merge the
tasks' answers into the whole view's findings, in its order (:func:`merge_index`), scheduling the
lookups and the key coverage only when some file's entries are not its keys."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.checks.index import _abnormal_start_note, _index_open_error, add_validate_findings
from storelib.checks.keystream import behind_finding
from storelib.checks.segment import _Capped
from storelib.checks.tasks.context import CrossContext
from storelib.checks.tasks.indextask import CoverageTask, IndexFileTask, IndexLookupTask
from storelib.errors import Finding, StoreError
from storelib.format.checkpoint import Checkpoint
from storelib.format.indexdir import IndexFileRef, list_index_files
from storelib.format.indexfile import IndexGeometry, IndexHeader


@dataclass
class IndexEntry:
    """One listed index file: its header (None: it could not be opened, ``err`` says why)."""

    ref: IndexFileRef
    header: IndexHeader | None
    err: Finding | None
    entries: int = 0
    key_lo: int = 0  # the first key its entries should be, when every earlier file held its own


@dataclass
class IndexPlan:
    """The index files, what each task checks, and what the merge needs of the store."""

    findings: list[Finding]  # the listing's and the size notes, in the whole view's order
    files: list[IndexEntry]
    idx_ts: int | None  # the checkpoint's indexMsgTimestamp
    abort: bool
    key_starts: np.ndarray  # each part's first key's number in the log's key order (and the total last)
    file_tasks: list[IndexFileTask] = field(default_factory=list)
    looked: list[int] = field(default_factory=list)  # files looked up entry by entry (filled by the merge)
    results: list[dict] = field(default_factory=list)  # the file tasks' (filled by the merge)

    @property
    def n_keys(self) -> int:
        return int(self.key_starts[-1])


def index_plan(ctx: CrossContext, settings: BrokerSettings, cp: Checkpoint | None, abort: bool) -> IndexPlan:
    """Each index file's header read (no entry) and its task: which keys its entries should be."""
    root = ctx.root()
    found: list[Finding] = []
    refs = list_index_files(root, found)
    g = IndexGeometry(settings.max_hash_slot_num, settings.max_index_num)
    starts = np.r_[0, np.cumsum([p.n_keys for p in ctx.parts], dtype=np.int64)]
    plan = IndexPlan(found, [], cp.index_msg_timestamp if cp is not None else None, abort, starts)
    c = 0
    for ref in refs:
        note = ref.size_finding(g)
        if note is not None:
            found.append(note)
        try:
            f = ref.open(g, strict=False, broker_size=True)
        except StoreError as e:
            plan.files.append(IndexEntry(ref, None, _index_open_error(f"index/{ref.name}", e)))
            continue
        try:
            e = IndexEntry(ref, f.header, None, f.index_count - 1, c)
        finally:
            f.close()
        plan.files.append(e)
        # its keys, and the key after them (where a healthy index's unindexed keys begin)
        keys = key_slices(starts, c, min(c + e.entries + 1, plan.n_keys)) if c + e.entries <= plan.n_keys else ()
        plan.file_tasks.append(IndexFileTask(len(plan.file_tasks), ref.name, ref.size, c, e.entries, keys))
        c += e.entries
    return plan


def key_slices(starts: np.ndarray, a: int, b: int) -> tuple[tuple[int, int, int], ...]:
    """Keys ``a`` .. ``b`` of the log as (part, first row, end row) of the parts' key tables."""
    out = []
    if b <= a:
        return ()
    i = int(np.searchsorted(starts, a, side="right")) - 1
    while a < b and i < len(starts) - 1:
        lo, hi = int(starts[i]), int(starts[i + 1])
        if hi > a:
            out.append((i, a - lo, min(b, hi) - lo))
            a = min(b, hi)
        i += 1
    return tuple(out)


Run = Callable[[Callable[[Any], Any], list, str], list]


def merge_index(ctx: CrossContext, settings: BrokerSettings, plan: IndexPlan, results: list[dict], run: Run
                ) -> tuple[_Capped, dict]:
    """The index findings and the report's index summary from the file tasks' results (scheduling the
    lookups and coverage that damaged files need)."""
    from storelib.checks.tasks.crossplan import run_item

    out = _Capped()
    out.extend(plan.findings)
    plan.results = results
    info: dict[str, Any] = {"files": []}
    if not plan.files:
        return out, info
    opened = [e for e in plan.files if e.err is None]
    # the whole view matches files to the keys in order until one is not its keys; from there on (and with
    # a misplaced record anywhere, from the first file) it looks every entry up
    j = 0 if ctx.misplaced else next((k for k, r in enumerate(results) if not r["matched"]), len(results))
    plan.looked = list(range(j, len(opened)))
    looked = {}
    if plan.looked:
        tasks = [IndexLookupTask(k, opened[k].ref.name, opened[k].ref.size) for k in plan.looked]
        looked = {r["pos"]: r for r in run(partial(run_item, ctx), tasks, "audit: index lookups")}
    max_end_phy = max((r["max_phy"] for r in results), default=-1)
    k = 0
    for e in plan.files:
        if e.err is not None:
            out.add(e.err)
            continue
        h, r, display = e.header, results[k], f"index/{e.ref.name}"
        info["files"].append({"name": e.ref.name, "entries": e.entries, "begin_ts": h.begin_timestamp,
                              "end_ts": h.end_timestamp, "begin_phy": h.begin_phy_offset, "end_phy": h.end_phy_offset})
        _abnormal_start_note(info, out, e.ref.name, h, plan.idx_ts, plan.abort)
        lk = looked.get(k)
        if lk is not None:
            out.replay_json(lk["found"])
        out.replay_json((lk or r)["chains"])
        add_validate_findings([Finding.from_dict(d) for d in r["validate"]], bool(lk and lk["wrong"]), display, out)
        k += 1
    matched_keys = sum(e.entries for e in opened[:j])
    if settings.message_index_enable and plan.n_keys and not (not looked and matched_keys == plan.n_keys):
        _keys_findable(ctx, plan, info, looked, matched_keys, max_end_phy, out, run)
    info["max_end_phy"] = max_end_phy
    return out, info


def _keys_findable(ctx: CrossContext, plan: IndexPlan, info: dict, looked: dict[int, dict], matched_keys: int,
                   max_end_phy: int, out: _Capped, run: Run) -> None:
    """Keys after the files matched in order that no looked-up entry finds: not indexed yet, or missing
    (the whole view's classification, per commitlog segment)."""
    from storelib.checks.tasks.crossplan import run_item

    n = plan.n_keys
    after = plan_next_key(plan, looked)
    if after is not None and after > max_end_phy:
        out.add(behind_finding(n - matched_keys, max_end_phy))  # after every indexed message: all behind
        return
    pairs: dict[int, list] = {}
    wrong: dict[int, list] = {}
    for r in looked.values():
        for base, ref in r["pairs"].items():
            pairs.setdefault(base, []).append(ref)
        for base, ref in r["wrong_phy"].items():
            wrong.setdefault(base, []).append(ref)
    by_seg: dict[int, list[tuple[int, int, int]]] = {}
    for i, lo, hi in key_slices(plan.key_starts, matched_keys, n):
        by_seg.setdefault(ctx.parts[i].base, []).append((i, lo, hi))
    first_begin = min((fi["begin_phy"] for fi in info["files"]), default=0)
    tasks = [CoverageTask(base, tuple(ks), tuple(pairs.get(base, ())), tuple(wrong.get(base, ())), max_end_phy,
                          first_begin) for base, ks in sorted(by_seg.items())]
    done = run(partial(run_item, ctx), tasks, "audit: index key coverage") if tasks else []
    behind = sum(d["behind"] for d in done)
    if behind:
        out.add(behind_finding(behind, max_end_phy))
    for d in done:
        out.replay_json(d["found"])


def plan_next_key(plan: IndexPlan, looked: dict[int, dict]) -> int | None:
    """The position of the first key no file matched, when every file matched its keys (the last file's
    task read it); None otherwise (the coverage tasks classify the keys)."""
    if looked or not plan.file_tasks:
        return None
    return plan.results[-1].get("next_key")
