"""The 5.x timer store, read: ``timerlog/`` units, the ``timerwheel`` slots, ``config/timercheck`` and
``config/timermetrics``, and the timer messages of the commitlog (pending and delivered).

Layouts from RocketMQ 5.3.3's own code (store/timer/TimerLog, TimerWheel, Slot, TimerCheckpoint,
TimerMessageStore; store-format §9):

* timerlog: a mapped-file queue (``mappedFileSizeTimerLog``) of 52-byte big-endian units: size i32 (52),
  prevPos i64 (the previous unit of the same slot), magic i32 (1 DEFAULT | 2 ROLL | 4 DELETE),
  currWriteTime i64, delayedTime i32 (relative to currWriteTime: the slot time is their sum), offsetPy i64
  (the ``rmq_sys_wheel_timer`` record in the commitlog), sizePy i32, hashCode of the real topic i32,
  reserved i64. A file ends with a filler (size = bytes left, 0 i64, magic -875286124) once a unit plus
  16 bytes no longer fits.
* timerwheel: 7 x 86 400 x 2 slots of 32 bytes: time / precisionMs i64, firstPos i64, lastPos i64, num i32,
  magic i32; slot index = time / precisionMs mod slots. Slots are not cleared after delivery.
* timercheck: 4096 bytes, big-endian longs: lastReadTimeMs, lastTimerLogFlushPos, lastTimerQueueOffset,
  masterTimerQueueOffset, dataVersion (stateVersion, timestamp, counter); a shorter file reads as zeros past
  its end (the broker's map grows it), a longer one by its first 56 bytes.

A timer message is the broker's rewrite of a message with ``TIMER_DELIVER_MS``/``TIMER_DELAY_SEC``:
stored under ``rmq_sys_wheel_timer`` queue 0 with ``REAL_TOPIC``/``REAL_QID`` and ``TIMER_OUT_MS``; when
due, it is re-put on its real topic with ``TIMER_ENQUEUE_MS``/``TIMER_DEQUEUE_MS``. Pending = an enqueue
record whose UNIQ_KEY has no delivered copy.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location, open_source

TIMER_TOPIC = "rmq_sys_wheel_timer"
UNIT_SIZE = 52
MIN_BLANK_LEN = 16
BLANK_MAGIC = -875286124  # 0xBBCCDDEE ^ 1880681586 + 8 in Java (+ binds first)
MAGIC_DEFAULT, MAGIC_ROLL, MAGIC_DELETE = 1, 2, 4
SLOTS_TOTAL = 7 * 86_400  # TIMER_WHEEL_TTL_DAY x DAY_SECS; the file holds twice as many
SLOT_SIZE = 32
CHECKPOINT_SIZE = 4096
TIMERCHECK_FIELDS = 56  # seven longs
TIMERCHECK_JAVA_NAMES = ("lastReadTimeMs", "lastTimerLogFlushPos", "lastTimerQueueOffset", "masterTimerQueueOffset",
                         "dataVersion.stateVersion", "dataVersion.timestamp", "dataVersion.counter")
DEFAULT_TIMERLOG_FILE_SIZE = 100 * 1024 * 1024
DEFAULT_PRECISION_MS = 1000
MAX_TIMERLOG_FILES = 100_000  # a listing bound (a 1 TB timerlog of 100 MiB files is 10 000)

UNIT_DTYPE = np.dtype([("size", ">i4"), ("prev_pos", ">i8"), ("magic", ">i4"), ("curr_write_ms", ">i8"),
                       ("delayed_time", ">i4"), ("offset_py", ">i8"), ("size_py", ">i4"),
                       ("hash_real_topic", ">i4"), ("reserved", ">i8")])
SLOT_DTYPE = np.dtype([("time", ">i8"), ("first_pos", ">i8"), ("last_pos", ">i8"), ("num", ">i4"), ("magic", ">i4")])
assert UNIT_DTYPE.itemsize == UNIT_SIZE and SLOT_DTYPE.itemsize == SLOT_SIZE

UNIT_SCHEMA = pa.schema([
    ("pos", pa.int64()), ("file", pa.string()), ("file_offset", pa.int32()), ("prev_pos", pa.int64()),
    ("magic", pa.int32()), ("roll", pa.bool_()), ("delete", pa.bool_()), ("curr_write_ms", pa.int64()),
    ("delayed_time", pa.int32()), ("slot_time_ms", pa.int64()), ("offset_py", pa.int64()), ("size_py", pa.int32()),
    ("hash_real_topic", pa.int32()), ("reserved", pa.int64()),
])
SLOT_SCHEMA = pa.schema([
    ("index", pa.int32()), ("time_ms", pa.int64()), ("first_pos", pa.int64()), ("last_pos", pa.int64()),
    ("num", pa.int32()), ("magic", pa.int32()), ("file_offset", pa.int64()), ("index_matches_time", pa.bool_()),
    ("chain_length", pa.int32()), ("chain_ok", pa.bool_()),
])


class TimerSettings(Protocol):
    """The two settings the timer store's layout depends on (BrokerSettings has them; a format module
    does not import the broker's settings)."""

    timer_precision_ms: int | None
    mapped_file_size_timer_log: int | None


