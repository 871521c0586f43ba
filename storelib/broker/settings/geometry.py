"""The store's geometry as its own files show it, for a store copied without its broker.conf.

A broker maps every ConsumeQueue, IndexFile and timerlog file at its configured size, so the files
carry the settings that wrote them: the CQ file size (``mappedFileSizeConsumeQueue``) and the timerlog
file size (``mappedFileSizeTimerLog``) are the size their files share; the index geometry
(``maxHashSlotNum``/``maxIndexNum``) is the one pair that puts the header's last entry (its
``endPhyOffset`` and time) where the slot table says entry ``indexCount - 1`` is. broker.conf and
``--set`` still win: :func:`storelib.broker.settings.store.load_settings` applies what is inferred only where they are
silent, and reports a disagreement as one finding.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow.fs as pafs

from storelib.errors import Finding
from storelib.fileio.bytesource import Location
from storelib.format.consumequeue import CQ_UNIT_SIZE
from storelib.format.indexfile import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE, IndexHeader

_NAME20 = re.compile(r"^[0-9]{20}$")
_INDEX_NAME = re.compile(r"^[0-9]{17}$")
MAX_QUEUES_LOOKED_AT = 256  # enough files to see the shared size; bounded on stores with 100k queues
MAX_INDEX_FILES_TRIED = 8
CHECKED_ENTRIES = 4096  # entries whose slot chain confirms a candidate geometry


@dataclass(frozen=True)
class Inferred:
    """One setting read off the files: the broker.conf key, its value, and the evidence."""

    key: str
    value: int
    file: str
    evidence: str


def infer_geometry(root: Location) -> list[Inferred]:
    """Every geometry setting the files show (empty where they show nothing, e.g. no CQ files)."""
    out: list[Inferred] = []
    for fn in (_cq_file_size, _index_geometry, _timerlog_file_size):
        try:
            out.extend(fn(root))
        except OSError:
            continue  # unreadable: nothing to infer; the readers report the file themselves
    return out


def _files(loc: Location) -> list[pafs.FileInfo]:
    try:
        return list(loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True)))
    except OSError:
        return []


def _shared_size(infos: list[pafs.FileInfo]) -> tuple[int, int] | None:
    """(size, how many files have it) of the most common non-zero size among segment files."""
    sizes = Counter(int(i.size or 0) for i in infos
                    if i.type == pafs.FileType.File and _NAME20.match(i.base_name) and (i.size or 0) > 0)
    if not sizes:
        return None
    return sizes.most_common(1)[0]


def _cq_file_size(root: Location) -> list[Inferred]:
    """The size ConsumeQueue files share (the broker preallocates each at the configured size)."""
    cq = root.join("consumequeue")
    files: list[pafs.FileInfo] = []
    queues = 0
    for topic in sorted(_files(cq), key=lambda i: i.base_name):
        if topic.type != pafs.FileType.Directory:
            continue
        for q in _files(cq.join(topic.base_name)):
            if q.type == pafs.FileType.Directory and queues < MAX_QUEUES_LOOKED_AT:
                files.extend(_files(cq.join(topic.base_name, q.base_name)))
                queues += 1
        if queues >= MAX_QUEUES_LOOKED_AT:
            break
    shared = _shared_size(files)
    if shared is None or shared[0] % CQ_UNIT_SIZE:
        return []
    size, n = shared
    return [Inferred("mappedFileSizeConsumeQueue", size, "consumequeue",
                     f"{n} of {len(files)} ConsumeQueue files in {queues} queue(s) are {size} bytes")]


def _timerlog_file_size(root: Location) -> list[Inferred]:
    """The size timerlog files share (5.x timer store, a mapped-file queue like the commitlog)."""
    files = _files(root.join("timerlog"))
    shared = _shared_size(files)
    if shared is None:
        return []
    size, n = shared
    return [Inferred("mappedFileSizeTimerLog", size, "timerlog", f"{n} timerlog file(s) are {size} bytes")]


def _index_geometry(root: Location) -> list[Inferred]:
    """hashSlotNum/indexNum from the first local index files whose last entry pins them down."""
    idx = root.join("index")
    if not root.local:
        return []  # the search reads the whole file: not over a remote filesystem
    names = sorted((i for i in _files(idx) if i.type == pafs.FileType.File and _INDEX_NAME.match(i.base_name)
                    and (i.size or 0) > HEADER_SIZE), key=lambda i: i.base_name, reverse=True)
    for info in names[:MAX_INDEX_FILES_TRIED]:
        with open(info.path, "rb") as fh:
            size = int(info.size or 0)
            with mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as mm:
                found = index_geometry_of(mm, size)
        if found is not None:
            slots, num = found
            rel = f"index/{info.base_name}"
            ev = (f"{rel}: {size} bytes and its last entry (endPhyOffset) sits where the slot table points "
                  f"with {slots} slots")
            return [Inferred("maxHashSlotNum", slots, rel, ev), Inferred("maxIndexNum", num, rel, ev)]
    return []


def index_geometry_of(buf: mmap.mmap | bytes, size: int) -> tuple[int, int] | None:
    """(hashSlotNum, indexNum) of one index file, or None when its entries cannot tell.

    The last entry (index ``indexCount - 1``) holds the header's endPhyOffset and its time offset; where
    it is found fixes the slot-table length, which the slot of its hash (and the slot chains of up to
    :data:`CHECKED_ENTRIES` earlier entries) must confirm, and the file size must fit exactly.
    """
    h = IndexHeader.from_bytes(buf[:HEADER_SIZE])
    last = h.index_count - 1
    if last < 1 or h.end_phy_offset < 0:
        return None
    diff = 0 if h.begin_timestamp <= 0 else max(0, min((h.end_timestamp - h.begin_timestamp) // 1000, 2**31 - 1))
    pattern = struct.pack(">qi", h.end_phy_offset, diff)
    # the usual geometries first (the broker's default slot count, and indexNum = 4 x slots as the
    # defaults have it): one probe each instead of a search through hundreds of MB of mostly-empty file
    for slots in dict.fromkeys(c for c in (5_000_000, (size - HEADER_SIZE) // (SLOT_SIZE + 4 * ENTRY_SIZE)) if c > 0):
        rest = size - HEADER_SIZE - SLOT_SIZE * slots
        at = HEADER_SIZE + SLOT_SIZE * slots + ENTRY_SIZE * last + 4
        if (rest > 0 and rest % ENTRY_SIZE == 0 and rest // ENTRY_SIZE >= h.index_count and at + len(pattern) <= size
                and bytes(buf[at:at + len(pattern)]) == pattern and _slot_chains_agree(buf, slots, last)):
            return slots, rest // ENTRY_SIZE
    hi = size
    while True:
        at = buf.rfind(pattern, HEADER_SIZE, hi)
        if at < 0:
            return None
        entry = at - 4
        hi = at + len(pattern) - 1
        slots4 = entry - HEADER_SIZE - ENTRY_SIZE * last
        if slots4 <= 0 or slots4 % SLOT_SIZE:
            continue
        slots = slots4 // SLOT_SIZE
        rest = size - HEADER_SIZE - slots4
        if rest % ENTRY_SIZE or rest // ENTRY_SIZE < h.index_count:
            continue
        if _slot_chains_agree(buf, slots, last):
            return slots, rest // ENTRY_SIZE


def _slot_chains_agree(buf: mmap.mmap | bytes, slots: int, last: int) -> bool:
    """Each checked entry's slot points at it or at a later entry; the last entry's slot points at it."""
    first = max(1, last - CHECKED_ENTRIES + 1)
    base = HEADER_SIZE + SLOT_SIZE * slots
    raw = np.frombuffer(buf, dtype=np.uint8, count=ENTRY_SIZE * (last - first + 1), offset=base + ENTRY_SIZE * first)
    hashes = raw.reshape(-1, ENTRY_SIZE)[:, :4].copy().view(">i4").ravel().astype(np.int64)
    if (hashes < 0).any():
        return False
    slot_of = hashes % slots
    table = np.frombuffer(buf, dtype=">i4", count=slots, offset=HEADER_SIZE)
    pointed = table[slot_of].astype(np.int64)
    idx = np.arange(first, last + 1, dtype=np.int64)
    return bool(pointed[-1] == last and (pointed >= idx).all() and (pointed <= last).all())


# what each geometry setting, when wrong, makes the readers say about every file it shapes
_FOLDED: dict[str, tuple[str, set[str] | None]] = {
    "mappedFileSizeConsumeQueue": ("consumequeue/", {"short_segment", "misaligned_segment", "segment_overlap",
                                                     "wrong_segment_size", "bad_size"}),
    # with the wrong slot count nothing read through the index holds: every index finding is a consequence
    "maxHashSlotNum": ("", None),
    "maxIndexNum": ("", None),
    "mappedFileSizeTimerLog": ("timerlog/", {"wrong_segment_size", "misaligned_segment", "short_segment"}),
}


def fold_geometry_findings(findings: list[Finding]) -> list[Finding]:
    """Per-file findings that a ``geometry_conflict`` explains, counted into it instead of listed.

    A wrong broker.conf value makes every file it shapes look damaged; the operator needs the one
    cause, not a wall of consequences."""
    conflicts = [f for f in findings if f.kind == "geometry_conflict"]
    if not conflicts:
        return findings
    rules = [_FOLDED[c.extra["key"]] for c in conflicts if c.extra.get("key") in _FOLDED]
    folded = 0
    out = []
    for f in findings:
        path = (f.file or "").replace("\\", "/")
        if f.kind != "geometry_conflict" and any(_explains(prefix, kinds, path, f.kind) for prefix, kinds in rules):
            folded += 1
            continue
        out.append(f)
    if folded:
        out = [Finding(f.kind, f.severity, f.file, f.offset, f.detail + f" ({folded} per-file finding(s) folded)",
                       {**f.extra, "folded": folded}) if f.kind == "geometry_conflict" else f for f in out]
    return out


def _explains(prefix: str, kinds: set[str] | None, path: str, kind: str) -> bool:
    if kinds is None:  # the index: any index finding, wherever it is reported
        return kind.startswith("index_") or (path.startswith("index/") and not kind.startswith("geometry_"))
    return prefix in path and kind in kinds
