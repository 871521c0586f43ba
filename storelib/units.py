"""The one way sizes, times and time zones are read from users: ``2GB``/``512k``/``1048576``, ISO-8601 or
epoch ms, and ``UTC``/``+08:00``/``Asia/Shanghai``/``local``.

Every command option and data source option that takes a size, a time or a zone goes through here, so
``--disk-capacity 2GB`` works wherever ``gen --size 1GB`` does, and ``rebuild --tz`` reads what
``expiry --tz`` reads.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta, timezone, tzinfo

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)


def parse_size(text: str | int | float) -> int:
    """Bytes from ``1GB``, ``256MB``, ``512k``, ``1.5TB`` or ``1048576`` (binary units); ValueError otherwise."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"not a size: {text!r} (negative)")
        return int(text)
    m = _SIZE.fullmatch(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 256MB, 2GB, 1048576)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_time_ms(text: str | int | datetime) -> int:
    """Epoch milliseconds from an integer, a datetime, or ISO-8601 text (``Z``/offset; naive means UTC)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    if isinstance(text, datetime):
        dt = text
    else:
        t = str(text).strip()
        if re.fullmatch(r"-?\d+", t):
            return int(t)
        try:
            dt = datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValueError(f"not an ISO-8601 time or epoch milliseconds: {text!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return (dt - _EPOCH) // _MS


_UTC_NAMES = {"z", "utc", "gmt", "ut", "zulu", "etc/utc", "etc/gmt", "etc/uct", "uct", "universal"}
_OFFSET = re.compile(r"(?:utc|gmt|ut)?\s*([+-])(\d{1,2})(?::?(\d{2}))?", re.IGNORECASE)
LOCAL = "local"


def parse_zone(tz: str | tzinfo) -> tzinfo:
    """A time zone as users and JVMs name it: ``Z``/``UTC``/``GMT``, an offset (``+08:00``, ``-0500``,
    ``GMT+8``, ``UTC-05:30``), an IANA name (``Asia/Shanghai``, with its DST rules), or ``local``: the
    zone a JVM started on this host uses by default (:func:`local_zone`). ValueError otherwise."""
    if isinstance(tz, tzinfo):
        return tz
    t = str(tz).strip()
    if t.lower() == LOCAL:
        return local_zone()
    if t.lower() in _UTC_NAMES:
        return timezone.utc
    m = _OFFSET.fullmatch(t)
    if m:
        hours, minutes = int(m.group(2)), int(m.group(3) or 0)
        if hours > 18 or minutes > 59:
            raise ValueError(f"not a time zone offset: {tz!r} (at most 18 hours)")
        off = timedelta(hours=hours, minutes=minutes)
        return timezone(-off if m.group(1) == "-" else off) if off else timezone.utc
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(t)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"not a time zone: {tz!r} (use e.g. UTC, +08:00, Asia/Shanghai or local)") from None


def zone_name(zone: tzinfo) -> str:
    """How a zone is written back (manifests, reports): its IANA key, ``UTC`` or ``UTC+08:00``."""
    key = getattr(zone, "key", None)
    if key and key != "localtime":
        return key
    if zone is timezone.utc:
        return "UTC"
    if isinstance(zone, timezone):
        return str(zone)
    return "this host's /etc/localtime"


def local_zone() -> tzinfo:
    """The zone a JVM on this host defaults to (TimeZone.getDefault; Linux: ``$TZ``, then /etc/timezone,
    then the zoneinfo file /etc/localtime links to or is), UTC when none says. The broker names index
    files and fires deleteWhen in it."""
    from zoneinfo import ZoneInfo

    env = os.environ.get("TZ", "").strip().lstrip(":")
    if env:
        name = env.split("zoneinfo/", 1)[1] if "zoneinfo/" in env else env
        if name.lower() != LOCAL:
            try:
                return parse_zone(name)
            except ValueError:
                pass
    try:
        with open("/etc/timezone") as f:
            return parse_zone(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        pass
    link = "/etc/localtime"
    real = os.path.realpath(link)
    if "zoneinfo/" in real:
        try:
            return ZoneInfo(real.split("zoneinfo/", 1)[1])
        except (ValueError, OSError):
            pass
    try:
        with open(link, "rb") as f:
            return ZoneInfo.from_file(f, key="localtime")
    except (OSError, ValueError):
        return timezone.utc
