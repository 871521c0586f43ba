"""Retention simulator: what the broker's file expiry (store-algorithms §9) would delete, and when.

The core is a pure function, :func:`simulate` (policy + store snapshot + time model -> timeline), so
one snapshot can be evaluated under hundreds of policies (the Spark grid in ``jobs/expiry.py`` runs
the same function). It reproduces the broker's cleaner exactly on its 10-s tick grid (first run 60 s
after start, then every ``cleanResourceInterval``) without ticking: between two deletions nothing but
the write position and the consumers move, both linear in time, so the next tick where the cleaner
does anything is found directly (next deleteWhen hour, next time the oldest segment passes its
reserved time, first tick whose disk ratio crosses a threshold — a binary search, the ratio only grows
between deletions). That tick is then run like the broker runs it.

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
  unit, live index files) — block usage of sparse, mmap-written files. Without a capacity no disk
  pressure is modelled (ratios are reported as null).

Timeline conventions: a commitlog file's ``reason`` is "time" when it was past fileReservedTime and
the run was triggered by the deleteWhen hour, "space" when past it but triggered by disk usage,
"manual" when past it in a run triggered only by an admin request, "forced" when it was not past it
and went because cleanImmediately (cleanFileForciblyEnable and a ratio above the forcible/warning
level). Files of one run are ``deleteCommitLogFilesInterval`` (100 ms) apart, as the cleaner sleeps
between them; CQ and index files deleted in the same tick carry the time the commit-log cleaner
finished and its last reason ("startup" for the first run's catch-up when nothing was deleted). Both
versions clean the commit log then the queues on each tick (4.9.8: one task; 5.x: two executors on the
same schedule, differences #30). Every destroy succeeds (no reader holds a file offline), so the
hanged-file retry never has work.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from storelib.brokerconf import BrokerSettings
from storelib.commitlog import offset_to_file_name
from storelib.errors import Finding, StoreError
from storelib.units import parse_time_ms

HOUR_MS = 3_600_000
FIRST_RUN_DELAY_MS = 60_000  # scheduleAtFixedRate(..., 60 s, cleanResourceInterval)
MANUAL_DELETE_RUNS = 20  # executeDeleteFilesManually sets the counter to 20
DELETE_FILES_BATCH_MAX_4 = 10  # 4.9.8 constant
DEFAULT_HORIZON_MS = 7 * 24 * HOUR_MS
MTIME_TOLERANCE_MS = 60_000
MAX_NEW_SEGMENTS = 100_000  # beyond this the timeline is not worth computing (or reading)
CQ_UNIT = 20
_KEY_SHIFT = 40  # queue index << 40 | logical offset: one sorted key over every queue

# outcome of isTimeToDelete for an hour of day
_FALSE, _TRUE, _ERROR = 0, 1, 2

# extra keys a --policy file may carry besides broker.conf keys
EXTRA_CAPACITY = "diskCapacity"
EXTRA_OTHER_USED = "diskOtherUsed"
EXTRA_MANUAL = "manualDeleteAt"
EXTRA_TZ = "jvmTimeZone"


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
    """isTimeToDelete per hour of day: _TRUE, _FALSE or _ERROR (a part that does not parse is reached).

    UtilAll.isItTimeToDo walks the ``;``-parts in order and returns on the first equal hour, so a bad
    part only throws (aborting that cleaner run) in hours no earlier part matched.
    """
    parts = java_split(delete_when, ";")
    table: list[int] = []
    problem = None
    for h in range(24):
        out = _FALSE
        for p in parts:
            try:
                v = java_parse_int(p)
            except ValueError:
                out = _ERROR
                problem = f"deleteWhen part {p!r} is not an integer: the cleaner run throws (nothing is deleted)"
                break
            if v == h:
                out = _TRUE
                break
        table.append(out)
    return table, problem


def _zone(tz: str) -> Any:
    if tz in ("UTC", "Z", "GMT"):
        return timezone.utc
    from zoneinfo import ZoneInfo

    return ZoneInfo(tz)


# --------------------------------------------------------------------------------------------------
# inputs


@dataclass(frozen=True)
class Policy:
    """The cleaner's settings (already through the broker's getters and clamps) plus the disk model."""

    name: str
    version: str = "4"
    file_reserved_time: int = 72
    delete_when: str = "04"
    disk_max_used_space_ratio: int = 75
    warn_ratio: float = 0.90
    force_ratio: float = 0.85
    clean_file_forcibly_enable: bool = True
    clean_resource_interval: int = 10_000
    delete_commit_log_files_interval: int = 100
    delete_file_batch_max: int = 10
    replicas_per_disk_partition: int = 1
    logical_force_threshold: float = 0.8
    disk_capacity: int | None = None
    disk_other_used: int = 0
    tz: str = "UTC"
    manual_deletes: tuple[int, ...] = ()

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
            delete_commit_log_files_interval=s.delete_commit_log_files_interval, delete_file_batch_max=batch,
            replicas_per_disk_partition=s.replicas_per_disk_partition,
            logical_force_threshold=0.8 if logical is None else logical, disk_capacity=disk_capacity,
            disk_other_used=disk_other_used, tz=tz, manual_deletes=tuple(sorted(manual_deletes)))

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

    @property
    def mtime_source(self) -> str:
        srcs = set(self.seg_mtime_source[:-1]) or set(self.seg_mtime_source)
        return srcs.pop() if len(srcs) == 1 else "mixed"


# --------------------------------------------------------------------------------------------------
# snapshot


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _queue_arrays(store, findings: list[Finding]):
    """Per queue (topic, qid, offsets, phy, size, first CQ file base) from the ConsumeQueue files,
    or from one commitlog scan when there are none."""
    from storelib.consumequeue import ConsumeQueue, filler_mask, list_queues, valid_mask

    out = []
    S = store.settings.mapped_file_size_consume_queue
    try:
        queues = list_queues(store.loc, findings)
    except StoreError:
        queues = []
    for topic, qid, loc in queues:
        with ConsumeQueue(loc, segment_size=S, topic=topic, queue_id=qid) as cq:
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
        keep = np.flatnonzero((tt == 0) | (tt == 2))
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


def load_snapshot(store, *, mtimes: str = "auto", tolerance_ms: int = MTIME_TOLERANCE_MS) -> StoreSnapshot:
    """Read what the simulator needs from a :class:`storelib.store.Store`.

    ``mtimes``: "file" (trust file mtimes), "store-time" (each segment's last message store time), or
    "auto": the file mtime unless it is missing or impossible for that segment — earlier than its last
    message's store time or later than the next segment's first one (beyond ``tolerance_ms``), as after
    a copy that did not keep times (tar with epoch dates, cp without -p).
    """
    from storelib.bytesource import open_source
    from storelib.configjson import consumer_offsets, load_config
    from storelib.indexfile import IndexHeader, list_index_files

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

    # per segment: first and last message store times (one record read each)
    bases = np.array([s.base for s in segs], np.int64)
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
        key_parts.append((np.int64(i) << _KEY_SHIFT) | offs)
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

    # index files
    idx_files = []
    for ref in list_index_files(store.loc, findings):
        try:
            head = open_source(ref.loc, ref.size)
            try:
                end_phy = IndexHeader.from_bytes(bytes(head.read(0, 40)), f"index/{ref.name}").end_phy_offset
            finally:
                head.close()
        except (StoreError, OSError) as e:
            findings.append(Finding("index_unreadable", "warning", f"index/{ref.name}", 0,
                                    f"header unreadable ({e}); the file is left out of the simulation"))
            continue
        idx_files.append((ref.name, int(end_phy), int(ref.size)))

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
        findings=findings)


# --------------------------------------------------------------------------------------------------
# the simulation


class _Sim:
    """One policy over one snapshot; state advanced tick by tick, jumping over idle ticks."""

    def __init__(self, policy: Policy, snap: StoreSnapshot, model: TimeModel):
        self.p, self.s = policy, snap
        self.t_snap = snap.last_store_ms or int(snap.seg_mtime.max())
        span_ms = snap.last_store_ms - snap.first_store_ms
        observed = (snap.write_pos - snap.first_phy) * 1000.0 / span_ms if span_ms > 0 else 0.0
        self.R = float(observed if model.ingest_bytes_per_s is None else model.ingest_bytes_per_s)
        if self.R < 0:
            raise ValueError("ingest rate must not be negative")
        self.ingest_source = "observed" if model.ingest_bytes_per_s is None else "given"
        self.start = self.t_snap if model.start_ms is None else int(model.start_ms)
        if self.start < self.t_snap:
            raise ValueError(f"--from {self.start} is before the store's snapshot time {self.t_snap} "
                             "(the store's state is only known from then on)")
        self.until = self.start + DEFAULT_HORIZON_MS if model.until_ms is None else int(model.until_ms)
        self.horizon_source = "default (7 days)" if model.until_ms is None else "given (--until)"
        if self.until < self.start:
            raise ValueError("--until is before the simulation start")
        new_segments = self.R * (self.until - self.t_snap) / 1000.0 / snap.segment_size
        if new_segments > MAX_NEW_SEGMENTS and model.until_ms is None:
            # a store written in a burst makes the observed rate absurd over 7 days: answer anyway, over the
            # horizon in which the simulated segments stay worth computing, and say so
            self.until = max(self.start, self.t_snap + int(MAX_NEW_SEGMENTS * snap.segment_size * 1000.0 / self.R))
            self.horizon_source = (f"shortened from 7 days: {self.ingest_source} ingest of {self.R:.0f} bytes/s would "
                                   f"write {new_segments:.0f} segments; the simulation ends after {MAX_NEW_SEGMENTS} "
                                   "(give --ingest or --until to choose)")
            new_segments = MAX_NEW_SEGMENTS
        if new_segments > MAX_NEW_SEGMENTS:
            raise ValueError(
                f"{self.ingest_source} ingest of {self.R:.0f} bytes/s would write {new_segments:.0f} new "
                f"{snap.segment_size}-byte segments before the end of the simulation (a store written in a "
                f"burst?); give --ingest BYTES_PER_S or an earlier --until")
        self.P = policy.clean_resource_interval
        self.T0 = self.start + FIRST_RUN_DELAY_MS
        self.kmax = (self.until - self.T0) // self.P if self.until >= self.T0 else -1
        self.expired = policy.file_reserved_time * HOUR_MS
        self.table, self.when_problem = hour_table(policy.delete_when)
        self.zone = _zone(policy.tz)
        self.batch = max(1, policy.delete_file_batch_max)
        self.S = snap.segment_size
        self.W0 = snap.write_pos
        self.n_exist = len(snap.seg_base)
        self.last_exist_base = int(snap.seg_base[-1])
        # queues
        observed_bytes = snap.write_pos - snap.first_phy
        self.mpb = (snap.q_count / observed_bytes) if observed_bytes > 0 else np.zeros(len(snap.q_count))
        self.bound_row = {int(b): i for i, b in enumerate(snap.bounds)}
        self.E = snap.cq_entries_per_file
        self.cq_k = snap.q_first_cq_seg.copy()
        self.n0 = int(snap.q_max_offset.sum())
        self.mpb_total = float(self.mpb.sum())
        self.cq_base_sum = int((self.cq_k * self.E).sum())
        self.idx_first = 0
        self.idx_bytes = sum(f[2] for f in snap.index_files)
        self.last_phys_min = 0
        self.i0 = 0  # first live segment
        self.manual_count = 0
        self.manual_pending = [t for t in policy.manual_deletes]
        # consumers (pairs whose queue exists in the store)
        qindex = {(t, int(q)): i for i, (t, q) in enumerate(zip(snap.q_topic, snap.q_id))}
        self.pairs = snap.groups
        self.pq = np.array([qindex.get((t, q), -1) for (_g, t, q, _o) in self.pairs], np.int64)
        if model.consumption_msgs_per_s is None:
            rate = np.where(self.pq >= 0, self.mpb[np.maximum(self.pq, 0)] * self.R, 0.0) if len(self.pq) else \
                np.zeros(0)
            self.consumption = "observed (each queue's production rate: groups keep their lag)"
        else:
            rate = np.full(len(self.pairs), float(model.consumption_msgs_per_s))
            self.consumption = f"{model.consumption_msgs_per_s} messages/s per queue"
        self.c_rate = rate.astype(np.float64)
        self.lost_msgs = np.zeros(len(self.pairs), np.int64)
        self.lost_bytes = np.zeros(len(self.pairs), np.int64)
        self.first_loss: list[int | None] = [None] * len(self.pairs)
        self.ranges: list[list[list[int]]] = [[] for _ in self.pairs]
        # the pairs whose queue is in the store, as flat per-pair arrays (no per-queue gathers per deletion)
        self.lp = np.flatnonzero(self.pq >= 0)
        lq = self.pq[self.lp]
        self.l_rate = self.c_rate[self.lp]
        self.l_max0 = snap.q_max_offset[lq]
        self.l_mpb = self.mpb[lq]
        self.l_mean = snap.q_mean_size[lq]
        self.l_key = lq.astype(np.int64) << _KEY_SHIFT
        self.l_below = snap.below[:, lq]
        self.c_base = np.array([self.pairs[j][3] for j in self.lp], np.float64)
        self.t_base = float(self.t_snap)
        if len(self.lp):
            # losses before the simulation starts are not the policy's doing: start at the min offset
            self._jump(self.t_snap, self._below_pairs(int(snap.seg_base[0])))
        self.deletions: list[dict[str, Any]] = []
        self.disk: list[dict[str, Any]] = []
        self.max_ratio: float | None = None

    # -- geometry over time -----------------------------------------------------------------
    def base(self, i: int) -> int:
        if i < self.n_exist:
            return int(self.s.seg_base[i])
        return self.last_exist_base + (i - self.n_exist + 1) * self.S

    def W(self, t: int) -> int:
        return self.W0 + math.floor(self.R * (t - self.t_snap) / 1000.0) if t > self.t_snap else self.W0

    def fill_time(self, i: int) -> float:
        """When segment i stops being the newest (the write position reaches its end)."""
        if i < self.n_exist - 1:
            return -math.inf
        end = self.base(i) + self.S
        if end <= self.W0:
            return float(self.t_snap)
        if self.R <= 0:
            return math.inf
        return float(self.t_snap + math.ceil((end - self.W0) * 1000.0 / self.R))

    def newest(self, T: int) -> int:
        """Index of the newest segment at T (the first one the write position has not left)."""
        lo = max(self.i0, self.n_exist - 1)  # older existing segments all have newer ones after them
        if self.fill_time(lo) > T:
            return lo
        # segment i >= n_exist - 1 ends at last_exist_base + (i - n_exist + 2) * S: start from the guess
        i = max(lo, self.n_exist - 2 + (self.W(T) - self.last_exist_base) // self.S)
        while self.fill_time(i) <= T:
            i += 1
        while i > lo and self.fill_time(i - 1) > T:
            i -= 1
        return i

    def mtime(self, i: int) -> float:
        return float(self.s.seg_mtime[i]) if i < self.n_exist - 1 else self.fill_time(i)

    def _proj(self, x: int) -> np.ndarray:
        return self.s.q_max_offset + np.floor((x - self.W0) * self.mpb).astype(np.int64)

    def _below(self, x: int) -> np.ndarray:
        """Per queue: first logical offset whose message starts at or after physical offset x."""
        if x > self.W0:
            return self._proj(x)
        row = self.bound_row.get(x)
        if row is not None:
            return self.s.below[row]
        return self.s.q_max_offset.copy()  # only for boundaries that are not segment bases

    def max_offsets(self, t: int) -> np.ndarray:
        return self._proj(max(self.W(t), self.W0))

    def used(self, t: int) -> tuple[int, int]:
        """(bytes used on the partition, store bytes) at time t.

        CQ bytes are 20 per live unit, with the projected unit count taken over all queues at once
        (a disk model: it differs from the per-queue sum by less than one unit per queue).
        """
        M = self.base(self.i0)
        cl = max(0, self.W(t) - M)
        cq = 0
        if self.s.cq_files:
            units = self.n0 + math.floor((max(self.W(t), self.W0) - self.W0) * self.mpb_total) - self.cq_base_sum
            cq = CQ_UNIT * max(0, units)
        store = cl + cq + self.idx_bytes
        return self.p.disk_other_used + store, store

    def ratios(self, t: int) -> tuple[float | None, bool, bool]:
        """(commitlog ratio, isSpaceToDelete, cleanImmediately) as the broker computes them at t."""
        p = self.p
        if p.disk_capacity is None:
            return None, False, False
        used, store = self.used(t)
        pct = -(-100 * used // p.disk_capacity)  # ceil, integers: exact
        phys = pct / 100  # same double as Math.ceil(...) / 100
        ratio = p.disk_max_used_space_ratio / 100.0
        warn, force = p.warn_ratio, p.force_ratio
        clean = False
        if p.version == "4":
            # commitlog, then the CQ directory: one partition, so both see the same ratio
            if phys > warn or phys > force:
                clean = True
            return phys, phys > ratio, clean
        if phys > warn or phys > force:
            return phys, True, True
        if p.replicas_per_disk_partition <= 1:
            return phys, phys > ratio, False
        logical = store / (p.disk_capacity / p.replicas_per_disk_partition)
        if logical > p.logical_force_threshold:
            return phys, True, True
        return phys, logical > ratio, False

    # -- ticks --------------------------------------------------------------------------------
    def tick(self, k: int) -> int:
        return self.T0 + k * self.P

    def k_at(self, t: float) -> int:
        """Index of the first tick at or after t."""
        if t <= self.T0:
            return 0
        return int(-(-(int(math.ceil(t)) - self.T0) // self.P))

    def hour(self, t: int) -> int:
        return datetime.fromtimestamp(t // 1000, self.zone).hour

    def next_hour(self, t: int) -> int:
        off = datetime.fromtimestamp(t // 1000, self.zone).utcoffset()
        off_ms = int(off.total_seconds() * 1000) if off else 0
        nb = ((t + off_ms) // HOUR_MS + 1) * HOUR_MS - off_ms
        return nb if nb > t else t + 1

    def first_tick_where(self, k: int, allowed: tuple[int, ...]) -> int | None:
        """First tick >= k whose isTimeToDelete outcome is in ``allowed``."""
        if not any(x in allowed for x in self.table):
            return None
        while k <= self.kmax:
            t = self.tick(k)
            if self.table[self.hour(t)] in allowed:
                return k
            k = max(k + 1, self.k_at(self.next_hour(t)))
        return None

    def first_tick_pred(self, k: int, pred) -> int | None:
        """First tick >= k where a predicate monotone in time (between deletions) holds: binary search."""
        if k > self.kmax or not pred(self.tick(self.kmax)):
            return None
        lo, hi = k, self.kmax
        while lo < hi:
            mid = (lo + hi) // 2
            if pred(self.tick(mid)):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def next_event(self, k: int) -> int | None:
        if k > self.kmax:
            return None
        cands: list[int] = []
        if self.manual_count > 0 or self.base(self.i0) > self.last_phys_min:
            return k
        if self.manual_pending:
            cands.append(max(k, self.k_at(self.manual_pending[0])))
        F = self.fill_time(self.i0)
        if F != math.inf:
            E = max(F, self.mtime(self.i0) + self.expired)
            kf = max(k, self.k_at(F))
            ke = max(k, self.k_at(E))
            ok_run = (_FALSE, _TRUE)
            a = self.first_tick_where(ke, (_TRUE,))
            if a is not None:
                cands.append(a)
            if self.p.disk_capacity is not None:
                tS = self.first_tick_pred(kf, lambda t: self.ratios(t)[1])
                tC = (self.first_tick_pred(kf, lambda t: self.ratios(t)[2])
                      if self.p.clean_file_forcibly_enable else None)
                if tS is not None:
                    b = self.first_tick_where(max(tS, ke), ok_run)
                    if b is not None:
                        cands.append(b)
                if tC is not None:
                    c = self.first_tick_where(tC, (_TRUE,))
                    if c is not None:
                        cands.append(c)
                    if tS is not None:
                        d = self.first_tick_where(max(tC, tS), ok_run)
                        if d is not None:
                            cands.append(d)
        cands = [c for c in cands if c <= self.kmax]
        return min(cands) if cands else None

    def run(self) -> None:
        self._sample(self.start)
        k = 0
        while True:
            k = self.next_event(k)
            if k is None:
                break
            self.run_tick(self.tick(k))
            k += 1
        self._sample(self.until)

    def run_tick(self, T: int) -> None:
        """One run of the clean task at tick T: commit-log cleaner, then the queue/index cleaner."""
        while self.manual_pending and self.manual_pending[0] <= T:
            self.manual_pending.pop(0)
            self.manual_count = MANUAL_DELETE_RUNS
        outcome = self.table[self.hour(T)]
        moved_by: str | None = None
        t_last = T
        before = len(self.deletions)
        pre = phys = None
        if outcome != _ERROR:  # otherwise isTimeToDelete throws: the whole run is lost
            phys, space, clean_imm = self.ratios(T)
            time_up = outcome == _TRUE
            manual = self.manual_count > 0
            if time_up or space or manual:
                if manual:
                    self.manual_count -= 1
                pre = self.used(T)
                t_last, moved_by = self._delete_commitlog(T, time_up, space, clean_imm)
        M = self.base(self.i0)
        if M > self.last_phys_min:
            self.last_phys_min = M
            self._clean_queues(t_last, M, moved_by or "startup")
        if len(self.deletions) > before:
            self._sample(T, phys, used=pre)
            self._sample(t_last)

    def _delete_commitlog(self, T: int, time_up: bool, space: bool, clean_imm: bool) -> tuple[int, str | None]:
        """MappedFileQueue.deleteExpiredFileByTime on the segment list as it is at tick T."""
        clean_at_once = self.p.clean_file_forcibly_enable and clean_imm
        # the list snapshot: segments i0 .. last, where last = newest segment at T
        last = self.newest(T)
        now, i, n = T, self.i0, 0
        reason = None
        while i < last:
            aged = now >= self.mtime(i) + self.expired
            if not (aged or clean_at_once):
                break
            reason = ("time" if time_up else "space" if space else "manual") if aged else "forced"
            self._lose(i, now)
            self.deletions.append({"time_ms": now, "file": "commitlog/" + offset_to_file_name(self.base(i)),
                                   "kind": "commitlog", "reason": reason})
            n += 1
            self.i0 = i + 1
            if n >= self.batch:
                break
            if self.p.delete_commit_log_files_interval > 0 and i + 1 < last:
                now += self.p.delete_commit_log_files_interval
            i += 1
        return now, reason

    def _below_pairs(self, x: int) -> np.ndarray:
        """_below(x) for the live pairs' queues."""
        if x > self.W0:
            return self.l_max0 + np.floor((x - self.W0) * self.l_mpb).astype(np.int64)
        row = self.bound_row.get(x)
        return self.l_below[row] if row is not None else self.l_max0

    def _consumed(self, t: int) -> np.ndarray:
        """Committed offsets of the live pairs at t (never past the queue's end)."""
        c = np.floor(self.c_base + self.l_rate * ((t - self.t_base) / 1000.0)).astype(np.int64)
        cap = self.l_max0 + np.floor((max(self.W(t), self.W0) - self.W0) * self.l_mpb).astype(np.int64)
        return np.minimum(c, cap)

    def _jump(self, t: int, below: np.ndarray) -> None:
        """Consumers behind the queue's new min offset resume there."""
        self.c_base = np.maximum(self._consumed(t), below).astype(np.float64)
        self.t_base = float(t)

    def _lose(self, i: int, t: int) -> None:
        """Segment i deleted at t: per pair, the offsets in it at or past the committed offset."""
        if not len(self.lp):
            return
        a = self.base(i)
        lo, hi = self._below_pairs(a), self._below_pairs(a + self.S)
        start = np.maximum(self._consumed(t), lo)
        hit = np.flatnonzero(start < hi)
        if len(hit):
            s_, e_, qmax = start[hit], hi[hit], self.l_max0[hit]
            # existing entries: count and bytes from the sorted (queue, offset) key
            kq = self.l_key[hit]
            i1 = np.searchsorted(self.s.key, kq | np.minimum(s_, qmax), "left")
            i2 = np.searchsorted(self.s.key, kq | np.minimum(e_, qmax), "left")
            # projected entries past the snapshot have the queue's mean size
            fut = np.maximum(0, e_ - np.maximum(s_, qmax))
            cnt = (i2 - i1) + fut
            byt = (self.s.cum_size[i2] - self.s.cum_size[i1]) + np.rint(fut * self.l_mean[hit]).astype(np.int64)
            for j, h in enumerate(self.lp[hit].tolist()):
                if cnt[j] <= 0:
                    continue
                self.lost_msgs[h] += int(cnt[j])
                self.lost_bytes[h] += int(byt[j])
                if self.first_loss[h] is None:
                    self.first_loss[h] = t
                rr = self.ranges[h]
                lo_, hi_ = int(s_[j]), int(e_[j]) - 1
                if rr and rr[-1][1] + 1 >= lo_:
                    rr[-1][1] = max(rr[-1][1], hi_)
                else:
                    rr.append([lo_, hi_])
        self._jump(t, hi)

    def _clean_queues(self, t: int, M: int, reason: str) -> None:
        """CleanConsumeQueueService: CQ files whose last unit is below M, then index files."""
        if self.s.cq_files and len(self.cq_k):
            below = self._below(M)
            mx = self.max_offsets(t)
            last_k = np.where(mx > 0, (mx - 1) // self.E, self.cq_k)  # CQ file holding the last entry
            new_k = np.maximum(self.cq_k, np.minimum(last_k, below // self.E))
            for qi in np.flatnonzero(new_k > self.cq_k):
                d = f"consumequeue/{self.s.q_topic[qi]}/{int(self.s.q_id[qi])}/"
                for kk in range(int(self.cq_k[qi]), int(new_k[qi])):
                    self.deletions.append({"time_ms": t, "file": d + offset_to_file_name(kk * self.E * CQ_UNIT),
                                           "kind": "consumequeue", "reason": reason})
            self.cq_k = new_k
            self.cq_base_sum = int((self.cq_k * self.E).sum())
        files = self.s.index_files
        if self.idx_first < len(files) and files[self.idx_first][1] < M:
            while self.idx_first < len(files) - 1 and files[self.idx_first][1] < M:
                name, _end, size = files[self.idx_first]
                self.deletions.append({"time_ms": t, "file": "index/" + name, "kind": "index", "reason": reason})
                self.idx_bytes -= size
                self.idx_first += 1

    def _sample(self, t: int, phys: float | None = None, used: tuple[int, int] | None = None) -> None:
        used, store = used or self.used(t)
        if phys is None and self.p.disk_capacity is not None:
            phys = -(-100 * used // self.p.disk_capacity) / 100
        if phys is not None:
            self.max_ratio = phys if self.max_ratio is None else max(self.max_ratio, phys)
        if self.disk and self.disk[-1]["time_ms"] == t and self.disk[-1]["used_bytes"] == used:
            return
        self.disk.append({"time_ms": int(t), "used_bytes": int(used), "store_bytes": int(store), "ratio": phys})

    # -- output -------------------------------------------------------------------------------
    def result(self) -> dict[str, Any]:
        groups = []
        for j, (g, t, q, off) in enumerate(self.pairs):
            groups.append({"group": g, "topic": t, "queue_id": int(q), "committed_offset": int(off),
                           "lost_messages": int(self.lost_msgs[j]), "lost_bytes": int(self.lost_bytes[j]),
                           "lost_offsets": [list(r) for r in self.ranges[j]], "first_loss_ms": self.first_loss[j],
                           "in_store": bool(self.pq[j] >= 0)})
        cl = [d for d in self.deletions if d["kind"] == "commitlog"]
        losses = [x["first_loss_ms"] for x in groups if x["first_loss_ms"] is not None]
        summary = {
            "commitlog_deleted": len(cl),
            "consumequeue_deleted": sum(1 for d in self.deletions if d["kind"] == "consumequeue"),
            "index_deleted": sum(1 for d in self.deletions if d["kind"] == "index"),
            "by_reason": {r: sum(1 for d in cl if d["reason"] == r) for r in ("time", "space", "forced", "manual")},
            "first_deletion_ms": cl[0]["time_ms"] if cl else None,
            "lost_messages": int(self.lost_msgs.sum()), "lost_bytes": int(self.lost_bytes.sum()),
            "groups_with_loss": len({x["group"] for x in groups if x["lost_messages"]}),
            "first_loss_ms": min(losses) if losses else None, "max_ratio": self.max_ratio,
        }
        return {"name": self.p.name, "settings": self.p.settings_dict(),
                "warnings": [self.when_problem] if self.when_problem else [],
                "deletions": self.deletions, "disk_usage": self.disk, "groups": groups, "summary": summary}


def simulate(policy: Policy, snap: StoreSnapshot, model: TimeModel | None = None) -> dict[str, Any]:
    """Run one policy over one snapshot: deletion timeline, disk usage and per-group losses (JSON-ready)."""
    sim = _Sim(policy, snap, model or TimeModel())
    sim.run()
    return sim.result()


def describe(snap: StoreSnapshot, model: TimeModel | None = None, policy: Policy | None = None) -> dict[str, Any]:
    """The simulation's assumptions for one store (snapshot and time model), for the report."""
    sim = _Sim(policy or Policy("describe"), snap, model or TimeModel())
    return {
        "store": snap.name, "snapshot_ms": sim.t_snap, "start_ms": sim.start, "until_ms": sim.until,
        "horizon_source": sim.horizon_source,
        "first_tick_ms": sim.T0, "segment_size": snap.segment_size, "write_pos": snap.write_pos,
        "ingest_bytes_per_s": sim.R, "ingest_source": sim.ingest_source, "consumption": sim.consumption,
        "mtime_source": snap.mtime_source,
        "segments": [{"file": "commitlog/" + offset_to_file_name(int(b)), "mtime_ms": int(m), "mtime_source": s}
                     for b, m, s in zip(snap.seg_base, snap.seg_mtime, snap.seg_mtime_source)],
        "queues": len(snap.q_topic), "groups": len(snap.groups),
        "findings": [f.to_dict() for f in snap.findings],
    }
