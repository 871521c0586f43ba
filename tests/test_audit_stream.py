"""The audit's streamed cross-file checks (segment by segment, bounded memory) settle stores whose files
agree, lag and all, with exactly the report of the whole record view; anything they cannot settle (a
unit, an index entry or a record that disagrees) hands the store to the whole view, which reports it."""

from __future__ import annotations

import shutil
import struct
import tarfile
from pathlib import Path

import pytest

import storelib.checks.crossfile as crossfile
from storelib.broker.dispatch.cqwriter import build_consume_queues, write_consume_queues
from storelib.broker.index.indexbuild import build_index_files, index_key_rows
from storelib.format.indexfile import IndexGeometry
from storelib.scan.commitlog import CommitLog

from .conftest import SAMPLE_NAMES, SAMPLES
from .test_audit import (
    CQ_SEG,
    INDEX_NUM,
    SEG,
    SLOTS,
    _comparable,
    flip,
    records,
    seg_file,
    store_fixtures,
)
from .test_audit import run as _run

base_store, store = store_fixtures("auditstream")
NOW = 1_800_000_000_000


def run(root: Path, **kw) -> dict:
    """The audit with the cross-file checks on the driver (streamed, the whole view for the rest): what
    these tests look inside; the partitioned tasks are tested against it (tests/test_audit_partitioned.py)."""
    return _run(root, cross="driver", **kw)


def _both(root: Path, monkeypatch, **kw) -> tuple[dict, dict]:
    """The audit as it runs (streamed first) and with the whole view only."""
    streamed = run(root, now_ms=NOW, **kw)
    with monkeypatch.context() as m:
        m.setattr(crossfile, "streamable", lambda store, results: False)
        whole = run(root, now_ms=NOW, **kw)
    assert whole["run"]["cross_check_mode"] == "whole view: lost regions or missing segments"
    return streamed, whole


def _table(root: Path):
    return CommitLog(str(root / "commitlog"), SEG).read_table()


def _queues_from_first(root: Path, n: int) -> None:
    """Consume queues holding the first ``n`` records only: every queue lags after them."""
    shutil.rmtree(root / "consumequeue")
    write_consume_queues(build_consume_queues(_table(root).slice(0, n), segment_size=CQ_SEG),
                         str(root / "consumequeue"), CQ_SEG)


def _index_from_first(root: Path, n: int) -> None:
    shutil.rmtree(root / "index")
    (root / "index").mkdir()
    for im in build_index_files(index_key_rows(_table(root).slice(0, n)), geometry=IndexGeometry(SLOTS, INDEX_NUM)):
        im.write(root / "index" / im.name)


def _cq_file(root: Path, topic: str = "OrderEvents", qid: int = 0, i: int = 0) -> Path:
    return sorted((root / "consumequeue" / topic / str(qid)).iterdir())[i]


def _lagging_queues(root: Path) -> None:
    _queues_from_first(root, 300)


def _lagging_index(root: Path) -> None:
    _index_from_first(root, 333)


def _queue_dir_gone(root: Path) -> None:
    shutil.rmtree(root / "consumequeue" / "PaymentNotify" / "1")


def _abort_file(root: Path) -> None:
    (root / "abort").write_bytes(b"")


def _body_crc(root: Path) -> None:
    rec = records(root)[170]
    path, _, off = seg_file(root, rec["phy_offset"])
    flip(path, off + 88 + 5)


SETTLED = {"clean": None, "lagging queues": _lagging_queues, "lagging index": _lagging_index,
           "queue directory gone": _queue_dir_gone, "abort file": _abort_file, "body CRC": _body_crc}


@pytest.mark.parametrize("threads", [True, False])
@pytest.mark.parametrize("case", list(SETTLED))
def test_streamed_checks_settle_agreeing_stores_with_the_whole_views_report(store, monkeypatch, case, threads):
    if SETTLED[case] is not None:
        SETTLED[case](store)
    streamed, whole = _both(store, monkeypatch, threads=threads)
    assert streamed["run"]["cross_check_mode"] == "streamed"
    assert _comparable(streamed) == _comparable(whole)
    kinds = {f["kind"] for f in streamed["findings"]}
    expect = {"lagging queues": "queue_behind_commitlog", "lagging index": "index_behind_commitlog",
              "queue directory gone": "queue_missing", "abort file": "index_deleted_on_abnormal_start",
              "body CRC": "body_crc_mismatch"}.get(case)
    assert expect is None or expect in kinds


def _unit_moved(root: Path) -> None:
    f = _cq_file(root)
    with open(f, "r+b") as fh:
        fh.seek(20 * 7)
        phy = struct.unpack(">q", fh.read(8))[0]
        fh.seek(20 * 7)
        fh.write(struct.pack(">q", phy + 10))


def _unit_zeroed(root: Path) -> None:
    with open(_cq_file(root), "r+b") as fh:
        fh.seek(20 * 9)
        fh.write(bytes(20))


def _unit_tags(root: Path) -> None:
    flip(_cq_file(root, "PaymentNotify", 1), 20 * 4 + 19)


def _index_hash(root: Path) -> None:
    flip(sorted((root / "index").iterdir())[1], 40 + 64 * 4 + 20 * 3 + 3, 0x10)


def _index_file_gone(root: Path) -> None:
    sorted((root / "index").iterdir())[0].unlink()


