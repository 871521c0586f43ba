"""The rebuild's phase A in units: segments cut at verified record starts into tasks whose results join like
one scan of each segment. The files are the same bytes as with whole-segment tasks, on a clean store and
with the walk ending inside a unit (a CRC failure in the window, a bad magic before a cut), and a cut that
one scan never reaches (records inside a body, written for that spot) sends its segment round again as
one task."""

from __future__ import annotations

from pathlib import Path

import pytest

import jobs.engines.rebuild_tasks as rebuild_tasks
from storelib.broker.settings.store import Store
from storelib.format.record import encode_message
from storelib.scan.splits import segment_cuts
from tests.rebuild_storegen import CraftedStore, msg
from tests.test_rebuild import (
    S,
    _sample_args,
    assert_same_output,
    files_of,
    index_list,
    rich_store,
    run,
    with_spark,  # noqa: F401 - the fixture
    write_conf,
)

SPLIT = 6000  # ~10 units per 64 KiB segment


def _conf(tmp: Path, **extra) -> str:
    return write_conf(tmp, mappedFileSizeCommitLog=S, maxHashSlotNum=64, maxIndexNum=6000, **extra)


def _units_seen(monkeypatch) -> list:
    """What each join of phase A's units found: (units, segments joined, segments to redo)."""
    seen: list = []
    real = rebuild_tasks.join_units

    def spy(items, metas):
        j = real(items, metas)
        seen.append((len(items), len(j.ends), len(j.redo)))
        return j

    monkeypatch.setattr(rebuild_tasks, "join_units", spy)
    return seen


def _same(a: dict, b: dict) -> None:
    assert a["files"] == b["files"] and a["counts"] == b["counts"]
    assert a["recovery"] == b["recovery"]


@pytest.mark.parametrize("version", ["4", "5"])
def test_units_write_the_same_files_as_whole_segment_tasks(tmp_path, monkeypatch, version):
    cs = rich_store(tmp_path / "store", version, n=700)
    conf = _conf(tmp_path)
    whole = run(tmp_path / "store", tmp_path / "whole", conf, broker_version=version)
    seen = _units_seen(monkeypatch)
    cut = run(tmp_path / "store", tmp_path / "cut", conf, broker_version=version, split_bytes=SPLIT)
    (units, segments, redo), = seen
    assert segments == len(cs.segments) and units > 5 * segments and redo == 0
    assert_same_output(tmp_path / "whole", tmp_path / "cut")
    _same(whole, cut)


def test_sample_store_in_units_is_byte_identical_to_the_broker_files(tmp_path, monkeypatch, sample):
    """RocketMQ's own store (4.9.8 and 5.3.3), its segments cut in units: the broker's own files."""
    store, conf = _sample_args(sample)
    seen = _units_seen(monkeypatch)
    run(store, tmp_path / "out", conf, split_bytes=16 * 1024)
    assert seen[0][0] > seen[0][1] and seen[0][2] == 0  # cut, and every cut on the chain
    assert files_of(tmp_path / "out", "consumequeue") == files_of(store, "consumequeue")
    assert index_list(tmp_path / "out") == index_list(store)


def test_the_last_bytes_are_cut_finer_so_a_run_ends_with_short_units(tmp_path):
    """The last ``fine_tail`` bytes of records (before the young last segment's zeros, into the segment
    before it) are cut four times finer; everything before them as without."""
    cs = rich_store(tmp_path / "store", "4", n=700)
    cl = Store(str(tmp_path / "store")).commitlog
    names = [s.name for s in cl.segments]
    written = cs.pos  # the last segment's records end here, zeros after
    assert written < S // 4
    coarse = segment_cuts(cl, 16 << 10, set(names))
    fine = segment_cuts(cl, 16 << 10, set(names), fine_tail=written + (24 << 10))
    assert {n: fine.get(n) for n in names[:-2]} == {n: coarse.get(n) for n in names[:-2]}
    prev = names[-2]
    starts = {p.file_offset for p in cs.placed if p.segment == len(cs.segments) - 2}
    assert set(fine[prev]) <= starts and len(fine[prev]) >= len(coarse[prev]) + 3
    tail = [c for c in fine[prev] if c >= S - (24 << 10)]
    assert len(tail) >= 4 and max(b - a for a, b in zip(tail, tail[1:])) < 8 << 10


