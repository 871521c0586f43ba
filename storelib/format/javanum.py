"""Java integer arithmetic where the broker's numbers live in it: longs wrap, ``%`` keeps the sign.

Python ints neither overflow nor round remainders toward zero; a rule that computes with a value read
from a damaged file (a checkpoint time with its sign bit flipped, an offset near the long range) must
do what the JVM does with it, or it picks a different file than the broker.
"""

from __future__ import annotations

I64_MIN = -(2**63)


def wrap64(x: int) -> int:
    """``x`` as a Java long: two's complement wrap-around at 64 bits."""
    return ((x - I64_MIN) % 2**64) + I64_MIN


def jrem(a: int, b: int) -> int:
    """Java ``a % b``: the remainder takes the sign of the dividend."""
    r = abs(a) % abs(b)
    return -r if a < 0 else r
