"""Saving what only one replica holds, and what a rejoin would cut from it, before anything changes.

Per store and per set (``only_here``: messages no other given store holds; ``dropped``: what the rejoin
cut drops), any of: a new store in the broker's format (``store/``: each message put again through
:class:`storelib.broker.writer.StoreWriter`, as the broker stores a message sent to it: its own offsets,
ConsumeQueue and IndexFile, the original store times, a delayed message back in SCHEDULE_TOPIC_XXXX), and
``messages.jsonl`` / ``messages.parquet`` (every column, the body, the original offsets). The inputs are only
read; each output appears complete or not at all (temp file or staging directory, then a rename).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from storelib.broker.replicas.group import GroupComparison
from storelib.errors import StoreError
from storelib.fileio.smallfile_io import atomic_write_json
from storelib.format.properties import REAL_QID, REAL_TOPIC
from storelib.format.record import SCHEDULE_TOPIC, Message
from storelib.scan.scanner import SegmentScan

FORMATS = ("store", "jsonl", "parquet")
SETS = ("only_here", "dropped")


def _ranges(g: GroupComparison, i: int, which: str) -> list[tuple[int, int]]:
    ivs = g.intervals(i)
    pick = [iv for iv in ivs if (not iv["holders"] if which == "only_here" else iv["dropped"])]
    return [(iv["lo"], iv["hi"]) for iv in pick]


def _batches(g: GroupComparison, i: int, ranges: list[tuple[int, int]]) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Every record of store ``i`` starting in the ranges, with body and properties, in commitlog order."""
    store = g.store(i)
    S, h = store.commitlog.segment_size, g.head
    opts = store.commitlog.scan_options()
    for lo, hi in ranges:  # offsets as ConsumeQueue counts them; a DLedger entry starts 48 bytes before
        for seg in store.commitlog.segments:
            a, b = max(lo - h, seg.base), min(hi - h, seg.base + S)
            if a >= b or seg.file_size == 0:
                continue
            with seg.open() as src:
                scan = SegmentScan(src, seg.display, seg.base, a - seg.base, b - seg.base, verify_crc=True,
                                   with_body=True, delay_levels_ms=list(store.delay_levels_ms), **opts)
                for batch in scan:
                    if batch.num_rows:
                        yield seg.name, batch


def resend_message(row: dict[str, Any]) -> Message:
    """The message as its producer sent it: a delayed one back to its real topic and queue (the writer puts
    it in SCHEDULE_TOPIC_XXXX again, as the broker does), everything else as stored."""
    props = dict(row["properties"] or [])
    topic, qid, raw = row["topic"], row["queue_id"], row["properties_raw"]
    if topic == SCHEDULE_TOPIC and REAL_TOPIC in props:
        topic = props.pop(REAL_TOPIC)
        q = props.pop(REAL_QID, "")
        qid = int(q) if q.lstrip("-").isdigit() else qid
        raw = None
    return Message(topic=topic, body=row["body"] or b"", queue_id=qid, flag=row["flag"], sys_flag=row["sys_flag"],
                   born_timestamp=row["born_timestamp"], born_host=row["born_host"],
                   reconsume_times=row["reconsume_times"], prepared_transaction_offset=row["prepared_transaction_offset"],
                   properties=props, properties_raw=raw)


