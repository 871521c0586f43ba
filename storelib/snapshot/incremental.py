"""What an export run writes: the segments new or changed since the snapshot's manifest (a grown last
segment from where it ended), the previous snapshot's files it keeps or drops, and the manifest's
segment entries, with what was skipped and why. A snapshot of another store is refused."""

from __future__ import annotations

from typing import Any

from storelib.broker.recovery.walk import WalkPlan
from storelib.broker.settings.livecut import StoreCut
from storelib.broker.settings.store import Store
from storelib.errors import StoreError
from storelib.fileio.bytesource import Location
from storelib.scan.commitlog import Segment
from storelib.scan.fingerprint import fingerprint, prefix_unchanged
from storelib.scan.scanner import FULL_KINDS, SegmentEnd
from storelib.snapshot.directory import MANIFEST


def _prefix_same(seg: Segment, entry: dict[str, Any]) -> bool:
    """Are the bytes the snapshot holds of this segment unchanged (head and the bytes before its end)?"""
    try:
        return prefix_unchanged(seg, entry.get("fingerprint") or {}, int(entry["end"]["file_offset"]))
    except (StoreError, OSError, KeyError):
        return False


def same_store(store: Store, prev: dict[str, Any], out: Location) -> None:
    """Refuse a snapshot of another store: a segment both hold must have the bytes the manifest saw."""
    segs = {s.name: s for s in store.commitlog.segments}
    shared = [n for n in prev["segments"] if n in segs]
    if shared and any(_prefix_same(segs[n], prev["segments"][n]) for n in shared):
        return
    why = ("its segments hold other bytes" if shared else "none of its segments is in this store")
    raise StoreError(out.join(MANIFEST).path, None, "other_store",
                     f"the snapshot there was exported from {prev.get('store')!r} and {why}: export into a new "
                     "directory")


def export_items(plan: WalkPlan, prev: dict[str, Any], cut: StoreCut | None = None
                 ) -> tuple[list[tuple], dict[int, dict[str, Any]]]:
    """Tasks to run and segments carried whole from the previous manifest (by plan index). On a live store
    (``cut``) each task stops at the cut (a segment past it has nothing for this run; the one being written
    is exported to the cut and the next run goes on from there)."""
    items: list[tuple] = []
    carried: dict[int, dict[str, Any]] = {}
    for t in plan.tasks:
        seg = plan.segments[t.index]
        uri = seg.loc.path if seg.loc.local else f"{seg.loc.fs.type_name}://{seg.loc.path}"
        stop = cut.limit(seg.base, seg.file_size) if cut is not None else None
        p = prev.get(seg.name)
        if p and p["base"] == seg.base and (p["crc"] or not t.crc) and _prefix_same(seg, p):
            if p["end"]["kind"] in FULL_KINDS:
                carried[t.index] = p
                continue
            items.append((t.index, seg.name, seg.base, uri, seg.file_size, int(p["end"]["file_offset"]), t.crc, stop))
        else:
            items.append((t.index, seg.name, seg.base, uri, seg.file_size, t.start, t.crc, stop))
    return items, carried


END_FIELDS = ("kind", "file", "file_offset", "phy_offset", "reason", "detail", "size")


def _end(e: SegmentEnd) -> dict[str, Any]:
    """A segment's scan end as the manifest keeps it (where and why, not the counters of one scan; a DLedger
    data file's facts too: the next run's walk carries them, the ledger's begin read from the first file's)."""
    d = {k: getattr(e, k) for k in END_FIELDS}
    facts = getattr(e, "facts", None)
    if facts is not None:
        d["dledger_facts"] = facts.to_dict()
    return d


def manifest_content(segs: dict[str, Any]) -> dict[str, Any]:
    """What a manifest's segments say about the data (not the file times in their fingerprints)."""
    return {n: {**{k: v for k, v in e.items() if k != "fingerprint"},
                "fingerprint": {k: v for k, v in e["fingerprint"].items() if k != "mtime_ms"}}
            for n, e in segs.items()}


