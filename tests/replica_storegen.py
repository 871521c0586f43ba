"""Replica groups made the broker's way, for the replica tests.

* A master is a generated store (storelib.generator: the broker's record layout, dispatch, config/).
* A classic-HA slave is a byte copy of the master's commitlog at the same offsets (HAConnection sends file
  bytes, HAClient.appendToCommitLog writes them at the slave's write position), from the start of the file
  the master was writing when the slave first connected (or from 0), up to where it stopped; its own reput
  then builds its ConsumeQueue (here: StoreWriter's dispatch on close). HA chunks are not record-aligned, so
  a slave may end inside a record (``partial``).
* After a failover the slave is master and appends its own messages (StoreWriter continues the commitlog
  where the copy ends), and the old master may have appended more of its own too.
* Controller mode: the epoch files the broker writes: the first master's ``1-0``; a slave appends the
  master's epochs as it receives them; a store made master in epoch e appends ``e-<its max offset>``.

Every expected answer in the tests is computed from these stores with the plain commitlog scan, not with
the code under test.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.writer.writer import StoreWriter
from storelib.format.record import Message
from storelib.generator.gen import generate
from storelib.generator.genplan import GenConfig
from storelib.scan.commitlog import CommitLog

SEGMENT = 256 << 10


def settings(version: str = "5") -> BrokerSettings:
    return dataclasses.replace(BrokerSettings.defaults(version), mapped_file_size_commit_log=SEGMENT,
                               max_hash_slot_num=4096, max_index_num=16384,
                               mapped_file_size_consume_queue_config=20 * 2000)


def master(root: Path, messages: int, *, version: str = "5", seed: int = 1) -> Path:
    generate(root, GenConfig(messages=messages, version=version, seed=seed, tx_ratio=0.0, delay_ratio=0.02),
             settings(version))
    return root


def records(root: Path, columns: tuple[str, ...] = ("phy_offset", "size", "topic", "queue_id", "queue_offset",
                                                   "tran_type")) -> pa.Table:
    """Every record of a store's commitlog (the tests' reference view)."""
    cl = CommitLog(str(root / "commitlog"), SEGMENT)
    batches = list(cl.scan(columns=list(columns), with_properties=False, verify_crc=False, with_body="body" in columns))
    return pa.Table.from_batches(batches) if batches else None


def offsets(root: Path) -> np.ndarray:
    return np.asarray(records(root, ("phy_offset",)).column("phy_offset"))


def log_end(root: Path) -> int:
    t = records(root, ("phy_offset", "size"))
    return int(t.column("phy_offset")[-1].as_py()) + int(t.column("size")[-1].as_py())


def copy_log(src: Path, dst: Path, end: int, *, start: int = 0, partial: int = 0, config: bool = True,
             version: str = "5") -> Path:
    """A slave of ``src``: its commitlog bytes [``start``, ``end`` + ``partial``) at the same offsets (``start`` a
    segment base), zeros after; its ConsumeQueue and IndexFile dispatched from them; ``config/`` copied."""
    os.makedirs(dst / "commitlog")
    if config and (src / "config").exists():
        shutil.copytree(src / "config", dst / "config")
    stop = end + partial
    for name in sorted(os.listdir(src / "commitlog")):
        base = int(name)
        if base >= stop or base + SEGMENT <= start:
            continue
        shutil.copyfile(src / "commitlog" / name, dst / "commitlog" / name)
        if base + SEGMENT > stop:
            with open(dst / "commitlog" / name, "r+b") as f:
                f.seek(stop - base)
                f.write(bytes(base + SEGMENT - stop))
    with StoreWriter(str(dst), settings(version)) as w:
        w.dispatch()
    return dst


def own_messages(prefix: str, n: int, *, topics: tuple[str, ...] = ("OrderEvents", "PaymentNotify")) -> list[Message]:
    """Messages a master stores after a failover (new bodies, keys naming where they came from)."""
    return [Message(topic=topics[k % len(topics)], body=f"{prefix}-{k}".encode() * (1 + k % 7), queue_id=k % 4,
                    born_timestamp=1_700_000_100_000 + k, born_host="10.1.2.3:5555",
                    properties={"KEYS": f"{prefix}-{k}", "UNIQ_KEY": f"{prefix.upper()}{k:020d}"}) for k in range(n)]


def append(root: Path, msgs: list[Message], *, host: str, version: str = "5") -> list:
    """The messages put on ``root`` as its broker would (StoreWriter continues the log), dispatched, closed."""
    with StoreWriter(str(root), settings(version), store_host=host) as w:
        return [w.append(m) for m in msgs]


__all__ = ["SEGMENT", "append", "copy_log", "log_end", "master", "offsets", "own_messages", "records", "settings"]
