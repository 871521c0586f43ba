"""Process memory for the big array passes (the rebuild's, audit's and export's tasks): glibc keeps freed
blocks for reuse instead of unmapping them, unless the user chose otherwise. Audit of the 2 GB bench
store on the pool: 492 k page faults -> 236 k, 0.3 CPU-s less. Not in the audit's driver: its cross-file
checks then held 1.26x the memory at 9 GB that they held at 2 GB (1.0x without)."""

from __future__ import annotations

import os
import sys

_malloc_kept = False
MALLOC_KEEP = 512 << 20  # bytes of freed memory a rebuild process keeps for reuse (and the largest heap block)


def keep_freed_memory() -> None:
    """Let glibc's malloc serve blocks up to MALLOC_KEEP from the heap and keep that much freed memory.

    By default every array above 32 MB is a fresh mmap and is unmapped when freed: the next task (a
    reused Spark worker) or the next dispatch chunk faults in and zeroes new pages again, and with the
    page cache full of store files each fault can wait on reclaim. Kept in the heap, the memory is
    reused: on the 2 GB bench store the consume-queue tasks took 0.45 CPU-s instead of 0.62 and the
    local engine 9.2-10.0 s instead of 10.2-11.0 s. Once per process; MALLOC_MMAP_THRESHOLD_ /
    MALLOC_TRIM_THRESHOLD_ in the environment (the user's choice) win; no-op without glibc.
    """
    global _malloc_kept
    if _malloc_kept:
        return
    _malloc_kept = True
    if sys.platform != "linux" or "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, MALLOC_KEEP)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, MALLOC_KEEP)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


SHM_DIR = "/dev/shm"
SHM_SHARE_OF_AVAILABLE = 8  # a run's scratch in memory may take at most 1/8 of the host's available memory


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def scratch_dir(need: int, shm: str = SHM_DIR) -> str | None:
    """Where one run's short-lived scratch files of about ``need`` bytes go on this host: the memory
    filesystem when it is there, writable and has room for them (at most 1/8 of the available memory and
    half its free space), else None: the temp dir. Scratch that is written, read once and deleted within
    seconds sits in memory on a disk filesystem too, as dirty pages; there it also costs the filesystem's
    block allocation and journal (audit of the 2 GB bench store: the task tables' writes 0.36-0.53 CPU-s on
    ext4, 0.28-0.29 on tmpfs). A bigger run keeps the disk, whose pages can be written back and dropped.
    A TMPDIR the user set wins (None)."""
    if os.environ.get("TMPDIR") or sys.platform != "linux":
        return None
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    avail = _mem_available()
    if avail is None or not os.access(shm, os.W_OK | os.X_OK):
        return None
    if need > min(avail // SHM_SHARE_OF_AVAILABLE, st.f_bavail * st.f_frsize // 2):
        return None
    return shm


def scratch_tempdir(prefix: str, need: int) -> str | None:
    """A fresh directory for one run's scratch of about ``need`` bytes in the memory filesystem
    (:func:`scratch_dir`), named by :func:`scratch_stem` after the directories of killed runs are swept;
    None where it does not fit (the caller's usual place then)."""
    shm = scratch_dir(need)
    if shm is None:
        return None
    import tempfile

    sweep_dead_scratch(shm, prefix)
    return tempfile.mkdtemp(prefix=scratch_stem(prefix), dir=shm)


def _pid_namespace() -> str:
    """This process's PID namespace (the inode of /proc/self/ns/pid), "" when it cannot be told."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def scratch_stem(prefix: str) -> str:
    """The start of a scratch directory's name in the memory filesystem: ``<prefix>p<pid>.<pid namespace>-``,
    so that a later run can tell the directory of a process that is gone (:func:`sweep_dead_scratch`)."""
    return f"{prefix}p{os.getpid()}.{_pid_namespace()}-"


def sweep_dead_scratch(parent: str, prefix: str) -> int:
    """Remove ``parent`` directories named by :func:`scratch_stem` whose process is gone (a run killed before
    its cleanup: in the memory filesystem they would hold memory until reboot); returns how many. Only
    processes of this PID namespace are judged (a container sharing the filesystem has pids of its own)."""
    import shutil

    ns = _pid_namespace()
    if not ns:
        return 0
    gone = 0
    try:
        names = os.listdir(parent)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(prefix + "p"):
            continue
        pid, _, rest = name[len(prefix) + 1:].partition(".")
        if not pid.isdigit() or not rest.startswith(ns + "-"):
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive (or another user's: not ours to judge)
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        gone += 1
    return gone
