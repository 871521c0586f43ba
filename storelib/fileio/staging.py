"""Where a rebuild writes: the destination checks (never inside the store, never over something that is
not a rebuild's output), the staging directory beside the destination (stale ones of dead runs removed),
file hashes for the manifest, and the publish in place with a backup.
The index file writers are storelib.broker.index.indexwrite; the job is :mod:`jobs.rebuild`."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from storelib.errors import StoreError
from storelib.fileio.bytesource import Location, resolve, sha256_of
from storelib.fileio.publish import (
    MANIFEST_NAME,
    is_partial,
    read_manifest,
    tree_files,
)
from storelib.fileio.smallfile_io import atomic_write, fsync_dir

STAGING_TAG = ".rebuild-staging-"


def hash_tree(root: Location, rels: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """{relative path: {size, sha256}} for files under ``root`` (threads: hashing releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    rels = sorted(rels) if rels is not None else [r for r in tree_files(root) if r != MANIFEST_NAME]
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2))) as ex:
        res = list(ex.map(lambda r: sha256_of(root.join(*r.split("/"))), rels))
    return {r: {"size": n, "sha256": h} for r, (h, n) in zip(rels, res)}


def check_not_inside(out: Location, root: Location) -> None:
    if not (out.local and root.local):
        if out.fs.type_name == root.fs.type_name and (out.path + "/").startswith(root.path.rstrip("/") + "/"):
            raise StoreError(out.path, None, "bad_output", "the output is inside the source store (use --in-place)")
        return
    o, r = os.path.realpath(out.path), os.path.realpath(root.path)
    if o == r or o.startswith(r + os.sep):
        raise StoreError(out.path, None, "bad_output", "the output is inside the source store (use --in-place)")
    if r.startswith(o + os.sep):
        raise StoreError(out.path, None, "bad_output", "the output directory contains the source store")


def check_dest(out: Location) -> None:
    """A destination must be absent, empty, a previous rebuild output, or one whose publish was interrupted.

    The last two are replaced (an interrupted publish carries the publishing marker and no manifest, so
    it can never be mistaken for a complete output; rerunning completes it).
    """
    info = out.fs.get_file_info(out.path)
    if info.type == pafs.FileType.NotFound:
        return
    if info.type != pafs.FileType.Directory:
        raise StoreError(out.path, None, "bad_output", "output exists and is not a directory")
    files = tree_files(out)
    if files and read_manifest(out) is None and not is_partial(out):
        raise StoreError(out.path, None, "bad_output",
                         "output directory is not empty and holds no rebuild manifest; refusing to replace it")


def remove_stale_staging(parent: str, prefix: str) -> None:
    """Staging directories of crashed runs (never published) are removed."""
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            if name.startswith(prefix):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def make_staging(in_place: bool, root: Location, out: Location | None, engine_name: str = "local") -> Location:
    """A fresh staging directory: inside the store root (in place), beside a local destination, on the
    remote filesystem for Spark executors, else a local temp dir (stale ones of dead runs removed)."""
    tag = f"{uuid.uuid4().hex[:10]}"
    if in_place:
        remove_stale_staging(root.path, STAGING_TAG)
        path = os.path.join(root.path, STAGING_TAG + tag)
        os.makedirs(path)
        return resolve(path)
    assert out is not None
    if out.local:
        parent = os.path.dirname(os.path.abspath(out.path))
        os.makedirs(parent, exist_ok=True)
        prefix = "." + os.path.basename(out.path) + STAGING_TAG
        remove_stale_staging(parent, prefix)
        path = os.path.join(parent, prefix + tag)
        os.makedirs(path)
        return resolve(path)
    if engine_name == "spark":  # executors (maybe on other hosts) write straight to the remote filesystem
        st = Location(out.fs, out.path.rstrip("/") + STAGING_TAG + tag, False)
        out.fs.create_dir(st.path, recursive=True)
        return st
    return resolve(tempfile.mkdtemp(prefix="rmqstore" + STAGING_TAG))


def remove_files(fs_options: dict[str, Any], paths: list[str | Location]) -> int:
    """Remove intermediate files, paths/URIs or Locations (as a task of their own, so that their removal,
    which on a local disk frees their page cache, is spread over the workers); missing ones are fine.
    Returns how many went."""
    done = 0
    for path in paths:
        loc = path if isinstance(path, Location) else resolve(path, **(fs_options if "://" in path else {}))
        try:
            if loc.local:
                os.unlink(loc.path)
            else:
                loc.fs.delete_file(loc.path)
            done += 1
        except OSError:
            pass
    return done


def drop_staging(st: Location) -> None:
    if st.local:
        shutil.rmtree(st.path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError, pa.ArrowException):
            st.fs.delete_dir(st.path)


def publish_in_place(root: Location, staging: Location, manifest: dict[str, Any], what: tuple[str, ...],
                      changed: list[str] | None) -> str:
    """Move the staged output into the store, after moving what it replaces into a backup directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    backup = os.path.join(root.path, f"rebuild-backup-{stamp}")
    os.makedirs(backup)
    manifest["backup"] = backup
    # the manifest of the store goes stale first: a crash in between never leaves a manifest that
    # describes files which are not there
    with contextlib.suppress(FileNotFoundError):
        os.rename(os.path.join(root.path, MANIFEST_NAME), os.path.join(backup, MANIFEST_NAME))
    if changed is None:  # full: whole directories
        for w in what:
            cur = os.path.join(root.path, w)
            if os.path.lexists(cur):
                os.rename(cur, os.path.join(backup, w))
            src = os.path.join(staging.path, w)
            if os.path.isdir(src):
                os.rename(src, cur)
            else:
                os.makedirs(cur)
    else:
        for rel in changed:
            cur = os.path.join(root.path, rel)
            if os.path.lexists(cur):
                os.makedirs(os.path.dirname(os.path.join(backup, rel)), exist_ok=True)
                shutil.copy2(cur, os.path.join(backup, rel))
            os.makedirs(os.path.dirname(cur), exist_ok=True)
            os.replace(os.path.join(staging.path, rel), cur)
    fsync_dir(root.path)
    import json

    atomic_write(os.path.join(backup, "rebuild-manifest.json"),
                       json.dumps(manifest, indent=2, ensure_ascii=False).encode())
    atomic_write(os.path.join(root.path, MANIFEST_NAME), json.dumps(manifest, indent=2, ensure_ascii=False).encode())
    shutil.rmtree(staging.path, ignore_errors=True)
    return root.path
