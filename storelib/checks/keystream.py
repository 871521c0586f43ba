"""The log's index keys in dispatch order, matched against the index files one after the other
(:func:`storelib.checks.index.check_index`), holding at most a chunk of keys at a time: streamed from the
segments' key tables (:mod:`storelib.checks.crossstream`), or over the whole view's key table
(:meth:`KeyStream.of_view`)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from storelib.checks.logview import LogView, Unsettled
from storelib.checks.segment import Capped
from storelib.errors import Finding


class KeyStream:
    """Index files are matched against the keys one file after the other (:meth:`next_are_entries`).

    A healthy store's index files hold exactly these keys, in this order (the broker indexes each record's
    keys as it dispatches it): when a file's entries equal the next keys (PHYSICALOFFSET, hash), every
    entry points at the start of its record with the hash of one of its keys, which is what per-entry
    lookups would conclude, so they are skipped. That holds only while records sit at their
    PHYSICALOFFSET fields: streamed (``strict``), a key that does not raises :class:`Unsettled`; over
    the whole view, ``aligned`` says whether they all do, and once a file does not match, no later file
    is matched (the whole view looks their entries up)."""

    def __init__(self, tables: Iterator[pa.Table], n: int, cur: int = 0, *, strict: bool = True,
                 aligned: bool = True) -> None:
        self._tables = (b for t in tables for b in t.to_batches())  # a batch at a time: bounded copies
        self.n = n  # keys in the whole log
        self.cur = cur  # keys matched so far (``cur`` > 0: by an earlier run, whose unmatched keys lead ``tables``)
        self.strict = strict
        self.aligned = aligned  # False: no (further) file is the keys' sequence
        self.spans: list[tuple[int, int]] = []  # key ranges matched by files
        self._phy: list[np.ndarray] = []  # keys read from tables and not matched yet, in order
        self._hash: list[np.ndarray] = []
        self._have = 0

    @classmethod
    def of_view(cls, log: LogView) -> KeyStream:
        """The whole view's keys (:class:`~storelib.checks.logview.LogView`): matched only when record
        positions are unique, ascending and equal to the records' PHYSICALOFFSET fields (then a lookup by
        field finds that record), which is decided here for the whole log."""
        k, phy = log.keys, log.phy
        aligned = log.field_unique and bool(np.all(phy[1:] > phy[:-1]))
        aligned = aligned and all(np.array_equal(p.to_numpy(), f.to_numpy())
                                  for p, f in zip(k.column("pos").chunks, k.column("phy").chunks))
        return cls(iter([k]), k.num_rows, strict=False, aligned=aligned)

    def _fill(self, m: int) -> bool:
        while self._have < m:
            if not self._pull():
                return False
        return True

    def _pull(self) -> bool:
        """One more batch of keys into the buffer (False: none left)."""
        t = next(self._tables, None)
        if t is None:
            return False
        pos, phy = t.column("pos").to_numpy(), t.column("phy").to_numpy()
        if self.strict and not np.array_equal(pos, phy):
            raise Unsettled("a key's record is not at its PHYSICALOFFSET field")
        if len(phy):
            self._phy.append(phy)
            self._hash.append(t.column("key_hash").to_numpy())  # int32, as the entries hold it: no copy
            self._have += len(phy)
        return True

    def _take(self, m: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The next ``m`` keys (copies only when they span tables)."""
        if not self._fill(m):
            return None
        phy, kh, got = [], [], 0
        while got < m:
            a, b = self._phy[0], self._hash[0]
            k = min(m - got, len(a))
            phy.append(a[:k])
            kh.append(b[:k])
            if k == len(a):
                self._phy.pop(0)
                self._hash.pop(0)
            else:
                self._phy[0], self._hash[0] = a[k:], b[k:]
            got += k
        self._have -= m
        return (phy[0], kh[0]) if len(phy) == 1 else (np.concatenate(phy), np.concatenate(kh))

    def next_are_entries(self, ent: np.ndarray, chunk: int = 1 << 20) -> bool:
        """Are one file's raw entries (in entry order) the next keys? Advances past them if so. Compared
        ``chunk`` entries at a time: no whole-file copy of their columns."""
        m = len(ent)
        if not self.aligned or self.cur + m > self.n:
            self.aligned = False
            return False
        for lo in range(0, m, chunk):
            part = ent[lo:lo + chunk]
            got = self._take(len(part))
            if (got is None or not np.array_equal(got[0], part["phy_offset"].astype(np.int64))
                    or not np.array_equal(got[1], part["key_hash"].astype(np.int32))):
                self.aligned = False
                return False
        self.spans.append((self.cur, self.cur + m))
        self.cur += m
        return True

    def all_matched(self) -> bool:
        """Did the files, in order, hold every key exactly (so every key is findable)?"""
        return self.aligned and self.cur == self.n

    def behind(self, max_end_phy: int, out: Capped) -> None:
        """The keys no file holds are those of messages after the last indexed one (the broker indexes them
        when it dispatches): said as the whole view says it; any other unmatched key raises Unsettled."""
        if not self._fill(1):
            raise Unsettled("fewer keys than counted")
        first = int(self._phy[0][0])
        if first <= max_end_phy:
            raise Unsettled("a key at or before the last indexed message is in no index file")
        out.add(behind_finding(self.n - self.cur, max_end_phy))

    def snapshot(self, limit: int, indexed: bool) -> dict | None:
        """The keys no index file holds yet (the rest of the stream), for a later run to go on from; None
        when more than ``limit``. ``indexed`` False (no index file was checked): no key is carried."""
        if not indexed:
            return {"cur": self.n, "n": self.n, "phy": [], "hash": []}
        while self._have <= limit and self._pull():
            pass
        if self._have > limit or self._have != self.n - self.cur:
            return None
        phy = np.concatenate(self._phy) if self._phy else np.zeros(0, np.int64)
        kh = np.concatenate(self._hash) if self._hash else np.zeros(0, np.int32)
        return {"cur": self.cur, "n": self.n, "phy": phy.tolist(), "hash": kh.tolist()}


def behind_finding(count: int, max_end_phy: int) -> Finding:
    """``count`` keys of messages after the last indexed one: the broker indexes them when it dispatches."""
    return Finding("index_behind_commitlog", "warning", "index", None,
                   f"{count} keys of messages after the last indexed message ({max_end_phy}) are not indexed yet; "
                   "the broker indexes them when it dispatches", {"count": count})


def pending_table(snap: dict) -> pa.Table:
    """An earlier run's unmatched keys as a key table (they lead this run's stream)."""
    phy = pa.array(snap["phy"], pa.int64())
    return pa.table({"pos": phy, "phy": phy, "key_hash": pa.array(snap["hash"], pa.int32())})
