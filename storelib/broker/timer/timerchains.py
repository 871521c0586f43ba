"""The timer wheel's slot chains judged as 5.3.3's broker reads them (TimerMessageStore dequeue, doEnqueue's
num accounting, the timerlog cleaner, the wheel's flush): what the format reader's strict rules (a chain holds
``num`` units, prevPos is an earlier unit) call broken on a healthy broker's store is graded here, once, for
the audit and for ``rmqstore timers``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from storelib.errors import Finding
from storelib.format.timerstore import TimerLog

SHOWN = 10  # findings of one kind listed one by one; the rest are counted in the last


def _listed(found: list[Finding], kind: str, severity: str, items: list[tuple[str, int | None, str, dict]]) -> None:
    for file, off, detail, extra in items[:SHOWN]:
        found.append(Finding(kind, severity, file, off, detail, extra))
    if len(items) > SHOWN:
        found.append(Finding(kind, severity, "timerlog", None, f"... and {len(items) - SHOWN} more like these",
                             {"count": len(items)}))


CHAIN_KINDS = ("timerwheel_chain", "timerlog_bad_prev")  # the format reader's strict rules, re-judged below


def slot_verdict(slot: dict, units: dict[int, tuple[int, bool]], deleted_below: int) -> tuple[str, str]:
    """One wheel slot judged as 5.3.3's broker reads it: ("ok" | "truncated" | "stale_num" | "broken", why).

    dequeue (TimerMessageStore :917-962) walks prevPos from lastPos to -1 and stops where a timerlog file is
    gone (getWholeBuffer null: the cleaner deletes files from the front, :486-488); doEnqueue counts a
    unit +1 and a deletion marker (magic DELETE) -1 in num (:752-754, :773-774); the wheel goes to disk
    every timerFlushIntervalMs and not at shutdown (:552, :1720) and recovery revises lastPos, never num
    (TimerWheel.reviseSlot), so num may miss the newest units (never count units the chain lacks)."""
    at, normal, marks, oldest = slot["last_pos"], 0, 0, None
    while at != -1:
        if at not in units:
            if 0 <= at < deleted_below:
                return "truncated", f"the chain runs into timerlog position {at}, in a file the broker deleted"
            return "broken", f"the chain from lastPos {slot['last_pos']} reaches {at}, which is no timerlog unit"
        prev, delete = units[at]
        if prev >= at:  # a unit's prevPos is an earlier unit: a forward one could loop
            return "broken", f"the chain from lastPos {slot['last_pos']} turns forward at {at} (prevPos {prev})"
        marks, normal = marks + delete, normal + (not delete)
        oldest, at = at, prev
    num = slot["num"]
    counted = f"{normal} unit(s) and {marks} deletion marker(s) (num {normal - marks} when every one is counted)"
    if oldest != slot["first_pos"]:
        return "broken", f"the chain from lastPos {slot['last_pos']} ends at {oldest}, not at firstPos {slot['first_pos']}"
    if num == normal - marks:
        return "ok", ""
    if -marks <= num <= normal:
        return "stale_num", f"num {num}, the chain holds {counted}"
    return "broken", f"num {num} but the chain holds only {counted}"


def judge_chains(tl: TimerLog, wheel: pa.Table, found: list[Finding], last_read_ms: int | None) -> list[Finding]:
    """The format reader's findings with its strict chain rules (chain length == num, prevPos an earlier
    unit) replaced by the broker's (:func:`slot_verdict`): the audit and ``rmqstore timers`` judge a wheel alike."""
    kept = [f for f in found if f.kind not in CHAIN_KINDS]
    u = tl.units
    pos = u.column("pos").to_numpy()
    prev = u.column("prev_pos").to_numpy()
    units = dict(zip(pos.tolist(), zip(prev.tolist(), u.column("delete").to_pylist())))
    deleted_below = min((f["base"] for f in tl.files), default=0)
    known = np.isin(prev, pos) | (prev == -1) | ((prev >= 0) & (prev < deleted_below))
    bad = np.flatnonzero(~known | ((prev >= pos) & (prev != -1)))
    files, offs = u.column("file").to_pylist(), u.column("file_offset").to_numpy()
    _listed(kept, "timerlog_bad_prev", "error", [
        (files[i], int(offs[i]), f"prevPos {int(prev[i])} is not an earlier unit of the timerlog", {})
        for i in bad.tolist()])
    verdicts: dict[str, list] = {"broken": [], "stale_num": [], "truncated": []}
    for row in wheel.select(["index", "time_ms", "first_pos", "last_pos", "num", "file_offset"]).to_pylist():
        kind, why = slot_verdict(row, units, deleted_below)
        if kind != "ok":
            verdicts[kind].append(("timerwheel", row["file_offset"], f"slot {row['index']}: {why}",
                                   {"slot_time_ms": row["time_ms"]}))
    _listed(kept, "timerwheel_chain", "error", verdicts["broken"])
    _listed(kept, "timerwheel_num_stale", "warning", [(f, o, d + ": the broker writes its wheel every "
                                                          "timerFlushIntervalMs and not at shutdown, and its recovery "
                                                          "revises lastPos but never num (TimerWheel.reviseSlot); "
                                                          "delivery walks the chain; num only feeds the congestion "
                                                          "check (isReject) and the dequeue-behind metric", e)
                                                         for f, o, d, e in verdicts["stale_num"]])
    trunc = verdicts["truncated"]
    if trunc:
        pending = sum(1 for *_, e in trunc if last_read_ms is not None and e["slot_time_ms"] >= last_read_ms)
        kept.append(Finding("timerwheel_chain_truncated", "info", "timerwheel", trunc[0][1],
                            f"{len(trunc)} slot(s) ({pending} not yet read) chain back into timerlog files before "
                            f"{deleted_below}, which the broker deleted once their units' records left the commitlog "
                            "(TimerMessageStore :486-488); its dequeue stops there", {"count": len(trunc)}))
    return kept


__all__ = ["CHAIN_KINDS", "judge_chains", "slot_verdict"]
