"""A live store's cleaner deleting files at a chosen moment of an audit, deterministically (the races the
live-writer tests hit under load): the broker's CleanCommitLogService then CleanConsumeQueueService
(segment, then the index files below the next one: IndexService.deleteExpiredFile, 4.9.8
``IndexService.java:90-121``), DLedger's CleanSpaceService then ``reviseLedgerBeginIndex`` (data file, then
the index-unit files wholly below the new first entry). What they deleted is expired, said once, never a
warning or a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storelib.broker.settings import livecut
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.livecut import LiveBroker
from storelib.errors import Finding
from storelib.fileio.bytesource import resolve
from storelib.generator.dledgergen import DLedgerGen
from storelib.generator.gen import GenConfig, generate

S = 256 << 10


def _store(tmp_path: Path, dledger: DLedgerGen | None, **sets) -> tuple[Path, dict, list[Path]]:
    """A generated store of 1500 messages over 256 KiB segments (or data files): root, overrides, segments."""
    sets = {"mappedFileSizeCommitLog": S, **sets}
    root = tmp_path / "store"
    generate(root, GenConfig(messages=1500, seed=3), BrokerSettings.defaults("4").with_overrides(sets), dledger=dledger)
    return root, sets, sorted((root / ("dledger-n0/data" if dledger else "commitlog")).iterdir())


@pytest.fixture
def live(monkeypatch):
    """Every store is run by a broker (pid 4242): audits take a live cut."""
    monkeypatch.setattr(livecut, "live_broker", lambda loc: LiveBroker(4242, "test"))


@pytest.mark.parametrize("dledger", [False, True])
def test_keys_of_a_segment_the_cleaner_deletes_mid_run_are_expired_past_the_cap_too(tmp_path, monkeypatch, live,
                                                                                     dledger):
    """The segment and the index files below the next one go after the audit read the segments and before its
    index checks (the flaky live DLedger audit under load). The deleted index files' keys are then in no file:
    expired, every one of them, the 50 listed and the summary of the rest ("N more index_key_missing findings in
    this file"), which names no position but the segment of its keys; a later segment's summary stays."""
    import storelib.checks.tasks.crossplan as crossplan
    from jobs.audit import audit_store
    from storelib.checks.livejudge import expired_count
    from storelib.checks.segment import MAX_PER_KIND
    from storelib.format.indexdir import list_index_files
    from storelib.format.indexfile import IndexHeader

    root, sets, segs = _store(tmp_path, DLedgerGen() if dledger else None, maxIndexNum=200, maxHashSlotNum=50)
    refs = list_index_files(resolve(str(root)))
    below = [r for r in refs[:-1] if IndexHeader.from_bytes(open(r.loc.path, "rb").read(40)).end_phy_offset < S]
    assert len(below) == 2 and int(segs[1].name) == S  # 398 keys of segment 0, none of segment 1
    plan = crossplan.index_plan

    def cleaner_then_index_plan(*a, **kw):  # the segments were read and none had gone (drop_expired)
        segs[0].unlink()
        for r in below:
            os.unlink(r.loc.path)
        return plan(*a, **kw)

    monkeypatch.setattr(crossplan, "index_plan", cleaner_then_index_plan)
    rep = audit_store(str(root), overrides=sets, quiet=True, engine="local")
    assert rep["live"]["live"]
    assert not [f for f in rep["findings"] if f["kind"] == "index_key_missing"]
    said = [f for f in rep["findings"] if f["kind"] == "expired_during_run" and f["file"] == "commitlog"]
    assert len(said) == 1 and said[0]["extra"]["count"] == 398 > MAX_PER_KIND
    more = Finding("index_key_missing", "warning", f"commitlog/{S:020d}", None, "", {"more": 7, "total": 57})
    assert expired_count(more, 2 * S, S) == 7 and expired_count(more, S, S) == 0  # its segment's keys, not later


def test_a_dledger_data_file_and_its_index_units_deleted_under_its_read_expire(tmp_path, monkeypatch, live):
    """DLedger's cleaner deletes the oldest data file after its audit task opened it (the read goes on, on the
    unlinked file), then reviseLedgerBeginIndex the index-unit files wholly below the next file's first entry,
    which the task's DLedger facts read: the data file expired during the run (as when it is gone at its
    open), not a traceback."""
    import storelib.checks.segment as segment
    from jobs.audit import audit_store

    F = 32 * 64  # 64 units per index file
    root, sets, segs = _store(tmp_path, DLedgerGen(index_file_size=F))
    with open(segs[1], "rb") as f:
        begin = int.from_bytes(f.read(16)[8:16], "big")  # the index of the next file's first entry
    units = sorted((root / "dledger-n0" / "index").iterdir())
    below = [p for p in units if int(p.name) + F <= begin * 32]
    assert below and len(below) < len(units)
    opened = segment._open_task

    def cleaner_after_open(task, opts):
        src = opened(task, opts)
        if task.name == segs[0].name and segs[0].exists():
            segs[0].unlink()
            for p in below:
                p.unlink()
        return src

    monkeypatch.setattr(segment, "_open_task", cleaner_after_open)
    rep = audit_store(str(root), overrides=sets, quiet=True, engine="local")
    assert rep["live"]["live"] and not segs[0].exists()
    assert not [f for f in rep["findings"] if f["severity"] not in ("info", "ok")], rep["findings"]
    said = [f for f in rep["findings"] if f["kind"] == "expired_during_run" and f["file"] == "dledger-n0/data"]
    assert len(said) == 1 and said[0]["extra"]["segments"] == [segs[0].name]


def test_a_carried_queue_seen_without_its_consume_queue_then_expired_is_settled_from_its_carried_records(
        tmp_path, live):
    """An incremental run saw a queue's records before the reput had created its consume queue (a new queue):
    the carry keeps them as lagging records. When the cleaner has deleted their segment by the next run, the
    ones it took leave the carry and the rest are checked against the units written since: that run goes on
    from the state (it went in full before, "cannot be told from the carry"; an IndexError before that) and
    reports what a full audit reports."""
    import shutil

    from jobs.audit import audit_store

    root, sets, segs = _store(tmp_path, None)
    q = root / "consumequeue" / "OrderEvents" / "0"
    shutil.move(q, tmp_path / "q.away")  # not created yet
    state = str(tmp_path / "audit.state")
    first = audit_store(str(root), overrides=sets, quiet=True, engine="local", since=state)
    assert "dispatch_lag" in {f["kind"] for f in first["findings"]}  # the queue without its consume queue yet
    shutil.move(tmp_path / "q.away", q)  # the reput caught up, then the cleaner deleted the oldest segment
    segs[0].unlink()
    rep = audit_store(str(root), overrides=sets, quiet=True, engine="local", since=state)
    full = audit_store(str(root), overrides=sets, quiet=True, engine="local")
    assert first["live"]["live"] and rep["live"]["live"]
    assert "incremental" in rep["run"]["cross_check_mode"], rep["run"]["cross_check_mode"]
    assert rep["run"]["segments_carried"] > 0 and rep["run"]["segments_audited"] < full["run"]["segments_audited"]
    assert not [f for f in rep["findings"] if f["severity"] not in ("info", "ok")], rep["findings"]
    for f in rep["findings"]:
        f["extra"].pop("carried_forward", None)
    assert rep["findings"] == full["findings"] and rep["queues"] == full["queues"]


def test_incremental_runs_go_on_when_the_cleaner_deletes_a_segment_before_its_fingerprint(tmp_path, monkeypatch,
                                                                                           live):
    """``audit --since`` fingerprints each segment it read after the cross-file phase, and the next run
    compares the carried fingerprints with the segments it lists: the cleaner may delete the oldest segment
    between either and the file's read (seen with the live DLedger writer under load). That segment expired:
    the state is saved without its fingerprint, the next run drops it and goes on; a segment gone between
    the listing and the comparison is read by a task that finds it gone. No traceback, no warning."""
    import jobs.audit as audit
    import storelib.checks.auditstate as auditstate

    root, sets, segs = _store(tmp_path, None)
    state = str(tmp_path / "audit.state")

    def cleaner_first(real, seg):
        def call(s, *a):
            if s.name == seg.name and seg.exists():
                seg.unlink()
            return real(s, *a)
        return call

    monkeypatch.setattr(audit, "fingerprint", cleaner_first(audit.fingerprint, segs[0]))
    first = audit.audit_store(str(root), overrides=sets, quiet=True, engine="local", since=state)
    monkeypatch.setattr(auditstate, "prefix_unchanged", cleaner_first(auditstate.prefix_unchanged, segs[1]))
    second = audit.audit_store(str(root), overrides=sets, quiet=True, engine="local", since=state)
    assert not segs[0].exists() and not segs[1].exists()
    for rep in (first, second):
        assert rep["live"]["live"]
        assert not [f for f in rep["findings"] if f["severity"] not in ("info", "ok")], rep["findings"]
    said = [f for f in second["findings"] if f["kind"] == "expired_during_run" and f["file"] == "commitlog"]
    assert len(said) == 1 and segs[1].name in said[0]["extra"]["segments"]


def test_an_index_file_the_cleaner_deletes_before_its_file_task_is_expired_with_its_keys(tmp_path, monkeypatch,
                                                                                         live):
    """The cleaner deletes the oldest segment and the index files below the next one after the audit planned
    its index tasks and before the first file's task: that file and its keys expired (said once each), the
    later files are looked up, nothing is missing (was a KeyError in the index merge)."""
    import storelib.checks.tasks.indextask as indextask
    from jobs.audit import audit_store
    from storelib.format.indexdir import list_index_files
    from storelib.format.indexfile import IndexHeader

    root, sets, segs = _store(tmp_path, None, maxIndexNum=200, maxHashSlotNum=50)
    refs = list_index_files(resolve(str(root)))
    below = [r for r in refs[:-1] if IndexHeader.from_bytes(open(r.loc.path, "rb").read(40)).end_phy_offset < S]
    task = indextask.index_file_task

    def cleaner_first(ctx, item):
        if item.name == below[0].name and segs[0].exists():
            segs[0].unlink()
            for r in below:
                os.unlink(r.loc.path)
        return task(ctx, item)

    monkeypatch.setattr(indextask, "index_file_task", cleaner_first)
    rep = audit_store(str(root), overrides=sets, quiet=True, engine="local")
    assert rep["live"]["live"] and not segs[0].exists()
    assert not [f for f in rep["findings"] if f["severity"] not in ("info", "ok")], rep["findings"]
    said = [f for f in rep["findings"] if f["kind"] == "expired_during_run"]
    assert {f["file"] for f in said} >= {"commitlog", *(f"index/{r.name}" for r in below)}


@pytest.mark.parametrize("zeroed, in_flight", [(0, True), (1, False)])
def test_only_the_unit_of_the_last_entry_before_the_cut_may_be_in_flight(tmp_path, monkeypatch, zeroed, in_flight):
    """DLedgerMmapFileStore.appendAsLeader (0.3.1.2 :353-372) appends one entry at a time under one lock, its
    data then its index unit: at a live cut only the last entry's unit may not be written yet (in flight, not
    a mismatch); an earlier entry's missing unit is one, live or not."""
    from jobs.audit import audit_store

    F = 32 * 64
    root, sets, segs = _store(tmp_path, DLedgerGen(index_file_size=F))
    units = sorted((root / "dledger-n0" / "index").iterdir())
    last = max(i for p in units for i in range(int(p.name) // 32, (int(p.name) + F) // 32)
               if _unit(p, i % 64)[:4] == (1).to_bytes(4, "big"))
    at = (last - zeroed) * 32
    with open(root / "dledger-n0" / "index" / f"{at - at % F:020d}", "r+b") as f:
        f.seek(at % F)
        f.write(bytes(32))  # not written yet

    def mismatches(rep):
        return [f for f in rep["findings"] if f["kind"] == "dledger_index_unit_mismatch"]

    rest = audit_store(str(root), overrides=sets, quiet=True, engine="local")
    monkeypatch.setattr(livecut, "live_broker", lambda loc: LiveBroker(4242, "test"))
    live = audit_store(str(root), overrides=sets, quiet=True, engine="local")
    assert live["live"]["live"] and live["live"]["cut_offset"] == rest["dledger"]["data_end"]
    assert [f["extra"]["entry_index"] for f in mismatches(rest)] == [last - zeroed]
    assert [f["extra"]["entry_index"] for f in mismatches(live)] == ([] if in_flight else [last - zeroed])


def _unit(path: Path, k: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(32 * k)
        return f.read(32)


def test_an_index_unit_file_dledgers_cleaner_deletes_before_the_since_fingerprint_is_not_a_traceback(
        tmp_path, monkeypatch, live):
    """``audit --since`` on a running DLedger node fingerprints each data file's index units for the carry
    after the cross-file phase; DLedger's cleaner may delete the oldest data file, then the index-unit files
    wholly below the next one's first entry, in between (seen in CI under load: a StoreError out of the
    driver). The state is saved without that file's fingerprint, and the next run goes on: no traceback,
    nothing above info."""
    import storelib.checks.tasks.dledgertask as dledgertask
    from jobs.audit import audit_store

    F = 32 * 64  # 64 units per index file
    root, sets, segs = _store(tmp_path, DLedgerGen(index_file_size=F))
    with open(segs[1], "rb") as f:
        begin = int.from_bytes(f.read(16)[8:16], "big")  # the index of the next file's first entry
    below = [p for p in sorted((root / "dledger-n0" / "index").iterdir()) if int(p.name) + F <= begin * 32]
    assert below
    state = str(tmp_path / "audit.state")
    real = dledgertask.units_fingerprint
    calls: list[int] = []

    def cleaner_first(index, end):
        calls.append(1)
        if segs[0].exists():
            segs[0].unlink()
            for p in below:
                p.unlink()
        return real(index, end)

    monkeypatch.setattr(dledgertask, "units_fingerprint", cleaner_first)
    first = audit_store(str(root), overrides=sets, quiet=True, engine="local", since=state)
    assert calls and not segs[0].exists()
    monkeypatch.setattr(dledgertask, "units_fingerprint", real)
    second = audit_store(str(root), overrides=sets, quiet=True, engine="local", since=state)
    for rep in (first, second):
        assert rep["live"]["live"]
    assert not [f for f in second["findings"] if f["severity"] not in ("info", "ok")], second["findings"]


def test_reput_skip_warnings_of_a_segment_the_cleaner_deletes_mid_run_expire(tmp_path, monkeypatch):
    """The reput skipped the rest of segment 0 after an undecodable record (both audits warn: cq_reput_skipped,
    index_reput_skipped); the cleaner deletes segment 0 after the audit read the segments. Those warnings are
    about expired records, as the other findings of a vanished segment are: dropped, counted in the one note;
    a capped summary of them is its segment's, not a later one's."""
    import storelib.checks.tasks.crossplan as crossplan
    from jobs.audit import audit_store
    from storelib.checks.livejudge import expired_count

    from .test_index_audit_reput_skip import CONF, _skipped_store

    root, phy, _ = _skipped_store(tmp_path / "s")
    seg0 = root / "commitlog" / f"{0:020d}"
    at_rest = audit_store(str(root), broker_conf=str(root / "broker.conf"), version="4", quiet=True,
                          engine="local")
    assert {"cq_reput_skipped", "index_reput_skipped"} <= {f["kind"] for f in at_rest["findings"]}
    monkeypatch.setattr(livecut, "live_broker", lambda loc: LiveBroker(4242, "test"))
    plan = crossplan.index_plan

    def cleaner_then_index_plan(*a, **kw):
        seg0.unlink()
        return plan(*a, **kw)

    monkeypatch.setattr(crossplan, "index_plan", cleaner_then_index_plan)
    rep = audit_store(str(root), broker_conf=str(root / "broker.conf"), version="4", quiet=True, engine="local")
    assert rep["live"]["live"] and not seg0.exists()
    kinds = {f["kind"] for f in rep["findings"]}
    assert not kinds & {"cq_reput_skipped", "index_reput_skipped"}, rep["findings"]
    said = [f for f in rep["findings"] if f["kind"] == "expired_during_run" and f["file"] == "commitlog"
            and "consume-queue or index" in f["detail"]]
    assert len(said) == 1 and said[0]["extra"]["count"] == 2, rep["findings"]
    S = CONF["mappedFileSizeCommitLog"]
    for kind in ("cq_reput_skipped", "index_reput_skipped"):
        more = Finding(kind, "warning", f"commitlog/{S:020d}", None, "", {"more": 7, "total": 57})
        assert expired_count(more, 2 * S, S) == 7 and expired_count(more, S, S) == 0
