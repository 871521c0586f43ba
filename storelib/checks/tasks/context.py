"""What every cross-file task knows of the whole store (:class:`CrossContext`, plain values: picklable,
so any engine ships it), and the record views a task builds from the segment tasks' tables: its queue
group's records part by part, records looked up by position, and the smallest view on which the whole
view's judgement of a partition is exactly the whole view's (:func:`subset_view`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.checks.logview import LogView, is_member
from storelib.checks.segment import Capped
from storelib.checks.tables import KEY_SCHEMA, RECORD_SCHEMA, PartRef, TableSink
from storelib.errors import Finding
from storelib.fileio.bytesource import Location, resolve


@dataclass(frozen=True)
class CrossContext:
    """The store as every cross-file task sees it."""

    uri: str
    fs_options: dict[str, Any]
    settings: BrokerSettings
    groups: int  # queue groups (:func:`storelib.checks.tables.group_of`)
    log_min: int  # the commitlog's first offset
    log_end: int  # end of the last valid record (the whole view's log end)
    segment_size: int
    lost: tuple[tuple[int, int], ...]  # physical ranges known lost (corrupt regions, missing segments)
    misplaced: bool  # some record is away from its PHYSICALOFFSET field
    ts_lo: int | None  # the records' store-time range (the report's traffic buckets)
    ts_hi: int | None
    part_list: tuple[PartRef, ...]  # every segment task's tables, commitlog order (see :attr:`parts`)
    cq_max_phy: int = -1  # the consume queues' max physical offset (the reput position's source)
    sink: str | None = None  # where a task leaves what a later task reads (None: handed back in its result)
    snapshots: bool = False  # the tasks also return what a later (``--since``) run goes on from
    resumed: bool = False  # going on from an earlier run: ``parts`` are only what was audited since
    cut: Any = None  # the extents a run reads up to (a live store), carried for the checks that need it
    parts_file: str | None = None  # ``part_list`` written once in the work dir (:meth:`for_tasks`)
    gaps: tuple[tuple[int, int], ...] = ()  # the lost ranges no segment file holds (missing segments)
    cq_ends: tuple[int, ...] = ()  # lagdispatch.cq_able_ends of the whole log (:func:`log_cq_ends`)

    @property
    def parts(self) -> tuple[PartRef, ...]:
        """Every part's tables: held here, or read once per process from :attr:`parts_file`."""
        if self.part_list or self.parts_file is None:
            return self.part_list
        got = _PARTS.get(self.parts_file)
        if got is None:
            import pickle

            with resolve(self.parts_file, **self.fs_options).fs.open_input_stream(
                    resolve(self.parts_file, **self.fs_options).path) as f:
                got = pickle.loads(f.read())
            _PARTS.clear()  # one run's at a time
            _PARTS[self.parts_file] = got
        return got

    def for_tasks(self) -> CrossContext:
        """What the tasks are sent: the part list written once to the work dir and read by each worker
        process, not pickled into every task (thousands of parts times hundreds of tasks)."""
        sink = self.table_sink()
        if sink is None or not self.part_list:
            return self
        import pickle
        import uuid

        path = self.sink.rstrip("/") + f"/parts-{uuid.uuid4().hex}.pickle"
        loc = resolve(path, **(self.fs_options if "://" in path else {}))
        with loc.fs.open_output_stream(loc.path) as f:
            f.write(pickle.dumps(self.part_list, protocol=pickle.HIGHEST_PROTOCOL))
        return replace(self, part_list=(), parts_file=path)

    def root(self) -> Location:
        return resolve(self.uri, **self.fs_options)

    def lost_array(self) -> np.ndarray:
        return np.array(sorted(self.lost), dtype=np.int64).reshape(-1, 2)

    def gaps_array(self) -> np.ndarray:
        return np.array(sorted(self.gaps), dtype=np.int64).reshape(-1, 2)

    @property
    def streamable(self) -> bool:
        """Can a partition be proved in agreement part by part (the streamed checks)? Not with lost
        ranges or misplaced records: what they explain needs the whole view's lookups."""
        return not self.lost and not self.misplaced

    def table_sink(self) -> TableSink | None:
        return TableSink(self.sink, self.fs_options if "://" in self.sink else {}) if self.sink else None


_PARTS: dict[str, tuple[PartRef, ...]] = {}  # a worker's copy of the run's part list (CrossContext.parts)


class ByQueue:
    """A finding collector per queue (each finding names its queue in ``extra``): a queue group's
    findings kept apart so the driver adds them queue by queue in the whole store's order."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, int], Capped] = {}

    def add(self, f: Finding) -> None:
        key = (f.extra["topic"], int(f.extra["queue_id"]))
        c = self.queues.get(key)
        if c is None:
            c = self.queues[key] = Capped()
        c.add(f)

    def extend(self, fs) -> None:
        for f in fs:
            self.add(f)

    def per_queue(self) -> dict[tuple[str, int], dict]:
        """Each queue's collector as :meth:`Capped.to_json` gives it."""
        return {k: c.to_json() for k, c in self.queues.items()}

    def to_json(self) -> list:
        return [[t, q, c.to_json()] for (t, q), c in self.queues.items()]

    def replay_json(self, j: list) -> None:
        for t, q, cj in j:
            c = self.queues.get((t, q))
            if c is None:
                c = self.queues[(t, q)] = Capped()
            c.replay_json(cj)


