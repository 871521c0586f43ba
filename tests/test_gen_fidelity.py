"""The generator and StoreWriter write what RocketMQ's Java would: UNIQ_KEY times (MessageClientIDSetter) and the
checkpoint a broker leaves after continuing a store (StoreCheckpoint)."""

from __future__ import annotations

import struct
from datetime import datetime, timezone

import numpy as np
import pyarrow.compute as pc

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.broker.writer.writer import StoreWriter
from storelib.format.checkpoint import read_checkpoint
from storelib.format.record import Message
from storelib.format.uniqkey import create_uniq_id, month_start_ms, read_uniq_key
from storelib.generator.gen import generate
from storelib.generator.genplan import GenConfig, Generator, utc_month_start

GEOMETRY = {"mappedFileSizeCommitLog": 262144, "mappedFileSizeConsumeQueue": 2000, "maxHashSlotNum": 200,
            "maxIndexNum": 800}
DEC_1 = int(datetime(2023, 12, 1, tzinfo=timezone.utc).timestamp() * 1000)


def _generated(tmp_path, start_ms: int):
    s = BrokerSettings.defaults("4").with_overrides(GEOMETRY)
    cfg = GenConfig(messages=1500, seed=4, version="4", tx_ratio=0.1, delay_ratio=0.05, start_ms=start_ms,
                    chunk_ops=300)
    generate(tmp_path / "g", cfg, s)
    t = Store(tmp_path / "g", s).commitlog.read_table(verify_crc=False)
    return t.filter(pc.invert(pc.is_null(t.column("uniq_key"))))


def test_generated_uniq_keys_decode_to_the_born_time_across_a_month_start(tmp_path):
    # ~1.5 s of store time straddling 2023-12-01 00:00 UTC: keys made in both months
    t = _generated(tmp_path, DEC_1 - 700)
    born = t.column("born_timestamp").to_pylist()
    assert min(born) < DEC_1 < max(born)
    # getNearlyTimeFromID in a UTC JVM a millisecond after the store time gives the born time back
    got = [read_uniq_key(u).created_ms(st + 1) for u, st in
           zip(t.column("uniq_key").to_pylist(), t.column("store_timestamp").to_pylist())]
    wrong = [(g, b) for g, b in zip(got, born) if g != b]
    assert not wrong, wrong[:3]


def test_generated_uniq_keys_count_ms_since_the_producers_month_start(tmp_path):
    t = _generated(tmp_path, 1_700_000_000_000)  # 2023-11-14 22:13:20 UTC
    spans = {read_uniq_key(u).span_ms for u in t.column("uniq_key").to_pylist()}
    born = np.asarray(t.column("born_timestamp"))
    assert spans == set((born - month_start_ms(1_700_000_000_000)).tolist())


def test_generated_uniq_key_counters_keep_the_low_16_bits_of_each_producers_counter():
    s = BrokerSettings.defaults("4").with_overrides(GEOMETRY)
    g = Generator(GenConfig(messages=400, seed=4, version="4", tx_ratio=0.0, delay_ratio=0.0), s)
    g.uniq_counter[:] = 0xFFFE  # each producer JVM already made 65534 ids
    props = g.plan_chunk(400).props.to_pylist()
    seen: dict[str, list[int]] = {}
    for p in props:
        u = p.split("UNIQ_KEY\x01")[1][:32]
        seen.setdefault(u[:20], []).append(int(u[28:], 16))
    assert len(seen) == 8
    assert all(c == [(0xFFFE + i) & 0xFFFF for i in range(len(c))] for c in seen.values())


def test_create_uniq_id_writes_the_int_difference_and_the_counters_low_16_bits():
    start = month_start_ms(DEC_1 + 5)
    assert start == DEC_1 and utc_month_start(np.array([DEC_1 + 5, DEC_1 - 1])).tolist() == [DEC_1, DEC_1 - 30 * 86_400_000]
    assert create_uniq_id("c0a8010d10925f3759df", DEC_1 + 1000, start, 0x12840) == "C0A8010D10925F3759DF000003E82840"
    assert create_uniq_id("C0A8010D10925F3759DF", DEC_1 - 5, start, 1)[20:28] == "00000000"  # NTP step back: 0
    assert create_uniq_id("C0A8010D10925F3759DF", DEC_1 - 2_000_000, start, 1)[20:28] == "FFE17B80"


def test_generated_timer_uniq_keys_decode_to_the_born_time(tmp_path):
    from jobs.cli import main
    from storelib.broker.settings.store import load_settings
    from storelib.fileio.bytesource import resolve
    from storelib.generator.timergen import add_timer_messages

    root = tmp_path / "store"
    assert main(["gen", str(root), "--messages", "20", "--version", "5", "--segment-size", "1MB", "--seed", "5",
                 "--set", "mappedFileSizeTimerLog=4096"]) == 0
    settings = load_settings(None, "5", {"mappedFileSizeTimerLog": "4096"}, resolve(str(root)))
    start = DEC_1 - 5_000
    add_timer_messages(str(root), settings, count=30, seed=7, start_ms=start, now_ms=start + 30 * 500 + 60_000)
    t = Store(resolve(str(root)), settings).commitlog.read_table(verify_crc=False)
    t = t.filter(pc.equal(t.column("topic"), "rmq_sys_wheel_timer"))
    assert t.num_rows >= 30
    for u, b, st in zip(t.column("uniq_key").to_pylist(), t.column("born_timestamp").to_pylist(),
                        t.column("store_timestamp").to_pylist()):
        assert read_uniq_key(u).created_ms(st + 1) == b


