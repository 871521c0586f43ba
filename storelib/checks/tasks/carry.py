"""The partitioned cross-file checks' ``--since`` carry (the state file's ``carry``): per queue group its
stream snapshot and its result, per index file its snapshot, the keys not indexed yet, the timer store's
records and result; and which partitions a run going on from it schedules: a queue group with new
records, changed consume queues, or lag while the reput position moved; an index file that grew or is
new; the timer store when the log grew or its files changed. The rest is what the carry says."""

from __future__ import annotations

from typing import Any

import numpy as np

from storelib.checks import queuestream
from storelib.checks.logcharts import TrafficSeries
from storelib.checks.logview import Unsettled
from storelib.checks.tasks.context import CrossContext
from storelib.checks.tasks.expire import group_expired, moved
from storelib.checks.tasks.queuetask import LISTING, QueueGroupResult, QueueGroupTask
from storelib.fileio.bytesource import Location

CARRY_KIND = "partitioned/1"


def _pairs(d: dict[tuple[str, int], Any]) -> list:
    return [[t, q, v] for (t, q), v in d.items()]


def _unpairs(j: list) -> dict[tuple[str, int], Any]:
    return {(t, int(q)): v for t, q, v in j}


def group_to_json(r: QueueGroupResult, ctx: CrossContext) -> dict[str, Any]:
    """A group's result as the state keeps it (its series with their bucket layout)."""
    traffic = TrafficSeries(ctx.ts_lo, ctx.ts_hi)
    return {"facts": _pairs(r.facts), "stats": _pairs(r.stats), "offsets": _pairs(r.offsets_found),
            "units": _pairs(r.units_found), "first": r.first_phy, "traffic": r.traffic,
            "layout": [traffic.bucket, traffic.start], "sizes": r.sizes, "records": r.records}


def group_from_json(g: int, d: dict[str, Any], ctx: CrossContext, expired: bool = False) -> QueueGroupResult:
    """A carried group's result, its traffic rows in this run's buckets (Unsettled: they do not nest;
    ``expired``: the cleaner deleted the oldest records since, and buckets before this run's are dropped)."""
    return QueueGroupResult(g, _unpairs(d["facts"]), _unpairs(d["stats"]), _unpairs(d["offsets"]), _unpairs(d["units"]),
                            dict(d["first"]), _rebucket(d["traffic"], d["layout"], ctx, expired), d["sizes"],
                            mode="carried", records=d["records"])


def _rebucket(rows: dict[str, list[int]], layout: list[int], ctx: CrossContext,
              expired: bool = False) -> dict[str, list[int]]:
    if not rows:
        return {}
    names = list(rows)
    t = TrafficSeries(ctx.ts_lo, ctx.ts_hi)
    t.grid = np.zeros((len(names), t.nb), np.int64)
    if not t.resume({"bucket": layout[0], "start": layout[1], "grid": [rows[n] for n in names], "empty": False},
                    drop_before=expired):
        raise Unsettled("the traffic series' buckets changed width")
    return {n: t.grid[i].tolist() for i, n in enumerate(names) if t.grid[i].any()}


def merge_group(old: QueueGroupResult, new: QueueGroupResult, log_min: int | None = None) -> QueueGroupResult:
    """A group gone on from its carry: the task's facts, stats and findings (its stream went on from the
    carried tails), the series of the old records and the new ones added. ``log_min``: the cleaner
    deleted records below it since: a topic's first record is then its queues' first left (the facts)."""
    first = dict(old.first_phy)
    if log_min is not None and any(p < log_min for p in first.values()):
        left: dict[str, int] = {}
        for (t, _q), f in new.facts.items():
            left[t] = min(f["first_phy"], left.get(t, f["first_phy"]))
        first = {t: p if p >= log_min else left[t] for t, p in first.items() if p >= log_min or t in left}
        new.records -= new.expired
    for t, p in new.first_phy.items():
        first[t] = min(p, first.get(t, p))
    traffic = {t: list(v) for t, v in old.traffic.items()}
    for t, v in new.traffic.items():
        traffic[t] = (np.asarray(traffic[t]) + np.asarray(v)).tolist() if t in traffic else v
    from storelib.checks.logcharts import SizeHistogram

    sizes = SizeHistogram()
    for s in (old.sizes, new.sizes):
        if s[0]:
            sizes.resume(s)
    new.first_phy, new.traffic, new.sizes = first, traffic, sizes.snapshot()
    new.records += old.records
    return new