PRECISION_CANDIDATES = (100, 200, 500, 1000)


def snap_timer_precision(value: int) -> int:
    """MessageStoreConfig.setTimerPrecisionMs (5.3.3): the largest of 100, 200, 500, 1000 not above the value
    (100 below 200, 1000 from 1000 up: 300 -> 200, 2000 -> 1000). The broker.conf value goes through this
    setter (MixAll.properties2Object), so a wheel is never laid out in any other precision."""
    for lower, upper in zip(PRECISION_CANDIDATES, PRECISION_CANDIDATES[1:]):
        if value < upper:
            return lower
    return PRECISION_CANDIDATES[-1]


def precision_of(settings: TimerSettings) -> int:
    """timerPrecisionMs of a store's settings as the broker uses it (snapped; the 5.x default where a 4.x
    settings object has none)."""
    v = settings.timer_precision_ms
    return DEFAULT_PRECISION_MS if v is None else snap_timer_precision(int(v))


def timerlog_file_size(settings: TimerSettings) -> int:
    """mappedFileSizeTimerLog of a store's settings, the 5.x default where none is known."""
    return int(settings.mapped_file_size_timer_log or DEFAULT_TIMERLOG_FILE_SIZE)


def units_per_file(file_size: int) -> int:
    """Units a timerlog file takes before the 16-byte filler is due (TimerLog.append)."""
    return (file_size - MIN_BLANK_LEN) // UNIT_SIZE


def unit_position(k: int, file_size: int) -> int:
    """Log position of the ``k``-th unit appended (TimerLog.append: a file takes units until one plus the
    16-byte filler no longer fits, then the next file starts)."""
    file_no, in_file = divmod(k, units_per_file(file_size))
    return file_no * file_size + in_file * UNIT_SIZE


