"""Prometheus metrics of a scheduled run (``--metrics-file F``), in the text exposition format that the
node_exporter textfile collector reads: written to a temp file beside F, then renamed over it, so the
collector never sees half a file.

Names follow Prometheus conventions: a ``rmqstore_audit_``/``rmqstore_expiry_`` prefix, base units in the
name (``_bytes``, ``_seconds``), ``_total`` only on counters (these are all gauges: each run replaces
them), every sample labelled with the ``store`` it describes. The metric list is in docs/scheduling.md.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

LabelSet = tuple[tuple[str, str], ...]


@dataclass
class Family:
    """One metric family: name, help, type and its samples (labels -> value)."""

    name: str
    help: str
    type: str = "gauge"
    samples: list[tuple[LabelSet, float]] = field(default_factory=list)

    def add(self, value: float | int | None, **labels: Any) -> None:
        if value is None:
            return
        self.samples.append((tuple((k, str(v)) for k, v in labels.items()), float(value)))


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n")


def _number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return str(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)


NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def exposition(families: list[Family]) -> str:
    """The families as Prometheus text exposition format (version 0.0.4)."""
    out: list[str] = []
    for fam in families:
        if not NAME_RE.match(fam.name):
            raise ValueError(f"bad metric name {fam.name!r}")
        out.append(f"# HELP {fam.name} {_escape_help(fam.help)}")
        out.append(f"# TYPE {fam.name} {fam.type}")
        for labels, value in fam.samples:
            lab = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
            out.append(f"{fam.name}{{{lab}}} {_number(value)}" if lab else f"{fam.name} {_number(value)}")
    return "\n".join(out) + "\n"


def write_textfile(path: str, families: list[Family]) -> None:
    """Write the exposition atomically (temp file beside ``path``, then rename; the umask's permissions)."""
    from storelib.fileio.publish import atomic_local_file

    text = exposition(families)
    with atomic_local_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def previous_value(path: str, name: str, store: str) -> float | None:
    """A sample of the file a previous run wrote (e.g. the last success time a failed run keeps)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    want = f'{name}{{store="{_escape_label(store)}"}} '
    for line in text.splitlines():
        if line.startswith(want):
            try:
                return float(line[len(want):].split()[0])
            except (ValueError, IndexError):
                return None
    return None


# ------------------------------------------------------------------------------------------------
# audit


def audit_families(store: str, report: dict[str, Any] | None, *, exit_code: int, wall_seconds: float,
                   previous_success: float | None = None, now: float | None = None) -> list[Family]:
    """The ``rmqstore_audit_`` families of one run; ``report`` None: the run could not read the store
    (``up`` 0, the last success time carried over from the previous file)."""
    now = time.time() if now is None else now
    up = Family("rmqstore_audit_up", "1 when the audit read the store, 0 when it could not run")
    up.add(1 if report is not None else 0, store=store)
    code = Family("rmqstore_audit_exit_code", "exit code of the run: 0 clean, 1 findings at or above --fail-on, "
                                              "2 could not run, 3 another run holds the lock")
    code.add(exit_code, store=store)
    last_ok = Family("rmqstore_audit_last_success_time_seconds",
                     "unix time of the last run that read the store (clean or not)")
    last_ok.add(now if report is not None else previous_success, store=store)
    duration = Family("rmqstore_audit_duration_seconds",
                      "wall time of the run by phase: startup (settings, planning, Spark session) and work "
                      "(segment and cross-file checks)")
    fams = [up, code, last_ok, duration]
    if report is None:
        duration.add(wall_seconds, store=store, phase="startup")
        return fams
    run = report.get("run") or {}
    work = float(run.get("segment_seconds", 0) or 0) + float(run.get("cross_check_seconds", 0) or 0)
    duration.add(max(0.0, wall_seconds - work), store=store, phase="startup")
    duration.add(work, store=store, phase="work")
    s = report["summary"]

    findings = Family("rmqstore_audit_findings", "findings of this run by severity and kind")
    by_kind: dict[tuple[str, str], int] = {}
    for f in report["findings"]:
        by_kind[(f["severity"], f["kind"])] = by_kind.get((f["severity"], f["kind"]), 0) + 1
    for (sev, kind), n in sorted(by_kind.items()):
        findings.add(n, store=store, severity=sev, kind=kind)
    by_sev = Family("rmqstore_audit_findings_by_severity", "findings of this run per severity (0 included)")
    for sev in ("critical", "error", "warning", "info"):
        by_sev.add(s["by_severity"].get(sev, 0), store=store, severity=sev)
    fams += [findings, by_sev]

    def one(name: str, help_: str, value: float | int | None) -> None:
        fam = Family(name, help_)
        fam.add(value, store=store)
        fams.append(fam)

    one("rmqstore_audit_records", "valid commitlog records", s["records"])
    one("rmqstore_audit_valid_bytes", "bytes of valid commitlog records", s["bytes_valid"])
    one("rmqstore_audit_audited_bytes", "commitlog file bytes audited by this run (not carried forward)",
        run.get("bytes_audited"))
    one("rmqstore_audit_segments", "commitlog segments present", s["segments"])
    one("rmqstore_audit_queues", "ConsumeQueues", s["queues"])
    one("rmqstore_audit_bad_region_bytes", "bytes in corrupt regions of the commitlog", s["bytes_lost"])
    one("rmqstore_audit_crc_failed_records", "records failing their body or property CRC", s.get("crc_errors", 0))
    one("rmqstore_audit_crc_failed_bytes", "bytes of the records failing their CRC", s.get("bytes_crc_failed", 0))
    one("rmqstore_audit_oldest_store_time_seconds", "store time of the oldest record (unix seconds)",
        None if s["first_store_ts"] is None else s["first_store_ts"] / 1000)
    one("rmqstore_audit_newest_store_time_seconds", "store time of the newest record (unix seconds)",
        None if s["last_store_ts"] is None else s["last_store_ts"] / 1000)
    one("rmqstore_audit_commitlog_end_offset_bytes", "physical offset after the last valid record",
        s["commitlog_end_offset"])
    damage = report.get("damage") or {}
    one("rmqstore_audit_startup_loss_messages", "messages a broker start-up would drop (0 without damage)",
        damage.get("messages_lost", 0))
    live = report.get("live") or {}
    one("rmqstore_audit_live", "1 when a broker ran the store during the run (its lock held): read up to a cut",
        1 if live.get("live") else 0)
    if live.get("live"):
        one("rmqstore_audit_live_pid", "pid of the broker running the store (absent when unknown)", live.get("pid"))
        one("rmqstore_audit_cut_offset_bytes", "physical commitlog offset of the run's cut (a live store)",
            live.get("cut_offset"))
        one("rmqstore_audit_cut_time_seconds", "when the run's cut was taken (unix seconds)",
            live["cut_time_ms"] / 1000 if live.get("cut_time_ms") else None)
        lagf = next((f for f in report["findings"] if f["kind"] == "dispatch_lag"), None)
        extra = (lagf or {}).get("extra") or {}
        one("rmqstore_audit_dispatch_lag_messages", "messages written before the cut, not in their consume queue yet",
            extra.get("messages", 0))
        one("rmqstore_audit_dispatch_lag_bytes", "bytes of those messages (over --max-lag: a warning)",
            extra.get("bytes", 0))

    lag = Family("rmqstore_audit_queue_lag_messages",
                 "per ConsumeQueue: messages in the commitlog that its ConsumeQueue lacks (commitlog max - CQ max)")
    lag_b = Family("rmqstore_audit_queue_lag_bytes", "per ConsumeQueue: bytes of the messages it lacks")
    qmax = Family("rmqstore_audit_queue_max_offset", "per ConsumeQueue: its max offset (entries)")
    for q in report["queues"]:
        labels = {"store": store, "topic": q["topic"], "queue_id": q["queue_id"]}
        lag.add(q.get("lag"), **labels)
        lag_b.add(q.get("lag_bytes"), **labels)
        qmax.add(q.get("max_offset"), **labels)
    return fams + [lag, lag_b, qmax]


# ------------------------------------------------------------------------------------------------
# expiry


def expiry_families(store: str, report: dict[str, Any], *, now: float | None = None) -> list[Family]:
    """The ``rmqstore_expiry_`` families: per policy, what it deletes next and what it would lose."""
    now = time.time() if now is None else now
    up = Family("rmqstore_expiry_up", "1 when the simulation ran")
    up.add(1, store=store)
    last = Family("rmqstore_expiry_last_success_time_seconds", "unix time of this simulation")
    last.add(now, store=store)
    nxt = Family("rmqstore_expiry_next_deletion_time_seconds",
                 "per policy: when its cleaner first deletes a commitlog file (unix seconds)")
    freed = Family("rmqstore_expiry_freed_bytes", "per policy: commitlog bytes its deletions free over the horizon")
    deleted = Family("rmqstore_expiry_deleted_files", "per policy: files deleted over the horizon, by kind")
    lost = Family("rmqstore_expiry_lost_messages", "per policy: unconsumed messages deleted before their groups read them")
    lost_b = Family("rmqstore_expiry_lost_bytes", "per policy: bytes of those messages")
    first_loss = Family("rmqstore_expiry_first_loss_time_seconds", "per policy: when the first unconsumed message goes")
    groups = Family("rmqstore_expiry_groups_with_loss", "per policy: consumer groups that lose messages")
    timers = Family("rmqstore_expiry_lost_timers", "per policy: pending 5.x timer messages whose commitlog segment "
                    "is deleted before their deliver time (absent without a timer store)")
    horizon = Family("rmqstore_expiry_horizon_end_time_seconds", "end of the simulated interval (unix seconds)")
    sim = report.get("simulation", {})
    if sim.get("until_ms") is not None:
        horizon.add(sim["until_ms"] / 1000, store=store)
    for p in report["policies"]:
        labels = {"store": store, "policy": p["name"]}
        m = p["summary"]
        if m.get("first_deletion_ms") is not None:
            nxt.add(m["first_deletion_ms"] / 1000, **labels)
        if sim.get("segment_size"):  # every commitlog file is one segment long
            freed.add(m.get("commitlog_deleted", 0) * int(sim["segment_size"]), **labels)
        for kind, key in (("commitlog", "commitlog_deleted"), ("consumequeue", "consumequeue_deleted"),
                          ("index", "index_deleted")):
            deleted.add(m.get(key, 0), **labels, kind=kind)
        lost.add(m["lost_messages"], **labels)
        lost_b.add(m["lost_bytes"], **labels)
        if m.get("first_loss_ms") is not None:
            first_loss.add(m["first_loss_ms"] / 1000, **labels)
        groups.add(m["groups_with_loss"], **labels)
        if p.get("timers") is not None:
            timers.add(p["timers"]["lost_timers"], **labels)
    return [up, last, horizon, nxt, freed, deleted, lost, lost_b, first_loss, groups, timers]


__all__ = ["Family", "audit_families", "expiry_families", "exposition", "previous_value", "write_textfile"]
