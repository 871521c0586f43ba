"""The rocketmq data sources: split planning, pyarrow readers and Spark DataFrames equal storelib's reads.

Spark tests use the one session fixture; stores are the real samples and stores written by
storelib.broker.writer.writer (IPv6 hosts, V2 records, transactions, compressed bodies, 5.x property CRC).
"""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from pathlib import Path

import pyarrow as pa
import pytest
from chispa import assert_df_equality

from datasources import read_checkpoint_table, read_consumequeue, read_index, read_messages, read_segments
from datasources.commitlog_reader import MessageReadOptions, Pred, output_schema, plan
from storelib.broker.settings.brokerconf import BrokerSettings, load_broker_conf
from storelib.broker.writer.writer import StoreWriter
from storelib.errors import CorruptRecordError
from storelib.format.checkpoint import read_checkpoint
from storelib.format.indexdir import list_index_files
from storelib.format.indexfile import IndexGeometry
from storelib.format.record import Message, encode_message
from storelib.scan import splits
from storelib.scan.commitlog import CommitLog
from storelib.scan.messagecols import MESSAGE_COLUMNS, with_time_columns
from storelib.scan.scanner import SegmentScan
from storelib.scan.splits import find_record_start, plan_splits
from tests.conftest import broker_conf, load_expected

SEG = 65536


def storelib_table(store: Path, **kw) -> pa.Table:
    """What storelib reads directly, in the data source's columns (without segment/_corrupt)."""
    t = with_time_columns(CommitLog(str(store / "commitlog")).read_table(**kw))
    cols = MESSAGE_COLUMNS + (["body"] if kw.get("with_body") else [])
    schema = output_schema(kw.get("with_body", False))
    return t.select(cols).cast(pa.schema([schema.field(c) for c in cols]))


def without_extras(t: pa.Table) -> pa.Table:
    return t.drop_columns(["segment", "_corrupt"])


@pytest.fixture(scope="module")
def gen_store(tmp_path_factory) -> Path:
    """A 5.x-style store: IPv6 store/born hosts, V2 topics, transactions, compressed bodies, delays, prop CRC."""
    root = tmp_path_factory.mktemp("gen") / "store"
    st = BrokerSettings.defaults("5").with_overrides({
        "mappedFileSizeCommitLog": str(SEG), "enabledAppendPropCRC": "true", "maxHashSlotNum": "64",
        "maxIndexNum": "256", "mappedFileSizeConsumeQueue": "2000"})
    clock = iter(range(1_700_000_000_000, 1_700_000_000_000 + 10**9, 7))
    with StoreWriter(root, st, clock=lambda: next(clock), store_host="[2001:db8::1]:10911") as w:
        for i in range(400):
            body = (f"body-{i}-" * (i % 17 + 1)).encode()
            sf = 0
            if i % 5 == 0:
                body, sf = zlib.compress(body), 0x1 | (3 << 8)
            topic = "T" * 130 if i % 7 == 0 else f"Topic{i % 3}"
            m = Message(topic=topic, body=body, queue_id=i % 4, sys_flag=sf, born_timestamp=1_699_999_999_000 + i,
                        born_host="[fe80::1]:5555" if i % 2 else "10.0.0.9:4444",
                        properties={"TAGS": f"tag{i % 3}", "KEYS": f"k{i} kk{i}", "UNIQ_KEY": f"U{i:030d}"})
            if i % 11 == 0:
                h = w.prepare(m, "pg")
                w.commit(h) if i % 22 == 0 else w.rollback(h)
            elif i % 13 == 0:
                m.properties["DELAY"] = "2"
                w.append(m)
            else:
                w.append(m)
    (root.parent / "broker.conf").write_text(
        f"mappedFileSizeCommitLog={SEG}\nmaxHashSlotNum=64\nmaxIndexNum=256\nmappedFileSizeConsumeQueue=2000\n")
    return root


def _segment_bytes(records: list[bytes], size: int) -> bytes:
    body = b"".join(records)
    free = size - len(body)
    return body + struct.pack(">ii", free, -875286124) + b"\0" * (free - 8)


# ------------------------------------------------------------------------------------------------
# split planning (no Spark)


