"""DLedger rules a review found the walk missing, each checked against DLedger 0.3.1.2 / RocketMQ 4.9.8:
the first entry recover() walks (term >= -1, an index unit lookup that a negative index fails), the index
file size DLedger is configured with, RocketMQ's "[BUG]" reput drift, a committed unit in a missing index
file, a -1 magic mid-file, DLedger's checkpoint parsed as IOUtils.string2Properties does, and an index list
without data files. Inputs are generated stores patched as the reviewer's repro scripts did."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from storelib.broker.startup.recoveryplan import plan_document
from storelib.broker.startup.startup import simulate
from storelib.format.dledger.entries import BODY_OFFSET

from .conftest import run_cli
from .dledger_files import (
    SEG,
    data_file_at,
    dledger_entries,
    gen_dledger,
    index_unit_at,
    open_store,
    patch_bytes,
)


def _plan(root: Path, **kw) -> dict:
    return plan_document(simulate(open_store(root), "4", **kw))


def _kinds(doc: dict) -> dict[str, dict]:
    return {f["kind"]: f for f in doc.get("findings", [])}


# ---------------------------------------------------------------------------------------------
# 1. the first entry recover() walks


def test_a_first_entry_term_below_minus_one_ends_dledgers_walk_at_byte_0(tmp_path):
    """DLedgerMmapFileStore.recover starts with lastEntryTerm = -1 (:203, :248): entry 0 with term -2^62 ends
    the walk there: the ledger is empty, the data cut at 0, the consume queues cut to it."""
    root = gen_dledger(tmp_path, "t3", 20)
    patch_bytes(data_file_at(root, 0)[0], 16, struct.pack(">q", -(1 << 62)))
    doc = _plan(root)
    dl = doc["dledger"]
    assert (dl["data_end"], dl["ledger_end_index"], dl["committed_index"], dl["max_offset"]) == (0, -1, -1, 0)
    assert "below -1" in dl["stop"] and dl["index_delete"] == ()
    f = _kinds(doc)["dledger_data_truncated"]
    assert (f["file"], f["offset"]) == ("dledger-n0/data/00000000000000000000", 0)
    assert dl["cq_truncate_offset"] == 0


def test_a_bad_first_term_in_the_start_file_stops_the_jvm(tmp_path):
    """The third-last file's first entry passes the start check (its unit matches, term -5) but not the walk's
    term rule: processOffset stays two files below the last, and recover() calls System.exit(-1) (:293-296)."""
    root = gen_dledger(tmp_path, "t2", 300)
    ents = dledger_entries(root)
    files = sorted({p - p % SEG for _, p, _ in ents})
    sf = files[-3]
    first = next(i for i, p, _ in ents if p == sf)
    patch_bytes(data_file_at(root, sf)[0], 16, struct.pack(">q", -5))
    up, at = index_unit_at(root, first)
    patch_bytes(up, at + 24, struct.pack(">q", -5))
    dl = _plan(root)["dledger"]
    assert dl["start_file"].endswith(f"{sf:020d}") and dl["data_end"] == sf
    assert "System.exit(-1)" in dl["load_failure"]


def test_a_negative_first_index_deletes_every_index_file_and_never_raises(tmp_path, capsys):
    """Entry 0's index -7: the index-unit lookup fails, the catch's truncateOffset(-224) deletes every index
    file and rebuildWithPos(-224) fails (MmapFileList :672-678), ending the walk at 0. recover and audit name
    the file and offset; no traceback."""
    root = gen_dledger(tmp_path, "t11", 20)
    patch_bytes(data_file_at(root, 0)[0], 8, struct.pack(">q", -7))
    doc = _plan(root)
    dl = doc["dledger"]
    assert (dl["data_end"], dl["ledger_end_index"], dl["index_rewrite_from"]) == (0, -1, None)
    assert dl["index_delete"] == ("00000000000000000000",) and dl["index_create"] == ()
    assert "index -7" in dl["stop"]
    rc, out, err = run_cli(capsys, "recover", root, "--plan")
    assert rc == 1 and "Traceback" not in err and "dledger_data_truncated" in out
    rc, out, err = run_cli(capsys, "audit", root, "--engine", "local", "--quiet", "--json")
    assert rc == 1 and "Traceback" not in err
    bad = [f for f in json.loads(out)["findings"] if f["kind"] == "dledger_bad_entry"]
    assert [(f["file"], f["offset"], f["severity"]) for f in bad] == [("dledger-n0/data/00000000000000000000", 0,
                                                                       "critical")]


# ---------------------------------------------------------------------------------------------
# 2. the index file size DLedger is configured with


def test_a_short_only_index_file_stops_dledgers_load(tmp_path):
    """The only index file cut to the 3392 bytes of its units: DLedgerConfig fixes the index file size (160 MiB on
    every RocketMQ broker; the generator's 16 KiB, a power of two, reads as configured), MmapFileList.doLoad
    rejects any other size and DLedgerMmapFileStore.load calls System.exit(-1)."""
    root = gen_dledger(tmp_path, "t6", 100)
    idx = root / "dledger-n0" / "index" / f"{0:020d}"
    assert _plan(root)["dledger"]["load_failure"] is None
    n = len(dledger_entries(root))
    with open(idx, "r+b") as f:
        f.truncate(32 * n)
    doc = _plan(root)
    assert "System.exit(-1)" in doc["dledger"]["load_failure"] and doc["commitlog"]["supported"] is False
    f = next(f for f in doc["findings"] if f["kind"] == "dledger_load_fails")
    assert (f["file"], f["offset"]) == ("dledger-n0/index/00000000000000000000", 32 * n)


def test_recover_plan_exits_1_when_the_broker_would_not_start(tmp_path, capsys):
    """Nothing to change, but DLedger's load exits (a short index file): `recover --plan` says so and exits 1."""
    root = gen_dledger(tmp_path, "t6c", 100)
    idx = root / "dledger-n0" / "index" / f"{0:020d}"
    with open(idx, "r+b") as f:
        f.truncate(32 * len(dledger_entries(root)))
    rc, out, err = run_cli(capsys, "recover", root, "--plan", "--broker-version", "4")
    assert rc == 1 and "THE BROKER DOES NOT START" in out and "Traceback" not in err


def test_short_later_index_files_are_judged_by_the_files_spacing(tmp_path):
    """Three index files 16 KiB apart (the spacing checkSelf requires), the last two cut to 4000 bytes: those two
    fail the load, though 4000 is now the most common size."""
    root = gen_dledger(tmp_path, "t6b", 1100)
    files = sorted((root / "dledger-n0" / "index").iterdir())
    assert len(files) == 3
    for p in files[1:]:
        with open(p, "r+b") as f:
            f.truncate(4000)
    doc = _plan(root)
    bad = [(f["file"], f["offset"]) for f in doc["findings"] if f["kind"] == "dledger_load_fails"]
    assert bad == [(f"dledger-n0/index/{p.name}", 4000) for p in files[1:]]
    assert doc["dledger"]["load_failure"].startswith("4000 bytes, not the 16384")


# ---------------------------------------------------------------------------------------------
# 3. the reput's "[BUG]" drift in DLedger mode


def test_a_length_mismatch_record_drifts_the_reput_into_the_next_file_which_is_never_dispatched(tmp_path):
    """propertiesLength lowered by 10 in file 1: the check fails with size TOTALSIZE + 48 (DLedgerCommitLog
    :358-364), doReput adds it without moving readSize (4.9.8 DefaultMessageStore :2061-2073), the next check
    fails and ``+= result.getSize() - readSize`` lands one entry size into file 2, inside its first entry:
    nothing of file 2 is dispatched, and the plan counts it lost."""
    from storelib.broker.recovery.walk import rebuild_target

    root = gen_dledger(tmp_path, "t8", 900)
    ents = dledger_entries(root)
    files = sorted({p - p % SEG for _, p, _ in ents})
    victim = [e for e in ents if files[1] <= e[1] < files[2]][1]
    path, off = data_file_at(root, victim[1])
    b = path.read_bytes()
    rec = off + BODY_OFFSET
    blen = struct.unpack_from(">i", b, rec + 84)[0]
    pl_at = rec + 88 + blen + 1 + b[rec + 88 + blen]
    plen = struct.unpack_from(">h", b, pl_at)[0]
    patch_bytes(path, pl_at, struct.pack(">h", plen - 10))
    res = rebuild_target(open_store(root))
    got = [(d.base, d.start, d.end) for d in res.dispatch if d.base in files[1:4]]
    assert got[0] == (files[1], 0, victim[1] - files[1]) and all(d[0] != files[2] for d in got)
    assert any(d[0] == files[3] for d in got)
    drift = next(f for f in res.findings if f.kind == "reput_drift_skip")
    assert drift.extra["next"] == files[2] + victim[2]  # file 2 + TOTALSIZE + 48
    starts2 = [p - files[2] for _, p, _ in ents if files[2] <= p < files[3]]
    assert victim[2] not in starts2
    doc = _plan(root)
    assert [files[2], 0, "reput_drift_skips_file"] in [list(x) for x in doc["dledger"]["reput_skips"]]
    in12 = [e for e in ents if files[1] <= e[1] < files[3] and e[1] > victim[1]]
    assert doc["lost"]["totals"]["intact"] == len(in12)


# ---------------------------------------------------------------------------------------------
# 4. a committed unit in a missing index file


def test_a_committed_unit_in_a_missing_index_file_fails_the_load(tmp_path):
    """committedIndex 300 whose unit lies in the deleted first index file: updateCommittedIndex ->
    getEntryPosAndSize finds no file (:566-567), DISK_ERROR, and 4.9.8 DefaultMessageStore.load catches it and
    fails (:212, :221-223): not a committed position read from zeros."""
    root = gen_dledger(tmp_path, "t4", 900)
    n = len(dledger_entries(root))
    (root / "dledger-n0" / "checkpoint").write_text(f"committedIndex=300\nendIndex={n - 1}\n")
    (root / "dledger-n0" / "index" / f"{0:020d}").unlink()
    doc = _plan(root)
    assert "dledger-n0/index/00000000000000000000 @ 9600" in doc["dledger"]["load_failure"]
    assert doc["commitlog"]["supported"] is False and doc["dledger"]["committed_pos"] == -1


# ---------------------------------------------------------------------------------------------
# 5. a -1 magic mid-way through the last file


def test_a_minus_one_magic_inside_the_last_file_ends_the_ledger_and_the_plan_counts_the_loss(tmp_path):
    """DLedger takes a -1 magic for a blank filler (:211-216): in the last file that ends the ledger, processOffset
    at the file's end, and the entries after it are dropped; the plan names the offset and counts them."""
    root = gen_dledger(tmp_path, "t10", 300)
    ents = dledger_entries(root)
    last_base = ents[-1][1] - ents[-1][1] % SEG
    inlast = [e for e in ents if e[1] >= last_base]
    v = inlast[2]
    path, off = data_file_at(root, v[1])
    patch_bytes(path, off, struct.pack(">i", -1))
    doc = _plan(root)
    dl = doc["dledger"]
    assert (dl["data_end"], dl["ledger_end_index"], dl["ledger_cut"]) == (last_base + SEG, v[0] - 1, v[1])
    f = _kinds(doc)["dledger_data_truncated"]
    assert (f["file"], f["offset"]) == (f"dledger-n0/data/{last_base:020d}", off)
    assert doc["lost"]["totals"]["intact"] == len(inlast) - 3


def test_a_blank_filler_at_the_end_of_the_last_file_drops_nothing(tmp_path):
    """A genuine filler (its length the bytes left) in the last file is no loss."""
    root = gen_dledger(tmp_path, "t10b", 300)
    ents = dledger_entries(root)
    end = ents[-1][1] + ents[-1][2]
    path, off = data_file_at(root, end)
    patch_bytes(path, off, struct.pack(">ii", -1, SEG - off))
    doc = _plan(root)
    assert doc["dledger"]["ledger_cut"] is None and "dledger_data_truncated" not in _kinds(doc)


# ---------------------------------------------------------------------------------------------
# 6. DLedger's checkpoint and currterm through IOUtils.string2Properties


def test_a_malformed_escape_in_dledgers_checkpoint_reads_as_no_checkpoint(tmp_path):
    """string2Properties catches Properties.load's exception and returns null (IOUtils :147-156): loadCheckPoint
    gives null, recover() returns with committedIndex -1 (:315-317); currterm likewise keeps term 0."""
    from storelib.broker.settings.dledgerlayout import read_dledger_state
    from storelib.fileio.bytesource import resolve as res

    root = gen_dledger(tmp_path, "t5", 100, committed_lag=5)
    (root / "dledger-n0" / "checkpoint").write_bytes(b"committedIndex=100\nendIndex=105\njunk=\\u00zz\n")
    (root / "dledger-n0" / "currterm").write_bytes(b"currTerm=3\nbad=\\u12\n")
    doc = _plan(root)
    dl = doc["dledger"]
    assert (dl["committed_index"], dl["load_failure"], doc["commitlog"]["supported"]) == (-1, None, True)
    f = _kinds(doc)["dledger_checkpoint_unreadable"]
    assert f["file"] == "dledger-n0/checkpoint" and "line 3" in f["detail"]
    st = read_dledger_state(res(str(root / "dledger-n0")), "dledger-n0")
    assert st.currterm.curr_term is None and "keeps term 0" in st.currterm.problem


# ---------------------------------------------------------------------------------------------
# 7. index files without data files


def test_index_files_without_data_files_are_cut_to_the_first(tmp_path):
    """recover() with no data file: indexFileList.truncateOffset(0) (:144-149) deletes every index file but the
    one at offset 0."""
    root = gen_dledger(tmp_path, "t7", 900)
    idx = sorted(p.name for p in (root / "dledger-n0" / "index").iterdir())
    assert len(idx) == 2
    for p in (root / "dledger-n0" / "data").iterdir():
        p.unlink()
    assert _plan(root)["dledger"]["index_delete"] == tuple(idx[1:])
