"""What one simulated broker start-up computes (jobs.recover.simulate), read by the plan document, the
lost-message scan, salvage and apply."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from storelib.broker.cqrecovery import QueueReplay
from storelib.broker.indexbuild import IndexImage
from storelib.broker.recovery import RecoveryResult
from storelib.broker.timerrecovery import TimerRecovery
from storelib.scan.commitlog import Segment


@dataclass
class Simulation:
    """Everything a start-up would do to one store, computed read-only."""

    store: Any
    version: str
    plan: dict
    walk: RecoveryResult
    queues: dict[tuple[str, int], QueueReplay]
    index_delete: list[str]
    index_images: list[IndexImage]
    checkpoint_bytes: bytes | None
    commitlog_zero_from: tuple[str, int] | None
    commitlog_delete: list[str]
    lost_ranges: list[tuple[Segment, int, str]]  # (segment, file offset, why) where lost data starts
    timer: TimerRecovery | None = None  # the 5.x timer store's start-up (storelib.broker.timerrecovery)