def segment_entries(plan: WalkPlan, prev: dict[str, Any] | None, prev_segs: dict[str, Any], carried: dict[int, Any],
                     done: dict[int, Any], ends: dict[int, SegmentEnd], P: int, store_segs: list,
                     cut: StoreCut | None = None) -> tuple[dict[str, Any], list[str], list[str], list[dict[str, Any]]]:
    """The manifest's segments (kept, new or extended files), the staged files to move in, the previous
    snapshot's files to drop, and what was skipped (past processOffset, an invalid tail, unsafe topics).

    Segments the snapshot holds that the store no longer does, before its first segment, were expired by
    the broker's cleaner: the snapshot keeps them (an archive keeps what the broker expired)."""
    live_end = cut.commitlog_end if cut is not None and cut.live else None
    manifest_segs: dict[str, Any] = expired_entries(prev, store_segs)
    moves: list[str] = []
    drop: list[str] = []  # files of the previous snapshot this one no longer holds
    skipped: list[dict[str, Any]] = []
    skipped_topics: dict[str, int] = {}
    for t in plan.tasks:
        seg = plan.segments[t.index]
        old = prev_segs.get(seg.name) or ((prev or {}).get("segments", {}).get(seg.name))
        r = done.get(t.index)
        new_files = r["files"] if r else []
        if live_end is not None and seg.base >= P and seg.base >= live_end:
            continue  # written after this run's cut (or not at all yet): the next run exports it
        if seg.base >= P:
            skipped.append({"segment": seg.name, "from": seg.base, "to": seg.base + seg.file_size,
                            "why": f"past the recovery end (processOffset {P}): a broker start-up drops it"})
            drop += [f["path"] for f in (old or {}).get("files", [])]
            continue
        for k, v in (r or {}).get("skipped_topics", {}).items():
            skipped_topics[k] = skipped_topics.get(k, 0) + v
        end = ends[t.index]
        if seg.base + end.file_offset > P:
            raise StoreError("commitlog/" + seg.name, end.file_offset, "internal", "export range past processOffset")
        keep = carried.get(t.index) or (old if r is not None and r["start"] != t.start else None)
        if keep is None and old is not None:
            drop += [f["path"] for f in old.get("files", [])]
        files = (keep or {}).get("files", []) + new_files
        moves += [f["path"] for f in new_files]
        manifest_segs[seg.name] = {
            "base": seg.base, "crc": bool(t.crc), "start": (keep or {}).get("start", t.start), "end": _end(end),
            "rows": (keep or {}).get("rows", 0) + (r["rows"] if r else 0), "files": files,
            "fingerprint": keep["fingerprint"] if keep is not None and r is None else fingerprint(seg, end.file_offset)}
        if end.kind == "invalid":
            skipped.append({"segment": seg.name, "from": seg.base + end.file_offset, "to": seg.base + seg.file_size,
                            "why": f"{end.reason}: {end.detail} (the walk stops here; the rest of the segment is "
                                   "not a start-up's)"})
    for n, old in ((prev or {}).get("segments", {})).items():
        if n not in {s.name for s in store_segs} and n not in manifest_segs:
            drop += [f["path"] for f in old.get("files", [])]
    if skipped_topics:
        skipped.append({"topics": skipped_topics, "why": "topic names that cannot be one directory entry"})
    return manifest_segs, moves, drop, skipped


def expired_entries(prev: dict[str, Any] | None, store_segs: list) -> dict[str, Any]:
    """The previous snapshot's segments below the store's first one (the cleaner deleted them), kept."""
    if not store_segs:
        return {}
    first = min(s.base for s in store_segs)
    return {n: {**e, "expired": True} for n, e in sorted(((prev or {}).get("segments", {})).items(),
                                                           key=lambda kv: kv[1]["base"]) if e["base"] < first}


__all__ = ["END_FIELDS", "export_items", "manifest_content", "same_store", "segment_entries"]
