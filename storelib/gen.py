"""Synthetic, realistic broker stores, fast: records are encoded column-wise, never one by one.

A store has several topics and queues, tags (unicode, empty, ``||``), keys (none, one, several,
empty tokens, unicode, huge), UNIQ_KEY in the MessageClientIDSetter layout, a body size mix, some IPv6
born hosts, transactions (half message + commit/rollback op records), delayed messages (rewritten to
``SCHEDULE_TOPIC_XXXX``), compressed bodies (zlib/lz4/zstd with their SYSFLAG bits), 5.x V2 topics and
``__CRC32#`` properties, ``config/topics.json`` and ``consumerOffset.json``.

How it stays fast (1 GB well under a minute on one core): a plan of messages is drawn as numpy
columns; per chunk of records the sizes are computed first, then positions (segment rolling with blank
records), queue offsets (per-queue running counts) and every fixed field; a record is the Arrow
concatenation (``binary_join_element_wise``) of a fixed-field prefix built from a numpy structured
array, the body (a zero-copy view into a body pool), the topic and the properties, so the data buffer
of that Arrow array *is* the commitlog bytes. The only per-record Python work is one CRC call per body
(and, in 5.x with ``enabledAppendPropCRC``, one per record). CQ and index files come from
:func:`storelib.dispatch.dispatch_store`.

The bytes are exactly what :class:`storelib.writer.StoreWriter` writes for the same operations:
:func:`replay_plan` feeds a plan to a StoreWriter (tests compare the two byte for byte).
"""

from __future__ import annotations

import os
import shutil
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrowcols import view_array
from .brokerconf import BrokerSettings
from .commitlog import offset_to_file_name
from .crc import MASK, crc32
from .errors import StoreError
from .properties import CRC32, CRC32_RESERVED_LEN, NAME_VALUE_SEP, PROPERTY_SEP
from .record import (
    BLANK_MAGIC,
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    MAGIC_V1,
    MAGIC_V2,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    encode_host,
)
from .writer import OP_REMOVE_TAG, java_hashmap_order

NORMAL, HALF, COMMIT, OP = 0, 1, 2, 3
BASE_TOPICS = ["OrderEvents", "PaymentNotify", "InventorySync", "UserActivity", "ShipmentTracking",
               "AuditLog", "PriceUpdates", "NotificationSend"]
TAG_SETS = [["created", "paid", "shipped", "cancelled", ""], ["TagA", "TagB", "TagC", "TagA||TagB"],
            ["full", "delta", "sync", "标签"], ["login", "logout", "click", "😀emoji"]]
IPV6_HOSTS = ["[1050:0:0:0:5:600:300c:326b]", "[0:0:0:0:0:0:0:1]", "[fe80:0:0:0:1ff:fe23:4567:890a]",
              "[2001:db8:0:0:0:8a2e:370:7334]"]
# the order properties are put into the map (client, then broker); ties in a HashMap bucket keep it
PROP_UNIVERSE = ["KEYS", "TAGS", "DELAY", "UNIQ_KEY", "WAIT", "CLUSTER", "TRAN_MSG", "PGROUP", "REAL_TOPIC",
                 "REAL_QID"]
PROP_ORDER = java_hashmap_order(PROP_UNIVERSE)  # ≤ 12 names: capacity 16 for every subset
CLUSTER_NAME = "DefaultCluster"
_BROKER_ADDED = ("REAL_TOPIC", "REAL_QID", "TRAN_MSG", "PGROUP")
PRODUCER_GROUP = "tx_producer_group"
_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)


def _checked_topic(topic: str, v2: bool) -> str:
    """A topic name the record format can hold: 127 UTF-8 bytes in a V1 record, 32767 in a V2 one."""
    limit = 32767 if v2 else 127
    n = len(topic.encode("utf-8"))
    if not topic or n > limit:
        raise ValueError(f"topic {topic[:40]!r}: {n} bytes; a {'V2' if v2 else 'V1'} record holds 1..{limit}")
    return topic


