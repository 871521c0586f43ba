"""Stray entries in commitlog/ and in a consume-queue directory: the readers skip them, the broker's load does
not (MappedFileQueue.doLoad, 4.9.8 :158-183, 5.3.3 :246-281). ``recover --plan`` says the broker does not
start (exit 1), ``--apply`` refuses without --force, the audit names the entry; 5.3.3 skips a sub-directory."""

from __future__ import annotations

import pytest

from jobs.audit import audit_store
from storelib.broker.dispatch.dispatch import dispatch_store
from storelib.broker.settings.brokerconf import load_broker_conf
from storelib.broker.settings.store import Store
from storelib.broker.settings.storeinfo import collect
from storelib.broker.settings.strayload import LOAD_FAILS, STRAY_LOADED, java_long
from storelib.broker.startup import recoverapply as ra
from storelib.broker.startup.recoveryplan import plan_document
from storelib.broker.startup.startup import simulate
from storelib.errors import StoreError
from storelib.format.checkpoint import Checkpoint, write_checkpoint
from tests.conftest import run_cli
from tests.rebuild_storegen import CraftedStore, msg

S = 8192
CQS = 20 * 40
CONF = {"mappedFileSizeCommitLog": S, "mappedFileSizeConsumeQueue": CQS, "maxHashSlotNum": 16, "maxIndexNum": 64}
VERSIONS = ["4", "5"]


def _store(tmp_path, version: str) -> tuple[str, str]:
    """A clean 3-segment store (root, broker.conf) whose plan changes nothing."""
    conf = tmp_path / "broker.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in CONF.items()))
    cs = CraftedStore(S, version=version)
    i = 0
    while cs.seg_index < 3:
        cs.append(msg("T", i % 2, body=bytes([65 + i % 26]) * (200 + i % 7), keys=f"k{i}", uniq=f"U{i:06d}"))
        i += 1
    root = tmp_path / "store"
    cs.write(root)
    dispatch_store(str(root), load_broker_conf(str(conf), version))
    last = cs.placed[-1].msg.store_timestamp
    write_checkpoint(str(root), Checkpoint(last, last, 0))
    (root / "lock").write_bytes(b"lock")
    return str(root), str(conf)


def _plan(root: str, conf: str, version: str) -> dict:
    return plan_document(simulate(Store(root, load_broker_conf(conf, version))), lost=False)


def _failed(plan: dict) -> dict[str, str]:
    return {f["file"]: f["kind"] for f in plan.get("load_failures", [])}


def test_java_long_is_long_parse_long():
    assert java_long("00000000000000000000") == 0
    assert java_long("+12") == 12 and java_long("-3") == -3
    assert java_long("9223372036854775807") == (1 << 63) - 1
    for bad in ("99999999999999999999", "1_0", " 1", "", "+", "00000000000000000000.bak", "backup"):
        assert java_long(bad) is None, bad


def test_clean_store_loads(tmp_path):
    root, conf = _store(tmp_path, "4")
    plan = _plan(root, conf, "4")
    assert plan.get("load_failures") == [] and plan["supported"] is True


@pytest.mark.parametrize("version", VERSIONS)
def test_commitlog_subdirectory_fails_4_9_8_and_is_skipped_by_5_3_3(tmp_path, capsys, version):
    root, conf = _store(tmp_path, version)
    (tmp_path / "store" / "commitlog" / "backup").mkdir()
    plan = _plan(root, conf, version)
    if version == "4":
        assert _failed(plan) == {"commitlog/backup": LOAD_FAILS} and plan["supported"] is False
        rc, out, _ = run_cli(capsys, "recover", root, "--broker-conf", conf, "--broker-version", version, "--plan")
        assert rc == 1 and "THE BROKER DOES NOT START: commitlog/backup" in out
        with pytest.raises(StoreError, match="use --force"):
            ra.apply(Store(root, load_broker_conf(conf, version)), str(tmp_path / "bk"))
    else:
        assert plan.get("load_failures") == [] and plan["supported"] is True
        assert any(f["kind"] == "stray_entry_skipped" and f["file"] == "commitlog/backup" for f in plan["findings"])
        rc, out, _ = run_cli(capsys, "recover", root, "--broker-conf", conf, "--broker-version", version, "--plan")
        assert rc == 0 and "DOES NOT START" not in out
    rep = audit_store(root, broker_conf=conf, version=version, quiet=True)
    hits = [f for f in rep["findings"] if f["file"] == "commitlog/backup"]
    assert [f["severity"] for f in hits] == (["critical"] if version == "4" else ["info"])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name,size,kind", [("00000000000000000000.bak", 100, LOAD_FAILS),
                                            ("backup", S, LOAD_FAILS),  # NumberFormatException
                                            ("0", S, STRAY_LOADED)])  # mapped at offset 0
