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
