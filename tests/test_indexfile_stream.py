"""Index files streamed from runs whose slot chains were computed separately (the Spark engine's split:
per-segment chains in phase A, one merge-and-write task per file) equal the one-shot build, byte for
byte; and the Spark engine's task functions, run in-process, equal the local engine."""

from __future__ import annotations

import gc
import hashlib
import io
import weakref
from pathlib import Path

import numpy as np
import pytest

import jobs.rebuild as rb
from jobs.engines.schedulers import LocalEngine
from storelib.broker.index.indexbuild import IndexState, build_index_files
from storelib.broker.index.indexmerge import link_file
from storelib.broker.index.indexstream import ChainRun, local_chains, stream_index_file
from storelib.format.indexfile import ENTRY_DTYPE, IndexGeometry, IndexHeader
from tests.rebuild_storegen import CraftedStore, msg

BEGIN = 1_700_000_000_000


def _keys(rng: np.random.Generator, k: int, *, phy0: int = 1000) -> dict[str, np.ndarray]:
    h = rng.integers(0, 2**31 - 1, k)
    h[rng.random(k) < 0.25] = 123_457  # one hot slot: long chains
    return {"key_hash": h, "phy_offset": phy0 + np.cumsum(rng.integers(1, 90, k)),
            "store_timestamp": BEGIN + np.cumsum(rng.integers(0, 900, k))}


def _runs(keys: dict[str, np.ndarray], cuts: list[int], slots: int) -> list[ChainRun]:
    b = [0, *cuts, len(keys["key_hash"])]
    return [ChainRun.of(keys["key_hash"][x:y], keys["phy_offset"][x:y], keys["store_timestamp"][x:y], slots)
            for x, y in zip(b, b[1:])]


def _stream(runs: list[ChainRun], g: IndexGeometry, prev: IndexState | None, chunk: int) -> tuple[bytes, IndexHeader, str]:
    out = io.BytesIO()
    header, digest = stream_index_file(runs, out, geometry=g, prev_state=prev, chunk_entries=chunk)
    return out.getvalue(), header, digest


@pytest.mark.parametrize("slots", [13, 5000, 1 << 20])  # every slot shared; some; nearly every key alone
def test_local_chains_link_each_key_to_the_previous_key_of_its_slot(slots):
    rng = np.random.default_rng(3)
    h = rng.integers(0, 2**31 - 1, 3000)
    h[::7] = 99
    prev, tail = local_chains(h, slots)
    last: dict[int, int] = {}
    want_prev = []
    for i, x in enumerate(h.tolist()):
        want_prev.append(last.get(x % slots, -1))
        last[x % slots] = i
    assert prev.tolist() == want_prev
    assert sorted(np.flatnonzero(tail).tolist()) == sorted(last.values())


