"""ConsumeQueue reading, tagsCode and the broker-exact CQ writer (storelib.format.consumequeue)."""

from __future__ import annotations

import json
import os
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storelib.broker.dispatch.cqwriter import (
    NO_SLOT,
    QueueState,
    build_consume_queues,
    write_consume_queues,
    write_queue_image,
)
from storelib.broker.settings.cqload import LoadedQueue
from storelib.errors import StoreError
from storelib.fileio.bytesource import Location, data_ranges
from storelib.format.consumequeue import (
    CQ_DTYPE,
    CQ_UNIT_SIZE,
    DEFAULT_CQ_SEGMENT_SIZE,
    FILLER_BYTES,
    cq_file_size,
    file_name,
    filler_mask,
    first_invalid,
    list_queues,
    make_units,
    parse_file_name,
    parse_queue_dir,
    units_before_hole,
    valid_mask,
    view_units,
)
from storelib.format.delaylevel import DEFAULT_DELAY_LEVELS_MS
from storelib.format.topicname import safe_topic_dirname
from storelib.scan.arrowcols import tags_codes

SAMPLE_NAMES = ["rocketmq-4.9.8-small", "rocketmq-5.3.3-small"]
SAMPLE_CQ_SIZE = 2000  # mappedFileSizeConsumeQueue in both *.broker.conf


# ---------------------------------------------------------------------------------------------
# helpers


@pytest.fixture(scope="module")
def cq_samples(sample_498, sample_533) -> dict[str, Path]:
    """The shared read-only sample extractions (tests/conftest.py), by sample name."""
    return {"rocketmq-4.9.8-small": sample_498, "rocketmq-5.3.3-small": sample_533}


def records(rows, topic="T", queue_id=0) -> pa.Table:
    """rows: (phy, size, tags, queue_offset[, tran_type[, topic[, queue_id]]])."""
    cols: dict[str, list] = {k: [] for k in ("physical_offset_field", "size", "tags_code", "topic",
                                             "queue_id", "queue_offset", "tran_type")}
    for r in rows:
        p, z, c, n = r[:4]
        tt = r[4] if len(r) > 4 else 0
        cols["physical_offset_field"].append(p)
        cols["size"].append(z)
        cols["tags_code"].append(c)
        cols["queue_offset"].append(n)
        cols["tran_type"].append(tt)
        cols["topic"].append(r[5] if len(r) > 5 else topic)
        cols["queue_id"].append(r[6] if len(r) > 6 else queue_id)
    return pa.table({
        "physical_offset_field": pa.array(cols["physical_offset_field"], pa.int64()),
        "size": pa.array(cols["size"], pa.int32()),
        "tags_code": pa.array(cols["tags_code"], pa.int64()),
        "topic": pa.array(cols["topic"], pa.string()),
        "queue_id": pa.array(cols["queue_id"], pa.int32()),
        "queue_offset": pa.array(cols["queue_offset"], pa.int64()),
        "tran_type": pa.array(cols["tran_type"], pa.int8()),
    })


def unit(p, z, c) -> bytes:
    return struct.pack(">qiq", p, z, c)


def dir_bytes(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())} if d.exists() else {}


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def reference_broker(rows, S, files=None, state=None):
    """Independent model of ConsumeQueue.putMessagePositionInfo writing into bytearray 'files'.

    state: dict(max_phy, files order list, wpos of last, first flag). Mirrors store-algorithms §5.2.
    """
    files = {} if files is None else files
    s = state or {"max_phy": -1, "order": sorted(files), "wpos": None, "first": False}
    for p, z, c, n in rows:
        if p + z <= s["max_phy"]:
            continue
        expect = n * 20
        if not s["order"]:
            base = expect - (expect % S if expect >= 0 else -((-expect) % S))
            files[base] = bytearray(S)
            s["order"].append(base)
            s["wpos"], s["first"] = 0, True
        elif s["wpos"] == S:
            base = s["order"][-1] + S
            files[base] = bytearray(S)
            s["order"].append(base)
            s["wpos"], s["first"] = 0, False
        last = s["order"][-1]
        if s["first"] and n != 0 and s["wpos"] == 0:
            for i in range(0, expect % S, 20):
                files[last][i:i + 20] = FILLER_BYTES
                s["wpos"] += 20
        if n != 0 and expect < last + s["wpos"]:
            continue
        s["max_phy"] = p + z
        files[last][s["wpos"]:s["wpos"] + 20] = unit(p, z, c)
        s["wpos"] += 20
    return files, s


def build_and_write(rows, S, out: Path, state=None, key=("T", 0)):
    imgs = build_consume_queues(records(rows, key[0], key[1]), segment_size=S,
                                state={key: state} if state else None)
    if key in imgs:
        write_queue_image(imgs[key], out, S)
    return imgs.get(key)


# ---------------------------------------------------------------------------------------------
# names, sizes, units


