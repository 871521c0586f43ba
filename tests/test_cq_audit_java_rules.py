"""The audit judges consume queues by the broker's own rules (ConsumeQueue.putMessagePositionInfo and the
start-up order of 4.9.8 and 5.3.3): what a broker really writes is no error, real damage still is, and
every engine gives the same report."""

from __future__ import annotations

import struct
from itertools import count
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from jobs.audit import audit_store
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.broker.startup import recoverapply as ra
from storelib.broker.writer.writer import StoreWriter
from storelib.format.consumequeue import CQ_DTYPE
from storelib.format.record import Message

from .test_audit import _comparable
from .test_audit_partitioned import _same

SMALL = {"mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 200}
NOW = 1_800_000_000_000


def _conf(root: Path, extra: str = "") -> str:
    p = root / "broker.conf"
    p.write_text("\n".join(f"{k}={v}" for k, v in SMALL.items()) + "\n" + extra)
    return str(p)


def _audit(root: Path, version: str, **kw) -> dict:
    return audit_store(str(root), broker_conf=str(root / "broker.conf"), version=version, quiet=True, now_ms=NOW,
                       **kw)


def _serious(rep: dict) -> list[tuple[str, str | None, int | None]]:
    return [(f["kind"], f["file"], f["offset"]) for f in rep["findings"]
            if f["severity"] in ("warning", "error", "critical")]


def _units(root: Path, topic: str, qid: int) -> tuple[Path, np.ndarray]:
    f = root / "consumequeue" / topic / str(qid) / f"{0:020d}"
    return f, np.frombuffer(f.read_bytes(), CQ_DTYPE)


# --- A: 4.9.8 recovers before the delay table is loaded -----------------------------------------


def _crashed_delay_store(root: Path, version: str = "4") -> Path:
    """Three DELAY=3 messages dispatched, three more not, the abort file left (t_delay.py)."""
    s = BrokerSettings.defaults(version).with_overrides(SMALL)
    c = count(1_700_000_000_000, 10)
    with StoreWriter(root, s, clock=lambda: next(c)) as w:
        for _ in range(3):
            w.append(Message("T", b"x" * 100, 0, properties={"TAGS": "a", "DELAY": "3"}))
        w.dispatch()
        for _ in range(3):
            w.append(Message("T", b"x" * 100, 0, properties={"TAGS": "a", "DELAY": "3"}))
        w.close(clean=False)
    _conf(root)
    return root


def test_498_delay_units_written_by_an_abnormal_recovery_are_no_mismatch(tmp_path, monkeypatch):
    root = _crashed_delay_store(tmp_path / "s")
    ra.apply(Store(str(root), broker_conf=str(root / "broker.conf")), str(tmp_path / "bk"))
    f, u = _units(root, "SCHEDULE_TOPIC_XXXX", 2)
    assert u["tags_code"][3:6].tolist() == [97, 97, 97]  # the TAGS hash: what our recover (and 4.9.8) wrote
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="4")
    assert _serious(ref) == []
    pool = _audit(root, "4", engine="pool", workers=2)
    assert _comparable(pool) == _comparable(ref)


def test_498_delay_unit_with_neither_tags_code_is_still_a_mismatch(tmp_path, monkeypatch):
    root = _crashed_delay_store(tmp_path / "s")
    ra.apply(Store(str(root), broker_conf=str(root / "broker.conf")), str(tmp_path / "bk"))
    f, u = _units(root, "SCHEDULE_TOPIC_XXXX", 2)
    b = bytearray(f.read_bytes())
    b[4 * 20 + 12:4 * 20 + 20] = struct.pack(">q", 98)  # neither the delivery time nor the TAGS hash
    f.write_bytes(bytes(b))
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="4")
    (m,) = [x for x in ref["findings"] if x["kind"] == "cq_entry_mismatch"]
    assert (m["offset"], m["extra"]["queue_offset"]) == (80, 4) and "tagsCode 98" in m["detail"]


