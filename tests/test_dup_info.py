"""5.3.3's duplicationEnable: recovery's checkMessageAndReturnSize fails a record with properties whose DUP_INFO is
missing or does not ``split("_")`` into 2 parts (CommitLog.java:540-545), so the valid log ends there as at a bad
CRC; 4.9.8 has no such check and the reput never applies it. After an abnormal exit only records ending at or
before the checkpoint's confirmPhyOffset are dispatched (CommitLog.java:751-753). recover --plan, the rebuild and
the audit follow both; the scalar check and the batch decoder agree."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.audit import audit_store
from jobs.reports.audit_summary import COMMITLOG_DAMAGE
from storelib.broker.dispatch.dispatch import dispatch_store
from storelib.broker.settings.brokerconf import load_broker_conf
from storelib.broker.settings.store import Store
from storelib.broker.startup.recoveryplan import plan_document
from storelib.broker.startup.startup import simulate
from storelib.format.checkpoint import Checkpoint, write_checkpoint
from storelib.format.properties import dup_info_error
from storelib.format.record import Message, check_record, encode_message
from storelib.scan.scanner import scan_buffer
from tests.conftest import run_cli
from tests.rebuild_storegen import CraftedStore, msg
from tests.test_inner_batch_parse import segment_of

COLUMN_SETS = [["phy_offset"], ["phy_offset", "tags", "keys", "uniq_key", "tags_code"], ["properties"],
               ["properties_raw", "tags"]]
S = 8192
CONF = {"mappedFileSizeCommitLog": S, "mappedFileSizeConsumeQueue": 20 * 40, "maxHashSlotNum": 16,
        "maxIndexNum": 64}
BAD = {"missing": None, "one_part": "7_", "three_parts": "7_0_1", "underscore_only": "_"}


def _dup(value: str | None, **extra: str) -> Message:
    props = {"TAGS": "a", **extra}
    if value is not None:
        props["DUP_INFO"] = value
    return Message(topic="T", body=b"x", properties=props)


@pytest.mark.parametrize("value,ok", [("12_0", True), ("_0", True), ("12_0__", True), ("a b_\u00e9", True),
                                      ("12_", False), ("_", False), ("12_0_1", False), ("__0", False),
                                      ("12__0", False), ("120", False), (None, False)])
def test_dup_info_passes_exactly_when_java_split_gives_two_parts(value, ok):
    # Java's String.split drops trailing empty strings: "12_0__" -> [12, 0], "12_" -> [12], "_" -> []
    assert (dup_info_error(value) is None) == ok


@pytest.mark.parametrize("bad", list(BAD))
def test_missing_or_malformed_dup_info_fails_the_record_when_duplication_is_enabled(bad):
    first = _dup("1_0")
    buf = segment_of([first, _dup(BAD[bad]), _dup("3_0")])
    second = len(encode_message(first, trailing_sep=True))
    chk = check_record(buf, second, line="5", dup_info=True)
    assert (chk.kind, chk.size) == ("invalid", -1) and chk.reason.startswith("dup_info: DUP_INFO")
    for cols in COLUMN_SETS:
        t, end = scan_buffer(buf, line="5", columns=cols, dup_info=True)
        assert (t.num_rows, end.kind, end.reason, end.file_offset) == (1, "invalid", "dup_info", second), cols
        assert end.detail == chk.reason.removeprefix("dup_info: ")
        assert scan_buffer(buf, line="5", columns=cols)[0].num_rows == 3  # duplicationEnable off: no check


def test_a_record_without_properties_is_not_checked():
    # the check sits inside ``propertiesLength > 0`` (CommitLog.java:533-545): a record without any passes
    buf = segment_of([Message(topic="T", body=b"x"), _dup("1_0"), _dup(None)])
    assert check_record(buf, 0, line="5", dup_info=True).kind == "message"
    t, end = scan_buffer(buf, line="5", columns=["phy_offset"], dup_info=True)
    assert (t.num_rows, end.reason) == (2, "dup_info")


def test_dup_info_is_checked_before_delay_and_the_length():
    sched = Message(topic="SCHEDULE_TOPIC_XXXX", body=b"x", properties={"DELAY": "three", "TAGS": "a"})
    t, end = scan_buffer(segment_of([sched]), line="5", columns=["phy_offset"], dup_info=True)
    assert (t.num_rows, end.reason) == (0, "dup_info")
    buf = bytearray(segment_of([_dup("x"), _dup("2_0")]))
    buf[0:4] = (int.from_bytes(buf[0:4], "big") + 4).to_bytes(4, "big")  # TOTALSIZE 4 more than the fields
    assert check_record(bytes(buf), 0, line="5").reason.startswith("length_mismatch")
    chk = check_record(bytes(buf), 0, line="5", dup_info=True)  # DUP_INFO fails before the length: -1
    assert (chk.kind, chk.size, chk.reason.split(":")[0]) == ("invalid", -1, "dup_info")
    t, end = scan_buffer(bytes(buf), line="5", columns=["phy_offset"], dup_info=True)
    assert (t.num_rows, end.reason, end.size) == (0, "dup_info", None)


def test_replaced_property_text_is_checked_too():
    raw = "TAGS\x01\udcff\x02DUP_INFO\x017\x02"  # a raw FF byte: the column-wise parser for replaced text
    buf = segment_of([_dup("1_0"), Message(topic="T", body=b"x", properties_raw=raw)])
    for cols in COLUMN_SETS:
        t, end = scan_buffer(buf, line="5", columns=cols, dup_info=True)
        assert (t.num_rows, end.reason) == (1, "dup_info"), cols


# ---- recover --plan, rebuild and audit on a crafted 5.3.3 store


def _store(tmp_path, dup: bool, bad: str | None = "missing", n: int = 60, k: int = 57) -> tuple[str, str, list]:
    """A 5.3.3 store of ``n`` messages over several segments, its queues dispatched, record ``k``'s DUP_INFO
    ``BAD[bad]`` (the others valid); broker.conf with duplicationEnable=``dup``. (root, conf, placed)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    conf = tmp_path / "broker.conf"
    conf.write_text("".join(f"{a}={b}\n" for a, b in {**CONF, "duplicationEnable": str(dup).lower()}.items()))
    cs = CraftedStore(S, version="5")
    for i in range(n):
        value = BAD[bad] if bad is not None and i == k else f"{i}_0"
        extra = {} if value is None else {"DUP_INFO": value}
        cs.append(msg("T", i % 2, body=bytes([65 + i % 26]) * 300, keys=f"k{i}", uniq=f"U{i:06d}", extra=extra))
    root = tmp_path / "store"
    cs.write(root)
    dispatch_store(str(root), load_broker_conf(str(conf), "5"))
    last = cs.placed[-1].msg.store_timestamp
    write_checkpoint(str(root), Checkpoint(last, last, 0))
    (root / "lock").write_bytes(b"lock")
    return str(root), str(conf), cs.placed


