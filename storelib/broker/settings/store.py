"""Store: the facade over one broker store root (local path or any pyarrow filesystem URI).

It only knows where things are and which settings apply; each file kind's reading and writing lives
in its own module (commitlog, consumequeue, indexfile, checkpoint, markers, configjson).
"""

from __future__ import annotations

import dataclasses
import os
from functools import cached_property
from typing import Any

import pyarrow.fs as pafs

from storelib.broker.settings.brokerconf import BrokerSettings, attribute_of, load_broker_conf
from storelib.broker.settings.brokerline import detect_broker_line
from storelib.broker.settings.dledgerlayout import (
    DLedgerLayout,
    DLedgerState,
    detect_dledger,
    read_dledger_state,
)
from storelib.broker.settings.geometry import Inferred, infer_geometry
from storelib.broker.settings.livecut import StoreCut
from storelib.broker.settings.storeroot import (
    NotAStoreError,
    any_segment_starts_with_record,
    commitlog_head_finding,
    require_store_root,
)
from storelib.broker.settings.strayload import judge_listing, version_of
from storelib.errors import Finding, StoreLayoutError
from storelib.fileio.bytesource import Location, resolve
from storelib.format.indexdir import IndexFileRef, list_index_files
from storelib.scan.commitlog import CommitLog


def load_settings(broker_conf: str | None = None, version: str | None = None,
                  overrides: dict[str, Any] | None = None, root: Location | None = None) -> BrokerSettings:
    """The one way every command and data source gets its broker settings.

    ``version`` "4"/"5" is explicit; None/"auto" detects the line (storelib.broker.settings.brokerline: broker.conf and
    ``overrides`` keys only 5.x has, then the store at ``root``, then 4.x). Then ``broker_conf`` (or the
    line's defaults), then ``overrides`` (broker.conf key -> value, e.g. from ``--set``). Geometry
    that neither gives is taken from the files themselves and reported (see :func:`infer_geometry`).
    A DLedger-mode store (storelib.broker.settings.dledgerlayout) sets ``settings.dledger``.
    """
    conf_keys = _conf_keys(broker_conf)
    line = detect_broker_line(root, conf_keys | set(overrides or ()), version,
                              conf_name=os.path.basename(str(broker_conf)) if broker_conf else "--set")
    settings = (load_broker_conf(broker_conf, line.version) if broker_conf
                else BrokerSettings.defaults(line.version))
    if overrides:
        settings = settings.with_overrides(overrides)
    settings = dataclasses.replace(settings, line=line)
    explicit = set(overrides or ()) | conf_keys
    if root is not None:
        settings = apply_geometry(settings, root, explicit)
    settings = with_dledger(settings, root, explicit)
    if root is not None:
        settings = infer_segment_size(settings, root, explicit)
    return settings


def infer_segment_size(settings: BrokerSettings, root: Location, explicit: set[str]) -> BrokerSettings:
    """mappedFileSizeCommitLog from the segment (or DLedger data) files when no broker.conf/--set gave it."""
    if explicit & {"mappedFileSizeCommitLog", "mapped_file_size_commit_log"}:
        return settings
    size = _segment_file_size(_log_dir(root, settings.dledger))
    if size and size != settings.mapped_file_size_commit_log:
        settings = dataclasses.replace(settings.with_overrides({"mappedFileSizeCommitLog": size}),
                                       source=f"{settings.source or 'defaults'}; {INFERRED_NOTE} {size}")
    return settings


def with_dledger(settings: BrokerSettings, root: Location | None, explicit: set[str]) -> BrokerSettings:
    """The settings with the DLedger layout the settings and the files give (unchanged for a default store)."""
    layout = detect_dledger(root, settings, explicit)
    if layout is None:
        return settings
    return dataclasses.replace(settings, dledger=layout, enable_dleger_commit_log=True, d_leger_self_id=layout.self_id)


def apply_geometry(settings: BrokerSettings, root: Location, explicit: set[str]) -> BrokerSettings:
    """Settings with the geometry the files show where ``explicit`` keys are silent; disagreements noted."""
    applied: dict[str, int] = {}
    inferred, conflicts = [], []
    for inf in infer_geometry(root):
        attr = attribute_of(inf.key)
        if inf.key in explicit or attr in explicit:
            if _effective(settings, attr) != inf.value:
                conflicts.append(inf)
        elif _effective(settings, attr) != inf.value:
            applied[inf.key] = inf.value
            inferred.append(inf)
    if applied:
        settings = settings.with_overrides(applied)
    return dataclasses.replace(settings, inferred=tuple(inferred), geometry_conflicts=tuple(conflicts))