def test_5x_delay_unit_with_the_tags_hash_is_a_mismatch(tmp_path):
    """5.x loads the delay table before it recovers: only the delivery time is right."""
    root = tmp_path / "s"
    s = BrokerSettings.defaults("5").with_overrides(SMALL)
    with StoreWriter(root, s, clock=lambda: 1_700_000_000_000) as w:
        for _ in range(3):
            w.append(Message("T", b"x" * 100, 0, properties={"TAGS": "a", "DELAY": "3"}))
        w.close(clean=True)
    _conf(root, "enabledAppendPropCRC=true\n")
    f, u = _units(root, "SCHEDULE_TOPIC_XXXX", 2)
    b = bytearray(f.read_bytes())
    b[20 + 12:20 + 20] = struct.pack(">q", 97)
    f.write_bytes(bytes(b))
    rep = _audit(root, "5")
    assert [(k, o) for k, _f, o in _serious(rep)] == [("cq_entry_mismatch", 20)]


# --- B: the writer puts a record in the queue's next unit whatever its QUEUEOFFSET --------------


def _offsets_store(root: Path, mode: str) -> Path:
    """Eight records of T/0 with their QUEUEOFFSETs rewritten (t_gap.py), dispatched by our rebuild (which is
    putMessagePositionInfo): ``gap`` 0,1,2,5..9; ``zero`` 0,1,2,3,0,1,2,3."""
    from storelib.broker.dispatch.dispatch import dispatch_store

    s = BrokerSettings.defaults("4").with_overrides(SMALL)
    c = count(1_700_000_000_000, 10)
    with StoreWriter(root, s, clock=lambda: next(c)) as w:
        res = [w.append(Message("T", b"x" * 100, 0, properties={"TAGS": "a"})) for _ in range(8)]
        w.close(clean=True, dispatch=False)
    seg = root / "commitlog" / f"{0:020d}"
    b = bytearray(seg.read_bytes())
    new = {"gap": [0, 1, 2, 5, 6, 7, 8, 9], "zero": [0, 1, 2, 3, 0, 1, 2, 3]}[mode]
    for r, q in zip(res, new):
        b[r.phy_offset + 20:r.phy_offset + 28] = struct.pack(">q", q)
    seg.write_bytes(bytes(b))
    dispatch_store(root, s)
    _conf(root)
    return root


def test_queue_offset_jump_is_the_brokers_warning_and_its_units_are_no_mismatch(tmp_path, monkeypatch):
    root = _offsets_store(tmp_path / "s", "gap")
    _f, u = _units(root, "T", 0)
    assert len(np.flatnonzero(u["size"] > 0)) == 8  # the records at slots 0..7, as the broker writes them
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="4")
    (gap,) = [f for f in ref["findings"] if f["severity"] != "info"]
    assert (gap["kind"], gap["severity"], gap["file"], gap["offset"]) == \
        ("queue_offset_gap", "warning", f"commitlog/{0:020d}", 594)
    assert "order maybe wrong" in gap["detail"]
    (q,) = ref["queues"] if isinstance(ref["queues"], list) else ref["queues"].values()
    assert q["lag"] == 0


def test_a_wrong_unit_after_a_queue_offset_jump_is_still_a_mismatch(tmp_path, monkeypatch):
    root = _offsets_store(tmp_path / "s", "gap")
    f, u = _units(root, "T", 0)
    b = bytearray(f.read_bytes())
    b[6 * 20:7 * 20], b[7 * 20:8 * 20] = b[7 * 20:8 * 20], b[6 * 20:7 * 20]  # the last two units swapped
    f.write_bytes(bytes(b))
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="4")
    bad = [(x["kind"], x["offset"]) for x in ref["findings"] if x["severity"] == "error"]
    assert bad == [("cq_entry_mismatch", 120), ("cq_entry_mismatch", 140)]
    details = " ".join(x["detail"] for x in ref["findings"] if x["kind"] == "cq_entry_mismatch")
    assert "QUEUEOFFSET 9 (the broker's writer puts it at 7)" in details