def test_file_name_matches_tv4_offset2filename():
    assert file_name(0) == "00000000000000000000"
    assert file_name(1_073_741_824) == "00000000001073741824"
    assert file_name(6_000_000) == "00000000000006000000"
    assert file_name(123_456_789_012) == "00000000123456789012"
    assert file_name(-1) == "-00000000000000000001"  # Java's NumberFormat: a sign before the 20 digits
    with pytest.raises(StoreError):
        file_name(2**63)


@pytest.mark.parametrize("name", ["0" * 19, "0" * 21, "０" * 20, "+" + "0" * 19, " " + "0" * 19,
                                  "0" * 19 + "a", "0000000000000000000٣", ""])
def test_parse_file_name_rejects_anything_but_20_ascii_digits(name):
    assert parse_file_name(name) is None


def test_parse_file_name_accepts_20_digits():
    assert parse_file_name("00000000000024000000") == 24_000_000


def test_cq_file_size_rounds_up_to_multiple_of_20():
    assert cq_file_size(6_000_000) == 6_000_000
    assert cq_file_size(2001) == 2020
    assert cq_file_size(1) == 20


def test_view_units_is_zero_copy_and_reads_big_endian():
    buf = bytearray(unit(905, 507, 3154575) + unit(-1, 5, 0) + unit(0, 0x7FFFFFFF, 0) + b"\x01\x02")
    arr = view_units(buf)
    assert len(arr) == 3 and arr.dtype == CQ_DTYPE
    assert np.shares_memory(arr, np.frombuffer(buf, np.uint8))
    assert arr[0].tolist() == (905, 507, 3154575)
    assert valid_mask(arr).tolist() == [True, False, True]
    assert filler_mask(arr).tolist() == [False, False, True]
    assert first_invalid(arr) == 1
    buf[0:8] = (7).to_bytes(8, "big")
    assert int(arr["phy_offset"][0]) == 7  # shares the buffer


def test_filler_unit_bytes_are_the_broker_filler():
    assert FILLER_BYTES == bytes.fromhex("0000000000000000 7FFFFFFF 0000000000000000".replace(" ", ""))


# ---------------------------------------------------------------------------------------------
# tagsCode (TV-2)


NOT_DELAYED = -(2**62)  # the decoder's mark for a row without a SCHEDULE_TOPIC_XXXX DELAY


def test_tags_code_tv2_sign_extended_hashes():
    tags = pa.array(["TagA", "TagB", "*", "TagA||TagB", "ORDER_CREATED", "标签", None, ""])
    got = tags_codes(tags, None, np.zeros(8, np.int64), None, DEFAULT_DELAY_LEVELS_MS)
    assert got.dtype == np.int64
    assert got.tolist() == [2_598_919, 2_598_920, 42, 1_789_476_431, -394_906_953, 857_175, 0, 0]
    assert struct.pack(">q", int(got[4])) == bytes.fromhex("FFFFFFFFE87632B7")


def test_tags_code_schedule_topic_delay_rules():
    ts = 1_700_000_000_123
    tags = pa.array(["TagA"] * 7)
    # levels of SCHEDULE_TOPIC_XXXX rows; the last row is another topic's (its DELAY is not looked at)
    levels = np.array([3, 99, 0, -2, NOT_DELAYED, 18, NOT_DELAYED], np.int64)
    got = tags_codes(tags, None, np.full(7, ts, np.int64), levels, DEFAULT_DELAY_LEVELS_MS).tolist()
    assert got[0] == 1_700_000_010_123  # TV-2 delay example: level 3 = 10 s
    assert got[1] == ts + 7_200_000  # clamped to level 18 (2 h)
    assert got[2] == got[3] == got[4] == 2_598_919  # level <= 0 or absent keeps the TAGS hash
    assert got[5] == ts + 7_200_000
    assert got[6] == 2_598_919  # DELAY outside SCHEDULE_TOPIC_XXXX has no effect


def test_tags_code_empty_delay_table_keeps_hash():
    ts = np.array([1000, 1000], np.int64)
    tags = pa.array([None, "TagA"])
    levels = np.array([2, 3], np.int64)
    # 4.9.8 abnormal recovery: delay table not loaded yet → max level 0 → tag hash stays
    assert tags_codes(tags, None, ts, levels, []).tolist() == [0, 2_598_919]
    assert tags_codes(tags, None, ts, levels, (500, 1000, 9000)).tolist() == [2000, 10000]


# ---------------------------------------------------------------------------------------------
# the real sample stores


def _expected_entries(base: Path) -> dict[tuple[str, int], list[dict]]:
    exp: dict[tuple[str, int], list[dict]] = {}
    for line in (base / "expected" / "consumequeue_entries.jsonl").read_text().splitlines():
        d = json.loads(line)
        exp.setdefault((d["topic"], d["queueId"]), []).append(d)
    return exp


