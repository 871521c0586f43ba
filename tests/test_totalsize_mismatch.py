"""A record whose TOTALSIZE disagrees with the length its fields give (calMsgLength), in both lines.

CommitLog.checkMessageAndReturnSize: 4.9.8 allocates ``new byte[totalSize]`` and reads the fields whatever
TOTALSIZE says (it has no bound), then returns DispatchRequest(totalSize, false) when ``totalSize !=
readLength``; 5.3.3 first fails (-1) a TOTALSIZE longer than the bytes left (``remaining < totalSize - 4``).
Recovery stops at either (the truncation point). 4.9.8's reput (DefaultMessageStore.ReputMessageService.doReput)
adds TOTALSIZE to reputFromOffset but reads on from the buffer after the fields: the drift shows when the
buffer is left (rollNextFile after a blank, ``result.getSize() - readSize`` after a -1).
"""

from __future__ import annotations

import json
import struct

import pytest

from storelib.broker.recovery.walk import RecoveryInputs, recovery_walk
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.scan.scanner import SegmentEnd
from tests.conftest import run_cli
from tests.rebuild_storegen import CraftedStore, msg

S = 8192


def five_segments() -> CraftedStore:
    """Segments 0..3 end with blanks, 4 is partly written (4.9.8 normal: window from segment 2)."""
    cs = CraftedStore(S)
    i = 0
    while cs.append(msg("T", i % 3, body=b"x" * 300, keys=f"k{i}")).segment < 4:
        i += 1
    return cs


@pytest.fixture
def five() -> CraftedStore:
    return five_segments()


def _seg(cs: CraftedStore, i: int) -> list:
    return [p for p in cs.placed if p.segment == i]


def _set_total(cs: CraftedStore, p, total: int) -> None:
    cs.segments[p.segment][p.file_offset:p.file_offset + 4] = struct.pack(">i", total)


def _store(tmp_path, cs: CraftedStore, version: str = "4", **overrides) -> Store:
    root = cs.write(tmp_path / "store")
    settings = BrokerSettings.defaults(version).with_overrides({"mappedFileSizeCommitLog": S, **overrides})
    return Store(root, settings)


def _walk(store: Store, line: str | None, **kw):
    version = "5" if line == "5" else "4"
    inputs = RecoveryInputs.from_settings(store.settings, segment_size=S, version=version,
                                          version_told=line is not None, **kw)
    return recovery_walk(store, inputs)


def _ends(store: Store, line: str | None) -> list[SegmentEnd]:
    ends: list[SegmentEnd] = []
    for _ in store.scan(columns=["phy_offset"], verify_crc=False, ends=ends, line=line):
        pass
    return ends


def _blank_at(cs: CraftedStore, i: int) -> int:
    last = _seg(cs, i)[-1]
    return last.file_offset + last.size


def test_a_totalsize_past_the_segment_end_is_a_length_mismatch_under_4x_and_minus_one_under_5x(tmp_path, five,
                                                                                             capsys):
    bad = _seg(five, 3)[-1]  # the window's last full segment: the record before its blank
    total = S - bad.file_offset + 100  # runs 100 bytes past the file; the fields still fit
    _set_total(five, bad, total)
    store = _store(tmp_path, five)
    for line in (None, "4"):
        e = _ends(store, line)[3]
        assert (e.kind, e.reason, e.file_offset, e.size) == ("invalid", "length_mismatch", bad.file_offset, total)
        assert f"fields add up to {bad.size}" in e.detail and "runs 100 bytes past the end" in e.detail
        assert f"new byte[{total}]" in e.detail
    e = _ends(store, "5")[3]
    assert (e.kind, e.reason, e.file_offset, e.size) == ("invalid", "bad_size", bad.file_offset, None)
    assert "5.3.3 checks the size first" in e.detail
    # recovery (normal and abnormal) stops at it either way: the truncation point; the next segment is deleted
    for line in (None, "4", "5"):
        for ok in (True, False):
            r = _walk(store, line, last_exit_ok=ok)
            assert r.mode == ("normal" if ok else "abnormal")
            assert (r.process_offset, r.truncate, r.delete_segments) == (bad.phy, (3 * S, bad.file_offset), (4 * S,))
            assert r.failure.reason == ("bad_size" if line == "5" else "length_mismatch")
    # ... and so does the recover plan, in both lines
    for version, reason in (("4", "length_mismatch"), ("5", "bad_size")):
        rc, out, _ = run_cli(capsys, "recover", store.loc.path, "--broker-version", version, "--json",
                             "--plan-file", "-", "--set", f"mappedFileSizeCommitLog={S}")
        plan = json.loads(out)["commitlog"]
        assert rc == 1 and plan["process_offset"] == bad.phy and plan["failure"]["reason"] == reason


