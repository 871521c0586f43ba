"""UNIQ_KEY (client message id) decoding as MessageClientIDSetter reads it: client IP, pid, creation time.

createUniqID (MessageClientIDSetter 4.9.8 and 5.3.3 :114-131, the same code in both; 5.3.3 adds no
helper) writes upper-case hex of: client IP (4 bytes, 16 when UtilAll.getIP picked an IPv6 address) ‖
pid (2) ‖ class-loader hash (4) ‖ ms since the start of the producer JVM's current month in its zone
(4, ``(int)`` of the difference; setStartTime :50-61) ‖ counter (2): 32 or 56 digits.

The readers parse the text with UtilAll.string2bytes (4.9.8 :279-296, 5.3.3 :340-357): upper-case it,
take ``length() / 2`` bytes (an odd last digit is dropped), a character that is not a hex digit is
nibble -1 (charToByte), combined as ``(byte)(hi << 4 | lo)``; empty text gives null. Then
(MessageClientIDSetter :63-112):

* getIPFromID / getIPStrFromID: 16 address bytes when there are exactly 28 bytes, else the first 4
  (ArrayIndexOutOfBounds under 4 bytes); IPv4 as UtilAll.ipToIPv4Str, IPv6 as ipToIPv6Str
  (4.9.8 :507-533, 5.3.3 :569-595): eight groups of four lower-case digits, no zero-run compression,
  an IPv4-mapped address left as IPv6 text.
* getPidFromID: the unsigned short 12 bytes before the END (IndexOutOfBounds under 12 bytes).
* getNearlyTimeFromID: the 4 bytes at ``ip length + 6`` from the START read unsigned, added to the
  start of the decoding JVM's current month in its zone, or of the month before when that is not
  before ``now`` (once: a span over a month can still land after ``now``).

Java never reads the class-loader hash or the counter; we read them only from the two lengths
createUniqID writes. A key that is not such an id (other length, a non-hex digit) gives garbage or an
exception in Java; :func:`decode_uniq_key` gives None for it, :func:`read_uniq_key` the Java values.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo

_NIBBLE = {c: i for i, c in enumerate("0123456789ABCDEF")}
ID_DIGITS = (32, 56)  # createUniqID's text: 16 bytes (IPv4 client) or 28 bytes (IPv6 client)


def java_hex_bytes(text: str) -> bytes | None:
    """UtilAll.string2bytes, quirks included: None for empty text, ``len // 2`` bytes counted in UTF-16
    units of the upper-cased text, -1 for a non-hex digit (so ``"ZZ"`` is 0xFF, ``"Z5"`` 0xF5)."""
    if not text:
        return None
    up = text.upper()
    if not up.isascii():  # Java counts UTF-16 code units
        raw = up.encode("utf-16-be", "surrogatepass")
        up = "".join(chr(u) for u in struct.unpack(f">{len(raw) // 2}H", raw))
    nib = [_NIBBLE.get(c, -1) for c in up[: len(up) // 2 * 2]]
    return bytes(((hi << 4) | lo) & 0xFF for hi, lo in zip(nib[0::2], nib[1::2]))


def ipv6_text(ip: bytes) -> str:
    """UtilAll.ipToIPv6Str: ``2001:0db8:0000:...:0005``. Not Inet6Address.getHostAddress (host fields,
    :func:`storelib.format.record.decode_host`), which drops leading zeros."""
    return ":".join(ip[i:i + 2].hex() for i in range(0, 16, 2))


def java_wall_ms(wall: datetime, tz: tzinfo) -> int:
    """A lenient GregorianCalendar's instant for a local wall time: in a DST gap the earlier offset, in
    an overlap the later one (Calendar.set of 00:00 in America/Goose_Bay on 2009-11-01); both are the
    later of the two instants Python's ``fold`` gives."""
    return int(max(wall.replace(tzinfo=tz, fold=f).timestamp() for f in (0, 1)) * 1000)


