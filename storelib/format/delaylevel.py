"""``messageDelayLevel``: the broker's delay-level table, as text and as milliseconds per level (what
SCHEDULE_TOPIC_XXXX records' delivery times and queue ids are computed from)."""

from __future__ import annotations

import re

from storelib.errors import StoreError

DEFAULT_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DELAY_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str, *, file: str | None = None, line: int | None = None) -> tuple[int, ...]:
    """``messageDelayLevel`` ("1s 5s ... 2h") to milliseconds, one entry per level.

    Split on single spaces like Java's ``split(" ")`` (trailing empties dropped); every token is a
    decimal count followed by one unit of s/m/h/d. The broker refuses to start on a bad table; here
    that is a StoreError.
    """
    parts = text.split(" ")
    while parts and parts[-1] == "":
        parts.pop()
    out: list[int] = []
    for i, tok in enumerate(parts, 1):
        unit = DELAY_UNITS_MS.get(tok[-1:]) if tok else None
        num = tok[:-1]
        if unit is None or not re.fullmatch(r"[+-]?[0-9]+", num):
            at = f"line {line}: " if line else ""
            raise StoreError(
                file, None, "bad_config", f"{at}messageDelayLevel level {i} {tok!r} is not <number><s|m|h|d>"
            )
        out.append(int(num) * unit)
    return tuple(out)


DEFAULT_DELAY_LEVELS_MS: tuple[int, ...] = parse_delay_levels(DEFAULT_DELAY_LEVEL)  # the one default table
