"""IndexFile: test vectors (TV-1, TV-4 names, TV-5, TV-9), vectorised builder vs the scalar putKey oracle,
the real 4.9.8 / 5.3.3 sample stores byte for byte, queries, validity findings and error paths."""

from __future__ import annotations

import json
import os
import struct
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storelib.broker.index.indexbuild import IndexState, build_index_files, index_key_rows, index_keys
from storelib.errors import StoreError
from storelib.fileio.bytesource import Location, open_source
from storelib.format.indexdir import index_file_name, list_index_files, parse_index_file_name, query_index
from storelib.format.indexfile import ENTRY_DTYPE, IndexFile, IndexGeometry, IndexHeader
from storelib.format.javahash import index_hash, java_string_hash
from tests.conftest import SAMPLES
from tests.index_oracle import IndexFileWriter, ScalarIndexService

T0 = 1_700_000_000_123


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def batch_of(records: list[dict]) -> pa.Table:
    """A scan-like table with the columns index_keys uses."""
    return pa.table({
        "topic": pa.array([r["topic"] for r in records], pa.string()),
        "uniq_key": pa.array([r.get("uniq_key") for r in records], pa.string()),
        "keys": pa.array([r.get("keys") for r in records], pa.string()),
        "tran_type": pa.array([r.get("tran_type", 0) for r in records], pa.int8()),
        "physical_offset_field": pa.array([r.get("phy", 0) for r in records], pa.int64()),
        "store_timestamp": pa.array([r.get("ts", T0) for r in records], pa.int64()),
    })


def scalar_keys(records: list[dict]) -> tuple[list[int], list[int]]:
    """The §6.1 key enumeration, one record at a time (oracle for index_keys)."""
    rows, hashes = [], []
    for i, r in enumerate(records):
        if r.get("tran_type", 0) == 3:
            continue
        keys = []
        if r.get("uniq_key") is not None:
            keys.append(r["uniq_key"])
        if r.get("keys"):
            keys += [k for k in r["keys"].split(" ") if k]
        for k in keys:
            rows.append(i)
            hashes.append(index_hash(f"{r['topic']}#{k}"))
    return rows, hashes


