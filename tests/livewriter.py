"""A broker-like writer PROCESS for the live-store tests and benchmarks (issue 27).

It writes a store the way a running RocketMQ broker does, in the broker's order (docs in
/work/notes/live.md, with the Java file:line each rule comes from):

* it holds ``lock`` (an exclusive POSIX record lock on byte 0, length 1: what the JVM's
  ``FileChannel.tryLock(0, 1, false)`` takes on Linux) and leaves ``abort`` (5.x: holding its pid);
* records are encoded by the project's :class:`StoreWriter` and copied into the segment one put at a
  time, whole (``byteBuffer.put(preEncodeBuffer)``), so a reader sees each record appear front to back;
  one record can be paused halfway through its copy (its first bytes there, the rest still zeros);
* the next segment is created ahead (AllocateMappedFileService), full size and sparse;
* a reput step every ``reput_ms`` dispatches what was put since: each record's ConsumeQueue unit is
  written in place into its queue's file, then its index keys (entry, slot, header, as
  ``IndexFile.putKey``), record after record in commitlog order; files are created full size, in place;
  with ``torn_ratio``, some units and entries are written in pieces (offset, size, tags code; hash,
  phy, timeDiff, prevIndex) with a pause between them, as a reader may see the broker's copy;
  the units and entries are the project's own builders' (``build_consume_queues``,
  ``build_index_files``), the bytes left on disk are checked against their images;
* ``checkpoint`` is rewritten in place every ``checkpoint_ms`` (physic = last put, logics = last
  dispatched, index = the end time of the last full index file);
* the cleaner, every ``clean_ms`` once more than ``keep_segments`` segments hold data, deletes the
  oldest segment (never one the reput has not passed: the broker's cleaners keep hours of data), then the
  consume-queue files and index files wholly below the new first offset;
* traffic: single sends, batches, delay levels, transactions (half, then commit or rollback later),
  on 5.x timer messages (the timer topic's record, a delivery re-put when due, and the timer store
  rewritten every ``timer_ms``).

Every record put is journaled (``journal.jsonl``: phy offset, size, topic, queue, queue offset, uniq
key), so tests can check that an export holds each exactly once. Run as
``python -m tests.livewriter CONFIG_JSON``; it prints ``ready`` once the lock is held and records are
on disk, and ``done`` when it stops (after ``seconds``, or on SIGTERM).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]


@dataclass
class LiveConfig:
    """What the writer does (JSON-serialisable: it crosses the process boundary)."""

    root: str
    version: str = "4"
    seconds: float = 4.0
    rate: int = 1200  # messages per second
    body_min: int = 100
    body_max: int = 6000
    body_dist: str = "log"  # "log" (log-uniform) or "uniform" between body_min and body_max
    segment_size: int = 1 << 20
    cq_units: int = 2000  # units per consume-queue file
    index_slots: int = 400
    index_num: int = 1600
    topics: int = 4
    queues: int = 4
    reput_ms: int = 100
    checkpoint_ms: int = 1000
    clean_ms: int = 6000
    keep_segments: int = 8  # the cleaner deletes the oldest segment once more than this many hold data
    batch_ratio: float = 0.04
    delay_ratio: float = 0.03
    tx_ratio: float = 0.03
    timer_ratio: float = 0.03  # 5.x only
    timer_ms: int = 2000
    timer_delays: tuple[int, ...] = (1, 2, 3)  # seconds (keep them under the retention the cleaner leaves)
    long_timers: bool = False  # also 1 h timers (pending past the run: lost when the cleaner is this fast)
    pause_at_s: float | None = None  # one record paused halfway through its copy, this long into the run
    pause_ms: int = 400
    torn_ratio: float = 0.0  # this share of ConsumeQueue units and index entries is written in pieces, with
    torn_ms: float = 5.0  # this pause between the pieces (a reader's pread sees the unit partly written)
    seed: int = 7
    exit_clean: bool = False  # on stop: dispatch everything, remove abort (a clean shutdown)
    extra: dict[str, Any] = field(default_factory=dict)
    # DLedger mode (tests/livewriter_dledger.py): entries in dledger-<id>/data, index units, checkpoint
    dledger: bool = False
    dledger_self_id: str = "n0"
    dledger_checkpoint_ms: int = 3000  # DLedger's checkPointInterval
    dledger_index_file_size: int = 32 * 2048  # units per index file x 32 (DLedger's own is 160 MiB)

    @property
    def journal(self) -> str:
        return os.path.join(os.path.dirname(self.root.rstrip("/")), os.path.basename(self.root.rstrip("/"))
                            + ".journal.jsonl")


def live_settings(cfg: LiveConfig):
    """The broker settings the writer uses (and a test passes the audit as overrides)."""
    from storelib.broker.settings.brokerconf import BrokerSettings

    return BrokerSettings.defaults(cfg.version).with_overrides(settings_overrides(cfg))


def settings_overrides(cfg: LiveConfig) -> dict[str, Any]:
    """broker.conf keys of the store's geometry (what ``--set`` would say)."""
    o: dict[str, Any] = {"mappedFileSizeCommitLog": cfg.segment_size,
                         "mappedFileSizeConsumeQueue": cfg.cq_units * 20,
                         "maxHashSlotNum": cfg.index_slots, "maxIndexNum": cfg.index_num}
    if cfg.version == "5":
        o["mappedFileSizeTimerLog"] = 52 * 2000
    if cfg.dledger:
        o.update(enableDLegerCommitLog=True, dLegerSelfId=cfg.dledger_self_id)
    return o


