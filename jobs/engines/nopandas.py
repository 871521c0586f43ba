"""Processes of ours that never use pandas run without it.

No command and no task of rmqstore uses pandas (only the library's ``as_pandas=True`` does), but pyarrow
imports it on a process's first ``pa.array`` (and ``pyarrow.dataset`` on import) only to ask whether an
argument is a pandas object: 0.2-0.3 s of CPU in every process that imports it, 40% of ``rmqstore info``
on a small store. The ``rmqstore`` command and the process pool's workers therefore hide it; pyarrow then
goes on without it. Code that imports rmqstore as a library (a notebook, the tests, a Spark session's
workers) keeps pandas.
"""

from __future__ import annotations

import sys
from typing import Any


class NoPandas:
    """An import finder for which pandas does not exist."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is not used by rmqstore's own processes", name=name)


def hide_pandas() -> bool:
    """Hide pandas from this process unless it is already imported; True when hidden."""
    if "pandas" in sys.modules or any(isinstance(f, NoPandas) for f in sys.meta_path):
        return "pandas" not in sys.modules
    sys.meta_path.insert(0, NoPandas())
    return True
