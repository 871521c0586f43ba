"""The Spark driver JVM's class-data archive (JDK AppCDS): Spark loads ~10 k classes at every start, and
mapping them from an archive instead of parsing and verifying jars halves the session start (2 cores,
JDK 17, Spark 4: 3.9-4.7 s -> 2.0-2.3 s). The first session started here dumps the archive as its JVM
exits, in the background (10-15 s of one core, once per JDK and Spark install); later sessions map it.

The archive lives in ``$RMQSTORE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/rmqstore`` or
``~/.cache/rmqstore``), under a name keyed by the java binary and Spark's jars, so a new JDK or Spark
gets a new one. ``RMQSTORE_JVM_CDS=0`` turns it off. The JVM ignores an archive of another class path,
but aborts on a damaged one: an archive is published (renamed into place) only after a JVM started with
it, and a session whose JVM fails to start with it starts again without it and drops it. The CDS log
lines are off (they would land on our stdout).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

QUIET = "-Xlog:cds*=off"
# with an archive mapped, a JVM that aborts (a damaged archive) does so silently: the session starts
# again without the archive, whose JVM would report any crash of its own
SILENT_ABORT = "-XX:+SuppressFatalErrorMessage"
DYNAMIC_MAGIC = 0xF00BABA8  # the first word of a JDK dynamic CDS archive
DUMP_WAIT_S = 600.0  # a JVM still running after this is not dumping for us any more


@dataclass(frozen=True)
class ArchivePlan:
    """The JVM options for this start; with ``dump_to``, this run dumps the archive (holding ``lock_fd``)."""

    options: tuple[str, ...]
    archive: Path | None = None
    dump_to: Path | None = None
    lock_fd: int | None = None


def cache_dir() -> Path:
    if os.environ.get("RMQSTORE_CACHE_DIR"):
        return Path(os.environ["RMQSTORE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rmqstore"


def java_binary() -> str | None:
    """The java that Spark's launcher runs (JAVA_HOME's, else the one on PATH), resolved; None without one."""
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return str(Path(home, "bin", "java").resolve())
    found = shutil.which("java")
    return str(Path(found).resolve()) if found else None


def archive_key() -> str | None:
    """A name for the archive of this JDK and Spark (None when either cannot be found)."""
    java = java_binary()
    try:
        import pyspark

        names = sorted(os.listdir(Path(pyspark.__file__).parent / "jars"))
        st = os.stat(java) if java else None
    except (ImportError, OSError):
        return None
    if st is None or java is None:
        return None
    h = hashlib.sha256()
    for part in (java, str(st.st_size), str(st.st_mtime_ns), pyspark.__version__, *names):
        h.update(part.encode() + b"\0")
    return f"spark-{pyspark.__version__}-{h.hexdigest()[:16]}.jsa"


def plan_archive() -> ArchivePlan:
    """Map the archive when there is one; else dump one at this JVM's exit, unless another run holds the
    dump's lock (it is dumping) or the cache is not writable."""
    if os.environ.get("RMQSTORE_JVM_CDS", "1") == "0":
        return ArchivePlan(())
    key = archive_key()
    if key is None:
        return ArchivePlan(())
    d = cache_dir() / "jvm"
    final = d / key
    if final.is_file() and valid_archive(final):
        return ArchivePlan((f"-XX:SharedArchiveFile={final}", QUIET, SILENT_ABORT), archive=final)
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return ArchivePlan(())
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return ArchivePlan(())
    tmp = d / f"{key}.tmp"
    with contextlib.suppress(OSError):
        tmp.unlink()  # a dump whose run died before publishing it
    return ArchivePlan((f"-XX:ArchiveClassesAtExit={tmp}", QUIET), archive=final, dump_to=tmp, lock_fd=fd)


def valid_archive(path: Path) -> bool:
    """Does ``path`` start with the dynamic archive's magic (a cheap first test: see :func:`maps_cleanly`)?"""
    try:
        with open(path, "rb") as f:
            return f.read(4) in (DYNAMIC_MAGIC.to_bytes(4, "little"), DYNAMIC_MAGIC.to_bytes(4, "big"))
    except OSError:
        return False


def finish_dump(plan: ArchivePlan, jvm) -> None:
    """At exit, after the session stopped: the JVM dumps when it exits, which is when this process has
    gone (its stdin closes), and dumping takes 10-15 s, so a detached watcher (holding the dump's lock)
    waits for it and publishes the archive by rename. Nobody waits for it."""
    if plan.dump_to is None or plan.archive is None or plan.lock_fd is None:
        return
    pid = getattr(jvm, "pid", None)
    if pid is None:
        os.close(plan.lock_fd)
        return
    with contextlib.suppress(OSError, AttributeError):
        # the dump is background work: the lowest CPU priority, so the next command (whose JVM may be
        # starting now on the same cores) is not slowed by it
        os.setpriority(os.PRIO_PROCESS, pid, 19)
    with contextlib.suppress(OSError):
        subprocess.Popen([sys.executable, "-m", "jobs.spark.jvmcache", str(pid), str(plan.dump_to), str(plan.archive)],
                         cwd=str(Path(__file__).resolve().parents[2]), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         pass_fds=(plan.lock_fd,))
    os.close(plan.lock_fd)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def publish_when_done(pid: int, tmp: Path, final: Path, patience_s: float = DUMP_WAIT_S) -> bool:
    """The watcher: wait for the JVM ``pid`` to exit, then rename a complete dump into place."""
    deadline = time.monotonic() + patience_s
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if pid_alive(pid) or not valid_archive(tmp) or not maps_cleanly(tmp):
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    os.replace(tmp, final)
    return True


def maps_cleanly(path: Path) -> bool:
    """Does a JVM start with this archive mapped? The JVM ignores an archive it finds does not match, but
    aborts on a damaged one (a truncated file), so nothing is published that was not tried once."""
    java = java_binary()
    if java is None:
        return False
    try:
        r = subprocess.run([java, f"-XX:SharedArchiveFile={path}", QUIET, SILENT_ABORT, "-version"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def discard(plan: ArchivePlan) -> None:
    """Remove an archive a JVM could not start with (the next start dumps a new one)."""
    if plan.archive is not None:
        with contextlib.suppress(OSError):
            plan.archive.unlink()


__all__ = ["ArchivePlan", "cache_dir", "discard", "finish_dump", "java_binary", "maps_cleanly", "pid_alive", "plan_archive",
           "publish_when_done"]


if __name__ == "__main__":  # the detached watcher of finish_dump: PID TMP FINAL
    with contextlib.suppress(OSError):
        os.nice(19)
    publish_when_done(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
