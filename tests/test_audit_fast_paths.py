"""The audit's shortcuts for healthy stores give exactly the report of the full comparisons: index files
whose entries are the log's keys in order skip the per-entry lookups, consume queues whose units are
exactly their records skip the lookups too, a consume queue's invalid tail is not compared, file holes
read as zeros without being scanned, and queue grouping by dense 16-bit codes orders rows like the
stable sort of the 64-bit codes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import storelib.checks.crossfile as crossfile
import storelib.checks.index as index_checks
import storelib.checks.keystream as keystream
import storelib.checks.queues as queue_checks
from storelib.checks.keystream import KeyStream
from storelib.checks.queues import _units_before_invalid_tail, queue_group_order
from storelib.fileio.bytesource import data_ranges
from storelib.fileio.bytesource import zero_tail as _zero_tail
from storelib.format.consumequeue import CQ_DTYPE, make_units

from .test_audit import _comparable, flip, store_fixtures
from .test_audit import run as _run

base_store, store = store_fixtures("auditfast")

def run(root: Path, **kw) -> dict:
    """The audit with the cross-file checks on the driver, whose shortcuts these tests look inside."""
    return _run(root, cross="driver", **kw)


ENTRIES = 40 + 64 * 4  # IndexFile header + slot table of the test geometry: entry 0 starts here


def _whole_view(monkeypatch) -> None:
    """No streamed cross-file checks: the whole record view judges every store."""
    monkeypatch.setattr(crossfile, "streamable", lambda store, results: False)


def _plain(monkeypatch) -> None:
    """Turn every shortcut off: the whole record view, every index entry looked up, every CQ unit compared."""
    _whole_view(monkeypatch)

    def never(self, ent, chunk=0) -> bool:
        self.aligned = False
        return False

    monkeypatch.setattr(keystream.KeyStream, "next_are_entries", never)
    monkeypatch.setattr(queue_checks, "_units_before_invalid_tail", lambda units, path: len(units))
    monkeypatch.setattr(queue_checks, "queue_records_exactly", lambda log, recs, phy, qoffs: None)


def _same_as_plain(root: Path, monkeypatch) -> dict:
    fast = run(root, now_ms=1_800_000_000_000)
    with monkeypatch.context() as m:
        _plain(m)
        plain = run(root, now_ms=1_800_000_000_000)
    assert _comparable(fast) == _comparable(plain)
    return fast


def _index_files(root: Path) -> list[Path]:
    return sorted((root / "index").iterdir())


def test_clean_store_takes_the_index_shortcut_and_reports_the_same(store, monkeypatch):
    calls = []
    real = index_checks.key_codes
    monkeypatch.setattr(index_checks, "key_codes", lambda log: calls.append(1) or real(log))
    rep = _same_as_plain(store, monkeypatch)
    assert len(rep["index"]["files"]) > 2
    assert calls == [1]  # only the plain run computed the key codes
    assert rep["run"]["cross_check_mode"] == "streamed"
    with monkeypatch.context() as m:
        _whole_view(m)
        assert _comparable(run(store, now_ms=1_800_000_000_000)) == _comparable(rep)
    assert calls == [1]  # the whole view's shortcut needed no key codes either


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_wrong_hash_in_one_index_file_same_findings_as_full_lookups(store, monkeypatch, where):
    files = _index_files(store)
    f = {"first": files[0], "middle": files[len(files) // 2], "last": files[-1]}[where]
    flip(f, ENTRIES + 20 * 3 + 3, 0x10)  # entry 3's keyHash
    rep = _same_as_plain(store, monkeypatch)
    assert any(x["kind"] == "index_entry_wrong_hash" for x in rep["findings"])


@pytest.mark.parametrize("which", [0, 2, -1])
def test_deleted_index_file_same_findings_as_full_lookups(store, monkeypatch, which):
    _index_files(store)[which].unlink()
    rep = _same_as_plain(store, monkeypatch)
    assert any(x["kind"] in ("index_key_missing", "index_behind_commitlog") for x in rep["findings"])


def test_entry_pointing_elsewhere_and_bad_prev_index_same_findings(store, monkeypatch):
    files = _index_files(store)
    flip(files[1], ENTRIES + 20 * 5 + 4 + 7, 0x04)  # entry 5's phyOffset
    flip(files[3], ENTRIES + 20 * 7 + 19, 0x01)  # entry 7's prevIndex
    rep = _same_as_plain(store, monkeypatch)
    kinds = {x["kind"] for x in rep["findings"]}
    assert "index_entry_bad_offset" in kinds


def test_physical_offset_field_changed_disables_the_shortcut_same_findings(store, monkeypatch):
    flip(store / "commitlog" / f"{0:020d}", 4 + 4 + 4 + 4 + 4 + 8 + 7, 0x08)  # first record's PHYSICALOFFSET
    rep = _same_as_plain(store, monkeypatch)
    assert any(x["kind"] == "physical_offset_mismatch" for x in rep["findings"])


@pytest.mark.parametrize("field_off, mask", [(7, 0x01), (8 + 3, 0x02), (12 + 7, 0x04)])
def test_cq_unit_with_another_offset_size_or_tags_same_findings_as_lookups(store, monkeypatch, field_off, mask):
    f = sorted((store / "consumequeue" / "OrderEvents" / "1").iterdir())[0]
    flip(f, 20 * 9 + field_off, mask)  # unit 9: phyOffset, size or tagsCode
    rep = _same_as_plain(store, monkeypatch)
    assert any(x["kind"].startswith("cq_entry") for x in rep["findings"])


def test_queue_rows_are_taken_as_is_only_when_units_match_them_exactly(store, monkeypatch):
    seen: list[bool] = []
    real = queue_checks.queue_records_exactly

    def spy(log, recs, phy, qoffs):
        r = real(log, recs, phy, qoffs)
        seen.append(r is not None)
        return r

    monkeypatch.setattr(queue_checks, "queue_records_exactly", spy)
    _whole_view(monkeypatch)
    run(store)
    assert len(seen) == 4 and all(seen)
    seen.clear()
    flip(sorted((store / "consumequeue" / "OrderEvents" / "0").iterdir())[0], 20 * 4 + 7, 0x01)
    run(store)
    assert seen.count(False) == 1


def _last_cq_file(root: Path) -> Path:
    return sorted((root / "consumequeue" / "OrderEvents" / "0").iterdir())[-1]


def test_valid_unit_after_zeros_in_the_last_cq_file_is_still_seen(store, monkeypatch):
    f = _last_cq_file(store)
    data = bytearray(f.read_bytes())
    data[-20:] = make_units([5], [100], [0]).astype(CQ_DTYPE).tobytes()  # a stray unit in the last slot
    f.write_bytes(bytes(data))
    rep = _same_as_plain(store, monkeypatch)
    assert any(x["kind"] == "cq_entry_missing" for x in rep["findings"])


def test_sparse_and_all_zero_cq_files_same_findings(store, monkeypatch):
    f = _last_cq_file(store)
    size = f.stat().st_size
    data = f.read_bytes()
    keep = len(data.rstrip(b"\0"))
    with open(f, "wb") as out:  # the same content with the zero tail as a hole
        out.write(data[:keep])
        out.truncate(size)
    one = sorted((store / "consumequeue" / "PaymentNotify" / "0").iterdir())
    for p in one[1:]:
        p.unlink()
    one[0].write_bytes(bytes(one[0].stat().st_size))  # the queue's only file: all zeros
    _same_as_plain(store, monkeypatch)


def _sparse(path: Path, size: int, writes: dict[int, bytes]) -> memoryview:
    with open(path, "wb") as f:
        f.truncate(size)
        for off, b in writes.items():
            f.seek(off)
            f.write(b)
    return memoryview(path.read_bytes())


def test_zero_tail_reads_holes_as_zeros_and_finds_bytes_after_them(tmp_path):
    p = tmp_path / "seg"
    view = _sparse(p, 8 << 20, {100: b"\x01", (5 << 20) + 3: b"\x07"})
    for path in (str(p), None):
        assert not _zero_tail(view, 0, path=path)
        assert not _zero_tail(view, 101, path=path)
        assert not _zero_tail(view, (5 << 20) + 3, path=path)
        assert _zero_tail(view, (5 << 20) + 4, path=path)
    assert _zero_tail(memoryview(b""), 0, path=None)


def test_data_ranges_hold_every_non_zero_byte(tmp_path):
    rng = np.random.default_rng(3)
    offs = sorted(int(x) for x in rng.integers(0, 16 << 20, 12))
    p = tmp_path / "f"
    view = _sparse(p, 16 << 20, {o: b"\xff" for o in offs})
    ranges = data_ranges(str(p), 0, len(view))
    assert all(any(a <= o < b for a, b in ranges) for o in offs)
    assert data_ranges(str(p), 5, 5) == []
    assert data_ranges(None, 3, 9) == [(3, 9)]
    assert data_ranges(str(tmp_path / "missing"), 0, 10) == [(0, 10)]


def test_units_before_invalid_tail_keeps_every_unit_with_a_size(tmp_path):
    u = np.zeros(1000, CQ_DTYPE)
    assert _units_before_invalid_tail(u, None) == 0
    u[:10] = make_units(np.arange(10) * 100, [100] * 10, [0] * 10)
    assert _units_before_invalid_tail(u, None) == 10
    u[700] = make_units([-1], [3], [0])[0]  # invalid (negative offset) but has a size: kept
    assert _units_before_invalid_tail(u, None) == 701
    u[900] = make_units([77], [0], [9])[0]  # no size: part of the invalid tail
    assert _units_before_invalid_tail(u, None) == 701
    p = tmp_path / "cq"
    with open(p, "wb") as f:
        f.write(u[:701].tobytes())
        f.truncate(len(u) * 20)
    mapped = np.frombuffer(p.read_bytes(), CQ_DTYPE)
    assert _units_before_invalid_tail(mapped, str(p)) == 701


def test_queue_group_order_equals_the_stable_sort_of_the_codes():
    rng = np.random.default_rng(11)
    for n_topics, qids in ((5, (0, 8)), (300, (0, 16)), (3, (-2, 4)), (2, (0, 70000))):
        t = rng.integers(0, n_topics, 20000).astype(np.int64)
        q = rng.integers(qids[0], qids[1], 20000).astype(np.int32)
        code = (t << 32) | (q.astype(np.int64) & 0xFFFFFFFF)
        assert np.array_equal(queue_group_order(code, t, q, n_topics), np.argsort(code, kind="stable"))


def test_group_order_equals_the_stable_sort_on_every_path():
    """The radix path (a narrow range), the dense-rank path (few values spread wide) and the plain sort
    (more than 65536 values), on the partition keys of the export and the generator's queue codes."""
    from storelib.scan.arrowcols import group_order

    rng = np.random.default_rng(5)
    cases = [rng.integers(0, 16, 30000), rng.integers(-5, 5, 30000) * (1 << 40), rng.integers(0, 1 << 40, 90000),
             np.zeros(1, np.int64), np.zeros(0, np.int64), np.arange(70000)[::-1]]
    for code in cases:
        code = code.astype(np.int64)
        assert np.array_equal(group_order(code), np.argsort(code, kind="stable"))


