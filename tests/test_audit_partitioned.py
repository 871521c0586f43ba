"""The audit's cross-file checks as partitioned tasks give the report of the driver's streamed checks (and
their whole view), on every store kind and every kind of damage: in memory with one queue group, through
task files with a queue per group and splits inside segments, on the pool and on Spark; the driver
reads no record table."""

from __future__ import annotations

import os
import random
import struct
import tarfile
from pathlib import Path

import pytest

import jobs.engines.audit_tasks as audit_tasks
import jobs.engines.schedulers as schedulers
import storelib.checks.segment as segment_checks
from jobs.audit import audit_store
from storelib.fileio.bytesource import resolve
from storelib.format.timerstore import UNIT_SIZE, read_timerlog

from . import test_audit_stream as stream_cases
from .conftest import SAMPLE_NAMES, SAMPLES
from .test_audit import _comparable, flip, records, seg_file, store_fixtures
from .test_audit_workdir import corrupt

base_store, store = store_fixtures("auditparts")
NOW = 1_800_000_000_000
GROUPS = 8  # the generated store's four queues fall in four groups
SPLIT = 6000  # several parts per 64 KiB segment


def _reference(root: Path, **kw) -> dict:
    return audit_store(str(root), quiet=True, now_ms=NOW, cross="driver", **kw)


def _through_files(root: Path, monkeypatch, **kw) -> dict:
    """The partitioned checks with the task tables in files, a queue per group and splits in segments."""
    with monkeypatch.context() as m:
        m.setattr(audit_tasks, "IN_MEMORY_TABLES", 0)
        m.setattr(audit_tasks, "cross_groups", lambda eng, tasks, in_memory: GROUPS)
        return audit_store(str(root), quiet=True, now_ms=NOW, split_bytes=SPLIT, **kw)


def _same(root: Path, monkeypatch, **kw) -> tuple[dict, dict]:
    """The reference and the partitioned report (in memory and through files): all three equal."""
    ref = _reference(root, **kw)
    mem = audit_store(str(root), quiet=True, now_ms=NOW, **kw)
    files = _through_files(root, monkeypatch, **kw)
    assert mem["run"]["cross_check_mode"].startswith("partitioned")
    assert files["run"]["cross_check_mode"].startswith("partitioned")
    assert _comparable(mem) == _comparable(ref)
    assert _comparable(files) == _comparable(ref)
    return ref, files


def _unit_of_another_queue(root: Path) -> None:
    """OrderEvents/0's 8th unit replaced by one of PaymentNotify/1's (a record of another queue group)."""
    src = stream_cases._cq_file(root, "PaymentNotify", 1).read_bytes()[20 * 3:20 * 4]
    with open(stream_cases._cq_file(root), "r+b") as f:
        f.seek(20 * 7)
        f.write(src)


def _field_of_another_record(root: Path) -> None:
    """Record 40's PHYSICALOFFSET field says record 41's position: two records share a field, and
    record 41's unit resolves to the lower one (record 40, of another queue)."""
    recs = records(root)
    path, _, off = seg_file(root, recs[40]["phy_offset"])
    with open(path, "r+b") as f:
        f.seek(off + 28)
        f.write(struct.pack(">q", recs[41]["phy_offset"]))


CASES = {**stream_cases.SETTLED, **{k: v[0] for k, v in stream_cases.UNSETTLED.items()},
         "zeroed region": stream_cases._zeroed_region, "unit of another queue": _unit_of_another_queue,
         "field of another record": _field_of_another_record, "several": corrupt}


@pytest.mark.parametrize("case", list(CASES))
def test_partitioned_checks_report_what_the_driver_reports(store, monkeypatch, case):
    if CASES[case] is not None:
        CASES[case](store)
    ref, files = _same(store, monkeypatch, broker_conf=str(store / "broker.conf"))
    assert ref["summary"]["records"] > 400


@pytest.mark.parametrize("seed", range(16))
def test_random_damage_gets_the_drivers_report(store, monkeypatch, seed):
    rnd = random.Random(1000 + seed)
    files = [p for d in ("consumequeue", "index", "commitlog") for p in sorted((store / d).rglob("*")) if p.is_file()]
    for _ in range(rnd.choice([1, 2, 3, 5])):
        f = rnd.choice(files)
        size = f.stat().st_size
        if size:
            flip(f, rnd.randrange(size), 1 << rnd.randrange(8))
    _same(store, monkeypatch, broker_conf=str(store / "broker.conf"))