def _cq_entries(root) -> int:
    """Entries in the consume queues of topic T under ``root`` (non-zero 20-byte units)."""
    d = os.path.join(root, "consumequeue", "T")
    n = 0
    for q in os.listdir(d):
        for f in os.listdir(os.path.join(d, q)):
            with open(os.path.join(d, q, f), "rb") as fh:
                units = np.frombuffer(fh.read(), np.uint8).reshape(-1, 20)
            n += int(units.any(axis=1).sum())
    return n


def _plan_cli(capsys, tmp_path, root: str, conf: str) -> dict:
    out = tmp_path / "plan.json"
    rc, _, _ = run_cli(capsys, "recover", root, "--broker-conf", conf, "--broker-version", "5", "--plan",
                       "--plan-file", out)
    assert rc in (0, 1)
    with open(out) as f:
        return json.load(f)


@pytest.mark.parametrize("bad", ["missing", "three_parts"])
def test_recover_plan_ends_the_log_at_a_bad_dup_info_only_with_duplication_enabled(tmp_path, capsys, bad):
    root, conf, placed = _store(tmp_path / "on", True, bad)
    plan = _plan_cli(capsys, tmp_path / "on", root, conf)
    assert plan["commitlog"]["process_offset"] == placed[57].phy
    assert plan["commitlog"]["failure"]["reason"] == "dup_info"
    assert plan["lost"]["totals"]["messages"] == 3 and plan["lost"]["totals"]["intact"] == 3
    root, conf, placed = _store(tmp_path / "off", False, bad)
    plan = _plan_cli(capsys, tmp_path / "off", root, conf)
    assert plan["commitlog"]["process_offset"] == placed[-1].phy + placed[-1].size
    assert plan["commitlog"]["failure"] is None and plan["lost"]["totals"]["messages"] == 0
    root, conf, placed = _store(tmp_path / "valid", True, None)  # every DUP_INFO valid: nothing is lost
    plan = _plan_cli(capsys, tmp_path / "valid", root, conf)
    assert plan["commitlog"]["process_offset"] == placed[-1].phy + placed[-1].size


