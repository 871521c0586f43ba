"""The run's cut (storelib.broker.settings.livecut) and the readers clamped to it, without a writer process:
crafted tails (a record being copied in, damage followed by valid data), index files read as a header
stood, consume queues clamped, a file truncated under a reader, the lock and abort facts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from storelib.broker.settings.livecut import LiveBroker, StoreCut, live_broker, log_end
from storelib.broker.settings.store import Store, load_settings
from storelib.broker.writer.writer import StoreWriter
from storelib.checks.livejudge import MARKER_KINDS
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import resolve
from storelib.format.record import Message
from storelib.scan.commitlog import CommitLog
from tests.conftest import REPO

SEG = 1 << 16


def _store(tmp_path, n=40, version="4"):
    from storelib.broker.settings.brokerconf import BrokerSettings

    settings = BrokerSettings.defaults(version).with_overrides({"mappedFileSizeCommitLog": SEG})
    root = tmp_path / "store"
    with StoreWriter(root, settings, lock=False) as w:
        res = [w.append(Message(topic="T", body=os.urandom(200 + i), queue_id=i % 2,
                                properties={"KEYS": f"k{i}", "UNIQ_KEY": f"U{i:030d}"})) for i in range(n)]
    return root, settings, res


def _cl(root, settings):
    return CommitLog(resolve(str(root)).join("commitlog"), settings.mapped_file_size_commit_log)


def test_log_end_is_the_end_of_the_last_valid_record(tmp_path):
    root, settings, res = _store(tmp_path)
    end, note = log_end(_cl(root, settings), max_record=1 << 20, tail_wait_s=0.05)
    assert end == res[-1].phy_offset + res[-1].size and note is None


def test_a_record_still_being_copied_is_waited_for_then_read(tmp_path):
    root, settings, res = _store(tmp_path)
    seg = root / "commitlog" / f"{0:020d}"
    last = res[-1]
    data = bytearray(seg.read_bytes())
    rec = bytes(data[last.phy_offset:last.phy_offset + last.size])
    data[last.phy_offset + last.size // 2:last.phy_offset + last.size] = bytes(last.size - last.size // 2)
    seg.write_bytes(bytes(data))  # its first half there, the rest still the fresh file's zeros

    def finish() -> None:
        time.sleep(0.1)
        with open(seg, "r+b") as f:
            f.seek(last.phy_offset)
            f.write(rec)

    t = threading.Thread(target=finish)
    t.start()
    end, note = log_end(_cl(root, settings), max_record=1 << 20, tail_wait_s=2.0)
    t.join()
    assert end == last.phy_offset + last.size
    assert note and "being copied in" in note


def test_a_record_that_stays_incomplete_is_left_after_the_cut(tmp_path):
    root, settings, res = _store(tmp_path)
    seg = root / "commitlog" / f"{0:020d}"
    last = res[-1]
    with open(seg, "r+b") as f:
        f.seek(last.phy_offset + 60)
        f.write(bytes(last.size - 60))
    t0 = time.monotonic()
    end, note = log_end(_cl(root, settings), max_record=1 << 20, tail_wait_s=0.2)
    assert end == last.phy_offset and "still incomplete" in note
    assert time.monotonic() - t0 >= 0.2


def test_a_bad_record_followed_by_valid_ones_is_damage_not_a_tail_in_flight(tmp_path):
    root, settings, res = _store(tmp_path)
    seg = root / "commitlog" / f"{0:020d}"
    bad = res[20]
    with open(seg, "r+b") as f:  # a body byte flipped: its CRC fails, the records after it are fine
        f.seek(bad.phy_offset + bad.size - 30)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    t0 = time.monotonic()
    end, note = log_end(_cl(root, settings), max_record=1 << 20, tail_wait_s=5.0)
    assert end == res[-1].phy_offset + res[-1].size and note is None
    assert time.monotonic() - t0 < 2.0  # not waited for


def test_the_next_segment_created_ahead_is_not_where_the_log_ends(tmp_path):
    root, settings, res = _store(tmp_path)
    with open(root / "commitlog" / f"{SEG:020d}", "wb") as f:
        f.truncate(SEG)  # AllocateMappedFileService: the next file, full size, nothing in it
    end, _ = log_end(_cl(root, settings), max_record=1 << 20)
    assert end == res[-1].phy_offset + res[-1].size


def test_store_at_rest_gets_a_cut_that_clamps_nothing(sample_498):
    loc = resolve(str(sample_498 / "store"))
    store = Store(loc, load_settings(None, None, None, loc))
    before = [(s.name, s.file_size) for s in store.commitlog.segments]
    cut = store.take_cut()
    assert not cut.live and cut.commitlog_end is None and cut.describe().startswith("not live")
    assert store.loc.mapped and store.commitlog.cut_end is None
    assert [(s.name, s.file_size) for s in store.commitlog.segments] == before
    assert cut.limit(0, SEG) is None and cut.to_dict()["live"] is False


_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def held_lock(tmp_path, sample_498):
    """A copy of the 4.9.8 sample whose lock another process holds (as the JVM's FileChannel.tryLock does)."""
    root = tmp_path / "s"
    shutil.copytree(sample_498 / "store", root)
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(root / "lock")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    try:
        yield root, proc.pid
    finally:
        proc.stdin.close()
        proc.wait()


def test_a_held_lock_is_a_live_broker_with_its_pid(held_lock):
    root, pid = held_lock
    b = live_broker(resolve(str(root)))
    assert b == LiveBroker(pid, f"lock held by pid {pid}")
    loc = resolve(str(root))
    store = Store(loc, load_settings(None, None, None, loc))
    cut = store.take_cut()
    assert cut.live and cut.commitlog_end == 1572864 + 155308  # the sample's data end (its last segment)
    assert cut.describe().startswith(f"live store (pid {pid}): read up to a cut at offset {cut.commitlog_end}")
    assert not store.loc.mapped and store.commitlog.cut_end == cut.commitlog_end


def test_a_5x_abort_naming_a_running_pid_is_a_live_broker_when_the_lock_cannot_tell(tmp_path):
    from storelib.format.markers import write_abort

    write_abort(tmp_path, pid=os.getpid())  # no lock file: the probe cannot tell
    assert live_broker(resolve(str(tmp_path))) == LiveBroker(os.getpid(), f"abort names pid {os.getpid()}, "
                                                                           "which is running")
    (tmp_path / "lock").write_bytes(b"lock")  # a lock nobody holds: no broker, whatever abort says
    assert live_broker(resolve(str(tmp_path))) is None


def test_index_file_read_as_its_header_stood_at_the_cut(tmp_path):
    """Entries put after the cut are not read, and slots the broker pointed at them since are followed back
    through prevIndex to their value at the cut."""
    from storelib.broker.index.indexbuild import build_index_files
    from storelib.format.indexfile import IndexFile, IndexGeometry

    g = IndexGeometry(16, 200)
    rng = np.random.default_rng(3)
    h = rng.integers(0, 2**31 - 1, 120)
    rows = {"key_hash": h, "phy_offset": np.arange(120) * 100, "store_timestamp": 1_700_000_000_000 + np.arange(120)}
    early = build_index_files({k: v[:70] for k, v in rows.items()}, geometry=g)[0]
    late = build_index_files({k: v[70:] for k, v in rows.items()}, geometry=g, prev_state=early.state())[0]
    path = tmp_path / early.name
    late.write(path)
    at_cut = IndexFile.open(str(path), g, at=early.header.to_bytes())
    assert at_cut.entry_count == 70 and np.array_equal(at_cut.slots(), early.slots)
    assert [at_cut.slot_value(s) for s in range(16)] == early.slots.tolist()
    assert at_cut.validate() == []
    now = IndexFile.open(str(path), g)
    assert now.entry_count == 120 and not np.array_equal(now.slots(), early.slots)


def test_consume_queue_clamped_at_the_cut_and_a_vanished_file_left_out(tmp_path):
    from storelib.broker.settings.cqload import LoadedQueue
    from storelib.format.consumequeue import ConsumeQueue, make_units

    qdir = tmp_path / "q"
    qdir.mkdir()
    u = make_units(np.arange(10, dtype=np.int64) * 100, np.full(10, 100), np.zeros(10, np.int64))
    (qdir / f"{0:020d}").write_bytes(u[:5].tobytes())
    (qdir / f"{100:020d}").write_bytes(u[5:].tobytes())
    cq = LoadedQueue(str(qdir), segment_size=100, phy_limit=750)  # the broker's load of it reads the same
    units = np.concatenate([cq.read_units(s) for s in cq.segments])
    assert units["phy_offset"].tolist() == [0, 100, 200, 300, 400, 500, 600, 700, 0, 0]
    assert units["size"].tolist()[-2:] == [0, 0] and cq.max_offset() == 8
    cq.close()
    listed = ConsumeQueue.__new__(ConsumeQueue)  # listed, then the cleaner deletes the first file
    ConsumeQueue.__init__(listed, str(qdir), segment_size=100)
    os.unlink(qdir / f"{0:020d}")
    live = ConsumeQueue(str(qdir), segment_size=100, phy_limit=10_000)
    assert [s.name for s in live.segments] == [f"{100:020d}"] and live.vanished == []
    assert len(listed.segments) == 2  # an at-rest listing keeps what it saw


_TRUNCATE = """
import os, sys
from dataclasses import replace
from storelib.fileio.bytesource import open_source, resolve
from storelib.errors import StoreError
path, mapped = sys.argv[1], sys.argv[2] == "1"
loc = resolve(path)
src = open_source(loc if mapped else replace(loc, mapped=False), os.path.getsize(path))
os.truncate(path, 4096)  # the file shrinks under the reader
try:
    data = bytes(src.read(1 << 20, 4096))
    print("read", len(data))
except StoreError as e:
    print("error", e.kind)
"""


def test_a_file_truncated_under_a_reader_is_an_error_with_ranged_reads_and_a_sigbus_when_mapped(tmp_path):
    """Why a live store's files are never mapped: touching a mapped page past a shrunk file's end kills the
    process (SIGBUS); the ranged read a live store uses ends with an error naming the file."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    results = {}
    for mapped in ("1", "0"):
        f = tmp_path / f"seg{mapped}"
        f.write_bytes(os.urandom(2 << 20))
        p = subprocess.run([sys.executable, "-c", _TRUNCATE, str(f), mapped], capture_output=True, text=True,
                           env=env, cwd=str(REPO))
        results[mapped] = (p.returncode, p.stdout.strip())
    assert results["1"][0] == -signal.SIGBUS
    assert results["0"] == (0, "error truncated")


def test_scans_stop_at_the_cut_as_at_the_end_of_data(tmp_path):
    root, settings, res = _store(tmp_path)
    loc = resolve(str(root))
    store = Store(loc, settings)
    store.apply_cut(StoreCut(0, LiveBroker(None, "test"), res[30].phy_offset, (f"{0:020d}",)))
    ends = []
    rows = sum(b.num_rows for b in store.scan(ends=ends))
    assert rows == 30 and ends[-1].kind == "end_of_data" and ends[-1].phy_offset == res[30].phy_offset
    with pytest.raises(StoreError) as e:
        store.commitlog.read(res[35].phy_offset)
    assert e.value.kind == "past_cut"


def test_judge_live_folds_lag_and_the_markers_of_a_running_broker():
    from storelib.checks.livejudge import judge_live

    class _S:
        cut = StoreCut(0, LiveBroker(9, "lock held by pid 9"), 1000)

    fs = [Finding("queue_behind_commitlog", "warning", "consumequeue/T/0", None, "", {"count": 3, "bytes": 300}),
          Finding("queue_behind_commitlog", "warning", "consumequeue/T/1", None, "", {"count": 2, "bytes": 200}),
          Finding("index_behind_commitlog", "warning", "index", None, "", {"count": 4}),
          Finding("abort_present", "warning", "abort", None, ""), Finding("broker_running", "critical", "lock", 0, ""),
          Finding("cq_entry_mismatch", "error", "consumequeue/T/0", 20, "")]
    out = judge_live(fs, _S(), max_lag=1000)
    assert [(f.kind, f.severity) for f in out] == [("cq_entry_mismatch", "error"), ("dispatch_lag", "info")]
    assert out[1].extra == {"messages": 5, "bytes": 500, "queues": 2, "keys": 4, "max_lag": 1000}
    assert judge_live(fs, _S(), max_lag=400)[-1].severity == "warning"
    _S.cut = replace(_S.cut, broker=None)
    assert judge_live(fs, _S()) == fs  # at rest: nothing changes


def test_judge_live_calls_a_running_dledger_nodes_missing_checkpoint_progress_wherever_it_comes_from():
    """DLedger rewrites its checkpoint by delete and rename: a live audit may find no file. The store's commitlog
    findings carry that finding too (not only the DLedger checks, which demote it): it is info however it comes."""
    from storelib.checks.livejudge import dledger_progress, judge_live

    class _S:
        cut = StoreCut(0, LiveBroker(9, "lock held by pid 9"), 1000)

    missing = Finding("dledger_checkpoint_missing", "warning", "dledger-n0/checkpoint", None, "no DLedger checkpoint")
    out = judge_live([missing, *dledger_progress([missing])], _S())
    assert [(f.kind, f.severity) for f in out] == [("dledger_checkpoint_missing", "info")] * 2
    assert out[0].detail == out[1].detail  # demoted once, not twice


def _big_segment(tmp_path, n=1500):
    from storelib.broker.settings.brokerconf import BrokerSettings

    settings = BrokerSettings.defaults("4").with_overrides({"mappedFileSizeCommitLog": 8 << 20})
    root = tmp_path / "big"
    with StoreWriter(root, settings, lock=False) as w:
        res = [w.append(Message(topic="T", body=os.urandom(2000), queue_id=0)) for _ in range(n)]
    os.sync()
    return root / "commitlog" / f"{0:020d}", res


def _task(path, res, **kw):
    from storelib.checks.segment import SegmentTask

    end = res[-1].phy_offset + res[-1].size
    return SegmentTask(path.name, 0, str(path), os.path.getsize(path), 8 << 20, True, 0, limit=end, live=True, **kw)


def test_a_cold_segment_read_gives_back_only_the_pages_it_brought_into_the_page_cache(tmp_path):
    from storelib.checks.segment import AuditOptions, audit_part
    from storelib.fileio.pagecare import PAGE, drop_pages, residency

    path, res = _big_segment(tmp_path)
    end = res[-1].phy_offset + res[-1].size
    pages = -(-end // PAGE)
    drop_pages(str(path), [(0, os.path.getsize(path))])
    if residency(str(path)) is None or residency(str(path))[:pages].any():
        pytest.skip("page-cache residency cannot be told or dropped here")
    with open(path, "rb") as f:  # the broker's hot pages: the first MiB, in the cache before the run
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead landing after `before`
        f.read(1 << 20)
    before = residency(str(path))[:pages]
    assert 0 < before.sum() < pages
    part = audit_part(_task(path, res, page_care=True), AuditOptions(), keep_tables=True)
    assert part.end_kind == "end_of_data" and part.data_end == end
    after = residency(str(path))[:pages]
    # what was cached still is; what the audit brought in is gone
    assert np.flatnonzero(before & ~after).tolist() == [], "pages cached before the run were dropped"
    assert np.flatnonzero(after & ~before).tolist() == [], "pages the run brought in are still cached"
    drop_pages(str(path), [(0, os.path.getsize(path))])
    audit_part(_task(path, res), AuditOptions(), keep_tables=True)  # without page care: the read stays cached
    assert residency(str(path))[:pages].sum() > before.sum()


def test_page_care_of_a_read_that_found_every_page_cached_drops_nothing_and_does_not_wait(tmp_path, monkeypatch):
    """A warm segment (the usual case on a broker host) costs no read-ahead settling: the settle loop is
    for pages the read brought in, and here there are none (it slept 20 ms per task before)."""
    from storelib.fileio import pagecare

    path = tmp_path / "seg"
    path.write_bytes(os.urandom(1 << 20))
    path.read_bytes()
    if pagecare.residency(str(path)) is None or not pagecare.residency(str(path)).all():
        pytest.skip("page-cache residency cannot be told here")
    slept: list[float] = []
    dropped: list = []
    monkeypatch.setattr(pagecare.time, "sleep", slept.append)
    monkeypatch.setattr(pagecare, "drop_pages", lambda p, runs: dropped.append(runs) or 0)
    care = pagecare.PageCare(str(path))
    assert care.done(0, 1 << 20) == 0
    assert slept == [] and dropped == []


def test_read_rate_holds_a_task_to_its_budget(tmp_path):
    from storelib.checks.segment import AuditOptions, audit_part

    path, res = _big_segment(tmp_path, n=600)
    nbytes = sum(r.size for r in res)
    t0 = time.monotonic()
    audit_part(_task(path, res), AuditOptions(), keep_tables=True)
    fast = time.monotonic() - t0
    t0 = time.monotonic()
    audit_part(_task(path, res, read_rate=nbytes / 0.6), AuditOptions(), keep_tables=True)
    slow = time.monotonic() - t0
    assert slow >= 0.55 and slow > fast


def _summary(rep):
    return {k: v for k, v in rep["summary"].items() if k not in ("findings", "by_severity")}


def _findings(rep):
    return sorted((f["kind"], f["severity"], f["file"], f["offset"]) for f in rep["findings"])


def test_a_held_lock_on_a_store_that_does_not_move_audits_as_at_rest_and_says_live(held_lock, tmp_path, capsys):
    """Clamped to a cut at its own end, a store reads exactly as at rest: the same findings (only the
    running broker's markers become the live block), the console, audit.json and the metrics say live."""
    from jobs.cli import main
    from tests.test_scheduled_audits import one, samples

    root, pid = held_lock
    mf = tmp_path / "m.prom"
    rc = main(["audit", str(root), "--json", "--quiet", "--metrics-file", str(mf)])
    out = capsys.readouterr()
    rep = json.loads(out.out)
    assert rc == 0 and rep["live"]["live"] and rep["live"]["pid"] == pid
    assert f"live store (pid {pid}): read up to a cut at offset {rep['live']['cut_offset']}" in out.err
    ms = samples(mf)
    assert one(ms, "rmqstore_audit_live") == 1 and one(ms, "rmqstore_audit_live_pid") == pid
    assert one(ms, "rmqstore_audit_cut_offset_bytes") == rep["live"]["cut_offset"] == 1572864 + 155308
    os.unlink(root / "lock")  # the same bytes at rest (the holder keeps its lock on the unlinked inode)
    (root / "lock").write_bytes(b"lock")
    rc = main(["audit", str(root), "--json", "--quiet"])
    rest = json.loads(capsys.readouterr().out)
    assert rc == 0 and rest["live"]["live"] is False
    assert _findings(rep) == [f for f in _findings(rest) if f[0] not in MARKER_KINDS]
    for k in ("queues", "index"):
        assert rep[k] == rest[k]
    assert _summary(rep) == _summary(rest)


def test_a_generated_5x_store_with_timers_reads_at_its_own_cut_as_at_rest(tmp_path):
    """The clamps (consume queues at the cut, index headers, the checkpoint and timercheck as the cut read them,
    the scans) change nothing when the cut is the store's own end."""
    from jobs.audit import audit_store
    from jobs.cli import main
    from storelib.broker.settings import livecut

    root = tmp_path / "g5"
    assert main(["gen", str(root), "--messages", "3000", "--version", "5", "--segment-size", "262144",
                 "--timers", "40", "--seed", "5"]) == 0
    rest = audit_store(str(root), quiet=True)
    orig = livecut.live_broker
    livecut.live_broker = lambda loc: LiveBroker(4242, "test")
    try:
        live = audit_store(str(root), quiet=True)
    finally:
        livecut.live_broker = orig
    assert live["live"]["live"] and not rest["live"]["live"]
    assert _findings(live) == [f for f in _findings(rest) if f[0] not in MARKER_KINDS]
    assert _summary(live) == _summary(rest) and live["timer_store"] == rest["timer_store"]


def test_an_index_file_the_cleaner_deletes_before_its_lookup_is_said_expired_and_the_audit_goes_on(
        held_lock, monkeypatch):
    """A damaged index file is looked up entry by entry after the file tasks; the broker's cleaner may
    delete it in between (seen in a live audit under load): said once, no traceback."""
    import storelib.checks.tasks.indextask as indextask
    from jobs.audit import audit_store

    root, _pid = held_lock
    loc = resolve(str(root))
    g = load_settings(None, None, None, loc).index_geometry
    idx = sorted((root / "index").iterdir())[0]
    first = 40 + 4 * g.hash_slot_num + 20  # entry 1 (the broker leaves entry 0 unused)
    with open(idx, "r+b") as f:  # its key hash: the file is no longer its keys in order
        f.seek(first)
        h = f.read(4)
        f.seek(first)
        f.write(bytes(b ^ 0x5A for b in h))
    looked = []
    original = indextask.index_lookup_task

    def cleaner_first(ctx, task):
        looked.append(task.name)
        if task.name == idx.name:
            (root / "index" / task.name).unlink()
        return original(ctx, task)

    monkeypatch.setattr(indextask, "index_lookup_task", cleaner_first)
    rep = audit_store(str(root), engine="local", quiet=True)
    assert looked[0] == idx.name and rep["live"]["live"]  # (it and every later file: the whole view's rule)
    said = [f for f in rep["findings"] if f["file"] == f"index/{idx.name}" and f["kind"] == "expired_during_run"]
    assert len(said) == 1 and said[0]["severity"] == "info"

