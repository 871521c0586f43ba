"""Lost messages: every record a simulated broker start-up (:func:`storelib.broker.startup.startup.simulate`) drops,
found by scanning its lost ranges and resynchronising over corrupt regions (:mod:`storelib.broker.recovery.resync`);
the recover plan's ``lost`` section, the audit's damage cost and the salvage export all read them from here.
"""

from __future__ import annotations

import contextlib

import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.recovery.resync import find_next_record, lost_region
from storelib.broker.startup.startup import Simulation
from storelib.fileio.bytesource import LocalSource
from storelib.scan.commitlog import Segment, offset_to_file_name
from storelib.scan.scanner import SegmentScan

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


def lost_table(sim: Simulation, with_body: bool) -> tuple[pa.Table | None, list[dict]]:
    """Every record in the simulation's lost ranges (with a ``why`` column; None when there is none) and the
    byte ranges nothing can be read from (corrupt regions, and records whose body CRC fails), by offset."""
    batches: list[pa.Table] = []
    regions: list[dict] = []
    delay = list(sim.store.settings.delay_levels_ms)
    for seg, start, why, *end in sim.lost_ranges:
        if seg.file_size:
            _scan_from(seg, start, why, with_body=with_body, delay_levels=delay, batches=batches, regions=regions,
                       end=end[0] if end else None)
    table = pa.concat_tables(batches) if batches else None
    if table is not None:
        bad = table.filter(pc.equal(table.column("crc_ok"), False))
        for ph, sz, why in zip(bad.column("phy_offset").to_pylist(), bad.column("size").to_pylist(),
                               bad.column("why").to_pylist()):
            seg_base = ph - ph % sim.store.commitlog.segment_size
            regions.append({"file": "commitlog/" + offset_to_file_name(seg_base), "start": ph - seg_base,
                            "end": ph - seg_base + sz, "phy_start": ph, "bytes_lost": sz, "reason": "crc_mismatch",
                            "detail": "body CRC does not match: record not salvaged", "resumed": "message",
                            "why": why})
    regions.sort(key=lambda r: r["phy_start"])
    return table, regions


def scan_lost(sim: Simulation, *, with_body: bool = False) -> dict:
    """The plan's ``lost`` section: every record a start-up drops, corrupt byte ranges, totals."""
    table, regions = lost_table(sim, with_body)
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