def write_file(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def tv9_expected() -> tuple[bytes, bytes]:
    """Files A and B of TV-9 assembled by hand from the documented field values."""
    def image(header, slots, entries):
        b = bytearray(136)
        b[0:40] = struct.pack(">qqqqii", *header)
        b[40:56] = struct.pack(">4i", *slots)
        for n, e in entries.items():
            struct.pack_into(">iqii", b, 56 + 20 * n, *e)
        return bytes(b)

    a = image((1_700_000_000_123, 1_700_000_002_623, 0, 190, 2, 4), (0, 3, 0, 1),
              {1: (2_538_763, 0, 0, 0), 2: (2_538_453, 0, 0, 0), 3: (2_538_453, 190, 2, 2)})
    b = image((1_700_000_005_000, 1_700_000_005_000, 380, 380, 1, 2), (0, 0, 1, 0),
              {1: (2_538_454, 380, 2, 0)})
    return a, b


TV9_PUTS = [("T#U1", 0, 1_700_000_000_123), ("T#K1", 0, 1_700_000_000_123),
            ("T#K1", 190, 1_700_000_002_623), ("T#K2", 380, 1_700_000_005_000)]


# ---------------------------------------------------------------------------------------------
# TV-1 hashes and key extraction
# ---------------------------------------------------------------------------------------------

TV1 = [
    ("TopicTest#KEY1", -1_656_969_516, 1_656_969_516, 1_969_516, 7_878_104),
    ("TopicTest#KEY2", -1_656_969_515, 1_656_969_515, 1_969_515, 7_878_100),
    ("TopicTest#ORDER_20240101_0001", -1_601_127_221, 1_601_127_221, 1_127_221, 4_508_924),
    ("TopicTest#7F00000100002A9F0000000000000001", 1_471_913_327, 1_471_913_327, 1_913_327, 7_653_348),
    ("SCHEDULE_TOPIC_XXXX#KEY1", -158_426_723, 158_426_723, 3_426_723, 13_706_932),
    ("polygenelubricants", -2_147_483_648, 0, 0, 40),
    ("TopicTest#主键", 3_401_685, 3_401_685, 3_401_685, 13_606_780),
    ("TopicTest#\U0001F600", 4_515_557, 4_515_557, 4_515_557, 18_062_268),
]


@pytest.mark.parametrize("key,hc,ih,slot,pos", TV1)
def test_tv1_index_hash_slot_and_slot_position(key, hc, ih, slot, pos):
    g = IndexGeometry()
    assert java_string_hash(key) == hc
    assert index_hash(key) == ih
    assert ih % g.hash_slot_num == slot
    assert g.slot_pos(slot) == pos


def test_tv1_vectorised_index_keys_match_documented_hashes():
    recs = [
        {"topic": "TopicTest", "uniq_key": "7F00000100002A9F0000000000000001",
         "keys": "KEY1 KEY2 ORDER_20240101_0001 主键 \U0001F600"},
        {"topic": "SCHEDULE_TOPIC_XXXX", "keys": "KEY1"},
    ]
    rows, kh = index_keys(batch_of(recs))
    order = [3, 0, 1, 2, 6, 7, 4]  # uniq key first, then KEYS tokens in order, then the next record
    assert rows.tolist() == [0, 0, 0, 0, 0, 0, 1]
    assert kh.dtype == np.int32
    assert kh.tolist() == [TV1[i][2] for i in order]


def test_index_keys_rules_uniq_first_split_on_single_space_rollback_skipped():
    recs = [
        {"topic": "T", "uniq_key": "U0", "keys": " a  b a\tc "},  # empties dropped, dup kept, tab kept
        {"topic": "T", "uniq_key": "U1", "keys": "x", "tran_type": 3},  # ROLLBACK: nothing
        {"topic": "T", "keys": None},  # nothing
        {"topic": "T2", "keys": ""},  # nothing
        {"topic": "T2", "keys": "y", "tran_type": 1},  # PREPARED: indexed
        {"topic": "T3", "uniq_key": "U5", "tran_type": 2},  # COMMIT: uniq only
    ]
    rows, kh = index_keys(batch_of(recs))
    srows, shash = scalar_keys(recs)
    assert rows.tolist() == srows == [0, 0, 0, 0, 4, 5]
    assert kh.tolist() == shash
    assert kh[0] == index_hash("T#U0") and kh[3] == index_hash("T#a\tc")


def test_index_keys_random_batches_equal_scalar_enumeration():
    rng = np.random.default_rng(7)
    alphabet = ["a", "B", " ", "  ", "é", "主", "\U0001F600", "\t", "K1", "polygenelubricants"]
    recs = []
    for _ in range(500):
        keys = None if rng.random() < 0.2 else "".join(rng.choice(alphabet, rng.integers(0, 6)))
        uniq = None if rng.random() < 0.3 else "".join(rng.choice(alphabet[4:], rng.integers(0, 4)))
        recs.append({"topic": str(rng.choice(["TopicTest", "主题", "T"])), "keys": keys,
                     "uniq_key": uniq, "tran_type": int(rng.integers(0, 4))})
    rows, kh = index_keys(batch_of(recs))
    srows, shash = scalar_keys(recs)
    assert rows.tolist() == srows
    assert kh.tolist() == shash


def test_index_key_rows_carries_physical_offset_field_and_store_time():
    recs = [{"topic": "T", "uniq_key": "U", "keys": "a b", "phy": 500, "ts": 9},
            {"topic": "T", "keys": "c", "phy": 700, "ts": 11}]
    kr = index_key_rows(batch_of(recs))
    assert kr["row_index"].tolist() == [0, 0, 0, 1]
    assert kr["phy_offset"].tolist() == [500, 500, 500, 700]
    assert kr["store_timestamp"].tolist() == [9, 9, 9, 11]


# ---------------------------------------------------------------------------------------------
# TV-4 names
# ---------------------------------------------------------------------------------------------


def test_tv4_index_file_names_in_utc_and_shanghai():
    assert index_file_name(1_700_000_000_000) == "20231114221320000"
    assert index_file_name(1_700_000_000_000, "Asia/Shanghai") == "20231115061320000"
    assert index_file_name(1_704_067_200_123) == "20240101000000123"
    assert index_file_name(1_704_067_200_123, "Asia/Shanghai") == "20240101080000123"
    assert parse_index_file_name("20240101080000123", "Asia/Shanghai") == 1_704_067_200_123


def test_index_file_name_bumps_to_stay_strictly_increasing():
    first = index_file_name(1_704_067_200_123)
    assert index_file_name(1_704_067_200_000, after=first) == "20240101000000124"
    assert index_file_name(1_704_067_200_999, after=first) == "20240101000000999"
    assert index_file_name(1_704_067_199_000, after="20231231235959999") == "20240101000000000"


def test_index_file_name_of_corrupt_store_times_stays_17_digits_and_increasing():
    assert index_file_name(-5) == "19700101000000000"
    top = index_file_name(2**62)
    assert len(top) == 17 and top.startswith("9999")
    nxt = index_file_name(2**62, after=top)
    assert len(nxt) == 17 and nxt > top


# ---------------------------------------------------------------------------------------------
# TV-5 and TV-9
# ---------------------------------------------------------------------------------------------


def test_tv5_entries_of_the_first_message_with_default_geometry(tmp_path):
    g = IndexGeometry()
    rec = {"topic": "TopicTest", "uniq_key": "7F00000100002A9F0000000000000001", "keys": "KEY1 KEY2",
           "phy": 0, "ts": T0}
    [img] = build_index_files(index_key_rows(batch_of([rec])), geometry=g)
    assert img.header == IndexHeader(T0, T0, 0, 0, 3, 4)
    path = tmp_path / img.name
    img.write(path)
    assert path.stat().st_size == 420_000_040
    raw = open(path, "rb").read(g.entry_pos(4))
    assert g.entry_pos(1) == 20_000_060
    assert raw[20_000_060:20_000_080] == bytes.fromhex("57BB9D6F") + bytes(16)
    assert raw[20_000_080:20_000_084] == bytes.fromhex("62C3592C")
    assert raw[20_000_100:20_000_104] == bytes.fromhex("62C3592B")
    with IndexFile.open(path, g) as f:
        assert f.slots()[[1_913_327, 1_969_516, 1_969_515]].tolist() == [1, 2, 3]
        assert f.query("TopicTest", "KEY2") == [0]
        assert f.validate(check_tail=False) == []


def test_tv9_scalar_writer_produces_documented_bytes():
    svc = ScalarIndexService(IndexGeometry(4, 4))
    for key, phy, t in TV9_PUTS:
        svc.put_key(key, phy, t)
    assert [index_hash(k) for k in ("T#U1", "T#K1", "T#K2")] == [2_538_763, 2_538_453, 2_538_454]
    a, b = tv9_expected()
    assert [w.to_bytes() for w in svc.files] == [a, b]
    # a put into the full file returns false
    assert svc.files[0].put_key("T#K2", 380, 1_700_000_005_000) is False


def test_tv9_vectorised_builder_produces_documented_bytes_including_rolled_time_diff():
    rows = {"key_hash": [index_hash(k) for k, _, _ in TV9_PUTS],
            "phy_offset": [p for _, p, _ in TV9_PUTS], "store_timestamp": [t for _, _, t in TV9_PUTS]}
    imgs = build_index_files(rows, geometry=IndexGeometry(4, 4))
    a, b = tv9_expected()
    assert [im.to_bytes() for im in imgs] == [a, b]
    assert imgs[1].entries["time_diff"].tolist() == [2]  # measured from A's end time
    assert [im.name for im in imgs] == ["20231114221320123", "20231114221325000"]


def test_tv9_query_on_file_a_returns_newest_first(tmp_path):
    a, _ = tv9_expected()
    with IndexFile.open(write_file(tmp_path, "20231114221320123", a), IndexGeometry(4, 4)) as f:
        assert f.query("T", "K1") == [190, 0]
        assert f.chain(1).tolist() == [3, 2]
        assert f.query("T", "K1", max_num=1) == [190]
        assert f.validate() == []


def test_tv9_fresh_file_has_zero_header_and_flush_writes_index_count_one():
    w = IndexFileWriter(IndexGeometry(4, 4))
    assert w.to_bytes()[:40] == bytes(40)
    w.flush()
    assert w.to_bytes()[36:40] == b"\x00\x00\x00\x01"


# ---------------------------------------------------------------------------------------------
# vectorised == scalar
# ---------------------------------------------------------------------------------------------


def run_scalar(records, geometry, prev: IndexState | None = None):
    """Dispatch records through the scalar service; returns the writers (continued file first)."""
    files = [IndexFileWriter.from_state(geometry, prev)] if prev is not None else []
    svc = ScalarIndexService(geometry, files)
    for hashes, phy, ts in records:
        svc.build_index_hashes(hashes, phy, ts)
    return svc.files


def key_rows_of(records):
    h, p, t = [], [], []
    for hashes, phy, ts in records:
        h += list(hashes)
        p += [phy] * len(hashes)
        t += [ts] * len(hashes)
    return {"key_hash": np.array(h, np.int64), "phy_offset": np.array(p, np.int64),
            "store_timestamp": np.array(t, np.int64)}


def trailing(records) -> bool:
    last = max((i for i, r in enumerate(records) if r[0]), default=-1)
    return last < len(records) - 1


record_st = st.tuples(
    st.lists(st.sampled_from([0, 1, 2, 3, 5, 8, 13, 2_147_483_647, 1_000_003]), max_size=4),
    st.integers(-3, 3000),
    st.one_of(st.integers(-2000, 10**7), st.integers(0, 2**62)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(record_st, max_size=30), slots=st.integers(1, 5), num=st.integers(2, 6),
       monotonic=st.booleans())
def test_vectorised_builder_equals_scalar_put_key(records, slots, num, monotonic):
    if monotonic:  # the common case: offsets increasing, several keys per record, rolling
        records = [(h, 100 * i, T0 + 700 * i) for i, (h, _, _) in enumerate(records)]
    g = IndexGeometry(slots, num)
    oracle = run_scalar(records, g)
    imgs = build_index_files(key_rows_of(records), geometry=g, emit_empty=bool(records),
                             trailing_dispatch=trailing(records))
    assert [im.to_bytes() for im in imgs] == [w.to_bytes() for w in oracle]


@settings(max_examples=200, deadline=None)
@given(records=st.lists(record_st, min_size=1, max_size=30), cut=st.integers(0, 30),
       slots=st.integers(1, 4), num=st.integers(2, 5))
def test_incremental_build_continues_last_file_like_one_shot(records, cut, slots, num):
    g = IndexGeometry(slots, num)
    first, rest = records[:cut], records[cut:]
    part1 = build_index_files(key_rows_of(first), geometry=g, trailing_dispatch=trailing(first))
    if not part1:
        return
    state = part1[-1].state()
    part2 = build_index_files(key_rows_of(rest), geometry=g, prev_state=state,
                              trailing_dispatch=trailing(rest))
    oracle = run_scalar(records, g)
    combined = [im.to_bytes() for im in part1]
    if part2 and part2[0].name == state.name:
        combined[-1] = part2[0].to_bytes()
        part2 = part2[1:]
    combined += [im.to_bytes() for im in part2]
    assert combined == [w.to_bytes() for w in oracle]
    # the scalar writer continuing the same state agrees too
    cont = run_scalar(rest, g, prev=state)
    assert [w.to_bytes() for w in cont][len(cont) - len(part2):] == [im.to_bytes() for im in part2]


def test_incremental_build_from_disk_skips_already_indexed_offsets(tmp_path):
    g = IndexGeometry(3, 6)
    h = [index_hash(f"T#k{i}") for i in range(4)]
    [img] = build_index_files({"key_hash": h[:3], "phy_offset": [0, 100, 200],
                               "store_timestamp": [T0, T0 + 1000, T0 + 2000]}, geometry=g)
    img.write(tmp_path / img.name)
    with IndexFile.open(tmp_path / img.name, g) as f:
        # re-dispatching 100 (< endPhyOffset 200) is skipped; 200 (== endPhyOffset) is indexed again
        imgs = build_index_files({"key_hash": h[1:], "phy_offset": [100, 200, 300],
                                  "store_timestamp": [T0 + 1000, T0 + 2000, T0 + 3000]},
                                 geometry=g, prev_state=f)
        oracle = run_scalar([([h[1]], 100, T0 + 1000), ([h[2]], 200, T0 + 2000), ([h[3]], 300, T0 + 3000)],
                            g, prev=IndexState.from_file(f))
    assert [im.name for im in imgs] == [img.name]  # the continued file keeps its name
    assert imgs[0].entries["phy_offset"].tolist() == [0, 100, 200, 200, 300]
    assert [im.to_bytes() for im in imgs] == [w.to_bytes() for w in oracle]
    # the file is now exactly full: one more dispatched record creates the empty successor
    with IndexFile.open(tmp_path / img.name, g) as f:
        more = build_index_files({"key_hash": h[1:], "phy_offset": [100, 200, 300],
                                  "store_timestamp": [T0 + 1000, T0 + 2000, T0 + 3000]},
                                 geometry=g, prev_state=f, trailing_dispatch=True)
    assert [im.name for im in more] == [img.name, index_file_name(T0 + 3000, after=img.name)]
    assert more[1].header == IndexHeader(T0 + 3000, T0 + 3000, 300, 300, 0, 0)


def test_rolling_over_many_files_with_collisions_matches_scalar():
    rng = np.random.default_rng(3)
    g = IndexGeometry(7, 9)
    recs = [(rng.choice([0, 7, 14, 3, 1_000_000_007], rng.integers(0, 4)).tolist(), 50 * i,
             T0 + int(rng.integers(-3000, 3000)) + 400 * i) for i in range(200)]
    imgs = build_index_files(key_rows_of(recs), geometry=g, trailing_dispatch=trailing(recs))
    oracle = run_scalar(recs, g)
    assert len(imgs) > 20
    assert [im.to_bytes() for im in imgs] == [w.to_bytes() for w in oracle]
    names = [im.name for im in imgs]
    assert names == sorted(set(names))


def test_empty_builds_follow_the_broker():
    g = IndexGeometry(4, 4)
    none = {"key_hash": [], "phy_offset": [], "store_timestamp": []}
    [img] = build_index_files(none, geometry=g)
    assert img.to_bytes() == bytes(g.file_size)
    [img5] = build_index_files(none, geometry=g, empty_index_count=1)  # 5.x flushed at shutdown
    assert img5.to_bytes()[36:40] == b"\x00\x00\x00\x01"
    assert build_index_files(none, geometry=g, emit_empty=False) == []
    # exactly full last file + a later dispatch: the empty successor starts at the previous end values
    rows = {"key_hash": [1, 2, 3], "phy_offset": [0, 10, 20], "store_timestamp": [T0, T0, T0 + 5]}
    assert len(build_index_files(rows, geometry=g)) == 1
    full, succ = build_index_files(rows, geometry=g, trailing_dispatch=True)
    assert succ.header == IndexHeader(T0 + 5, T0 + 5, 20, 20, 0, 0)


# ---------------------------------------------------------------------------------------------
# the real sample stores
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["rocketmq-4.9.8-small", "rocketmq-5.3.3-small"])
def sample(request, tmp_path_factory):
    name = request.param
    dest = tmp_path_factory.mktemp(name)
    with tarfile.open(SAMPLES / f"{name}.tar.gz") as tf:
        members = [m for m in tf.getmembers()
                   if m.name.startswith(f"{name}/store/index") or m.name.startswith(f"{name}/expected/")
                   and m.name.endswith(("messages.jsonl", "index_queries.jsonl"))]
        tf.extractall(dest, members=members, filter="data")
    root = dest / name
    msgs = [json.loads(line) for line in open(root / "expected/messages.jsonl")]
    msgs = [m for m in msgs if m["type"] == "msg"]
    table = pa.table({
        "topic": [m["topic"] for m in msgs],
        "uniq_key": pa.array([m.get("uniqKey") for m in msgs], pa.string()),
        "keys": pa.array([m.get("keys") for m in msgs], pa.string()),
        "tran_type": pa.array([m["tranType"] for m in msgs], pa.int8()),
        "physical_offset_field": pa.array([m["physicalOffsetField"] for m in msgs], pa.int64()),
        "store_timestamp": pa.array([m["storeTimestamp"] for m in msgs], pa.int64()),
    })
    queries = [json.loads(line) for line in open(root / "expected/index_queries.jsonl")]
    return {"name": name, "root": root, "table": table, "msgs": msgs, "queries": queries,
            "geometry": IndexGeometry(200, 800)}


def test_sample_rebuild_is_byte_identical_pairing_files_by_order(sample):
    refs = list_index_files(sample["root"] / "store")
    imgs = build_index_files(index_key_rows(sample["table"]), geometry=sample["geometry"])
    assert len(refs) == len(imgs) == 6
    for ref, img in zip(refs, imgs, strict=True):
        assert img.to_bytes() == (sample["root"] / "store/index" / ref.name).read_bytes(), ref.name


def test_sample_rebuild_with_scalar_service_is_byte_identical(sample):
    svc = ScalarIndexService(sample["geometry"])
    t = sample["table"].to_pylist()
    for r in t:
        svc.build_index(r["topic"], r["uniq_key"], r["keys"], r["tran_type"],
                        r["physical_offset_field"], r["store_timestamp"])
    refs = list_index_files(sample["root"] / "store")
    assert [w.to_bytes() for w in svc.files] == [
        (sample["root"] / "store/index" / r.name).read_bytes() for r in refs]


def test_sample_last_index_file_header_is_current_and_all_files_valid(sample):
    # The 4.9.8 broker never flushes the current index file at shutdown, yet its header on disk is
    # current: IndexHeader writes every field into the mapped buffer at each put, and the kernel
    # writes dirty mapped pages back after a clean exit. Only an *empty* current file differs
    # (indexCount 0 unflushed vs 1 flushed), and neither sample ends with one.
    files = [r.open(sample["geometry"]) for r in list_index_files(sample["root"] / "store")]
    try:
        for f in files:
            assert f.validate() == [], f.name
        last = files[-1]
        assert 1 < last.header.index_count < 800
        assert last.header.end_phy_offset == int(last.entries_array()["phy_offset"][-1])
        assert last.header.end_phy_offset == max(m["physicalOffsetField"] for m in sample["msgs"]
                                                  if m.get("keys") or m.get("uniqKey"))
    finally:
        for f in files:
            f.close()


def test_sample_index_queries_answered_exactly_in_broker_order(sample):
    files = [r.open(sample["geometry"]) for r in list_index_files(sample["root"] / "store")]
    try:
        for q in sample["queries"]:
            assert java_string_hash(q["indexKey"]) == q["javaHashCode"]
            assert query_index(files, q["topic"], q["key"]) == q["phyOffsets"], q["indexKey"]
    finally:
        for f in files:
            f.close()


def test_sample_queries_through_ranged_reads_and_confirm_filter(sample):
    # Location(local=False) forces the ArrowFileSource path used for S3/HDFS
    fs = pafs.LocalFileSystem()
    root = Location(fs, str(sample["root"] / "store"), False)
    refs = list_index_files(root)
    files = [r.open(sample["geometry"]) for r in refs]
    by_phy = {m["physicalOffsetField"]: m for m in sample["msgs"]}
    multi = [q for q in sample["queries"] if len(q["phyOffsets"]) > 1] + sample["queries"][:50]
    for q in multi:
        def confirm(phy: int, q=q) -> bool:
            m = by_phy[phy]
            return q["key"] == m.get("uniqKey") or q["key"] in (m.get("keys") or "").split(" ")
        want = [p for p in q["phyOffsets"] if confirm(p)]
        assert query_index(files, q["topic"], q["key"], confirm=confirm) == want
        assert query_index(files, q["topic"], q["key"], max_num=1) == q["phyOffsets"][:1]
    for f in files:
        f.close()


def test_query_time_range_uses_second_precision_time_diff(sample):
    files = [r.open(sample["geometry"]) for r in list_index_files(sample["root"] / "store")]
    q = next(q for q in sample["queries"] if len(q["phyOffsets"]) == 1)
    ts = next(m["storeTimestamp"] for m in sample["msgs"] if m["physicalOffsetField"] == q["phyOffsets"][0])
    assert query_index(files, q["topic"], q["key"], ts - 5000, ts + 5000) == q["phyOffsets"]
    assert query_index(files, q["topic"], q["key"], ts + 10_000, 2**63 - 1) == []
    for f in files:
        f.close()


# ---------------------------------------------------------------------------------------------
# geometry, listing, errors and findings
# ---------------------------------------------------------------------------------------------


def test_geometry_file_size_and_inference():
    assert IndexGeometry().file_size == 420_000_040
    assert IndexGeometry(200, 800).file_size == 16_840
    assert IndexGeometry.infer(16_840, hash_slot_num=200) == IndexGeometry(200, 800)
    assert IndexGeometry.infer(16_840, index_num=800) == IndexGeometry(200, 800)
    assert IndexGeometry.infer(420_000_040) == IndexGeometry()
    with pytest.raises(StoreError) as e:
        IndexGeometry.infer(16_842, hash_slot_num=200, file="index/x")
    assert e.value.file == "index/x" and e.value.kind == "bad_size"


def test_short_file_is_a_store_error_naming_file_and_offset(tmp_path):
    a, _ = tv9_expected()
    p = write_file(tmp_path, "20231114221320123", a[:100])
    with pytest.raises(StoreError) as e:
        IndexFile.open(p, IndexGeometry(4, 4))
    assert e.value.file == str(p) and e.value.offset == 100 and e.value.kind == "truncated"
    p2 = write_file(tmp_path, "20231114221320124", a[:30])
    with pytest.raises(StoreError) as e:
        IndexFile.open(p2, IndexGeometry(4, 4))
    assert e.value.kind == "truncated" and e.value.offset == 30


def test_corrupt_header_raises_in_strict_mode_and_is_a_finding_otherwise(tmp_path):
    a, _ = tv9_expected()
    bad = bytearray(a)
    struct.pack_into(">i", bad, 36, 999_999)
    p = write_file(tmp_path, "20231114221320123", bytes(bad))
    g = IndexGeometry(4, 4)
    with pytest.raises(StoreError) as e:
        IndexFile.open(p, g)
    assert e.value.kind == "bad_header" and e.value.offset == 36 and str(p) in str(e.value)
    with IndexFile.open(p, g, strict=False) as f:
        assert f.entries_array().shape == (3,)  # bounded by the geometry, not by indexCount
        kinds = {x.kind for x in f.validate()}
    assert "index_count_beyond_geometry" in kinds


def test_validate_reports_slot_chain_count_and_header_damage(tmp_path):
    a, _ = tv9_expected()
    g = IndexGeometry(4, 4)
    bad = bytearray(a)
    struct.pack_into(">i", bad, 40 + 4 * 0, 7)  # slot 0 out of range
    struct.pack_into(">i", bad, g.entry_pos(2) + 16, 3)  # entry 2 points forward (cycle 3 -> 2 -> 3)
    struct.pack_into(">i", bad, 32, 3)  # hashSlotCount 3, the entries use 2 slots
    struct.pack_into(">q", bad, 24, 191)  # endPhyOffset wrong
    struct.pack_into(">q", bad, 8, 1_700_000_009_999)  # endTimestamp disagrees with timeDiff 2
    struct.pack_into(">i", bad, g.entry_pos(3) + 16, 3)  # entry 3 points to itself
    p = write_file(tmp_path, "20231114221320123", bytes(bad))
    with IndexFile.open(p, g, strict=False) as f:
        found = {x.kind: x for x in f.validate()}
        assert f.query("T", "K1") == [190]  # prev == current stops the walk
        assert f.chain(1).tolist() == [3]
    assert set(found) >= {"slot_out_of_range", "prev_index_not_older", "hash_slot_count_mismatch",
                          "end_phy_offset_mismatch", "end_timestamp_mismatch"}
    assert found["slot_out_of_range"].offset == 40
    assert found["prev_index_not_older"].offset == g.entry_pos(2) + 16
    assert all(x.file == str(p) for x in found.values())


def test_cyclic_chain_walk_is_bounded(tmp_path):
    a, _ = tv9_expected()
    g = IndexGeometry(4, 4)
    bad = bytearray(a)
    struct.pack_into(">i", bad, g.entry_pos(2) + 16, 3)  # 3 -> 2 -> 3 -> ...
    p = write_file(tmp_path, "20231114221320123", bytes(bad))
    with IndexFile.open(p, g, strict=False) as f:
        assert len(f.chain(1)) == f.index_count
        assert len(f.query("T", "K1")) <= f.index_count


def test_validate_reports_stale_entries_beyond_index_count(tmp_path):
    a, _ = tv9_expected()
    bad = bytearray(a)
    struct.pack_into(">ii", bad, 32, 1, 3)  # header claims 2 entries; entry 3 is still there
    p = write_file(tmp_path, "20231114221320123", bytes(bad))
    with IndexFile.open(p, IndexGeometry(4, 4), strict=False) as f:
        kinds = [x.kind for x in f.validate()]
    assert "data_beyond_index_count" in kinds


def test_list_index_files_sorts_names_and_reports_foreign_files(tmp_path):
    d = tmp_path / "index"
    d.mkdir()
    for n in ["20240101000000123", "20231114221320000", "notes.txt", "2024010100000012"]:
        (d / n).write_bytes(b"")
    (d / "20240101000000999").mkdir()
    findings = []
    refs = list_index_files(tmp_path, findings)
    assert [r.name for r in refs] == ["20231114221320000", "20240101000000123"]
    assert sorted(f.file for f in findings) == ["index/2024010100000012", "index/20240101000000999",
                                                "index/notes.txt"]
    assert list_index_files(tmp_path / "nowhere") == []


def test_written_image_round_trips_through_reader(tmp_path):
    g = IndexGeometry(5, 10)
    rows = {"key_hash": [1, 6, 2, 11, 1], "phy_offset": [0, 0, 90, 90, 180],
            "store_timestamp": [T0, T0, T0 + 1500, T0 + 1500, T0 + 4100]}
    [img] = build_index_files(rows, geometry=g)
    img.write(tmp_path / img.name)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]
    src = open_source(Location(pafs.LocalFileSystem(), str(tmp_path / img.name), True))
    with IndexFile(src, hash_slot_num=5) as f:
        assert f.geometry == g
        assert f.header == img.header
        assert np.array_equal(f.entries_array(), img.entries.astype(ENTRY_DTYPE))
        assert f.chain(1).tolist() == [5, 4, 2, 1]
        assert f.query_hash(1) == [180, 0]
        assert f.validate() == []