def test_queue_offset_reset_to_zero_takes_the_next_unit(tmp_path, monkeypatch):
    """QUEUEOFFSET 0 is written wherever the queue is (no repeat check); the later 1, 2, 3 are repeats the
    writer drops: the reset stays an error (messages lost), its unit is no mismatch."""
    root = _offsets_store(tmp_path / "s", "zero")
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="4")
    assert [(x["kind"], x["offset"]) for x in ref["findings"] if x["severity"] != "info"] == \
        [("queue_offset_backwards", 792)]


def _skipped_store(root: Path, version: str = "4") -> tuple[Path, int]:
    """A master's reput skipped the rest of segment 0 after a record with a zeroed magic (t_skip.py)."""
    from storelib.broker.dispatch.dispatch import dispatch_store

    conf = {"mappedFileSizeCommitLog": 8192, "mappedFileSizeConsumeQueue": 200, "maxHashSlotNum": 16,
            "maxIndexNum": 24}
    s = BrokerSettings.defaults(version).with_overrides(conf)
    with StoreWriter(root, s, clock=lambda: 1_700_000_000_000) as w:
        res = [w.append(Message("T", b"x" * 1500, 0)) for _ in range(30)]
        w.close(clean=True, dispatch=False)
    seg0 = root / "commitlog" / f"{0:020d}"
    b = bytearray(seg0.read_bytes())
    b[res[1].phy_offset + 4:res[1].phy_offset + 8] = b"\0\0\0\0"
    seg0.write_bytes(bytes(b))
    assert [f.kind for f in dispatch_store(root, s).findings] == ["reput_skipped_rest_of_segment"]
    (root / "broker.conf").write_text("\n".join(f"{k}={v}" for k, v in conf.items())
                                      + ("\nenabledAppendPropCRC=true\n" if version == "5" else ""))
    return root, res[2].phy_offset  # the first record the reput skipped


@pytest.mark.parametrize("version", ["4", "5"])
def test_master_reput_skip_leaves_the_rest_of_the_segment_undispatched_and_later_units_slide(tmp_path, monkeypatch,
                                                                                            version):
    """DefaultMessageStore.doReput on a master (4.9.8 and 5.3.3) adds the rest of the buffer after a record it
    cannot decode: those records get no unit (the broker's warning), later ones take their slots."""
    root, first = _skipped_store(tmp_path / "s", version)
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version=version)
    kinds = [(x["kind"], x["offset"]) for x in ref["findings"] if x["severity"] != "info"
             and x["kind"].startswith(("cq_", "queue_"))]
    assert kinds == [("cq_reput_skipped", first)]
    assert "3 message(s) from queue offset 2" in [x for x in ref["findings"] if x["kind"] == "cq_reput_skipped"][0][
        "detail"]


# --- C: a 5.3.3 normal start never dispatches the record at the queues' max physical offset -----


def _lagging_store(root: Path, version: str) -> Path:
    """Three records dispatched, three more not, a clean shutdown (t_lag5.py)."""
    s = BrokerSettings.defaults(version).with_overrides(SMALL)
    c = count(1_700_000_000_000, 10)
    with StoreWriter(root, s, clock=lambda: next(c)) as w:
        for _ in range(3):
            w.append(Message("T", b"x" * 100, 0, properties={"TAGS": "a"}))
        w.dispatch()
        for _ in range(3):
            w.append(Message("T", b"x" * 100, 0, properties={"TAGS": "a"}))
        w.close(clean=True, dispatch=False)
    _conf(root, "enabledAppendPropCRC=true\n" if version == "5" else "")
    return root


def test_5x_lag_finding_names_the_record_a_normal_start_never_dispatches(tmp_path, monkeypatch):
    root = _lagging_store(tmp_path / "s", "5")
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="5")
    (lag,) = [f for f in ref["findings"] if f["severity"] != "info"]
    assert lag["kind"] == "queue_behind_commitlog" and lag["extra"]["never_dispatched"] == 597
    assert "dispatches the 2 after phy 597" in lag["detail"] and "(queue offset 3) is never dispatched" in lag["detail"]
    pool = _audit(root, "5", engine="pool", workers=2)
    assert _comparable(pool) == _comparable(ref)


