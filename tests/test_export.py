"""rmqstore export: a Parquet snapshot equal to the data source's valid rows, nothing past the recovery
end, incremental reruns that equal a full export and write nothing when nothing changed, crash safety,
and clear refusals of what is not a snapshot or belongs to another store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import datasources as ds
import storelib.snapshot.directory as snap_mod
from jobs.engines.schedulers import LocalEngine, PoolEngine
from jobs.export import ExportConfig, export
from storelib.errors import StoreError
from tests.conftest import broker_conf

CONF = str(broker_conf("4.9.8"))


def run(store: Path, out: Path, **kw) -> dict:
    return export(ExportConfig(store=str(store), out=str(out), progress=False, **kw))


def rows(out: Path) -> list[dict]:
    t = ds.snapshot_dataset(str(out)).to_table()
    return sorted(t.drop_columns(["date"]).to_pylist(), key=lambda r: r["phy_offset"])


def source_rows(store: Path, **opts) -> list[dict]:
    t = ds.read_messages(str(store), **opts)
    t = t.filter(pc.is_null(t.column("_corrupt"))).drop_columns(["_corrupt"])
    return sorted(t.to_pylist(), key=lambda r: r["phy_offset"])


def grow(store: Path, n: int, topic: str = "OrderEvents") -> None:
    from storelib.broker.settings.store import load_settings
    from storelib.broker.writer.writer import StoreWriter
    from storelib.fileio.bytesource import resolve
    from storelib.format.record import Message

    st = load_settings(CONF, None, None, resolve(str(store)))
    with StoreWriter(store, st) as w:
        for i in range(n):
            w.append(Message(topic=topic if i % 3 else "New/Topic 🚀", body=b"x" * (300 + i), queue_id=i % 2,
                             born_timestamp=1795299620000 + i, born_host="10.0.0.1:1", properties={"KEYS": f"k{i}"}))


@pytest.fixture
def store(tmp_path, sample_498) -> Path:
    root = tmp_path / "store"
    shutil.copytree(sample_498 / "store", root)
    return root


def test_snapshot_equals_the_data_source_rows_field_by_field(store, tmp_path):
    m = run(store, tmp_path / "snap", broker_conf=CONF)
    got = rows(tmp_path / "snap")
    assert got == source_rows(store) and len(got) == 2000 == m["totals"]["rows"]
    assert m["schema"] == "rmqstore.snapshot/1" and m["process_offset"] == 1728172 and m["skipped"] == []
    assert m["broker_line"]["version"] == "4" and m["partition_by"] == ["topic", "date"]
    for seg in m["segments"].values():  # every file listed with its rows and digest
        assert sum(f["rows"] for f in seg["files"]) == seg["rows"]
        for f in seg["files"]:
            p = tmp_path / "snap" / f["path"]
            assert p.stat().st_size == f["bytes"] and len(f["sha256"]) == 64
    assert {p.name.split("=")[1] for p in (tmp_path / "snap").glob("topic=*")} == {"OrderEvents", "InventorySync",
                                                                                  "PaymentNotify"}


def test_with_body_and_no_partitions(store, tmp_path):
    run(store, tmp_path / "snap", with_body=True, partition_by=())
    got = rows(tmp_path / "snap")
    want = source_rows(store, withBody=True)
    assert [r["body"] for r in got] == [r["body"] for r in want]
    assert not list((tmp_path / "snap").glob("topic=*"))


def test_small_row_groups_and_file_limits_cut_files_and_keep_every_row_in_dispatch_order(store, tmp_path, monkeypatch):
    """The partition writer's buffering: row groups of ROW_GROUP rows, a partition's file cut past
    MAX_FILE_ROWS, many partitions flushed biggest first past PENDING_ROWS; by date only too."""
    import pyarrow.parquet as pq

    import storelib.snapshot.exporttask as et

    monkeypatch.setattr(et, "ROW_GROUP", 50)
    monkeypatch.setattr(et, "MAX_FILE_ROWS", 120)
    monkeypatch.setattr(et, "PENDING_ROWS", 80)
    for by in (("topic", "date"), ("date",)):
        out = tmp_path / ("snap-" + "-".join(by))
        m = run(store, out, broker_conf=CONF, partition_by=by)
        assert rows(out) == source_rows(store)
        files = [f for seg in m["segments"].values() for f in seg["files"]]
        assert len(files) > 2000 // 120 and all(f["rows"] <= 120 for f in files)
        for f in files:
            md = pq.ParquetFile(out / f["path"]).metadata
            assert md.num_rows == f["rows"] and all(md.row_group(i).num_rows <= 50 for i in range(md.num_row_groups))
            assert not set(by) & set(md.schema.names)  # partition values live in the path only
            phy = pq.read_table(out / f["path"], columns=["phy_offset"]).column(0).to_pylist()
            assert phy == sorted(phy)  # dispatch order inside a file
    assert not list((tmp_path / "snap-date").glob("topic=*")) and list((tmp_path / "snap-date").glob("date=*"))


def test_take_rows_moves_map_rows_like_arrows_take(store):
    """The partition sort's take (maps moved row by row) gives Arrow's own take: on the decoder's real
    properties, on a slice, with empty maps and empty strings, binary keys, and (Arrow's path) nulls."""
    import numpy as np

    from storelib.snapshot.exporttask import take_rows

    props = ds.read_messages(str(store)).column("properties").combine_chunks()
    mt = pa.map_(pa.string(), pa.string())
    cases = [
        props, props.slice(7, 500),
        pa.array([[("a", "")], [], [("", "x"), ("k", "v")], [], [("z", "long value " * 5)]], mt),
        pa.array([[(b"\x00k", b"v")], [(b"", b"")]], pa.map_(pa.binary(), pa.binary())),
        pa.array([[("a", "1")], None, [("b", None)]], mt),  # nulls: Arrow's take
        pa.array([[], []], mt),
    ]
    rng = np.random.default_rng(3)
    for arr in cases:
        t = pa.table({"n": pa.array(range(len(arr))), "m": arr})
        for order in (rng.permutation(len(arr)), np.arange(len(arr))[::-1].copy(), rng.integers(0, len(arr), 9)):
            got = take_rows(t, order)
            assert got.schema == t.schema and got.equals(t.take(pa.array(order)))
            assert got.column("m").to_pylist() == [arr[int(i)].as_py() for i in order]


def _kept_alive(pending: dict[str, list[pa.Table]]) -> int:
    """Bytes of the distinct buffers the waiting tables reference (a slice keeps its parent's whole buffer)."""
    seen: dict[int, int] = {}
    for tables in pending.values():
        for t in tables:
            for col in t.columns:
                for chunk in col.chunks:
                    stack = [chunk]
                    while stack:
                        a = stack.pop()
                        for b in a.buffers():
                            if b is not None:
                                seen[b.address] = b.size
                        if pa.types.is_map(a.type) or pa.types.is_struct(a.type):
                            stack.extend([a.values] if pa.types.is_map(a.type) else [a.field(i) for i in range(a.type.num_fields)])
    return sum(seen.values())


def test_rows_waiting_for_a_row_group_keep_a_bounded_number_of_batches_alive(tmp_path, monkeypatch):
    """A partition's waiting rows are slices of their batch's take, each keeping the whole batch alive: a
    partition that fills slowly goes out once the batches from its oldest rows pass KEEP_BYTES (a 1 GB
    segment's task grew to 820 MB), and every row is written, in dispatch order, all the same."""
    import numpy as np
    import pyarrow.parquet as pq

    from storelib.fileio.bytesource import resolve
    from storelib.snapshot import exporttask
    from storelib.snapshot.exporttask import _Partitions

    mt = pa.map_(pa.string(), pa.string())

    def batch(k: int, n: int = 2000) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({
            "topic": pa.array(["A" if i % 20 else "B" for i in range(n)]),  # B fills 20x slower
            "n": pa.array(np.arange(k * n, (k + 1) * n)),
            "properties": pa.array([[("UNIQ_KEY", f"{k:04d}{i:028d}")] for i in range(n)], mt)})

    one = pa.Table.from_batches([batch(0)]).drop_columns(["topic"]).nbytes
    monkeypatch.setattr(exporttask, "KEEP_BYTES", 3 * one)
    parts = _Partitions(resolve(str(tmp_path)), ("topic",), batch(0).schema, "t")
    for k in range(12):
        parts.add(batch(k))
        assert _kept_alive(parts.pending) <= 4.5 * one  # three batches and the newest, not all twelve
    files = parts.close()
    got = {f["path"].split("/")[-2]: pq.read_table(f["path"]).column("n").to_pylist() for f in files}
    every = np.arange(12 * 2000)
    assert got["topic=B"] == every[every % 20 == 0].tolist() and got["topic=A"] == every[every % 20 != 0].tolist()


def test_utc_days_equal_the_zoned_cast_to_date_text():
    """The date partition's text (cast on the naive timestamp, only distinct days formatted) equals the
    zoned cast row by row: before 1970, at midnight, the last day Arrow prints, and the far out of range."""
    import numpy as np

    from storelib.scan.messagecols import time_column
    from storelib.snapshot.exporttask import utc_days

    ms = np.r_[np.random.default_rng(5).integers(-10**13, 10**13, 5000),
               [-1, 0, 86_399_999, 86_400_000, -86_400_000, -86_400_001, 253_402_300_799_999, 10**15, -10**15]]
    st = time_column(pa.array(ms, pa.int64()))
    got = utc_days(st)
    assert got.dictionary_decode().equals(pc.cast(pc.cast(st, pa.date32()), pa.string()))
    assert len(got.dictionary) == len(set(got.dictionary.to_pylist()))


def test_records_past_the_recovery_end_are_not_exported_and_the_manifest_says_why(store, tmp_path):
    seg = store / "commitlog" / "00000000000001048576"
    with open(seg, "r+b") as f:  # a body byte of the record at 199059 (inside the recovery window)
        f.seek(199059 + 88 + 5)
        b = f.read(1)[0]
        f.seek(199059 + 88 + 5)
        f.write(bytes([b ^ 1]))
    m = run(store, tmp_path / "snap")
    P = 1048576 + 199059
    assert m["process_offset"] == P
    got = rows(tmp_path / "snap")
    assert got and max(r["phy_offset"] for r in got) < P
    assert len(got) == sum(1 for r in source_rows(store) if r["phy_offset"] < P)
    whys = " ".join(s["why"] for s in m["skipped"])
    assert "crc" in whys.lower() and "past the recovery end" in whys


def test_topic_names_become_encoded_partition_values(store, tmp_path):
    grow(store, 30)
    run(store, tmp_path / "snap", broker_conf=CONF)
    t = ds.snapshot_dataset(str(tmp_path / "snap")).to_table()
    assert "New/Topic 🚀" in set(t.column("topic").to_pylist())
    assert all("/" not in p.name for p in (tmp_path / "snap").iterdir())


def test_a_topic_too_long_for_a_directory_entry_is_skipped_and_counted_unless_topics_are_not_partitions(store, tmp_path):
    long = "\U0001f680" * 30  # 120 bytes: 360 percent-encoded, past one directory entry
    grow(store, 30, topic=long)  # 20 of them in that topic, 10 in "New/Topic 🚀"
    m = run(store, tmp_path / "snap", broker_conf=CONF)
    (entry,) = [s for s in m["skipped"] if "topics" in s]
    assert list(entry["topics"].values()) == [20] and "\\U0001f680" in next(iter(entry["topics"]))
    assert rows(tmp_path / "snap") == [r for r in source_rows(store) if r["topic"] != long]
    assert m["totals"]["rows"] == 2010
    m = run(store, tmp_path / "bydate", broker_conf=CONF, partition_by=("date",))
    assert not [s for s in m["skipped"] if "topics" in s] and rows(tmp_path / "bydate") == source_rows(store)


def test_incremental_rerun_writes_only_the_new_part_and_equals_a_full_export(store, tmp_path):
    run(store, tmp_path / "snap", broker_conf=CONF)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "snap").rglob("*.parquet")}
    grow(store, 200)
    m = run(store, tmp_path / "snap", broker_conf=CONF, incremental=True)
    assert m["run"]["segments_unchanged"] == 3 and m["run"]["rows_written"] == 200
    after = {p: p.stat().st_mtime_ns for p in (tmp_path / "snap").rglob("*.parquet")}
    assert all(after.get(p) == t for p, t in before.items())  # nothing rewritten
    run(store, tmp_path / "full", broker_conf=CONF)
    strip = [{k: v for k, v in r.items() if k != "segment"} for r in rows(tmp_path / "snap")]
    assert strip == [{k: v for k, v in r.items() if k != "segment"} for r in rows(tmp_path / "full")]
    assert len(strip) == 2200


