"""The recovery walk's plain values: its inputs (:class:`RecoveryInputs`), its plan (:class:`WalkPlan` and
its per-segment :class:`SegmentTask`), and its result (:class:`RecoveryResult`, with the ranges the broker
dispatches and each segment's outcome). Frozen and picklable: the walk's scans run as tasks on any
engine (:mod:`storelib.broker.recovery.walk` computes them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from storelib.broker.recovery.dledgerfacts import IndexFiles
from storelib.broker.settings.brokerconf import duplication_dispatches_nothing
from storelib.errors import Finding
from storelib.format.checkpoint import Checkpoint
from storelib.scan.commitlog import Segment
from storelib.scan.scanner import SegmentScan

if TYPE_CHECKING:
    from storelib.broker.recovery.dledgerwalk import DLedgerRecovery


@dataclass(frozen=True)
class RecoveryInputs:
    """Everything the walk depends on besides the segment files themselves.

    ``cq_max_phy_offset``: the store's maxPhyOffsetOfConsumeQueue (§8.2; -1 for no/empty CQ).
    ``last_exit_ok``: no ``abort`` file (normal recovery) — abnormal recovery otherwise.
    ``version_told``: something said which line wrote the store (an option, broker.conf, its own evidence);
    False for the 4.x default, whose records are then judged as an unknown line's (:attr:`line`).
    """

    version: str = "4"  # "4" = 4.9.8, "5" = 5.3.3
    version_told: bool = True
    last_exit_ok: bool = True
    cq_max_phy_offset: int = -1
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    segment_size: int = 1024 * 1024 * 1024
    check_crc_on_recover: bool = True
    force_verify_prop_crc: bool = False
    message_index_enable: bool = True
    message_index_safe: bool = False
    broker_id: int = 0
    dledger: bool = False  # a DLedger-mode commitlog (entries in dledger-<selfId>/data)
    dledger_committed_index: int | None = None  # from DLedger's checkpoint: fills dledger_committed
    dledger_startup: bool = False  # a DLedger start-up (recover), not the lifetime walk (rebuild, export)
    dledger_index: IndexFiles | None = None  # DLedger's index file list
    dledger_load_findings: tuple[Finding, ...] = ()  # what makes DLedger's load fail
    duplication_enable: bool = False  # MessageStoreConfig.duplicationEnable

    @property
    def line(self) -> str | None:
        """The line whose record check the walk's scans apply (BrokerLine.scan_line: None when not told)."""
        return self.version if self.version_told else None

    @property
    def dup_info(self) -> bool:
        """Does the recovery walk check DUP_INFO (5.3.3 CommitLog.recoverNormally/recoverAbnormally pass
        duplicationEnable as checkDupInfo, CommitLog.java:329/715; 4.9.8 has no such check)? In DLedger mode only
        5.3.3's abnormal start-up walks records with it (dledgerRecoverAbnormally, DLedgerCommitLog.java:319/348;
        its normal recovery walks no record, a lifetime walk is the reput's, which never checks it)."""
        if self.dledger:
            return self.duplication_enable and self.version == "5" and self.dledger_startup and not self.last_exit_ok
        return self.duplication_enable and self.version == "5"

    @property
    def dispatches_nothing(self) -> bool:
        """4.9.8 with duplicationEnable: neither its recovery nor its reput dispatches a record (its confirm
        offset stays -1: :func:`duplication_dispatches_nothing`)."""
        return duplication_dispatches_nothing(self.version, self.duplication_enable, self.dledger)

    @property
    def confirm_bound(self) -> int | None:
        """5.3.3 abnormal recovery with duplicationEnable dispatches only records whose PHYSICALOFFSET +
        TOTALSIZE <= getConfirmOffset() (CommitLog.java:751-753): the field loaded from the checkpoint's
        confirmPhyOffset (DefaultMessageStore.java:388, before recover); None when nothing bounds it."""
        if self.duplication_enable and self.version == "5" and not self.dledger and not self.last_exit_ok:
            return self.checkpoint.confirm_phy_offset
        return None

    @property
    def dledger_crc(self) -> bool:
        """Are a DLedger walk's records CRC-checked? Only by 5.3.3's own walk after an abnormal exit."""
        return bool(self.dledger_startup and self.version == "5" and not self.last_exit_ok
                    and self.check_crc_on_recover)

    @classmethod
    def from_settings(cls, settings, **kw) -> RecoveryInputs:
        """Inputs from a BrokerSettings (version, CRC and index flags, segment size) plus ``kw``; a
        ``version`` in ``kw`` other than the settings' is told."""
        version = "5" if str(settings.version).startswith("5") else "4"
        base = dict(
            version=version,
            version_told=settings.scan_line is not None or kw.get("version", version) != version,
            segment_size=int(settings.mapped_file_size_commit_log),
            check_crc_on_recover=bool(settings.check_crc_on_recover),
            force_verify_prop_crc=bool(settings.force_verify_prop_crc),
            message_index_enable=bool(settings.message_index_enable),
            message_index_safe=bool(settings.message_index_safe),
            broker_id=int(settings.broker_id),
            duplication_enable=bool(settings.duplication_enable),
        )
        base.update(kw)
        return cls(**base)


