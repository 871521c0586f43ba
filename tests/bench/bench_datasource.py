"""Benchmark: rows/s of the ``rocketmq`` data source (local[2]) vs storelib's single-process scan.

    .venv/bin/python -m tests.bench.bench_datasource [--gb 2] [--store DIR] [--keep]

Generates a store of ``--gb`` GiB of commitlog (1 GiB segments, realistic mixed record sizes,
consecutive queue offsets and physical offsets, IPv4 hosts) unless ``--store`` points at one, then in
one run prints:

* storelib: ``CommitLog.scan`` (CRC verified, properties map) in this process, and the same scan
  written to Parquet;
* Spark local[2], warm session: ``spark.read.format("rocketmq").load(store).count()`` and a Parquet
  export ``df.write.parquet``;
* the same count with a 3-column schema given by the query (``.schema("topic STRING, ...")``: Spark
  4.3 prunes no columns of a Python source, a narrower schema is how a query reads less), beside
  storelib's single-process scan of the same 3 columns;
* Spark's ingestion floor: ``count()`` of a bench-only Python data source serving the very same rows
  already decoded (Arrow IPC files, memory-mapped, one per partition of the real source). Whatever a
  decoder does, Spark still spends this CPU receiving the rows, so on 2 cores the real count cannot
  beat ``(single-process decode CPU + floor CPU) / 2``; the bound is printed as a ratio.

Every Spark line gives the CPU seconds of the JVM and of everything else (Python workers, kernel),
from /proc, so "both cores really used" is visible.

Not a test (pytest ignores tests/bench); no timing assertions anywhere.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from storelib.format.record import BLANK_MAGIC, Message, encode_message
from storelib.scan.commitlog import CommitLog

SEGMENT = 1 << 30


def _templates(n: int, rng: np.random.Generator) -> list[bytes]:
    out = []
    topics = ["OrderEvents", "PaymentNotify", "InventorySync", "UserActivity"]
    for i in range(n):
        size = int(rng.choice([120, 300, 600, 1200, 2500], p=[0.3, 0.3, 0.2, 0.15, 0.05]))
        body = rng.integers(32, 127, size, dtype=np.uint8).tobytes()
        m = Message(topic=topics[i % 4], body=body, queue_id=i % 8, born_timestamp=1_700_000_000_000,
                    born_host="10.0.0.7:52311", store_host="10.0.0.5:10911", store_timestamp=1_700_000_000_000,
                    properties={"TAGS": f"tag{i % 5}", "KEYS": f"ORD{i:07d}", "UNIQ_KEY": f"{i:032X}",
                                "WAIT": "true"})
        out.append(encode_message(m))
    return out


def generate(root: str, gib: float, seed: int = 7) -> int:
    """Write ``gib`` GiB of full 1 GiB segments; returns the number of records."""
    rng = np.random.default_rng(seed)
    tpl = _templates(4096, rng)
    block = np.frombuffer(b"".join(tpl), np.uint8)
    sizes = np.array([len(t) for t in tpl], np.int64)
    qids = np.array([i % 8 for i in range(len(tpl))], np.int64) + 8 * np.array([i % 4 for i in range(len(tpl))])
    os.makedirs(os.path.join(root, "commitlog"), exist_ok=True)
    nseg = max(1, int(round(gib)))
    queue_next = np.zeros(32, np.int64)
    ts = 1_700_000_000_000
    total = 0
    for s in range(nseg):
        base = s * SEGMENT
        reps = (SEGMENT - 8) // len(block)
        cnt = reps * len(tpl)
        # add whole templates while they fit (keep >= 8 bytes for the blank record)
        used = reps * len(block)
        extra = 0
        while used + sizes[extra] + 8 <= SEGMENT and extra < len(tpl) - 1:
            used += sizes[extra]
            extra += 1
        seg = np.zeros(SEGMENT, np.uint8)
        seg[: reps * len(block)] = np.tile(block, reps)
        seg[reps * len(block) : used] = block[: used - reps * len(block)]
        rec_sizes = np.concatenate([np.tile(sizes, reps), sizes[:extra]])
        rec_q = np.concatenate([np.tile(qids, reps), qids[:extra]])
        cnt = len(rec_sizes)
        starts = np.concatenate([[0], np.cumsum(rec_sizes)[:-1]])
        # consecutive queue offsets per (topic, queue)
        order = np.argsort(rec_q, kind="stable")
        grp = rec_q[order]
        first = np.searchsorted(grp, grp, side="left")
        qoff = np.empty(cnt, np.int64)
        qoff[order] = np.arange(cnt) - first + queue_next[grp]
        queue_next += np.bincount(rec_q, minlength=32)
        stamps = ts + np.arange(cnt) // 50  # 50 messages per ms
        ts = int(stamps[-1]) + 1

        for off, values in ((20, qoff), (28, base + starts), (56, stamps)):  # QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP
            seg[(starts + off)[:, None] + np.arange(8)] = values.astype(">i8").view(np.uint8).reshape(-1, 8)
        seg[used : used + 8] = np.frombuffer(struct.pack(">ii", SEGMENT - used, BLANK_MAGIC), np.uint8)
        seg.tofile(os.path.join(root, "commitlog", f"{base:020d}"))
        total += cnt
    return total


def _rate(rows: int, secs: float) -> str:
    return f"{rows:>10,d} rows in {secs:7.2f} s = {rows / secs:>12,.0f} rows/s"


_TCK = os.sysconf("SC_CLK_TCK")


def _machine_cpu() -> float:
    """CPU seconds (user + nice + system) of the whole machine so far."""
    with open("/proc/stat") as f:
        v = f.readline().split()[1:4]
    return sum(map(int, v)) / _TCK


def _pid_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / _TCK


def _timed_count(df, jvm_pid: int) -> tuple[int, float, float, float]:
    """(rows, wall s, JVM CPU s, other CPU s) of one ``df.count()``."""
    m0, j0, t0 = _machine_cpu(), _pid_cpu(jvm_pid), time.perf_counter()
    n = df.count()
    wall = time.perf_counter() - t0
    jvm = _pid_cpu(jvm_pid) - j0
    return n, wall, jvm, max(0.0, _machine_cpu() - m0 - jvm)


def _cpu(wall: float, jvm: float, other: float) -> str:
    return f"cpu: JVM {jvm:5.2f} s + other {other:5.2f} s = {(jvm + other) / wall:4.2f} cores busy"


class _PreDecodedReader(DataSourceReader):
    def __init__(self, files: list[str]):
        self.files = files

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(f) for f in self.files]

    def read(self, partition: InputPartition):
        import pyarrow as pa

        with pa.memory_map(partition.value) as src:
            r = pa.ipc.open_file(src)
            for i in range(r.num_record_batches):
                yield r.get_batch(i)


class PreDecoded(DataSource):
    """Bench only: serves rows decoded beforehand, so a count() measures Spark's ingestion alone."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq_predecoded"

    def schema(self) -> str:
        return self.options["ddl"]

    def reader(self, schema) -> DataSourceReader:
        return _PreDecodedReader(self.options["files"].split("\n"))


