"""Lost messages: every record a simulated broker start-up (:func:`storelib.broker.startup.startup.simulate`) drops,
found by scanning its lost ranges and resynchronising over corrupt regions (:mod:`storelib.broker.recovery.resync`);
the recover plan's ``lost`` section, the audit's damage cost and the salvage export all read them from here.

In a DLedger-mode store the lost ranges are entries: scanned entry by entry up to the next range (a range
ends where the next one in the same file begins), an entry that breaks the ledger's order is read on its
own, and a damaged entry is skipped to the next verified entry start (:func:`storelib.scan.splits.find_entry_start`).
``uncommitted_ranges`` adds, for the salvage, the entries past the committed index.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.recovery.resync import find_next_record, lost_region
from storelib.broker.startup.startup import Simulation
from storelib.errors import Finding
from storelib.fileio.bytesource import LocalSource
from storelib.format.record import OOM_KIND
from storelib.scan.commitlog import Segment, offset_to_file_name
from storelib.scan.scanner import SegmentScan
from storelib.scan.splits import find_entry_start

LOST_COLUMNS = ["phy_offset", "size", "topic", "queue_id", "queue_offset", "keys", "uniq_key", "tags",
                "store_timestamp", "crc_ok"]


def _scan_from(seg: Segment, start: int, why: str, *, with_body: bool, delay_levels: list[int],
               batches: list[pa.Table], regions: list[dict], end: int | None = None) -> None:
    """Every structurally valid record from ``start`` to the segment's end (records starting before ``end``
    when given), resynchronising after each corrupt region (records with a bad body CRC are kept, flagged
    ``crc_ok=false``)."""
    src = seg.open()
    try:
        view = src.view() if isinstance(src, LocalSource) else memoryview(bytes(src.read(0, src.size)))
        n = len(view) if end is None else min(len(view), end)
        pos = start
        while pos < n:
            scan = SegmentScan(src, seg.display, seg.base, pos, end, verify_crc=True, stop_on_crc=False,
                               with_body=with_body, with_properties=True, delay_levels_ms=delay_levels)
            for b in scan:
                if b.num_rows:
                    batches.append(pa.Table.from_batches([b]).append_column("why", pa.array([why] * b.num_rows)))
            e = scan.end
            assert e is not None
            if e.kind in ("segment_end", "split_end", "blank"):
                return
            if e.kind == "end_of_data":
                r = find_next_record(view, e.file_offset, base=seg.base)
                if r.kind == "message":
                    regions.append({"file": seg.display, "start": e.file_offset, "end": r.pos,
                                    "phy_start": seg.base + e.file_offset, "bytes_lost": r.pos - e.file_offset,
                                    "reason": "zeroed", "detail": "zeros inside the data", "resumed": "message",
                                    "why": why})
                    pos = r.pos
                    continue
                return
            region, r = lost_region(view, seg.display, seg.base, e.file_offset, e.reason or "invalid", e.detail or "")
            d = region.to_dict()
            d["why"] = why
            regions.append(d)
            if r.kind != "message":
                return
            pos = r.pos
    finally:
        with contextlib.suppress(Exception):
            del view
        src.close()


def _scan_entries(seg: Segment, start: int, stop: int, why: str, *, with_body: bool, delay_levels: list[int],
                  committed: int | None, batches: list[pa.Table], regions: list[dict]) -> None:
    """:func:`_scan_from` for a DLedger data file: every entry starting in ``[start, stop)`` whose record is
    well formed, resynchronising on entry starts."""
    with seg.open() as src:
        pos = start
        while pos < stop:
            scan = SegmentScan(src, seg.display, seg.base, pos, stop, verify_crc=True, stop_on_crc=False,
                               with_body=with_body, with_properties=True, delay_levels_ms=delay_levels,
                               dledger=True, committed_index=committed)
            for b in scan:
                if b.num_rows:
                    batches.append(pa.Table.from_batches([b]).append_column("why", pa.array([why] * b.num_rows)))
            e = scan.end
            assert e is not None
            if e.kind != "invalid" or e.file_offset >= stop:
                return
            if e.reason == "bad_entry" and e.file_offset > pos:  # read the entry again as the first of a run
                pos = e.file_offset
                continue
            nxt = find_entry_start(src, seg.base, e.file_offset + 1, stop)
            end = stop if nxt is None else nxt
            regions.append({"file": seg.display, "start": e.file_offset, "end": end,
                            "phy_start": seg.base + e.file_offset, "bytes_lost": end - e.file_offset,
                            "reason": e.reason or "invalid", "detail": e.detail or "",
                            "resumed": "none" if nxt is None else "entry", "why": why})
            if nxt is None:
                return
            pos = nxt


def uncommitted_ranges(sim: Simulation) -> list[tuple[Segment, int, str]]:
    """The entries past DLedger's committed index (after load) up to the ledger's end, as ranges (DLedger keeps
    them; a rejoin to a leader without them truncates them)."""
    dl = sim.walk.dledger
    if dl is None or dl.committed_index >= dl.ledger_end_index:
        return []
    frm = max(dl.committed_pos, dl.min_offset)
    S = sim.store.commitlog.segment_size
    return [(s, max(0, frm - s.base), "uncommitted") for s in sim.store.commitlog.segments
            if s.base + S > frm and s.base < dl.last_entry_end]


@dataclass(frozen=True)
class LostScan:
    """One lost range to scan, as a task any engine can run (picklable): a default store's records from
    ``start`` (to ``end``), or a DLedger data file's entries in ``[start, end)``."""

    seg: Segment
    start: int
    why: str
    end: int | None
    with_body: bool
    delay_levels: tuple[int, ...]
    dledger: bool = False
    committed: int | None = None


