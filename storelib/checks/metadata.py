"""The store's small files against the data: the checkpoint, the abort and lock markers, config/*.json
(with their .bak) and the consumer offsets against the queues."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from storelib.checks.logview import LogSummary, rel_path
from storelib.checks.segment import Capped
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location
from storelib.format.record import SCHEDULE_TOPIC

if TYPE_CHECKING:
    from storelib.broker.settings.livecut import StoreCut


def check_checkpoint(root: Location, log: LogSummary, out: Capped, now_ms: int, cut: StoreCut | None = None):
    """Checkpoint timestamps within the data's store-time range (and not in the future). A live store's is
    the one its cut read first, before the data it is compared with."""
    from storelib.format.checkpoint import read_checkpoint

    try:
        cp = _checkpoint_at(cut, root) if cut is not None and cut.live else read_checkpoint(root, strict=False)
    except StoreError as e:
        sev = "warning" if e.kind == "missing" else "error"
        out.add(Finding("checkpoint_" + e.kind, sev, "checkpoint", e.offset, e.detail))
        return None
    if log.ts_lo is None or log.ts_hi is None:
        return cp
    lo, hi = log.ts_lo, log.ts_hi
    for name, off in (("physic_msg_timestamp", 0), ("logics_msg_timestamp", 8), ("index_msg_timestamp", 16)):
        v = getattr(cp, name)
        if v > now_ms + 60_000:
            out.add(Finding("checkpoint_in_future", "error", "checkpoint", off,
                            f"{name} {v} is after the current time {now_ms}", {"field": name, "value": v}))
        elif v > hi:
            out.add(Finding("checkpoint_ahead_of_data", "error", "checkpoint", off,
                            f"{name} {v} is after the newest store timestamp in the commitlog ({hi}): the checkpoint "
                            "claims data that is not there; abnormal recovery would trust segments it should re-check",
                            {"field": name, "value": v, "data_max": hi}))
        elif 0 < v < lo and name != "index_msg_timestamp":
            out.add(Finding("checkpoint_behind_data", "info", "checkpoint", off,
                            f"{name} {v} is before the oldest store timestamp ({lo}): abnormal recovery would re-scan "
                            "from the first segment", {"field": name, "value": v, "data_min": lo}))
    if cp.confirm_phy_offset and cp.confirm_phy_offset > log.log_end:
        out.add(Finding("confirm_offset_past_data", "warning", "checkpoint", 32,
                        f"confirmPhyOffset {cp.confirm_phy_offset} is past the end of the data ({log.log_end})"))
    return cp


def _checkpoint_at(cut: StoreCut, root: Location):
    """The checkpoint as the cut read it (the same errors as reading the file)."""
    from storelib.format.checkpoint import FIELDS_SIZE, Checkpoint

    path = root.join("checkpoint").path
    if cut.checkpoint is None:
        raise StoreError(path, None, "missing", "no checkpoint file")
    if len(cut.checkpoint) < FIELDS_SIZE:
        raise StoreError(path, len(cut.checkpoint), "truncated",
                         f"checkpoint is {len(cut.checkpoint)} bytes, expected {FIELDS_SIZE}")
    return Checkpoint.from_bytes(cut.checkpoint[:FIELDS_SIZE], path)


def check_markers(root: Location, out: Capped, cut: StoreCut | None = None):
    """lock marker (a live broker?); returns the abort state (reported by :func:`report_abort`). A broker
    the run's cut found is a fact of the report (its ``live`` block); one that holds the lock now but did
    not when the cut was taken started during the run, which then read a moving target."""
    from storelib.format.markers import abort_state, lock_state

    ab = abort_state(root)
    try:
        lk = lock_state(root)
    except StoreError:
        return ab
    if lk.held_by_other and not (cut is not None and cut.live):
        out.add(Finding("broker_running", "critical", "lock", 0,
                        f"another process{f' (pid {lk.holder_pid})' if lk.holder_pid else ''} holds the store lock: "
                        "a live broker is writing this store; the audit saw a moving target"
                        + (" (it started during the run)" if cut is not None else "")))
    elif lk.exists and not lk.content_ok:
        out.add(Finding("lock_content", "info", "lock", 0, "lock file does not hold the 4 bytes 'lock'"))
    return ab


def report_abort(ab, idx_info: dict, out: Capped) -> None:
    """An abort file: say what the next broker start does, including the index files it deletes."""
    from storelib.format.markers import what_broker_does

    if not ab.exists:
        return
    dele = idx_info.get("deleted_on_abnormal_start", [])
    more = (f"; {len(dele)} index file(s) would be deleted ({', '.join(dele[:5])}"
            f"{'…' if len(dele) > 5 else ''})" if dele else "")
    out.add(Finding("abort_present", "warning", "abort", None,
                    "the broker was not shut down cleanly: " + what_broker_does(ab) + more,
                    {"pid": ab.pid, "index_files_deleted": dele}))


CONFIG_FILES = ["topics.json", "consumerOffset.json", "subscriptionGroup.json", "delayOffset.json",
                "consumerFilter.json", "lmqConsumerOffset.json"]


def check_configs(root: Location, out: Capped) -> dict[str, Any]:
    """config/*.json readable (fastjson quirks), ``.bak`` agreeing or older; returns the loaded data."""
    from storelib.fileio.smallfile_io import read_small
    from storelib.format.configjson import load_config

    loaded: dict[str, Any] = {}
    for name in CONFIG_FILES:
        loc = root.join("config", name)
        present = [root.fs.get_file_info(p).type.name != "NotFound" for p in (loc.path, loc.path + ".bak",
                                                                                   loc.path + ".tmp")]
        if not any(present):
            continue
        ld = load_config(root, name)
        for f in ld.findings:
            f.file = rel_path(root.path, f.file)
            if f.kind in ("config_unparseable", "config_empty") and f.severity == "warning":
                f.severity = "error" if ld.source is None else "warning"
            if f.kind == "config_missing" and ld.source == "bak":
                f.severity = "warning"
            out.add(f)
        loaded[name] = ld.data
        if ld.source == "file" and present[1]:
            try:
                from storelib.format.fastjson import parse_fastjson
                from storelib.format.properties import java_string

                raw = read_small(Location(loc.fs, loc.path + ".bak", loc.local))
                bak = parse_fastjson(java_string(raw)) if raw else None
            except StoreError:
                bak = None
            if bak is not None and ld.data is not None:
                _compare_bak(name, ld.data, bak, out)
    return loaded


def _compare_bak(name: str, data: dict, bak: dict, out: Capped) -> None:
    dv, bv = data.get("dataVersion") or {}, bak.get("dataVersion") or {}
    if isinstance(dv, dict) and isinstance(bv, dict) and dv.get("counter") is not None and bv.get("counter") is not None:
        try:
            if int(bv["counter"]) > int(dv["counter"]):
                out.add(Finding("config_bak_newer", "warning", f"config/{name}.bak", None,
                                f".bak dataVersion counter {bv['counter']} is newer than the file's {dv['counter']}: "
                                "the last persist may have been lost"))
        except (TypeError, ValueError):
            pass
        return
    if name in ("consumerOffset.json", "lmqConsumerOffset.json"):
        from storelib.format.configjson import consumer_offsets

        a, b = consumer_offsets(data), consumer_offsets(bak)
        newer = [(k, q) for k, qs in b.items() for q, o in qs.items() if a.get(k, {}).get(q, o) < o]
        if newer:  # offsets can be reset by an admin, so this is a note, not a warning
            (tg, q) = newer[0]
            out.add(Finding("config_bak_offsets_ahead", "info", f"config/{name}.bak", None,
                            f"{len(newer)} offsets in .bak are ahead of the file (first: {tg[0]}@{tg[1]} queue {q}): "
                            "unless offsets were reset, the file looks older than its backup"))


def check_consumer_offsets(loaded: dict, qstats: dict, out: Capped) -> list[dict]:
    """Consumer offsets within their queues' [min, max]; returns per-group lag rows for the report."""
    from storelib.format.configjson import consumer_offsets, delay_offsets

    rows: list[dict] = []
    for name in ("consumerOffset.json", "lmqConsumerOffset.json"):
        data = loaded.get(name)
        if not data:
            continue
        for (topic, group), qs in consumer_offsets(data, include_lmq=name.startswith("lmq")).items():
            for qid, off in sorted(qs.items()):
                st = qstats.get((topic, qid))
                where = f"config/{name}"
                ex = {"topic": topic, "group": group, "queue_id": qid, "offset": off}
                if st is None:  # offset 0 on a queue never written (e.g. %RETRY% of a subscribed group) is normal
                    out.add(Finding("consumer_offset_unknown_queue", "info" if off == 0 else "warning", where, None,
                                    f"{group} has offset {off} for {topic}/{qid}, which has no consume queue", ex))
                    continue
                mx, mn = st["max_offset"], st["min_offset"]
                rows.append({**ex, "max_offset": mx, "lag": max(0, mx - off)})
                # a hole in the queue (reported as cq_entry_missing) lowers the broker's max: compare with
                # the units actually on disk so the hole is not reported twice
                if off > max(mx, st.get("raw_max_offset", mx)):
                    out.add(Finding("consumer_offset_past_queue", "error", where, None,
                                    f"{group} on {topic}/{qid}: offset {off} is past the queue's max offset {mx}",
                                    {**ex, "max_offset": mx}))
                elif off < mn:
                    out.add(Finding("consumer_offset_below_min", "warning", where, None,
                                    f"{group} on {topic}/{qid}: offset {off} is below the queue's min offset {mn}: "
                                    f"{mn - off} messages expired before they were consumed", {**ex, "min_offset": mn}))
    d = loaded.get("delayOffset.json")
    if d:
        for level, off in delay_offsets(d).items():
            st = qstats.get((SCHEDULE_TOPIC, level - 1))
            if st is not None and off > st["max_offset"]:
                out.add(Finding("delay_offset_past_queue", "error", "config/delayOffset.json", None,
                                f"delay level {level}: offset {off} is past {SCHEDULE_TOPIC}/{level - 1} max "
                                f"{st['max_offset']}", {"level": level, "offset": off}))
    return rows
