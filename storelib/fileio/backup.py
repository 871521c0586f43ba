"""Backups with a manifest, so any in-place change to a store can be undone byte for byte.

A :class:`Backup` lives in its own directory: ``manifest.jsonl`` (one JSON object per line, each
line fsynced before the change it describes is made) and ``files/<relative path>`` (exact copies).
Every file is saved *before* it is touched, once: a file already in the manifest is never saved
again, so a rerun after a crash cannot overwrite the original copy with a half-modified file. A
file that did not exist is recorded as ``existed: false`` before it is created, so a restore
deletes it.

Crash safety of :meth:`Backup.save`: the copy goes to ``files/<rel>.part`` (fsynced), is renamed
to ``files/<rel>``, and only then is the manifest line appended and fsynced. Killed anywhere in
between, the store file is still untouched (the caller modifies it only after ``save`` returns), so
saving it again on the rerun is correct. A torn last manifest line (killed mid-write) is ignored.

:func:`restore` puts every recorded file back (temp file + ``os.replace``, content checked against
the recorded SHA-256, mode and mtime restored), deletes files that did not exist, removes the
toolkit's own temp-file leftovers beside them and directories it created. It is idempotent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass

from storelib.errors import StoreError
from storelib.fileio.bytesource import resolve, sha256_of
from storelib.fileio.publish import atomic_local_file
from storelib.fileio.smallfile_io import atomic_write, fsync_dir

MANIFEST = "manifest.jsonl"
FILES_DIR = "files"
SCHEMA = "rmqstore.backup/1"
_CHUNK = 8 * 1024 * 1024
# temp names used by the toolkit's atomic writers (smallfile_io, publish, consumequeue, indexfile, here)
TEMP_NAME = re.compile(r"^(\..+\.(tmp|rmqtmp)|\.tmp-index-.+|\..+\.part)$")


@dataclass(frozen=True)
class BackupEntry:
    """One saved path: ``rel`` (relative to the store root, '/'-separated), whether it existed,
    and for files that did: size, SHA-256, mode and mtime (ns) of the original."""

    rel: str
    existed: bool
    kind: str = "file"  # "file" | "dir"
    size: int | None = None
    sha256: str | None = None
    mode: int | None = None
    mtime_ns: int | None = None


def _check_rel(rel: str) -> str:
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StoreError(rel, None, "bad_path", "backup paths must be relative to the store root, without '..'")
    return rel


def _copy_fsync(src: str, dst: str) -> str:
    """Copy ``src`` to ``dst`` (created/truncated), fsync it; returns the SHA-256 of what was copied."""
    h = hashlib.sha256()
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while True:
            b = fi.read(_CHUNK)
            if not b:
                break
            h.update(b)
            fo.write(b)
        fo.flush()
        os.fsync(fo.fileno())
    return h.hexdigest()


def read_manifest(backup_dir: str) -> tuple[dict, list[BackupEntry]]:
    """(header, entries) of a backup directory; a torn last line is ignored."""
    path = os.path.join(backup_dir, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except FileNotFoundError as e:
        raise StoreError(path, None, "missing", "no backup manifest here") from e
    header: dict | None = None
    entries: list[BackupEntry] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if i >= len(lines) - 2:  # the last (possibly unterminated) line: killed mid-append
                break
            raise StoreError(path, None, "bad_manifest", f"line {i + 1} is not JSON: {e}") from e
        if obj.get("schema") == SCHEMA:
            header = obj
        else:
            entries.append(BackupEntry(**obj))
    if header is None:
        raise StoreError(path, None, "bad_manifest", f"no {SCHEMA} header line")
    return header, entries


class Backup:
    """A backup directory for one store root (created on first use, reopened on reruns)."""

    def __init__(self, backup_dir: str | os.PathLike, root: str | os.PathLike):
        self.dir = os.path.abspath(os.fspath(backup_dir))
        self.root = os.path.abspath(os.fspath(root))
        if self.dir == self.root or self.dir.startswith(self.root + os.sep):
            raise StoreError(self.dir, None, "bad_backup_dir", "the backup directory must be outside the store")
        os.makedirs(os.path.join(self.dir, FILES_DIR), exist_ok=True)
        self.manifest = os.path.join(self.dir, MANIFEST)
        self.entries: dict[str, BackupEntry] = {}
        if os.path.exists(self.manifest):
            header, entries = read_manifest(self.dir)
            if os.path.abspath(header["root"]) != self.root:
                raise StoreError(self.manifest, None, "wrong_store",
                                 f"this backup belongs to {header['root']}, not {self.root}")
            self.entries = {e.rel: e for e in entries}
            self._drop_torn_tail()
        else:
            self._append({"schema": SCHEMA, "root": self.root})

    def _drop_torn_tail(self) -> None:
        """Rewrite the manifest without a torn last line, so later appends start on a fresh line."""
        with open(self.manifest, "rb") as f:
            data = f.read()
        if data and not data.endswith(b"\n"):
            atomic_write(self.manifest, data[: data.rfind(b"\n") + 1])

    def _append(self, obj: dict) -> None:
        line = json.dumps(obj, sort_keys=True) + "\n"
        with open(self.manifest, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.dir)

    def path(self, rel: str) -> str:
        return os.path.join(self.root, *_check_rel(rel).split("/"))

    def saved(self, rel: str) -> bool:
        return rel in self.entries

    def save(self, rel: str, *, link_ok: bool = False) -> BackupEntry:
        """Record ``rel`` before it is changed, created or removed (no-op when already recorded).

        ``link_ok``: the caller will only delete or *replace* the file (never write into it), so a
        hard link is as good as a copy and costs nothing (falls back to a copy across filesystems).
        """
        if rel in self.entries:
            return self.entries[rel]
        src = self.path(rel)
        try:
            st = os.stat(src)
        except FileNotFoundError:
            entry = BackupEntry(rel, False)
        else:
            if not os.path.isfile(src):
                raise StoreError(src, None, "not_a_file", "only regular files can be backed up")
            dst = os.path.join(self.dir, FILES_DIR, *rel.split("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            part = dst + ".part"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
            digest = None
            if link_ok:
                try:
                    os.link(src, part)
                    digest = sha256_of(resolve(part))[0]
                except OSError:
                    digest = None
            if digest is None:
                digest = _copy_fsync(src, part)
            # by hand, not atomic_local_file: a hard-linked part is the store's own file, which must not be
            # opened for writing or chmod-ed (read-only or foreign-owned store files)
            os.replace(part, dst)
            fsync_dir(os.path.dirname(dst))
            entry = BackupEntry(rel, True, "file", st.st_size, digest, st.st_mode & 0o7777, st.st_mtime_ns)
        self._append(asdict(entry))
        self.entries[rel] = entry
        return entry

    def note_dir(self, rel: str) -> None:
        """Record that directory ``rel`` is about to be created (a restore removes it when empty)."""
        if rel in self.entries:
            return
        existed = os.path.isdir(self.path(rel))
        entry = BackupEntry(rel, existed, "dir")
        self._append(asdict(entry))
        self.entries[rel] = entry

    def makedirs(self, rel_dir: str) -> None:
        """Create ``rel_dir`` and missing parents, recording each one created."""
        parts = _check_rel(rel_dir).split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if not os.path.isdir(self.path(sub)):
                self.note_dir(sub)
                os.makedirs(self.path(sub), exist_ok=True)


def _remove_temp_leftovers(d: str) -> list[str]:
    out = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(d):
            if TEMP_NAME.match(name) and os.path.isfile(os.path.join(d, name)):
                os.unlink(os.path.join(d, name))
                out.append(os.path.join(d, name))
    return out


def restore(backup_dir: str | os.PathLike, root: str | os.PathLike | None = None) -> list[dict]:
    """Put the store recorded in ``backup_dir`` back exactly as it was; returns the actions taken.

    Raises StoreError(``bad_backup``) when a saved copy does not match its recorded SHA-256 (nothing
    is restored from a damaged backup).
    """
    bdir = os.path.abspath(os.fspath(backup_dir))
    header, entries = read_manifest(bdir)
    base = os.path.abspath(os.fspath(root)) if root is not None else header["root"]
    files = [e for e in entries if e.kind == "file"]
    for e in files:  # verify everything before touching anything
        if e.existed:
            copy = os.path.join(bdir, FILES_DIR, *e.rel.split("/"))
            if not os.path.isfile(copy) or sha256_of(resolve(copy))[0] != e.sha256:
                raise StoreError(copy, None, "bad_backup", f"saved copy of {e.rel} is missing or damaged")
    actions: list[dict] = []
    touched_dirs: set[str] = set()
    for e in reversed(files):
        target = os.path.join(base, *e.rel.split("/"))
        d = os.path.dirname(target)
        touched_dirs.add(d)
        if e.existed:
            copy = os.path.join(bdir, FILES_DIR, *e.rel.split("/"))
            if os.path.isfile(target) and os.path.getsize(target) == e.size and sha256_of(resolve(target))[0] == e.sha256:
                act = "unchanged"
            else:
                with atomic_local_file(target) as tmp:
                    _copy_fsync(copy, tmp)
                act = "restored"
            os.chmod(target, e.mode if e.mode is not None else 0o644)
            if e.mtime_ns is not None:
                os.utime(target, ns=(e.mtime_ns, e.mtime_ns))
        else:
            if os.path.lexists(target):
                os.unlink(target)
                fsync_dir(d)
                act = "removed"
            else:
                act = "absent"
        actions.append({"path": e.rel, "action": act})
    for d in sorted(touched_dirs):
        for p in _remove_temp_leftovers(d):
            actions.append({"path": os.path.relpath(p, base), "action": "removed_temp"})
    for e in entries:  # directories the change removed come back (empty) before files are restored
        if e.kind == "dir" and e.existed:
            os.makedirs(os.path.join(base, *e.rel.split("/")), exist_ok=True)
    for e in reversed([e for e in entries if e.kind == "dir" and not e.existed]):
        d = os.path.join(base, *e.rel.split("/"))
        _remove_temp_leftovers(d)
        with contextlib.suppress(OSError):
            os.rmdir(d)
            actions.append({"path": e.rel, "action": "removed_dir"})
    return actions