def test_continuing_a_file_with_garbage_slot_values_treats_them_as_empty_like_put_key():
    g = IndexGeometry(4, 8)
    [img] = build_index_files({"key_hash": [3], "phy_offset": [10], "store_timestamp": [T0]}, geometry=g)
    state = img.state()
    # slot 0 = 6 and slot 1 = 5 exceed indexCount 2, slot 2 is negative: empty while > cnt at insert
    state.slots[:] = [6, 5, -1, 1]
    recs = [([1, 2], 20, T0 + 10), ([1, 5], 30, T0 + 2000), ([3], 40, T0 + 4000), ([4], 50, T0 + 9000)]
    imgs = build_index_files(key_rows_of(recs), geometry=g, prev_state=state)
    oracle = run_scalar(recs, g, prev=state)
    assert [im.to_bytes() for im in imgs] == [w.to_bytes() for w in oracle]
    # entry 7 lands in slot 0 whose stale value 6 is now <= cnt: the broker links to it
    assert imgs[0].entries["prev_index"].tolist() == [0, 0, 0, 2, 4, 1, 6]
    assert imgs[0].header.hash_slot_count == 3


def test_wide_slot_table_uses_two_pass_sort_and_still_matches_scalar():
    rng = np.random.default_rng(11)
    g = IndexGeometry(100_003, 40)  # slots beyond 16 bits
    pool = rng.integers(0, 2**31 - 1, 25).tolist() + [0, 100_003, 200_006, 65_536, 65_537 + 100_003]
    recs = [(rng.choice(pool, rng.integers(0, 3)).tolist(), 10 * i, T0 + 300 * i) for i in range(120)]
    imgs = build_index_files(key_rows_of(recs), geometry=g, trailing_dispatch=trailing(recs))
    oracle = run_scalar(recs, g)
    assert len(imgs) >= 3
    assert [im.to_bytes() for im in imgs] == [w.to_bytes() for w in oracle]


