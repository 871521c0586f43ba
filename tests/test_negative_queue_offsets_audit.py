"""Queues whose QUEUEOFFSETs are negative, audited: the writer's slot model tells a unit at queue offset -1
from a record it drops (NO_SLOT), and the streamed checks settle such a queue themselves (no valid unit is
None, not -1), with the report of the whole view and of the partitioned tasks."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import storelib.checks.crossfile as crossfile
from jobs.audit import audit_store
from jobs.cli import main
from storelib.broker.dispatch.cqwriter import NO_SLOT
from storelib.broker.index.lookup import lookup_queue
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.cqload import LoadedQueue
from storelib.broker.settings.store import Store
from storelib.broker.settings.storeinfo import collect
from storelib.broker.startup.cqrecovery import QueueReplay, writer_slots_of
from storelib.broker.writer.writer import StoreWriter
from storelib.checks.queuestream import load_queue_meta, queue_meta_snapshot
from storelib.errors import StoreError
from storelib.format.consumequeue import CQ_DTYPE, CQ_UNIT_SIZE, as_location, file_name
from storelib.format.record import Message

from .test_audit import _comparable
from .test_audit_partitioned import NOW, _same

SMALL = {"mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 200}  # ten units a file
FAR = -(1 << 56) // 10 * 10  # a file start far below 0


def queue_with_offsets(root: Path, qos: list[int], version: str = "4") -> Path:
    """Messages of queue T/0 whose QUEUEOFFSETs are patched to ``qos``, the consume queue rebuilt by
    ``rmqstore rebuild --in-place`` (the broker's dispatch)."""
    s = BrokerSettings.defaults(version).with_overrides(SMALL)
    with StoreWriter(root, s, clock=lambda: 1_700_000_000_000) as w:
        res = [w.append(Message("T", b"x" * 100, 0)) for _ in qos]
        w.close(clean=True, dispatch=False)
    (root / "broker.conf").write_text("".join(f"{k}={v}\n" for k, v in SMALL.items()))
    seg = root / "commitlog" / f"{0:020d}"
    b = bytearray(seg.read_bytes())
    for r, q in zip(res, qos):
        b[r.phy_offset + 20:r.phy_offset + 28] = struct.pack(">q", q)
    seg.write_bytes(bytes(b))
    assert main(["rebuild", str(root), "--in-place", "--broker-conf", str(root / "broker.conf"),
                 "--broker-version", version, "--quiet"]) == 0
    return root


def zero_units_from(root: Path, keep: int) -> None:
    """Every unit of T/0 after its first ``keep`` zeroed (the reput had not written them yet)."""
    files = sorted((root / "consumequeue" / "T" / "0").iterdir(), key=lambda p: int(p.name))
    seen = 0
    for f in files:
        b = bytearray(f.read_bytes())
        for j in range(len(b) // CQ_UNIT_SIZE):
            if seen >= keep:
                b[j * CQ_UNIT_SIZE:(j + 1) * CQ_UNIT_SIZE] = bytes(CQ_UNIT_SIZE)
            seen += 1
        f.write_bytes(bytes(b))


def streamed_and_whole(root: Path, monkeypatch) -> tuple[dict, dict]:
    kw = {"broker_conf": str(root / "broker.conf"), "quiet": True, "now_ms": NOW, "cross": "driver"}
    streamed = audit_store(str(root), **kw)
    with monkeypatch.context() as m:
        m.setattr(crossfile, "streamable", lambda store, results: False)
        whole = audit_store(str(root), **kw)
    return streamed, whole


def lag(rep: dict) -> list[tuple[str, int]]:
    return [(f["file"], f["extra"]["count"]) for f in rep["findings"] if f["kind"] == "queue_behind_commitlog"]


def test_writer_slots_tell_a_unit_at_queue_offset_minus_1_from_a_dropped_record():
    """A new queue whose first QUEUEOFFSET, -11, is not a file start: putMessagePositionInfo creates the file at
    -10 (Java's remainder rounds toward 0), drops -11 as a repeat and writes -10..-2 in place and the jump to 7
    at -1 (4.9.8 ConsumeQueue.java :478-530): the dropped one is NO_SLOT, the slid one -1."""
    q = np.array([-11, *range(-10, -1), 7], np.int64)
    P = 1000 * np.arange(1, len(q) + 1, dtype=np.int64)
    none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    got = writer_slots_of(P, np.full(len(q), 90, np.int64), q, np.ones(len(q), bool), none, None, 200)
    assert got.tolist() == [NO_SLOT, *range(-10, -1), -1]
    assert got[0] != got[-1]  # "dropped" is no unit's queue offset


def test_record_the_writer_puts_at_queue_offset_minus_1_lags_when_its_unit_is_not_written(tmp_path, monkeypatch):
    """QUEUEOFFSETs -10..-2 then 7: the broker writes 7's unit at -1. With that unit not written yet the record
    is lag (the whole view used to take its slot -1 for "dropped" and say nothing); every audit says so."""
    root = queue_with_offsets(tmp_path / "s", [*range(-10, -1), 7])
    zero_units_from(root, 9)
    streamed, whole = streamed_and_whole(root, monkeypatch)
    assert whole["run"]["cross_check_mode"].startswith("whole view")
    assert lag(whole) == [("consumequeue/T/0", 1)]
    assert _comparable(streamed) == _comparable(whole)
    _same(root, monkeypatch, broker_conf=str(root / "broker.conf"))


def test_streamed_audit_settles_negative_queue_without_a_unit_yet(tmp_path, monkeypatch):
    """Queues of negative QUEUEOFFSETs (ending at -1, or far below 0) whose files hold no valid unit yet: the
    streamed checks take them as all lag (they used to read "no unit" as a unit at -1, find it differs and
    hand the store to the whole view), with the whole view's and the partitioned audit's report."""
    for name, qos in (("minus1", list(range(-10, 0))), ("far", [FAR, FAR + 1, FAR + 2])):
        root = queue_with_offsets(tmp_path / name, qos)
        zero_units_from(root, 0)
        streamed, whole = streamed_and_whole(root, monkeypatch)
        assert streamed["run"]["cross_check_mode"] == "streamed", name
        assert lag(streamed) == [("consumequeue/T/0", len(qos))], name
        assert _comparable(streamed) == _comparable(whole), name
        ref, parted = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"))
        assert "(0 by the whole view" in parted["run"]["cross_check_mode"], name


# --- several negative files: the order the broker maps them in ------------------------------------------------


def test_audit_and_info_say_the_broker_never_serves_a_negative_file_below_the_first_one_mapped(tmp_path,
                                                                                           monkeypatch):
    """QUEUEOFFSETs -20..1: the rebuild writes -400, -200 and 0 (putMessagePositionInfo rolls on from -400);
    doLoad maps -200 first, so the broker's queue (4.9.8 correctMinOffset over that file) starts at -10, a lookup
    below it is out of range and findMappedFileByOffset finds no file below -200: the audit names -400 as
    never served, not as a gap or overlap of the file sequence, in every mode."""
    root = queue_with_offsets(tmp_path / "s", list(range(-20, 2)))
    streamed, whole = streamed_and_whole(root, monkeypatch)
    assert streamed["run"]["cross_check_mode"] == "streamed"
    serious = [(f["kind"], f["file"].rsplit("/", 1)[-1]) for f in whole["findings"] if f["severity"] != "info"]
    assert serious == [("negative_file_unreachable", "-00000000000000000400")]
    assert _comparable(streamed) == _comparable(whole)
    _same(root, monkeypatch, broker_conf=str(root / "broker.conf"))
    store = Store(str(root), broker_conf=str(root / "broker.conf"))
    info = collect(store, scan=False)
    (q0,) = [q for q in info["queues"] if q["topic"] == "T"]
    assert (q0["cq_min_offset"], q0["cq_max_offset"]) == (-10, 2)
    assert [f["kind"] for f in info["findings"] if f["severity"] == "error"] == ["negative_file_unreachable"]
    with pytest.raises(StoreError) as e:
        lookup_queue(store, "T", 0, -20)
    assert e.value.kind == "offset_out_of_range"


def test_recovery_ending_in_the_lower_negative_file_deletes_the_first_one_mapped(tmp_path):
    """-200 full, -400 with three valid units, then 0: ConsumeQueue.recover walks the files in load order
    (-200, -400, 0), ends at -340 and truncateDirtyFiles (4.9.8 MappedFileQueue.java:105-123) deletes every file
    starting above it, -200 and 0 included: -400 is then the first file mapped and served, no file is out of
    reach and the sequence (by offset) has no gap."""
    d = tmp_path / "q"
    d.mkdir()
    units = np.zeros(10, CQ_DTYPE)
    for base, valid in ((-400, 3), (-200, 10), (0, 10)):
        units["phy_offset"], units["size"] = 1000 + base + np.arange(10), np.where(np.arange(10) < valid, 50, 0)
        (d / file_name(base)).write_bytes(units.tobytes())
    cq = LoadedQueue(d, segment_size=200)
    assert cq.recover().end == -340
    gone = [f.file.rsplit("/", 1)[-1] for f in cq.findings if f.kind == "segment_after_end"]
    assert gone == [file_name(-200), file_name(0)]
    assert [f.kind for f in cq.findings if f.severity == "error"] == []


def _negative_files(root: Path, bases: tuple[int, ...]) -> LoadedQueue:
    """Full files of T/0 at ``bases`` (units pointing at 1000 + their queue offset), in a store at ``root``."""
    d = root / "consumequeue" / "T" / "0"
    d.mkdir(parents=True)
    units = np.zeros(10, CQ_DTYPE)
    for base in bases:
        units["phy_offset"], units["size"] = 1000 + base // CQ_UNIT_SIZE + np.arange(10), 1
        (d / file_name(base)).write_bytes(units.tobytes())
    return LoadedQueue(d, segment_size=200)


def test_start_up_replay_takes_first_and_last_mapped_file_in_load_order(tmp_path):
    """recover --plan's queue model keeps the broker's mappedFiles list order: correctMinOffset reads the first
    file of the list (4.9.8 ConsumeQueue.java:343-344: -200, not -400), truncateDirtyLogicFiles the last
    (:228-235: -400 when no file 0 follows), so the min is -10 and a truncation that keeps every unit ends the
    queue at -400's end, -10 (getMaxOffset: the last file's start + its write position)."""
    loc = as_location(str(tmp_path / "a"))
    replay = QueueReplay("T", 0, loc, 200, _negative_files(tmp_path / "a", (-400, -200, 0)))
    assert replay.finish(0).final_min_offset == -10
    replay = QueueReplay("T", 0, as_location(str(tmp_path / "b")), 200, _negative_files(tmp_path / "b", (-400, -200)))
    replay.truncate(1 << 40)
    assert replay.max_offset() == -10


def test_negative_queue_summary_is_carried_to_the_next_incremental_run(tmp_path):
    """A queue whose last valid unit is at -1 (or further below 0) has one: its summary goes into the state, so
    ``audit --since`` does not read its units again (a last valid -1 used to read as "none": not carried)."""
    for name, qos in (("minus1", list(range(-10, 0))), ("far", [FAR, FAR + 1, FAR + 2])):
        root = queue_with_offsets(tmp_path / name, qos)
        meta = load_queue_meta(as_location(str(root)), BrokerSettings.defaults("4").with_overrides(SMALL), 0)
        try:
            snap = queue_meta_snapshot(meta)
        finally:
            meta.close()
        assert snap["0/T"]["units"]["last_valid"] == qos[-1], name
