"""StoreWriter: broker-exact appends (sample stores reproduced byte for byte), rolling, tx, delay, batches."""

from __future__ import annotations

import json
import os
import zlib
from itertools import count

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storelib.broker.settings.brokerconf import BrokerSettings, load_broker_conf
from storelib.broker.settings.store import Store
from storelib.broker.writer.writer import StoreWriter, java_hashmap_order, serialize_properties
from storelib.format.checkpoint import read_checkpoint
from storelib.format.properties import parse_properties
from storelib.format.record import BLANK_MAGIC, Message
from tests.conftest import broker_conf

SMALL = {"mappedFileSizeCommitLog": 4096, "mappedFileSizeConsumeQueue": 200, "maxHashSlotNum": 16,
         "maxIndexNum": 32}


def small(version: str = "4", **kw) -> BrokerSettings:
    return BrokerSettings.defaults(version).with_overrides({**SMALL, **kw})


def ticking(start: int = 1_700_000_000_000):
    c = count(start)
    return lambda: next(c)


def read_all(root, settings) -> list[dict]:
    return Store(root, settings).commitlog.read_table(with_body=True).to_pylist()


# -- the broker's own stores, rebuilt from their messages ---------------------------------------


@pytest.mark.parametrize("version", ["4.9.8", "5.3.3"])
def test_writer_reproduces_broker_commitlog_byte_for_byte(tmp_path, sample_498, sample_533, version):
    sample = sample_498 if version == "4.9.8" else sample_533
    st_ = load_broker_conf(broker_conf(version), version[0])
    rows = Store(sample / "store", st_).commitlog.read_table(with_body=True, verify_crc=False).to_pylist()
    puts = [json.loads(x) for x in open(sample / "expected" / "put_results.jsonl", encoding="utf-8")]
    ts = iter([p["storeTimestamp"] for p in puts])
    w = StoreWriter(tmp_path / "w", st_, clock=lambda: next(ts), store_host="10.0.0.5:10911")

    def msg(r, raw=None):
        props = parse_properties(r["properties_raw"])
        props.pop("__CRC32#", None)
        return Message(topic=r["topic"], body=r["body"], queue_id=r["queue_id"], flag=r["flag"],
                       sys_flag=r["sys_flag"], born_timestamp=r["born_timestamp"], born_host=r["born_host"],
                       properties=props, properties_raw=raw)

    i = 0
    for p in puts:
        n = p.get("msgNum", 1)
        if n == 1:
            w.store_host = rows[i]["store_host"]  # the 5.3.3 sample has IPv6 store hosts too
            w.append(msg(rows[i]))
        else:  # a client batch: inner properties, then the batch's CLUSTER property
            inner = [r["properties_raw"].split("\x02__CRC32#")[0].split("CLUSTER\x01")[0].rstrip("\x02")
                     for r in rows[i:i + n]]
            w.append_batch([msg(r, t) for r, t in zip(rows[i:i + n], inner)],
                           batch_properties={"CLUSTER": "DefaultCluster"})
        i += n
    w.close()
    names = sorted(os.listdir(sample / "store" / "commitlog"))
    assert names == sorted(os.listdir(tmp_path / "w" / "commitlog"))
    for name in names:
        assert (sample / "store" / "commitlog" / name).read_bytes() == (tmp_path / "w" / "commitlog" / name).read_bytes()


def test_hashmap_order_matches_broker_property_order():
    assert java_hashmap_order(["TAGS", "KEYS", "WAIT", "UNIQ_KEY", "CLUSTER"]) == \
        ["KEYS", "UNIQ_KEY", "CLUSTER", "WAIT", "TAGS"]
    assert serialize_properties({"UNIQ_KEY": "U", "KEYS": "K"}, trailing_sep=False) == "KEYS\x01K\x02UNIQ_KEY\x01U"
    assert serialize_properties({"KEYS": "K"}, trailing_sep=True) == "KEYS\x01K\x02"


