"""``rmqstore recover --apply`` and ``--restore``: a plan carried out step by step under a journal, every
file it changes saved first in the backup directory (storelib.fileio.backup), so that a kill at any point
leaves a store that a rerun finishes and ``--restore`` puts back exactly.

``--apply`` carries out what :func:`storelib.broker.startup.startup.simulate` finds without a broker, crash-safely
(see :func:`apply`): all new file contents are first *staged* in the backup directory, then each step backs
up what it touches (:class:`storelib.fileio.backup.Backup`) and performs one idempotent operation, and is
marked done in a journal. A rerun after a kill continues from the journal with the staged plan (never
re-plans from a half-changed store).

Truncating the commitlog offline: the broker only moves its write position and leaves the bytes after
processOffset on disk (the next start would find them again only if they were valid, which they are
not — except that a *later* corruption fix or a different window could resurrect them). Offline there
is no write position to move, so apply **zeroes** the segment from processOffset to its end (in place,
zeros written front to back, so at every instant the record at processOffset is invalid and a broker
started mid-way sees the same valid end). ConsumeQueue tails after the new write position are zeroed
the same way (stale units would otherwise be recovered as valid on the next start). The exact
original bytes are in the backup, so ``--restore`` is byte-identical.

A DLedger-mode store's data files are its commitlog (``dledger-<id>/data``, zeroed after DLedger's data
end the same way); DLedger's own index changes are steps too: index files deleted, and the units recover()
rewrites from their entries written in place (``write_at``; a file it creates is made at its full size).
DLedger's checkpoint is left as it is: the broker's load does not write it either.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from storelib.broker.recovery.walk import WalkRunner, serial_walk
from storelib.broker.startup.recoveryplan import plan_document
from storelib.broker.startup.startup import Simulation, simulate
from storelib.errors import StoreError
from storelib.fileio.backup import Backup
from storelib.fileio.backup import restore as backup_restore
from storelib.fileio.publish import atomic_local_file
from storelib.fileio.smallfile_io import atomic_write, atomic_write_json, read_small
from storelib.format.markers import ABORT_FILE, LOCK_FILE, lock_state

if TYPE_CHECKING:
    from storelib.broker.settings.store import Store

MARKER = ".rmqstore-recover"  # in the store root while an apply is under way (names the backup dir)
JOURNAL = "journal.jsonl"
PLAN_FILE = "plan.json"
STEPS_FILE = "steps.json"
STAGED = "staged"
_ZERO_CHUNK = 4 * 1024 * 1024

# ---------------------------------------------------------------------------------------------
# apply


def _journal_events(bdir: str) -> list[dict]:
    path = os.path.join(bdir, JOURNAL)
    out: list[dict] = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # torn last line
    except FileNotFoundError:
        pass
    return out


def _journal(bdir: str, obj: dict) -> None:
    path = os.path.join(bdir, JOURNAL)
    with open(path, "ab") as f:
        f.write((json.dumps(obj, sort_keys=True) + "\n").encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


def _repair_journal(bdir: str) -> None:
    path = os.path.join(bdir, JOURNAL)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return
    if data and not data.endswith(b"\n"):
        atomic_write(path, data[: data.rfind(b"\n") + 1])


@contextlib.contextmanager
def _store_lock(root: str):
    """Hold the broker's lock on byte 0 of ``lock`` (when the file exists; never creates or writes it)."""
    path = os.path.join(root, LOCK_FILE)
    if not os.path.exists(path):
        yield
        return
    fd = os.open(path, os.O_RDWR)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
        except (BlockingIOError, PermissionError) as e:
            raise StoreError(path, 0, "locked", "another process (a live broker?) holds the store lock") from e
        yield
    finally:
        os.close(fd)


def check_offline(store: Store) -> str:
    """The local root of a store no live broker holds; StoreError otherwise."""
    root = store.require_local("recover --apply")
    ls = lock_state(store.loc)
    if ls.held_by_other:
        raise StoreError(os.path.join(root, LOCK_FILE), 0, "locked",
                         f"a live broker holds the store lock ({ls.detail}); stop it first")
    return root