@dataclass
class GenConfig:
    """What to generate. ``messages`` or ``size`` (commitlog bytes) bounds the store."""

    messages: int | None = None
    size: int | None = None
    topics: int = 4
    queues: int = 4
    seed: int = 0
    version: str = "4"
    ipv6_ratio: float = 0.03
    tx_ratio: float = 0.02
    delay_ratio: float = 0.02
    compressed_ratio: float = 0.01
    start_ms: int = 1_700_000_000_000
    store_host: str = "10.0.0.5:10911"
    chunk_ops: int = 65536
    consumer_groups: int = 2
    topic_names: tuple[str, ...] = ()  # user topics by name (any string the store can hold), else generated


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


# ---------------------------------------------------------------------------------------------
# the plan: one chunk of records as columns


@dataclass
class RecordPlan:
    """Records of one chunk in commitlog order, before layout (everything except offsets)."""

    rtype: np.ndarray  # NORMAL / HALF / COMMIT / OP
    topic_id: np.ndarray  # into Generator.topic_names
    queue_id: np.ndarray
    sys_flag: np.ndarray
    flag: np.ndarray
    born_ts: np.ndarray
    store_ts: np.ndarray
    born_host_id: np.ndarray  # into Generator.hosts
    half_ref: np.ndarray  # COMMIT: index (in this chunk) of its half record, else -1
    body: pa.Array  # binary
    props: pa.Array  # string, final stored text without the 5.x CRC property
    real_topic_id: np.ndarray  # NORMAL/HALF: the producer's topic (for replay), else -1
    real_queue_id: np.ndarray
    delay: np.ndarray  # requested level (0 = none)

    def __len__(self) -> int:
        return len(self.rtype)


def _hex(raw: np.ndarray) -> pa.Array:
    """Upper-case hex strings of the rows of a (n, k) uint8 array."""
    n, k = raw.shape
    txt = np.empty((n, 2 * k), dtype=np.uint8)
    txt[:, 0::2] = _HEX[raw >> 4]
    txt[:, 1::2] = _HEX[raw & 15]
    offsets = np.arange(0, 2 * k * n + 1, 2 * k, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(txt)])


def _be(values: np.ndarray, width: int) -> np.ndarray:
    return np.asarray(values).astype(f">i{width}").view(np.uint8).reshape(-1, width)


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