def test_rebuild_dispatches_up_to_a_bad_dup_info_only_with_duplication_enabled(tmp_path, capsys):
    # the rebuild is a start on empty queues: recoverNormally from the first segment checks every record
    for dup in (True, False):
        root, conf, placed = _store(tmp_path / str(dup), dup, "one_part", k=20)
        out = tmp_path / str(dup) / "out"
        rc, _, err = run_cli(capsys, "rebuild", root, "--out", out, "--broker-conf", conf, "--broker-version", "5",
                             "--engine", "local")
        assert rc == 0, err
        assert _cq_entries(str(out)) == (20 if dup else len(placed)), dup


def test_audit_reports_a_bad_dup_info_as_commitlog_damage_only_with_duplication_enabled(tmp_path):
    for dup in (True, False):
        root, conf, placed = _store(tmp_path / str(dup), dup, "missing")
        report = audit_store(root, broker_conf=conf, version="5", quiet=True)
        damage = [(f["file"], f["offset"]) for f in report["findings"] if f["kind"] in COMMITLOG_DAMAGE]
        if dup:
            assert damage == [(f"commitlog/{3 * S:020d}", placed[57].file_offset)]
            assert report["damage"]["process_offset"] == placed[57].phy and report["damage"]["messages_lost"] == 3
        else:
            assert damage == [] and not report.get("damage")


def test_abnormal_recovery_dispatches_only_up_to_the_confirm_offset_with_duplication(tmp_path):
    """After a crash with duplicationEnable only records ending at or before the checkpoint's confirmPhyOffset
    are dispatched (CommitLog.java:751-753); the reput starts and ends at the confirm offset recovery sets."""
    for dup in (True, False):
        root, conf, placed = _store(tmp_path / str(dup), dup, None)
        shutil.rmtree(os.path.join(root, "consumequeue"))
        first = placed[0].msg.store_timestamp
        confirm = placed[30].phy + placed[30].size
        write_checkpoint(root, Checkpoint(first + 3000, first + 3000, 0, 0, confirm))  # recovery from segment 0
        open(os.path.join(root, "abort"), "wb").close()
        sim = simulate(Store(root, load_broker_conf(conf, "5")))
        assert sim.walk.mode == "abnormal" and sim.walk.process_offset == placed[-1].phy + placed[-1].size
        assert sim.recovery_records == (31 if dup else len(placed)), dup
        assert ("recovery_unconfirmed" in {f.kind for f in sim.findings}) == dup
        doc = plan_document(sim, lost=False)
        assert doc["dispatch"]["recovery"][0]["only_ending_at_or_before"] == (confirm if dup else None)
        reput = doc["dispatch"]["reput"]
        assert (reput["from"], reput["to"]) == (placed[-1].phy if dup else sim.walk.process_offset,) * 2


