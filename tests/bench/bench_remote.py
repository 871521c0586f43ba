"""Remote scan benchmark: a 1 GB store scanned from loopback S3 servers vs the local mmap path, one run.

Not part of the test run. ``python -m tests.bench.bench_remote [--size 1GB] [--segment-size 128MB]
[--server moto|dir|both]``

It generates a store (``storelib.generator.gen``; commitlog only), then for each server (``--server``, default
both) starts it on 127.0.0.1 (stopped by PID at exit), uploads the commitlog, and in the same run
scans the whole commitlog with CRC check through storelib (``CommitLog.scan``) from the local path
(mmap) and from ``s3://`` (ranged reads with background read-ahead), best of ``--repeat`` each. Per
server it prints MB/s local, MB/s remote, the ratio (target: remote >= 0.5 x local), how many windows
came from the read-ahead buffer and the peak RSS growth during the remote scans (flat: a segment is
never read whole); a summary at the end has one line per server. Every line names its server.

The two servers:

- ``moto``: moto's standalone server, the one the tests use (``tests/s3server.py``). It answers every
  ranged GET by reading the *whole object* (``moto/s3/models.py`` ``value`` reads the object from its
  temp file into one bytes; ``responses.py`` ``_handle_range_header`` then slices the range out), so
  each 16 MiB request of a read-ahead window (``storelib.fileio.bytesource.FILL_CHUNK``) costs it a read of
  the whole 128 MiB segment: its numbers measure moto, and get worse the larger the segment (hence
  the 128 MiB default rather than 1 GiB).
- ``dir``: ``tests/s3dir.py``, a small S3-compatible server over a directory (the store is hard-linked
  into its root). It serves a range with ``sendfile`` from the page cache, at the cost of the range,
  as real S3 and MinIO do; this is the number that says what our client does. Neither real S3 nor
  MinIO can be installed here.

Both still run on the same 2-core machine as the client (the server's CPU and the client's compete),
so neither is a network measurement. ``--endpoint`` runs against any other S3-compatible server
instead (credentials from AWS_* variables).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.bench.bench_scan import parse_size  # noqa: E402 (one size parser for the benchmarks)

GiB = 1024**3


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
    from storelib.broker.settings.brokerconf import BrokerSettings
    from storelib.generator.gen import generate
    from storelib.generator.genplan import GenConfig

    settings = dataclasses.replace(BrokerSettings.defaults("4"), mapped_file_size_commit_log=segment_size)
    res = generate(root, GenConfig(size=size, version="4", seed=1), settings, dispatch=False,
                   write_config_files=False)
    return res.to_dict()


def scan(loc, segment_size: int) -> tuple[int, int, float, dict]:
    """Full scan with CRC check (``CommitLog.scan``); returns (messages, bytes, seconds, read-ahead counters)."""
    from storelib.fileio.bytesource import ArrowFileSource
    from storelib.scan.commitlog import CommitLog

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


def bench_one(name: str, s3, root: Path, args: argparse.Namespace) -> dict:
    """Upload the commitlog to one server, then scan local and remote in this same run (best of N each)."""
    from storelib.fileio.bytesource import resolve

    label = f"[{name}]"
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    s3.filesystem().create_dir(bucket)
    t0 = time.perf_counter()
    uri = s3.upload(root / "commitlog", f"{bucket}/store/commitlog")
    print(f"{label} uploaded to {uri} via {s3.endpoint} in {time.perf_counter() - t0:.1f} s")
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
    print(f"{label} local  (mmap)               {best_l[2]:6.2f} s  {mb_l:8.0f} MB/s  "
          f"{best_l[0] / best_l[2] / 1e6:5.2f} M msg/s")
    print(f"{label} s3     (ranged, read-ahead) {best_r[2]:6.2f} s  {mb_r:8.0f} MB/s  "
          f"{best_r[0] / best_r[2] / 1e6:5.2f} M msg/s"
          f"  windows: {best_r[3]['prefetched']} from read-ahead, {best_r[3]['direct']} direct")
    print(f"{label} remote/local ratio {mb_r / mb_l:.2f}  (target >= 0.50: {'MET' if mb_r >= 0.5 * mb_l else 'missed'})")
    print(f"{label} RSS during the S3 scans: start {mem.base:.0f} MB, peak {mem.peak:.0f} MB "
          f"(+{mem.peak - mem.base:.0f} MB; a segment is {args.segment_size >> 20} MiB)")
    return {"server": name, "bytes": best_l[1], "local": mb_l, "remote": mb_r, "ratio": mb_r / mb_l}


SERVERS = {"moto": "moto standalone server (copies the whole object per ranged GET)",
           "dir": "tests/s3dir.py directory server (sendfile of the range, as S3/MinIO cost)"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=parse_size, default=GiB, help="commitlog bytes (default 1GB = 1 GiB)")
    ap.add_argument("--segment-size", type=parse_size, default=128 * 1024**2,
                    help="mappedFileSizeCommitLog (default 128MB; see the module doc about moto)")
    ap.add_argument("--dir", type=Path, help="build/reuse the store here (default: a temp dir, removed)")
    ap.add_argument("--repeat", type=int, default=2, help="best of N scans per path")
    ap.add_argument("--server", choices=["moto", "dir", "both"], default="both",
                    help="loopback S3 server(s) to start: moto, the directory server, or both (default)")
    ap.add_argument("--endpoint", help="use this S3-compatible server instead of starting any")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from storelib.fileio.bytesource import DEFAULT_WINDOW
    from tests.s3server import running_s3_server

    root = args.dir or Path(tempfile.mkdtemp(prefix="rmq-bench-remote-")) / "store"
    results = []
    try:
        if (root / "commitlog").is_dir() and any((root / "commitlog").iterdir()):
            print(f"reusing store at {root}")
        else:
            t0 = time.perf_counter()
            info = build(root, args.size, args.segment_size)
            print(f"generated {info['bytes'] / 1e6:.0f} MB, {info['records']:,} records in {info['segments']} "
                  f"segment(s) of {args.segment_size / 2**20:.0f} MiB in {time.perf_counter() - t0:.1f} s")
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPU(s), scan window {DEFAULT_WINDOW >> 20} MiB, "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

        if args.endpoint:
            runs = [("endpoint", args.endpoint, lambda: _external(args.endpoint))]
        else:
            names = ["moto", "dir"] if args.server == "both" else [args.server]
            # the directory server's root sits beside the store, so upload() hard-links instead of copying
            start = {"moto": running_s3_server, "dir": lambda: _dir_server(root)}
            runs = [(n, SERVERS[n], start[n]) for n in names]
        for name, what, open_server in runs:
            print(f"--- server {name}: {what}")
            with open_server() as s3:
                results.append(bench_one(name, s3, root, args))
        size = results[0]["bytes"] if results else 0
        print(f"--- summary ({size / 2**30:.2f} GiB commitlog, {args.segment_size >> 20} MiB segments, "
              f"best of {args.repeat}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
        for r in results:
            print(f"server {r['server']:<8} local {r['local']:7.0f} MB/s   remote {r['remote']:7.0f} MB/s   "
                  f"ratio {r['ratio']:.2f}  ({'MET' if r['ratio'] >= 0.5 else 'missed'} >= 0.50)")
        print(f"peak RSS of the whole run {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    finally:
        if args.dir is None:
            shutil.rmtree(root.parent, ignore_errors=True)
    return 0


@contextlib.contextmanager
def _dir_server(store: Path) -> Iterator:
    """The directory server over a fresh root next to the store (same filesystem: upload hard-links)."""
    from tests.s3dir import running_dir_s3_server

    try:
        d = Path(tempfile.mkdtemp(prefix="rmq-bench-s3dir-", dir=store.parent))
    except OSError:
        d = Path(tempfile.mkdtemp(prefix="rmq-bench-s3dir-"))
    try:
        with running_dir_s3_server(d) as s3:
            yield s3
    finally:
        shutil.rmtree(d, ignore_errors=True)


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