def _sample_records(base: Path) -> pa.Table:
    msgs = [json.loads(x) for x in (base / "expected" / "messages.jsonl").read_text().splitlines()]
    msgs = [m for m in msgs if m["type"] == "msg"]
    return pa.table({
        "physical_offset_field": pa.array([m["physicalOffsetField"] for m in msgs], pa.int64()),
        "size": pa.array([m["size"] for m in msgs], pa.int32()),
        "tags_code": pa.array([m["tagsCode"] for m in msgs], pa.int64()),
        "topic": pa.array([m["topic"] for m in msgs], pa.string()),
        "queue_id": pa.array([m["queueId"] for m in msgs], pa.int32()),
        "queue_offset": pa.array([m["queueOffset"] for m in msgs], pa.int64()),
        "tran_type": pa.array([m["tranType"] for m in msgs], pa.int8()),
    })


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_cq_files_read_equal_java_consumequeue_entries(cq_samples, name):
    base = cq_samples[name]
    exp = _expected_entries(base)
    findings: list = []
    queues = list_queues(base / "store", findings)
    assert findings == []
    assert {(t, q) for t, q, _ in queues} == set(exp)
    summary = json.loads((base / "expected" / "export_summary.json").read_text())["afterLoad_queues"]
    for topic, qid, loc in queues:
        with LoadedQueue(loc, segment_size=SAMPLE_CQ_SIZE, topic=topic, queue_id=qid) as cq:
            assert cq.findings == []
            got = []
            for off, chunk in cq.entries(chunk_entries=37):
                for i, (p, z, c) in enumerate(chunk.tolist()):
                    got.append({"topic": topic, "queueId": qid, "queueOffset": off + i,
                                "phyOffset": p, "size": z, "tagsCode": c})
            assert got == exp[(topic, qid)]
            s = summary[topic][str(qid)]
            assert cq.max_offset() == s["maxOffset"]
            assert cq.max_physic_offset() == s["maxPhysicOffset"]
            assert cq.min_offset(0) == s["minOffset"]
            assert cq.min_offset(0, variant="5.x") == s["minOffset"]
            last = exp[(topic, qid)][-1]
            assert cq.entry(last["queueOffset"]) == (last["phyOffset"], last["size"], last["tagsCode"])


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_cq_rebuilt_from_messages_is_byte_identical(cq_samples, name, tmp_path):
    base = cq_samples[name]
    imgs = build_consume_queues(_sample_records(base), segment_size=SAMPLE_CQ_SIZE)
    assert all(i.skipped_duplicates == i.skipped_repeats == i.out_of_order == 0 for i in imgs.values())
    write_consume_queues(imgs, tmp_path / "consumequeue", SAMPLE_CQ_SIZE)
    want = tree_bytes(base / "store" / "consumequeue")
    got = tree_bytes(tmp_path / "consumequeue")
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k] == want[k], k


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_incremental_build_from_existing_queue_equals_one_shot(cq_samples, name, tmp_path):
    base = cq_samples[name]
    tbl = _sample_records(base)
    cut = 1234
    first = build_consume_queues(tbl.slice(0, cut), segment_size=SAMPLE_CQ_SIZE)
    out = tmp_path / "consumequeue"
    write_consume_queues(first, out, SAMPLE_CQ_SIZE)
    states = {}
    for topic, qid, loc in list_queues(tmp_path):
        states[(topic, qid)] = QueueState.from_existing(LoadedQueue(loc, segment_size=SAMPLE_CQ_SIZE))
    second = build_consume_queues(tbl.slice(cut), segment_size=SAMPLE_CQ_SIZE, state=states)
    write_consume_queues(second, out, SAMPLE_CQ_SIZE)
    assert tree_bytes(out) == tree_bytes(base / "store" / "consumequeue")


# ---------------------------------------------------------------------------------------------
# the writer state machine, rule by rule


def test_tv7_first_entry_at_1234567_fills_pre_blank_units(tmp_path):
    img = build_and_write([(100, 200, 5, 1_234_567)], DEFAULT_CQ_SEGMENT_SIZE, tmp_path)
    assert img.segment_bases == [24_000_000] and img.start == 24_000_000
    assert img.slots.tolist() == [1_234_567]
    assert img.state.min_logic_offset == 24_691_340
    f = tmp_path / "00000000000024000000"
    assert f.stat().st_size == DEFAULT_CQ_SEGMENT_SIZE
    data = f.read_bytes()
    assert data[:691_340] == FILLER_BYTES * 34_567
    assert data[691_340:691_360] == unit(100, 200, 5)
    assert data[691_360:] == bytes(DEFAULT_CQ_SEGMENT_SIZE - 691_360)
    cq = LoadedQueue(tmp_path)
    assert cq.max_offset() == 1_234_568  # fillers count in the max offset
    assert cq.min_offset(0) == 1_200_000  # 4.9.8: fillers (phy 0) qualify when M = 0
    assert cq.min_offset(1) == 1_234_567