def test_gen_dup_info_writes_a_store_that_recovers_whole_with_duplication_enabled(tmp_path, capsys):
    conf = tmp_path / "broker.conf"
    conf.write_text("duplicationEnable=true\nmappedFileSizeCommitLog=65536\n")
    ends = {}
    for flag in (["--dup-info"], []):
        out = tmp_path / f"gen{len(flag)}"
        rc, _, err = run_cli(capsys, "gen", out, "--messages", "300", "--version", "5", "--segment-size", "65536",
                             "--tx-ratio", "0.1", "--compressed-ratio", "0", *flag)
        assert rc == 0, err
        sim = simulate(Store(str(out), load_broker_conf(str(conf), "5")))
        ends[bool(flag)] = (sim.walk.process_offset, sim.walk.failure and sim.walk.failure.reason)
        if flag:  # every record, transaction op records too, carries a valid DUP_INFO
            store = Store(str(out), load_broker_conf(str(conf), "5"))
            values = [dict(p).get("DUP_INFO") for b in store.scan(columns=["properties"])
                      for p in b.column("properties").to_pylist()]
            assert len(values) >= 300 and all(dup_info_error(v) is None for v in values)
    # without DUP_INFO the walk ends at the first record of its window (the last segment: CQ max in it)
    assert ends[True][1] is None and ends[False][1] == "dup_info" and ends[False][0] < ends[True][0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.none(), st.text(alphabet="_a\u00e9", max_size=5)), min_size=1, max_size=12),
       st.sampled_from([64, 300, 4 << 20]), st.sampled_from(COLUMN_SETS))
def test_the_batch_decoder_and_the_scalar_check_judge_every_dup_info_alike(values, window, cols):
    buf = segment_of([_dup(v, KEYS=f"k{i}") for i, v in enumerate(values)])
    pos, starts = 0, []
    while (chk := check_record(buf, pos, line="5", dup_info=True)).kind == "message":
        starts.append(pos)
        pos += chk.size
    t, end = scan_buffer(buf, line="5", columns=list(dict.fromkeys(["phy_offset", *cols])), window=window,
                         dup_info=True)
    assert t.column("phy_offset").to_pylist() == starts
    # the records before the first whose value fails Java's rule (an empty value is no property at all)
    assert len(starts) == next((i for i, v in enumerate(values) if dup_info_error(v or None)), len(values))
    if chk.kind == "blank":
        assert (end.kind, end.reason) == ("blank", None)
    else:
        assert (end.kind, end.reason, end.detail) == ("invalid", "dup_info", chk.reason.removeprefix("dup_info: "))


def test_a_normal_start_that_walks_no_valid_record_keeps_the_checkpoints_confirm_offset(tmp_path):
    """recoverNormally starts lastValidMsgPhyOffset at getConfirmOffset(), with duplicationEnable the value loaded
    from the checkpoint (CommitLog.java:347, 669-670), and sets it back when no record of the window is valid
    (:397); the reput then starts and ends there."""
    root, conf, placed = _store(tmp_path, True, "missing", k=54)
    assert placed[54].file_offset == 0 and placed[54].segment == 3  # the window's first record fails
    last = placed[-1].msg.store_timestamp
    write_checkpoint(root, Checkpoint(last, last, 0, 0, 777))
    plan = plan_document(simulate(Store(root, load_broker_conf(conf, "5"))), lost=False)
    assert plan["commitlog"]["process_offset"] == placed[54].phy
    assert plan["checkpoint_after"]["confirm_phy_offset"] == 777
    assert (plan["dispatch"]["reput"]["from"], plan["dispatch"]["reput"]["to"]) == (777, 777)
