"""The 5.x ``__CRC32#`` property read exactly as 5.3.3's CommitLog.checkMessageAndReturnSize reads it.

With forceVerifyPropCRC the broker folds the value's characters from the LAST to the first,
``expectedCRC = expectedCRC * 10 + (c - '0')`` in Java int arithmetic, and rejects the record unless
``expectedCRC >= 0`` and it equals the masked CRC-32 of the record minus its last 20 bytes (5.3.2+:
``>= 0``, so a stored 0 is an ordinary value, compared, not a pass). Records are forged here so that
their CRC is exactly the value some odd text reads as; the scalar check, every columnar property path
and the recovery walk must all give the broker's answer.
"""

from __future__ import annotations

import struct
import zlib

import pytest

from storelib.broker.recovery.walk import RecoveryInputs, recovery_walk
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.format.record import BLANK_MAGIC, Message, check_record, encode_message
from storelib.scan.scanner import scan_buffer
from tests.rebuild_storegen import CraftedStore, msg

FLAG_AT = 16  # the FLAG field: 4 bytes inside the CRC'd range, free to forge


def java_expected(text: str) -> int:
    """The Java loop, literally: UTF-16 units from the end, int overflow wrapping."""
    data = text.encode("utf-16-be", "surrogatepass")
    units = [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]
    e = 0
    for u in reversed(units):
        e = (e * 10 + (u - 48)) & 0xFFFFFFFF
        e = e - (1 << 32) if e & 0x80000000 else e
    return e