def _effective(settings: BrokerSettings, attr: str) -> int | None:
    """The value the broker uses (the CQ size rounded up to whole 20-byte units)."""
    if attr == "mapped_file_size_consume_queue_config":
        return settings.mapped_file_size_consume_queue
    return getattr(settings, attr)


def settings_findings(settings: BrokerSettings) -> list[Finding]:
    """What the settings took from the files, where the files disagree with broker.conf/--set, and what
    in broker.conf a broker would ignore."""
    out = [*settings.conf_findings, *[Finding("geometry_inferred", "info", inf.file, None,
                   f"no broker.conf or --set gave {inf.key}: using {inf.value}, as {inf.evidence}",
                   {"key": inf.key, "value": inf.value}) for inf in settings.inferred]]
    by_file: dict[str, list[Inferred]] = {}
    for inf in settings.geometry_conflicts:  # one finding per file kind (the index's two numbers together)
        by_file.setdefault(inf.file, []).append(inf)
    for file, infs in by_file.items():
        conf = ", ".join(f"{i.key}={_effective(settings, attribute_of(i.key))}" for i in infs)
        files = ", ".join(f"{i.key}={i.value}" for i in infs)
        out.append(Finding("geometry_conflict", "error", file, None,
                           f"broker.conf/--set gives {conf}, but {infs[0].evidence}: the broker that wrote them used "
                           f"{files}; reading with the configured values (the per-file findings they cause are folded "
                           f"into this one); if that broker.conf is not the store's, drop it or pass "
                           + " ".join(f"--set {i.key}={i.value}" for i in infs),
                           {"key": infs[0].key, "keys": [i.key for i in infs], "files": files, "configured": conf}))
    return out


INFERRED_NOTE = "mappedFileSizeCommitLog inferred from the segment files:"


def open_commitlog(root: Location, settings: BrokerSettings, committed_index: int | None = None) -> CommitLog:
    """The store's commitlog as its settings place it: ``commitlog/``, or a DLedger node's data files
    (``committed_index`` from DLedger's checkpoint fills ``dledger_committed``; None leaves it null),
    scanned by the settings' broker line (``settings.scan_line``)."""
    size = int(settings.mapped_file_size_commit_log)
    d = settings.dledger
    line = settings.scan_line
    if d is None:
        return CommitLog(root.join("commitlog"), size, line=line)
    cl = CommitLog(_log_dir(root, d), size, dledger=True, folder=d.data, committed_index=committed_index, line=line)
    cl.findings[:0] = d.findings
    return cl


def _log_dir(root: Location, layout: DLedgerLayout | None) -> Location:
    """The directory of the commitlog's segment files: ``commitlog/`` or the DLedger data directory."""
    if layout is None:
        return root.join("commitlog")
    if layout.data.startswith("/"):
        return Location(root.fs, layout.data, root.local)
    return root.join(*layout.data.split("/"))


def _conf_keys(broker_conf: str | None) -> set[str]:
    if not broker_conf:
        return set()
    from storelib.fileio.smallfile_io import as_location, read_small
    from storelib.format.javaprops import parse_properties_text, properties_text

    data = read_small(as_location(broker_conf))
    return set(parse_properties_text(properties_text(data))) if data else set()


def _segment_file_size(loc: Location) -> int | None:
    """The size shared by the commitlog's segment files (None when there are none or they disagree).

    Lets a store copied without its broker.conf be read with the segment size it was written with;
    the caller reports that the size was inferred.
    """
    import re

    try:
        infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True))
    except OSError:
        return None
    sizes = [int(i.size or 0) for i in infos if i.type == pafs.FileType.File and re.fullmatch(r"[0-9]{20}", i.base_name)]
    full = {s for s in sizes if s > 0}
    return full.pop() if len(full) == 1 else None


