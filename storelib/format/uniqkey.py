"""UNIQ_KEY (client message id, MessageClientIDSetter) decoding: client IP, pid, creation time.

Layout (hex text): client IP (4 bytes, 16 for IPv6) ‖ pid (2) ‖ class-loader hash (4) ‖ ms since the
start of the producer's current month (4, unsigned) ‖ counter (2). The month is not stored: like the
broker's ``getNearlyTimeFromID`` we take the month of a reference time (offline: the record's store
timestamp) and step back one month when the result would not be before it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo


@dataclass(frozen=True)
class UniqKey:
    client_ip: str
    pid: int
    class_loader_hash: int
    span_ms: int
    counter: int

    def created_ms(self, reference_ms: int, tz: tzinfo = timezone.utc) -> int:
        """Creation time (ms) given a reference time known to be after it (e.g. STORETIMESTAMP)."""
        ref = datetime.fromtimestamp(reference_ms / 1000, tz)
        start = ref.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        start_ms = int(start.timestamp() * 1000)
        if start_ms + self.span_ms >= reference_ms:
            prev = (start - timedelta(days=1)).replace(day=1)
            start_ms = int(prev.timestamp() * 1000)
        return start_ms + self.span_ms


def decode_uniq_key(text: str) -> UniqKey | None:
    """Decode a UNIQ_KEY; None when it is not in the client-id format (32 or 56 hex characters)."""
    if len(text) not in (32, 56):
        return None
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return None
    ip_len = 16 if len(raw) == 28 else 4
    ip = str(ipaddress.ip_address(raw[:ip_len]))
    rest = raw[ip_len:]
    return UniqKey(
        client_ip=ip,
        pid=int.from_bytes(rest[0:2], "big"),
        class_loader_hash=int.from_bytes(rest[2:6], "big", signed=True),
        span_ms=int.from_bytes(rest[6:10], "big"),
        counter=int.from_bytes(rest[10:12], "big"),
    )


