"""DLedger's data entries, blank fillers, index units, checkpoint and currterm: read and written byte for
byte as DLedger 0.3.1.2 does, checked against the two samples' own files and expected/*.jsonl."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from storelib.errors import StoreError
from storelib.format.dledger import entries as dl
from storelib.format.dledger.state import (
    CurrTerm,
    DLedgerCheckpoint,
    read_checkpoint_file,
    read_currterm_file,
    write_checkpoint_file,
    write_currterm_file,
)

from .conftest import load_expected


def _dir(sample: Path) -> Path:
    return sample / "store" / "dledger-n0"


def _data_files(sample: Path) -> dict[str, bytes]:
    d = _dir(sample) / "data"
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _index_head(sample: Path, n: int) -> bytes:
    with open(_dir(sample) / "index" / "00000000000000000000", "rb") as f:
        return f.read(n)


def test_every_entry_header_decodes_to_the_expected_fields_and_reencodes_identically(dledger_sample):
    files = _data_files(dledger_sample)
    for e in load_expected(dledger_sample, "dledger_entries.jsonl"):
        name = e["file"].rsplit("/", 1)[1]
        buf = files[name]
        h = dl.EntryHeader.from_bytes(buf, e["fileOffset"])
        assert (h.magic, h.size, h.index, h.term, h.pos, h.channel, h.chain_crc, h.body_crc, h.body_len) == (
            e["magic"], e["size"], e["index"], e["term"], e["pos"], e["channel"], e["chainCrc"], e["bodyCrc"],
            e["bodyLenField"])
        assert h.problem(int(name) + e["fileOffset"], len(buf) - e["fileOffset"]) is None
        body = buf[e["fileOffset"] + dl.BODY_OFFSET: e["fileOffset"] + e["size"]]
        assert dl.encode_entry(body, h.index, h.term, h.pos) == buf[e["fileOffset"]: e["fileOffset"] + e["size"]]


def test_vectorised_header_decode_and_encode_agree_with_the_scalar_ones(sample_dledger):
    files = _data_files(sample_dledger)
    ents = [e for e in load_expected(sample_dledger, "dledger_entries.jsonl") if e["file"].endswith("0" * 20)]
    buf = files["0" * 20]
    starts = np.array([e["fileOffset"] for e in ents])
    hs = dl.decode_entry_headers(np.frombuffer(buf, np.uint8), starts)
    assert hs["index"].tolist() == [e["index"] for e in ents]
    assert hs["pos"].tolist() == [e["pos"] for e in ents]
    enc = dl.encode_entry_headers(hs["size"], hs["index"], hs["term"], hs["pos"])
    assert all(bytes(enc[i]) == buf[s: s + 48] for i, s in enumerate(starts.tolist()))


def test_phy_offset_is_pos_plus_48_in_the_record_and_in_expected_messages(dledger_sample):
    files = _data_files(dledger_sample)
    for m in load_expected(dledger_sample, "messages.jsonl"):
        buf = files[m["file"].rsplit("/", 1)[1]]
        assert m["phyOffset"] == m["dledgerPos"] + dl.BODY_OFFSET
        assert m["size"] == m["dledgerEntrySize"] - dl.BODY_OFFSET
        rec = m["fileOffset"]
        assert int.from_bytes(buf[rec + 28: rec + 36], "big") == m["phyOffset"]


def test_blank_filler_is_where_the_next_entry_did_not_fit_and_the_writer_makes_the_same_bytes(sample_dledger):
    files = _data_files(sample_dledger)
    ents = load_expected(sample_dledger, "dledger_entries.jsonl")
    first = files["0" * 20]
    last0 = [e for e in ents if e["file"].endswith("0" * 20)][-1]
    end = last0["fileOffset"] + last0["size"]
    assert end == 4190588
    nxt = [e for e in ents if not e["file"].endswith("0" * 20)][0]
    assert dl.needs_blank(end, len(first), nxt["size"])
    assert not dl.needs_blank(last0["fileOffset"], len(first), last0["size"])
    assert dl.read_blank(first, end) == len(first) - end == 3716
    assert dl.blank_filler(len(first) - end) == first[end:]
    # the last file: zeros after the last entry, no filler
    tail = files["00000000000004194304"]
    assert dl.read_blank(tail, 765861) is None and tail[765861:] == bytes(len(tail) - 765861)


def test_needs_blank_keeps_room_for_an_eight_byte_filler():
    assert not dl.needs_blank(0, 100, 92)  # 92 + 8 = 100: fits exactly, 8 bytes left for a filler
    assert dl.needs_blank(0, 100, 93)
    with pytest.raises(StoreError, match="8 bytes"):
        dl.blank_filler(7)


def test_index_units_decode_match_their_entries_and_reencode_byte_identically(dledger_sample):
    ents = load_expected(dledger_sample, "dledger_entries.jsonl")
    raw = _index_head(dledger_sample, (len(ents) + 1) * dl.INDEX_UNIT_SIZE)
    units = dl.decode_index_units(raw)
    assert units[len(ents)].tolist() == (0, 0, 0, 0, 0)  # nothing after the last entry
    u = units[: len(ents)]
    assert u["index"].tolist() == [e["index"] for e in ents]
    assert [tuple(x) for x in u.tolist()] == [tuple(e["indexUnit"][k] for k in ("magic", "pos", "size", "index", "term"))
                                                for e in ents]
    assert dl.encode_index_units(u["pos"], u["size"], u["index"], u["term"]) == raw[: len(ents) * 32]
    assert dl.encode_index_unit(*[int(u[7][k]) for k in ("pos", "size", "index", "term")]) == raw[7 * 32: 8 * 32]
    h = dl.EntryHeader(1, ents[7]["size"], 7, 0, ents[7]["pos"], 0, 0, 0, ents[7]["size"] - 48)
    assert dl.index_unit_problem(u[7], h, ents[7]["pos"]) is None
    assert "term" in dl.index_unit_problem(u[7], h.__class__(**{**h.__dict__, "term": 3}), ents[7]["pos"])


def test_header_problems_follow_dledger_recovery_checks():
    ok = dict(magic=1, size=100, pos=4096, body_len=52, abs_pos=4096, room=1000)
    assert dl.header_problem(**ok) is None
    assert "pos field" in dl.header_problem(**{**ok, "pos": 0})
    assert "body length" in dl.header_problem(**{**ok, "body_len": 51})
    assert "does not fit" in dl.header_problem(**{**ok, "room": 99})
    assert "magic 2" in dl.header_problem(**{**ok, "magic": 2})
    assert "> 44" in dl.header_problem(**{**ok, "size": 44, "body_len": -4})


def test_truncated_reads_name_the_file_and_offset():
    with pytest.raises(StoreError) as e:
        dl.EntryHeader.from_bytes(bytes(40), 0, file="dledger-n0/data/x", file_offset=4100)
    assert e.value.file == "dledger-n0/data/x" and e.value.offset == 4100 and e.value.kind == "truncated"
    with pytest.raises(StoreError) as e:
        dl.decode_index_units(bytes(70), file="dledger-n0/index/0", file_offset=320)
    assert e.value.offset == 384


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_checkpoint_and_currterm_read_as_dledger_reads_them(sample_dledger, sample_dledger_crashed):
    assert read_checkpoint_file(_dir(sample_dledger)) == DLedgerCheckpoint(2013, 2013)
    crashed = _dir(sample_dledger_crashed)
    assert read_checkpoint_file(crashed) == DLedgerCheckpoint(1005, 1005)
    assert read_checkpoint_file(crashed, bak=True) == DLedgerCheckpoint(28, 28)
    assert read_currterm_file(crashed) == CurrTerm(0, "n0")
    assert read_currterm_file(crashed, bak=True) is None  # written once: no .bak yet


def test_state_writers_are_byte_identical_to_the_samples_files(sample_dledger_crashed):
    d = _dir(sample_dledger_crashed)
    assert DLedgerCheckpoint(1005, 1005).to_bytes() == (d / "checkpoint").read_bytes()
    assert DLedgerCheckpoint(28, 28).to_bytes() == (d / "checkpoint.bak").read_bytes()
    assert CurrTerm(0, "n0").to_bytes() == (d / "currterm").read_bytes()
    before = json.loads((sample_dledger_crashed / "expected" / "recovery.json").read_text())["beforeRecovery"]
    assert DLedgerCheckpoint(1005, 1005).to_text() == before["dledgerCheckpointFileText"]
    assert CurrTerm(0, "n0").to_text() == before["currtermFileText"]


def test_state_writer_keeps_the_previous_content_as_bak_like_string2file(tmp_path, sample_dledger_crashed):
    d = tmp_path / "dledger-n0"
    write_checkpoint_file(d, DLedgerCheckpoint(28, 28))
    assert not (d / "checkpoint.bak").exists()
    write_checkpoint_file(d, DLedgerCheckpoint(1005, 1005))
    src = _dir(sample_dledger_crashed)
    assert _sha(d / "checkpoint") == _sha(src / "checkpoint")
    assert _sha(d / "checkpoint.bak") == _sha(src / "checkpoint.bak")
    write_currterm_file(d, CurrTerm(0, "n0"))
    assert _sha(d / "currterm") == _sha(src / "currterm")
    assert DLedgerCheckpoint(5, 7).to_text(java8_order=True) == "endIndex=7\ncommittedIndex=5\n"


def test_checkpoint_values_dledger_cannot_parse_fail_like_the_broker_and_blank_means_none():
    assert DLedgerCheckpoint.from_bytes(b"endIndex=3\ncommittedIndex=2\n") == DLedgerCheckpoint(2, 3)
    assert DLedgerCheckpoint.from_bytes(b"committedIndex=  7 \n").committed_index == 7  # trim()
    assert DLedgerCheckpoint.from_bytes(b"committedIndex=\n").committed_index is None
    assert DLedgerCheckpoint.from_bytes(b"# nothing\n") == DLedgerCheckpoint(None, None)
    assert DLedgerCheckpoint(None).to_text() == "committedIndex=-1\nendIndex=-1\n"
    with pytest.raises(StoreError) as e:
        DLedgerCheckpoint.from_bytes(b"endIndex=3\ncommittedIndex=12x\n", "dledger-n0/checkpoint")
    assert e.value.kind == "bad_value" and e.value.offset == 11 and e.value.file == "dledger-n0/checkpoint"
    with pytest.raises(StoreError):
        DLedgerCheckpoint.from_bytes(b"committedIndex=9223372036854775808\n")
    bad = CurrTerm.from_bytes(b"voteLeader=n1\ncurrTerm=2 \n")  # no trim for the term
    assert bad.curr_term is None and bad.problem and bad.vote_leader is None
    assert CurrTerm.from_bytes(b"voteLeader=\ncurrTerm=3\n") == CurrTerm(3, None)
