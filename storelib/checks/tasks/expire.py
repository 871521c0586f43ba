"""An incremental run's carry after the broker's cleaner deleted the oldest segments since the run that
made it (or during this one): what pointed into them leaves the carry, so the run goes on from it
rather than auditing the store in full, and reports what a full audit at the same cut would.

The cleaner deletes the oldest commitlog segments, then every consume-queue file whose last unit points
below the new first offset, then every index file but the last whose endPhyOffset lies below it
(4.9.8 ``DefaultMessageStore.java:1674-1706``, ``:1872-1896``; ``index/IndexService.java:90-120``). So:

* a queue group whose carried tails hold records below the log's first offset is checked again: its
  stream drops them (:meth:`storelib.checks.queuestream.QueueStream.resume`), its carried series drop
  the time buckets before the first record left;
* an index file the carry checked and that is gone is dropped when the cleaner's rule says it could go
  (its last entry below the first offset); the keys the carry left unindexed whose records are gone leave
  it, and a grown file's new entries that point below the first offset are skipped, as a full run skips
  a file's expired head;
* the timer topic's carried records below it are dropped and the timer store is judged again.

Anything else (a file gone that the cleaner would not delete, lag the cleaner took) is Unsettled: the
run audits the store in full.
"""

from __future__ import annotations

from typing import Any

from storelib.checks.logview import Unsettled

TAIL_FIRST_PHY = 5  # a carried stream tail: [topic code, qid, min_qo, max_qo, messages, first_phy, ...]


def moved(carry: dict | None, log_min: int) -> bool:
    """Has the log's first offset moved past the carry's (the cleaner deleted segments since)?"""
    return carry is not None and log_min > carry.get("log_min", log_min)


def group_expired(c: dict[str, Any], log_min: int) -> bool:
    """Does a carried queue group hold records below ``log_min`` (it must be checked again)?"""
    return any(t[TAIL_FIRST_PHY] < log_min for t in c["snap"]["tails"])


def expire_carry(carry: dict[str, Any], log_min: int, index_names: set[str]) -> dict[str, Any]:
    """``carry`` without the index files and timer records the cleaner deleted below ``log_min``
    (``index_names``: the index files listed at the cut); Unsettled when something is gone that the
    cleaner would not have deleted."""
    out = dict(carry)
    ix = {}
    for name, snap in carry["index"].items():
        if name in index_names:
            ix[name] = snap
        elif snap["info"]["end_phy"] >= log_min:
            raise Unsettled(f"index/{name}, checked by an earlier run, is gone though it indexes records left")
    gone = [n for n in carry["index"] if n not in ix]
    if gone and ix and max(gone) > min(ix):  # names are creation times: the cleaner takes the oldest
        raise Unsettled("an index file checked by an earlier run is gone, and older ones are not")
    out["index"] = ix
    out["keys"] = expire_keys(carry["keys"], log_min)
    t = carry.get("timers")
    if t is not None and t.get("records"):
        recs = t["records"]
        keep = [i for i, p in enumerate(recs["phy_offset"]) if p >= log_min]
        out["timers"] = {**t, "records": {k: [v[i] for i in keep] for k, v in recs.items()}, "files": None}
    return out


def expire_keys(keys: dict[str, Any], log_min: int) -> dict[str, Any]:
    """The keys an earlier run left unindexed (dispatch lag at its cut) less those whose records the cleaner
    deleted since: they are in dispatch (log) order, so those go as a prefix. Their entries, if the broker
    indexed them before the cleaner ran, lead a grown file's new entries and are skipped there as a full
    run skips a file's expired head (:func:`storelib.checks.tasks.indexplan.index_plan`)."""
    phy = keys["phy"]
    k = next((i for i, p in enumerate(phy) if p >= log_min), len(phy))
    if not k:
        return keys
    return {**keys, "n": keys["n"] - k, "phy": phy[k:], "hash": keys["hash"][k:]}


__all__ = ["expire_carry", "expire_keys", "group_expired", "moved"]
