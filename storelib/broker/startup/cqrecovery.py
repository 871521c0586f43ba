"""One consume queue through a broker start-up, in memory: ConsumeQueue.recover, the records dispatched during
recovery, truncateDirtyLogicFiles, the 4.9.8 reput and correctMinOffset (store-algorithms §8.2, §8.6, §8.8).

The model starts from the files on disk and records what the start-up writes as overlays, so the store is
never touched: :meth:`QueueReplay.outputs` gives the new content of every file that changes, which the
offline recovery (``rmqstore recover``) plans and applies. The unit rules are :mod:`storelib.format.consumequeue`'s, the load
:mod:`storelib.broker.settings.cqload`'s and the writer is :mod:`storelib.broker.dispatch.cqwriter`'s; this module only keeps the files' state between the steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from storelib.broker.dispatch.cqwriter import (
    NO_SLOT,
    QueueImage,
    QueueState,
    build_consume_queues,
    slide_slots,
)
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.cqload import LoadedQueue, first_unit_from
from storelib.errors import StoreError
from storelib.fileio.bytesource import Location
from storelib.format.consumequeue import (
    CQ_DTYPE,
    CQ_UNIT_SIZE,
    DEFAULT_CQ_SEGMENT_SIZE,
    file_name,
    list_segment_names,
    valid_mask,
)
from storelib.format.javahash import wrap64


def _read_upto(fs: pafs.FileSystem | None, path: str, n: int) -> bytes:
    """Up to ``n`` bytes from the start of a file: a local path, or a path on a remote store's filesystem."""
    if fs is None:
        with open(path, "rb") as f:
            return f.read(n)
    with fs.open_input_file(path) as f:
        return f.read(min(n, f.size()))


def kept_after_truncation(units: np.ndarray, process_offset: int) -> int:
    """truncateDirtyLogicFiles' scan of the last segment that survives it (store-algorithms §8.6): how many
    units stay. The first unit is kept unchecked (the caller deletes the file when its phyOffset >=
    processOffset); later ones while valid and phyOffset < processOffset."""
    rest = units[1:]
    ok = valid_mask(rest) & (rest["phy_offset"] < int(process_offset))
    return 1 + (int(np.argmax(~ok)) if (~ok).any() else len(rest))


