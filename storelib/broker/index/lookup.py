"""Lookups the broker answers for clients: by queue position and by key (store-algorithms §10).

Unlike the broker, a key lookup has no 64-result cap, and every index hash hit is confirmed against
the commitlog record (same topic, the key is its UNIQ_KEY or one of its KEYS tokens, store time in
range), so hash collisions never produce false positives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from storelib.broker.settings.cqload import LoadedQueue, min_variant
from storelib.errors import Finding, StoreError
from storelib.format.consumequeue import CQ_UNIT_SIZE
from storelib.format.javahash import index_hash
from storelib.format.properties import split_keys
from storelib.format.topicname import safe_topic_dirname

if TYPE_CHECKING:
    from storelib.broker.settings.store import Store

LONG_MAX = 2**63 - 1


def consume_queue(store: Store, topic: str, queue_id: int) -> LoadedQueue:
    """The ConsumeQueue of (topic, queue_id) with the store's CQ segment size; the name is validated."""
    loc = store.path("consumequeue", safe_topic_dirname(topic), str(int(queue_id)))
    return LoadedQueue(loc, segment_size=store.settings.mapped_file_size_consume_queue, topic=topic,
                       queue_id=queue_id, phy_limit=store.cq_limit)


def lookup_queue(store: Store, topic: str, queue_id: int, queue_offset: int) -> int:
    """Physical offset of entry ``queue_offset`` of a queue, with the broker's range checks (§10.2)."""
    cq = consume_queue(store, topic, queue_id)
    where = f"consumequeue/{topic}/{queue_id}"
    try:
        if not cq.segments:
            raise StoreError(where, None, "no_queue", "no ConsumeQueue files for this queue")
        lo = cq.min_offset(store.min_offset, variant=min_variant(store.settings.version))
        hi = cq.max_offset()
        if not lo <= queue_offset < hi:
            raise StoreError(where, queue_offset * CQ_UNIT_SIZE, "offset_out_of_range",
                             f"queue offset {queue_offset} outside [{lo}, {hi})")
        if queue_offset < 0 and queue_offset * CQ_UNIT_SIZE % cq.segment_size:  # in a file with a negative name
            raise StoreError(where, queue_offset * CQ_UNIT_SIZE, "offset_found_null",
                             "getIndexBuffer (4.9.8 ConsumeQueue.java:544-554, 5.3.3 :864-874) reads the file at "
                             "(int) (offset % mappedFileSize), negative here (Java's remainder): the broker finds "
                             "no entry; of a file with a negative name it serves the first unit only")
        e = cq.entry(queue_offset)
        if e is None:
            raise StoreError(where, queue_offset * CQ_UNIT_SIZE, "offset_found_null", "no CQ file holds this entry")
        phy, size, _tags = e
        if phy < 0 or size <= 0 or size == 0x7FFFFFFF:
            raise StoreError(where, queue_offset * CQ_UNIT_SIZE, "filler_entry",
                             f"entry {queue_offset} is a filler or invalid (phy {phy}, size {size})")
        return phy
    finally:
        if cq.vanished:  # a live store's cleaner deleted them after the listing: said once
            store.findings.append(Finding("expired_during_run", "info", where, None,
                                          f"{len(cq.vanished)} file(s) deleted by the broker's cleaner after this "
                                          f"run listed them (first: {cq.vanished[0]}): they expired during the run"))
        cq.close()


def key_candidates(store: Store, topic: str, key: str, begin_ms: int = 0, end_ms: int = LONG_MAX) -> list[int]:
    """Physical offsets whose index entries hash like ``topic#key`` (unconfirmed), ascending, unique, from the
    index files IndexService.load keeps (queryOffset walks that list); what the load does with the entries the
    reader skips is said in ``store.findings`` (:func:`storelib.broker.settings.storeloads.broker_index_refs`)."""
    h = index_hash(f"{topic}#{key}")
    geom = store.settings.index_geometry
    found: set[int] = set()
    said: list[Finding] = []
    refs = store.loaded_index_files(said)
    store.findings.extend(said)
    for ref in reversed(refs):
        f = ref.open(geom, strict=False, broker_size=True)
        try:
            found.update(f.query_hash(h, begin_ms, end_ms))
            if f.header.begin_timestamp < begin_ms:
                break
        finally:
            f.close()
    return sorted(found)


def lookup_key(store: Store, topic: str, key: str, begin_ms: int = 0, end_ms: int = LONG_MAX, *,
               with_body: bool = False, margin_ms: int = 3000) -> list[dict[str, Any]]:
    """Every message of ``topic`` whose UNIQ_KEY or a KEYS token equals ``key``, confirmed, ascending.

    The index's time filter has whole-second precision, so it is widened by ``margin_ms`` and the
    decoded STORETIMESTAMP is then filtered exactly.
    """
    lo = max(0, begin_ms - margin_ms)
    hi = end_ms + margin_ms if end_ms < LONG_MAX - margin_ms else LONG_MAX
    rows = []
    for phy in key_candidates(store, topic, key, lo, hi):
        try:
            row = store.record_at(phy, with_body=with_body, delay_levels_ms=store.delay_levels_ms).to_pylist()[0]
        except StoreError:
            continue  # data expired or corrupt: the broker skips it too
        if row["topic"] != topic or not begin_ms <= row["store_timestamp"] <= end_ms:
            continue
        if row["uniq_key"] == key or key in split_keys(row["keys"]):
            rows.append(row)
    return rows