def _record_field(root: Path) -> None:
    flip(root / "commitlog" / f"{0:020d}", 4 + 4 + 4 + 4 + 4 + 8 + 7, 0x08)


def _lag_before_reput(root: Path) -> None:
    """One queue's last units gone while the others' reach further: its messages are never dispatched."""
    f = _cq_file(root, "OrderEvents", 1, -1)
    data = bytearray(f.read_bytes())
    n = len(data) // 20
    last = max(i for i in range(n) if struct.unpack(">i", data[20 * i + 8:20 * i + 12])[0] > 0)
    data[20 * (last - 2):20 * (last + 1)] = bytes(60)
    f.write_bytes(bytes(data))


def _zeroed_region(root: Path) -> None:
    recs = records(root)
    path, _, off = seg_file(root, recs[50]["phy_offset"])
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(bytes(recs[52]["phy_offset"] - recs[50]["phy_offset"] + 7))


UNSETTLED = {"unit moved": (_unit_moved, "cq_entry_not_record_start"), "unit zeroed": (_unit_zeroed, "cq_entry_missing"),
             "unit tags": (_unit_tags, "cq_entry_mismatch"), "index hash": (_index_hash, "index_entry_wrong_hash"),
             "index file gone": (_index_file_gone, "index_key_missing"),
             "record field": (_record_field, "physical_offset_mismatch"),
             "lag before reput": (_lag_before_reput, "cq_entries_missing_for_messages")}


@pytest.mark.parametrize("case", list(UNSETTLED))
def test_what_the_stream_cannot_settle_goes_to_the_whole_view(store, monkeypatch, case):
    damage, kind = UNSETTLED[case]
    damage(store)
    streamed, whole = _both(store, monkeypatch)
    assert streamed["run"]["cross_check_mode"].startswith("whole view: ")
    assert _comparable(streamed) == _comparable(whole)
    assert kind in {f["kind"] for f in streamed["findings"]}


def test_lost_regions_go_to_the_whole_view_without_streaming(store, monkeypatch):
    _zeroed_region(store)
    calls = []
    real = crossfile.streamed_checks
    monkeypatch.setattr(crossfile, "streamed_checks", lambda *a, **k: calls.append(1) or real(*a, **k))
    rep = run(store, now_ms=NOW)
    assert calls == [] and rep["run"]["cross_check_mode"] == "whole view: lost regions or missing segments"
    assert rep["summary"]["bytes_lost"] > 0


def test_a_clean_store_is_audited_without_the_whole_record_view(store, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the whole record view was built")

    monkeypatch.setattr(crossfile, "_record_view", refuse)
    rep = run(store, now_ms=NOW)
    assert rep["summary"]["records"] == 420 and rep["run"]["cross_check_mode"] == "streamed"


@pytest.mark.parametrize("name", ["4.9.8", "5.3.3", "5.3.3-timer"])
def test_real_broker_stores_stream_with_the_whole_views_report(name, tmp_path, monkeypatch):
    from jobs.audit import audit_store

    stem = SAMPLE_NAMES.get(name, f"rocketmq-{name}-small")
    with tarfile.open(SAMPLES / f"{stem}.tar.gz") as tf:
        tf.extractall(tmp_path, filter="data")
    root = next(p.parent for p in tmp_path.rglob("commitlog"))
    conf = str(SAMPLES / f"{stem}.broker.conf")
    streamed = audit_store(str(root), broker_conf=conf, quiet=True, now_ms=NOW, cross="driver")
    with monkeypatch.context() as m:
        m.setattr(crossfile, "streamable", lambda store, results: False)
        whole = audit_store(str(root), broker_conf=conf, quiet=True, now_ms=NOW, cross="driver")
    assert streamed["run"]["cross_check_mode"] == "streamed"
    assert _comparable(streamed) == _comparable(whole)
    if name == "5.3.3-timer":
        assert streamed["timer_store"]["timerlog_units"] > 0


def test_in_process_audit_of_a_big_store_maps_its_task_tables_with_the_same_report(store, monkeypatch):
    import jobs.engines.audit_tasks as audit_tasks

    in_memory = run(store, now_ms=NOW, engine="local")
    monkeypatch.setattr(audit_tasks, "IN_MEMORY_TABLES", 0)  # every store is "big": tables through files
    sinks = []
    real = audit_tasks.table_sink
    monkeypatch.setattr(audit_tasks, "table_sink", lambda *a, **k: sinks.append(1) or real(*a, **k))
    mapped = run(store, now_ms=NOW, engine="local")
    assert sinks == [1] and mapped["run"]["cross_check_mode"] == "streamed"
    assert _comparable(mapped) == _comparable(in_memory)


@pytest.mark.parametrize("seed", range(24))
def test_random_damage_gets_the_same_report_streamed_or_whole(store, monkeypatch, seed):
    """A few bytes flipped anywhere in the consume queues, the index files or the commitlog: whichever
    path the audit takes, its report is the whole view's."""
    import random

    rnd = random.Random(seed)
    files = [p for d in ("consumequeue", "index", "commitlog") for p in sorted((store / d).rglob("*")) if p.is_file()]
    for _ in range(rnd.choice([1, 1, 2, 3])):
        f = rnd.choice(files)
        size = f.stat().st_size
        if size:
            flip(f, rnd.randrange(size), 1 << rnd.randrange(8))
    streamed, whole = _both(store, monkeypatch)
    assert _comparable(streamed) == _comparable(whole), streamed["run"]["cross_check_mode"]