@pytest.mark.parametrize("n_keys", [0, 3, 10, 25])
def test_index_image_sha256_from_memory_equals_the_written_files_hash(tmp_path, n_keys):
    import hashlib

    g = IndexGeometry(7, 10)  # 10 entries per file: 25 keys give full, full and partial files
    rng = np.random.default_rng(n_keys)
    rows = {"key_hash": rng.integers(0, 2**31 - 1, n_keys), "phy_offset": np.arange(n_keys) * 100,
            "store_timestamp": 1_700_000_000_000 + np.arange(n_keys) * 1500}
    images = build_index_files(rows, geometry=g, emit_empty=True, name_tz=None)
    assert images
    for i, im in enumerate(images):
        path = tmp_path / f"f{i}"
        im.write(path)
        assert im.sha256() == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("continued", [False, True])
def test_index_build_with_chains_on_a_thread_equals_the_single_thread_build(monkeypatch, continued):
    import storelib.broker.index.indexbuild as ix

    g = IndexGeometry(97, 400)
    rng = np.random.default_rng(7)
    n = 1000  # rolls into three files; the first continues a half-full file when ``continued``
    rows = {"key_hash": rng.integers(0, 2**31 - 1, n), "phy_offset": np.arange(n) * 64 + 10_000,
            "store_timestamp": 1_700_000_000_000 + np.arange(n) * 700}
    prev = None
    if continued:
        first = {k: v[:150] - (10_000 if k == "phy_offset" else 0) for k, v in rows.items()}
        prev = build_index_files(first, geometry=g, name_tz=None)[-1].state()

    def build(thread_min: int):
        monkeypatch.setattr(ix, "_THREAD_MIN", thread_min)
        return build_index_files(rows, geometry=g, prev_state=prev, name_tz=None)

    single, threaded = build(1 << 62), build(1)
    assert len(single) == len(threaded) == 3
    for a, b in zip(single, threaded):
        assert a.header == b.header and a.sha256() == b.sha256()
        assert np.array_equal(a.slots, b.slots) and np.array_equal(a.entries, b.entries)