def test_per_kind_caps_and_their_summaries_are_the_drivers(store, monkeypatch):
    monkeypatch.setattr(segment_checks, "MAX_PER_KIND", 2)
    corrupt(store)
    cq = stream_cases._cq_file(store)
    with open(cq, "r+b") as f:
        for u in (2, 3, 4, 5):
            f.seek(u * 20)
            f.write(struct.pack(">q", 7))  # units pointing mid-record
    ref, files = _same(store, monkeypatch, broker_conf=str(store / "broker.conf"))
    assert files["findings"] == ref["findings"]
    assert any(f["extra"].get("more") for f in ref["findings"])


def _sample(tmp_path: Path, name: str) -> tuple[Path, str]:
    stem = SAMPLE_NAMES.get(name, f"rocketmq-{name}-small")
    with tarfile.open(SAMPLES / f"{stem}.tar.gz") as tf:
        tf.extractall(tmp_path, filter="data")
    return next(p.parent for p in tmp_path.rglob("commitlog")), str(SAMPLES / f"{stem}.broker.conf")


@pytest.mark.parametrize("name", ["4.9.8", "5.3.3", "5.3.3-timer"])
def test_real_broker_stores_get_the_drivers_report(name, tmp_path, monkeypatch):
    root, conf = _sample(tmp_path, name)
    ref, files = _same(root, monkeypatch, broker_conf=conf)
    assert ref["summary"]["records"] >= 800 and (name != "5.3.3-timer" or ref["timer_store"]["timerlog_units"] > 0)