# --------------------------------------------------------------------------------------------------
# the writer process
# --------------------------------------------------------------------------------------------------


def _broker_like_writer():
    """StoreWriter with segments created as MappedFile.init does: the file opened (created empty) in place,
    then extended to full size by its mapping (sparse), no temp file."""
    from storelib.broker.writer.writer import StoreWriter

    class BrokerLikeWriter(StoreWriter):
        def _create_file(self, base: int) -> None:
            fd = os.open(self._segment_path(base), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if os.fstat(fd).st_size < self.segment_size:
                    os.ftruncate(fd, self.segment_size)
            finally:
                os.close(fd)

    return BrokerLikeWriter


class LiveBroker:
    """The broker's services on one thread: put, reput, checkpoint, cleaner, timers."""

    HEAD = 0  # bytes in front of each record (DLedger mode: its entry header)

    def __init__(self, cfg: LiveConfig):
        self.cfg = cfg
        self.settings = live_settings(cfg)
        self.rnd = random.Random(cfg.seed)
        self.np = np.random.default_rng(cfg.seed)
        self.pool = self.np.integers(0, 256, 1 << 16, dtype=np.uint8).tobytes()
        self.w = self._writer()
        self.S = self.w.segment_size
        self.cq_size = cfg.cq_units * 20
        self.reput_at = self.w.write_offset
        self.qstate: dict = {}
        self.istate = None
        self.index_full_ts = 0
        self.logics_ts = 0
        self.halves: list = []
        self.timers: list[tuple[int, Any, int]] = []  # (deliver ms, message, store ms)
        self.timer_rows: pa.Table | None = None  # every timer the timer store has enqueued
        self.paused = False
        self.stop = False
        self.journal = open(cfg.journal, "a", encoding="utf-8")
        self.fds: dict[str, int] = {}
        self.topics = [f"LiveTopic{i}" for i in range(cfg.topics)]
        self.counts = {"messages": 0, "records": 0, "deleted_segments": 0}

    def _writer(self):
        return _broker_like_writer()(self.cfg.root, self.settings, version=self.cfg.version, preallocate=True)

    # -- puts -------------------------------------------------------------------------------------
    def _message(self, topic: str | None = None, qid: int | None = None, **props: str):
        from storelib.format.record import Message

        r = self.rnd
        if self.cfg.body_dist == "uniform":
            n = r.randint(self.cfg.body_min, self.cfg.body_max)
        else:  # log-uniform: mostly small bodies, some large
            n = int(np.exp(r.uniform(np.log(self.cfg.body_min), np.log(self.cfg.body_max))))
        off = r.randrange(0, len(self.pool) - n)
        i = self.counts["messages"]
        p = {"KEYS": f"ORD{r.randrange(10**6):06d} USR{r.randrange(10**5)}", "TAGS": r.choice(["a", "b", "c"]),
             "UNIQ_KEY": f"AC11000{os.getpid() % 10}{i:024X}"[:32], "WAIT": "true", **props}
        self.counts["messages"] += 1
        return Message(topic=topic or r.choice(self.topics), queue_id=r.randrange(self.cfg.queues) if qid is None else qid,
                       body=self.pool[off:off + n], born_timestamp=int(time.time() * 1000),
                       born_host=f"10.0.{r.randrange(4)}.{r.randrange(1, 250)}:{r.randrange(30000, 60000)}",
                       properties=p)

    def _op(self) -> list:
        """One producer operation (its AppendResults)."""
        c, r = self.cfg, self.rnd.random()
        w = self.w
        if c.version == "5" and r < c.timer_ratio:
            return [self._timer_put()]
        r -= c.timer_ratio if c.version == "5" else 0
        if r < c.batch_ratio:
            topic, qid = self.rnd.choice(self.topics), self.rnd.randrange(c.queues)
            return w.append_batch([self._message(topic, qid) for _ in range(self.rnd.randint(2, 8))])
        r -= c.batch_ratio
        if r < c.delay_ratio:
            return [w.append(self._message(DELAY=str(self.rnd.randint(1, 6))))]
        r -= c.delay_ratio
        if r < c.tx_ratio:
            half = w.prepare(self._message(), "live_tx_group")
            self.halves.append((time.monotonic() + self.rnd.uniform(0.05, 0.5), half))
            return [half]
        return [w.append(self._message())]

    def _timer_put(self):
        from storelib.format.record import Message
        from storelib.format.timerstore import TIMER_TOPIC
        from storelib.generator.timergen import deliver_ms

        m = self._message()
        now = int(time.time() * 1000)
        delay = self.rnd.choice(list(self.cfg.timer_delays) + ([3600] if self.cfg.long_timers else []))
        out = deliver_ms(now, delay, 1000)
        props = dict(m.properties, TIMER_DELAY_SEC=str(delay), TIMER_OUT_MS=str(out), REAL_TOPIC=m.topic,
                     REAL_QID=str(m.queue_id))
        tm = Message(topic=TIMER_TOPIC, queue_id=0, body=m.body, born_timestamp=m.born_timestamp,
                     born_host=m.born_host, properties=props)
        res = self.w.append(tm)
        self.timers.append((out, tm, res.store_timestamp))
        return res

    def _due(self) -> list:
        """Transactions resolved and timers delivered whose time has come."""
        from storelib.format.record import Message

        out = []
        now = time.monotonic()
        keep = []
        for at, half in self.halves:
            if at > now:
                keep.append((at, half))
            elif self.rnd.random() < 0.7:
                out += list(self.w.commit(half))
            else:
                out.append(self.w.rollback(half))
        self.halves = keep
        now_ms = int(time.time() * 1000)
        later = []
        for d, m, t in self.timers:
            if d > now_ms:
                later.append((d, m, t))
                continue
            props = dict(m.properties, TIMER_ENQUEUE_MS=str(t // 1000 * 1000), TIMER_DEQUEUE_MS=str(now_ms))
            out.append(self.w.append(Message(topic=props["REAL_TOPIC"], queue_id=int(props["REAL_QID"]), body=m.body,
                                             born_timestamp=m.born_timestamp, born_host=m.born_host,
                                             properties=props)))
        self.timers = later
        return out

    def _publish(self, results: list) -> None:
        """The put's bytes into the segment (the broker's copy into the mapped file), then the journal."""
        w = self.w
        if self.cfg.pause_at_s is not None and not self.paused and self._elapsed() >= self.cfg.pause_at_s \
                and len(results) == 1 and len(w._buf) == results[0].size + self.HEAD:
            self.paused = True
            half = len(w._buf) // 2
            os.pwrite(w._fd, bytes(w._buf[:half]), w._buf_pos)  # TOTALSIZE, MAGIC, ... half the record
            print(f"paused {results[0].phy_offset} {results[0].size}", flush=True)
            time.sleep(self.cfg.pause_ms / 1000)
        w.flush()
        for r in results:
            self.journal.write(json.dumps({"phy": r.phy_offset, "size": r.size, "topic": r.topic, "qid": r.queue_id,
                                           "qoff": r.queue_offset, "tx": r.tran_type, "ts": r.store_timestamp}) + "\n")
        self.counts["records"] += len(results)

    # -- reput: consume queues and index, record by record --------------------------------------------
    def _fd(self, path: str, size: int) -> int:
        fd = self.fds.get(path)
        if fd is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # the broker's map of a new file: full size, sparse
            self.fds[path] = fd
        return fd

    def _drop_fd(self, path: str) -> None:
        fd = self.fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def _dispatched_records(self) -> pa.Table | None:
        from storelib.broker.dispatch.dispatch import DISPATCH_COLUMNS
        from storelib.fileio.bytesource import LocalSource
        from storelib.scan.commitlog import offset_to_file_name
        from storelib.scan.scanner import SegmentScan

        end = self._reput_end()
        pos = self.reput_at
        batches = []
        while pos < end:
            base = pos - pos % self.S
            path = os.path.join(self.w._log_dir(), offset_to_file_name(base))
            with LocalSource(path) as src:
                stop = end - base if end < base + self.S else None
                scan = SegmentScan(src, path, base, pos - base, stop, verify_crc=False, with_properties=False,
                                   columns=DISPATCH_COLUMNS, dledger=self.w.dl is not None)
                batches += [b for b in scan if b.num_rows]
                e = scan.end
            if e.kind == "blank":
                pos = base + self.S
            else:
                pos = e.phy_offset
                break
        self.reput_at = max(pos, self.reput_at)
        if not batches:
            return None
        return pa.Table.from_batches(batches).combine_chunks()

    def _reput_end(self) -> int:
        """Where the reput may read to: everything put (DLedger mode: the committed position)."""
        return self.w.write_offset

    def reput(self) -> None:
        """ReputMessageService.doReput over what was put since the last call."""
        from storelib.broker.dispatch.cqwriter import build_consume_queues
        from storelib.broker.index.indexbuild import index_key_rows

        t = self._dispatched_records()
        if t is None:
            return
        images = build_consume_queues(t, segment_size=self.cq_size, state=self.qstate)
        writes = []  # (row, logical byte offset, path, bytes): one unit each
        for (topic, qid), img in images.items():
            real = {int(s): int(r) for r, s in zip(img.rows.tolist(), img.slots.tolist()) if s >= 0}
            raw = np.ascontiguousarray(img.entries).tobytes()
            nxt = max(real.values(), default=0)
            for i in range(len(img.entries) - 1, -1, -1):  # fillers go with the unit after them
                off = img.start + 20 * i
                nxt = real.get(off // 20, nxt)
                base = off - off % self.cq_size
                path = os.path.join(self.cfg.root, "consumequeue", topic, str(qid), f"{base:020d}")
                writes.append((nxt, off, path, raw[20 * i:20 * i + 20]))
            self.qstate[(topic, qid)] = img.state
        writes.sort(key=lambda x: (x[0], x[1]))
        keys = index_key_rows(t)
        puts = self._index_puts(keys)
        ts = np.asarray(t.column("store_timestamp"))
        per_row_keys = np.diff(np.searchsorted(keys["row_index"], np.arange(t.num_rows + 1)))
        wi = 0
        for row in range(t.num_rows):  # CommitLogDispatcherBuildConsumeQueue, then ...BuildIndex, per record
            while wi < len(writes) and writes[wi][0] == row:
                _, off, path, unit = writes[wi]
                # offset, size, tags code: the 20-byte copy a reader may see partly done
                self._pieces(self._fd(path, self.cq_size), unit, off % self.cq_size, (8, 12))
                wi += 1
            for _ in range(int(per_row_keys[row])):
                next(puts)
            self.logics_ts = int(ts[row])
        assert wi == len(writes), "consume-queue units left unwritten"
        for _ in puts:  # the builder's images checked against what is on disk
            raise AssertionError("index keys left unwritten")

    def _index_puts(self, rows: dict[str, np.ndarray]):
        """IndexService.buildIndex: IndexFile.putKey for each key in turn (entry, slot, header), one per
        ``next``; the project's builder gives the entries, and the bytes left on disk are checked against it."""
        from storelib.broker.index.indexbuild import build_index_files
        from storelib.format.indexfile import IndexGeometry, IndexHeader

        g = IndexGeometry(self.cfg.index_slots, self.cfg.index_num)
        images = build_index_files(rows, geometry=g, prev_state=self.istate, emit_empty=False) if len(
            rows["key_hash"]) else []
        k = 0
        for img in images:
            cont = self.istate is not None and img.name == self.istate.name
            c0 = self.istate.entry_count if cont else 0
            if not cont and self.istate is not None:  # the full file is flushed: its end time to the checkpoint
                self.index_full_ts = self.istate.header.end_timestamp
                self._drop_fd(os.path.join(self.cfg.root, "index", self.istate.name))
            path = os.path.join(self.cfg.root, "index", img.name)
            fd = self._fd(path, g.file_size)
            hsc = self.istate.header.hash_slot_count if cont else 0
            for j in range(c0, len(img.entries)):
                e = img.entries[j:j + 1]
                n = j + 1
                self._pieces(fd, e.tobytes(), g.entry_pos(n), (4, 12, 16))  # hash, phy, timeDiff, prevIndex
                os.pwrite(fd, int(n).to_bytes(4, "big"), g.slot_pos(int(e["key_hash"][0]) % g.hash_slot_num))
                hsc += int(e["prev_index"][0] == 0)
                h = IndexHeader(img.header.begin_timestamp, int(rows["store_timestamp"][k]),
                                img.header.begin_phy_offset, int(e["phy_offset"][0]), hsc, n + 1)
                os.pwrite(fd, h.to_bytes(), 0)
                k += 1
                yield
            assert os.pread(fd, 40, 0) == img.header.to_bytes(), "index header differs from the builder's"
            self.istate = img.state()

    def _pieces(self, fd: int, data: bytes, pos: int, cuts: tuple[int, ...]) -> None:
        """``data`` written at ``pos``: whole, or (``torn_ratio`` of the time) in pieces split at ``cuts`` with
        ``torn_ms`` between them, front to back as the broker's copy goes."""
        if self.cfg.torn_ratio <= 0 or self.rnd.random() >= self.cfg.torn_ratio:
            os.pwrite(fd, data, pos)
            return
        edges = [0, *cuts, len(data)]
        for a, b in zip(edges, edges[1:]):
            os.pwrite(fd, data[a:b], pos + a)
            time.sleep(self.cfg.torn_ms / 1000)
        self.counts["torn"] = self.counts.get("torn", 0) + 1

    # -- checkpoint, cleaner, timer store -----------------------------------------------------------
    def checkpoint(self) -> None:
        """StoreCheckpoint.flush: the mapped page's fields written in place."""
        from storelib.format.checkpoint import Checkpoint

        cp = Checkpoint(self.w.last_store_timestamp, self.logics_ts, self.index_full_ts)
        fd = self._fd(os.path.join(self.cfg.root, "checkpoint"), 4096)
        os.pwrite(fd, cp.to_bytes()[:40], 0)

    def clean(self) -> None:
        """CleanCommitLogService + CleanConsumeQueueService: the oldest segment, then what lies below it."""
        from storelib.format.indexdir import list_index_files

        seg_dir = self.w._log_dir()
        names = sorted(n for n in os.listdir(seg_dir) if n.isdigit())
        data = [n for n in names if int(n) < self.w.write_offset]
        # the broker's cleaners go by age (fileReservedTime 72 h, MessageStoreConfig.java:87 4.9.8; DLedger's
        # fileReservedHours, at least 1 h, DLedgerMmapFileStore.java:704-708 0.3.1.2): a reput never trails
        # that far, so a segment holding records the reput has not dispatched yet is never the one deleted
        if len(data) <= self.cfg.keep_segments or int(data[1]) > self.reput_at:
            return
        os.unlink(os.path.join(seg_dir, data[0]))  # MappedFile.destroy: file.delete()
        self.counts["deleted_segments"] += 1
        min_off = int(data[1])
        cq_root = os.path.join(self.cfg.root, "consumequeue")
        for topic in sorted(os.listdir(cq_root)):
            for q in sorted(os.listdir(os.path.join(cq_root, topic))):
                qdir = os.path.join(cq_root, topic, q)
                files = sorted(os.listdir(qdir))
                for f in files[:-1]:  # deleteExpiredFileByOffset: the last unit of a file below minOffset
                    path = os.path.join(qdir, f)
                    with open(path, "rb") as fh:
                        fh.seek(self.cq_size - 20)
                        last = int.from_bytes(fh.read(8), "big", signed=True)
                    if last >= min_off:
                        break
                    self._drop_fd(path)
                    os.unlink(path)
        refs = list_index_files(self.cfg.root)
        for ref in refs[:-1]:  # IndexService.deleteExpiredFile: endPhyOffset < minOffset
            with open(ref.loc.path, "rb") as fh:
                from storelib.format.indexfile import IndexHeader

                h = IndexHeader.from_bytes(fh.read(40), ref.name)
            if h.end_phy_offset >= min_off:
                break
            self._drop_fd(ref.loc.path)
            os.unlink(ref.loc.path)

    def timer_store(self) -> None:
        """The 5.x timer store as the timer threads leave it now (timerlog, wheel, timercheck)."""
        import pyarrow.compute as pc

        from storelib.broker.settings.store import Store
        from storelib.broker.timer.timermsg import store_timers
        from storelib.broker.timer.timerrebuild import enqueue_units, rebuilt_checkpoint
        from storelib.fileio.bytesource import resolve
        from storelib.format.timerstore import TimerCheckpoint, timerlog_file_size, write_timer_store

        now = int(time.time() * 1000)
        timers = store_timers(Store(resolve(self.cfg.root), self.settings)).drop_columns(["state"])
        # the timerlog only grows (its own cleaner deletes whole files, rarely): timers whose records the
        # commitlog's cleaner took keep their units
        if self.timer_rows is not None:
            seen = pc.is_in(self.timer_rows.column("timer_phy_offset"), value_set=timers.column("timer_phy_offset"))
            gone = self.timer_rows.filter(pc.invert(seen))
            timers = pa.concat_tables([gone, timers]).sort_by("timer_phy_offset")
        self.timer_rows = timers
        size = timerlog_file_size(self.settings)
        units, slots = enqueue_units(timers, size, 1000, self.settings.timer_roll_window_slot)
        n = timers.num_rows
        cp = rebuilt_checkpoint(TimerCheckpoint(now // 1000 * 1000, 0, n, n, 0, now, n), units, size)
        write_timer_store(self.cfg.root, units, slots, cp, file_size=size, precision_ms=1000)

    # -- the loop -----------------------------------------------------------------------------------
    def _elapsed(self) -> float:
        return time.monotonic() - self.t0

    def run(self) -> None:
        c = self.cfg
        self.t0 = time.monotonic()
        self._publish([self.w.append(self._message())])
        self.reput()
        self.checkpoint()
        print("ready", flush=True)
        ticks = {"reput": (c.reput_ms, self.reput), "checkpoint": (c.checkpoint_ms, self.checkpoint),
                 "clean": (c.clean_ms, self.clean)}
        if c.version == "5" and c.timer_ratio > 0:
            ticks["timers"] = (c.timer_ms, self.timer_store)
        due = {k: self.t0 + ms / 1000 for k, (ms, _) in ticks.items()}
        while not self.stop and self._elapsed() < c.seconds:
            want = int(self._elapsed() * c.rate)
            while self.counts["messages"] < want and not self.stop:
                self._publish(self._op())
                done = self._due()
                if done:
                    self._publish(done)
                if time.monotonic() >= min(due.values()):
                    break
            now = time.monotonic()
            for k, (ms, fn) in ticks.items():
                if now >= due[k]:
                    fn()
                    due[k] = now + ms / 1000
            time.sleep(0.002)
        self.shutdown()

    def shutdown(self) -> None:
        self.reput()
        self.checkpoint()
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        self.journal.close()
        if self.cfg.exit_clean:
            self.w.close(clean=True, dispatch=False)
        else:  # the process ends: the kernel releases the lock, abort stays (as after a kill)
            self.w.flush()
        print(json.dumps({"done": self.counts, "write_offset": self.w.write_offset}), flush=True)


def main(argv: list[str]) -> int:
    from jobs.engines.nopandas import hide_pandas

    hide_pandas()  # the writer never uses it (pyarrow would import it on a first array: seconds of CPU)
    cfg = LiveConfig(**json.loads(argv[0]))
    if cfg.dledger:  # the DLedger writer mode (tests/livewriter_dledger.py)
        from tests.livewriter_dledger import DLedgerLiveBroker

        broker = DLedgerLiveBroker(cfg)
    else:
        broker = LiveBroker(cfg)

    def _stop(*_: object) -> None:
        broker.stop = True

    signal.signal(signal.SIGTERM, _stop)
    broker.run()
    return 0


# --------------------------------------------------------------------------------------------------
# the test side
# --------------------------------------------------------------------------------------------------


class LiveWriter:
    """A running writer process (context manager): started, waited for ``ready``, stopped and reaped."""

    def __init__(self, cfg: LiveConfig):
        self.cfg = cfg
        self.proc: subprocess.Popen | None = None
        self.summary: dict | None = None
        self.lines: list[str] = []

    def __enter__(self) -> LiveWriter:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.livewriter", json.dumps(asdict(self.cfg))],
                                     cwd=str(REPO), env=env, stdout=subprocess.PIPE, text=True)
        self.t0 = time.monotonic()
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"live writer did not start: {line!r}")
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> dict:
        """Wait for the writer to finish its run; its summary (counts, write offset)."""
        out, _ = self.proc.communicate(timeout=timeout)
        self.lines += out.splitlines()
        for line in self.lines:
            if line.startswith("{"):
                self.summary = json.loads(line)
        return self.summary or {}

    def stop(self) -> dict:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout=60)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.stop()
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def journal(cfg: LiveConfig) -> list[dict]:
    """Every record the writer put, in order."""
    with open(cfg.journal, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def exports_while_writing(cfg: LiveConfig, snap: str) -> list[dict]:
    """``export --incremental`` into ``snap`` in a loop while the writer writes, then once more after it
    stopped: each run's manifest."""
    from jobs.export import ExportConfig, export

    ex = ExportConfig(store=cfg.root, out=snap, overrides=settings_overrides(cfg), engine="local", incremental=True,
                      progress=False)
    runs = []
    with LiveWriter(cfg) as w:
        while w.running():
            runs.append(export(ex))
        w.wait()
    runs.append(export(ex))  # the rest, once the writer stopped
    return runs


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