def test_gap_in_queue_offsets_slides_later_entries_down(tmp_path):
    rows = [(0, 10, 1, 0), (10, 10, 2, 1), (20, 10, 3, 2), (30, 10, 4, 5), (40, 10, 5, 6), (50, 10, 6, 9)]
    img = build_and_write(rows, 100, tmp_path)
    assert img.slots.tolist() == [0, 1, 2, 3, 4, 5]
    assert img.out_of_order == 3
    data = (tmp_path / "00000000000000000000").read_bytes() + (tmp_path / "00000000000000000100").read_bytes()
    assert [data[i * 20:(i + 1) * 20] for i in range(6)] == [unit(*r[:3]) for r in rows]
    assert data[120:] == bytes(80)


def test_duplicate_physical_end_is_skipped_without_writing(tmp_path):
    rows = [(0, 10, 1, 0), (10, 10, 2, 1), (5, 15, 9, 2), (2, 3, 9, 2), (20, 10, 3, 2)]
    img = build_and_write(rows, 2000, tmp_path)
    assert img.slots.tolist() == [0, 1, NO_SLOT, NO_SLOT, 2]
    assert img.skipped_duplicates == 2
    assert img.state.max_physic_offset == 30


def test_queue_offset_behind_write_position_is_dropped_as_repeat(tmp_path):
    rows = [(0, 10, 1, 0), (10, 10, 2, 1), (20, 10, 3, 2), (30, 10, 4, 1), (40, 10, 5, 3)]
    img = build_and_write(rows, 2000, tmp_path)
    assert img.slots.tolist() == [0, 1, 2, NO_SLOT, 3]
    assert img.skipped_repeats == 1
    assert img.state.max_physic_offset == 50  # the dropped repeat did not move maxPhysicOffset


def test_offset_zero_is_appended_at_current_position_of_non_empty_queue(tmp_path):
    rows = [(0, 10, 1, 0), (10, 10, 2, 1), (20, 10, 3, 0), (30, 10, 4, 3)]
    img = build_and_write(rows, 2000, tmp_path)
    assert img.slots.tolist() == [0, 1, 2, 3]
    assert img.out_of_order == 0


def test_offset_zero_after_fillers_is_written_without_order_check(tmp_path):
    rows = [(0, 10, 1, 3), (10, 10, 2, 0), (20, 10, 3, 2)]
    img = build_and_write(rows, 2000, tmp_path)
    assert img.slots.tolist() == [3, 4, NO_SLOT]  # n=2 expects slot 2 < current 5 → repeat
    data = (tmp_path / "00000000000000000000").read_bytes()
    assert data[:60] == FILLER_BYTES * 3 and data[60:100] == unit(0, 10, 1) + unit(10, 10, 2)


def test_prepared_and_rollback_records_get_no_entry(tmp_path):
    rows = [(0, 10, 1, 0, 1), (10, 10, 2, 0, 0), (20, 10, 3, 0, 3), (30, 10, 4, 1, 2),
            (40, 10, 4, 0, 1, "Half", 0)]
    imgs = build_consume_queues(records(rows), segment_size=2000)
    assert list(imgs) == [("T", 0)]
    assert imgs[("T", 0)].rows.tolist() == [1, 3]
    assert imgs[("T", 0)].entries.tolist() == [(10, 10, 2), (30, 10, 4)]


def test_full_segment_rolls_to_next_file_with_zero_tail(tmp_path):
    rows = [(i * 10, 10, i, i) for i in range(12)]
    img = build_and_write(rows, 100, tmp_path)
    assert img.segment_bases == [0, 100, 200] and img.base == 0 and img.end == 240
    assert sorted(p.name for p in tmp_path.iterdir()) == [file_name(0), file_name(100), file_name(200)]
    last = (tmp_path / file_name(200)).read_bytes()
    assert last == unit(100, 10, 10) + unit(110, 10, 11) + bytes(60)
    assert img.state.last_base == 200 and img.state.write_pos == 40 and not img.state.first_create


def test_records_are_grouped_per_topic_and_queue_in_dispatch_order():
    rows = [(0, 10, 1, 0, 0, "A", 1), (10, 10, 2, 0, 0, "B", 1), (20, 10, 3, 1, 0, "A", 1),
            (30, 10, 4, 0, 0, "A", -1), (40, 10, 5, 1, 0, "B", 1)]
    imgs = build_consume_queues(records(rows), segment_size=2000)
    assert sorted(imgs) == [("A", -1), ("A", 1), ("B", 1)]
    assert imgs[("A", 1)].entries["phy_offset"].tolist() == [0, 20]
    assert imgs[("B", 1)].rows.tolist() == [1, 4]