def test_commitlog_stray_file(tmp_path, version, name, size, kind):
    root, conf = _store(tmp_path, version)
    (tmp_path / "store" / "commitlog" / name).write_bytes(b"x" * size)
    plan = _plan(root, conf, version)
    assert _failed(plan) == {f"commitlog/{name}": kind} and plan["supported"] is False


@pytest.mark.parametrize("version", VERSIONS)
def test_zero_length_last_segment_before_a_later_sorting_directory(tmp_path, version):
    """5.3.3 deletes a zero-length file only as the last of ALL entries: here the directory is last."""
    root, conf = _store(tmp_path, version)
    cl = tmp_path / "store" / "commitlog"
    last = max(int(p.name) for p in cl.iterdir())
    (cl / f"{last + S:020d}").write_bytes(b"")
    (cl / "zz").mkdir()
    failed = _failed(_plan(root, conf, version))
    if version == "5":
        assert failed == {f"commitlog/{last + S:020d}": LOAD_FAILS}
    else:  # 4.9.8 fails on the zero-length file (the first it meets) and would on the directory
        assert failed == {f"commitlog/{last + S:020d}": "empty_last_segment", "commitlog/zz": LOAD_FAILS}


@pytest.mark.parametrize("version", VERSIONS)
def test_zero_length_stray_file_last_is_deleted_by_5_3_3(tmp_path, version):
    root, conf = _store(tmp_path, version)
    (tmp_path / "store" / "commitlog" / "zz.tmp").write_bytes(b"")
    plan = _plan(root, conf, version)
    if version == "5":
        assert plan.get("load_failures") == []
        assert any(f["kind"] == "stray_entry_deleted" for f in plan["findings"])
    else:
        assert _failed(plan) == {"commitlog/zz.tmp": LOAD_FAILS}


@pytest.mark.parametrize("version", VERSIONS)
def test_consume_queue_subdirectory(tmp_path, version):
    root, conf = _store(tmp_path, version)
    (tmp_path / "store" / "consumequeue" / "T" / "0" / "old").mkdir()
    plan = _plan(root, conf, version)
    where = f"{root}/consumequeue/T/0/old"
    if version == "4":
        assert _failed(plan) == {where: LOAD_FAILS} and plan["supported"] is False
    else:
        assert plan.get("load_failures") == [] and plan["supported"] is True


@pytest.mark.parametrize("version", VERSIONS)
def test_consume_queue_stray_files_stop_the_broker(tmp_path, capsys, version):
    """Our own ``.tmp`` leftover of an interrupted write, and a right-sized non-numeric name."""
    root, conf = _store(tmp_path, version)
    q = tmp_path / "store" / "consumequeue" / "T" / "1"
    (q / "00000000000000000000.tmp").write_bytes(b"\0" * 40)
    (q / "copy").write_bytes(b"\0" * CQS)
    plan = _plan(root, conf, version)
    assert _failed(plan) == {f"{root}/consumequeue/T/1/00000000000000000000.tmp": LOAD_FAILS,
                             f"{root}/consumequeue/T/1/copy": LOAD_FAILS}
    rc, out, _ = run_cli(capsys, "recover", root, "--broker-conf", conf, "--broker-version", version, "--plan")
    assert rc == 1 and "THE BROKER DOES NOT START" in out and "consumequeue/T/1/copy" in out
    with pytest.raises(StoreError, match="use --force"):
        ra.apply(Store(root, load_broker_conf(conf, version)), str(tmp_path / "bk"))
    rep = audit_store(root, broker_conf=conf, version=version, quiet=True)
    hits = {f["file"]: f["severity"] for f in rep["findings"] if f["kind"] == LOAD_FAILS}
    assert hits == {"consumequeue/T/1/00000000000000000000.tmp": "critical", "consumequeue/T/1/copy": "critical"}
    steps = [s["command"] for s in rep["damage"]["next"]]  # move it out; no rebuild is offered for it
    assert steps[0] == f"mv {root}/consumequeue/T/1/00000000000000000000.tmp MOVED_DIR/"
    assert not any("rebuild" in c for c in steps)