class _Sinks:
    """The open outputs of one (store, set): a StoreWriter, a JSONL file, a Parquet writer (each optional)."""

    def __init__(self, out: str, formats: tuple[str, ...], settings, version: str):
        import pyarrow.parquet as pq

        from storelib.scan.messagecols import output_schema

        self.out, self.formats, self.settings, self.version = out, formats, settings, version
        self.stage = out + ".tmp"
        shutil.rmtree(self.stage, ignore_errors=True)
        os.makedirs(self.stage)
        self.schema = output_schema(with_body=True)
        self.pq = pq.ParquetWriter(os.path.join(self.stage, "messages.parquet"), self.schema) if "parquet" in formats else None
        self.jsonl = open(os.path.join(self.stage, "messages.jsonl"), "w", encoding="utf-8") if "jsonl" in formats else None
        self.writer = None
        self.times: collections.deque[int] = collections.deque()
        self.messages = 0
        self.skipped = 0

    def add(self, seg_name: str, batch: pa.RecordBatch) -> None:
        from storelib.scan.messagecols import message_batch, row_to_json

        self.messages += batch.num_rows
        if self.pq is not None:
            self.pq.write_batch(message_batch(batch, self.schema, seg_name))
        rows = batch.to_pylist() if (self.jsonl is not None or "store" in self.formats) else []
        if self.jsonl is not None:
            for r in rows:
                self.jsonl.write(json.dumps(row_to_json(r, with_body=True), ensure_ascii=False, default=str) + "\n")
        if "store" in self.formats:
            self._put(rows)

    def _put(self, rows: list[dict[str, Any]]) -> None:
        from storelib.broker.writer.writer import StoreWriter

        for r in rows:
            if r.get("crc_ok") is False:  # a body that fails its CRC is not put again (JSONL/Parquet keep it)
                self.skipped += 1
                continue
            if self.writer is None:
                self.writer = StoreWriter(os.path.join(self.stage, "store"), self.settings, version=self.version,
                                          clock=self.times.popleft, store_host=r["store_host"])
            self.times.append(r["store_timestamp"])
            self.writer.append(resend_message(r))

    def close(self) -> None:
        if self.pq is not None:
            self.pq.close()
        if self.jsonl is not None:
            self.jsonl.close()
        if self.writer is not None:
            self.writer.close()
        if os.path.exists(self.out):
            shutil.rmtree(self.out)
        os.replace(self.stage, self.out)

    def abort(self) -> None:
        for h in (self.pq, self.jsonl):
            if h is not None:
                h.close()
        if self.writer is not None:
            self.writer.close(clean=False)
        shutil.rmtree(self.stage, ignore_errors=True)


def _check_out(out: str, g: GroupComparison) -> None:
    for f in g.facts:
        root = os.path.abspath(f.uri) if "://" not in f.uri else None
        if root and (out == root or out.startswith(root.rstrip("/") + "/")):
            raise StoreError(out, None, "bad_argument", f"the salvage directory lies inside the store {f.uri}")


def salvage(g: GroupComparison, out_dir: str | os.PathLike, formats: tuple[str, ...] = FORMATS,
            sets: tuple[str, ...] = SETS) -> dict[str, Any]:
    """Write each store's ``sets`` in ``formats`` under ``out_dir/<store name>/<set>/``; returns (and writes as
    ``salvage.json``) what went where. Stores with nothing in a set get no directory for it."""
    if "://" in os.fspath(out_dir):
        raise StoreError(os.fspath(out_dir), None, "bad_argument", "salvage writes to a local directory")
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise StoreError(None, None, "bad_argument", f"unknown salvage format {bad[0]!r} (choose from {FORMATS})")
    out = os.path.abspath(os.fspath(out_dir))
    _check_out(out, g)
    report: dict[str, Any] = {"schema": "rmqstore.replicas.salvage/1", "stores": []}
    for i, f in enumerate(g.facts):
        entry: dict[str, Any] = {"name": f.name, "uri": f.uri}
        for which in sets:
            ranges = _ranges(g, i, which) if which == "only_here" or g.cuts[i] is not None else []
            if not ranges:
                continue
            path = os.path.join(out, _safe(f.name), which)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            settings = g.specs[i].settings  # the new store is a default-layout one, whatever the source's
            if getattr(settings, "dledger", None) is not None:
                settings = dataclasses.replace(settings, dledger=None, enable_dleger_commit_log=False)
            sinks = _Sinks(path, formats, settings, settings.version[0])
            try:
                for seg_name, batch in _batches(g, i, ranges):
                    sinks.add(seg_name, batch)
            except BaseException:
                sinks.abort()
                raise
            sinks.close()
            entry[which] = {"dir": path, "messages": sinks.messages, "not_put_again_crc": sinks.skipped,
                            "ranges": [list(r) for r in ranges],
                            "files": sorted(os.listdir(path))}
        report["stores"].append(entry)
    os.makedirs(out, exist_ok=True)
    atomic_write_json(os.path.join(out, "salvage.json"), report)
    return report


def _safe(name: str) -> str:
    """A store's name as one directory name."""
    s = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".")
    return s[:100] or "store"


__all__ = ["FORMATS", "SETS", "resend_message", "salvage"]