def _spans(r) -> list[tuple[int, int, int]]:
    return [(d.base, d.start, d.end) for d in r.dispatch]


def _whole(cs: CraftedStore, i: int) -> tuple[int, int, int]:
    return i * S, 0, _blank_at(cs, i) if i < 4 else cs.placed[-1].file_offset + cs.placed[-1].size


def test_the_4x_reput_skips_a_mismatch_and_dispatches_the_records_after_its_fields(tmp_path, five):
    bad = _seg(five, 0)[2]  # before the recovery window: only the reput reads it
    _set_total(five, bad, bad.size + 1)
    store = _store(tmp_path, five)
    for line in (None, "4"):
        r = _walk(store, line)
        assert r.failure is None and r.supported and r.process_offset == five.placed[-1].phy + five.placed[-1].size
        # the buffer goes on after the fields (the true next record); reputFromOffset is 1 byte ahead, which
        # rollNextFile at the blank absorbs: every other record is dispatched
        assert _spans(r) == [(0, 0, bad.file_offset), (0, bad.file_offset + bad.size, _blank_at(five, 0)),
                             *[_whole(five, i) for i in range(1, 5)]]
        f = [x for x in r.findings if x.kind == "reput_length_mismatch"]
        assert [(x.file, x.offset, x.extra["total_size"], x.extra["read_length"]) for x in f] == [
            ("commitlog/" + f"{0:020d}", bad.file_offset, bad.size + 1, bad.size)]
        assert "recovery (normal or abnormal) stops here" in f[0].detail and "reputFromOffset +=" in f[0].detail


def test_a_4x_reput_drift_past_the_file_end_skips_the_next_file_at_the_blank(tmp_path, five):
    bad = _seg(five, 0)[2]
    total = S - bad.file_offset + 100  # TOTALSIZE past the end of segment 0; the fields fit
    _set_total(five, bad, total)
    store = _store(tmp_path, five)
    r = _walk(store, "4")
    # at the blank, reputFromOffset = blank + (TOTALSIZE - fields) > S: rollNextFile gives 2 S, and segment 1
    # (which the recovery window does not cover either) is never dispatched
    drifted = _blank_at(five, 0) + total - bad.size
    assert S < drifted < 2 * S
    assert _spans(r) == [(0, 0, bad.file_offset), (0, bad.file_offset + bad.size, _blank_at(five, 0)),
                         *[_whole(five, i) for i in range(2, 5)]]
    assert r.failure is None and r.process_offset == five.placed[-1].phy + five.placed[-1].size
    # 5.3.3 (its recovery from the first segment when the consume queue is empty) stops at it: -1
    r5 = _walk(_store(tmp_path / "v5", five, "5"), "5")
    assert (r5.process_offset, r5.failure.reason, r5.delete_segments) == (bad.phy, "bad_size", (S, 2 * S, 3 * S, 4 * S))


