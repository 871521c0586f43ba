"""The broker's load of a mapped-file directory (``commitlog/``, a consume-queue directory) over the entries
this toolkit's readers skip: sub-directories and names that are not 20 digits.

The readers keep reading what they can; the broker does not. MappedFileQueue.doLoad (4.9.8 :158-183, 5.3.3
:246-281) walks EVERY entry of the directory, sorted by name:

* 4.9.8: an entry whose File.length() is not the mapped file size fails the load (:163-167); a directory's
  length is never one (so any sub-directory fails it);
* 5.3.3: a directory is skipped (:252-254); a zero-length file is deleted only when it is the last of ALL
  entries, directories included (:256-260), any other wrong length fails the load (:262-266);
* both: a right-sized file is mapped, and MappedFile.init runs Long.parseLong on its name (4.9.8
  MappedFile.java:166, 5.3.3 DefaultMappedFile.java:161); the NumberFormatException is not the IOException
  doLoad catches: DefaultMessageStore.load catches it (4.9.8 :221-223, 5.3.3 :371-373) and the load fails.
  A right-sized file whose name parses (``0``, ``+1``) is mapped as a segment at that offset.

A failed load: the broker does not start. :func:`judge_listing` turns the readers' notes on such entries
into findings of what the broker does (``broker_load_fails``, critical, naming the entry and the rule).
The store's other directories (index/, the 5.x timer store, batchconsumequeue/): :mod:`storeloads`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

import pyarrow.fs as pafs

from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location
from storelib.format.consumequeue import ConsumeQueue, parse_file_name

LOAD_FAILS = "broker_load_fails"  # the broker's load fails on this entry: it does not start
OWN_FILE = {"supported": False, "own_file": True}  # a LOAD_FAILS on one of the broker's own files (not a stray
# entry to move out: a segment of the wrong length, the 5.x timerwheel)
STRAY_LOADED = "stray_segment_loaded"  # the broker maps this entry as a segment the readers do not model
# the readers' findings of a segment of the wrong length (doLoad's length check fails the load); a zero-length
# last file only fails 4.9.8's (5.3.3 deletes it)
SIZE_FAILS = frozenset({"wrong_segment_size", "short_segment", "long_segment"})
READER_SKIPS = frozenset({"unexpected_directory", "bad_segment_name", "bad_file_name"})  # the readers' notes
_LONG = re.compile(r"[+-]?\d+")  # Long.parseLong's form (Character.digit takes any Unicode decimal digit)
_SEGMENT = re.compile(r"[0-9]{20}")


def java_long(name: str) -> int | None:
    """``Long.parseLong(name)``; None where it throws NumberFormatException."""
    if not _LONG.fullmatch(name):
        return None
    v = int(name)
    return v if -(1 << 63) <= v < (1 << 63) else None


def _entry(name: str, length: int, is_dir: bool, last: bool, size: int, v5: bool) -> tuple[str, str, str]:
    """(kind, severity, why) for one stray entry as doLoad meets it."""
    rule = "MappedFileQueue.doLoad " + ("(5.3.3 :246-281)" if v5 else "(4.9.8 :158-183)")
    if is_dir:
        if v5:
            return "stray_entry_skipped", "info", f"a sub-directory: {rule} skips it (isDirectory: continue)"
        return (LOAD_FAILS, "critical", f"a sub-directory: {rule} requires every entry to be "
                "exactly the mapped file size, and a directory's File.length() is not: the load fails and the "
                "broker does not start")
    if v5 and length == 0 and last:
        return ("stray_entry_deleted", "warning", f"zero-length and the last entry: {rule} deletes it "
                "at start-up (this plan does not)")
    if length != size:
        return (LOAD_FAILS, "critical", f"{length} bytes, not the mapped file size {size}: {rule} fails the "
                "load (length not matched) and the broker does not start")
    off = java_long(name)
    if off is None:
        return (LOAD_FAILS, "critical", "right-sized, but Long.parseLong fails on the name: the "
                "NumberFormatException of MappedFile.init escapes doLoad, DefaultMessageStore.load fails and "
                "the broker does not start")
    return (STRAY_LOADED, "critical", f"right-sized and Long.parseLong takes the name: the broker maps it as "
            f"the segment at offset {off}, which this model does not read")


def _twenty_digits(name: str) -> bool:
    """The commitlog reader's segment names."""
    return bool(_SEGMENT.fullmatch(name))


def _cq_segment(name: str) -> bool:
    """The consume-queue reader's segment names (20 digits, or a negative offset's)."""
    return parse_file_name(name) is not None