@pytest.mark.parametrize("stray_entry", [None, 30, 1500, 1999])
def test_validate_reads_only_the_data_of_a_sparse_tail_and_still_finds_a_stray_entry_past_holes(tmp_path, stray_entry):
    g = IndexGeometry(16, 2000)  # a 40 KB file: its unused entries span several 4 KB blocks
    rows = {"key_hash": [index_hash(f"T#K{i}") for i in range(20)], "phy_offset": list(range(0, 2000, 100)),
            "store_timestamp": [1_700_000_000_000 + i for i in range(20)]}
    [img] = build_index_files(rows, geometry=g)
    path = tmp_path / "20231114221320000"
    img.write(path)  # the zero tail is a hole where the filesystem allows
    if stray_entry is not None:
        fd = os.open(path, os.O_WRONLY)
        try:  # one byte in the unused part, holes on both sides of its block
            os.pwrite(fd, b"\x07", g.entry_pos(stray_entry) + 5)
        finally:
            os.close(fd)
    assert path.stat().st_size == g.file_size
    with IndexFile.open(str(path), g) as f:
        found = [(x.kind, x.offset, x.extra.get("entry")) for x in f.validate()]
    want = [] if stray_entry is None else [("data_beyond_index_count", g.entry_pos(stray_entry), stray_entry)]
    assert found == want