def test_498_lag_finding_says_the_reput_dispatches_them_all(tmp_path, monkeypatch):
    root = _lagging_store(tmp_path / "s", "4")
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="4")
    (lag,) = [f for f in ref["findings"] if f["severity"] != "info"]
    assert "the broker dispatches them on start (reput from 594)" in lag["detail"]  # V1 records: 198 bytes
    assert "never_dispatched" not in lag["extra"]


@pytest.mark.parametrize("version", ["4", "5"])
def test_the_record_the_lag_finding_says_is_never_dispatched_is_the_one_the_recovery_walk_skips(tmp_path, version):
    """One rule (walkplan.recovery_dispatch_after) for the audit's never_dispatched and the start-up walk's
    dispatch bound: 5.3.3 dispatches only records strictly above the queues' max physical offset, so the one
    starting there is never dispatched; 4.9.8 reputs from it (no bound, nothing skipped)."""
    from storelib.broker.startup.startup import simulate
    from storelib.checks.queues import load_consume_queues

    root = _lagging_store(tmp_path / "s", version)
    store = Store(str(root), broker_conf=str(root / "broker.conf"))
    never = load_consume_queues(store.loc, store.settings, 0).never_dispatched()
    bounds = {d.after for d in simulate(store).walk.dispatch}
    assert (never, bounds) == ((597, {597}) if version == "5" else (-1, {None}))


def test_5x_after_recovery_the_skipped_record_is_the_one_named_missing(tmp_path, monkeypatch):
    root = _lagging_store(tmp_path / "s", "5")
    ra.apply(Store(str(root), broker_conf=str(root / "broker.conf")), str(tmp_path / "bk"))
    _f, u = _units(root, "T", 0)
    assert u["phy_offset"][:5].tolist() == [0, 199, 398, 796, 995]  # 597 never dispatched, as 5.3.3 does
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="5")
    (m,) = [f for f in ref["findings"] if f["severity"] != "info"]
    assert (m["kind"], m["severity"], m["file"], m["offset"]) == \
        ("cq_entries_missing_for_messages", "error", f"commitlog/{0:020d}", 597)
    assert "1 message(s) from queue offset 3 (phy 597)" in m["detail"]


# --- D: 5.3.3's correctMinOffset sets a fully expired queue's min offset to its max ---------------


def _expired_queue_store(root: Path, version: str) -> Path:
    """Queue A's three records all in the first commitlog segment, which is then deleted (t_min.py)."""
    import os

    small = {"mappedFileSizeCommitLog": 4096, "mappedFileSizeConsumeQueue": 200}
    s = BrokerSettings.defaults(version).with_overrides(small)
    c = count(1_700_000_000_000, 10)
    with StoreWriter(root, s, clock=lambda: next(c)) as w:
        for _ in range(3):
            w.append(Message("A", b"x" * 100, 0))
        for _ in range(40):
            w.append(Message("B", b"y" * 300, 0))
        w.close(clean=True)
    os.remove(root / "commitlog" / f"{0:020d}")
    (root / "broker.conf").write_text("\n".join(f"{k}={v}" for k, v in small.items()) + "\n"
                                      + ("enabledAppendPropCRC=true\n" if version == "5" else ""))
    return root


def _min_a(version: str, root: Path, monkeypatch) -> tuple[int, int, int]:
    """Queue A's min offset as the audit (every path), ``info`` and the queue lookup's range see it."""
    from storelib.broker.index.lookup import lookup_queue
    from storelib.broker.settings.storeinfo import collect
    from storelib.errors import StoreError

    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version=version)
    (q,) = [q for q in ref["queues"] if q["topic"] == "A"]
    store = Store(str(root), broker_conf=str(root / "broker.conf"))
    assert store.settings.version == version
    (i,) = [q for q in collect(store, scan=False)["queues"] if q["topic"] == "A"]
    with pytest.raises(StoreError) as e:
        lookup_queue(store, "A", 0, 3)
    return q["min_offset"], i["cq_min_offset"], int(e.value.detail.split("[")[1].split(",")[0])


