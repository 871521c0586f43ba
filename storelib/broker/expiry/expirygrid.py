"""A grid of expiry policies over one or more stores, as tasks for any engine: every (store, policy) pair
is one :func:`storelib.broker.expiry.cleaner.simulate`, the pure function ``rmqstore expiry`` runs for one policy.

The pairs are sorted by store and cut into contiguous slices, one task each: a task reads a store's
snapshot (consume-queue units, segment times, consumer offsets) once and runs its policies from memory.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from storelib.broker.expiry.cleaner import describe, simulate
from storelib.broker.expiry.expiry import Policy, TimeModel, load_snapshot
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store

GridItem = tuple[str, int]  # (store, policy number)


def grid_policies(base: BrokerSettings, reserved: list[int], delete_when: list[str], max_ratio: list[int],
                  capacity: list[int | None], *, tz: str = "UTC", disk_other_used: int = 0) -> list[Policy]:
    """The cartesian grid fileReservedTime × deleteWhen × diskMaxUsedSpaceRatio × capacity."""
    out = []
    for r, w, m, c in itertools.product(reserved, delete_when, max_ratio, capacity):
        s = base.with_overrides({"fileReservedTime": r, "deleteWhen": w, "diskMaxUsedSpaceRatio": m})
        name = f"reserved={r}h when={w} max={m}% cap={'-' if c is None else c}"
        out.append(Policy.from_settings(name, s, disk_capacity=c, tz=tz, disk_other_used=disk_other_used))
    return out


@dataclass(frozen=True)
class GridContext:
    """What every slice needs (shipped with the task function)."""

    policies: list[Policy]
    model: TimeModel
    settings: BrokerSettings
    mtimes: str = "auto"
    summary_only: bool = False
    fs_options: dict[str, Any] = field(default_factory=dict)  # how a remote store is opened (s3 endpoint, ...)
    describe: bool = False  # also each store's simulation assumptions (cleaner.describe), once per store


def grid_slices(stores: list[str], n_policies: int, slices: int) -> list[list[GridItem]]:
    """Every (store, policy) pair in store order, cut into at most ``slices`` contiguous slices."""
    pairs = [(s, i) for s in stores for i in range(n_policies)]
    if not pairs:
        return []
    n = max(1, min(slices, len(pairs)))
    step = -(-len(pairs) // n)
    return [pairs[k:k + step] for k in range(0, len(pairs), step)]


def simulate_slice(ctx: GridContext, part: list[GridItem]) -> list[tuple[str, int, str]]:
    """One slice: (store, policy number, the simulation as JSON text) per pair; a store's snapshot is read
    once and only the current one is kept in memory. With ``ctx.describe`` the slice that holds a store's
    first policy adds (store, -1, its :func:`~storelib.broker.expiry.cleaner.describe` as JSON text)."""
    out = []
    snap_of: tuple[str, Any] | None = None
    for store, i in part:
        if snap_of is None or snap_of[0] != store:
            st = Store(store, ctx.settings, **ctx.fs_options)
            st.take_cut()  # a store a broker is writing: its files as at one moment, read robustly
            snap_of = (store, load_snapshot(st, mtimes=ctx.mtimes))
        if ctx.describe and i == 0:
            out.append((store, -1, json.dumps(describe(snap_of[1], ctx.model, ctx.policies[0]))))
        res = simulate(ctx.policies[i], snap_of[1], ctx.model)
        if ctx.summary_only:
            res = {k: v for k, v in res.items() if k not in ("deletions", "disk_usage")}
        out.append((store, i, json.dumps(res)))
    return out


def merge_slices(stores: list[str], parts: list[list[tuple[str, int, str]]]
                 ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The slices' results in (store, policy) order, each tagged ``store``, and the stores' descriptions
    (empty without ``GridContext.describe``)."""
    rows = sorted((r for p in parts for r in p if r[1] >= 0), key=lambda r: (stores.index(r[0]), r[1]))
    described = {r[0]: json.loads(r[2]) for p in parts for r in p if r[1] < 0}
    return [dict(json.loads(r[2]), store=r[0]) for r in rows], described


__all__ = ["GridContext", "grid_policies", "grid_slices", "merge_slices", "simulate_slice"]
