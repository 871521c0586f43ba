"""The one way sizes and times are read from users: ``2GB``/``512k``/``1048576`` and ISO-8601 or epoch ms.

Every command option and data source option that takes a size or a time goes through here, so
``--disk-capacity 2GB`` works wherever ``gen --size 1GB`` does.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

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
