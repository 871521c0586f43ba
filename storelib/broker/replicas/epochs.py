"""Controller mode (5.x): the broker's rules over epoch entries (EpochFileCache, AutoSwitchHAClient).

``find_consistent_point`` is EpochFileCache.findConsistentPoint over caches built the way
AutoSwitchHAClient.doTruncate builds them; :func:`rejoin_cut` is the whole doTruncate decision for a store
rejoining a master: no epochs (a "new replica": nothing cut), no consistent point (nothing cut, the client
retries), a point at or past the store's end (nothing cut), a point that is not a message boundary
(DefaultMessageStore.truncateFiles refuses: "need manual fix"), else the cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from storelib.format.ha.epochfile import LONG_MAX, EpochEntry


@dataclass(frozen=True)
class Epoch:
    """An epoch with its end as the broker's cache holds it (the next epoch's start; the last one's end is
    the store's max offset, or Long.MAX_VALUE when its start lies past that)."""

    epoch: int
    start: int
    end: int


def epoch_cache(entries: Sequence[EpochEntry], last_end: int) -> list[Epoch]:
    """EpochFileCache.initCacheFromEntries + setLastEpochEntryEndOffset(last_end), in epoch order.

    A TreeMap by epoch: a repeated epoch keeps the later entry. doTruncate rebuilds both caches from
    getAllEntries (epoch order), so each end is the next epoch's start in epoch order.
    """
    by_epoch: dict[int, int] = {}
    for e in entries:
        by_epoch[e.epoch] = e.start_offset
    keys = sorted(by_epoch)
    out = []
    for i, k in enumerate(keys):
        if i + 1 < len(keys):
            end = by_epoch[keys[i + 1]]
        else:
            end = last_end if by_epoch[k] <= last_end else LONG_MAX  # setLastEpochEntryEndOffset's guard
        out.append(Epoch(k, by_epoch[k], end))
    return out


def find_consistent_point(local: Sequence[Epoch], master: Sequence[Epoch]) -> int:
    """EpochFileCache.findConsistentPoint: the local epochs newest first; the first the master also has with
    the same start offset gives min(local end, master end); -1 when none does."""
    by_epoch = {e.epoch: e for e in master}
    for e in sorted(local, key=lambda x: x.epoch, reverse=True):
        m = by_epoch.get(e.epoch)
        if m is not None and m.start == e.start:
            return min(e.end, m.end)
    return -1


@dataclass(frozen=True)
class RejoinCut:
    """What AutoSwitchHAClient.doTruncate does to a store rejoining a master.

    ``outcome``: ``new_replica`` (no epochs: nothing cut, the master streams from the store's end),
    ``no_consistent_point`` (nothing cut; the broker logs an error and retries), ``nothing_to_cut`` (the
    point is at or past the store's end), ``refused`` (the point is not a message boundary: truncateFiles
    fails, "need manual fix"), ``cut`` (the commitlog is truncated at ``point``).
    """

    outcome: str
    point: int | None
    detail: str

    @property
    def truncated_at(self) -> int | None:
        """The offset of the first message dropped (None when nothing is)."""
        return self.point if self.outcome == "cut" else None


def rejoin_cut(local: Sequence[EpochEntry], local_end: int, master: Sequence[EpochEntry], master_end: int,
               aligned: Callable[[int], bool]) -> RejoinCut:
    """doTruncate for a store (epochs ``local``, max phy offset ``local_end``) rejoining ``master``.

    ``aligned(offset)``: DefaultMessageStore.isOffsetAligned on the rejoining store (a message or the
    segment's blank record starts there, body CRC checked).
    """
    if not local:
        return RejoinCut("new_replica", None, "no epochs: the broker treats it as a new replica and cuts nothing; "
                                              "the master streams its bytes from this store's end")
    point = find_consistent_point(epoch_cache(local, local_end), epoch_cache(master, master_end))
    if point < 0:
        return RejoinCut("no_consistent_point", None, "no epoch with the same start offset on both: the broker logs "
                                                      "'Failed to find a consistent point' and retries, cutting nothing")
    if point >= local_end:
        return RejoinCut("nothing_to_cut", point, f"consistent point {point} is at or past the store's end {local_end}")
    if not aligned(point):
        return RejoinCut("refused", point, f"consistent point {point} is not a message boundary: truncateFiles refuses "
                                           "('need manual fix') and nothing is cut")
    return RejoinCut("cut", point, f"the commitlog is cut at {point} (the epoch file's entries from there are dropped)")


def newest(epochs: Sequence[Sequence[EpochEntry]], ends: Sequence[int]) -> int | None:
    """Index of the store with the newest epoch (ties: the larger end, then the first given); None when no
    store has epochs. That store is the master the others rejoin."""
    best = None
    for i, (entries, end) in enumerate(zip(epochs, ends)):
        if not entries:
            continue
        key = (max(e.epoch for e in entries), end)
        if best is None or key > best[0]:
            best = (key, i)
    return None if best is None else best[1]


__all__ = ["Epoch", "RejoinCut", "epoch_cache", "find_consistent_point", "newest", "rejoin_cut"]
