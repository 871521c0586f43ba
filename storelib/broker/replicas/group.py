"""One broker group's replicas compared: where they part, what each holds alone, what a rejoin cuts.

The comparison runs in steps so that any engine (and a job over many groups at once) can schedule the
heavy parts as tasks: ``facts`` (one task per store, :func:`storelib.broker.replicas.facts.store_facts`),
``block_tasks``/``take_blocks`` (CRCs of the byte blocks, then the first differing byte of each pair on
the driver), ``hold_tasks``/``take_holdings`` (the ranges not every store shares, scanned), ``result``.
:func:`compare_group` runs them all with a ``map`` (serial by default).

Offsets are physical offsets as ConsumeQueue units hold them: ``diverged_at`` is the offset of the first
message at which two of the stores hold different messages (the record holding the first differing
byte), ``truncated_at`` the offset of the first message a rejoin would drop (controller mode only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from storelib.broker.replicas.epochs import RejoinCut, newest, rejoin_cut
from storelib.broker.replicas.facts import StoreFacts, StoreSpec, is_boundary, store_facts
from storelib.broker.replicas.holdings import HoldTask, hold_task, merge, queue_extremes, summarise
from storelib.broker.replicas.metadata import compare_config, config_summary
from storelib.broker.replicas.ranges import (
    DEFAULT_BLOCK,
    BlockTask,
    Extent,
    block_crcs,
    divergence_record,
    pair_difference,
    segment_lengths,
)
from storelib.broker.settings.store import Store
from storelib.errors import Finding, StoreError
from storelib.format.dledger.entries import BODY_OFFSET
from storelib.scan.scanner import SegmentScan

SCHEMA = "rmqstore.replicas/1"
MODES = ("auto", "classic", "controller", "dledger")
Runner = Callable[[Callable[[Any], Any], list[Any]], list[Any]]


def serial(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """The default runner: every task in this process, in order."""
    return [fn(it) for it in items]


@dataclass(frozen=True)
class Pair:
    """Two stores compared: their overlap ``[lo, hi)``, the first differing byte ``first_difference`` (None:
    they agree on the overlap), and ``shared_until``: the end of the messages both hold (the record holding
    that byte, else ``hi``)."""

    a: int
    b: int
    lo: int
    hi: int
    first_difference: int | None
    shared_until: int

    @property
    def diverged(self) -> bool:
        return self.first_difference is not None

    def shared(self) -> tuple[int, int] | None:
        return (self.lo, self.shared_until) if self.lo < self.shared_until else None


class GroupComparison:
    """The steps of one group's comparison (see the module docstring); ``tag`` prefixes every task key."""

    def __init__(self, facts: list[StoreFacts], specs: list[StoreSpec], *, mode: str = "auto",
                 block: int = DEFAULT_BLOCK, tag: tuple = ()):
        if len(facts) < 2:
            raise StoreError(None, None, "bad_argument", "a replica comparison needs at least two stores")
        if mode not in MODES:
            raise StoreError(None, None, "bad_argument", f"mode must be one of {MODES}, not {mode!r}")
        kinds = {f.ledger is not None for f in facts}
        if len(kinds) > 1:
            raise StoreError(None, None, "bad_argument", "DLedger-mode stores and default-layout stores are not replicas "
                                                         "of one group: compare each kind on its own")
        self.dledger = kinds == {True}
        if mode not in ("auto", "dledger") and self.dledger or mode == "dledger" and not self.dledger:
            raise StoreError(None, None, "bad_argument", f"--mode {mode} does not fit these stores "
                                                         f"({'DLedger' if self.dledger else 'default'} layout)")
        self.facts, self.specs, self.block, self.tag = facts, specs, block, tag
        self.mode = mode if mode != "auto" else ("dledger" if self.dledger else
                                                  "controller" if any(f.epoch_present for f in facts) else "classic")
        self.head = BODY_OFFSET if self.dledger else 0  # offsets as ConsumeQueue counts them: DLedger entry pos + 48
        self.walks: list[dict[str, Any] | None] = [None] * len(facts)
        self.ext = [Extent(f.min_offset, f.end, f.segment_size, tuple(s.base for s in f.segments)) for f in facts]
        self.findings: list[Finding] = [_named(f, x.name) for x in facts for f in x.findings]
        self.pairs: list[Pair] = []
        self.cuts: list[RejoinCut | None] = [None] * len(facts)
        self.reference: int | None = None
        self.aggs: list[pa.Table] = []
        self._stores: dict[int, Store] = {}
        self._ivs: dict[int, list[dict[str, Any]]] = {}
        self._crcs: list[dict[int, np.ndarray]] = [{} for _ in facts]

    # -- driver reads --------------------------------------------------------------------------------
    def store(self, i: int) -> Store:
        if i not in self._stores:
            self._stores[i] = self.specs[i].open()
        return self._stores[i]

    def _reader(self, i: int):
        def read(phy: int, n: int) -> bytes:
            seg = self.store(i).commitlog.segment_for(phy)
            if seg is None:
                raise StoreError(self.facts[i].name, phy, "no_segment", f"no segment holds offset {phy}")
            with seg.open() as src:
                return bytes(src.read(phy - seg.base, n))
        return read

    def _starts(self, i: int):
        """Record starts and sizes (DLedger: entry starts and sizes) of a segment up to a byte."""
        def starts(seg_base: int, d: int) -> tuple[np.ndarray, np.ndarray]:
            cl = self.store(i).commitlog
            seg = cl.segment_for(d)
            first = "dledger_pos" if self.dledger else "phy_offset"
            with seg.open() as src:
                scan = SegmentScan(src, seg.display, seg.base, 0, d - seg.base + 1, verify_crc=False,
                                   with_properties=False, columns=[first, "size"], **cl.scan_options())
                batches = [b for b in scan if b.num_rows]
            if not batches:
                return np.empty(0, np.int64), np.empty(0, np.int64)
            return (np.concatenate([np.asarray(b.column(first)) for b in batches]),
                    np.concatenate([np.asarray(b.column("size")).astype(np.int64) for b in batches]) + self.head)
        return starts

    # -- step 2: byte blocks -----------------------------------------------------------------------
    def _overlaps(self) -> list[tuple[int, int, int, int]]:
        n = len(self.facts)
        return [(a, b, max(self.ext[a].min_offset, self.ext[b].min_offset), min(self.ext[a].end, self.ext[b].end))
                for a in range(n) for b in range(a + 1, n)]

    def block_tasks(self) -> list[BlockTask]:
        """One task per segment of each store that lies in its overlap with another store."""
        need: list[set[int]] = [set() for _ in self.facts]
        for a, b, lo, hi in self._overlaps():
            for base in range(lo - lo % self.ext[a].segment_size, hi, self.ext[a].segment_size):
                need[a].add(base)
                need[b].add(base)
        tasks = []
        for i, f in enumerate(self.facts):
            lengths = segment_lengths(self.ext[i])
            fs = self.specs[i].fs_options
            for seg in f.segments:
                if seg.base in need[i] and seg.base in lengths:
                    tasks.append(BlockTask((*self.tag, i, seg.base), seg.uri, seg.file_size, lengths[seg.base],
                                           self.block, fs))
        return tasks

    def take_blocks(self, results: list[tuple[tuple, np.ndarray]]) -> None:
        """The tasks' CRCs: compare every pair, find where each parts, then the controller-mode cuts."""
        k, h = len(self.tag), self.head
        for key, crcs in results:
            self._crcs[key[k]][key[k + 1]] = crcs
        for a, b, lo, hi in self._overlaps():
            if lo >= hi:
                self.pairs.append(Pair(a, b, lo + h, hi + h, None, lo + h))
                self.findings.append(Finding("no_overlap", "warning", None, None,
                                             f"{self.facts[a].name} and {self.facts[b].name} hold no common offsets "
                                             f"([{self.ext[a].min_offset}, {self.ext[a].end}) and "
                                             f"[{self.ext[b].min_offset}, {self.ext[b].end})): they cannot be compared"))
                continue
            d, lo, hi = pair_difference(self.ext[a], self._crcs[a], self._reader(a), self.ext[b], self._crcs[b],
                                        self._reader(b), self.block)
            if d is None:
                self.pairs.append(Pair(a, b, lo + h, hi + h, None, hi + h))
                continue
            seg_base = d - d % self.ext[a].segment_size
            r = divergence_record(self._starts(a), seg_base, d)
            self.pairs.append(Pair(a, b, lo + h, hi + h, d, r + h))
        self._crcs = [{} for _ in self.facts]
        if self.mode == "controller":
            self._controller_cuts()
        elif self.mode == "dledger":
            from storelib.broker.replicas.dledgergroup import dledger_cuts

            dledger_cuts(self)
        else:
            self._classic_notes()
        for i, f in enumerate(self.facts):
            self._store_notes(i, f)

    def pair(self, a: int, b: int) -> Pair:
        return next(p for p in self.pairs if {p.a, p.b} == {a, b})

    def _controller_cuts(self) -> None:
        """Each store rejoining the one with the newest epoch (AutoSwitchHAClient.doTruncate), checked
        against the bytes."""
        f = self.facts
        m = newest([x.epochs for x in f], [x.end for x in f])
        self.reference = m
        if m is None:
            self.findings.append(Finding("no_epochs", "warning", None, None, "controller mode, but no store has epochs: "
                                         "no rejoin would cut anything"))
            return
        for i, x in enumerate(f):
            if i == m:
                continue
            cut = rejoin_cut(x.epochs, x.end, f[m].epochs, f[m].end, lambda o, i=i: is_boundary(self.store(i), o))
            self.cuts[i] = cut
            p = self.pair(i, m)
            if cut.outcome in ("refused", "no_consistent_point"):
                self.findings.append(Finding(f"rejoin_{cut.outcome}", "error", f"{x.name}/epochFileCheckpoint", cut.point,
                                             f"rejoining {f[m].name}: {cut.detail}"))
            elif cut.outcome == "new_replica" and p.diverged:
                self.findings.append(Finding("rejoin_splice", "error", f"{x.name}/epochFileCheckpoint", p.shared_until,
                                             f"rejoining {f[m].name}: {cut.detail}, although the two part at "
                                             f"{p.shared_until}: its own messages stay and the master's bytes are "
                                             "appended after them"))
            point = cut.point
            if point is not None and p.diverged and point > p.shared_until:
                self.findings.append(Finding(
                    "stale_tail", "critical", f"{x.name}/commitlog", p.shared_until,
                    f"its epochs say it agrees with {f[m].name} up to {point}, but the bytes differ from "
                    f"{p.shared_until}: a rejoin keeps [{p.shared_until}, {min(point, x.end)}), which {f[m].name} does not "
                    "hold (a truncation that left the old tail valid on disk: apache/rocketmq#10666, or epoch files "
                    "that disagree)"))
            if cut.outcome == "cut" and point < p.shared_until:
                self.findings.append(Finding("rejoin_recopies", "info", f"{x.name}/commitlog", point,
                                             f"the cut at {point} drops [{point}, {p.shared_until}), which {f[m].name} "
                                             "also holds: it is copied again after the cut"))

    def _classic_notes(self) -> None:
        for p in self.pairs:
            if p.diverged:
                a, b = self.facts[p.a].name, self.facts[p.b].name
                self.findings.append(Finding(
                    "classic_no_truncation", "warning", None, p.shared_until,
                    f"{a} and {b} part at {p.shared_until}; classic HA never truncates: if either rejoins the other as "
                    "a slave, its own messages stay and the master's bytes are appended after them (a broken record "
                    "chain there). Save what only it holds (--salvage) before it rejoins."))

    # -- step 3: what is not shared, scanned ----------------------------------------------------------
    def _bounds(self, i: int) -> list[int]:
        x, h = self.ext[i], self.head
        cuts = [self.cuts[i].truncated_at] if self.cuts[i] is not None and self.cuts[i].truncated_at is not None else []
        pts = {x.min_offset + h, x.end + h, *cuts}
        for p in self.pairs:
            if i in (p.a, p.b) and p.shared():
                pts.update(p.shared())
        return sorted(v for v in pts if x.min_offset + h <= v <= x.end + h)

    def intervals(self, i: int) -> list[dict[str, Any]]:
        """Store ``i``'s data cut where what the others share with it changes: each interval's holders (the
        other stores that hold its messages) and whether a rejoin drops it."""
        if i not in self._ivs:
            self._ivs[i] = self._intervals(i)
        return self._ivs[i]

    def _intervals(self, i: int) -> list[dict[str, Any]]:
        b = self._bounds(i)
        cut = self.cuts[i].truncated_at if self.cuts[i] is not None else None
        shared = {(p.b if p.a == i else p.a): p.shared() for p in self.pairs if i in (p.a, p.b) and p.shared()}
        out = []
        for k in range(len(b) - 1):
            lo, hi = b[k], b[k + 1]
            holders = sorted(j for j, (s, e) in shared.items() if s <= lo and hi <= e)
            out.append({"index": k, "lo": lo, "hi": hi, "holders": holders, "dropped": cut is not None and lo >= cut})
        return out

    def hold_tasks(self) -> list[HoldTask]:
        """Scans of every interval that some other store lacks (or that a rejoin drops)."""
        tasks = []
        n_others = len(self.facts) - 1
        for i, f in enumerate(self.facts):
            ivs = self.intervals(i)
            bounds = tuple(self._bounds(i))
            S = f.segment_size
            levels = tuple(self.specs[i].settings.delay_levels_ms)
            h = self.head
            for iv in ivs:
                if len(iv["holders"]) == n_others and not iv["dropped"]:
                    continue
                for seg in f.segments:  # records (DLedger: entries) starting in the interval, by file offset
                    lo, hi = max(iv["lo"] - h, seg.base), min(iv["hi"] - h, seg.base + S)
                    if lo < hi:
                        tasks.append(HoldTask((*self.tag, i, seg.base, lo), seg.uri, seg.file_size, seg.base,
                                              lo - seg.base, hi - seg.base, bounds, levels, self.specs[i].fs_options,
                                              seg.dledger, self.specs[i].settings.scan_line))
        return tasks

    def take_holdings(self, results: list[tuple[tuple, pa.Table, int]]) -> None:
        k = len(self.tag)
        parts: list[list[pa.Table]] = [[] for _ in self.facts]
        for key, table, _stop in results:
            parts[key[k]].append(table)
        self.aggs = [merge(p) for p in parts]

    # -- step 4: the answer -------------------------------------------------------------------------
    def _skip_hi(self, i: int) -> int:
        """The end of store ``i``'s part that was not scanned (everything after it was)."""
        n_others = len(self.facts) - 1
        skipped = [iv["hi"] for iv in self.intervals(i) if len(iv["holders"]) == n_others and not iv["dropped"]]
        return max(skipped) if skipped else self.ext[i].min_offset

    def _after(self, i: int, offset: int) -> list[int]:
        return [iv["index"] for iv in self.intervals(i) if iv["lo"] >= offset]

    def queue_ends(self, i: int) -> dict[tuple[str, int], int]:
        """Store ``i``'s next queue offset for every queue that some store holds messages of past the part of
        ``i`` left unscanned: from its own last message there, else from where another store's messages of that
        queue resume past it (the same number: the part before it is shared)."""
        skip = self._skip_hi(i)
        own = queue_extremes(self.aggs[i], self._after(i, skip))
        ends = {q: last + 1 for q, (_, last) in own.items() if last is not None}
        for j in range(len(self.facts)):
            if j == i:
                continue
            for q, (first, _) in queue_extremes(self.aggs[j], self._after(j, skip)).items():
                if q not in own and first is not None:
                    ends[q] = min(ends.get(q, first), first)
        return ends

    def consumers(self) -> list[dict[str, Any]]:
        """Consumer groups whose committed offsets on one store lie past another store's end, or past where the
        two hold different messages in that queue."""
        out = []
        ends = [self.queue_ends(i) for i in range(len(self.facts))]
        for x, fx in enumerate(self.facts):
            for y, fy in enumerate(self.facts):
                if x == y:
                    continue
                p = self.pair(x, y)
                resume: dict[tuple[str, int], int] = {}
                theirs = queue_extremes(self.aggs[y], self._after(y, p.shared_until)) if p.diverged else {}
                if p.diverged:
                    for w in (x, y):
                        for q, (first, _) in queue_extremes(self.aggs[w], self._after(w, p.shared_until)).items():
                            if first is not None:
                                resume[q] = min(resume.get(q, first), first)
                for (topic, group), qmap in sorted(fx.config.offsets.items()):
                    for qid, c in sorted(qmap.items()):
                        q = (topic, qid)
                        e = ends[y].get(q)
                        row = {"store": fx.name, "other": fy.name, "group": group, "topic": topic, "queue_id": qid,
                               "committed": c, "other_end": e}
                        if e is not None and c > e:
                            out.append({**row, "kind": "past_end", "messages": c - e})
                        elif e is not None and q in resume and c > resume[q] and q in theirs:
                            skipped = min(c, e) - resume[q]
                            if skipped > 0:
                                out.append({**row, "kind": "past_divergence", "diverged_queue_offset": resume[q],
                                            "messages": skipped})
        return out

    def result(self) -> dict[str, Any]:
        """The report dict (schema ``rmqstore.replicas/1``)."""
        diverged = [p.shared_until for p in self.pairs if p.diverged]
        stores = []
        n_others = len(self.facts) - 1
        for i, f in enumerate(self.facts):
            ivs = self.intervals(i)
            only = summarise(self.aggs[i], [iv["index"] for iv in ivs if not iv["holders"]])
            cut = self.cuts[i]
            dropped = summarise(self.aggs[i], [iv["index"] for iv in ivs if iv["dropped"]]) if cut else None
            stores.append({
                "name": f.name, "uri": f.uri, "version": f.version, "min_offset": f.min_offset, "end": f.end,
                "bytes": max(0, f.end - f.min_offset), "recovery": f.recovery, "confirm_offset": f.confirm_offset,
                "epochs": [[e.epoch, e.start_offset] for e in f.epochs], "epoch_file": f.epoch_source,
                "only_here": only["messages"], "held_only_here": only,
                "truncated_at": cut.truncated_at if cut else None,
                "rejoin": None if cut is None else {"master": self.facts[self.reference].name, "outcome": cut.outcome,
                                                    "point": cut.point, "detail": cut.detail, "drops": dropped,
                                                    **({"dledger": self.walks[i]} if self.walks[i] else {})},
                "ledger": f.ledger,
                "stale_tail": f.stale_tail,
                "shared_with_all_until": min((p.shared_until for p in self.pairs if i in (p.a, p.b)), default=f.end)
                if n_others else f.end,
            })
        cfg = compare_config(self.facts)
        return {
            "schema": SCHEMA, "mode": self.mode, "consistent": not diverged,
            "diverged_at": min(diverged) if diverged else None,
            "reference": None if self.reference is None else self.facts[self.reference].name,
            "stores": stores,
            "pairs": [{"a": self.facts[p.a].name, "b": self.facts[p.b].name,
                       "overlap": [p.lo - self.head, p.hi - self.head],
                       "first_difference": p.first_difference, "shared_until": p.shared_until,
                       "relation": _relation(p, self.ext)} for p in self.pairs],
            "consumers": self.consumers(), "config": cfg, "config_summary": config_summary(cfg),
            "findings": [_finding_json(x) for x in self.findings],
        }

    def _store_notes(self, i: int, f: StoreFacts) -> None:
        if f.stale_tail and f.ledger is not None:
            s = f.stale_tail
            parts = []
            if s.get("entries"):
                parts.append(f"{s['entries']} valid entr(ies) (index {s['first_index']}..{s['last_index']}, data "
                             f"[{s['resumes_at']}, {s['until']})) lie past the ledger's end {f.end}")
            if s.get("index_units_past_end"):
                parts.append(f"{s['index_units_past_end']} index unit(s) after index {f.ledger['end_index']} are not zero")
            self.findings.append(Finding(
                "stale_entries_past_end", "warning", f"{f.name}/{f.ledger['dir']}", s.get("resumes_at"),
                "; ".join(parts) + ": left by a truncation that only moved DLedger's write positions (a rejoin); "
                "DLedger's reload ignores them unless they happen to continue the chain"))
        elif f.stale_tail:
            s = f.stale_tail
            self.findings.append(Finding(
                "stale_records_past_end", "warning", f"{f.name}/commitlog", s["resumes_at"],
                f"{s['records']} valid record(s) [{s['resumes_at']}, {s['until']}) lie past the end {f.end} (left by a "
                "truncation that only moved the write position: apache/rocketmq#10666); a restart ignores them unless new "
                "data ends exactly where one starts"))
        if self.mode == "controller" and f.confirm_offset is not None and 0 <= f.confirm_offset < f.end:
            self.findings.append(Finding(
                "unconfirmed_tail", "info", f"{f.name}/checkpoint", f.confirm_offset,
                f"[{f.confirm_offset}, {f.end}) lies past the checkpoint's confirm offset: in controller mode reput "
                "dispatches only up to it, so those messages are in no consume queue until confirmed"))

    def close(self) -> None:
        self._stores.clear()


