"""ConsumeQueue files: 20-byte units as numpy, naming, fillers, the queue directories, one queue's files.

A CQ unit is ``phyOffset:i64, size:i32, tagsCode:i64`` big-endian with no header (store-format §4).
Reading views a segment's bytes as a structured numpy array without copying (mmap for local files,
ranged reads for remote ones). Bytes and files only: what the broker makes of them at start-up (its
recovery scan, the min and max offsets) is :mod:`storelib.broker.settings.cqload`, its writer
:mod:`storelib.broker.dispatch.cqwriter`.
"""

from __future__ import annotations

import bisect
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from storelib.errors import Finding, StoreError, StoreLayoutError
from storelib.fileio.bytesource import ArrowFileSource, LocalSource, Location, data_ranges, resolve
from storelib.format.topicname import escape_topic, is_standard_topic

CQ_UNIT_SIZE = 20
DEFAULT_CQ_SEGMENT_SIZE = 6_000_000
FILLER_PHY_OFFSET = 0
FILLER_SIZE = 0x7FFFFFFF
FILLER_TAGS_CODE = 0
FILLER_ENTRY = (FILLER_PHY_OFFSET, FILLER_SIZE, FILLER_TAGS_CODE)
MAX_SEGMENT_SIZE = 2**31 - 1  # a MappedFile's size is a Java int