def test_incremental_continuation_equals_one_shot_build_for_irregular_queue(tmp_path):
    rows = [(0, 10, 1, 4), (10, 10, 2, 5), (5, 5, 0, 6), (20, 10, 3, 9), (30, 10, 4, 0), (40, 10, 5, 2),
            (50, 10, 6, 8)] + [(60 + 10 * i, 10, i, 9 + i) for i in range(9)]
    one = tmp_path / "one"
    build_and_write(rows, 100, one)
    for cut in range(len(rows) + 1):
        inc = tmp_path / f"inc{cut}"
        build_and_write(rows[:cut], 100, inc)
        state = QueueState.from_existing(LoadedQueue(inc, segment_size=100)) if inc.exists() else None
        build_and_write(rows[cut:], 100, inc, state=state)
        assert dir_bytes(inc) == dir_bytes(one), cut
        chained = tmp_path / f"chain{cut}"
        img = build_and_write(rows[:cut], 100, chained)
        build_and_write(rows[cut:], 100, chained, state=img.state if img else None)
        assert dir_bytes(chained) == dir_bytes(one), cut


def test_continuation_keeps_stale_bytes_after_the_new_end(tmp_path):
    S = 100
    stale = unit(0, 10, 1) + unit(10, 10, 2) + bytes(20) + unit(999, 9, 9) + unit(998, 9, 9)
    (tmp_path / file_name(0)).write_bytes(stale)
    cq = LoadedQueue(tmp_path, segment_size=S)
    state = QueueState.from_existing(cq)
    assert (state.last_base, state.write_pos, state.max_physic_offset) == (0, 40, 20)
    img = build_and_write([(20, 10, 3, 2)], S, tmp_path, state=state)
    assert img.prefix is not None and img.slots.tolist() == [2]
    assert (tmp_path / file_name(0)).read_bytes() == stale[:40] + unit(20, 10, 3) + stale[60:]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-2, 3), st.integers(1, 30)), max_size=40),
       st.integers(0, 12), st.sampled_from([20, 60, 100]), st.data())
def test_writer_matches_independent_broker_model(tmp_path_factory, steps, n0, S, data):
    """Random mixes of consecutive offsets, gaps, repeats, zeros and duplicate physical ends."""
    rows, n, p = [], n0, 0
    for kind, dn, z in steps:
        if kind == 0:
            n += 1
        elif kind == 1:
            n = max(0, n + dn)
        elif kind == 2:
            n = 0 if dn < 0 else n + 1
        p = p + z if dn != -2 else max(0, p - z)
        rows.append((p, z, kind, n))
    want, _ = reference_broker(rows, S)
    out = tmp_path_factory.mktemp("model")
    build_and_write(rows, S, out)
    got = dir_bytes(out)
    assert got == {file_name(b): bytes(v) for b, v in want.items()}
    if rows:
        cut = data.draw(st.integers(0, len(rows)))
        inc = tmp_path_factory.mktemp("model_inc")
        build_and_write(rows[:cut], S, inc)
        state = QueueState.from_existing(LoadedQueue(inc, segment_size=S)) if any(inc.iterdir()) else None
        build_and_write(rows[cut:], S, inc, state=state)
        # recovery stops at the first invalid unit; the model never writes invalid ones here
        assert dir_bytes(inc) == got


# ---------------------------------------------------------------------------------------------
# reading: bad input, recovery, min offsets, remote


def test_short_wrong_size_and_badly_named_files_become_findings(tmp_path):
    S = 100
    (tmp_path / file_name(0)).write_bytes(unit(0, 10, 1) * 5)
    (tmp_path / file_name(100)).write_bytes(unit(10, 10, 1) + b"\x00" * 7)  # short, partial unit
    (tmp_path / file_name(300)).write_bytes(bytes(120))  # gap and too long
    (tmp_path / "0000000000000000000x").write_bytes(b"")
    (tmp_path / "sub").mkdir()
    cq = LoadedQueue(tmp_path, segment_size=S)
    kinds = {(f.kind, os.path.basename(f.file), f.offset) for f in cq.findings}
    assert ("short_segment", file_name(100), 27) in kinds
    assert ("partial_unit", file_name(100), 20) in kinds
    assert ("long_segment", file_name(300), 100) in kinds
    assert ("segment_gap", file_name(300), None) in kinds
    assert ("bad_file_name", "0000000000000000000x", None) in kinds
    assert ("unexpected_directory", "sub", None) in kinds
    assert [s.base for s in cq.segments] == [0, 100, 300]
    assert cq.max_offset() == 6  # the short file ends the scan after its one valid unit
    assert cq.entry(5) == (10, 10, 1) and cq.entry(6) is None and cq.entry(10) is None
    assert [int(o) for o, _ in cq.entries(0, 20)] == [0, 5, 15]


def test_empty_last_segment_is_reported_and_skipped(tmp_path):
    (tmp_path / file_name(0)).write_bytes(unit(0, 10, 1) + bytes(80))
    (tmp_path / file_name(100)).write_bytes(b"")
    cq = LoadedQueue(tmp_path, segment_size=100)
    assert [f.kind for f in cq.findings] == ["empty_last_segment"]
    assert [s.name for s in cq.segments] == [file_name(0)]


