"""Is this a DLedger-mode store, and which node's files are read? One answer for every command.

A broker with ``enableDLegerCommitLog=true`` keeps no ``commitlog/``: DLedgerCommitLog hands the log to
DLedger, whose files are under ``<storePathRootDir>/dledger-<dLegerSelfId>/`` (data in ``data/`` unless
``storePathDLedgerCommitLog`` moves it; index, checkpoint and currterm stay). The signals, strongest
first: ``--dledger-self-id`` (= ``dLegerSelfId``), broker.conf/``--set`` ``enableDLegerCommitLog``,
``dLegerSelfId`` or ``storePathDLedgerCommitLog``, then the layout itself (``dledger-*/`` folders and no
commitlog segments). A root holding several nodes' folders (a group copied together) needs the node
named. ``enableDLegerCommitLog=false`` given explicitly turns DLedger mode off whatever the files say.
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

    @property
    def index(self) -> str:
        return f"{self.dir}/{INDEX_DIR}"

    def describe(self) -> str:
        return f"DLedger node {self.self_id}: {self.data} ({self.reason})"

    def to_json(self) -> dict:
        return {"self_id": self.self_id, "dir": self.dir, "data": self.data, "index": self.index,
                "reason": self.reason, "findings": [f.to_dict() for f in self.findings]}


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


def has_commitlog_segments(root: Location) -> bool:
    cl = root.join("commitlog")
    try:
        infos = cl.fs.get_file_info(pafs.FileSelector(cl.path, allow_not_found=True))
    except OSError:
        return False
    return any(i.type == pafs.FileType.File and _SEGMENT.match(i.base_name) and (i.size or 0) > 0 for i in infos)


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
    elif not dirs or root is None or has_commitlog_segments(root):
        return None
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
    return DLedgerLayout(sid, d, data, reason, tuple(findings))


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


__all__ = ["DLEDGER_KEYS", "DLedgerLayout", "DLedgerState", "detect_dledger", "dledger_dirs",
           "has_commitlog_segments", "read_dledger_state"]