# -- round trips ------------------------------------------------------------------------------

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\x01\x02"), max_size=12)
_msg = st.fixed_dictionaries({
    "topic": st.sampled_from(["T", "TopicA", "%RETRY%g", "L" * 128, "V" * 200]),
    "queue": st.integers(0, 3),
    "body": st.binary(max_size=300),
    "compress": st.booleans(),
    "tags": st.one_of(st.none(), st.just(""), _text, st.just("标签||😀")),
    "keys": st.one_of(st.none(), st.lists(_text, max_size=4).map(" ".join), st.just("K" * 3000)),
    "v6": st.booleans(),
})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msgs=st.lists(_msg, min_size=1, max_size=25), version=st.sampled_from(["4", "5"]))
def test_written_messages_read_back_field_for_field(tmp_path_factory, msgs, version):
    root = tmp_path_factory.mktemp("rt")
    s = small(version, mappedFileSizeCommitLog=16384, enabledAppendPropCRC="true")
    if version == "4":
        msgs = [m for m in msgs if len(m["topic"]) <= 127] or [dict(msgs[0], topic="T")]
    expect = []
    with StoreWriter(root, s, clock=ticking()) as w:
        for m in msgs:
            props = {"UNIQ_KEY": "C0A8010A10925F3759DFE1A328A80C40"}
            if m["tags"] is not None:
                props["TAGS"] = m["tags"]
            if m["keys"] is not None:
                props["KEYS"] = m["keys"]
            body = zlib.compress(m["body"]) if m["compress"] else m["body"]
            host = "[fe80:0:0:0:1ff:fe23:4567:890a]:4000" if m["v6"] else "192.168.0.10:5000"
            r = w.append(Message(m["topic"], body, m["queue"], sys_flag=0x301 if m["compress"] else 0,
                                 born_timestamp=1, born_host=host, properties=props))
            expect.append((r, m, body, props))
    rows = read_all(root, s)
    assert len(rows) == len(expect)
    seen: dict = {}
    for row, (res, m, body, props) in zip(rows, expect):
        assert row["phy_offset"] == res.phy_offset == row["physical_offset_field"]
        assert row["crc_ok"] is True
        assert (row["topic"], row["queue_id"], row["body"]) == (m["topic"], m["queue"], body)
        assert row["magic_version"] == (2 if version == "5" and len(m["topic"]) > 127 else 1)
        assert row["born_host"].startswith("[fe80") == m["v6"]
        assert row["sys_flag"] & 0x301 == (0x301 if m["compress"] else 0)
        got = dict(row["properties"])
        assert got.pop("__CRC32#", None) is not None if version == "5" else "__CRC32#" not in got
        assert row["prop_crc_ok"] in ((True,) if version == "5" else (None,))
        assert got == {k: v for k, v in props.items() if v}  # empty values are dropped by the parser
        q = (m["topic"], m["queue"])
        assert row["queue_offset"] == seen.get(q, 0)
        seen[q] = row["queue_offset"] + 1
        assert row["store_timestamp"] == res.store_timestamp


def test_rolling_writes_blank_record_and_full_size_segments(tmp_path):
    s = small()
    with StoreWriter(tmp_path, s, clock=ticking()) as w:
        res = [w.append(Message("T", b"x" * 900, 0)) for _ in range(9)]
    size = res[0].size
    per_seg = (4096 - 8) // size  # a record needs 8 spare bytes after it
    assert res[per_seg].phy_offset == 4096
    seg0 = (tmp_path / "commitlog" / "00000000000000000000").read_bytes()
    free = 4096 - per_seg * size
    assert seg0[per_seg * size: per_seg * size + 8] == free.to_bytes(4, "big") + BLANK_MAGIC.to_bytes(4, "big", signed=True)
    assert all(os.path.getsize(p) == 4096 for p in (tmp_path / "commitlog").iterdir())
    assert [r.queue_offset for r in res] == list(range(9))


def test_batch_moves_as_a_whole_to_the_next_segment(tmp_path):
    with StoreWriter(tmp_path, small(), clock=ticking()) as w:
        a = w.append(Message("T", b"a" * 2500, 1))
        batch = w.append_batch([Message("T", b"b" * 500, 1, properties={"KEYS": f"k{i}"}) for i in range(3)],
                               batch_properties={"CLUSTER": "DefaultCluster"})
    assert a.phy_offset == 0
    assert [r.phy_offset for r in batch] == [4096, 4096 + batch[0].size, 4096 + 2 * batch[0].size]
    assert [r.queue_offset for r in batch] == [1, 2, 3]
    assert len({r.store_timestamp for r in batch}) == 1
    rows = read_all(tmp_path, small())
    assert rows[1]["properties_raw"] == "KEYS\x01k0\x02CLUSTER\x01DefaultCluster"


def test_prepared_and_rollback_records_get_queue_offset_zero(tmp_path):
    with StoreWriter(tmp_path, small(), clock=ticking()) as w:
        r = [w.append(Message("T", b"m", 0, sys_flag=f)) for f in (0, 0x4, 0x8, 0xC, 0)]
    assert [x.queue_offset for x in r] == [0, 0, 1, 0, 2]
    assert [x.tran_type for x in r] == [0, 1, 2, 3, 0]