@dataclass(frozen=True)
class SegmentTask:
    """One segment's part of the walk: scan ``[start, end)`` of file ``index``.

    ``crc``: inside the recovery window (records are CRC-checked and the first failure ends the valid
    log); outside it (4.9.8 reput over earlier segments) nothing is CRC-checked.
    """

    index: int
    base: int
    name: str
    start: int
    crc: bool

    def scan(self, source, *, verify_crc: bool, prop_crc: bool = False, verify_all: bool = False,
             **kw) -> SegmentScan:
        """The :class:`SegmentScan` of this task over an open ``source`` (the segment file).

        ``verify_crc``: checkCRCOnRecover (body CRC checked and ended on inside the window).
        ``verify_all``: also check (and report in ``crc_ok``) body CRCs outside the window, without
        ending there: the walk is unchanged, the rows say what a reader of them wants to know.
        """
        crc = self.crc and verify_crc and not prop_crc
        file = kw.pop("file", "commitlog/" + self.name)
        return SegmentScan(source, file, self.base, self.start, verify_crc=crc or verify_all, stop_on_crc=crc, **kw)


@dataclass(frozen=True)
class WalkPlan:
    """Where the walk starts and what it checks (the output of :func:`plan_recovery`)."""

    inputs: RecoveryInputs
    segments: tuple[Segment, ...]
    mode: str  # "normal" | "abnormal"
    start_index: int  # first segment of the CRC window (recovery start segment)
    start_reason: str
    reput_from: int | None  # 4.9.8 normal: where reput starts (segments before the window); else None
    dispatch_after: int | None  # only records whose PHYSICALOFFSET field > this are dispatched (recovery_dispatch_after)
    findings: tuple[Finding, ...] = ()
    # where the reput's dispatch ends when not at processOffset: 5.3.3's getReputEndOffset() is the confirm offset
    # with duplicationEnable (DefaultMessageStore.java:2855-2857), a record reaching past it is not dispatched (:2885)
    reput_end: int | None = None

    @property
    def tasks(self) -> list[SegmentTask]:
        """Every segment scan the walk may need, in commitlog order (reput segments, then the window)."""
        out: list[SegmentTask] = []
        S = self.inputs.segment_size
        if self.inputs.dledger:  # DLedger reads every data file from byte 0
            crc = self.inputs.dledger_crc
            return [SegmentTask(i, s.base, s.name, 0, crc) for i, s in enumerate(self.segments) if s.file_size]
        for i, seg in enumerate(self.segments):
            if i >= self.start_index:
                out.append(SegmentTask(i, seg.base, seg.name, 0, True))
            elif self.reput_from is not None and seg.base + S > self.reput_from:
                out.append(SegmentTask(i, seg.base, seg.name, max(0, self.reput_from - seg.base), False))
        return out

    @property
    def prop_crc(self) -> bool:
        """5.x ``forceVerifyPropCRC``: the window checks the ``__CRC32#`` property instead of the body CRC."""
        return self.inputs.version == "5" and self.inputs.force_verify_prop_crc


def recovery_dispatch_after(version: str, dledger: bool, normal: bool, cq_max_phy_offset: int) -> int | None:
    """The PHYSICALOFFSET a start-up's recovery dispatches only records strictly above (None: all it walks).

    5.3.3's normal recovery of a default store: CommitLog.recoverNormally :351 (``doDispatch =
    commitLogOffset > maxPhyOffsetOfConsumeQueue``), its reput then starting at the log's end. 4.9.8's
    normal start reputs from that offset instead; abnormal recovery re-dispatches every valid record;
    DLedger's walk is its own (dledgerwalk)."""
    return cq_max_phy_offset if version == "5" and normal and not dledger else None


