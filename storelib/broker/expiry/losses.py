"""Per-group losses for the retention simulation (:mod:`storelib.broker.expiry.cleaner`): each consumer group's
committed offset moves at its consumption rate, and a deleted segment loses the messages in it at or past that
offset (the broker corrects a group behind the new min offset to it). A mixin of the simulation's state.
"""

from __future__ import annotations

import numpy as np


class GroupLosses:
    """What deletions cost the consumer groups; needs the simulation's geometry (``W``, ``base``, ``S``) and
    its per-pair arrays (``lp``, ``l_*``, ``c_base``, ``t_base``, ``lost_*``, ``first_loss``, ``ranges``)."""

    def _below_pairs(self, x: int) -> np.ndarray:
        """_below(x) for the live pairs' queues."""
        if x > self.W0:
            return self.l_max0 + np.floor((x - self.W0) * self.l_mpb).astype(np.int64)
        row = self.bound_row.get(x)
        return self.l_below[row] if row is not None else self.l_max0

    def _consumed(self, t: int) -> np.ndarray:
        """Committed offsets of the live pairs at t (never past the queue's end)."""
        c = np.floor(self.c_base + self.l_rate * ((t - self.t_base) / 1000.0)).astype(np.int64)
        cap = self.l_max0 + np.floor((max(self.W(t), self.W0) - self.W0) * self.l_mpb).astype(np.int64)
        return np.minimum(c, cap)

    def _jump(self, t: int, below: np.ndarray) -> None:
        """Consumers behind the queue's new min offset resume there."""
        self.c_base = np.maximum(self._consumed(t), below).astype(np.float64)
        self.t_base = float(t)

    def _lose(self, i: int, t: int) -> None:
        """Segment i deleted at t: per pair, the offsets in it at or past the committed offset."""
        if not len(self.lp):
            return
        a = self.base(i)
        lo, hi = self._below_pairs(a), self._below_pairs(a + self.S)
        start = np.maximum(self._consumed(t), lo)
        hit = np.flatnonzero(start < hi)
        if len(hit):
            s_, e_, qmax = start[hit], hi[hit], self.l_max0[hit]
            # existing entries: count and bytes from the sorted (queue, offset) key
            kq = self.l_key[hit]
            i1 = np.searchsorted(self.s.key, kq | np.minimum(s_, qmax), "left")
            i2 = np.searchsorted(self.s.key, kq | np.minimum(e_, qmax), "left")
            # projected entries past the snapshot have the queue's mean size
            fut = np.maximum(0, e_ - np.maximum(s_, qmax))
            cnt = (i2 - i1) + fut
            byt = (self.s.cum_size[i2] - self.s.cum_size[i1]) + np.rint(fut * self.l_mean[hit]).astype(np.int64)
            for j, h in enumerate(self.lp[hit].tolist()):
                if cnt[j] <= 0:
                    continue
                self.lost_msgs[h] += int(cnt[j])
                self.lost_bytes[h] += int(byt[j])
                if self.first_loss[h] is None:
                    self.first_loss[h] = t
                rr = self.ranges[h]
                lo_, hi_ = int(s_[j]), int(e_[j]) - 1
                if rr and rr[-1][1] + 1 >= lo_:
                    rr[-1][1] = max(rr[-1][1], hi_)
                else:
                    rr.append([lo_, hi_])
        self._jump(t, hi)


__all__ = ["GroupLosses"]
