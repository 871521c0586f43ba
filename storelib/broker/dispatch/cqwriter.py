"""The broker's ConsumeQueue writer: the dispatch state machine per queue (:func:`build_consume_queues`,
fillers, repeats, the files it rolls into) and the files it writes (:func:`write_queue_image`,
:func:`write_consume_queues`); reading the files is :mod:`storelib.format.consumequeue`.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from storelib.broker.settings.cqload import LoadedQueue
from storelib.errors import StoreError
from storelib.fileio.bytesource import Location
from storelib.format.consumequeue import (  # the readers' constants and helpers
    CQ_DTYPE,
    CQ_UNIT_SIZE,
    DEFAULT_CQ_SEGMENT_SIZE,
    FILLER_ENTRY,
    as_location,
    check_segment_size,
    file_name,
    fillers,
    make_units,
)
from storelib.format.javahash import jrem, wrap64
from storelib.format.record import gets_cq_unit
from storelib.format.topicname import unsafe_reason

# the broker's CQ writer; NO_SLOT: the slot of a record it drops (no unit has it; -1 can be a unit's)
NO_SLOT = np.iinfo(np.int64).min


@dataclass(frozen=True)
class QueueState:
    """What putMessagePositionInfo needs to know about a queue (store-algorithms §5.1).

    ``last_base`` None means the queue has no segment (the next entry creates a first-create segment,
    with fillers when its offset ≠ 0). ``backing`` is the existing file holding the last segment's
    bytes, so a continued segment keeps what is already on disk (including stale bytes after the end).
    """

    max_physic_offset: int = -1
    last_base: int | None = None
    write_pos: int = 0
    first_create: bool = False
    min_logic_offset: int = 0
    backing: Location | None = None

    @property
    def current(self) -> int | None:
        """Logical byte offset of the next write into the last segment (None without segments)."""
        return None if self.last_base is None else self.last_base + self.write_pos

    @classmethod
    def from_existing(cls, cq: LoadedQueue) -> QueueState:
        """The state a broker holds for ``cq`` after recovery (§8.2): last segment's write position
        and maxPhysicOffset from the scan; loaded segments are never first-create."""
        rec = cq.recover()
        if not rec.segments:
            return cls()
        last, wpos = rec.segments[-1][0], rec.wrote  # negative in a negative file (cqload.write_position)
        return cls(max_physic_offset=rec.max_physic_offset, last_base=last.base, write_pos=wpos,
                   first_create=False, min_logic_offset=0, backing=last.loc)


@dataclass
class QueueImage:
    """The CQ bytes one build wrote for one queue.

    ``entries`` are the units written from logical byte offset ``start`` on, contiguously (fillers
    included); ``segment_bases`` the segments created or written (a created segment may stay empty);
    ``prefix`` the existing file whose bytes precede ``start`` in the first of them (continuation).
    ``rows`` are the input row numbers of this queue in dispatch order and ``slots`` the logical offset
    each was written at (:data:`NO_SLOT`: skipped as duplicate or repeat). ``state`` continues a later build.
    """

    topic: str
    queue_id: int
    start: int
    entries: np.ndarray
    segment_bases: list[int]
    state: QueueState
    prefix: Location | None = None
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    slots: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    skipped_duplicates: int = 0
    skipped_repeats: int = 0
    out_of_order: int = 0

    @property
    def end(self) -> int:
        """Logical byte offset after the last unit written (the queue's new write position)."""
        return self.start + len(self.entries) * CQ_UNIT_SIZE

    @property
    def base(self) -> int | None:
        """Base (file name offset) of the first segment this image touches, None if it touches none."""
        return self.segment_bases[0] if self.segment_bases else None


_REQUIRED = ("physical_offset_field", "size", "tags_code", "topic", "queue_id", "queue_offset", "tran_type")


def _column(records, name: str) -> pa.Array | pa.ChunkedArray:
    try:
        col = records.column(name)
    except KeyError as e:
        raise StoreError(None, None, "bad_input", f"records lack column {name!r}") from e
    if col.null_count:
        raise StoreError(None, None, "bad_input", f"column {name!r} has {col.null_count} nulls")
    return col


def _np(col, dtype) -> np.ndarray:
    return np.asarray(col.to_numpy() if isinstance(col, pa.ChunkedArray) else col.to_numpy(zero_copy_only=False),
                      dtype=dtype)


class _Machine:
    """putMessagePositionInfo for one queue, entry by entry (irregular queues only)."""

    def __init__(self, st: QueueState, S: int):
        self.S = S
        self.max_phy = st.max_physic_offset
        self.last_base = st.last_base
        self.wpos = st.write_pos
        self.first_create = st.first_create
        self.min_logic = st.min_logic_offset
        self.start = st.current
        self.units: list[tuple[int, int, int]] = []
        self.bases: list[int] = []
        self.dups = self.repeats = self.slides = 0

    def _create(self, base: int, first: bool) -> None:
        self.last_base, self.wpos, self.first_create = base, 0, first
        if self.start is None:
            self.start = base
        self.bases.append(base)

    def _append(self, u: tuple[int, int, int]) -> int:
        if self.last_base is not None and (not self.bases or self.bases[-1] != self.last_base):
            self.bases.append(self.last_base)  # first write into a pre-existing segment
        slot = self.last_base + self.wpos
        self.units.append(u)
        self.wpos += CQ_UNIT_SIZE
        return slot

    def put(self, p: int, z: int, c: int, n: int) -> int:
        end = wrap64(p + z)
        if end <= self.max_phy:
            self.dups += 1
            return NO_SLOT
        expect = wrap64(n * CQ_UNIT_SIZE)
        S = self.S
        if self.last_base is None:
            self._create(expect - jrem(expect, S), True)
        elif self.wpos >= S:
            self._create(self.last_base + S, False)
        if self.first_create and n != 0 and self.wpos == 0:
            self.min_logic = expect
            until = jrem(expect, S)
            for _ in range(0, until, CQ_UNIT_SIZE):
                self._append(FILLER_ENTRY)
        if n != 0:
            cur = self.last_base + self.wpos
            if expect < cur:
                self.repeats += 1
                return NO_SLOT
            if expect != cur:
                self.slides += 1
        self.max_phy = end
        return self._append((p, z, c)) // CQ_UNIT_SIZE

    def state(self, backing: Location | None) -> QueueState:
        return QueueState(self.max_phy, self.last_base, self.wpos, self.first_create, self.min_logic, backing)


def slide_slots(q: np.ndarray, cur: int) -> np.ndarray:
    """The slots (:data:`NO_SLOT`: none) :class:`_Machine` gives records with QUEUEOFFSETs ``q`` that each end
    past the one before (no duplicate), the write position at slot ``cur`` (no first-file fillers), in numpy:
    each goes to the write position (a slide when its offset differs), unless its offset is not 0 and its unit's
    offset, a Java long (wraps), is below the write position's (a repeat). putMessagePositionInfo, 4.9.8 and
    5.3.3. Used by the dispatch fast path (:func:`_fast_image`) and the audit (cqrecovery)."""
    k = len(q)
    slot = np.full(k, NO_SLOT, np.int64)
    with np.errstate(over="ignore"):
        expect = np.where(np.asarray(q) == 0, np.iinfo(np.int64).max, np.asarray(q, np.int64) * CQ_UNIT_SIZE)
    i = 0
    while i < k:
        drop = expect[i:] < (cur + np.arange(k - i)) * CQ_UNIT_SIZE  # offset 0 (max here): never a repeat
        j = int(drop.argmax()) if drop.any() else k - i
        slot[i:i + j] = cur + np.arange(j)
        cur += j
        i += j
        if i < k:  # a run of repeats: the write position stays
            keep = expect[i:] >= cur * CQ_UNIT_SIZE
            i += int(keep.argmax()) if keep.any() else k - i
    return slot


def _group_order(tidx: np.ndarray, qu: np.ndarray, code: np.ndarray) -> np.ndarray:
    """The stable order of rows by ``code`` = (topic index << 32) | unsigned queue id.

    With few (topic, queue) combinations the rank-preserving dense key fits 16 bits, which numpy sorts
    stably by radix (linear) instead of the merge sort of int64 keys: ~10x faster on millions of rows.
    """
    if len(code):
        q0 = int(qu.min())
        span = int(qu.max()) - q0 + 1
        if (int(tidx.max()) + 1) * span <= 1 << 16:
            return np.argsort((tidx * span + (qu - q0)).astype(np.uint16), kind="stable")
    return np.argsort(code, kind="stable")


def build_consume_queues(records: pa.Table | pa.RecordBatch, *, segment_size: int = DEFAULT_CQ_SEGMENT_SIZE,
                         state: Mapping[tuple[str, int], QueueState] | None = None,
                         ) -> dict[tuple[str, int], QueueImage]:
    """Run the broker's CQ writer (store-algorithms §5.2) over dispatch-ordered records.

    ``records`` columns: physical_offset_field, size, tags_code, topic, queue_id, queue_offset,
    tran_type (only NOT=0 and COMMIT=2 get entries). ``state`` maps (topic, queue_id) to the state of
    an existing queue (``QueueState.from_existing`` or a previous image's ``state``); other queues start
    empty. Returns one image per queue that had at least one NOT/COMMIT record.

    Steps: the records grouped by queue in one vectorised pass (:func:`_grouped`), each queue's starting
    state (:func:`_first_states`), the queues whose records the fast path cannot take
    (:func:`_irregular`), then each queue's image: the state machine record by record for those
    (:func:`_machine_image`), column slices for the rest (:func:`_fast_image`)."""
    S = check_segment_size(segment_size)
    gr = _grouped(records)
    out: dict[tuple[str, int], QueueImage] = {}
    if gr is None:
        return out
    keys, init, cur0, max0, ok0 = _first_states(gr, state or {}, S)
    irregular = _irregular(gr, cur0, max0, ok0)
    units_all = np.empty(len(gr.code_s), dtype=CQ_DTYPE)
    units_all["phy_offset"] = gr.P
    units_all["size"] = gr.Z.astype(np.int32)
    units_all["tags_code"] = gr.C
    for g in range(len(gr.starts)):
        a, b = int(gr.starts[g]), int(gr.stops[g])
        st = init[g]
        img = (_machine_image(gr, a, b, st, keys[g], S) if irregular[g] else
               _fast_image(gr, a, b, st, keys[g], int(cur0[g]), S, units_all))
        if img.state.last_base is not None and img.state.last_base != st.last_base:
            img.state = replace(img.state, backing=None)
        out[keys[g]] = img
    return out


@dataclass
class _Grouped:
    """Dispatchable records in queue order (one gather per column: ``rows_s`` are their input rows) and
    the queues' row ranges (``starts``/``stops``)."""

    names: list[str]  # topic names by code
    code_s: np.ndarray  # topic code << 32 | queue id, per row
    rows_s: np.ndarray
    P: np.ndarray  # PHYSICALOFFSET field
    Z: np.ndarray  # size
    C: np.ndarray  # tags code
    N: np.ndarray  # QUEUEOFFSET
    ends: np.ndarray  # P + Z
    expect: np.ndarray  # N * unit size: where the broker expects the unit
    starts: np.ndarray
    stops: np.ndarray


def _grouped(records: pa.Table | pa.RecordBatch) -> _Grouped | None:
    """The NOT/COMMIT records grouped by queue, stable (None: there are none)."""
    cols = {name: _column(records, name) for name in _REQUIRED}
    tt = _np(cols["tran_type"], np.int64)
    keep = np.flatnonzero(gets_cq_unit(tt))
    if len(keep) == 0:
        return None
    every = len(keep) == len(tt)
    topic = cols["topic"]
    if isinstance(topic, pa.ChunkedArray):
        topic = topic.combine_chunks()
    # a dictionary column (a rebuild's work file: topic codes) comes back as it is, without hashing
    enc = pc.dictionary_encode(topic if every else topic.take(pa.array(keep)))
    tidx = np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    Q = _np(cols["queue_id"], np.int64)
    qu = (Q if every else Q[keep]) & 0xFFFFFFFF
    code = (tidx << 32) | qu
    order = _group_order(tidx, qu, code)
    code_s = code[order]
    rows_s = order if every else keep[order]
    P = _np(cols["physical_offset_field"], np.int64)[rows_s]
    Z = _np(cols["size"], np.int64)[rows_s]
    N = _np(cols["queue_offset"], np.int64)[rows_s]
    starts = np.flatnonzero(np.r_[True, code_s[1:] != code_s[:-1]])
    with np.errstate(over="ignore"):
        ends, expect = P + Z, N * CQ_UNIT_SIZE
    return _Grouped(enc.dictionary.to_pylist(), code_s, rows_s, P, Z, _np(cols["tags_code"], np.int64)[rows_s], N,
                    ends, expect, starts, np.r_[starts[1:], len(code_s)])


def _first_states(gr: _Grouped, state: Mapping[tuple[str, int], QueueState], S: int
                  ) -> tuple[list[tuple[str, int]], list[QueueState], np.ndarray, np.ndarray, np.ndarray]:
    """Per queue: its key, its starting state, where its next unit goes, its max physical offset, and
    whether its first record continues the queue as the fast path needs."""
    G = len(gr.starts)
    keys: list[tuple[str, int]] = []
    init: list[QueueState] = []
    cur0 = np.zeros(G, dtype=np.int64)
    max0 = np.zeros(G, dtype=np.int64)
    ok0 = np.zeros(G, dtype=bool)
    n_first = gr.N[gr.starts]
    for g in range(G):
        c = int(gr.code_s[gr.starts[g]])
        q = c & 0xFFFFFFFF
        key = (gr.names[c >> 32], q - 2**32 if q >= 2**31 else q)
        st = state.get(key, QueueState())
        keys.append(key)
        init.append(st)
        max0[g] = st.max_physic_offset
        n0 = int(n_first[g])
        if st.last_base is None:
            ok0[g] = 0 <= n0 < 2**57
            cur0[g] = n0 * CQ_UNIT_SIZE if ok0[g] else 0
        else:
            cur = st.last_base + st.write_pos
            ok0[g] = (n0 == 0 or n0 * CQ_UNIT_SIZE == cur) and not (st.first_create and st.write_pos == 0 and n0)
            ok0[g] = ok0[g] and 0 <= st.write_pos <= S and st.last_base % S == 0 and 0 <= cur < 2**62
            cur0[g] = cur
    return keys, init, cur0, max0, ok0


def _irregular(gr: _Grouped, cur0: np.ndarray, max0: np.ndarray, ok0: np.ndarray) -> np.ndarray:
    """The queues the fast path cannot take (a record not past its predecessor's end, or not at the slot
    its QUEUEOFFSET names): the state machine replays them record by record."""
    grp = np.repeat(np.arange(len(gr.starts)), gr.stops - gr.starts)
    idx = np.arange(len(gr.code_s)) - gr.starts[grp]
    first_row = idx == 0
    prev_end = np.r_[np.int64(0), gr.ends[:-1]]
    end_ok = np.where(first_row, gr.ends > max0[grp], gr.ends > prev_end)
    with np.errstate(over="ignore"):
        slot_b = cur0[grp] + idx * CQ_UNIT_SIZE
    off_ok = first_row | (gr.N == 0) | (gr.expect == slot_b)
    bad = ~(end_ok & off_ok)
    irregular = ~ok0
    if bad.any():
        irregular[np.unique(grp[bad])] = True
    return irregular


def _machine_image(gr: _Grouped, a: int, b: int, st: QueueState, key: tuple[str, int], S: int) -> QueueImage:
    """One queue's image from the broker's state machine, record by record."""
    prefix = st.backing
    m = _Machine(st, S)
    slots = np.array([m.put(p, z, c, n) for p, z, c, n in zip(
        gr.P[a:b].tolist(), gr.Z[a:b].tolist(), gr.C[a:b].tolist(), gr.N[a:b].tolist())], dtype=np.int64)
    ents = make_units(*zip(*m.units)) if m.units else np.zeros(0, dtype=CQ_DTYPE)
    start = m.start if m.start is not None else 0
    return QueueImage(key[0], key[1], start, ents, m.bases, m.state(prefix),
                      prefix if st.last_base is not None and st.last_base in m.bases[:1] else None,
                      gr.rows_s[a:b], slots, m.dups, m.repeats, m.slides)


def _fast_image(gr: _Grouped, a: int, b: int, st: QueueState, key: tuple[str, int], c0: int, S: int,
                units_all: np.ndarray) -> QueueImage:
    """One queue's image when every record goes to the next slot (column slices, fillers before a new
    queue's first unit); the slots are :func:`slide_slots`' (no repeat nor slide: :func:`_irregular`)."""
    prefix = st.backing
    k = b - a
    if st.last_base is None:
        base0 = c0 - c0 % S
        nfill = (c0 - base0) // CQ_UNIT_SIZE
        ents = np.concatenate([fillers(nfill), units_all[a:b]]) if nfill else units_all[a:b]
        start = base0
        min_logic = c0 if c0 else st.min_logic_offset
    else:
        base0 = c0 - c0 % S
        ents = units_all[a:b]
        start = c0
        min_logic = st.min_logic_offset
    end_pos = c0 + k * CQ_UNIT_SIZE
    last_base = (end_pos - CQ_UNIT_SIZE) // S * S
    first_create = (st.last_base is None and last_base == base0) or (
        st.last_base is not None and last_base == st.last_base and st.first_create)
    new_state = QueueState(int(gr.ends[b - 1]), last_base, end_pos - last_base, first_create, min_logic,
                           prefix if last_base == st.last_base else None)
    return QueueImage(key[0], key[1], start, ents, list(range(base0, last_base + 1, S)), new_state,
                      prefix if st.last_base is not None and base0 == st.last_base else None,
                      gr.rows_s[a:b], slide_slots(gr.N[a:b], c0 // CQ_UNIT_SIZE))


# writing


def _read_prefix(loc: Location, S: int) -> bytes:
    try:
        if loc.local:
            with open(loc.path, "rb") as f:
                return f.read(S)
        with loc.fs.open_input_file(loc.path) as f:
            return f.read(min(S, f.size()))
    except (OSError, pa.ArrowException):
        return b""


def _exists(loc: Location) -> bool:
    try:
        return loc.fs.get_file_info(loc.path).type == pafs.FileType.File
    except (OSError, pa.ArrowException):
        return False


def write_queue_image(image: QueueImage, out_dir: Location | str | os.PathLike,
                      segment_size: int = DEFAULT_CQ_SEGMENT_SIZE, digests: dict[str, str] | None = None) -> list[str]:
    """Write the segments ``image`` touches into the queue directory ``out_dir``; return their paths.

    Each file is full size: units where the image wrote them, zeros after (a fresh segment), or the
    existing bytes (a continued segment: ``image.prefix``, else the file already in ``out_dir``).
    Local files go through a temp file + os.replace; remote ones through a temp object + move when
    the filesystem supports it. ``digests``: filled with each written path's SHA-256 (hex), computed
    from the bytes as they are written (no read-back).
    """
    S = check_segment_size(segment_size)
    loc = as_location(out_dir)
    if loc.local and digests is None and (image.prefix is None or image.prefix.local):
        return _write_queue_image_local(image, loc.path, S)
    raw = np.ascontiguousarray(image.entries, dtype=CQ_DTYPE).tobytes()
    written: list[str] = []
    if loc.local:
        os.makedirs(loc.path, exist_ok=True)
    else:
        loc.fs.create_dir(loc.path, recursive=True)
    for i, base in enumerate(image.segment_bases):
        lo, hi = max(base, image.start), min(base + S, image.end)
        data = raw[max(0, lo - image.start): max(0, hi - image.start)] if hi > lo else b""
        pos = lo - base if hi > lo else 0
        target = loc.join(file_name(base))
        prefix = b""
        if i == 0 and image.start > base or (i == 0 and image.prefix is not None):
            src = image.prefix if image.prefix is not None else (target if _exists(target) else None)
            prefix = _read_prefix(src, S) if src is not None else b""
        if prefix:
            buf = bytearray(S)
            buf[: len(prefix)] = prefix
            buf[pos: pos + len(data)] = data
            chunks: list[bytes | bytearray] = [buf]
            fill_to = S
            pos_first = 0
        else:
            chunks, fill_to, pos_first = [data], S, pos
        write_file(target, chunks, pos_first, fill_to, digests)
        written.append(target.path)
    return written


def _data_prefix(path: str, size: int) -> bytes:
    """The bytes of ``path`` up to its first hole (all of it where holes are not reported).

    A continued CQ segment written by this module is data followed by a sparse zero tail: reading
    only the data (SEEK_HOLE) keeps a chunked dispatch from re-reading and re-writing whole 6 MB
    segments of zeros after every chunk. Bytes in a hole are zeros, so nothing is lost.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    try:
        try:
            end = os.lseek(fd, 0, os.SEEK_HOLE)
            try:  # data after the first hole (a file written otherwise): read it all
                if os.lseek(fd, end, os.SEEK_DATA) < size:
                    end = size
            except OSError:  # ENXIO: no data after the hole
                pass
        except (OSError, AttributeError):
            end = size
        os.lseek(fd, 0, os.SEEK_SET)
        chunks, got = [], 0
        while got < min(end, size):
            b = os.read(fd, min(end, size) - got)
            if not b:
                break
            chunks.append(b)
            got += len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write_queue_image_local(image: QueueImage, out_dir: str, segment_size: int) -> list[str]:
    """:func:`write_queue_image` into a local directory without digests: the same bytes, written sparse
    (each file full size, zeros as holes), a continued segment's existing bytes read up to the first hole
    only; temp file + rename (:func:`storelib.fileio.publish.atomic_local_file`)."""
    from storelib.fileio.publish import atomic_local_file

    S = segment_size
    raw = np.ascontiguousarray(image.entries, dtype=CQ_DTYPE).tobytes()
    os.makedirs(out_dir, exist_ok=True)
    written: list[str] = []
    for i, base in enumerate(image.segment_bases):
        lo, hi = max(base, image.start), min(base + S, image.end)
        data = raw[max(0, lo - image.start): max(0, hi - image.start)] if hi > lo else b""
        pos = lo - base if hi > lo else 0
        target = os.path.join(out_dir, file_name(base))
        prefix = b""
        if i == 0 and image.start > base or (i == 0 and image.prefix is not None):
            src = image.prefix.path if image.prefix is not None else None  # local (write_queue_image)
            prefix = _data_prefix(src or target, S)
        with atomic_local_file(target, durable=False) as tmp, open(tmp, "wb") as f:
            if prefix:
                f.write(prefix[:pos])
                if len(prefix) < pos:
                    f.seek(pos)
                f.write(data)
                if len(prefix) > pos + len(data):
                    f.write(prefix[pos + len(data):])
            else:
                if pos:
                    f.seek(pos)
                f.write(data)
            f.truncate(S)
        written.append(target)
    return written


_ZEROS = memoryview(bytes(1 << 20))


def _sha256_of(chunks: list, pos: int, size: int) -> str:
    """SHA-256 (hex) of the file :func:`write_file` makes: ``pos`` zeros, the chunks, zeros up to ``size``."""
    h = hashlib.sha256()

    def zeros(n: int) -> None:
        while n > 0:
            k = min(n, len(_ZEROS))
            h.update(_ZEROS[:k])
            n -= k

    zeros(pos)
    for c in chunks:
        h.update(c)
    zeros(size - pos - sum(len(c) for c in chunks))
    return h.hexdigest()


def write_file(target: Location, chunks: list, pos: int, size: int, digests: dict[str, str] | None = None) -> None:
    """Write ``chunks`` at ``pos`` of a new file of ``size`` bytes (zeros elsewhere), atomically;
    with ``digests``, record the file's SHA-256 under its path."""
    if digests is not None:
        digests[target.path] = _sha256_of(chunks, pos, size)
    tmp_name = f".{os.path.basename(target.path)}.{uuid.uuid4().hex[:12]}.tmp"
    parent = target.path.rsplit("/", 1)[0]
    tmp = f"{parent}/{tmp_name}"
    if target.local:
        from storelib.fileio.publish import atomic_local_file

        with atomic_local_file(target.path, durable=False) as tmp_path, open(tmp_path, "wb") as f:
            if pos:
                f.seek(pos)
            for c in chunks:
                f.write(c)
            f.truncate(size)  # sparse zero tail, like the broker's freshly mapped file
        return
    body = bytearray(size)
    p = pos
    for c in chunks:
        body[p: p + len(c)] = c
        p += len(c)
    fs = target.fs
    with fs.open_output_stream(tmp) as f:
        f.write(body)
    try:
        fs.move(tmp, target.path)
    except (OSError, NotImplementedError, pa.ArrowException):
        with fs.open_output_stream(target.path) as f:
            f.write(body)
        try:
            fs.delete_file(tmp)
        except (OSError, pa.ArrowException):
            pass


def write_consume_queues(images: Mapping[tuple[str, int], QueueImage], consumequeue_dir: Location | str,
                         segment_size: int = DEFAULT_CQ_SEGMENT_SIZE, digests: dict[str, str] | None = None
                         ) -> list[str]:
    """Write every image under ``consumequeue_dir/<topic>/<queueId>/``, skipping topics that cannot be a
    directory (storelib.format.topicname);
    ``digests`` as in :func:`write_queue_image`."""
    root = as_location(consumequeue_dir)
    paths: list[str] = []
    for (topic, qid), img in sorted(images.items(), key=lambda kv: kv[0]):
        if unsafe_reason(topic) is None:  # an unsafe name is never a path (the caller reports it)
            paths += write_queue_image(img, root.join(topic, str(qid)), segment_size, digests)
    return paths
