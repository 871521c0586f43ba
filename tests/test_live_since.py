"""``audit --since`` on a store whose broker's cleaner deletes the oldest segments (tests/livewriter.py): a run
from a state whose oldest segments expired drops them (and the consume-queue and index files the cleaner
deleted after them) and audits only what is new, reporting what a full audit at the same cut reports.
The writer is stopped (SIGSTOP, its lock still held) while the two audits run, so both read one cut."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

from jobs.audit import audit_store
from tests.livewriter import LiveConfig, LiveWriter, settings_overrides


def _cfg(tmp_path) -> LiveConfig:
    return LiveConfig(root=str(tmp_path / "store"), seconds=30.0, rate=800, body_max=3000, segment_size=256 << 10,
                      keep_segments=5, clean_ms=600, cq_units=1000, index_slots=200, index_num=800)


def _findings(rep: dict) -> list:
    return sorted((f["kind"], f["severity"], f["file"] or "", f["offset"] if f["offset"] is not None else -1,
                   f["detail"]) for f in rep["findings"])


def _first_segment(cfg: LiveConfig) -> int:
    return min(int(n) for n in os.listdir(os.path.join(cfg.root, "commitlog")))


def test_incremental_audit_after_the_cleaner_deleted_segments_equals_a_full_audit_at_the_same_cut(tmp_path):
    cfg = _cfg(tmp_path)
    ov = settings_overrides(cfg)
    state = str(tmp_path / "audit.state")
    rounds = []
    with LiveWriter(cfg) as w:
        time.sleep(1.5)
        for _ in range(2):
            audit_store(cfg.root, overrides=ov, quiet=True, since=state)
            first = json.load(open(state))["segments"]
            deadline = time.monotonic() + 20
            while _first_segment(cfg) <= int(min(first)) + cfg.segment_size and time.monotonic() < deadline:
                time.sleep(0.1)  # the cleaner deletes at least two of the state's segments
            os.kill(w.pid, signal.SIGSTOP)  # one cut for both runs: the writer stands still, its lock held
            try:
                shutil.copy(state, state + ".copy")
                inc = audit_store(cfg.root, overrides=ov, quiet=True, since=state + ".copy")
                full = audit_store(cfg.root, overrides=ov, quiet=True)
                kept = json.load(open(state + ".copy"))
                listed = sorted(os.listdir(os.path.join(cfg.root, "commitlog")))
                index = set(os.listdir(os.path.join(cfg.root, "index")))
            finally:
                os.kill(w.pid, signal.SIGCONT)
            rounds.append((first, inc, full, kept, listed, index))
        w.stop()
    for first, inc, full, kept, listed, index in rounds:
        assert inc["live"]["live"] and inc["live"]["cut_offset"] == full["live"]["cut_offset"]
        assert min(listed) > min(first)  # segments of the state expired before the incremental run
        assert "incremental" in inc["run"]["cross_check_mode"], inc["run"]["cross_check_mode"]
        assert inc["run"]["segments_carried"] > 0 and inc["run"]["segments_audited"] < full["run"]["segments_audited"]
        assert _findings(inc) == _findings(full)
        for part in ("queues", "consumers", "summary", "index", "checkpoint"):
            assert inc[part] == full[part], part
        # the state holds what the store holds: no expired segment, no index file or record past the cleaner
        assert set(kept["segments"]) <= set(listed)
        carry = kept["carry"]
        assert carry is not None and carry["log_min"] == int(min(listed))
        assert set(carry["index"]) <= index
        for g in carry["queue_groups"].values():
            assert all(t[5] >= carry["log_min"] for t in g["snap"]["tails"])  # each tail's first record is left