def schedule_groups(ctx: CrossContext, candidates: list[QueueGroupTask], carry: dict | None
                    ) -> tuple[list[QueueGroupTask], dict[int, QueueGroupResult]]:
    """The group tasks a run schedules, and the carried results of those it does not (a full run: all
    scheduled)."""
    if carry is None:
        return candidates, {}
    kept: dict[int, QueueGroupResult] = {}
    out = []
    carried = carry["queue_groups"]
    reput_moved = max(ctx.cq_max_phy, ctx.log_min, 0) != max(carry["cq_max_phy"], carry["log_min"], 0) \
        or carry.get("cq_end") != max(ctx.cq_ends, default=-1)  # a later unit record: lagdispatch's verdict
    expired = moved(carry, ctx.log_min)
    by_group = {t.group: t for t in candidates}
    for g in sorted({*by_group, *(int(k) for k in carried)}):
        c = carried.get(str(g))
        t = by_group.get(g, QueueGroupTask(g, ()))
        fresh = any(p.group_rows(g)[1] > p.group_rows(g)[0] for p in ctx.parts)
        lag = c is not None and any(s.get("lag") for _t, _q, s in c["result"]["stats"])
        if (c is None or fresh or [_unlisted(q) for q in t.queues] != c["metas"] or (lag and reput_moved)
                or (expired and group_expired(c, ctx.log_min))):
            out.append(QueueGroupTask(g, t.queues, t.listing_failed, c["snap"] if c is not None else None))
        else:
            kept[g] = group_from_json(g, c["result"], ctx, expired)
    return out, kept


def _lagging(snap: dict) -> int:
    """Lagging records a group's stream snapshot keeps (:class:`storelib.checks.queuestream.QueueStream`)."""
    return sum(len(t[-1][0]) if t[-1] else 0 for t in snap["tails"])


def timer_signature(root: Location) -> list:
    """The timer store's files as listed (names, sizes, times): whether they changed since a run."""
    import pyarrow.fs as pafs

    sig = []
    for rel in ("timerlog", "timerwheel", "config/timercheck"):
        loc = root.join(*rel.split("/"))
        infos = root.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True)) if rel == "timerlog" \
            else [root.fs.get_file_info(loc.path)]
        sig += [[i.base_name, i.size, i.mtime_ns] for i in infos if i.type == pafs.FileType.File]
    return sorted(sig)


def _unlisted(q: dict) -> dict:
    """A queue summary as carried: without its directory's listing, which a later run lists anew."""
    return {k: v for k, v in q.items() if k != LISTING}


def new_carry(ctx: CrossContext, groups: dict[int, QueueGroupResult], snaps: dict[int, dict], metas: list[dict],
              index: dict | None, timers: dict | None) -> dict | None:
    """The carry of a run whose every partition settled (None: the next run audits in full)."""
    if index is None or any(r.mode not in ("streamed", "carried") for r in groups.values()):
        return None
    if any(m.get("snap") is None for m in metas) or any(g not in snaps or snaps[g] is None for g in groups):
        return None
    if sum(_lagging(s) for s in snaps.values()) > queuestream.LAG_KEEP:  # each group keeps up to that many: the store too
        return None
    qg = {str(g): {"snap": snaps[g], "result": group_to_json(r, ctx),
                   "metas": next(([_unlisted(q) for q in m["queues"]] for m in metas if m["group"] == g), [])}
          for g, r in groups.items()}
    return {"kind": CARRY_KIND, "groups": ctx.groups, "log_min": ctx.log_min, "segment_size": ctx.segment_size,
            "cq_max_phy": ctx.cq_max_phy, "cq_end": max(ctx.cq_ends, default=-1), "queue_groups": qg,
            "cq": {k: v for m in metas for k, v in m["snap"].items()},
            "index": index["index"], "keys": index["keys"], "timers": timers}
