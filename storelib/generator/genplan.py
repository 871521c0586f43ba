"""What a generated store holds: the configuration and the plan, drawn chunk by chunk as numpy columns.

A plan chunk is every record of some producer operations (sends, delayed sends, transactions with
their half, commit and op records) before layout: types, topics, queues, flags, times, hosts, bodies
and the final property text. :mod:`storelib.generator.gen` lays the chunks out in segments and encodes them.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.writer.writer import OP_REMOVE_TAG, java_hashmap_order
from storelib.format.properties import DUP_INFO, NAME_VALUE_SEP, PROPERTY_SEP
from storelib.format.record import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    encode_host,
)
from storelib.scan.arrowcols import view_array

NORMAL, HALF, COMMIT, OP = 0, 1, 2, 3
BASE_TOPICS = ["OrderEvents", "PaymentNotify", "InventorySync", "UserActivity", "ShipmentTracking",
               "AuditLog", "PriceUpdates", "NotificationSend"]
TAG_SETS = [["created", "paid", "shipped", "cancelled", ""], ["TagA", "TagB", "TagC", "TagA||TagB"],
            ["full", "delta", "sync", "标签"], ["login", "logout", "click", "😀emoji"]]
IPV6_HOSTS = ["[1050:0:0:0:5:600:300c:326b]", "[0:0:0:0:0:0:0:1]", "[fe80:0:0:0:1ff:fe23:4567:890a]",
              "[2001:db8:0:0:0:8a2e:370:7334]"]
# the order properties are put into the map (client, then broker); ties in a HashMap bucket keep it
PROP_UNIVERSE = ["KEYS", "TAGS", "DELAY", "UNIQ_KEY", "WAIT", "CLUSTER", "TRAN_MSG", "PGROUP", "REAL_TOPIC",
                 "REAL_QID", DUP_INFO]
PROP_ORDER = java_hashmap_order(PROP_UNIVERSE)  # ≤ 12 names: capacity 16 for every subset
CLUSTER_NAME = "DefaultCluster"
BROKER_ADDED = ("REAL_TOPIC", "REAL_QID", "TRAN_MSG", "PGROUP")
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
    dup_info: bool = False  # every record carries DUP_INFO "<send number>_<queue id>", which 5.3.3's
    # recovery requires with duplicationEnable (CommitLog.java:540-545); the StoreWriter replay does not


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


def be_bytes(values: np.ndarray, width: int) -> np.ndarray:
    return np.asarray(values).astype(f">i{width}").view(np.uint8).reshape(-1, width)




class Generator:
    """Draws a plan chunk by chunk, lays records out in segments and writes them."""

    def __init__(self, cfg: GenConfig, settings: BrokerSettings):
        self.cfg = cfg
        self.settings = settings
        self.v5 = str(cfg.version).startswith("5")
        # DLedgerCommitLog serialises records itself and never appends __CRC32# (enabledAppendPropCRC ignored)
        self.prop_crc = self.v5 and bool(settings.enabled_append_prop_crc) and not settings.enable_dleger_commit_log
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
        uniq = self._uniq(n_ops, born_op)

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

        props = self._properties(rtype, op_of, tags, keys, uniq, d_rec, t_rec, q_rec)
        body = self._bodies(rtype, op_of, blen, boff, comp, comp_type, op_body_of)
        self.ops += n_ops
        return RecordPlan(rtype, topic_id, queue_id, sysf.astype(np.int64), flag_rec, born_ts, store_ts,
                          born_host, half_ref, body, props,
                          np.where(rtype == OP, -1, t_rec), np.where(rtype == OP, -1, q_rec), d_rec)

    def _properties(self, rtype: np.ndarray, op_of: np.ndarray, tags: pa.Array, keys: pa.Array, uniq: pa.Array,
                    d_rec: np.ndarray, t_rec: np.ndarray, q_rec: np.ndarray) -> pa.Array:
        """The stored property text per record, names in the stored (HashMap) order."""
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
        cols[DUP_INFO] = pa.array(np.char.add(np.char.add((self.ops + op_of).astype(str), "_"), q_rec.astype(str))
                                  ) if self.cfg.dup_info else pa.nulls(len(rtype), pa.string())
        real = pa.array(((rtype == NORMAL) & (d_rec > 0)) | tx)
        cols["REAL_TOPIC"] = pc.if_else(real, pc.take(self.topic_str, pa.array(t_rec)), null)
        cols["REAL_QID"] = pc.if_else(real, pa.array(q_rec.astype(str)), null)
        pieces = [pc.binary_join_element_wise(pa.scalar(name + NAME_VALUE_SEP), cols[name],
                                              pa.scalar(PROPERTY_SEP), pa.scalar("")) for name in PROP_ORDER]
        props = pc.binary_join_element_wise(*pieces, pa.scalar(""), null_handling="skip")
        if not self.v5:  # 4.x drops the final separator
            props = pc.utf8_slice_codeunits(props, 0, -1)
        return props

    def _bodies(self, rtype: np.ndarray, op_of: np.ndarray, blen: np.ndarray, boff: np.ndarray, comp: np.ndarray,
                comp_type: np.ndarray, op_body_of: np.ndarray) -> pa.Array:
        """Bodies as views into the pool; compressed and op bodies are built separately (few)."""
        n = len(rtype)
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
        return body

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
        """UNIQ_KEY as MessageClientIDSetter.createUniqID (4.9.8 = 5.3.3 :114-131) writes it at ``ts`` (the born
        time: the producer sets the id just before stamping the born time) in a producer JVM per fixed prefix
        ip 4 | pid 2 | class-loader hash 4 (:33-48): then ``(int)(now - startTime)`` (4) and the JVM-wide
        counter's low 16 bits (2; UtilAll.writeShort keeps ``value >>> 12..0``).

        startTime is 00:00 on the first of the month (the producer's zone: UTC here) of the id's time: a JVM
        moves it to the current month on the first id at or after the next month (:50-61, :117-120), and ids
        made in time order never see a later month's start (so the NTP clamp at :122-125 never applies).
        The counter runs in plan order, which threads racing between :117 and :129 can give."""
        p = self.rng.integers(0, len(self.producers), n)
        raw = np.empty((n, 16), dtype=np.uint8)
        raw[:, :10] = self.producers[p]
        counter = np.zeros(n, dtype=np.int64)
        for i in range(len(self.producers)):  # per-producer running counter (8 column ops)
            m = p == i
            c = int(m.sum())
            counter[m] = self.uniq_counter[i] + np.arange(c)
            self.uniq_counter[i] += c
        raw[:, 10:14] = be_bytes((ts - utc_month_start(ts)) & 0xFFFFFFFF, 4)  # < 31 days: fits the int
        raw[:, 14:16] = be_bytes(counter & 0xFFFF, 2)
        return _hex(raw)


def utc_month_start(ms: np.ndarray) -> np.ndarray:
    """Epoch ms of 00:00 UTC on the first of each time's month (setStartTime's Calendar in a UTC JVM)."""
    return ms.astype("datetime64[ms]").astype("datetime64[M]").astype("datetime64[ms]").astype(np.int64)


def _compress(raw: bytes, kind: int) -> bytes:
    """A body compressed as RocketMQ's CompressorFactory does it (1 LZ4 frame, 2 ZSTD, 3 ZLIB).

    LZ4 and ZSTD come from the ``gen`` extra: only the generator writes compressed bodies (a reader
    keeps the stored bytes), so a store-reading install does not carry them."""
    try:
        if kind == 1:
            import lz4.frame

            return lz4.frame.compress(raw)
        if kind == 2:
            import zstandard

            return zstandard.ZstdCompressor(level=5).compress(raw)
    except ImportError as e:
        raise ImportError(f"compressed bodies ({'LZ4' if kind == 1 else 'ZSTD'}) need the generator's extra: "
                          "pip install 'rmqstore[gen]' (or GenConfig(compressed_ratio=0))") from e
    return zlib.compress(raw, 5)

