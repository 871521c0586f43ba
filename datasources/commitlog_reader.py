"""The ``rocketmq`` source without Spark: its options, row schema, planning and reading of commitlog units.

:func:`read_messages` returns the rows of ``spark.read.format("rocketmq")`` as a pyarrow Table (or
pandas DataFrame) for notebooks and tools; :mod:`datasources.commitlog_source` is the Spark side.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from storelib.errors import CorruptRecordError
from storelib.fileio.bytesource import open_source
from storelib.scan.commitlog import CommitLog, Split
from storelib.scan.messagecols import (
    DLEDGER_COLUMNS,
    MESSAGE_COLUMNS,
    TIME_COLUMNS,
    message_batch,
    output_schema,
)
from storelib.scan.scanner import SegmentScan
from storelib.scan.splits import find_entry_start, find_record_start, plan_splits, prune_by_time

from .options import StoreOpen, norm_options, parse_bool, parse_bytes, parse_int, parse_time, spark_ddl

EXTRA_COLUMNS = ["segment", "_corrupt"]
MODES = ("PERMISSIVE", "DROPMALFORMED", "FAILFAST")
# columns a pushed filter may test (scalar columns of the schema); pruning uses the first three
PUSHABLE = {"phy_offset", "store_timestamp", "segment", "topic", "queue_id", "queue_offset", "tags", "keys",
            "uniq_key", "msg_id", "tran_type", "magic_version", "size", "body_len", "sys_flag",
            "born_timestamp", "flag", "tags_code", "crc_ok", "store_host", "born_host",
            "dledger_index", "dledger_term", "dledger_committed"}


def rows_schema(opts: MessageReadOptions) -> pa.Schema:
    """The schema of the rows these options produce (a user-given schema's columns, in its order)."""
    full = output_schema(opts.with_body, opts.dledger)
    return full if opts.columns is None else pa.schema([full.field(c) for c in opts.columns])


def with_user_schema(opts: MessageReadOptions, schema: Any) -> MessageReadOptions:
    """Options reading only the columns of a schema given with ``spark.read.schema(...)``.

    Spark 4.3 prunes no columns of a Python data source, so a narrower schema is how a query asks
    for less decoding and less Arrow traffic. Every column must be one of this source's, with its
    type (``body`` turns ``withBody`` on); anything else is a clear error, not a wrong read.
    """
    names = [f.name for f in getattr(schema, "fields", [])]
    full = output_schema(True, opts.dledger)
    if not names or names == output_schema(opts.with_body, opts.dledger).names:
        return opts
    for f in schema.fields:
        if f.name not in full.names:
            raise ValueError(f"rocketmq: unknown column {f.name!r} in the given schema "
                             f"(columns: {', '.join(full.names)})")
        want = spark_ddl(pa.schema([full.field(f.name)])).split(" ", 1)[1].replace(" ", "").lower()
        got = f.dataType.simpleString().replace(" ", "").lower()
        if got != want:
            raise ValueError(f"rocketmq: column {f.name!r} is {want}, the given schema says {got}")
    if len(set(names)) != len(names):
        raise ValueError("rocketmq: the given schema names a column twice")
    return replace(opts, columns=tuple(names), with_body=opts.with_body or "body" in names)



@dataclass(frozen=True)
class Pred:
    """One SQL predicate ``column op value`` (op: = < <= > >= in); rows where it is null are dropped."""

    column: str
    op: str
    value: Any

    def mask(self, batch: pa.RecordBatch) -> pa.Array:
        col = batch.column(self.column)
        if self.op == "in":
            return pc.is_in(col, value_set=pa.array(list(self.value), type=col.type))
        fn = {"=": pc.equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}[self.op]
        return fn(col, pa.scalar(self.value, type=col.type))


def _int_range(preds: list[Pred], column: str) -> tuple[int | None, int | None]:
    """Inclusive integer bounds implied by the predicates on ``column`` (None = unbounded)."""
    lo: int | None = None
    hi: int | None = None

    def up(v: int) -> None:
        nonlocal lo
        lo = v if lo is None else max(lo, v)

    def down(v: int) -> None:
        nonlocal hi
        hi = v if hi is None else min(hi, v)

    for p in preds:
        if p.column != column:
            continue
        vals = list(p.value) if p.op == "in" else [p.value]
        if not vals or not all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            continue
        if p.op in ("=", "in"):
            up(min(vals))
            down(max(vals))
        elif p.op == ">":
            up(p.value + 1)
        elif p.op == ">=":
            up(p.value)
        elif p.op == "<":
            down(p.value - 1)
        elif p.op == "<=":
            down(p.value)
    return lo, hi


@dataclass(frozen=True)
class MessageReadOptions:
    """The ``rocketmq`` source options, parsed and checked once (names as Spark options)."""

    store: StoreOpen
    with_body: bool = False
    verify_crc: bool = True
    topics: tuple[str, ...] | None = None
    from_offset: int | None = None
    to_offset: int | None = None  # exclusive
    from_time: int | None = None
    to_time: int | None = None  # exclusive
    max_split_bytes: int | None = None  # None: about two units per core (storelib.scan.splits.parallel_split_bytes)
    min_partitions: int = 1
    mode: str = "PERMISSIVE"
    time_pruning: bool = True
    batch_rows: int = 65536
    columns: tuple[str, ...] | None = None  # a user-given schema's columns (None: all of output_schema)

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> MessageReadOptions:
        o = norm_options(options)
        known = {"path", "withbody", "verifycrc", "brokerconf", "topics", "fromoffset", "tooffset", "fromtime",
                 "totime", "maxsplitbytes", "minpartitions", "mode", "timepruning", "batchrows"}
        unknown = sorted(k for k in o if k not in known and not StoreOpen.is_option(k))
        if unknown:
            raise ValueError(f"unknown rocketmq option(s): {', '.join(unknown)}")
        mode = str(o.get("mode", "PERMISSIVE")).upper()
        if mode not in MODES:
            raise ValueError(f"option mode: expected one of {', '.join(MODES)}, got {o['mode']!r}")
        topics = o.get("topics")
        if topics is not None and not isinstance(topics, (list, tuple)):
            topics = [t.strip() for t in str(topics).split(",") if t.strip()]
        return cls(
            store=StoreOpen.parse(options),
            with_body=parse_bool("withBody", o.get("withbody", False)),
            verify_crc=parse_bool("verifyCrc", o.get("verifycrc", True)),
            topics=tuple(topics) if topics is not None else None,
            from_offset=parse_int("fromOffset", o["fromoffset"]) if "fromoffset" in o else None,
            to_offset=parse_int("toOffset", o["tooffset"]) if "tooffset" in o else None,
            from_time=parse_time("fromTime", o["fromtime"]) if "fromtime" in o else None,
            to_time=parse_time("toTime", o["totime"]) if "totime" in o else None,
            max_split_bytes=parse_bytes("maxSplitBytes", o["maxsplitbytes"]) if "maxsplitbytes" in o else None,
            min_partitions=max(1, parse_int("minPartitions", o.get("minpartitions", 1))),
            mode=mode,
            time_pruning=parse_bool("timePruning", o.get("timepruning", True)),
            batch_rows=max(1, parse_int("batchRows", o.get("batchrows", 65536))),
        )

    @property
    def dledger(self) -> bool:
        """A DLedger-mode store: the rows carry the entry columns (known from the store's settings)."""
        return self.store.settings().dledger is not None

    def option_preds(self) -> tuple[list[Pred], list[Pred]]:
        """(predicates on every row, predicates on message rows only) from the options.

        Offsets apply to corrupt rows too (they have one); topic and time do not (unknown for them).
        """
        every: list[Pred] = []
        msg: list[Pred] = []
        if self.from_offset is not None:
            every.append(Pred("phy_offset", ">=", self.from_offset))
        if self.to_offset is not None:
            every.append(Pred("phy_offset", "<", self.to_offset))
        if self.from_time is not None:
            msg.append(Pred("store_timestamp", ">=", self.from_time))
        if self.to_time is not None:
            msg.append(Pred("store_timestamp", "<", self.to_time))
        if self.topics is not None:
            msg.append(Pred("topic", "in", self.topics))
        return every, msg


# ------------------------------------------------------------------------------------------------
# planning and reading (no Spark)


def open_commitlog(store: StoreOpen) -> CommitLog:
    """The store's commitlog (``commitlog/`` or a DLedger node's data files, with DLedger's committed index);
    the segment size comes from broker.conf or set.* when given, else from the files."""
    return _commitlog(store)


@functools.lru_cache(maxsize=8)
def _commitlog(store: StoreOpen) -> CommitLog:
    from storelib.broker.settings.store import Store

    st = Store(store.location(), store.settings(), uri=store.path)
    st.require_one_log("the commitlog data source")  # a mixed DLedger store: one line, not half the messages
    return st.commitlog


def plan(opts: MessageReadOptions, pushed: list[Pred] = ()) -> list[Split]:
    """The scan units for these options and pushed predicates, pruned by offset, segment and time; on a
    store a broker is writing, up to the query's own cut (:meth:`StoreOpen.at_cut`: the units end there and
    are read with ranged reads: :attr:`LiveSplit.live`)."""
    every, msg = opts.option_preds()
    preds = [*every, *msg, *pushed]
    lo, hi = _int_range(preds, "phy_offset")
    segments = None
    for p in pushed:
        if p.column == "segment" and p.op in ("=", "in"):
            names = {p.value} if p.op == "=" else set(p.value)
            segments = names if segments is None else segments & names
    t_lo, t_hi = _int_range([*msg, *pushed], "store_timestamp")
    use_time = opts.time_pruning and (t_lo is not None or t_hi is not None)
    store = opts.store.at_cut()
    cl = store.commitlog
    planned = plan_splits(cl, opts.max_split_bytes, min_splits=opts.min_partitions, from_offset=lo,
                          to_offset=None if hi is None else hi + 1, segments=segments, with_timestamps=use_time)
    if use_time:
        planned = prune_by_time(planned, t_lo, t_hi)
    if not store.live or cl.cut_end is None:
        return [p.split for p in planned]
    out = []
    for p in planned:  # clamped at the cut: what the broker writes after it is not this query's
        end = min(p.split.end, max(0, cl.cut_end - p.split.segment_base))
        if end > p.split.start:
            out.append(LiveSplit(**{**dataclasses.asdict(p.split), "end": end}))
    return out


@dataclasses.dataclass(frozen=True)
class LiveSplit(Split):
    """A scan unit of a store a broker is writing: ends at the query's cut, read with ranged reads (a file
    that shrinks under a map would kill the executor)."""

    live: bool = True


def _filter(batch: pa.RecordBatch, preds: list[Pred]) -> pa.RecordBatch:
    if not preds or batch.num_rows == 0:
        return batch
    mask = None
    for p in preds:
        m = p.mask(batch)
        mask = m if mask is None else pc.and_kleene(mask, m)
    return batch.filter(mask)


def _corrupt_row(schema: pa.Schema, phy: int, segment: str, reason: str) -> pa.RecordBatch:
    cols = []
    for f in schema:
        if f.name == "phy_offset":
            cols.append(pa.array([phy], pa.int64()))
        elif f.name == "segment":
            cols.append(pa.array([segment], pa.string()))
        elif f.name == "_corrupt":
            cols.append(pa.array([reason], pa.string()))
        else:
            cols.append(pa.nulls(1, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def read_split(opts: MessageReadOptions, split: Split, pushed: list[Pred] = ()) -> Iterator[pa.RecordBatch]:
    """The rows of one scan unit as record batches of :func:`output_schema` (after all predicates)."""
    every, msg = opts.option_preds()
    msg_preds = [*every, *msg, *pushed]
    bad_preds = [*every, *pushed]
    out_names = rows_schema(opts).names
    dl = opts.dledger
    names = MESSAGE_COLUMNS + (DLEDGER_COLUMNS if dl else []) + (["body"] if opts.with_body else [])
    scan_cols = None
    if opts.columns is not None:  # decode only what is returned or filtered on (phy_offset always)
        need = {*out_names, *(p.column for p in msg_preds), "phy_offset"}
        need |= {TIME_COLUMNS[c] for c in need if c in TIME_COLUMNS}
        names = [c for c in names if c in need]
        scan_cols = [c for c in names if c not in TIME_COLUMNS]
    schema = pa.schema([output_schema(opts.with_body, dl).field(c) for c in [*names, "segment", "_corrupt"]])
    project = out_names != schema.names
    settings = opts.store.settings()
    delays = list(settings.delay_levels_ms)
    cl = open_commitlog(opts.store)
    seg_loc = cl.loc.join(split.segment_name)
    if getattr(split, "live", False):
        seg_loc = dataclasses.replace(seg_loc, mapped=False)
        if seg_loc.local and not os.path.exists(seg_loc.path):
            return  # the broker's cleaner deleted it after the query's cut: expired, nothing to read
    display = f"{cl.folder}/{split.segment_name}"
    find_start = find_entry_start if split.dledger else find_record_start
    src = open_source(seg_loc, split.file_size)
    try:
        seg_len = src.size
        pos = split.start
        end = min(split.end, seg_len)
        while pos < end:
            scan = SegmentScan(src, display, split.segment_base, pos, end, verify_crc=opts.verify_crc,
                               with_body=opts.with_body, delay_levels_ms=delays, batch_rows=opts.batch_rows,
                               columns=scan_cols, **cl.scan_options())
            for batch in scan:
                n = batch.num_rows
                if not n:
                    continue
                out = _filter(message_batch(batch, schema, split.segment_name), msg_preds)
                if out.num_rows:
                    yield out.select(out_names) if project else out
            e = scan.end
            if e is None or e.kind != "invalid":
                return
            nxt = find_start(src, split.segment_base, e.file_offset + 1, end)
            where = f"{e.reason}: {e.detail}".rstrip(": ")
            resumed = (f"resumed at physical offset {split.segment_base + nxt + split.head}" if nxt is not None
                       else "nothing valid follows in this unit")
            if opts.mode == "FAILFAST":
                if _filter(_corrupt_row(schema, e.phy_offset + split.head, split.segment_name, where), bad_preds).num_rows:
                    raise CorruptRecordError(display, e.file_offset, e.reason or "invalid",
                                             f"{e.detail} (physical offset {e.phy_offset + split.head}; mode FAILFAST)")
            elif opts.mode == "PERMISSIVE":
                row = _filter(_corrupt_row(schema, e.phy_offset + split.head, split.segment_name, f"{where} ({resumed})"),
                              bad_preds)
                if row.num_rows:
                    yield row.select(out_names) if project else row
            if nxt is None:
                return
            pos = nxt
    finally:
        src.close()


def read_messages(store: str, *, as_pandas: bool = False, columns: list[str] | None = None,
                  **options: Any) -> pa.Table | Any:
    """The ``rocketmq`` rows without Spark: every unit read in order into one pyarrow Table.

    Options are the data source's (``withBody=True``, ``mode="FAILFAST"``, ``topics="A,B"``, ... in
    camelCase or snake_case). ``columns``: only these columns, decoded and returned (as a narrower
    schema does in Spark). ``as_pandas`` returns a pandas DataFrame.
    """
    opts = MessageReadOptions.parse({**options, "path": store})
    if columns is not None:
        full = output_schema(True, opts.dledger)
        bad = [c for c in columns if c not in full.names]
        if bad or not columns or len(set(columns)) != len(columns):
            raise ValueError(f"rocketmq: bad columns {list(columns)!r} (columns: {', '.join(full.names)})")
        opts = replace(opts, columns=tuple(columns), with_body=opts.with_body or "body" in columns)
    batches = [b for s in plan(opts) for b in read_split(opts, s)]
    table = pa.Table.from_batches(batches, schema=rows_schema(opts))
    return table.to_pandas() if as_pandas else table


__all__ = ["MessageReadOptions", "message_batch", "Pred", "output_schema", "plan", "read_messages",
           "read_split", "rows_schema", "with_user_schema"]