@pytest.mark.parametrize(("broker_id", "delta"), [(0, 1), (0, 3), (1, 1)])
def test_a_4x_reput_drift_after_a_bad_record_lands_in_the_next_file(tmp_path, five, broker_id, delta):
    """After a mismatch readSize never reaches the buffer's size: at a -1 record a master adds
    ``size - readSize``, landing sum(TOTALSIZE) past the file's end, where the next getData reads: on a
    record start of segment 1 (delta 1: the records before it are never dispatched) or inside one
    (delta 3: garbage, -1 again, the rest of that file skipped); a slave stops and retries the drifted offset."""
    seg0, seg1 = _seg(five, 0), _seg(five, 1)
    bad, broken = seg0[2], seg0[5]
    total = bad.size + delta
    _set_total(five, bad, total)
    five.corrupt(broken.phy, 5)  # its MAGIC: -1
    store = _store(tmp_path, five, brokerId=str(broker_id))
    r = _walk(store, "4", broker_id=broker_id)
    head = [(0, 0, bad.file_offset), (0, bad.file_offset + bad.size, broken.file_offset)]
    if broker_id:
        assert _spans(r) == head
        stop = [f for f in r.findings if f.kind == "reput_stopped"]
        assert [(f.offset, str(broken.phy + delta) in f.detail) for f in stop] == [(broken.file_offset, True)]
        return
    landing = total  # in segment 1: S + TOTALSIZE
    starts1 = [p.file_offset for p in seg1]
    mid = [] if landing not in starts1 else [(S, landing, _blank_at(five, 1))]
    assert bool(mid) == (delta == 1)  # the fixture's record sizes: 419/420 bytes
    assert _spans(r) == head + mid + [_whole(five, i) for i in range(2, 5)]
    skip = [f for f in r.findings if f.kind == "reput_drift_skip"]
    assert [(f.offset, f.extra["next"]) for f in skip] == [(broken.file_offset, S + landing)]


def _cq_phys(root, qids=(0, 1, 2)) -> list[int]:
    import numpy as np

    from storelib.format.consumequeue import CQ_DTYPE, filler_mask

    out: list[int] = []
    for q in qids:
        d = root / "consumequeue" / "T" / str(q)
        if not d.exists():
            continue
        u = np.frombuffer(b"".join(p.read_bytes() for p in sorted(d.iterdir())), CQ_DTYPE)
        u = u[(u["size"] > 0) & ~filler_mask(u)]
        out += [int(x) for x in u["phy_offset"]]
    return sorted(out)


@pytest.mark.parametrize("past_end", [False, True])
def test_rebuild_dispatches_what_the_4x_reput_reads_around_a_mismatch(tmp_path, five, capsys, past_end):
    """The rebuild's consume queues hold exactly the records the broker's reput dispatches: not the
    mismatched one, and (TOTALSIZE past the file's end) none of segment 1, which rollNextFile skips."""
    bad = _seg(five, 0)[2]
    _set_total(five, bad, S - bad.file_offset + 100 if past_end else bad.size + 1)
    root = five.write(tmp_path / "store")
    out = tmp_path / "out"
    rc, _, err = run_cli(capsys, "rebuild", root, "--out", out, "--engine", "local", "--broker-version", "4",
                         "--set", f"mappedFileSizeCommitLog={S}", "--quiet")
    assert rc == 0, err
    lost = {bad.phy} | ({p.phy for p in _seg(five, 1)} if past_end else set())
    assert _cq_phys(out) == sorted(p.phy for p in five.placed if p.phy not in lost)
    # the recover plan (a start-up from an empty consume queue) says the same: those messages are lost, the
    # mismatched record is an unreadable range
    rc, plan_out, _ = run_cli(capsys, "recover", root, "--broker-version", "4", "--json", "--plan-file", "-",
                              "--set", f"mappedFileSizeCommitLog={S}")
    plan = json.loads(plan_out)
    assert plan["commitlog"]["process_offset"] == five.placed[-1].phy + five.placed[-1].size
    assert sorted(m["phy_offset"] for m in plan["lost"]["messages"]) == sorted(lost - {bad.phy})
    assert [(r["phy_start"], r["reason"]) for r in plan["lost"]["ranges"]] == [(bad.phy, "length_mismatch")]


@pytest.mark.parametrize("version", ["4", "5"])
def test_the_audit_names_the_record_and_what_recovery_and_the_reput_do(tmp_path, five, capsys, version):
    bad = _seg(five, 0)[2]
    _set_total(five, bad, bad.size + 1)
    root = five.write(tmp_path / "store")
    rc, out, _ = run_cli(capsys, "audit", root, "--quiet", "--json", "--broker-version", version,
                         "--set", f"mappedFileSizeCommitLog={S}")
    found = [f for f in json.loads(out)["findings"]
             if f["file"] == f"commitlog/{0:020d}" and f["offset"] == bad.file_offset]
    assert rc == 1 and len(found) == 1, found
    d = found[0]["detail"]
    assert f"TOTALSIZE {bad.size + 1}, fields add up to {bad.size}" in d
    assert "recovery (normal or abnormal) stops here" in d
    assert ("4.9.8 reput" in d and "reputFromOffset +=" in d) == (version == "4")
