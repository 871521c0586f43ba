"""Is this a DLedger-mode store, and which node's files are read? One answer for every command.

A broker with ``enableDLegerCommitLog=true`` keeps no ``commitlog/``: DLedgerCommitLog hands the log to
DLedger, whose files are under ``<storePathRootDir>/dledger-<dLegerSelfId>/`` (data in ``data/`` unless
``storePathDLedgerCommitLog`` moves it; index, checkpoint and currterm stay). The signals, strongest
first: ``--dledger-self-id`` (= ``dLegerSelfId``), broker.conf/``--set`` ``enableDLegerCommitLog``,
``dLegerSelfId`` or ``storePathDLedgerCommitLog``, then the layout itself (``dledger-*/`` folders and no
commitlog segments, or DLedger data beside them: a "mixed" store). A root holding several nodes' folders
(a group copied together) needs the node named. ``enableDLegerCommitLog=false`` given explicitly turns
DLedger mode off whatever the files say.

A mixed store: a broker switched from default mode to DLedger mode keeps its old ``commitlog/``, and
DLedgerCommitLog serves the physical offsets below its ``dividedCommitlogOffset`` from it (see
:func:`mixed_finding`); :class:`OldCommitLog` records where that old log is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location
from storelib.format.dledger.entries import DATA_DIR, DIR_PREFIX, INDEX_DIR
from storelib.format.dledger.state import (
    CHECKPOINT_FILE,
    CurrTerm,
    DLedgerCheckpoint,
    read_checkpoint_file,
    read_currterm_file,
)

if TYPE_CHECKING:
    from storelib.broker.settings.brokerconf import BrokerSettings

DLEDGER_KEYS = ("enableDLegerCommitLog", "dLegerSelfId", "storePathDLedgerCommitLog")
_SEGMENT = re.compile(r"^[0-9]{20}$")


@dataclass(frozen=True)
class DLedgerLayout:
    """Where a DLedger-mode store's files are, relative to the store root (``data`` may be absolute when
    storePathDLedgerCommitLog points outside the root and exists), and why DLedger mode was chosen."""

    self_id: str
    dir: str  # "dledger-n0": index/, checkpoint, currterm
    data: str  # "dledger-n0/data", or the storePathDLedgerCommitLog directory
    reason: str
    findings: tuple[Finding, ...] = ()
    old: OldCommitLog | None = None  # a mixed store's default-mode commitlog/ (None: no segments there)

    @property
    def index(self) -> str:
        return f"{self.dir}/{INDEX_DIR}"

    def describe(self) -> str:
        return f"DLedger node {self.self_id}: {self.data} ({self.reason})"

    def to_json(self) -> dict:
        return {"self_id": self.self_id, "dir": self.dir, "data": self.data, "index": self.index,
                "reason": self.reason, "findings": [f.to_dict() for f in self.findings],
                "old_commitlog": None if self.old is None else self.old.to_json()}

    def refuse_mixed(self, what: str) -> None:
        """Fail (one line) for a command that would read only the DLedger part of a mixed store."""
        if self.old is not None:
            raise StoreError("commitlog", None, "mixed_dledger_store",
                             f"{what}: mixed store: commitlog/ keeps {self.old.count} default-mode segment(s) "
                             f"beside DLedger data {self.data}, and the broker serves offsets below "
                             f"{self.old.divided} from them; only info, messages and get join the two logs so far (read the old "
                             f"log alone with --set enableDLegerCommitLog=false)")


@dataclass(frozen=True)
class OldCommitLog:
    """The default-mode segments of a mixed store and the divided offset the broker computes from them.

    ``divided``: 4.9.8 DLedgerCommitLog.recover (DLedgerCommitLog.java:271-322; 5.3.3 :291-427) takes
    the first DLedger data file's offset when DLedger holds files (:275; 5.3.3 :295/:323), else the end of
    the last old segment (fileFromOffset + file size, :309; 5.3.3 setRecoverPosition :414), where DLedger's
    first data file is then created (:320; 5.3.3 :425)."""

    first: int  # the first old segment's offset
    end: int  # the last old segment's offset + its file size
    count: int
    divided: int
    dledger_first: int | None  # the first DLedger data file's offset (None: no data file yet)

    def to_json(self) -> dict:
        return {"first": self.first, "end": self.end, "segments": self.count, "divided_offset": self.divided,
                "dledger_first": self.dledger_first}


@dataclass(frozen=True)
class DLedgerState:
    """DLedger's state files as its load reads them (``.bak`` kept for the record: DLedger never reads
    them). ``committed_index``: what recover() applies before clamping (-1: checkpoint missing or without
    the key, as DLedger then keeps -1; None: a value the broker cannot parse, its load() fails)."""

    checkpoint: DLedgerCheckpoint | None
    checkpoint_bak: DLedgerCheckpoint | None
    currterm: CurrTerm | None
    currterm_bak: CurrTerm | None
    committed_index: int | None
    findings: tuple[Finding, ...] = ()

    def to_json(self) -> dict:
        def cp(c):
            return None if c is None else {"committed_index": c.committed_index, "end_index": c.end_index}

        def ct(c):
            return None if c is None else {"curr_term": c.curr_term, "vote_leader": c.vote_leader}

        return {"checkpoint": cp(self.checkpoint), "checkpoint_bak": cp(self.checkpoint_bak),
                "currterm": ct(self.currterm), "currterm_bak": ct(self.currterm_bak),
                "committed_index": self.committed_index}


def read_dledger_state(dledger_dir: Location, shown: str) -> DLedgerState:
    """Read ``checkpoint``/``currterm`` (and their ``.bak``) of a node's folder; damage is a finding."""
    findings: list[Finding] = []
    got: dict[str, object] = {}
    for name, reader, bak in (("checkpoint", read_checkpoint_file, False), ("checkpoint_bak", read_checkpoint_file, True),
                              ("currterm", read_currterm_file, False), ("currterm_bak", read_currterm_file, True)):
        try:
            got[name] = reader(dledger_dir, bak=bak)
        except StoreError as e:
            got[name] = None
            findings.append(Finding("dledger_state_unreadable", "error" if name == "checkpoint" else "warning",
                                    f"{shown}/{name.replace('_bak', '.bak')}", e.offset, e.detail))
    cp = got["checkpoint"]
    if cp is not None and cp.unreadable:
        findings.append(Finding("dledger_checkpoint_unreadable", "warning", f"{shown}/{CHECKPOINT_FILE}", None,
                                cp.unreadable))
    if cp is None and not findings:
        findings.append(Finding("dledger_checkpoint_missing", "warning", f"{shown}/{CHECKPOINT_FILE}", None,
                                "no DLedger checkpoint: its load keeps committedIndex -1, so the broker's max "
                                "offset is the data's min offset until the entries are committed again"))
    bad = any(f.file == f"{shown}/{CHECKPOINT_FILE}" and f.kind == "dledger_state_unreadable" for f in findings)
    committed = None if bad else (-1 if cp is None else cp.committed_or_minus_one)
    ct = got["currterm"]
    if ct is not None and ct.problem:
        findings.append(Finding("dledger_currterm_bad", "warning", f"{shown}/currterm", None, ct.problem))
    return DLedgerState(cp, got["checkpoint_bak"], ct, got["currterm_bak"], committed, tuple(findings))


