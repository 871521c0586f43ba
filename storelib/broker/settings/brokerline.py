"""Which broker line (4.x or 5.x) wrote a store: one detection for every command and data source.

Operators rarely know, or say, which line wrote a dump, and the two lines read some bytes differently
(4.9.8 treats a V2 record as corrupt and truncates recovery there). Precedence: an explicit choice,
then broker.conf keys only 5.x has, then the store's own evidence (V2 records, the ``__CRC32#``
property, 5.x-only files, 5.x checkpoint fields), then 4.x. The result says what decided and why,
and names a conflict between the chosen line and the store's evidence, with its consequence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow.fs as pafs

from storelib.errors import StoreError
from storelib.fileio.bytesource import Location, open_source
from storelib.fileio.pagecare import PageCare
from storelib.format.properties import CRC32

VERSIONS = ("4", "5")
# files and folders a 4.x store never has (5.3.3: DefaultMessageStore, CompactionStore, TimerMessageStore,
# RocksDB consume queues, BatchConsumeQueue)
FIVE_X_ONLY_FILES = ("abort.bak", "compaction", "timerwheel", "timerlog", "config/timercheck",
                     "config/timermetrics", "rocksdbstore", "rocksdb", "batchconsumequeue", "consumequeue/CURRENT")
# how much of the oldest segment the record evidence reads: enough for the first thousands of records,
# bounded so detection costs milliseconds on any store
EVIDENCE_BYTES = 4 * 1024 * 1024
EVIDENCE_RECORDS = 20_000

# MessageStoreConfig / BrokerConfig fields of 5.3.3 whose names appear nowhere in 4.9.8's Java source:
# a broker.conf that sets one was written for a 5.x broker (derived by diffing the two tags' sources).
FIVE_X_ONLY_KEYS = frozenset({
    "accessMessageInMemoryHotRatio", "accountStatsEnable", "accountStatsPrintZeroValues", "ackMessageThreadPoolNums",
    "ackThreadPoolQueueCapacity", "adminBrokerThreadPoolQueueCapacity", "allAckInSyncStateSet",
    "allowRecallWhenBrokerNotWriteable", "appendAckAsync", "appendCkAsync", "asyncLearner", "asyncSendEnable",
    "autoMessageVersionOnTopicLen", "batchDispatchRequestThreadPoolNums", "broadcastOffsetExpireMaxSecond",
    "broadcastOffsetExpireSecond", "brokerElectionPriority", "brokerHeartbeatInterval",
    "brokerNotActiveTimeoutMillis", "cgColdReadThreshold", "channelExpiredTimeout", "checkSyncStateSetPeriod",
    "cleanOfflineBrokerInterval", "cleanRocksDBDirtyCQIntervalMin", "cleanSwapedMapInterval",
    "clearRetryTopicWhenDeleteTopic", "coldCtrStrategyEnable", "coldDataFlowControlEnable", "coldDataScanEnable",
    "commercialSizePerMsg", "commitLogForceSwapMapInterval", "commitLogSwapMapInterval",
    "commitLogSwapMapReserveFileNum", "compactionCqMappedFileSize", "compactionMappedFileSize",
    "compactionScheduleInternal", "compactionThreadNum", "compatibleWithOldNameSrv",
    "consumerOffsetUpdateVersionStep", "controllerAddr", "controllerHeartBeatTimeoutMills",
    "correctLogicMinOffsetForceInterval", "correctLogicMinOffsetSleepInterval", "dataReadAheadEnable",
    "defaultMessageRequestMode", "defaultPopShareQueueNum", "delayOffsetUpdateVersionStep", "deleteFileBatchMax",
    "disappearTimeAfterStart", "dispatchCqCacheNum", "dispatchCqThreads", "dispatchFromSenderThread",
    "enableAsyncReput", "enableAutoInSyncReplicas", "enableBroadcastOffsetStore",
    "enableBuildConsumeQueueConcurrently", "enableCleanExpiredOffset", "enableCompaction", "enableControllerMode",
    "enableCreateSysGroup", "enableFastChannelEventProcess", "enableLmqStats", "enableMixedMessageType",
    "enableNetWorkFlowControl", "enableNotifyAfterPopOrderLockRelease", "enableNotifyBeforePopCalculateLag",
    "enablePopBatchAck", "enablePopBufferMerge", "enablePopLog", "enablePopMessageThreshold",
    "enableRegisterProducer", "enableRemoteEscape", "enableRetryTopicV2", "enableRocksDBLog",
    "enableSingleTopicRegister", "enableSkipLongAwaitingAck", "enableSlaveActingMaster", "enableSplitRegistration",
    "enabledAppendPropCRC", "estimateAccumulation", "fetchControllerAddrByDnsLookup", "fetchNameSrvAddrByDnsLookup",
    "fetchNamesrvAddrInterval", "forceVerifyPropCRC", "forwardTimeout", "globalColdReadThreshold",
    "haFlowControlEnable", "haMaxGapNotInSync", "haMaxTimeSlaveNotCatchup", "inSyncReplicas",
    "initPopOffsetByCheckMsgInMem", "litePullMessageEnable", "litePullMessageThreadPoolNums",
    "litePullThreadPoolQueueCapacity", "loadBalancePollNameServerInterval", "loadBalanceProcessorThreadPoolNums",
    "loadBalanceThreadPoolQueueCapacity", "lockInStrictMode", "logicQueueForceSwapMapInterval",
    "logicQueueSwapMapInterval", "logicQueueSwapMapReserveFileNum", "logicalDiskSpaceCleanForciblyThreshold",
    "mappedFileSizeTimerLog", "mappedFileSwapEnable", "mapperFileSizeBatchConsumeQueue",
    "maxAsyncPutMessageRequests", "maxBatchDeleteFilesNum", "maxChecksumRange", "maxConsumeQueueScan",
    "maxFilterMessageSize", "maxHaTransferByteInSecond", "maxOffsetMapSize", "maxPopPollingSize",
    "maxRecoveryCommitlogFiles", "maxSlaveResendLength", "maxStatsIdleTimeInMinutes", "maxTopicLength",
    "memTableFlushIntervalMs", "metricGrpcExporterIntervalInMills", "metricGrpcExporterTimeOutInMills",
    "metricLoggingExporterIntervalInMills", "metricsExporterType", "metricsGrpcExporterHeader",
    "metricsGrpcExporterTarget", "metricsInDelta", "metricsLabel", "metricsOtelCardinalityLimit",
    "metricsPromExporterHost", "metricsPromExporterPort", "minInSyncReplicas", "popCkMaxBufferSize",
    "popCkOffsetMaxQueueSize", "popCkStayBufferTime", "popCkStayBufferTimeOut", "popConsumerFSServiceInit",
    "popConsumerKVServiceEnable", "popConsumerKVServiceInit", "popConsumerKVServiceLog", "popFromRetryProbability",
    "popInflightMessageThreshold", "popLongPollingForceNotifyInterval", "popPollingMapSize", "popPollingSize",
    "popResponseReturnActualRetryTopic", "popReviveMaxAttemptTimes", "popReviveMaxReturnSizePerRead",
    "printChannelGroups", "printChannelGroupsMinNum", "pullBatchMaxMessageCount", "putConsumeQueueDataByFileChannel",
    "readUnCommitted", "realTimeNotifyConsumerChange", "realTimePersistRocksDBConfig", "recallMessageEnable",
    "recheckReputOffsetFromCq", "recoverConcurrently", "recoverThreadPoolNums", "rejectPullConsumerEnable",
    "replicasPerDiskPartition", "retrieveMessageFromPopRetryTopicV1", "reviveInterval", "reviveMaxSlow",
    "reviveQueueNum", "reviveScanTime", "rocksdbCQDoubleWriteEnable", "rocksdbFlushWalFrequency",
    "rocksdbWalFileRollingThreshold", "sampleCountThreshold", "sampleSteps", "searchBcqByCacheEnable",
    "sendHeartbeatTimeoutMillis", "serverLoadBalancerEnable", "skipPreOnline", "skipWhenCKRePutReachMaxTimes",
    "spinLockCollisionRetreatOptimalDegree", "splitRegistrationSize", "statRocksDBCQIntervalSec",
    "storePathBrokerIdentity", "storePathEpochFile", "subscriptionExpiredTimeout", "syncBrokerMemberGroupPeriod",
    "syncBrokerMetadataPeriod", "syncControllerMetadataPeriod", "syncFromLastFile",
    "syncMasterFlushOffsetWhenStartup", "timerCheckMetricsWhen", "timerColdDataCheckIntervalMs",
    "timerCongestNumEachSlot", "timerEnableCheckMetrics", "timerEnableDisruptor", "timerEnableRetryUntilSuccess",
    "timerFlushIntervalMs", "timerGetMessageThreadNum", "timerInterceptDelayLevel", "timerMaxDelaySec",
    "timerMetricSmallThreshold", "timerPrecisionMs", "timerProgressLogIntervalMs", "timerPutMessageThreadNum",
    "timerRollWindowSlot", "timerSkipUnknownError", "timerStopDequeue", "timerStopEnqueue", "timerWarmEnable",
    "timerWheelEnable", "topicQueueLockNum", "totalReplicas", "transactionMetricFlushInterval",
    "transactionOpBatchInterval", "transactionOpMsgMaxSize", "travelCqFileNumWhenGetMessage",
    "updateNameServerAddrPeriod", "useABSLock", "usePIDColdCtrStrategy", "useServerSideResetOffset",
    "useStaticSubscription", "validateSystemTopicWhenUpdateTopic", "waitTimeMillsInAckQueue",
    "waitTimeMillsInAdminBrokerQueue", "waitTimeMillsInLitePullQueue", "wakeCommitWhenPutMessage",
    "wakeFlushWhenPutMessage",
})


@dataclass(frozen=True)
class BrokerLine:
    """The line whose rules apply, where that came from, and why."""

    version: str  # "4" or "5"
    source: str  # "option", "broker.conf", "store" or "default"
    reasons: tuple[str, ...] = ()
    store_evidence: tuple[str, ...] = field(default=(), compare=False)
    conflict: str | None = None  # the chosen line disagrees with the store's own evidence

    @property
    def scan_line(self) -> str | None:
        """The line whose record check scans apply (``SegmentScan(line=)``): the version when something
        told it (an option, broker.conf, the store's evidence), None when nothing did. The 4.x default is a
        guess from the absence of 5.x evidence in a bounded prefix (EVIDENCE_BYTES); a scan that meets a V2
        record meets exactly the evidence that would have made it 5.x, so an untold line keeps 4.9.8's
        rules (a blank record is taken whatever its size) but reads V2 records, and no command drops
        records the store's own bytes say a 5.x broker keeps."""
        return None if self.source == "default" else self.version

    def describe(self) -> str:
        """One line for ``info`` and the reports."""
        why = "; ".join(self.reasons) if self.reasons else "no 5.x-only evidence"
        return f"{self.version}.x ({self.source}: {why})"

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "source": self.source, "reasons": list(self.reasons),
                "store_evidence": list(self.store_evidence), "conflict": self.conflict}