def test_delay_rewrites_to_schedule_topic_with_clamped_level(tmp_path):
    s = small()
    with StoreWriter(tmp_path, s, clock=ticking()) as w:
        a = w.append(Message("Orders", b"x", 3, properties={"DELAY": "3"}))
        b = w.append(Message("Orders", b"y", 1, properties={"DELAY": "99"}))
        c = w.append(Message("Orders", b"z", 1, properties={"DELAY": "0"}))
    assert (a.topic, a.queue_id, b.topic, b.queue_id, c.topic) == (
        "SCHEDULE_TOPIC_XXXX", 2, "SCHEDULE_TOPIC_XXXX", 17, "Orders")
    rows = read_all(tmp_path, s)
    assert rows[0]["properties"] and dict(rows[0]["properties"])["REAL_TOPIC"] == "Orders"
    assert dict(rows[0]["properties"])["REAL_QID"] == "3"
    assert dict(rows[1]["properties"])["DELAY"] == "18"
    assert rows[0]["tags_code"] == a.store_timestamp + 10_000


def test_transaction_half_commit_and_op_records(tmp_path):
    s = small()
    with StoreWriter(tmp_path, s, clock=ticking()) as w:
        h1 = w.prepare(Message("Pay", b"half", 2, born_host="[::1]:9", properties={"KEYS": "K1"}), "pg")
        h2 = w.prepare(Message("Pay", b"half2", 2), "pg")
        commit, op1 = w.commit(h1)
        op2 = w.rollback(h2)
    assert (h1.topic, h1.queue_id, h1.tran_type, h1.queue_offset, h2.queue_offset) == (
        "RMQ_SYS_TRANS_HALF_TOPIC", 0, 0, 0, 1)
    assert (commit.topic, commit.queue_id, commit.tran_type, commit.queue_offset) == ("Pay", 2, 2, 0)
    rows = {r["phy_offset"]: r for r in read_all(tmp_path, s)}
    c = rows[commit.phy_offset]
    assert c["prepared_transaction_offset"] == h1.phy_offset
    assert c["born_host"].startswith("[0:0:0:0:0:0:0:1]")
    props = dict(c["properties"])
    assert (props["REAL_TOPIC"], props["TRAN_MSG"], props["PGROUP"], props["KEYS"]) == ("Pay", "true", "pg", "K1")
    assert rows[op1.phy_offset]["topic"] == "RMQ_SYS_TRANS_OP_HALF_TOPIC"
    assert (rows[op1.phy_offset]["body"], rows[op2.phy_offset]["body"]) == (b"0", b"1")
    assert rows[op1.phy_offset]["tags"] == "d"


def test_reopened_store_continues_like_one_writer(tmp_path):
    s = small()
    msgs = [Message(f"T{i % 3}", bytes([i]) * (200 + 37 * i), i % 2, properties={"KEYS": f"k{i}"}) for i in range(30)]
    with StoreWriter(tmp_path / "one", s, clock=ticking()) as w:
        for m in msgs:
            w.append(m)
    clock = ticking()
    with StoreWriter(tmp_path / "two", s, clock=clock) as w:
        for m in msgs[:13]:
            w.append(m)
    with StoreWriter(tmp_path / "two", s, clock=clock) as w:
        assert w.queue_table[("T0", 0)] == 3
        for m in msgs[13:]:
            w.append(m)
    for sub in ("commitlog", "consumequeue/T1/1", "consumequeue/T2/0"):
        a, b = tmp_path / "one" / sub, tmp_path / "two" / sub
        assert sorted(os.listdir(a)) == sorted(os.listdir(b))
        for n in os.listdir(a):
            assert (a / n).read_bytes() == (b / n).read_bytes(), f"{sub}/{n}"
    ia, ib = sorted(os.listdir(tmp_path / "one" / "index")), sorted(os.listdir(tmp_path / "two" / "index"))
    assert [(tmp_path / "one" / "index" / x).read_bytes() for x in ia] == \
        [(tmp_path / "two" / "index" / x).read_bytes() for x in ib]


def test_clean_close_writes_checkpoint_and_removes_abort(tmp_path):
    with StoreWriter(tmp_path / "a", small("5"), clock=ticking(5000)) as w:
        w.append(Message("T", b"x"))
        assert (tmp_path / "a" / "abort").exists()
    cp = read_checkpoint(tmp_path / "a")
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp) == (5000, 5000)
    assert not (tmp_path / "a" / "abort").exists()
    w = StoreWriter(tmp_path / "b", small(), clock=ticking())
    w.append(Message("T", b"x"))
    w.close(clean=False)
    assert (tmp_path / "b" / "abort").exists()
    assert not (tmp_path / "b" / "consumequeue").exists()


def test_oversized_message_is_a_store_error(tmp_path):
    from storelib.errors import StoreError

    with StoreWriter(tmp_path, small(), clock=ticking()) as w:
        with pytest.raises(StoreError):
            w.append(Message("T", b"x" * 5000))
        with pytest.raises(StoreError):
            w.append(Message("T", b"x", properties={"DELAY": "soon"}))
