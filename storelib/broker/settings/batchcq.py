"""5.3.3's BatchConsumeQueues (``batchconsumequeue/<topic>/<queueId>/``) as its start-up loads them, read-only.

A 5.3.3 store keeps the queues of a topic whose ``queue.type`` attribute is ``BatchCQ`` there, in 46-byte units
(BatchConsumeQueue.java:49-63: phyOffset 8, size 4, tagsCode 8, storeTime 8, msgBaseOffset 8, batchSize 2,
compactedOffset 4, reserved 4). At start-up the broker:

* loads them beside the consume queues (ConsumeQueueStore.java:68-72, :204-233): each queue directory of each
  topic; ``queueTypeShouldBe`` (:259-267) throws, and the load fails (the broker does not start), when the
  topic's config (config/topics.json, attribute ``queue.type``, default SimpleCQ: QueueTypeUtils.java:33-50)
  is not BatchCQ, and the same for a ``consumequeue/`` topic configured BatchCQ; each directory is a
  MappedFileQueue of ``mapperFileSizeBatchConsumeQueue`` files (MappedFileQueue.doLoad: a zero-length last
  file deleted, any other length fails the load, a name that is not a long fails the DefaultMappedFile);
* recovers each (BatchConsumeQueue.recover :211-262): from the third-last file, units are valid while
  ``phyOffset >= 0 && size > 0 && msgBaseOffset >= 0 && batchSize > 0``; files after the end are deleted;
  ``getMaxPhysicOffset`` (:297) is the phyOffset of the last valid unit (a record's *start*, -1 if none),
  and it counts in maxPhyOffsetOfConsumeQueue (ConsumeQueueStore.java:294-302), which picks the 5.x normal
  recovery window;
* when that max is >= processOffset, truncates them too (truncateDirtyLogicFiles :375-440): from the last
  file, a file whose first unit's phyOffset >= processOffset is deleted; in the file kept, units from the
  first valid one at or past processOffset are dropped; the max becomes the last kept unit's phyOffset, or
  processOffset - 1 when none is kept;
* appends the records of these topics that its recovery or reput dispatches.

rmqstore models the offsets these give (the recovery window, the reput start) and reports the rest; it never
writes these files. 4.9.8 has no BatchConsumeQueue and never reads the directory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow.fs as pafs

from storelib.broker.settings.strayload import LOAD_FAILS
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location
from storelib.format.configjson import TopicConfig, load_config, topic_configs

BCQ_UNIT_SIZE = 46
BCQ_DTYPE = np.dtype([("phy_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8"), ("store_time", ">i8"),
                      ("msg_base_offset", ">i8"), ("batch_size", ">i2"), ("compacted_offset", ">i4"),
                      ("reserved", ">i4")])
assert BCQ_DTYPE.itemsize == BCQ_UNIT_SIZE
DEFAULT_BCQ_FILE_SIZE = 300_000 * BCQ_UNIT_SIZE  # MessageStoreConfig.java:118
_LONG = re.compile(r"[+-]?\d+")  # Long.parseLong / Integer.parseInt's form (ASCII digits here)


@dataclass
class BatchQueue:
    """One BatchConsumeQueue directory after load and recover: its files (name, base, location; units read
    when needed), where the valid units end (file index, unit count), its max physical offset, and the files
    recover deletes."""

    topic: str
    queue_id: int
    path: str
    file_size: int
    files: list[tuple[str, int, Location]] = field(default_factory=list)
    end: tuple[int, int] = (0, 0)
    max_physic_offset: int = -1
    deleted_on_recover: list[str] = field(default_factory=list)
    _read: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def units_of(self, i: int) -> np.ndarray:
        """The units of file ``i`` (read once)."""
        if i not in self._read:
            self._read[i] = _read_units(self.files[i][2], self.file_size)
        return self._read[i]

    @property
    def units(self) -> int:
        """Valid units after recover: the files before the end's (whole) and the end file's valid ones."""
        i, k = self.end
        return i * (self.file_size // BCQ_UNIT_SIZE) + k if self.files else 0

    def recover(self) -> None:
        """BatchConsumeQueue.recover (:211-262): from the third-last file, while files are whole and valid."""
        if not self.files:
            return
        full = self.file_size // BCQ_UNIT_SIZE
        index = max(0, len(self.files) - 3)
        while True:
            u = self.units_of(index)
            k = 0
            while k < len(u) and _valid(u[k]):
                k += 1
            if k:
                self.max_physic_offset = int(u[k - 1]["phy_offset"])
            if k == full and full * BCQ_UNIT_SIZE == self.file_size and index + 1 < len(self.files):
                index += 1
                continue
            break
        self.end = (index, k)
        self.deleted_on_recover = [n for n, _, _ in self.files[index + 1:]]

    def truncate(self, phy: int) -> tuple[int, int, list[str]]:
        """truncateDirtyLogicFiles(``phy``) computed, not done: (its max physical offset after, units dropped,
        files deleted). The last file is re-read from its first unit, whose validity is not checked."""
        last = self.end[0] if self.files else -1
        max_phy, deleted, kept = phy - 1, [], 0
        while last >= 0:
            u = self.units_of(last)
            if len(u) == 0 or int(u[0]["phy_offset"]) >= phy:
                deleted.append(self.files[last][0])
                last -= 1
                continue
            k = 1
            while k < len(u) and _valid(u[k]) and int(u[k]["phy_offset"]) < phy:
                k += 1
            max_phy = int(u[k - 1]["phy_offset"])
            kept = last * (self.file_size // BCQ_UNIT_SIZE) + k
            break
        return max_phy, max(self.units - kept, 0), deleted


def _valid(u: np.void) -> bool:
    return int(u["phy_offset"]) >= 0 and int(u["size"]) > 0 and int(u["msg_base_offset"]) >= 0 \
        and int(u["batch_size"]) > 0


def _list(loc: Location) -> list[pafs.FileInfo]:
    try:
        return sorted(loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True)),
                      key=lambda i: i.base_name)
    except OSError as e:
        raise StoreError(loc.path, None, "io_error", f"cannot list: {e}") from None


def _read_units(loc: Location, size: int) -> np.ndarray:
    with loc.fs.open_input_file(loc.path) as f:
        raw = f.read_at(size - size % BCQ_UNIT_SIZE, 0)
    return np.frombuffer(raw, dtype=BCQ_DTYPE)


def queue_type(topics: Mapping[str, TopicConfig], topic: str) -> str:
    """QueueTypeUtils.getCQType: the exact ``queue.type`` attribute, SimpleCQ when absent."""
    tc = topics.get(topic)
    return (tc.attributes.get("queue.type") if tc is not None else None) or "SimpleCQ"


def store_topics(root: Location) -> dict[str, TopicConfig]:
    """The topic table the broker loads before its store (config/topics.json, or its .bak)."""
    return topic_configs(load_config(root, "topics.json").data)


def load_batch_queues(root: Location, file_size: int, topics: Mapping[str, TopicConfig],
                      findings: list[Finding], *, recover: bool = True) -> list[BatchQueue]:
    """Every ``batchconsumequeue/<topic>/<queueId>`` as 5.3.3 loads (and with ``recover``, recovers) it (module
    docstring); what fails the load becomes a ``broker_load_fails`` finding (the load stops at the first)."""
    out: list[BatchQueue] = []
    for t in _list(root.join("batchconsumequeue")):
        if t.type != pafs.FileType.Directory:
            continue
        for qd in _list(root.join("batchconsumequeue", t.base_name)):
            if qd.type != pafs.FileType.Directory or not _LONG.fullmatch(qd.base_name):
                continue  # ConsumeQueueStore.loadConsumeQueues: a name Integer.parseInt rejects is skipped
            rel = f"batchconsumequeue/{t.base_name}/{qd.base_name}"
            qt = queue_type(topics, t.base_name)
            if qt != "BatchCQ":
                findings.append(Finding(LOAD_FAILS, "critical", rel, None,
                                        f"topic {t.base_name!r} is {qt} in config/topics.json: 5.3.3's load throws "
                                        "(ConsumeQueueStore.queueTypeShouldBe) and the broker does not start"))
                return out
            q = _load_one(root.join("batchconsumequeue", t.base_name, qd.base_name), rel, t.base_name,
                          int(qd.base_name), file_size, findings)
            if q is None:
                return out
            if recover:
                q.recover()
            out.append(q)
    return out


def simple_queue_type_fails(topics: Mapping[str, TopicConfig], cq_topics: set[str]) -> list[Finding]:
    """``consumequeue/`` topics configured BatchCQ: queueTypeShouldBe fails 5.3.3's load on them too."""
    return [Finding(LOAD_FAILS, "critical", f"consumequeue/{t}", None,
                    f"topic {t!r} is BatchCQ in config/topics.json but has consumequeue/ files: 5.3.3's load throws "
                    "(ConsumeQueueStore.queueTypeShouldBe) and the broker does not start")
            for t in sorted(cq_topics) if queue_type(topics, t) == "BatchCQ"]


