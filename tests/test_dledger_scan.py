"""The one scanner over DLedger data files: every message column plus the entry columns, at the broker's
offsets (entry pos + 48), DLedger's recovery rules ending the walk, the same result whatever the window,
batch size or column-wise run, and never a traceback on damaged bytes."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storelib.fileio.bytesource import open_source, resolve
from storelib.format.dledger.entries import BODY_OFFSET, encode_entry
from storelib.format.record import Message, encode_message
from storelib.scan.messageschema import DLEDGER_NAMES, MESSAGE_SCHEMA
from storelib.scan.scanner import SegmentScan, scan_buffer

from .conftest import load_expected
from .dledger_oracle import build_data_files, messages, oracle_walk

# expected/messages.jsonl key -> scan column
FIELDS = {
    "phyOffset": "phy_offset", "size": "size", "bodyCRC": "body_crc", "queueId": "queue_id", "flag": "flag",
    "queueOffset": "queue_offset", "physicalOffsetField": "physical_offset_field", "sysFlag": "sys_flag",
    "tranType": "tran_type", "bornTimestamp": "born_timestamp", "bornHost": "born_host",
    "storeTimestamp": "store_timestamp", "storeHost": "store_host", "reconsumeTimes": "reconsume_times",
    "preparedTransactionOffset": "prepared_transaction_offset", "bodyLen": "body_len", "topic": "topic",
    "tags": "tags", "keys": "keys", "uniqKey": "uniq_key", "offsetMsgId": "msg_id", "tagsCode": "tags_code",
    "propertiesStringRaw": "properties_raw", "dledgerIndex": "dledger_index", "dledgerTerm": "dledger_term",
    "dledgerPos": "dledger_pos",
}


def scan_data_dir(sample: Path, **kw) -> tuple[pa.Table, list]:
    d = sample / "store" / "dledger-n0" / "data"
    batches, ends, prev = [], [], None
    for p in sorted(d.iterdir()):
        src = open_source(resolve(str(p)))
        scan = SegmentScan(src, "dledger-n0/data/" + p.name, int(p.name), dledger=True, prev_entry=prev, **kw)
        batches += list(scan)
        ends.append(scan.end)
        prev = (scan.end.last_index, scan.end.last_term)
        src.close()
    return pa.Table.from_batches(batches), ends


def test_both_samples_decode_field_by_field_as_the_broker_did(dledger_sample):
    exp = load_expected(dledger_sample, "messages.jsonl")
    t, ends = scan_data_dir(dledger_sample, with_body=True, committed_index=1005)
    assert t.num_rows == len(exp)
    d = t.to_pydict()
    for i, e in enumerate(exp):
        for k, col in FIELDS.items():
            assert d[col][i] == e[k], (i, k)
        assert d["properties"][i] == sorted(e["properties"].items()) or dict(d["properties"][i]) == e["properties"]
        assert d["crc_ok"][i] is (e["bodyCRC"] == e["bodyCrcRecomputed"])
        assert d["magic_version"][i] == 1 and e["magicCode"] == "0xDAA320A7"
        assert d["dledger_committed"][i] is (e["dledgerIndex"] <= 1005)
    assert [e.kind for e in ends][-1] == "end_of_data"
    assert ends[-1].phy_offset == exp[-1]["dledgerPos"] + exp[-1]["dledgerEntrySize"]


def test_clean_sample_ends_in_a_blank_filler_then_the_data_end(sample_dledger):
    _, ends = scan_data_dir(sample_dledger)
    assert [(e.kind, e.file_offset, e.last_index) for e in ends] == [("blank", 4190588, 1695),
                                                                      ("end_of_data", 765861, 2013)]
    assert ends[0].segment_full and not ends[1].segment_full


def test_without_a_committed_index_the_committed_column_is_null_and_the_schema_is_the_messages_plus_ledger(
        sample_dledger_crashed):
    t, _ = scan_data_dir(sample_dledger_crashed)
    assert t.column("dledger_committed").null_count == t.num_rows
    names = t.schema.names
    assert names[-4:] == ["dledger_index", "dledger_term", "dledger_pos", "dledger_committed"]
    assert set(names[:-4]) <= set(MESSAGE_SCHEMA.names)


def test_default_scans_have_no_dledger_columns():
    buf = encode_message(Message(topic="T", body=b"x", properties={"UNIQ_KEY": "A" * 32}))
    t, end = scan_buffer(buf + bytes(64))
    assert not DLEDGER_NAMES & set(t.schema.names) and end.last_index is None
    assert "last_index" not in end.to_dict()


def _image(n: int = 40, size: int = 1 << 14, **kw) -> list[bytes]:
    return build_data_files(messages(n), size, **kw)


def test_generated_files_roll_with_blank_fillers_and_split_scans_join_to_the_whole():
    files = _image(60, 8192)
    assert len(files) > 2
    whole, prev = [], None
    for k, f in enumerate(files):
        t, end = scan_buffer(f, base=k * 8192, dledger=True, prev_entry=prev)
        whole.append(t)
        prev = (end.last_index, end.last_term)
        assert end.kind == ("blank" if k < len(files) - 1 else "end_of_data")
    t = pa.concat_tables(whole)
    assert t.column("dledger_index").to_pylist() == list(range(60))
    assert (np.asarray(t.column("phy_offset")) == np.asarray(t.column("dledger_pos")) + BODY_OFFSET).all()
    # a split that starts at an entry in the middle of the first file
    starts = [o for o, _, _ in oracle_walk(files[0]).entries]
    mid = starts[len(starts) // 2]
    a, ea = scan_buffer(files[0], dledger=True, end=mid)
    b, eb = scan_buffer(files[0], dledger=True, start=mid)
    assert ea.kind == "split_end" and pa.concat_tables([a, b]).equals(whole[0])


def _set(buf: bytes, at: int, fmt: str, value: int) -> bytes:
    b = bytearray(buf)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


@pytest.mark.parametrize("what, at, fmt, value, reason, text", [
    ("pos field", 24, ">q", 7, "bad_entry", "pos field 7"),
    ("entry magic", 0, ">i", 2, "bad_entry", "magic 2"),
    ("body length", 44, ">i", 100, "bad_entry", "body length"),
    ("index gap", 8, ">q", 9, "bad_entry", "does not follow"),
    ("record magic", 52, ">i", 0x12345678, "bad_magic", "0x12345678"),
])
def test_an_entry_failing_dledger_or_record_rules_ends_the_scan_there_with_the_reason(what, at, fmt, value, reason,
                                                                                       text):
    f = _image(12)[0]
    starts = [o for o, _, _ in oracle_walk(f).entries]
    k = 5
    bad = _set(f, starts[k] + at, fmt, value)
    t, end = scan_buffer(bad, dledger=True)
    assert t.num_rows == k and end.kind == "invalid" and end.reason == reason and text in end.detail, what
    assert end.file_offset == starts[k] and end.last_index == k - 1
    assert oracle_walk(bad).reason == reason


def test_a_lower_term_ends_the_scan_and_a_higher_one_does_not():
    f = build_data_files(messages(10), 1 << 14, term_of=lambda i: 0 if i < 4 else 3)[0]
    t, end = scan_buffer(f, dledger=True)
    assert t.num_rows == 10 and t.column("dledger_term").to_pylist() == [0] * 4 + [3] * 6
    starts = [o for o, _, _ in oracle_walk(f).entries]
    t, end = scan_buffer(_set(f, starts[7] + 16, ">q", 1), dledger=True)
    assert t.num_rows == 7 and "term 1 is lower" in end.detail


def test_a_record_that_is_not_its_entry_length_is_a_length_mismatch():
    rec = encode_message(Message(topic="T", body=b"abc", physical_offset=BODY_OFFSET, properties={"UNIQ_KEY": "B" * 32}))
    ent = encode_entry(rec + b"\0\0\0\0", 0, 0, 0)  # the entry says 4 bytes more than the record
    t, end = scan_buffer(ent + bytes(200), dledger=True)
    assert t.num_rows == 0 and end.reason == "length_mismatch" and end.size == len(rec)


def test_an_entry_ending_exactly_at_the_file_end_stops_dledger_recovery():
    f = _image(3)[0]
    w = oracle_walk(f)
    cut = f[: w.offset]
    t, end = scan_buffer(cut, dledger=True)
    assert t.num_rows == 3 and end.kind == "invalid" and end.reason == "truncated" and not end.segment_full


def _plain(monkeypatch):
    from storelib.scan import scanner

    monkeypatch.setattr(scanner.ChainRun, "run", lambda self, a, rel, lim, rel_end, rows, head=0: ([], rel))


FUZZ = _image(30, 8192)[0]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 8191), st.integers(0, 255)), min_size=0, max_size=6),
       st.integers(16, 8192), st.sampled_from([64, 300, 4 << 20]), st.sampled_from([1, 3, 65536]))
def test_damaged_files_end_where_the_scalar_walk_ends_and_the_run_changes_nothing(monkeypatch, edits, cut, window,
                                                                                  rows):
    buf = bytearray(FUZZ)
    for pos, val in edits:
        buf[pos] = val
    buf = bytes(buf[:cut])
    t, end = scan_buffer(buf, dledger=True, verify_crc=False, window=window, batch_rows=rows)
    ref = oracle_walk(buf)
    assert t.num_rows == end.records == len(ref.entries)
    assert (end.kind, end.file_offset) == (ref.kind, ref.offset)
    if end.kind == "invalid":
        assert end.reason == ref.reason
    assert t.column("phy_offset").to_pylist() == [o + BODY_OFFSET for o, _, _ in ref.entries]
    with monkeypatch.context() as m:
        _plain(m)
        t2, end2 = scan_buffer(buf, dledger=True, verify_crc=False, window=window, batch_rows=rows)
    assert t2.equals(t) and end2.to_dict() == end.to_dict()


def _log(sample: Path, committed: int | None = None):
    from storelib.scan.commitlog import CommitLog

    return CommitLog(str(sample / "store" / "dledger-n0" / "data"), 4194304, dledger=True,
                     folder="dledger-n0/data", committed_index=committed)


def test_the_dledger_commitlog_scans_looks_up_and_splits_at_entry_starts(dledger_sample):
    from storelib.scan.splits import find_entry_start, plan_splits

    exp = load_expected(dledger_sample, "messages.jsonl")
    cl = _log(dledger_sample, 1005)
    assert not cl.findings and [s.display for s in cl.segments][0] == "dledger-n0/data/" + "0" * 20
    whole = cl.read_table()
    assert whole.column("phy_offset").to_pylist() == [m["phyOffset"] for m in exp]
    assert whole.column("dledger_committed").to_pylist() == [m["dledgerIndex"] <= 1005 for m in exp]
    m = exp[len(exp) // 2]
    row = cl.record_at(m["phyOffset"])
    assert row.column("dledger_index")[0].as_py() == m["dledgerIndex"] and row.column("uniq_key")[0].as_py() == m["uniqKey"]
    assert cl.read(m["phyOffset"]).message.queue_offset == m["queueOffset"]
    with pytest.raises(Exception, match="no valid message record"):
        cl.record_at(m["phyOffset"] + 1)
    planned = plan_splits(cl, 256 * 1024)
    assert len(planned) > 4 and all(p.split.dledger for p in planned)
    entry_starts = {m["fileOffset"] - BODY_OFFSET for m in exp}
    parts = []
    for p in planned:
        sp = p.split
        assert sp.start == 0 or sp.start in entry_starts
        src = open_source(resolve(sp.uri))
        parts += list(SegmentScan(src, sp.segment_name, sp.segment_base, sp.start, sp.end, dledger=True,
                                  committed_index=1005))
        src.close()
    assert pa.Table.from_batches(parts).equals(whole)
    src = open_source(resolve(cl.segments[0].path))
    assert find_entry_start(src, 0, 1) == exp[1]["fileOffset"] - BODY_OFFSET
    src.close()
    # an offset range keeps the unit holding its first record
    lo = exp[100]["phyOffset"]
    units = plan_splits(cl, 256 * 1024, from_offset=lo)
    assert units[0].split.start == exp[100]["fileOffset"] - BODY_OFFSET