@pytest.mark.parametrize("version", VERSIONS)
def test_consume_queue_zero_length_last_file_before_a_directory(tmp_path, version):
    """A queue directory as commitlog/: 5.3.3 does not delete a zero-length file a directory sorts after."""
    root, conf = _store(tmp_path, version)
    q = tmp_path / "store" / "consumequeue" / "T" / "0"
    last = max(int(p.name) for p in q.iterdir())
    (q / f"{last + CQS:020d}").write_bytes(b"")
    (q / "zz").mkdir()
    failed = _failed(_plan(root, conf, version))
    seg = f"{root}/consumequeue/T/0/{last + CQS:020d}"
    assert failed == ({seg: LOAD_FAILS} if version == "5"
                      else {seg: "empty_last_segment", f"{root}/consumequeue/T/0/zz": LOAD_FAILS})


@pytest.mark.parametrize("version", VERSIONS)
def test_segment_of_the_wrong_length_fails_the_load(tmp_path, capsys, version):
    """Not a stray entry, the same rule: doLoad's length check (the readers already said "refuses to load")."""
    root, conf = _store(tmp_path, version)
    cl = tmp_path / "store" / "commitlog"
    first = min(cl.iterdir())
    first.write_bytes(first.read_bytes()[:S // 2])
    q = tmp_path / "store" / "consumequeue" / "T" / "1"
    cq = min(q.iterdir())
    cq.write_bytes(cq.read_bytes()[:100])
    failed = _failed(_plan(root, conf, version))
    assert failed == {f"commitlog/{first.name}": "wrong_segment_size", str(cq): "short_segment"}
    rc, out, _ = run_cli(capsys, "recover", root, "--broker-conf", conf, "--broker-version", version, "--plan")
    assert rc == 1 and f"THE BROKER DOES NOT START: commitlog/{first.name}" in out


@pytest.mark.parametrize("version", VERSIONS)
def test_consume_queue_zero_length_last_file_is_critical_on_4_9_8(tmp_path, version):
    """4.9.8's doLoad holds every file to the mapped size (:163-167): the audit and info say the broker does
    not start; 5.3.3 deletes the file (:256-260): a warning."""
    root, conf = _store(tmp_path, version)
    q = tmp_path / "store" / "consumequeue" / "T" / "0"
    last = max(int(p.name) for p in q.iterdir())
    (q / f"{last + CQS:020d}").write_bytes(b"")
    rel = f"consumequeue/T/0/{last + CQS:020d}"
    rep = audit_store(root, broker_conf=conf, version=version, quiet=True)
    hits = {f["severity"] for f in rep["findings"] if f["file"] == rel and f["kind"] == "empty_last_segment"}
    assert hits == ({"critical"} if version == "4" else {"warning"})
    info = collect(Store(root, load_broker_conf(conf, version)), scan=False)
    sev = {f["severity"] for f in info["findings"] if f["kind"] == "empty_last_segment"}
    assert sev == ({"critical"} if version == "4" else {"warning"})
    failed = _failed(_plan(root, conf, version))
    assert failed == ({f"{root}/{rel}": "empty_last_segment"} if version == "4" else {})


def _index_findings(findings: list[dict], name: str) -> list[tuple[str, str]]:
    return [(f["kind"], f["severity"]) for f in findings if f["file"] == f"index/{name}"]


@pytest.mark.parametrize("version", VERSIONS)
def test_index_entries_with_non_numeric_names_are_skipped_by_the_broker(tmp_path, version):
    """IndexService.load catches MappedFile.init's NumberFormatException (4.9.8 :81-83, 5.3.3 :82-84): skipped."""
    root, conf = _store(tmp_path, version)
    idx = tmp_path / "store" / "index"
    before = len(collect(Store(root, load_broker_conf(conf, version)), scan=False)["index_files"])
    (idx / "backup").mkdir()
    (idx / "notes.txt").write_bytes(b"x" * 10)
    plan = _plan(root, conf, version)
    assert plan.get("load_failures") == [] and plan["supported"] is True
    assert _index_findings(plan["findings"], "backup") == [("stray_entry_skipped", "info")]
    rep = audit_store(root, broker_conf=conf, version=version, quiet=True)
    assert _index_findings(rep["findings"], "notes.txt") == [("stray_entry_skipped", "info")]
    info = collect(Store(root, load_broker_conf(conf, version)), scan=False)
    assert _index_findings(info["findings"], "backup") == [("stray_entry_skipped", "info")]
    assert len(info["index_files"]) == before  # the readers read around them as before


@pytest.mark.parametrize("version", VERSIONS)
def test_index_numeric_directory_stops_4_9_8_index_load_and_fails_5_3_3_load(tmp_path, capsys, version):
    """A directory fails MappedFile.init's RandomAccessFile (an IOException): IndexService.load returns false;
    4.9.8's DefaultMessageStore.load ignores it (:210), 5.3.3's fails on it (:362)."""
    root, conf = _store(tmp_path, version)
    (tmp_path / "store" / "index" / "00000000000000000").mkdir()  # sorts before every index file
    plan = _plan(root, conf, version)
    rc, out, _ = run_cli(capsys, "recover", root, "--broker-conf", conf, "--broker-version", version, "--plan")
    rep = audit_store(root, broker_conf=conf, version=version, quiet=True)
    got = _index_findings(rep["findings"], "00000000000000000")
    driver = audit_store(root, broker_conf=conf, version=version, quiet=True, cross="driver")
    assert _index_findings(driver["findings"], "00000000000000000") == got
    if version == "5":
        assert _failed(plan) == {"index/00000000000000000": LOAD_FAILS} and plan["supported"] is False
        assert rc == 1 and "THE BROKER DOES NOT START: index/00000000000000000" in out
        assert got == [(LOAD_FAILS, "critical")]
    else:
        assert plan.get("load_failures") == [] and rc == 0
        assert _index_findings(plan["findings"], "00000000000000000") == [("index_load_stops", "error")]
        assert plan["index"]["files"] == []  # the load returned before every index file: none loaded
        assert got == [("index_load_stops", "error")]


@pytest.mark.parametrize("version", VERSIONS)
def test_index_file_with_a_numeric_short_name_is_loaded_as_an_index_file(tmp_path, version):
    """Long.parseLong takes "1": IndexService.load maps it at the configured size (a stray index file)."""
    root, conf = _store(tmp_path, version)
    (tmp_path / "store" / "index" / "1").write_bytes(b"\0" * 100)
    plan = _plan(root, conf, version)
    assert plan.get("load_failures") == []
    assert _index_findings(plan["findings"], "1") == [("stray_index_loaded", "warning")]
    rep = audit_store(root, broker_conf=conf, version=version, quiet=True)
    assert _index_findings(rep["findings"], "1") == [("stray_index_loaded", "warning")]


@pytest.mark.parametrize("version", VERSIONS)
def test_expire_and_key_lookups_judge_index_entries_as_index_service_load_does(tmp_path, capsys, version):
    """``expire`` and ``get --key`` say what IndexService.load does with the entries the index reader skips (not
    the reader's raw note), and take only the index files it keeps (the cleaner and queryOffset walk that list)."""
    from storelib.broker.expiry.expiry import load_snapshot
    from storelib.broker.index.lookup import lookup_key

    root, conf = _store(tmp_path, version)
    (tmp_path / "store" / "index" / "backup").mkdir()
    store = Store(root, load_broker_conf(conf, version))
    snap = load_snapshot(store)
    assert _index_findings([f.to_dict() for f in snap.findings], "backup") == [("stray_entry_skipped", "info")]
    assert snap.index_files and [r["uniq_key"] for r in lookup_key(store, "T", "k1")] == ["U000001"]
    assert _index_findings([f.to_dict() for f in store.findings], "backup") == [("stray_entry_skipped", "info")]
    rc, _, err = run_cli(capsys, "get", root, "--broker-conf", conf, "--broker-version", version, "--key", "k1",
                         "--topic", "T")
    assert rc == 0 and "index/backup" in err and "foreign_index_file" not in err
    if version == "4":  # a numeric directory sorting first: 4.9.8's IndexService.load returns there, loading none
        (tmp_path / "store" / "index" / "00000000000000000").mkdir()
        store = Store(root, load_broker_conf(conf, version))
        snap = load_snapshot(store)
        assert _index_findings([f.to_dict() for f in snap.findings], "00000000000000000") == \
            [("index_load_stops", "error")]
        assert snap.index_files == [] and lookup_key(store, "T", "k1") == []
