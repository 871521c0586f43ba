"""A consume queue as the broker loads it: ConsumeQueue.recover and the offsets it answers with.

:class:`LoadedQueue` is one queue's files (:class:`storelib.format.consumequeue.ConsumeQueue`) seen
through the broker's start-up rules: the recovery scan from the third-last file (store-algorithms
§8.2: where the queue ends, its maxPhysicOffset, the files deleted after the end), getMaxOffsetInQueue,
and getMinOffsetInQueue after correctMinOffset, 4.9.8's and 5.x's (§8.8). Readers of a store (info,
lookups, the audit, the data source) and the start-up replay all ask it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from storelib.errors import Finding
from storelib.fileio.bytesource import Location
from storelib.format.consumequeue import (
    CQ_UNIT_SIZE,
    ConsumeQueue,
    CQSegment,
    first_invalid,
    units_before_hole,
)
from storelib.format.javahash import jrem, wrap64


@dataclass(frozen=True)
class CQRecovery:
    """What ``ConsumeQueue.recover`` (store-algorithms §8.2) leaves in memory.

    ``end``: logical byte offset after the last valid unit; ``max_physic_offset``: end (phy + size)
    of that unit, -1 if none was scanned; ``segments``: the segments kept (later ones are deleted by
    the broker) with the bytes of each up to the end; ``wrote``: the write position of the last one
    (getLastMappedFile) as the broker holds it (:func:`write_position`; negative in a negative file).
    """

    end: int
    max_physic_offset: int
    segments: tuple[tuple[CQSegment, int], ...]
    wrote: int = 0


def write_position(base: int, end: int, S: int) -> int:
    """A kept file's write position after ConsumeQueue.recover ends the queue at ``end``: a file ending at or
    before it keeps the load's (the file size: MappedFileQueue.load, 4.9.8 :172, 5.3.3 :271); the one holding
    it gets ``(int) (end % S)`` from truncateDirtyFiles (4.9.8 MappedFileQueue.java:112-114, 5.3.3 :200-202),
    Java's remainder, which has the dividend's sign: in a negative file, unless ``end`` is its start, that is
    ``end - base - S`` (below 0). truncateDirtyLogicFiles sets it again from 0 (cqrecovery.QueueReplay.truncate)."""
    return S if base + S <= end else jrem(end, S)


def max_bytes_after_recover(bases: list[int], end: int, S: int) -> int:
    """getMaxOffset after ConsumeQueue.recover ended at ``end``: the last file of the mappedFiles list
    (``bases`` in load order; truncateDirtyFiles deleted those starting past ``end``) at its start plus its
    :func:`write_position` (4.9.8 MappedFileQueue.java:316-320, 5.3.3 :445-449). Where that position is
    negative, appendMessage's write fails inside its catch and only moves the position on (4.9.8
    MappedFile.java:244-256, 5.3.3 DefaultMappedFile :342-358): the units from there up to the file's start
    are never written (the writer's machine clips them: cqrecovery.QueueReplay.put)."""
    kept = [b for b in bases if b <= end]
    return kept[-1] + write_position(kept[-1], end, S) if kept else 0


def max_offset_after_recover(bases: list[int], end: int, S: int) -> int:
    """getMaxOffsetInQueue after recovery: :func:`max_bytes_after_recover` over 20, a Java long division."""
    n = max_bytes_after_recover(bases, end, S)
    return -(-n // CQ_UNIT_SIZE) if n < 0 else n // CQ_UNIT_SIZE


def first_unit_from(units: np.ndarray, base: int, commitlog_min_offset: int) -> int | None:
    """correctMinOffset 4.9.8's scan of the first segment (store-algorithms §8.8): the logical byte offset
    of the first unit whose phyOffset >= M, None when none is (fillers have phy 0, so they count only
    when M = 0, as in the broker). Shared by the reader and the start-up replay."""
    hit = np.flatnonzero(units["phy_offset"] >= int(commitlog_min_offset))
    return base + int(hit[0]) * CQ_UNIT_SIZE if len(hit) else None


def min_variant(version: str) -> str:
    """The :meth:`LoadedQueue.min_offset` variant of a broker line ("4" or "5"): 5.3.3's correctMinOffset (run
    at start-up, ConsumeQueueStore.recoverOffsetTable) sets a queue whose last unit is below the commitlog's
    min offset to its max; 4.9.8's leaves it at 0."""
    return "5.x" if version == "5" else "4.9.8"


class LoadedQueue(ConsumeQueue):
    """One ``consumequeue/<topic>/<queueId>`` directory as a started broker holds it (read-only)."""

    _recovery: CQRecovery | None = None

    def __init__(self, loc: Location | str | os.PathLike, **kw: Any) -> None:
        """:class:`ConsumeQueue`'s files (same arguments), and the negative files the broker never serves."""
        super().__init__(loc, **kw)
        segs = self.segments
        if any(s.base < segs[0].base for s in segs[1:]):  # negative files: doLoad maps them nearest 0 first
            end = self._recovery_end()[0]
            kept = [s for s in segs if s.base <= end]  # truncateDirtyFiles deletes the files that start past it
            for s in kept[1:]:
                if s.base < kept[0].base:
                    self.findings.append(_unserved(kept[0], s, self.segment_size))

    def _recovery_end(self) -> tuple[int, int]:
        """ConsumeQueue.recover's walk of :attr:`segments` (the load order) from the third-last (4.9.8
        ConsumeQueue.java:92-149): the logical byte offset after the last valid unit, and that unit's end (-1)."""
        S = self.segment_size
        segs = self.segments
        index = max(0, len(segs) - 3)
        max_phy = -1
        while True:
            seg = segs[index]
            units = self.read_units(seg)
            k = first_invalid(units[:units_before_hole(seg, len(units))])
            if k:
                last = units[k - 1]
                max_phy = wrap64(int(last["phy_offset"]) + int(last["size"]))
            pos = k * CQ_UNIT_SIZE
            if pos == S and index + 1 < len(segs):
                index += 1
                continue
            return seg.base + pos, max_phy

    def recover(self) -> CQRecovery:
        """ConsumeQueue.recover (store-algorithms §8.2): scan from the third-last segment.

        Units are valid while ``phyOffset >= 0 && size > 0``; the end is the position after the last
        valid unit. Segments after the end are the ones the broker would delete (reported).
        """
        if self._recovery is not None:
            return self._recovery
        S = self.segment_size
        segs = self.segments
        if not segs:
            self._recovery = CQRecovery(0, -1, ())
            return self._recovery
        end, max_phy = self._recovery_end()
        kept: list[tuple[CQSegment, int]] = []
        for s in segs:
            if s.base + S <= end:
                kept.append((s, S))
            elif end >= s.base:
                kept.append((s, end - s.base))
            else:
                self.findings.append(Finding("segment_after_end", "warning", s.path, 0,
                                             f"queue ends at logical byte {end}; the broker deletes this file "
                                             "on recovery"))
        self._recovery = CQRecovery(end, max_phy, tuple(kept), write_position(kept[-1][0].base, end, S))
        return self._recovery

    def max_offset(self, *, truncated: bool = True) -> int:
        """getMaxOffsetInQueue after recovery: one past the last valid unit (fillers count), as a start whose
        truncateDirtyLogicFiles runs leaves it (maxPhyOffsetOfConsumeQueue >= processOffset, CommitLog
        .recoverNormally 4.9.8 :259-263, 5.3.3 :400-404; recoverAbnormally :537-541, :809-813: it counts the
        last file's write position again from 0), what a store whose queues hold its last record gets, and
        what :meth:`min_offset` assumes too. ``truncated=False``: right after ConsumeQueue.recover
        (:func:`max_offset_after_recover`: the list's last file, a negative write position in a negative
        file), what a start without that truncation serves (the start-up replay's model)."""
        rec = self.recover()
        if truncated:
            return rec.end // CQ_UNIT_SIZE
        return max_offset_after_recover([s.base for s in self.segments], rec.end, self.segment_size)

    def max_physic_offset(self) -> int:
        """maxPhysicOffset after recovery: phy + size of the last valid unit scanned, -1 if none."""
        return self.recover().max_physic_offset

    def entries(self, start: int | None = None, end: int | None = None, *, chunk_entries: int = 65536,
                ) -> Iterator[tuple[int, np.ndarray]]:
        """:meth:`ConsumeQueue.entries`, ending by default where the broker's queue ends (``max_offset``)."""
        return super().entries(start, self.max_offset() if end is None else end, chunk_entries=chunk_entries)

    def min_offset(self, commitlog_min_offset: int, *, variant: str = "4.9.8",
                   previous_min_logic_offset: int = 0) -> int:
        """getMinOffsetInQueue after correctMinOffset (store-algorithms §8.8), as a logical offset.

        ``variant="4.9.8"``: first unit of the first segment's readable part with phyOffset ≥ M sets
        the min; none → the previous value stays. ``variant="5.x"``: keep when already ≥ max; all
        expired (last unit < M) → max; else reuse the previous value if still valid, or binary search
        the first segment. ``previous_min_logic_offset`` (bytes) is the in-memory value before the call
        (0 at broker start).
        """
        rec = self.recover()
        M = int(commitlog_min_offset)
        min_logic = int(previous_min_logic_offset)
        if not rec.segments:
            return min_logic // CQ_UNIT_SIZE
        first, first_read = rec.segments[0]
        if variant in ("4.9.8", "4"):
            units = self.read_units(first, 0, first_read // CQ_UNIT_SIZE)
            hit = first_unit_from(units, first.base, M)
            return (min_logic if hit is None else hit) // CQ_UNIT_SIZE
        if variant not in ("5.x", "5", "5.3.3"):
            raise ValueError(f"unknown variant {variant!r}")
        if min_logic >= rec.end:
            return min_logic // CQ_UNIT_SIZE
        last, last_read = rec.segments[-1]
        if last_read >= CQ_UNIT_SIZE:
            u = self.read_units(last, last_read // CQ_UNIT_SIZE - 1, 1)
            if len(u) and int(u["phy_offset"][0]) < M:
                return (last.base + last_read) // CQ_UNIT_SIZE
        return self._min_5x(first, first_read, min_logic, M)

    def _min_5x(self, first: CQSegment, first_read: int, min_logic: int, M: int) -> int:
        """5.x correctMinOffset over the first segment: the previous value if still valid, else the
        broker's binary search (its exact steps) for the first unit with phyOffset >= M."""
        start = min_logic - first.base
        intact = True
        if start < 0:
            intact, start = False, 0
        if start >= first_read:  # selectMappedBuffer(start) returns null (or "should have been deleted")
            return min_logic // CQ_UNIT_SIZE
        units = self.read_units(first, start // CQ_UNIT_SIZE, (first_read - start) // CQ_UNIT_SIZE)
        if len(units) == 0:
            return min_logic // CQ_UNIT_SIZE
        phy = units["phy_offset"]
        if intact and int(phy[0]) >= M:
            return min_logic // CQ_UNIT_SIZE
        low, high = 0, (len(units) - 1) * CQ_UNIT_SIZE
        while high - low > CQ_UNIT_SIZE:
            mid = (low + high) // 2 // CQ_UNIT_SIZE * CQ_UNIT_SIZE
            v = int(phy[mid // CQ_UNIT_SIZE])
            if v > M:
                high = mid
            elif v == M:
                low = high = mid
                break
            else:
                low = mid
        for i in range(low, high + 1, CQ_UNIT_SIZE):
            if int(phy[i // CQ_UNIT_SIZE]) >= M:
                min_logic = first.base + start + i
                break
        return min_logic // CQ_UNIT_SIZE


def _unserved(first: CQSegment, seg: CQSegment, S: int) -> Finding:
    """A negative file below the first one the broker maps (after recovery): findMappedFileByOffset looks only
    from that file's start to the last one's end (4.9.8 MappedFileQueue.java:476-518, 5.3.3 :671-713: "Offset
    not matched" below it) and correctMinOffset reads that first file, so no unit of ``seg`` is ever served."""
    lo = seg.base // CQ_UNIT_SIZE
    return Finding("negative_file_unreachable", "error", seg.path, None,
                   f"the broker maps {first.name} first (doLoad sorts by name: negative files nearest zero first) "
                   f"and finds no file below its start {first.base} (findMappedFileByOffset: \"Offset not "
                   f"matched\"; correctMinOffset reads that file): it never serves this file's units (queue "
                   f"offsets {lo}..{lo + S // CQ_UNIT_SIZE - 1})", {"first_mapped": first.base, "base": seg.base})
