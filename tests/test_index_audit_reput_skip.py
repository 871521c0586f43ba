"""The index audit judges the messages a master's reput skipped as the broker does: after a record it cannot
decode, DefaultMessageStore.doReput (4.9.8 and 5.3.3) adds the rest of its buffer to reputFromOffset, so
doDispatch, and with it IndexService.buildIndex, never gets the rest of that segment. Their keys are the
broker's own gap (one warning per segment, as cq_reput_skipped is for their queue), not index_key_missing
errors; a slave's reput, or a message one of whose keys is indexed, stays an error. Every path and engine
gives the same report."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from jobs.audit import audit_store
from storelib.broker.dispatch.dispatch import dispatch_store
from storelib.broker.index.indexbuild import build_index_files, index_key_rows
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.writer.writer import StoreWriter
from storelib.format.indexfile import IndexGeometry
from storelib.format.record import Message
from storelib.scan.commitlog import CommitLog

from .test_audit import _comparable
from .test_audit_partitioned import _same

CONF = {"mappedFileSizeCommitLog": 8192, "mappedFileSizeConsumeQueue": 200, "maxHashSlotNum": 16, "maxIndexNum": 24}
NOW = 1_800_000_000_000


def _skipped_store(root: Path, version: str = "4", keys: str = "k{i}", extra: str = "", bad: tuple[int, ...] = (1,)
                   ) -> tuple[Path, list[int], dict]:
    """30 keyed messages (five a segment), record 1's magic zeroed (and those of ``bad``), then dispatched as a
    master (t_skip.py): the reput skips records 2..4, the rest of segment 0. Returns the store, the records' positions and every record's keys
    (as the index builder takes them, read before the damage)."""
    s = BrokerSettings.defaults(version).with_overrides(CONF)
    with StoreWriter(root, s, clock=lambda: 1_700_000_000_000) as w:
        res = [w.append(Message("T", b"x" * 1500, 0, properties={"KEYS": keys.format(i=i)})) for i in range(30)]
        w.close(clean=True, dispatch=False)
    rows = index_key_rows(CommitLog(str(root / "commitlog"), CONF["mappedFileSizeCommitLog"]).read_table())
    S = CONF["mappedFileSizeCommitLog"]
    for k in bad:
        seg = root / "commitlog" / f"{res[k].phy_offset // S * S:020d}"
        b = bytearray(seg.read_bytes())
        b[res[k].phy_offset % S + 4:res[k].phy_offset % S + 8] = b"\0\0\0\0"
        seg.write_bytes(bytes(b))
    assert [f.kind for f in dispatch_store(root, s).findings] == ["reput_skipped_rest_of_segment"] * len(bad)
    (root / "broker.conf").write_text("\n".join(f"{k}={v}" for k, v in CONF.items()) + "\n"
                                      + ("enabledAppendPropCRC=true\n" if version == "5" else "") + extra)
    return root, [r.phy_offset for r in res], rows


def _index(rep: dict) -> list[tuple[str, str, str, int | None]]:
    """The index audit's serious findings about records: (kind, severity, file, offset)."""
    return [(f["kind"], f["severity"], f["file"], f["offset"]) for f in rep["findings"]
            if f["kind"].startswith("index_") and f["severity"] != "info"]


@pytest.mark.parametrize("version", ["4", "5"])
def test_keys_of_messages_a_masters_reput_skipped_are_one_warning_not_key_missing_errors(tmp_path, monkeypatch,
                                                                                          version):
    root, phy, _ = _skipped_store(tmp_path / "s", version)
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version=version)
    assert _index(ref) == [("index_reput_skipped", "warning", f"commitlog/{0:020d}", phy[2])]
    f = next(x for x in ref["findings"] if x["kind"] == "index_reput_skipped")
    assert f["extra"] == {"phy": phy[2], "count": 3, "messages": 3}
    # the consume-queue audit says the same of the same records
    assert [(x["kind"], x["offset"]) for x in ref["findings"] if x["kind"] == "cq_reput_skipped"] == \
        [("cq_reput_skipped", phy[2])]


def test_each_segment_the_reput_skipped_is_its_own_warning_at_its_first_skipped_message(tmp_path, monkeypatch):
    """Records 1 and 6 undecodable: the reput skips 2..4 in segment 0 and 7..9 in segment 1, one warning each,
    whether the keys are judged all at once or a segment (and part of one) at a time."""
    root, phy, _ = _skipped_store(tmp_path / "s", bad=(1, 6))
    S = CONF["mappedFileSizeCommitLog"]
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="4")
    assert _index(ref) == [("index_reput_skipped", "warning", f"commitlog/{p // S * S:020d}", p % S)
                           for p in (phy[2], phy[7])]


