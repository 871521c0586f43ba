"""rmqstore audit: each corruption kind injected into a generated store is reported exactly (kind, file,
offset) with nothing spurious at warning level or above; clean stores report clean; both engines agree;
incremental runs carry findings forward; the HTML report renders in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from jobs.audit import audit_store, exit_code, main, summary_text, write_reports
from storelib.broker.dispatch.cqwriter import build_consume_queues, write_consume_queues
from storelib.broker.index.indexbuild import build_index_files, index_key_rows
from storelib.format.checkpoint import Checkpoint, write_checkpoint
from storelib.format.configjson import write_config
from storelib.format.indexfile import IndexGeometry
from storelib.format.record import Message, blank_record, encode_message
from storelib.scan.commitlog import CommitLog

from .conftest import SAMPLE_NAMES, SAMPLES

SEG = 64 * 1024
CQ_SEG = 1000  # 50 units per CQ file
SLOTS, INDEX_NUM = 64, 200
BASE_TS = 1_700_000_000_000
TOPICS = [("OrderEvents", 2), ("PaymentNotify", 2)]
REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "tests" / "artifacts"


# --------------------------------------------------------------------------------------------------
# a small store written the broker's way (records, blank end records, CQ and index by the broker's rules)
# --------------------------------------------------------------------------------------------------


def _messages(n: int, dup_at: int | None = None) -> list[Message]:
    rng = np.random.default_rng(7)
    qnext: dict[tuple[str, int], int] = {}
    out = []
    for i in range(n):
        topic, nq = TOPICS[i % len(TOPICS)]
        qid = int(rng.integers(nq))
        key = (topic, qid)
        qo = qnext.get(key, 0)
        if dup_at is not None and i == dup_at and qo > 0:
            qo -= 1  # the writer reuses the previous offset: a duplicate QUEUEOFFSET
        qnext[key] = qo + 1
        props = {"TAGS": f"Tag{i % 3}", "UNIQ_KEY": f"7F000001000{i:021X}", "WAIT": "true"}
        if i % 4 != 3:
            props["KEYS"] = f"order-{i} cust-{i % 17}"
        body = bytes(rng.integers(0, 256, int(rng.integers(40, 400)), dtype=np.uint8))
        out.append(Message(topic=topic, body=body, queue_id=qid, queue_offset=qo, born_timestamp=BASE_TS + i * 1000 - 3,
                           store_timestamp=BASE_TS + i * 1000, born_host="10.0.0.7:52011",
                           store_host="10.0.0.1:10911", properties=props))
    return out


def build_store(root: Path, n: int = 420, dup_at: int | None = None, segments_min: int = 3) -> Path:
    """Write commitlog/, consumequeue/, index/, checkpoint, config/ and broker.conf under ``root``."""
    (root / "commitlog").mkdir(parents=True)
    segs: list[bytearray] = [bytearray(SEG)]
    pos = 0
    for m in _messages(n, dup_at):
        rec_len = len(encode_message(m))
        if rec_len + 8 > SEG - pos:
            segs[-1][pos : pos + 8] = blank_record(SEG - pos)
            segs.append(bytearray(SEG))
            pos = 0
        m.physical_offset = (len(segs) - 1) * SEG + pos
        rec = encode_message(m)
        segs[-1][pos : pos + len(rec)] = rec
        pos += len(rec)
    assert len(segs) >= segments_min
    for i, s in enumerate(segs):
        (root / "commitlog" / f"{i * SEG:020d}").write_bytes(bytes(s))
    table = CommitLog(str(root / "commitlog"), SEG).read_table()
    images = build_consume_queues(table, segment_size=CQ_SEG)
    write_consume_queues(images, str(root / "consumequeue"), CQ_SEG)
    g = IndexGeometry(SLOTS, INDEX_NUM)
    files = build_index_files(index_key_rows(table), geometry=g)
    (root / "index").mkdir()
    for im in files:
        im.write(root / "index" / im.name)
    ts = table.column("store_timestamp").to_numpy()
    full_end = files[-2].header.end_timestamp if len(files) > 1 else 0
    write_checkpoint(str(root), Checkpoint(int(ts[-3]), int(ts[-3]), full_end))
    (root / "config").mkdir()
    offsets = {f"{t}@group_a": {q: img.end // 20 // 2 for (t, q), img in images.items() if t == t2}
               for t2, _ in TOPICS for t in [t2]}
    write_config(root / "config" / "consumerOffset.json", {"offsetTable": offsets})
    write_config(root / "config" / "consumerOffset.json", {"offsetTable": offsets})  # leaves a .bak
    write_config(root / "config" / "topics.json", {"dataVersion": {"counter": 2, "timestamp": BASE_TS},
                                                   "topicConfigTable": {t: {"topicName": t, "readQueueNums": q,
                                                                            "writeQueueNums": q} for t, q in TOPICS}})
    (root / "lock").write_bytes(b"lock")
    (root / "broker.conf").write_text(f"mappedFileSizeCommitLog={SEG}\nmappedFileSizeConsumeQueue={CQ_SEG}\n"
                                      f"maxHashSlotNum={SLOTS}\nmaxIndexNum={INDEX_NUM}\n")
    return root


def store_fixtures(tag: str):
    """(base_store, store) fixtures for a test module: the generated store built once per module and
    a fresh copy of it per test (the audit test modules share this pair)."""

    @pytest.fixture(scope="module")
    def base_store(tmp_path_factory) -> Path:
        return build_store(tmp_path_factory.mktemp(tag) / "store")

    @pytest.fixture
    def store(tmp_path, base_store) -> Path:
        dst = tmp_path / "store"
        shutil.copytree(base_store, dst)
        return dst

    return base_store, store


base_store, store = store_fixtures("audit")


def run(root: Path, **kw) -> dict:
    return audit_store(str(root), broker_conf=str(root / "broker.conf"), quiet=True, **kw)


def serious(rep: dict) -> set[tuple[str, str | None, int | None]]:
    return {(f["kind"], f["file"], f["offset"]) for f in rep["findings"] if f["severity"] != "info"}


def records(root: Path):
    return CommitLog(str(root / "commitlog"), SEG).read_table().to_pylist()


def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


def seg_file(root: Path, phy: int) -> tuple[Path, str, int]:
    base = phy // SEG * SEG
    return root / "commitlog" / f"{base:020d}", f"commitlog/{base:020d}", phy - base


def body_pos(rec: dict) -> int:
    return rec["phy_offset"] + 88  # IPv4/IPv4: BODY at 88


# --------------------------------------------------------------------------------------------------
# clean stores
# --------------------------------------------------------------------------------------------------


def test_clean_generated_store_reports_clean(store):
    rep = run(store)
    assert serious(rep) == set()
    assert exit_code(rep, "warning") == 0
    assert rep["summary"]["records"] == 420
    assert rep["summary"]["queues"] == 4
    assert all(s["worst"] is None for s in rep["segments"])


@pytest.mark.parametrize("version", ["4.9.8", "5.3.3"])
def test_shared_sample_stores_report_clean(version, sample_498, sample_533):
    root = (sample_498 if version == "4.9.8" else sample_533) / "store"
    conf = SAMPLES / f"{SAMPLE_NAMES[version]}.broker.conf"
    rep = audit_store(str(root), broker_conf=str(conf), version=version[0], quiet=True)
    assert serious(rep) == set()
    assert rep["summary"]["records"] == (2000 if version == "4.9.8" else 2018)


@pytest.mark.parametrize("version", ["4", "5"])
def test_store_from_storelib_gen_reports_clean(version, tmp_path):
    from storelib.broker.settings.brokerconf import BrokerSettings
    from storelib.generator.gen import generate
    from storelib.generator.genplan import GenConfig

    keys = {"mappedFileSizeCommitLog": 256 * 1024, "mappedFileSizeConsumeQueue": 2000, "maxHashSlotNum": 500,
            "maxIndexNum": 2000}
    if version == "5":  # a 5.x-only key: a 4.x broker.conf does not have it
        keys["enabledAppendPropCRC"] = True
    s = BrokerSettings.defaults(version).with_overrides(keys)
    generate(tmp_path / "g", GenConfig(messages=3000, version=version, seed=5), s)
    conf = tmp_path / "broker.conf"
    conf.write_text("".join(f"{k}={str(v).lower()}\n" for k, v in keys.items()))
    rep = audit_store(str(tmp_path / "g"), broker_conf=str(conf), version=version, quiet=True)
    assert serious(rep) == set()
    assert rep["summary"]["records"] > 3000


# --------------------------------------------------------------------------------------------------
# commitlog corruption
# --------------------------------------------------------------------------------------------------


def test_bit_flip_in_body_is_a_crc_mismatch_at_that_record(store):
    rec = records(store)[17]
    path, name, off = seg_file(store, rec["phy_offset"])
    flip(path, off + 88 + 5)
    rep = run(store)
    assert serious(rep) == {("body_crc_mismatch", name, off)}


def test_bit_flip_in_magic_is_a_corrupt_region_resynchronised_at_the_next_record(store):
    recs = records(store)
    rec, nxt = recs[30], recs[31]
    path, name, off = seg_file(store, rec["phy_offset"])
    flip(path, off + 5)
    rep = run(store)
    assert serious(rep) == {("corrupt_region", name, off)}
    (region,) = rep["regions"]
    assert region["bytes_lost"] == rec["size"] and region["end"] == nxt["phy_offset"] % SEG
    assert rep["summary"]["records"] == 419  # everything after the bad record is still audited


def test_bit_flip_in_physicaloffset_field_is_reported_alone(store):
    rec = records(store)[40]
    path, name, off = seg_file(store, rec["phy_offset"])
    flip(path, off + 28 + 6)
    rep = run(store)
    assert serious(rep) == {("physical_offset_mismatch", name, off)}


def test_torn_tail_is_reported_at_the_last_record(store):
    rec = records(store)[-1]
    path, name, off = seg_file(store, rec["phy_offset"])
    with open(path, "r+b") as f:
        f.seek(off + rec["size"] // 2)
        f.write(bytes(rec["size"] - rec["size"] // 2))
    rep = run(store)
    assert serious(rep) == {("torn_tail", name, off)}


def test_zeroed_middle_region_reports_bytes_lost_and_audits_the_rest(store):
    recs = records(store)
    a, c = recs[50], recs[53]
    assert a["phy_offset"] // SEG == c["phy_offset"] // SEG
    path, name, off = seg_file(store, a["phy_offset"])
    end = c["phy_offset"] + 7 - a["phy_offset"] // SEG * SEG
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(bytes(end - off))
    rep = run(store)
    assert serious(rep) == {("zeroed_region", name, off)}
    (region,) = rep["regions"]
    assert region["end"] == recs[54]["phy_offset"] % SEG
    assert rep["summary"]["records"] == 420 - 4


def test_missing_segment_is_critical_and_its_consequences_are_not_repeated(store):
    names = sorted(os.listdir(store / "commitlog"))
    os.unlink(store / "commitlog" / names[1])
    rep = run(store)
    assert serious(rep) == {("missing_segment", f"commitlog/{names[2]}", None)}
    assert exit_code(rep, "error") == 1


def test_wrong_segment_size_is_reported(store):
    names = sorted(os.listdir(store / "commitlog"))
    last = store / "commitlog" / names[-1]
    data = last.read_bytes()
    last.write_bytes(data[: len(data) - 1000])
    rep = run(store)
    assert serious(rep) == {("wrong_segment_size", f"commitlog/{names[-1]}", None)}


# --------------------------------------------------------------------------------------------------
# consume queues
# --------------------------------------------------------------------------------------------------


def _cq(store: Path, topic: str = "OrderEvents", qid: int = 0) -> list[Path]:
    return sorted((store / "consumequeue" / topic / str(qid)).iterdir())


def test_cq_entry_pointing_mid_record(store):
    f = _cq(store)[0]
    with open(f, "r+b") as fh:
        fh.seek(20 * 7)
        phy = struct.unpack(">q", fh.read(8))[0]
        fh.seek(20 * 7)
        fh.write(struct.pack(">q", phy + 10))
    rep = run(store)
    assert serious(rep) == {("cq_entry_not_record_start", f"consumequeue/OrderEvents/0/{f.name}", 140)}


def test_cq_entry_missing_in_the_middle(store):
    f = _cq(store)[0]
    with open(f, "r+b") as fh:
        fh.seek(20 * 9)
        fh.write(bytes(20))
    rep = run(store)
    assert serious(rep) == {("cq_entry_missing", f"consumequeue/OrderEvents/0/{f.name}", 180)}


def test_cq_extra_entries_past_the_commitlog(store):
    f = _cq(store, "PaymentNotify", 1)[-1]
    data = bytearray(f.read_bytes())
    units = np.frombuffer(bytes(data), dtype=[("p", ">i8"), ("s", ">i4"), ("t", ">i8")])
    k = int(np.flatnonzero(units["s"] <= 0)[0])
    assert k + 3 <= len(units)
    end = sum(p.stat().st_size for p in (store / "commitlog").iterdir())
    for i in range(3):
        data[20 * (k + i) : 20 * (k + i + 1)] = struct.pack(">qiq", end + 300 * i, 300, 0)
    f.write_bytes(bytes(data))
    rep = run(store)
    assert serious(rep) == {("cq_entry_past_commitlog", f"consumequeue/PaymentNotify/1/{f.name}", 20 * k)}


def test_duplicate_queue_offset(tmp_path):
    root = build_store(tmp_path / "store", dup_at=101)
    rec = next(r for r in records(root) if r["phy_offset"] >= 0 and r["store_timestamp"] == BASE_TS + 101 * 1000)
    _, name, off = seg_file(root, rec["phy_offset"])
    rep = run(root)
    assert serious(rep) == {("duplicate_queue_offset", name, off)}


# --------------------------------------------------------------------------------------------------
# index, checkpoint, markers, config
# --------------------------------------------------------------------------------------------------


def test_index_entry_with_wrong_hash(store):
    f = sorted((store / "index").iterdir())[0]
    g = IndexGeometry(SLOTS, INDEX_NUM)
    pos = g.entry_pos(5)
    with open(f, "r+b") as fh:
        fh.seek(pos)
        h = struct.unpack(">i", fh.read(4))[0]
        fh.seek(pos)
        fh.write(struct.pack(">i", h ^ 0x100))
    rep = run(store)
    assert serious(rep) == {("index_entry_wrong_hash", f"index/{f.name}", pos)}


def test_index_header_lying_about_end_offset(store):
    f = sorted((store / "index").iterdir())[1]
    with open(f, "r+b") as fh:
        fh.seek(24)
        v = struct.unpack(">q", fh.read(8))[0]
        fh.seek(24)
        fh.write(struct.pack(">q", v + 1000))
    rep = run(store)
    assert serious(rep) == {("end_phy_offset_mismatch", f"index/{f.name}", 24)}


def test_checkpoint_ahead_of_the_data(store):
    last_ts = records(store)[-1]["store_timestamp"]
    write_checkpoint(str(store), Checkpoint(last_ts + 86_400_000, last_ts - 5000, 0))
    rep = run(store)
    assert serious(rep) == {("checkpoint_ahead_of_data", "checkpoint", 0)}


def test_checkpoint_in_the_future(store):
    write_checkpoint(str(store), Checkpoint(BASE_TS, 4_000_000_000_000, 0))
    rep = run(store, now_ms=BASE_TS + 10**9)
    assert serious(rep) == {("checkpoint_in_future", "checkpoint", 8)}


def test_abort_file_present_says_what_the_broker_would_do(store):
    (store / "abort").write_bytes(b"")
    rep = run(store)
    assert serious(rep) == {("abort_present", "abort", None)}
    (f,) = [f for f in rep["findings"] if f["kind"] == "abort_present"]
    assert "abnormal recovery" in f["detail"] and f["extra"]["index_files_deleted"]


def test_truncated_json_falls_back_to_bak(store):
    p = store / "config" / "consumerOffset.json"
    p.write_bytes(p.read_bytes()[:40])
    rep = run(store)
    kinds = serious(rep)
    assert {k for k, _, _ in kinds} == {"config_unparseable"}
    (f,) = [f for f in rep["findings"] if f["kind"] == "config_unparseable"]
    assert f["file"] == "config/consumerOffset.json" and f["offset"] is not None and "bak" in f["detail"]


def test_consumer_offset_past_the_queue(store):
    rep0 = run(store)
    q = next(q for q in rep0["queues"] if q["topic"] == "OrderEvents" and q["queue_id"] == 1)
    offsets = {"OrderEvents@group_a": {0: 1, 1: q["max_offset"] + 5}}
    write_config(store / "config" / "consumerOffset.json", {"offsetTable": offsets})
    rep = run(store)
    assert serious(rep) == {("consumer_offset_past_queue", "config/consumerOffset.json", None)}
    (f,) = [f for f in rep["findings"] if f["kind"] == "consumer_offset_past_queue"]
    assert f["extra"]["queue_id"] == 1 and f["extra"]["offset"] == q["max_offset"] + 5


# --------------------------------------------------------------------------------------------------
# engines, incremental runs, reports, command line
# --------------------------------------------------------------------------------------------------


def _comparable(rep: dict) -> dict:
    return {k: rep[k] for k in ("findings", "summary", "segments", "regions", "queues", "consumers", "index", "sizes",
                                "traffic", "checkpoint", "timer_store")}


def test_spark_engine_gives_the_same_report_as_local(store, spark):
    rec = records(store)[17]
    path, _, off = seg_file(store, rec["phy_offset"])
    flip(path, off + 88 + 5)
    flip(store / "commitlog" / f"{SEG:020d}", 5000 + 3)
    local = run(store, engine="local")
    dist = run(store, engine="spark", spark=spark)
    assert _comparable(dist) == _comparable(local)
    assert len(serious(local)) >= 2


def test_incremental_audit_carries_findings_and_audits_only_appended_data(store, tmp_path):
    state = tmp_path / "audit.state"
    rec = records(store)[17]
    path, name, off = seg_file(store, rec["phy_offset"])
    flip(path, off + 88 + 5)
    first = run(store, since=str(state))
    assert first["run"]["segments_audited"] == len(first["segments"])
    # append one record to the last segment, as a broker would
    recs = records(store)
    last = recs[-1]
    lpath, lname, loff = seg_file(store, last["phy_offset"])
    m = Message(topic="OrderEvents", body=b"appended", queue_id=0, queue_offset=10**6, store_timestamp=BASE_TS,
                physical_offset=last["phy_offset"] + last["size"])
    with open(lpath, "r+b") as fh:
        fh.seek(loff + last["size"])
        fh.write(encode_message(m))
    second = run(store, since=str(state))
    assert second["run"]["segments_audited"] == 1 and second["run"]["segments_carried"] == len(first["segments"]) - 1
    assert second["run"]["bytes_audited"] == SEG - (loff + last["size"])
    assert second["summary"]["records"] == 421
    (crc,) = [f for f in second["findings"] if f["kind"] == "body_crc_mismatch"]
    assert (crc["file"], crc["offset"]) == (name, off) and crc["extra"]["carried_forward"]
    assert ("queue_offset_gap", lname, loff + last["size"]) in serious(second)  # the new record is audited
    full = run(store)
    assert serious(full) == serious(second)


def test_reports_json_schema_and_html_sections_in_headless_chromium(store, tmp_path):
    flip(seg_file(store, records(store)[17]["phy_offset"])[0], seg_file(store, records(store)[17]["phy_offset"])[2] + 93)
    rep = run(store)
    jp, hp = write_reports(rep, str(tmp_path / "rep"))
    data = json.loads(Path(jp).read_text())
    assert data["schema"] == "rmqstore.audit/1"
    for f in data["findings"]:
        assert set(f) == {"kind", "severity", "file", "offset", "detail", "extra"}
    page = Path(hp).read_text()
    for section in ("summary", "findings", "health", "traffic", "sizes", "lag"):
        assert f'<section id="{section}">' in page
    assert "<script" not in page and "http" not in page.split("</title>", 1)[1]
    chromium = next((shutil.which(c) for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)), None)
    if chromium is None:
        pytest.skip("chromium not found (install the Debian package 'chromium')")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "audit-report.png"
    if shot.exists():
        shot.unlink()
    common = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              f"--user-data-dir={tmp_path / 'chrome'}"]
    subprocess.run([*common, f"--screenshot={shot}", "--window-size=1280,2400", f"file://{hp}"],
                   check=True, capture_output=True, timeout=120)
    assert shot.stat().st_size > 10_000
    dom = subprocess.run([*common, "--dump-dom", f"file://{hp}"], check=True, capture_output=True, timeout=120,
                         text=True).stdout
    for heading in ("Summary", "Findings", "Segment health map", "Traffic per topic over time",
                    "Message size distribution", "Queue lag"):
        assert f">{heading}</h2>" in dom
    assert "body_crc_mismatch" in dom


def test_command_line_exit_codes_and_summary(store, tmp_path, capsys):
    args = [str(store), "--broker-conf", str(store / "broker.conf"), "--quiet"]
    assert main(args) == 0
    flip(seg_file(store, records(store)[3]["phy_offset"])[0], seg_file(store, records(store)[3]["phy_offset"])[2] + 90)
    assert main([*args, "--report-dir", str(tmp_path / "r")]) == 1
    assert main([*args, "--fail-on", "critical"]) == 0
    err = capsys.readouterr().err
    assert "body_crc_mismatch" in err and "FINDINGS" in err
    assert (tmp_path / "r" / "audit.html").exists()
    assert main([str(tmp_path / "nope"), "--quiet"]) == 2
    from jobs.cli import main as cli_main

    assert cli_main(["audit", *args]) == 1
    rep = run(store)
    assert "exit 1" in summary_text(rep, "error")
