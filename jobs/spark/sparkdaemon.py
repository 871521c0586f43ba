"""Spark's Python daemon for the sessions rmqstore starts on this machine (``spark.python.daemon.module``).

Spark starts its Python workers from ``pyspark.daemon`` with ``$SPARK_HOME/python/lib/pyspark.zip``
first on their path. Python cannot cache compiled code for a module imported from a zip, so every
session's first Python task waited while PySpark was compiled from source: 0.4 s of the 0.5 s the
daemon took to come up (measured on the 2-core machine, Spark 4.3). When that zip is the one inside the
installed ``pyspark`` package (a pip install: the same code), this daemon moves it behind the installed
package, whose compiled files are cached, and then runs Spark's own daemon unchanged. Any other layout
(a separate ``SPARK_HOME`` on a cluster) keeps Spark's order.
"""

from __future__ import annotations

import os
import sys


def _installed_pyspark_dir() -> str | None:
    """The directory of the ``pyspark`` package installed beside this interpreter (not a zip), or None."""
    for entry in sys.path:
        if not entry or entry.endswith(".zip"):
            continue
        candidate = os.path.join(entry, "pyspark")
        if os.path.isfile(os.path.join(candidate, "__init__.py")):
            return os.path.realpath(candidate)
    return None


def prefer_installed_pyspark() -> bool:
    """Move the installed package's own ``python/lib/*.zip`` entries (pyspark, py4j) to the end of
    ``sys.path``; True when it did."""
    installed = _installed_pyspark_dir()
    if installed is None:
        return False
    own = os.path.join(installed, "python", "lib") + os.sep
    zips = [p for p in sys.path if p.endswith(".zip") and os.path.realpath(p).startswith(own)]
    for p in zips:
        sys.path.remove(p)
    sys.path.extend(zips)
    return bool(zips)


if __name__ == "__main__":
    prefer_installed_pyspark()
    from pyspark.daemon import manager

    manager()