def test_recovery_stops_at_first_invalid_unit_in_window_and_reports_later_segments(tmp_path):
    S = 60
    (tmp_path / file_name(0)).write_bytes(unit(0, 10, 1) * 3)
    (tmp_path / file_name(60)).write_bytes(unit(10, 10, 1) + bytes(20) + unit(30, 10, 1))
    (tmp_path / file_name(120)).write_bytes(unit(40, 10, 1) + bytes(40))
    cq = LoadedQueue(tmp_path, segment_size=S)
    rec = cq.recover()
    assert rec.end == 80 and cq.max_offset() == 4 and cq.max_physic_offset() == 20
    assert [(s.base, w) for s, w in rec.segments] == [(0, 60), (60, 20)]
    assert [f.kind for f in cq.findings] == ["segment_after_end"]
    assert QueueState.from_existing(cq) == QueueState(20, 60, 20, False, 0, cq.segments[1].loc)


def test_min_offset_rules_against_commitlog_min(tmp_path):
    S = 200
    data = b"".join(unit(100 * i, 10, 0) for i in range(10))  # phy 0,100,...,900
    (tmp_path / file_name(0)).write_bytes(data)
    (tmp_path / file_name(200)).write_bytes(unit(1000, 10, 0) + unit(1100, 10, 0) + bytes(160))
    cq = LoadedQueue(tmp_path, segment_size=S)
    assert cq.max_offset() == 12
    for M, want in [(0, 0), (1, 1), (450, 5), (900, 9)]:
        assert cq.min_offset(M) == want
        assert cq.min_offset(M, variant="5.x") == want
    # nothing in the first file qualifies: 4.9.8 keeps the old value, 5.x binary search keeps it too
    assert cq.min_offset(1050) == 0
    assert cq.min_offset(1050, variant="5.x") == 0
    # every entry expired: 5.x jumps to the max offset, 4.9.8 keeps the old value
    assert cq.min_offset(5000, variant="5.x") == 12
    assert cq.min_offset(5000) == 0
    # 5.x keeps a previous min that still points at a live entry
    assert cq.min_offset(100, variant="5.x", previous_min_logic_offset=7 * 20) == 7


def test_entries_stream_in_bounded_chunks_with_logical_offsets(tmp_path):
    rows = [(i * 10, 10, i, i + 3) for i in range(40)]
    build_and_write(rows, 200, tmp_path)
    cq = LoadedQueue(tmp_path, segment_size=200)
    chunks = list(cq.entries(chunk_entries=4))
    assert all(len(c) <= 4 for _, c in chunks)
    assert chunks[0][0] == 0
    allu = np.concatenate([c for _, c in chunks])
    assert len(allu) == cq.max_offset() == 43
    assert filler_mask(allu[:3]).all() and allu["phy_offset"][3:].tolist() == [i * 10 for i in range(40)]
    part = list(cq.entries(11, 13))
    assert [(o, c.tolist()) for o, c in part] == [(11, [(80, 10, 8), (90, 10, 9)])]


def test_remote_location_reads_and_writes_through_arrow_filesystem(tmp_path):
    rows = [(i * 10, 10, i, i) for i in range(9)]
    fs = pafs.LocalFileSystem()
    loc = Location(fs, str(tmp_path / "remote" / "T" / "0"), False)
    imgs = build_consume_queues(records(rows), segment_size=100)
    paths = write_queue_image(imgs[("T", 0)], loc, 100)
    assert [os.path.basename(p) for p in paths] == [file_name(0), file_name(100)]
    assert not [p for p in (tmp_path / "remote" / "T" / "0").iterdir() if p.name.endswith(".tmp")]
    local = tmp_path / "local"
    write_queue_image(imgs[("T", 0)], local, 100)
    assert dir_bytes(local) == dir_bytes(tmp_path / "remote" / "T" / "0")
    cq = LoadedQueue(loc, segment_size=100)
    assert cq.max_offset() == 9 and cq.entry(7) == (70, 10, 7)
    found = list_queues(Location(fs, str(tmp_path / "rootx"), False))
    assert found == []


def count_ranged_requests(monkeypatch) -> tuple[Counter, Counter]:
    """(opens, ranged reads) of files read by ranged requests (``ArrowFileSource``), per path, from now on."""
    import storelib.fileio.bytesource as bytesource

    opens: Counter = Counter()
    reads: Counter = Counter()
    real_init, real_read = bytesource.ArrowFileSource.__init__, bytesource.ArrowFileSource._read_at

    def counted_init(self, fs, path, size=None):
        opens[path] += 1
        real_init(self, fs, path, size)

    def counted_read(self, offset, length):
        reads[self.path] += 1
        return real_read(self, offset, length)

    monkeypatch.setattr(bytesource.ArrowFileSource, "__init__", counted_init)
    monkeypatch.setattr(bytesource.ArrowFileSource, "_read_at", counted_read)
    return opens, reads