def test_a_rerun_with_other_partitions_leaves_no_empty_partition_directory(store, tmp_path):
    """A full rerun replaces every file: the directories of the old layout go with them (pruned), and a
    run that deletes nothing leaves the directories its files are in."""
    m = run(store, tmp_path / "snap", broker_conf=CONF)
    assert list((tmp_path / "snap").glob("topic=*/date=*/*.parquet"))
    m = run(store, tmp_path / "snap", broker_conf=CONF, partition_by=("date",))
    assert m["run"]["files_deleted"] > 0 and not list((tmp_path / "snap").glob("topic=*"))
    dirs = [p for p in (tmp_path / "snap").rglob("*") if p.is_dir()]
    assert dirs and all(any(d.iterdir()) for d in dirs)
    assert rows(tmp_path / "snap") == source_rows(store)


def test_an_unchanged_store_writes_nothing(store, tmp_path):
    run(store, tmp_path / "snap")
    man = tmp_path / "snap" / "_manifest.json"
    stamp = man.stat().st_mtime_ns
    m = run(store, tmp_path / "snap", incremental=True)
    assert m["run"]["unchanged"] and m["run"]["files_written"] == 0 and man.stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "snap").iterdir() if p.name.startswith("_")] == ["_manifest.json"]


def test_a_crash_before_the_commit_record_leaves_the_previous_snapshot(store, tmp_path, monkeypatch):
    run(store, tmp_path / "snap")
    old = rows(tmp_path / "snap")
    grow(store, 50)

    def boom(*a, **k):
        raise OSError("killed before the commit record")

    monkeypatch.setattr("jobs.export.write_json", boom)
    with pytest.raises(OSError):
        run(store, tmp_path / "snap", incremental=True)
    assert rows(tmp_path / "snap") == old  # staged files are invisible to dataset readers
    monkeypatch.undo()
    m = run(store, tmp_path / "snap", incremental=True)
    assert m["totals"]["rows"] == 2050 and len(rows(tmp_path / "snap")) == 2050
    assert not list((tmp_path / "snap").glob("_staging-*"))


