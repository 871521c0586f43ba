"""storelib.broker.recovery.resync: after a bad record, valid data is found again at the right place (message or blank
end record), with the bytes lost counted, in bounded windows."""

from __future__ import annotations

import numpy as np
import pytest

from storelib.broker.recovery.resync import find_next_record, lost_region, scan_regions
from storelib.format.record import Message, blank_record, encode_message

SEG = 16 * 1024


def segment(n: int = 30, base: int = 0, fill_blank: bool = False) -> tuple[bytearray, list[int]]:
    rng = np.random.default_rng(1)
    buf = bytearray(SEG)
    pos, starts = 0, []
    for i in range(n):
        body = bytes(rng.integers(0, 256, int(rng.integers(10, 200)), dtype=np.uint8))
        m = Message(topic="T", body=body, queue_offset=i, physical_offset=base + pos, store_timestamp=1 + i,
                    properties={"KEYS": f"k{i}"})
        rec = encode_message(m)
        buf[pos : pos + len(rec)] = rec
        starts.append(pos)
        pos += len(rec)
    if fill_blank:
        buf[pos : pos + 8] = blank_record(SEG - pos)
    starts.append(pos)  # end of data
    return buf, starts


def test_next_record_after_a_corrupt_one_is_found_with_the_physical_offset_signal():
    buf, st = segment(base=5 * SEG)
    buf[st[4] + 5] ^= 0xFF  # magic of record 4
    r = find_next_record(buf, st[4] + 1, base=5 * SEG)
    assert (r.kind, r.pos, r.phy_match) == ("message", st[5], True)


def test_chain_confirmation_accepts_a_record_whose_physical_offset_field_is_wrong():
    buf, st = segment(base=0)
    buf[st[7] + 28 : st[7] + 36] = (123456).to_bytes(8, "big")  # wrong PHYSICALOFFSET field
    buf[st[6] + 5] ^= 0xFF
    r = find_next_record(buf, st[6] + 1, base=0)
    assert (r.kind, r.pos, r.phy_match) == ("message", st[7], False)


def test_a_magic_inside_a_body_is_not_taken_for_a_record():
    buf, st = segment()
    fake = buf[st[2] : st[2] + 8]  # TOTALSIZE + magic of a real record
    buf[st[3] + 100 : st[3] + 108] = fake  # planted inside record 3's body → CRC of 3 breaks, 3 is "bad"
    buf[st[3] + 5] ^= 0xFF
    r = find_next_record(buf, st[3] + 1)
    assert r.pos == st[4]


def test_resync_ends_at_the_blank_end_record_when_the_last_record_is_bad():
    buf, st = segment(fill_blank=True)
    buf[st[-2] + 5] ^= 0xFF  # the last message before the blank
    r = find_next_record(buf, st[-2] + 1)
    assert (r.kind, r.pos) == ("blank", st[-1])


def test_nothing_valid_after_a_torn_tail_counts_only_the_non_zero_bytes_as_lost():
    buf, st = segment()
    last = st[-2]
    buf[last + 5] ^= 0xFF
    region, r = lost_region(buf, "commitlog/x", 0, last, "bad_magic")
    assert r.kind == "none" and region.resumed == "none"
    assert region.end == st[-1] and region.bytes_lost == st[-1] - last


@pytest.mark.parametrize("window", [64, 1000, 1 << 20])
def test_small_windows_give_the_same_answer(window):
    buf, st = segment()
    buf[st[10] : st[12] + 7] = bytes(st[12] + 7 - st[10])  # zeroed span, record 12 partly wiped
    r = find_next_record(buf, st[10], window=window)
    assert (r.kind, r.pos) == ("message", st[13])


def test_scan_regions_lists_every_bad_region_of_a_segment():
    buf, st = segment()
    buf[st[3] + 90] ^= 0x10  # body bit flip → CRC failure
    buf[st[20] + 5] ^= 0xFF
    regions = scan_regions(bytes(buf), "commitlog/00000000000000000000")
    assert [(g.start, g.end, g.reason) for g in regions] == [(st[3], st[4], "crc_mismatch"),
                                                             (st[20], st[21], "bad_magic")]
    assert regions[0].bytes_lost == st[4] - st[3]


def test_clean_segment_has_no_regions_and_valid_start_is_returned_as_is():
    buf, st = segment()
    assert scan_regions(bytes(buf), "f") == []
    assert find_next_record(buf, st[5]).pos == st[5]


def test_data_end_is_not_moved_by_all_zero_windows_after_stale_bytes():
    """Stale bytes followed by a zero tail longer than one window: data_end is the end of the stale bytes."""
    from storelib.broker.recovery.resync import find_next_record

    buf = bytearray(3 * 1024 * 1024)
    buf[100:200] = b"\x07" * 100  # garbage that is not a record
    r = find_next_record(bytes(buf), 0, base=0, window=256 * 1024)
    assert r.kind == "none" and r.data_end == 200
