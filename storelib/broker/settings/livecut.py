"""A run's cut of a store a broker may be writing: whether a broker runs it (a fact, not a finding), and
when one does, the one moment every reader of the run is held to.

A running broker appends records, dispatches them to the consume queues and index files later (reput),
rewrites the checkpoint, and deletes the oldest files (notes: /work/notes/live.md). Files read at
different moments of that progress disagree in ways that are no damage. So a run on a live store takes,
at its start, one cut in an order where every file read later can only be AHEAD of those read before:

1. the checkpoint (its timestamps can then only be behind the data read after it), and the 5.x timer
   store's ``config/timercheck`` (flushed after the timerlog, so the timerlog read later holds what it
   claims);
2. the index files' listing and their 40-byte headers (each file is read later as it stood then:
   :class:`storelib.format.indexfile.IndexFile` ``at``), re-read while a header and its last entry
   disagree (a key being put);
3. the commitlog's listing and its end, last: the end of the last record whose CRC holds. A record at
   the tail that is still being copied in (its first bytes there, the rest zeros) is re-read after short
   waits before the cut is placed in front of it; a bad record with valid data after it is damage and
   the cut goes past it.

Every consume-queue unit and index entry within those extents then points at or below the commitlog
end (the broker dispatches only complete records); consume queues, read later, are clamped at the end
(:class:`storelib.format.consumequeue.ConsumeQueue` ``phy_limit``). A store nobody runs gets a cut that
clamps nothing: it reads exactly as it always did.

The cut is a plain frozen value (picklable: it rides into engine tasks, Spark included).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from storelib.errors import StoreError
from storelib.fileio.bytesource import Location, data_ranges, open_source
from storelib.fileio.smallfile_io import read_small
from storelib.format.dledger.entries import BODY_OFFSET
from storelib.format.indexdir import IndexFileRef, list_index_files
from storelib.format.indexfile import HEADER_SIZE, IndexGeometry, IndexHeader, index_time_diff
from storelib.format.markers import abort_state, lock_state, pid_alive
from storelib.scan.commitlog import CommitLog, Segment
from storelib.scan.scanner import SegmentScan
from storelib.scan.splits import find_entry_start, find_record_start

if TYPE_CHECKING:
    from storelib.broker.settings.store import Store

TAIL_WAIT_S = 0.5  # how long a record still being copied in at the tail is waited for
_TAIL_COLUMNS = ["phy_offset", "size", "crc_ok", "prop_crc_ok"]
_CHUNK = 1 << 20


@dataclass(frozen=True)
class LiveBroker:
    """A broker running the store, and how we know: its lock held (F_GETLK names the pid), or on 5.x its
    abort file naming a running pid."""

    pid: int | None
    evidence: str


@dataclass(frozen=True)
class StoreCut:
    """One run's cut (see the module docstring). Without ``broker`` (nobody runs the store) it clamps
    nothing. Offsets are physical commitlog offsets; ``taken_ms`` is the wall clock when taken."""

    taken_ms: int
    broker: LiveBroker | None = None
    commitlog_end: int | None = None  # records starting at or after it are not read
    segments: tuple[str, ...] = ()  # the segment files listed at the cut (later ones are not read)
    index_headers: tuple[tuple[str, bytes], ...] = ()  # (file name, its 40 header bytes) at the cut
    checkpoint: bytes | None = None  # the checkpoint file as read first (None: there was none)
    timercheck: bytes | None = None  # 5.x config/timercheck as read next (None: there was none)
    tail: str | None = None  # what the tail held when the cut was taken (a record waited for, ...)
    seconds: float = 0.0  # how long taking it took
    notes: tuple[str, ...] = field(default=())

    @property
    def live(self) -> bool:
        return self.broker is not None

    @property
    def when(self) -> str:
        return datetime.fromtimestamp(self.taken_ms / 1000, timezone.utc).isoformat(timespec="milliseconds")

    def describe(self) -> str:
        """One line: "live store (pid N): read up to a cut at offset X taken at T", or "at rest"."""
        if self.broker is None:
            return "not live: no process holds the store's lock"
        who = f"pid {self.broker.pid}" if self.broker.pid else "pid unknown"
        return f"live store ({who}): read up to a cut at offset {self.commitlog_end} taken at {self.when}"

    def to_dict(self) -> dict[str, Any]:
        """The report's ``live`` block (audit.json, export manifests): null fields when not live."""
        b = self.broker
        return {"live": self.live, "pid": b.pid if b else None, "evidence": b.evidence if b else None,
                "cut_offset": self.commitlog_end, "cut_time_ms": self.taken_ms if b else None,
                "cut_time": self.when if b else None, "tail": self.tail,
                "cut_seconds": round(self.seconds, 3) if b else None}

    def index_at(self, name: str) -> bytes | None:
        for n, h in self.index_headers:
            if n == name:
                return h
        return None

    def limit(self, base: int, file_size: int) -> int | None:
        """The file offset in the segment at ``base`` where reading stops (None: no cut)."""
        if self.commitlog_end is None:
            return None
        return max(0, min(file_size, self.commitlog_end - base))

    def index_refs(self, refs: list[IndexFileRef]) -> list[IndexFileRef]:
        """The index files of a listing as of the cut: those listed then, each read as its header was
        (files created since are not the run's)."""
        if not self.live:
            return refs
        at = dict(self.index_headers)
        return [replace(r, at=at[r.name]) for r in refs if r.name in at]