def lost_scan_task(job: LostScan) -> tuple[pa.Table | None, list[dict]]:
    """The records of one lost range (with their ``why``) and its unreadable regions: a task, so the audit's
    damage price reads no record in the driver."""
    batches: list[pa.Table] = []
    regions: list[dict] = []
    if job.dledger:
        assert job.end is not None
        _scan_entries(job.seg, job.start, job.end, job.why, with_body=job.with_body,
                      delay_levels=list(job.delay_levels), committed=job.committed, batches=batches, regions=regions)
    else:
        _scan_from(job.seg, job.start, job.why, with_body=job.with_body, delay_levels=list(job.delay_levels),
                   batches=batches, regions=regions, end=job.end)
    return (pa.concat_tables(batches) if batches else None), regions


def _serial_map(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    return [fn(x) for x in items]


TaskMap = Callable[[Callable[[Any], Any], list[Any]], list[Any]]  # (task function, items) -> results, in order


def lost_scans(sim: Simulation, with_body: bool, *, uncommitted: bool = False) -> list[LostScan]:
    """The simulation's lost ranges (and with ``uncommitted`` a DLedger store's uncommitted entries) as scans;
    in a DLedger data file a range ends where the next one in the same file begins."""
    delay = tuple(sim.store.settings.delay_levels_ms)
    ranges = list(sim.lost_ranges) + (uncommitted_ranges(sim) if uncommitted else [])
    dl = sim.walk.dledger
    out: list[LostScan] = []
    for seg, start, why, *end in ranges:
        if not seg.file_size:
            continue
        if dl is None:
            out.append(LostScan(seg, start, why, end[0] if end else None, with_body, delay))
            continue
        later = [a for s2, a, *_ in ranges if s2.base == seg.base and a > start]
        stop = min(later + [seg.file_size, dl.last_entry_end - seg.base if why == "uncommitted" else seg.file_size])
        out.append(LostScan(seg, start, why, stop, with_body, delay, True, dl.committed_index))
    return out


def lost_table(sim: Simulation, with_body: bool, *, uncommitted: bool = False, run: TaskMap = _serial_map
               ) -> tuple[pa.Table | None, list[dict]]:
    """Every record in the simulation's lost ranges (with a ``why`` column; None when there is none) and the
    byte ranges nothing can be read from (corrupt regions, and records whose body CRC fails), by offset.
    ``uncommitted``: a DLedger store's uncommitted entries too. ``run``: where the ranges' scans run (a
    task per range; default: here, in order)."""
    batches: list[pa.Table] = []
    regions: list[dict] = []
    for t, r in run(lost_scan_task, lost_scans(sim, with_body, uncommitted=uncommitted)):
        if t is not None:
            batches.append(t)
        regions += r
    table = pa.concat_tables(batches) if batches else None
    if table is not None:
        bad = table.filter(pc.equal(table.column("crc_ok"), False))
        for ph, sz, why in zip(bad.column("phy_offset").to_pylist(), bad.column("size").to_pylist(),
                               bad.column("why").to_pylist()):
            seg_base = ph - ph % sim.store.commitlog.segment_size
            regions.append({"file": f"{sim.commitlog_folder}/" + offset_to_file_name(seg_base), "start": ph - seg_base,
                            "end": ph - seg_base + sz, "phy_start": ph, "bytes_lost": sz, "reason": "crc_mismatch",
                            "detail": "body CRC does not match: record not salvaged", "resumed": "message",
                            "why": why})
    regions.sort(key=lambda r: r["phy_start"])
    return table, regions


def scan_lost(sim: Simulation, *, with_body: bool = False, run: TaskMap = _serial_map) -> dict:
    """The plan's ``lost`` section: every record a start-up drops, corrupt byte ranges, totals (``run``: where
    the ranges' scans run, see :func:`lost_table`)."""
    table, regions = lost_table(sim, with_body, run=run)
    msgs: list[dict] = []
    if table is not None:
        t = table.select(LOST_COLUMNS + ["why"])
        msgs = [dict(r, intact=bool(r.pop("crc_ok"))) for r in t.to_pylist()]
    intact = [m for m in msgs if m["intact"]]
    by_topic: dict[str, int] = {}
    for m in msgs:
        by_topic[m["topic"]] = by_topic.get(m["topic"], 0) + 1
    return {
        "messages": msgs,
        "ranges": regions,
        "totals": {"messages": len(msgs), "intact": len(intact), "corrupt": len(msgs) - len(intact),
                   "bytes": sum(m["size"] for m in msgs), "bytes_unreadable": sum(r["bytes_lost"] for r in regions),
                   "by_topic": dict(sorted(by_topic.items()))},
    }


def truncation_failures(sim: Simulation) -> list[Finding]:
    """``sim``'s load failures when a truncation of the log ends all of them (else empty): a record whose
    check throws OutOfMemoryError is the only one it ends (its bytes go with the cut; stray entries and files
    of the wrong length stay)."""
    fails = sim.load_failures
    oom = [f for f in fails if f.kind == OOM_KIND]
    return oom if oom and len(oom) == len(fails) else []
