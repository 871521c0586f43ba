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


def test_incremental_audit_goes_on_when_the_keys_its_state_left_unindexed_were_deleted_by_the_cleaner(tmp_path):
    """The state's cut fell between a record and its dispatch (its keys carried as not indexed yet); the
    cleaner then deleted the segment holding those records. The next --since run drops them from the carry
    (and skips the grown index file's entries that point at them) instead of auditing in full, and reports
    what a full audit at the same cut does."""
    cfg = _cfg(tmp_path)
    ov = settings_overrides(cfg)
    state = str(tmp_path / "audit.state")
    with LiveWriter(cfg) as w:
        time.sleep(1.0)
        pending: list = []
        for _ in range(40):  # a state whose cut caught keys the reput had not indexed yet
            if os.path.exists(state):
                os.unlink(state)
            audit_store(cfg.root, overrides=ov, quiet=True, since=state)
            pending = (json.load(open(state)).get("carry") or {}).get("keys", {}).get("phy") or []
            if pending:
                break
        assert pending, "no state caught keys not indexed yet"
        deadline = time.monotonic() + 20
        while _first_segment(cfg) <= max(pending) and time.monotonic() < deadline:
            time.sleep(0.1)  # the cleaner deletes the segment holding them
        os.kill(w.pid, signal.SIGSTOP)
        try:
            inc = audit_store(cfg.root, overrides=ov, quiet=False, since=state)
            full = audit_store(cfg.root, overrides=ov, quiet=True)
            first = _first_segment(cfg)
        finally:
            os.kill(w.pid, signal.SIGCONT)
        w.stop()
    assert first > max(pending)
    assert inc["live"]["cut_offset"] == full["live"]["cut_offset"]
    assert "incremental" in inc["run"]["cross_check_mode"], inc["run"]["cross_check_mode"]  # not a full run
    assert _findings(inc) == _findings(full)
    for part in ("queues", "consumers", "summary", "index", "checkpoint"):
        assert inc[part] == full[part], part
    keys = json.load(open(state))["carry"]["keys"]
    assert all(p >= first for p in keys["phy"])


_HOLD = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0); print('locked', flush=True); sys.stdin.read()")


def test_a_consume_queue_unit_caught_in_its_copy_is_waited_for_on_a_live_store(tmp_path, monkeypatch):
    """The broker copies a unit's offset, size, then tags code: a reader that sees the queue's last unit
    without its tags code reads it again before calling it damage (the copy finishing 100 ms after the queue checks first read it here);
    the same bytes left so past the wait (0.5 s) are still reported (a mismatch, as at rest)."""
    import subprocess
    import sys
    import threading

    from storelib.checks import queuestream

    real = queuestream._read_units
    cfg = LiveConfig(root=str(tmp_path / "store"), seconds=1.0, rate=400, body_max=2000, segment_size=256 << 10,
                     cq_units=1000, index_slots=200, index_num=800, pause_at_s=None)
    with LiveWriter(cfg) as w:
        w.wait()
    qdir = os.path.join(cfg.root, "consumequeue", "LiveTopic1", "1")
    path = os.path.join(qdir, sorted(os.listdir(qdir))[-1])
    data = open(path, "rb").read()
    last = max(i for i in range(0, len(data), 20) if any(data[i:i + 20]))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, os.path.join(cfg.root, "lock")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            kinds = []
            for finish in (True, False):
                os.pwrite(fd, bytes(8), last + 12)  # the tags code not copied yet
                done = threading.Timer(0.1, os.pwrite, (fd, data[last + 12:last + 20], last + 12))

                def read(cq, first, count, _done=done, _finish=finish):  # the copy ends 100 ms after the
                    if _finish and cq.topic == "LiveTopic1" and not _done.is_alive() and not _done.finished.is_set():
                        _done.start()  # queue checks first read the unit
                    return real(cq, first, count)

                monkeypatch.setattr(queuestream, "_read_units", read)
                rep = audit_store(cfg.root, overrides=settings_overrides(cfg), quiet=True, engine="local")
                kinds.append({f["kind"] for f in rep["findings"] if f["severity"] != "info"})
            os.pwrite(fd, data[last + 12:last + 20], last + 12)
        finally:
            os.close(fd)
    finally:
        holder.stdin.close()
        holder.wait()
    assert kinds[0] == set() and "cq_entry_mismatch" in kinds[1], kinds


def test_audits_while_units_and_index_entries_are_written_in_pieces_find_nothing(tmp_path):
    """The writer copies a share of its consume-queue units (offset, size, tags code) and index entries
    (hash, phy, timeDiff, prevIndex) in pieces with pauses between them; audits reading meanwhile report
    nothing above info (a unit caught mid-copy is waited for; entries past the header's count are not read)."""
    cfg = LiveConfig(root=str(tmp_path / "store"), seconds=4.0, rate=500, body_max=2000, segment_size=256 << 10,
                     cq_units=1000, index_slots=200, index_num=800, keep_segments=6, clean_ms=800, pause_at_s=None,
                     torn_ratio=0.3, torn_ms=2.0)
    runs = []
    with LiveWriter(cfg) as w:
        while w.running():
            runs.append(audit_store(cfg.root, overrides=settings_overrides(cfg), quiet=True))
        summary = w.wait()
    live = [r for r in runs if r["live"]["live"]]
    assert len(live) >= 3 and summary["done"]["torn"] > 50
    bad = [(f["kind"], f["detail"][:100]) for r in live for f in r["findings"] if f["severity"] != "info"]
    assert not bad, bad
