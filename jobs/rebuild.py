"""Rebuild ConsumeQueue and IndexFile files from the commitlog, byte-identical to the broker.

Runnable with ``spark-submit --properties-file spark-conf/spark-defaults.conf jobs/rebuild.py STORE
--out DIR`` and importable (``rmqstore rebuild`` calls :func:`rebuild`).

The target is store-algorithms §7.1: what a broker writes when started on the commitlog with empty
``consumequeue/`` and ``index/`` and no abort file. The recovery walk (storelib.recovery) fixes the
valid end (processOffset) and which records reput dispatches; then:

* engine ``local``: storelib.dispatch.dispatch_store in this process;
* engine ``spark``: phase A parses every segment on an executor (one task per segment, longest
  first; inside the recovery window with CRC checks, so the walk itself is distributed) into Arrow
  columns of what dispatch needs plus the index keys with their slot chains numbered within the
  segment (storelib.indexbuild.local_chains); the driver finishes the walk from the per-segment ends.
  Phase B shuffles CQ rows by queue (one partition per core) and each task runs build_consume_queues
  for its queues and writes their files. Phase C numbers the index keys globally (prefix sums of
  per-segment counts), and each index file is built by one task that links the segments' chains
  (each segment's oldest key per slot to the slot table left by the segments before it) and streams
  the file in order, hashing as it writes (storelib.indexbuild.stream_index_file; slices cut by a file
  boundary or the duplicate test get their chains recomputed). Phases B and C are independent and
  run as one Spark job, index files first, so the consume-queue tasks use the cores an index file
  leaves free. Both engines produce the same bytes; both keep freed memory in the malloc heap
  (:func:`keep_freed_memory`) and write index files past the page cache (storelib.direct_write).

Index file names are not derivable (the broker uses the wall clock at creation): the policy is
``yyyyMMddHHmmssSSS`` of the file's first entry's store time in UTC (the empty successor of a full
last file: the last entry's time), bumped by 1 ms to stay strictly increasing
(storelib.indexfile.index_file_name). Compare index files by order, not by name.

Output goes to a staging directory next to the destination and is published atomically with a
manifest (``rebuild-manifest.json``: counts, per-file sha256, source fingerprint, settings, the
recovery walk); a directory without a manifest is never complete. ``--in-place`` writes into the
source store only after moving what it replaces into ``rebuild-backup-<time>/``. ``--incremental``
dispatches only what the store's consume queues lack (from their max physical offset, as reput does),
continuing the last CQ segments and the last index file; only changed or new files are output.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from jobs.engines import Engine, add_engine_args, make_engine, resolve_engine_name
from storelib.brokerconf import BrokerSettings
from storelib.bytesource import Location, open_source, resolve
from storelib.checkpoint import Checkpoint, read_checkpoint
from storelib.commitlog import Split
from storelib.cqwriter import build_consume_queues, write_consume_queues
from storelib.direct_write import atomic_direct_file
from storelib.dispatch import dispatch_store, index_geometry
from storelib.errors import StoreError
from storelib.indexbuild import (
    ChainRun,
    IndexImage,
    IndexState,
    build_index_files,
    index_key_rows,
    local_chains,
    stream_index_file,
)
from storelib.indexfile import ENTRY_DTYPE, IndexGeometry, IndexHeader, index_file_name, list_index_files
from storelib.javahash import java_hash_array
from storelib.publish import (
    MANIFEST_NAME,
    is_partial,
    publish_tree,
    read_manifest,
    tree_files,
)
from storelib.recovery import (
    RecoveryResult,
    SegmentTask,
    WalkPlan,
    finish_walk,
    iter_task,
    plan_recovery,
    rebuild_target,
    recovery_walk,
    store_inputs,
)
from storelib.smallfile_io import atomic_write, fsync_dir
from storelib.store import Store
from storelib.store import load_settings as store_settings
from storelib.topicname import escape_topic, unsafe_reason, unsafe_topic_finding

WHAT = ("consumequeue", "index", "timer")
DEFAULT_WHAT = ("consumequeue", "index")
CQ_COLS = ["physical_offset_field", "size", "tags_code", "topic", "queue_id", "queue_offset", "tran_type"]
SCAN_COLS = ["phy_offset", "size", "physical_offset_field", "topic", "queue_id", "queue_offset", "tran_type",
             "store_timestamp", "tags_code", "uniq_key", "keys"]
STAGING_TAG = ".rebuild-staging-"


@dataclass
class RebuildConfig:
    """Everything one rebuild needs (the CLI and spark-submit arguments)."""

    store: str
    out: str | None = None
    what: tuple[str, ...] = DEFAULT_WHAT
    broker_conf: str | None = None
    broker_version: str = "auto"  # "4", "5" or "auto"
    overrides: dict = field(default_factory=dict)  # broker.conf key -> value (--set)
    engine: str = "local"  # "auto" | "local" | "pool" | "spark"
    workers: int | None = None  # pool engine: worker processes (default: all cores)
    master: str | None = None
    in_place: bool = False
    incremental: bool = False
    partitions: int | None = None
    fs_options: dict[str, Any] = field(default_factory=dict)
    progress: bool = True
    name_tz: str = "UTC"


class Reporter:
    """Stage and segment progress lines on stderr."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.t0 = time.monotonic()
        # crash-safety tests slow the job down to kill it mid-way (seconds per progress line)
        self.delay = float(os.environ.get("RMQSTORE_REBUILD_TEST_DELAY_S", "0") or 0)

    def __call__(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(f"rebuild [{time.monotonic() - self.t0:7.1f}s] {text}\n")
            sys.stderr.flush()
        if self.delay:
            time.sleep(self.delay)


# ---------------------------------------------------------------------------------------------
# settings, fingerprint, hashing


def load_settings(cfg: RebuildConfig, root: Location) -> BrokerSettings:
    return store_settings(cfg.broker_conf, cfg.broker_version, cfg.overrides, root)


def _sha256(loc: Location) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    with loc.fs.open_input_stream(loc.path) as f:
        while True:
            b = f.read(8 << 20)
            if not b:
                break
            h.update(b)
            n += len(b)
    return h.hexdigest(), n


def hash_tree(root: Location, rels: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """{relative path: {size, sha256}} for files under ``root`` (threads: hashing releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    rels = sorted(rels) if rels is not None else [r for r in tree_files(root) if r != MANIFEST_NAME]
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2))) as ex:
        res = list(ex.map(lambda r: _sha256(root.join(*r.split("/"))), rels))
    return {r: {"size": n, "sha256": h} for r, (h, n) in zip(rels, res)}


def store_fingerprint(store: Store) -> dict[str, Any]:
    """What identifies the source: each segment's name, size, mtime and sha256 of its first 64 KiB, the
    checkpoint bytes; plus a digest over all of it."""
    segs = []
    for s in store.commitlog.segments:
        with s.open() as src:
            head = bytes(src.read(0, min(65536, s.file_size))) if s.file_size else b""
        segs.append({"name": s.name, "size": s.file_size, "mtime_ms": s.mtime_ms,
                     "head_sha256": hashlib.sha256(head).hexdigest()})
    cp = None
    with contextlib.suppress(StoreError, OSError):
        c = read_checkpoint(store.loc, strict=False)
        cp = c.__dict__
    digest = hashlib.sha256(repr((segs, cp)).encode()).hexdigest()
    return {"uri": store.uri, "segments": segs, "checkpoint": cp, "digest": digest}


# ---------------------------------------------------------------------------------------------
# destinations


def _check_not_inside(out: Location, root: Location) -> None:
    if not (out.local and root.local):
        if out.fs.type_name == root.fs.type_name and (out.path + "/").startswith(root.path.rstrip("/") + "/"):
            raise StoreError(out.path, None, "bad_output", "the output is inside the source store (use --in-place)")
        return
    o, r = os.path.realpath(out.path), os.path.realpath(root.path)
    if o == r or o.startswith(r + os.sep):
        raise StoreError(out.path, None, "bad_output", "the output is inside the source store (use --in-place)")
    if r.startswith(o + os.sep):
        raise StoreError(out.path, None, "bad_output", "the output directory contains the source store")


def _check_dest(out: Location) -> None:
    """A destination must be absent, empty, a previous rebuild output, or one whose publish was interrupted.

    The last two are replaced (an interrupted publish carries the publishing marker and no manifest, so
    it can never be mistaken for a complete output; rerunning completes it).
    """
    info = out.fs.get_file_info(out.path)
    if info.type == pafs.FileType.NotFound:
        return
    if info.type != pafs.FileType.Directory:
        raise StoreError(out.path, None, "bad_output", "output exists and is not a directory")
    files = tree_files(out)
    if files and read_manifest(out) is None and not is_partial(out):
        raise StoreError(out.path, None, "bad_output",
                         "output directory is not empty and holds no rebuild manifest; refusing to replace it")


def _remove_stale_staging(parent: str, prefix: str) -> None:
    """Staging directories of crashed runs (never published) are removed."""
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            if name.startswith(prefix):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _make_staging(cfg: RebuildConfig, root: Location, out: Location | None, engine_name: str = "local") -> Location:
    tag = f"{uuid.uuid4().hex[:10]}"
    if cfg.in_place:
        _remove_stale_staging(root.path, STAGING_TAG)
        path = os.path.join(root.path, STAGING_TAG + tag)
        os.makedirs(path)
        return resolve(path)
    assert out is not None
    if out.local:
        parent = os.path.dirname(os.path.abspath(out.path))
        os.makedirs(parent, exist_ok=True)
        prefix = "." + os.path.basename(out.path) + STAGING_TAG
        _remove_stale_staging(parent, prefix)
        path = os.path.join(parent, prefix + tag)
        os.makedirs(path)
        return resolve(path)
    if engine_name == "spark":  # executors (maybe on other hosts) write straight to the remote filesystem
        st = Location(out.fs, out.path.rstrip("/") + STAGING_TAG + tag, False)
        out.fs.create_dir(st.path, recursive=True)
        return st
    return resolve(tempfile.mkdtemp(prefix="rmqstore" + STAGING_TAG))


def _drop_staging(st: Location) -> None:
    if st.local:
        shutil.rmtree(st.path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError, pa.ArrowException):
            st.fs.delete_dir(st.path)


# ---------------------------------------------------------------------------------------------
# index file writing (local or any pyarrow filesystem)


@contextlib.contextmanager
def _remote_output(loc: Location) -> Iterator[Any]:
    """An output stream to a temp object beside ``loc``, moved over it once written (copied where the
    filesystem cannot move); the temp object is removed when writing fails."""
    loc.fs.create_dir(loc.path.rsplit("/", 1)[0], recursive=True)
    tmp = loc.path + f".{uuid.uuid4().hex[:8]}.tmp"
    try:
        with loc.fs.open_output_stream(tmp) as f:
            yield f
    except BaseException:
        with contextlib.suppress(OSError, pa.ArrowException):
            loc.fs.delete_file(tmp)
        raise
    try:
        loc.fs.move(tmp, loc.path)
    except (OSError, NotImplementedError, pa.ArrowException):
        pafs.copy_files(tmp, loc.path, source_filesystem=loc.fs, destination_filesystem=loc.fs)
        loc.fs.delete_file(tmp)


def write_index_image(image: IndexImage, loc: Location) -> None:
    if loc.local:
        os.makedirs(os.path.dirname(loc.path), exist_ok=True)
        image.write(loc.path)
        return
    g = image.geometry
    with _remote_output(loc) as f:
        f.write(image.header.to_bytes())
        f.write(np.asarray(image.slots, dtype=">i4").tobytes())
        f.write(bytes(g.entry_pos(1) - g.entries_offset))  # entry 0 is never written: zeros
        ent = np.asarray(image.entries, dtype=ENTRY_DTYPE).tobytes()
        f.write(ent)
        left = g.file_size - g.entry_pos(1) - len(ent)
        zeros = bytes(min(left, 8 << 20))
        while left > 0:
            f.write(zeros[: min(left, len(zeros))])
            left -= len(zeros)


def write_index_runs(runs: list[ChainRun], loc: Location, geometry: IndexGeometry,
                     prev_state: IndexState | None) -> tuple[IndexHeader, str]:
    """Stream one index file from its runs (storelib.indexbuild.stream_index_file) to a temp file beside
    ``loc``, then rename it; returns (header, sha256). Local files get a sparse zero tail and an fsync."""
    if loc.local:
        with atomic_direct_file(loc.path) as fh:  # written once, never read back: past the page cache
            return stream_index_file(runs, fh, geometry=geometry, prev_state=prev_state, sparse_tail=True)
    with _remote_output(loc) as f:
        return stream_index_file(runs, f, geometry=geometry, prev_state=prev_state)


def _full_state(geometry: IndexGeometry, end_phy: int, end_ts: int) -> IndexState:
    """A stand-in for a previous, full index file: what build_index_files needs to start the next one
    (its end offset/time for the first entry's timeDiff and the duplicate test; no entries are read)."""
    E = geometry.entries_per_file
    hdr = IndexHeader(end_timestamp=end_ts, end_phy_offset=end_phy, index_count=E + 1)
    return IndexState(hdr, np.zeros(0, np.int32), np.broadcast_to(np.zeros(1, ENTRY_DTYPE), (E,)))


# ---------------------------------------------------------------------------------------------
# process memory


MALLOC_KEEP = 512 << 20  # bytes of freed memory a rebuild process keeps for reuse (and the largest heap block)
_malloc_kept = False


def keep_freed_memory() -> None:
    """Let glibc's malloc serve blocks up to MALLOC_KEEP from the heap and keep that much freed memory.

    By default every array above 32 MB is a fresh mmap and is unmapped when freed: the next task (a
    reused Spark worker) or the next dispatch chunk faults in and zeroes new pages again, and with the
    page cache full of store files each fault can wait on reclaim. Kept in the heap, the memory is
    reused: on the 2 GB bench store the consume-queue tasks took 0.45 CPU-s instead of 0.62 and the
    local engine 9.2-10.0 s instead of 10.2-11.0 s. Once per process; MALLOC_MMAP_THRESHOLD_ /
    MALLOC_TRIM_THRESHOLD_ in the environment (the user's choice) win; no-op without glibc.
    """
    global _malloc_kept
    if _malloc_kept:
        return
    _malloc_kept = True
    if sys.platform != "linux" or "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, MALLOC_KEEP)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, MALLOC_KEEP)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


# ---------------------------------------------------------------------------------------------
# the Spark engine: executor-side functions (module level so that they pickle by reference)


WORK = "_work"  # intermediate files inside staging (removed before publishing)


def _queue_partition(table: pa.Table, parts: int) -> tuple[np.ndarray, list[str]]:
    """Deterministic partition of each CQ row by (topic, queue id) (Java hash; the same on every worker),
    and the distinct topics. Each distinct topic is hashed once."""
    enc = table.column("topic").combine_chunks().dictionary_encode()
    th = java_hash_array(enc.dictionary).astype(np.int64)
    h = th[np.asarray(enc.indices)]
    q = np.asarray(table.column("queue_id").combine_chunks()).astype(np.int64)
    return ((h * 31 + q) % parts + parts) % parts, enc.dictionary.to_pylist()


def _write_ipc(loc: Location, table: pa.Table) -> None:
    if loc.local:
        os.makedirs(os.path.dirname(loc.path), exist_ok=True)
    with loc.fs.open_output_stream(loc.path) as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)


def _read_ipc(loc: Location) -> pa.Table:
    if loc.local:
        with pa.memory_map(loc.path) as f:
            return pa.ipc.open_file(f).read_all()
    with loc.fs.open_input_file(loc.path) as f:
        return pa.ipc.open_file(f).read_all()


def _cq_part(staging: Location, idx: int, p: int) -> Location:
    return staging.join(WORK, f"cq-{idx:06d}-{p:05d}.arrow")


def _keys_file(staging: Location, idx: int) -> Location:
    return staging.join(WORK, f"keys-{idx:06d}.arrow")


def _recs_file(staging: Location, idx: int) -> Location:
    return staging.join(WORK, f"recs-{idx:06d}.arrow")


def phase_a(ctx: dict[str, Any], item: tuple[int, Split, bool]) -> dict[str, Any]:
    """Parse one segment (the walk's view of it): CQ rows per queue partition and the index keys go to
    files under staging/_work; returns the segment's small summary (its scan end, counts, key stats)."""
    idx, split, crc = item
    keep_freed_memory()
    loc = resolve(split.uri, **ctx["fs_options"])
    plan: WalkPlan = ctx["plan"]
    staging: Location = ctx["staging"]
    task = SegmentTask(idx, split.segment_base, split.segment_name, split.start, crc)
    ends: list = []
    cq_tables: list[pa.Table] = []
    hs, ps, ts, rs, rec_p, rec_t = [], [], [], [], [], []
    rows = 0
    last_key_row = -1
    cols = SCAN_COLS + (["prop_crc_ok"] if plan.prop_crc and crc else [])
    with open_source(loc, split.file_size) as src:
        for batch in iter_task(plan, task, src, delay_levels_ms=ctx["delay_levels"], ends=ends,
                               with_properties=False, columns=cols):
            if batch.num_rows == 0:
                continue
            if ctx["do_cq"]:
                cq_tables.append(pa.Table.from_batches([batch.select(CQ_COLS)]))
            if ctx["do_index"]:
                kr = index_key_rows(batch)
                if len(kr["row_index"]):
                    last_key_row = rows + int(kr["row_index"][-1])
                hs.append(kr["key_hash"])
                ps.append(kr["phy_offset"])
                ts.append(kr["store_timestamp"])
                rs.append(kr["row_index"] + rows)
                rec_p.append(np.asarray(batch.column("physical_offset_field")))
                rec_t.append(np.asarray(batch.column("store_timestamp")))
            rows += batch.num_rows
    parts: list[int] = []
    cq_rows = 0
    topics: list[str] = []
    if cq_tables:
        t = pa.concat_tables(cq_tables)
        tt = np.asarray(t.column("tran_type"))
        keep = np.flatnonzero((tt == 0) | (tt == 2))
        if len(keep) < t.num_rows:
            t = t.take(pa.array(keep))
        cq_rows = t.num_rows
        if cq_rows:
            P = ctx["parts"]
            part, topics = _queue_partition(t, P)
            order = np.argsort(part.astype(np.int16 if P < 2**15 else np.int64), kind="stable")  # radix sort
            sp = part[order]
            t = t.take(pa.array(order))  # rows grouped by partition, dispatch order kept within each
            cuts = np.flatnonzero(np.r_[True, sp[1:] != sp[:-1], True])
            for a, b in zip(cuts[:-1], cuts[1:]):
                p = int(sp[a])
                _write_ipc(_cq_part(staging, idx, p), t.slice(int(a), int(b - a)))
                parts.append(p)
    h = np.concatenate(hs, dtype=np.int32) if hs else np.zeros(0, np.int32)
    p_ = np.concatenate(ps, dtype=np.int64) if ps else np.zeros(0, np.int64)
    tsa = np.concatenate(ts, dtype=np.int64) if ts else np.zeros(0, np.int64)
    ra = np.concatenate(rs, dtype=np.int32) if rs else np.zeros(0, np.int32)
    if ctx["do_index"] and len(h):
        # the segment's slot chains with local numbers: the index-file task only links them up
        q, e = local_chains(h, ctx["geometry"].hash_slot_num)
        # a record's PHYSICALOFFSET and store time are kept once, not once per key (~3 keys a record)
        _write_ipc(_keys_file(staging, idx), pa.table({"h": h, "r": ra, "q": q, "e": e}))
        _write_ipc(_recs_file(staging, idx), pa.table({"p": np.concatenate(rec_p, dtype=np.int64),
                                                       "t": np.concatenate(rec_t, dtype=np.int64)}))
    mono = bool(len(p_) < 2 or np.all(p_[1:] >= np.maximum.accumulate(p_)[:-1]))
    return {
        "idx": idx, "end": ends[0], "rows": rows, "cq_rows": cq_rows, "n_keys": len(h), "topics": topics,
        "parts": parts, "p_first": int(p_[0]) if len(p_) else None, "p_max": int(p_.max()) if len(p_) else None,
        "monotone": mono, "last_key_row": last_key_row,
        "last_key": (int(p_[-1]), int(tsa[-1])) if len(p_) else None,
    }


def _kept(keys: tuple, m_before: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The §6.1 step 2 duplicate test within one segment, given the running max before it:
    (hash, phy, time, record row) of the keys the broker indexes."""
    h, p, t, r = keys
    if len(p) == 0:
        return h, p, t, r
    before = np.maximum.accumulate(np.concatenate(([m_before], p[:-1])))
    idx = np.flatnonzero(p >= before)
    return h[idx], p[idx], t[idx], r[idx]


def _load_keys(ctx: dict[str, Any], idx: int, m_before: dict[int, int] | None, *, runs: bool = False) -> tuple:
    """(hash, phy, time, record row) of a segment's indexed keys; with ``runs`` also its ChainRun when
    its precomputed chains still hold (every key kept), else None."""
    tb = _read_ipc(_keys_file(ctx["staging"], idx))
    recs = _read_ipc(_recs_file(ctx["staging"], idx))
    h, r = np.asarray(tb.column("h")), np.asarray(tb.column("r"))
    keys = (h, np.asarray(recs.column("p"))[r], np.asarray(recs.column("t"))[r], r)
    if m_before is not None:
        keys = _kept(keys, m_before[idx])
    if not runs:
        return keys
    whole = len(keys[0]) == tb.num_rows
    run = ChainRun(*keys[:3], np.asarray(tb.column("q")), np.asarray(tb.column("e"))) if whole else None
    return keys, run


def count_kept(ctx: dict[str, Any], m_before: dict[int, int], idx: int) -> tuple[int, int, int, tuple[int, int] | None]:
    """(segment, kept keys, record row of the last kept key, its (phy, time)) — slow path only."""
    h, p, t, r = _load_keys(ctx, idx, m_before)
    if len(p) == 0:
        return idx, 0, -1, None
    return idx, len(p), int(r[-1]), (int(p[-1]), int(t[-1]))


def first_times(ctx: dict[str, Any], E: int, offsets: dict[int, int], m_before: dict[int, int] | None,
                idx: int) -> list[tuple[int, int]]:
    """(file number, store time of its first entry) for files whose first key is in segment ``idx``."""
    h, p, t, _ = _load_keys(ctx, idx, m_before)
    o = offsets[idx]
    out = []
    f = -(-o // E)
    while f * E < o + len(p):
        out.append((f, int(t[f * E - o])))
        f += 1
    return out


def phase_b(ctx: dict[str, Any], job: tuple[int, list[int]]) -> dict[str, Any]:
    """Build and write the consume queues of partition ``p`` from its per-segment parts, in dispatch order."""
    p, segs = job
    staging: Location = ctx["staging"]
    tables = [_read_ipc(_cq_part(staging, i, p)) for i in sorted(segs)]
    if not tables:
        return {"queues": 0, "cq_records": 0, "files": {}}
    table = pa.concat_tables(tables)
    images = build_consume_queues(table, segment_size=ctx["cq_size"])
    digests: dict[str, str] = {}  # hashed as written: reading back sparse files costs page-cache fills
    paths = write_consume_queues(images, staging.join("consumequeue"), ctx["cq_size"], digests=digests)
    base = staging.path.rstrip("/") + "/"
    files = {path[len(base):]: {"size": ctx["cq_size"], "sha256": digests[path]} for path in paths}
    return {"queues": len(images), "cq_records": table.num_rows, "files": files}


def phase_c(ctx: dict[str, Any], names: list[str], E: int, offsets: dict[int, int], counts: dict[int, int],
            m_before: dict[int, int] | None, f: int) -> dict[str, Any]:
    """Build and write index file ``f``: keys ``[f*E, (f+1)*E)`` in global order, read from the segments
    that hold them, continuing from the previous file's last key (entry 1's timeDiff)."""
    lo, hi = f * E, (f + 1) * E
    g: IndexGeometry = ctx["geometry"]
    runs: list[ChainRun] = []
    prev = None
    for idx in sorted(offsets):
        o, c = offsets[idx], counts[idx]
        if c == 0 or o + c <= lo - 1 or o >= hi:
            continue
        (h, p, t, _), run = _load_keys(ctx, idx, m_before, runs=True)
        a, b = max(lo, o) - o, min(hi, o + c) - o
        if b > a:
            if run is None or b - a < c:  # filtered or cut by a file boundary: chains of the slice
                run = ChainRun.of(h[a:b], p[a:b], t[a:b], g.hash_slot_num)
            runs.append(run)
        if f > 0 and o <= lo - 1 < o + c:
            prev = (int(p[lo - 1 - o]), int(t[lo - 1 - o]))
    if f > 0 and prev is None:
        raise StoreError("index", None, "internal", f"index file {f}: previous file's last key is missing")
    state = _full_state(g, prev[0], prev[1]) if prev is not None else None
    name = names[f]
    _, digest = write_index_runs(runs, ctx["staging"].join("index", name), g, state)
    return {"file": f, "rel": f"index/{name}", "size": g.file_size, "sha256": digest,
            "keys": sum(len(r) for r in runs)}



def phase_bc(ctx: dict[str, Any], index_args: tuple | None, item: tuple[str, Any]) -> tuple[str, dict[str, Any]]:
    """One task of the combined phase B/C job: a consume-queue partition or an index file."""
    kind, arg = item
    keep_freed_memory()
    t0 = time.monotonic()
    if kind == "cq":
        res = phase_b(ctx, arg)
    else:
        names, E, offsets, counts, m_before = index_args
        res = phase_c(ctx, names, E, offsets, counts, m_before, arg)
    res["seconds"] = round(time.monotonic() - t0, 3)
    return kind, res


# ---------------------------------------------------------------------------------------------
# engines


@dataclass
class EngineResult:
    recovery: RecoveryResult
    records: int = 0
    cq_records: int = 0
    queues: int = 0
    index_keys: int = 0
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: list[Any] = field(default_factory=list)


def _check_supported(res: RecoveryResult) -> None:
    if not res.supported:
        why = "; ".join(str(f) for f in res.findings if f.severity == "critical")
        raise StoreError("commitlog", None, "unsupported", f"the broker's dispatch cannot be reproduced: {why}")


def run_local(store: Store, settings: BrokerSettings, staging: Location, what: tuple[str, ...], say: Reporter,
              name_tz: str = "UTC") -> EngineResult:
    keep_freed_memory()
    say("walk: recovery window (store-algorithms §7.1)")
    res = rebuild_target(store, version=settings.version)
    _check_supported(res)
    say(f"walk: processOffset {res.process_offset} ({res.start_reason})")
    n = len(store.commitlog.segments)
    done = {"seg": -1}
    S = store.commitlog.segment_size

    def prog(phy: int) -> None:
        i = phy // S
        if i != done["seg"]:
            done["seg"] = i
            say(f"dispatch: segment {min(i + 1, n)}/{n}")

    out = staging
    d = dispatch_store(store.loc, settings, from_offset=None, to_offset=res.process_offset, out_root=out, what=what,
                       name_tz=name_tz, commitlog=store.commitlog, progress=prog)
    if d.unsupported:
        raise StoreError("commitlog", None, "unsupported", "; ".join(str(f) for f in d.findings))
    say(f"dispatch: {d.records} records, {d.cq_records} CQ entries, {d.index_keys} index keys; hashing outputs")
    files = hash_tree(staging)
    queues = len({tuple(r.split("/")[1:3]) for r in files if r.startswith("consumequeue/")})
    return EngineResult(res, d.records, d.cq_records, queues, d.index_keys, files, list(d.findings))


def run_tasks(engine: Engine, store: Store, settings: BrokerSettings, staging: Location, what: tuple[str, ...],
              say: Reporter, fs_options: dict[str, Any], partitions: int | None = None,
              name_tz: str = "UTC") -> EngineResult:
    """Phases A/B/C as tasks on ``engine`` (a process pool or Spark); intermediates are exchanged through
    files in ``staging/_work`` (no shuffle or cache of Python objects), which every worker reads and
    writes itself."""
    inputs = store_inputs(store, version=settings.version, last_exit_ok=True, cq_max_phy_offset=-1,
                          checkpoint=Checkpoint())
    plan = plan_recovery(inputs, store.commitlog.segments)
    tasks = plan.tasks
    # one consume-queue partition per core: they run beside the index-file task(s), and a task costs
    # tens of ms of scheduling here, more than finer balancing gains
    P = partitions or engine.parallelism
    do_index = "index" in what and bool(settings.message_index_enable)
    g = index_geometry(settings)
    ctx = {"plan": plan, "fs_options": fs_options, "delay_levels": list(settings.delay_levels_ms),
           "do_cq": "consumequeue" in what, "do_index": do_index, "parts": P,
           "cq_size": int(settings.mapped_file_size_consume_queue), "staging": staging, "geometry": g,
           "empty_index_count": 1 if settings.version == "5" else 0}
    if not tasks:
        return EngineResult(finish_walk(plan, {}))
    items = []
    for t in tasks:
        seg = plan.segments[t.index]
        uri = seg.loc.path if seg.loc.local else f"{seg.loc.fs.type_name}://{seg.loc.path}"
        items.append((t.index, Split(seg.base, seg.name, uri, t.start, seg.file_size, seg.file_size), t.crc))
    # longest first (segments scanned with CRC checks, then the biggest): the stage ends evenly
    items.sort(key=lambda it: (not it[2], -it[1].file_size, it[0]))
    say(f"phase A: parsing {len(items)} segment(s) on executors")
    try:
        metas = {m["idx"]: m for m in engine.map(partial(phase_a, ctx), items, "phase A: segments", say)}
        say(f"phase A: {len(metas)}/{len(items)} segments parsed, {sum(m['rows'] for m in metas.values())} records")
        res = finish_walk(plan, {i: m["end"] for i, m in metas.items()})
        _check_supported(res)
        say(f"walk: processOffset {res.process_offset} ({res.start_reason})")
        base_to_idx = {s.base: i for i, s in enumerate(plan.segments)}
        inc = sorted({base_to_idx[d.base] for d in res.dispatch})
        for d in res.dispatch:  # a full rebuild dispatches whole segment scans
            m = metas[base_to_idx[d.base]]
            if d.start != 0 or d.end != m["end"].file_offset:
                raise StoreError("commitlog/" + d.name, d.end, "internal", "dispatch range is not a whole scan")
        out = EngineResult(res, records=sum(metas[i]["rows"] for i in inc))
        # an unsafe name never reaches an executor's makedirs (write_consume_queues skips it): reported once
        unsafe = sorted({(t, plan.segments[i].name) for i in inc for t in metas[i]["topics"]
                         if unsafe_reason(t) is not None}, key=lambda x: (x[0], x[1]))
        for topic in dict.fromkeys(t for t, _ in unsafe):
            first = next(seg for t, seg in unsafe if t == topic)
            out.findings.append(unsafe_topic_finding(topic, f"commitlog/{first}", None, None))
        files: dict[str, dict[str, Any]] = {}
        cq_jobs: list[tuple[int, list[int]]] = []
        if ctx["do_cq"]:
            cq_jobs = [(p, [i for i in inc if p in metas[i]["parts"]]) for p in range(P)]
            cq_jobs = [j for j in cq_jobs if j[1]]
        ix = _index_plan(engine, metas, inc, ctx, out, say, name_tz) if do_index else None
        # phases B and C are independent: one Spark job runs both, index files first (one long task
        # per file) so the consume-queue tasks fill the other cores around them
        work: list[tuple[str, Any]] = [("index", f) for f in range(ix.nfiles if ix else 0)]
        work += [("cq", j) for j in cq_jobs]
        if ctx["do_cq"]:
            say(f"phase B: consume queues in {len(cq_jobs)} partition(s)")
        if ix is not None and ix.nfiles:
            say(f"phase C: {ix.keys} index keys → {ix.nfiles} index file(s)")
        results = []
        if work:
            results = engine.map(partial(phase_bc, ctx, ix.job_args() if ix else None), work, "phases B/C: tasks", say)
        for kind, s in results:
            if kind == "cq":
                files.update(s["files"])
                out.queues += s["queues"]
                out.cq_records += s["cq_records"]
            else:
                files[s["rel"]] = {"size": s["size"], "sha256": s["sha256"]}
        if ctx["do_cq"]:
            say(f"phase B: {out.queues} queues, {out.cq_records} entries, "
                f"{sum(1 for r in files if r.startswith('consumequeue/'))} files "
                f"(task seconds: {sum(s['seconds'] for k, s in results if k == 'cq'):.1f})")
        if any(k == "index" for k, _ in results):
            say(f"phase C: longest index-file task {max(s['seconds'] for k, s in results if k == 'index'):.1f} s")
        if ix is not None:
            files.update(_write_extra_index(ix, staging))
            say(f"phase C: {sum(1 for r in files if r.startswith('index/'))} index file(s) written")
        out.files = dict(sorted(files.items()))
        return out
    finally:
        _drop_staging(staging.join(WORK))


@dataclass
class IndexPlan:
    """Where each index file's keys come from (global key numbering) and the files' names."""

    E: int
    offsets: dict[int, int]
    counts: dict[int, int]
    m_before: dict[int, int] | None
    names: list[str]
    extra: list[IndexImage]
    keys: int

    @property
    def nfiles(self) -> int:
        return len(self.names)

    def job_args(self) -> tuple:
        return self.names, self.E, self.offsets, self.counts, self.m_before


def _index_plan(engine: Engine, metas: dict[int, dict], inc: list[int], ctx: dict[str, Any], out: EngineResult,
                say: Reporter, name_tz: str) -> IndexPlan:
    g: IndexGeometry = ctx["geometry"]
    E = g.entries_per_file
    keyed = [i for i in inc if metas[i]["n_keys"]]
    # §6.1 step 2 duplicate test: a running max over keyed phy offsets (fast path: already increasing)
    run = 0
    m_before: dict[int, int] = {}
    fast = True
    for i in inc:
        m = metas[i]
        m_before[i] = run
        if m["n_keys"]:
            if not m["monotone"] or m["p_first"] < run:
                fast = False
            run = max(run, m["p_max"])
    counts: dict[int, int] = {i: 0 for i in inc}
    last_key_seg = None
    last_key = None
    last_row_of_last = -1
    mb = None
    if fast:
        for i in keyed:
            counts[i] = metas[i]["n_keys"]
            last_key_seg, last_key, last_row_of_last = i, metas[i]["last_key"], metas[i]["last_key_row"]
    else:
        say("phase C: PHYSICALOFFSET fields are not increasing: applying the broker's duplicate test")
        got = {i: (c, lr, lk) for i, c, lr, lk in engine.map(partial(count_kept, ctx, m_before), keyed,
                                                            "phase C: duplicate test")}
        for i in keyed:
            counts[i] = got[i][0]
            if counts[i]:
                last_key_seg, last_row_of_last, last_key = i, got[i][1], got[i][2]
        mb = m_before
    offsets: dict[int, int] = {}
    K = 0
    for i in inc:
        offsets[i] = K
        K += counts[i]
    out.index_keys = K
    if last_key_seg is None:
        trailing = False
    else:
        later_rows = sum(metas[i]["rows"] for i in inc if i > last_key_seg)
        trailing = later_rows > 0 or last_row_of_last < metas[last_key_seg]["rows"] - 1
    nfiles = -(-K // E) if K else 0
    extra: list[IndexImage] = []
    empty = {"key_hash": [], "phy_offset": [], "store_timestamp": []}
    if K == 0:
        if out.records:
            extra = build_index_files(empty, geometry=g, emit_empty=True, empty_index_count=ctx["empty_index_count"],
                                      name_tz=None)
    elif trailing and K % E == 0:
        extra = build_index_files(empty, geometry=g, prev_state=_full_state(g, last_key[0], last_key[1]),
                                  emit_empty=False, trailing_dispatch=True, empty_index_count=ctx["empty_index_count"],
                                  name_tz=None)
    names: list[str] = []
    last = None
    if nfiles:
        with_keys = [i for i in keyed if counts[i]]
        if ctx["staging"].local:  # memory-mapped key files: the driver reads one time per file itself
            firsts = dict(pair for i in with_keys for pair in first_times(ctx, E, offsets, mb, i))
        else:
            firsts = dict(pair for lst in engine.map(partial(first_times, ctx, E, offsets, mb), with_keys,
                                                     "phase C: first times")
                          for pair in lst)
        for f in range(nfiles):
            last = index_file_name(firsts[f], name_tz, after=last)
            names.append(last)
    for im in extra:
        im.name = index_file_name(im.first_timestamp or 0, name_tz, after=last)
        last = im.name
    return IndexPlan(E, offsets, counts, mb, names, extra, K)


def _write_extra_index(ix: IndexPlan, staging: Location) -> dict[str, dict[str, Any]]:
    """The empty successor/only file the broker would have (built on the driver, no keys)."""
    files = {}
    for im in ix.extra:
        write_index_image(im, staging.join("index", im.name))
        # hashed from memory: the file is all but empty, and reading back its holes fills page cache
        files[f"index/{im.name}"] = {"size": im.geometry.file_size, "sha256": im.sha256()}
    return files


# ---------------------------------------------------------------------------------------------
# incremental (reput over what the store's consume queues lack)


def _seed_incremental(root: Location, staging: Location, settings: BrokerSettings, what: tuple[str, ...]
                      ) -> dict[str, tuple[int, int]]:
    """Hard-link (or copy) the files an incremental dispatch continues into staging: the last three
    segments of each queue (enough for the broker's CQ recovery) and the last index file. Writers
    replace files (temp + rename), so a link never lets them modify the source. Returns the seeded
    files' (device, inode) to tell unchanged ones apart afterwards."""
    from storelib.consumequeue import ConsumeQueue, list_queues

    seeded: dict[str, tuple[int, int]] = {}

    def link(src: str, rel: str) -> None:
        dst = os.path.join(staging.path, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        st = os.stat(dst)
        seeded[rel] = (st.st_dev, st.st_ino)

    cq_size = int(settings.mapped_file_size_consume_queue)
    for topic, qid, loc in list_queues(root):
        with ConsumeQueue(loc, segment_size=cq_size, topic=topic, queue_id=qid) as cq:
            for seg in cq.segments[-3:]:
                link(seg.path, f"consumequeue/{topic}/{os.path.basename(loc.path)}/{seg.name}")
    if "index" in what:
        refs = list_index_files(root)
        if refs:
            link(refs[-1].loc.path, f"index/{refs[-1].name}")
    return seeded


def run_incremental(store: Store, settings: BrokerSettings, staging: Location, what: tuple[str, ...],
                    say: Reporter, name_tz: str = "UTC") -> tuple[EngineResult, list[str]]:
    if not store.local:
        raise StoreError(store.uri, None, "unsupported", "--incremental needs a local store")
    keep_freed_memory()
    inputs = store_inputs(store, version=settings.version, last_exit_ok=True)
    res = recovery_walk(store, inputs)
    _check_supported(res)
    if inputs.cq_max_phy_offset > res.process_offset:
        raise StoreError("consumequeue", None, "cq_ahead",
                         f"consume queues reach physical offset {inputs.cq_max_phy_offset}, past the valid commitlog "
                         f"end {res.process_offset}: the broker would truncate them; run a full rebuild")
    say(f"incremental: consume queues end at {inputs.cq_max_phy_offset}, commitlog at {res.process_offset}")
    seeded = _seed_incremental(store.loc, staging, settings, what)
    d = dispatch_store(store.loc, settings, from_offset=None, to_offset=res.process_offset, out_root=staging,
                       what=what, name_tz=name_tz, commitlog=store.commitlog)
    if d.unsupported:
        raise StoreError("commitlog", None, "unsupported", "; ".join(str(f) for f in d.findings))
    changed = []
    for rel in tree_files(staging):
        p = os.path.join(staging.path, rel)
        st = os.stat(p)
        if seeded.get(rel) == (st.st_dev, st.st_ino):
            os.unlink(p)  # untouched: not part of the output
        else:
            changed.append(rel)
    for dirpath, _dirs, _ in sorted(os.walk(staging.path), reverse=True):  # drop empty seeded dirs
        if dirpath != staging.path and not os.listdir(dirpath):
            os.rmdir(dirpath)
    say(f"incremental: dispatched {d.records} records from {d.from_offset}; {len(changed)} file(s) changed")
    files = hash_tree(staging, changed)
    queues = len({tuple(r.split("/")[1:3]) for r in changed if r.startswith("consumequeue/")})
    return EngineResult(res, d.records, d.cq_records, queues, d.index_keys, files, list(d.findings)), changed


# ---------------------------------------------------------------------------------------------
# publishing


def _publish_in_place(root: Location, staging: Location, manifest: dict[str, Any], what: tuple[str, ...],
                      changed: list[str] | None) -> str:
    """Move the staged output into the store, after moving what it replaces into a backup directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    backup = os.path.join(root.path, f"rebuild-backup-{stamp}")
    os.makedirs(backup)
    manifest["backup"] = backup
    # the manifest of the store goes stale first: a crash in between never leaves a manifest that
    # describes files which are not there
    with contextlib.suppress(FileNotFoundError):
        os.rename(os.path.join(root.path, MANIFEST_NAME), os.path.join(backup, MANIFEST_NAME))
    if changed is None:  # full: whole directories
        for w in what:
            cur = os.path.join(root.path, w)
            if os.path.lexists(cur):
                os.rename(cur, os.path.join(backup, w))
            src = os.path.join(staging.path, w)
            if os.path.isdir(src):
                os.rename(src, cur)
            else:
                os.makedirs(cur)
    else:
        for rel in changed:
            cur = os.path.join(root.path, rel)
            if os.path.lexists(cur):
                os.makedirs(os.path.dirname(os.path.join(backup, rel)), exist_ok=True)
                shutil.copy2(cur, os.path.join(backup, rel))
            os.makedirs(os.path.dirname(cur), exist_ok=True)
            os.replace(os.path.join(staging.path, rel), cur)
    fsync_dir(root.path)
    import json

    atomic_write(os.path.join(backup, "rebuild-manifest.json"),
                       json.dumps(manifest, indent=2, ensure_ascii=False).encode())
    atomic_write(os.path.join(root.path, MANIFEST_NAME), json.dumps(manifest, indent=2, ensure_ascii=False).encode())
    shutil.rmtree(staging.path, ignore_errors=True)
    return root.path


# ---------------------------------------------------------------------------------------------
# the job


def _rebuild_timer_store(store: Store, settings: BrokerSettings, staging: Location, say: Reporter
                         ) -> dict[str, dict[str, Any]]:
    """``--what timer``: timerlog, wheel and timercheck for the pending timers (storelib.timerrebuild)."""
    from storelib.timermsg import timer_messages
    from storelib.timerrebuild import enqueue_units, rebuilt_checkpoint
    from storelib.timerstore import read_timer_checkpoint, read_timerlog, write_timer_store

    if not staging.local:
        raise StoreError(None, None, "unsupported", "--what timer writes to a local --out only")
    precision = int(settings.timer_precision_ms or 1000)
    file_size = int(settings.mapped_file_size_timer_log or 100 * 1024 * 1024)
    has_log = store.exists("timerlog")
    log = read_timerlog(store.loc, file_size) if has_log else None
    timers = timer_messages(store, log or read_timerlog(staging, file_size), precision)
    units, slots = enqueue_units(timers, file_size, precision, settings.timer_roll_window_slot)
    cp = read_timer_checkpoint(store.loc) if store.exists("config", "timercheck") else None
    written = write_timer_store(staging.path, units, slots, rebuilt_checkpoint(cp, units, file_size),
                                file_size=file_size, precision_ms=precision)
    say(f"timer: {units.num_rows} pending timer(s) enqueued into {len([w for w in written if '/timerlog/' in w])} "
        f"timerlog file(s), {slots.num_rows} wheel slot(s)")
    return hash_tree(staging, [os.path.relpath(w, staging.path).replace(os.sep, "/") for w in written])


def _cq_layout_notes(root: Location, what: tuple[str, ...], in_place: bool) -> list[str]:
    """What the source's ConsumeQueue layout means for a rebuild: the rebuilt files are the file-based
    layout a default store has. In place that would sit beside (or over) a 5.x RocksDB CQ database or a
    BatchConsumeQueue topic the broker reads instead: refused."""
    from storelib.consumequeue import batch_cq_topics, is_rocksdb_consumequeue

    if "consumequeue" not in what:
        return []
    notes = []
    if is_rocksdb_consumequeue(root):
        notes.append("[warning] consumequeue: the source keeps its consume queues in RocksDB (storeType=defaultRocksDB); "
                     "the rebuilt consumequeue/ is the file-based layout (storeType=default)")
    batch = batch_cq_topics(root)
    if batch:
        notes.append(f"[warning] batchconsumequeue: topic(s) {', '.join(escape_topic(t) for t in sorted(batch))} use "
                     "5.x BatchConsumeQueue files, which rmqstore does not write; their rebuilt consume queues are "
                     "the file-based layout")
    if notes and in_place:
        raise StoreError("consumequeue", None, "unsupported_layout",
                         "; ".join(n.split(": ", 1)[1] for n in notes) + ": --in-place would put them beside the "
                         "broker's own; rebuild into --out, or --what index")
    return notes


def rebuild(cfg: RebuildConfig, spark=None, engine: Engine | None = None) -> dict[str, Any]:
    """Run one rebuild; returns the manifest (also written next to the output).

    ``cfg.engine``: ``local`` runs the one-process dispatcher (storelib.dispatch); ``pool`` and ``spark``
    run the same phase tasks on a process pool or Spark; ``auto`` picks (:func:`jobs.engines.resolve_engine_name`).
    ``engine``: run the phase tasks on this engine instead (the caller owns it)."""
    what = tuple(cfg.what)
    for w in what:
        if w not in WHAT:
            raise StoreError(None, None, "bad_value", f"--what must be among {','.join(WHAT)}, not {w!r}")
    if "timer" in what and cfg.in_place:
        raise StoreError(None, None, "unsupported", "--what timer writes into --out only (its bytes depend on "
                         "run-time timing; install them by hand after a look)")
    if cfg.in_place == bool(cfg.out):
        raise StoreError(None, None, "bad_value", "give exactly one of --out DIR and --in-place")
    say = Reporter(cfg.progress)
    t0 = time.time()
    root = resolve(cfg.store, **cfg.fs_options)
    settings = load_settings(cfg, root)
    store = Store(root, settings)
    store.require_records("rebuild")
    out = None
    layout_notes = _cq_layout_notes(root, what, cfg.in_place)
    if cfg.in_place:
        if not store.local:
            raise StoreError(store.uri, None, "remote_store", "--in-place needs a local store")
        from storelib.markers import lock_state

        if lock_state(store.loc).held_by_other:
            raise StoreError("lock", None, "broker_running", "a live broker holds the store lock; stop it first")
    else:
        out = resolve(cfg.out, **cfg.fs_options)
        _check_not_inside(out, root)
        _check_dest(out)
    segs = store.commitlog.segments
    engine_name = engine.name if engine is not None else resolve_engine_name(
        cfg.engine, master=cfg.master if spark is None else "given", store_bytes=sum(x.file_size for x in segs),
        segments=len(segs))
    if cfg.incremental:
        engine_name = "local"
    say(f"store {store.uri}: {len(segs)} segment(s), broker {settings.version}.x settings, "
        f"engine {engine_name}{' (incremental)' if cfg.incremental else ''}")
    for f in store.commitlog.findings:
        say(f"note: {f}")
    staging = _make_staging(cfg, root, out, engine_name)
    try:
        changed = None
        t_work = time.time()  # from here: work (a Spark session's start is moved out of it below)
        timer = "timer" in what
        what = tuple(w for w in what if w != "timer")  # what the dispatch writes
        if not what:  # --what timer alone: the walk for the manifest, no dispatch
            res = rebuild_target(store, version=settings.version)
            _check_supported(res)
            er = EngineResult(res)
        elif cfg.incremental:
            er, changed = run_incremental(store, settings, staging, what, say, cfg.name_tz)
        elif engine is not None or engine_name in ("pool", "spark"):
            own = engine is None
            if own:
                engine = make_engine(engine_name, spark=spark, master=cfg.master, workers=cfg.workers,
                                     app_name="rmqstore-rebuild")
                t_work = time.time()
            say(f"engine: {engine.describe()}")
            try:
                er = run_tasks(engine, store, settings, staging, what, say, cfg.fs_options, cfg.partitions, cfg.name_tz)
            finally:
                if own:
                    engine.close()
        else:
            er = run_local(store, settings, staging, what, say, cfg.name_tz)
        if timer:
            er.files.update(_rebuild_timer_store(store, settings, staging, say))
        elapsed = time.time() - t0
        work = time.time() - t_work
        manifest = {
            "tool": "rmqstore rebuild",
            "mode": "incremental" if cfg.incremental else "full",
            "engine": engine_name,
            "created_ms": int(time.time() * 1000),
            "source": store_fingerprint(store),
            "settings": {
                "broker_version": settings.version, "what": list(what) + (["timer"] if timer else []),
                "broker_line": settings.line.to_json() if settings.line else None,
                "mapped_file_size_commit_log": store.commitlog.segment_size,
                "mapped_file_size_consume_queue": int(settings.mapped_file_size_consume_queue),
                "max_hash_slot_num": int(settings.max_hash_slot_num), "max_index_num": int(settings.max_index_num),
                "message_delay_level": settings.message_delay_level,
                "message_index_enable": bool(settings.message_index_enable),
                "index_name_policy": f"first entry store time, yyyyMMddHHmmssSSS in {cfg.name_tz}, +1 ms to stay "
                                     "strictly increasing",
                "broker_conf": cfg.broker_conf,
            },
            "recovery": er.recovery.summary(),
            "counts": {"records": er.records, "cq_records": er.cq_records, "queues": er.queues,
                       "index_keys": er.index_keys,
                       "cq_files": sum(1 for r in er.files if r.startswith("consumequeue/")),
                       "index_files": sum(1 for r in er.files if r.startswith("index/"))},
            "findings": [str(f) for f in er.findings] + layout_notes,
            "skipped_topics": [f.extra for f in er.findings if f.kind == "unsafe_topic_name"],
            "elapsed_s": round(elapsed, 3),
            "startup_s": round(elapsed - work, 3),  # settings, store, planning, Spark session
            "work_s": round(work, 3),  # walk, dispatch, writing and hashing the outputs
            "files": er.files,
        }
        say("publishing")
        if cfg.in_place:
            dest = _publish_in_place(root, staging, manifest, what, changed)
        else:
            assert out is not None
            dest = publish_tree(staging, out, manifest)
            if not (staging.local and out.local):
                _drop_staging(staging)
        manifest["published"] = dest
        return manifest
    except BaseException:
        _drop_staging(staging)
        raise


def _line_why(line: dict[str, Any] | None) -> str:
    """`` from broker.conf``-style note on where the broker line came from."""
    return f", from {line['source']}" if line else ""


def summary_text(m: dict[str, Any]) -> str:
    """The one-screen summary printed at the end."""
    c, r = m["counts"], m["recovery"]
    el = m.get("work_s") or m["elapsed_s"] or 1e-9
    lines = [
        f"rmqstore rebuild ({m['mode']}, engine {m['engine']}, broker {m['settings']['broker_version']}.x"
        f"{_line_why(m['settings'].get('broker_line'))})",
        f"  source          {m['source']['uri']} ({len(m['source']['segments'])} segment(s))",
        f"  recovery        {r['mode']}, window from {r['window_start']} ({r['start_reason']})",
        f"  valid end       processOffset {r['process_offset']}"
        + (f"; stopped by {r['failure']['reason']} in {r['failure']['segment']} @ {r['failure']['offset']}"
           if r["failure"] else ""),
        f"  records         {c['records']} dispatched ({c['records'] / el:,.0f} msg/s of work)",
        f"  consume queues  {c['queues']} queue(s), {c['cq_records']} entries, {c['cq_files']} file(s)",
        f"  index           {c['index_keys']} key(s), {c['index_files']} file(s)",
        *([f"  timer store     {sum(1 for r in m['files'] if r.startswith('timerlog/'))} timerlog file(s), "
           "timerwheel, config/timercheck (pending timers re-enqueued)"] if "timer" in m["settings"]["what"] else []),
        f"  output          {m['published']} (manifest {MANIFEST_NAME})",
        f"  elapsed         {m['elapsed_s']:.2f} s"
        + (f" (start-up {m['startup_s']:.2f} s, work {m['work_s']:.2f} s)" if "work_s" in m else ""),
    ]
    if m.get("backup"):
        lines.append(f"  backup          {m['backup']}")
    for f in m["findings"][:5]:
        lines.append(f"  finding         {f}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE", help="store root: local path or URI (s3://bucket/prefix, ...)")
    p.add_argument("--out", metavar="DIR", help="output directory (local path or URI); published atomically")
    p.add_argument("--in-place", action="store_true",
                   help="replace the store's own files (after moving them into rebuild-backup-<time>/)")
    p.add_argument("--what", default="consumequeue,index",
                   help="consumequeue,index (default both); timer: the 5.x timerlog and wheel for the pending timer "
                        "messages (--out only)")
    from jobs.common import add_fs_args, add_settings_args

    add_settings_args(p)
    add_engine_args(p, "dispatch")
    p.add_argument("--incremental", action="store_true",
                   help="only dispatch what the store's consume queues lack (continues the last files)")
    p.add_argument("--partitions", type=int, help="spark engine: consume-queue partitions")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON instead of the summary")
    add_fs_args(p)


def config_from_args(args: argparse.Namespace) -> RebuildConfig:
    from jobs.common import fs_options, overrides

    return RebuildConfig(store=args.store, out=args.out, what=tuple(w.strip() for w in args.what.split(",") if w.strip()),
                         broker_conf=args.broker_conf, broker_version=args.broker_version, overrides=overrides(args),
                         engine=args.engine or "auto", workers=args.workers,
                         master=args.master, in_place=args.in_place, incremental=args.incremental,
                         partitions=args.partitions, fs_options=fs_options(args), progress=not args.quiet)


def run_args(args: argparse.Namespace) -> int:
    import json

    m = rebuild(config_from_args(args))
    if args.json:
        print(json.dumps({k: v for k, v in m.items() if k != "files"}, indent=2, ensure_ascii=False))
    else:
        print(summary_text(m))
    return 1 if m.get("skipped_topics") else 0  # exit 1: rebuilt, but some topic could not be a directory


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rebuild.py", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)  # engine auto: spark under spark-submit
    try:
        return run_args(args)
    except StoreError as e:
        print(f"rebuild: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from jobs.rebuild import main as _main  # functions pickle by reference to the importable module

    sys.exit(_main())