# -- the checkpoint after StoreWriter continued a store --------------------------------------------------

def _ticks(start: int):
    t = [start]

    def tick() -> int:
        t[0] += 7
        return t[0]
    return tick


def _first_session(root, version: str) -> list:
    with StoreWriter(root, BrokerSettings.defaults(version), clock=_ticks(1_700_000_000_000)) as w:
        return [w.append(Message("T", b"x" * (100 + i), i % 3, properties={"KEYS": f"k{i}"})) for i in range(20)]


def _plant(root, head: bytes, tail: bytes = b"") -> bytes:
    """Overwrite the checkpoint's first bytes with ``head`` and put recognisable bytes after the fields."""
    path = root / "checkpoint"
    page = bytearray(path.read_bytes())
    page[:len(head)] = head
    page[40:48] = b"NOTMINE!"
    page[4000:4004] = b"KEEP"
    path.write_bytes(bytes(page) + tail)
    return bytes(page)


def test_continued_5x_store_checkpoint_confirms_the_last_message_recovery_found(tmp_path):
    first = _first_session(tmp_path, "5")
    _plant(tmp_path, struct.pack(">qqqqq", 11, 12, 13, 777, 999))
    with StoreWriter(tmp_path, BrokerSettings.defaults("5"), clock=_ticks(1_700_000_100_000)) as w:
        more = [w.append(Message("T", b"y" * 50, 1)) for _ in range(5)]
    data = (tmp_path / "checkpoint").read_bytes()
    cp = read_checkpoint(tmp_path)
    assert cp.confirm_phy_offset == first[-1].phy_offset  # recoverNormally: lastValidMsgPhyOffset, a start offset
    assert cp.master_flushed_offset == 777  # only HA sets it
    assert cp.physic_msg_timestamp == cp.logics_msg_timestamp == more[-1].store_timestamp
    assert cp.index_msg_timestamp == 13  # no index file filled up
    assert data[40:48] == b"NOTMINE!" and data[4000:4004] == b"KEEP" and len(data) == 4096


def test_continued_4x_store_checkpoint_keeps_bytes_the_broker_never_writes(tmp_path):
    _first_session(tmp_path, "4")
    planted = _plant(tmp_path, struct.pack(">qqqqq", 11, 12, 13, 777, 999), tail=b"past the page")
    with StoreWriter(tmp_path, BrokerSettings.defaults("4"), clock=_ticks(1_700_000_100_000)) as w:
        last = [w.append(Message("T", b"y" * 50, 1)) for _ in range(5)][-1]
    data = (tmp_path / "checkpoint").read_bytes()
    assert struct.unpack_from(">qq", data, 0) == (last.store_timestamp, last.store_timestamp)
    assert data[16:] == planted[16:] + b"past the page"  # 4.9.8 flushes bytes 0-23 only


def test_a_session_that_appends_nothing_leaves_the_checkpoint_timestamps_as_loaded(tmp_path):
    first = _first_session(tmp_path, "5")
    _plant(tmp_path, struct.pack(">qqqqq", 11, 12, 13, 777, 999))
    StoreWriter(tmp_path, BrokerSettings.defaults("5")).close()
    cp = read_checkpoint(tmp_path)
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (11, 12, 13)
    assert (cp.master_flushed_offset, cp.confirm_phy_offset) == (777, first[-1].phy_offset)


def test_a_crashed_session_keeps_the_loaded_logics_timestamp(tmp_path):
    _first_session(tmp_path, "4")
    _plant(tmp_path, struct.pack(">qqq", 11, 12, 13))
    w = StoreWriter(tmp_path, BrokerSettings.defaults("4"), clock=_ticks(1_700_000_100_000))
    last = w.append(Message("T", b"y" * 50, 1))
    w.close(clean=False)
    cp = read_checkpoint(tmp_path)
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (last.store_timestamp, 12, 13)


def test_a_continued_5x_dledger_store_keeps_the_loaded_confirm_offset(tmp_path):
    s = BrokerSettings.defaults("5")
    with StoreWriter(tmp_path, s, clock=_ticks(1_700_000_000_000), dledger_self_id="n0") as w:
        w.append(Message("T", b"x" * 100, 0))
    _plant(tmp_path, struct.pack(">qqqqq", 11, 12, 13, 777, 999))
    with StoreWriter(tmp_path, s, clock=_ticks(1_700_000_100_000), dledger_self_id="n0") as w:
        w.append(Message("T", b"y" * 50, 1))
    cp = read_checkpoint(tmp_path)
    assert (cp.master_flushed_offset, cp.confirm_phy_offset) == (777, 999)  # DLedgerCommitLog.setConfirmOffset logs only


def test_a_crashed_dledger_session_leaves_physic_to_the_consume_queue_put(tmp_path):
    s = BrokerSettings.defaults("4")
    with StoreWriter(tmp_path, s, clock=_ticks(1_700_000_000_000), dledger_self_id="n0") as w:
        w.append(Message("T", b"x" * 100, 0))
    _plant(tmp_path, struct.pack(">qqq", 11, 12, 13))
    w = StoreWriter(tmp_path, s, clock=_ticks(1_700_000_100_000), dledger_self_id="n0")
    w.append(Message("T", b"y" * 50, 1))
    w.close(clean=False)  # nothing dispatched: DLedgerCommitLog has no flush service to set physic
    cp = read_checkpoint(tmp_path)
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (11, 12, 13)
