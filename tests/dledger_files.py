"""Shared helpers of the tests that generate a DLedger-mode store and patch its files as the reviewers'
repro scripts did (test_dledger_java_rules, test_dledger_recover, test_dledger_audit): one copy of the
generator call, the store as the command opens it, where each entry is, and the byte patch."""

from __future__ import annotations

from pathlib import Path

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store, load_settings
from storelib.fileio.bytesource import resolve
from storelib.format.dledger.entries import BODY_OFFSET, INDEX_UNIT_SIZE
from storelib.generator.dledgergen import DLedgerGen
from storelib.generator.gen import generate
from storelib.generator.genplan import GenConfig

SEG = 64 * 1024  # the generated stores' data file size
IDX = 16 * 1024  # and index file size


def gen_dledger(tmp_path: Path, name: str = "s", n: int = 600, version: str = "4", seed: int = 5, **kw) -> Path:
    """A dispatched DLedger store of ``n`` messages in ``tmp_path/name`` (``kw``: DLedgerGen's options)."""
    out = tmp_path / name
    s = BrokerSettings.defaults(version).with_overrides({"mappedFileSizeCommitLog": SEG, "maxHashSlotNum": 500,
                                                         "maxIndexNum": 4000})
    generate(out, GenConfig(messages=n, seed=seed, version=version), s, dispatch=True,
             dledger=DLedgerGen(index_file_size=IDX, **kw))
    return out


def gen_mixed(tmp_path: Path, n_old: int = 200, n_new: int = 300, dledger_data: bool = True,
              overlap: bool = False) -> Path:
    """A "mixed" store: a default-mode store's ``commitlog/`` (``n_old`` messages) beside a DLedger node whose
    first data file starts where the old log ends, as the switched broker creates it (DLedgerCommitLog.java:309-320;
    ``overlap``: at 0 instead, over the old log's offsets; ``dledger_data=False``: ``dledger-n0/data`` left empty,
    as the broker finds it at its first start in DLedger mode)."""
    import shutil

    s = BrokerSettings.defaults("4").with_overrides({"mappedFileSizeCommitLog": SEG})
    generate(tmp_path / "old", GenConfig(messages=n_old, seed=3, version="4"), s, dispatch=True)
    end = SEG * len([p for p in (tmp_path / "old" / "commitlog").iterdir() if p.stat().st_size])
    root = gen_dledger(tmp_path, "mixed", n=n_new, data_start=0 if overlap else end)
    shutil.copytree(tmp_path / "old" / "commitlog", root / "commitlog")
    if not dledger_data:
        for f in (root / "dledger-n0" / "data").iterdir():
            f.unlink()
    return root


def open_store(root: Path) -> Store:
    """The store as the command opens it (settings and geometry inferred from its files)."""
    loc = resolve(str(root))
    return Store(loc, load_settings(None, None, None, loc))


def dledger_entries(root: Path) -> list[tuple[int, int, int]]:
    """(index, pos, entry size) of every entry the scan reads, in order."""
    t = open_store(root).commitlog.read_table(with_properties=False)
    return list(zip(t.column("dledger_index").to_pylist(), t.column("dledger_pos").to_pylist(),
                    [s + BODY_OFFSET for s in t.column("size").to_pylist()]))


def data_file_at(root: Path, pos: int) -> tuple[Path, int]:
    """The data file of node n0 holding DLedger position ``pos``, and the offset in it."""
    base = pos - pos % SEG
    return root / "dledger-n0" / "data" / f"{base:020d}", pos - base


def index_unit_at(root: Path, index: int) -> tuple[Path, int]:
    """The index file of node n0 holding entry ``index``'s unit, and the unit's offset in it."""
    at = index * INDEX_UNIT_SIZE
    return root / "dledger-n0" / "index" / f"{at - at % IDX:020d}", at % IDX


def patch_bytes(path: Path, at: int, data: bytes) -> None:
    """Overwrite ``data`` at byte ``at`` of ``path`` in place."""
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)
