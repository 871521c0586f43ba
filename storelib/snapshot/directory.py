"""A columnar snapshot's directory: its layout (``rmqstore.snapshot/1``: Hive-partitioned Parquet in the
columns of the ``rocketmq`` data source, ``topic=``/``date=`` of the UTC store time, plus ``_manifest.json``)
and how a run changes it atomically.

A run stages its files under ``_staging-*/`` (invisible to dataset readers, which skip ``_`` names), writes
a commit record there, moves the files in, swaps the manifest and deletes what it replaced: a crash before
the commit record leaves the previous snapshot as it was; after it, the next run finishes the moves.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

from storelib.errors import StoreError
from storelib.fileio.bytesource import Location, resolve
from storelib.scan.messagecols import output_schema

STAGING = "_staging-"
COMMIT = "_commit.json"
SCHEMA = "rmqstore.snapshot/1"
MANIFEST = "_manifest.json"


def file_schema(with_body: bool, dledger: bool = False) -> pa.Schema:
    """The exported columns: the data source's (``segment`` included, no ``_corrupt``: only valid records
    are exported; a DLedger store's entry columns) plus ``date`` (UTC store date) for partitioning."""
    s = output_schema(with_body, dledger)
    return s.remove(s.get_field_index("_corrupt")).append(pa.field("date", pa.string()))


def partitioning(partition_by: tuple[str, ...] | list[str]) -> pads.Partitioning | None:
    """Hive partitions by ``partition_by``, all strings (a topic named ``123`` stays a name)."""
    if not partition_by:
        return None
    return pads.partitioning(pa.schema([pa.field(p, pa.string()) for p in partition_by]), flavor="hive")


def load_manifest(path: str, **fs_options: Any) -> dict[str, Any]:
    """The manifest of the snapshot at ``path``; a clear error when ``path`` is not one."""
    return manifest_at(resolve(path, **fs_options), path)


def manifest_at(snapshot: Location, shown: str) -> dict[str, Any]:
    """The manifest in the snapshot directory ``snapshot`` (``shown``: its path as the user wrote it)."""
    loc = snapshot.join(MANIFEST)
    try:
        with loc.fs.open_input_stream(loc.path) as f:
            doc = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise StoreError(shown, None, "not_a_snapshot", f"no {MANIFEST}: not a snapshot written by rmqstore export") \
            from None
    except (OSError, ValueError) as e:
        raise StoreError(loc.path, None, "bad_manifest", str(e)) from e
    if doc.get("schema") != SCHEMA:
        raise StoreError(loc.path, None, "not_a_snapshot", f"schema {doc.get('schema')!r}, expected {SCHEMA}")
    return doc


def read_manifest(out: Location) -> dict[str, Any] | None:
    """The snapshot's manifest; None for a missing or empty directory; StoreError for anything else."""
    info = out.fs.get_file_info(out.path)
    if info.type == pa.fs.FileType.NotFound:
        return None
    if info.type != pa.fs.FileType.Directory:
        raise StoreError(out.path, None, "not_a_snapshot", "exists and is not a directory")
    entries = [e for e in out.fs.get_file_info(pa.fs.FileSelector(out.path)) if not e.base_name.startswith(STAGING)]
    if not entries:
        return None
    if out.fs.get_file_info(out.join(MANIFEST).path).type != pa.fs.FileType.File:
        raise StoreError(out.path, None, "not_a_snapshot",
                         f"holds {len(entries)} entr(ies) and no {MANIFEST}: not a snapshot this tool wrote; "
                         "choose an empty or new directory")
    return manifest_at(out, out.path)


