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

SEG = 64 * 1024
IDX = 16 * 1024


def _audit(capsys, root: Path, *extra) -> tuple[int, dict]:
    rc, out, err = run_cli(capsys, "audit", root, "--engine", "local", "--quiet", "--json", *extra)
    assert rc in (0, 1), err
    return rc, json.loads(out)


def _bad(rep: dict, level: str = "warning") -> list[dict]:
    rank = {"info": 0, "warning": 1, "error": 2, "critical": 3}
    return [f for f in rep["findings"] if rank[f["severity"]] >= rank[level]]


def _gen(tmp_path: Path, n: int = 900, version: str = "4", **kw) -> Path:
    out = tmp_path / "s"
    s = BrokerSettings.defaults(version).with_overrides({"mappedFileSizeCommitLog": SEG, "maxHashSlotNum": 500,
                                                         "maxIndexNum": 4000})
    generate(out, GenConfig(messages=n, seed=3, version=version), s, dispatch=True,
             dledger=DLedgerGen(index_file_size=IDX, **kw))
    return out


def _entries(root: Path) -> list[tuple[int, int, int]]:
    from storelib.broker.settings.store import Store, load_settings
    from storelib.fileio.bytesource import resolve

    loc = resolve(str(root))
    t = Store(loc, load_settings(None, None, None, loc)).commitlog.read_table(with_properties=False)
    return list(zip(t.column("dledger_index").to_pylist(), t.column("dledger_pos").to_pylist(),
                    t.column("size").to_pylist()))


def _patch(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def _data(root: Path, pos: int) -> tuple[Path, int]:
    return root / "dledger-n0" / "data" / f"{pos - pos % SEG:020d}", pos % SEG


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
    path, off = _data(root, victim[1])
    _patch(path, off + 24, struct.pack(">q", victim[1] + 7))  # its pos field
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
    _patch(root / "dledger-n0" / "index" / f"{at - at % IDX:020d}", at % IDX + 24, struct.pack(">q", 9))  # its term
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
    path, off = _data(root, pos)
    body = off + BODY_OFFSET + 88  # IPv4 hosts: the body starts 88 bytes into the record
    _patch(path, body + 2, bytes([path.read_bytes()[body + 2] ^ 0xFF]))
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
    _patch(cq, 0, unit.tobytes())
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
    _patch(root / "dledger-n0" / "index" / f"{at - at % IDX:020d}", at % IDX + 24, struct.pack(">q", 9))
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
    path, off = _data(root, pos)
    entry = bytearray(path.read_bytes()[off:off + BODY_OFFSET + size])
    assert off + 2 * len(entry) + 8 < SEG, "the next entry must fit the file"
    entry[8:16], entry[24:32] = struct.pack(">q", idx + 1), struct.pack(">q", end)
    _patch(path, end % SEG, bytes(entry[:BODY_OFFSET + size // 2]))  # DLedger's put, half done
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