@dataclass(frozen=True)
class DispatchRange:
    """Records the broker dispatches from one segment: valid records starting in ``[start, end)``.

    ``after``: only records whose PHYSICALOFFSET field is strictly greater (5.x normal recovery), or
    None. ``by``: ``reput`` or ``recovery`` (who dispatches them; the same records either way).
    ``confirm``: only records whose PHYSICALOFFSET field + TOTALSIZE <= it (5.3.3 abnormal recovery with
    duplicationEnable: :attr:`RecoveryInputs.confirm_bound`), or None. ``below``: only records whose
    PHYSICALOFFSET field < it (5.3.3's DLedger abnormal recovery with duplicationEnable: ``commitLogOffset <
    getConfirmOffset()``, DLedger's max offset, DLedgerCommitLog.java:354-356, :175-177), or None.
    """

    base: int
    name: str
    start: int
    end: int
    after: int | None
    by: str
    confirm: int | None = None
    below: int | None = None  # only records whose PHYSICALOFFSET field < it (DLedger 5.3.3 abnormal, duplication)

    @property
    def phy_start(self) -> int:
        return self.base + self.start

    @property
    def phy_end(self) -> int:
        return self.base + self.end


@dataclass(frozen=True)
class SegmentOutcome:
    """How far the walk (or reput) got in one segment."""

    base: int
    name: str
    start: int
    crc_checked: bool
    end_kind: str
    end_offset: int  # file offset where the scan stopped
    reason: str | None = None
    detail: str | None = None
    size: int | None = None
    records: int = 0


@dataclass(frozen=True)
class RecoveryResult:
    """The outcome of the recovery walk (store-algorithms §8.3–§8.5, §4.1 for 4.9.8 reput).

    ``process_offset``: end of the valid commitlog; ``failure``: the record that ended the window
    walk (None when it ended at the last segment's blank / end of data); ``delete_segments``: bases
    of segments the broker deletes; ``truncate``: (base, write position) of the segment cut at
    ``process_offset``; ``truncate_consume_queues``: the CQ is cut at ``process_offset`` too
    (§8.6); ``dispatch``: the ranges dispatched, in dispatch order (a 4.9.8 reput that meets a length
    mismatch reads around it: :mod:`storelib.broker.recovery.reputpath`); ``supported``: False when the
    broker's dispatch cannot be reproduced byte-identically (a missing segment in the dispatched range)
    — see ``findings``.
    """

    version: str
    mode: str
    start_index: int
    start_base: int | None
    start_reason: str
    window_start: int | None  # physical offset where CRC checking starts
    crc_checked: bool
    process_offset: int
    failure: SegmentOutcome | None
    segments: tuple[SegmentOutcome, ...]
    delete_segments: tuple[int, ...]
    truncate: tuple[int, int] | None
    cq_max_phy_offset: int
    truncate_consume_queues: bool
    dispatch: tuple[DispatchRange, ...]
    supported: bool
    findings: tuple[Finding, ...] = ()
    delay_levels_quirk: bool = False  # 4.9.8 abnormal: recovery dispatch sees no delay levels (§8.4)
    dledger: DLedgerRecovery | None = None  # a DLedger-mode walk: DLedger's load and recover
    cq_truncate_offset: int | None = None  # where the consume queues are cut when not at process_offset

    def summary(self) -> dict:
        """A JSON-able digest (for manifests and CLI output)."""
        f = self.failure
        return {
            "version": self.version, "mode": self.mode, "start_index": self.start_index,
            "start_base": self.start_base, "start_reason": self.start_reason,
            "window_start": self.window_start, "crc_checked": self.crc_checked,
            "process_offset": self.process_offset,
            "failure": None if f is None else {"segment": f.name, "offset": f.end_offset, "reason": f.reason,
                                                "detail": f.detail},
            "delete_segments": list(self.delete_segments), "truncate": self.truncate,
            "truncate_consume_queues": self.truncate_consume_queues, "supported": self.supported,
            "findings": [str(x) for x in self.findings],
        }
