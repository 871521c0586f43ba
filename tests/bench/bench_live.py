"""Live-store benchmark and acceptance run (issue 27): a broker-like writer process (tests/livewriter.py) at
about 1,500 msg/s with 100 B - 6 KB bodies, reput every 100 ms, the checkpoint rewritten every second and
the cleaner deleting the oldest segment every 6 s once 8 segments are on disk; meanwhile the commands run
as cron would run them (a fresh ``rmqstore`` process each).

Not part of the test run. ``python -m tests.bench.bench_live [--seconds 60] [--rate 1500] [--segment-size 8MB]``

Phases, each with a fresh store:

A. audits, full and ``--since`` alternating, for the whole run: every run must exit 0 with no finding of
   severity warning or above (the issue's "done when");
B. ``export --incremental`` in a loop, then once more after the writer stops: every run exits 0 and the
   snapshot holds each written message exactly once, those the cleaner deleted included;
C. the incremental audit after ``--seconds`` of traffic: a ``--since`` state written at the start, the
   writer runs, then an incremental audit and a full one on the live store at one cut (the writer stopped
   by SIGSTOP, its lock held), with the cleaner and without;
D. the writer's slowdown under a concurrent audit: the writer unthrottled, audits in a loop over the
   second half of the run only; its put rate in each half (from the journal's store times), plain and
   under ``nice -n 10 ionice -c3`` with ``--max-read-rate 50``;
E. the page cache: cold segments out of the cache but for a hot MiB each, then an audit of the live
   store (page care) and one of the same store at rest (none): the cold pages each leaves cached.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from tests.bench.bench_scan import parse_size
from tests.livewriter import LiveConfig, LiveWriter, journal, settings_overrides

RMQ = [sys.executable, "-m", "jobs.cli"]


def _cfg(root: str, a: argparse.Namespace, **kw) -> LiveConfig:
    base = dict(root=root, version=a.version, seconds=a.seconds, rate=a.rate, body_min=100, body_max=6000,
                body_dist="uniform", segment_size=a.segment_size, keep_segments=8, clean_ms=6000,
                cq_units=300_000, index_slots=50_000, index_num=200_000, pause_at_s=5.0, pause_ms=300)
    base.update(kw)
    return LiveConfig(**base)


def _sets(cfg: LiveConfig) -> list[str]:
    return [x for k, v in settings_overrides(cfg).items() for x in ("--set", f"{k}={v}")]


def _run(args: list[str]) -> tuple[int, float, dict | None, str]:
    t0 = time.monotonic()
    p = subprocess.run(RMQ + args, capture_output=True, text=True)
    rep = None
    if "--json" in args and p.stdout.strip():
        try:
            rep = json.loads(p.stdout)
        except ValueError:
            rep = None
    return p.returncode, time.monotonic() - t0, rep, p.stderr


def _fresh(tmp: str, name: str) -> str:
    root = os.path.join(tmp, name)
    shutil.rmtree(root, ignore_errors=True)
    for suffix in (".journal.jsonl",):
        if os.path.exists(root + suffix):
            os.unlink(root + suffix)
    return root


def phase_audits(tmp: str, a: argparse.Namespace) -> dict:
    cfg = _cfg(_fresh(tmp, "a"), a)
    state = os.path.join(tmp, "a.state")
    runs = []
    with LiveWriter(cfg) as w:
        i = 0
        while w.running():
            args = ["audit", cfg.root, "--json", "--quiet", *_sets(cfg)] + (["--since", state] if i % 2 else [])
            code, secs, rep, err = _run(args)
            runs.append({"kind": "since" if i % 2 else "full", "code": code, "seconds": secs,
                         "live": bool(rep and rep["live"]["live"]),
                         "bad": [] if rep is None else [(f["kind"], f["severity"], f["detail"][:100])
                                                         for f in rep["findings"] if f["severity"] != "info"],
                         "info": [] if rep is None else [f["kind"] for f in rep["findings"] if f["severity"] == "info"],
                         "mode": rep["run"]["cross_check_mode"] if rep else None, "err": err[-200:] if code else ""})
            i += 1
        summary = w.wait()
    live = [r for r in runs if r["live"]]
    by = collections.defaultdict(list)
    for r in live:
        by[r["kind"]].append(r["seconds"])
    return {"writer": summary, "runs": len(runs), "live_runs": len(live),
            "exit_codes": dict(collections.Counter(r["code"] for r in live)),
            "warnings_or_worse": [b for r in live for b in r["bad"]],
            "info_kinds": dict(collections.Counter(k for r in live for k in r["info"])),
            "seconds": {k: {"mean": round(float(np.mean(v)), 2), "max": round(max(v), 2), "n": len(v)}
                        for k, v in by.items()},
            "errors": [r["err"] for r in runs if r["code"]][:3]}


def phase_exports(tmp: str, a: argparse.Namespace) -> dict:
    import pyarrow.dataset as ds

    cfg = _cfg(_fresh(tmp, "b"), a)
    snap = os.path.join(tmp, "b.snap")
    shutil.rmtree(snap, ignore_errors=True)
    codes, secs = [], []
    with LiveWriter(cfg) as w:
        while w.running():
            code, s, _, err = _run(["export", cfg.root, "--out", snap, "--incremental", "--quiet", *_sets(cfg)])
            codes.append(code)
            secs.append(s)
        summary = w.wait()
    final = _run(["export", cfg.root, "--out", snap, "--incremental", "--quiet", *_sets(cfg)])[0]
    want = [j["phy"] for j in journal(cfg)]
    got = collections.Counter(ds.dataset(snap, format="parquet", partitioning="hive")
                              .to_table(columns=["phy_offset"]).column("phy_offset").to_pylist())
    first_now = min(int(n) for n in os.listdir(os.path.join(cfg.root, "commitlog")) if n.isdigit())
    expired = [p for p in want if p < first_now]
    return {"writer": summary, "runs": len(codes), "exit_codes": dict(collections.Counter(codes)), "final_exit": final,
            "mean_seconds": round(float(np.mean(secs)), 2) if secs else None, "messages_written": len(want),
            "missing": sum(1 for p in want if not got.get(p)), "duplicates": sum(1 for n in got.values() if n > 1),
            "foreign": len(set(got) - set(want)), "expired_messages": len(expired),
            "expired_in_snapshot": sum(1 for p in expired if got.get(p) == 1)}


def phase_incremental(tmp: str, a: argparse.Namespace, keep_all: bool) -> dict:
    cfg = _cfg(_fresh(tmp, "c"), a, pause_at_s=None, **({"keep_segments": 100_000} if keep_all else {}))
    state = os.path.join(tmp, "c.state")
    for f in (state, state + ".lock"):
        if os.path.exists(f):
            os.unlink(f)
    with LiveWriter(cfg) as w:
        time.sleep(1.0)
        _run(["audit", cfg.root, "--quiet", "--since", state, *_sets(cfg)])  # the state, at the start
        while w.running() and time.monotonic() - w.t0 < a.seconds - 4:
            time.sleep(0.2)
        # both runs read one live cut (the writer stopped, its lock held): a full run that started after the
        # writer's end read the store at rest (mapped, no page care, no writer on the other core) and looked
        # twice as fast as the live incremental run before it
        os.kill(w.pid, signal.SIGSTOP)
        try:
            code_i, t_inc, rep_i, _ = _run(["audit", cfg.root, "--json", "--quiet", "--since", state, *_sets(cfg)])
            code_f, t_full, rep_f, _ = _run(["audit", cfg.root, "--json", "--quiet", *_sets(cfg)])
        finally:
            os.kill(w.pid, signal.SIGCONT)
        w.wait()
    return {"cleaner": not keep_all, "incremental_seconds": round(t_inc, 2), "full_seconds": round(t_full, 2),
            "live": [bool(r and r["live"]["live"]) for r in (rep_i, rep_f)],
            "ratio": round(t_inc / t_full, 3), "codes": [code_i, code_f],
            "incremental_segments_audited": rep_i["run"]["segments_audited"] if rep_i else None,
            "incremental_segments_carried": rep_i["run"]["segments_carried"] if rep_i else None,
            "store_bytes": rep_f["summary"]["bytes_valid"] if rep_f else None,
            "mode": rep_i["run"]["cross_check_mode"] if rep_i else None}


def _rates(cfg: LiveConfig, t0_ms: int, split_s: float, end_s: float) -> tuple[float, float]:
    ts = np.array([j["ts"] for j in journal(cfg)], np.int64) - t0_ms
    first = ts[(ts >= 3000) & (ts < split_s * 1000)]
    second = ts[(ts >= split_s * 1000 + 1000) & (ts < end_s * 1000)]
    return len(first) / (split_s - 3.0), len(second) / (end_s - split_s - 1.0)


def phase_slowdown(tmp: str, a: argparse.Namespace, niced: bool) -> dict:
    seconds = max(20.0, a.seconds * 2 / 3)
    cfg = _cfg(_fresh(tmp, "d"), a, rate=1_000_000, seconds=seconds, pause_at_s=None)
    audits = 0
    with LiveWriter(cfg) as w:
        t0_ms = int(time.time() * 1000)
        split = seconds / 2
        while w.running() and time.monotonic() - w.t0 < split:
            time.sleep(0.1)
        while w.running():
            pre = ["nice", "-n", "10", "ionice", "-c3"] if niced else []
            extra = ["--max-read-rate", "50"] if niced else []
            subprocess.run(pre + RMQ + ["audit", cfg.root, "--quiet", *extra, *_sets(cfg)], capture_output=True)
            audits += 1
        w.wait()
    alone, beside = _rates(cfg, t0_ms, split, seconds)
    return {"niced": niced, "audits": audits, "writer_msg_per_s_alone": round(alone), "beside_audits": round(beside),
            "slowdown": round(1 - beside / alone, 3) if alone else None}


def _cold_residency(root: str, cold: list[str]) -> tuple[int, int]:
    from storelib.fileio.pagecare import residency

    got = [residency(os.path.join(root, "commitlog", n)) for n in cold]
    return sum(int(r.sum()) for r in got if r is not None), sum(len(r) for r in got if r is not None)


def phase_page_cache(tmp: str, a: argparse.Namespace) -> dict:
    """E. An audit of the live store with its cold segments out of the page cache except one hot MiB each:
    the pages it leaves cached there, against the same audit of the store at rest (no page care)."""
    from storelib.fileio.pagecare import drop_pages

    cfg = _cfg(_fresh(tmp, "e"), a, seconds=max(20.0, a.seconds / 3), keep_segments=100_000, pause_at_s=None)
    out = {}
    with LiveWriter(cfg) as w:
        while w.running() and time.monotonic() - w.t0 < cfg.seconds - 6:
            time.sleep(0.2)
        names = sorted(n for n in os.listdir(os.path.join(cfg.root, "commitlog")) if n.isdigit())
        cold = names[:-3]  # the one being written, the one created ahead, and the last full one stay hot
        os.sync()  # dirty pages (written in the last seconds) cannot be dropped: written back first
        for n in cold:
            path = os.path.join(cfg.root, "commitlog", n)
            drop_pages(path, [(0, os.path.getsize(path))])
            with open(path, "rb") as f:
                f.read(1 << 20)  # the broker's hot pages: the first MiB
        out["cold_segments"] = len(cold)
        out["before_live"] = _cold_residency(cfg.root, cold)
        _run(["audit", cfg.root, "--quiet", *_sets(cfg)])
        out["after_live_audit"] = _cold_residency(cfg.root, cold)
        w.wait()
    for n in cold:
        path = os.path.join(cfg.root, "commitlog", n)
        drop_pages(path, [(0, os.path.getsize(path))])
        with open(path, "rb") as f:
            f.read(1 << 20)
    out["before_at_rest"] = _cold_residency(cfg.root, cold)
    _run(["audit", cfg.root, "--quiet", *_sets(cfg)])
    out["after_audit_at_rest"] = _cold_residency(cfg.root, cold)
    out["note"] = "(resident pages, pages) of the cold segments"
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rate", type=int, default=1500)
    p.add_argument("--segment-size", type=parse_size, default=parse_size("8MB"))
    p.add_argument("--version", default="4")
    p.add_argument("--phases", default="ABCDE")
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="rmqstore-bench-live-")
    out: dict = {"seconds": a.seconds, "rate": a.rate, "segment_size": a.segment_size, "version": a.version}
    try:
        if "A" in a.phases:
            out["A_audits"] = phase_audits(tmp, a)
            print(json.dumps({"A_audits": out["A_audits"]}, indent=1), flush=True)
        if "B" in a.phases:
            out["B_exports"] = phase_exports(tmp, a)
            print(json.dumps({"B_exports": out["B_exports"]}, indent=1), flush=True)
        if "C" in a.phases:
            out["C_incremental"] = [phase_incremental(tmp, a, keep_all) for keep_all in (False, True)]
            print(json.dumps({"C_incremental": out["C_incremental"]}, indent=1), flush=True)
        if "D" in a.phases:
            out["D_slowdown"] = [phase_slowdown(tmp, a, niced) for niced in (False, True)]
            print(json.dumps({"D_slowdown": out["D_slowdown"]}, indent=1), flush=True)
        if "E" in a.phases:
            out["E_page_cache"] = phase_page_cache(tmp, a)
            print(json.dumps({"E_page_cache": out["E_page_cache"]}, indent=1), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
