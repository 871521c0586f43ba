"""The controller-mode epoch file (CheckpointFile + EpochFileCache.EpochEntrySerializer) and the rejoin rules
over it (EpochFileCache.findConsistentPoint, AutoSwitchHAClient.doTruncate), against the broker's own
examples: the CheckpointFile javadoc's file and EpochFileCacheTest's consistent points."""

from __future__ import annotations

import os

import pytest

from storelib.broker.replicas.epochs import epoch_cache, find_consistent_point, newest, rejoin_cut
from storelib.format.crc import body_crc
from storelib.format.ha.epochfile import (
    LONG_MAX,
    EpochEntry,
    encode_epoch_file,
    load_epoch_file,
    parse_epoch_file,
    write_epoch_file,
)

JAVADOC = b"2\n773307083\n7-7000\n8-8000\n"  # CheckpointFile.java's class comment: size, crc32, entries


def E(*pairs):
    return [EpochEntry(a, b) for a, b in pairs]


def test_encoded_file_is_the_javadoc_example_byte_for_byte():
    assert encode_epoch_file(E((7, 7000), (8, 8000))) == JAVADOC
    p = parse_epoch_file(JAVADOC)
    assert p.outcome == "ok" and list(p.entries) == E((7, 7000), (8, 8000))
    assert p.stored_crc == p.computed_crc == 773307083


def test_an_empty_list_is_never_written():
    from storelib.errors import StoreError

    with pytest.raises(StoreError):
        encode_epoch_file([])


def _crc(lines: str) -> int:
    return body_crc(lines.encode())


@pytest.mark.parametrize("text, outcome, entries", [
    ("2\n0\n7-7000\n8-8000\n", "ok", [(7, 7000), (8, 8000)]),  # a stored CRC of 0 is not checked
    ("2\n773307083\r\n7-7000\r\n8-8000\r\n", "ok", [(7, 7000), (8, 8000)]),  # readLine takes \r\n; CRC over \n
    ("2\n773307083\n7-7000\n8-8000", "ok", [(7, 7000), (8, 8000)]),  # no final newline: same lines
    ("2\n773307084\n7-7000\n8-8000\n", "ioerror", None),  # CRC differs
    ("3\n773307083\n7-7000\n8-8000\n", "ioerror", None),  # count differs
    ("2\n{}\n7-7000\n5\n8-8000\n".format(_crc("7-7000\n5\n8-8000\n")), "ok", [(7, 7000), (8, 8000)]),  # 1 part: skipped, CRC'd
    ("1\n{}\n7-7000-\n".format(_crc("7-7000-\n")), "ok", [(7, 7000)]),  # split drops the trailing empty part
    ("x\n0\n7-7000\n", "fatal", None),  # Integer.parseInt("x"): NumberFormatException, not caught
    ("2\n", "fatal", None),  # no CRC line: parseInt(null)
    ("", "fatal", None),  # an empty file (a power cut inside the in-place rewrite)
    ("1\n0\na-7000\n", "fatal", None),  # an entry's epoch is not a number
    ("1\n0\n-7-7000\n", "ioerror", None),  # "", "7", "7000": three parts, skipped, so the count is not met
])
def test_parse_follows_checkpointfile_read(text, outcome, entries):
    p = parse_epoch_file(text.encode())
    assert p.outcome == outcome, p.problem
    if entries is not None:
        assert list(p.entries) == E(*entries)


def test_bytes_that_are_not_utf8_go_to_the_bak():
    assert parse_epoch_file(b"1\n0\n7-70\xff0\n").outcome == "ioerror"


def _store(tmp_path, main: bytes | None, bak: bytes | None):
    if main is not None:
        (tmp_path / "epochFileCheckpoint").write_bytes(main)
    if bak is not None:
        (tmp_path / "epochFileCheckpoint.bak").write_bytes(bak)
    return load_epoch_file(str(tmp_path))


def test_load_falls_back_to_bak_like_the_broker(tmp_path):
    good_bak = encode_epoch_file(E((1, 0)))
    ld = _store(tmp_path, b"2\n1\n1-0\n2-100\n", good_bak)  # bad CRC -> .bak
    assert ld.source == "bak" and ld.entries == E((1, 0)) and not ld.broker_fails
    assert [f.kind for f in ld.findings] == ["epoch_file_bad"]


