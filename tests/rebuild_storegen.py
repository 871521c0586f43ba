"""Crafted commitlog stores for the recovery and rebuild tests (and the rebuild benchmark).

:class:`CraftedStore` appends records the way a broker does (store-algorithms §2.1): queue offsets
from a per-queue table (PREPARED/ROLLBACK get 0 and do not advance it), delay messages moved to
``SCHEDULE_TOPIC_XXXX``, PHYSICALOFFSET = position, a blank record when ``L + 8 > free`` and the
record retried in the next segment. Tests can also place raw bytes and corrupt records afterwards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from storelib.format.record import (
    SCHEDULE_TOPIC,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    blank_record,
    encode_message,
)


@dataclass
class Placed:
    """Where a record went: physical offset, size, segment index and file offset, the message."""

    phy: int
    size: int
    segment: int
    file_offset: int
    msg: Message


class CraftedStore:
    """An in-memory commitlog written out as segment files by :meth:`write`."""

    def __init__(self, segment_size: int = 64 * 1024, *, start_ts: int = 1_700_000_000_000, version: str = "4",
                 max_delay_level: int = 18):
        self.S = segment_size
        self.segments: list[bytearray] = [bytearray(segment_size)]
        self.pos = 0
        self.table: dict[str, int] = {}
        self.ts = start_ts
        self.placed: list[Placed] = []
        self.version = version
        self.max_delay_level = max_delay_level

    @property
    def seg_index(self) -> int:
        return len(self.segments) - 1

    def phy(self) -> int:
        return self.seg_index * self.S + self.pos

    def roll(self) -> None:
        """Fill the current segment with a blank record and start the next one."""
        free = self.S - self.pos
        if free >= 8:
            self.segments[-1][self.pos:self.pos + 8] = blank_record(free)
        self.segments.append(bytearray(self.S))
        self.pos = 0

    def append(self, msg: Message, *, ts_step: int = 1, prop_crc: bool = False) -> Placed:
        """Append like CommitLog.putMessage (delay rewrite, queue offset table, roll with a blank)."""
        msg = replace(msg, properties=dict(msg.properties))
        tx = msg.sys_flag & 0xC
        delay = msg.properties.get("DELAY")
        if tx in (0, 8) and delay is not None and int(delay) > 0:
            level = min(int(delay), self.max_delay_level)
            msg.properties["DELAY"] = str(level)
            msg.properties["REAL_TOPIC"] = msg.topic
            msg.properties["REAL_QID"] = str(msg.queue_id)
            msg.topic, msg.queue_id = SCHEDULE_TOPIC, level - 1
        key = f"{msg.topic}-{msg.queue_id}"
        nxt = self.table.setdefault(key, 0)
        msg.queue_offset = 0 if tx in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE) else nxt
        self.ts += ts_step
        msg.store_timestamp = self.ts
        if not msg.born_timestamp:
            msg.born_timestamp = self.ts - 1
        msg.physical_offset = 0
        size = len(encode_message(msg, prop_crc=prop_crc))
        if size + 8 > self.S - self.pos:
            self.roll()
        msg.physical_offset = self.phy()
        data = encode_message(msg, prop_crc=prop_crc)
        assert len(data) == size
        seg = self.segments[-1]
        seg[self.pos:self.pos + size] = data
        p = Placed(msg.physical_offset, size, self.seg_index, self.pos, msg)
        self.placed.append(p)
        self.pos += size
        if tx not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
            self.table[key] = nxt + 1
        return p

    def put_raw(self, data: bytes, *, segment: int | None = None, offset: int | None = None) -> int:
        """Write raw bytes (at the current position by default, advancing it); returns the phy offset."""
        if segment is None:
            segment, offset = self.seg_index, self.pos
            self.pos += len(data)
        assert offset is not None
        self.segments[segment][offset:offset + len(data)] = data
        return segment * self.S + offset

    def corrupt(self, phy: int, rel: int, value: int | None = None) -> None:
        """Change the byte ``rel`` bytes into the record at ``phy`` (XOR 0xFF by default)."""
        seg, off = divmod(phy + rel, self.S)
        b = self.segments[seg]
        b[off] = (b[off] ^ 0xFF) if value is None else value

    def body_pos(self, p: Placed) -> int:
        """Offset of the first body byte inside the record."""
        bh = 20 if p.msg.sys_flag & 0x10 or ":" in p.msg.born_host.rsplit(":", 1)[0] else 8
        sh = 20 if ":" in p.msg.store_host.rsplit(":", 1)[0] else 8
        return 48 + bh + 8 + sh + 4 + 8 + 4

    def write(self, root: str | os.PathLike, *, preallocate: int = 0, drop_empty_tail: bool = True) -> str:
        """Write ``root/commitlog/<segments>`` (full size; ``preallocate`` extra all-zero segments)."""
        d = os.path.join(os.fspath(root), "commitlog")
        os.makedirs(d, exist_ok=True)
        segs = list(self.segments)
        if drop_empty_tail and len(segs) > 1 and self.pos == 0 and not any(segs[-1][:8]):
            segs = segs[:-1]
        segs += [bytearray(self.S) for _ in range(preallocate)]
        for i, b in enumerate(segs):
            with open(os.path.join(d, f"{i * self.S:020d}"), "wb") as f:
                f.write(b)
        return os.fspath(root)


def msg(topic: str = "TopicA", queue_id: int = 0, *, body: bytes = b"hello", keys: str | None = None,
        tags: str | None = "TagA", uniq: str | None = None, sys_flag: int = 0, delay: int | None = None,
        born_host: str = "10.0.0.1:5000", store_host: str = "10.0.0.2:10911", magic_version: int = 1,
        extra: dict[str, str] | None = None) -> Message:
    """A message with the usual properties (order: KEYS, TAGS, DELAY, UNIQ_KEY, WAIT)."""
    props: dict[str, str] = {}
    if keys is not None:
        props["KEYS"] = keys
    if tags is not None:
        props["TAGS"] = tags
    if delay is not None:
        props["DELAY"] = str(delay)
    if uniq is not None:
        props["UNIQ_KEY"] = uniq
    props["WAIT"] = "true"
    if extra:
        props.update(extra)
    return Message(topic=topic, body=body, queue_id=queue_id, sys_flag=sys_flag, born_host=born_host,
                   store_host=store_host, properties=props, magic_version=magic_version)
