"""Hosts of IPv6 (BORNHOST_V6/STOREHOST_V6) records as the broker's MessageDecoder.decode holds them.

``InetAddress.getByAddress(byte[16])`` returns an Inet4Address for an IPv4-mapped address (::ffff:a.b.c.d),
so the broker prints such a host as IPv4; any other 16-byte address is an Inet6Address, printed by
getHostAddress without zero compression. The offset msgId's buffer is sized by the STOREHOST flag (28
bytes) but filled from getStoreHostBytes (4 address bytes for the Inet4Address): createMessageId hexes the
IPv4 id's 16 bytes and 12 zero bytes (MessageDecoder: 4.9.8 :65-73, :323, :334, :379-381).
"""

from __future__ import annotations

import ipaddress
import struct

import pytest

from storelib.format.record import Message, check_record, encode_message, offset_msg_id
from storelib.scan.scanner import scan_buffer

CASES = [  # (host as written, what the broker prints)
    ("[::ffff:10.1.2.3]:5555", "10.1.2.3:5555"),
    ("[::ffff:192.168.0.9]:10911", "192.168.0.9:10911"),
    ("[fe80::1]:7", "[fe80:0:0:0:0:0:0:1]:7"),
    ("[::10.1.2.3]:8", "[0:0:0:0:0:0:a01:203]:8"),  # IPv4-compatible, not mapped: an Inet6Address
    ("[0:0:0:0:1:ffff:a01:203]:9", "[0:0:0:0:1:ffff:a01:203]:9"),  # not the mapped prefix
    ("10.9.8.7:10911", "10.9.8.7:10911"),
]


def _segment(hosts: list[tuple[str, str]], version: int) -> tuple[bytes, list[Message]]:
    out, msgs, pos = bytearray(), [], 0
    for i, (born, store) in enumerate(hosts):
        m = Message(topic="T", body=b"b%d" % i, born_host=born, store_host=store, physical_offset=pos,
                    magic_version=version)
        rec = encode_message(m)
        out += rec
        msgs.append(m)
        pos += len(rec)
    out += struct.pack(">ii", 8, -875286124)
    return bytes(out), msgs


def _java_msg_id(store: str, phy: int) -> str:
    """MessageDecoder.decode's msgId for a store host written as ``store``."""
    addr, _, port = store.rpartition(":")
    if addr.startswith("[::ffff:"):
        four = bytes(int(x) for x in addr[8:-1].split("."))
        return (four + struct.pack(">iq", int(port), phy) + bytes(12)).hex().upper()
    return (ipaddress.ip_address(addr.strip("[]")).packed + struct.pack(">iq", int(port), phy)).hex().upper()


@pytest.mark.parametrize("version", [1, 2])
def test_an_ipv4_mapped_ipv6_host_prints_as_ipv4_as_the_broker_prints_it(version):
    hosts = [(born, store) for born, _ in CASES for store, _ in CASES[::-1]][:24]
    seg, msgs = _segment(hosts, version)
    table, end = scan_buffer(seg, columns=["phy_offset", "born_host", "store_host", "msg_id"])
    assert end.kind == "blank" and table.num_rows == len(hosts)
    shown = dict(CASES)
    assert table.column("born_host").to_pylist() == [shown[b] for b, _ in hosts]
    assert table.column("store_host").to_pylist() == [shown[s] for _, s in hosts]
    ids = [_java_msg_id(s, m.physical_offset) for (_, s), m in zip(hosts, msgs)]
    assert table.column("msg_id").to_pylist() == ids
    for m, want in zip(msgs, ids):  # the scalar decoder says the same
        chk = check_record(seg, m.physical_offset)
        assert (chk.message.born_host, chk.message.store_host) == (shown[m.born_host], shown[m.store_host])
        assert offset_msg_id(chk.message._store_host_bytes, m.physical_offset) == want


def test_a_batch_of_only_mapped_hosts_prints_ipv4_and_56_digit_msg_ids():
    seg, msgs = _segment([("[::ffff:10.1.2.3]:5555", "[::ffff:10.0.0.1]:10911")] * 3, 1)
    table, _ = scan_buffer(seg, columns=["born_host", "store_host", "msg_id"])
    assert set(table.column("born_host").to_pylist()) == {"10.1.2.3:5555"}
    assert set(table.column("store_host").to_pylist()) == {"10.0.0.1:10911"}
    ids = table.column("msg_id").to_pylist()
    assert ids == [f"0A000001{10911:08X}{m.physical_offset:016X}" + "0" * 24 for m in msgs]
