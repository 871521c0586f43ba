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