@dataclass(frozen=True)
class UniqKey:
    """What MessageClientIDSetter's readers give for one key; None where Java throws."""

    client_ip: str | None  # getIPStrFromID
    pid: int | None  # getPidFromID
    span_ms: int | None  # the unsigned 4 bytes getNearlyTimeFromID adds to a month start
    class_loader_hash: int | None  # no Java reader: only for a 32/56-digit key
    counter: int | None  # idem
    well_formed: bool  # 32 or 56 hex digits, as createUniqID writes

    def created_ms(self, now_ms: int, tz: tzinfo = timezone.utc) -> int | None:
        """What getNearlyTimeFromID returns in a JVM of zone ``tz`` at ``now_ms`` (offline: a time known to
        follow the creation, e.g. STORETIMESTAMP). The creation time only when ``tz`` is the producer's."""
        if self.span_ms is None:
            return None
        now = datetime.fromtimestamp(now_ms / 1000, tz).replace(tzinfo=None)
        start_ms = java_wall_ms(now.replace(day=1, hour=0, minute=0, second=0, microsecond=0), tz)
        if start_ms + self.span_ms >= now_ms:
            # Calendar.add(MONTH, -1) keeps the wall time getTimeInMillis normalised the fields to: 01:00
            # when the 1st's midnight was in a one-hour gap (Africa/Cairo 2014-08), so a month before at 01:00
            wall = datetime.fromtimestamp(start_ms / 1000, tz).replace(tzinfo=None)
            start_ms = java_wall_ms((wall - timedelta(days=1)).replace(day=1, hour=wall.hour, minute=wall.minute,
                                                                         second=wall.second), tz)
        return start_ms + self.span_ms


def month_start_ms(ms: int, tz: tzinfo = timezone.utc) -> int:
    """setStartTime's startTime (MessageClientIDSetter :50-58): 00:00 on the first of ``ms``'s month in ``tz``."""
    wall = datetime.fromtimestamp(ms / 1000, tz).replace(tzinfo=None)
    return java_wall_ms(wall.replace(day=1, hour=0, minute=0, second=0, microsecond=0), tz)


def create_uniq_id(fixed: str, now_ms: int, start_ms: int, counter: int) -> str:
    """createUniqID's text (:114-131) in a JVM whose prefix is ``fixed`` (hex of ip ‖ pid ‖ class-loader hash),
    at ``now_ms`` with the JVM's ``startTime`` and COUNTER value: ``(int)`` of the difference, 0 for one
    above -1e6 below 0 (NTP), then the counter's low 16 bits (UtilAll.writeInt/writeShort, 4.9.8 :265-277)."""
    diff = (now_ms - start_ms + 2**31) % 2**32 - 2**31
    if -1_000_000 < diff < 0:
        diff = 0
    return f"{fixed.upper()}{diff & 0xFFFFFFFF:08X}{counter & 0xFFFF:04X}"


def read_uniq_key(text: str) -> UniqKey:
    """Every MessageClientIDSetter reader on ``text`` (garbage where Java reads garbage); never raises."""
    b = java_hex_bytes(text) or b""
    ip_len = 16 if len(b) == 28 else 4
    ip = None
    if len(b) >= ip_len:
        ip = ipv6_text(b[:16]) if ip_len == 16 else ".".join(str(x) for x in b[:4])
    pid = int.from_bytes(b[-12:-10], "big") if len(b) >= 12 else None
    span = int.from_bytes(b[ip_len + 6:ip_len + 10], "big") if len(b) >= ip_len + 10 else None
    well = len(text) in ID_DIGITS and all(c in "0123456789ABCDEFabcdef" for c in text)
    return UniqKey(
        client_ip=ip, pid=pid, span_ms=span,
        class_loader_hash=int.from_bytes(b[ip_len + 2:ip_len + 6], "big", signed=True) if well else None,
        counter=int.from_bytes(b[ip_len + 10:ip_len + 12], "big") if well else None,
        well_formed=well,
    )


def decode_uniq_key(text: str) -> UniqKey | None:
    """The decoded client id; None when ``text`` is not one createUniqID writes (32 or 56 hex digits)."""
    k = read_uniq_key(text)
    return k if k.well_formed else None
