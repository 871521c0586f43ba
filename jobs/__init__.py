"""rmqstore jobs and the ``rmqstore`` command.

Importing this package turns off numpy's ``madvise(MADV_HUGEPAGE)`` on large arrays for this process
and the processes it starts (Spark's JVM and Python workers), unless ``NUMPY_MADVISE_HUGEPAGE`` is
already set. With transparent huge pages in ``madvise`` mode and a page cache full of store files,
every fresh array of tens of MB stalls in direct memory compaction (``compact_stall`` in
/proc/vmstat): on the 2 GB audit benchmark the cross-file checks took 0.9-1.1 s with it and
0.6-0.8 s without, the whole Spark audit 2.84 s vs 2.54 s.

It also starts OpenBLAS (numpy's linear algebra) with one thread, unless ``OPENBLAS_NUM_THREADS`` is
set or numpy is already imported. At import, OpenBLAS starts a thread per core that spins for about
0.1 s before it sleeps: about 0.1 CPU-s for every process that imports numpy fresh, for nothing.
rmqstore does no linear algebra, and each pool worker is one core's share anyway.
"""

from __future__ import annotations

import os
import sys


def _numpy_without_hugepage_madvise() -> None:
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:  # the user's (or a parent job's) choice stands
        return
    os.environ["NUMPY_MADVISE_HUGEPAGE"] = "0"  # read by numpy at import, here and in child processes
    np = sys.modules.get("numpy")
    if np is not None:  # numpy is already imported: make the same switch it makes for the variable
        setter = getattr(getattr(getattr(np, "_core", None), "multiarray", None), "_set_madvise_hugepage", None)
        if setter is not None:
            setter(False)


def _openblas_one_thread() -> None:
    if "numpy" not in sys.modules:  # read when numpy loads OpenBLAS: too late once it is imported
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


_numpy_without_hugepage_madvise()
_openblas_one_thread()
