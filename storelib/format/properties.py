"""Message properties: the broker's exact parse rules (MessageDecoder.string2messageProperties).

Pairs are ``name 0x01 value`` separated by ``0x02``. A segment counts only when the first 0x01 at or
after its start lies strictly inside it with non-empty name and value; later duplicates win. 4.9.8
writers drop the final separator, 5.x (since 5.2.0) keep it.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Mapping

NAME_VALUE_SEP = "\x01"
PROPERTY_SEP = "\x02"

KEYS = "KEYS"
TAGS = "TAGS"
UNIQ_KEY = "UNIQ_KEY"
DELAY = "DELAY"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
TRAN_MSG = "TRAN_MSG"
PGROUP = "PGROUP"
WAIT = "WAIT"
INNER_NUM = "INNER_NUM"
INNER_BASE = "INNER_BASE"
INNER_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"
INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"
CRC32 = "__CRC32#"
DUP_INFO = "DUP_INFO"  # MessageConst.DUP_INFO (5.3.3 common/.../MessageConst.java:47)
CRC32_RESERVED_LEN = 20
_JAVA_INT = re.compile(r"[+-]?\d+")


def parse_properties(s: str) -> dict[str, str]:
    """Decode a properties string exactly as the broker does (store-format §3.6)."""
    out: dict[str, str] = {}
    n = len(s)
    i = 0
    while i < n:
        end = s.find(PROPERTY_SEP, i)
        if end < 0:
            end = n
        if end - i >= 3:
            k = s.find(NAME_VALUE_SEP, i)
            if i < k < end - 1:
                out[s[i:k]] = s[k + 1 : end]
        i = end + 1
    return out


def encode_properties(props: Mapping[str, str] | Iterable[tuple[str, str]], trailing_sep: bool = False) -> str:
    """Serialise pairs in the given order (4.9.8 style drops the last separator, 5.x keeps it)."""
    items = props.items() if isinstance(props, Mapping) else props
    parts = [f"{k}{NAME_VALUE_SEP}{v}{PROPERTY_SEP}" for k, v in items if v is not None]
    s = "".join(parts)
    if s and not trailing_sep:
        s = s[:-1]
    return s


def crc_digits(value: int) -> str:
    """The 10 little-endian decimal digits the 5.x broker stores for a property CRC."""
    return "".join(str((value // 10**i) % 10) for i in range(10))


def crc_expected(value: str) -> int:
    """The CRC a 5.3.3 broker expects from a ``__CRC32#`` value, as a Java int (negative: none usable).

    CommitLog.checkMessageAndReturnSize (forceVerifyPropCRC) reads the value's UTF-16 units from the
    last to the first, ``e = e * 10 + (unit - '0')`` in int arithmetic: any text gives a number (no
    length or digit check), 0 is compared like any other value (5.3.2+: ``expectedCRC >= 0``), and a
    negative result rejects the record as if the property were missing.
    """
    data = value.encode("utf-16-le", "surrogatepass")
    e, p = 0, 1
    for i in range(0, len(data), 2):
        e = (e + (int.from_bytes(data[i : i + 2], "little") - 48) * p) & 0xFFFFFFFF
        p = p * 10 & 0xFFFFFFFF
    return e - (1 << 32) if e >= 1 << 31 else e


def java_int(text: str, bits: int = 32) -> int | None:
    """``Integer.parseInt(text)``, or None where it throws: an optional sign, then decimal digits
    (Unicode ones too, as Character.digit takes them, but none outside the BMP: Java sees two
    surrogate units there), within the int range. ``bits`` 16 is ``Short.parseShort`` (parseInt, then
    a range check), 64 ``Long.parseLong`` (the same rules over the long range)."""
    if not _JAVA_INT.fullmatch(text) or any(ord(c) > 0xFFFF for c in text):
        return None
    v = int(text)
    return v if -(1 << (bits - 1)) <= v < 1 << (bits - 1) else None


def inner_batch_error(num: str | None, base: str | None) -> str | None:
    """Why 5.3.3's setBatchSizeIfNeeded throws for these INNER_NUM/INNER_BASE values (None: it does not).

    Only when both properties are present it does ``Long.parseLong(INNER_BASE)`` then
    ``Short.parseShort(INNER_NUM)``, inside checkMessageAndReturnSize's try: a NumberFormatException
    fails the record (-1). 4.9.8 has no such step.
    """
    if num is None or base is None:
        return None
    if java_int(base, 64) is None:
        return f"INNER_BASE {base!r} is not a Java long"
    if java_int(num, 16) is None:
        return f"INNER_NUM {num!r} is not a Java short"
    return None


def dup_info_error(value: str | None) -> str | None:
    """Why 5.3.3's recovery check fails a record with duplicationEnable for this DUP_INFO value (None: it
    passes). CommitLog.checkMessageAndReturnSize (5.3.3 CommitLog.java:540-545), inside ``propertiesLength >
    0``: a missing value or ``dupInfo.split("_").length != 2`` returns -1; nothing is parsed. Java's split
    drops trailing empty strings ("a_b__" has 2 parts, "_b" 2, "a_" 1, "_" 0), so the value passes exactly
    when, without its trailing "_", it holds one "_" (:func:`storelib.scan.batchdecode` applies the same
    rule column-wise)."""
    if value is None:
        return "DUP_INFO missing (duplicationEnable)"
    if value.rstrip("_").count("_") != 1:
        return f"DUP_INFO {value!r} does not split into 2 parts on '_' (duplicationEnable)"
    return None


def _java_replace(exc: UnicodeError) -> tuple[str, int]:
    """One U+FFFD per malformed sequence as Java's UTF-8 decoder counts them.

    Python's "replace" already agrees (maximal subparts) except on ED A0..BF, a UTF-8-encoded
    surrogate: Python rejects the ED alone, Java decodes ED xx yy and replaces the surrogate as one
    (isMalformed3 does not look at ED's range), ED xx before a non-continuation byte as one
    (malformed3: 2 bytes) and ED xx at the end of the input as one (the loop breaks).
    """
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    b, i = exc.object, exc.start
    if b[i] == 0xED and i + 1 < len(b) and 0xA0 <= b[i + 1] <= 0xBF:
        return "\ufffd", i + 3 if i + 2 < len(b) and 0x80 <= b[i + 2] <= 0xBF else i + 2
    return "\ufffd", exc.end


JAVA_REPLACE = "rmqstore-java-replace"  # the codecs error handler: bytes.decode("utf-8", JAVA_REPLACE)
codecs.register_error(JAVA_REPLACE, _java_replace)


def java_string(data: bytes | bytearray | memoryview) -> str:
    """``new String(data, UTF_8)`` as the broker builds topics and properties: invalid bytes become
    U+FFFD exactly where and as often as Java puts them (see :func:`_java_replace`)."""
    return bytes(data).decode("utf-8", JAVA_REPLACE)


def split_keys(keys: str | None) -> list[str]:
    """KEYS tokens as the index uses them: split on a single space, empty tokens dropped."""
    if not keys:
        return []
    return [t for t in keys.split(" ") if t]