def test_empty_main_file_stops_the_broker_even_with_a_good_bak(tmp_path):
    ld = _store(tmp_path, b"", encode_epoch_file(E((1, 0))))
    assert ld.broker_fails and ld.entries == [] and ld.findings[0].severity == "critical"


def test_missing_main_reads_bak_and_both_bad_means_no_epochs(tmp_path):
    ld = _store(tmp_path, None, encode_epoch_file(E((1, 0), (2, 50))))
    assert ld.source == "bak" and ld.entries == E((1, 0), (2, 50))
    assert [f.kind for f in ld.findings] == ["epoch_file_missing"]
    (tmp_path / "epochFileCheckpoint").write_bytes(b"1\n5\n1-0\n")
    (tmp_path / "epochFileCheckpoint.bak").write_bytes(b"1\n6\n1-0\n")
    ld = load_epoch_file(str(tmp_path))
    assert ld.entries == [] and ld.source is None and not ld.broker_fails and ld.present


def test_no_file_at_all_is_not_present(tmp_path):
    ld = load_epoch_file(str(tmp_path))
    assert not ld.present and ld.entries == [] and not ld.findings


def test_write_keeps_the_previous_version_as_bak(tmp_path):
    write_epoch_file(str(tmp_path), E((1, 0)))
    assert not os.path.exists(tmp_path / "epochFileCheckpoint.bak")
    write_epoch_file(str(tmp_path), E((1, 0), (2, 4096)))
    assert (tmp_path / "epochFileCheckpoint.bak").read_bytes() == encode_epoch_file(E((1, 0)))
    assert load_epoch_file(str(tmp_path)).entries == E((1, 0), (2, 4096))


# EpochFileCacheTest (5.3.3): cache1 = 1-100, 2-300, 3-500
CACHE1 = E((1, 100), (2, 300), (3, 500))


@pytest.mark.parametrize("local, local_end, master, master_end, expected", [
    (CACHE1, LONG_MAX, E((1, 100), (2, 300), (3, 450)), LONG_MAX, 450),  # testFindConsistentPointSample1
    (CACHE1, 700, E((1, 100), (2, 300), (3, 500)), 600, 600),  # Sample2
    (CACHE1, LONG_MAX, E((1, 200), (2, 500)), LONG_MAX, -1),  # Sample3
    (E((1, 100), (2, 300), (3, 500), (4, 800)), LONG_MAX, CACHE1, 700, 700),  # Sample4 (cache2 vs cache1)
])
def test_consistent_point_matches_the_brokers_own_tests(local, local_end, master, master_end, expected):
    assert find_consistent_point(epoch_cache(local, local_end), epoch_cache(master, master_end)) == expected


def test_last_epoch_starting_past_the_end_keeps_long_max():
    """setLastEpochEntryEndOffset ignores an end below the last start: that epoch still ends at Long.MAX_VALUE."""
    c = epoch_cache(E((1, 0), (2, 900)), 500)
    assert c[-1].end == LONG_MAX and c[0].end == 900
    assert find_consistent_point(c, epoch_cache(E((1, 0), (2, 900)), 1000)) == 1000


def test_rejoin_outcomes():
    def always(_):
        return True

    assert rejoin_cut([], 500, E((1, 0), (2, 300)), 800, always).outcome == "new_replica"
    assert rejoin_cut(E((1, 7)), 500, E((1, 0), (2, 300)), 800, always).outcome == "no_consistent_point"
    cut = rejoin_cut(E((1, 0)), 500, E((1, 0), (2, 300)), 800, always)
    assert (cut.outcome, cut.point, cut.truncated_at) == ("cut", 300, 300)
    same = rejoin_cut(E((1, 0), (2, 300)), 600, E((1, 0), (2, 300)), 800, always)
    assert (same.outcome, same.truncated_at) == ("nothing_to_cut", None)
    refused = rejoin_cut(E((1, 0)), 500, E((1, 0), (2, 300)), 800, lambda o: o != 300)
    assert (refused.outcome, refused.point, refused.truncated_at) == ("refused", 300, None)


def test_the_newest_epoch_wins_then_the_longer_log():
    assert newest([E((1, 0)), E((1, 0), (2, 30)), E((1, 0), (2, 30))], [90, 40, 60]) == 2
    assert newest([[], []], [1, 2]) is None