TAIL_WAIT_S = 0.5  # how long a live queue's last unit, still being copied in, is waited for
CQ_DTYPE = np.dtype([("phy_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
assert CQ_DTYPE.itemsize == CQ_UNIT_SIZE
FILLER_BYTES = np.array([FILLER_ENTRY], dtype=CQ_DTYPE).tobytes()

_ROCKSDB_NAMES = re.compile(r"^(CURRENT|IDENTITY|LOCK|MANIFEST-\d+|OPTIONS-\d+|\d+\.(sst|log))$")


# ---------------------------------------------------------------------------------------------
# names and sizes


def file_name(offset: int) -> str:
    """UtilAll.offset2FileName: the segment's first logical byte offset, 20 zero-padded digits. A negative
    offset (a record's corrupt negative QUEUEOFFSET starts a new queue: ConsumeQueue.putMessagePositionInfo
    creates the file at it) is what Java's NumberFormat makes of it, a minus sign before the 20 digits."""
    if not -(2**63) <= offset < 2**63:
        raise StoreError(None, offset, "bad_offset", f"segment offset {offset} is not a Java long")
    return f"{offset:020d}" if offset >= 0 else f"-{-offset:020d}"


def parse_file_name(name: str) -> int | None:
    """The offset a CQ file's name stands for, for the names the broker writes (UtilAll.offset2FileName, 4.9.8
    UtilAll.java:87-93, 5.3.3 :107-113: NumberFormat, 20 integer digits, a minus sign before a negative
    offset) and its load maps at ``Long.parseLong(name)`` (MappedFile.init, 4.9.8 MappedFile.java:166, 5.3.3
    DefaultMappedFile.java:161): 20 ASCII digits, or ``-`` and 20 digits down to Long.MIN_VALUE. None for any
    other name: one Long.parseLong takes in another form (``+1``, ``7``, ``-000..0``) is mapped by the broker
    too, but not read here (the audit names it: strayload's stray_segment_loaded)."""
    digits = name[1:] if name[:1] == "-" else name
    if len(digits) != 20 or not all("0" <= c <= "9" for c in digits):
        return None
    v = int(name)
    return v if digits is name or -(2**63) <= v < 0 else None


def broker_order(name: str) -> bytes:
    """Sort key of a directory's entry names as MappedFileQueue.doLoad orders them (4.9.8
    MappedFileQueue.java:160, 5.3.3 :248: ``Comparator.comparing(File::getName)``, String.compareTo over UTF-16
    code units): a negative name (``-``) sorts before every 20-digit one, and negative names by their digits,
    so a queue's negative files come nearest-zero first, the reverse of their offsets."""
    return name.encode("utf-16-be", "surrogatepass")


def list_segment_names(names: Sequence[str]) -> list[tuple[str, int]]:
    """(name, offset) of the CQ files among ``names`` (:func:`parse_file_name`) in the broker's load order
    (:func:`broker_order`): the one listing rule of every reader of a queue directory."""
    got = [(n, parse_file_name(n)) for n in sorted(names, key=broker_order)]
    return [(n, b) for n, b in got if b is not None]


def cq_file_size(configured: int) -> int:
    """mappedFileSizeConsumeQueue as the broker's getter returns it: rounded up to a multiple of 20."""
    return -(-int(configured) // CQ_UNIT_SIZE) * CQ_UNIT_SIZE


def check_segment_size(segment_size: int) -> int:
    """A CQ segment size as a MappedFile takes it (a positive multiple of 20 below 2^31), else StoreError."""
    s = int(segment_size)
    if s <= 0 or s % CQ_UNIT_SIZE or s > MAX_SEGMENT_SIZE:
        raise StoreError(None, None, "bad_segment_size",
                         f"CQ segment size {s} must be a positive multiple of 20 below 2^31 (see cq_file_size)")
    return s


# ---------------------------------------------------------------------------------------------
# unit arrays


REMOTE_BLOCK = 64 << 10  # a short ranged read of a consume queue fetches at least this much (one round trip)


def view_units(buf, count: int | None = None) -> np.ndarray:
    """The whole 20-byte units of ``buf`` as a CQ_DTYPE array sharing ``buf``'s memory (no copy).

    A trailing partial unit is ignored; callers that care report it (``ConsumeQueue`` does).
    """
    n = len(buf) // CQ_UNIT_SIZE if count is None else count
    if n <= 0:
        return np.zeros(0, dtype=CQ_DTYPE)
    return np.frombuffer(buf, dtype=CQ_DTYPE, count=n)


def valid_mask(units: np.ndarray) -> np.ndarray:
    """ConsumeQueue's validity rule: ``phyOffset >= 0 && size > 0`` (fillers are valid)."""
    return (units["phy_offset"] >= 0) & (units["size"] > 0)


def filler_mask(units: np.ndarray) -> np.ndarray:
    """Pre-blank filler units (0, 0x7FFFFFFF, 0)."""
    return (units["phy_offset"] == 0) & (units["size"] == FILLER_SIZE) & (units["tags_code"] == 0)


def first_invalid(units: np.ndarray) -> int:
    """Index of the first invalid unit (where a scan of the queue stops), or len(units)."""
    bad = ~valid_mask(units)
    return int(np.argmax(bad)) if bad.any() else len(units)


def units_before_hole(seg: CQSegment, n: int) -> int:
    """How many of a CQ file's ``n`` units lie before its first hole (a preallocated file's unwritten,
    sparse tail): the units after are zeros, so the first of them is invalid without being read. ``n``
    when the file is not local or has no hole."""
    ranges = data_ranges(seg.loc.path if seg.loc.local else None, 0, n * CQ_UNIT_SIZE)
    if not ranges or ranges[0][0] > 0:
        return 0
    return min(n, -(-ranges[0][1] // CQ_UNIT_SIZE))


def make_units(phy_offset, size, tags_code) -> np.ndarray:
    """A native CQ_DTYPE array from three columns (handy for tests and writers)."""
    p = np.asarray(phy_offset, dtype=np.int64)
    out = np.empty(len(p), dtype=CQ_DTYPE)
    out["phy_offset"] = p
    out["size"] = np.asarray(size, dtype=np.int64).astype(np.int32)
    out["tags_code"] = np.asarray(tags_code, dtype=np.int64)
    return out


def fillers(n: int) -> np.ndarray:
    """``n`` filler units (0, 0x7FFFFFFF, 0)."""
    out = np.zeros(n, dtype=CQ_DTYPE)
    out["size"] = FILLER_SIZE
    return out


# ---------------------------------------------------------------------------------------------
# topic and queue directories


def parse_queue_dir(name: str) -> int | None:
    """Java ``Integer.parseInt`` of a queue-id directory name (sign allowed, int range), else None."""
    if not name:
        return None
    body = name[1:] if name[0] in "+-" else name
    if not body or not body.isdecimal():
        return None
    v = int(name)
    return v if -(2**31) <= v < 2**31 else None


def _list(loc: Location) -> list[pafs.FileInfo]:
    try:
        infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True, recursive=False))
    except (OSError, pa.ArrowException) as e:
        raise StoreError(loc.path, None, "unreadable", f"cannot list directory: {e}") from e
    return sorted(infos, key=lambda i: broker_order(i.base_name))


def as_location(where: Location | str | os.PathLike) -> Location:
    """A Location as given, or the one a path or URI resolves to."""
    return where if isinstance(where, Location) else resolve(where)


def list_queues(store_root: Location | str | os.PathLike, findings: list[Finding] | None = None,
                ) -> list[tuple[str, int, Location]]:
    """Every ``consumequeue/<topic>/<queueId>`` directory as (topic, queue_id, Location), sorted.

    Queue-id directories that do not parse as a Java int are ignored like the broker's loader does,
    and reported as findings (so are stray files and unusual topic names). A RocksDB consume-queue
    store (5.x ``storeType=defaultRocksDB``) raises ``StoreLayoutError(kind="rocksdb_consumequeue")``.
    """
    root = as_location(store_root)
    cq = root.join("consumequeue")
    found = findings if findings is not None else []
    out: list[tuple[str, int, Location]] = []
    infos = _list(cq)
    rocks = [i.base_name for i in infos if i.type == pafs.FileType.File and _ROCKSDB_NAMES.match(i.base_name)]
    if rocks:
        raise StoreLayoutError(cq.path, None, "rocksdb_consumequeue",
                               f"consumequeue/ holds a RocksDB database ({', '.join(rocks[:3])}); "
                               "file-based CQ readers do not apply (storeType=defaultRocksDB)")
    for t in infos:
        if t.type != pafs.FileType.Directory:
            found.append(Finding("unexpected_file", "warning", t.path, None, "not a topic directory"))
            continue
        topic = t.base_name
        if not is_standard_topic(topic):
            found.append(Finding("unusual_topic_name", "info", t.path, None,
                                 f"topic {escape_topic(topic)} is outside TopicValidator's ^[%|a-zA-Z0-9_-]+$ "
                                 "(legal on disk: the store does not validate names)"))
        for q in _list(cq.join(topic)):
            qid = parse_queue_dir(q.base_name)
            if q.type != pafs.FileType.Directory:
                found.append(Finding("unexpected_file", "warning", q.path, None, "not a queue-id directory"))
                continue
            if qid is None:
                found.append(Finding("bad_queue_dir", "warning", q.path, None,
                                     "queue-id directory name is not an integer; the broker ignores it"))
                continue
            if q.base_name != str(qid):
                found.append(Finding("noncanonical_queue_dir", "warning", q.path, None,
                                     f"loaded by the broker as queue {qid}"))
            out.append((topic, qid, cq.join(topic, q.base_name)))
    out.sort(key=lambda x: (x[0], x[1]))
    return out


def is_rocksdb_consumequeue(store_root: Location | str | os.PathLike) -> bool:
    """Does ``consumequeue/`` hold a RocksDB database (5.x ``storeType=defaultRocksDB``) instead of topics?"""
    cq = as_location(store_root).join("consumequeue")
    return any(i.type == pafs.FileType.File and _ROCKSDB_NAMES.match(i.base_name) for i in _list(cq))


def batch_cq_topics(store_root: Location | str | os.PathLike) -> dict[str, list[int]]:
    """Topics with 5.x BatchConsumeQueue files (``batchconsumequeue/<topic>/<queueId>``) and their queue
    ids: a layout the broker supports and rmqstore does not read (callers say so instead of calling
    the topic's consume queues missing)."""
    root = as_location(store_root)
    out: dict[str, list[int]] = {}
    for t in _list(root.join("batchconsumequeue")):
        if t.type == pafs.FileType.Directory:
            qids = [q for q in (parse_queue_dir(i.base_name) for i in _list(root.join("batchconsumequeue", t.base_name))
                                if i.type == pafs.FileType.Directory) if q is not None]
            out[t.base_name] = sorted(qids)
    return out


LMQ_PREFIX = "%LMQ%"  # MixAll.LMQ_PREFIX: the queues multi-dispatch copies records into (queue id 0)


def lmq_queues(store_root: Location | str | os.PathLike) -> str | None:
    """The ``consumequeue/`` topics named as light message queues (``%LMQ%...``), said in a few words (None:
    there are none): written by a broker's multi-dispatch (enableMultiDispatch/enableLmq) from the records'
    INNER_MULTI_DISPATCH property, which no dispatch of ours reproduces."""
    cq = as_location(store_root).join("consumequeue")
    names = sorted(t.base_name for t in _list(cq)
                   if t.type == pafs.FileType.Directory and t.base_name.startswith(LMQ_PREFIX))
    if not names:
        return None
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return f"{len(names)} light message queue(s) ({', '.join(escape_topic(t) for t in names[:5])}{more})"


# ---------------------------------------------------------------------------------------------
# reading one queue


@dataclass(frozen=True)
class CQSegment:
    """One CQ file: its name, the logical byte offset it starts at, its size on disk."""

    name: str
    base: int
    size: int
    loc: Location

    @property
    def path(self) -> str:
        return self.loc.path


class ConsumeQueue:
    """The segments of one ``consumequeue/<topic>/<queueId>`` directory, read-only.

    Problems with the files never raise: they become ``findings`` (bad names, wrong sizes, gaps).
    Short files are read as far as they go; longer ones only up to the segment size.
    """

    def __init__(self, loc: Location | str | os.PathLike, *, segment_size: int = DEFAULT_CQ_SEGMENT_SIZE,
                 topic: str | None = None, queue_id: int | None = None, phy_limit: int | None = None,
                 listing: Sequence[Sequence] | None = None):
        """``phy_limit``: the commitlog end of a run's cut on a store a broker is writing: units pointing at
        or past it read as unwritten (zeros: dispatched after the cut), and files the cleaner deletes
        between the listing and their opening are left out (named in :attr:`vanished`). ``listing``: the
        directory's entries as another reader of this run listed them (:attr:`listed`: name, size, is a
        directory), instead of listing it again: a listing is a request on an object store."""
        self.loc = as_location(loc)
        self.segment_size = check_segment_size(segment_size)
        self.topic = topic
        self.queue_id = queue_id
        self.phy_limit = phy_limit
        self.findings: list[Finding] = []
        self.vanished: list[str] = []
        self._sources: dict[str, LocalSource | ArrowFileSource] = {}
        self._block: tuple[str, int, memoryview] | None = None  # remote: the block last read (file, start, bytes)
        self._last: str | None = None  # remote: the file read last, kept open between a reader's runs
        self.listed: list[list] = []  # the directory's entries as listed: [name, size, is a directory]
        self.segments: list[CQSegment] = self._discover(listing)
        if phy_limit is not None:  # open them now: an open file outlives its deletion by the cleaner
            self.segments = [seg for seg in self.segments if self._opened(seg)]
        # by offset, sorted once: segment_for runs per unit read (the list is never changed after this)
        self._by_offset = sorted(self.segments, key=lambda s: s.base)
        self._bases = [s.base for s in self._by_offset]

    def _discover(self, listing: Sequence[Sequence] | None) -> list[CQSegment]:
        S = self.segment_size
        segs: list[CQSegment] = []
        if listing is None:
            infos = _list(self.loc)
        else:
            infos = [pafs.FileInfo(self.loc.join(str(n)).path, pafs.FileType.Directory if d else pafs.FileType.File,
                                   size=None if d else int(z)) for n, z, d in sorted(listing, key=lambda e: broker_order(str(e[0])))]
        self.listed = [[i.base_name, int(i.size or 0), i.type == pafs.FileType.Directory] for i in infos]
        files = [i for i in infos if i.type != pafs.FileType.Directory]
        bases = dict(list_segment_names([i.base_name for i in files]))
        for info in infos:  # in the broker's load order (doLoad), which every later step follows
            if info.type == pafs.FileType.Directory:
                self.findings.append(Finding("unexpected_directory", "info", info.path, None,
                                             "sub-directory in a queue directory: not read here "
                                             "(whether the broker's load accepts it: the audit and recover --plan)"))
                continue
            base = bases.get(info.base_name)
            if base is None:
                self.findings.append(Finding("bad_file_name", "warning", info.path, None,
                                             "not a segment name the broker writes (20 digits, or a minus sign "
                                             "and 20): not read here (whether the broker's load accepts it: the "
                                             "audit and recover --plan)"))
                continue
            segs.append(CQSegment(info.base_name, base, int(info.size or 0), self.loc.join(info.base_name)))
        if segs and segs[-1].size == 0:
            if self.phy_limit is None:  # on a live store: a file the broker is creating (opened, not mapped yet)
                self.findings.append(Finding("empty_last_segment", "warning", segs[-1].path, 0,
                                             "zero-length last segment: 4.9.8 fails the load, 5.x deletes it"))
            segs.pop()
        for s in segs:
            if s.size != S:
                kind = "short_segment" if s.size < S else "long_segment"
                self.findings.append(Finding(kind, "error", s.path, min(s.size, S),
                                             f"file is {s.size} bytes, segment size is {S}; the broker refuses "
                                             "to load it", {"size": s.size, "expected": S}))
                if s.size < S and s.size % CQ_UNIT_SIZE:
                    self.findings.append(Finding("partial_unit", "error", s.path,
                                                 s.size - s.size % CQ_UNIT_SIZE,
                                                 "file ends inside a 20-byte unit"))
            if s.base % S:
                self.findings.append(Finding("misaligned_segment", "error", s.path, None,
                                             f"name {s.base} is not a multiple of the segment size {S}"))
        self._sequence_findings(segs)
        return segs

    def _sequence_findings(self, segs: list[CQSegment]) -> None:
        """Gaps and overlaps between the files by offset: the broker maps a queue's negative files nearest-zero
        first (:func:`broker_order`), an order checkSelf (4.9.8 MappedFileQueue.java:59-76) logs as damage but
        no gap; what it does with them is :class:`storelib.broker.settings.cqload.LoadedQueue`'s."""
        S = self.segment_size
        by_offset = sorted(segs, key=lambda s: s.base)
        for prev, s in zip(by_offset, by_offset[1:]):
            if s.base != prev.base + S:
                kind = "segment_gap" if s.base > prev.base + S else "segment_overlap"
                self.findings.append(Finding(kind, "error", s.path, None,
                                             f"previous segment starts at {prev.base}; expected "
                                             f"{prev.base + S} (broker: mappedFile queue damaged)"))

    # -- raw access ------------------------------------------------------------------------

    def _source(self, seg: CQSegment) -> LocalSource | ArrowFileSource:
        src = self._sources.get(seg.name)
        if src is None:
            if seg.loc.local and seg.loc.mapped:
                src = LocalSource(seg.path)
            else:
                src = ArrowFileSource(seg.loc.fs, seg.path, seg.size)
            self._sources[seg.name] = src
        return src

    def _opened(self, seg: CQSegment) -> bool:
        """Open ``seg`` (kept until :meth:`close`); False when it no longer exists (noted in ``vanished``)."""
        try:
            self._source(seg)
        except StoreError:
            if self.loc.fs.get_file_info(seg.path).type != pafs.FileType.NotFound:
                raise
            self.vanished.append(seg.name)
            return False
        return True

    def readable_units(self, seg: CQSegment) -> int:
        """Whole units of ``seg`` that exist on disk, capped at the segment size."""
        return min(seg.size, self.segment_size) // CQ_UNIT_SIZE

    def read_units(self, seg: CQSegment, first: int = 0, count: int | None = None) -> np.ndarray:
        """Units ``[first, first+count)`` of a segment (zero copy for local files)."""
        n = self.readable_units(seg)
        first = max(0, min(first, n))
        last = n if count is None else max(first, min(n, first + count))
        if last == first:
            return np.zeros(0, dtype=CQ_DTYPE)
        if self.phy_limit is not None and seg.name not in self._sources and not self._opened(seg):
            return np.zeros(0, dtype=CQ_DTYPE)  # deleted by the cleaner since the queue was listed
        units = view_units(self._read(seg, first * CQ_UNIT_SIZE, (last - first) * CQ_UNIT_SIZE))
        if self.phy_limit is not None:
            units = self._held_last(seg, first, units)
            ahead = units["phy_offset"] >= self.phy_limit
            if ahead.any():  # dispatched after the cut: not there yet as far as this run is concerned (nor
                # any unit after one that is: dispatch follows the commitlog)
                units = np.array(units)
                units[int(np.argmax(ahead)):] = np.zeros(1, dtype=CQ_DTYPE)
        return units

    def _read(self, seg: CQSegment, offset: int, length: int) -> memoryview:
        """Bytes of ``seg``; a short read from a remote filesystem is served from a block of at least
        :data:`REMOTE_BLOCK` bytes: a queue's units are read in ascending runs (one per commitlog unit of
        the audit), and each run alone would cost a round trip to the object store. One block is kept, of
        the file read last (the runs ascend: an earlier file is not read again). Local files (mapped, or
        read by ``pread``) and a live cut's reads, which must see the broker's latest bytes, are read as
        asked."""
        src = self._source(seg)
        if seg.loc.local or self.phy_limit is not None:
            return src.read(offset, length)
        self._last = seg.name
        if length >= REMOTE_BLOCK:
            return src.read(offset, length)
        blk = self._block
        if blk is None or blk[0] != seg.name or not (blk[1] <= offset and offset + length <= blk[1] + len(blk[2])):
            start = offset // REMOTE_BLOCK * REMOTE_BLOCK
            blk = self._block = (seg.name, start, src.read_range(start, max(start + REMOTE_BLOCK, offset + length) - start))
        return blk[2][offset - blk[1]: offset - blk[1] + length]

    def _held_last(self, seg: CQSegment, first: int, units: np.ndarray) -> np.ndarray:
        """A live queue's units with their last written one (zeros after it) read again until two reads
        agree: a read racing the broker's copy of those 20 bytes may see any part of them (a size with
        half an offset), which no unit ever held."""
        raw = units.view(np.uint8).reshape(-1, CQ_UNIT_SIZE) if len(units) else None
        used = np.flatnonzero(raw.any(axis=1)) if raw is not None else ()
        if not len(used):
            return units
        j = int(used[-1])
        src, pos = self._source(seg), (first + j) * CQ_UNIT_SIZE
        was = units[j:j + 1].tobytes()
        for k in range(50):
            now = bytes(src.read(pos, CQ_UNIT_SIZE))
            if now == was:
                break
            was = now
            if k > 4:
                time.sleep(0.0005)
        if was == units[j:j + 1].tobytes():
            return units
        out = np.array(units)
        out[j:j + 1] = np.frombuffer(was, CQ_DTYPE)
        return out

    def settle_unit(self, n: int, wait_s: float = TAIL_WAIT_S) -> np.ndarray:
        """A live queue's unit at queue offset ``n`` read again after short waits (doubling, up to
        ``wait_s``) until it holds still: the broker copies a unit's 20 bytes front to back (4.9.8
        ``ConsumeQueue.java:488-490`` fills offset, size, tags code; ``MappedFile.appendMessage`` copies
        them), so a pread may see its size without its tags code yet. A reader that finds the queue's last
        unit differing from its record asks this before calling it damage."""
        seg = self.segment_for(n * CQ_UNIT_SIZE)
        if seg is None:
            return np.zeros(0, CQ_DTYPE)
        i = (n * CQ_UNIT_SIZE - seg.base) // CQ_UNIT_SIZE
        raw = bytes(self._source(seg).read(i * CQ_UNIT_SIZE, CQ_UNIT_SIZE))
        deadline, delay = time.monotonic() + wait_s, 0.001
        while time.monotonic() < deadline:
            time.sleep(delay)
            now = bytes(self._source(seg).read(i * CQ_UNIT_SIZE, CQ_UNIT_SIZE))
            # still as a copy stopped part way leaves it (no size, or no tags code): keep waiting
            partial = int.from_bytes(now[8:12], "big", signed=True) <= 0 or not any(now[12:])
            if now == raw and delay >= 0.008 and not partial:
                break
            raw, delay = now, min(delay * 2, 0.1)
        return np.frombuffer(raw, CQ_DTYPE)

    def by_offset(self) -> list[CQSegment]:
        """:attr:`segments` (the broker's load order) by offset: the two differ only when a queue has several
        negative files (:func:`broker_order`)."""
        return list(self._by_offset)

    def segment_for(self, byte_offset: int) -> CQSegment | None:
        """The segment holding logical byte offset ``byte_offset`` (by name), if present."""
        i = bisect.bisect_right(self._bases, byte_offset) - 1
        if i < 0:
            return None
        s = self._by_offset[i]
        return s if byte_offset < s.base + self.segment_size else None

    def entry(self, n: int) -> tuple[int, int, int] | None:
        """(phyOffset, size, tagsCode) stored at logical offset ``n``, or None if no file holds it.

        Raw read: the unit may be invalid, a filler or stale data past the queue's end; compare with
        ``LoadedQueue.min_offset``/``max_offset`` for the broker's view (store-algorithms §10.2).
        """
        seg = self.segment_for(n * CQ_UNIT_SIZE)
        if seg is None:
            return None
        u = self.read_units(seg, (n * CQ_UNIT_SIZE - seg.base) // CQ_UNIT_SIZE, 1)
        if len(u) == 0:
            return None
        return int(u["phy_offset"][0]), int(u["size"][0]), int(u["tags_code"][0])

    def entries(self, start: int | None = None, end: int | None = None, *, chunk_entries: int = 65536,
                ) -> Iterator[tuple[int, np.ndarray]]:
        """Yield (logical offset of the first unit, CQ_DTYPE chunk) over logical offsets [start, end), ascending.

        ``start`` defaults to the first file's first unit (negative in a file with a negative name).

        ``end`` defaults to every unit on disk (the broker's end is ``LoadedQueue.max_offset()``); past
        the queue's end the units are stale or zeros.
        Offsets no file holds are skipped (the yielded offsets show the hole). Memory is bounded by
        ``chunk_entries`` units per chunk.
        """
        if end is None:
            end = max((s.base // CQ_UNIT_SIZE + self.readable_units(s) for s in self.segments), default=0)
        if start is None:
            start = min((s.base // CQ_UNIT_SIZE for s in self.segments), default=0)
        chunk_entries = max(1, int(chunk_entries))
        S = self.segment_size
        for seg in self.by_offset():
            lo_n = seg.base // CQ_UNIT_SIZE
            hi_n = lo_n + self.readable_units(seg)
            a, b = max(start, lo_n), min(end, hi_n, lo_n + S // CQ_UNIT_SIZE)
            i = a
            while i < b:
                k = min(chunk_entries, b - i)
                yield i, self.read_units(seg, i - lo_n, k)
                i += k

    def close(self) -> None:
        for src in self._sources.values():
            src.close()
        self._sources.clear()
        self._block = None
        self._last = None

    def release_mapped(self) -> None:
        """Unmap the local files read so far (a reader's memory follows what it reads now). Of the files
        read by ranged requests, the one read last stays open with its block (the next run of ascending
        reads starts in it or after it, and reopening costs a metadata request on an object store); the
        others are closed. Under a live cut every file is closed: the next read reopens it and so notices
        one the cleaner deleted meanwhile."""
        keep = None if self.phy_limit is not None else self._last
        for name in [n for n in self._sources if n != keep]:
            self._sources.pop(name).close()
        if self._block is not None and self._block[0] != keep:
            self._block = None

    def __enter__(self) -> ConsumeQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