def test_radix_order_equals_the_stable_sort_for_one_two_and_wide_passes():
    """Hash slots below 2**16 (one pass), below 2**24 (an 8-bit second pass) and up to 2**32 (a 16-bit
    one), with many equal values (ties keep their order), empty, int32 and uint32 inputs; a negative
    value is refused rather than sorted wrong."""
    from storelib.scan.arrowcols import radix_order

    rng = np.random.default_rng(11)
    cases = [rng.integers(0, 1 << 16, 50000), rng.integers(0, 5_000_000, 200000), rng.integers(0, 7, 40000),
             rng.integers(0, 1 << 32, 120000, dtype=np.uint64).astype(np.uint32),
             rng.integers(0, 1 << 31, 60000).astype(np.int32), np.zeros(0, np.int64), np.array([3])]
    for v in cases:
        assert np.array_equal(radix_order(v), np.argsort(v, kind="stable"))
    with pytest.raises(ValueError):
        radix_order(np.array([4, -1, 2]))


def test_slot_chains_group_entries_by_slot_oldest_first():
    from storelib.broker.index.indexchains import slot_chains

    rng = np.random.default_rng(12)
    slot = rng.integers(0, 5_000_000, 300000)
    ss, ns = slot_chains(slot, 1000)
    order = np.lexsort((np.arange(len(slot)), slot))
    assert np.array_equal(ss, slot[order]) and np.array_equal(ns, order + 1000)
    assert ns.dtype == np.int32