def _kind(loc: Location) -> pafs.FileType:
    try:
        return loc.fs.get_file_info(loc.path).type
    except OSError:
        return pafs.FileType.NotFound


def dledger_dirs(root: Location) -> list[str]:
    """``dledger-*`` folders of the root that hold DLedger files (data/, index/ or a checkpoint), sorted."""
    try:
        infos = root.fs.get_file_info(pafs.FileSelector(root.path, allow_not_found=True))
    except OSError:
        return []
    out = []
    for i in infos:
        if i.type == pafs.FileType.Directory and i.base_name.startswith(DIR_PREFIX) and len(i.base_name) > len(DIR_PREFIX):
            d = root.join(i.base_name)
            if any(_kind(d.join(n)) != pafs.FileType.NotFound for n in (DATA_DIR, INDEX_DIR, CHECKPOINT_FILE)):
                out.append(i.base_name)
    return sorted(out)


def _segment_files(folder: Location) -> list[tuple[int, int]]:
    """(offset from the name, size) of the folder's non-empty 20-digit files, in offset order."""
    try:
        infos = folder.fs.get_file_info(pafs.FileSelector(folder.path, allow_not_found=True))
    except OSError:
        return []
    return sorted((int(i.base_name), int(i.size or 0)) for i in infos
                  if i.type == pafs.FileType.File and _SEGMENT.match(i.base_name) and (i.size or 0) > 0)


