"""Writes refused while the disk is marked full, for the retention simulation (:mod:`storelib.broker.expiry.cleaner`).

Above the warning ratio the broker marks its disk full and refuses every put (4.9.8
DefaultMessageStore.putMessage :413, 5.3.3 HookUtils.java:75: runningFlags.isWriteable()); DLedger refuses
appends above its own full ratio (isDiskFull, DLedgerMmapFileStore.java:710). So the write position stops
while the disk is full and moves again once a check finds it below the mark: without this a store that
cannot delete grows past 100 % of its disk. The flags and who sets them:

* the broker's flag: its cleaner run (isSpaceToDelete, after isTimeToDelete, which a bad deleteWhen makes
  throw) marks full above the warning ratio and clears at or below the forcible ratio (between the two it
  leaves the flag); 4.9.8 also checks every 10 s from 1 s after the start (isSpaceFull: full above the
  warning ratio, clear otherwise; DefaultMessageStore.java:1359-1363, :1836-1848); 5.3.3 schedules no
  such check;
* DLedger's flag (DLedger mode): each CleanSpaceService.doWork, before isTimeToDelete, sets it to ratio >
  its full ratio;
* the disk itself: when no flag stopped the writes (5.3.3 with a deleteWhen that throws every hour never
  marks its disk full) they stop when the partition is full, its ratio 1.00 (the broker's writes fail
  there; what it does then is not modelled, and the report warns).

A check inside a delete run sees the run's deletions at once (the run's files go from the disk model
together); the search for the next change starts after the run.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from storelib.broker.expiry.expiry import HOUR_ERROR

if TYPE_CHECKING:
    from storelib.broker.expiry.cleaner import CleanerSim

DISK_CHECK_DELAY_MS = 1000  # 4.9.8 diskCheckScheduledExecutorService: scheduleAtFixedRate(isSpaceFull, 1 s, 10 s)
DISK_CHECK_PERIOD_MS = 10_000


class WriteClock:
    """Time spent writing since the snapshot: the write position only moves while writes are accepted.

    Pauses come in time order (a stop, then its resume), so each is kept with the pause time before it
    and its start in writing time: both lookups are a bisection (a full disk that a cleaner frees again
    and again over days makes tens of thousands of pauses, and the event search asks at every step)."""

    def __init__(self, t0: int):
        self.t0 = t0
        self.starts: list[int] = []  # each pause's start
        self.ends: list[float] = []  # its end; inf while writes are refused
        self.before: list[float] = []  # pause time before it
        self.w_starts: list[float] = []  # its start in writing time (non-decreasing)

    @property
    def paused(self) -> bool:
        return bool(self.ends) and self.ends[-1] == math.inf

    def writing_ms(self, t: float) -> float:
        """Milliseconds of writing between the snapshot and t."""
        k = bisect.bisect_left(self.starts, t)  # the pauses that started before t
        if not k:
            return t - self.t0
        i = k - 1
        return t - self.t0 - self.before[i] - (min(self.ends[i], t) - self.starts[i])

    def at_writing_ms(self, w: float) -> float:
        """The first time at which ``w`` ms of writing have passed since the snapshot (inf: never, writes stay
        refused)."""
        k = bisect.bisect_left(self.w_starts, w)  # the pauses that come before w ms of writing
        if not k:
            return self.t0 + w
        i = k - 1
        return self.t0 + w + self.before[i] + (self.ends[i] - self.starts[i])

    def stop(self, t: int) -> None:
        before = self.before[-1] + (self.ends[-1] - self.starts[-1]) if self.starts else 0.0
        self.starts.append(t)
        self.ends.append(math.inf)
        self.before.append(before)
        self.w_starts.append(t - self.t0 - before)

    def resume(self, t: int) -> None:
        if t > self.starts[-1]:
            self.ends[-1] = t
        else:  # resumed where it stopped: no pause
            for xs in (self.starts, self.ends, self.before, self.w_starts):
                xs.pop()


@dataclass(frozen=True)
class Checker:
    """One place that sets a disk-full flag: on a grid of times, full above one ratio, clear at or below
    another; ``skip_error_hours``: it runs after isTimeToDelete (nothing in an hour whose deleteWhen throws)."""

    flag: str  # "broker", "dledger" or "disk"
    anchor: int
    period: int
    full_above: float
    ok_at_most: float
    skip_error_hours: bool = False


def checkers(sim: CleanerSim) -> list[Checker]:
    """The checks that run in this simulation (see the module docstring)."""
    p = sim.p
    out = []
    if p.version == "4":
        out.append(Checker("broker", sim.start + DISK_CHECK_DELAY_MS, DISK_CHECK_PERIOD_MS, p.warn_ratio, p.warn_ratio))
    if sim.dl:
        out.append(Checker("broker", sim.broker_T0, sim.broker_P, p.warn_ratio, p.force_ratio, True))
        out.append(Checker("dledger", sim.T0, sim.P, sim.dl_full, sim.dl_full))
    else:
        out.append(Checker("broker", sim.T0, sim.P, p.warn_ratio, p.force_ratio, True))
    out.append(Checker("disk", sim.t_snap, 1, 0.99, 0.99))  # no flag stopped it: the disk is full (ratio 1.00)
    return out


def first_change(sim: CleanerSim, c: Checker, now: int, limit: int) -> int | None:
    """The first time in [now, limit] on ``c``'s grid at which it changes its flag. The ratio only grows
    while writes go on and stays put while they are refused (between deletions), so the condition, once
    true, stays true: a binary search, then the first hour in which the check runs."""
    on = sim.flags[c.flag]
    j = max(0, -(-(now - c.anchor) // c.period))
    jmax = (limit - c.anchor) // c.period
    if j > jmax:
        return None

    def cond(jj: int) -> bool:
        r = sim.phys(c.anchor + jj * c.period)
        return r <= c.ok_at_most if on else r > c.full_above

    if not cond(jmax):
        return None
    lo, hi = j, jmax
    while lo < hi:
        mid = (lo + hi) // 2
        if cond(mid):
            hi = mid
        else:
            lo = mid + 1
    t = c.anchor + lo * c.period
    while c.skip_error_hours and sim.table[sim.hour(t)] == HOUR_ERROR:
        nh = sim.next_hour(t)
        t = c.anchor + -(-(nh - c.anchor) // c.period) * c.period
        if t > limit:
            return None
    return t


def set_flag(sim: CleanerSim, flag: str, value: bool, t: int) -> None:
    """Set one flag at t; writes stop when the first flag goes up and resume when the last comes down."""
    was = any(sim.flags.values())
    sim.flags[flag] = value
    now = any(sim.flags.values())
    if now == was:
        return
    sim._sample(t)
    if now:
        sim.clock.stop(t)
        sim.refusals.append({"from_ms": int(t), "to_ms": None, "by": flag})
    else:
        sim.clock.resume(t)
        sim.refusals[-1]["to_ms"] = int(t)


def check(sim: CleanerSim, flag: str, phys: float | None, full_above: float, ok_at_most: float, t: int) -> None:
    """A processed run's own check of the disk (its ratio at t)."""
    if phys is None:
        return
    if phys > full_above and not sim.flags[flag]:
        set_flag(sim, flag, True, t)
    elif phys <= ok_at_most and sim.flags[flag]:
        set_flag(sim, flag, False, t)


def apply_next_change(sim: CleanerSim, now: int, limit: int) -> int | None:
    """Apply the first flag change of any check in [now, limit] (before the cleaner event at ``limit``);
    its time, or None when there is none."""
    if sim.p.disk_capacity is None:
        return None
    best: tuple[int, Checker] | None = None
    for c in checkers(sim):
        t = first_change(sim, c, now, min(limit, sim.until))
        if t is not None and (best is None or t < best[0]):
            best = (t, c)
    if best is None:
        return None
    t, c = best
    set_flag(sim, c.flag, not sim.flags[c.flag], t)
    return t


def refusal_summary(sim: CleanerSim) -> dict[str, int | None]:
    """When writes were first refused and for how long in all (ms, to the simulation's end)."""
    total = sum((sim.until if r["to_ms"] is None else r["to_ms"]) - r["from_ms"] for r in sim.refusals)
    return {"writes_refused_ms": sim.refusals[0]["from_ms"] if sim.refusals else None,
            "writes_refused_total_ms": int(total)}


__all__ = ["Checker", "WriteClock", "apply_next_change", "check", "checkers", "first_change", "refusal_summary",
           "set_flag"]
