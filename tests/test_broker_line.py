"""The broker line (4.x or 5.x) is detected once, in storelib, and every command says what and why."""

from __future__ import annotations

import json

import pytest

from storelib.broker.settings.brokerline import FIVE_X_ONLY_KEYS, detect_broker_line, normalise_version
from storelib.broker.settings.store import load_settings
from storelib.errors import StoreError
from storelib.fileio.bytesource import resolve
from tests.conftest import broker_conf, run_cli


def test_a_4x_store_without_5x_evidence_is_4x_by_default(sample_498):
    line = detect_broker_line(resolve(str(sample_498 / "store")))
    assert (line.version, line.source, line.conflict) == ("4", "default", None)


def test_a_5x_store_is_recognised_by_its_v2_records_crc_property_and_files(sample_533):
    line = detect_broker_line(resolve(str(sample_533 / "store")))
    assert (line.version, line.source) == ("5", "store")
    text = " ".join(line.reasons)
    assert "V2 record" in text and "__CRC32#" in text and "compaction exists" in text
    assert "commitlog/00000000000000000000 @ 9138" in text  # the first V2 record of the sample


def test_broker_conf_keys_only_5x_has_decide_before_the_store(sample_498, tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("timerWheelEnable=true\nmappedFileSizeCommitLog=524288\n")
    s = load_settings(str(conf), None, None, resolve(str(sample_498 / "store")))
    assert s.version == "5" and s.line.source == "broker.conf" and "timerWheelEnable" in s.line.reasons[0]
    assert "mappedFileSizeCommitLog" not in FIVE_X_ONLY_KEYS and "enabledAppendPropCRC" in FIVE_X_ONLY_KEYS


def test_an_explicit_version_wins_and_a_conflict_explains_the_cost(sample_533):
    line = detect_broker_line(resolve(str(sample_533 / "store")), explicit="4")
    assert (line.version, line.source) == ("4", "option")
    assert "V2 record" in line.conflict and "drop" in line.conflict


@pytest.mark.parametrize("given,expected", [("4", "4"), ("5.3.3", "5"), ("4.9.8", "4"), ("auto", None), (None, None)])
def test_version_spellings(given, expected):
    assert normalise_version(given) == expected


def test_an_unknown_version_is_a_clear_error():
    with pytest.raises(StoreError, match="4, 5 or auto"):
        normalise_version("6")


def test_audit_of_the_5x_sample_with_its_broker_conf_is_clean(capsys, sample_533, tmp_path):
    rc, _, _ = run_cli(capsys, "audit", sample_533 / "store", "--broker-conf", broker_conf("5.3.3"), "--quiet",
                       "--report-dir", tmp_path / "r")
    report = json.loads((tmp_path / "r" / "audit.json").read_text())
    assert rc == 0 and report["summary"]["by_severity"]["error"] == 0
    assert report["settings"]["broker_line"]["version"] == "5"
    assert report["settings"]["broker_line"]["source"] == "broker.conf"


def test_audit_of_the_5x_sample_without_broker_conf_is_clean(capsys, sample_533):
    rc, out, _ = run_cli(capsys, "audit", sample_533 / "store", "--quiet", "--json")
    report = json.loads(out)
    assert rc == 0 and report["settings"]["broker_line"]["source"] == "store"


def test_a_wrong_broker_version_is_one_finding_not_a_flood(capsys, sample_533):
    rc, out, _ = run_cli(capsys, "audit", sample_533 / "store", "--broker-conf", broker_conf("5.3.3"),
                         "--broker-version", "4", "--quiet", "--json")
    report = json.loads(out)
    v2 = [f for f in report["findings"] if f["kind"] == "v2_record_on_4x"]
    errors = [f for f in report["findings"] if f["severity"] in ("error", "critical")]
    assert rc == 1 and len(v2) == 1 and errors == v2
    assert v2[0]["extra"]["count"] == 39 and v2[0]["offset"] == 9138
    assert "--broker-version 5" in v2[0]["detail"]
    assert report["settings"]["broker_line"]["conflict"]


def test_info_prints_the_detected_line_and_why(capsys, sample_533):
    rc, out, _ = run_cli(capsys, "info", sample_533 / "store", "--no-scan")
    line = next(x for x in out.splitlines() if x.startswith("broker"))
    assert rc == 0 and "5.x rules (store:" in line and "V2 record" in line
    rc, out, _ = run_cli(capsys, "info", sample_533 / "store", "--no-scan", "--json")
    assert json.loads(out)["broker_line"]["version"] == "5"


def test_rebuild_manifest_and_recover_plan_record_the_line(capsys, sample_533, tmp_path):
    rc, _, _ = run_cli(capsys, "rebuild", sample_533 / "store", "--out", tmp_path / "out", "--engine", "local")
    manifest = json.loads(next((tmp_path / "out").rglob("*manifest*.json")).read_text())
    assert rc == 0 and manifest["settings"]["broker_line"]["version"] == "5"
    rc, out, _ = run_cli(capsys, "recover", sample_533 / "store", "--json", "--plan-file", "-")
    plan = json.loads(out)
    assert plan["version"] == "5.x" and plan["broker_line"]["source"] == "store"


def test_the_data_source_options_match_the_cli(sample_533):
    from datasources.commitlog_reader import read_messages
    from datasources.options import StoreOpen

    store = str(sample_533 / "store")
    s = StoreOpen.parse({"path": store, "brokerVersion": "4", "set.maxIndexNum": "800"}).settings()
    assert s.version == "4" and s.max_index_num == 800 and s.line.conflict
    assert StoreOpen.parse({"path": store}).settings().line.source == "store"
    t = read_messages(store, brokerVersion="auto", columns=["magic_version"])
    assert t.num_rows == 2018 and t.column("magic_version").to_pylist().count(2) == 39
    with pytest.raises(StoreError, match="4, 5 or auto"):
        StoreOpen.parse({"path": store, "brokerVersion": "7"})


@pytest.mark.spark
def test_spark_reads_with_the_broker_version_option(spark, sample_533):
    from datasources import register

    register(spark)
    df = spark.read.format("rocketmq").option("brokerVersion", "5").option("set.maxIndexNum", "800")
    assert df.load(str(sample_533 / "store")).count() == 2018


def _evidence_store(tmp_path, records: list[bytes]):
    from storelib.fileio.bytesource import resolve

    (tmp_path / "commitlog").mkdir(parents=True)
    (tmp_path / "commitlog" / f"{0:020d}").write_bytes(b"".join(records) + bytes(4096))
    return resolve(str(tmp_path))


def test_record_evidence_is_the_first_v2_and_crc_property_before_the_first_invalid_record(tmp_path):
    from storelib.broker.settings.brokerline import _record_evidence
    from storelib.format.record import Message, encode_message

    def rec(i: int, pos: int, v2: bool = False, crc: bool = False) -> bytes:
        props = {"UNIQ_KEY": f"{i:032X}", **({"__CRC32#": "12345"} if crc else {})}
        return encode_message(Message(topic="T", body=b"b" * (10 + i), queue_offset=i, physical_offset=pos,
                                      store_timestamp=1_700_000_000_000, born_host="10.0.0.1:1",
                                      properties=props, magic_version=2 if v2 else 1))

    recs: list[bytes] = []
    pos = 0
    for i, (v2, crc) in enumerate([(False, False), (False, True), (False, False), (True, False), (True, True)]):
        recs.append(rec(i, pos, v2, crc))
        pos += len(recs[-1])
    at = [sum(len(r) for r in recs[:i]) for i in range(len(recs))]
    got = _record_evidence(_evidence_store(tmp_path / "a", recs))
    assert got == [f"V2 record (magic 0xDAA320AB) at commitlog/{0:020d} @ {at[3]}",
                   f"property CRC (__CRC32#) at commitlog/{0:020d} @ {at[1]}"]
    # a record the broker rejects ends the evidence, as it ends the broker's read
    bad = bytearray(recs[2])
    bad[4:8] = b"\0\0\0\0"
    assert _record_evidence(_evidence_store(tmp_path / "b", [recs[0], recs[1], bytes(bad), *recs[3:]])) == [
        f"property CRC (__CRC32#) at commitlog/{0:020d} @ {at[1]}"]
    assert _record_evidence(_evidence_store(tmp_path / "c", [recs[0], recs[2]])) == []
