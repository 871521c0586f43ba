"""5.3.3's setBatchSizeIfNeeded: with both INNER_NUM and INNER_BASE present the broker's check does
``Long.parseLong(INNER_BASE)`` and ``Short.parseShort(INNER_NUM)``, and a NumberFormatException fails
the record (-1); 4.9.8 has no such step. The scalar check and the batch decoder (whatever columns are
asked, clean or replaced property text) must agree. Expected parses were checked against JDK 17."""

from __future__ import annotations

import pytest

from storelib.format.properties import java_int
from storelib.format.record import Message, blank_record, check_record, encode_message
from storelib.scan.scanner import scan_buffer

COLUMN_SETS = [["phy_offset"], ["phy_offset", "tags", "keys", "uniq_key", "tags_code"], ["properties"],
               ["properties_raw", "tags"]]


def segment_of(msgs: list[Message], size: int = 8192) -> bytes:
    """One segment of ``size`` bytes holding ``msgs`` (their offsets set), then a blank record."""
    out = bytearray()
    for m in msgs:
        m.physical_offset = len(out)
        out += encode_message(m, trailing_sep=True)
    out += blank_record(size - len(out))
    return bytes(out) + bytes(size - len(out))


def _inner(num: str, base: str, **extra: str) -> Message:
    return Message(topic="T", body=b"x", properties={"INNER_NUM": num, "INNER_BASE": base, "TAGS": "a", **extra})


@pytest.mark.parametrize("text,short,long_", [
    ("+1", 1, 1), ("-5", -5, -5), ("\u0661\u0662", 12, 12), ("\uff11\uff12", 12, 12), ("-0", 0, 0),
    ("32767", 32767, 32767), ("32768", None, 32768), ("-32768", -32768, -32768), ("-32769", None, -32769),
    ("9223372036854775807", None, 9223372036854775807), ("9223372036854775808", None, None),
    (" 1", None, None), ("1 ", None, None), ("+", None, None), ("", None, None), ("1_0", None, None),
    ("1.5", None, None), ("0x1", None, None), ("\U0001d7d9", None, None), ("00000000000000000000001", 1, 1),
])
def test_java_short_and_long_parse_like_the_jdk(text, short, long_):
    assert (java_int(text, 16), java_int(text, 64)) == (short, long_)


@pytest.mark.parametrize("num,base", [("x", "0"), ("40000", "0"), ("1", "1.5"), ("1", "99999999999999999999"),
                                      ("1", " 0")])
def test_unparsable_inner_values_fail_the_record_on_5_3_3(num, base):
    buf = segment_of([_inner("1", "0"), _inner(num, base), Message(topic="T", body=b"z")])
    second = len(encode_message(_inner("1", "0"), trailing_sep=True))
    chk = check_record(buf, second, line="5")
    assert (chk.kind, chk.size) == ("invalid", -1) and chk.reason.startswith("parse_error: INNER_")
    for cols in COLUMN_SETS:
        t, end = scan_buffer(buf, line="5", columns=cols)
        assert (t.num_rows, end.kind, end.reason) == (1, "invalid", "parse_error"), cols
        assert end.detail == chk.reason.removeprefix("parse_error: ")


@pytest.mark.parametrize("line", ["4", None])
def test_4_9_8_and_an_unknown_line_do_not_parse_inner_values(line):
    buf = segment_of([_inner("x", "0"), Message(topic="T", body=b"z")])
    assert check_record(buf, 0, line=line).kind == "message"
    assert scan_buffer(buf, line=line, columns=["phy_offset", "tags"])[0].num_rows == 2


@pytest.mark.parametrize("props", [{"INNER_NUM": "x"}, {"INNER_BASE": "x"}, {"INNER_NUM": "", "INNER_BASE": "0"},
                                   {"INNER_NUM": "+7", "INNER_BASE": "-1"},
                                   {"INNER_NUM": "\u0661", "INNER_BASE": "9223372036854775807"}])
def test_parsable_or_single_inner_values_are_accepted(props):  # an empty value is no pair at all
    buf = segment_of([Message(topic="T", body=b"x", properties=dict(props)), Message(topic="T", body=b"z")])
    assert check_record(buf, 0, line="5").kind == "message"
    for cols in COLUMN_SETS:
        assert scan_buffer(buf, line="5", columns=cols)[0].num_rows == 2


def test_replaced_property_text_is_parsed_too():
    raw = "TAGS\x01\udcff\x02INNER_NUM\x01x\x02INNER_BASE\x010\x02"  # a raw FF byte: the column-wise parser
    buf = segment_of([Message(topic="T", body=b"y"), Message(topic="T", body=b"x", properties_raw=raw)])
    for cols in COLUMN_SETS:
        t, end = scan_buffer(buf, line="5", columns=cols)
        assert (t.num_rows, end.reason) == (1, "parse_error")


def test_a_bad_delay_is_reported_before_bad_inner_values_of_the_same_record():
    sched = Message(topic="SCHEDULE_TOPIC_XXXX", body=b"x",
                    properties={"DELAY": "three", "INNER_NUM": "x", "INNER_BASE": "0"})
    t, end = scan_buffer(segment_of([sched]), line="5", columns=["phy_offset"])
    assert (t.num_rows, end.reason) == (0, "parse_error") and end.detail.startswith("DELAY")
    later = Message(topic="SCHEDULE_TOPIC_XXXX", body=b"x", properties={"DELAY": "three"})
    t, end = scan_buffer(segment_of([_inner("x", "0"), later]), line="5", columns=["phy_offset"])
    assert (t.num_rows, end.reason) == (0, "parse_error") and end.detail.startswith("INNER_NUM")


@pytest.mark.parametrize("pad", range(4))
def test_inner_values_are_found_at_any_byte_offset_when_no_property_column_is_asked(pad):
    """Without property columns the batch decoder first tests the bytes cheaply (aligned 2-byte words):
    an INNER_NUM at an even or an odd offset of the properties column must still be parsed."""
    first = Message(topic="T", body=b"y", properties={"A": "x" * (pad + 1)})
    buf = segment_of([first, _inner("x", "0"), Message(topic="T", body=b"z")])
    t, end = scan_buffer(buf, line="5", columns=["phy_offset", "size"])
    assert (t.num_rows, end.reason) == (1, "parse_error")
    plain = segment_of([first, Message(topic="T", body=b"x", properties={"NUM": "SUM", "XUM": "M"})])
    assert scan_buffer(plain, line="5", columns=["phy_offset"])[0].num_rows == 2  # a prefilter hit, no INNER_NUM