def test_splits_start_at_record_starts_and_cover_every_record_once(sample):
    store = sample / "store"
    cl = CommitLog(str(store / "commitlog"))
    planned = plan_splits(cl, 40_000)
    assert len(planned) > 2 * len(cl.segments)  # big segments were cut
    full = cl.read_table()
    starts = set(full.column("phy_offset").to_pylist())
    parts = []
    for p in planned:
        s = p.split
        if s.start:
            assert s.segment_base + s.start in starts
        seg = next(x for x in cl.segments if x.name == s.segment_name)
        scan = SegmentScan(seg.open(), seg.display, seg.base, s.start, s.end)
        parts.extend(scan)
        assert scan.end.kind in ("split_end", "blank", "end_of_data", "segment_end")
    assert pa.Table.from_batches(parts).equals(full)


def test_min_splits_lowers_the_split_size_so_two_big_segments_still_make_many_units(sample):
    cl = CommitLog(str(sample / "store" / "commitlog"))
    assert len(plan_splits(cl, 1 << 30)) == len(cl.segments)
    assert len(plan_splits(cl, 1 << 30, min_splits=2 * len(cl.segments))) > len(cl.segments)


def test_parallel_split_size_is_two_units_per_core_within_128_to_512_mib():
    mib = 1 << 20
    assert splits.parallel_split_bytes(2048 * mib, 2) == 512 * mib
    assert splits.parallel_split_bytes(1024 * mib, 2) == 256 * mib
    assert splits.parallel_split_bytes(2048 * mib, 16) == 128 * mib  # many cores: not below 128 MiB
    assert splits.parallel_split_bytes(100 * 1024 * mib, 2) == 512 * mib  # big store: not above 512 MiB
    assert splits.parallel_split_bytes(2048 * mib, 4) == 256 * mib
    assert splits.parallel_split_bytes(0, 4) == 128 * mib
    assert splits.parallel_split_bytes(0, 0) == 128 * mib