def group_slices(ctx: CrossContext, g: int) -> Iterator[pa.Table]:
    """Queue group ``g``'s records, part after part (commitlog order)."""
    for p in ctx.parts:
        lo, hi = p.group_rows(g)
        if hi > lo:
            yield p.group_table(g, ctx.fs_options)


def _concat(tables: list[pa.Table]) -> pa.Table:
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else RECORD_SCHEMA.empty_table()


def records_at(ctx: CrossContext, positions: np.ndarray) -> pa.Table:
    """The records starting at ``positions`` (sorted, unique), from the parts that hold them."""
    out = []
    for p in ctx.parts:
        if p.phy_hi <= p.phy_lo or not len(positions):
            continue
        a, b = np.searchsorted(positions, [p.phy_lo, p.phy_hi])
        if b <= a:
            continue
        t = p.all_records(ctx.fs_options)
        phy = t.column("phy_offset").to_numpy()
        want = positions[a:b]
        i = np.clip(np.searchsorted(phy, want), 0, max(len(phy) - 1, 0))
        hit = i[phy[i] == want] if len(phy) else i[:0]
        if len(hit):
            out.append(t.take(hit))
    return _concat(out)


def misplaced_records(ctx: CrossContext) -> pa.Table:
    """Every record whose PHYSICALOFFSET field is not its position (few: each is a finding)."""
    out = []
    for p in ctx.parts:
        if p.n_misplaced:
            t = p.all_records(ctx.fs_options)
            keep = t.column("physical_offset_field").to_numpy() != t.column("phy_offset").to_numpy()
            out.append(t.filter(pa.array(keep)))
    return _concat(out)


def keys_of(ctx: CrossContext, positions: np.ndarray) -> pa.Table:
    """The index keys of the records at ``positions`` (sorted, unique), commitlog order."""
    out = []
    for p in ctx.parts:
        if not p.n_keys or p.phy_hi <= p.phy_lo:
            continue
        a, b = np.searchsorted(positions, [p.phy_lo, p.phy_hi])
        if b <= a:
            continue
        k = p.key_table(ctx.fs_options)
        keep = is_member(k.column("pos").to_numpy(), positions[a:b])
        if keep.any():
            out.append(k.filter(pa.array(keep)))
    out = [t for t in out if t.num_rows]
    return pa.concat_tables(out) if out else KEY_SCHEMA.empty_table()


@dataclass
class SubsetView:
    """A :class:`LogView` over some records, and which of them the caller brought (``own``)."""

    view: LogView
    positions: np.ndarray  # every record position in the view, ascending
    extra: dict[str, int] = field(default_factory=dict)  # how many records each source added


def subset_view(ctx: CrossContext, own: pa.Table, wanted: np.ndarray, with_keys: bool = False) -> SubsetView:
    """A view whose lookups answer as the whole view's for ``own``'s records and the positions ``wanted``.

    The whole view looks a position up by PHYSICALOFFSET field first (the record with that field at the
    lowest position), then by position. Records with a field ``x`` are the record at position ``x`` (when
    its field is ``x``) and misplaced records; so the view holds ``own``, every misplaced record, and the
    records at ``wanted`` and at the misplaced records' fields. Two records share a field only among
    those, so the view's field uniqueness is the whole log's as well."""
    mis = misplaced_records(ctx)
    have = np.concatenate([own.column("phy_offset").to_numpy(), mis.column("phy_offset").to_numpy()])
    want = np.concatenate([wanted.astype(np.int64), mis.column("physical_offset_field").to_numpy()])
    want = np.unique(want)
    need = want[~is_member(want, np.unique(have))] if len(want) else want
    looked = records_at(ctx, need)
    allr = _concat([own.cast(RECORD_SCHEMA), mis, looked])
    phy = allr.column("phy_offset").to_numpy()
    order = np.argsort(phy, kind="stable")
    ps = phy[order]
    first = np.r_[True, ps[1:] != ps[:-1]] if len(ps) else np.zeros(0, bool)
    recs = allr.take(order[first])
    positions = ps[first]
    keys = keys_of(ctx, positions) if with_keys else KEY_SCHEMA.empty_table()
    view = LogView(recs, keys, ctx.lost_array(), ctx.log_min, ctx.log_end, ctx.segment_size, ctx.gaps_array())
    return SubsetView(view, positions, {"own": own.num_rows, "misplaced": mis.num_rows, "looked_up": looked.num_rows})
