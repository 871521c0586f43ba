"""A message whose TOTALSIZE is past the JVM's largest array: the broker's check throws OutOfMemoryError.

CommitLog.checkMessageAndReturnSize allocates ``new byte[totalSize]`` right after the magic (4.9.8
CommitLog.java:306; 5.3.3 :462, after its ``remaining < totalSize - 4`` check at :443, so 5.3.3 never gets
there with a 1 GiB file). Past 2^31 - 3 (64-bit HotSpot's limit; the default -Xmx8g heap holds any smaller
array) that is an OutOfMemoryError: an Error, which neither the check's ``catch (Exception)`` nor
DefaultMessageStore.load's takes, so a recovery that reaches the record ends the start-up (BrokerStartup
exits -1), and 4.9.8's reput thread (``run()`` catches Exception) dies on it.
"""

from __future__ import annotations

import json
import struct
import tracemalloc

import pytest

from storelib.broker.recovery.walk import RecoveryInputs, recovery_walk
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.format.dledger.entries import BODY_OFFSET, encode_entry
from storelib.format.record import JVM_MAX_BYTE_ARRAY, Message, check_record, encode_message
from storelib.scan.scanner import scan_buffer
from tests.conftest import run_cli
from tests.rebuild_storegen import CraftedStore, msg
from tests.test_totalsize_mismatch import five_segments

S = 8192
SEG3 = f"commitlog/{3 * S:020d}"


@pytest.fixture
def five() -> CraftedStore:
    return five_segments()


def _set_total(cs: CraftedStore, p, total: int) -> None:
    cs.segments[p.segment][p.file_offset:p.file_offset + 4] = struct.pack(">i", total)


def _store(tmp_path, cs: CraftedStore, version: str = "4") -> Store:
    root = cs.write(tmp_path / "store")
    return Store(root, BrokerSettings.defaults(version).with_overrides({"mappedFileSizeCommitLog": S}))


def _plan(capsys, store: Store, version: str, *more) -> tuple[int, str]:
    rc, out, _ = run_cli(capsys, "recover", store.loc.path, "--broker-version", version,
                         "--set", f"mappedFileSizeCommitLog={S}", *more)
    return rc, out


@pytest.mark.parametrize("total", [JVM_MAX_BYTE_ARRAY + 1, 2**31 - 1])
def test_a_totalsize_past_the_jvm_array_limit_in_the_recovery_window_stops_the_4x_broker_from_starting(
        tmp_path, five, capsys, total):
    bad = [p for p in five.placed if p.segment == 3][4]
    _set_total(five, bad, total)
    store = _store(tmp_path, five)
    tracemalloc.start()
    try:
        for ok in (True, False):  # normal (the last three segments) and abnormal recovery both reach it
            r = recovery_walk(store, RecoveryInputs.from_settings(store.settings, segment_size=S, version="4",
                                                                  last_exit_ok=ok))
            assert r.failure.reason == "out_of_memory" and r.process_offset == bad.phy
            f = [x for x in r.findings if x.kind == "broker_out_of_memory"]
            assert [(x.severity, x.file, x.offset) for x in f] == [("critical", SEG3, bad.file_offset)]
            assert f"new byte[{total}]" in f[0].detail and "the broker does not start" in f[0].detail
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20  # nothing of the size the record claims
    rc, out = _plan(capsys, store, "4", "--json", "--plan-file", "-")
    plan = json.loads(out)
    assert rc == 1 and not plan["supported"]
    assert [(f["kind"], f["file"], f["offset"]) for f in plan["load_failures"]] == [
        ("broker_out_of_memory", SEG3, bad.file_offset)]
    rc, out = _plan(capsys, store, "4")
    assert rc == 1 and f"THE BROKER DOES NOT START: {SEG3}: TOTALSIZE {total}" in out
    rc, _, err = run_cli(capsys, "recover", store.loc.path, "--broker-version", "4", "--apply",
                         "--backup", tmp_path / "bk", "--set", f"mappedFileSizeCommitLog={S}")
    assert rc != 0 and "not applied" in err
    # 5.3.3 checks the size against the bytes left first: -1, a truncation point, no allocation
    rc, out = _plan(capsys, _store(tmp_path / "v5", five, "5"), "5", "--json", "--plan-file", "-")
    plan = json.loads(out)
    assert plan["load_failures"] == [] and plan["commitlog"]["failure"]["reason"] == "bad_size"