class Store:
    """A RocketMQ broker store root: ``commitlog/``, ``consumequeue/``, ``index/``, ``checkpoint``, ``config/``..."""

    def __init__(self, root: str | os.PathLike | Location, settings: BrokerSettings | None = None, *,
                 broker_conf: str | None = None, filesystem: pafs.FileSystem | None = None, uri: str | None = None,
                 **fs_options: Any):
        """``root`` is a path/URI, or an already resolved Location (then ``uri`` names it as the user wrote it,
        which is also what tasks on other processes reopen)."""
        self.loc = root if isinstance(root, Location) else resolve(root, filesystem, **fs_options)
        self.uri = uri or (os.fspath(root) if not isinstance(root, Location) else root.path)
        info = self.loc.fs.get_file_info(self.loc.path)
        if info.type == pafs.FileType.NotFound:
            raise StoreLayoutError(self.uri, None, "not_found", "store root does not exist")
        if info.type != pafs.FileType.Directory:
            raise StoreLayoutError(self.uri, None, "not_a_directory", "store root is not a directory")
        if settings is None:
            settings = with_dledger(load_settings(broker_conf), self.loc, _conf_keys(broker_conf))
            if settings.dledger is not None:  # a DLedger node's data file size is its commitlog segment size
                settings = infer_segment_size(settings, self.loc, _conf_keys(broker_conf))
        if settings.dledger is None:
            require_store_root(self.loc, self.uri)
        self.settings = settings
        self.cut: StoreCut | None = None  # the run's cut (:meth:`take_cut`), None: read as found
        self.findings: list[Finding] = settings_findings(settings)
        head = commitlog_head_finding(self.loc)
        if head is not None:
            self.findings.append(head)

    @property
    def local(self) -> bool:
        return self.loc.local

    @property
    def live(self) -> bool:
        """Does a broker run this store (as the run's cut found)?"""
        return self.cut is not None and self.cut.live

    @property
    def cq_limit(self) -> int | None:
        """The ``phy_limit`` a ConsumeQueue of this store is read with: the cut's end on a live store."""
        return self.commitlog.cut_end if self.live else None

    def cq_unmodelled(self) -> str | None:
        """Why this store's consume queues may hold entries no dispatch of ours writes (None: nothing says
        so): its settings' (:attr:`BrokerSettings.cq_unreproduced`), or light message queues (``%LMQ%``) in
        ``consumequeue/``, a multi-dispatch broker's, when no setting told."""
        from storelib.format.consumequeue import lmq_queues

        why = self.settings.cq_unreproduced
        lmq = lmq_queues(self.loc) if why is None else None
        if lmq is not None:
            why = f"{lmq} hold multi-dispatch copies of other queues' records (enableMultiDispatch)"
        return why

    def index_files(self, findings: list[Finding] | None = None) -> list[IndexFileRef]:
        """``index/`` as the broker orders it, as at the run's cut on a live store (files created since left
        out, each read as its header stood)."""
        refs = list_index_files(self.loc, findings)
        return self.cut.index_refs(refs) if self.cut is not None else refs

    def loaded_index_files(self, findings: list[Finding]) -> list[IndexFileRef]:
        """:meth:`index_files` as IndexService.load keeps them (what the reader skips judged into ``findings``:
        :func:`storelib.broker.settings.storeloads.broker_index_refs`): what the cleaner and key queries use."""
        from storelib.broker.settings.storeloads import broker_index_refs

        return broker_index_refs(self.index_files(findings), findings, version_of(self.settings.version))

    def checkpoint_bytes(self) -> bytes | None:
        """The checkpoint file's bytes: as the cut read them on a live store (first, before the data)."""
        from storelib.fileio.smallfile_io import read_small

        if self.live:
            return self.cut.checkpoint
        return read_small(self.path("checkpoint"), 1 << 16)

    def take_cut(self, **kw: Any) -> StoreCut:
        """Take the run's cut (:func:`storelib.broker.settings.livecut.take_cut`) and read through it from now on."""
        from storelib.broker.settings.livecut import take_cut

        return self.apply_cut(take_cut(self, **kw))

    def apply_cut(self, cut: StoreCut) -> StoreCut:
        """Read this store as ``cut`` has it: on a live store its files by ranged reads (never mapped: a file
        the broker shrinks or the cleaner deletes must not take the process down), the commitlog listed as
        at the cut and read up to its end. A cut that is not live changes nothing."""
        self.cut = cut
        if cut.live:
            self.loc = dataclasses.replace(self.loc, mapped=False)
            self.__dict__.pop("commitlog", None)
            cl = self.commitlog
            if cut.segments or cut.commitlog_end is not None:
                listed = set(cut.segments)
                cl.segments = [s for s in cl.segments if s.name in listed and s.file_size]
            # a zero-length last file is one the broker is creating (opened, not mapped to full size yet)
            cl.findings = [f for f in cl.findings if f.kind != "empty_last_segment"]
            cl.cut_end = cut.commitlog_end
        return cut

    def path(self, *parts: str) -> Location:
        """A Location below the root."""
        return self.loc.join(*parts)

    def exists(self, *parts: str) -> bool:
        return self.loc.fs.get_file_info(self.path(*parts).path).type != pafs.FileType.NotFound

    @property
    def dledger(self) -> DLedgerLayout | None:
        """The DLedger layout of a DLedger-mode store (None for a default-mode one)."""
        return self.settings.dledger

    @cached_property
    def dledger_state(self) -> DLedgerState | None:
        """DLedger's checkpoint and currterm (with their .bak) as its load reads them."""
        d = self.dledger
        return None if d is None else read_dledger_state(self.path(d.dir), d.dir)

    @cached_property
    def commitlog(self) -> CommitLog:
        """The commitlog: ``commitlog/``, or in DLedger mode the node's data files (entries scanned with
        the DLedger columns, ``dledger_committed`` from DLedger's checkpoint)."""
        st = self.dledger_state
        cl = open_commitlog(self.loc, self.settings, st.committed_index if st is not None else None)
        if st is not None:
            cl.findings[:0] = st.findings
        else:  # MappedFileQueue.doLoad's verdict on the entries the reader skips (DLedger's own: dledgerfacts)
            cl.findings = judge_listing(cl.findings, cl.listed, cl.segment_size,
                                        version_of(self.settings.version), lambda n: f"{cl.folder}/{n}")
        size = cl.segment_size
        source = self.settings.source or ""
        if INFERRED_NOTE in source:
            cl.findings.insert(0, Finding("segment_size_inferred", "info", cl.folder, None,
                                          f"no broker.conf or --set gave mappedFileSizeCommitLog: using {size} bytes, "
                                          "the size of the segment files"))
        return cl

    @property
    def delay_levels_ms(self) -> list[int]:

        return list(self.settings.delay_levels_ms)

    @cached_property
    def old_commitlog(self) -> CommitLog | None:
        """A mixed store's default-mode ``commitlog/`` (dledgerlayout.OldCommitLog); None otherwise."""
        if self.dledger is None or self.dledger.old is None:
            return None
        return CommitLog(self.loc.join("commitlog"), int(self.settings.mapped_file_size_commit_log),
                         line=self.settings.scan_line)

    def scan(self, **kw):
        """Every valid record in commitlog order as Arrow batches (see CommitLog.scan); a mixed store's old
        log below the divided offset, then DLedger's (storelib.broker.settings.mixedlog)."""
        kw.setdefault("delay_levels_ms", self.delay_levels_ms)
        old = self.old_commitlog
        if old is not None and self.dledger is not None and self.dledger.old is not None:
            from storelib.broker.settings.mixedlog import mixed_scan

            return mixed_scan(old, self.commitlog, self.dledger.old.divided, **kw)
        return self.commitlog.scan(**kw)

    def record_at(self, phy_offset: int, **kw):
        """The record at a physical offset as the broker's getMessage finds it (a mixed store: the old log
        below the divided offset, storelib.broker.settings.mixedlog); a one-row batch."""
        old = self.old_commitlog
        if old is not None and self.dledger is not None and self.dledger.old is not None:
            from storelib.broker.settings.mixedlog import mixed_record_at

            return mixed_record_at(old, self.commitlog, self.dledger.old.divided, phy_offset, **kw)
        return self.commitlog.record_at(phy_offset, **kw)

    @property
    def min_offset(self) -> int:
        """The broker's min physical offset: a mixed store's old log's while it has files (4.9.8
        DLedgerCommitLog.java:163-169), else the commitlog's first segment's."""
        old = self.old_commitlog
        return old.min_offset if old is not None and old.segments else self.commitlog.min_offset

    def require_records(self, what: str, *, one_log: bool = False) -> None:
        """Fail (one line) where a command would otherwise print nothing for a commitlog that is not one
        (``one_log``: or read only the DLedger part of a mixed store, :meth:`require_one_log`)."""
        if one_log:
            self.require_one_log(what)
        for f in self.findings:
            if f.kind == "commitlog_head_not_a_record" and not any_segment_starts_with_record(self.loc):
                raise NotAStoreError(f.file, f.offset, "not_a_commitlog", f"{what}: {f.detail}")

    def require_one_log(self, what: str) -> None:
        """Fail (one line) where a command would read only the DLedger part of a mixed store (dledgerlayout)."""
        if self.dledger is not None:
            self.dledger.refuse_mixed(what)

    def require_local(self, what: str) -> str:
        """The local root path, or a clear error for operations that modify a store in place."""
        if not self.local:
            raise StoreLayoutError(self.uri, None, "remote_store",
                                   f"{what} modifies a store in place and only works on a local path")
        return self.loc.path
