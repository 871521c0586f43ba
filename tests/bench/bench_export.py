"""Export benchmark: ``rmqstore export`` against storelib's own scan on the same cores, SQL over the
snapshot against the same SQL through the ``rocketmq`` data source in Spark local[2], and an incremental
rerun after 1% growth, all in one run.

Not part of the test run. ``python -m tests.bench.bench_export [--size 2GB] [--segment-size 256MB]``

* scan: every segment decoded into the public columns (datasources' decoder, CRC verified), one task per
  segment on a fresh process pool with as many workers as the export uses (both pay the workers'
  start); export: the default engine (auto).
* bound: the pool scan's batches written as one Parquet file per segment with the export's writer options
  and nothing else: what no export of these columns with zstd can beat.
* SQL: ``count(*)``, ``group by topic``, and a store-time range filter with a count, each run twice
  (the second timed) on the snapshot (``datasources.read_snapshot``) and on ``spark.read.format("rocketmq")``.
* incremental: 1% more messages appended through storelib.broker.writer.writer (the broker's write path), then
  ``export --incremental`` against the full export's time.
Also storelib's own one-process scan (CommitLog.scan, all columns, CRCs). Targets (issue "columnar
snapshots"): snapshot SQL >= 10x the data source; incremental < 0.10 of the full export; and (issue
"scale-out", which replaced "export >= 0.8 of the scan") export >= 0.9 of the bound measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from functools import partial

from tests.bench.bench_scan import parse_size


def _scan_segment(store: str, name: str) -> int:
    """Decode one whole segment into the public columns (what the export starts from)."""
    from datasources.commitlog_reader import MessageReadOptions, plan, read_split

    opts = MessageReadOptions.parse({"path": store, "maxSplitBytes": str(1 << 40)})
    return sum(b.num_rows for s in plan(opts) if s.segment_name == name for b in read_split(opts, s))


def _scan_and_write_segment(store: str, out: str, name: str) -> int:
    """The export's bound: :func:`_scan_segment`'s batches written as one Parquet file with the export's
    writer options (its columns, zstd, dictionaries, statistics), without partitioning or manifest."""
    import pyarrow.parquet as pq

    from datasources.commitlog_reader import MessageReadOptions, plan, read_split
    from storelib.snapshot.exporttask import DICTIONARY_COLUMNS, ROW_GROUP, STATS_COLUMNS

    opts = MessageReadOptions.parse({"path": store, "maxSplitBytes": str(1 << 40)})
    rows, writer = 0, None
    for s in plan(opts):
        if s.segment_name != name:
            continue
        for b in read_split(opts, s):
            b = b.drop_columns(["_corrupt"])
            if writer is None:
                names = set(b.schema.names)
                writer = pq.ParquetWriter(os.path.join(out, f"{name}.parquet"), b.schema, compression="zstd",
                                          use_dictionary=[c for c in DICTIONARY_COLUMNS if c in names],
                                          write_statistics=[c for c in STATS_COLUMNS if c in names])
            writer.write_batch(b, row_group_size=ROW_GROUP)
            rows += b.num_rows
    if writer is not None:
        writer.close()
    return rows


def _storelib_scan(store: str) -> int:
    """storelib's own full scan: CommitLog.scan over every segment, all columns, CRCs checked, one process."""
    from storelib.scan.commitlog import CommitLog

    return sum(b.num_rows for b in CommitLog(os.path.join(store, "commitlog")).scan(verify_crc=True))


def _timed(fn):
    t0 = time.monotonic()
    r = fn()
    return time.monotonic() - t0, r


