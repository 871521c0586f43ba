"""The generator and StoreWriter write what RocketMQ's Java would: UNIQ_KEY times (MessageClientIDSetter) and the
checkpoint a broker leaves after continuing a store (StoreCheckpoint)."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pyarrow.compute as pc

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
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
