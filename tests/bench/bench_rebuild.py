"""Rebuild throughput on a generated store: local engine vs Spark local[2], warm and end-to-end.

Not collected by pytest (tests/bench is ignored). Run:

    .venv/bin/python tests/bench/bench_rebuild.py [--gb 2] [--segment-mb 256] [--dir /tmp/rmq-bench]

The store is generated vectorised: a few hundred distinct encoded records (64 queues, keys, tags,
bodies of 60-400 bytes) are tiled into segments like the broker appends them (blank record at each
segment end), then QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP are patched with numpy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from storelib.format.record import Message, blank_record, encode_message  # noqa: E402


def _templates(n: int, rng: np.random.Generator) -> list[tuple[bytes, int]]:
    out = []
    for i in range(n):
        topic = f"BenchTopic{i % 8}"
        qid = (i // 8) % 8
        body = bytes(rng.integers(32, 127, int(rng.integers(60, 400)), dtype=np.uint8))
        props = {"KEYS": f"order{i} user{i % 97}", "TAGS": f"tag{i % 5}", "UNIQ_KEY": f"7F0000010001{i:020X}",
                 "WAIT": "true"}
        m = Message(topic=topic, body=body, queue_id=qid, born_host="10.1.2.3:50000", store_host="10.1.2.4:10911",
                    born_timestamp=1_700_000_000_000, properties=props)
        out.append((encode_message(m), (i % 8) * 8 + qid))
    return out


def generate_store(root: Path, total_bytes: int, segment_size: int, seed: int = 1) -> int:
    """Write ``root/commitlog`` of about ``total_bytes``; returns the number of messages."""
    rng = np.random.default_rng(seed)
    tpl = _templates(512, rng)
    sizes = np.array([len(b) for b, _ in tpl], dtype=np.int64)
    qcode = np.array([q for _, q in tpl], dtype=np.int64)
    d = root / "commitlog"
    d.mkdir(parents=True, exist_ok=True)
    counters = np.zeros(64, dtype=np.int64)
    ts = 1_700_000_000_000
    total = 0
    nseg = max(1, total_bytes // segment_size)
    for s in range(nseg):
        # choose records until the segment is (almost) full: L + 8 <= free for each record
        est = segment_size // int(sizes.mean()) + 64
        pick = rng.integers(0, len(tpl), est)
        lens = sizes[pick]
        ends = np.cumsum(lens)
        k = int(np.searchsorted(ends + 8, segment_size, side="right"))
        pick, lens = pick[:k], lens[:k]
        starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
        data = bytearray(b"".join(tpl[i][0] for i in pick.tolist()))
        used = len(data)
        data += blank_record(segment_size - used)
        data += bytes(segment_size - len(data))
        a = np.frombuffer(data, dtype=np.uint8)
        # queue offsets: running count per queue (carried over segments)
        q = qcode[pick]
        order = np.argsort(q, kind="stable")
        qs = q[order]
        first = np.r_[0, np.flatnonzero(qs[1:] != qs[:-1]) + 1]
        grp_start = np.repeat(first, np.diff(np.r_[first, len(qs)]))
        rank = np.empty(k, dtype=np.int64)
        rank[order] = np.arange(k) - grp_start
        qoff = counters[q] + rank
        counters += np.bincount(q, minlength=64)
        phy = s * segment_size + starts
        store_ts = ts + np.arange(k) // 50
        ts = int(store_ts[-1]) + 1
        for field_off, vals in ((20, qoff), (28, phy), (56, store_ts)):
            be = vals.astype(">i8").view(np.uint8).reshape(k, 8)
            idx = (starts + field_off)[:, None] + np.arange(8)
            a[idx] = be
        with open(d / f"{s * segment_size:020d}", "wb") as f:
            f.write(a)
        total += k
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--segment-mb", type=int, default=256)
    ap.add_argument("--dir", default="/tmp/rmq-bench")
    ap.add_argument("--keep", action="store_true", help="reuse an existing generated store")
    args = ap.parse_args()
    base = Path(args.dir)
    store = base / "store"
    seg = args.segment_mb * 1024 * 1024
    conf = base / "broker.conf"
    if not (args.keep and store.exists()):
        shutil.rmtree(base, ignore_errors=True)
        t = time.time()
        n = generate_store(store, int(args.gb * 1024**3), seg)
        print(f"generated {n:,} messages ({args.gb} GB, {args.segment_mb} MB segments) in {time.time() - t:.1f}s")
    base.mkdir(parents=True, exist_ok=True)
    conf.write_text(f"mappedFileSizeCommitLog={seg}\n")

    from jobs.rebuild import RebuildConfig, rebuild

    def one(name: str, **kw) -> dict:
        out = base / f"out-{name}"
        shutil.rmtree(out, ignore_errors=True)
        os.sync()  # the previous run's ~0.6 GB of output is written back now, not during this run
        t = time.time()
        m = rebuild(RebuildConfig(store=str(store), out=str(out), broker_conf=str(conf), broker_version="4",
                                  progress=False, **kw), spark=SPARK.get("s"))
        el = time.time() - t
        n = m["counts"]["records"]
        print(f"{name:28s} {n:>12,} msgs  {el:8.2f} s  {n / el:>12,.0f} msg/s")
        return {"n": n, "s": el, "files": m["files"]}

    SPARK: dict = {}
    local = one("local (1 process)")
    t0 = time.time()
    from jobs.spark.sparkutil import get_spark

    SPARK["s"] = get_spark("local[2]", app_name="rmqstore-bench", batch_job=True)  # as `rmqstore rebuild` does
    start = time.time() - t0
    cold = one("spark local[2] first run", engine="spark")
    print(f"{'spark local[2] end-to-end':28s} {cold['n']:>12,} msgs  {cold['s'] + start:8.2f} s  "
          f"{cold['n'] / (cold['s'] + start):>12,.0f} msg/s (incl. {start:.1f}s session start)")
    warm = one("spark local[2] warm", engine="spark")
    same = local["files"] == cold["files"] == warm["files"]
    print(f"outputs identical: {same}")
    print(f"speed-up warm local[2] vs 1 process: {local['s'] / warm['s']:.2f}x "
          f"(targets: >= 1.0M msg/s warm, >= 1.7x); cpus: {os.cpu_count()}")
    SPARK["s"].stop()


if __name__ == "__main__":
    main()