class Generator:
    """Draws a plan chunk by chunk, lays records out in segments and writes them."""

    def __init__(self, cfg: GenConfig, settings: BrokerSettings):
        self.cfg = cfg
        self.settings = settings
        self.v5 = str(cfg.version).startswith("5")
        self.prop_crc = self.v5 and bool(settings.enabled_append_prop_crc)
        self.auto_v2 = self.v5 and bool(settings.auto_message_version_on_topic_len)
        self.S = int(settings.mapped_file_size_commit_log)
        self.delay_levels = list(settings.delay_levels_ms)
        self.rng = np.random.default_rng(cfg.seed)
        names = list(BASE_TOPICS[: max(1, min(cfg.topics, len(BASE_TOPICS)))])
        names += [f"Topic{i:03d}" for i in range(len(names), cfg.topics)]
        if self.v5 and cfg.topics >= 3:  # a V2 record topic (> 127 characters)
            names[-1] = ("LongTopicV2_" + "abcdefghijklmnopqrstuvwxyz" * 6)[:150]
        if cfg.topic_names:
            names = [_checked_topic(t, self.auto_v2) for t in cfg.topic_names]
        self.user_topics = names
        self.topic_names = names + [SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC]
        self.t_sched, self.t_half, self.t_op = len(names), len(names) + 1, len(names) + 2
        tp = []
        for t in self.topic_names:
            b = t.encode()
            v2 = self.auto_v2 and len(b) > 127
            tp.append((len(b).to_bytes(2 if v2 else 1, "big", signed=True)) + b)
        self.topic_parts = pa.array(tp, pa.binary())
        self.topic_v2 = np.array([self.auto_v2 and len(t.encode()) > 127 for t in self.topic_names])
        self.topic_str = pa.array(self.topic_names, pa.string())
        # hosts: born hosts (IPv4 pool + IPv6), then the store host at the end
        v4 = [f"192.168.{a}.{b}:{p}" for a, b, p in zip(self.rng.integers(0, 8, 24), self.rng.integers(2, 250, 24),
                                                          self.rng.integers(30000, 60000, 24))]
        v6 = [f"{h}:{p}" for h, p in zip(IPV6_HOSTS, self.rng.integers(30000, 60000, len(IPV6_HOSTS)))]
        self.hosts = v4 + v6 + [cfg.store_host]
        self.n_v4, self.store_host_id = len(v4), len(self.hosts) - 1
        self.host_bytes = [encode_host(h) for h in self.hosts]
        self.store_host_bytes = encode_host(cfg.store_host)
        # producers for UNIQ_KEY: ip(4) pid(2) classloader hash(4), then time diff(4) + counter(2)
        self.producers = self.rng.integers(0, 256, (8, 10), dtype=np.uint8)
        self.producers[:, :2] = (192, 168)
        self.uniq_counter = np.zeros(8, dtype=np.int64)
        self.pool = self._body_pool()
        self.pool_np = np.frombuffer(self.pool, dtype=np.uint8)
        self.now = cfg.start_ms
        self.ops = 0
        self.half_qoff = 0  # RMQ_SYS_TRANS_HALF_TOPIC queue 0 offsets (the op record bodies)

    def _body_pool(self) -> bytes:
        """8 MiB of JSON-ish text followed by 1 MiB of random bytes; bodies are slices of it."""
        words = [b"order", b"payment", b"sku", b"amount", b"status", b"customer", b"\xe8\xae\xa2\xe5\x8d\x95",
                 b"warehouse", b"true", b"false", b"null", b"12345", b"3.14"]
        idx = self.rng.integers(0, len(words), 1_600_000)
        parts = [b'{"' + words[i] + b'":"' + words[(i * 7) % len(words)] + b'",' for i in idx[:20000]]
        text = b"".join(parts)
        text = (text * (8 * 1024 * 1024 // len(text) + 1))[: 8 * 1024 * 1024]
        return text + self.rng.integers(0, 256, 1024 * 1024, dtype=np.uint8).tobytes()

    # -- plan ------------------------------------------------------------------------------------
    def plan_chunk(self, n_ops: int) -> RecordPlan:
        cfg, rng = self.cfg, self.rng
        kind = np.where(rng.random(n_ops) < cfg.tx_ratio, np.where(rng.random(n_ops) < 0.7, 1, 2), 0)
        per_op = np.array([1, 3, 2])[kind]  # normal: 1; tx commit: half+commit+op; tx rollback: half+op
        n = int(per_op.sum())
        op_of = np.repeat(np.arange(n_ops), per_op)
        first = np.zeros(n, dtype=bool)
        first[np.cumsum(per_op) - per_op] = True
        k_in = np.arange(n) - (np.cumsum(per_op) - per_op)[op_of]
        rtype = np.where(kind[op_of] == 0, NORMAL,
                         np.where(k_in == 0, HALF, np.where((kind[op_of] == 1) & (k_in == 1), COMMIT, OP)))
        # per-op draws
        nt = len(self.user_topics)
        topic = rng.integers(0, nt, n_ops)
        queue = rng.integers(0, cfg.queues, n_ops)
        delay = np.where((kind == 0) & (rng.random(n_ops) < cfg.delay_ratio), rng.integers(1, 21, n_ops), 0)
        comp = (kind == 0) & (rng.random(n_ops) < cfg.compressed_ratio)
        comp_type = rng.integers(1, 4, n_ops)  # 1 LZ4, 2 ZSTD, 3 ZLIB
        v6 = rng.random(n_ops) < cfg.ipv6_ratio
        host = np.where(v6, self.n_v4 + rng.integers(0, len(IPV6_HOSTS), n_ops), rng.integers(0, self.n_v4, n_ops))
        flag = np.where(rng.random(n_ops) < 0.05, rng.integers(1, 1000, n_ops), 0)
        # store times: non-decreasing, one per record; born = store - (0..29) ms
        step = rng.integers(0, 3, n)
        store_ts = self.now + np.cumsum(step)
        self.now = int(store_ts[-1]) if n else self.now
        born_op = store_ts[np.cumsum(per_op) - per_op] - rng.integers(0, 30, n_ops)
        # body lengths: log-uniform 10 B .. 4 KiB, 2 % up to 64 KiB
        blen = np.exp(rng.uniform(np.log(10), np.log(4096), n_ops)).astype(np.int64)
        big = rng.random(n_ops) < 0.02
        blen = np.where(big, rng.integers(4096, 65536, n_ops), blen)
        boff = rng.integers(0, len(self.pool) - 65536, n_ops)
        # tags / keys / uniq keys (strings, column-wise)
        tag_set = [TAG_SETS[t % len(TAG_SETS)] for t in range(nt)]
        tag_flat = pa.array([x for ts in tag_set for x in ts], pa.string())
        tag_base = np.cumsum([0] + [len(ts) for ts in tag_set])[:-1]
        tag_pick = np.array([len(tag_set[t]) for t in range(nt)])[topic]
        tag_idx = tag_base[topic] + (rng.random(n_ops) * tag_pick).astype(np.int64)
        tags = pc.take(tag_flat, pa.array(tag_idx))
        tags = pc.if_else(pa.array(rng.random(n_ops) < 0.05), pa.scalar(None, pa.string()), tags)
        keys = self._keys(n_ops)
        uniq = self._uniq(n_ops, store_ts[np.cumsum(per_op) - per_op])

        # record columns
        t_rec = topic[op_of]
        q_rec = queue[op_of]
        d_rec = delay[op_of]
        lv = np.minimum(d_rec, len(self.delay_levels))
        topic_id = np.select([rtype == HALF, rtype == OP, (rtype == NORMAL) & (d_rec > 0)],
                             [self.t_half, self.t_op, self.t_sched], t_rec)
        queue_id = np.select([rtype == HALF, rtype == OP, (rtype == NORMAL) & (d_rec > 0)], [0, 0, lv - 1], q_rec)
        v6_rec = v6[op_of] & (rtype != OP)
        sysf = np.where(v6_rec, BORNHOST_V6_FLAG, 0)
        if len(self.store_host_bytes) == 20:
            sysf |= 0x20
        sysf = sysf | np.where(comp[op_of], COMPRESSED_FLAG | (comp_type[op_of] << 8), 0)
        sysf = sysf | np.where(rtype == COMMIT, 0x8, 0)
        born_ts = np.where(rtype == OP, store_ts, born_op[op_of])
        born_host = np.where(rtype == OP, self.store_host_id, host[op_of])
        half_ref = np.where(rtype == COMMIT, np.arange(n) - 1, -1)
        flag_rec = np.where(rtype == OP, 0, flag[op_of])

        # half queue offsets for op bodies: halves are numbered in order
        is_half = rtype == HALF
        half_no = np.cumsum(is_half) - 1 + self.half_qoff
        self.half_qoff += int(is_half.sum())
        op_body_of = half_no[np.cumsum(per_op) - per_op][op_of]  # the half of this op's transaction

        # properties, in the stored (HashMap) order
        rowsel = pa.array(op_of)
        cols: dict[str, pa.Array] = {}
        null = pa.scalar(None, pa.string())
        not_op = pa.array(rtype != OP)
        cols["KEYS"] = pc.if_else(not_op, pc.take(keys, rowsel), null)
        cols["TAGS"] = pc.if_else(not_op, pc.take(tags, rowsel), pa.scalar(OP_REMOVE_TAG))
        # a commit copies the half's properties as the broker parsed them: empty values are gone
        empty_tag = pc.and_(pa.array(rtype == COMMIT), pc.equal(cols["TAGS"], "").fill_null(False))
        cols["TAGS"] = pc.if_else(empty_tag, null, cols["TAGS"])
        dtext = pa.array(np.where(d_rec > len(self.delay_levels), len(self.delay_levels), d_rec).astype(str))
        cols["DELAY"] = pc.if_else(pa.array(d_rec > 0), dtext, null)
        cols["UNIQ_KEY"] = pc.if_else(not_op, pc.take(uniq, rowsel), null)
        cols["WAIT"] = pc.if_else(not_op, pa.scalar("true"), null)
        cols["CLUSTER"] = pc.if_else(not_op, pa.scalar(CLUSTER_NAME), null)
        tx = pa.array((rtype == HALF) | (rtype == COMMIT))
        cols["TRAN_MSG"] = pc.if_else(tx, pa.scalar("true"), null)
        cols["PGROUP"] = pc.if_else(tx, pa.scalar(PRODUCER_GROUP), null)
        real = pa.array(((rtype == NORMAL) & (d_rec > 0)) | tx)
        cols["REAL_TOPIC"] = pc.if_else(real, pc.take(self.topic_str, pa.array(t_rec)), null)
        cols["REAL_QID"] = pc.if_else(real, pa.array(q_rec.astype(str)), null)
        pieces = [pc.binary_join_element_wise(pa.scalar(name + NAME_VALUE_SEP), cols[name],
                                              pa.scalar(PROPERTY_SEP), pa.scalar("")) for name in PROP_ORDER]
        props = pc.binary_join_element_wise(*pieces, pa.scalar(""), null_handling="skip")
        if not self.v5:  # 4.x drops the final separator
            props = pc.utf8_slice_codeunits(props, 0, -1)

        # bodies: pool views; compressed and op bodies built separately (few)
        bl = blen[op_of]
        bo = boff[op_of]
        body = view_array(self.pool_np, self.pool, bo, np.where(rtype == OP, 0, bl)).cast(pa.binary())
        special = np.flatnonzero(comp[op_of] | (rtype == OP))
        if len(special):
            vals = []
            for r in special.tolist():
                if rtype[r] == OP:
                    vals.append((str(int(op_body_of[r])) + ("," if self.v5 else "")).encode())
                else:
                    raw = self.pool[int(bo[r]): int(bo[r]) + 4096 + int(bl[r]) % 8192]
                    vals.append(_compress(raw, int(comp_type[op_of[r]])))
            mask = np.zeros(n, dtype=bool)
            mask[special] = True
            body = pc.replace_with_mask(body, pa.array(mask), pa.array(vals, pa.binary()))
        self.ops += n_ops
        return RecordPlan(rtype, topic_id, queue_id, sysf.astype(np.int64), flag_rec, born_ts, store_ts,
                          born_host, half_ref, body, props,
                          np.where(rtype == OP, -1, t_rec), np.where(rtype == OP, -1, q_rec), d_rec)

    def _keys(self, n: int) -> pa.Array:
        """KEYS: 20 % none, 55 % one, 20 % 2-3 (some with empty tokens), 3 % unicode, 2 % huge."""
        rng = self.rng
        k1 = pc.binary_join_element_wise(pa.scalar("ORD"), pa.array(rng.integers(100000, 999999, n).astype(str)),
                                         pa.scalar(""))
        k2 = pc.binary_join_element_wise(pa.scalar("USR"), pa.array(rng.integers(10000, 99999, n).astype(str)),
                                         pa.scalar(""))
        k3 = pc.binary_join_element_wise(pa.scalar("SKU-"), pa.array(rng.integers(1, 9999, n).astype(str)),
                                         pa.scalar(""))
        u = rng.random(n)
        multi = pc.binary_join_element_wise(k1, k2, k3, pa.scalar(" "))
        gap = pc.binary_join_element_wise(k1, pa.scalar(""), k2, pa.scalar(" "))  # "ORD..  USR.." (empty token)
        uni = pc.binary_join_element_wise(pa.scalar("主键"), k1, pa.scalar(" "))
        huge = pc.binary_join_element_wise(k1, pa.scalar("H" * 2000), pa.scalar(""))
        out = pc.case_when(
            pa.StructArray.from_arrays(
                [pa.array(u < 0.20), pa.array(u < 0.75), pa.array(u < 0.90), pa.array(u < 0.95),
                 pa.array(u < 0.98)], ["a", "b", "c", "d", "e"]),
            pa.scalar(None, pa.string()), k1, multi, gap, uni, huge)
        return out

    def _uniq(self, n: int, ts: np.ndarray) -> pa.Array:
        """UNIQ_KEY = hex(ip 4 | pid 2 | classloader hash 4 | ms since the producer's start 4 | counter 2)."""
        p = self.rng.integers(0, len(self.producers), n)
        raw = np.empty((n, 16), dtype=np.uint8)
        raw[:, :10] = self.producers[p]
        counter = np.zeros(n, dtype=np.int64)
        for i in range(len(self.producers)):  # per-producer running counter (8 column ops)
            m = p == i
            c = int(m.sum())
            counter[m] = self.uniq_counter[i] + np.arange(c)
            self.uniq_counter[i] += c
        raw[:, 10:14] = _be((ts - self.cfg.start_ms + 86_400_000) & 0x7FFFFFFF, 4)
        raw[:, 14:16] = _be(counter & 0x7FFF, 2)
        return _hex(raw)


def _compress(raw: bytes, kind: int) -> bytes:
    if kind == 1:
        import lz4.frame

        return lz4.frame.compress(raw)
    if kind == 2:
        import zstandard

        return zstandard.ZstdCompressor(level=5).compress(raw)
    return zlib.compress(raw, 5)


# ---------------------------------------------------------------------------------------------
# layout and encoding


def encode_chunk(g: Generator, plan: RecordPlan, lay: FileLayout) -> None:
    """Encode one plan chunk and write it at the layout's position (segments roll as needed)."""
    n = len(plan)
    if n == 0:
        return
    S = lay.S
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

    # layout: positions with segment rolling (a blank record where the next one does not fit)
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

    # queue offsets: NOT/COMMIT records advance a per-queue counter
    # (the generator writes no PREPARED/ROLLBACK records: half and op records are NOT-type, so every
    # record counts)
    code = plan.topic_id.astype(np.int64) << 32 | plan.queue_id.astype(np.int64)
    order = np.argsort(code, kind="stable")
    cs = code[order]
    starts_g = np.flatnonzero(np.r_[True, cs[1:] != cs[:-1]])
    grp_len = np.diff(np.r_[starts_g, n])
    rank = np.arange(n) - np.repeat(starts_g, grp_len)
    qoff = np.empty(n, dtype=np.int64)
    base_off = np.array([lay.queue_table.get(int(c), 0) for c in cs[starts_g].tolist()], dtype=np.int64)
    qoff[order] = np.repeat(base_off, grp_len) + rank
    for c, b, ln in zip(cs[starts_g].tolist(), base_off.tolist(), grp_len.tolist()):
        lay.queue_table[c] = b + ln

    # body CRC: one call per body
    bb = plan.body
    boffs = np.asarray(bb.buffers()[1]).view(np.int32)[bb.offset: bb.offset + n + 1].astype(np.int64)
    bdata = memoryview(bb.buffers()[2]) if bb.buffers()[2] is not None else memoryview(b"")
    crc = np.fromiter((crc32(bdata[s:e]) if e > s else 0 for s, e in zip(boffs[:-1].tolist(), boffs[1:].tolist())),
                      dtype=np.int64, count=n) & MASK

    prep = np.where(plan.half_ref >= 0, phy[np.maximum(plan.half_ref, 0)], 0)
    # fixed prefix: 48-byte header, hosts, store time, reconsume, prepared offset, body length
    hdr = np.empty((n, 48), dtype=np.uint8)
    hdr[:, 0:4] = _be(total, 4)
    hdr[:, 4:8] = _be(np.where(v2, MAGIC_V2, MAGIC_V1), 4)
    hdr[:, 8:12] = _be(crc, 4)
    hdr[:, 12:16] = _be(plan.queue_id, 4)
    hdr[:, 16:20] = _be(plan.flag, 4)
    hdr[:, 20:28] = _be(qoff, 8)
    hdr[:, 28:36] = _be(phy, 8)
    hdr[:, 36:40] = _be(plan.sys_flag, 4)
    hdr[:, 40:48] = _be(plan.born_ts, 8)
    host_rows = np.zeros((len(g.host_bytes), 20), dtype=np.uint8)
    for j, hb in enumerate(g.host_bytes):
        host_rows[j, : len(hb)] = np.frombuffer(hb, np.uint8)
    sh_row = np.zeros(20, dtype=np.uint8)
    sh_row[: len(g.store_host_bytes)] = np.frombuffer(g.store_host_bytes, np.uint8)
    width = 112  # widest prefix: 48 + 20 + 8 + 20 + 4 + 8 + 4
    pre = np.zeros((n, width), dtype=np.uint8)
    pre[:, :48] = hdr
    tail = np.concatenate([_be(plan.store_ts, 8), np.broadcast_to(sh_row, (n, 20)), np.zeros((n, 4), np.uint8),
                           _be(prep, 8), _be(blen, 4)], axis=1)  # store ts, store host(20), reconsume, prep, bodylen
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
    prefix = _ragged_binary(pre, pre_len)
    proplen = _fixed_binary(_be(plen, 2))
    recs = pc.binary_join_element_wise(prefix, bb, topic_part, proplen, props_b, pa.scalar(b""))
    roffs = np.asarray(recs.buffers()[1]).view(np.int32)[recs.offset: recs.offset + n + 1].astype(np.int64)
    data = np.frombuffer(recs.buffers()[2], dtype=np.uint8)
    if g.prop_crc:
        data = data.copy()
        mv = memoryview(data)
        vals = np.fromiter((crc32(mv[s:e - CRC32_RESERVED_LEN]) for s, e in zip(roffs[:-1].tolist(), roffs[1:].tolist())),
                           dtype=np.int64, count=n) & MASK
        digits = (vals[:, None] // (10 ** np.arange(10, dtype=np.int64))[None, :]) % 10 + 48
        idx = (roffs[1:] - 11)[:, None] + np.arange(10)[None, :]
        data[idx] = digits.astype(np.uint8)

    # write runs
    for base, pos, lo, hi in runs:
        lay.open_file(base)
        if lo < 0:  # blank record: only its 8 bytes are written
            os.pwrite(lay.fd, int(hi).to_bytes(4, "big", signed=True) + BLANK_MAGIC.to_bytes(4, "big", signed=True),
                      pos)
        else:
            os.pwrite(lay.fd, memoryview(data)[int(roffs[lo]): int(roffs[hi])], pos)
    lay.bytes += int(total.sum())


class FileLayout:
    """Segment files of the generated commitlog (created full size, written only by the generator)."""

    def __init__(self, root: str, segment_size: int):
        self.root = root
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
        path = os.path.join(self.root, "commitlog", offset_to_file_name(base))
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self.fd).st_size != self.S:
            os.ftruncate(self.fd, self.S)
            self.segments += 1
        self._file_base = base

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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
             write_config_files: bool = True) -> GenResult:
    """Generate a store at ``out`` (must not exist, or be an empty directory).

    Everything is written into a staging directory beside ``out`` and renamed into place at the end,
    so ``out`` never holds a half-generated store. ``progress(bytes, records)`` is called per chunk.
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
    os.makedirs(os.path.join(stage, "commitlog"))
    t0 = time.perf_counter()
    g = Generator(cfg, settings)
    lay = FileLayout(stage, g.S)
    lay.open_file(0)
    res = GenResult(out)
    counts = np.zeros(4, dtype=np.int64)
    last_ts = 0
    try:
        for plan in iter_plans(g, lambda: lay.bytes):
            encode_chunk(g, plan, lay)
            res.records += len(plan)
            counts += np.bincount(plan.rtype, minlength=4)
            last_ts = int(plan.store_ts[-1])
            if progress is not None:
                progress(lay.bytes, res.records)
    finally:
        lay.close()
    res.bytes = lay.bytes
    res.segments = len(os.listdir(os.path.join(stage, "commitlog")))
    res.per_type = {"normal": int(counts[NORMAL]), "half": int(counts[HALF]), "commit": int(counts[COMMIT]),
                    "op": int(counts[OP])}
    res.messages = int(counts[NORMAL] + counts[HALF])
    from .checkpoint import Checkpoint, write_checkpoint

    if dispatch:
        from .dispatch import dispatch_store

        res.dispatch = dispatch_store(stage, settings, from_offset=0)
    if write_config_files:
        _write_configs(stage, g, lay, settings)
    idx_ts = res.dispatch.index_msg_timestamp if res.dispatch is not None else 0
    write_checkpoint(stage, Checkpoint(last_ts, last_ts if dispatch else 0, idx_ts))
    with open(os.path.join(stage, "lock"), "wb") as f:
        f.write(b"lock")
    if os.path.isdir(out):
        os.rmdir(out)
    os.replace(stage, out)
    res.seconds = time.perf_counter() - t0
    return res


def _write_configs(stage: str, g: Generator, lay: FileLayout, settings: BrokerSettings) -> None:
    """config/topics.json and consumerOffset.json (fastjson style) with plausible consumer offsets."""
    from .configjson import write_config

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
    from .record import Message

    for plan in plans:
        props_list = plan.props.to_pylist()
        bodies = plan.body.to_pylist()
        last_half = None
        for i in range(len(plan)):
            rt = int(plan.rtype[i])
            if rt in (NORMAL, HALF):
                pairs = [seg.partition(NAME_VALUE_SEP) for seg in props_list[i].split(PROPERTY_SEP)
                         if NAME_VALUE_SEP in seg]
                d = {k: v for k, _, v in pairs if k not in _BROKER_ADDED}
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


__all__ = ["GenConfig", "GenResult", "Generator", "generate", "replay_plan", "java_hashmap_order"]
