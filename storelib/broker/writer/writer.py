"""StoreWriter: append messages to a commitlog exactly as the broker does, then dispatch and checkpoint.

It is the reference for "what would a broker have written": tests, fixtures and the generator's
byte-identity check use it. Rules (store-algorithms §2.1–2.3, store-format §3):

* physical offsets = segment base + write position; a record that does not fit (``L + 8 > free``)
  leaves a blank record and goes to offset 0 of the next, full-size segment (TV-8); a client batch
  moves to the next segment as a whole (§2.2);
* queue offsets come from a per ``topic-queueId`` table; PREPARED/ROLLBACK records get 0 and do not
  advance it;
* STORETIMESTAMP from an injectable clock (default: wall clock made non-decreasing);
* the store host is the writer's (the broker stamps its own address), BODYCRC computed, IPv6 host
  bits set from the host fields;
* properties are re-serialised in Java ``HashMap`` iteration order (what the broker's
  ``messageProperties2String`` produces for the map it holds; ``property_order="given"`` keeps the
  caller's order); 4.x drops the final 0x02, 5.x keeps it and may append ``__CRC32#``
  (``enabledAppendPropCRC``), and writes V2 records for topics longer than 127 characters
  (``autoMessageVersionOnTopicLen``);
* delay levels → ``SCHEDULE_TOPIC_XXXX`` queue level−1 with ``REAL_TOPIC``/``REAL_QID`` (level
  clamped); :meth:`StoreWriter.prepare` / :meth:`commit` / :meth:`rollback` write half messages,
  commit records and op records like the broker's transaction bridge.

Opening an existing store appends to it (that is the only way this module ever writes into a store it
did not create): the topic-queue table and write position are recovered from a scan (like
recoverTopicQueueTable). Segment files are created full size through a temp file + rename and then
written in place only by this writer, which holds the store's ``lock`` while open. The checkpoint
is the one that broker session leaves (:mod:`storelib.broker.writer.session`).

DLedger mode (``dledger_self_id``): records go into ``dledger-<selfId>/data`` as entries (one per
message, batches included), each entry's index unit into ``index/``, a shutdown writes DLedger's
checkpoint and currterm (:mod:`storelib.broker.writer.dledgerwriter`); offsets are entry pos + 48.

Not supported: 5.x inner batches (BatchCQ topics), timer messages, LMQ multi-dispatch.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow.compute as pc

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.writer.dledgerwriter import DLedgerAppender
from storelib.broker.writer.session import CheckpointSession
from storelib.errors import StoreError
from storelib.format.crc import body_crc
from storelib.format.dledger.entries import BODY_OFFSET
from storelib.format.javahash import java_string_hash
from storelib.format.markers import hold_lock, remove_abort, write_abort
from storelib.format.properties import (
    CRC32,
    CRC32_RESERVED_LEN,
    DELAY,
    NAME_VALUE_SEP,
    PGROUP,
    PROPERTY_SEP,
    REAL_QID,
    REAL_TOPIC,
    TAGS,
    TRAN_MSG,
    UNIQ_KEY,
    crc_digits,
)
from storelib.format.record import (
    BORNHOST_V6_FLAG,
    END_FILE_MIN_BLANK_LENGTH,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    blank_record,
    encode_message,
    gets_cq_unit,
    offset_msg_id,
)
from storelib.scan.commitlog import CommitLog, offset_to_file_name

DEFAULT_STORE_HOST = "127.0.0.1:10911"
OP_REMOVE_TAG = "d"  # TransactionalMessageUtil.REMOVETAG
_QOFF_POS, _PHY_POS = 20, 28


# ---------------------------------------------------------------------------------------------
# property serialisation


def _spread(name: str) -> int:
    h = java_string_hash(name) & 0xFFFFFFFF
    return h ^ (h >> 16)


def _table_size(n: int, initial_capacity: int) -> int:
    cap = 1
    while cap < initial_capacity:
        cap <<= 1
    while n > cap * 3 // 4:  # resize when size exceeds the 0.75 load factor threshold
        cap <<= 1
    return cap


def java_hashmap_order(names: Sequence[str], initial_capacity: int = 16) -> list[str]:
    """Iteration order of a ``java.util.HashMap`` after putting ``names`` in this order.

    Buckets are ``(h ^ h >>> 16) & (capacity - 1)``; within a bucket insertion order is kept (also
    across resizes). Chains never get long enough to treeify for property maps. Verified against the
    sample stores (``KEYS, UNIQ_KEY, CLUSTER, WAIT, TAGS``).
    """
    cap = _table_size(len(names), initial_capacity)
    return [n for _, _, n in sorted((_spread(n) & (cap - 1), i, n) for i, n in enumerate(names))]


def serialize_properties(props: Mapping[str, str], *, trailing_sep: bool, order: str = "hashmap") -> str:
    """MessageDecoder.messageProperties2String over a map holding ``props`` (insertion order = dict order)."""
    items = [(k, v) for k, v in props.items() if v is not None]
    if order == "hashmap":
        pos = {k: i for i, (k, _) in enumerate(items)}
        names = java_hashmap_order([k for k, _ in items])
        items = [items[pos[n]] for n in names]
    elif order != "given":
        raise ValueError(f"property order must be 'hashmap' or 'given', not {order!r}")
    s = "".join(f"{k}{NAME_VALUE_SEP}{v}{PROPERTY_SEP}" for k, v in items)
    if s and not trailing_sep:
        s = s[:-1]
    return s


# ---------------------------------------------------------------------------------------------
# clocks and results


class MonotonicClock:
    """Wall-clock milliseconds that never go backwards (the broker's lock-time store timestamps)."""

    def __init__(self, floor: int = 0):
        self.last = floor

    def __call__(self) -> int:
        now = time.time_ns() // 1_000_000
        self.last = max(self.last, now)
        return self.last


@dataclass(frozen=True)
class AppendResult:
    """Where one record went (AppendMessageResult + the queue it was stored in)."""

    phy_offset: int
    size: int
    queue_offset: int
    store_timestamp: int
    msg_id: str
    topic: str
    queue_id: int
    tran_type: int


def _parse_java_int(text: str, what: str) -> int:
    t = text.strip() if text is not None else ""
    try:
        v = int(t, 10)
    except ValueError:
        raise StoreError(None, None, "bad_value", f"{what} {text!r} is not a Java int") from None
    if not -(2**31) <= v < 2**31 or t != text:
        raise StoreError(None, None, "bad_value", f"{what} {text!r} is not a Java int")
    return v


# ---------------------------------------------------------------------------------------------
# the writer


class StoreWriter:
    """Append-only writer of a broker store (see the module docstring for the rules).

    ``settings``: a ``BrokerSettings`` (segment sizes, delay levels, 5.x switches); default the
    broker defaults of ``version``. ``version`` "4" or "5" selects the property style and V2/CRC
    behaviour (default: ``settings.version``). ``clock()`` returns the store time in ms for each
    append (one call per message, per batch, per transaction step).
    """

    def __init__(self, root: str | os.PathLike, settings: BrokerSettings | None = None, *, version: str | None = None,
                 clock: Callable[[], int] | None = None, store_host: str = DEFAULT_STORE_HOST,
                 preallocate: bool = False, property_order: str = "hashmap", lock: bool = True,
                 dledger_self_id: str | None = None, dledger_term: int = 0):
        if settings is None:
            settings = BrokerSettings.defaults(version or "4")
        self.root = os.path.abspath(os.fspath(root))
        self.dl = DLedgerAppender(self.root, dledger_self_id, dledger_term) if dledger_self_id else None
        if self.dl is not None:
            settings = replace(settings.with_overrides({"enableDLegerCommitLog": True, "dLegerSelfId": dledger_self_id}),
                               dledger=self.dl.layout())
        self.settings = settings
        self.version = str(version or settings.version)[0]
        if self.version not in ("4", "5"):
            raise StoreError(None, None, "bad_value", f"version must be '4' or '5', not {version!r}")
        self.v5 = self.version == "5"
        self.segment_size = int(settings.mapped_file_size_commit_log)
        self.store_host = store_host
        self.preallocate = preallocate
        self.property_order = property_order
        self.prop_crc = self.v5 and bool(settings.enabled_append_prop_crc) and self.dl is None  # DLedger: never
        self.auto_v2 = self.v5 and bool(settings.auto_message_version_on_topic_len)
        self.delay_levels = list(settings.delay_levels_ms)
        self.max_message_size = int(settings.max_message_size)
        self.queue_table: dict[tuple[str, int], int] = {}
        self.last_store_timestamp = 0
        self.reput_offset: int | None = 0
        self.last_dispatch = None
        self.closed = False
        self._stack = contextlib.ExitStack()
        os.makedirs(self._log_dir(), exist_ok=True)
        if lock:
            self._stack.enter_context(hold_lock(self.root))
        self._seg_base: int | None = None
        self._fd: int | None = None
        self._pos = 0  # write position in the current segment
        self._buf = bytearray()  # bytes not yet written, starting at _buf_pos
        self._buf_pos = 0
        self.ckpt = CheckpointSession.load(self.root, self.v5, self.dl is not None)  # StoreCheckpoint's constructor
        self._recover()
        self.clock = clock if clock is not None else MonotonicClock(self.last_store_timestamp)
        write_abort(self.root, os.getpid() if self.v5 else None)

    # -- open / recover ------------------------------------------------------------------------
    def _log_dir(self) -> str:
        return self.dl.data_dir if self.dl is not None else os.path.join(self.root, "commitlog")

    def _commitlog(self) -> CommitLog:
        return CommitLog(self._log_dir(), self.segment_size, dledger=self.dl is not None)

    def _recover(self) -> None:
        """Continue an existing commitlog: write position and topic-queue table from a scan."""
        cl = self._commitlog()
        segs = [s for s in cl.segments if s.file_size > 0]
        if not segs:
            return
        bad = [f for f in cl.findings if f.severity in ("error", "critical")]
        if bad:
            raise StoreError(bad[0].file, bad[0].offset, "unsupported",
                             f"cannot append to this commitlog: {bad[0].detail}")
        ends: list = []
        cols = ["topic", "queue_id", "queue_offset", "tran_type", "store_timestamp", "phy_offset"]
        if self.dl is not None:
            cols.append("dledger_index")
        last: dict[tuple[str, int], int] = {}
        last_phy = None  # start offset of the last valid message (recovery's lastValidMsgPhyOffset)
        for batch in cl.scan(ends=ends, verify_crc=False, with_properties=False, columns=cols):
            if batch.num_rows == 0:
                continue
            ts = np.asarray(batch.column("store_timestamp"))
            self.last_store_timestamp = max(self.last_store_timestamp, int(ts.max()))
            last_phy = int(batch.column("phy_offset")[-1].as_py())
            if self.dl is not None:
                self.dl.next_index = int(batch.column("dledger_index")[-1].as_py()) + 1
            tt = np.asarray(batch.column("tran_type"))
            keep = np.flatnonzero(gets_cq_unit(tt))
            if not len(keep):
                continue
            b = batch.take(keep)
            enc = pc.dictionary_encode(b.column("topic"))
            codes = np.asarray(enc.indices).astype(np.int64) << 32 | (np.asarray(b.column("queue_id")).astype(np.int64) & 0xFFFFFFFF)
            rev = codes[::-1]
            uniq, idx = np.unique(rev, return_index=True)
            lastrow = len(codes) - 1 - idx
            names = enc.dictionary.to_pylist()
            qoff = np.asarray(b.column("queue_offset"))
            for c, r in zip(uniq.tolist(), lastrow.tolist()):
                q = c & 0xFFFFFFFF
                last[(names[c >> 32], q - 2**32 if q >= 2**31 else q)] = int(qoff[r]) + 1
        self.queue_table = last
        self.ckpt.recovered(last_phy, self.settings.extra)
        S = self.segment_size
        e = ends[-1] if ends else None
        if e is None:
            pos = segs[-1].base
        elif e.segment_full:
            pos = e.phy_offset - e.file_offset + S
        else:
            pos = e.phy_offset
        self._open_at(pos)
        self.reput_offset = None  # continue where the consume queues say (dispatch_store's default)

    def _open_at(self, phy: int) -> None:
        S = self.segment_size
        base = phy - phy % S
        self._open_segment(base)
        self._pos = phy - base
        self._buf_pos = self._pos

    # -- segments ------------------------------------------------------------------------------
    def _segment_path(self, base: int) -> str:
        return os.path.join(self._log_dir(), offset_to_file_name(base))

    def _create_file(self, base: int) -> None:
        path = self._segment_path(base)
        if os.path.exists(path):
            return
        from storelib.fileio.publish import atomic_local_file

        with atomic_local_file(path, durable=False) as tmp, open(tmp, "wb") as f:
            f.truncate(self.segment_size)  # full size at once; a sparse zero tail like a fresh mapping

    def _open_segment(self, base: int) -> None:
        self._flush_buf()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._create_file(base)
        if self.preallocate:
            self._create_file(base + self.segment_size)
        path = self._segment_path(base)
        if os.path.getsize(path) != self.segment_size:
            raise StoreError(path, None, "wrong_segment_size", f"segment is not {self.segment_size} bytes")
        self._fd = os.open(path, os.O_RDWR)
        self._seg_base = base
        self._pos = 0
        self._buf_pos = 0
        self._buf = bytearray()

    def _flush_buf(self) -> None:
        if self._fd is not None and self._buf:
            os.pwrite(self._fd, self._buf, self._buf_pos)
            self._buf_pos += len(self._buf)
            self._buf = bytearray()

    def flush(self) -> None:
        """Write buffered records to the segment file (no fsync; close() syncs)."""
        self._flush_buf()

    # -- encoding ------------------------------------------------------------------------------
    def _props_text(self, props: Mapping[str, str]) -> str:
        return serialize_properties(props, trailing_sep=self.v5, order=self.property_order)

    def _encode(self, msg: Message, props_text: str) -> bytearray:
        topic_len = len(msg.topic)
        version = 2 if self.auto_v2 and topic_len > 127 else 1
        m = replace(msg, store_host=self.store_host, queue_offset=0, physical_offset=0, store_timestamp=0,
                    properties_raw=props_text, magic_version=version, body_crc=None)
        if len(msg.body) > self.max_message_size:
            raise StoreError(None, None, "message_too_large",
                             f"body of {len(msg.body)} bytes exceeds maxMessageSize {self.max_message_size}")
        rec = bytearray(encode_message(m, prop_crc=self.prop_crc))
        if len(rec) > self.segment_size - END_FILE_MIN_BLANK_LENGTH:
            raise StoreError(None, None, "message_too_large",
                             f"record of {len(rec)} bytes cannot fit a {self.segment_size}-byte segment")
        return rec

    def _patch(self, rec: bytearray, qoff: int, phy: int, ts: int) -> None:
        rec[_QOFF_POS:_QOFF_POS + 8] = qoff.to_bytes(8, "big", signed=True)
        rec[_PHY_POS:_PHY_POS + 8] = phy.to_bytes(8, "big", signed=True)
        sysf = int.from_bytes(rec[36:40], "big", signed=True)
        p = 48 + (20 if sysf & BORNHOST_V6_FLAG else 8)
        rec[p:p + 8] = ts.to_bytes(8, "big", signed=True)
        if self.prop_crc:
            total = len(rec)
            value = body_crc(bytes(rec[: total - CRC32_RESERVED_LEN]))
            rec[total - 11: total - 1] = crc_digits(value).encode()

    # -- the append path -------------------------------------------------------------------------
    def _put(self, recs: list[tuple[bytearray, str, int, int]], ts: int) -> list[AppendResult]:
        """Place encoded records (record, topic, queue id, tx) as one unit (one message or a batch)."""
        if self.closed:
            raise StoreError(self.root, None, "closed", "the writer is closed")
        S = self.segment_size
        need = sum(len(r) for r, *_ in recs)
        if self._seg_base is None:
            self._open_segment(0)
        if self.dl is None and self._pos + need + END_FILE_MIN_BLANK_LENGTH > S:
            free = S - self._pos
            if self._pos == 0:
                raise StoreError(None, None, "message_too_large", f"{need} bytes cannot fit a segment")
            self._buf += blank_record(free)
            self._open_segment(self._seg_base + S)
        out = []
        offsets: dict[tuple[str, int], int] = {}
        for rec, topic, qid, tx in recs:
            key = (topic, qid)
            counted = tx in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)
            if counted:
                qoff = offsets.get(key, self.queue_table.get(key, 0))
                offsets[key] = qoff + 1
            else:
                qoff = 0
            if self.dl is not None:  # one entry per record, each placed by DLedger's own rule
                fill = self.dl.filler_before(self._pos, self.segment_size, len(rec))
                if fill:  # MmapFileList.preAppend: the entry goes to the next data file
                    self._buf += fill
                    self._open_segment(self._seg_base + self.segment_size)
                phy = self._seg_base + self._pos + BODY_OFFSET
                self._patch(rec, qoff, phy, ts)
                ent = self.dl.entry(rec, phy - BODY_OFFSET)
                self._buf += ent
                self._pos += len(ent)
            else:
                phy = self._seg_base + self._pos
                self._patch(rec, qoff, phy, ts)
                self._buf += rec
                self._pos += len(rec)
            sysf = int.from_bytes(rec[36:40], "big", signed=True)
            sh = 20 if sysf & 0x20 else 8
            bh = 20 if sysf & BORNHOST_V6_FLAG else 8
            p_sh = 56 + bh
            out.append(AppendResult(phy, len(rec), qoff, ts, offset_msg_id(bytes(rec[p_sh:p_sh + sh]), phy),
                                    topic, qid, tx >> 2))
        self.queue_table.update(offsets)
        self.last_store_timestamp = max(self.last_store_timestamp, ts)
        self.ckpt.appended(ts)
        if len(self._buf) > (4 << 20):
            self._flush_buf()
        return out

    def _apply_delay(self, topic: str, qid: int, props: dict[str, str], tx: int) -> tuple[str, int]:
        """store-algorithms §2.1 step 2: DELAY > 0 on a NOT/COMMIT message → SCHEDULE_TOPIC_XXXX."""
        if tx not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE) or DELAY not in props:
            return topic, qid
        level = _parse_java_int(props[DELAY], "DELAY")
        if level <= 0:
            return topic, qid
        if level > len(self.delay_levels):  # the broker clamps and rewrites the property
            level = len(self.delay_levels)
            props[DELAY] = str(level)
        props[REAL_TOPIC] = topic
        props[REAL_QID] = str(qid)
        return SCHEDULE_TOPIC, level - 1

    def append(self, msg: Message) -> AppendResult:
        """putMessage: one message (any transaction type in SYSFLAG; PREPARED/ROLLBACK get offset 0)."""
        tx = msg.sys_flag & 0xC
        props = dict(msg.properties)
        topic, qid = self._apply_delay(msg.topic, msg.queue_id, props, tx)
        text = msg.properties_raw if msg.properties_raw is not None and props == msg.properties \
            else self._props_text(props)
        rec = self._encode(replace(msg, topic=topic, queue_id=qid), text)
        return self._put([(rec, topic, qid, tx)], self.clock())[0]

    def append_batch(self, msgs: Sequence[Message], *, topic: str | None = None, queue_id: int | None = None,
                     batch_properties: Mapping[str, str] | None = None, born_timestamp: int | None = None,
                     born_host: str | None = None, sys_flag: int = 0, reconsume_times: int = 0
                     ) -> list[AppendResult]:
        """putMessages: a client batch stored as consecutive records (store-format §3.10).

        Batch-level fields (topic, queue, born time/host, sysflag, reconsume) default to the first
        message's; each message keeps its flag, body and properties, and ``batch_properties`` are
        appended to each message's properties (0x02 inserted when needed).
        """
        if not msgs:
            return []
        first = msgs[0]
        topic = first.topic if topic is None else topic
        qid = first.queue_id if queue_id is None else queue_id
        if sys_flag & 0xC:
            raise StoreError(None, None, "bad_value", "a batch cannot be transactional")
        batch_text = self._props_text(batch_properties) if batch_properties else ""
        recs = []
        for m in msgs:
            if DELAY in m.properties and m.properties[DELAY] not in ("0", ""):
                raise StoreError(None, None, "bad_value", "a batch cannot carry delay levels")
            inner = m.properties_raw if m.properties_raw is not None else \
                serialize_properties(m.properties, trailing_sep=False, order=self.property_order)
            if inner and batch_text and not inner.endswith(PROPERTY_SEP):
                inner += PROPERTY_SEP
            text = inner + batch_text
            mm = replace(m, topic=topic, queue_id=qid, sys_flag=sys_flag, reconsume_times=reconsume_times,
                         born_timestamp=first.born_timestamp if born_timestamp is None else born_timestamp,
                         born_host=first.born_host if born_host is None else born_host,
                         prepared_transaction_offset=0)
            recs.append((self._encode(mm, text), topic, qid, 0))
        return self._put(recs, self.clock())

    # -- transactions ----------------------------------------------------------------------------
    def prepare(self, msg: Message, producer_group: str | None = None) -> AppendResult:
        """A transactional half message: stored NOT-type in RMQ_SYS_TRANS_HALF_TOPIC queue 0.

        The producer's ``TRAN_MSG=true`` and ``PGROUP`` are added when missing, DELAY is dropped (the
        client clears it for transactional messages), then REAL_TOPIC/REAL_QID as the broker adds them.
        """
        props = {k: v for k, v in msg.properties.items() if k != DELAY}
        props.setdefault(TRAN_MSG, "true")
        if producer_group is not None:
            props.setdefault(PGROUP, producer_group)
        props[REAL_TOPIC] = msg.topic
        props[REAL_QID] = str(msg.queue_id)
        sysf = (msg.sys_flag & ~0xC) | TRANSACTION_NOT_TYPE
        m = replace(msg, topic=TRANS_HALF_TOPIC, queue_id=0, sys_flag=sysf, prepared_transaction_offset=0)
        rec = self._encode(m, self._props_text(props))
        return self._put([(rec, TRANS_HALF_TOPIC, 0, TRANSACTION_NOT_TYPE)], self.clock())[0]

    def _half(self, half: AppendResult | int) -> tuple[Message, int]:
        phy = half.phy_offset if isinstance(half, AppendResult) else int(half)
        self._flush_buf()
        chk = self._commitlog().read(phy, check_crc=False)
        if chk.kind != "message" or chk.message is None or chk.message.topic != TRANS_HALF_TOPIC:
            raise StoreError("commitlog", phy, "not_a_half_message", "no transactional half message starts here")
        return chk.message, phy

    def _op(self, half_msg: Message) -> AppendResult:
        """The op record marking a half message as resolved (TransactionalMessageBridge.putOpMessage)."""
        body = str(half_msg.queue_offset) + ("," if self.v5 else "")
        ts = self.clock()
        m = Message(topic=TRANS_OP_HALF_TOPIC, body=body.encode(), queue_id=half_msg.queue_id, sys_flag=0,
                    born_timestamp=ts, born_host=self.store_host)
        rec = self._encode(m, self._props_text({TAGS: OP_REMOVE_TAG}))
        return self._put([(rec, TRANS_OP_HALF_TOPIC, half_msg.queue_id, TRANSACTION_NOT_TYPE)], ts)[0]

    def commit(self, half: AppendResult | int) -> tuple[AppendResult, AppendResult]:
        """EndTransaction COMMIT: the real message (COMMIT type, PREPAREDTRANSACTIONOFFSET = the half's
        offset, properties copied from the half), then the op record. Returns (commit, op)."""
        hm, phy = self._half(half)
        props = {k: v for k, v in hm.properties.items() if k != CRC32}
        topic = props.get(REAL_TOPIC)
        if topic is None or REAL_QID not in props:
            raise StoreError("commitlog", phy, "not_a_half_message", "half message lacks REAL_TOPIC/REAL_QID")
        qid = _parse_java_int(props[REAL_QID], "REAL_QID")
        sysf = (hm.sys_flag & ~0xC) | TRANSACTION_COMMIT_TYPE
        m = replace(hm, topic=topic, queue_id=qid, sys_flag=sysf, prepared_transaction_offset=phy,
                    properties=props, properties_raw=None)
        topic2, qid2 = self._apply_delay(topic, qid, props, TRANSACTION_COMMIT_TYPE)
        rec = self._encode(replace(m, topic=topic2, queue_id=qid2), self._props_text(props))
        res = self._put([(rec, topic2, qid2, TRANSACTION_COMMIT_TYPE)], self.clock())[0]
        return res, self._op(hm)

    def rollback(self, half: AppendResult | int) -> AppendResult:
        """EndTransaction ROLLBACK: only the op record is stored."""
        hm, _ = self._half(half)
        return self._op(hm)

    # -- dispatch, close -------------------------------------------------------------------------
    def dispatch(self, **kw: Any):
        """Write ConsumeQueue + IndexFile for everything appended since the last dispatch."""
        from storelib.broker.dispatch.dispatch import dispatch_store

        self._flush_buf()
        res = dispatch_store(self.root, self.settings, from_offset=self.reput_offset, **kw)
        self.reput_offset = res.end_offset
        self.last_dispatch = res
        self.ckpt.dispatched(res.last_cq_store_timestamp, res.index_msg_timestamp)
        return res

    @property
    def write_offset(self) -> int:
        """Physical offset where the next record would start (before any rolling)."""
        return 0 if self._seg_base is None else self._seg_base + self._pos

    def close(self, clean: bool = True, *, dispatch: bool = True) -> None:
        """Flush, dispatch what is left (clean only), write the checkpoint and the markers.

        ``clean=True`` removes ``abort`` (a clean shutdown); ``clean=False`` leaves it, as a crashed
        broker does, and does not dispatch the tail.
        """
        if self.closed:
            return
        self._flush_buf()
        if clean and dispatch and (self.reput_offset is None or self.reput_offset < self.write_offset):
            self.dispatch()
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
        if clean and not dispatch and self.ckpt.last_append is not None:
            self.ckpt.dispatched(self.ckpt.last_append)  # the broker's reput would have dispatched everything
        self.ckpt.write(self.root)  # the fields this session set, every other byte as found
        if clean:
            remove_abort(self.root)
        if self.dl is not None:
            if clean:
                self.dl.shutdown()
            self.dl.close()
        self.closed = True
        self._stack.close()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        self.close(clean=exc_type is None)


def write_messages(root: str | os.PathLike, messages: Iterable[Message], settings: BrokerSettings | None = None, **kw: Any
                   ) -> list[AppendResult]:
    """Convenience: a fresh store with ``messages`` appended, dispatched and closed cleanly."""
    with StoreWriter(root, settings, **kw) as w:
        return [w.append(m) for m in messages]


__all__ = [
    "AppendResult", "MonotonicClock", "StoreWriter", "java_hashmap_order", "serialize_properties",
    "write_messages", "UNIQ_KEY", "TRANSACTION_PREPARED_TYPE", "TRANSACTION_ROLLBACK_TYPE",
]