def write_json(loc: Location, obj: Any) -> None:
    data = (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
    if loc.local:
        from storelib.fileio.smallfile_io import atomic_write

        atomic_write(loc.path, data)
    else:
        with loc.fs.open_output_stream(loc.path) as f:  # one PUT: appears only when complete
            f.write(data)


def finish_commits(out: Location, say) -> None:
    """Roll forward a run that wrote its commit record (moves, manifest, deletions); drop staging dirs
    of runs that did not get that far (their files were never visible)."""
    if out.fs.get_file_info(out.path).type != pa.fs.FileType.Directory:
        return
    for e in out.fs.get_file_info(pa.fs.FileSelector(out.path)):
        if not (e.base_name.startswith(STAGING) and e.type == pa.fs.FileType.Directory):
            continue
        st = out.join(e.base_name)
        commit = st.join(COMMIT)
        if out.fs.get_file_info(commit.path).type == pa.fs.FileType.File:
            with out.fs.open_input_stream(commit.path) as f:
                doc = json.loads(f.read().decode("utf-8"))
            say(f"finishing the interrupted run {e.base_name}: {len(doc['moves'])} file(s) to move")
            apply_commit(out, st, doc)
        else:
            out.fs.delete_dir(st.path)


def apply_commit(out: Location, st: Location, doc: dict[str, Any]) -> None:
    """Move the staged files in, swap the manifest, delete what it replaced; again from the start after a
    crash (a move whose file is gone from the staging directory was done)."""
    whole = _move_whole_dirs(out, st, doc["moves"]) if out.local else set()
    for rel in doc["moves"]:
        if rel in whole:
            continue
        src, dst = st.join(*rel.split("/")), out.join(*rel.split("/"))
        if out.fs.get_file_info(src.path).type == pa.fs.FileType.File:
            out.fs.create_dir(os.path.dirname(dst.path), recursive=True)
            out.fs.move(src.path, dst.path)
    write_json(out.join(MANIFEST), doc["manifest"])
    for rel in doc["delete"]:
        p = out.join(*rel.split("/"))
        if out.fs.get_file_info(p.path).type == pa.fs.FileType.File:
            out.fs.delete_file(p.path)
    if doc["delete"]:  # (moves only fill directories: a run that deletes nothing empties none)
        _prune_empty_dirs(out)
    out.fs.delete_dir(st.path)


def _move_whole_dirs(out: Location, st: Location, moves: list[str]) -> set[str]:
    """Staged top-level partition directories (``topic=...``) that the snapshot does not hold yet and
    whose every file is a move: one rename each, instead of two directories made, a rename per file and
    two directories removed from the staging area (on the 2 GB bench store's 15 partitions the removals
    alone took ~100 ms of the driver's time: ~3.5 ms for each ``topic=`` directory on ext4). Returns the
    moves done."""
    prefix = st.path.rstrip("/") + "/"
    staged: dict[str, list[str]] = {}
    for e in out.fs.get_file_info(pa.fs.FileSelector(st.path, recursive=True)):
        rel = e.path[len(prefix):] if e.path.startswith(prefix) else ""
        if "/" in rel and e.type == pa.fs.FileType.File:
            staged.setdefault(rel.split("/", 1)[0], []).append(rel)
    want, done = set(moves), set()
    for top, files in staged.items():
        if set(files) <= want and out.fs.get_file_info(out.join(top).path).type == pa.fs.FileType.NotFound:
            out.fs.move(st.join(top).path, out.join(top).path)
            done.update(files)
    return done


def _prune_empty_dirs(out: Location) -> None:
    """Partition directories left empty by deleted files (deepest first)."""
    dirs = [e for e in out.fs.get_file_info(pa.fs.FileSelector(out.path, recursive=True))
            if e.type == pa.fs.FileType.Directory and not e.path.rstrip("/").split("/")[-1].startswith("_")]
    for d in sorted(dirs, key=lambda e: -len(e.path)):
        if not out.fs.get_file_info(pa.fs.FileSelector(d.path)):
            out.fs.delete_dir(d.path)


__all__ = ["COMMIT", "MANIFEST", "SCHEMA", "STAGING", "apply_commit", "file_schema", "finish_commits", "load_manifest",
           "manifest_at", "partitioning", "read_manifest", "write_json"]