def no_cut() -> StoreCut:
    """The cut of a store at rest (or one nobody may ask about): clamps nothing."""
    return StoreCut(int(time.time() * 1000))


def live_broker(root: Location) -> LiveBroker | None:
    """Is a broker running this store? Its lock held by another process (F_GETLK: asked, never taken), or,
    when the lock cannot tell (no lock file, a filesystem without locks), an abort file naming a pid
    that runs here (5.x writes its pid there). A lock nobody holds means no broker, whatever abort says
    (a stale pid may belong to another process now). Remote stores cannot be asked: None."""
    if not root.local:
        return None
    try:
        lk = lock_state(root)
    except StoreError:
        lk = None
    ab = abort_state(root)
    if lk is not None and lk.held_by_other:
        pid = lk.holder_pid or (ab.pid if ab.exists and pid_alive(ab.pid) else None)
        return LiveBroker(pid, f"lock held by {'pid ' + str(pid) if pid else 'a process in another pid namespace'}")
    if (lk is None or lk.held_by_other is None) and ab.exists and pid_alive(ab.pid):
        return LiveBroker(ab.pid, f"abort names pid {ab.pid}, which is running")
    return None


def take_cut(store: Store, *, tail_wait_s: float = TAIL_WAIT_S, broker: LiveBroker | None = None,
             probe: bool = True) -> StoreCut:
    """The run's cut of ``store`` (see the module docstring); at rest (nobody runs it) a cut that clamps
    nothing, for which nothing is read here. ``broker``: already known (else asked when ``probe``)."""
    t0 = time.monotonic()
    now = int(time.time() * 1000)
    if broker is None and probe:
        broker = live_broker(store.loc)
    if broker is None:
        return StoreCut(now)
    root = replace(store.loc, mapped=False)
    if store.dledger is not None:  # 1. DLedger's checkpoint first too: its committed index is behind the data
        store.dledger_state  # noqa: B018 (read once here, cached for the run)
    cp = read_small(root.join("checkpoint"), 1 << 16)  # 1. the checkpoint first, the timer store's next
    tc = read_small(root.join("config", "timercheck"), 1 << 16)
    g = store.settings.index_geometry
    # 2. (a file shorter than its header is one the broker is creating: not the cut's)
    headers = tuple((ref.name, _stable_header(ref, g)) for ref in list_index_files(root) if ref.size >= HEADER_SIZE)
    if store.dledger is not None:  # a DLedger node's data files, listed last: its end is the last whole entry
        from storelib.broker.settings.store import open_commitlog

        cl = open_commitlog(root, store.settings)
    else:
        cl = CommitLog(root.join("commitlog"), store.settings.mapped_file_size_commit_log,  # 3. listed last
                       line=store.settings.scan_line)
    end, tail = log_end(cl, max_record=int(store.settings.max_message_size) + (1 << 17), tail_wait_s=tail_wait_s)
    return StoreCut(now, broker, end, tuple(s.name for s in cl.segments), headers, cp, tc, tail,
                    time.monotonic() - t0)


def _stable_header(ref: IndexFileRef, g: IndexGeometry | None, tries: int = 50) -> bytes:
    """An index file's header as the broker left it between two puts: IndexFile.putKey writes the entry,
    the slot, then the header's fields one by one, so a header whose endPhyOffset or endTimestamp is not
    its last entry's is a put in progress: read again (1 ms apart)."""
    with open_source(ref.loc, ref.size) as src:
        raw = b""
        for _ in range(tries):
            raw = bytes(src.read(0, HEADER_SIZE))
            if len(raw) < HEADER_SIZE or g is None:
                return raw
            h = IndexHeader.from_bytes(raw, ref.name)
            n = min(h.loaded_index_count, g.index_num) - 1
            if n < 1:
                return raw
            e = bytes(src.read(g.entry_pos(n), 20))
            if len(e) < 20:
                return raw
            phy = int.from_bytes(e[4:12], "big", signed=True)
            td = int.from_bytes(e[12:16], "big", signed=True)
            if phy == h.end_phy_offset and (n < 2 or td == index_time_diff(h.end_timestamp, h.begin_timestamp)):
                return raw
            time.sleep(0.001)
        return raw