def test_a_totalsize_the_jvm_can_allocate_stays_a_length_mismatch_under_4x():
    """2^31 - 3 bytes is the largest array: the default 8 GiB heap holds it, the fields are read and the
    length check fails (the broker starts and truncates there)."""
    rec = bytearray(encode_message(msg("T", 0, body=b"y" * 10)))
    rec[0:4] = struct.pack(">i", JVM_MAX_BYTE_ARRAY)
    chk = check_record(bytes(rec), 0, line="4")
    assert (chk.kind, chk.size) == ("invalid", JVM_MAX_BYTE_ARRAY) and chk.reason.startswith("length_mismatch")
    rec[0:4] = struct.pack(">i", JVM_MAX_BYTE_ARRAY + 1)
    for line in ("4", None):
        chk = check_record(bytes(rec), 0, line=line)
        assert (chk.kind, chk.size) == ("invalid", -1) and chk.reason.startswith("out_of_memory")
    assert check_record(bytes(rec), 0, line="5").reason.startswith("bad_size")


def test_the_4x_reput_thread_dies_at_a_totalsize_past_the_jvm_array_limit(tmp_path, five):
    """Before the recovery window only the reput reads the record: the broker starts, but its reput thread
    ends there and dispatches nothing after it."""
    bad = [p for p in five.placed if p.segment == 0][2]
    _set_total(five, bad, 2**31 - 1)
    store = _store(tmp_path, five)
    r = recovery_walk(store, RecoveryInputs.from_settings(store.settings, segment_size=S, version="4"))
    assert r.failure is None and r.process_offset == five.placed[-1].phy + five.placed[-1].size
    assert [(d.base, d.start, d.end) for d in r.dispatch] == [(0, 0, bad.file_offset)]
    f = [x for x in r.findings if x.kind == "reput_out_of_memory"]
    assert [(x.severity, x.file, x.offset) for x in f] == [("critical", f"commitlog/{0:020d}", bad.file_offset)]
    assert "ends the reput thread" in f[0].detail
    assert not [x for x in r.findings if x.kind == "broker_out_of_memory"]


def test_the_audit_says_the_broker_does_not_start_at_a_totalsize_past_the_jvm_array_limit(tmp_path, five, capsys):
    bad = [p for p in five.placed if p.segment == 3][4]
    _set_total(five, bad, 2**31 - 1)
    root = five.write(tmp_path / "store")
    rc, out, _ = run_cli(capsys, "audit", root, "--quiet", "--json", "--broker-version", "4",
                         "--set", f"mappedFileSizeCommitLog={S}")
    report = json.loads(out)
    found = [f for f in report["findings"] if f["kind"] == "broker_out_of_memory"]
    assert rc == 1 and [(f["severity"], f["file"], f["offset"]) for f in found] == [
        ("critical", SEG3, bad.file_offset)]
    assert "the broker does not start" in found[0]["detail"]
    # what to run next: the plain --apply refuses a start-up the broker does not make; --force truncates there
    apply = [s for s in report["damage"]["next"] if "--apply" in s["command"]]
    assert len(apply) == 1 and "--force" in apply[0]["command"] and f"{SEG3} @ {bad.file_offset}" in apply[0]["why"]


@pytest.mark.parametrize("line", [None, "4"])
def test_dledger_catches_the_out_of_memory_of_a_totalsize_past_the_jvm_array_limit(line):
    """DLedgerCommitLog.checkMessageAndReturnSize wraps the check in catch (Throwable) (4.9.8 :366): -1 there,
    not the length mismatch an allocatable TOTALSIZE is, and not a broker that does not start."""
    rec = bytearray(encode_message(Message(topic="T", body=b"abc", physical_offset=BODY_OFFSET)))
    rec[0:4] = struct.pack(">i", 2**31 - 1)
    t, end = scan_buffer(encode_entry(bytes(rec), 0, 0, 0) + bytes(200), dledger=True, line=line)
    assert t.num_rows == 0 and (end.kind, end.reason, end.size) == ("invalid", "bad_size", None)
    assert "catches Throwable" in end.detail