def test_index_validation_sees_a_stray_entry_after_a_hole(store):
    from storelib.format.indexfile import IndexFile, IndexGeometry

    g = IndexGeometry(64, 200)
    f = _index_files(store)[-1]
    with IndexFile.open(str(f), g, strict=False) as idx:
        used = g.entry_pos(idx.index_count)
        assert [x.kind for x in idx.validate()] == []
    data = f.read_bytes()
    stray = g.entry_pos(170) + 6
    for content in (data[:used], data[:used] + bytes(stray - used) + b"\x09"):
        with open(f, "wb") as out:  # the unused entries as a hole (and a byte after it)
            out.write(content)
            out.truncate(len(data))
        with IndexFile.open(str(f), g, strict=False) as idx:
            found = [(x.kind, x.offset) for x in idx.validate()]
        assert found == ([] if len(content) == used else [("data_beyond_index_count", g.entry_pos(170))])


def test_hole_probe_needs_no_seek_data(tmp_path, monkeypatch):
    p = tmp_path / "f"
    view = _sparse(p, 1 << 20, {9: b"\x01"})
    monkeypatch.delattr(os, "SEEK_DATA")
    assert data_ranges(str(p), 0, len(view)) == [(0, len(view))]
    assert not _zero_tail(view, 0, path=str(p))


