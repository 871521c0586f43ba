"""Tiny hand-checkable stores for the expiry tests: commitlog segments, ConsumeQueue files, index
headers, consumerOffset.json and chosen file mtimes (records through storelib.format.record.encode_message)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.format.consumequeue import CQ_DTYPE
from storelib.format.indexfile import IndexHeader
from storelib.format.record import Message, blank_record, encode_message

T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
H = 3_600_000
MIN = 60_000
RECORD = 1000  # bytes per record (topic "T", no properties, 908-byte body)


@dataclass
class Msg:
    topic: str
    queue_id: int
    store_ms: int
    body: int = 908


def build_store(root: Path, messages: Sequence[Msg], *, segment_size: int = 4096, cq_entries: int = 4,
                offsets: dict[str, dict[int, int]] | None = None, mtimes: dict[int, int] | None = None,
                index_ends: Sequence[int] = (), dledger: bool = False) -> BrokerSettings:
    """Write a store; ``mtimes`` maps segment number -> mtime ms (default: last message time + 1 s).
    ``dledger``: a DLedger-mode store (node n0): each record in a 48-byte entry, the body 48 bytes shorter so
    an entry takes what the record takes in the default store; DLedger's index units and state files.

    Returns the matching BrokerSettings (segment sizes)."""
    from storelib.format.dledger.entries import blank_filler, encode_entry, encode_index_unit
    from storelib.format.dledger.state import (
        CurrTerm,
        DLedgerCheckpoint,
        write_checkpoint_file,
        write_currterm_file,
    )

    head = 48 if dledger else 0
    cl = root / ("dledger-n0/data" if dledger else "commitlog")
    cl.mkdir(parents=True)
    units: list[bytes] = []
    segs: list[bytearray] = [bytearray(segment_size)]
    pos = 0
    queue_next: dict[tuple[str, int], int] = {}
    cq: dict[tuple[str, int], list[tuple[int, int]]] = {}
    last_ms: dict[int, int] = {}
    for m in messages:
        qk = (m.topic, m.queue_id)
        n = queue_next.get(qk, 0)
        phy = (len(segs) - 1) * segment_size + pos + head
        body = b"x" * (m.body - head)
        rec = encode_message(Message(topic=m.topic, body=body, queue_id=m.queue_id, queue_offset=n,
                                     physical_offset=phy, store_timestamp=m.store_ms, born_timestamp=m.store_ms))
        if pos + len(rec) + head + 8 > segment_size:
            filler = blank_filler(segment_size - pos)[:8] if dledger else blank_record(segment_size - pos)
            segs[-1][pos:pos + 8] = filler
            segs.append(bytearray(segment_size))
            pos = 0
            phy = (len(segs) - 1) * segment_size + head
            rec = encode_message(Message(topic=m.topic, body=body, queue_id=m.queue_id, queue_offset=n,
                                         physical_offset=phy, store_timestamp=m.store_ms,
                                         born_timestamp=m.store_ms))
        if dledger:
            at = (len(segs) - 1) * segment_size + pos
            rec = encode_entry(rec, len(units), 0, at)
            units.append(encode_index_unit(at, len(rec), len(units), 0))
        segs[-1][pos:pos + len(rec)] = rec
        pos += len(rec)
        queue_next[qk] = n + 1
        cq.setdefault(qk, []).append((phy, len(rec) - head))
        last_ms[len(segs) - 1] = m.store_ms
    for i, data in enumerate(segs):
        p = cl / f"{i * segment_size:020d}"
        p.write_bytes(bytes(data))
        mt = (mtimes or {}).get(i, last_ms.get(i, T0) + 1000)
        os.utime(p, ns=(mt * 1_000_000, mt * 1_000_000))
    if dledger:
        d = root / "dledger-n0"
        (d / "index").mkdir()
        raw = b"".join(units)
        (d / "index" / ("0" * 20)).write_bytes(raw + bytes(4096 - len(raw) % 4096))
        write_checkpoint_file(str(d), DLedgerCheckpoint(len(units) - 1, len(units) - 1))
        write_currterm_file(str(d), CurrTerm(0, "n0"))
    file_bytes = cq_entries * 20
    for (topic, qid), units in cq.items():
        d = root / "consumequeue" / topic / str(qid)
        d.mkdir(parents=True)
        arr = np.zeros(len(units), dtype=CQ_DTYPE)
        arr["phy_offset"] = [u[0] for u in units]
        arr["size"] = [u[1] for u in units]
        raw = arr.tobytes()
        for k in range(0, max(1, -(-len(raw) // file_bytes))):
            chunk = raw[k * file_bytes:(k + 1) * file_bytes]
            (d / f"{k * file_bytes:020d}").write_bytes(chunk + b"\0" * (file_bytes - len(chunk)))
    if index_ends:
        idx = root / "index"
        idx.mkdir()
        for j, end in enumerate(index_ends):
            hdr = IndexHeader(T0, T0, 0, end, 4, 1).to_bytes()
            (idx / f"2024010100000{j:04d}").write_bytes(hdr + b"\0" * (16 + 80))
    if offsets is not None:
        cfg = root / "config"
        cfg.mkdir()
        table = {k: {str(q): o for q, o in v.items()} for k, v in offsets.items()}
        (cfg / "consumerOffset.json").write_text(json.dumps({"offsetTable": table}))
    return BrokerSettings.defaults().with_overrides(
        {"mappedFileSizeCommitLog": segment_size, "mappedFileSizeConsumeQueue": file_bytes,
         "maxHashSlotNum": 4, "maxIndexNum": 4})


def broker_conf_text(settings: BrokerSettings) -> str:
    return "".join(f"{k}={v}\n" for k, v in settings.to_properties().items())
