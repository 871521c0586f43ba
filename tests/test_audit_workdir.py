"""How the audit's Spark tasks hand their record tables to the driver, and the threaded cross-file checks:
per-task Arrow files in a work dir (temp dir with a local master, or ``--work-dir``) and the in-band
collect give the local engine's report; the work dir is gone after a run, also after a failing task;
the cross-file checks on threads give exactly the findings of the serial run."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

import jobs.audit as audit_mod
import jobs.engines.audit_tasks as audit_tasks
import storelib.checks.segment as checks
from storelib.checks.segment import KEY_SCHEMA, RECORD_SCHEMA, TableSink, read_table_file

from .test_audit import _comparable, flip, records, run, seg_file, serious, store_fixtures

SPLIT = 6000  # several Spark tasks per 64 KiB segment


base_store, store = store_fixtures("auditwd")


def corrupt(root: Path) -> None:
    """CRC errors, a corrupt region, a PHYSICALOFFSET mismatch and an index entry with a wrong hash."""
    recs = records(root)
    for i in (17, 150):
        path, _, off = seg_file(root, recs[i]["phy_offset"])
        flip(path, off + 88 + 5)
    path, _, off = seg_file(root, recs[200]["phy_offset"])
    flip(path, off + 5)
    path, _, off = seg_file(root, recs[300]["phy_offset"])
    with open(path, "r+b") as f:
        f.seek(off + 28)
        f.write(struct.pack(">q", recs[300]["phy_offset"] + 1))
    idx = sorted((root / "index").iterdir())[0]
    with open(idx, "r+b") as f:
        f.seek(40 + 64 * 4 + 3 * 20)
        f.write(struct.pack(">i", 12345))


def work_dirs(d: Path) -> list[Path]:
    """Audit work dirs under ``d`` (Spark's shipped code may sit there too)."""
    return [p for p in d.iterdir() if p.name.startswith("rmqstore-audit-")]


def loud(root: Path, **kw) -> dict:
    """An audit with progress on stderr (which says how the tables came back)."""
    return audit_mod.audit_store(str(root), broker_conf=str(root / "broker.conf"), **kw)


@pytest.fixture
def tempdir(tmp_path, monkeypatch) -> Path:
    """The driver's temp dir, private to the test (where a local master's work dir is created)."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    monkeypatch.setenv("TMPDIR", str(d))  # a TMPDIR set wins over the memory filesystem (scratch_dir), as in CI
    return d


def test_spark_files_and_in_band_collect_give_the_local_report(store, spark, tempdir, capsys):
    corrupt(store)
    local = run(store)
    files = loud(store, engine="spark", spark=spark, split_bytes=SPLIT, transfer="files")
    err = capsys.readouterr().err
    assert "tables in files" in err and "partitioned" in files["run"]["cross_check_mode"]
    collect = loud(store, engine="spark", spark=spark, split_bytes=SPLIT, transfer="collect")
    assert "tables in-band" in capsys.readouterr().err  # no shared directory: the checks run on the driver
    assert not collect["run"]["cross_check_mode"].startswith("partitioned")
    assert _comparable(files) == _comparable(local)
    assert _comparable(collect) == _comparable(local)
    assert {"body_crc_mismatch", "corrupt_region", "physical_offset_mismatch",
            "index_entry_wrong_hash"} <= {k for k, _, _ in serious(local)}
    assert work_dirs(tempdir) == []  # the work dir is removed


def _part_files(monkeypatch) -> list[str]:
    """The table files the segment tasks report to the driver (each checked to exist when reported)."""
    seen: list[str] = []
    real = audit_tasks.merge_parts

    def spy(tasks, parts, *a, **k):
        for p in parts:
            for path in (p.records_path, p.keys_path):
                if path is not None:
                    assert os.path.exists(path)
                    seen.append(path)
        return real(tasks, parts, *a, **k)

    monkeypatch.setattr(audit_tasks, "merge_parts", spy)
    return seen


def test_auto_transfer_uses_a_temp_work_dir_on_a_local_master_and_removes_it(store, spark, tempdir, monkeypatch):
    seen = _part_files(monkeypatch)
    rep = run(store, engine="spark", spark=spark, split_bytes=SPLIT)
    assert seen and all(p.startswith(str(tempdir) + os.sep) for p in seen)
    assert work_dirs(tempdir) == []
    assert serious(rep) == set()


def test_work_dir_option_holds_the_files_during_the_run_and_is_left_empty(store, spark, tmp_path, monkeypatch):
    wd = tmp_path / "shared-work"
    wd.mkdir()
    seen = _part_files(monkeypatch)
    rep = run(store, engine="spark", spark=spark, split_bytes=SPLIT, work_dir=str(wd))
    assert seen and all(p.startswith(str(wd) + os.sep) for p in seen)
    assert list(wd.iterdir()) == []
    assert _comparable(rep) == _comparable(run(store))


def test_work_dir_is_removed_after_a_failing_task(store, spark, tmp_path, tempdir, monkeypatch):
    """A task that fails after writing its files: the job fails, the error reaches the caller, and
    neither the temp work dir nor the files under ``--work-dir`` stay behind."""
    real = audit_tasks.phase_one

    def failing(opts, sink, item):
        res = real(opts, sink, item)
        if getattr(item, "start", 0) > 0:
            raise RuntimeError("injected task failure")
        return res

    monkeypatch.setattr(audit_tasks, "phase_one", failing)  # a local function: shipped to the workers by value
    with pytest.raises(Exception, match="injected task failure"):
        run(store, engine="spark", spark=spark, split_bytes=SPLIT)
    assert work_dirs(tempdir) == []
    wd = tmp_path / "wd"
    wd.mkdir()
    with pytest.raises(Exception, match="injected task failure"):
        run(store, engine="spark", spark=spark, split_bytes=SPLIT, work_dir=str(wd))
    assert list(wd.iterdir()) == []


def test_table_sink_round_trip_and_empty_tables(tmp_path):
    sink = TableSink(str(tmp_path))
    t = pa.table({"pos": [1, 2], "phy": [1, 2], "key_hash": [7, -8]}, schema=KEY_SCHEMA)
    p = sink.write("seg-0.keys", t)
    assert os.path.dirname(p) == str(tmp_path) and read_table_file(p, KEY_SCHEMA).equals(t)
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []  # written via temp + rename
    p2 = sink.write("seg-0.keys", t)
    assert p2 != p  # every write (task attempt) gets its own file
    assert sink.write("seg-0.records", RECORD_SCHEMA.empty_table()) is None
    assert read_table_file(None, RECORD_SCHEMA).num_rows == 0


def test_file_transfer_needs_a_work_dir_on_a_cluster_master():
    with pytest.raises(ValueError, match="work-dir"), audit_tasks.table_sink("spark://h:7077", None, "files", {}):
        pass
    with audit_tasks.table_sink("spark://h:7077", None, "auto", {}) as sink:
        assert sink is None  # in-band collect
    assert audit_tasks.is_local_master("local[*]") and audit_tasks.is_local_master("local")
    assert not audit_tasks.is_local_master("yarn")


def test_threaded_cross_checks_give_exactly_the_serial_findings(store, monkeypatch):
    """Findings from every cross-file check (queues, CQ, index, checkpoint, abort, config, consumer
    offsets), and per-kind caps small enough to bite: same list, same order, same summaries."""
    monkeypatch.setattr(checks, "MAX_PER_KIND", 2)
    corrupt(store)
    cq = sorted((store / "consumequeue" / "OrderEvents" / "0").iterdir())[0]
    with open(cq, "r+b") as f:
        for u in (2, 3, 4):
            f.seek(u * 20)
            f.write(struct.pack(">q", 7))  # entries pointing mid-record
    (store / "abort").write_bytes(b"")
    (store / "config" / "topics.json").write_text('{"dataVersion": {"counter": 1')  # truncated: falls back to .bak
    serial = run(store, threads=False, cross="driver")
    threaded = run(store, threads=True, cross="driver")
    assert threaded["findings"] == serial["findings"]
    assert _comparable(threaded) == _comparable(serial)
    kinds = {f["kind"] for f in serial["findings"]}
    assert {"cq_entry_not_record_start", "index_entry_wrong_hash", "abort_present", "body_crc_mismatch"} <= kinds
    assert any(f["extra"].get("more") for f in serial["findings"])  # a cap was reached


def test_capped_absorb_equals_adding_in_order():
    from storelib.errors import Finding

    def fs(kind: str, n: int, file: str = "f") -> list[Finding]:
        return [Finding(kind, "error", file, i, f"{kind} {i}") for i in range(n)]

    parts = [fs("a", 70) + fs("b", 3), fs("a", 40) + fs("c", 60, "g"), fs("b", 60)]
    one = checks.Capped()
    for p in parts:
        one.extend(p)
    merged = checks.Capped()
    for p in parts:
        c = checks.Capped()
        c.extend(p)
        merged.absorb(c)
    key = [(f.kind, f.file, f.offset, f.detail, f.extra) for f in one.done()]
    assert [(f.kind, f.file, f.offset, f.detail, f.extra) for f in merged.done()] == key


def test_work_dir_on_s3_round_trips_tables_and_is_removed(s3_server):
    """A ``--work-dir`` URI (what a cluster passes): the tables go there as objects and are read back;
    the run's prefix is deleted when the block ends."""
    import pyarrow.fs as pafs

    bucket = s3_server.new_bucket("work")
    opts = s3_server.fs_options()
    t = pa.table({"pos": [5], "phy": [5], "key_hash": [1]}, schema=KEY_SCHEMA)
    with audit_tasks.table_sink("spark://cluster:7077", f"s3://{bucket}/audit-work", "auto", opts) as sink:
        assert sink is not None and sink.dir.startswith(f"s3://{bucket}/audit-work/rmqstore-audit-")
        p = sink.write("seg-0.keys", t)
        assert p.startswith(sink.dir + "/") and read_table_file(p, KEY_SCHEMA, sink.fs_options).equals(t)
    fs = s3_server.filesystem()
    left = fs.get_file_info(pafs.FileSelector(f"{bucket}/audit-work", allow_not_found=True, recursive=True))
    assert [i.path for i in left if i.type == pafs.FileType.File] == []


def test_command_line_work_dir_option(store, spark, tmp_path, capsys):
    wd = tmp_path / "wd"
    wd.mkdir()
    code = audit_mod.main([str(store), "--broker-conf", str(store / "broker.conf"), "--engine", "spark",
                           "--master", "local[2]", "--work-dir", str(wd), "--json"])
    captured = capsys.readouterr()
    assert code == 0 and "tables in files" in captured.err and f"through {wd}" in captured.err
    assert list(wd.iterdir()) == []


def test_incremental_state_from_a_spark_run_goes_on_locally(store, spark, tmp_path, tempdir):
    """A Spark run's state (no table files: the carry of the partitioned checks) is continued by a local run;
    a damaged store's (judged by the whole view's checks, nothing to carry) is audited in full again."""
    state = tmp_path / "audit.state"
    first = run(store, engine="spark", spark=spark, split_bytes=SPLIT, since=str(state))
    assert work_dirs(tempdir) == [] and not (tmp_path / "audit.state.d").exists()
    again = run(store, since=str(state))  # local engine, everything carried forward
    assert again["run"]["segments_audited"] == 0 and "incremental: 0 queue group(s)" in again["run"]["cross_check_mode"]
    assert _comparable(again) == _comparable(first)
    corrupt(store)
    damaged = run(store, engine="spark", spark=spark, split_bytes=SPLIT, since=str(state))
    after = run(store, since=str(state))
    assert after["run"]["segments_audited"] == len(after["segments"])
    assert _comparable(after) == _comparable(damaged)
    assert serious(after) == serious(run(store))


def test_mapped_tables_hold_no_file_descriptor_and_survive_the_file(tmp_path):
    """Thousands of tasks must not mean thousands of open files on the driver."""
    t = pa.table({"pos": list(range(1000)), "phy": list(range(1000)), "key_hash": [3] * 1000}, schema=KEY_SCHEMA)
    paths = [TableSink(str(tmp_path)).write("s.keys", t) for _ in range(20)]
    fds = len(os.listdir("/proc/self/fd"))
    tables = [read_table_file(p, KEY_SCHEMA) for p in paths]
    assert len(os.listdir("/proc/self/fd")) == fds
    for p in paths:
        os.unlink(p)
    assert all(x.equals(t) for x in tables)