def _traffic_per_topic_masks(log, buckets: int = 60) -> dict:
    """The straightforward traffic series (a mask per topic), the reference for the one-count version."""
    from storelib.checks.logcharts import MAX_TOPICS, time_buckets

    ts = log.ts
    bucket, start, nb = time_buckets(int(ts.min()), int(ts.max()), buckets)
    b = (ts - start) // bucket
    t = log.topic_idx
    top = np.argsort(-np.bincount(t, minlength=len(log.topic_names)), kind="stable")[:MAX_TOPICS]
    series = {log.topic_names[ti]: np.bincount(b[t == ti], minlength=nb).tolist() for ti in top.tolist()}
    rest = ~np.isin(t, top)
    if rest.any():
        series["(other topics)"] = np.bincount(b[rest], minlength=nb).tolist()
    return {"bucket_ms": int(bucket), "start_ms": int(start), "topics": series}


@pytest.mark.parametrize("n_topics", [1, 5, 8, 9, 40])
def test_traffic_series_and_size_percentiles_equal_the_straightforward_ones(n_topics):
    from types import SimpleNamespace

    from storelib.checks.logcharts import SizeHistogram, TrafficSeries, size_histogram, traffic_series

    rng = np.random.default_rng(n_topics)
    n = 50_000
    log = SimpleNamespace(ts=np.sort(rng.integers(1_700_000_000_000, 1_700_000_000_000 + 3_600_000 * 30, n)),
                          topic_idx=rng.zipf(1.5, n).clip(1, n_topics).astype(np.int64) - 1,
                          topic_names=[f"T{i}" for i in range(n_topics)])
    want = _traffic_per_topic_masks(log)
    assert traffic_series(log.ts, log.topic_idx, log.topic_names) == want
    # fed segment by segment (topics first seen later get their rows late): the same series
    streamed = TrafficSeries(int(log.ts.min()), int(log.ts.max()))
    for a in range(0, n, 7_001):
        part = log.topic_idx[a:a + 7_001]
        streamed.feed(log.ts[a:a + 7_001], part, int(part.max()) + 1)
    assert streamed.result(log.topic_names) == want
    for sizes in (rng.integers(91, 4_000_000, n), rng.integers(91, 200, n), rng.integers(91, 95, 7),
                  np.array([300]), np.array([91, 4_000_000])):
        h = size_histogram(sizes)
        k = np.floor(np.log2(sizes)).astype(np.int64)
        c = np.bincount(k)
        assert h == {"buckets": [{"from": 1 << i, "to": (1 << (i + 1)) - 1, "count": int(m)}
                                 for i, m in enumerate(c) if m],
                     "min": int(sizes.min()), "max": int(sizes.max()), "mean": float(sizes.mean()),
                     "p50": float(np.percentile(sizes, 50)), "p99": float(np.percentile(sizes, 99))}
        chunked = SizeHistogram()
        for a in range(0, len(sizes), 999):
            chunked.feed(sizes[a:a + 999])
        assert chunked.result() == h