def test_5x_fully_expired_queue_min_offset_is_its_max(tmp_path, monkeypatch):
    assert _min_a("5", _expired_queue_store(tmp_path / "s", "5"), monkeypatch) == (3, 3, 3)


def test_498_fully_expired_queue_min_offset_stays_0(tmp_path, monkeypatch):
    assert _min_a("4", _expired_queue_store(tmp_path / "s", "4"), monkeypatch) == (0, 0, 0)


def test_start_up_model_min_offset_follows_the_line(tmp_path):
    """QueueReplay (recover's model of one queue) gives the line's correctMinOffset when told the line."""
    from storelib.broker.settings.cqload import LoadedQueue, min_variant
    from storelib.broker.startup.cqrecovery import QueueReplay

    root = _expired_queue_store(tmp_path / "s", "5")
    cq = LoadedQueue(root / "consumequeue" / "A" / "0", segment_size=200)
    rep = QueueReplay("A", 0, Store(str(root), broker_conf=str(root / "broker.conf")).loc, 200, cq)
    assert rep.min_offset(4096, min_variant("5")) == 3 and rep.min_offset(4096, min_variant("4")) == 0


# --- F: a negative QUEUEOFFSET starts a queue in a file with a negative name ----------------------


def test_negative_queue_offset_rebuilds_into_the_negative_file_java_names_and_other_queues_go_on(tmp_path):
    """putMessagePositionInfo creates the file at the negative offset (UtilAll.offset2FileName: NumberFormat,
    a minus sign before 20 digits), drops that record as a repeat (its offset is below the file's start) and
    writes the queue's later units into that file after a filler (t_neg.py). The rebuild used to stop for
    every queue."""
    from storelib.broker.dispatch.dispatch import dispatch_store

    root = tmp_path / "s"
    s = BrokerSettings.defaults("4").with_overrides(SMALL)
    with StoreWriter(root, s, clock=lambda: 1_700_000_000_000) as w:
        res = [w.append(Message("T", b"x" * 100, i % 2)) for i in range(6)]
        w.close(clean=True, dispatch=False)
    seg = root / "commitlog" / f"{0:020d}"
    b = bytearray(seg.read_bytes())
    b[res[0].phy_offset + 20:res[0].phy_offset + 28] = struct.pack(">q", -(1 << 56))
    seg.write_bytes(bytes(b))
    dispatch_store(root, s)
    q0 = root / "consumequeue" / "T" / "0"
    base = -(1 << 56) * 20 - (-(1 << 56) * 20 % -200)  # Java's expect - expect % S
    assert [p.name for p in q0.iterdir()] == [f"-{-base:020d}"] == ["-01441151880758558600"]
    u = np.frombuffer((q0 / f"-{-base:020d}").read_bytes(), CQ_DTYPE)
    assert u[:3]["phy_offset"].tolist() == [0, res[2].phy_offset, res[4].phy_offset]
    assert u[0]["size"] == 0x7FFFFFFF  # the filler fillPreBlank writes before queue offset 1
    _f, u1 = _units(root, "T", 1)
    assert u1[:3]["phy_offset"].tolist() == [res[1].phy_offset, res[3].phy_offset, res[5].phy_offset]


def test_vectorised_writer_slots_are_the_rebuild_machines():
    """The audit's numpy model of putMessagePositionInfo's slots (writer_slots_of) gives what the rebuild's
    record-by-record machine (build_consume_queues) gives, on QUEUEOFFSETs that jump, repeat, reset to 0 and
    go negative, from any write position."""
    from storelib.broker.startup.cqrecovery import _machine_slots, writer_slots_of

    rng = np.random.default_rng(7)
    for trial in range(300):
        k = int(rng.integers(1, 40))
        steps = rng.choice([1, 1, 1, 2, 5, 0, -1, -3], size=k)
        q = np.cumsum(steps) + int(rng.integers(0, 20))
        q[rng.random(k) < 0.05] = 0
        q[rng.random(k) < 0.03] = -(1 << 40)
        P = np.cumsum(rng.integers(100, 300, size=k)).astype(np.int64)
        Z = np.full(k, 90, np.int64)
        anchor = int(rng.integers(0, 30))
        none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        fast = writer_slots_of(P, Z, q, np.ones(k, bool), none, anchor)
        assert fast.tolist() == _machine_slots(P, Z, q, anchor).tolist(), (trial, q.tolist(), anchor)


