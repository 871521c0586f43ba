"""DLedger's compare walk and truncation (DLedgerEntryPusher.doCompare/doTruncate, DLedgerMmapFileStore.truncate)
against a step-by-step transcription of doCompare's loop, on ledgers with every shape of overlap."""

from __future__ import annotations

import itertools

import pytest

from storelib.broker.replicas.terms import LedgerRange, compare_walk, leader_of


def reference_walk(leader: dict[int, str], follower: dict[int, str]) -> tuple[str, int | None]:
    """doCompare as written in DLedgerEntryPusher (one index per step), then the truncate's existedEntry."""
    lb, le = (min(leader), max(leader)) if leader else (-1, -1)
    fb, fe = (min(follower), max(follower)) if follower else (-1, -1)
    if le == -1:
        return "none", None
    ci, t = -1, -1
    while True:
        if ci == -1:
            ci = le
        elif ci > le or ci < lb:
            ci = le
        ok = ci in follower and follower[ci] == leader[ci]
        if ok:
            if ci == fe:
                return "append", ci
            t = ci
        elif fe < lb or fb > le:
            t = lb
        elif ci < fb:
            t = lb
        elif ci > fe:
            ci = fe
        else:
            ci -= 1
        if ci < lb:
            t = lb
        if t != -1:
            break
    kept = t in follower and follower[t] == leader[t]
    return ("truncate" if kept else "replace"), t


def _ledger(entries: dict[int, str]) -> LedgerRange:
    return LedgerRange(min(entries), max(entries)) if entries else LedgerRange(-1, -1)


def ours(leader: dict[int, str], follower: dict[int, str]):
    def matches(i):
        return i in follower and i in leader and follower[i] == leader[i]

    def last_match(lo, hi):
        return next((i for i in range(hi, lo - 1, -1) if matches(i)), None)

    return compare_walk(_ledger(leader), _ledger(follower), matches, last_match)


def _log(begin: int, end: int, fork: int | None = None, tag: str = "x") -> dict[int, str]:
    """Entries begin..end, the same content as any other log up to ``fork`` and this log's own from there."""
    return {i: (f"{tag}{i}" if fork is not None and i >= fork else f"c{i}") for i in range(begin, end + 1)}


SHAPES = [
    (_log(0, 20), _log(0, 20)),  # equal
    (_log(0, 20), _log(0, 12)),  # follower behind
    (_log(0, 20), _log(0, 30)),  # follower longer, a prefix of nothing: same entries past the leader's end
    (_log(0, 20, 15, "L"), _log(0, 30, 15, "F")),  # forked at 15, follower longer (the sample's shape)
    (_log(0, 20, 15, "L"), _log(0, 17, 15, "F")),  # forked, follower shorter
    (_log(0, 20, 0, "L"), _log(0, 9, 0, "F")),  # nothing in common
    (_log(5, 20), _log(0, 3)),  # no common range
    (_log(5, 20), _log(0, 9)),  # follower's begin before the leader's
    (_log(5, 20, 7, "L"), _log(0, 9, 7, "F")),
    (_log(0, 20), {}),  # an empty follower
    (_log(5, 20), _log(12, 25, 18, "F")),  # follower begins later (expired files) and forks
]


@pytest.mark.parametrize("leader, follower", SHAPES)
def test_walk_matches_the_step_by_step_loop(leader, follower):
    want_outcome, want_index = reference_walk(leader, follower)
    got = ours(leader, follower)
    assert (got.outcome, got.index) == (want_outcome, want_index)
    if got.outcome in ("append", "none"):
        assert got.first_dropped is None


def test_forked_follower_is_cut_after_the_last_common_entry():
    got = ours(_log(0, 1192, 1043, "L"), _log(0, 1250, 1043, "F"))  # the group sample's shape
    assert (got.outcome, got.index, got.first_dropped) == ("truncate", 1042, 1043)
    assert got.compared[:2] == (1192, 1042)  # from the leader's end, then straight to the match


def test_random_ledgers_agree_with_the_loop():
    for lb, le, fb, fe, fork in itertools.product((0, 3), (6, 9), (0, 2, 5), (4, 8, 12), (None, 2, 5)):
        if le < lb or fe < fb:
            continue
        leader, follower = _log(lb, le, fork, "L"), _log(fb, fe, fork, "F")
        assert (ours(leader, follower).outcome, ours(leader, follower).index) == reference_walk(leader, follower)


def test_the_leader_is_the_most_up_to_date_then_the_voted():
    ranges = [LedgerRange(0, 1192, 2), LedgerRange(0, 1192, 2), LedgerRange(0, 1250, 1)]
    assert leader_of(ranges, ["n1", "n1", "n2"], ["n0", "n1", "n2"]) == 1
    assert leader_of(ranges, [None, None, None], ["n0", "n1", "n2"]) == 0
    assert leader_of([LedgerRange(-1, -1)], [None], ["a"]) is None