def load_findings(listed: Sequence[Sequence], size: int, version: str, path: Callable[[str], str],
                  read: Callable[[str], bool] = _twenty_digits) -> list[Finding]:
    """What the broker's load says of a directory's stray entries (``listed``: [name, length, is a directory],
    sorted by name; ``path``: an entry's name as findings name it; ``read``: the names its reader reads as
    segments, not stray): besides each stray entry, a 5.3.3 zero-length last segment that a later-sorting
    stray entry follows (not deleted: the load fails)."""
    v5 = version == "5"
    n = len(listed)
    out: list[Finding] = []
    segs = [i for i, (name, _z, d) in enumerate(listed) if not d and read(str(name))]
    for i, (name, length, is_dir) in enumerate(listed):
        name, length = str(name), int(length or 0)
        if not is_dir and read(name):
            if java_long(name) is None and length == size:  # 20 digits past Long.MAX_VALUE
                out.append(Finding(LOAD_FAILS, "critical", path(name), None,
                                   "Long.parseLong fails on this 20-digit name (past Long.MAX_VALUE): "
                                   "DefaultMessageStore.load fails and the broker does not start",
                                   {"supported": False}))
            elif v5 and length == 0 and segs and i == segs[-1] and i != n - 1:
                out.append(Finding(LOAD_FAILS, "critical", path(name), None,
                                   f"zero-length last segment, but {listed[-1][0]} sorts after it: 5.3.3's "
                                   "MappedFileQueue.doLoad deletes a zero-length file only when it is the last "
                                   "of all entries (:256-260), so its length check fails the load and the "
                                   "broker does not start", {"supported": False}))
            continue
        kind, sev, why = _entry(name, length, bool(is_dir), i == n - 1, size, v5)
        extra = {"supported": False} if sev == "critical" else {}
        out.append(Finding(kind, sev, path(name), None, why, extra))
    return out


def mapped_dir_findings(listed: Sequence[Sequence], size: int, version: str, path: Callable[[str], str]
                        ) -> list[Finding]:
    """doLoad's verdict on EVERY entry of a mapped-file directory no reader of ours models as one (5.x
    ``timerlog/``, a ``batchconsumequeue/`` queue): the stray entries' (:func:`load_findings`) and each 20-digit
    file's length, which doLoad holds to the mapped file size (4.9.8 :163-167, 5.3.3 :262-266) but for 5.3.3's
    zero-length last of all entries, deleted (:256-260)."""
    out = load_findings(listed, size, version, path)
    judged = {f.file for f in out}
    rule = "MappedFileQueue.doLoad " + ("(5.3.3 :246-281)" if version == "5" else "(4.9.8 :158-183)")
    for i, (name, length, is_dir) in enumerate(listed):
        name, length = str(name), int(length or 0)
        if is_dir or not _SEGMENT.fullmatch(name) or length == size or path(name) in judged:
            continue
        if version == "5" and length == 0 and i == len(listed) - 1:
            out.append(Finding("empty_last_segment", "warning", path(name), None,
                               f"zero-length and the last entry: {rule} deletes it at start-up"))
        else:
            out.append(Finding(LOAD_FAILS, "critical", path(name), None,
                               f"{length} bytes, not the mapped file size {size}: {rule} fails the load (length "
                               "not matched) and the broker does not start", dict(OWN_FILE)))
    return out


def dir_listing(loc: Location) -> list[list]:
    """A directory's entries as File.listFiles gives them to doLoad: [name, length, is a directory], sorted by
    name (empty when the directory is absent: listFiles is null and the load passes)."""
    try:
        infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True))
    except OSError as e:
        raise StoreError(loc.path, None, "unreadable", f"cannot list: {e}") from e
    return sorted(([i.base_name, int(i.size or 0), i.type == pafs.FileType.Directory] for i in infos),
                  key=lambda e: e[0])


def _graded(f: Finding, version: str) -> Finding:
    """A reader's finding as the line's load grades it: 4.9.8's doLoad fails on a zero-length last file like
    on any length but the mapped size (:163-167; 5.3.3 deletes it, :256-260)."""
    if f.kind == "empty_last_segment" and version == "4":
        return dataclasses.replace(f, severity="critical", detail="zero-length last segment: 4.9.8's "
                                   "MappedFileQueue.doLoad fails the load on any file whose length is not the "
                                   "mapped file size (:163-167): the broker does not start",
                                   extra={**f.extra, "supported": False})
    return f


def judge_listing(findings: list[Finding], listed: Sequence[Sequence], size: int, version: str,
                  path: Callable[[str], str], read: Callable[[str], bool] = _twenty_digits) -> list[Finding]:
    """``findings`` with the readers' notes on stray entries replaced by what the broker's load does (and a
    zero-length last segment graded as the line's load treats it)."""
    return [_graded(f, version) for f in findings if f.kind not in READER_SKIPS] + \
        load_findings(listed, size, version, path, read)


def version_of(settings_version: object) -> str:
    """The broker line's load rules: "5" (5.x) or "4" (4.9.x)."""
    return "5" if str(settings_version).startswith("5") else "4"


def judge_queue(cq: ConsumeQueue, version: str) -> None:
    """A queue directory's findings as the broker's load judges its stray entries (in place)."""
    cq.findings = judge_listing(cq.findings, cq.listed, cq.segment_size, version, lambda n: cq.loc.join(n).path,
                                _cq_segment)  # the CQ reader also reads a negative offset's name


def fails_load(f: Finding, version: str) -> bool:
    """Whether ``f`` names an entry of a mapped-file directory the broker's load fails on (or maps beyond the
    model): a stray entry, a segment of the wrong length, 4.9.8's zero-length last file."""
    return f.kind in (LOAD_FAILS, STRAY_LOADED) or f.kind in SIZE_FAILS or (
        f.kind == "empty_last_segment" and version == "4")
