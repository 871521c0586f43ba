"""The audit's "never dispatched" judgement (storelib.broker.startup.lagdispatch) counts, past the record a 5.3.3
normal start skips, only the records its recovery gives a consume-queue unit (NOT/COMMIT:
CommitLogDispatcherBuildConsumeQueue.dispatch, DefaultMessageStore 5.3.3 :2174-2189): a PREPARED/ROLLBACK tail
raises no queue's max, so recheckReputOffsetFromCq's reput starts at the skipped record and dispatches it
(DefaultMessageStore.java:438-489). The whole view, the driver's stream and the partitioned tasks agree."""

from __future__ import annotations

import numpy as np
import pytest

from .rebuild_storegen import msg
from .test_audit_partitioned import _same
from .test_recover_5x_start import S, _crafted, _plan, _queue_findings, _store

ON = {"recheckReputOffsetFromCq": "true"}


def _tail_store(tmp_path, name: str, tail: list[tuple[str, int]], corrupt_at: int | None = None):
    """Two segments of T records, the skipped T/1 record (the queues end where it starts), then ``tail``
    records (topic, SYSFLAG); ``corrupt_at``: that tail record's magic code broken (a lost range there)."""
    cs = _crafted(2)
    skipped = cs.append(msg("T", 1, body=b"Z" * 300, keys="kz", uniq="UZ"))
    placed = [cs.append(msg(t, 0, body=b"P" * 200, sys_flag=f, uniq=f"P{i}")) for i, (t, f) in enumerate(tail)]
    assert skipped.phy % S > 0 and all(p.segment == skipped.segment for p in placed)
    if corrupt_at is not None:
        cs.corrupt(placed[corrupt_at].phy, 4)
    return cs, skipped, _store(tmp_path, cs, name=name, dispatch_to=skipped.phy, conf=ON)


def _never(tmp_path, monkeypatch, name: str, topic: str, qid: int) -> set:
    """What every audit path says of the queue's lag: the record never dispatched (None: it is dispatched)."""
    root, conf = tmp_path / name, str(tmp_path / f"{name}.conf")
    got = set()
    for rep in _same(root, monkeypatch, broker_conf=conf, version="5"):  # driver, partitioned (memory, files)
        [lag] = _queue_findings(rep["findings"], topic, qid)
        assert lag["kind"] == "queue_behind_commitlog"
        got.add(lag["extra"].get("never_dispatched"))
    return got


def test_a_prepared_and_rollback_tail_leaves_the_skipped_record_to_the_rechecked_reput(tmp_path, monkeypatch):
    half = "RMQ_SYS_TRANS_HALF_TOPIC"
    cs, skipped, store = _tail_store(tmp_path, "s", [(half, 4), (half, 4), ("T", 12)])
    plan = _plan(store)
    assert plan["dispatch"]["reput"]["from"] == skipped.phy  # the queues' max: no unit past the skipped record
    assert _never(tmp_path, monkeypatch, "s", "T", 1) == {None}


def test_a_commit_record_in_the_tail_leaves_the_skipped_record_never_dispatched(tmp_path, monkeypatch):
    half = "RMQ_SYS_TRANS_HALF_TOPIC"
    _cs, skipped, store = _tail_store(tmp_path, "s", [(half, 4), ("T", 8), ("T", 12)])
    assert _plan(store)["dispatch"]["reput"]["from"] > skipped.phy
    assert _never(tmp_path, monkeypatch, "s", "T", 1) == {skipped.phy}


@pytest.mark.parametrize("cq_able_before_lost", [False, True])
def test_only_unit_records_before_the_first_lost_range_count(tmp_path, monkeypatch, cq_able_before_lost):
    """The recovery stops at the broken record: a unit record past it raises no queue's max."""
    half = "RMQ_SYS_TRANS_HALF_TOPIC"
    tail = [(half, 4), *([("U", 0)] if cq_able_before_lost else []), ("U", 0), ("U", 0), ("U", 0)]
    _cs, skipped, _ = _tail_store(tmp_path, "s", tail, corrupt_at=len(tail) - 3)
    assert _never(tmp_path, monkeypatch, "s", "T", 1) == ({skipped.phy} if cq_able_before_lost else {None})


def test_cq_able_ends_of_any_split_of_the_log_tell_the_same_recovery_max():
    """Segment tasks carry their records' summary: split anywhere, the judgement is the whole log's."""
    from storelib.broker.startup.lagdispatch import cq_able_ends, recovery_max_past

    phy = np.array([0, 10, 20, 30, 50, 60, 70], np.int64)  # a lost range [40, 50)
    size = np.full(7, 10, np.int64)
    tran = np.array([0, 1, 3, 2, 1, 0, 1])
    lost = np.array([[40, 50]], np.int64)
    whole = cq_able_ends(phy, size, tran)
    assert whole == [40, 70]
    for cut in range(8):
        parts = cq_able_ends(phy[:cut], size[:cut], tran[:cut]) + cq_able_ends(phy[cut:], size[cut:], tran[cut:])
        for end in (10, 20, 30, 40, 60, 70, 80):
            assert recovery_max_past(end, 80, lost, parts) == recovery_max_past(end, 80, lost, whole)
    assert [recovery_max_past(e, 80, lost, whole) for e in (10, 30, 40, 60, 70)] == [40, 40, -1, 70, -1]


def test_incremental_audit_judges_the_skipped_record_again_when_a_unit_record_follows(tmp_path, monkeypatch):
    """``audit --since``: a record another queue group gets after the PREPARED tail makes the recovery raise
    a queue's max past the skipped record, so the lagging group's carried verdict is judged again."""
    import jobs.engines.audit_tasks as audit_tasks
    from jobs.audit import audit_store

    monkeypatch.setattr(audit_tasks, "cross_groups", lambda eng, tasks, in_memory: 8)
    half = "RMQ_SYS_TRANS_HALF_TOPIC"
    cs, skipped, _ = _tail_store(tmp_path, "s", [(half, 4), (half, 4)])
    root, kw = tmp_path / "s", {"broker_conf": str(tmp_path / "s.conf"), "version": "5", "quiet": True}
    state = str(tmp_path / "state.json")

    def never(rep: dict) -> list:
        return [f["extra"].get("never_dispatched") for f in _queue_findings(rep["findings"], "T", 1)]

    assert never(audit_store(str(root), since=state, **kw)) == [None]
    p = cs.append(msg("U", 0, body=b"N" * 200, uniq="N1"))  # appended to the file, not dispatched
    with open(sorted((root / "commitlog").iterdir())[-1], "r+b") as f:
        f.seek(p.phy % S)
        f.write(bytes(cs.segments[p.segment][p.phy % S:p.phy % S + p.size]))
    inc = audit_store(str(root), since=state, **kw)
    assert "incremental" in inc["run"]["cross_check_mode"]
    assert never(inc) == never(audit_store(str(root), **kw)) == [skipped.phy]