def test_units_on_a_process_pool_write_the_same_files(tmp_path):
    rich_store(tmp_path / "store", "5", n=500)
    conf = _conf(tmp_path)
    whole = run(tmp_path / "store", tmp_path / "whole", conf, broker_version="5")
    pool = run(tmp_path / "store", tmp_path / "pool", conf, broker_version="5", engine="pool", workers=2,
               split_bytes=SPLIT)
    assert_same_output(tmp_path / "whole", tmp_path / "pool")
    _same(whole, pool)


@pytest.mark.spark
@pytest.mark.usefixtures("with_spark")
def test_units_on_spark_write_the_same_files(tmp_path, monkeypatch):
    rich_store(tmp_path / "store", "4", n=500)
    conf = _conf(tmp_path)
    whole = run(tmp_path / "store", tmp_path / "whole", conf, broker_version="4")
    seen = _units_seen(monkeypatch)
    spark = run(tmp_path / "store", tmp_path / "spark", conf, broker_version="4", engine="spark", split_bytes=SPLIT)
    assert seen[0][0] > 3 * seen[0][1]
    assert_same_output(tmp_path / "whole", tmp_path / "spark")
    _same(whole, spark)


def test_a_crc_failure_inside_a_later_unit_ends_the_walk_there(tmp_path, monkeypatch):
    cs = rich_store(tmp_path / "store", "5", n=400)
    last = len(cs.segments) - 1
    victim = [p for p in cs.placed if p.segment == last][-5]  # the window: CRCs are checked
    cs.corrupt(victim.phy, cs.body_pos(victim) + 1)
    cs.write(tmp_path / "store")
    conf = _conf(tmp_path, enabledAppendPropCRC="true")
    cuts = segment_cuts(Store(str(tmp_path / "store")).commitlog, SPLIT, {f"{last * S:020d}"})
    assert any(c < victim.phy - last * S for c in cuts[f"{last * S:020d}"])  # the failure is past a cut
    whole = run(tmp_path / "store", tmp_path / "whole", conf, broker_version="5")
    seen = _units_seen(monkeypatch)
    cut = run(tmp_path / "store", tmp_path / "cut", conf, broker_version="5", split_bytes=SPLIT)
    assert cut["recovery"]["process_offset"] == victim.phy
    assert cut["recovery"]["failure"]["reason"] == "crc_mismatch"
    assert cut["counts"]["records"] == sum(1 for p in cs.placed if p.phy < victim.phy)
    assert seen[0][2] == 0
    assert_same_output(tmp_path / "whole", tmp_path / "cut")
    _same(whole, cut)


def test_a_bad_magic_just_before_a_cut_ends_the_segment_in_that_unit(tmp_path, monkeypatch):
    cs = rich_store(tmp_path / "store", "4", n=700)
    name = f"{S:020d}"
    cut_at = segment_cuts(Store(str(tmp_path / "store")).commitlog, SPLIT, {name})[name][2]
    before = max((p for p in cs.placed if p.segment == 1 and p.file_offset < cut_at), key=lambda p: p.file_offset)
    cs.corrupt(before.phy, 5)  # MAGIC
    cs.write(tmp_path / "store")
    conf = _conf(tmp_path)
    whole = run(tmp_path / "store", tmp_path / "whole", conf, broker_version="4")
    seen = _units_seen(monkeypatch)
    cut = run(tmp_path / "store", tmp_path / "cut", conf, broker_version="4", split_bytes=SPLIT)
    assert seen[0][2] == 0
    assert cut["counts"]["records"] < len(cs.placed)
    assert_same_output(tmp_path / "whole", tmp_path / "cut")
    _same(whole, cut)


