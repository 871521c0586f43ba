"""The checkpoint a start-up leaves (:func:`storelib.broker.startup.startup.simulate`): its timestamps claim no
more than the store holds after recovery; 5.x also sets confirmPhyOffset as its recovery does
(:mod:`storelib.broker.startup.startup5x`); 4.9.8 keeps bytes 24.. (it never writes them)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from storelib.broker.settings.store import Store
from storelib.fileio.smallfile_io import read_small
from storelib.format.checkpoint import CHECKPOINT_SIZE, Checkpoint
from storelib.format.record import gets_cq_unit
from storelib.scan.commitlog import Segment
from storelib.scan.scanner import SegmentScan


def last_records(store: Store, P: int) -> tuple[int, int, int] | None:
    """(start, store time, store time of the last CQ-able record or 0) of the last record before P."""
    segs = [s for s in store.commitlog.segments if s.base < P and s.file_size > 0]
    opts = store.commitlog.scan_options()
    for seg in reversed(segs):
        with seg.open() as src:
            scan = SegmentScan(src, seg.display, seg.base, 0, P - seg.base, verify_crc=False, with_properties=False,
                               columns=["phy_offset", "store_timestamp", "tran_type"], **opts)
            last = None
            last_cq = 0
            for b in scan:
                if b.num_rows:
                    last = (int(b.column("phy_offset")[-1].as_py()), int(b.column("store_timestamp")[-1].as_py()))
                    tt = np.asarray(b.column("tran_type"))
                    cq = np.flatnonzero(gets_cq_unit(tt))
                    if len(cq):
                        last_cq = int(b.column("store_timestamp")[int(cq[-1])].as_py())
            if last is not None:
                return last[0], last[1], last_cq
    return None


def checkpoint_after(store: Store, cp: Checkpoint, version: str, P: int, segs: list[Segment],
                      confirm: int | None = None) -> Checkpoint:
    """The checkpoint rewritten to claim no more than the store holds after the start-up. 5.x: ``confirm``,
    the confirmPhyOffset of a recovery window without a valid record (startup5x), else the start of the last."""
    last = last_records(store, P) if segs else None
    if last is None:
        new_cp = replace(cp, physic_msg_timestamp=0, logics_msg_timestamp=0, index_msg_timestamp=0)
    else:
        start, t_last, t_cq = last
        new_cp = replace(cp, physic_msg_timestamp=t_last,
                         logics_msg_timestamp=t_cq if t_cq else min(cp.logics_msg_timestamp, t_last),
                         index_msg_timestamp=min(cp.index_msg_timestamp, t_last))
        confirm = start if confirm is None else confirm
    if version == "5" and confirm is not None:
        new_cp = replace(new_cp, confirm_phy_offset=confirm)
    return new_cp


def checkpoint_image(store: Store, cp: Checkpoint, version: str) -> bytes:
    """The new 4096-byte checkpoint: fields patched into the existing page (4.9.8 keeps bytes 24..)."""
    old = read_small(store.path("checkpoint"), 1 << 20)
    page = bytearray(old[:CHECKPOINT_SIZE]) if old else bytearray(CHECKPOINT_SIZE)
    if len(page) < CHECKPOINT_SIZE:
        page += bytes(CHECKPOINT_SIZE - len(page))
    n = 40 if version == "5" else 24
    page[:n] = cp.to_bytes()[:n]
    return bytes(page)
