"""Is this a RocketMQ store at all? One answer for every command and data source.

An empty directory, the folder that holds ``store/``, or a commitlog of random bytes used to read as
"a store with no messages": an operator takes that for an empty store. A root without ``commitlog/``
is an error that says where the store probably is; a first segment whose first bytes are neither a
record, a blank record nor unwritten zeros is a finding, and commands that would print nothing fail.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pyarrow.fs as pafs

from storelib.broker.settings.dledgerlayout import dledger_dirs
from storelib.errors import Finding, StoreLayoutError
from storelib.fileio.bytesource import Location, open_source
from storelib.format.record import BLANK_MAGIC, MAGIC_V1, MAGIC_V2

_SEGMENT = re.compile(r"^[0-9]{20}$")


class NotAStoreError(StoreLayoutError):
    """The path is not a broker store root (no ``commitlog/``), or its commitlog holds no records."""


def require_store_root(loc: Location, shown: str) -> None:
    """Raise :class:`NotAStoreError` unless ``loc`` holds a ``commitlog/`` directory (or DLedger's folders).

    ``shown`` is the path as the user wrote it; the error names a store one level down when there is one.
    """
    try:
        kind = loc.fs.get_file_info(loc.join("commitlog").path).type
    except OSError as e:
        raise NotAStoreError(shown, None, "unreadable", str(e)) from None
    if kind == pafs.FileType.Directory or dledger_dirs(loc):
        return
    if loc.fs.get_file_info(loc.path).type == pafs.FileType.NotFound:
        raise NotAStoreError(shown, None, "not_found", "store root does not exist")
    hint = ""
    try:
        below = [i.base_name for i in loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True))
                 if i.type == pafs.FileType.Directory]
    except OSError:
        below = []
    for name in sorted(below, key=lambda n: (n != "store", n))[:64]:
        if (loc.fs.get_file_info(loc.join(name, "commitlog").path).type == pafs.FileType.Directory
                or dledger_dirs(loc.join(name))):
            hint = f"; did you mean {shown.rstrip('/')}/{name}?"
            break
    raise NotAStoreError(shown, None, "not_a_store",
                         f"not a RocketMQ store root: no commitlog/ here (nor DLedger's dledger-<selfId>/){hint}")


def _segments(loc: Location) -> list[pafs.FileInfo]:
    cl = loc.join("commitlog")
    try:
        infos = [i for i in cl.fs.get_file_info(pafs.FileSelector(cl.path, allow_not_found=True))
                 if i.type == pafs.FileType.File and _SEGMENT.match(i.base_name) and (i.size or 0) > 0]
    except OSError:
        return []
    return sorted(infos, key=lambda i: i.base_name)


def _head(loc: Location, info: pafs.FileInfo) -> tuple[int, int] | None:
    """(TOTALSIZE, magic) of a segment's first record slot; None when unreadable or unwritten (zeros)."""
    try:
        # 8 bytes by a ranged read: a running broker's cleaner may take the file, never map it
        with open_source(replace(loc.join("commitlog", info.base_name), mapped=False), int(info.size or 0)) as src:
            head = bytes(src.read(0, 8))
    except OSError:
        return None
    if len(head) < 8 or head == bytes(8):
        return None
    return int.from_bytes(head[:4], "big", signed=True), int.from_bytes(head[4:], "big", signed=True)


def _is_record(head: tuple[int, int] | None) -> bool:
    return head is not None and head[1] in (MAGIC_V1, MAGIC_V2, BLANK_MAGIC) and head[0] > 0


def any_segment_starts_with_record(loc: Location) -> bool:
    """Whether some segment starts with a record: 8 bytes read per segment."""
    return any(_is_record(_head(loc, i)) for i in _segments(loc))


def commitlog_head_finding(loc: Location) -> Finding | None:
    """A finding when the oldest non-empty segment does not start with a record (None when it does,
    or when it starts with zeros: a preallocated segment the broker has not written yet)."""
    infos = _segments(loc)
    if not infos:
        return None
    first = infos[0]
    head = _head(loc, first)
    if head is None or _is_record(head):
        return None
    total, magic = head
    return Finding("commitlog_head_not_a_record", "error", f"commitlog/{first.base_name}", 0,
                   f"the oldest segment does not start with a record (TOTALSIZE {total}, magic "
                   f"0x{magic & 0xFFFFFFFF:08X}): not a RocketMQ commitlog, or its head is destroyed; the broker "
                   "would dispatch nothing from it")


def unreadable_segments(loc: Location, before: int | None = None) -> list[Finding]:
    """Segments after the oldest (below physical offset ``before``) whose first bytes are neither a record,
    a blank record nor unwritten zeros: random bytes, a segment overwritten or copied in from elsewhere. The
    broker never checks a segment before its recovery window, and readers skip one whose first record is
    invalid, so without this nothing would name it (8 bytes read per segment). The oldest segment is
    :func:`commitlog_head_finding`'s."""
    out = []
    for info in _segments(loc)[1:]:
        base = int(info.base_name)
        if before is not None and base >= before:
            break
        head = _head(loc, info)
        if head is None or _is_record(head):
            continue
        total, magic = head
        out.append(Finding("segment_not_records", "error", f"commitlog/{info.base_name}", 0,
                           f"does not start with a record (TOTALSIZE {total}, magic 0x{magic & 0xFFFFFFFF:08X}): its "
                           f"{info.size} bytes hold no message a reader can take; it lies before the recovery window, "
                           "which is all a broker start-up checks", {"bytes": int(info.size or 0)}))
    return out


# findings that name commitlog bytes no reader takes as messages (the commands say them on stderr)
UNREAD_KINDS = ("commitlog_head_not_a_record", "segment_not_records", "reput_skipped_rest_of_segment", "segment_unread")


def unread_ends(ends: list, sizes: dict[str, int]) -> list[Finding]:
    """A scan's segment ends (:class:`storelib.scan.scanner.SegmentEnd`) that stopped at an invalid record:
    the rest of each such segment (``sizes``: file sizes by display name) is not read as messages."""
    out = []
    for e in ends:
        if e.kind != "invalid":
            continue
        left = max(sizes.get(e.file, 0) - e.file_offset, 0)
        out.append(Finding("segment_unread", "error", e.file, e.file_offset,
                           f"{e.reason or 'invalid record'} ({e.detail or 'not a record'}): the {left} bytes from here "
                           "to the segment's end hold no record a reader can take; they were skipped",
                           {"bytes": left, "phy": e.phy_offset}))
    return out