def test_a_crash_after_the_commit_record_is_finished_by_the_next_run(store, tmp_path, monkeypatch):
    run(store, tmp_path / "snap")
    grow(store, 50)
    real = snap_mod.apply_commit

    def crash(out, st, doc):
        raise OSError("killed while moving")

    monkeypatch.setattr("jobs.export.apply_commit", crash)
    with pytest.raises(OSError):
        run(store, tmp_path / "snap", incremental=True)
    assert list((tmp_path / "snap").glob("_staging-*/_commit.json"))
    monkeypatch.setattr("jobs.export.apply_commit", real)
    m = run(store, tmp_path / "snap", incremental=True)  # finishes the moves, then finds nothing new
    assert m["run"]["unchanged"] and m["totals"]["rows"] == 2050 and len(rows(tmp_path / "snap")) == 2050


def test_a_fresh_snapshot_takes_whole_partition_directories_and_a_crash_mid_commit_is_finished(store, tmp_path,
                                                                                              monkeypatch):
    """A new snapshot's staged topic directories move in whole (every file of each is a move); a crash
    after those moves and before the manifest leaves the commit record, and the next run finishes it
    (per file, none left to move) to the same rows, with no staging directory left."""
    real_whole, real_write = snap_mod._move_whole_dirs, snap_mod.write_json
    moved: list[set[str]] = []
    monkeypatch.setattr(snap_mod, "_move_whole_dirs", lambda *a: moved.append(real_whole(*a)) or moved[-1])
    m = run(store, tmp_path / "snap")
    assert moved[0] == {f["path"] for s in m["segments"].values() for f in s["files"]}
    assert not list((tmp_path / "snap").glob("_staging-*"))

    def crash(loc, obj):
        raise OSError("killed before the manifest")

    monkeypatch.setattr(snap_mod, "write_json", crash)
    with pytest.raises(OSError):
        run(store, tmp_path / "again")
    assert len(moved) == 2 and moved[1] and list((tmp_path / "again").glob("_staging-*/_commit.json"))
    assert not (tmp_path / "again" / "_manifest.json").exists()
    monkeypatch.setattr(snap_mod, "write_json", real_write)
    m = run(store, tmp_path / "again", incremental=True)  # finishes the commit, then finds nothing new
    assert m["run"]["unchanged"] and rows(tmp_path / "again") == rows(tmp_path / "snap") == source_rows(store)
    assert not list((tmp_path / "again").glob("_staging-*"))


