"""The audit's fast paths give the same report as the plain ones: split tasks (segments cut at record
starts, parts merged per segment) vs whole-segment tasks, including corruption next to and across a cut
(parts that do not chain fall back to one whole-segment task), per-kind caps across parts, the zero-tail
shortcut, and the sorted-array membership used by the index checks."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa

import storelib.checks.segment as segment_checks
from storelib.checks.logview import is_member
from storelib.fileio.bytesource import zero_tail as _zero_tail
from storelib.scan.commitlog import CommitLog
from storelib.scan.splits import plan_splits

from .test_audit import SEG, _comparable, flip, records, run, seg_file, serious, store_fixtures

SPLIT = 6000  # ~10 cuts per 64 KiB segment


base_store, store = store_fixtures("auditperf")


def cuts(root: Path) -> list[int]:
    """Physical offsets where split tasks start (other than segment starts)."""
    cl = CommitLog(str(root / "commitlog"), SEG)
    return [p.split.segment_base + p.split.start for p in plan_splits(cl, SPLIT) if p.split.start > 0]


def both(root: Path) -> tuple[dict, dict]:
    return run(root), run(root, split_bytes=SPLIT)


def count_fallbacks(monkeypatch) -> list[str]:
    seen: list[str] = []
    real = segment_checks.audit_segment

    def spy(task, opts):
        seen.append(task.name)
        return real(task, opts)

    monkeypatch.setattr(segment_checks, "audit_segment", spy)
    return seen


def test_split_tasks_cover_each_segment_from_record_starts(store):
    from storelib.broker.settings.store import Store
    from storelib.checks.auditstate import plan
    from storelib.checks.segment import split_tasks

    st = Store(str(store), None, broker_conf=str(store / "broker.conf"))
    tasks, *_ = plan(st, {}, None)
    units = split_tasks(st, tasks, SPLIT)
    assert len(units) > 3 * len(tasks)
    starts = {r["phy_offset"] for r in records(store)}
    for t in tasks:
        mine = [u for u in units if u.name == t.name]
        assert mine[0].start == 0 and mine[-1].end is None
        assert all(a.end == b.start for a, b in zip(mine, mine[1:]))
        assert all(u.base + u.start in starts for u in mine)


def test_clean_store_same_report_split_or_whole(store, monkeypatch):
    fb = count_fallbacks(monkeypatch)
    whole, split = both(store)
    assert _comparable(split) == _comparable(whole)
    assert serious(split) == set() and fb == []


def test_crc_errors_and_magic_flips_in_several_parts_same_report(store, monkeypatch):
    recs = records(store)
    for i in (17, 60, 61, 150, 300):
        path, _, off = seg_file(store, recs[i]["phy_offset"])
        flip(path, off + 88 + 3)
    path, _, off = seg_file(store, recs[200]["phy_offset"])
    flip(path, off + 5)  # bad magic: a corrupt region resynchronised at the next record
    fb = count_fallbacks(monkeypatch)
    whole, split = both(store)
    assert _comparable(split) == _comparable(whole)
    assert {k for k, _, _ in serious(whole)} == {"body_crc_mismatch", "corrupt_region"}
    assert fb == []


def test_zeroed_region_across_a_cut_same_report(store):
    c = next(p for p in cuts(store) if p // SEG == 1)
    recs = records(store)
    i = next(k for k, r in enumerate(recs) if r["phy_offset"] == c)
    a, b = recs[i - 2], recs[i + 2]  # zeros from two records before the cut into the second record after it
    path, name, off = seg_file(store, a["phy_offset"])
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(bytes(b["phy_offset"] + 10 - a["phy_offset"]))
    whole, split = both(store)
    assert _comparable(split) == _comparable(whole)
    assert serious(whole) == {("zeroed_region", name, off)}


def test_corrupt_region_spanning_a_cut_falls_back_to_the_whole_segment(store, monkeypatch):
    """The record before a cut loses its magic and the record at the cut its body CRC: the whole-segment
    resync skips the CRC-bad record (region up to the record after it), while the split at the cut starts
    on it. The parts do not chain, so that segment is audited again as one task: same report."""
    c = next(p for p in cuts(store) if p // SEG == 1)
    recs = records(store)
    i = next(k for k, r in enumerate(recs) if r["phy_offset"] == c)
    p0, _, o0 = seg_file(store, recs[i - 1]["phy_offset"])
    flip(p0, o0 + 5)
    p1, name, o1 = seg_file(store, recs[i]["phy_offset"])
    flip(p1, o1 + 88 + 3)
    fb = count_fallbacks(monkeypatch)
    whole = run(store)
    split = run(store, split_bytes=SPLIT)
    assert _comparable(split) == _comparable(whole)
    assert fb == [f"{SEG:020d}"]
    (region,) = whole["regions"]
    assert region["start"] == o0 and region["end"] == recs[i + 1]["phy_offset"] % SEG  # spans the cut


def test_torn_tail_and_bad_last_segment_same_report(store):
    rec = records(store)[-1]
    path, name, off = seg_file(store, rec["phy_offset"])
    with open(path, "r+b") as f:
        f.seek(off + rec["size"] // 2)
        f.write(bytes(rec["size"] - rec["size"] // 2))
    whole, split = both(store)
    assert _comparable(split) == _comparable(whole)
    assert serious(whole) == {("torn_tail", name, off)}


def test_per_kind_caps_are_the_same_when_findings_spread_over_parts(store, monkeypatch):
    """More than MAX_PER_KIND physical_offset_mismatch findings in one segment, spread over parts: the
    merged segment keeps the same first findings and the same 'N more' summary."""
    monkeypatch.setattr(segment_checks, "MAX_PER_KIND", 4)
    recs = [r for r in records(store) if r["phy_offset"] // SEG == 0]
    path = store / "commitlog" / f"{0:020d}"
    with open(path, "r+b") as f:
        for r in recs[::6]:
            f.seek(r["phy_offset"] + 28)
            f.write(struct.pack(">q", r["phy_offset"] + 1))
    whole, split = both(store)
    assert _comparable(split) == _comparable(whole)
    kinds = [f for f in whole["findings"] if f["kind"] == "physical_offset_mismatch"]
    assert any(f["extra"].get("more") for f in kinds)


def test_incremental_run_with_splits_matches_whole(store, tmp_path):
    path, _, off = seg_file(store, records(store)[17]["phy_offset"])
    flip(path, off + 88 + 5)
    a = run(store, since=str(tmp_path / "a.state"))
    b = run(store, since=str(tmp_path / "b.state"), split_bytes=SPLIT)
    assert _comparable(a) == _comparable(b)
    # second run: everything carried forward either way
    a2 = run(store, since=str(tmp_path / "a.state"))
    b2 = run(store, since=str(tmp_path / "b.state"), split_bytes=SPLIT)
    assert _comparable(a2) == _comparable(b2) and b2["run"]["segments_carried"] == len(b["segments"])


def test_run_reports_record_bytes_scanned_and_file_bytes(store):
    rep = run(store)
    r = rep["run"]
    assert r["bytes_scanned"] == rep["summary"]["bytes_valid"]
    assert r["bytes_audited"] == sum(os.path.getsize(p) for p in (store / "commitlog").iterdir())
    assert r["bytes_scanned"] < r["bytes_audited"]


def test_zero_tail_detects_any_non_zero_byte():
    buf = bytearray(1000)
    assert _zero_tail(memoryview(bytes(buf)), 0)
    for pos in (0, 3, 7, 8, 500, 993, 999):
        b = bytearray(buf)
        b[pos] = 1
        mv = memoryview(bytes(b))
        assert not _zero_tail(mv, 0, chunk=64)
        assert _zero_tail(mv, pos + 1, chunk=64)
        assert not _zero_tail(mv, pos, chunk=16)
    assert _zero_tail(memoryview(b""), 0)


def test_member_equals_isin():
    rng = np.random.default_rng(3)
    for n, m in ((0, 5), (5, 0), (1000, 300), (50, 5000)):
        vals = rng.integers(-5, 2000, n).astype(np.int64)
        s = rng.integers(-5, 2000, m).astype(np.int64)
        assert np.array_equal(is_member(vals, np.sort(s)), np.isin(vals, s))


def _key_batch(rows: list[tuple[str, str | None, str | None, int]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "topic": pa.array([r[0] for r in rows], pa.string()),
        "uniq_key": pa.array([r[1] for r in rows], pa.string()),
        "keys": pa.array([r[2] for r in rows], pa.string()),
        "tran_type": pa.array([r[3] for r in rows], pa.int8())})


def test_java_hashes_match_java_string_hash():
    from storelib.format.javahash import java_hashes, java_string_hash

    words = ["", "a", "hello world", "é", "😀", "x" * 5000, "Topic#7F000001", None]
    h, n = java_hashes(pa.array(words, pa.string()))
    for w, hv, ln in zip(words, h.tolist(), n.tolist()):
        assert hv == (java_string_hash(w) if w is not None else 0)
        assert ln == (len(w.encode("utf-16-le")) // 2 if w is not None else 0)
