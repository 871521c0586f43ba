"""Retention simulator, inputs and snapshot (the simulation itself is :mod:`storelib.broker.expiry.cleaner`): what the broker's file expiry (store-algorithms §9) would delete, and when.

The core is a pure function, :func:`simulate` (policy + store snapshot + time model -> timeline), so
one snapshot can be evaluated under hundreds of policies (the Spark grid in ``jobs/expiry.py`` runs
the same function). It reproduces the broker's cleaner exactly on its 10-s tick grid (first run 60 s
after start, then every ``cleanResourceInterval``) without ticking: between two deletions nothing but
the write position and the consumers move, both linear in time, so the next tick where the cleaner
does anything is found directly (next deleteWhen hour, next time the oldest segment passes its
reserved time, first tick whose disk ratio crosses a threshold — a binary search, the ratio only grows
between deletions). That tick is then run like the broker runs it. scheduleAtFixedRate never overlaps
runs: a tick that passes while a run is still deleting (100 ms a file) starts when that run ends and is
judged then; the ticks after it keep their grid times.

Model (all stated in the report, see :func:`simulate`):

* the store as read (:func:`load_snapshot`): commitlog segments with their last-modified times (file
  mtimes, or — when a copy lost them — each segment's last message store time), every ConsumeQueue
  entry's (logical offset, phyOffset, size), the index files' endPhyOffset, and the committed offsets
  of ``config/consumerOffset.json``;
* time moves forward from the snapshot time (last message's store time): the write position grows at
  the ingest rate (observed: bytes between the first and last message over their store-time span);
  each queue keeps its observed share of messages per byte; a segment is last-modified when the write
  position leaves it;
* each consumer group advances on each queue at the consumption rate (observed: the queue's production
  rate, i.e. the group keeps its lag), never past the queue's end; after a deletion a group behind the
  new minimum offset resumes there (the broker corrects OFFSET_TOO_SMALL to the min offset);
* disk: one partition of ``disk_capacity`` bytes holding ``disk_other_used`` bytes of other data plus
  the store's written bytes (commitlog from min offset to the write position, 20 bytes per live CQ
  unit, live index files, with the ones the broker creates as it goes on writing at the observed
  index entries per byte) — block usage of sparse, mmap-written files. Without a capacity no disk
  pressure is modelled (ratios are reported as null);
* writes stop while the disk is marked full (above the warning ratio; DLedger: above its full ratio) and
  resume when a check finds it below the mark again (:mod:`storelib.broker.expiry.diskfull`): the report's
  ``write_refusals`` and ``writes_refused_ms`` / ``writes_refused_total_ms``.

Timeline conventions: a commitlog file's ``reason`` is "time" when it was past fileReservedTime and
the run was triggered by the deleteWhen hour, "space" when past it but triggered by disk usage,
"manual" when past it in a run triggered only by an admin request, "forced" when it was not past it
and went because cleanImmediately (cleanFileForciblyEnable and a ratio above the forcible/warning
level). Files of one run are ``deleteCommitLogFilesInterval`` (100 ms) apart, as the cleaner sleeps
between them. The queue cleaner (:mod:`storelib.broker.expiry.queueclean`) sleeps
``deleteConsumeQueueFilesInterval`` (100 ms) after each queue that deleted, the index files going after the
last sleep; its files carry the reason of the commit-log deletion whose min offset it acted on ("startup"
for the first run's catch-up). 4.9.8 runs it in the clean task after the commit-log cleaner (its sleeps
lengthen the run); 5.x on its own executor on the same ticks, at once with the commit-log cleaner, seeing
the files deleted before it starts (differences #30). Every destroy succeeds (no reader holds a file
offline), so the hanged-file retry never has work.

A DLedger-mode store (``StoreSnapshot.dledger``) keeps its data files under DLedger's own cleaner
(DLedgerMmapFileStore.CleanSpaceService, both lines over DLedger 0.3.1.2; the broker's commit-log cleaner
only hands it deleteWhen, fileReservedTime + 1 hours and cleanFileForciblyEnable, and deletes nothing):
it runs at the broker's start and again 100 ms after each run ends (doWork, then waitForRunning(100)), deletes when the deleteWhen hour is on or the disk is past
diskMaxUsedSpaceRatio (as a Java float), ignores the age above ``dledger.disk.ratio.clean`` (0.85, at
least 0.50) with cleanFileForciblyEnable, at most 10 files a run 100 ms apart, never the last; an admin's
manual delete reaches only the broker's cleaner, so it deletes nothing. Writes are refused (DISK_FULL)
above that ratio + 0.05 (at most 0.95), set at every run, also in an hour whose deleteWhen throws. The broker's queue cleaner still runs on its own ticks and
deletes consume-queue and index files below the first data file's start as it is when the run starts
(docs/dledger.md).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.errors import Finding, StoreError
from storelib.format.record import gets_cq_unit
from storelib.units import parse_time_ms, parse_zone

if TYPE_CHECKING:
    from storelib.broker.settings.store import Store

HOUR_MS = 3_600_000
FIRST_RUN_DELAY_MS = 60_000  # scheduleAtFixedRate(..., 60 s, cleanResourceInterval)
MANUAL_DELETE_RUNS = 20  # executeDeleteFilesManually sets the counter to 20
DELETE_FILES_BATCH_MAX_4 = 10  # 4.9.8 constant
DEFAULT_HORIZON_MS = 7 * 24 * HOUR_MS
MTIME_TOLERANCE_MS = 60_000
MAX_NEW_SEGMENTS = 100_000  # beyond this the timeline is not worth computing (or reading)
CQ_UNIT = 20
QUEUE_KEY_SHIFT = 40  # queue index << 40 | logical offset: one sorted key over every queue

# outcome of isTimeToDelete for an hour of day
HOUR_FALSE, HOUR_TRUE, HOUR_ERROR = 0, 1, 2

# extra keys a --policy file may carry besides broker.conf keys
EXTRA_CAPACITY = "diskCapacity"
EXTRA_OTHER_USED = "diskOtherUsed"
EXTRA_MANUAL = "manualDeleteAt"
EXTRA_TZ = "jvmTimeZone"
EXTRA_DLEDGER_CLEAN = "dledger.disk.ratio.clean"  # DLedger's force-clean ratio (a JVM system property there)
DLEDGER_TICK_MS = 100  # CleanSpaceService.doWork: waitForRunning(100)
DLEDGER_ERROR_SLEEP_MS = 200  # doWork's catch (a deleteWhen that throws): DLedgerUtils.sleep(200)
DLEDGER_BATCH_MAX = 10  # MmapFileList.DELETE_FILES_BATCH_MAX
DLEDGER_DELETE_INTERVAL_MS = 100  # deleteExpiredFileByTime(..., 100, ...)


# --------------------------------------------------------------------------------------------------
# small exact helpers


def java_parse_int(text: str) -> int:
    """Integer.parseInt: optional sign, decimal (Unicode) digits, int32 range; anything else raises."""
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ValueError(f"For input string: {text!r}")
    v = int(text)
    if not -(2**31) <= v < 2**31:
        raise ValueError(f"For input string: {text!r} (out of int range)")
    return v


def java_split(text: str, sep: str) -> list[str]:
    """String.split with a literal one-char separator: trailing empty strings removed."""
    parts = text.split(sep)
    while len(parts) > 1 and parts[-1] == "":
        parts.pop()
    if parts == [""] and text == "":
        return [""]  # "".split(";") is [""] in Java too
    return parts


def hour_table(delete_when: str) -> tuple[list[int], str | None]:
    """isTimeToDelete per hour of day: HOUR_TRUE, HOUR_FALSE or HOUR_ERROR (a part that does not parse is reached).

    UtilAll.isItTimeToDo walks the ``;``-parts in order and returns on the first equal hour, so a bad
    part only throws (aborting that cleaner run) in hours no earlier part matched.
    """
    parts = java_split(delete_when, ";")
    table: list[int] = []
    problem = None
    for h in range(24):
        out = HOUR_FALSE
        for p in parts:
            try:
                v = java_parse_int(p)
            except ValueError:
                out = HOUR_ERROR
                problem = f"deleteWhen part {p!r} is not an integer: the cleaner run throws (nothing is deleted)"
                break
            if v == h:
                out = HOUR_TRUE
                break
        table.append(out)
    return table, problem


# --------------------------------------------------------------------------------------------------
# inputs


@dataclass(frozen=True)
class Policy:
    """The cleaner's settings (already through the broker's getters and clamps) plus the disk model."""

    # the broker's settings: no defaults here, they are BrokerSettings' (one place); see from_settings
    name: str
    version: str
    file_reserved_time: int
    delete_when: str
    disk_max_used_space_ratio: int
    warn_ratio: float
    force_ratio: float
    clean_file_forcibly_enable: bool
    clean_resource_interval: int
    delete_commit_log_files_interval: int
    delete_consume_queue_files_interval: int
    delete_file_batch_max: int
    replicas_per_disk_partition: int
    logical_force_threshold: float
    # the disk model
    disk_capacity: int | None = None
    disk_other_used: int = 0
    tz: str = "UTC"
    manual_deletes: tuple[int, ...] = ()
    dledger_force_ratio: float = 0.85  # DLedgerConfig.diskSpaceRatioToForceClean (-Ddledger.disk.ratio.clean)

    @classmethod
    def from_settings(cls, name: str, s: BrokerSettings, *, disk_capacity: int | None = None,
                      disk_other_used: int = 0, tz: str = "UTC", manual_deletes: tuple[int, ...] = ()) -> Policy:
        """A policy from BrokerSettings; a policy file's own ``diskCapacity``/``diskOtherUsed``/
        ``manualDeleteAt`` (``;``-separated times)/``jvmTimeZone`` keys override the arguments."""
        extra = s.extra
        where = s.source
        try:
            if extra.get(EXTRA_CAPACITY, "").strip():
                disk_capacity = int(float(extra[EXTRA_CAPACITY]))
            if extra.get(EXTRA_OTHER_USED, "").strip():
                disk_other_used = int(float(extra[EXTRA_OTHER_USED]))
            if extra.get(EXTRA_MANUAL, "").strip():
                manual_deletes = tuple(parse_time_ms(x) for x in extra[EXTRA_MANUAL].split(";") if x.strip())
        except ValueError as e:
            raise StoreError(where, None, "bad_config", str(e)) from e
        tz = extra.get(EXTRA_TZ, "").strip() or tz
        try:
            dl_force = float(extra.get(EXTRA_DLEDGER_CLEAN, "").strip() or 0.85)
        except ValueError as e:
            raise StoreError(where, None, "bad_config", f"{EXTRA_DLEDGER_CLEAN}: {e}") from e
        try:
            parse_zone(tz)  # the cleaner reads it per tick: a bad zone is the policy's error, now
        except ValueError as e:
            raise StoreError(where, None, "bad_config", f"{EXTRA_TZ}: {e}") from e
        batch = s.delete_file_batch_max if s.version == "5" else DELETE_FILES_BATCH_MAX_4
        logical = s.logical_disk_space_clean_forcibly_threshold
        if s.clean_resource_interval <= 0:
            raise StoreError(where, None, "bad_config",
                             f"cleanResourceInterval={s.clean_resource_interval}: the broker's scheduler refuses "
                             "a non-positive period")
        if disk_capacity is not None and disk_capacity <= 0:
            raise StoreError(where, None, "bad_config", f"disk capacity {disk_capacity} must be positive")
        return cls(
            name=name, version=s.version, file_reserved_time=s.file_reserved_time, delete_when=s.delete_when,
            disk_max_used_space_ratio=s.disk_max_used_space_ratio, warn_ratio=s.disk_space_warning_ratio,
            force_ratio=s.disk_space_force_ratio, clean_file_forcibly_enable=s.clean_file_forcibly_enable,
            clean_resource_interval=s.clean_resource_interval,
            delete_commit_log_files_interval=s.delete_commit_log_files_interval,
            delete_consume_queue_files_interval=s.delete_consume_queue_files_interval, delete_file_batch_max=batch,
            replicas_per_disk_partition=s.replicas_per_disk_partition,
            logical_force_threshold=0.8 if logical is None else logical, disk_capacity=disk_capacity,
            disk_other_used=disk_other_used, tz=tz, manual_deletes=tuple(sorted(manual_deletes)),
            dledger_force_ratio=dl_force)

    def settings_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("name")
        d["manual_deletes"] = list(self.manual_deletes)
        return d


@dataclass(frozen=True)
class TimeModel:
    """How time moves on from the snapshot. None means: observed (rates) / snapshot time / +7 days."""

    start_ms: int | None = None
    until_ms: int | None = None
    ingest_bytes_per_s: float | None = None
    consumption_msgs_per_s: float | None = None


@dataclass
class StoreSnapshot:
    """What the simulator needs from a store, as plain arrays (picklable, no open files)."""

    name: str
    segment_size: int
    seg_base: np.ndarray  # int64, existing commitlog segments in order
    seg_mtime: np.ndarray  # int64, last-modified time used (file mtime or reconstructed)
    seg_mtime_source: list[str]  # "file" | "store_time" | "unknown" per segment
    write_pos: int  # end of the last message (W0)
    first_phy: int  # phyOffset of the first message still in the store
    first_store_ms: int
    last_store_ms: int
    q_topic: list[str]
    q_id: np.ndarray  # int32
    q_max_offset: np.ndarray  # int64: logical offset after the last entry
    q_first_cq_seg: np.ndarray  # int64: number (base / file bytes) of the first CQ file present
    q_count: np.ndarray  # int64: valid (non-filler) entries
    q_mean_size: np.ndarray  # float64
    cq_entries_per_file: int
    key: np.ndarray  # int64 sorted: queue index << 40 | logical offset (valid entries)
    cum_size: np.ndarray  # int64, len(key) + 1: cumulative sizes along ``key``
    bounds: np.ndarray  # int64 sorted boundaries <= write_pos (segment bases and ends)
    below: np.ndarray  # int64 (len(bounds), Q): first logical offset with phyOffset >= boundary
    index_files: list[tuple[str, int, int]]  # (name, endPhyOffset, size)
    cq_files: bool  # positions came from ConsumeQueue files (False: commitlog scan, no CQ files to expire)
    groups: list[tuple[str, str, int, int]]  # (group, topic, queue_id, committed offset)
    findings: list[Finding] = field(default_factory=list)
    dledger: bool = False  # a DLedger-mode store: its data files go by DLedger's cleaner
    # the index as the simulated broker goes on writing it (storelib.broker.expiry.queueclean)
    index_per_byte: float = 0.0  # observed index entries per commit-log byte (0: no new index files)
    index_last_count: int = 1  # the last index file's indexCount (as loaded)
    index_num: int = 0  # maxIndexNum: a file is full at indexCount >= maxIndexNum
    index_file_size: int = 0  # bytes of a new index file
    log_folder: str = "commitlog"  # the segments' folder as shown (dledger-<id>/data)

    @property
    def mtime_source(self) -> str:
        srcs = set(self.seg_mtime_source[:-1]) or set(self.seg_mtime_source)
        return srcs.pop() if len(srcs) == 1 else "mixed"


# --------------------------------------------------------------------------------------------------
# snapshot


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _queue_arrays(store: Store, findings: list[Finding]):
    """Per queue (topic, qid, offsets, phy, size, first CQ file base) from the ConsumeQueue files,
    or from one commitlog scan when there are none."""
    from storelib.broker.settings.cqload import LoadedQueue
    from storelib.format.consumequeue import filler_mask, list_queues, valid_mask

    out = []
    S = store.settings.mapped_file_size_consume_queue
    try:
        queues = list_queues(store.loc, findings)
    except StoreError:
        queues = []
    for topic, qid, loc in queues:
        with LoadedQueue(loc, segment_size=S, topic=topic, queue_id=qid, phy_limit=store.cq_limit) as cq:
            findings.extend(cq.findings)
            if not cq.segments:
                continue
            offs, phys, sizes = [], [], []
            for first, units in cq.entries():
                ok = valid_mask(units) & ~filler_mask(units)
                idx = np.flatnonzero(ok)
                offs.append(first + idx.astype(np.int64))
                phys.append(units["phy_offset"][idx].astype(np.int64))
                sizes.append(units["size"][idx].astype(np.int64))
            mx = cq.max_offset()
            first_base = cq.segments[0].base
        out.append((topic, qid, _cat(offs), _cat(phys), _cat(sizes), mx, first_base // S))
    if out:
        return out, "consumequeue"
    # no ConsumeQueue: dispatchable records of the commitlog (normal and committed transactions)
    cols: dict[str, list] = {k: [] for k in ("topic", "queue_id", "queue_offset", "phy_offset", "size")}
    for batch in store.scan(verify_crc=False, with_properties=False):
        tt = batch.column("tran_type").to_numpy(zero_copy_only=False)
        keep = np.flatnonzero(gets_cq_unit(tt))
        for k in cols:
            cols[k].append(batch.column(k).take(keep).to_numpy(zero_copy_only=False))
    if not cols["topic"] or not sum(len(c) for c in cols["topic"]):
        return [], "none"
    topic = np.concatenate(cols["topic"]).astype(object)
    qid = np.concatenate(cols["queue_id"]).astype(np.int64)
    qoff = np.concatenate(cols["queue_offset"]).astype(np.int64)
    phy = np.concatenate(cols["phy_offset"]).astype(np.int64)
    size = np.concatenate(cols["size"]).astype(np.int64)
    names, tix = np.unique(topic, return_inverse=True)
    gid = tix.astype(np.int64) * (2**32) + qid
    order = np.lexsort((phy, gid))
    gid, qoff, phy, size = gid[order], qoff[order], phy[order], size[order]
    starts = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]])
    ends = np.r_[starts[1:], len(gid)]
    for a, b in zip(starts, ends):
        t, q = names[gid[a] // 2**32], int(gid[a] % 2**32)
        out.append((str(t), q, qoff[a:b], phy[a:b], size[a:b], int(qoff[b - 1]) + 1, 0))
    out.sort(key=lambda x: (x[0], x[1]))
    return out, "commitlog"


def _store_time(cl, phy: int) -> int | None:
    try:
        chk = cl.read(int(phy), check_crc=False)
    except StoreError:
        return None
    return chk.message.store_timestamp if chk.kind == "message" and chk.message else None


def load_snapshot(store: Store, *, mtimes: str = "auto", tolerance_ms: int = MTIME_TOLERANCE_MS) -> StoreSnapshot:
    """Read what the simulator needs from a :class:`storelib.broker.settings.store.Store`.

    ``mtimes``: "file" (trust file mtimes), "store-time" (each segment's last message store time), or
    "auto": the file mtime unless it is missing or impossible for that segment — earlier than its last
    message's store time or later than the next segment's first one (beyond ``tolerance_ms``), as after
    a copy that did not keep times (tar with epoch dates, cp without -p).
    """
    from storelib.format.configjson import consumer_offsets, load_config

    if mtimes not in ("auto", "file", "store-time"):
        raise ValueError(f"mtimes must be auto, file or store-time, not {mtimes!r}")
    findings: list[Finding] = []
    cl = store.commitlog
    findings.extend(cl.findings)
    segs = [s for s in cl.segments if s.file_size > 0]
    if not segs:
        raise StoreError(store.uri, None, "no_commitlog", "no commitlog segments: nothing to expire")
    S = cl.segment_size
    queues, source = _queue_arrays(store, findings)
    Q = len(queues)
    all_phy = np.sort(np.concatenate([q[3] for q in queues])) if Q else np.zeros(0, np.int64)
    all_end = np.concatenate([q[3] + q[4] for q in queues]) if Q else np.zeros(0, np.int64)
    first_phy = int(all_phy[0]) if len(all_phy) else segs[0].base
    write_pos = int(all_end.max()) if len(all_end) else segs[0].base
    first_ms = _store_time(cl, first_phy) if len(all_phy) else None
    last_ms = _store_time(cl, int(all_phy[-1])) if len(all_phy) else None

    bases = np.array([s.base for s in segs], np.int64)
    mt, src = _segment_mtimes(cl, segs, all_phy, bases, mtimes, tolerance_ms, findings)

    # per-queue arrays
    key_parts, size_parts = [], []
    q_topic, q_id, q_max, q_first, q_count, q_mean = [], [], [], [], [], []
    for i, (topic, qid, offs, _phy, size, mx, first_seg) in enumerate(queues):
        q_topic.append(topic)
        q_id.append(qid)
        q_max.append(mx)
        q_first.append(first_seg)
        q_count.append(len(offs))
        q_mean.append(float(size.mean()) if len(size) else 0.0)
        key_parts.append((np.int64(i) << QUEUE_KEY_SHIFT) | offs)
        size_parts.append(size)
    key = np.concatenate(key_parts) if key_parts else np.zeros(0, np.int64)
    sizes = np.concatenate(size_parts) if size_parts else np.zeros(0, np.int64)
    cum = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    bounds = np.unique(np.concatenate([bases, bases + S]))
    bounds = bounds[bounds <= write_pos]
    below = np.zeros((len(bounds), Q), np.int64)
    for i, (_t, _q, offs, phy, _s, mx, _f) in enumerate(queues):
        if len(offs):
            idx = np.searchsorted(phy, bounds, "left")
            below[:, i] = np.where(idx < len(offs), offs[np.minimum(idx, len(offs) - 1)], mx)
        else:
            below[:, i] = mx

    idx_files, idx_rate, idx_count = _index_file_ends(store, findings)

    # consumer groups
    cfg = load_config(store.loc, "consumerOffset.json")
    findings.extend(cfg.findings)
    offsets = consumer_offsets(cfg.data, findings=findings, file=cfg.path)
    groups = sorted((g, t, q, off) for (t, g), qs in offsets.items() for q, off in qs.items())
    if source == "commitlog":
        findings.append(Finding("no_consumequeue", "info", "consumequeue", None,
                                "no ConsumeQueue files: queue positions taken from a commitlog scan"))
    return StoreSnapshot(
        name=store.uri, segment_size=S, seg_base=bases, seg_mtime=np.array(mt, np.int64), seg_mtime_source=src,
        write_pos=write_pos, first_phy=first_phy, first_store_ms=first_ms or 0, last_store_ms=last_ms or 0,
        q_topic=q_topic, q_id=np.array(q_id, np.int32), q_max_offset=np.array(q_max, np.int64),
        q_first_cq_seg=np.array(q_first, np.int64), q_count=np.array(q_count, np.int64),
        q_mean_size=np.array(q_mean, np.float64),
        cq_entries_per_file=store.settings.mapped_file_size_consume_queue // CQ_UNIT, key=key, cum_size=cum,
        bounds=bounds, below=below, index_files=idx_files, cq_files=source == "consumequeue", groups=groups,
        findings=findings, dledger=store.dledger is not None, log_folder=cl.folder, index_per_byte=idx_rate,
        index_last_count=idx_count, index_num=int(store.settings.max_index_num),
        index_file_size=int(store.settings.index_file_size))


def _segment_mtimes(cl, segs: list, all_phy: np.ndarray, bases: np.ndarray, mtimes: str, tolerance_ms: int,
                    findings: list[Finding]) -> tuple[list[int], list[str]]:
    """Each segment's last-modified time as the cleaner will see it, and where it came from (see
    :func:`load_snapshot`'s ``mtimes``)."""
    S = cl.segment_size
    # per segment: first and last message store times (one record read each)
    lo = np.searchsorted(all_phy, bases, "left")
    hi = np.searchsorted(all_phy, bases + S, "left")
    seg_first, seg_last = [], []
    for a, b in zip(lo, hi):
        seg_first.append(_store_time(cl, all_phy[a]) if b > a else None)
        seg_last.append(_store_time(cl, all_phy[b - 1]) if b > a else None)
    mt, src = [], []
    for i, s in enumerate(segs):
        fm = s.mtime_ms if s.mtime_ms and s.mtime_ms > 0 else None
        last_t = seg_last[i]
        nxt = next((t for t in seg_first[i + 1:] if t is not None), None)
        ok = fm is not None and (last_t is None or fm >= last_t - tolerance_ms) and (
            nxt is None or fm <= nxt + tolerance_ms)
        if mtimes == "file" and fm is not None:
            ok = True
        if mtimes == "store-time" and last_t is not None:
            ok = False
        if ok:
            mt.append(fm)
            src.append("file")
        elif last_t is not None:
            mt.append(last_t)
            src.append("store_time")
        else:
            mt.append(fm if fm is not None else 0)
            src.append("file" if fm is not None else "unknown")
    if any(x == "store_time" for x in src[:-1]):
        findings.append(Finding("mtime_reconstructed", "info", "commitlog", None,
                                "segment mtimes look lost in a copy; last-modified times reconstructed from "
                                "each segment's last message store time",
                                {"segments": [s.name for s, x in zip(segs, src) if x == "store_time"]}))
    return mt, src


def _index_file_ends(store: Store, findings: list[Finding]) -> tuple[list[tuple[str, int, int]], float, int]:
    """(name, endPhyOffset, size) of every readable index file IndexService.load keeps: what decides when the
    cleaner (deleteExpiredFile, over the loaded list) deletes it; the entries the reader skips judged as the
    load meets them (:func:`storelib.broker.settings.storeloads.broker_index_refs`); the entries per commit-log
    byte they hold (indexCount - 1 each, over the bytes from the first file's beginPhyOffset to the last one's
    endPhyOffset); the last file's indexCount."""
    from storelib.fileio.bytesource import open_source
    from storelib.format.indexfile import IndexHeader

    idx_files = []
    heads: list[IndexHeader] = []
    for ref in store.loaded_index_files(findings):
        try:
            head = open_source(ref.loc, ref.size)
            try:
                header = IndexHeader.from_bytes(bytes(head.read(0, 40)), f"index/{ref.name}")
                end_phy = header.end_phy_offset
            finally:
                head.close()
        except (StoreError, OSError) as e:
            findings.append(Finding("index_unreadable", "warning", f"index/{ref.name}", 0,
                                    f"header unreadable ({e}); the file is left out of the simulation"))
            continue
        idx_files.append((ref.name, int(end_phy), int(ref.size)))
        heads.append(header)
    if not heads:
        return idx_files, 0.0, 1
    entries = sum(h.loaded_index_count - 1 for h in heads)
    span = heads[-1].end_phy_offset - min(h.begin_phy_offset for h in heads if h.loaded_index_count > 1) \
        if entries else 0
    return idx_files, (entries / span if span > 0 else 0.0), heads[-1].loaded_index_count
