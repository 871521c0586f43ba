"""One replica's facts, gathered by one task (any engine): where its commitlog data lies and ends (the
broker's recovery walk), its epochs, its checkpoint's confirm offset, its ``config/`` tables, and any
valid records left on disk past its end.

Everything here is plain values (picklable), so a Spark job over many broker groups gathers the facts of
all their stores on executors and compares them on the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import resolve
from storelib.format.ha.epochfile import EpochEntry, load_epoch_file

STALE_PROBE = 16 << 20  # bytes past the end searched for valid records a truncation left behind


@dataclass(frozen=True)
class StoreSpec:
    """How a task opens one store: its URI as given, the settings resolved for it, filesystem options."""

    name: str
    uri: str
    settings: BrokerSettings
    fs_options: dict[str, Any] = field(default_factory=dict)

    def open(self) -> Store:
        return Store(resolve(self.uri, **self.fs_options), self.settings, uri=self.uri)


@dataclass(frozen=True)
class SegmentRef:
    """A commitlog segment as a task reopens it."""

    base: int
    name: str
    uri: str
    file_size: int
    dledger: bool = False  # a DLedger data file (entries; records at +48)


@dataclass
class ConfigFacts:
    """The ``config/`` tables replicas copy from their master (SlaveSynchronize)."""

    topics: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    offsets: dict[tuple[str, str], dict[int, int]] = field(default_factory=dict)
    delay: dict[int, int] = field(default_factory=dict)
    data_versions: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str | None] = field(default_factory=dict)  # file -> which copy was read (file/bak/None)


@dataclass
class StoreFacts:
    """What one task learns about one store (see the module docstring)."""

    name: str
    uri: str
    version: str
    segment_size: int
    segments: list[SegmentRef]
    min_offset: int
    end: int
    recovery: dict[str, Any]
    confirm_offset: int | None
    epochs: list[EpochEntry]
    epoch_source: str | None
    epoch_present: bool
    epoch_broker_fails: bool
    stale_tail: dict[str, Any] | None
    config: ConfigFacts
    findings: list[Finding] = field(default_factory=list)
    ledger: dict[str, Any] | None = None  # DLedger mode: the node's ledger after load (storelib.broker.replicas.ledger)


def _segment_uri(store: Store, seg) -> str:
    u = store.uri.rstrip("/")
    return u + "/" + seg.folder.strip("/") + "/" + seg.name if "://" in u else seg.loc.path


def store_facts(spec: StoreSpec) -> StoreFacts:
    """The facts of one store (a task: module-level, so it pickles by reference)."""
    from storelib.broker.recovery.walk import finish_walk, plan_recovery, run_tasks, store_inputs
    from storelib.broker.replicas.ledger import ledger_facts, stale_entries
    from storelib.format.checkpoint import read_checkpoint

    store = spec.open()
    cl = store.commitlog
    findings = [f for f in [*store.findings, *cl.findings] if f.severity in ("warning", "error", "critical")]
    segs = [SegmentRef(s.base, s.name, _segment_uri(store, s), s.file_size, s.dledger)
            for s in cl.segments if s.file_size > 0]
    plan = plan_recovery(store_inputs(store), cl.segments)
    ends = run_tasks(plan, delay_levels_ms=list(store.delay_levels_ms))
    rec = finish_walk(plan, ends)
    end = rec.process_offset
    min_offset = segs[0].base if segs else 0
    if store.dledger is not None:
        last = next(((e.last_index, e.last_term) for _, e in sorted(ends.items(), reverse=True)
                     if e.last_index is not None), (None, None))
        ledger = ledger_facts(store, end, last)
        if store.dledger_state is not None:
            findings += [f for f in store.dledger_state.findings if f.severity != "info"]
        return StoreFacts(
            name=spec.name, uri=spec.uri, version=store.settings.version, segment_size=cl.segment_size, segments=segs,
            min_offset=min_offset, end=end, recovery={"mode": rec.mode, "process_offset": end, "failure": None},
            confirm_offset=None, epochs=[], epoch_source=None, epoch_present=False, epoch_broker_fails=False,
            stale_tail=stale_entries(store, end, ledger["end_index"]), config=config_facts(store, findings),
            findings=findings, ledger=ledger)
    confirm = None
    if store.settings.version.startswith("5") and store.exists("checkpoint"):
        try:
            confirm = read_checkpoint(store.loc, strict=False).confirm_phy_offset
        except StoreError as e:
            findings.append(Finding("checkpoint_unreadable", "warning", "checkpoint", e.offset, e.detail))
    ep = load_epoch_file(store.loc)
    findings += ep.findings
    findings += epoch_checks(store, ep.entries, min_offset, end)
    return StoreFacts(
        name=spec.name, uri=spec.uri, version=store.settings.version, segment_size=cl.segment_size, segments=segs,
        min_offset=min_offset, end=end,
        recovery={"mode": rec.mode, "process_offset": end,
                  "failure": None if rec.failure is None else {"segment": rec.failure.name, "offset": rec.failure.end_offset,
                                                               "reason": rec.failure.reason}},
        confirm_offset=confirm, epochs=list(ep.entries), epoch_source=ep.source, epoch_present=ep.present,
        epoch_broker_fails=ep.broker_fails, stale_tail=stale_tail(store, end), config=config_facts(store, findings),
        findings=findings)


def is_boundary(store: Store, offset: int) -> bool:
    """DefaultMessageStore.isOffsetAligned: a message (body CRC checked) or a blank end record starts at
    ``offset``; an offset no segment holds counts as aligned, as it does for the broker."""
    if store.commitlog.segment_for(offset) is None:
        return True
    try:
        return store.commitlog.read(offset, check_crc=True).kind in ("message", "blank")
    except StoreError:
        return False


def epoch_checks(store: Store, entries: list[EpochEntry], min_offset: int, end: int) -> list[Finding]:
    """Epochs that do not fit the bytes: a start past the store's end, or not at a message boundary."""
    out = []
    for e in entries:
        if e.start_offset > end:
            out.append(Finding("epoch_past_end", "error", "epochFileCheckpoint", e.start_offset,
                               f"epoch {e.epoch} starts at {e.start_offset}, past the commitlog's end {end}: its data "
                               "is gone (a crash after the epoch was written, or a commitlog cut behind it)"))
        elif min_offset <= e.start_offset < end and not is_boundary(store, e.start_offset):
            out.append(Finding("epoch_not_at_record", "error", "epochFileCheckpoint", e.start_offset,
                               f"epoch {e.epoch} starts at {e.start_offset}, where no message starts: the epoch file does "
                               "not describe these bytes"))
    return out


