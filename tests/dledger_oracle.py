"""Scalar references for DLedger data files (tests only): an entry-by-entry walk with DLedger's recovery
checks and the scalar record validator, and a tiny image builder. The scanner's column-wise DLedger walk
is tested against these."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from storelib.format.dledger.entries import (
    BLANK_MAGIC,
    BODY_OFFSET,
    blank_filler,
    encode_entry,
    header_problem,
    needs_blank,
)
from storelib.format.record import MAGIC_V1, MAGIC_V2, Message, check_record, encode_message

_I = struct.Struct(">i")
_H = struct.Struct(">iiqqqiiii")


@dataclass
class Walk:
    entries: list[tuple[int, int, int]] = field(default_factory=list)  # (file offset, index, term)
    kind: str = ""
    offset: int = 0
    reason: str | None = None


def oracle_walk(buf: bytes, base: int = 0, start: int = 0, prev: tuple[int, int] | None = None) -> Walk:
    """DLedgerMmapFileStore.recover's walk over one file, then CommitLog's check of each entry's record."""
    w = Walk()
    pos = start
    while True:
        left = len(buf) - pos
        w.offset = pos
        if left < 4:
            w.kind, w.reason = "invalid", "truncated"
            return w
        magic = _I.unpack_from(buf, pos)[0]
        if magic == BLANK_MAGIC:
            w.kind = "blank"
            return w
        if left < 8:
            w.kind, w.reason = "invalid", "truncated"
            return w
        if _I.unpack_from(buf, pos + 4)[0] == 0:
            w.kind = "end_of_data"
            return w
        if left < BODY_OFFSET:
            w.kind, w.reason = "invalid", "truncated"
            return w
        m, size, index, term, p, _, _, _, blen = _H.unpack_from(buf, pos)
        why = header_problem(m, size, p, blen, base + pos, left)
        if why is None and prev is not None and (index != prev[0] + 1 or term < prev[1]):
            why = "contiguity"
        if why is not None:
            w.kind, w.reason = "invalid", "bad_entry"
            return w
        rtot, rmag = struct.unpack_from(">ii", buf, pos + BODY_OFFSET)
        if rmag not in (MAGIC_V1, MAGIC_V2):
            w.kind, w.reason = "invalid", "bad_magic"
            return w
        if rtot != blen:
            w.kind, w.reason = "invalid", "length_mismatch"
            return w
        chk = check_record(buf, pos + BODY_OFFSET, check_crc=False)  # the reput reads on past the entry
        if chk.kind != "message":
            w.kind, w.reason = "invalid", (chk.reason or "invalid").split(":", 1)[0].strip()
            return w
        w.entries.append((pos, index, term))
        prev = (index, term)
        pos += size


def messages(n: int, seed: int = 0) -> list[Message]:
    """``n`` varied messages (IPv6 hosts, V2 records, keys, tags) whose offsets the builder fills in."""
    out = []
    for i in range(n):
        out.append(Message(topic=f"T{(i + seed) % 3}", body=bytes([i % 256]) * (10 + (7 * i + seed) % 300),
                           queue_id=i % 2, queue_offset=i // 2, store_timestamp=1_700_000_000_000 + i,
                           born_host="10.0.0.1:1" if i % 4 else "[::1]:5",
                           properties={"TAGS": f"tag{i}", "KEYS": f"k{i} k{i + 1}", "UNIQ_KEY": f"{i + seed:032X}"},
                           magic_version=2 if i % 5 == 0 else 1))
    return out


def build_data_files(msgs: list[Message], file_size: int, *, term_of=lambda i: 0, first_index: int = 0,
                     base: int = 0) -> list[bytes]:
    """DLedger data file images for ``msgs`` appended in order (PHYSICALOFFSET = pos + 48, blank fillers)."""
    files: list[bytearray] = [bytearray()]
    pos = base
    for i, m in enumerate(msgs):
        m.physical_offset = pos + BODY_OFFSET
        rec = encode_message(m)
        cur = files[-1]
        if needs_blank(len(cur), file_size, BODY_OFFSET + len(rec)):
            cur += blank_filler(file_size - len(cur))
            files.append(bytearray())
            pos = base + (len(files) - 1) * file_size
            m.physical_offset = pos + BODY_OFFSET
            rec = encode_message(m)
            cur = files[-1]
        ent = encode_entry(rec, first_index + i, term_of(i), pos)
        cur += ent
        pos += len(ent)
    return [bytes(f) + bytes(file_size - len(f)) for f in files]