def _records_in_a_body(cs: CraftedStore, n: int = 6) -> tuple[int, int]:
    """Append a message whose body holds ``n`` records written as if they lay where they do (their
    PHYSICALOFFSET fields say so): a cut search finds them. Returns (file offset of the second inner
    record, segment)."""
    seg, pos = cs.seg_index, cs.pos
    body_at = pos + 88  # IPv4 hosts: the body starts 88 bytes into the record
    body, inner = b"", []
    for i in range(n):
        m = msg("Inner", 0, keys=f"inner{i}")
        m.physical_offset, m.queue_offset, m.store_timestamp, m.born_timestamp = 0, i, cs.ts, cs.ts
        m.physical_offset = seg * cs.S + body_at + len(body)
        inner.append(body_at + len(body))
        body += encode_message(m)
    p = cs.append(msg("Outer", 0, keys="outer", body=body))
    assert p.segment == seg and p.file_offset == pos
    return inner[1], seg


def test_a_cut_inside_a_body_sends_the_segment_round_again_as_one_task(tmp_path, monkeypatch):
    cs = CraftedStore(S)
    for i in range(30):
        cs.append(msg("T", i % 3, keys=f"k{i}", body=b"x" * 200))
    fake, seg = _records_in_a_body(cs)
    for i in range(60):
        cs.append(msg("T", i % 3, keys=f"m{i}", body=b"y" * 300))
    cs.write(tmp_path / "store")
    step = fake - 3  # the first nominal cut lies 3 bytes before an inner record: the search takes it
    name = f"{seg * S:020d}"
    assert segment_cuts(Store(str(tmp_path / "store")).commitlog, step, {name})[name][0] == fake
    conf = _conf(tmp_path)
    whole = run(tmp_path / "store", tmp_path / "whole", conf, broker_version="4")
    seen = _units_seen(monkeypatch)
    cut = run(tmp_path / "store", tmp_path / "cut", conf, broker_version="4", split_bytes=step)
    assert seen[0][2] == 1  # that segment again, as one task
    assert cut["counts"]["records"] == len(cs.placed)
    assert_same_output(tmp_path / "whole", tmp_path / "cut")
    _same(whole, cut)


@pytest.mark.parametrize("case", ["plus_one", "past_end", "minus_one_landing"])
def test_a_segment_the_498_reput_reads_around_a_mismatch_is_scanned_again_as_one_task(tmp_path, monkeypatch, case):
    """4.9.8's reput reads around a length mismatch (storelib.broker.recovery.reputpath): the segment's units
    give way to one task over the reput's ranges; the files are those of whole-segment tasks."""
    from tests.test_totalsize_mismatch import S as S8
    from tests.test_totalsize_mismatch import _seg, _set_total, five_segments

    cs = five_segments()
    bad = _seg(cs, 0)[2]
    _set_total(cs, bad, bad.size + 1 if case != "past_end" else S8 - bad.file_offset + 100)
    if case == "minus_one_landing":  # a -1 after it: the reput lands past the file's end, in segment 1
        cs.corrupt(_seg(cs, 0)[5].phy, 5)
    cs.write(tmp_path / "store")
    conf = write_conf(tmp_path, mappedFileSizeCommitLog=S8)
    whole = run(tmp_path / "store", tmp_path / "whole", conf, broker_version="4")
    again: list = []
    real = rebuild_tasks.rescan_items
    monkeypatch.setattr(rebuild_tasks, "rescan_items", lambda *a: again.append(real(*a)) or again[-1])
    cut = run(tmp_path / "store", tmp_path / "cut", conf, broker_version="4", split_bytes=1500)
    assert [it.idx for it in again[0]] and all(len(it.ranges) >= 1 and it.ranges[0][1] is not None
                                               for it in again[0])
    assert_same_output(tmp_path / "whole", tmp_path / "cut")
    _same(whole, cut)