@pytest.mark.parametrize("k", [1, 2, 17, 59])
@pytest.mark.parametrize("cuts", ["none", "half", "every3"])
@pytest.mark.parametrize("chunk", [1, 4, 1 << 19])
def test_new_file_streamed_from_runs_equals_the_one_shot_build(k, cuts, chunk):
    g = IndexGeometry(7, 60)
    keys = _keys(np.random.default_rng(k), k)
    cut = {"none": [], "half": [k // 2] if k > 1 else [], "every3": list(range(1, k, 3))}[cuts]
    im = build_index_files(keys, geometry=g, name_tz=None)[0]
    data, header, digest = _stream(_runs(keys, cut, g.hash_slot_num), g, None, chunk)
    assert data == im.to_bytes()
    assert header == im.header and digest == hashlib.sha256(data).hexdigest() == im.sha256()


def test_file_after_a_full_one_measures_entry_one_from_the_previous_end_time():
    g = IndexGeometry(5, 30)
    full = IndexState(IndexHeader(end_timestamp=BEGIN - 5_000, end_phy_offset=10, index_count=30),
                      np.zeros(0, np.int32), np.zeros(29, ENTRY_DTYPE))
    keys = _keys(np.random.default_rng(1), 29)
    im = build_index_files(keys, geometry=g, prev_state=full, name_tz=None)[0]
    data, header, _ = _stream(_runs(keys, [4, 20], 5), g, full, 3)
    assert data == im.to_bytes()
    assert np.frombuffer(data, ENTRY_DTYPE, 1, g.entry_pos(1))["time_diff"][0] == 5  # (begin - prev end) / 1000


@pytest.mark.parametrize("existing", [0, 1, 12])
def test_continued_file_streamed_from_runs_equals_the_one_shot_build(existing):
    """Entries already in the file are kept; a slot value beyond indexCount reads as empty (putKey)."""
    g = IndexGeometry(7, 60)
    rng = np.random.default_rng(existing)
    if existing:
        first = build_index_files(_keys(rng, existing), geometry=g, name_tz=None)[0]
        state = first.state()
    else:  # an empty file on disk (indexCount 1 after a flush)
        state = IndexState(IndexHeader(index_count=1), np.zeros(7, np.int32), np.zeros(0, ENTRY_DTYPE))
    keys = _keys(rng, 59 - existing, phy0=10**6)
    # stale / corrupt slot values: beyond indexCount at insert (empty), negative (empty), and exactly
    # indexCount at insert (kept: the broker links the entry to itself)
    s_first = int(keys["key_hash"][0] % 7)
    others = [s for s in range(7) if s != s_first]
    state.slots[[others[0], others[1], s_first]] = [existing + 40, -3, existing + 1]
    im = build_index_files(keys, geometry=g, prev_state=state, name_tz=None)[0]
    data, header, digest = _stream(_runs(keys, [3, 9, 30], 7), g, state, 5)
    assert data == im.to_bytes()
    assert header == im.header and digest == im.sha256()


def test_sparse_local_file_has_the_same_bytes_and_hash(tmp_path):
    g = IndexGeometry(11, 400)
    keys = _keys(np.random.default_rng(5), 150)
    path = tmp_path / "f"
    with open(path, "wb") as f:
        _, digest = stream_index_file(_runs(keys, [50], 11), f, geometry=g, sparse_tail=True, chunk_entries=16)
    data = path.read_bytes()
    assert data == build_index_files(keys, geometry=g, name_tz=None)[0].to_bytes()
    assert digest == hashlib.sha256(data).hexdigest()


def test_keys_that_do_not_fit_one_file_are_refused():
    g = IndexGeometry(7, 10)
    with pytest.raises(ValueError, match="do not fill one index file"):
        stream_index_file(_runs(_keys(np.random.default_rng(0), 10), [], 7), io.BytesIO(), geometry=g)


@pytest.mark.parametrize("chunk", [4, 1 << 19])
def test_files_linked_from_segments_loaded_one_at_a_time_equal_the_one_shot_build(chunk):
    """storelib.broker.index.indexmerge.link_file hands the stream a loader: each pass loads the file's segments one by
    one (whole ones with their phase-A chains, cut ones re-chained), so the index task holds one or two
    segments' keys, not the file's; the files are the one-shot build's, byte for byte."""
    g = IndexGeometry(7, 40)
    E = g.entries_per_file
    keys = _keys(np.random.default_rng(9), 3 * E - 5)
    bounds = [0, 10, 11, 50, 61, 90, 130, len(keys["key_hash"])]
    segs = {i: {k: v[a:b] for k, v in keys.items()} for i, (a, b) in enumerate(zip(bounds, bounds[1:]))}
    spans = {i: (a, b - a) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))}
    alive: list[weakref.ref] = []
    loads: list[int] = []

    def load(i: int):
        loads.append(i)
        s = segs[i]
        run = ChainRun.of(s["key_hash"], s["phy_offset"], s["store_timestamp"], g.hash_slot_num)
        alive.append(weakref.ref(run))
        assert sum(r() is not None for r in alive) <= 2  # the previous segment's run may still be bound while the next loads
        return (s["key_hash"], s["phy_offset"], s["store_timestamp"], np.arange(len(s["key_hash"]))), run

    want = build_index_files(keys, geometry=g, name_tz=None)
    assert len(want) == 3
    for f, im in enumerate(want):
        loads.clear()
        runs, state = link_file(f, g, spans, load)
        data, header, digest = _stream(runs, g, state, chunk)
        assert data == im.to_bytes() and header == im.header and digest == im.sha256()
        inside = [i for i, (o, c) in spans.items() if o < (f + 1) * E and o + c > f * E]
        assert loads == ([] if f == 0 else [next(i for i, (o, c) in spans.items() if o <= f * E - 1 < o + c)]) \
            + inside * 2  # the previous file's last key, then one load per segment per pass
        gc.collect()


# -- the engines' task functions, run in-process (LocalEngine: the pool and Spark run the same ones) --


def _index_bytes(root: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted((root / "index").iterdir())]


@pytest.mark.parametrize("index_num", [34, 401])
@pytest.mark.parametrize("corrupt", [False, True])
def test_engine_task_functions_roll_index_files_inside_and_across_segments_like_the_local_engine(
        tmp_path, corrupt, index_num):
    """~170 keys per 8 KiB segment: with 33 entries per file files start inside segments (chains of
    slices), with 400 a file holds whole segments (their precomputed chains) and parts of others; with
    PHYSICALOFFSET fields going backwards the duplicate test drops keys (chains recomputed)."""
    cs = CraftedStore(8192)
    for i in range(300):
        cs.append(msg("T", i % 3, uniq=f"U{i}", keys=f"k{i} k{i % 5}" if i % 4 else None, tags=None))
    if corrupt:
        for p in cs.placed[50:53]:
            cs.put_raw((p.phy - 3000).to_bytes(8, "big"), segment=p.segment, offset=p.file_offset + 28)
    cs.write(tmp_path / "store")
    conf = tmp_path / "broker.conf"
    conf.write_text(f"mappedFileSizeCommitLog=8192\nmaxHashSlotNum=16\nmaxIndexNum={index_num}\n")

    def run(out: str, engine: str) -> dict:
        return rb.rebuild(rb.RebuildConfig(store=str(tmp_path / "store"), out=str(tmp_path / out),
                                           broker_conf=str(conf), broker_version="4", engine=engine,
                                           progress=False), engine=LocalEngine() if engine == "tasks" else None)

    a, b = run("local", "local"), run("tasks", "tasks")
    assert len(cs.placed) and len({p.segment for p in cs.placed}) >= 4
    assert a["files"] == b["files"] and a["counts"]["index_files"] >= (4 if index_num < 100 else 2)
    assert _index_bytes(tmp_path / "local") == _index_bytes(tmp_path / "tasks")