def normalise_version(version: str | None) -> str | None:
    """"4"/"4.9.8"/"5"/"5.3.3" to "4"/"5"; None or "auto" to None (detect); anything else is an error."""
    if version is None or str(version).strip().lower() in ("", "auto"):
        return None
    v = str(version).strip()
    if v[:1] in VERSIONS and (len(v) == 1 or v[1] == "."):
        return v[:1]
    raise StoreError(None, None, "bad_argument", f"broker version must be 4, 5 or auto, not {version!r}")


def conf_evidence(keys: Iterable[str]) -> list[str]:
    """The broker.conf keys that only a 5.x broker reads."""
    return sorted(k for k in keys if k in FIVE_X_ONLY_KEYS)


def store_evidence(root: Location | None) -> list[str]:
    """Why the store itself looks written by 5.x (empty when nothing says so); reads a bounded prefix."""
    if root is None:
        return []
    out: list[str] = []
    for name in FIVE_X_ONLY_FILES:
        try:
            kind = root.fs.get_file_info(root.join(*name.split("/")).path).type
        except OSError:
            continue
        if kind != pafs.FileType.NotFound:
            out.append(f"{name} exists (5.x only)")
    out.extend(_checkpoint_evidence(root))
    out.extend(_record_evidence(root))
    return out


