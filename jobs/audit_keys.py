"""Index-key hashes for the audit's segment tasks: exactly :func:`storelib.indexfile.index_keys`.

The inverse-power prefix-sum hashing that was first written here (~2.5x cheaper than a per-byte
exponent gather) now lives in :mod:`storelib.javahash` (``hash_units``, ``java_hashes``), so the
scanner's tagsCode, the index builder and the audit share one implementation. This module keeps the
audit's names.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from storelib.indexfile import index_keys
from storelib.javahash import hash_units, java_hashes

__all__ = ["audit_index_keys", "hash_units", "java_hashes"]


def audit_index_keys(batch: pa.RecordBatch | pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(row_index int64, key hash int32) in dispatch order: :func:`storelib.indexfile.index_keys`."""
    return index_keys(batch)
