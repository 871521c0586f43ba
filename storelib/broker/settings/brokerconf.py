"""Store-relevant broker settings (store-format §10) read from a ``broker.conf`` (:mod:`storelib.format.javaprops`).

Every reader of a store needs the geometry the broker was configured with (segment sizes, index
slots, delay levels); reading them from the operator's own broker.conf, with the broker's defaults and
getter rules (CQ size rounding, ratio clamps), is what makes offline results match the broker's.

Deliberate differences from the broker, for operators' sake: values are trimmed (Java keeps trailing
blanks, which makes its ``Integer.parseInt`` fail), an invalid number raises StoreError naming file and
line (the broker silently keeps the default). The file is read as the broker's ``Properties.load(InputStream)``
reads it: ISO-8859-1, ``\\uXXXX`` escapes (:func:`storelib.format.javaprops.properties_text`). Booleans follow
``Boolean.parseBoolean``: only "true" (any case) is true.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from storelib.broker.settings.brokerkeys import KNOWN_BROKER_CONF_KEYS
from storelib.broker.settings.brokerline import BrokerLine
from storelib.broker.settings.dledgerlayout import DLedgerLayout
from storelib.errors import Finding, StoreError
from storelib.fileio.smallfile_io import PathOrLocation, as_location, read_small
from storelib.format.consumequeue import CQ_UNIT_SIZE
from storelib.format.delaylevel import DEFAULT_DELAY_LEVEL, parse_delay_levels
from storelib.format.indexfile import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE, IndexGeometry
from storelib.format.javaprops import parse_properties_text, properties_text
from storelib.format.timerstore import snap_timer_precision

if TYPE_CHECKING:
    from storelib.broker.settings.geometry import Inferred

SYSPROP_WARNING_RATIO = "rocketmq.broker.diskSpaceWarningLevelRatio"
SYSPROP_FORCE_RATIO = "rocketmq.broker.diskSpaceCleanForciblyRatio"
SYSPROP_MULTI_PATH_SPLITTER = "rocketmq.broker.multiPathSplitter"
VERSIONS = ("4", "5")

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def _default_root() -> str:
    return os.path.join(os.path.expanduser("~"), "store")


# (broker.conf key, attribute, kind, 4.9.8 default, 5.3.3 default, exists in 4.9.8)
# For keys 4.9.8 does not have, the 4.x default is the behaviour 4.9.8 has without the key.
_KEYS: tuple[tuple[str, str, str, Any, Any, bool], ...] = (
    ("storePathRootDir", "store_path_root_dir", "str", None, None, True),
    ("storePathCommitLog", "store_path_commit_log", "str", None, None, True),
    ("readOnlyCommitLogStorePaths", "read_only_commit_log_store_paths", "str", None, None, True),
    ("mappedFileSizeCommitLog", "mapped_file_size_commit_log", "int", 1_073_741_824, 1_073_741_824, True),
    (
        "mappedFileSizeConsumeQueue",
        "mapped_file_size_consume_queue_config",
        "int",
        6_000_000,
        6_000_000,
        True,
    ),
    ("enableConsumeQueueExt", "enable_consume_queue_ext", "bool", False, False, True),
    (
        "mappedFileSizeConsumeQueueExt",
        "mapped_file_size_consume_queue_ext",
        "int",
        50_331_648,
        50_331_648,
        True,
    ),
    ("bitMapLengthConsumeQueueExt", "bit_map_length_consume_queue_ext", "int", 64, 64, True),
    (
        "mapperFileSizeBatchConsumeQueue",
        "mapper_file_size_batch_consume_queue",
        "int",
        None,
        13_800_000,
        False,
    ),
    ("maxMessageSize", "max_message_size", "int", 4_194_304, 4_194_304, True),
    ("messageIndexEnable", "message_index_enable", "bool", True, True, True),
    ("maxHashSlotNum", "max_hash_slot_num", "int", 5_000_000, 5_000_000, True),
    ("maxIndexNum", "max_index_num", "int", 20_000_000, 20_000_000, True),
    ("maxMsgsNumBatch", "max_msgs_num_batch", "int", 64, 64, True),
    ("messageIndexSafe", "message_index_safe", "bool", False, False, True),
    ("checkCRCOnRecover", "check_crc_on_recover", "bool", True, True, True),
    ("enabledAppendPropCRC", "enabled_append_prop_crc", "bool", False, False, False),
    ("forceVerifyPropCRC", "force_verify_prop_crc", "bool", False, False, False),
    ("autoMessageVersionOnTopicLen", "auto_message_version_on_topic_len", "bool", False, True, False),
    ("messageDelayLevel", "message_delay_level", "str", DEFAULT_DELAY_LEVEL, DEFAULT_DELAY_LEVEL, True),
    ("fileReservedTime", "file_reserved_time", "int", 72, 72, True),
    ("deleteWhen", "delete_when", "str", "04", "04", True),
    ("diskMaxUsedSpaceRatio", "disk_max_used_space_ratio_config", "int", 75, 75, True),
    ("diskSpaceWarningLevelRatio", "disk_space_warning_level_ratio", "int", None, 90, False),
    ("diskSpaceCleanForciblyRatio", "disk_space_clean_forcibly_ratio", "int", None, 85, False),
    ("cleanFileForciblyEnable", "clean_file_forcibly_enable", "bool", True, True, True),
    ("cleanResourceInterval", "clean_resource_interval", "int", 10_000, 10_000, True),
    ("deleteCommitLogFilesInterval", "delete_commit_log_files_interval", "int", 100, 100, True),
    ("deleteConsumeQueueFilesInterval", "delete_consume_queue_files_interval", "int", 100, 100, True),
    (
        "destroyMapedFileIntervalForcibly",
        "destroy_maped_file_interval_forcibly",
        "int",
        120_000,
        120_000,
        True,
    ),
    ("redeleteHangedFileInterval", "redelete_hanged_file_interval", "int", 120_000, 120_000, True),
    ("deleteFileBatchMax", "delete_file_batch_max", "int", 10, 10, False),
    ("replicasPerDiskPartition", "replicas_per_disk_partition", "int", 1, 1, False),
    (
        "logicalDiskSpaceCleanForciblyThreshold",
        "logical_disk_space_clean_forcibly_threshold",
        "double",
        None,
        0.8,
        False,
    ),
    (
        "correctLogicMinOffsetForceInterval",
        "correct_logic_min_offset_force_interval",
        "int",
        None,
        300_000,
        False,
    ),
    ("flushDiskType", "flush_disk_type", "str", "ASYNC_FLUSH", "ASYNC_FLUSH", True),
    ("brokerRole", "broker_role", "str", "ASYNC_MASTER", "ASYNC_MASTER", True),
    ("flushIntervalCommitLog", "flush_interval_commit_log", "int", 500, 500, True),
    ("flushCommitLogLeastPages", "flush_commit_log_least_pages", "int", 4, 4, True),
    ("flushCommitLogThoroughInterval", "flush_commit_log_thorough_interval", "int", 10_000, 10_000, True),
    ("transientStorePoolEnable", "transient_store_pool_enable", "bool", False, False, True),
    ("warmMapedFileEnable", "warm_maped_file_enable", "bool", False, False, True),
    ("flushIntervalConsumeQueue", "flush_interval_consume_queue", "int", 1000, 1000, True),
    ("flushConsumeQueueLeastPages", "flush_consume_queue_least_pages", "int", 2, 2, True),
    (
        "flushConsumeQueueThoroughInterval",
        "flush_consume_queue_thorough_interval",
        "int",
        60_000,
        60_000,
        True,
    ),
    ("enableDLegerCommitLog", "enable_dleger_commit_log", "bool", False, False, True),
    ("dLegerSelfId", "d_leger_self_id", "str", None, None, True),
    ("dLegerGroup", "d_leger_group", "str", None, None, True),
    ("dLegerPeers", "d_leger_peers", "str", None, None, True),
    ("storePathDLedgerCommitLog", "store_path_d_ledger_commit_log", "str", None, None, True),
    ("duplicationEnable", "duplication_enable", "bool", False, False, True),
    ("recheckReputOffsetFromCq", "recheck_reput_offset_from_cq", "bool", False, False, False),
    ("enableMultiDispatch", "enable_multi_dispatch", "bool", False, False, True),
    ("enableLmq", "enable_lmq", "bool", False, False, True),
    ("enableCompaction", "enable_compaction", "bool", False, True, False),
    ("timerWheelEnable", "timer_wheel_enable", "bool", False, True, False),
    ("mappedFileSizeTimerLog", "mapped_file_size_timer_log", "int", None, 104_857_600, False),
    ("timerPrecisionMs", "timer_precision_ms", "int", None, 1000, False),  # setter: int, snapped (see _build)
    ("timerRollWindowSlot", "timer_roll_window_slot", "int", None, 172_800, False),
    ("storeType", "store_type", "str", "default", "default", False),
    ("brokerId", "broker_id", "long", 0, 0, True),
    ("enableCalcFilterBitMap", "enable_calc_filter_bit_map", "bool", False, False, True),
)
_BY_KEY = {k[0]: k for k in _KEYS}
_BY_ATTR = {k[1]: k for k in _KEYS}
# JVM system properties (-D...) that change store behaviour; accepted in overrides by their full name.
_SYSPROPS = {
    SYSPROP_WARNING_RATIO: "sysprop_disk_space_warning_level_ratio",
    SYSPROP_FORCE_RATIO: "sysprop_disk_space_clean_forcibly_ratio",
    SYSPROP_MULTI_PATH_SPLITTER: "sysprop_multi_path_splitter",
}


def attribute_of(key: str) -> str:
    """The BrokerSettings attribute of a broker.conf key (``mappedFileSizeConsumeQueue`` -> ...)."""
    return _BY_KEY[key][1]


def _defaults(version: str) -> dict[str, Any]:
    if version not in VERSIONS:
        raise StoreError(None, None, "bad_value", f"version must be one of {VERSIONS}, not {version!r}")
    col = 3 if version == "4" else 4
    out = {k[1]: k[col] for k in _KEYS}
    out["store_path_root_dir"] = _default_root()
    return out


# broker settings under which the consume queues are not what a dispatch of ours writes: what the broker does
CQ_UNREPRODUCED = {
    "enableConsumeQueueExt": "the broker writes an ext address as each unit's tags code",
    "enableMultiDispatch": "the broker also copies each record into every queue its INNER_MULTI_DISPATCH "
                           "property lists (LMQ)",
}


def duplication_dispatches_nothing(version: str, duplication_enable: bool, dledger: bool) -> bool:
    """Does this broker dispatch nothing at all? 4.9.8 with duplicationEnable outside DLedger mode: nothing in
    4.9.8 ever sets CommitLog.confirmOffset (-1, CommitLog.java:74; setConfirmOffset :462 has no caller but
    the plugin pass-through), so the reput breaks before its first record (``reputFromOffset >=
    getConfirmOffset()``, DefaultMessageStore.java:2017-2020) and abnormal recovery dispatches only records
    with ``commitLogOffset < -1`` (CommitLog.java:500-502): none. DLedger mode's getConfirmOffset is the log's
    max offset (DLedgerCommitLog.java:172-174): there the setting changes nothing. 5.3.3 sets the confirm
    offset in recovery (its own rules: RecoveryInputs.confirm_bound, startup5x)."""
    return duplication_enable and str(version).startswith("4") and not dledger


@dataclass(frozen=True)
class BrokerSettings:
    """Store-relevant MessageStoreConfig/BrokerConfig values, raw as configured.

    Getter-adjusted values (CQ size rounding, ratio clamps) are properties. ``extra`` keeps every key
    this class does not model (or that the selected version does not have), as text.
    """

    version: str = "4"
    store_path_root_dir: str = field(default_factory=_default_root)
    store_path_commit_log: str | None = None
    read_only_commit_log_store_paths: str | None = None
    mapped_file_size_commit_log: int = 1_073_741_824
    mapped_file_size_consume_queue_config: int = 6_000_000
    enable_consume_queue_ext: bool = False
    mapped_file_size_consume_queue_ext: int = 50_331_648
    bit_map_length_consume_queue_ext: int = 64
    mapper_file_size_batch_consume_queue: int | None = None
    max_message_size: int = 4_194_304
    message_index_enable: bool = True
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    max_msgs_num_batch: int = 64
    message_index_safe: bool = False
    check_crc_on_recover: bool = True
    enabled_append_prop_crc: bool = False
    force_verify_prop_crc: bool = False
    auto_message_version_on_topic_len: bool = False
    message_delay_level: str = DEFAULT_DELAY_LEVEL
    file_reserved_time: int = 72
    delete_when: str = "04"
    disk_max_used_space_ratio_config: int = 75
    disk_space_warning_level_ratio: int | None = None
    disk_space_clean_forcibly_ratio: int | None = None
    clean_file_forcibly_enable: bool = True
    clean_resource_interval: int = 10_000
    delete_commit_log_files_interval: int = 100
    delete_consume_queue_files_interval: int = 100
    destroy_maped_file_interval_forcibly: int = 120_000
    redelete_hanged_file_interval: int = 120_000
    delete_file_batch_max: int = 10
    replicas_per_disk_partition: int = 1
    logical_disk_space_clean_forcibly_threshold: float | None = None
    correct_logic_min_offset_force_interval: int | None = None
    flush_disk_type: str = "ASYNC_FLUSH"
    broker_role: str = "ASYNC_MASTER"
    flush_interval_commit_log: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval: int = 10_000
    transient_store_pool_enable: bool = False
    warm_maped_file_enable: bool = False
    flush_interval_consume_queue: int = 1000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval: int = 60_000
    enable_dleger_commit_log: bool = False
    d_leger_self_id: str | None = None
    d_leger_group: str | None = None
    d_leger_peers: str | None = None
    store_path_d_ledger_commit_log: str | None = None
    duplication_enable: bool = False
    recheck_reput_offset_from_cq: bool = False  # 5.3.3 DefaultMessageStore.doRecheckReputOffsetFromCq
    enable_multi_dispatch: bool = False
    enable_lmq: bool = False
    enable_compaction: bool = False
    timer_wheel_enable: bool = False
    mapped_file_size_timer_log: int | None = None
    timer_precision_ms: int | None = None
    timer_roll_window_slot: int | None = None
    store_type: str = "default"
    broker_id: int = 0
    enable_calc_filter_bit_map: bool = False
    sysprop_disk_space_warning_level_ratio: str | None = None
    sysprop_disk_space_clean_forcibly_ratio: str | None = None
    sysprop_multi_path_splitter: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    source: str | None = None
    line: BrokerLine | None = None  # how ``version`` was chosen (storelib.broker.settings.store.load_settings sets it)
    dledger: DLedgerLayout | None = None  # DLedger mode: where its files are and why (load_settings sets it)
    inferred: tuple[Inferred, ...] = ()  # geometry taken from the files (no broker.conf/--set gave it)
    geometry_conflicts: tuple[Inferred, ...] = ()  # the files disagree with broker.conf/--set (which win)
    conf_findings: tuple[Finding, ...] = ()  # keys no broker reads (typos), a JSON file given as broker.conf

    # ---- constructors -------------------------------------------------------------------------

    @classmethod
    def defaults(cls, version: str = "4") -> BrokerSettings:
        """The broker's defaults for ``version`` ("4" = 4.9.8, "5" = 5.3.3)."""
        return cls(version=version, **_defaults(version))

    @classmethod
    def from_properties(
        cls, props: Mapping[str, Any], version: str = "4", *, source: str | None = None
    ) -> BrokerSettings:
        """Settings from a key -> value mapping (broker.conf keys, or JVM property names)."""
        items = {str(k): (v, None, None) for k, v in props.items()}
        return _build(cls.defaults(version), items, source)

    def with_overrides(self, overrides: Mapping[str, Any]) -> BrokerSettings:
        """A copy with some keys replaced; keys are broker.conf names or attribute names.

        Values may be text (parsed like broker.conf) or already typed (checked).
        """
        items: dict[str, tuple[Any, int | None, int | None]] = {}
        for k, v in overrides.items():
            key = _BY_ATTR[k][0] if k in _BY_ATTR else str(k)
            items[key] = (v, None, None)
        return _build(self, items, self.source)

    # ---- derived values (the broker's getters) -------------------------------------------------

    @property
    def scan_line(self) -> str | None:
        """The line whose record check the store's scans apply (BrokerLine.scan_line; None when these
        settings were not made by :func:`storelib.broker.settings.store.load_settings`)."""
        return self.line.scan_line if self.line is not None else None

    @property
    def mapped_file_size_consume_queue(self) -> int:
        """CQ segment size as the broker uses it: the configured value rounded up to a multiple of 20."""
        return -(-self.mapped_file_size_consume_queue_config // CQ_UNIT_SIZE) * CQ_UNIT_SIZE

    @property
    def commit_log_dirs(self) -> list[str]:
        """Commitlog directories: storePathCommitLog (default <root>/commitlog) split on the multi-path splitter."""
        path = self.store_path_commit_log or os.path.join(self.store_path_root_dir, "commitlog")
        splitter = self.sysprop_multi_path_splitter or ","
        return [p for p in path.split(splitter) if p] if splitter in path else [path]

    @property
    def cq_unreproduced_setting(self) -> str | None:
        """The setting (enabled) that makes this broker's consume queues differ from what a dispatch of
        ours writes, None when none does (:data:`CQ_UNREPRODUCED` says how). Neither touches the index."""
        if self.enable_consume_queue_ext:
            return "enableConsumeQueueExt"
        if self.enable_multi_dispatch:
            return "enableMultiDispatch"
        return None

    @property
    def cq_unreproduced(self) -> str | None:
        """:attr:`cq_unreproduced_setting` and what the broker does under it, in a few words (None: nothing)."""
        key = self.cq_unreproduced_setting
        return None if key is None else f"{key}=true: {CQ_UNREPRODUCED[key]}"

    def require_reproducible(self, what: Iterable[str]) -> None:
        """Refuse, before anything is written, consume queues (``"consumequeue"`` in ``what``) that would
        not be the broker's (:attr:`cq_unreproduced`), and any consume queue or index under 4.9.8's
        duplicationEnable, where the broker dispatches nothing (:func:`duplication_dispatches_nothing`): empty
        files would be a rebuild that loses every entry while saying it succeeded. Every dispatch of ours, on
        every engine, asks this."""
        what = tuple(what)
        if duplication_dispatches_nothing(str(self.version), bool(self.duplication_enable),
                                          bool(self.enable_dleger_commit_log)) and set(what) & {"consumequeue", "index"}:
            raise StoreError(self.source, None, "unsupported",
                             "duplicationEnable=true on 4.9.8: the broker dispatches nothing, ever (its confirm offset "
                             "stays -1: the reput stops at once and an abnormal recovery dispatches no record, "
                             "DefaultMessageStore.java:2017-2020, CommitLog.java:500-502), so the consume queues and "
                             "index it holds after a start on rebuilt files are empty and its start-up waits forever "
                             "for the reput; nothing is written (empty files would pass for a rebuild that lost every "
                             "entry). Set duplicationEnable=false (--set "
                             "duplicationEnable=false) to write what a broker without it dispatches")
        key = self.cq_unreproduced_setting if "consumequeue" in what else None
        if key is not None:
            raise StoreError(None, None, "unsupported",
                             f"consume queues are not rebuilt under {self.cq_unreproduced}, which no dispatch of "
                             f"ours reproduces; the index files are unaffected (what=index), or set {key}=false to "
                             "build the queues without it")

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        """Delay per level in ms (index 0 = level 1), parsed like the broker's parseDelayLevel."""
        return parse_delay_levels(self.message_delay_level, file=self.source)

    @property
    def max_delay_level(self) -> int:
        return len(self.delay_levels_ms)

    @property
    def index_geometry(self) -> IndexGeometry:
        """The IndexFile geometry these settings give (maxHashSlotNum, maxIndexNum)."""
        return IndexGeometry(int(self.max_hash_slot_num), int(self.max_index_num))

    @property
    def index_file_size(self) -> int:
        """Bytes of one IndexFile: 40-byte header + 4 per hash slot + 20 per entry."""
        return (
            HEADER_SIZE
            + self.max_hash_slot_num * SLOT_SIZE
            + self.max_index_num * ENTRY_SIZE
        )

    @property
    def disk_max_used_space_ratio(self) -> int:
        """diskMaxUsedSpaceRatio (percent) after the getter's clamp to 10..95."""
        return min(95, max(10, self.disk_max_used_space_ratio_config))

    @property
    def disk_space_warning_ratio(self) -> float:
        """Warning ratio as a fraction, per version (store-format §10, differences #27)."""
        return _ratio(
            self,
            self.sysprop_disk_space_warning_level_ratio,
            self.disk_space_warning_level_ratio,
            0.90,
            (0.35, 0.90),
        )

    @property
    def disk_space_force_ratio(self) -> float:
        """Force-clean ratio as a fraction, per version."""
        return _ratio(
            self,
            self.sysprop_disk_space_clean_forcibly_ratio,
            self.disk_space_clean_forcibly_ratio,
            0.85,
            (0.30, 0.85),
        )

    def to_properties(self) -> dict[str, str]:
        """broker.conf keys whose value differs from the version's default, plus ``extra``."""
        base = _defaults(self.version)
        out: dict[str, str] = {}
        for key, attr, kind, *_ in _KEYS:
            v = getattr(self, attr)
            if v != base[attr] and v is not None:
                out[key] = ("true" if v else "false") if kind == "bool" else str(v)
        for prop, attr in _SYSPROPS.items():
            if getattr(self, attr) is not None:
                out[prop] = getattr(self, attr)
        out.update(self.extra)
        return out


def _ratio(
    s: BrokerSettings,
    sysprop: str | None,
    config_pct: int | None,
    v4_default: float,
    clamp: tuple[float, float],
) -> float:
    where = s.source
    if sysprop is not None and sysprop.strip() != "":
        value = _parse_double(sysprop, where, None, None, "system property")
    elif s.version == "4":
        return v4_default
    else:
        value = (config_pct if config_pct is not None else round(v4_default * 100)) / 100.0
    if s.version == "4":
        return value  # 4.9.8 does not clamp the system property
    return min(clamp[1], max(clamp[0], value))


def load_broker_conf(where: PathOrLocation, version: str = "4") -> BrokerSettings:
    """Read a broker.conf (local path, URI or Location) into BrokerSettings for ``version``."""
    return load_conf_over(where, BrokerSettings.defaults(version))


def load_conf_over(where: PathOrLocation, base: BrokerSettings, what: str = "broker.conf") -> BrokerSettings:
    """The keys of a file in broker.conf syntax over ``base`` (a broker.conf over the line's defaults, an
    expiry policy file over the store's settings); errors name the file, line and byte offset."""
    loc = as_location(where)
    data = read_small(loc, 16 * 1024 * 1024)
    if data is None:
        raise StoreError(loc.path, None, "missing", f"no such {what}")
    text = properties_text(data)  # one char per byte: a line's char offset is its byte offset
    items: dict[str, tuple[Any, int | None, int | None]] = dict(parse_properties_text(text, file=loc.path))
    settings = _build(base, items, loc.path)
    return dataclasses.replace(settings, conf_findings=tuple(conf_findings(loc.path, text, items)))


def conf_findings(path: str, text: str, items: Mapping[str, tuple[Any, int | None, int | None]]) -> list[Finding]:
    """What a broker would silently ignore: keys no broker reads (with the closest one), or not a
    properties file at all (JSON given as broker.conf)."""
    import difflib

    if text.lstrip().startswith(("{", "[")):
        return [Finding("broker_conf_not_properties", "warning", path, 0,
                        "this looks like JSON, not a broker.conf (Java properties: key=value lines); "
                        "the broker would read no setting from it")]
    out = []
    for key, (_, line, off) in items.items():
        if key in KNOWN_BROKER_CONF_KEYS or key in _BY_KEY or key in _SYSPROPS:
            continue
        close = difflib.get_close_matches(key, KNOWN_BROKER_CONF_KEYS, n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else ""
        out.append(Finding("broker_conf_unknown_key", "warning", path, off,
                           f"line {line}: {key!r} is not a setting of RocketMQ 4.9.8 or 5.3.3 (the broker ignores "
                           f"it){hint}", {"key": key, "suggestion": close[0] if close else None}))
    return out


# ---- typed conversion -------------------------------------------------------------------------


def _where(line: int | None) -> str:
    return f"line {line}: " if line else ""


def _parse_int(v: Any, kind: str, file: str | None, line: int | None, off: int | None, key: str) -> int:
    lo, hi = _INT32 if kind == "int" else _INT64
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise StoreError(file, off, "bad_config", f"{_where(line)}{key}={v!r} is not an integer")
    if isinstance(v, str):
        t = v.strip()
        if not re.fullmatch(r"[+-]?[0-9]+", t):
            raise StoreError(file, off, "bad_config", f"{_where(line)}{key}={v!r} is not an integer")
        v = int(t)
    if not lo <= v <= hi:
        raise StoreError(file, off, "bad_config", f"{_where(line)}{key}={v} does not fit a Java {kind}")
    return v


def _parse_double(v: Any, file: str | None, line: int | None, off: int | None, key: str) -> float:
    if isinstance(v, bool):
        raise StoreError(file, off, "bad_config", f"{_where(line)}{key}={v!r} is not a number")
    if isinstance(v, (int, float)):
        return float(v)
    t = str(v).strip()
    t2 = t[:-1] if t[-1:] in ("d", "D", "f", "F") else t
    if not re.fullmatch(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", t2):
        raise StoreError(file, off, "bad_config", f"{_where(line)}{key}={v!r} is not a number")
    x = float(t2)
    if not math.isfinite(x):
        raise StoreError(file, off, "bad_config", f"{_where(line)}{key}={v!r} is not finite")
    return x


def _convert(kind: str, v: Any, file: str | None, line: int | None, off: int | None, key: str) -> Any:
    if kind in ("int", "long"):
        return _parse_int(v, kind, file, line, off, key)
    if kind == "bool":
        if isinstance(v, bool):
            return v
        return str(v).strip().lower() == "true"  # Boolean.parseBoolean: anything else is false
    if kind == "double":
        return _parse_double(v, file, line, off, key)
    return str(v).strip()


def _build(
    base: BrokerSettings, items: Mapping[str, tuple[Any, int | None, int | None]], source: str | None
) -> BrokerSettings:
    changes: dict[str, Any] = {}
    extra = dict(base.extra)
    version = base.version
    for key, (value, line, off) in items.items():
        spec = _BY_KEY.get(key)
        if key in _SYSPROPS:
            changes[_SYSPROPS[key]] = None if value is None else str(value).strip()
        elif spec is None or (version == "4" and not spec[5]):
            extra[key] = "" if value is None else str(value)
        elif value is None:
            changes[spec[1]] = _defaults(version)[spec[1]]
        else:
            changes[spec[1]] = _convert(spec[2], value, source, line, off, key)
            if key == "timerPrecisionMs":  # the setter snaps to 100/200/500/1000 (MessageStoreConfig :1630)
                changes[spec[1]] = snap_timer_precision(changes[spec[1]])
            if key == "messageDelayLevel":
                parse_delay_levels(changes[spec[1]], file=source, line=line)
    changes["extra"] = extra
    changes["source"] = source
    out = dataclasses.replace(base, **changes)
    if out.index_file_size > _INT32[1]:
        raise StoreError(
            source,
            None,
            "bad_config",
            f"index geometry maxHashSlotNum={out.max_hash_slot_num} maxIndexNum={out.max_index_num} "
            f"gives {out.index_file_size} bytes, more than a Java int",
        )
    return out