def test_a_remote_queue_read_in_ascending_runs_costs_one_open_and_one_read_per_file(tmp_path, monkeypatch):
    """Runs of units across three files, released between runs as the audit's queue checks do: each remote
    file is opened once and read once (one block), the units are the file's, and after a release only the
    file read last stays open."""
    from storelib.checks.queuestream import _read_units

    S = 20 * 50
    rows = [(i * 10, 10, i, i) for i in range(140)]
    fs = pafs.LocalFileSystem()
    loc = Location(fs, str(tmp_path / "remote" / "T" / "0"), False)
    write_queue_image(build_consume_queues(records(rows), segment_size=S)[("T", 0)], loc, S)
    opens, reads = count_ranged_requests(monkeypatch)
    cq = LoadedQueue(loc, segment_size=S)
    got = []
    for first in range(0, 140, 7):  # runs of 7 units, some across a file boundary
        got.append(np.array(_read_units(cq, first, 7)))
        cq.release_mapped()
        assert len(cq._sources) == 1  # the file read last
    units = np.concatenate(got)
    assert units["phy_offset"].tolist() == [i * 10 for i in range(140)]
    assert len(opens) == 3 and set(opens.values()) == {1}  # three files, each once
    assert len(reads) == 3 and set(reads.values()) == {1}
    cq.close()
    assert cq._sources == {} and cq._block is None


# ---------------------------------------------------------------------------------------------
# queue listing and topic names


def test_list_queues_ignores_non_integer_queue_dirs_with_a_finding(tmp_path):
    cq = tmp_path / "consumequeue"
    for d in ["TopicA/0", "TopicA/1", "TopicA/x1", "TopicA/01", "%RETRY%g/0", "bad.topic/0"]:
        (cq / d).mkdir(parents=True)
    (cq / "TopicA" / "stray").write_bytes(b"")
    findings: list = []
    got = [(t, q) for t, q, _ in list_queues(tmp_path, findings)]
    assert got == [("%RETRY%g", 0), ("TopicA", 0), ("TopicA", 1), ("TopicA", 1), ("bad.topic", 0)]
    kinds = {(f.kind, os.path.basename(f.file)) for f in findings}
    assert ("bad_queue_dir", "x1") in kinds
    assert ("noncanonical_queue_dir", "01") in kinds
    assert ("unexpected_file", "stray") in kinds
    assert ("unusual_topic_name", "bad.topic") in kinds


def test_list_queues_detects_rocksdb_consumequeue(tmp_path):
    cq = tmp_path / "consumequeue"
    cq.mkdir()
    for n in ["CURRENT", "MANIFEST-000005", "000007.sst"]:
        (cq / n).write_bytes(b"x")
    with pytest.raises(StoreError) as ei:
        list_queues(tmp_path)
    assert ei.value.kind == "rocksdb_consumequeue" and ei.value.file.endswith("consumequeue")


def test_parse_queue_dir_follows_java_parse_int():
    assert [parse_queue_dir(s) for s in ["0", "17", "-1", "+3", "007"]] == [0, 17, -1, 3, 7]
    assert [parse_queue_dir(s) for s in ["", "x", "1_0", " 1", "2147483648", "1.0", "+"]] == [None] * 7


@pytest.mark.parametrize("topic", ["TopicTest", "%RETRY%group_a", "%DLQ%group_a", "%LMQ%lmq1",
                                   "SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer", "a|b-c",
                                   "%RETRY%group+TopicTest", "LongTopicV2_200_" + "a" * 184, "x" * 255])
def test_safe_topic_dirname_allows_rocketmq_topic_names(topic):
    assert safe_topic_dirname(topic) == topic


@pytest.mark.parametrize("topic", ["tópico", "订单事件_テスト_ñ", "Emoji🚀Topic", "a b", "a.b", "a\nb", "abc\n",
                                   "..a", "é" * 127])
def test_safe_topic_dirname_allows_any_name_the_broker_could_make_a_directory(topic):
    assert safe_topic_dirname(topic) == topic


@pytest.mark.parametrize("topic", ["", ".", "..", "../x", "a/b", "a\x00b", "x" * 256, "é" * 128, "/abs"])
def test_safe_topic_dirname_rejects_names_that_cannot_be_one_directory_entry(topic):
    with pytest.raises(StoreError) as ei:
        safe_topic_dirname(topic)
    assert ei.value.kind == "unsafe_topic_name"


def test_write_consume_queues_never_writes_an_unsafe_topic_and_writes_the_rest(tmp_path):
    imgs = build_consume_queues(records([(0, 10, 1, 0)], topic="../evil"), segment_size=100)
    imgs.update(build_consume_queues(records([(0, 10, 1, 0)], topic="Fine"), segment_size=100))
    paths = write_consume_queues(imgs, tmp_path / "cq", 100)
    assert not (tmp_path / "evil").exists()
    assert [os.path.relpath(p, tmp_path) for p in paths] == [os.path.join("cq", "Fine", "0", "0" * 20)]


# ---------------------------------------------------------------------------------------------
# builder input validation