def has_commitlog_segments(root: Location) -> bool:
    return bool(_segment_files(root.join("commitlog")))


def old_commitlog(root: Location, data: Location) -> OldCommitLog | None:
    """The mixed store's old segments and divided offset (None when ``commitlog/`` holds no segments)."""
    old = _segment_files(root.join("commitlog"))
    if not old:
        return None
    new = _segment_files(data)
    end = old[-1][0] + old[-1][1]
    first = new[0][0] if new else None
    return OldCommitLog(old[0][0], end, len(old), end if first is None else first, first)


def mixed_finding(old: OldCommitLog, data: str) -> Finding:
    """What the broker does with a mixed store's old commitlog (4.9.8 DLedgerCommitLog.java lines; 5.3.3
    keeps the same rules: getMinOffset :162, deleteExpiredFile :195, getData :248-290, getMessage :801)."""
    gap = ""
    if old.end > old.divided:
        gap = (f"; the old segments end at {old.end}, past the divided offset: their bytes at and above "
               f"{old.divided} are never read: DLedger's entries own those offsets")
    elif old.end < old.divided:
        gap = f"; nothing lies between the old log's end {old.end} and {old.divided}"
    start = ("the first DLedger data file's offset, recover DLedgerCommitLog.java:275" if old.dledger_first
             is not None else "the end of the last old segment: with no DLedger data yet the broker's next start "
             "seals that segment with a blank record and creates DLedger's first file there (:288-321)")
    return Finding("dledger_mixed_commitlog", "warning", "commitlog", old.divided,
                   f"mixed store: commitlog/ keeps {old.count} default-mode segment(s) ({old.first}..{old.end}) "
                   f"beside the DLedger data {data}; the broker (4.9.8/5.3.3 DLedgerCommitLog) serves physical "
                   f"offsets below the divided offset {old.divided} ({start}) from the old log (getData/getMessage "
                   ":244-269, :664-676) and the rest from DLedger, reports the old log's first offset as the min "
                   "offset (:163-169), turns DLedger's file deletion off while old files are left (:276-279, "
                   ":192-207) and deletes the old files by the usual expiry, the last one too (:208-219); info, messages "
                   "and get read both parts so; the audit and recover --plan model the DLedger part only; export, "
                   f"rebuild, expiry, timers and recover --apply/--salvage refuse{gap}",
                   {**old.to_json(), "supported": False})