def forge(rec: bytearray, end: int, target: int) -> None:
    """Set FLAG so that the masked CRC-32 of ``rec[:end]`` is ``target`` (CRC is affine over GF(2))."""
    base = zlib.crc32(bytes(rec[:end]))
    cols = []
    for bit in range(32):
        r = bytearray(rec[:end])
        r[FLAG_AT + bit // 8] ^= 0x80 >> (bit % 8)
        cols.append(zlib.crc32(bytes(r)) ^ base)
    rows: list[tuple[int, int]] = []
    for bit, v in enumerate(cols):
        comb = 1 << bit
        for rv, rc in rows:
            if v ^ rv < v:
                v, comb = v ^ rv, comb ^ rc
        if v:
            rows.append((v, comb))
            rows.sort(reverse=True)
    v, comb = base ^ target, 0
    for rv, rc in rows:
        if v ^ rv < v:
            v, comb = v ^ rv, comb ^ rc
    assert v == 0, "32 consecutive bits always reach any CRC"
    for bit in range(32):
        if comb >> bit & 1:
            rec[FLAG_AT + bit // 8] ^= 0x80 >> (bit % 8)
    assert zlib.crc32(bytes(rec[:end])) & 0x7FFFFFFF == target


def _record(value: str, *, crc: int | None, extra: str = "ok", i: int = 0) -> bytes:
    """A 5.x record whose ``__CRC32#`` property (the last 20+ bytes) holds ``value``; FLAG forged so the
    record's CRC is ``crc`` (None: left as it falls)."""
    props = f"TAGS\x01t{i}\x02EXTRA\x01{extra}\x02__CRC32#\x01{value}\x02"
    m = Message(topic="T", body=b"body %d" % i, store_timestamp=1_700_000_000_000 + i, physical_offset=i,
                properties_raw=props)
    rec = bytearray(encode_message(m))
    if crc is not None:
        forge(rec, len(rec) - 20, crc)
    return bytes(rec)


# value, forged CRC, the broker's verdict
CASES = [
    ("2482094791", 1974902842, True),      # what the broker writes: digits least significant first
    ("0000000000", 0, True),               # a CRC of 0 written as ten zeros: compared, and equal
    ("0000000000", 12345, False),          # ten zeros are 0, not "skip": a record whose CRC is not 0 fails
    ("12345", 54321, True),                # any length: five digits read from the end
    ("00000000001", java_expected("00000000001"), True),  # eleven: 10**10 wraps to 1410065408
    ("0000000003", None, False),           # 3000000000 wraps negative: as if there were no CRC
    ("A", 17, True),                       # not a digit: 'A' - '0' = 17
    ("", None, None),                      # an empty value is no property at all (string2messageProperties)
    ("3\u00e9", java_expected("3\u00e9"), True),  # a non-ASCII unit: its UTF-16 value - 48
]


def test_java_fold_matches_the_loop():
    from storelib.format.properties import crc_expected

    for text in ["2482094791", "0000000000", "12345", "99999999999999", "0000000003", "A", "", "3\u00e9", "\U0001d7ce"]:
        assert crc_expected(text) == java_expected(text), text


def _segment(recs: list[bytes]) -> bytes:
    body = b"".join(recs)
    return body + struct.pack(">ii", 64, BLANK_MAGIC) + b"\0" * 56


@pytest.mark.parametrize("columns", [None, ["phy_offset", "prop_crc_ok"]], ids=["split-parse", "name-lookup"])
@pytest.mark.parametrize("unclean", [False, True], ids=["utf8", "replacement-path"])
def test_scalar_and_columnar_read_the_crc_property_as_the_broker_does(columns, unclean):
    extra = "\udcff" if unclean else "ok"  # an invalid UTF-8 byte in another property: the U+FFFD path
    recs = []
    want = []
    for i, (value, crc, verdict) in enumerate(CASES):
        target = crc
        if target is None and verdict is not None:
            target = 7 if java_expected(value) != 7 else 8  # any CRC other than the expected one
        recs.append(_record(value, crc=target, extra=extra, i=i))
        want.append(verdict)
    seg = _segment(recs)
    pos, scalar = 0, []
    for rec in recs:
        chk = check_record(seg, pos, check_crc=True)
        assert chk.kind == "message", chk.reason
        scalar.append(chk.prop_crc_ok)
        pos += len(rec)
    assert scalar == want
    table, end = scan_buffer(seg, columns=columns)
    assert end.kind == "blank" and table.num_rows == len(CASES)
    assert table.column("prop_crc_ok").to_pylist() == want


def test_force_verify_prop_crc_walk_ends_at_ten_zeros_that_are_not_the_crc(tmp_path):
    S = 8192
    cs = CraftedStore(S, version="5")
    good = [cs.append(msg("T", 0, keys=f"k{i}"), prop_crc=True) for i in range(4)]
    zero = cs.append(msg("T", 0, keys="zeros"), prop_crc=True)
    cs.append(msg("T", 0, keys="after"), prop_crc=True)
    seg = cs.segments[zero.segment]
    end = zero.file_offset + zero.size
    assert java_expected(bytes(seg[end - 11 : end - 1]).decode()) != 0  # its true CRC is not 0
    seg[end - 11 : end - 1] = b"0000000000"
    root = cs.write(tmp_path / "store")
    store = Store(root, BrokerSettings.defaults("5").with_overrides({"mappedFileSizeCommitLog": S}))
    res = recovery_walk(store, RecoveryInputs.from_settings(store.settings, segment_size=S, version="5",
                                                            force_verify_prop_crc=True))
    assert res.process_offset == zero.phy == good[-1].phy + good[-1].size
    assert res.failure is not None and res.failure.reason == "crc_mismatch"


def test_force_verify_prop_crc_walk_passes_a_record_whose_crc_is_zero(tmp_path):
    S = 8192
    cs = CraftedStore(S, version="5")
    for i in range(3):
        cs.append(msg("T", 0, keys=f"k{i}"), prop_crc=True)
    zero = cs.append(msg("T", 0, keys="zero"), prop_crc=True)
    last = cs.append(msg("T", 0, keys="after"), prop_crc=True)
    seg = cs.segments[zero.segment]
    rec = bytearray(seg[zero.file_offset : zero.file_offset + zero.size])
    forge(rec, len(rec) - 20, 0)
    rec[-11:-1] = b"0000000000"
    seg[zero.file_offset : zero.file_offset + zero.size] = rec
    root = cs.write(tmp_path / "store")
    store = Store(root, BrokerSettings.defaults("5").with_overrides({"mappedFileSizeCommitLog": S}))
    res = recovery_walk(store, RecoveryInputs.from_settings(store.settings, segment_size=S, version="5",
                                                            force_verify_prop_crc=True))
    assert res.failure is None and res.process_offset == last.phy + last.size