def stale_tail(store: Store, end: int) -> dict[str, Any] | None:
    """Valid records still on disk past the store's end (what a truncation that only moved the write
    position leaves: apache/rocketmq#10666), or None. The broker's next recovery ignores them unless new
    data happens to end exactly where one of them starts."""
    from storelib.broker.recovery.resync import find_next_record
    from storelib.scan.scanner import SegmentScan

    seg = store.commitlog.segment_for(end)
    if seg is None:
        return None
    pos = end - seg.base
    with seg.open() as src:
        n = min(src.size - pos, STALE_PROBE)
        if n <= 8:
            return None
        buf = bytes(src.read(pos, n))
        r = find_next_record(buf, 0, base=end, limit=n)
        if r.kind != "message":
            return None
        scan = SegmentScan(src, seg.display, seg.base, pos + r.pos, verify_crc=True, with_properties=False,
                           columns=["phy_offset", "size"])
        rows = [b for b in scan if b.num_rows]
    count = sum(b.num_rows for b in rows)
    last = rows[-1] if rows else None
    stop = (int(last.column("phy_offset")[-1].as_py()) + int(last.column("size")[-1].as_py())) if last else end + r.pos
    return {"from": end, "resumes_at": end + r.pos, "records": count, "until": stop, "phy_match": r.phy_match}


def config_facts(store: Store, findings: list[Finding]) -> ConfigFacts:
    """Topics, subscription groups, consumer and delay offsets as the broker would load them."""
    from storelib.format.configjson import (
        CONSUMER_OFFSET,
        DELAY_OFFSET,
        SUBSCRIPTION_GROUP,
        TOPICS,
        consumer_offsets,
        delay_offsets,
        load_config,
        topic_configs,
    )

    out = ConfigFacts()
    for name in (TOPICS, SUBSCRIPTION_GROUP, CONSUMER_OFFSET, DELAY_OFFSET):
        ld = load_config(store.loc, name)
        findings += [f for f in ld.findings if f.severity != "info"]
        out.files[name] = ld.source
        data = ld.data or {}
        if isinstance(data.get("dataVersion"), dict):
            out.data_versions[name] = data["dataVersion"]
        path = ld.path
        if name == TOPICS:
            out.topics = {k: {"read_queue_nums": t.read_queue_nums, "write_queue_nums": t.write_queue_nums, "perm": t.perm}
                          for k, t in topic_configs(data, findings=findings, file=path).items()}
        elif name == SUBSCRIPTION_GROUP:
            table = data.get("subscriptionGroupTable") or {}
            out.groups = {str(k): (dict(v) if isinstance(v, dict) else {}) for k, v in table.items()}
        elif name == CONSUMER_OFFSET:
            out.offsets = consumer_offsets(data, findings=findings, file=path)
        else:
            out.delay = delay_offsets(data, findings=findings, file=path)
    return out


__all__ = ["ConfigFacts", "SegmentRef", "StoreFacts", "StoreSpec", "config_facts", "epoch_checks", "is_boundary",
           "stale_tail", "store_facts"]