def test_a_queue_offset_whose_unit_offset_wraps_is_placed_where_the_broker_puts_it():
    """putMessagePositionInfo compares QUEUEOFFSET * 20 as a Java long: an offset 2^62 away from the write
    position's wraps onto it (no repeat), one just past +2^62 wraps below it (a repeat). The audit's model
    (writer_slots_of) gives what the rebuild's machine gives."""
    from storelib.broker.dispatch.cqwriter import NO_SLOT
    from storelib.broker.startup.cqrecovery import _machine_slots, writer_slots_of

    none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    for q, anchor, want in (([0, 1, 2 - (1 << 62)], 0, [0, 1, 2]), ([5, (1 << 62) + 1, 6], 5, [5, NO_SLOT, 6])):
        q = np.array(q, np.int64)
        P, Z = 1000 * np.arange(1, len(q) + 1, dtype=np.int64), np.full(len(q), 90, np.int64)
        assert _machine_slots(P, Z, q, anchor).tolist() == want
        assert writer_slots_of(P, Z, q, np.ones(len(q), bool), none, anchor).tolist() == want


def test_the_dispatch_fast_path_gives_the_slots_of_the_writers_model():
    """The CQ writer's vectorised fast path (whole queues whose records each go to the next slot) and its
    record-by-record machine both give slide_slots' slots, for new and continued queues."""
    from storelib.broker.dispatch.cqwriter import QueueState, build_consume_queues, slide_slots

    rng = np.random.default_rng(11)
    for trial in range(200):
        k = int(rng.integers(1, 30))
        start = int(rng.integers(0, 50))
        q = start + np.arange(k, dtype=np.int64)
        if trial % 2:  # jumps, repeats and resets: the machine
            q = np.cumsum(rng.choice([1, 1, 2, 0, -2], size=k)) + start
        q[rng.random(k) < 0.1] = 0
        table = pa.table({"physical_offset_field": 100 * np.arange(1, k + 1), "size": np.full(k, 90),
                          "queue_offset": q, "tags_code": np.zeros(k, np.int64), "topic": ["T"] * k,
                          "queue_id": np.zeros(k, np.int32), "tran_type": np.zeros(k, np.int8)})
        new = trial % 4 < 2 and q[0] >= 0
        cur = int(q[0]) if new else start
        state = {} if new else {("T", 0): QueueState(-1, cur * 20 - cur * 20 % 200, cur * 20 % 200)}
        img = build_consume_queues(table, segment_size=200, state=state)[("T", 0)]
        assert img.slots.tolist() == slide_slots(q, cur).tolist(), (trial, q.tolist(), cur)


def test_recovery_tags_scanned_by_segment_span_equal_one_by_one(tmp_path):
    """Many delay units to check (a whole recovery's dispatch) are read by one scan per segment span: the same
    tagsCodes as reading each record (the TAGS hash, no delay levels); a position with no record gets none."""
    from storelib.broker.startup.cqrecovery import recovery_tags
    from storelib.scan.commitlog import CommitLog

    root = _crashed_delay_store(tmp_path / "s")
    st = Store(str(root), broker_conf=str(root / "broker.conf"))
    at = np.array([r["phy_offset"] for r in CommitLog(str(root / "commitlog"), 65536).read_table().to_pylist()])
    many = np.r_[np.tile(at, 4), at[:1] + 1]
    got = recovery_tags(st.loc, st.settings, many)
    assert got[:-1].tolist() == [97] * 24 and got[-1] == np.iinfo(np.int64).min
    assert recovery_tags(st.loc, st.settings, at).tolist() == [97] * 6
    assert (recovery_tags(st.loc, BrokerSettings.defaults("5").with_overrides(SMALL), at) == np.iinfo(np.int64).min).all()