def _has_data(src, seg: Segment) -> bool:
    head = bytes(src.read(0, 8)) if seg.file_size >= 8 else b""
    return head != bytes(len(head))


def log_end(cl: CommitLog, *, max_record: int, tail_wait_s: float = TAIL_WAIT_S) -> tuple[int, str | None]:
    """The physical offset after the last record whose CRC holds in the segment being written (the last
    one holding data), and a note on the tail when something there was waited for or left out."""
    segs = [s for s in cl.segments if s.file_size > 0]
    if not segs:
        return cl.min_offset, None
    for i in range(len(segs) - 1, -1, -1):
        seg = segs[i]
        with seg.open() as src:
            if i and not _has_data(src, seg):
                continue  # the next file, created ahead (AllocateMappedFileService): nothing in it yet
            return _segment_end(src, seg, max_record, tail_wait_s, cl.line, cl.dledger)
    return segs[0].base, None


def _last_nonzero(src, seg: Segment) -> int:
    """The position of the last non-zero byte of the segment (-1: none), over its data ranges only (a
    preallocated segment's unwritten part is a hole), read a MiB at a time from the end."""
    ranges = data_ranges(seg.path if seg.loc.local else None, 0, seg.file_size)
    for lo, hi in reversed(ranges):
        pos = hi
        while pos > lo:
            a = max(lo, pos - _CHUNK)
            buf = np.frombuffer(src.read(a, pos - a), np.uint8)
            nz = np.flatnonzero(buf)
            if len(nz):
                return a + int(nz[-1])
            pos = a
    return -1


def _segment_end(src, seg: Segment, max_record: int, tail_wait_s: float,
                 line: str | None = None, dledger: bool = False) -> tuple[int, str | None]:
    """Walk the tail of the segment being written (see :func:`log_end`)."""
    last = _last_nonzero(src, seg)
    if last < 0:
        return seg.base, None
    find = find_entry_start if dledger else find_record_start
    start = find(src, seg.base, max(0, last - max_record), last + 1) or 0
    deadline = time.monotonic() + tail_wait_s
    delay = 0.005
    waited = 0.0
    while True:
        end, pending = _walk(src, seg, start, line, dledger)
        if pending is None:
            note = f"a record at {seg.base + start} was being copied in: read after {waited * 1000:.0f} ms" \
                if waited else None
            return end, note
        nxt = find(src, seg.base, pending + 1, _last_nonzero(src, seg) + 1)
        if nxt is not None:  # valid records after it: damage for the audit to report, not a record in flight
            start = nxt
            continue
        if time.monotonic() >= deadline:
            return seg.base + pending, (f"the record at {seg.base + pending} was still incomplete after "
                                        f"{waited * 1000:.0f} ms: the cut is before it")
        time.sleep(delay)
        waited += delay
        delay = min(delay * 2, 0.1)
        start = pending


def _walk(src, seg: Segment, start: int, line: str | None = None, dledger: bool = False) -> tuple[int, int | None]:
    """Records from ``start`` (a record start) to where the chain ends: (physical end of the last record
    whose CRCs hold, the file offset of a record there that fails its checks or None). ``dledger``: entries
    (a record 48 bytes into each: the end of the last whole entry whose header and record hold)."""
    scan = SegmentScan(src, seg.display, seg.base, start, verify_crc=True, with_properties=False,
                       columns=_TAIL_COLUMNS, batch_rows=1 << 16, line=line, dledger=dledger)
    head = BODY_OFFSET if dledger else 0  # an entry starts 48 bytes before its record
    last_ok = start
    bad_at = None
    for b in scan:
        crc = np.asarray(b.column("crc_ok").fill_null(True)) & np.asarray(b.column("prop_crc_ok").fill_null(True))
        phy = np.asarray(b.column("phy_offset"))
        size = np.asarray(b.column("size")).astype(np.int64)
        if not crc.all():
            j = int(np.argmin(crc))
            if bad_at is None:
                bad_at = int(phy[j]) - head - seg.base
                last_ok = bad_at if j == 0 else int(phy[j - 1] + size[j - 1] - seg.base)
            continue
        if bad_at is None and len(phy):
            last_ok = int(phy[-1] + size[-1] - seg.base)
    e = scan.end
    if bad_at is not None:
        return seg.base + last_ok, bad_at
    if e.kind in ("blank", "segment_end"):
        return seg.base + seg.file_size, None
    if e.kind == "invalid":
        return seg.base + e.file_offset, e.file_offset
    return seg.base + e.file_offset, None


__all__ = ["LiveBroker", "StoreCut", "TAIL_WAIT_S", "live_broker", "log_end", "no_cut", "take_cut"]
