"""``expiry`` on DLedger-mode stores: the data files go by DLedger's CleanSpaceService (100-ms grid from the
start, fileReservedTime + 1 hours, ratios as Java floats, no manual deletes, DISK_FULL), the consume
queues and index files by the broker's queue cleaner on its own 10-s ticks. The tiny store is the one of
test_expiry.py (four 1000-byte entries per 4096-byte data file; segment i's mtime i:03:01; snapshot 04:01:00)."""

from __future__ import annotations

import pytest

from storelib.broker.expiry.cleaner import describe, simulate
from storelib.broker.expiry.expiry import Policy, TimeModel, load_snapshot
from storelib.broker.settings.store import Store, with_dledger
from storelib.fileio.bytesource import resolve
from tests.expiry_storegen import MIN, T0, H, Msg, build_store

STATIC = TimeModel(ingest_bytes_per_s=0, consumption_msgs_per_s=0)


def at(h: int, m: int = 0, s: int = 0, ms: int = 0) -> int:
    return T0 + h * H + m * MIN + s * 1000 + ms


@pytest.fixture
def dstore(tmp_path):
    root = tmp_path / "store"
    msgs = [Msg("T", 0, T0 + (m // 4) * H + (m % 4) * MIN) for m in range(18)]
    st = build_store(root, msgs, offsets={"T@lag": {0: 2}}, index_ends=[5000, 13000, 18384], dledger=True)
    loc = resolve(str(root))
    return root, with_dledger(st, loc, set())


def run(dstore, model=STATIC, **over):
    root, st = dstore
    pol = Policy.from_settings("p", st.with_overrides({k: v for k, v in over.items() if not k.startswith("_")}),
                               disk_capacity=over.get("_capacity"), manual_deletes=over.get("_manual", ()))
    return simulate(pol, load_snapshot(Store(resolve(str(root)), st)), model)


def cl(res):
    return [(d["time_ms"], d["file"], d["reason"]) for d in res["deletions"] if d["kind"] == "commitlog"]


def data(i: int) -> str:
    return f"dledger-n0/data/{i * 4096:020d}"


def test_the_snapshot_knows_the_data_files_of_a_dledger_store(dstore):
    root, st = dstore
    snap = load_snapshot(Store(resolve(str(root)), st))
    assert snap.dledger and snap.log_folder == "dledger-n0/data" and len(snap.seg_base) == 5
    assert snap.write_pos == 4 * 4096 + 2 * 1000  # the end of the last entry
    d = describe(snap)
    assert d["cleaner"] == "dledger" and d["segments"][0]["file"] == data(0)


def test_dledger_keeps_files_an_hour_longer_and_deletes_on_its_own_100ms_grid(dstore):
    # fileReservedTime=0 becomes fileReservedHours 1 (the broker passes + 1): segment i is old at (i+1):03:01;
    # the cleaner thread runs from the start (04:01:00), every 100 ms, 10 files a run, 100 ms apart
    res = run(dstore, fileReservedTime=0, deleteWhen="04")
    assert cl(res) == [(at(4, 1), data(0), "time"), (at(4, 1, ms=100), data(1), "time"),
                       (at(4, 1, ms=200), data(2), "time"), (at(4, 3, 1), data(3), "time")]
    assert res["summary"]["cleaner"] == "dledger"
    # the broker's queue cleaner follows the new min offset on its own ticks (04:02:00 + k * 10 s), the index
    # files after the 100-ms sleep that follows a queue that deleted (deleteConsumeQueueFilesInterval)
    rest = [(d["time_ms"], d["file"]) for d in res["deletions"] if d["kind"] != "commitlog"]
    assert rest == [(at(4, 2), "consumequeue/T/0/00000000000000000000"),
                    (at(4, 2), "consumequeue/T/0/00000000000000000080"),
                    (at(4, 2), "consumequeue/T/0/00000000000000000160"), (at(4, 2, ms=100), "index/20240101000000000"),
                    (at(4, 3, 10), "consumequeue/T/0/00000000000000000240"),
                    (at(4, 3, 10, ms=100), "index/20240101000000001")]


def test_manual_deletes_do_nothing_in_dledger_mode(dstore):
    res = run(dstore, fileReservedTime=1, deleteWhen="06", _manual=(at(4, 30),))
    assert [t for t, _f, _r in cl(res)][:1] == [at(6)]  # only the deleteWhen hour (05:00 is not it)
    assert any("manual deletes" in w for w in res["warnings"])


def test_dledger_compares_the_disk_ratio_with_java_floats(dstore):
    res0 = run(dstore)
    store_bytes = res0["disk_usage"][0]["store_bytes"]
    cap = -(-100 * store_bytes // 70)  # ceil: the used ratio is exactly 0.70
    assert -(-100 * store_bytes // cap) == 70
    # 0.70 > 70 / 100f (0.699999988) holds: the files past fileReservedHours (1 + 1 = 2 h) go at the first run
    res = run(dstore, fileReservedTime=1, deleteWhen="05", diskMaxUsedSpaceRatio=70, _capacity=cap)
    assert cl(res)[:2] == [(at(4, 1), data(0), "space"), (at(4, 1, ms=100), data(1), "space")]


def test_force_clean_ratio_and_disk_full(dstore):
    res0 = run(dstore)
    store_bytes = res0["disk_usage"][0]["store_bytes"]
    cap = -(-100 * store_bytes // 86)  # 0.86: past 0.85f, DLedger ignores the files' age
    res = run(dstore, deleteWhen="05", _capacity=cap)
    assert [r for _t, _f, r in cl(res)] == ["forced"] * 4 and cl(res)[0][0] == at(4, 1)
    assert res["summary"]["writes_refused_ms"] is None
    off = run(dstore, deleteWhen="05", cleanFileForciblyEnable="false", _capacity=cap)
    assert "forced" not in [r for _t, _f, r in cl(off)]
    higher = run(dstore, deleteWhen="05", _capacity=cap, **{"dledger.disk.ratio.clean": "0.9"})
    assert "forced" not in [r for _t, _f, r in cl(higher)]
    # DISK_FULL above 0.85f + 0.05f, which is 0.90000004 in float arithmetic: 0.90 still writes, 0.91 does not
    assert run(dstore, deleteWhen="05", _capacity=-(-100 * store_bytes // 90))["summary"]["writes_refused_ms"] is None
    full = run(dstore, deleteWhen="05", _capacity=-(-100 * store_bytes // 91))
    assert full["summary"]["writes_refused_ms"] == at(4, 1)