def slot_index(time_ms: int | np.ndarray, precision_ms: int = DEFAULT_PRECISION_MS) -> Any:
    """TimerWheel.getSlotIndex: (time / precision) mod (slots x 2)."""
    return (time_ms // precision_ms) % (SLOTS_TOTAL * 2)


# ------------------------------------------------------------------------------------------------
# timerlog


@dataclass
class TimerLog:
    """The timerlog's units (one Arrow table, log order), its files and what was wrong with them."""

    units: pa.Table
    files: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def prev_of(self) -> dict[int, int]:
        pos = self.units.column("pos").to_numpy()
        prev = self.units.column("prev_pos").to_numpy()
        return dict(zip(pos.tolist(), prev.tolist()))


def list_timerlog_files(root: Location) -> list[tuple[int, str, int]]:
    import pyarrow.fs as pafs

    d = root.join("timerlog")
    try:
        infos = root.fs.get_file_info(pafs.FileSelector(d.path, allow_not_found=True))
    except (OSError, pa.ArrowException) as e:
        raise StoreError("timerlog", None, "unreadable", f"cannot list: {e}") from e
    out = [(int(i.base_name), i.base_name, int(i.size or 0)) for i in infos
           if i.type == pafs.FileType.File and len(i.base_name) == 20 and i.base_name.isdigit()]
    if len(out) > MAX_TIMERLOG_FILES:
        raise StoreError("timerlog", None, "too_many_files", f"{len(out)} files, more than {MAX_TIMERLOG_FILES}")
    return sorted(out)


def read_timerlog(root: Location, file_size: int | None = None) -> TimerLog:
    """Every unit of ``timerlog/`` (vectorised per file); bad units, misnamed or mis-sized files are findings.

    A file is read in 52-byte strides from its start: units (size 52, a known magic) are kept; the
    filler or zeros end the file; anything else is a ``bad_timerlog_unit`` finding and the stride goes on.
    """
    findings: list[Finding] = []
    tables: list[pa.Table] = []
    files: list[dict[str, Any]] = []
    listed = list_timerlog_files(root)
    expect = file_size or (listed[0][2] if listed else DEFAULT_TIMERLOG_FILE_SIZE)
    for base, name, size in listed:
        rel = f"timerlog/{name}"
        if size != expect:
            findings.append(Finding("timerlog_file_size", "error", rel, None,
                                    f"{size} bytes; the timerlog's files are {expect} (mappedFileSizeTimerLog)"))
        if base % max(expect, 1):
            findings.append(Finding("timerlog_misnamed", "error", rel, None,
                                    f"name is not a multiple of the file size {expect}"))
        with open_source(root.join("timerlog", name), size) as src:
            raw = np.frombuffer(bytes(src.read(0, size)), dtype=np.uint8)
        n = size // UNIT_SIZE
        recs = raw[:n * UNIT_SIZE].view(UNIT_DTYPE) if n else np.zeros(0, UNIT_DTYPE)
        sizes, magic = recs["size"].astype(np.int64), recs["magic"].astype(np.int64)
        is_unit = (sizes == UNIT_SIZE) & (magic >= MAGIC_DEFAULT) & (magic <= 7) & ((magic & MAGIC_DEFAULT) != 0)
        end_at = n
        kind = "end_of_file"
        for k in np.flatnonzero(~is_unit).tolist():
            off = k * UNIT_SIZE
            head = raw[off:off + MIN_BLANK_LEN].tobytes()
            s_, _, m_ = struct.unpack(">iqi", head) if len(head) == MIN_BLANK_LEN else (0, 0, 0)
            if m_ == BLANK_MAGIC and s_ == size - off:
                end_at, kind = k, "blank"
                break
            if not raw[off:off + UNIT_SIZE].any():
                end_at, kind = k, "end_of_data"
                break
            findings.append(Finding("bad_timerlog_unit", "error", rel, off,
                                    f"not a timerlog unit (size {s_}, magic {m_}): skipped, the next unit read "
                                    f"{UNIT_SIZE} bytes on"))
        if kind == "end_of_file" and n * UNIT_SIZE < size:  # a tail too short for a unit: filler or zeros
            off = n * UNIT_SIZE
            head = raw[off:off + MIN_BLANK_LEN].tobytes()
            if len(head) == MIN_BLANK_LEN and struct.unpack(">iqi", head)[2] == BLANK_MAGIC:
                kind = "blank"
        keep = np.flatnonzero(is_unit[:end_at])
        r = recs[keep]
        pos = base + keep.astype(np.int64) * UNIT_SIZE
        cw = r["curr_write_ms"].astype(np.int64)
        dt = r["delayed_time"].astype(np.int32)
        mg = r["magic"].astype(np.int32)
        tables.append(pa.table({
            "pos": pos, "file": pa.array([rel] * len(keep), pa.string()),
            "file_offset": (keep * UNIT_SIZE).astype(np.int32), "prev_pos": r["prev_pos"].astype(np.int64),
            "magic": mg, "roll": (mg & MAGIC_ROLL) != 0, "delete": (mg & MAGIC_DELETE) != 0, "curr_write_ms": cw,
            "delayed_time": dt, "slot_time_ms": cw + dt.astype(np.int64), "offset_py": r["offset_py"].astype(np.int64),
            "size_py": r["size_py"].astype(np.int32), "hash_real_topic": r["hash_real_topic"].astype(np.int32),
            "reserved": r["reserved"].astype(np.int64)}, schema=UNIT_SCHEMA))
        files.append({"file": rel, "base": base, "size": size, "units": int(len(keep)), "end": kind,
                      "end_offset": int(end_at * UNIT_SIZE) if kind != "end_of_file" else size})
    units = pa.concat_tables(tables) if tables else UNIT_SCHEMA.empty_table()
    _check_prev_pointers(units, findings)
    return TimerLog(units, files, findings)


def _check_prev_pointers(units: pa.Table, findings: list[Finding]) -> None:
    """A unit's prevPos is -1 or an earlier unit's position (a chain that points forward could loop)."""
    if not units.num_rows:
        return
    pos = units.column("pos").to_numpy()
    prev = units.column("prev_pos").to_numpy()
    known = np.isin(prev, pos) | (prev == -1)
    bad = np.flatnonzero(~known | ((prev >= pos) & (prev != -1)))
    files = units.column("file").to_pylist()
    offs = units.column("file_offset").to_numpy()
    for i in bad[:50].tolist():
        findings.append(Finding("timerlog_bad_prev", "error", files[i], int(offs[i]),
                                f"prevPos {int(prev[i])} is not an earlier unit of the timerlog"))
    if len(bad) > 50:
        findings.append(Finding("timerlog_bad_prev", "error", "timerlog", None, f"... {len(bad) - 50} more"))


# ------------------------------------------------------------------------------------------------
# timerwheel


def read_wheel(root: Location, log: TimerLog, precision_ms: int = DEFAULT_PRECISION_MS) -> tuple[pa.Table, list[Finding]]:
    """The wheel's non-empty slots, each with its chain (lastPos back through prevPos) checked against
    the timerlog: ``num`` as doEnqueue counts it (+1 a unit, -1 a delete marker's) and ending at
    ``firstPos``, never looping (bounded walk)."""
    findings: list[Finding] = []
    loc = root.join("timerwheel")
    info = root.fs.get_file_info(loc.path)
    if info.type.name == "NotFound":
        return SLOT_SCHEMA.empty_table(), findings
    want = SLOTS_TOTAL * 2 * SLOT_SIZE
    size = int(info.size or 0)
    if size != want:
        findings.append(Finding("timerwheel_size", "error", "timerwheel", None,
                                f"{size} bytes; a 5.x wheel is {SLOTS_TOTAL} x 2 slots of {SLOT_SIZE} = {want}"))
    n = min(size, want) // SLOT_SIZE
    with open_source(loc, size) as src:
        slots = np.frombuffer(bytes(src.read(0, n * SLOT_SIZE)), dtype=SLOT_DTYPE)
    used = np.flatnonzero((slots["time"] != 0) | (slots["num"] != 0) | (slots["last_pos"] != 0))
    s = slots[used]
    time_ms = s["time"].astype(np.int64) * precision_ms
    prev = log.prev_of()
    deletes = set(log.units.filter(log.units.column("delete")).column("pos").to_pylist()) if log.units.num_rows else set()
    lengths, oks = [], []
    for first, last, num in zip(s["first_pos"].tolist(), s["last_pos"].tolist(), s["num"].tolist()):
        length, net, at, ok = 0, 0, last, True  # net: num as doEnqueue counts it (a delete marker takes 1 off)
        while at != -1 and length <= len(prev):
            if at not in prev:
                ok = False
                break
            length += 1
            net += -1 if at in deletes else 1
            if at == first:
                break
            at = prev[at]
        lengths.append(length)
        oks.append(ok and net == num and at == first)
    table = pa.table({
        "index": used.astype(np.int32), "time_ms": time_ms, "first_pos": s["first_pos"].astype(np.int64),
        "last_pos": s["last_pos"].astype(np.int64), "num": s["num"].astype(np.int32), "magic": s["magic"].astype(np.int32),
        "file_offset": used.astype(np.int64) * SLOT_SIZE,
        "index_matches_time": slot_index(time_ms, precision_ms) == used,
        "chain_length": np.array(lengths, np.int32), "chain_ok": np.array(oks, bool)}, schema=SLOT_SCHEMA)
    for row in table.filter(pc.invert(table.column("chain_ok"))).slice(0, 50).to_pylist():
        findings.append(Finding("timerwheel_chain", "error", "timerwheel", row["file_offset"],
                                f"slot {row['index']}: num {row['num']} but the chain from lastPos {row['last_pos']} "
                                f"to firstPos {row['first_pos']} holds {row['chain_length']} unit(s) (a delete "
                                "marker's counting -1) or leaves the timerlog"))
    for row in table.filter(pc.invert(table.column("index_matches_time"))).slice(0, 50).to_pylist():
        findings.append(Finding("timerwheel_slot_time", "error", "timerwheel", row["file_offset"],
                                f"slot {row['index']} holds time {row['time_ms']}, whose slot is "
                                f"{int(slot_index(row['time_ms'], precision_ms))}"))
    return table, findings


# ------------------------------------------------------------------------------------------------
# timercheck and timermetrics


@dataclass(frozen=True)
class TimerCheckpoint:
    last_read_time_ms: int
    last_timer_log_flush_pos: int
    last_timer_queue_offset: int
    master_timer_queue_offset: int
    state_version: int
    timestamp: int
    counter: int


def read_timer_checkpoint(root: Location) -> TimerCheckpoint | None:
    """``config/timercheck`` as the broker reads it (None when absent; :func:`timer_checkpoint_as_broker`)."""
    return read_timer_checkpoint_as_broker(root)[0]


def read_timer_checkpoint_as_broker(root: Location) -> tuple[TimerCheckpoint | None, Finding | None]:
    """:func:`timer_checkpoint_as_broker` of a store root's ``config/timercheck`` (None, None when absent;
    StoreError when it is not a file)."""
    loc = root.join("config", "timercheck")
    info = root.fs.get_file_info(loc.path)
    if info.type.name == "NotFound":
        return None, None
    if info.type.name != "File":  # TimerCheckpoint's RandomAccessFile throws FileNotFoundException (the load fails)
        raise StoreError("config/timercheck", None, "unreadable", f"a {info.type.name.lower()}, not a file")
    size = int(info.size or 0)
    if size == 0:
        return timer_checkpoint_as_broker(b"")
    with open_source(loc, size) as src:
        return timer_checkpoint_as_broker(bytes(src.read(0, min(size, TIMERCHECK_FIELDS))), size)


def timer_checkpoint_as_broker(data: bytes, size: int | None = None) -> tuple[TimerCheckpoint, Finding | None]:
    """The fields TimerCheckpoint's constructor reads from a file holding ``data`` (``size``: the file's size
    when ``data`` is only its head), and a warning when the file is too short to hold them.

    5.3.3 TimerCheckpoint :56-71 opens the file read-write and maps 4096 bytes (OS_PAGE_SIZE), which grows a
    shorter file with zeros, then reads its seven longs at 0..48 (the buffer's position stays 0, so
    ``hasRemaining`` is always true and the data version is read too): a short or empty file reads its bytes
    then zeros (a field cut across reads its bytes as the high ones) and the broker starts. A file longer
    than 4096 bytes is neither truncated nor read past its first 56 bytes: no finding."""
    size = len(data) if size is None else size
    cp = TimerCheckpoint(*struct.unpack(">7q", bytes(data[:TIMERCHECK_FIELDS]).ljust(TIMERCHECK_FIELDS, b"\0")))
    if size >= TIMERCHECK_FIELDS:
        return cp, None
    cut = [n + (" (its first bytes kept)" if 8 * i < size else "") for i, n in enumerate(TIMERCHECK_JAVA_NAMES)
           if 8 * i + 8 > size]
    return cp, Finding("timercheck_short", "warning", "config/timercheck", size,
                       f"timercheck is {size} bytes, fewer than the {TIMERCHECK_FIELDS} its fields need: the broker "
                       f"maps {CHECKPOINT_SIZE} bytes read-write (TimerCheckpoint :58), which extends it with zeros, "
                       f"and starts from what it reads; bytes {size}-{TIMERCHECK_FIELDS - 1} read as zero: {', '.join(cut)}",
                       {"size": size, "fields_cut": [c.split(" ")[0] for c in cut]})


def read_timer_metrics(root: Location) -> tuple[dict[str, int], list[Finding]]:
    """``config/timermetrics`` (fastjson, .bak fallback): pending timers per real topic (timingCount)."""
    from storelib.format.configjson import load_config

    ld = load_config(root, "timermetrics")
    data = ld.data or {}
    counts = data.get("timingCount") or {}
    out: dict[str, int] = {}
    for k, v in counts.items():  # {"topic": {"count": n, "timeStamp": ms}}
        n = v.get("count") if isinstance(v, dict) else v
        if isinstance(n, (int, float)) and not isinstance(n, bool):
            out[str(k)] = int(n)
    return out, list(ld.findings)


# ------------------------------------------------------------------------------------------------
# writers (the bytes 5.3.3 writes)


def encode_units(units: pa.Table) -> bytes:
    """Units (:data:`UNIT_SCHEMA` columns) as consecutive 52-byte big-endian records."""
    out = np.zeros(units.num_rows, UNIT_DTYPE)
    out["size"] = UNIT_SIZE
    for name in ("prev_pos", "magic", "curr_write_ms", "delayed_time", "offset_py", "size_py", "hash_real_topic",
                 "reserved"):
        out[name] = units.column(name).to_numpy()
    return out.tobytes()


def timerlog_images(units: pa.Table, file_size: int) -> dict[str, bytes]:
    """The timerlog files holding ``units`` in order, as TimerLog.append lays them out: a unit goes into
    the current file unless it and a 16-byte filler no longer fit, then the filler (size = bytes left,
    0, BLANK_MAGIC) closes the file and the unit starts the next. Each image is the written prefix of
    its file (the rest of a ``file_size``-byte file is zeros)."""
    raw = encode_units(units)
    per_file = units_per_file(file_size)
    if per_file <= 0:
        raise StoreError("timerlog", None, "bad_value", f"a {file_size}-byte timerlog file holds no unit")
    images: dict[str, bytes] = {}
    n = units.num_rows
    for k, first in enumerate(range(0, max(n, 1), per_file)):
        chunk = raw[first * UNIT_SIZE:(first + per_file) * UNIT_SIZE]
        if first + per_file < n:  # a later unit exists: this file was closed by a filler
            left = file_size - len(chunk)
            chunk += struct.pack(">iqi", left, 0, BLANK_MAGIC)
        images[f"{k * file_size:020d}"] = chunk
        if not n:
            break
    return images


def encode_wheel(slots: pa.Table, precision_ms: int = DEFAULT_PRECISION_MS) -> dict[int, bytes]:
    """{file offset: 32 bytes} of every used slot (the rest of the wheel file is zeros)."""
    out = {}
    for r in slots.select(["index", "time_ms", "first_pos", "last_pos", "num", "magic"]).to_pylist():
        out[int(r["index"]) * SLOT_SIZE] = struct.pack(">qqqii", r["time_ms"] // precision_ms, r["first_pos"],
                                                       r["last_pos"], r["num"], r["magic"])
    return out


def encode_timer_checkpoint(cp: TimerCheckpoint) -> bytes:
    """``config/timercheck``: seven big-endian longs, zero-padded to 4096 bytes."""
    return struct.pack(">7q", cp.last_read_time_ms, cp.last_timer_log_flush_pos, cp.last_timer_queue_offset,
                       cp.master_timer_queue_offset, cp.state_version, cp.timestamp, cp.counter).ljust(CHECKPOINT_SIZE,
                                                                                                          b"\0")


def encode_timer_metrics(counts: dict[str, tuple[int, int]], data_version: tuple[int, int, int]) -> str:
    """``config/timermetrics`` as fastjson writes it: ``{"dataVersion":{counter, stateVersion, timestamp},
    "timingCount":{topic:{"count", "timeStamp"}}}`` (keys sorted, no spaces). ``counts``: topic -> (count,
    timeStamp); ``data_version``: (counter, stateVersion, timestamp)."""
    from storelib.format.fastjson import dump_fastjson

    counter, state, ts = data_version
    doc = {"dataVersion": {"counter": counter, "stateVersion": state, "timestamp": ts},
           "timingCount": {t: {"count": c, "timeStamp": at} for t, (c, at) in sorted(counts.items())}}
    return dump_fastjson(doc, pretty=False)


def write_timer_store(root: str, units: pa.Table, slots: pa.Table, cp: TimerCheckpoint, *, file_size: int,
                      precision_ms: int = DEFAULT_PRECISION_MS) -> list[str]:
    """Write ``timerlog/``, ``timerwheel`` and ``config/timercheck`` under a store root (each file full size,
    zeros sparse, through a temp file and a rename); returns the paths written."""
    import os

    from storelib.fileio.publish import atomic_local_file

    written = []
    os.makedirs(os.path.join(root, "timerlog"), exist_ok=True)
    os.makedirs(os.path.join(root, "config"), exist_ok=True)
    for name, img in timerlog_images(units, file_size).items():
        path = os.path.join(root, "timerlog", name)
        with atomic_local_file(path, durable=False) as tmp, open(tmp, "wb") as f:
            f.write(img)
            f.truncate(file_size)
        written.append(path)
    path = os.path.join(root, "timerwheel")
    with atomic_local_file(path, durable=False) as tmp, open(tmp, "wb") as f:
        f.truncate(SLOTS_TOTAL * 2 * SLOT_SIZE)
        for off, data in sorted(encode_wheel(slots, precision_ms).items()):
            f.seek(off)
            f.write(data)
    written.append(path)
    path = os.path.join(root, "config", "timercheck")
    with atomic_local_file(path, durable=False) as tmp, open(tmp, "wb") as f:
        f.write(encode_timer_checkpoint(cp))
    written.append(path)
    return written


__all__ = ["BLANK_MAGIC", "MAGIC_DEFAULT", "MAGIC_DELETE", "MAGIC_ROLL", "SLOTS_TOTAL", "TIMER_TOPIC", "TimerCheckpoint",
           "TimerLog", "UNIT_SIZE", "read_timer_checkpoint", "read_timer_checkpoint_as_broker", "timer_checkpoint_as_broker",
           "read_timer_metrics", "read_timerlog", "read_wheel",
           "slot_index", "snap_timer_precision", "encode_timer_checkpoint", "encode_timer_metrics", "encode_units", "encode_wheel",
           "timerlog_images", "write_timer_store"]