def _checkpoint_evidence(root: Location) -> list[str]:
    from storelib.format.checkpoint import read_checkpoint

    try:
        cp = read_checkpoint(root, strict=False)
    except (StoreError, OSError):
        return []
    if cp.confirm_phy_offset or cp.master_flushed_offset:
        return ["checkpoint has 5.x fields set (masterFlushedOffset/confirmPhyOffset)"]
    return []


def _record_evidence(root: Location) -> list[str]:
    """V2 record magic and the ``__CRC32#`` property in the first records of the oldest segment."""
    from storelib.broker.settings.dledgerlayout import dledger_dirs
    from storelib.scan.commitlog import list_files

    def segments(d: Location) -> list:
        try:
            return [i for i in list_files(d) if i.type == pafs.FileType.File and len(i.base_name) == 20
                    and i.base_name.isdigit() and (i.size or 0) > 0]
        except (StoreError, OSError):
            return []

    cl, folder, dledger = root.join("commitlog"), "commitlog", False
    infos = segments(cl)
    nodes = dledger_dirs(root) if not infos else []
    if len(nodes) == 1:  # a DLedger-mode store: the records are in its data files, 48 bytes into each entry
        folder, dledger = f"{nodes[0]}/data", True
        cl = root.join(nodes[0], "data")
        infos = segments(cl)
    if not infos:
        return []
    first = min(infos, key=lambda i: i.base_name)
    n = min(int(first.size or 0), EVIDENCE_BYTES)
    # by ranged reads (a segment a running broker's cleaner may take, never mapped), and the page cache
    # left as found: the oldest segment is the coldest, and every command reads this at its start
    loc = replace(cl.join(first.base_name), mapped=False)
    care = PageCare(loc.path if loc.local else None)
    try:
        with open_source(loc, int(first.size or 0)) as src:
            buf = bytes(src.read(0, n))
    except (StoreError, OSError):
        return []
    finally:
        care.done(0, int(first.size or 0))
    # the prefix decoded column-wise (a scalar decode of its ~8 k records cost 0.1 s of every command's
    # start on a store that has neither mark); the scan stops where the broker would, like the walk did
    import numpy as np
    import pyarrow.compute as pc

    from storelib.scan.scanner import scan_buffer

    table, _end = scan_buffer(buf, base=int(first.base_name), verify_crc=False, dledger=dledger,
                              columns=["phy_offset", "magic_version", "properties"], batch_rows=EVIDENCE_RECORDS)
    table = table.slice(0, EVIDENCE_RECORDS)
    pos = table.column("phy_offset").to_numpy() - int(first.base_name)  # file offsets
    hit_v2 = np.flatnonzero(table.column("magic_version").to_numpy() == 2)
    hit_crc = np.flatnonzero(pc.is_valid(pc.map_lookup(table.column("properties"), CRC32, "first")).to_numpy(
        zero_copy_only=False))
    v2 = int(pos[hit_v2[0]]) if len(hit_v2) else None
    crc = int(pos[hit_crc[0]]) if len(hit_crc) else None
    where = f"{folder}/{first.base_name}"
    out = []
    if v2 is not None:
        out.append(f"V2 record (magic 0xDAA320AB) at {where} @ {v2}")
    if crc is not None:
        out.append(f"property CRC ({CRC32}) at {where} @ {crc}")
    return out


