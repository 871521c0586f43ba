"""Incremental audit benchmark: how big the ``--since`` state is per GB of store, and what an incremental
run costs after the store grows by 1%, against a full audit, in one run.

Not part of the test run. ``python -m tests.bench.bench_incremental_audit [--size 1GB] [--segment-size 256MB]``

Steps (all with the in-process engine, so the figures compare like with like): a full audit without
state; a full audit that writes the state; 1% more messages appended through the broker's write path
(storelib.broker.writer.writer.StoreWriter, dispatched); an incremental audit from the state. Printed: seconds of each,
state bytes (file + sidecar directory) and bytes per GB of store, the incremental/full ratio, peak RSS.
Targets (issue "scheduled audits"): state under 1 MB per GB; incremental after 1% growth under 10% of full.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import tempfile
import time

from tests.bench.bench_scan import parse_size


def _du(path: str) -> int:
    total = 0
    for dirpath, _, names in os.walk(path):
        total += sum(os.path.getsize(os.path.join(dirpath, n)) for n in names)
    return total


def _audit(store: str, since: str | None) -> tuple[float, dict]:
    from jobs.audit import audit_store

    t0 = time.monotonic()
    rep = audit_store(store, engine="local", since=since, quiet=True)
    return time.monotonic() - t0, rep


def grow_store(store: str, nbytes: int) -> int:
    """Append about ``nbytes`` of messages the way the broker writes them (CQ and index dispatched)."""
    from storelib.broker.settings.store import load_settings
    from storelib.broker.writer.writer import StoreWriter
    from storelib.fileio.bytesource import resolve
    from storelib.format.record import Message

    settings = load_settings(None, None, None, resolve(store))
    rnd = random.Random(7)
    written = n = 0
    t = int(time.time() * 1000)
    with StoreWriter(store, settings) as w:
        while written < nbytes:
            body = rnd.randbytes(rnd.randint(200, 2000))
            r = w.append(Message(topic=f"BenchTopic{n % 8}", body=body, queue_id=n % 4, born_timestamp=t,
                                 born_host="10.0.0.9:5000",
                                 properties={"KEYS": f"bench-{n}", "UNIQ_KEY": f"{n:032X}", "TAGS": "grow"}))
            written += r.size
            n += 1
    return n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1GB")
    ap.add_argument("--segment-size", default="256MB")
    ap.add_argument("--keep", metavar="DIR")
    args = ap.parse_args(argv)
    size, seg = parse_size(args.size), parse_size(args.segment_size)
    work = args.keep or tempfile.mkdtemp(prefix="rmqstore-bench-inc-")
    store = os.path.join(work, "store")
    try:
        if not os.path.isdir(store):
            from jobs.cli import main as cli

            cli(["gen", store, "--size", str(size), "--segment-size", str(seg)])
        state = os.path.join(work, "audit.state")
        shutil.rmtree(state + ".d", ignore_errors=True)
        if os.path.exists(state):
            os.unlink(state)
        _audit(store, None)  # page cache warm-up
        t_full, rep = _audit(store, None)
        t_state, _ = _audit(store, state)
        state_bytes = os.path.getsize(state) + _du(state + ".d")
        gb = rep["summary"]["bytes_valid"] / 1e9
        added = grow_store(store, size // 100)
        t_inc, rep2 = _audit(store, state)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(f"store: {gb:.2f} GB of records, {rep['summary']['records']} records; +{added} messages (1%)")
        print(f"full audit (no state)      {t_full:7.2f} s")
        print(f"full audit writing state   {t_state:7.2f} s")
        print(f"incremental after 1%       {t_inc:7.2f} s   ratio to full {t_inc / t_full:.2f} (target < 0.10)")
        print(f"state                      {state_bytes / 1e6:7.1f} MB   {state_bytes / 1e6 / gb:.1f} MB per GB "
              f"(target < 1 MB per GB)")
        print(f"segments audited/carried   {rep2['run']['segments_audited']}/{rep2['run']['segments_carried']}")
        print(f"peak RSS                   {rss / 1e6:7.0f} MB")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
