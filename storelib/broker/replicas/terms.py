"""DLedger groups (0.3.1.2): the leader's compare walk over a rejoining follower's entries and the truncation
that follows (DLedgerEntryPusher.EntryDispatcher.doCompare/doTruncate, DLedgerMmapFileStore.truncate).

The walk starts at the leader's ledger end and goes down one index at a time; an index matches when the
follower holds an entry there equal to the leader's (DLedgerEntry.equals: size, magic, index, term,
channel, pos and the body; not the two CRC fields). A match at the follower's end means nothing to cut;
a match below it cuts the follower after that entry; no match (or no common range) cuts it at the leader's
first entry, whose bytes replace the follower's. Here the one-at-a-time descent is a jump to the highest
match below (``last_match``), which the walk would reach first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

BODY_OFFSET = 48  # DLedgerEntry.BODY_OFFSET: a message's physical offset is its entry's pos + 48


@dataclass(frozen=True)
class LedgerRange:
    """A node's ledger after DLedgerMmapFileStore.recover: begin and end index (-1 when empty) and the
    term of its last entry."""

    begin: int
    end: int
    end_term: int = -1

    @property
    def empty(self) -> bool:
        return self.end < 0


@dataclass(frozen=True)
class RejoinTruncation:
    """What the leader does to a rejoining follower.

    ``outcome``: ``append`` (the follower's end matches: nothing cut), ``truncate`` (cut after entry
    ``index``, which both hold), ``replace`` (cut at entry ``index``, which the leader's entry replaces),
    ``none`` (the leader has no entries). ``first_dropped``: the follower's first entry dropped (None when
    none is); ``compared``: the indexes the walk compared, in order (one per jump).
    """

    outcome: str
    index: int | None
    first_dropped: int | None
    compared: tuple[int, ...]


def compare_walk(leader: LedgerRange, follower: LedgerRange, matches: Callable[[int], bool],
                 last_match: Callable[[int, int], int | None]) -> RejoinTruncation:
    """EntryDispatcher.doCompare then doTruncate's choice, for one follower.

    ``matches(i)``: the follower holds entry ``i`` (within its begin and end) and it equals the leader's;
    ``last_match(lo, hi)``: the highest ``i`` in ``[lo, hi]`` that matches, or None.
    """
    if leader.empty:
        return RejoinTruncation("none", None, None, ())
    compared: list[int] = []
    ci = leader.end
    truncate = -1
    for _ in range(4 * (leader.end - leader.begin + 4)):  # each pass moves ci or ends the walk
        if ci > leader.end or ci < leader.begin:
            ci = leader.end
        compared.append(ci)
        if follower.begin <= ci <= follower.end and matches(ci):
            if ci == follower.end:
                return RejoinTruncation("append", ci, None, tuple(compared))
            truncate = ci
        elif follower.end < leader.begin or follower.begin > leader.end or ci < follower.begin:
            truncate = leader.begin
        elif ci > follower.end:
            ci = follower.end
        else:  # the walk steps down one at a time until a match or below the common begin
            floor = max(follower.begin, leader.begin)
            j = last_match(floor, ci - 1) if ci - 1 >= floor else None
            if j is None:
                truncate = leader.begin
            else:
                ci = j
        if truncate == -1 and ci < leader.begin:
            truncate = leader.begin
        if truncate != -1:
            break
    else:  # pragma: no cover - the loop always ends the walk
        raise RuntimeError("compare walk did not end")
    kept = follower.begin <= truncate <= follower.end and matches(truncate)
    if kept:
        first = truncate + 1
    elif truncate > follower.end + 1 or truncate < follower.begin:
        first = follower.begin  # no common range: DLedger rebuilds the follower's files at the leader's entry
    else:
        first = truncate
    dropped = first if not follower.empty and first <= follower.end else None
    return RejoinTruncation("truncate" if kept else "replace", truncate, dropped, tuple(compared))


def leader_of(ranges: list[LedgerRange], votes: list[str | None], names: list[str]) -> int | None:
    """The node a rejoining node follows: the most up-to-date ledger (last entry's term, then its index: a
    node behind it cannot win a vote); among equals, the one the others voted for, else the first."""
    best = [i for i, r in enumerate(ranges) if not r.empty]
    if not best:
        return None
    top = max((ranges[i].end_term, ranges[i].end) for i in best)
    tied = [i for i in best if (ranges[i].end_term, ranges[i].end) == top]
    voted = [i for i in tied if sum(1 for v in votes if v == names[i]) > 0]
    ranked = sorted(voted, key=lambda i: -sum(1 for v in votes if v == names[i]))
    return ranked[0] if ranked else tied[0]


__all__ = ["BODY_OFFSET", "LedgerRange", "RejoinTruncation", "compare_walk", "leader_of"]