def test_key_stream_matches_files_across_table_ends_and_stops_at_the_first_other_file():
    from storelib.checks.logview import Unsettled
    from storelib.format.indexfile import ENTRY_DTYPE

    def keys(phy: list[int], kh: list[int], pos: list[int] | None = None) -> pa.Table:
        return pa.table({"pos": pa.array(pos or phy, pa.int64()), "phy": pa.array(phy, pa.int64()),
                         "key_hash": pa.array(kh, pa.int32())})

    def entries(phy: list[int], kh: list[int]) -> np.ndarray:
        e = np.zeros(len(phy), ENTRY_DTYPE)
        e["phy_offset"], e["key_hash"] = phy, kh
        return e

    tables = [keys([10, 20, 30], [1, 2, 3]), keys([], []), keys([40, 50], [4, 5]), keys([60], [6])]
    ks = KeyStream(iter(tables), 6)
    assert ks.next_are_entries(entries([10, 20], [1, 2]), chunk=1)
    assert ks.next_are_entries(entries([30, 40, 50], [3, 4, 5]), chunk=2)  # across two table ends
    assert not ks.all_matched() and ks.spans == [(0, 2), (2, 5)]
    assert not ks.next_are_entries(entries([60], [7]))  # another hash: no later file is matched
    assert not ks.next_are_entries(entries([60], [6])) and not ks.all_matched()
    with pytest.raises(Unsettled):  # streamed: a key away from its record's PHYSICALOFFSET field
        KeyStream(iter([keys([10], [1], pos=[11])]), 1).next_are_entries(entries([10], [1]))
    lenient = KeyStream(iter([keys([10], [1], pos=[11])]), 1, strict=False, aligned=False)
    assert not lenient.next_are_entries(entries([10], [1])) and not lenient.all_matched()


def _chains_reference(kh: np.ndarray, prev: np.ndarray, slots: int) -> tuple[int, int | None]:
    """Broken entries of a file's chains, one entry at a time: (count, first in (slot, entry) order)."""
    newest: dict[int, int] = {}
    bad = []
    for i, (h, p) in enumerate(zip(kh.tolist(), prev.tolist())):
        s = h % slots if h >= 0 else -1
        if p != newest.get(s, 0):
            bad.append((s, i + 1))
        newest[s] = i + 1
    return len(bad), (min(bad)[1] if bad else None)