def detect_dledger(root: Location | None, settings: BrokerSettings, explicit: set[str]) -> DLedgerLayout | None:
    """The DLedger layout the settings and the files at ``root`` give, None for a default-mode store.

    Raises StoreError (one line) when DLedger mode is asked for but the node's folder is missing, or
    when several nodes' folders leave the choice to the user."""
    said_off = "enableDLegerCommitLog" in explicit and not settings.enable_dleger_commit_log
    if said_off:
        return None
    sid = settings.d_leger_self_id or None
    spath = settings.store_path_d_ledger_commit_log or None
    dirs = dledger_dirs(root) if root is not None else []
    said = [k for k in DLEDGER_KEYS if _value(settings, k)]  # their defaults are unset: any value was given
    if said:
        reason = "broker.conf/--set " + ", ".join(f"{k}={_value(settings, k)}" for k in said)
    elif not dirs or root is None:
        return None
    elif has_commitlog_segments(root):
        if not any(_segment_files(root.join(d, DATA_DIR)) for d in dirs):
            return None
        reason = (f"the store holds DLedger data in {', '.join(d + '/' for d in dirs)} beside commitlog segments: a "
                  "broker switched to DLedger mode (--set enableDLegerCommitLog=false reads commitlog/ alone)")
    else:
        reason = f"the store holds {', '.join(d + '/' for d in dirs)} and no commitlog segments"
    if root is None:
        return None
    if sid is None:
        if len(dirs) > 1:
            raise StoreError(root.path, None, "several_dledger_nodes",
                             f"this root holds several DLedger nodes ({', '.join(dirs)}): pick one with "
                             f"--dledger-self-id {dirs[0][len(DIR_PREFIX):]} (or --set dLegerSelfId=...)")
        if not dirs:
            raise StoreError(root.path, None, "no_dledger_dir",
                             f"DLedger mode ({reason}) but no {DIR_PREFIX}<selfId>/ folder here")
        sid = dirs[0][len(DIR_PREFIX):]
    d = DIR_PREFIX + sid
    if d not in dirs and spath is None:
        have = f" (there is {', '.join(dirs)})" if dirs else ""
        raise StoreError(root.path, None, "no_dledger_dir", f"DLedger node {sid}: no {d}/ folder here{have}")
    data, findings = _data_dir(root, settings, d, spath)
    old = old_commitlog(root, Location(root.fs, data, root.local) if data.startswith("/")
                        else root.join(*data.split("/")))
    if old is not None:
        findings.append(mixed_finding(old, data))
    return DLedgerLayout(sid, d, data, reason, tuple(findings), old)


def _value(settings: BrokerSettings, key: str) -> str:
    return {"enableDLegerCommitLog": "true" if settings.enable_dleger_commit_log else "",
            "dLegerSelfId": settings.d_leger_self_id or "",
            "storePathDLedgerCommitLog": settings.store_path_d_ledger_commit_log or ""}[key]


def _data_dir(root: Location, settings: BrokerSettings, d: str, spath: str | None) -> tuple[str, list[Finding]]:
    """The data directory: ``<d>/data``, or storePathDLedgerCommitLog mapped onto this copy of the store."""
    default = f"{d}/{DATA_DIR}"
    if spath is None:
        return default, []
    splitter = settings.sysprop_multi_path_splitter or ","
    if splitter in spath:
        raise StoreError(root.path, None, "unsupported",
                         f"storePathDLedgerCommitLog={spath!r} spreads DLedger data over several paths: not supported")
    rootdir = (settings.store_path_root_dir or "").rstrip("/")
    if rootdir and spath.startswith(rootdir + "/"):  # inside the broker's root: the same place in this copy
        rel = spath[len(rootdir) + 1:].strip("/")
        if _kind(root.join(*rel.split("/"))) == pafs.FileType.Directory:
            return rel, []
    if root.local and spath.startswith("/") and _kind(Location(root.fs, spath, True)) == pafs.FileType.Directory:
        return spath, []
    if _kind(root.join(d, DATA_DIR)) == pafs.FileType.Directory:
        return default, [Finding("dledger_data_path_not_found", "warning", spath, None,
                                 f"storePathDLedgerCommitLog={spath} is not in this copy of the store: reading "
                                 f"{default} instead")]
    raise StoreError(spath, None, "not_found", f"storePathDLedgerCommitLog={spath}: no such directory here, and no "
                                              f"{default}/ either")


__all__ = ["DLEDGER_KEYS", "DLedgerLayout", "DLedgerState", "OldCommitLog", "detect_dledger", "dledger_dirs",
           "has_commitlog_segments", "mixed_finding", "old_commitlog", "read_dledger_state"]
