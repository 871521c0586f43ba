"""The store's ``checkpoint`` file (store-format §6): five big-endian i64 in a 4096-byte page.

Recovery after a crash starts from the newest commitlog segment whose first record is older than
``min_timestamp()``, so reading these values exactly is what lets an offline tool predict (or replay)
what the broker will do. 4.9.8 only writes the first three fields; bytes 24-39 are meaningful for 5.x
stores only (differences-4x-5x #23), so they are read as found.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import pyarrow.fs as pafs

from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location
from storelib.fileio.smallfile_io import PathOrLocation, as_location, atomic_write, file_size, local_path
from storelib.format.javahash import wrap64

CHECKPOINT_FILE = "checkpoint"
CHECKPOINT_SIZE = 4096  # OS_PAGE_SIZE: the broker maps exactly one page
FIELDS_SIZE = 40
RECOVERY_SAFETY_MS = 3000

_FMT = struct.Struct(">qqqqq")


@dataclass(frozen=True)
class Checkpoint:
    """The five checkpoint fields, in file order (offsets 0, 8, 16, 24, 32)."""

    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0

    def min_timestamp(self) -> int:
        """Newest store time recovery may trust: min(physic, logics) minus the broker's 3 s margin, >= 0.

        StoreCheckpoint.getMinTimestamp subtracts in long arithmetic, then clamps below 0: a minimum
        within 3 s of Long.MIN_VALUE (a flipped sign bit) wraps to near Long.MAX_VALUE, which every
        segment's first record is older than."""
        return max(0, wrap64(min(self.physic_msg_timestamp, self.logics_msg_timestamp) - RECOVERY_SAFETY_MS))

    def min_timestamp_index(self) -> int:
        """Same, also bounded by the index checkpoint (used when messageIndexSafe is on)."""
        return min(self.min_timestamp(), self.index_msg_timestamp)

    def to_bytes(self) -> bytes:
        """The 4096-byte file image, zero padded after the 40 bytes of fields."""
        for name, value in self.__dict__.items():
            if not -(2**63) <= int(value) < 2**63:
                raise StoreError(CHECKPOINT_FILE, None, "bad_value", f"{name}={value} does not fit in an i64")
        head = _FMT.pack(
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.master_flushed_offset,
            self.confirm_phy_offset,
        )
        return head + bytes(CHECKPOINT_SIZE - FIELDS_SIZE)

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, file: str | None = CHECKPOINT_FILE) -> Checkpoint:
        """Decode the first 40 bytes of a checkpoint image."""
        if len(data) < FIELDS_SIZE:
            raise StoreError(
                file, len(data), "truncated", f"checkpoint needs {FIELDS_SIZE} bytes, has {len(data)}"
            )
        return cls(*_FMT.unpack_from(data, 0))


def _checkpoint_location(where: PathOrLocation) -> Location:
    """A store root or the checkpoint file itself."""
    loc = as_location(where)
    try:
        info = loc.fs.get_file_info(loc.path)
    except OSError as e:
        raise StoreError(loc.path, None, "unreadable", str(e)) from e
    if info.type == pafs.FileType.Directory:
        return loc.join(CHECKPOINT_FILE)
    return loc


def read_checkpoint(where: PathOrLocation, *, strict: bool = True) -> Checkpoint:
    """Read the checkpoint of a store root (or a checkpoint file path / Location).

    A missing file, or one shorter than the page the broker maps, raises StoreError naming the file and
    the offset where data stops. ``strict=False`` accepts any file holding at least the 40 field bytes.
    """
    loc = _checkpoint_location(where)
    size = file_size(loc)
    if size is None:
        raise StoreError(loc.path, None, "missing", "no checkpoint file")
    if size < FIELDS_SIZE or (strict and size < CHECKPOINT_SIZE):
        raise StoreError(
            loc.path, size, "truncated", f"checkpoint is {size} bytes, expected {CHECKPOINT_SIZE}"
        )
    try:
        with loc.fs.open_input_file(loc.path) as f:
            head = f.read_at(FIELDS_SIZE, 0)
    except OSError as e:
        raise StoreError(loc.path, None, "unreadable", str(e)) from e
    return Checkpoint.from_bytes(head, loc.path)


def as_broker_reads(data: bytes | memoryview | None, file: str, size: int | None = None
                    ) -> tuple[Checkpoint, Finding | None]:
    """The checkpoint StoreCheckpoint's constructor reads from a file holding ``data`` (None: no file;
    ``size``: the file's size when ``data`` is only its head).

    It maps 4096 bytes read-write (4.9.8 StoreCheckpoint.java:46, 5.3.3 :49), which extends a shorter
    file with zeros, so the fields past the file's end read as 0 and the broker starts; a missing file
    reads as all zeros too (the broker creates it). A short or missing file comes with a warning naming
    the file and its size (the offset where its bytes stop)."""
    if data is None:
        return Checkpoint(), Finding("checkpoint_missing", "warning", file, None,
                                     "no checkpoint file: every timestamp reads as 0 (the broker creates it)")
    size = len(data) if size is None else size
    cp = Checkpoint.from_bytes(bytes(data[:FIELDS_SIZE]).ljust(FIELDS_SIZE, b"\0"), file)
    if size >= CHECKPOINT_SIZE:
        return cp, None
    lost = [n for n, off in zip(Checkpoint.__dataclass_fields__, range(0, FIELDS_SIZE, 8)) if off + 8 > size]
    what = f"bytes {size}-{FIELDS_SIZE - 1} ({', '.join(lost)}) read as zero" if lost else \
        "its five fields are all there"
    return cp, Finding("checkpoint_short", "warning", file, size,
                       f"checkpoint is {size} bytes, not {CHECKPOINT_SIZE}: the broker maps {CHECKPOINT_SIZE} bytes "
                       f"read-write, which extends it with zeros; {what}", {"size": size})


def read_checkpoint_as_broker(where: PathOrLocation, name: str | None = None) -> tuple[Checkpoint, Finding | None]:
    """:func:`as_broker_reads` of a store root's (or a path's) checkpoint file, the finding naming it ``name``
    (default: its path): for the start-up and recovery models and ``info``, which must go on where the broker
    does; commands that need the exact bytes use :func:`read_checkpoint`."""
    loc = _checkpoint_location(where)
    size = file_size(loc)
    if size is None:
        return as_broker_reads(None, name or loc.path)
    try:
        with loc.fs.open_input_file(loc.path) as f:
            head = f.read_at(min(size, FIELDS_SIZE), 0)
    except OSError as e:
        raise StoreError(loc.path, None, "unreadable", str(e)) from e
    return as_broker_reads(head, name or loc.path, size)


def write_checkpoint(where: str | os.PathLike | Location, cp: Checkpoint) -> str:
    """Write ``cp`` as a 4096-byte file (temp + rename); ``where`` is a store root or the file path.

    Returns the path written. The file is replaced as a whole, so bytes 40..4095 become zero.
    """
    path = local_path(where)
    if os.path.isdir(path):
        path = os.path.join(path, CHECKPOINT_FILE)
    atomic_write(path, cp.to_bytes())
    return path