def _putkey_chains(kh: np.ndarray, slots: int) -> tuple[np.ndarray, dict[int, int]]:
    """The reference chains, entry by entry as putKey links them: each entry's prevIndex (its slot's newest
    entry so far, 0 for the first; negative hashes chain in a slot of their own, -1) and the newest entry of
    every slot at the end."""
    newest: dict[int, int] = {}
    prev = np.zeros(len(kh), np.int64)
    for i, h in enumerate(kh.tolist()):
        s = h % slots if h >= 0 else -1
        prev[i] = newest.get(s, 0)
        newest[s] = i + 1
    return prev, newest


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_index_chains_checked_in_chunks_find_what_the_whole_file_check_finds(chunk):
    from storelib.checks.segment import Capped
    from storelib.format.indexfile import ENTRY_DTYPE, IndexGeometry

    g = IndexGeometry(64, 4000)
    rng = np.random.default_rng(7)
    m = 3000
    kh = rng.integers(0, 1 << 31, m, dtype=np.int64)
    kh[rng.choice(m, 20, replace=False)] *= -1  # negative hashes chain in a slot of their own
    prev, _ = _putkey_chains(kh, 64)
    ent = np.zeros(m, dtype=ENTRY_DTYPE)
    ent["key_hash"], ent["phy_offset"], ent["prev_index"] = kh, np.arange(m) * 100, prev
    for corrupt in ([], [2999], [5, 1700, 2400], list(rng.choice(m, 50, replace=False))):
        e = ent.copy()
        e["prev_index"][corrupt] += 1
        out = Capped()
        index_checks.check_chains(e, g, "index/x", out, chunk=chunk)
        found = [f for f in out.done() if f.kind == "index_chain_broken"]
        count, first = _chains_reference(e["key_hash"].astype(np.int64), e["prev_index"].astype(np.int64), 64)
        if not count:
            assert not found
            continue
        assert len(found) == 1 and found[0].extra["count"] == count
        assert found[0].offset == g.entry_pos(first) + 16 and f"entry {first})" in found[0].detail


@pytest.mark.parametrize("chunk", [1, 5, 64, 1 << 20])
def test_index_chains_proved_without_sorting_exactly_when_no_entry_is_off(chunk):
    """The sort-free proof (``proven_chains``) against the entry-by-entry reference, on corruptions that keep
    every link plausible: a link to an earlier entry of the same slot that is not the previous one, two
    entries linked to the same one, links swapped within a slot, across chunks, into another slot, forward,
    to 0, negative."""
    from storelib.checks.segment import Capped
    from storelib.format.indexfile import ENTRY_DTYPE, IndexGeometry

    slots = 16
    g = IndexGeometry(slots, 4000)
    rng = np.random.default_rng(11)
    m = 600
    kh = rng.integers(0, 1 << 31, m, dtype=np.int64)
    kh[rng.choice(m, 15, replace=False)] *= -1
    slot = np.where(kh >= 0, kh % slots, -1)
    prev, _ = _putkey_chains(kh, slots)
    same = {s: np.flatnonzero(slot == s) for s in set(slot.tolist())}  # each slot's entries (0-based)

    def corrupt(kind: str, e: np.ndarray) -> None:
        pv = e["prev_index"]
        i = int(rng.choice([j for j in range(m) if np.searchsorted(same[slot[j]], j) >= 2]))
        older = same[slot[i]][: np.searchsorted(same[slot[i]], i)]  # 0-based earlier entries of i's slot
        if kind == "skip":  # an earlier entry of the slot, not the previous one
            pv[i] = int(older[-2]) + 1
        elif kind == "shared":  # the same target as the previous entry of the slot
            pv[i] = pv[older[-1]]
        elif kind == "swap":  # two links of one slot exchanged
            j = int(older[-1])
            pv[i], pv[j] = pv[j], pv[i]
        elif kind == "other_slot":  # the last entry of another slot, which no other entry links to
            i = max(j for j in range(m) if np.searchsorted(same[slot[j]], j) >= 1)
            pv[i] = int(rng.choice([int(v[-1]) for s, v in same.items() if s != slot[i] and v[-1] < i])) + 1
        elif kind == "forward":
            pv[i] = min(m, i + 2)
        elif kind == "zero":
            pv[i] = 0
        elif kind == "negative":
            pv[i] = -3

    kinds = ["skip", "shared", "swap", "other_slot", "forward", "zero", "negative"]
    trials = [[]] + [[k] for k in kinds for _ in range(6)] + [rng.choice(kinds, 2).tolist() for _ in range(20)]
    for trial, chosen in enumerate(trials):  # every kind alone, then pairs
        e = np.zeros(m, dtype=ENTRY_DTYPE)
        e["key_hash"], e["prev_index"] = kh, prev
        for kind in chosen:
            corrupt(kind, e)
        count, first = _chains_reference(kh, e["prev_index"].astype(np.int64), slots)
        assert (index_checks.proven_chains(e, slots, chunk) is not None) == (count == 0), trial
        out = Capped()
        index_checks.check_chains(e, g, "index/x", out, chunk=chunk)
        found = [f for f in out.done() if f.kind == "index_chain_broken"]
        assert (found[0].extra["count"], found[0].offset) == (count, g.entry_pos(first) + 16) if count else not found