def detect_broker_line(root: Location | None, conf_keys: Iterable[str] = (), explicit: str | None = None,
                       *, conf_name: str = "broker.conf") -> BrokerLine:
    """The line whose rules apply to the store at ``root`` (see the module docstring for precedence)."""
    chosen = normalise_version(explicit)
    conf5 = conf_evidence(conf_keys)
    store5 = store_evidence(root)
    if chosen is not None:
        line = BrokerLine(chosen, "option", (f"--broker-version {chosen}",), tuple(store5))
    elif conf5:
        shown = ", ".join(conf5[:3]) + (f" (+{len(conf5) - 3} more)" if len(conf5) > 3 else "")
        line = BrokerLine("5", "broker.conf", (f"{conf_name} sets 5.x-only keys: {shown}",), tuple(store5))
    elif store5:
        line = BrokerLine("5", "store", tuple(store5), tuple(store5))
    else:
        line = BrokerLine("4", "default", ("no broker.conf key, file or record only 5.x writes",))
    if line.version == "4" and (store5 or conf5):
        line = BrokerLine(line.version, line.source, line.reasons, line.store_evidence, _conflict(line, store5, conf5))
    return line


def _conflict(line: BrokerLine, store5: list[str], conf5: list[str]) -> str:
    """What choosing 4.x costs on a store with 5.x evidence."""
    v2 = [e for e in store5 if e.startswith("V2 record")]
    if v2:
        return (f"4.x rules chosen ({line.source}) but the store holds a {v2[0]}: a 4.9.8 broker treats a V2 record "
                "as corrupt and ends recovery at the first one, dropping every message after it; "
                "use --broker-version 5 (or auto) if 5.x wrote this store")
    evidence = (store5 or [f"broker.conf sets {conf5[0]}"])[0]
    return (f"4.x rules chosen ({line.source}) but {evidence}: 4.x defaults apply (e.g. no property CRC check, "
            "other retention and timer settings); use --broker-version 5 (or auto) if 5.x wrote this store")
