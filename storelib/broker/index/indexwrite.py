"""Index files written to a Location, local or remote: a whole image (the empty successor file the broker
would have) or a file streamed from its runs (storelib.broker.index.indexstream). The rebuild's tasks write
them straight into staging, so they live beside the rules that build them, not in the job."""

from __future__ import annotations

import os

import numpy as np

from storelib.broker.index.indexbuild import IndexImage, IndexState
from storelib.broker.index.indexstream import Runs, stream_index_file
from storelib.fileio.bytesource import Location
from storelib.fileio.direct_write import atomic_direct_file
from storelib.fileio.remotewrite import remote_output
from storelib.format.indexfile import ENTRY_DTYPE, IndexGeometry, IndexHeader


def write_index_image(image: IndexImage, loc: Location) -> None:
    """Write ``image`` at ``loc``; remotely the zero tail is written out (object stores have no holes)."""
    if loc.local:
        os.makedirs(os.path.dirname(loc.path), exist_ok=True)
        image.write(loc.path)
        return
    g = image.geometry
    with remote_output(loc) as f:
        f.write(image.header.to_bytes())
        f.write(np.asarray(image.slots, dtype=">i4").tobytes())
        f.write(bytes(g.entry_pos(1) - g.entries_offset))  # entry 0 is never written: zeros
        ent = np.asarray(image.entries, dtype=ENTRY_DTYPE).tobytes()
        f.write(ent)
        left = g.file_size - g.entry_pos(1) - len(ent)
        zeros = bytes(min(left, 8 << 20))
        while left > 0:
            f.write(zeros[: min(left, len(zeros))])
            left -= len(zeros)


def write_index_runs(runs: Runs, loc: Location, geometry: IndexGeometry,
                     prev_state: IndexState | None) -> tuple[IndexHeader, str]:
    """Stream one index file from its runs (storelib.broker.index.indexstream.stream_index_file) to a temp file beside
    ``loc``, then rename it; returns (header, sha256). Local files get a sparse zero tail and an fsync."""
    if loc.local:
        with atomic_direct_file(loc.path) as fh:  # written once, never read back: past the page cache
            return stream_index_file(runs, fh, geometry=geometry, prev_state=prev_state, sparse_tail=True)
    with remote_output(loc) as f:
        return stream_index_file(runs, f, geometry=geometry, prev_state=prev_state)