def test_default_split_size_follows_the_bytes_in_range_and_the_cores(sample, monkeypatch):
    # shrink the bounds so the sample's segments show the rule: ~2 units per core over what is read
    monkeypatch.setattr(splits, "MIN_PARALLEL_SPLIT_BYTES", 1)
    monkeypatch.setattr(splits, "MAX_PARALLEL_SPLIT_BYTES", 1 << 40)
    cl = CommitLog(str(sample / "store" / "commitlog"))
    total = sum(s.file_size for s in cl.segments)
    seen = []
    real = splits._segment_cuts

    def spy(seg, src, step, *a):
        seen.append(step)
        return real(seg, src, step, *a)

    monkeypatch.setattr(splits, "_segment_cuts", spy)
    whole = plan_splits(cl, None, parallelism=3)
    assert set(seen) == {-(-total // 6)}
    assert len(whole) >= len(cl.segments)
    seen.clear()
    last = cl.segments[-1]
    part = plan_splits(cl, None, parallelism=1, from_offset=last.base)
    assert set(seen) == {-(-last.file_size // 2)}
    assert all(p.split.segment_name == last.name for p in part)
    # an explicit size wins, whatever the cores
    seen.clear()
    plan_splits(cl, 40_000, parallelism=64)
    assert set(seen) == {40_000}
    # the data source: no maxSplitBytes means the parallel default, a given one is kept
    store = str(sample / "store")
    assert MessageReadOptions.parse({"path": store}).max_split_bytes is None
    assert MessageReadOptions.parse({"path": store, "maxSplitBytes": "40k"}).max_split_bytes == 40 * 1024


def test_record_start_search_ignores_a_record_image_inside_a_body():
    # a body that carries a whole record (magic, sane size) but written for another position
    inner = encode_message(Message(topic="X", body=b"i" * 50, physical_offset=5, store_timestamp=1))
    recs = []
    pos = 0
    for i in range(3):
        r = encode_message(Message(topic="T", body=inner if i == 1 else b"plain", physical_offset=pos,
                                   store_timestamp=2, queue_offset=i))
        recs.append(r)
        pos += len(r)
    seg = _segment_bytes(recs, 4096)

    class Src:
        size = len(seg)

        def read(self, o, n):
            return memoryview(seg)[o : o + n]

    assert find_record_start(Src(), 0, 1) == len(recs[0])
    assert find_record_start(Src(), 0, len(recs[0]) + 1) == len(recs[0]) + len(recs[1])
    assert find_record_start(Src(), 0, pos + 1) is None
    assert find_record_start(Src(), 4096, 1) is None  # PHYSICALOFFSET must match base + position


# ------------------------------------------------------------------------------------------------
# pyarrow readers (no Spark)


def test_read_messages_equals_storelib_scan_on_samples_and_any_split_size(sample):
    store = sample / "store"
    want = storelib_table(store)
    for split in ("64k", "1g"):
        got = read_messages(str(store), maxSplitBytes=split)
        assert without_extras(got).equals(want)
        assert got.column("_corrupt").null_count == got.num_rows
    segs = read_messages(str(store)).column("segment").to_pylist()
    assert segs == [f"{p - p % (512 * 1024):020d}" for p in want.column("phy_offset").to_pylist()]


def test_read_messages_on_generated_store_with_ipv6_v2_transactions_and_compressed_bodies(gen_store):
    got = read_messages(str(gen_store), with_body=True, max_split_bytes=8192)
    want = storelib_table(gen_store, with_body=True)
    assert without_extras(got).equals(want)
    assert set(got.column("magic_version").to_pylist()) == {1, 2}
    assert set(got.column("tran_type").to_pylist()) == {0, 2}
    assert any(h.startswith("[") for h in got.column("born_host").to_pylist())
    assert any(sf & 1 for sf in got.column("sys_flag").to_pylist())
    df = read_messages(str(gen_store), as_pandas=True)
    assert len(df) == got.num_rows and list(df.columns) == output_schema().names


def test_option_filters_topics_offsets_and_times(sample):
    store = str(sample / "store")
    full = read_messages(store)
    rows = full.to_pylist()
    mid, late = rows[500], rows[1500]
    t = read_messages(store, topics="OrderEvents,PaymentNotify", fromOffset=mid["phy_offset"],
                      toOffset=late["phy_offset"])
    want = [r for r in rows[500:1500] if r["topic"] in ("OrderEvents", "PaymentNotify")]
    assert t.column("phy_offset").to_pylist() == [r["phy_offset"] for r in want]
    ts0, ts1 = mid["store_timestamp"], late["store_timestamp"]
    t = read_messages(store, fromTime=ts0, toTime=ts1, maxSplitBytes="32k")
    want = [r["phy_offset"] for r in rows if ts0 <= r["store_timestamp"] < ts1]
    assert t.column("phy_offset").to_pylist() == want
    iso = read_messages(store, fromTime="1970-01-01T00:00:00Z", toTime=str(ts1))
    assert iso.num_rows == sum(r["store_timestamp"] < ts1 for r in rows)
    assert read_messages(store, verifyCrc="false").column("crc_ok").null_count == full.num_rows


def test_time_pruning_drops_units_but_not_rows(sample):
    store = str(sample / "store")
    rows = read_messages(store).to_pylist()
    ts = rows[1000]["store_timestamp"]
    opts = MessageReadOptions.parse({"path": store, "maxSplitBytes": "32k", "fromTime": ts, "toTime": ts + 1})
    assert len(plan(opts)) < len(plan(MessageReadOptions.parse({"path": store, "maxSplitBytes": "32k"})))
    got = read_messages(store, maxSplitBytes="32k", fromTime=ts, toTime=ts + 1)
    assert got.column("phy_offset").to_pylist() == [r["phy_offset"] for r in rows if r["store_timestamp"] == ts]


def test_pushed_offset_and_segment_predicates_prune_units(sample):
    store = str(sample / "store")
    opts = MessageReadOptions.parse({"path": store, "maxSplitBytes": "64k"})
    everything = plan(opts)
    few = plan(opts, [Pred("phy_offset", ">=", 600_000), Pred("phy_offset", "<", 700_000)])
    assert 1 <= len(few) < len(everything) and all(s.segment_base == 524_288 for s in few)
    one = plan(opts, [Pred("segment", "=", "00000000000001048576")])
    assert {s.segment_name for s in one} == {"00000000000001048576"}


@pytest.mark.parametrize("bad", [{"mode": "LENIENT"}, {"withBody": "maybe"}, {"fromOffset": "x"}, {"nope": 1},
                                 {"maxSplitBytes": "0"}, {"fromTime": "yesterday"}])
def test_bad_options_are_rejected_with_the_option_name(sample, bad):
    with pytest.raises(ValueError, match="option"):
        MessageReadOptions.parse({"path": str(sample / "store"), **bad})


def test_consumequeue_rows_equal_the_broker_oracle(sample, sample_498):
    version = "4.9.8" if sample == sample_498 else "5.3.3"
    t = read_consumequeue(str(sample / "store"), brokerConf=str(broker_conf(version)))
    exp = load_expected(sample, "consumequeue_entries.jsonl")
    got = sorted((r["topic"], r["queue_id"], r["queue_offset"], r["phy_offset"], r["size"], r["tags_code"])
                 for r in t.to_pylist())
    want = sorted((e["topic"], e["queueId"], e["queueOffset"], e["phyOffset"], e["size"], e["tagsCode"]) for e in exp)
    assert got == want
    assert all(f.startswith("consumequeue/") for f in t.column("file").unique().to_pylist())


def test_index_rows_equal_the_index_files(sample, sample_498):
    version = "4.9.8" if sample == sample_498 else "5.3.3"
    conf = str(broker_conf(version))
    t = read_index(str(sample / "store"), brokerConf=conf)
    st = load_broker_conf(conf)
    geo = IndexGeometry(st.max_hash_slot_num, st.max_index_num)
    n = 0
    for ref in list_index_files(str(sample / "store")):
        with ref.open(geo) as f:
            e = f.entries_array()
            rows = t.filter(pa.compute.equal(t.column("file"), ref.name))
            assert rows.column("phy_offset").to_pylist() == e["phy_offset"].tolist()
            assert rows.column("prev_index").to_pylist() == e["prev_index"].tolist()
            assert rows.column("slot").to_pylist() == [int(h) % geo.hash_slot_num for h in e["key_hash"]]
            assert rows.column("entry").to_pylist() == list(range(1, len(e) + 1))
            n += len(e)
    assert t.num_rows == n > 0


def test_checkpoint_and_segments_tables(sample):
    store = str(sample / "store")
    cp = read_checkpoint(store)
    row = read_checkpoint_table(store).to_pylist()[0]
    assert row["physic_msg_timestamp"] == cp.physic_msg_timestamp and row["min_timestamp"] == cp.min_timestamp()
    segs = read_segments(store).to_pylist()
    assert [s["base"] for s in segs] == [0, 524288, 1048576, 1572864]
    first = read_messages(store).to_pylist()[0]
    assert segs[0]["first_store_timestamp"] == first["store_timestamp"]


# ------------------------------------------------------------------------------------------------
# corrupted store: modes (pyarrow path)


@pytest.fixture
def corrupt_store(tmp_path, sample_498) -> tuple[Path, list[int], list[dict]]:
    """The 4.9.8 sample with a bad magic in segment 1 and a bad TOTALSIZE in segment 2 (mid-segment)."""
    store = tmp_path / "store"
    shutil.copytree(sample_498 / "store", store)
    rows = storelib_table(store).to_pylist()
    seg1 = [r for r in rows if 524288 <= r["phy_offset"] < 1048576]
    seg2 = [r for r in rows if 1048576 <= r["phy_offset"] < 1572864]
    a, b = seg1[len(seg1) // 2], seg2[len(seg2) // 3]
    with open(store / "commitlog" / "00000000000000524288", "r+b") as f:
        f.seek(a["phy_offset"] - 524288 + 4)
        f.write(b"\x12\x34\x56\x78")
    with open(store / "commitlog" / "00000000000001048576", "r+b") as f:
        f.seek(b["phy_offset"] - 1048576)
        f.write(struct.pack(">i", 7))
    return store, [a["phy_offset"], b["phy_offset"]], rows


def test_permissive_reports_each_bad_record_and_resyncs_after_it(corrupt_store):
    store, bad, rows = corrupt_store
    for split in ("1g", "20k"):
        t = read_messages(str(store), maxSplitBytes=split)
        corrupt = [r for r in t.to_pylist() if r["_corrupt"] is not None]
        assert [r["phy_offset"] for r in corrupt] == bad
        assert corrupt[0]["_corrupt"].startswith("bad_magic") and corrupt[1]["_corrupt"].startswith("bad_size")
        assert corrupt[0]["segment"] == "00000000000000524288" and corrupt[0]["topic"] is None
        good = [r["phy_offset"] for r in t.to_pylist() if r["_corrupt"] is None]
        assert good == [r["phy_offset"] for r in rows if r["phy_offset"] not in bad]


def test_dropmalformed_keeps_every_good_record_and_no_corrupt_rows(corrupt_store):
    store, bad, rows = corrupt_store
    t = read_messages(str(store), mode="DROPMALFORMED", maxSplitBytes="20k")
    assert t.column("_corrupt").null_count == t.num_rows
    assert t.column("phy_offset").to_pylist() == [r["phy_offset"] for r in rows if r["phy_offset"] not in bad]


def test_failfast_raises_naming_segment_and_offset(corrupt_store):
    store, bad, _ = corrupt_store
    with pytest.raises(CorruptRecordError) as ei:
        read_messages(str(store), mode="FAILFAST")
    assert ei.value.file == "commitlog/00000000000000524288" and ei.value.offset == bad[0] - 524288
    # a range that avoids both bad records reads fine
    t = read_messages(str(store), mode="FAILFAST", toOffset=bad[0])
    assert t.num_rows and max(t.column("phy_offset").to_pylist()) < bad[0]


def test_read_messages_with_columns_equals_the_full_read_projected_with_filters(corrupt_store):
    store, bad, _ = corrupt_store
    full = read_messages(str(store), maxSplitBytes="20k", topics="OrderEvents")
    cols = ["keys", "_corrupt", "segment", "queue_id"]  # topics filter needs topic, not returned
    part = read_messages(str(store), maxSplitBytes="20k", topics="OrderEvents", columns=cols)
    assert 0 < part.num_rows < len(read_messages(str(store), columns=["topic"]))
    assert part.schema.names == cols
    assert part.to_pylist() == full.select(cols).to_pylist()
    everything = read_messages(str(store), columns=["_corrupt", "phy_offset"])  # corrupt rows keep offsets
    assert [r["phy_offset"] for r in everything.to_pylist() if r["_corrupt"]] == bad
    with pytest.raises(ValueError, match="bad columns"):
        read_messages(str(store), columns=["topic", "no_such_column"])


# ------------------------------------------------------------------------------------------------
# Spark


@pytest.fixture(scope="module")
def rmq_spark(spark):
    from datasources import register

    register(spark)
    return spark


@pytest.mark.spark
def test_dataframe_equals_storelib_on_the_sample(rmq_spark, sample_498):
    store = sample_498 / "store"
    df = rmq_spark.read.format("rocketmq").option("maxSplitBytes", "128k").load(str(store))
    assert df.columns == output_schema().names
    want = rmq_spark.createDataFrame(storelib_table(store))
    got = df.drop("segment", "_corrupt")
    assert_df_equality(got.orderBy("phy_offset"), want.orderBy("phy_offset"), ignore_nullable=True)
    assert got.rdd.getNumPartitions() >= 4 * 2


@pytest.mark.spark
def test_dataframe_equals_storelib_on_generated_store_with_body(rmq_spark, gen_store):
    df = (rmq_spark.read.format("rocketmq").option("withBody", "true").option("maxSplitBytes", "16k")
          .option("brokerConf", str(gen_store.parent / "broker.conf")).load(str(gen_store)))
    want = rmq_spark.createDataFrame(storelib_table(gen_store, with_body=True))
    assert_df_equality(df.drop("segment", "_corrupt").orderBy("phy_offset"), want.orderBy("phy_offset"),
                       ignore_nullable=True)


@pytest.mark.spark
def test_registered_reader_never_leaks_one_querys_filters_into_another(rmq_spark, sample_498):
    # Spark 4.3 reuses a pushdown-planned reader for later scans of the same DataFrame; register()
    # must pick a reader for which a filtered query does not change the next unfiltered one
    store = str(sample_498 / "store")
    df = rmq_spark.read.format("rocketmq").load(store)
    assert df.filter("phy_offset < 200000").count() < 2000
    assert df.count() == 2000 and len(df.select("phy_offset").collect()) == 2000


@pytest.mark.spark
def test_forced_pushdown_prunes_units_and_filters_exactly(rmq_spark, sample_498):
    from datasources import register

    store = str(sample_498 / "store")
    rows = read_messages(store).to_pylist()
    lo, hi = rows[300]["phy_offset"], rows[900]["phy_offset"]
    t0 = rows[1200]["store_timestamp"]
    try:
        assert register(rmq_spark, pushdown=True).pushdown is True

        def fresh():
            return rmq_spark.read.format("rocketmq").option("maxSplitBytes", "64k").load(store)

        q = fresh().filter(f"phy_offset >= {lo} AND phy_offset < {hi} AND topic IN ('OrderEvents', 'InventorySync')")
        assert sorted(r.phy_offset for r in q.select("phy_offset").collect()) == [
            r["phy_offset"] for r in rows[300:900] if r["topic"] in ("OrderEvents", "InventorySync")]
        q2 = fresh().filter(f"store_timestamp > {t0} AND segment = '00000000000001572864'")
        assert q2.count() == sum(r["store_timestamp"] > t0 and r["phy_offset"] >= 1572864 for r in rows)
        assert q.rdd.getNumPartitions() < fresh().rdd.getNumPartitions()
    finally:
        register(rmq_spark)


@pytest.mark.spark
def test_spark_modes_on_a_corrupted_store(rmq_spark, corrupt_store):
    store, bad, rows = corrupt_store
    rd = rmq_spark.read.format("rocketmq").option("maxSplitBytes", "256k")
    perm = rd.load(str(store))
    corrupt = perm.filter("_corrupt IS NOT NULL").orderBy("phy_offset").collect()
    assert [r.phy_offset for r in corrupt] == bad and corrupt[0]._corrupt.startswith("bad_magic")
    assert perm.count() == len(rows) - len(bad) + len(bad)
    dropped = rd.option("mode", "DROPMALFORMED").load(str(store))
    assert dropped.count() == len(rows) - len(bad) and dropped.filter("_corrupt IS NOT NULL").count() == 0
    with pytest.raises(Exception) as ei:
        rd.option("mode", "FAILFAST").load(str(store)).count()
    assert "bad_magic" in str(ei.value) or "bad_size" in str(ei.value)
    assert "commitlog/0000000000000" in str(ei.value)


@pytest.mark.spark
def test_sql_usage_and_the_other_tables(rmq_spark, sample_498):
    store = str(sample_498 / "store")
    conf = str(broker_conf("4.9.8"))
    rmq_spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW rmq_msgs USING rocketmq OPTIONS (path '{store}')")
    got = {r.topic: r.n for r in rmq_spark.sql("SELECT topic, count(*) AS n FROM rmq_msgs GROUP BY topic").collect()}
    rows = read_messages(store).to_pylist()
    want: dict[str, int] = {}
    for r in rows:
        want[r["topic"]] = want.get(r["topic"], 0) + 1
    assert got == want
    rmq_spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW rmq_cq USING `rocketmq.consumequeue` "
                  f"OPTIONS (path '{store}', brokerConf '{conf}')")
    joined = rmq_spark.sql("SELECT count(*) AS n FROM rmq_cq c JOIN rmq_msgs m ON c.phy_offset = m.phy_offset "
                           "AND c.tags_code = m.tags_code AND c.queue_offset = m.queue_offset").first().n
    assert joined == len(load_expected(sample_498, "consumequeue_entries.jsonl"))
    idx = rmq_spark.read.format("rocketmq.index").option("brokerConf", conf).load(store)
    assert idx.count() == read_index(store, brokerConf=conf).num_rows
    cp = rmq_spark.read.format("rocketmq.checkpoint").load(store).first()
    assert cp.physic_msg_timestamp == read_checkpoint(store).physic_msg_timestamp
    assert rmq_spark.read.format("rocketmq.segments").load(store).count() == 4


def test_message_columns_match_the_messages_command():
    from storelib.scan.messagecols import row_to_json

    assert list(row_to_json({})) == MESSAGE_COLUMNS == output_schema(True).names[: len(MESSAGE_COLUMNS)]
    assert json.dumps(output_schema(True).names[-3:]) == '["body", "segment", "_corrupt"]'


@pytest.mark.spark
def test_a_schema_given_by_the_query_reads_only_those_columns(rmq_spark, corrupt_store):
    store, bad, rows = corrupt_store
    rd = rmq_spark.read.format("rocketmq").option("maxSplitBytes", "256k")
    full = rd.load(str(store))
    narrow = rd.schema("_corrupt STRING, phy_offset BIGINT, topic STRING, body BINARY").load(str(store))
    assert narrow.columns == ["_corrupt", "phy_offset", "topic", "body"]
    want = full.select("_corrupt", "phy_offset", "topic")
    assert_df_equality(narrow.drop("body").orderBy("phy_offset"), want.orderBy("phy_offset"), ignore_nullable=True)
    with_body = rd.option("withBody", "true").load(str(store)).select("phy_offset", "body")
    assert_df_equality(narrow.select("phy_offset", "body").orderBy("phy_offset"), with_body.orderBy("phy_offset"),
                       ignore_nullable=True)
    assert narrow.filter("_corrupt IS NOT NULL").count() == len(bad)
    with pytest.raises(Exception, match="column 'topic' is string"):
        rd.schema("topic INT").load(str(store)).count()
    with pytest.raises(Exception, match="unknown column 'nope'"):
        rd.schema("nope STRING").load(str(store)).count()
