"""UNIQ_KEY (MessageClientIDSetter) decoding: client IP, pid, creation time relative to a reference."""

from __future__ import annotations

from datetime import datetime, timezone

from storelib.format.uniqkey import decode_uniq_key


def _key(ip: bytes, pid: int, loader: int, span_ms: int, counter: int) -> str:
    return (ip + pid.to_bytes(2, "big") + loader.to_bytes(4, "big", signed=True) + span_ms.to_bytes(4, "big")
            + counter.to_bytes(2, "big")).hex().upper()


def _ms(*args) -> int:
    return int(datetime(*args, tzinfo=timezone.utc).timestamp() * 1000)


def test_ipv4_uniq_key_decodes_every_field_and_the_time_in_the_reference_month():
    month = _ms(2026, 11, 1)
    created = _ms(2026, 11, 21, 22, 20, 19) + 54
    k = decode_uniq_key(_key(bytes([192, 168, 1, 13]), 4242, 0x5F3759DF, created - month, 10304))
    assert (k.client_ip, k.pid, k.class_loader_hash, k.counter) == ("192.168.1.13", 4242, 0x5F3759DF, 10304)
    assert k.created_ms(created + 127) == created  # stored shortly after it was created


def test_reference_in_the_next_month_steps_back_one_month_like_the_broker():
    created = _ms(2026, 10, 31, 23, 59, 59)
    k = decode_uniq_key(_key(bytes(4), 1, 0, created - _ms(2026, 10, 1), 0))
    assert k.created_ms(_ms(2026, 11, 1, 0, 0, 1)) == created


def test_ipv6_uniq_key_and_non_client_ids():
    ip6 = bytes.fromhex("20010db8000000000000000000000005")
    k = decode_uniq_key(_key(ip6, 7, -1, 1000, 1))
    assert k.client_ip == "2001:db8::5" and k.class_loader_hash == -1 and k.span_ms == 1000
    assert decode_uniq_key("order-123") is None and decode_uniq_key("Z" * 32) is None
