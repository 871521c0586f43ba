"""Checkpoint and abort files read the way the broker reads them: StoreCheckpoint maps 4096 bytes read-write
(a short checkpoint's missing bytes read as zero, and the broker starts), and only ``abort``'s existence
matters (File.exists(): any size, even a directory)."""

from __future__ import annotations

import struct

import pytest

from storelib.broker.dispatch.dispatch import dispatch_store
from storelib.broker.settings.brokerconf import load_broker_conf
from storelib.broker.settings.store import Store
from storelib.broker.settings.storeinfo import collect
from storelib.broker.startup import recoveryplan
from storelib.broker.startup.startup import simulate
from storelib.errors import StoreError
from storelib.format.checkpoint import Checkpoint, as_broker_reads, read_checkpoint, write_checkpoint
from storelib.format.markers import abort_state, write_abort
from tests.rebuild_storegen import CraftedStore, msg

S = 8192
CONF = {"mappedFileSizeCommitLog": S, "mappedFileSizeConsumeQueue": 20 * 40, "maxHashSlotNum": 16, "maxIndexNum": 64}


def _store(tmp_path, version: str = "4") -> tuple[Store, int]:
    """A three-segment store, dispatched, with a full checkpoint at its last store time (returned)."""
    cs = CraftedStore(S)
    i = 0
    while cs.seg_index < 3:
        cs.append(msg("T", i % 2, body=b"x" * (200 + i % 7), keys=f"k{i}", uniq=f"U{i:06d}"))
        i += 1
    root = tmp_path / "store"
    cs.write(root)
    conf = tmp_path / "broker.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in CONF.items()))
    settings = load_broker_conf(str(conf), version)
    dispatch_store(str(root), settings)
    last = cs.placed[-1].msg.store_timestamp
    write_checkpoint(str(root), Checkpoint(last, last, last))
    (root / "lock").write_bytes(b"lock")
    return Store(str(root), settings), last


@pytest.mark.parametrize("size", [0, 20, 40, 100])
def test_a_short_checkpoint_reads_as_the_broker_maps_it_missing_bytes_zero(size):
    full = Checkpoint(1_700_000_000_123, 1_700_000_000_456, 0x0102030405060708, 11, 22).to_bytes()
    cp, finding = as_broker_reads(full[:size], "store/checkpoint")
    padded = full[:min(size, 40)] + bytes(40 - min(size, 40))
    assert cp == Checkpoint(*struct.unpack(">qqqqq", padded))
    assert (finding.kind, finding.severity, finding.file, finding.offset) == (
        "checkpoint_short", "warning", "store/checkpoint", size)
    assert f"{size} bytes" in finding.detail
    if size == 20:  # the index timestamp keeps its four bytes on disk, the rest reads as zero
        assert cp.index_msg_timestamp == 0x0102030400000000
    assert as_broker_reads(full, "store/checkpoint") == (Checkpoint(*struct.unpack(">qqqqq", full[:40])), None)


@pytest.mark.parametrize("size", [0, 20])
def test_recover_plan_on_a_short_checkpoint_runs_crash_recovery_like_the_broker(tmp_path, size):
    store, last = _store(tmp_path)
    cp_path = tmp_path / "store" / "checkpoint"
    cp_path.write_bytes(cp_path.read_bytes()[:size])
    (tmp_path / "store" / "abort").write_bytes(b"")
    with pytest.raises(StoreError):
        read_checkpoint(store.loc)  # the exact reader still refuses it
    sim = simulate(Store(str(tmp_path / "store"), store.settings))
    plan = recoveryplan.plan_document(sim)
    shorts = [f for f in plan["findings"] if f["kind"] == "checkpoint_short"]
    assert len(shorts) == 1 and shorts[0]["offset"] == size and shorts[0]["file"] == "checkpoint"
    # 0 bytes: min timestamp 0, recovery from the first segment; 20 bytes: physic and logics survive
    assert sim.checkpoint.physic_msg_timestamp == (0 if size == 0 else last)
    assert plan["commitlog"]["start_segment"] == "00000000000000000000"


def test_info_shows_a_short_checkpoint_as_read_with_a_warning(tmp_path):
    store, last = _store(tmp_path)
    cp_path = tmp_path / "store" / "checkpoint"
    cp_path.write_bytes(cp_path.read_bytes()[:100])
    out = collect(Store(str(tmp_path / "store"), store.settings), scan=False)
    assert out["checkpoint"]["physic_msg_timestamp"] == last
    short = [f for f in out["findings"] if f["kind"] == "checkpoint_short"]
    assert len(short) == 1 and short[0]["offset"] == 100 and short[0]["file"].endswith("checkpoint")


@pytest.mark.parametrize("kind", ["big", "dir"])
def test_any_abort_that_exists_means_an_abnormal_exit_big_or_a_directory(tmp_path, kind):
    store, _ = _store(tmp_path)
    abort = tmp_path / "store" / "abort"
    if kind == "big":
        abort.write_bytes(b"1" * 5000)
    else:
        abort.mkdir()
    st = abort_state(tmp_path / "store")
    assert st.exists and not st.last_exit_ok and st.content is None and st.unusual
    plan = recoveryplan.plan_document(simulate(Store(str(tmp_path / "store"), store.settings)))
    assert plan["commitlog"]["start_reason"].startswith("abnormal")
    assert [f["file"] for f in plan["findings"] if f["kind"] == "abort_unusual"] == ["abort"]


def test_write_abort_498_creates_an_empty_file_and_keeps_an_existing_one(tmp_path):
    write_abort(tmp_path)
    assert (tmp_path / "abort").read_bytes() == b"" and not (tmp_path / "abort.bak").exists()
    (tmp_path / "abort").write_bytes(b"4242")  # a crash left it: createNewFile finds it and leaves it
    write_abort(tmp_path)
    assert (tmp_path / "abort").read_bytes() == b"4242" and not (tmp_path / "abort.bak").exists()


def test_write_abort_533_always_leaves_abort_bak_with_the_previous_content(tmp_path):
    (tmp_path / "abort.bak").write_bytes(b"old")  # a stale abort.bak is overwritten
    write_abort(tmp_path, pid=77)  # createNewFile made it empty: abort.bak gets ""
    assert (tmp_path / "abort").read_bytes() == b"77" and (tmp_path / "abort.bak").read_bytes() == b""
    write_abort(tmp_path, pid=88)  # a crash's abort: its PID goes to abort.bak
    assert (tmp_path / "abort").read_bytes() == b"88" and (tmp_path / "abort.bak").read_bytes() == b"77"
