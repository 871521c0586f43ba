"""Atomic writes and publishing: temp file + rename for files, staging + manifest-last for trees.

Nothing the toolkit writes may ever be seen half-written: a file appears under its final name only
once complete (os.replace is atomic on one filesystem), and an output tree counts as published only
when its manifest exists, which is written last.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

from storelib.fileio.smallfile_io import atomic_write, fsync_dir, output_mode


@contextlib.contextmanager
def atomic_local_file(path: str | os.PathLike, mode: int | None = None, durable: bool = True,
                      create_dir: bool = True) -> Iterator[str]:
    """Yield a temp path beside ``path``; on success fsync and rename it over ``path``, else remove it.

    ``create_dir=False``: a missing directory is an error (scratch dirs that another process removes
    when it is done must not come back). ``mode``: the file's permission bits; default :func:`storelib.fileio.smallfile_io.output_mode` (the replaced
    file's, else the umask's, as ``open`` would create it).

    ``durable=False`` skips the fsyncs: the file still appears only complete, but a crash may lose it
    (scratch files that a rerun recreates anyway).
    """
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    if create_dir:
        os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    os.close(fd)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.chmod(tmp, output_mode(path) if mode is None else mode)
        os.replace(tmp, path)
        if durable:
            fsync_dir(d)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------------------------
# output trees: staging + manifest last

MANIFEST_NAME = "rebuild-manifest.json"
PUBLISHING_MARKER = ".rmqstore-publishing"  # present at a remote destination while a publish runs


def _loc(where):
    from storelib.fileio.bytesource import Location, resolve

    return where if isinstance(where, Location) else resolve(where)


def tree_files(root) -> list[str]:
    """Relative paths ("a/b/c") of every file under a Location or path, sorted (temp files skipped)."""
    import pyarrow.fs as pafs

    loc = _loc(root)
    infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True, recursive=True))
    base = loc.path.rstrip("/") + "/"
    out = []
    for i in infos:
        if i.type == pafs.FileType.File and not i.base_name.endswith(".tmp"):
            out.append(i.path[len(base):] if i.path.startswith(base) else i.base_name)
    return sorted(out)


def is_published(dest, manifest_name: str = MANIFEST_NAME) -> bool:
    """An output tree is complete only when its manifest exists (it is always written last)."""
    import pyarrow.fs as pafs

    loc = _loc(dest)
    return loc.fs.get_file_info(loc.join(manifest_name).path).type == pafs.FileType.File


def read_manifest(dest, manifest_name: str = MANIFEST_NAME) -> dict | None:
    """The manifest of a published tree, None when there is none (an incomplete tree)."""
    import json

    loc = _loc(dest)
    if not is_published(loc, manifest_name):
        return None
    with loc.fs.open_input_stream(loc.join(manifest_name).path) as f:
        return json.loads(f.read().decode("utf-8"))


def _manifest_bytes(manifest: dict) -> bytes:
    import json

    return (json.dumps(manifest, indent=2, sort_keys=False, ensure_ascii=False) + "\n").encode("utf-8")


def publish_tree(staging, dest, manifest: dict, *, manifest_name: str = MANIFEST_NAME) -> str:
    """Publish the finished tree ``staging`` at ``dest`` with ``manifest`` as its completion marker.

    Local staging and destination on one filesystem: the manifest is written into the staging tree,
    then the tree is renamed into place (an existing ``dest`` is first renamed aside and removed
    after). Otherwise (remote ``dest`` or different filesystems) see :func:`_publish_remote`: staging
    prefix, move into place, manifest LAST; readers must treat a tree without manifest as
    incomplete (:func:`is_published`, :func:`is_partial`). Returns the destination path.
    """
    import shutil
    import uuid


    src, dst = _loc(staging), _loc(dest)
    data = _manifest_bytes(manifest)
    if src.local and dst.local and _same_device(src.path, os.path.dirname(os.path.abspath(dst.path))):
        atomic_write(os.path.join(src.path, manifest_name), data)
        old = None
        if os.path.lexists(dst.path):
            old = f"{dst.path}.old-{uuid.uuid4().hex[:8]}"
            os.rename(dst.path, old)
        os.rename(src.path, dst.path)
        fsync_dir(os.path.dirname(os.path.abspath(dst.path)))
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return dst.path
    _publish_remote(src, dst, data, manifest_name)
    return dst.path


def _publish_remote(src, dst, data: bytes, manifest_name: str) -> None:
    """Staging prefix on the destination filesystem, move into place, stale files out, manifest LAST.

    Object stores have no directory rename: the files are first uploaded under a sibling staging
    prefix (``<dest>.publish-<id>``; skipped when ``src`` already is on that filesystem), so ``dest``
    only changes once every byte has arrived; then each file is moved (S3: server-side copy +
    delete), files of a previous output that the new one lacks are deleted, and the manifest is
    written. A ``PUBLISHING_MARKER`` file marks ``dest`` as being replaced until the manifest exists.
    """
    import uuid

    import pyarrow.fs as pafs

    from storelib.fileio.bytesource import Location

    fs = dst.fs
    mpath = dst.join(manifest_name).path
    marker = dst.join(PUBLISHING_MARKER).path
    fs.create_dir(dst.path, recursive=True)
    with fs.open_output_stream(marker) as f:
        f.write(b"publish in progress; this tree is incomplete until " + manifest_name.encode() + b" exists\n")
    if fs.get_file_info(mpath).type == pafs.FileType.File:
        fs.delete_file(mpath)  # the old output stops counting as complete before any of it changes
    same_fs = not src.local and src.fs.equals(fs)
    stage = src
    if not same_fs:
        stage = Location(fs, f"{dst.path.rstrip('/')}.publish-{uuid.uuid4().hex[:10]}", False)
        fs.create_dir(stage.path, recursive=True)
    try:
        if not same_fs:
            pafs.copy_files(src.path, stage.path, source_filesystem=src.fs, destination_filesystem=fs,
                            use_threads=True)
        new = [rel for rel in tree_files(stage) if rel not in (manifest_name, PUBLISHING_MARKER)]
        for rel in new:
            target = dst.join(*rel.split("/")).path
            fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
            fs.move(stage.join(*rel.split("/")).path, target)
        keep = set(new) | {PUBLISHING_MARKER}
        for rel in tree_files(dst):
            if rel not in keep:
                fs.delete_file(dst.join(*rel.split("/")).path)
        with fs.open_output_stream(mpath) as f:  # one PUT: the object appears only when complete
            f.write(data)
        fs.delete_file(marker)
    finally:
        if not same_fs:
            with contextlib.suppress(OSError):
                fs.delete_dir(stage.path)


def is_partial(dest) -> bool:
    """True when a publish into ``dest`` started and did not finish (safe to replace, never to read)."""
    import pyarrow.fs as pafs

    loc = _loc(dest)
    return loc.fs.get_file_info(loc.join(PUBLISHING_MARKER).path).type == pafs.FileType.File


def _same_device(a: str, b: str) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False
