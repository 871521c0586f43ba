"""Where 4.9.8 and 5.3.3 judge a record differently, every scan and the recovery walk follow the store's line.

CommitLog.checkMessageAndReturnSize: 4.9.8 knows one message magic (V1), so a V2 record is an illegal magic
(-1) and recovery truncates there; 5.3.3 checks ``remaining < totalSize - 4`` before the magic, so an
end-of-file blank record longer than the rest of its file is -1 and recovery truncates there, deleting every
later segment, where 4.9.8 takes it as the blank (0) and goes on with the next file. A line nothing told
(the 4.x default) keeps 4.9.8's blank rule and reads V2 records, which only 5.x writes.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pyarrow as pa

from storelib.broker.recovery.walk import rebuild_target, recovery_walk
from storelib.broker.settings.store import Store, load_settings
from storelib.fileio.bytesource import resolve
from storelib.format.record import BLANK_MAGIC, check_record, encode_message
from tests.conftest import run_cli

SEG = 524288  # both samples: four 512 KiB segments


def _store(root: Path, version: str | None = None) -> Store:
    loc = resolve(str(root))
    return Store(loc, load_settings(None, version, None, loc))


def _table(store: Store, ends: list | None = None) -> pa.Table:
    return pa.Table.from_batches(list(store.scan(columns=["phy_offset", "magic_version"], verify_crc=False,
                                                 ends=ends)))


def _forge_v2(root: Path, segment: int, nth: int) -> int:
    """Rewrite the ``nth`` record of a segment as a V2 record of the same size (2-byte topic length, one
    body byte less, its CRCs recomputed): the size chain and everything after it stay intact."""
    store = _store(root, "5")
    phys = [p for p in _table(store).column("phy_offset").to_pylist() if segment * SEG <= p < (segment + 1) * SEG]
    phy = phys[nth]
    path = root / "commitlog" / f"{segment * SEG:020d}"
    buf = bytearray(path.read_bytes())
    pos = phy - segment * SEG
    chk = check_record(buf, pos)
    m = chk.message
    assert m is not None and m.magic_version == 1 and len(m.body) > 1
    m.magic_version, m.body, m.body_crc = 2, m.body[:-1], None
    rec = encode_message(m)
    assert len(rec) == chk.size
    buf[pos:pos + len(rec)] = rec
    path.write_bytes(bytes(buf))
    return phy


def test_a_forged_v2_record_ends_the_4x_walk_there_and_an_untold_line_reads_it(sample_498, tmp_path, capsys):
    root = tmp_path / "store"
    shutil.copytree(sample_498 / "store", root)
    clean = recovery_walk(_store(root))
    phy = _forge_v2(root, 2, 5)  # past the prefix detection reads: nothing tells the line
    auto, told = _store(root), _store(root, "4")
    assert auto.settings.line.source == "default" and told.settings.line.source == "option"

    # untold: the V2 record is read (only 5.x writes one), as before
    t = _table(auto)
    assert t.num_rows == 2000 and t.column("magic_version").to_pylist().count(2) == 1
    assert recovery_walk(auto).process_offset == clean.process_offset and recovery_walk(auto).failure is None

    # 4.x told: the segment's scan ends at the V2 record (-1: illegal magic); the next segment is read
    ends: list = []
    phys = _table(told, ends).column("phy_offset").to_pylist()
    assert phy not in phys and not [p for p in phys if phy < p < 3 * SEG] and max(phys) > 3 * SEG
    e = ends[2]
    assert (e.kind, e.reason, e.phy_offset) == ("invalid", "bad_magic", phy) and "V2" in e.detail

    # ... and the 4.9.8 recovery walk (normal: third-last segment on) ends there: the rest of the segment
    # is cut and the last segment deleted
    r = recovery_walk(told)
    assert (r.process_offset, r.failure.reason, r.truncate, r.delete_segments) == (
        phy, "bad_magic", (2 * SEG, phy - 2 * SEG), (3 * SEG,))
    rc, out, _ = run_cli(capsys, "recover", root, "--broker-version", "4", "--json", "--plan-file", "-")
    plan = json.loads(out)["commitlog"]
    assert rc == 1 and plan["process_offset"] == phy and plan["failure"]["reason"] == "bad_magic"
    assert plan["delete_segments"] == [f"{3 * SEG:020d}"]
    rc, out, _ = run_cli(capsys, "messages", root, "--broker-version", "4", "--format", "jsonl")
    assert len(out.splitlines()) == len(phys)
    # the data source: a reader that resynchronises past bad records drops just that one under 4.x rules
    from datasources.commitlog_reader import read_messages

    assert read_messages(str(root), columns=["phy_offset"]).num_rows == 2000
    dropped = read_messages(str(root), brokerVersion="4", mode="DROPMALFORMED", columns=["phy_offset"])
    assert dropped.num_rows == 1999 and phy not in dropped.column("phy_offset").to_pylist()


def test_a_v2_record_in_a_dledger_entry_ends_the_4x_scan(sample_dledger, tmp_path):
    """DLedgerCommitLog.checkMessageAndReturnSize (4.9.8) judges an entry's record by CommitLog's check."""
    from storelib.format.dledger.entries import BODY_OFFSET

    root = tmp_path / "store"
    shutil.copytree(sample_dledger / "store", root)
    store = _store(root, "5")
    seg = store.commitlog.segments[0]
    phys = _table(store).column("phy_offset").to_pylist()
    phy = phys[7]
    buf = bytearray(Path(seg.path).read_bytes())
    pos = phy - seg.base
    chk = check_record(buf, pos)
    m = chk.message
    m.magic_version, m.body, m.body_crc = 2, m.body[:-1], None
    buf[pos:pos + chk.size] = encode_message(m)
    Path(seg.path).write_bytes(bytes(buf))
    ends: list = []
    assert _table(_store(root, "5")).num_rows == len(phys)
    told = _table(_store(root, "4"), ends).column("phy_offset").to_pylist()
    assert [p for p in told if p < seg.base + seg.file_size] == phys[:7] and (ends[0].kind, ends[0].reason, ends[0].file_offset) == (
        "invalid", "bad_magic", pos - BODY_OFFSET)


def _oversized_blank(root: Path) -> tuple[int, int]:
    """Make the end-of-file blank record of segment 0 claim one byte more than the file has left; its
    (file offset, TOTALSIZE)."""
    ends: list = []
    _table(_store(root, "5"), ends)
    at = ends[0].file_offset
    assert ends[0].kind == "blank"
    path = root / "commitlog" / f"{0:020d}"
    buf = bytearray(path.read_bytes())
    total, magic = struct.unpack_from(">ii", buf, at)
    assert magic == BLANK_MAGIC and total == SEG - at
    struct.pack_into(">i", buf, at, total + 1)
    path.write_bytes(bytes(buf))
    return at, total + 1


def test_an_oversized_blank_ends_the_5x_walk_and_recovery_deletes_every_later_segment(sample_533, tmp_path, capsys):
    root = tmp_path / "store"
    shutil.copytree(sample_533 / "store", root)
    clean_rows = _table(_store(root)).num_rows
    at, total = _oversized_blank(root)
    store = _store(root)
    assert store.settings.line.source == "store" and store.settings.line.version == "5"

    ends: list = []
    t = _table(store, ends)
    e = ends[0]
    assert (e.kind, e.reason, e.file_offset, e.size) == ("invalid", "bad_size", at, None)
    assert f"TOTALSIZE {total}" in e.detail and t.num_rows == clean_rows  # the later segments still read
    # 5.3.3's recovery from the first segment (an empty consume queue: a rebuild) stops at the blank:
    # processOffset is there, segment 0 is cut to it and every later segment deleted (truncateDirtyFiles)
    r = rebuild_target(store)
    assert (r.process_offset, r.failure.reason, r.truncate, r.delete_segments) == (
        at, "bad_size", (0, at), (SEG, 2 * SEG, 3 * SEG))
    assert sum(d.end - d.start for d in r.dispatch) == at
    # an abnormal start (abort file; no first record old enough: the first segment) does the same
    (root / "abort").write_bytes(b"")
    rc, out, _ = run_cli(capsys, "recover", root, "--json", "--plan-file", "-")
    plan = json.loads(out)
    in_first = sum(1 for p in t.column("phy_offset").to_pylist() if p < SEG)
    assert rc == 1 and plan["commitlog"]["process_offset"] == at and plan["commitlog"]["failure"]["reason"] == "bad_size"
    assert plan["commitlog"]["delete_segments"] == [f"{b * SEG:020d}" for b in (1, 2, 3)]
    assert plan["lost"]["totals"]["messages"] == clean_rows - in_first
    (root / "abort").unlink()
    # the audit names the lost end of the segment instead of a blank record warning
    rc, out, _ = run_cli(capsys, "audit", root, "--quiet", "--json")
    found = [f for f in json.loads(out)["findings"] if f["file"] == f"commitlog/{0:020d}"]
    assert rc == 1 and [f["offset"] for f in found if "bad_size" in f["detail"]] == [at]
    assert not [f for f in found if f["kind"] == "bad_blank_record"]


def test_4x_and_an_untold_line_take_an_oversized_blank_as_the_blank(sample_498, tmp_path):
    """4.9.8 reads the magic first: the blank is the end of the file whatever its size, and the walk goes on."""
    root = tmp_path / "store"
    shutil.copytree(sample_498 / "store", root)
    end = rebuild_target(_store(root)).process_offset
    at, _ = _oversized_blank(root)
    for version, kind, process_offset in ((None, "blank", end), ("4", "blank", end), ("5", "invalid", at)):
        store = _store(root, version)
        ends: list = []
        assert _table(store, ends).num_rows == 2000 and ends[0].kind == kind
        assert rebuild_target(store).process_offset == process_offset


def test_the_abnormal_start_probe_takes_the_magics_of_the_line():
    """isMappedFileMatchedRecover: 4.9.8 matches a file whose first record is V1 only, 5.3.3 V1 or V2; an
    untold line judges a V2 first record as its scans do (5.x evidence)."""
    from storelib.broker.recovery.walk import RecoveryInputs, plan_recovery
    from storelib.format.checkpoint import Checkpoint
    from storelib.format.record import MAGIC_V2
    from storelib.scan.commitlog import Segment

    segs = [Segment(i * SEG, f"{i * SEG:020d}", resolve("/nonexistent"), SEG) for i in range(3)]
    cp = Checkpoint(10**12, 10**12, 10**12)
    starts = {}
    for version, told in (("4", True), ("4", False), ("5", True)):
        inputs = RecoveryInputs(version=version, version_told=told, last_exit_ok=False, checkpoint=cp,
                                segment_size=SEG)
        starts[(version, told)] = plan_recovery(inputs, segs, probe=lambda s: (MAGIC_V2, 1000)).start_index
    assert starts == {("4", True): 0, ("4", False): 2, ("5", True): 2}
