"""``audit`` on DLedger-mode stores: clean stores exit 0; the crashed sample names the committed position and
the index file a start-up deletes; damaged generated stores get findings an operator can act on (a bad entry
header where DLedger's recovery ends the log, an index unit that differs, a record CRC inside an entry, a
consume-queue unit that is not entry pos + 48)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.format.consumequeue import CQ_DTYPE
from storelib.format.dledger.entries import BODY_OFFSET, INDEX_UNIT_SIZE
from storelib.generator.dledgergen import DLedgerGen
from storelib.generator.gen import generate
from storelib.generator.genplan import GenConfig

from .conftest import run_cli
from .dledger_files import IDX, SEG, data_file_at, dledger_entries, gen_dledger, patch_bytes


def _audit(capsys, root: Path, *extra) -> tuple[int, dict]:
    rc, out, err = run_cli(capsys, "audit", root, "--engine", "local", "--quiet", "--json", *extra)
    assert rc in (0, 1), err
    return rc, json.loads(out)


def _bad(rep: dict, level: str = "warning") -> list[dict]:
    rank = {"info": 0, "warning": 1, "error": 2, "critical": 3}
    return [f for f in rep["findings"] if rank[f["severity"]] >= rank[level]]


def _gen(tmp_path: Path, n: int = 900, version: str = "4", **kw) -> Path:
    return gen_dledger(tmp_path, "s", n, version, seed=3, **kw)


def _entries(root: Path) -> list[tuple[int, int, int]]:
    """(index, pos, record size) of every entry."""
    return [(i, p, z - BODY_OFFSET) for i, p, z in dledger_entries(root)]


def test_the_clean_sample_audits_clean(sample_dledger, capsys):
    rc, rep = _audit(capsys, sample_dledger / "store")
    assert rc == 0 and _bad(rep) == []
    d = rep["dledger"]
    assert d["committed_index"] == d["ledger_end_index"] == 2013 and d["committed_pos"] == 4960165
    assert d["uncommitted_entries"] == 0 and d["index_files_deleted_at_startup"] == []
    assert all(not (f["file"] or "").startswith("commitlog/") for f in rep["findings"])


def test_the_crashed_sample_names_the_committed_position_and_the_index_file_a_start_deletes(sample_dledger_crashed,
                                                                                            capsys):
    rc, rep = _audit(capsys, sample_dledger_crashed / "store")
    assert rc == 1
    kinds = {f["kind"]: f for f in rep["findings"]}
    unc = kinds["dledger_uncommitted_entries"]
    assert unc["extra"]["committed_pos"] == 1243691 and unc["extra"]["committed_index"] == 1005
    assert unc["extra"]["uncommitted"] == 713 and "1243691" in unc["detail"]
    gone = kinds["index_deleted_at_startup"]
    assert gone["file"] == "index/20261126194122348" and gone["severity"] == "error"
    assert "index_deleted_on_abnormal_start" not in kinds  # the default store's note gives way to DLedger's
    assert not [f for f in rep["findings"] if f["severity"] == "critical"]
    assert rep["dledger"]["max_offset_after_load"] == 1243691
    assert "recover" in rep["damage"]["next"][0]["command"]


@pytest.mark.parametrize("version", ["4", "5"])
def test_clean_generated_dledger_stores_audit_clean(tmp_path, capsys, version):
    root = _gen(tmp_path, version=version)
    rc, rep = _audit(capsys, root)
    assert rc == 0 and _bad(rep) == [], _bad(rep)


def test_a_bad_entry_header_where_dledgers_walk_ends_is_critical_and_named(tmp_path, capsys):
    root = _gen(tmp_path)
    ents = _entries(root)
    files = sorted({p - p % SEG for _, p, _ in ents})
    victim = [e for e in ents if files[-2] <= e[1] < files[-1]][3]  # inside the walked files
    path, off = data_file_at(root, victim[1])
    patch_bytes(path, off + 24, struct.pack(">q", victim[1] + 7))  # its pos field
    rc, rep = _audit(capsys, root)
    bad = [f for f in rep["findings"] if f["kind"] == "dledger_bad_entry"]
    assert rc == 1 and len(bad) == 1
    assert bad[0]["severity"] == "critical" and bad[0]["file"] == f"dledger-n0/data/{files[-2]:020d}"
    assert bad[0]["offset"] == off and "pos field" in bad[0]["detail"]
    assert any(f["kind"] == "dledger_data_files_deleted" for f in rep["findings"])


def test_an_index_unit_that_differs_is_named_in_the_index_file(tmp_path, capsys):
    root = _gen(tmp_path)
    ents = _entries(root)
    k = len(ents) - 20
    at = k * INDEX_UNIT_SIZE
    patch_bytes(root / "dledger-n0" / "index" / f"{at - at % IDX:020d}", at % IDX + 24, struct.pack(">q", 9))  # its term
    rc, rep = _audit(capsys, root)
    mm = [f for f in rep["findings"] if f["kind"] == "dledger_index_unit_mismatch"]
    assert rc == 1 and len(mm) == 1 and mm[0]["extra"]["entry_index"] == k
    assert mm[0]["file"] == f"dledger-n0/index/{at - at % IDX:020d}" and mm[0]["offset"] == at % IDX
    assert "term 9" in mm[0]["detail"]


def test_a_body_crc_inside_an_entry_is_reported_in_dledger_terms(tmp_path, capsys):
    from storelib.broker.settings.store import Store, load_settings
    from storelib.fileio.bytesource import resolve

    root = _gen(tmp_path)
    loc = resolve(str(root))
    t = Store(loc, load_settings(None, None, None, loc)).commitlog.read_table(with_properties=False)
    k = next(i for i in range(100, t.num_rows) if t.column("sys_flag")[i].as_py() & 0x30 == 0
             and t.column("body_len")[i].as_py() > 8)
    pos = t.column("dledger_pos")[k].as_py()
    path, off = data_file_at(root, pos)
    body = off + BODY_OFFSET + 88  # IPv4 hosts: the body starts 88 bytes into the record
    patch_bytes(path, body + 2, bytes([path.read_bytes()[body + 2] ^ 0xFF]))
    rc, rep = _audit(capsys, root)
    crc = [f for f in rep["findings"] if f["kind"] == "body_crc_mismatch"]
    assert rc == 1 and len(crc) == 1 and crc[0]["file"].startswith("dledger-n0/data/")
    assert "DLedger keeps the entry" in crc[0]["detail"]
    assert not any(f["kind"] == "dledger_bad_entry" for f in rep["findings"])  # the header is fine


def test_a_consume_queue_unit_must_point_at_entry_pos_plus_48(tmp_path, capsys):
    root = _gen(tmp_path)
    cq = sorted((root / "consumequeue").rglob("0000*"))[0]
    u = bytearray(cq.read_bytes())
    first = bytes(u[:20])
    import numpy as np

    unit = np.frombuffer(first, CQ_DTYPE).copy()
    unit["phy_offset"] -= BODY_OFFSET  # the entry's pos, not its record
    patch_bytes(cq, 0, unit.tobytes())
    rc, rep = _audit(capsys, root)
    got = [f for f in _bad(rep, "error") if (f["file"] or "").startswith("consumequeue/")]
    assert rc == 1 and got, _bad(rep)


def test_the_audit_runs_dledgers_walk_on_a_pool_with_the_same_findings(tmp_path, capsys):
    root = _gen(tmp_path, committed_lag=7)
    rc, out, err = run_cli(capsys, "audit", root, "--engine", "pool", "--workers", "2", "--quiet", "--json")
    rep = json.loads(out)
    assert rc == 1, err  # the crash's index file, which the start-up deletes
    assert rep["dledger"]["uncommitted_entries"] == 7
    rc2, local = _audit(capsys, root)
    assert rc2 == rc and local["findings"] == rep["findings"] and local["dledger"] == rep["dledger"]


def test_a_533_crash_names_the_consume_queue_units_9084_cuts(tmp_path, capsys):
    for n in range(900, 1300, 23):  # a last data file with enough entries for the short offset to reach a unit
        root = tmp_path / f"s{n}"
        s = BrokerSettings.defaults("5").with_overrides({"mappedFileSizeCommitLog": SEG, "maxHashSlotNum": 500,
                                                         "maxIndexNum": 4000})
        generate(root, GenConfig(messages=n, seed=5, version="5"), s, dispatch=True,
                 dledger=DLedgerGen(index_file_size=IDX, committed_lag=10, crashed=True))
        ents = _entries(root)
        last = ents[-1][1] - ents[-1][1] % SEG
        end = ents[-1][1] + BODY_OFFSET + ents[-1][2]  # (the record size is the entry's minus 48)
        short = end - BODY_OFFSET * sum(1 for e in ents if e[1] >= last)
        if sum(1 for _, p, _ in ents if p + BODY_OFFSET >= short) > 1:
            break
    rc, rep = _audit(capsys, root, "--broker-version", "5")
    cut = [f for f in rep["findings"] if f["kind"] == "cq_truncated_at_startup"]
    assert rc == 1 and len(cut) == 1 and cut[0]["severity"] == "critical" and "#9084" in cut[0]["detail"]
    assert sum(cut[0]["extra"]["queues"].values()) == sum(1 for _, p, _ in ents if p + BODY_OFFSET >= short)


def _comparable(rep: dict) -> tuple:
    return rep["findings"], rep["dledger"] if "files_walked" not in rep["dledger"] else {
        k: v for k, v in rep["dledger"].items() if k not in ("files_walked", "files_carried")}


def test_the_dledger_checks_run_as_tasks_with_the_same_findings_on_every_engine(sample_dledger_crashed, spark,
                                                                              monkeypatch):
    """The crashed sample on the local engine, a pool and Spark: the same findings and DLedger block; DLedger's
    walk reads its entries in tasks only (the driver merges per-file facts: it never scans a data file)."""
    import os

    import storelib.broker.recovery.walk as walk
    from jobs.audit import audit_store

    store = str(sample_dledger_crashed / "store")
    ref = audit_store(store, quiet=True, engine="local")
    driver = os.getpid()
    real = walk.iter_task

    def only_in_tasks(plan, task, *a, **kw):
        assert os.getpid() != driver, "the driver scanned a data file"
        return real(plan, task, *a, **kw)

    monkeypatch.setattr(walk, "iter_task", only_in_tasks)
    monkeypatch.setenv("RMQSTORE_POOL_START", "fork")  # the workers get the spy too
    for eng in ("pool", "spark"):
        got = audit_store(store, quiet=True, engine=eng, workers=2 if eng == "pool" else None,
                          spark=spark if eng == "spark" else None)
        assert _comparable(got) == _comparable(ref), eng
    assert ref["dledger"]["committed_pos"] == 1243691 and ref["dledger"]["files_walked"] >= 1


def test_since_carries_each_data_files_dledger_facts_and_reports_the_same(tmp_path):
    """--since on a DLedger store: a second run reads no data file again (their facts carried while they and
    their index units fingerprint the same), with the first run's findings; an index unit rewritten since
    makes its file be walked again."""
    from jobs.audit import audit_store

    root = _gen(tmp_path, committed_lag=5)
    state = str(tmp_path / "state.json")
    first = audit_store(str(root), quiet=True, since=state)
    second = audit_store(str(root), quiet=True, since=state)
    assert first["dledger"]["files_carried"] == 0 and first["dledger"]["files_walked"] >= 2
    assert second["dledger"]["files_walked"] == 0 and second["dledger"]["files_carried"] == first["dledger"][
        "files_walked"]
    assert _comparable(second) == _comparable(first)
    ents = _entries(root)
    at = 3 * INDEX_UNIT_SIZE  # entry 3's unit, in the first data file
    patch_bytes(root / "dledger-n0" / "index" / f"{at - at % IDX:020d}", at % IDX + 24, struct.pack(">q", 9))
    third = audit_store(str(root), quiet=True, since=state)
    assert third["dledger"]["files_walked"] == 1, third["dledger"]
    mm = [f for f in third["findings"] if f["kind"] == "dledger_index_unit_mismatch"]
    assert len(mm) == 1 and mm[0]["extra"]["entry_index"] == 3 and ents[3][0] == 3


_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_live_dledger_store_is_read_as_at_one_cut(tmp_path, capsys):
    """A DLedger store whose lock a broker holds, with an entry being copied in at the tail (its header and half
    its record, the rest zeros): the cut ends at the last whole entry, and the audit judges the store as at it
    (no torn entry said, DLedger's walk ending at the cut); at rest the same bytes are a torn tail."""
    import subprocess
    import sys

    from storelib.broker.settings.store import Store, load_settings
    from storelib.fileio.bytesource import resolve

    root = _gen(tmp_path)
    idx, pos, size = _entries(root)[-1]
    end = pos + BODY_OFFSET + size
    path, off = data_file_at(root, pos)
    entry = bytearray(path.read_bytes()[off:off + BODY_OFFSET + size])
    assert off + 2 * len(entry) + 8 < SEG, "the next entry must fit the file"
    entry[8:16], entry[24:32] = struct.pack(">q", idx + 1), struct.pack(">q", end)
    patch_bytes(path, end % SEG, bytes(entry[:BODY_OFFSET + size // 2]))  # DLedger's put, half done
    rc0, at_rest = _audit(capsys, root)
    assert any(f["offset"] == end % SEG for f in _bad(at_rest)), _bad(at_rest)  # at rest: the torn entry
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(root / "lock")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        loc = resolve(str(root))
        store = Store(loc, load_settings(None, None, None, loc))
        cut = store.take_cut(tail_wait_s=0.05)
        assert cut.live and cut.commitlog_end == end and "incomplete" in (cut.tail or "")
        assert store.commitlog.cut_end == end
        rc, rep = _audit(capsys, root)
    finally:
        proc.stdin.close()
        proc.wait()
    assert rep["live"]["live"] and rep["live"]["cut_offset"] == end
    assert not [f for f in _bad(rep) if f["offset"] == end % SEG], _bad(rep)
    d = rep["dledger"]
    assert d["ledger_end_index"] == idx and d["data_end"] == end and d["index_files_deleted_at_startup"] == []



def test_the_damage_price_reads_no_data_file_in_the_driver(tmp_path, sample_dledger_crashed, monkeypatch):
    """The audit's damage price (a start-up replay, then the lost entries) on a pool: the driver opens no
    DLedger data file while it prices (the walk and the lost ranges' scans are the engine's tasks; the queue
    and index models are not fed), and the price equals the full in-process replay's lost section (the
    recover plan's)."""
    import os

    import jobs.audit as audit_mod
    import storelib.scan.commitlog as commitlog
    from storelib.broker.settings.store import Store, load_settings
    from storelib.broker.startup.startup import simulate
    from storelib.broker.startup.startuplost import scan_lost
    from storelib.fileio.bytesource import resolve

    root = tmp_path / "g"
    s = BrokerSettings.defaults("4").with_overrides({"mappedFileSizeCommitLog": SEG, "maxHashSlotNum": 500,
                                                     "maxIndexNum": 4000})
    generate(root, GenConfig(messages=900, seed=3), s, dispatch=True,
             dledger=DLedgerGen(index_file_size=IDX, committed_lag=9, crashed=True))
    ents = _entries(root)
    files = sorted({p - p % SEG for _, p, _ in ents})
    victim = [e for e in ents if files[-2] <= e[1] < files[-1]][3]
    path, off = data_file_at(root, victim[1])
    patch_bytes(path, off + 24, struct.pack(">q", victim[1] + 7))  # DLedger's data ends here: the rest is lost
    driver, real_open, real_cost = os.getpid(), commitlog.Segment.open, audit_mod.damage_cost
    reads: list[str] = []

    def spy_open(self):
        if os.getpid() == driver and "/data/" in self.loc.path:
            reads.append(self.display)
        return real_open(self)

    def spied_cost(*a, **kw):  # only the pricing is watched (the audit plans its splits in the driver)
        monkeypatch.setattr(commitlog.Segment, "open", spy_open)
        try:
            return real_cost(*a, **kw)
        finally:
            monkeypatch.setattr(commitlog.Segment, "open", real_open)

    monkeypatch.setattr(audit_mod, "damage_cost", spied_cost)
    monkeypatch.setenv("RMQSTORE_POOL_START", "fork")
    got = {}
    for name, store in (("generated", root), ("crashed", sample_dledger_crashed / "store")):
        loc = resolve(str(store))
        full = scan_lost(simulate(Store(loc, load_settings(None, None, None, loc))))["totals"]
        d = audit_mod.audit_store(str(store), quiet=True, engine="pool", workers=2)["damage"]
        assert d is not None and "error" not in d, d
        assert (d["messages_lost"], d["messages_intact"], d["bytes_lost"], d["by_topic"]) == \
            (full["messages"], full["intact"], full["bytes"], full["by_topic"]), name
        got[name] = d
    assert reads == [], reads
    assert got["generated"]["messages_lost"] > 0 and got["generated"]["data_end"] == victim[1]
    assert got["crashed"]["process_offset"] == 1243691 and got["crashed"]["messages_lost"] == 0


@pytest.mark.parametrize("what, at, fmt, value, text, readable", [
    ("entry magic", 0, ">i", 2, "magic 2", False),
    ("entry size", 4, ">i", 40, "size 40", False),
    ("index gap", 8, ">q", 10 ** 6, "does not follow", True),
    ("lower term", 16, ">q", -1, "lower", True),
])
def test_each_entry_header_rule_where_dledgers_walk_ends_is_critical_and_named(tmp_path, capsys, what, at, fmt,
                                                                                value, text, readable):
    """Issue 28 point 4, the headers: magic, size, a contiguous index and a term that never decreases, each
    broken in an entry DLedger's start-up walks: named at the entry, critical, with what a start-up drops (the
    damaged entry's record among them when its header still frames it, else as unreadable bytes)."""
    root = _gen(tmp_path)
    ents = _entries(root)
    files = sorted({p - p % SEG for _, p, _ in ents})
    victim = [e for e in ents if files[-2] <= e[1] < files[-1]][3]
    path, off = data_file_at(root, victim[1])
    patch_bytes(path, off + at, struct.pack(fmt, value))
    rc, rep = _audit(capsys, root)
    bad = [f for f in rep["findings"] if f["kind"] == "dledger_bad_entry"]
    assert rc == 1 and len(bad) == 1, (what, _bad(rep))
    assert bad[0]["severity"] == "critical" and bad[0]["file"] == f"dledger-n0/data/{files[-2]:020d}", what
    assert bad[0]["offset"] == off and text in bad[0]["detail"], (what, bad[0]["detail"])
    assert rep["damage"]["messages_lost"] == sum(1 for _, p, _ in ents if p > victim[1]) + readable, what
    assert (rep["damage"]["bytes_unreadable"] >= BODY_OFFSET + victim[2]) is not readable, what


def test_an_index_file_entry_must_point_at_entry_pos_plus_48(tmp_path, capsys):
    """Issue 28 point 4, IndexFile against the entries: an index entry holding the entry's pos (not its record's
    offset, pos + 48) is named in the index file."""
    root = _gen(tmp_path)
    idx = sorted((root / "index").iterdir())[0]
    at = 40 + 4 * 500 + 20 * 5 + 4  # entry 5's phyOffset (header, 500 slots, 20-byte entries)
    phy = struct.unpack_from(">q", idx.read_bytes(), at)[0]
    assert any(p + BODY_OFFSET == phy for _, p, _ in _entries(root))
    patch_bytes(idx, at, struct.pack(">q", phy - BODY_OFFSET))
    rc, rep = _audit(capsys, root)
    got = [f for f in _bad(rep, "error") if f["file"] == f"index/{idx.name}"]
    assert rc == 1 and got, _bad(rep)
    # the record's key is missing from the index now, named at the record (pos + 48), nothing else
    assert [(f["kind"], f["offset"]) for f in _bad(rep, "error") if not f["file"].startswith("index/")] == \
        [("index_key_missing", phy)], _bad(rep)


def _damaged(tmp_path: Path, how: str) -> Path:
    """A generated DLedger store with one kind of damage (or none)."""
    root = _gen(tmp_path / how, committed_lag=4)
    ents = _entries(root)
    files = sorted({p - p % SEG for _, p, _ in ents})
    inner = [e for e in ents if files[-2] <= e[1] < files[-1]]
    path, off = data_file_at(root, inner[3][1])
    if how == "header":
        patch_bytes(path, off + 24, struct.pack(">q", inner[3][1] + 7))
    elif how == "record":  # the record's magic inside a good entry: the reput skips the rest of the file
        patch_bytes(path, off + BODY_OFFSET + 4, b"\0\0\0\0")
    elif how == "body_crc":
        patch_bytes(path, off + BODY_OFFSET + 88 + 2, b"\xff\xfe")
    elif how == "unit":
        at = inner[5][0] * INDEX_UNIT_SIZE
        patch_bytes(root / "dledger-n0" / "index" / f"{at - at % IDX:020d}", at % IDX + 24, struct.pack(">q", 9))
    elif how == "index_gap":  # an entry index that does not follow, at a part's first entry as much as inside
        patch_bytes(path, off + 8, struct.pack(">q", 10 ** 6))
    return root


@pytest.mark.parametrize("how", ["clean", "header", "record", "body_crc", "unit", "index_gap"])
def test_each_data_file_is_read_once_and_the_report_is_the_walk_tasks(tmp_path, how, monkeypatch):
    """The segment parts give DLedger's walk its per-file facts (one read per data file): with one task per file
    the walk's own task never runs, and the report equals the one from the walk's own tasks, there and on
    files cut into parts (a pool with small splits, where damage across a cut falls back to the walk's task),
    whatever the damage."""
    from jobs.audit import audit_store
    from storelib.checks.tasks import dledgertask

    root = _damaged(tmp_path, how)
    monkeypatch.setenv("RMQSTORE_POOL_START", "fork")
    real_part_walk = dledgertask.part_walk
    monkeypatch.setattr(dledgertask, "part_walk", lambda run, opts: None)
    ref = audit_store(str(root), quiet=True, engine="local")
    monkeypatch.setattr(dledgertask, "part_walk", real_part_walk)
    walked: list[str] = []  # the data files the audit's walk reads again (its own tasks)
    real_task = dledgertask.dledger_file_task

    def counted(item):
        walked.append(item.plan.segments[item.task.index].name)
        return real_task(item)

    monkeypatch.setattr(dledgertask, "dledger_file_task", counted)
    one = audit_store(str(root), quiet=True, engine="local")
    assert _comparable(one) == _comparable(ref)
    assert walked == []  # one task per file: its part's facts are the walk's, damaged or not
    monkeypatch.setattr(dledgertask, "dledger_file_task", real_task)
    split = audit_store(str(root), quiet=True, engine="pool", workers=2, split_bytes=16 * 1024)
    assert _comparable(split) == _comparable(ref)
    assert one["damage"] == ref["damage"] == split["damage"]


def test_a_v2_record_read_under_498s_rules_leaves_the_walk_to_its_own_task(tmp_path, monkeypatch):
    """A 5.x DLedger store with V2 records (a topic over 127 bytes) audited as 4.9.8's: the audit reads V2
    records leniently, 4.9.8's walk stops at them, so the files holding them are walked by their own task and
    the report is the walk tasks'."""
    from jobs.audit import audit_store
    from storelib.checks.tasks import dledgertask

    root = tmp_path / "v2"
    s = BrokerSettings.defaults("5").with_overrides({"mappedFileSizeCommitLog": SEG, "maxHashSlotNum": 500,
                                                     "maxIndexNum": 4000})
    generate(root, GenConfig(messages=600, seed=3, version="5", topic_names=("T" * 200, "Short")), s,
             dispatch=True, dledger=DLedgerGen(index_file_size=IDX))
    real_part_walk, real_task = dledgertask.part_walk, dledgertask.dledger_file_task
    monkeypatch.setattr(dledgertask, "part_walk", lambda run, opts: None)
    ref = audit_store(str(root), quiet=True, engine="local", version="4")
    monkeypatch.setattr(dledgertask, "part_walk", real_part_walk)
    walked: list[str] = []

    def counted(item):
        walked.append(item.plan.segments[item.task.index].name)
        return real_task(item)

    monkeypatch.setattr(dledgertask, "dledger_file_task", counted)
    got = audit_store(str(root), quiet=True, engine="local", version="4")
    assert _comparable(got) == _comparable(ref)
    assert walked and any(f["kind"] == "dledger_data_truncated" or "V2" in f["detail"] for f in ref["findings"])


def test_a_running_nodes_index_file_being_created_is_not_a_load_failure(tmp_path, monkeypatch):
    """DLedger maps its next index file as it creates it: a running node's last index file may be listed at 0
    bytes. At rest that file stops the JVM (MmapFileList.load's size rule); on a live node it is the file being
    made, not a load failure."""
    from storelib.broker.recovery.dledgerwalk import dledger_inputs
    from storelib.broker.settings.store import Store, load_settings
    from storelib.fileio.bytesource import resolve

    root = _gen(tmp_path)
    idx = sorted((root / "dledger-n0" / "index").iterdir())
    (idx[-1].parent / f"{int(idx[-1].name) + IDX:020d}").write_bytes(b"")
    loc = resolve(str(root))
    store = Store(loc, load_settings(None, None, None, loc))
    at_rest = [f for f in dledger_inputs(store)["dledger_load_findings"] if f.kind == "dledger_load_fails"]
    assert len(at_rest) == 1 and "0 bytes, not the" in at_rest[0].detail
    monkeypatch.setattr(Store, "live", property(lambda s: True))
    assert [f for f in dledger_inputs(store)["dledger_load_findings"] if f.kind == "dledger_load_fails"] == []