def _poke(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_a_damaged_timer_store_gets_the_drivers_report(tmp_path, monkeypatch):
    """Units past the log, of the wrong size, pointing at another topic's record, firing late, and a
    timer record no unit holds: the timer task looks the records up as the whole view does."""
    root, conf = _sample(tmp_path, "5.3.3-timer")
    tl = root / "timerlog" / "00000000000000000000"
    units = read_timerlog(resolve(str(root)), 8192).units.to_pylist()
    other = next(r for r in records_of(root) if r["topic"] != "rmq_sys_wheel_timer")
    _poke(tl, 0 * UNIT_SIZE + 28, struct.pack(">q", 10**12))
    _poke(tl, 1 * UNIT_SIZE + 36, struct.pack(">i", 7))
    _poke(tl, 3 * UNIT_SIZE + 28, struct.pack(">qi", other["phy_offset"], other["size"]))
    k = next(i for i, u in enumerate(units) if not u["roll"] and i > 5)
    _poke(tl, k * UNIT_SIZE + 24, struct.pack(">i", units[k]["delayed_time"] + 5000))
    _poke(root / "config" / "timercheck", 16, struct.pack(">q", 10_000))
    ref, _ = _same(root, monkeypatch, broker_conf=conf)
    kinds = {f["kind"] for f in ref["findings"]}
    assert {"timer_unit_past_commitlog", "timer_unit_mismatch", "timercheck_ahead"} <= kinds


def records_of(root: Path) -> list[dict]:
    from storelib.scan.commitlog import CommitLog

    seg = os.path.getsize(next((root / "commitlog").iterdir()))
    return CommitLog(str(root / "commitlog"), seg).read_table().select(["phy_offset", "size", "topic"]).to_pylist()


def test_a_clean_store_is_proved_without_the_whole_view_or_lookups(store, monkeypatch):
    rep = _through_files(store, monkeypatch, broker_conf=str(store / "broker.conf"))
    assert rep["run"]["cross_check_mode"] == ("partitioned: 4 queue group(s) (0 by the whole view's checks), "
                                              "6 index file(s) (0 looked up)")


def test_pool_and_spark_give_the_drivers_report_and_the_driver_reads_no_record(store, spark, monkeypatch):
    import storelib.checks.tables as tables

    corrupt(store)
    _unit_of_another_queue(store)
    ref = _reference(store, broker_conf=str(store / "broker.conf"))
    driver = os.getpid()
    real = tables.read_table_file

    def only_in_tasks(path, schema, fs_options=None):
        assert os.getpid() != driver or path is None, "the driver read a task table"
        return real(path, schema, fs_options)

    monkeypatch.setattr(tables, "read_table_file", only_in_tasks)
    monkeypatch.setenv("RMQSTORE_POOL_START", "fork")  # the workers get the spy too, and may read
    pool = audit_store(str(store), quiet=True, now_ms=NOW, broker_conf=str(store / "broker.conf"), engine="pool",
                       workers=2, split_bytes=SPLIT)
    assert pool["run"]["cross_check_mode"].startswith("partitioned")
    assert _comparable(pool) == _comparable(ref)
    monkeypatch.setattr(tables, "read_table_file", real)
    dist = audit_store(str(store), quiet=True, now_ms=NOW, broker_conf=str(store / "broker.conf"), engine="spark",
                       spark=spark, split_bytes=SPLIT)
    assert dist["run"]["cross_check_mode"].startswith("partitioned")
    assert _comparable(dist) == _comparable(ref)


def test_a_store_of_many_segments_spreads_its_queues_over_groups(tmp_path, monkeypatch):
    """A generated 4.x store of several MB with more queues than groups: same report, every group used."""
    from storelib.broker.settings.brokerconf import BrokerSettings
    from storelib.generator.gen import generate
    from storelib.generator.genplan import GenConfig

    keys = {"mappedFileSizeCommitLog": 256 * 1024, "mappedFileSizeConsumeQueue": 2000, "maxHashSlotNum": 500,
            "maxIndexNum": 2000}
    s = BrokerSettings.defaults("4").with_overrides(keys)
    generate(tmp_path / "g", GenConfig(messages=4000, version="4", seed=11), s)
    conf = tmp_path / "broker.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    os.unlink(tmp_path / "g" / "index" / sorted(os.listdir(tmp_path / "g" / "index"))[-1])  # keys not indexed
    ref = _reference(tmp_path / "g", broker_conf=str(conf))
    files = _through_files(tmp_path / "g", monkeypatch, broker_conf=str(conf))
    assert _comparable(files) == _comparable(ref)
    assert files["summary"]["queues"] > GROUPS


def test_the_tasks_get_the_part_list_once_through_the_work_dir(tmp_path):
    """Thousands of parts times hundreds of tasks: the list is written once and read once per worker,
    not pickled into every task."""
    import pickle

    from storelib.broker.settings.brokerconf import BrokerSettings
    from storelib.checks.tables import PartRef, TableRef
    from storelib.checks.tasks import context

    parts = tuple(PartRef(f"{i:020d}", i << 30, 0, i << 30, (i << 30) + 100, TableRef(f"/w/r{i}.arrow"),
                          TableRef(f"/w/k{i}.arrow"), (0, 50, 100), 10, 0) for i in range(2000))
    ctx = context.CrossContext("/store", {}, BrokerSettings.defaults("4"), 2, 0, 1 << 40, 1 << 30, (), False, None,
                               None, parts, sink=str(tmp_path))
    sent = ctx.for_tasks()
    assert len(pickle.dumps(sent)) < len(pickle.dumps(ctx)) / 20
    context._PARTS.clear()
    assert pickle.loads(pickle.dumps(sent)).parts == parts
    assert ctx.for_tasks() is not ctx and context.CrossContext(
        "/store", {}, BrokerSettings.defaults("4"), 2, 0, 1, 1, (), False, None, None, parts).for_tasks().part_list


def test_a_pool_audit_queues_the_summaries_first_and_cuts_any_store_into_128_mib_units(store, monkeypatch):
    """An index file's structure check costs about a segment's work: queued after the segments it ran
    alone at the end. Whole segments are too coarse for two workers to finish together, and a unit's
    tables grow with it: a pool's units stay at 128 MiB as the store grows, so its workers' memory stays flat."""
    from jobs.engines.schedulers import PoolEngine

    seen: list[list[str]] = []
    real = PoolEngine.map

    def spy(self, fn, items, label="tasks", say=None):
        if label == "audit: tasks":
            seen.append([type(i).__name__ for i in items])
        return real(self, fn, items, label, say)

    monkeypatch.setattr(PoolEngine, "map", spy)
    rep = audit_store(str(store), quiet=True, now_ms=NOW, broker_conf=str(store / "broker.conf"), engine="pool",
                      workers=2, split_bytes=SPLIT)
    assert _comparable(rep) == _comparable(_reference(store, broker_conf=str(store / "broker.conf")))
    (kinds,) = seen
    first_segment = kinds.index("SegmentTask")
    assert first_segment > 0 and "SegmentTask" not in kinds[:first_segment]
    assert all(k == "SegmentTask" for k in kinds[first_segment:])

    two_gb = 8 << 28
    pool, spark = PoolEngine(2), type("SparkLike", (), {"name": "spark", "parallelism": 2})()
    assert schedulers.default_split_bytes(pool, two_gb) == 128 << 20  # 16 units on 2 cores
    assert schedulers.default_split_bytes(pool, 32 << 30) == 128 << 20  # 256 units: the same per worker
    assert schedulers.default_split_bytes(PoolEngine(64), two_gb) == 128 << 20
    assert schedulers.default_split_bytes(spark, two_gb) == 512 << 20  # two per core
    assert schedulers.default_split_bytes(spark, 32 << 30) == 512 << 20  # never above the bound