def _median_of(n: int, fn):
    """The median time of ``n`` runs of ``fn`` and its last result."""
    runs = [_timed(fn) for _ in range(n)]
    return sorted(t for t, _ in runs)[n // 2], runs[-1][1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="2GB")
    ap.add_argument("--segment-size", default="256MB")
    ap.add_argument("--keep", metavar="DIR")
    args = ap.parse_args(argv)
    size, seg = parse_size(args.size), parse_size(args.segment_size)
    work = args.keep or tempfile.mkdtemp(prefix="rmqstore-bench-export-")
    store = os.path.join(work, "store")
    out = os.path.join(work, "snap")
    try:
        from jobs.cli import main as cli
        from jobs.engines.schedulers import PoolEngine
        from jobs.export import ExportConfig, export

        if not os.path.isdir(store):
            cli(["gen", store, "--size", str(size), "--segment-size", str(seg)])
        names = sorted(os.listdir(os.path.join(store, "commitlog")))
        warm = PoolEngine()
        try:
            warm.map(partial(_scan_segment, store), names)  # page cache warm
        finally:
            warm.close()
        pool = PoolEngine()  # a fresh pool, as the export gets: both pay the workers' start
        try:
            t_scan, counts = _timed(lambda: pool.map(partial(_scan_segment, store), names))
        finally:
            pool.close()
        bound_dir = os.path.join(work, "bound")
        shutil.rmtree(bound_dir, ignore_errors=True)
        os.makedirs(bound_dir)
        pool = PoolEngine()
        try:
            t_bound, _ = _timed(lambda: pool.map(partial(_scan_and_write_segment, store, bound_dir), names))
        finally:
            pool.close()
            shutil.rmtree(bound_dir, ignore_errors=True)
        t_one, n_one = _timed(partial(_storelib_scan, store))
        shutil.rmtree(out, ignore_errors=True)
        t_exp, m = _timed(lambda: export(ExportConfig(store=store, out=out, progress=False)))
        rows = m["totals"]["rows"]
        print(f"store: {size / 1e9:.1f} GB, {len(names)} segments, {sum(counts)} records; snapshot {rows} rows, "
              f"{m['totals']['bytes'] / 1e6:.0f} MB in {m['totals']['files']} files (engine {m['run']['engine']})")
        print(f"scan (pool, {os.cpu_count()} workers)   {t_scan:7.2f} s  {sum(counts) / t_scan:12,.0f} rows/s")
        print(f"storelib scan (1 process)  {t_one:7.2f} s  {n_one / t_one:12,.0f} rows/s")
        print(f"scan + Parquet write (pool){t_bound:7.2f} s  ratio to the pool scan {t_scan / t_bound:.2f}: the bound "
              f"of any export of these columns with zstd (no partitioning, no manifest)")
        print(f"export (default engine)    {t_exp:7.2f} s  {rows / t_exp:12,.0f} rows/s   "
              f"ratio to the pool scan {t_scan / t_exp:.2f}, to storelib's one-process scan {t_one / t_exp:.2f}")
        print(f"export vs its bound        {t_bound / t_exp:7.2f}  (target >= 0.9: partitioning and the manifest "
              f"cost at most 10% over a plain Parquet write of the same rows)")
        _sql(store, out)
        _incremental(store, out, size, t_exp)
        print(f"peak RSS (this process)    {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:7.0f} MB")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _sql(store: str, out: str) -> None:
    import datasources as ds
    from jobs.spark.sparkutil import get_spark

    spark = get_spark(master="local[2]", app_name="bench-export")
    ds.register(spark)
    live = spark.read.format("rocketmq").load(store)
    snap = ds.read_snapshot(spark, out)
    t_mid = live.selectExpr("percentile_approx(store_timestamp, 0.5)").first()[0]
    queries = {
        "count(*)": lambda df: df.count(),
        "group by topic": lambda df: df.groupBy("topic").count().collect(),
        "time range": lambda df: df.filter(f"store_timestamp >= {t_mid}").count(),
    }
    for label, q in queries.items():  # after a warm-up, the median of three runs each (one run is noisy)
        q(snap)
        t_s, a = _median_of(3, partial(q, snap))
        q(live)
        t_l, b = _median_of(3, partial(q, live))
        same = (sorted(a) == sorted(b)) if isinstance(a, list) else a == b
        print(f"SQL {label:15s} snapshot {t_s:6.2f} s  data source {t_l:6.2f} s  speed-up {t_l / t_s:5.1f}x "
              f"(target >= 10x)  same answer: {same}")


def _incremental(store: str, out: str, size: int, t_full: float) -> None:
    from jobs.export import ExportConfig, export
    from tests.bench.bench_incremental_audit import grow_store

    n = grow_store(store, size // 100)
    t_inc, m = _timed(lambda: export(ExportConfig(store=store, out=out, incremental=True, progress=False)))
    print(f"incremental after +1% ({n} msgs) {t_inc:6.2f} s   ratio to full export {t_inc / t_full:.3f} "
          f"(target < 0.10); rows written {m['run']['rows_written']}")


if __name__ == "__main__":
    main()
