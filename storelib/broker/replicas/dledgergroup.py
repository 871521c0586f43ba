"""A DLedger group's rejoin, on a :class:`~storelib.broker.replicas.group.GroupComparison` whose pairs are
compared: the leader (:func:`terms.leader_of`) and, for every other node, DLedger's compare walk and what
its truncation drops (:func:`terms.compare_walk`), checked against the entries themselves.

Where two nodes' data files agree byte for byte their entries are equal (same positions, same bytes); only
the entries from where they part are read, from both nodes, and compared as DLedgerEntry.equals does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from storelib.broker.replicas.epochs import RejoinCut
from storelib.broker.replicas.ledger import entry_bytes, entry_rows, index_unit
from storelib.broker.replicas.terms import BODY_OFFSET, LedgerRange, compare_walk, leader_of
from storelib.errors import Finding

if TYPE_CHECKING:
    from storelib.broker.replicas.group import GroupComparison


def _range(ledger: dict[str, Any]) -> LedgerRange:
    return LedgerRange(ledger["begin_index"], ledger["end_index"], ledger["end_term"])


class _Entries:
    """The entries of a follower and its leader from where they part, and the equality the walk asks."""

    def __init__(self, g: GroupComparison, f: int, m: int):
        self.g, self.f, self.m = g, f, m
        p = g.pair(f, m)
        self.diverged = p.diverged
        if not p.diverged:
            return
        start = p.shared_until - BODY_OFFSET  # the first entry they hold differently (both at this position)
        self.rows = [entry_rows(g.store(x), start, g.facts[x].end) for x in (f, m)]
        firsts = [int(r["dledger_index"][0]) for r in self.rows if len(r["dledger_index"])]
        self.first = min(firsts) if firsts else _range(g.facts[f].ledger).end + 1
        self.at = [{int(i): k for k, i in enumerate(r["dledger_index"])} for r in self.rows]

    def _unit(self, x: int, i: int) -> tuple[int, int, int] | None:
        k = self.at[x].get(i)
        r = self.rows[x]
        return None if k is None else (int(r["dledger_term"][k]), int(r["dledger_pos"][k]), int(r["size"][k]))

    def matches(self, i: int) -> bool:
        if not self.diverged or i < self.first:
            return True  # identical bytes at identical positions: equal entries
        a, b = self._unit(0, i), self._unit(1, i)
        if a is None or b is None or a != b:
            return False
        return entry_bytes(self.g.store(self.f), a[1], a[2]) == entry_bytes(self.g.store(self.m), b[1], b[2])

    def last_match(self, lo: int, hi: int) -> int | None:
        if not self.diverged or hi < self.first:
            return hi if hi >= lo else None
        idx = np.asarray(sorted(set(self.at[0]) & set(self.at[1])), np.int64)
        for i in idx[(idx >= max(lo, self.first)) & (idx <= hi)][::-1].tolist():
            if self.matches(i):
                return i
        top = min(hi, self.first - 1)
        return top if top >= lo else None

    def pos(self, i: int) -> int | None:
        """The follower's entry ``i``'s position (from where they part on: the scan; before: its index unit)."""
        if self.diverged and i in self.at[0]:
            return int(self.rows[0]["dledger_pos"][self.at[0][i]])
        if i == self.g.facts[self.f].ledger["begin_index"]:
            return self.g.facts[self.f].min_offset
        u = index_unit(self.g.store(self.f), i)
        return None if u is None else u[0]


def dledger_cuts(g: GroupComparison) -> None:
    """Fill ``g.reference`` (the leader), ``g.cuts`` and ``g.walks`` for a DLedger group."""
    f = g.facts
    ranges = [_range(x.ledger) for x in f]
    m = leader_of(ranges, [x.ledger["vote_leader"] for x in f], [x.ledger["self_id"] for x in f])
    g.reference = m
    if m is None:
        g.findings.append(Finding("no_entries", "warning", None, None, "no node holds entries: nothing to compare"))
        return
    for i, x in enumerate(f):
        if i == m:
            continue
        e = _Entries(g, i, m)
        w = compare_walk(ranges[m], ranges[i], e.matches, e.last_match)
        walk = {"leader": f[m].ledger["self_id"], "outcome": w.outcome, "index": w.index,
                "first_dropped_index": w.first_dropped, "dropped_entries": 0 if w.first_dropped is None
                else ranges[i].end - w.first_dropped + 1, "compared": list(w.compared[:20])}
        g.walks[i] = walk
        if w.first_dropped is None:
            g.cuts[i] = RejoinCut("nothing_to_cut", None, f"the compare walk matches at the follower's end (index "
                                                         f"{w.index}): DLedger appends, nothing is cut")
            continue
        pos = e.pos(w.first_dropped)
        if pos is None:
            g.cuts[i] = RejoinCut("refused", None, f"entry {w.first_dropped} has no index unit: DLedger's get fails")
            g.findings.append(Finding("rejoin_refused", "error", f"{x.name}/{x.ledger['dir']}", None, g.cuts[i].detail))
            continue
        how = (f"cut after entry {w.index}, which both hold" if w.outcome == "truncate"
               else f"cut at entry {w.index}, which the leader's replaces")
        g.cuts[i] = RejoinCut("cut", pos + BODY_OFFSET,
                              f"rejoining leader {f[m].name}: the compare walk from index {ranges[m].end} {how}; "
                              f"entries {w.first_dropped}..{ranges[i].end} are dropped (data from position {pos})")
        p = g.pair(i, m)
        if p.diverged and pos + BODY_OFFSET > p.shared_until:
            g.findings.append(Finding(
                "rejoin_keeps_differing_entries", "critical", f"{x.name}/{x.ledger['dir']}", p.shared_until,
                f"DLedger's walk keeps entries up to {w.index}, but the bytes differ from {p.shared_until}: equal index, "
                "term, position and body where the data files differ"))


__all__ = ["dledger_cuts"]