def _relation(p: Pair, ext: list[Extent]) -> str:
    if p.lo >= p.hi:
        return "no_overlap"
    if p.diverged:
        return "diverged"
    ea, eb = ext[p.a].end, ext[p.b].end
    return "equal" if ea == eb else ("a_behind" if ea < eb else "b_behind")


def _named(f: Finding, name: str) -> Finding:
    return Finding(f.kind, f.severity, f"{name}/{f.file}" if f.file else name, f.offset, f.detail, f.extra)


def _finding_json(f: Finding) -> dict[str, Any]:
    return {"kind": f.kind, "severity": f.severity, "file": f.file, "offset": f.offset, "detail": f.detail}


def compare_group(specs: list[StoreSpec], *, mode: str = "auto", block: int = DEFAULT_BLOCK,
                  runner: Runner = serial) -> dict[str, Any]:
    """Compare the replicas of one group: the whole comparison, its tasks run by ``runner`` (``map``-like)."""
    facts = runner(store_facts, specs)
    g = GroupComparison(facts, specs, mode=mode, block=block)
    try:
        g.take_blocks(runner(block_crcs, g.block_tasks()))
        g.take_holdings(runner(hold_task, g.hold_tasks()))
        return g.result()
    finally:
        g.close()


__all__ = ["MODES", "SCHEMA", "GroupComparison", "Pair", "compare_group", "serial"]
