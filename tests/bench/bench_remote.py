"""Remote scan benchmark: a 1 GB store scanned from a loopback S3 server vs the local mmap path, one run.

Not part of the test run. ``python -m tests.bench.bench_remote [--size 1GB] [--segment-size 128MB]``

It generates a store (``storelib.gen``; commitlog only), starts moto's S3 server on 127.0.0.1 (the
same server the tests use, stopped by PID at exit), uploads the commitlog, then scans the whole
commitlog with CRC check through storelib (``CommitLog.scan``) from the local path (mmap) and from
``s3://`` (ranged reads with background read-ahead), best of ``--repeat``, and prints MB/s for both,
the ratio (target: remote >= 0.5 x local), how many windows came from the read-ahead buffer, and
the peak RSS growth during the remote scans (flat: a segment is never read whole).

About the default segment size: moto answers every ranged GET by reading the *whole object* from
its temp file and slicing it (``moto/s3/responses.py``), so a GET from a 1 GiB object costs it ~1 GiB
of copying, whatever the range; real S3, MinIO and the like cost the range only. With 1 GiB segments
(``--segment-size 1GB``) the benchmark measures moto's copying, not the client; 128 MiB segments (a
legal ``mappedFileSizeCommitLog``) keep the server's cost close to a real one. ``--endpoint`` runs
against any other S3-compatible server instead (credentials from AWS_* variables).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

GiB = 1024**3


def parse_size(text: str) -> int:
    """``1GB``/``1GiB``/``128MB``/plain bytes → bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    return int(float(m.group(1)) * 1024 ** "_kmgt".index(m.group(2) or "_"))


def rss_mb() -> float:
    """Current resident set size (Linux /proc), MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakRss:
    """Samples RSS every 20 ms in a thread: the peak during a block (ru_maxrss only ever grows)."""

    def __enter__(self) -> PeakRss:
        self.base = rss_mb()
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def build(root: Path, size: int, segment_size: int) -> dict:
    """A generated 4.x store of ``size`` commitlog bytes (no CQ/index: the scan needs only the commitlog)."""
    from storelib.brokerconf import BrokerSettings
    from storelib.gen import GenConfig, generate

    settings = dataclasses.replace(BrokerSettings.defaults("4"), mapped_file_size_commit_log=segment_size)
    res = generate(root, GenConfig(size=size, version="4", seed=1), settings, dispatch=False,
                   write_config_files=False)
    return res.to_dict()


def scan(loc, segment_size: int) -> tuple[int, int, float, dict]:
    """Full scan with CRC check (``CommitLog.scan``); returns (messages, bytes, seconds, read-ahead counters)."""
    from storelib.bytesource import ArrowFileSource
    from storelib.commitlog import CommitLog

    stats = {"prefetched": 0, "direct": 0}
    real_close = ArrowFileSource.close

    def counting_close(self) -> None:  # read the read-ahead counters before the source goes
        ahead = self._ahead
        if ahead is not None:
            stats["prefetched"] += ahead.prefetched
            stats["direct"] += ahead.direct
        real_close(self)

    ArrowFileSource.close = counting_close
    try:
        cl = CommitLog(loc, segment_size)
        msgs = 0
        ends: list = []
        t0 = time.perf_counter()
        for b in cl.scan(verify_crc=True, ends=ends):
            msgs += b.num_rows
        dt = time.perf_counter() - t0
    finally:
        ArrowFileSource.close = real_close
    bad = [e for e in ends if e.kind not in ("blank", "segment_end", "end_of_data") or e.crc_errors]
    assert not bad and len(ends) == len(cl.segments), bad
    return msgs, sum(s.file_size for s in cl.segments), dt, stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=parse_size, default=GiB, help="commitlog bytes (default 1GB = 1 GiB)")
    ap.add_argument("--segment-size", type=parse_size, default=128 * 1024**2,
                    help="mappedFileSizeCommitLog (default 128MB; see the module doc about moto)")
    ap.add_argument("--dir", type=Path, help="build/reuse the store here (default: a temp dir, removed)")
    ap.add_argument("--repeat", type=int, default=2, help="best of N scans per path")
    ap.add_argument("--endpoint", help="use this S3-compatible server instead of starting moto")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from storelib.bytesource import DEFAULT_WINDOW, resolve
    from tests.s3server import running_s3_server

    root = args.dir or Path(tempfile.mkdtemp(prefix="rmq-bench-remote-")) / "store"
    try:
        if (root / "commitlog").is_dir() and any((root / "commitlog").iterdir()):
            print(f"reusing store at {root}")
        else:
            t0 = time.perf_counter()
            info = build(root, args.size, args.segment_size)
            print(f"generated {info['bytes'] / 1e6:.0f} MB, {info['records']:,} records in {info['segments']} "
                  f"segment(s) of {args.segment_size / 2**20:.0f} MiB in {time.perf_counter() - t0:.1f} s")
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPU(s), scan window {DEFAULT_WINDOW >> 20} MiB")

        server = running_s3_server() if not args.endpoint else None
        with server or _external(args.endpoint) as s3:
            fs = s3.filesystem()
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            fs.create_dir(bucket)
            t0 = time.perf_counter()
            uri = s3.upload(root / "commitlog", f"{bucket}/store/commitlog")
            print(f"uploaded to {uri} via {s3.endpoint} in {time.perf_counter() - t0:.1f} s")
            local = resolve(root / "commitlog")
            remote = resolve(uri, **s3.fs_options())

            gc.collect()
            best_l = min((scan(local, args.segment_size) for _ in range(args.repeat)), key=lambda r: r[2])
            gc.collect()
            with PeakRss() as mem:
                best_r = min((scan(remote, args.segment_size) for _ in range(args.repeat)), key=lambda r: r[2])
            assert best_r[0] == best_l[0], (best_r[0], best_l[0])
            mb_l = best_l[1] / best_l[2] / 1e6
            mb_r = best_r[1] / best_r[2] / 1e6
            print(f"local  (mmap)              {best_l[2]:7.2f} s  {mb_l:8.0f} MB/s  {best_l[0] / best_l[2] / 1e6:5.2f} M msg/s")
            print(f"s3     (ranged, read-ahead) {best_r[2]:6.2f} s  {mb_r:8.0f} MB/s  {best_r[0] / best_r[2] / 1e6:5.2f} M msg/s"
                  f"  windows: {best_r[3]['prefetched']} from read-ahead, {best_r[3]['direct']} direct")
            print(f"remote/local ratio {mb_r / mb_l:.2f}  (target >= 0.50: {'MET' if mb_r >= 0.5 * mb_l else 'missed'})")
            print(f"RSS during the S3 scans: start {mem.base:.0f} MB, peak {mem.peak:.0f} MB "
                  f"(+{mem.peak - mem.base:.0f} MB; a segment is {args.segment_size >> 20} MiB)")
            print(f"peak RSS of the whole run {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    finally:
        if args.dir is None:
            shutil.rmtree(root.parent, ignore_errors=True)
    return 0


class _external:
    """An already running S3-compatible server (``--endpoint``), with credentials from the environment."""

    def __init__(self, endpoint: str):
        from tests.s3server import S3Server

        host, _, port = endpoint.split("://", 1)[-1].rstrip("/").partition(":")
        self.server = S3Server(host, int(port or 80), -1,
                               os.environ.get("AWS_ACCESS_KEY_ID", ""), os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
                               os.environ.get("AWS_REGION", "us-east-1"))

    def __enter__(self):
        return self.server

    def __exit__(self, *exc: object) -> None:
        pass


if __name__ == "__main__":
    raise SystemExit(main())