def _load_one(loc: Location, rel: str, topic: str, qid: int, S: int, findings: list[Finding]) -> BatchQueue | None:
    """MappedFileQueue.doLoad of one directory (None: the load fails)."""
    entries = [e for e in _list(loc) if e.type != pafs.FileType.Directory]
    q = BatchQueue(topic, qid, rel, S)
    for i, e in enumerate(entries):
        size = int(e.size or 0)
        if size == 0 and i == len(entries) - 1:
            continue  # deleted by doLoad
        if size != S:
            findings.append(Finding(LOAD_FAILS, "critical", f"{rel}/{e.base_name}", None,
                                    f"{size} bytes, mapperFileSizeBatchConsumeQueue is {S}: the load fails"))
            return None
        if not _LONG.fullmatch(e.base_name):
            findings.append(Finding(LOAD_FAILS, "critical", f"{rel}/{e.base_name}", None,
                                    "not a number: DefaultMappedFile's Long.parseLong throws, the load fails"))
            return None
        q.files.append((e.base_name, int(e.base_name), loc.join(e.base_name)))
    return q


def batch_typed_cq_topics(root: Location, topics: Mapping[str, TopicConfig]) -> set[str]:
    """The topics configured BatchCQ that have a ``consumequeue/<topic>/<queueId>`` directory (what
    loadConsumeQueues meets, :204-237): the only ones :func:`simple_queue_type_fails` can name, found without
    listing every consume-queue topic."""
    out = set()
    for t in topics:
        if queue_type(topics, t) == "BatchCQ" and any(
                q.type == pafs.FileType.Directory and _LONG.fullmatch(q.base_name)
                for q in _list(root.join("consumequeue", t))):
            out.add(t)
    return out


def batch_load_failures(root: Location, file_size: int | None, cq_topics: set[str] | None = None) -> list[Finding]:
    """What of ``batchconsumequeue/`` and the topics' queue types fails 5.3.3's load (no unit is read);
    ``cq_topics``: the consume-queue topics listed (None: :func:`batch_typed_cq_topics`)."""
    topics = store_topics(root)
    out = simple_queue_type_fails(topics, batch_typed_cq_topics(root, topics) if cq_topics is None else cq_topics)
    load_batch_queues(root, int(file_size or DEFAULT_BCQ_FILE_SIZE), topics, out, recover=False)
    return out
