"""UNIQ_KEY (MessageClientIDSetter) decoding, table-driven from what the Java returns.

The expected values were printed by MessageClientIDSetter and UtilAll (5.3.3 source, the same readers as
4.9.8) under a JDK 17: getIPStrFromID, getPidFromID (None: Java throws), and getNearlyTimeFromID with
its clock set to ``now`` in the JVM zone given.
"""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from jobs.commands.get import with_uniq_key_info
from storelib.format.uniqkey import decode_uniq_key, read_uniq_key

V4 = "C0A8010D10925F3759DF000003E82840"  # 192.168.1.13, pid 4242, loader 0x5F3759DF, span 1000, counter 0x2840
TAIL = V4[8:]

CLIENT_IDS = [  # what createUniqID writes (32 or 56 hex digits): (UNIQ_KEY, getIPStrFromID)
    (V4, "192.168.1.13"),
    (V4.lower(), "192.168.1.13"),  # string2bytes upper-cases
    ("20010DB8" + "0" * 22 + "05" + TAIL, "2001:0db8:0000:0000:0000:0000:0000:0005"),  # no "::"
    ("0" * 31 + "1" + TAIL, "0000:0000:0000:0000:0000:0000:0000:0001"),
    ("FE800000000000000202B3FFFE1E8329" + TAIL, "fe80:0000:0000:0000:0202:b3ff:fe1e:8329"),  # lower case
    ("0" * 20 + "FFFFC0A8010D" + TAIL, "0000:0000:0000:0000:0000:ffff:c0a8:010d"),  # IPv4-mapped: still v6 text
]
JAVA_READERS = [(text, ip, 4242, 1000) for text, ip in CLIENT_IDS] + [  # (UNIQ_KEY, getIPStrFromID,
    # getPidFromID, the span getNearlyTimeFromID adds); None where Java throws
    ("", None, None, None),  # string2bytes gives null: NullPointerException
    ("abc", None, None, None),  # 1 byte: ArrayIndexOutOfBounds / IndexOutOfBounds
    ("order-123", "255.222.255.18", None, None),  # 4 bytes of -1 nibbles and 'E','D','2','3'
    ("Z" * 32, "255.255.255.255", 65535, 0xFFFFFFFF),
    ("G5" + V4[2:], "245.168.1.13", 4242, 1000),  # (byte)(-1 << 4 | 5)
    (V4 + "1", "192.168.1.13", 4242, 1000),  # odd length: the last digit is dropped
    ("20010DB8" + "0" * 22 + "05" + TAIL + "1", "2001:0db8:0000:0000:0000:0000:0000:0005", 4242, 1000),
    ("20010DB8" + "0" * 22 + "05" + TAIL[:-2], "32.1.13.184", 1296, 0),  # 27 bytes: IPv4, pid from the end
    (V4[:24], "192.168.1.13", 49320, None),  # 12 bytes: pid at 0, too short for the time
    ("\U0001F600" * 16, "255.255.255.255", 65535, 0xFFFFFFFF),  # 32 UTF-16 units
]


@pytest.mark.parametrize(("text", "ip", "pid", "span"), JAVA_READERS)
def test_readers_return_what_message_client_id_setter_returns_and_only_client_ids_decode(text, ip, pid, span):
    k = read_uniq_key(text)
    assert (k.client_ip, k.pid, k.span_ms) == (ip, pid, span)
    assert (decode_uniq_key(text) is None) == (text not in dict(CLIENT_IDS))  # not Java's garbage


@pytest.mark.parametrize(("text", "ip"), CLIENT_IDS)
def test_client_ids_decode_every_field_with_java_ip_text(text, ip):
    k = decode_uniq_key(text)
    assert (k.client_ip, k.pid, k.class_loader_hash, k.span_ms, k.counter) == (ip, 4242, 0x5F3759DF, 1000, 0x2840)


def _ms(*args) -> int:
    return int(datetime(*args, tzinfo=timezone.utc).timestamp() * 1000)


def _span_id(span: int) -> str:
    return V4[:20] + f"{span:08X}" + V4[28:]


CREATED = _ms(2026, 11, 21, 22, 20, 19) + 54
JAVA_NEARLY_TIME = [  # (JVM zone, span, now, getNearlyTimeFromID(...).getTime())
    ("UTC", CREATED - _ms(2026, 11, 1), CREATED + 127, CREATED),
    ("UTC", _ms(2026, 10, 31, 23, 59, 59) - _ms(2026, 10, 1), _ms(2026, 11, 1, 0, 0, 1), _ms(2026, 10, 31, 23, 59, 59)),
    ("UTC", 1000, _ms(2026, 11, 1, 0, 0, 1), _ms(2026, 10, 1, 0, 0, 1)),  # start + span == now: a month back
    ("UTC", 0xFFFFFFFF, _ms(2026, 11, 2), 1795107767295),  # a span over a month: after now
    ("Asia/Shanghai", CREATED - _ms(2026, 11, 1), CREATED + 127, CREATED - 8 * 3600_000),
    ("Africa/Cairo", 1000, 1408217629561, 1406844001000),  # 2014-08-01 00:00 is in a DST gap
    ("Africa/Cairo", 0x541C1241, 1408217629561, 1405580325825),  # ... and a month back from 01:00
    ("America/Goose_Bay", 0, 1258857781097, 1257048000000),  # 2009-11-01 00:00 twice: the later one
]


@pytest.mark.parametrize(("zone", "span", "now", "java"), JAVA_NEARLY_TIME)
def test_created_ms_is_get_nearly_time_from_id_at_that_now_in_that_zone(zone, span, now, java):
    assert decode_uniq_key(_span_id(span)).created_ms(now, ZoneInfo(zone)) == java


def test_get_adds_java_ip_text_for_an_ipv6_client_and_nothing_for_a_malformed_key():
    row = {"uniq_key": "20010DB8" + "0" * 22 + "05" + TAIL, "store_timestamp": _ms(2026, 11, 1, 0, 0, 2)}
    info = with_uniq_key_info(row, timezone.utc)["uniq_key_decoded"]
    assert info == {"client_ip": "2001:0db8:0000:0000:0000:0000:0000:0005", "pid": 4242, "counter": 0x2840,
                    "created_ms": _ms(2026, 11, 1, 0, 0, 1)}
    for bad in ("order-123", V4 + "1", "Z" * 32, ""):
        assert "uniq_key_decoded" not in with_uniq_key_info({"uniq_key": bad, "store_timestamp": 0}, timezone.utc)