def test_refuses_a_directory_that_is_not_a_snapshot_and_a_snapshot_of_another_store(store, tmp_path, sample_533):
    other = tmp_path / "docs"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not a snapshot"):
        run(store, other)
    assert (other / "notes.txt").read_text() == "mine"
    run(sample_533 / "store", tmp_path / "snap")
    with pytest.raises(StoreError, match="other_store"):
        run(store, tmp_path / "snap", incremental=True)
    with pytest.raises(StoreError, match="not_a_snapshot"):
        ds.snapshot_dataset(str(other))


def test_pool_and_local_engines_write_the_same_rows(store, tmp_path):
    a = export(ExportConfig(store=str(store), out=str(tmp_path / "a"), progress=False), engine=LocalEngine())
    pool = PoolEngine(2)
    try:
        b = export(ExportConfig(store=str(store), out=str(tmp_path / "b"), progress=False), engine=pool)
    finally:
        pool.close()
    assert a["totals"]["rows"] == b["totals"]["rows"] and rows(tmp_path / "a") == rows(tmp_path / "b")


def test_cli_export_and_summary(store, tmp_path, capsys):
    from jobs.cli import main

    assert main(["export", str(store), "--out", str(tmp_path / "s"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "2000 rows" in out and "processOffset 1728172" in out
    assert main(["export", str(store), "--out", str(tmp_path / "s"), "--incremental", "--quiet", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"]["unchanged"] is True


@pytest.mark.spark
def test_spark_reads_the_snapshot_with_fixed_types(store, tmp_path, spark):
    run(store, tmp_path / "snap")
    df = ds.read_snapshot(spark, str(tmp_path / "snap"), view="snap")
    assert df.count() == 2000
    by_topic = {r.topic: r.n for r in spark.sql("SELECT topic, count(*) AS n FROM snap GROUP BY topic").collect()}
    src = ds.read_messages(str(store)).group_by("topic").aggregate([("phy_offset", "count")]).to_pylist()
    assert by_topic == {r["topic"]: r["phy_offset_count"] for r in src}
    assert dict(df.dtypes)["store_time"] == "timestamp" and dict(df.dtypes)["topic"] == "string"
    assert pa.types.is_timestamp(ds.snapshot_dataset(str(tmp_path / "snap")).schema.field("store_time").type)


@pytest.mark.spark
def test_read_snapshot_splits_small_files_finer_unless_the_session_says_otherwise(store, tmp_path, spark):
    run(store, tmp_path / "snap")
    keys = ("spark.sql.files.openCostInBytes", "spark.sql.files.minPartitionNum")
    before = {k: spark.conf.getAll.get(k) for k in keys}
    try:
        for k in keys:
            spark.conf.unset(k)
        df = ds.read_snapshot(spark, str(tmp_path / "snap"))
        got = spark.conf.getAll
        assert got["spark.sql.files.openCostInBytes"] == str(1 << 20)
        assert got["spark.sql.files.minPartitionNum"] == str(2 * spark.sparkContext.defaultParallelism)
        assert df.count() == 2000
        spark.conf.set("spark.sql.files.openCostInBytes", "8388608")  # the session's own choice stands
        spark.conf.unset("spark.sql.files.minPartitionNum")
        ds.read_snapshot(spark, str(tmp_path / "snap"))
        assert spark.conf.getAll["spark.sql.files.openCostInBytes"] == "8388608"
        spark.conf.unset("spark.sql.files.minPartitionNum")
        ds.read_snapshot(spark, str(tmp_path / "snap"), tune_splits=False)
        assert "spark.sql.files.minPartitionNum" not in spark.conf.getAll
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