def _validation_reference(idx) -> list[tuple[str, int]]:
    """The per-entry structure checks over the whole file at once (the one-pass formulation the chunked
    validation replaced): (kind, offset) of each finding, in the validation's order."""
    g, ic = idx.geometry, idx.index_count
    ent = idx.entries_array()
    m = len(ent)
    n = np.arange(1, m + 1, dtype=np.int32)
    kh = ent["key_hash"].astype(np.int32)
    prev = ent["prev_index"].astype(np.int32)
    slots = idx.slots().astype(np.int32)
    out = []
    neg = np.flatnonzero(kh < 0)
    if len(neg):
        out.append(("negative_key_hash", g.entry_pos(int(neg[0]) + 1)))
    eslot = np.where(kh >= 0, kh % g.hash_slot_num, -1)
    bad = np.flatnonzero((slots < 0) | (slots > ic))
    if len(bad):
        out.append(("slot_out_of_range", g.slot_pos(int(bad[0]))))
    expect = np.zeros(g.hash_slot_num, dtype=np.int32)
    okh = eslot >= 0
    np.maximum.at(expect, eslot[okh], n[okh])
    wrong = np.flatnonzero((slots >= 0) & (slots <= ic) & (slots != expect))
    if len(wrong):
        out.append(("slot_not_newest_entry", g.slot_pos(int(wrong[0]))))
    badp = np.flatnonzero((prev < 0) | (prev >= n))
    if len(badp):
        out.append(("prev_index_not_older", g.entry_pos(int(badp[0]) + 1) + 16))
    okp = (prev > 0) & (prev < n)
    cross = np.flatnonzero(okp & (eslot != eslot[np.clip(prev - 1, 0, max(m - 1, 0))]))
    if len(cross):
        out.append(("prev_index_wrong_slot", g.entry_pos(int(cross[0]) + 1) + 16))
    return out


@pytest.mark.parametrize("chunk", [1, 5, 1 << 20])
def test_index_validation_in_chunks_finds_what_one_pass_finds(store, chunk):
    """Damage of every structural kind in one file: the chunked validation reports each with the same
    count and first entry whatever the chunk size."""
    from storelib.format.indexfile import IndexFile, IndexGeometry

    f = _index_files(store)[1]
    flip(f, ENTRIES + 20 * 2 + 0, 0x80)  # entry 2's keyHash negative
    flip(f, ENTRIES + 20 * 4 + 19, 0x03)  # entry 4's prevIndex: another entry (another slot, or newer)
    flip(f, ENTRIES + 20 * 6 + 18, 0x7F)  # entry 6's prevIndex: far past its own number
    flip(f, 40 + 4 * 9 + 3, 0x05)  # slot 9's value
    g = IndexGeometry(64, 200)
    with IndexFile.open(str(f), g, strict=False) as idx:
        got = [(x.kind, x.offset, x.detail) for x in idx.validate(chunk_entries=chunk)]
        one = [(x.kind, x.offset, x.detail) for x in idx.validate(chunk_entries=1 << 30)]
    assert got == one
    ref = _validation_reference_of(f, g)
    per_entry = {k for k, _ in ref}
    assert [(k, o) for k, o, _ in got if k in per_entry] == ref
    assert {"negative_key_hash", "prev_index_not_older"} <= per_entry


