"""A consume queue whose recovered end lies inside a negative file, not at its start: truncateDirtyFiles sets
that file's write position to ``(int) (end % S)``, Java's remainder, which is negative there (4.9.8
MappedFileQueue.java:112-114, 5.3.3 :200-202). getMaxOffsetInQueue (the file's start plus that position, over
20) is then a file size below the end; appendMessage's write at a negative position fails inside its catch and
only moves the position on (4.9.8 MappedFile.java:244-256, 5.3.3 DefaultMappedFile :342-358), and
truncateDirtyLogicFiles sets the position again from 0 (4.9.8 ConsumeQueue.java:228-280)."""

from __future__ import annotations

from pathlib import Path

import pytest

from storelib.broker.settings.cqload import LoadedQueue, max_offset_after_recover
from storelib.broker.settings.store import Store
from storelib.broker.startup import recoveryplan as recover_plan
from storelib.broker.startup.cqrecovery import QueueReplay
from storelib.broker.startup.startup import simulate
from storelib.format.consumequeue import as_location

from .test_negative_queue_offsets_audit import SMALL, queue_with_offsets, zero_units_from

S = SMALL["mappedFileSizeConsumeQueue"]  # ten units a file


def _queue(root: Path) -> LoadedQueue:
    return LoadedQueue(root / "consumequeue" / "T" / "0", segment_size=S)


def test_max_offset_after_recover_follows_javas_remainder():
    assert [max_offset_after_recover([-200], end, S) for end in (-200, -140, -20, 0)] == [-10, -17, -11, 0]
    assert max_offset_after_recover([0, 200], 260, S) == 13  # a positive end: one past the last unit
    assert max_offset_after_recover([-200, -400], -140, S) == -10  # the list's last file, full, is -400


@pytest.mark.parametrize("version", ["4", "5"])
def test_queue_ending_inside_a_negative_file_has_a_negative_write_position_after_recover(tmp_path, version):
    """QUEUEOFFSETs -10..-8 in file -200: recover ends at -140 and the write position is -140 % 200 = -140, so
    right after recover the broker's max offset is (-200 - 140) / 20 = -17, not -7 (the start-up replay's
    recovered max). A start that runs truncateDirtyLogicFiles (this store's queue holds its last record:
    maxPhyOffsetOfConsumeQueue >= processOffset) counts it again from 0: -7, what readers take."""
    root = queue_with_offsets(tmp_path / "s", [-10, -9, -8], version)
    cq = _queue(root)
    assert (cq.recover().end, cq.recover().wrote) == (-140, -140)
    assert (cq.max_offset(truncated=False), cq.max_offset()) == (-17, -7)
    store = Store(str(root), broker_conf=str(root / "broker.conf"))
    doc = recover_plan.plan_document(simulate(store, version), lost=False)
    (q,) = [q for q in doc["consume_queues"]["queues"] if q["topic"] == "T"]
    assert (q["recovered_max_offset"], q["truncated_max_offset"], q["final_max_offset"]) == (-17, -7, -7)


def test_reput_into_a_negative_write_position_writes_nothing_and_moves_it_on(tmp_path):
    """4.9.8: the fourth record (QUEUEOFFSET -7) has no unit; the reput's putMessagePositionInfo finds the
    position at -340 (a slide, expected -140), its write fails and the position moves to -320: the max is
    -16 and the file is left as it is."""
    root = queue_with_offsets(tmp_path / "s", [-10, -9, -8, -7])
    zero_units_from(root, 3)
    store = Store(str(root), broker_conf=str(root / "broker.conf"))
    sim = simulate(store, "4")
    doc = recover_plan.plan_document(sim, lost=False)
    (q,) = [q for q in doc["consume_queues"]["queues"] if q["topic"] == "T"]
    assert (q["recovered_max_offset"], q["added_from"], q["final_max_offset"]) == (-17, -17, -16)
    replay = QueueReplay("T", 0, as_location(str(root)), S, _queue(root))
    assert replay.max_offset() == -17 and list(replay.outputs()) == []


def test_truncate_dirty_logic_files_sets_the_write_position_again_from_0(tmp_path):
    root = queue_with_offsets(tmp_path / "s", [-10, -9, -8])
    replay = QueueReplay("T", 0, as_location(str(root)), S, _queue(root))
    assert replay.max_offset() == -17
    replay.truncate(1 << 40)  # every unit below: all three kept, the position counted from 0 to 60
    assert replay.max_offset() == -7