def test_a_slaves_reput_stops_there_so_its_missing_keys_stay_errors(tmp_path, monkeypatch):
    """A slave's doReput (brokerId != 0, no DLedger) does not skip: it retries the bad offset, so keys missing
    before the last indexed message are not the broker's skip."""
    root, phy, _ = _skipped_store(tmp_path / "s", extra="brokerId=1\nbrokerRole=SLAVE\n")
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="4")
    assert _index(ref) == [("index_key_missing", "error", f"commitlog/{0:020d}", p) for p in phy[2:5]]


def test_a_skipped_message_with_one_key_indexed_was_dispatched_so_its_other_key_is_missing(tmp_path, monkeypatch):
    """Records 2..4 carry two keys each; the index holds record 2's first key (so the reput dispatched it) and
    none of 3's and 4's: record 2's other key is index_key_missing, 3 and 4 the broker's skip."""
    root, phy, rows = _skipped_store(tmp_path / "s", keys="a{i} b{i}")
    keep = ~np.isin(rows["phy_offset"], phy[3:5])
    keep[np.flatnonzero(rows["phy_offset"] == phy[2])[1]] = False  # record 2's second key
    shutil.rmtree(root / "index")
    (root / "index").mkdir()
    for im in build_index_files({k: v[keep] for k, v in rows.items()},
                                geometry=IndexGeometry(CONF["maxHashSlotNum"], CONF["maxIndexNum"])):
        im.write(root / "index" / im.name)
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="4")
    seg = f"commitlog/{0:020d}"
    assert _index(ref) == [("index_key_missing", "error", seg, phy[2]), ("index_reput_skipped", "warning", seg, phy[3])]
    f = next(x for x in ref["findings"] if x["kind"] == "index_reput_skipped")
    assert f["extra"] == {"phy": phy[3], "count": 4, "messages": 2}


def test_pool_and_spark_judge_the_skip_as_the_driver(tmp_path, spark):
    root, phy, _ = _skipped_store(tmp_path / "s")
    kw = {"quiet": True, "now_ms": NOW, "broker_conf": str(root / "broker.conf"), "version": "4"}
    ref = audit_store(str(root), cross="driver", **kw)
    assert ("index_reput_skipped", "warning", f"commitlog/{0:020d}", phy[2]) in _index(ref)
    pool = audit_store(str(root), engine="pool", workers=2, split_bytes=3000, **kw)
    dist = audit_store(str(root), engine="spark", spark=spark, split_bytes=3000, **kw)
    assert pool["run"]["cross_check_mode"].startswith("partitioned")
    assert dist["run"]["cross_check_mode"].startswith("partitioned")
    assert _comparable(pool) == _comparable(ref) and _comparable(dist) == _comparable(ref)


def _serious(rep: dict) -> list[tuple[str, str, str, int | None]]:
    """Every finding about the log's records, queues and index that is not info: (kind, severity, file, offset)."""
    return [(f["kind"], f["severity"], f["file"], f["offset"]) for f in rep["findings"]
            if f["severity"] not in ("info", "ok") and f["kind"] != "corrupt_region"]


@pytest.mark.parametrize("other_topic", [False, True])
def test_keys_the_reput_skipped_after_the_last_indexed_message_are_skipped_not_behind(tmp_path, monkeypatch,
                                                                                       other_topic):
    """Record 26 (the last segment's second) undecodable: the reput never dispatches 27..29, which lie after the
    last indexed message (25). Both audits call them the reput's skip, not lag: the index not "not indexed yet"
    (index_behind_commitlog), the consume queue not "dispatched on start" (queue_behind_commitlog), also when
    the bad record is another queue's, so the queue's offsets run on without a jump."""
    S = CONF["mappedFileSizeCommitLog"]
    root = tmp_path / "s"
    s = BrokerSettings.defaults("4").with_overrides(CONF)
    with StoreWriter(root, s, clock=lambda: 1_700_000_000_000) as w:
        res = [w.append(Message("U" if other_topic and i == 26 else "T", b"x" * 1500, 0,
                                properties={"KEYS": f"k{i}"})) for i in range(30)]
        w.close(clean=True, dispatch=False)
    p = res[26].phy_offset
    seg = root / "commitlog" / f"{p // S * S:020d}"
    b = bytearray(seg.read_bytes())
    b[p % S + 4:p % S + 8] = b"\0\0\0\0"
    seg.write_bytes(bytes(b))
    dispatch_store(root, s)  # the recovery window's last segment: dispatched up to the bad record
    (root / "broker.conf").write_text("\n".join(f"{k}={v}" for k, v in CONF.items()) + "\n")
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="4")
    first = res[27].phy_offset
    place = (f"commitlog/{first // S * S:020d}", first % S)
    assert _serious(ref) == [("cq_reput_skipped", "warning", *place), ("index_reput_skipped", "warning", *place)]
    f = next(x for x in ref["findings"] if x["kind"] == "index_reput_skipped")
    assert f["extra"] == {"phy": first, "count": 3, "messages": 3}