def _validation_reference_of(f: Path, g) -> list[tuple[str, int]]:
    from storelib.format.indexfile import IndexFile

    with IndexFile.open(str(f), g, strict=False) as idx:
        return _validation_reference(idx)


def test_validation_from_proven_chains_reports_what_the_entry_walk_reports(tmp_path):
    """The audit proves an index file's chains first and lets the proof settle validate's per-entry checks
    (one pass over the entries, not two). Whenever the proof holds, the findings are the full walk's: clean
    files, negative keyHashes in a chain of their own, a slot table off, header fields off; a broken chain
    is never taken as proven."""
    from storelib.format.indexfile import ENTRY_DTYPE, IndexFile, IndexGeometry, IndexHeader

    slots, m = 32, 900
    g = IndexGeometry(slots, 1000)
    rng = np.random.default_rng(21)

    def write(kh: np.ndarray, table_fix=None, header_fix=None, prev_fix=None) -> Path:
        prev, newest = _putkey_chains(kh, slots)
        ent = np.zeros(m, ENTRY_DTYPE)
        ent["key_hash"], ent["phy_offset"], ent["prev_index"] = kh, 1000 + 50 * np.arange(m), prev
        ent["time_diff"] = np.arange(m) // 10
        if prev_fix:
            prev_fix(ent)
        table = np.zeros(slots, np.int32)
        for s, n in newest.items():
            if s >= 0:
                table[s] = n
        if table_fix:
            table_fix(table)
        h = IndexHeader(1_000_000, 1_000_000 + 1000 * int(ent["time_diff"][-1]), 1000, int(ent["phy_offset"][-1]),
                        len([s for s in newest if s >= 0]), m + 1)
        if header_fix:
            h = header_fix(h)
        buf = bytearray(g.file_size)
        buf[:40] = h.to_bytes()
        buf[40:40 + 4 * slots] = table.astype(">i4").tobytes()
        buf[g.entry_pos(1):g.entry_pos(1) + 20 * m] = ent.tobytes()
        path = tmp_path / f"f{len(list(tmp_path.iterdir()))}"
        path.write_bytes(bytes(buf))
        return path

    kh = rng.integers(0, 1 << 31, m, dtype=np.int64)
    with_neg = kh.copy()
    with_neg[rng.choice(m, 12, replace=False)] *= -1
    cases = {
        "clean": write(kh),
        "negative hashes": write(with_neg),
        "slot table off": write(kh, table_fix=lambda t: t.__setitem__(5, t[5] - 1)),
        "slot out of range": write(kh, table_fix=lambda t: t.__setitem__(7, 5000)),
        "header off": write(with_neg, header_fix=lambda h: IndexHeader(h.begin_timestamp, h.end_timestamp + 5000,
                                                                       h.begin_phy_offset + 1, h.end_phy_offset,
                                                                       h.hash_slot_count + 1, h.index_count)),
        "chain broken": write(kh, prev_fix=lambda e: e["prev_index"].__setitem__(600, 0)),
    }
    for name, path in cases.items():
        with IndexFile.open(str(path), g, strict=False) as idx:
            ent = idx.entries_array()
            proven = index_checks.proven_chains(ent, slots, chunk=64)
            assert (proven is None) == (name == "chain broken"), name
            full = [(x.kind, x.offset, x.detail) for x in idx.validate(chunk_entries=100)]
            if proven is not None:
                assert [(x.kind, x.offset, x.detail) for x in idx.validate(proven=proven)] == full, name
            if name == "negative hashes":
                assert [k for k, _, _ in full] == ["negative_key_hash"] and proven.negatives == 12
            if name in ("slot table off", "slot out of range", "header off"):
                assert full, name
