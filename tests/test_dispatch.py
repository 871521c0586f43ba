"""dispatch_store: broker-identical CQ and index files, incremental == one-shot, reput quirks."""

from __future__ import annotations

import os
import shutil
from itertools import count
from pathlib import Path

import pytest

from storelib.broker.dispatch.dispatch import dispatch_store
from storelib.broker.settings.brokerconf import BrokerSettings, load_broker_conf
from storelib.broker.writer.writer import StoreWriter
from storelib.format.record import Message
from tests.conftest import broker_conf

SMALL = {"mappedFileSizeCommitLog": 8192, "mappedFileSizeConsumeQueue": 200, "maxHashSlotNum": 16,
         "maxIndexNum": 24}


def tree(root: Path, sub: str) -> dict[str, bytes]:
    base = root / sub
    out = {}
    for dirpath, _, files in os.walk(base):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(base))] = p.read_bytes()
    return out


def index_files(root: Path) -> list[bytes]:
    d = root / "index"
    return [(d / n).read_bytes() for n in sorted(os.listdir(d))] if d.exists() else []


def commitlog_only(src: Path, dst: Path) -> Path:
    shutil.copytree(src / "commitlog", dst / "commitlog")
    return dst


@pytest.mark.parametrize("version", ["4.9.8", "5.3.3"])
def test_dispatch_equals_broker_consume_queues_and_index_files(tmp_path, sample_498, sample_533, version):
    sample = (sample_498 if version == "4.9.8" else sample_533) / "store"
    settings = load_broker_conf(broker_conf(version), version[0])
    root = commitlog_only(sample, tmp_path / "s")
    res = dispatch_store(root, settings)
    assert not res.findings and not res.unsupported
    assert tree(root, "consumequeue") == tree(sample, "consumequeue")
    assert index_files(root) == index_files(sample)  # paired by order: names are creation times
    assert res.index_msg_timestamp > 0
    assert res.records == res.cq_records


@pytest.mark.parametrize("version", ["4.9.8", "5.3.3"])
def test_dispatch_in_steps_equals_one_shot(tmp_path, sample_498, sample_533, version):
    sample = (sample_498 if version == "4.9.8" else sample_533) / "store"
    settings = load_broker_conf(broker_conf(version), version[0])
    one = commitlog_only(sample, tmp_path / "one")
    dispatch_store(one, settings)
    two = commitlog_only(sample, tmp_path / "two")
    first = dispatch_store(two, settings, to_offset=700_001, chunk_rows=97)  # mid-segment, odd chunks
    assert 0 < first.end_offset <= 700_001 + 5000
    second = dispatch_store(two, settings, from_offset=first.end_offset, chunk_rows=300)
    assert first.records + second.records == (2000 if version == "4.9.8" else 2018)
    assert tree(two, "consumequeue") == tree(one, "consumequeue")
    assert index_files(two) == index_files(one)


def test_dispatch_after_more_appends_equals_one_shot(tmp_path):
    s = BrokerSettings.defaults("4").with_overrides(SMALL)
    msgs = [Message(f"T{i % 2}", b"b" * (50 + i * 13 % 400), i % 3,
                    sys_flag=(0x4 if i % 11 == 5 else 0),
                    properties={"KEYS": f"k{i} x{i % 4}", "UNIQ_KEY": f"U{i:030d}", "TAGS": "t"})
            for i in range(120)]

    def clock():
        c = count(1_700_000_000_000, 700)
        return lambda: next(c)

    with StoreWriter(tmp_path / "one", s, clock=clock()) as w:
        for m in msgs:
            w.append(m)
    with StoreWriter(tmp_path / "two", s, clock=clock()) as w:
        for m in msgs[:50]:
            w.append(m)
        r1 = w.dispatch()
        for m in msgs[50:]:
            w.append(m)
        r2 = w.dispatch()
    assert r1.records + r2.records == 120
    assert tree(tmp_path / "two", "consumequeue") == tree(tmp_path / "one", "consumequeue")
    assert index_files(tmp_path / "two") == index_files(tmp_path / "one")
    assert len(index_files(tmp_path / "one")) > 2  # several full index files were continued and rolled


def _three_segment_store(root: Path) -> tuple[BrokerSettings, list]:
    s = BrokerSettings.defaults("4").with_overrides(SMALL)
    with StoreWriter(root, s, clock=lambda: 1_700_000_000_000) as w:
        res = [w.append(Message("T", b"x" * 1500, 0, properties={"KEYS": f"k{i}"})) for i in range(14)]
        w.close(clean=False)  # keep the consume queues out of it
    return s, res


def test_reput_skips_rest_of_segment_after_a_bad_record_on_a_master(tmp_path):
    s, res = _three_segment_store(tmp_path)
    bad = res[1].phy_offset  # second record of segment 0: zero its magic
    seg0 = tmp_path / "commitlog" / "00000000000000000000"
    b = bytearray(seg0.read_bytes())
    b[bad + 4: bad + 8] = b"\0\0\0\0"
    seg0.write_bytes(bytes(b))
    r = dispatch_store(tmp_path, s)
    kinds = [f.kind for f in r.findings]
    assert kinds == ["reput_skipped_rest_of_segment"]
    per_seg = sum(1 for x in res if x.phy_offset < 8192)
    assert r.records == len(res) - per_seg + 1
    slave = dispatch_store(tmp_path, s.with_overrides({"brokerId": 1}), out_root=tmp_path / "out")
    assert [f.kind for f in slave.findings] == ["reput_stopped"] and slave.records == 1


def test_length_mismatch_is_followed_as_the_4x_reput_reads_it(tmp_path):
    s, res = _three_segment_store(tmp_path)
    seg0 = tmp_path / "commitlog" / "00000000000000000000"
    b = bytearray(seg0.read_bytes())
    p = res[2].phy_offset
    q = p + 88 + 1500 + 2  # PROPERTIESLENGTH after body and topic "T"
    b[q: q + 2] = (int.from_bytes(b[q: q + 2], "big") - 1).to_bytes(2, "big")  # fields no longer add up
    seg0.write_bytes(bytes(b))
    r = dispatch_store(tmp_path, s)
    assert not r.unsupported and r.records > 2
    assert r.findings[0].kind == "reput_length_mismatch" and r.findings[0].offset == p
    assert r.findings[0].extra["read_length"] == res[2].size - 1  # the buffer goes on after the fields


def test_default_reput_position_continues_from_the_consume_queues(tmp_path):
    s, res = _three_segment_store(tmp_path)
    first = dispatch_store(tmp_path, s, to_offset=res[6].phy_offset)
    assert first.records == 6
    again = dispatch_store(tmp_path, s)  # from maxPhysicOffset of the CQ
    assert again.from_offset == res[6].phy_offset and again.records == len(res) - 6


def test_what_limits_the_outputs(tmp_path):
    s, _ = _three_segment_store(tmp_path)
    r = dispatch_store(tmp_path, s, what=("index",), out_root=tmp_path / "o")
    assert r.index_files and not r.cq_files
    assert not (tmp_path / "o" / "consumequeue").exists()
