"""The 5.x timer store checked as a task of its own (:func:`timer_task`): the timer topic's records (its
queue group's slices: the topic's queues share one group) and the records its units point at, against
the timerlog, the wheel and timercheck, with :func:`storelib.checks.timers.check_timer_store`'s judgement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.checks.logview import LogView
from storelib.checks.queues import check_queue_offsets
from storelib.checks.segment import Capped
from storelib.checks.tables import RECORD_SCHEMA, group_of
from storelib.checks.tasks.context import CrossContext, group_slices, records_at
from storelib.checks.timers import check_timer_store, has_timer_store
from storelib.errors import StoreError
from storelib.format.timerstore import TIMER_TOPIC, read_timerlog

TIMERS_KEEP = 100_000  # timer-topic records a run keeps for the next incremental one (more: full)


@dataclass(frozen=True)
class TimerTask:
    """The timer store against the timer topic's records (``carried``: an earlier run's, before this run's)."""

    carried: dict | None = None


def timer_task(ctx: CrossContext, task: TimerTask) -> dict[str, Any]:
    """The timer store's findings and summary (None: the store keeps no timer store); with
    ``ctx.snapshots``, the timer records for a later run (None: more than :data:`TIMERS_KEEP`)."""
    root = ctx.root()
    out = Capped()
    if not has_timer_store(root):
        return {"timers": None, "found": out.to_json(), "records": {}}
    g = group_of(TIMER_TOPIC, 0, ctx.groups)
    mine = [t.filter(pc.equal(t.column("topic"), TIMER_TOPIC)) for t in group_slices(ctx, g)]
    if task.carried:
        mine.insert(0, pa.table(task.carried, schema=RECORD_SCHEMA))
    own = pa.concat_tables([t for t in mine if t.num_rows]) if any(t.num_rows for t in mine) else \
        RECORD_SCHEMA.empty_table()
    try:  # the records the units point at, read beforehand (check_timer_store reads the files again)
        py = read_timerlog(root, ctx.settings.mapped_file_size_timer_log).units.column("offset_py").to_numpy()
    except StoreError:
        py = np.zeros(0, np.int64)
    py = np.unique(py[(py >= ctx.log_min) & (py < ctx.log_end)])
    have = own.column("phy_offset").to_numpy()
    extra = records_at(ctx, py[~np.isin(py, have)]) if len(py) else RECORD_SCHEMA.empty_table()
    recs = pa.concat_tables([own, extra]) if extra.num_rows else own
    if extra.num_rows:
        recs = recs.take(np.argsort(recs.column("phy_offset").to_numpy(), kind="stable"))
    view = LogView(recs, pa.table({"pos": pa.array([], pa.int64())}), ctx.lost_array(), ctx.log_min, ctx.log_end,
                   ctx.segment_size)
    facts = check_queue_offsets(view, Capped())  # the timer topic's own facts (its records are all here)
    timers = check_timer_store(root, view, ctx.settings, out, facts, ctx.cut)
    res = {"timers": timers, "found": out.to_json(), "records": None}
    if ctx.resumed and any(kind == "timer_unit_mismatch" for kind, _ in out.counts):
        res["unsettled"] = "a timer unit is not a timer record's"  # it may be a record audited before
    if ctx.snapshots and own.num_rows <= TIMERS_KEEP:
        res["records"] = own.to_pydict()
    return res