@pytest.mark.parametrize("slave", [False, True])
def test_no_reput_reads_past_a_missing_segment_so_every_later_segment_is_its_skip(tmp_path, monkeypatch, slave):
    """Segment 2 deleted before the reput reached it: getData finds no file (findMappedFileByOffset null), so
    doReput stops there and retries it, a master's as a slave's; segments 3..5 are never dispatched. Both
    audits say so (one consume-queue warning for the queue, one index warning per segment), not lag the broker
    dispatches on start nor keys not indexed yet."""
    S = CONF["mappedFileSizeCommitLog"]
    root = tmp_path / "s"
    s = BrokerSettings.defaults("4").with_overrides(CONF)
    with StoreWriter(root, s, clock=lambda: 1_700_000_000_000) as w:
        res = [w.append(Message("T", b"x" * 1500, 0, properties={"KEYS": f"k{i}"})) for i in range(30)]
        w.close(clean=True, dispatch=False)
    (root / "commitlog" / f"{2 * S:020d}").unlink()
    assert [f.kind for f in dispatch_store(root, s).findings] == ["reput_gap"]
    (root / "broker.conf").write_text("\n".join(f"{k}={v}" for k, v in CONF.items()) + "\n"
                                      + ("brokerId=1\nbrokerRole=SLAVE\n" if slave else ""))
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="4")
    assert _serious(ref) == [("missing_segment", "critical", f"commitlog/{3 * S:020d}", None),
                             ("cq_reput_skipped", "warning", f"commitlog/{3 * S:020d}", 0)] + [
        ("index_reput_skipped", "warning", f"commitlog/{k * S:020d}", 0) for k in (3, 4, 5)]
    f = next(x for x in ref["findings"] if x["kind"] == "cq_reput_skipped")
    assert f["extra"]["count"] == 15 and f["extra"]["last_phy"] == res[-1].phy_offset


def test_a_lost_region_running_into_later_files_skips_each_of_them_to_its_end():
    """A master's reput leaves a file at unreadable bytes for the next file's start (the rest of the buffer); a
    region running on into later files makes it start each of them inside it, so each file's records after the
    region are skipped as well, up to that file's end; a file the region ends before is read from its start."""
    from storelib.broker.recovery.reputpath import reput_skipped_at

    S = 100
    lost = np.array([[150, 330]], dtype=np.int64)  # from file 1 into file 3
    phy = np.array([50, 120, 340, 380, 400, 450], dtype=np.int64)
    assert reput_skipped_at(lost, phy, S).tolist() == [False, False, True, True, False, False]
    assert not reput_skipped_at(lost, phy, S, master=False).any()  # a slave stops at it (retries)
    gap = np.array([[200, 300]], dtype=np.int64)  # no file: every reput stops there
    assert reput_skipped_at(np.array([[200, 300]]), phy, S, gap, master=False).tolist() == [
        False, False, True, True, True, True]


def test_a_segment_missing_below_what_was_dispatched_leaves_the_lag_after_it_lag(tmp_path, monkeypatch):
    """Segment 2 went after the reput had passed it (units and index entries point past it): the reput starts
    from the queues' max physical offset (DefaultMessageStore.start), after the gap, so the last three records,
    in no consume queue or index file yet, are lag the broker dispatches on start, as without the gap."""
    S = CONF["mappedFileSizeCommitLog"]
    root = tmp_path / "s"
    s = BrokerSettings.defaults("4").with_overrides(CONF)
    with StoreWriter(root, s, clock=lambda: 1_700_000_000_000) as w:
        res = [w.append(Message("T", b"x" * 1500, 0, properties={"KEYS": f"k{i}"})) for i in range(30)]
        w.close(clean=True, dispatch=True)
    rows = index_key_rows(CommitLog(str(root / "commitlog"), S).read_table())
    (root / "commitlog" / f"{2 * S:020d}").unlink()
    cq = root / "consumequeue" / "T" / "0" / f"{400:020d}"  # units 20..29: the last three not written yet
    cq.write_bytes(cq.read_bytes()[:140] + bytes(60))
    shutil.rmtree(root / "index")
    (root / "index").mkdir()
    keep = rows["phy_offset"] < res[27].phy_offset
    for im in build_index_files({k: v[keep] for k, v in rows.items()},
                                geometry=IndexGeometry(CONF["maxHashSlotNum"], CONF["maxIndexNum"])):
        im.write(root / "index" / im.name)
    (root / "broker.conf").write_text("\n".join(f"{k}={v}" for k, v in CONF.items()) + "\n")
    ref, _ = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version="4")
    assert [k for k, *_ in _serious(ref)] == ["missing_segment", "queue_behind_commitlog", "index_behind_commitlog"]
