"""A record's bytes from a ranged source, read the way the broker's check reads them.

:func:`storelib.format.record.check_record` reads the fixed part, then each length-prefixed field;
over a :class:`SourceBytes` each of those is one small ranged read (a chunk around it), so a corrupt
TOTALSIZE or BODYLENGTH never turns into one read of the bytes it claims. A body CRC over more than a
step is computed in steps; only a record the broker accepts is ever taken whole.
"""

from __future__ import annotations

from storelib.fileio.bytesource import LocalSource
from storelib.format.crc import MASK, crc32
from storelib.format.record import RecordCheck, check_record

CHUNK = 64 * 1024  # one small read: the fixed part, a topic, the properties (at most 32767 bytes)
STEP = 1024 * 1024  # a long body's CRC, read this much at a time


class SourceBytes:
    """:class:`storelib.format.record.RecordBytes` over a ByteSource (file offsets, ``len`` = file size).

    Reads go through the source's ``read_range`` (a random read that leaves a sequential read-ahead
    alone) or ``read``. ``reads`` lists the (offset, length) of every read made.
    """

    def __init__(self, source, chunk: int = CHUNK, step: int = STEP):
        self.source = source
        self.size = int(source.size)
        self.chunk = chunk
        self.step = step
        self._read = getattr(source, "read_range", source.read)
        self._lo = 0
        self._buf = memoryview(b"")
        self.reads: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return self.size

    def _get(self, lo: int, n: int) -> memoryview:
        self.reads.append((lo, n))
        return self._read(lo, n)

    def take(self, lo: int, hi: int) -> memoryview:
        hi = min(hi, self.size)
        if hi <= lo:
            return memoryview(b"")
        if self._lo <= lo and hi <= self._lo + len(self._buf):
            return self._buf[lo - self._lo : hi - self._lo]
        if hi - lo > self.chunk:  # a whole body of a record whose lengths hold: exactly that
            return self._get(lo, hi - lo)
        self._lo, self._buf = lo, self._get(lo, min(self.chunk, self.size - lo))
        return self._buf[: hi - lo]

    def crc(self, lo: int, hi: int) -> int:
        """Masked CRC-32 of ``[lo, hi)``, read ``step`` bytes at a time."""
        hi = min(hi, self.size)
        if hi - lo <= self.step:
            data = self.take(lo, hi)
            return crc32(data) & MASK if len(data) else 0
        value = 0
        for a in range(lo, hi, self.step):
            value = crc32(self._get(a, min(self.step, hi - a)), value)
        return value & MASK


def check_at(source, pos: int, check_crc: bool, line: str | None = None, read_body: bool = True,
             dup_info: bool = False) -> RecordCheck:
    """The scalar check of the record at file offset ``pos`` of ``source``, over the whole segment
    (a local mapping as it is, a ranged source in small reads), by ``line``'s rules (``read_body``
    False: the reput's, see :func:`storelib.format.record.check_record`; ``dup_info``: 5.3.3 recovery's
    checkDupInfo)."""
    data = source.view() if isinstance(source, LocalSource) else SourceBytes(source)
    return check_record(data, pos, check_crc=check_crc, line=line, read_body=read_body, dup_info=dup_info)


def outcome(chk: RecordCheck) -> tuple[str, str, int | None]:
    """(reason, detail, size) of a failed check, as a scan's end reports it (size only when positive)."""
    reason, _, detail = (chk.reason or "parse_error: fields do not fit the record").partition(":")
    return reason.strip(), detail.strip(), chk.size if chk.size > 0 else None
