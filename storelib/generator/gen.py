"""Synthetic, realistic broker stores, fast: records are encoded column-wise, never one by one.

A store has several topics and queues, tags (unicode, empty, ``||``), keys (none, one, several,
empty tokens, unicode, huge), UNIQ_KEY as MessageClientIDSetter writes it (a UTC producer JVM: its time
decodes to the born time), a body size mix, some IPv6
born hosts, transactions (half message + commit/rollback op records), delayed messages (rewritten to
``SCHEDULE_TOPIC_XXXX``), compressed bodies (zlib/lz4/zstd with their SYSFLAG bits), 5.x V2 topics and
``__CRC32#`` properties, ``config/topics.json`` and ``consumerOffset.json``.

How it stays fast (1 GB well under a minute on one core): a plan of messages is drawn as numpy
columns (:mod:`storelib.generator.genplan`); per chunk of records the sizes are computed first, then positions (segment rolling with blank
records), queue offsets (per-queue running counts) and every fixed field; a record is the Arrow
concatenation (``binary_join_element_wise``) of a fixed-field prefix built from a numpy structured
array, the body (a zero-copy view into a body pool), the topic and the properties, so the data buffer
of that Arrow array *is* the commitlog bytes. The only per-record Python work is one CRC call per body
(and, in 5.x with ``enabledAppendPropCRC``, one per record). CQ and index files come from
:func:`storelib.broker.dispatch.dispatch.dispatch_store`.

The bytes are exactly what :class:`storelib.broker.writer.writer.StoreWriter` writes for the same operations:
:func:`replay_plan` feeds a plan to a StoreWriter (tests compare the two byte for byte).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.errors import StoreError
from storelib.format.crc import MASK, crc32_ranges
from storelib.format.dledger.entries import BODY_OFFSET, MIN_BLANK_LEN, blank_filler, encode_entry_headers
from storelib.format.properties import CRC32, CRC32_RESERVED_LEN, NAME_VALUE_SEP, PROPERTY_SEP
from storelib.format.record import (
    BLANK_MAGIC,
    BORNHOST_V6_FLAG,
    MAGIC_V1,
    MAGIC_V2,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from storelib.generator.dledgergen import DLedgerFiles, DLedgerGen
from storelib.generator.genplan import (
    BROKER_ADDED,
    COMMIT,
    HALF,
    NORMAL,
    OP,
    PRODUCER_GROUP,
    PROP_UNIVERSE,
    GenConfig,
    Generator,
    RecordPlan,
    be_bytes,
)
from storelib.scan.arrowcols import group_order
from storelib.scan.commitlog import offset_to_file_name


@dataclass
class GenResult:
    root: str
    records: int = 0
    messages: int = 0
    bytes: int = 0
    segments: int = 0
    per_type: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    dispatch: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "records": self.records, "messages": self.messages, "bytes": self.bytes,
                "segments": self.segments, "per_type": self.per_type, "seconds": round(self.seconds, 3),
                "cq_records": getattr(self.dispatch, "cq_records", None),
                "index_keys": getattr(self.dispatch, "index_keys", None)}


def _fixed_binary(rows: np.ndarray) -> pa.Array:
    n, k = rows.shape
    offsets = np.arange(0, k * n + 1, k, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(rows))])


def _ragged_binary(rows: np.ndarray, lens: np.ndarray) -> pa.Array:
    """Binary array of the first ``lens[i]`` bytes of each row of a 2-D uint8 array."""
    n, k = rows.shape
    keep = np.arange(k)[None, :] < lens[:, None]
    data = rows[keep]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


# ---------------------------------------------------------------------------------------------
# layout and encoding


def encode_chunk(g: Generator, plan: RecordPlan, lay: FileLayout) -> None:
    """Encode one plan chunk and write it at the layout's position (segments roll as needed)."""
    n = len(plan)
    if n == 0:
        return
    v2 = g.topic_v2[plan.topic_id]
    topic_part = pc.take(g.topic_parts, pa.array(plan.topic_id))
    props = plan.props
    if g.prop_crc:
        tail = CRC32 + NAME_VALUE_SEP + "0" * 10 + PROPERTY_SEP
        props = pc.binary_join_element_wise(props, pa.scalar(tail), pa.scalar(""))
    props_b = props.cast(pa.binary())
    plen = np.asarray(pc.binary_length(props_b)).astype(np.int64)
    if len(plen) and plen.max() > 32767:
        raise StoreError(None, None, "properties_too_long", "generated properties exceed 32767 bytes")
    blen = np.asarray(pc.binary_length(plan.body)).astype(np.int64)
    bh = np.where(plan.sys_flag & BORNHOST_V6_FLAG, 20, 8)
    sh = np.where(plan.sys_flag & 0x20, 20, 8)
    tl = np.asarray(pc.binary_length(topic_part)).astype(np.int64)  # includes the length field
    total = 74 + bh + sh + blen + tl + plen

    dl = lay.dledger
    head = BODY_OFFSET if dl is not None else 0  # a DLedger entry's header precedes each record
    pos, runs = _place(lay, total + head)
    phy = pos + head  # the broker's offset of each record (entry pos + 48 in DLedger mode)
    qoff = _queue_offsets(lay, plan)

    # body CRC: one call per body
    bb = plan.body
    boffs = np.asarray(bb.buffers()[1]).view(np.int32)[bb.offset: bb.offset + n + 1].astype(np.int64)
    bdata = memoryview(bb.buffers()[2]) if bb.buffers()[2] is not None else memoryview(b"")
    crc = crc32_ranges(bdata, boffs[:-1].tolist(), boffs[1:].tolist()) & MASK  # an empty body's CRC is 0

    prefix = _prefixes(g, plan, total, crc, qoff, phy, v2, bh, sh, blen)
    proplen = _fixed_binary(be_bytes(plen, 2))
    parts = [prefix, bb, topic_part, proplen, props_b]
    if dl is not None:
        idx = dl.append(pos, total + head)
        parts.insert(0, _fixed_binary(encode_entry_headers(total + head, idx, np.full(n, dl.opts.term), pos)))
    recs = pc.binary_join_element_wise(*parts, pa.scalar(b""))
    roffs = np.asarray(recs.buffers()[1]).view(np.int32)[recs.offset: recs.offset + n + 1].astype(np.int64)
    data = np.frombuffer(recs.buffers()[2], dtype=np.uint8)
    if g.prop_crc:
        data = data.copy()
        mv = memoryview(data)
        vals = crc32_ranges(mv, roffs[:-1].tolist(), (roffs[1:] - CRC32_RESERVED_LEN).tolist()) & MASK
        digits = (vals[:, None] // (10 ** np.arange(10, dtype=np.int64))[None, :]) % 10 + 48
        idx = (roffs[1:] - 11)[:, None] + np.arange(10)[None, :]
        data[idx] = digits.astype(np.uint8)

    # write runs
    for base, at, lo, hi in runs:
        lay.open_file(base)
        if lo < 0 and dl is not None:  # DLedger's blank filler: int -1, int remaining (zeros after it)
            os.pwrite(lay.fd, blank_filler(int(hi))[:MIN_BLANK_LEN], at)
        elif lo < 0:  # blank record: only its 8 bytes are written
            os.pwrite(lay.fd, int(hi).to_bytes(4, "big", signed=True) + BLANK_MAGIC.to_bytes(4, "big", signed=True),
                      at)
        else:
            os.pwrite(lay.fd, memoryview(data)[int(roffs[lo]): int(roffs[hi])], at)
    lay.bytes += int(total.sum()) + head * n


def _place(lay: FileLayout, total: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
    """Positions with segment rolling (a blank record where the next one does not fit): (phy, runs)."""
    n = len(total)
    S = lay.S
    phy = np.empty(n, dtype=np.int64)
    runs: list[tuple[int, int, int, int]] = []  # (base, pos, lo, hi) data runs; lo = -1 → blank of size hi
    i = 0
    while i < n:
        ends = lay.pos + np.cumsum(total[i:])
        k = int(np.argmax(ends + 8 > S)) if (ends[-1] + 8 > S) else n - i
        if k:
            starts = np.concatenate(([lay.pos], ends[: k - 1]))
            phy[i:i + k] = lay.base + starts
            runs.append((lay.base, lay.pos, i, i + k))
            lay.pos = int(ends[k - 1])
            i += k
        if i < n:
            if lay.pos == 0:
                raise StoreError(None, None, "message_too_large", f"record of {int(total[i])} bytes cannot fit")
            runs.append((lay.base, lay.pos, -1, S - lay.pos))
            lay.base, lay.pos = lay.base + S, 0
    return phy, runs


def _queue_offsets(lay: FileLayout, plan: RecordPlan) -> np.ndarray:
    """QUEUEOFFSET per record: NOT/COMMIT records advance a per-queue counter (lay.queue_table).

    The generator writes no PREPARED/ROLLBACK records: half and op records are NOT-type, so every
    record counts.
    """
    n = len(plan)
    code = plan.topic_id.astype(np.int64) << 32 | plan.queue_id.astype(np.int64)
    order = group_order(code)
    cs = code[order]
    starts_g = np.flatnonzero(np.r_[True, cs[1:] != cs[:-1]])
    grp_len = np.diff(np.r_[starts_g, n])
    rank = np.arange(n) - np.repeat(starts_g, grp_len)
    qoff = np.empty(n, dtype=np.int64)
    base_off = np.array([lay.queue_table.get(int(c), 0) for c in cs[starts_g].tolist()], dtype=np.int64)
    qoff[order] = np.repeat(base_off, grp_len) + rank
    for c, b, ln in zip(cs[starts_g].tolist(), base_off.tolist(), grp_len.tolist()):
        lay.queue_table[c] = b + ln
    return qoff


def _prefixes(g: Generator, plan: RecordPlan, total: np.ndarray, crc: np.ndarray, qoff: np.ndarray,
              phy: np.ndarray, v2: np.ndarray, bh: np.ndarray, sh: np.ndarray, blen: np.ndarray) -> pa.Array:
    """The fixed prefix of every record: 48-byte header, hosts, store time, reconsume, prepared offset,
    body length (binary, ``72 + hosts`` bytes a row)."""
    n = len(plan)
    prep = np.where(plan.half_ref >= 0, phy[np.maximum(plan.half_ref, 0)], 0)
    hdr = np.empty((n, 48), dtype=np.uint8)
    hdr[:, 0:4] = be_bytes(total, 4)
    hdr[:, 4:8] = be_bytes(np.where(v2, MAGIC_V2, MAGIC_V1), 4)
    hdr[:, 8:12] = be_bytes(crc, 4)
    hdr[:, 12:16] = be_bytes(plan.queue_id, 4)
    hdr[:, 16:20] = be_bytes(plan.flag, 4)
    hdr[:, 20:28] = be_bytes(qoff, 8)
    hdr[:, 28:36] = be_bytes(phy, 8)
    hdr[:, 36:40] = be_bytes(plan.sys_flag, 4)
    hdr[:, 40:48] = be_bytes(plan.born_ts, 8)
    host_rows = np.zeros((len(g.host_bytes), 20), dtype=np.uint8)
    for j, hb in enumerate(g.host_bytes):
        host_rows[j, : len(hb)] = np.frombuffer(hb, np.uint8)
    sh_row = np.zeros(20, dtype=np.uint8)
    sh_row[: len(g.store_host_bytes)] = np.frombuffer(g.store_host_bytes, np.uint8)
    width = 112  # widest prefix: 48 + 20 + 8 + 20 + 4 + 8 + 4
    pre = np.zeros((n, width), dtype=np.uint8)
    pre[:, :48] = hdr
    # store ts, store host(20), reconsume, prep, bodylen
    tail = np.concatenate([be_bytes(plan.store_ts, 8), np.broadcast_to(sh_row, (n, 20)), np.zeros((n, 4), np.uint8),
                           be_bytes(prep, 8), be_bytes(blen, 4)], axis=1)
    born = host_rows[plan.born_host_id]
    # scatter born host (bh bytes) then the tail with the store host narrowed to sh bytes
    pre_len = 72 + bh + sh
    for bw in (8, 20):
        for sw in (8, 20):
            rows = np.flatnonzero((bh == bw) & (sh == sw))
            if not len(rows):
                continue
            p = 48
            pre[rows, p:p + bw] = born[rows, :bw]
            p += bw
            pre[rows, p:p + 8] = tail[rows, 0:8]
            p += 8
            pre[rows, p:p + sw] = tail[rows, 8:8 + sw]
            p += sw
            pre[rows, p:p + 16] = tail[rows, 28:44]
    return _ragged_binary(pre, pre_len)


class FileLayout:
    """Segment files of the generated commitlog (created full size, written only by the generator);
    with ``dledger`` the DLedger data files and their ledger (index units)."""

    def __init__(self, root: str, segment_size: int, dledger: DLedgerFiles | None = None):
        self.root = root
        self.dledger = dledger
        self.dir = dledger.data_dir if dledger is not None else os.path.join(root, "commitlog")
        self.S = segment_size
        self.base = 0
        self.pos = 0
        self.queue_table: dict[int, int] = {}
        self.fd: int | None = None
        self._file_base: int | None = None
        self.segments = 0
        self.bytes = 0

    def open_file(self, base: int) -> None:
        if self._file_base == base:
            return
        if self.fd is not None:
            os.close(self.fd)
        path = os.path.join(self.dir, offset_to_file_name(base))
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self.fd).st_size != self.S:
            os.ftruncate(self.fd, self.S)
            self.segments += 1
        self._file_base = base

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.dledger is not None:
            self.dledger.close()


# ---------------------------------------------------------------------------------------------
# driver


def iter_plans(g: Generator, written: Callable[[], int] | None = None) -> Iterator[RecordPlan]:
    """Plan chunks until the configured message count, or (``written()`` bytes) the size, is reached.

    With a size target the chunk shrinks as the target nears (by the average record size so far), so
    the store overshoots it by about one record rather than one chunk.
    """
    cfg = g.cfg
    done = 0
    records = 0
    while True:
        n = cfg.chunk_ops
        if cfg.messages is not None:
            n = min(n, cfg.messages - done)
        if cfg.size is not None and written is not None:
            left = cfg.size - written()
            if left <= 0:
                return
            avg = written() / records if records else 1500.0
            n = min(n, max(64, int(left / avg) + 1))
        if n <= 0:
            return
        plan = g.plan_chunk(n)
        records += len(plan)
        yield plan
        done += n


def generate(out: str | os.PathLike, cfg: GenConfig, settings: BrokerSettings | None = None, *,
             progress: Callable[[int, int], None] | None = None, dispatch: bool = True,
             write_config_files: bool = True, dledger: DLedgerGen | None = None) -> GenResult:
    """Generate a store at ``out`` (must not exist, or be an empty directory).

    Everything is written into a staging directory beside ``out`` and renamed into place at the end,
    so ``out`` never holds a half-generated store. ``progress(bytes, records)`` is called per chunk.
    ``dledger``: a DLedger-mode store (``dledger-<selfId>/`` instead of ``commitlog/``, see
    :mod:`storelib.generator.dledgergen`); the settings then say ``enableDLegerCommitLog``.
    """
    if cfg.messages is None and cfg.size is None:
        raise StoreError(None, None, "bad_value", "give a message count or a size")
    if settings is None:
        settings = BrokerSettings.defaults(cfg.version)
    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise StoreError(out, None, "exists", "output exists and is not an empty directory")
    stage = out.rstrip("/") + f".gen-{os.getpid()}.tmp"
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    if dledger is not None:
        settings = settings.with_overrides({"enableDLegerCommitLog": True, "dLegerSelfId": dledger.self_id})
    t0 = time.perf_counter()
    g = Generator(cfg, settings)
    files = DLedgerFiles(stage, dledger) if dledger is not None else None
    lay = FileLayout(stage, g.S, files)
    os.makedirs(lay.dir, exist_ok=True)
    lay.base = dledger.data_start if dledger is not None else 0  # a switched broker's DLedger starts past its old log
    if lay.base % g.S:
        raise StoreError(None, None, "bad_value", f"the DLedger data start {lay.base} is not a multiple of {g.S}")
    lay.open_file(lay.base)
    res = GenResult(out)
    counts = np.zeros(4, dtype=np.int64)
    tail_ts = np.zeros(0, np.int64)  # the last records' store times (the last dispatched one's is the checkpoint's)
    try:
        for plan in iter_plans(g, lambda: lay.bytes):
            encode_chunk(g, plan, lay)
            res.records += len(plan)
            counts += np.bincount(plan.rtype, minlength=4)
            tail_ts = np.concatenate([tail_ts, plan.store_ts])[-(len(files.tail_pos) if files else 1):]
            if progress is not None:
                progress(lay.bytes, res.records)
    finally:
        lay.close()
    res.bytes = lay.bytes
    res.segments = len(os.listdir(lay.dir))
    res.per_type = {"normal": int(counts[NORMAL]), "half": int(counts[HALF]), "commit": int(counts[COMMIT]),
                    "op": int(counts[OP])}
    res.messages = int(counts[NORMAL] + counts[HALF])
    from storelib.format.checkpoint import Checkpoint, write_checkpoint

    last_ts = int(tail_ts[-1]) if len(tail_ts) else 0
    if dispatch:
        from storelib.broker.dispatch.dispatch import dispatch_store

        to = files.dispatch_end() if files is not None else None
        if to is not None and files is not None:  # the reput had not reached the last entries
            k = files.next_index - _entries_before(files, to)
            last_ts = int(tail_ts[-1 - k]) if len(tail_ts) > k else 0
        res.dispatch = dispatch_store(stage, settings, from_offset=0, to_offset=to,
                                      commitlog=_dledger_log(stage, g.S, files) if files is not None else None)
    if files is not None:
        files.finish(stage)
    if write_config_files:
        caps = None  # a reput behind the log: consumers cannot be past what the consume queues hold
        if res.dispatch is not None and files is not None and files.dispatch_end() is not None:
            caps = {k: (st.last_base + st.write_pos) // 20 if st.last_base is not None else 0
                    for k, st in res.dispatch.queue_states.items()}
        _write_configs(stage, g, lay, settings, caps)
    idx_ts = res.dispatch.index_msg_timestamp if res.dispatch is not None else 0
    write_checkpoint(stage, Checkpoint(last_ts, last_ts if dispatch else 0, idx_ts))
    with open(os.path.join(stage, "lock"), "wb") as f:
        f.write(b"lock")
    if os.path.isdir(out):
        os.rmdir(out)
    os.replace(stage, out)
    res.seconds = time.perf_counter() - t0
    return res


def _entries_before(files: DLedgerFiles, pos: int) -> int:
    """How many entries start before ``pos`` (``pos`` is one of the last entries' starts)."""
    k = len(files.tail_pos) - int(np.searchsorted(files.tail_pos, pos))
    return files.next_index - k


def _dledger_log(stage: str, segment_size: int, files: DLedgerFiles):
    from storelib.scan.commitlog import CommitLog

    return CommitLog(files.data_dir, segment_size, dledger=True,
                     folder=files.opts.dir_name() + "/data")


def _write_configs(stage: str, g: Generator, lay: FileLayout, settings: BrokerSettings,
                   caps: dict[tuple[str, int], int] | None = None) -> None:
    """config/topics.json and consumerOffset.json (fastjson style) with plausible consumer offsets (at most
    ``caps``, each queue's dispatched end, when given)."""
    from storelib.format.configjson import write_config

    cfgdir = os.path.join(stage, "config")
    os.makedirs(cfgdir, exist_ok=True)
    ts = g.now
    table: dict[str, Any] = {}
    for t in g.user_topics + [SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC]:
        nq = g.cfg.queues if t in g.user_topics else (len(g.delay_levels) if t == SCHEDULE_TOPIC else 1)
        tc: dict[str, Any] = {}
        if g.v5:
            tc["attributes"] = {}
        tc.update({"order": False, "perm": 6, "readQueueNums": nq, "topicFilterType": "SINGLE_TAG",
                   "topicName": t, "topicSysFlag": 0, "writeQueueNums": nq})
        table[t] = tc
    dv: dict[str, Any] = {"counter": len(table), "timestamp": ts}
    if g.v5:
        dv["stateVersion"] = 0
    write_config(os.path.join(cfgdir, "topics.json"), {"dataVersion": dv, "topicConfigTable": table})
    rng = np.random.default_rng(g.cfg.seed + 1)
    offsets: dict[str, Any] = {}
    group_topics: dict[str, list[str]] = {}
    for gi in range(g.cfg.consumer_groups):
        group = f"group_{chr(ord('a') + gi % 26)}{gi // 26 or ''}"
        for ti, t in enumerate(g.user_topics):
            qs: dict[int, int] = {}
            for q in range(g.cfg.queues):
                mx = lay.queue_table.get(ti << 32 | q, 0)
                if caps is not None:
                    mx = min(mx, caps.get((t, q), 0))
                lag = 0 if gi == 0 else int(rng.integers(0, max(1, mx // 10 + 1)))
                qs[q] = max(0, mx - lag)
            offsets[f"{t}@{group}"] = qs
            group_topics.setdefault(group, []).append(t)
        offsets[f"%RETRY%{group}@{group}"] = {0: 0}
    data: dict[str, Any] = {}
    if g.v5:
        data["dataVersion"] = dict(dv)
        data["groupTopicMap"] = group_topics
    data["offsetTable"] = offsets
    write_config(os.path.join(cfgdir, "consumerOffset.json"), data)


# ---------------------------------------------------------------------------------------------
# replay through StoreWriter (the byte-identity oracle)


def replay_plan(g: Generator, plans: list[RecordPlan], writer: Any) -> None:
    """Feed the operations of ``plans`` to a StoreWriter (its clock must return the plans' store times).

    NORMAL → append (the writer applies the delay rewrite), HALF → prepare, COMMIT → commit (which
    also writes the op record), an OP after a HALF → rollback.
    """
    from storelib.format.record import Message

    for plan in plans:
        props_list = plan.props.to_pylist()
        bodies = plan.body.to_pylist()
        last_half = None
        for i in range(len(plan)):
            rt = int(plan.rtype[i])
            if rt in (NORMAL, HALF):
                pairs = [seg.partition(NAME_VALUE_SEP) for seg in props_list[i].split(PROPERTY_SEP)
                         if NAME_VALUE_SEP in seg]
                d = {k: v for k, _, v in pairs if k not in BROKER_ADDED}
                if plan.delay[i] > 0:
                    d["DELAY"] = str(int(plan.delay[i]))
                raw = {k: d[k] for k in PROP_UNIVERSE if k in d}
                m = Message(topic=g.topic_names[int(plan.real_topic_id[i])], body=bodies[i],
                            queue_id=int(plan.real_queue_id[i]), flag=int(plan.flag[i]),
                            sys_flag=int(plan.sys_flag[i]) & ~0xC & ~0x30, born_timestamp=int(plan.born_ts[i]),
                            born_host=g.hosts[int(plan.born_host_id[i])], properties=raw)
                if rt == NORMAL:
                    writer.append(m)
                else:
                    last_half = writer.prepare(m, PRODUCER_GROUP)
            elif rt == COMMIT:
                writer.commit(last_half)
            elif rt == OP and i and plan.rtype[i - 1] == HALF:
                writer.rollback(last_half)


__all__ = ["GenResult", "generate", "iter_plans", "replay_plan"]