def test_build_rejects_missing_columns_nulls_and_bad_segment_size():
    t = records([(0, 10, 1, 0)])
    with pytest.raises(StoreError) as ei:
        build_consume_queues(t.drop_columns(["tran_type"]), segment_size=100)
    assert ei.value.kind == "bad_input"
    nulls = t.set_column(0, "physical_offset_field", pa.array([None], pa.int64()))
    with pytest.raises(StoreError):
        build_consume_queues(nulls, segment_size=100)
    with pytest.raises(StoreError) as ei:
        build_consume_queues(t, segment_size=30)
    assert ei.value.kind == "bad_segment_size"


def test_build_accepts_record_batches_and_chunked_tables():
    rows = [(i * 10, 10, i, i) for i in range(6)]
    t = records(rows)
    chunked = pa.concat_tables([t.slice(0, 2), t.slice(2)])
    a = build_consume_queues(chunked, segment_size=100)[("T", 0)]
    b = build_consume_queues(t.to_batches()[0], segment_size=100)[("T", 0)]
    assert a.entries.tolist() == b.entries.tolist() == make_units(*zip(*[r[:3] for r in rows])).tolist()
    assert CQ_UNIT_SIZE == 20


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_digests_recorded_while_writing_equal_the_written_files_fresh_and_continued(cq_samples, name, tmp_path):
    import hashlib

    tbl = _sample_records(cq_samples[name])
    out = tmp_path / "consumequeue"
    for part, state in ((tbl.slice(0, 1234), None), (tbl.slice(1234), "existing")):
        states = None
        if state:  # the second build continues the files the first wrote (prefix bytes read back)
            states = {(t, q): QueueState.from_existing(LoadedQueue(loc, segment_size=SAMPLE_CQ_SIZE))
                      for t, q, loc in list_queues(tmp_path)}
        imgs = build_consume_queues(part, segment_size=SAMPLE_CQ_SIZE, state=states)
        digests: dict[str, str] = {}
        paths = write_consume_queues(imgs, out, SAMPLE_CQ_SIZE, digests=digests)
        assert paths and sorted(digests) == sorted(paths)
        for p in paths:
            assert digests[p] == hashlib.sha256(Path(p).read_bytes()).hexdigest(), p
    # remote (an Arrow filesystem), and a queue continued 60 bytes into a file that is not there (the
    # units land after zeros): the same digests
    for first, state in ((0, None), (3, QueueState(max_physic_offset=-1, last_base=0, write_pos=60))):
        rows = [(i * 10, 10, first + i, i) for i in range(9)]
        loc = Location(pafs.LocalFileSystem(), str(tmp_path / f"remote{first}" / "T" / "0"), False)
        img = build_consume_queues(records(rows), segment_size=100, state=state and {("T", 0): state})[("T", 0)]
        assert img.start == (60 if state else 0)
        digests = {}
        for p in write_queue_image(img, loc, 100, digests=digests):
            assert digests[p] == hashlib.sha256(Path(p).read_bytes()).hexdigest()


@pytest.mark.parametrize("layout", ["valid_then_hole", "invalid_unit_then_hole", "hole_first", "full", "odd_edge"])
def test_recovery_of_a_sparse_preallocated_file_equals_the_dense_one(tmp_path, layout):
    """Recovery skips reading a file's unwritten, sparse tail (zeros, so invalid units): the end and the max
    physical offset are those of the same bytes written out in full."""
    S = 3000 * CQ_UNIT_SIZE  # 15 pages: the sparse file's tail is a hole
    n = {"valid_then_hole": 210, "invalid_unit_then_hole": 210, "hole_first": 0, "full": 3000, "odd_edge": 409}[layout]
    units = make_units(np.arange(n, dtype=np.int64) * 100 + 7, np.full(n, 100), np.arange(n) % 5)
    if layout == "invalid_unit_then_hole":
        units["size"][150] = 0
    data = units.tobytes()
    ends = {}
    for kind in ("dense", "sparse"):
        qdir = tmp_path / kind / "T" / "0"
        qdir.mkdir(parents=True)
        with open(qdir / f"{0:020d}", "wb") as f:
            if layout == "hole_first":
                f.truncate(S)
            else:
                f.write(data)
                if kind == "dense":
                    f.write(bytes(S - len(data)))
                else:
                    f.truncate(S)
        with LoadedQueue(Location(pafs.LocalFileSystem(), str(qdir), True), segment_size=S, topic="T",
                          queue_id=0) as cq:
            r = cq.recover()
            ends[kind] = (r.end, r.max_physic_offset, cq.max_offset())
            holes = data_ranges(str(qdir / f"{0:020d}"), 0, S) != [(0, S)]  # can the filesystem say?
            if kind == "sparse" and layout != "full" and holes:  # then the hole is not read
                assert units_before_hole(cq.segments[0], 3000) <= 410
    assert ends["sparse"] == ends["dense"]
    want = {"valid_then_hole": 210, "invalid_unit_then_hole": 150, "hole_first": 0, "full": 3000, "odd_edge": 409}
    assert ends["dense"][2] == want[layout]
