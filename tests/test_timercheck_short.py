"""``config/timercheck`` read the way 5.3.3's TimerCheckpoint reads it (:56-71): it maps 4096 bytes read-write,
which grows a shorter file with zeros, and reads seven longs from offset 0, so a short or empty file's fields
are its bytes then zeros and the broker starts; a longer file is read by its first 56 bytes. The recovery
plan, the audit and ``rmqstore timers`` go on from those values with a ``timercheck_short`` warning."""

from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path

import pytest

from jobs.cli import main
from storelib.fileio.bytesource import resolve
from storelib.format.timerstore import TimerCheckpoint, read_timer_checkpoint_as_broker
from tests.conftest import extract_sample

WEEK_BACK = 7 * 86_400_000 - 60_000  # slotsTotal - TIMER_BLANK_SLOTS slots of 1000 ms


@pytest.fixture(scope="module")
def timer_sample(tmp_path_factory) -> Path:
    return extract_sample("timer", tmp_path_factory.mktemp("timercheck")) / "store"


@pytest.fixture
def copy(timer_sample, tmp_path) -> Path:
    dest = tmp_path / "store"
    shutil.copytree(timer_sample, dest)
    return dest


def _cut(store: Path, size: int) -> tuple[int, ...]:
    """The store's timercheck cut to ``size`` bytes: the seven longs the broker reads from it (zeros past it)."""
    path = store / "config" / "timercheck"
    full = path.read_bytes()
    path.write_bytes(full[:size])
    return struct.unpack(">7q", full[:min(size, 56)].ljust(56, b"\0"))


@pytest.mark.parametrize("size", [0, 10, 20, 55])
def test_a_short_timercheck_reads_its_bytes_then_zeros_with_a_warning_a_long_one_its_head(copy, size):
    full = (copy / "config" / "timercheck").read_bytes()
    want = _cut(copy, size)
    cp, finding = read_timer_checkpoint_as_broker(resolve(str(copy)))
    assert cp == TimerCheckpoint(*want)
    assert (finding.kind, finding.severity, finding.file, finding.offset) == (
        "timercheck_short", "warning", "config/timercheck", size)
    if size == 10:  # lastTimerLogFlushPos 16696 keeps its high two bytes (zeros), the rest reads as zero
        assert cp.last_read_time_ms == 1795517101000 and cp.last_timer_log_flush_pos == 0
        assert finding.extra["fields_cut"][0] == "lastTimerLogFlushPos"
    (copy / "config" / "timercheck").write_bytes(full + b"\xff" * 1000)  # past the 4096 mapped: never read
    assert read_timer_checkpoint_as_broker(resolve(str(copy))) == (TimerCheckpoint(*struct.unpack(">7q", full[:56])),
                                                                    None)


@pytest.mark.parametrize("size", [0, 20])
def test_recover_plan_on_a_short_timercheck_plans_from_its_bytes_then_zeros(copy, capsys, size):
    """TimerMessageStore.recover (5.3.3 :274-330) on what TimerCheckpoint read: the walk starts at
    lastTimerLogFlushPos - a file's size, the queue offset is bounded by masterTimerQueueOffset 0 (then raised
    to the timer queue's min offset 0), the read time is max(lastReadTimeMs, now - 7 days + 60 slots)."""
    read_ms, flush = _cut(copy, size)[:2]
    capsys.readouterr()
    before = int(time.time() * 1000)
    assert main(["recover", str(copy), "--plan", "--json"]) in (0, 1)
    after = int(time.time() * 1000)
    ts = json.loads(capsys.readouterr().out)["timer_store"]
    assert [(f["kind"], f["offset"]) for f in ts["findings"]] == [("timercheck_short", size)]
    assert (ts["begin_offset"], ts["process_offset"], ts["queue_offset"]) == (max(0, flush - 8192), 16696, 0)
    assert "masterTimerQueueOffset 0 read past a short timercheck's end" in ts["queue_offset_source"]
    low, high = before // 1000 * 1000 - WEEK_BACK, after // 1000 * 1000 - WEEK_BACK
    assert max(read_ms, low) <= ts["read_time_ms"] <= max(read_ms, high)
    assert main(["recover", str(copy), "--plan"]) in (0, 1)
    assert "timercheck_short" in capsys.readouterr().out


def test_the_audit_and_the_timers_command_warn_of_a_short_timercheck_and_go_on(copy, capsys):
    from jobs.audit import audit_store

    want = _cut(copy, 20)
    rep = audit_store(str(copy), quiet=True)
    timer = [(f["kind"], f["severity"], f["offset"]) for f in rep["findings"] if f["file"] == "config/timercheck"]
    assert timer == [("timercheck_short", "warning", 20)]
    assert rep["timer_store"]["checkpoint"]["last_read_time_ms"] == want[0]
    capsys.readouterr()
    assert main(["timers", str(copy), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert tuple(doc["timercheck"].values()) == want
    assert [f["kind"] for f in doc["findings"] if f["file"] == "config/timercheck"] == ["timercheck_short"]