def write_predecoded(store: str, out_dir: str, parts: int) -> tuple[list[str], str]:
    """The source's default rows of ``store`` as ``parts`` Arrow IPC files, and their Spark DDL."""
    from datasources.commitlog_reader import read_messages
    from datasources.options import spark_ddl

    table = read_messages(store)
    os.makedirs(out_dir, exist_ok=True)
    files = []
    step = -(-table.num_rows // parts)
    for i in range(parts):
        part = table.slice(i * step, step)
        name = os.path.join(out_dir, f"part-{i:04d}.arrow")
        with pa.OSFile(name, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            for b in part.to_batches(max_chunksize=65536):
                w.write_batch(b)
        files.append(name)
    return files, spark_ddl(table.schema)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--store", help="use this store root instead of generating one")
    ap.add_argument("--keep", action="store_true", help="keep the generated store")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="rmq-bench-")
    store = args.store or os.path.join(tmp, "store")
    try:
        if not args.store:
            t = time.perf_counter()
            n = generate(store, args.gb)
            print(f"generated {n:,d} records ({args.gb} GiB) in {time.perf_counter() - t:.1f} s at {store}")
        cl = CommitLog(os.path.join(store, "commitlog"))
        for seg in cl.segments:  # warm the page cache so both sides read from memory
            with open(seg.path, "rb") as f:
                while f.read(64 << 20):
                    pass

        t, c = time.perf_counter(), time.process_time()
        rows = sum(b.num_rows for b in cl.scan())
        single, single_cpu = time.perf_counter() - t, time.process_time() - c
        print("storelib single process, scan        :", _rate(rows, single), f"  cpu {single_cpu:5.2f} s")
        narrow = ["topic", "store_timestamp", "size"]
        t = time.perf_counter()
        rows_n = sum(b.num_rows for b in cl.scan(columns=narrow))
        single_n = time.perf_counter() - t
        print(f"storelib single process, {len(narrow)} columns:", _rate(rows_n, single_n))
        t = time.perf_counter()
        out = os.path.join(tmp, "single.parquet")
        writer = None
        for b in cl.scan():
            b = b.drop_columns(["properties_raw"])
            writer = writer or pq.ParquetWriter(out, b.schema)
            writer.write_batch(b)
        writer.close()
        single_pq = time.perf_counter() - t
        print("storelib single process, to Parquet  :", _rate(rows, single_pq))

        from datasources import register
        from jobs.spark.sparkutil import get_spark

        spark = get_spark(master="local[2]", app_name="bench_datasource")
        register(spark)
        df = spark.read.format("rocketmq").load(store)
        print(f"spark partitions: {df.rdd.getNumPartitions()}")
        jvm_pid = spark.sparkContext._gateway.proc.pid
        df.count()  # warm: Python workers started, imports done
        n, spark_count, jvm_s, other_s = _timed_count(df, jvm_pid)
        print("spark local[2] (warm), count()       :", _rate(n, spark_count),
              f"  {single / spark_count:.2f}x single   {_cpu(spark_count, jvm_s, other_s)}")
        dfn = spark.read.format("rocketmq").schema("topic STRING, store_timestamp BIGINT, size INT").load(store)
        dfn.count()
        nn, spark_n, nj, no = _timed_count(dfn, jvm_pid)
        print(f"spark local[2] (warm), count(), schema of the same {len(narrow)} columns:", _rate(nn, spark_n),
              f"  {single_n / spark_n:.2f}x single ({len(narrow)} columns)   {_cpu(spark_n, nj, no)}")
        files, ddl = write_predecoded(store, os.path.join(tmp, "predecoded"), df.rdd.getNumPartitions())
        spark.dataSource.register(PreDecoded)
        dff = spark.read.format("rocketmq_predecoded").option("ddl", ddl).option("files", "\n".join(files)).load()
        dff.count()
        nf, floor, fj, fo = _timed_count(dff, jvm_pid)
        print("spark local[2] (warm), count() of the same rows pre-decoded (ingestion floor):", _rate(nf, floor),
              f"  {_cpu(floor, fj, fo)}")
        bound = single / ((single_cpu + fj + fo) / 2)
        print(f"  => bound on 2 cores: count() >= (decode cpu {single_cpu:.2f} s + floor cpu {fj + fo:.2f} s) / 2"
              f" = {(single_cpu + fj + fo) / 2:.2f} s, i.e. at most {bound:.2f}x single for any decoder"
              f" (target 1.6x)")
        shutil.rmtree(os.path.join(tmp, "predecoded"), ignore_errors=True)
        t = time.perf_counter()
        df.write.mode("overwrite").parquet(os.path.join(tmp, "spark.parquet"))
        spark_pq = time.perf_counter() - t
        print("spark local[2] (warm), to Parquet    :", _rate(n, spark_pq),
              f"  {single_pq / spark_pq:.2f}x single")
        assert n == rows == nn == rows_n == nf, (n, rows, nn, rows_n, nf)
        spark.stop()
    finally:
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