def _stage(sim: Simulation, bdir: str) -> list[dict]:
    """Write every new file content under ``bdir/staged`` and return the ordered step list."""
    sdir = os.path.join(bdir, STAGED)
    if os.path.exists(sdir):
        shutil.rmtree(sdir)
    os.makedirs(sdir)
    steps: list[dict] = [{"op": "marker_create", "rel": MARKER}]

    def staged_path(rel: str) -> str:
        p = os.path.join(sdir, *rel.split("/"))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    for name in sim.index_delete:
        steps.append({"op": "delete", "rel": f"index/{name}"})
    folder = _relative_folder(sim)
    if sim.commitlog_zero_from is not None:
        name, pos = sim.commitlog_zero_from
        steps.append({"op": "zero_tail", "rel": f"{folder}/{name}", "from": pos})
    for name in sim.commitlog_delete:
        steps.append({"op": "delete", "rel": f"{folder}/{name}"})
    if sim.dledger is not None:
        steps += [{"op": "delete", "rel": rel} for rel in sim.dledger.index_delete]
        for k, (rel, off, data) in enumerate(sim.dledger.index_writes):
            name = f"dledger-units-{k}"
            with open(os.path.join(sdir, name), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            steps.append({"op": "write_at", "rel": rel, "at": off, "staged": name,
                          "size": sim.dledger.index_create.get(rel)})
    installs: list[dict] = []
    for key in sorted(sim.queues):
        for rel, data in sim.queues[key].outputs():
            if data is None:
                steps.append({"op": "delete", "rel": rel})
            else:
                p = staged_path(rel)
                with open(p, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                installs.append({"op": "install", "rel": rel})
    steps += installs
    for im in sim.index_images:
        rel = f"index/{im.name}"
        im.write(staged_path(rel))
        steps.append({"op": "install", "rel": rel})
    if sim.checkpoint_bytes is not None:
        old = read_small(sim.store.path("checkpoint"), 1 << 20)
        if old != sim.checkpoint_bytes:
            p = staged_path("checkpoint")
            with open(p, "wb") as f:
                f.write(sim.checkpoint_bytes)
                f.flush()
                os.fsync(f.fileno())
            steps.append({"op": "install", "rel": "checkpoint"})
    if sim.timer is not None:
        steps += [{"op": "delete", "rel": rel} for rel in sim.timer.delete_files]
        if sim.timer.wheel_writes:  # the wheel with the revised slots, installed whole like any file
            p = staged_path("timerwheel")
            shutil.copyfile(sim.store.path("timerwheel").path, p)
            with open(p, "r+b") as f:
                for off, data in sorted(sim.timer.wheel_writes.items()):
                    f.seek(off)
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
            steps.append({"op": "install", "rel": "timerwheel"})
    if sim.abort.exists:
        steps.append({"op": "delete", "rel": ABORT_FILE})
    steps.append({"op": "marker_remove", "rel": MARKER})
    for i, s in enumerate(steps):
        s["id"] = i
    return steps


def _relative_folder(sim: Simulation) -> str:
    """The commitlog folder as a path under the store root (a DLedger data path outside it cannot be applied)."""
    folder = sim.commitlog_folder
    if os.path.isabs(folder) or ".." in folder.split("/"):
        raise StoreError(folder, None, "unsupported",
                         "the DLedger data directory (storePathDLedgerCommitLog) is outside the store root: recover "
                         "--apply changes files under the root only")
    return folder


def _write_at(path: str, at: int, data: bytes, size: int | None) -> None:
    """``data`` written at ``at`` of ``path`` in place (idempotent), the file first created at ``size`` (sparse)
    when it does not exist (a DLedger index file recover() creates), then fsync."""
    flags = os.O_WRONLY | (os.O_CREAT if size is not None else 0)
    fd = os.open(path, flags, 0o644)
    try:
        if size is not None and os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        os.pwrite(fd, data, at)
        os.fsync(fd)
    finally:
        os.close(fd)


def _zero_tail(path: str, pos: int) -> None:
    """Zero ``path`` from ``pos`` to its end, in place, front to back (idempotent), then fsync."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_WRONLY)
    try:
        zeros = bytes(_ZERO_CHUNK)
        p = pos
        while p < size:
            n = min(_ZERO_CHUNK, size - p)
            os.pwrite(fd, zeros[:n], p)
            p += n
        os.fsync(fd)
    finally:
        os.close(fd)


def _install(src: str, dst: str) -> None:
    """A staged file copied over ``dst`` atomically (the replaced file's mode kept)."""
    with atomic_local_file(dst) as tmp:
        shutil.copyfile(src, tmp)


def _run_step(step: dict, root: str, bdir: str, backup: Backup) -> None:
    op, rel = step["op"], step["rel"]
    path = backup.path(rel)
    if op == "marker_create":
        backup.save(rel)
        atomic_write(path, bdir.encode("utf-8"))
        return
    if op == "marker_remove":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    if op == "delete":
        backup.save(rel, link_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    if op == "zero_tail":
        backup.save(rel)
        _zero_tail(path, int(step["from"]))
        return
    if op == "write_at":
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        if parent:
            backup.makedirs(parent)
        backup.save(rel)
        with open(os.path.join(bdir, STAGED, step["staged"]), "rb") as f:
            _write_at(path, int(step["at"]), f.read(), step.get("size"))
        return
    if op == "install":
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        if parent:
            backup.makedirs(parent)
        backup.save(rel, link_ok=True)
        _install(os.path.join(bdir, STAGED, *rel.split("/")), path)
        return
    raise StoreError(os.path.join(bdir, STEPS_FILE), None, "bad_journal", f"unknown step {op!r}")


@dataclass
class ApplyResult:
    plan: dict
    steps: int
    done_before: int
    resumed: bool
    already_complete: bool
    file_changes: int = 0  # files written or deleted in the store (what --restore undoes), markers excluded


def apply(store: Store, backup_dir: str | os.PathLike, *, version: str | None = None, force: bool = False,
          progress: Callable[[str], None] | None = None, complete_index: bool = True,
          walk_runner: WalkRunner = serial_walk) -> ApplyResult:
    """Carry out the recovery plan on a local, stopped store, with backups (crash-safe, resumable).

    Order: the plan and every new file are written to ``backup_dir`` first (``plan.json``,
    ``staged/``, ``steps.json``, then the journal's ``staged`` event); until then the store is
    untouched and a rerun starts over. Then each step: back the file up (manifest fsynced), do one
    idempotent operation, journal it done. A rerun reads the journal and continues.
    """
    root = check_offline(store)
    bdir = os.path.abspath(os.fspath(backup_dir))
    os.makedirs(bdir, exist_ok=True)
    _repair_journal(bdir)
    events = _journal_events(bdir)
    staged = any(e.get("event") == "staged" for e in events)
    marker = os.path.join(root, MARKER)
    if os.path.exists(marker):
        with open(marker, encoding="utf-8", errors="replace") as f:
            other = f.read().strip()
        if os.path.abspath(other) != bdir:
            raise StoreError(marker, None, "apply_in_progress",
                             f"an interrupted recover --apply used backup directory {other}: rerun with that one")
        if not staged:
            raise StoreError(marker, None, "bad_journal", f"{bdir} has no staged plan but the store is marked")
    with _store_lock(root):
        if any(e.get("event") == "complete" for e in events):
            with open(os.path.join(bdir, PLAN_FILE), encoding="utf-8") as f:
                plan = json.load(f)
            return ApplyResult(plan, 0, 0, True, True)
        if not staged:
            if events or os.path.exists(os.path.join(bdir, "manifest.jsonl")):
                # a previous run died before staging finished: the store is untouched, start over
                for name in (JOURNAL, "manifest.jsonl", STEPS_FILE, PLAN_FILE):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(bdir, name))
                shutil.rmtree(os.path.join(bdir, "files"), ignore_errors=True)
            sim = simulate(store, version, complete_index=complete_index, walk_runner=walk_runner)
            if not sim.walk.supported and not force:
                raise StoreError(store.uri, None, "unsupported",
                                 "the broker's recovery cannot be reproduced exactly here (see the plan's findings); "
                                 "use --force to apply anyway")
            if sim.load_failures and not force:  # the broker does not start (or loads files not modelled)
                f = sim.load_failures[0]
                raise StoreError(f.file, None, "unsupported",
                                 f"{f.detail}; a start-up the broker does not make is not applied "
                                 f"({len(sim.load_failures)} such entr(ies), see the plan); use --force to apply "
                                 "anyway")
            unmodelled = next((f for f in sim.findings if f.kind == "cq_unreproduced"), None)
            if unmodelled is not None and not force:  # the plan's own finding says what and why
                raise StoreError(store.uri, None, "unsupported", f"{unmodelled.detail}; use --force to apply anyway")
            plan = plan_document(sim)
            atomic_write_json(os.path.join(bdir, PLAN_FILE), plan)
            steps = _stage(sim, bdir)
            atomic_write_json(os.path.join(bdir, STEPS_FILE), steps)
            _journal(bdir, {"event": "staged", "steps": len(steps)})
            done: set[int] = set()
            resumed = False
        else:
            with open(os.path.join(bdir, PLAN_FILE), encoding="utf-8") as f:
                plan = json.load(f)
            with open(os.path.join(bdir, STEPS_FILE), encoding="utf-8") as f:
                steps = json.load(f)
            done = {int(e["id"]) for e in events if e.get("event") == "done"}
            resumed = True
        if os.path.abspath(plan["store"]) != os.path.abspath(root):
            raise StoreError(bdir, None, "wrong_store", f"this backup directory belongs to {plan['store']}")
        backup = Backup(bdir, root)
        before = len(done)
        for step in steps:
            if step["id"] in done:
                continue
            if progress:
                progress(f"{step['op']} {step['rel']}")
            _run_step(step, root, bdir, backup)
            _journal(bdir, {"event": "done", "id": step["id"]})
        _journal(bdir, {"event": "complete"})
        shutil.rmtree(os.path.join(bdir, STAGED), ignore_errors=True)
    return ApplyResult(plan, len(steps), before, resumed, False, file_changes=count_file_changes(steps))


def count_file_changes(steps: list[dict]) -> int:
    """The store files an apply writes or deletes: the one count apply and restore both report."""
    return sum(1 for s in steps if not str(s.get("op", "")).startswith("marker_"))


def restore(backup_dir: str | os.PathLike, root: str | os.PathLike | None = None) -> list[dict]:
    """Undo an apply (complete or interrupted) from its backup directory: the store becomes
    byte-identical to what it was before, and the backup's journal is marked restored."""
    bdir = os.path.abspath(os.fspath(backup_dir))
    actions = backup_restore(bdir, root)
    _repair_journal(bdir)
    _journal(bdir, {"event": "restored"})
    return actions


__all__ = ["ApplyResult", "apply", "count_file_changes", "restore"]