@dataclass
class _Seg:
    """One CQ segment as the simulated broker sees it: the file's bytes (or zeros) plus units written."""

    file: str | None  # path of the on-disk file whose bytes it starts from; None = new (zeros)
    overlays: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (byte pos, units)
    fs: pafs.FileSystem | None = None  # the file's filesystem when the store is remote (None: local path)

    def units(self, S: int) -> np.ndarray:
        out = np.zeros(S // CQ_UNIT_SIZE, dtype=CQ_DTYPE)
        if self.file is not None:
            raw = np.frombuffer(_read_upto(self.fs, self.file, S), dtype=np.uint8)
            n = len(raw) // CQ_UNIT_SIZE
            out[:n] = raw[: n * CQ_UNIT_SIZE].view(CQ_DTYPE)
        for pos, u in self.overlays:
            i = pos // CQ_UNIT_SIZE
            out[i: i + len(u)] = u
        return out


@dataclass
class QueueReport:
    """Per-queue outcome of a start-up (the recover plan's ``consume_queues.queues[]``)."""

    topic: str
    queue_id: int
    recovered_max_offset: int
    recovered_max_phy_offset: int
    files_deleted_on_load: list[str] = field(default_factory=list)
    truncated_max_offset: int | None = None
    entries_truncated: int = 0
    files_deleted_on_truncate: list[str] = field(default_factory=list)
    entries_added: int = 0
    added_from: int | None = None
    added_by: list[str] = field(default_factory=list)
    final_min_offset: int = 0
    final_max_offset: int = 0
    final_max_phy_offset: int = -1


class QueueReplay:
    """One consume queue through recover → recovery dispatch → truncation → reput, on a model of its files."""

    def __init__(self, topic: str, qid: int, root: Location, S: int, cq: LoadedQueue | None):
        self.topic, self.qid, self.S = topic, qid, S
        self.rel_dir = f"consumequeue/{topic}/{qid}"
        qloc = root.join("consumequeue", topic, str(qid))
        self.fs = None if qloc.local else qloc.fs  # a remote store (plan only) is read through its fs
        self.dir = qloc.path
        self.disk: dict[int, str] = {}
        files = {i.base_name: i.path for i in qloc.fs.get_file_info(pafs.FileSelector(qloc.path, allow_not_found=True))
                 if i.type == pafs.FileType.File}
        for name, b in list_segment_names(list(files)):
            self.disk[b] = files[name]
        self.model: dict[int, _Seg] = {}  # the broker's mappedFiles list, in its order (several negative files
        # load nearest-zero first, new files go last): its first and last are getFirst/LastMappedFile's
        if cq is not None:
            rec = cq.recover()
            for seg, _ in rec.segments:
                self.model[seg.base] = _Seg(seg.path, fs=self.fs)
            self.state = replace(QueueState.from_existing(cq), backing=None)
            self.report = QueueReport(topic, qid, cq.max_offset(truncated=False), rec.max_physic_offset)
            self.report.files_deleted_on_load = sorted(file_name(b) for b in self.disk if b not in self.model)
        else:
            self.state = QueueState()
            self.report = QueueReport(topic, qid, 0, -1)

    # -- writes ---------------------------------------------------------------------------------
    def put(self, img: QueueImage, by: str) -> None:
        """Overlay the units a build_consume_queues image wrote (``by``: which dispatch wrote them)."""
        S = self.S
        for base in img.segment_bases:
            if base not in self.model:
                self.model[base] = _Seg(None)
        ents = img.entries
        for base in img.segment_bases:
            lo, hi = max(base, img.start), min(base + S, img.end)
            if hi > lo:
                self.model[base].overlays.append((lo - base, ents[(lo - img.start) // CQ_UNIT_SIZE:
                                                                  (hi - img.start) // CQ_UNIT_SIZE].copy()))
        self.state = replace(img.state, backing=None)
        written = img.slots[img.slots != NO_SLOT]
        if len(written):
            self.report.entries_added += len(written)
            first = int(written.min())
            self.report.added_from = first if self.report.added_from is None else min(self.report.added_from, first)
            if by not in self.report.added_by:
                self.report.added_by.append(by)

    def truncate(self, P: int) -> None:
        """truncateDirtyLogicFiles(P) (store-algorithms §8.6): later files whose first unit is at or past P
        go, the last one keeps its leading units (:func:`kept_after_truncation`); an emptied queue
        keeps P as its provisional maxPhysicOffset."""
        S = self.S
        state = QueueState(max_physic_offset=P)
        deleted: list[str] = []
        while self.model:
            last = next(reversed(self.model))  # getLastMappedFile, deleteLastMappedFile: the list's last
            u = self.model[last].units(S)
            if int(u["phy_offset"][0]) >= P:
                del self.model[last]
                deleted.append(file_name(last))
                continue
            n = kept_after_truncation(u, P)
            lu = u[n - 1]
            max_phy = wrap64(int(lu["phy_offset"]) + int(lu["size"]))
            state = QueueState(max_physic_offset=max_phy, last_base=last, write_pos=n * CQ_UNIT_SIZE)
            break
        self.state = state
        self.report.files_deleted_on_truncate = deleted
        self.report.truncated_max_offset = self.max_offset()
        self.report.entries_truncated = max(0, self.report.recovered_max_offset - self.report.truncated_max_offset)

    def destroy(self) -> None:
        """ConsumeQueue.destroy (no commitlog segment left)."""
        self.report.files_deleted_on_truncate = sorted(file_name(b) for b in self.model)
        self.model.clear()
        self.state = QueueState()
        self.report.truncated_max_offset = 0
        self.report.entries_truncated = self.report.recovered_max_offset

    # -- results --------------------------------------------------------------------------------
    def max_offset(self) -> int:
        """getMaxOffsetInQueue of the model: the last file's start plus its write position, which recover can
        leave negative in a negative file (cqload.write_position) until truncate sets it again from 0."""
        st = self.state
        return 0 if st.last_base is None else (st.last_base + st.write_pos) // CQ_UNIT_SIZE

    def min_offset(self, commitlog_min: int, variant: str = "4.9.8") -> int:
        """correctMinOffset on the final model (cqload.first_unit_from over the first segment's written part);
        0 when no unit qualifies, the value a starting broker holds. ``variant`` (cqload.min_variant): 5.x
        sets a queue whose last unit is below ``commitlog_min`` to its max (all its units expired)."""
        if not self.model:
            return 0
        if variant != "4.9.8" and self.state.last_base is not None and self.state.write_pos >= CQ_UNIT_SIZE:
            last = self.model.get(self.state.last_base)
            u = last.units(self.S)[self.state.write_pos // CQ_UNIT_SIZE - 1] if last is not None else None
            if u is not None and int(u["phy_offset"]) < commitlog_min:
                return self.max_offset()
        first = next(iter(self.model))  # correctMinOffset's getFirstMappedFile: the list's first
        end = self.S if first != self.state.last_base else max(0, self.state.write_pos)  # selectMappedBuffer(0)
        u = self.model[first].units(self.S)[: end // CQ_UNIT_SIZE]
        hit = first_unit_from(u, first, commitlog_min)
        return 0 if hit is None else hit // CQ_UNIT_SIZE

    def finish(self, commitlog_min: int, variant: str = "4.9.8") -> QueueReport:
        """Fill the report's final offsets (after every dispatch) and return it (``variant``: the line's
        correctMinOffset, :meth:`min_offset`)."""
        r = self.report
        r.final_max_offset = self.max_offset()
        r.final_max_phy_offset = self.state.max_physic_offset
        r.final_min_offset = min(self.min_offset(commitlog_min, variant), r.final_max_offset)
        return r

    def outputs(self) -> Iterable[tuple[str, bytes | None]]:
        """(relative path, new full content or None to delete) for every file that changes."""
        S = self.S
        last = self.state.last_base
        for base in sorted(self.model):
            seg = self.model[base]
            u = seg.units(S)
            if base == last and self.state.write_pos >= 0:  # negative: the broker wrote nothing into the file
                u[self.state.write_pos // CQ_UNIT_SIZE:] = np.zeros(1, dtype=CQ_DTYPE)
            data = u.tobytes()
            path = self.disk.get(base)
            if path is not None and _read_upto(self.fs, path, S + 1) == data:
                continue
            yield f"{self.rel_dir}/{file_name(base)}", data
        for base in sorted(self.disk):
            if base not in self.model:
                yield f"{self.rel_dir}/{file_name(base)}", None


__all__ = ["QueueReplay", "QueueReport"]


def recovery_tags(root: Location | None, s: BrokerSettings | None, phy: np.ndarray) -> np.ndarray:
    """The tagsCode a 4.9.8 broker's abnormal recovery writes for the SCHEDULE_TOPIC_XXXX records at ``phy``
    (the TAGS hash, or 0), where the delivery time is not the only right one: DefaultMessageStore.load
    recovers (dispatching what the consume queues lack) before ScheduleMessageService.load fills the delay
    table, so maxDelayLevel is still 0 and CommitLog.checkMessageAndReturnSize skips the delivery-time rule
    (the walk's ``delay_levels_quirk``: this is what our recovery writes). 5.x loads the delay table first: no second value
    there (an impossible tagsCode, -1 << 63, for each record)."""
    out = np.full(len(phy), np.iinfo(np.int64).min, np.int64)
    if s is None or root is None or s.version != "4" or not len(phy):
        return out
    from storelib.broker.settings.store import open_commitlog

    cl = open_commitlog(root, s)
    if len(phy) > 16 and not cl.dledger:  # many (a whole recovery's dispatch): one scan per segment's span
        _scan_tags(cl, phy, out)
    for i, p in enumerate(phy.tolist()):  # those not found by a scan, one by one
        if out[i] != np.iinfo(np.int64).min:
            continue
        try:
            rec = cl.record_at(int(p), delay_levels_ms=[], verify_crc=False, with_properties=False,
                               columns=["tags_code"])
        except StoreError:
            continue
        out[i] = int(rec.column("tags_code")[0].as_py())
    return out


def _scan_tags(cl, phy: np.ndarray, out: np.ndarray) -> None:
    """``out[i]``: the tagsCode of the record at ``phy[i]`` with no delay levels (what a 4.9.8 abnormal
    recovery computes), each segment's span from the first to the last of them scanned once."""
    from storelib.scan.scanner import SegmentScan

    S = cl.segment_size
    for base in np.unique(phy // S * S).tolist():
        seg = cl.segment_for(int(base))
        mine = (phy >= base) & (phy < base + S)
        if seg is None:
            continue
        lo, hi = int(phy[mine].min()) - seg.base, int(phy[mine].max()) - seg.base + 1
        src = seg.open()
        try:
            scan = SegmentScan(src, seg.display, seg.base, lo, hi, verify_crc=False, with_properties=False,
                               delay_levels_ms=[], columns=["phy_offset", "tags_code"], **cl.scan_options())
            got = [b for b in scan if b.num_rows]
        except StoreError:
            got = []
        finally:
            src.close()
        if got:
            at = np.concatenate([b.column("phy_offset").to_numpy() for b in got])
            tags = np.concatenate([b.column("tags_code").to_numpy() for b in got])
            i = np.flatnonzero(mine)
            j = np.minimum(np.searchsorted(at, phy[i]), len(at) - 1)
            hit = at[j] == phy[i]
            out[i[hit]] = tags[j[hit]]


def writer_slots_of(P: np.ndarray, Z: np.ndarray, N: np.ndarray, take: np.ndarray,
                    lost: tuple[np.ndarray, np.ndarray], anchor: int | None,
                    segment_size: int | None = None) -> np.ndarray:
    """The queue offset of the unit the broker's CQ writer (putMessagePositionInfo) gives each of one queue's
    records (PHYSICALOFFSET fields ``P``, sizes ``Z``, QUEUEOFFSETs ``N``, in commitlog order; NO_SLOT: none)
    when it gets those in ``take`` and, in physical order among them, the ``lost`` records (fields, QUEUEOFFSETs)
    whose units are all that is left of them; the queue's write position at ``anchor`` (a queue that already
    exists: no first-file fillers; None: the queue is new and its first record creates it, as a negative
    QUEUEOFFSET does at a negative offset in files of ``segment_size`` (default: the broker's):
    ConsumeQueue.putMessagePositionInfo 4.9.8 :478-530, 5.3.3 :787-844; the machine runs from an empty queue).
    Vectorised (the writer's own model, :func:`slide_slots`) while each record ends past the one before (a
    commitlog's order); else :func:`build_consume_queues`' own machine, record by record."""
    idx = np.flatnonzero(take)
    allp = np.r_[P[idx], lost[0]].astype(np.int64)
    order = np.argsort(allp, kind="stable") if len(lost[0]) else np.arange(len(allp))  # else: commitlog order
    q = np.r_[N[idx], lost[1]].astype(np.int64)[order]
    p = allp[order]
    z = np.r_[Z[idx], np.ones(len(lost[0]), np.int64)].astype(np.int64)[order]  # a lost one: its own position
    with np.errstate(over="ignore"):
        ends = p + z
    if anchor is None:
        got = _machine_slots(p, z, q, None, segment_size or DEFAULT_CQ_SEGMENT_SIZE)
    elif len(p) < 2 or bool(np.all(ends[1:] > ends[:-1])):
        got = slide_slots(q, anchor)
    else:
        got = _machine_slots(p, z, q, anchor)
    out = np.full(len(allp), NO_SLOT, np.int64)
    out[order] = got
    slot = np.full(len(P), NO_SLOT, np.int64)
    slot[idx] = out[:len(idx)]
    return slot


def _machine_slots(p: np.ndarray, z: np.ndarray, q: np.ndarray, cur: int | None,
                   S: int = DEFAULT_CQ_SEGMENT_SIZE) -> np.ndarray:
    """The slots :func:`build_consume_queues` gives records that do not end in order (its record-by-record
    machine; rare: damaged PHYSICALOFFSET fields), the queue's write position at slot ``cur`` (slots run on
    across files of any size ``S``), or a new queue (``cur`` None: its files' size ``S`` places them)."""
    k = len(p)
    table = pa.table({"physical_offset_field": p, "size": z, "queue_offset": q, "tags_code": np.zeros(k, np.int64),
                      "topic": pa.DictionaryArray.from_arrays(np.zeros(k, np.int32), ["q"]),
                      "queue_id": np.zeros(k, np.int32), "tran_type": np.zeros(k, np.int8)})
    b = 0 if cur is None else cur * CQ_UNIT_SIZE
    img = build_consume_queues(table, segment_size=S, state=None if cur is None else
                               {("q", 0): QueueState(-1, b - b % S, b % S)})
    got = np.full(k, NO_SLOT, np.int64)
    if img:
        got[img[("q", 0)].rows] = img[("q", 0)].slots
    return got
