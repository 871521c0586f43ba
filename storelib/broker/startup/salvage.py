"""``rmqstore recover --salvage``: what a broker start-up would drop, exported before anything changes (the
messages as JSONL and Parquet, the exact byte ranges lost, and config JSON salvaged from damaged files).

In a DLedger-mode store that is also what DLedger would drop: the entries after its recovery's end
(``why`` = ``dledger_truncated``), records no reput dispatches (``reput_skips_rest_of_file``) and the
entries past the committed index (``uncommitted``: kept by this start-up, but truncated when the node
rejoins a leader that does not have them).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from storelib.broker.startup.startup import Simulation
from storelib.broker.startup.startuplost import lost_table
from storelib.errors import StoreError
from storelib.fileio.smallfile_io import atomic_write, atomic_write_json
from storelib.format.record import SCHEDULE_TOPIC, TRANS_HALF_TOPIC

# ---------------------------------------------------------------------------------------------
# salvage

RESEND_TOPIC_PROPS = {SCHEDULE_TOPIC: ("REAL_TOPIC", "REAL_QID"), TRANS_HALF_TOPIC: ("REAL_TOPIC", "REAL_QID")}


def salvage(sim: Simulation, out_dir: str | os.PathLike) -> dict:
    """Export every intact message a start-up would lose (Parquet + JSONL, all properties and the body),
    the exact byte ranges lost, and salvaged config JSON (offsets clamped to the recovered queues)."""
    import pyarrow.parquet as pq

    from storelib.fileio.publish import atomic_local_file
    from storelib.scan.messagecols import row_to_json

    out = os.path.abspath(os.fspath(out_dir))
    os.makedirs(out, exist_ok=True)
    table, regions = lost_table(sim, with_body=True, uncommitted=True)
    if table is not None:
        table = table.filter(pc.equal(table.column("crc_ok"), True))
    n = 0 if table is None else table.num_rows
    if table is not None and n:
        resend_t, resend_q = [], []
        for topic, qid, props in zip(table.column("topic").to_pylist(), table.column("queue_id").to_pylist(),
                                     table.column("properties").to_pylist()):
            p = dict(props or [])
            names = RESEND_TOPIC_PROPS.get(topic)
            if names and names[0] in p:
                resend_t.append(p[names[0]])
                q = p.get(names[1], "")
                resend_q.append(int(q) if q.lstrip("-").isdigit() else qid)
            else:
                resend_t.append(topic)
                resend_q.append(qid)
        table = table.append_column("resend_topic", pa.array(resend_t, pa.string()))
        table = table.append_column("resend_queue_id", pa.array(resend_q, pa.int32()))
        with atomic_local_file(os.path.join(out, "messages.parquet")) as tmp:
            pq.write_table(table, tmp)
        with atomic_local_file(os.path.join(out, "messages.jsonl")) as tmp, open(tmp, "w", encoding="utf-8") as f:
            for row in table.to_pylist():
                obj = row_to_json(row, with_body=True)
                obj.update({"why": row["why"], "resend_topic": row["resend_topic"],
                            "resend_queue_id": row["resend_queue_id"]})
                f.write(json.dumps(obj, ensure_ascii=False, default=str) + "\n")
    cfg = salvage_config(sim, os.path.join(out, "config"))
    report = {
        "schema": "rmqstore.recover.salvage/1",
        "store": sim.store.loc.path,
        "process_offset": sim.walk.process_offset,
        "messages": n,
        "files": ["messages.parquet", "messages.jsonl"] if n else [],
        "lost_ranges": regions,
        "bytes_unreadable": sum(r["bytes_lost"] for r in regions),
        "by_why": _count_by(table, "why") if n else {},
        "config": cfg,
    }
    if sim.walk.dledger is not None:
        dl = sim.walk.dledger
        report["dledger"] = {"data_end": dl.data_end, "committed_index": dl.committed_index,
                             "committed_pos": dl.committed_pos, "ledger_end_index": dl.ledger_end_index}
    atomic_write_json(os.path.join(out, "salvage-report.json"), report)
    return report


def _count_by(table: pa.Table, col: str) -> dict[str, int]:
    vc = pc.value_counts(table.column(col)).to_pylist()
    return {d["values"]: d["counts"] for d in sorted(vc, key=lambda d: d["values"])}


def _parse_candidate(path: str) -> tuple[str, dict | None, Any]:
    """('ok'|'salvaged'|'missing'|'empty'|'bad', data, detail) for one config text."""
    from storelib.format.fastjson import parse_fastjson, salvage_prefix_detail
    from storelib.format.properties import java_string

    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return "missing", None, None
    if not raw.strip(b"\x00 \t\r\n"):
        return "empty", None, None
    text = java_string(raw)  # as the broker reads it (MixAll.file2String: new String(data, UTF-8))
    try:
        return "ok", parse_fastjson(text, file=path), None
    except StoreError as e:
        try:
            s = salvage_prefix_detail(text, file=path)
        except StoreError:
            return "bad", None, str(e)
        if s.data:
            return "salvaged", s.data, {"error": str(e), "stopped_at": s.stopped_at, "incomplete": s.incomplete,
                                        "dropped": s.dropped}
        return "bad", None, str(e)


def salvage_config(sim: Simulation, out_dir: str) -> list[dict]:
    """For each ``config/*.json``: the newest valid of the file and its .bak (or a repaired prefix),
    consumer offsets clamped to the recovered queue ranges; written to ``out_dir``, changes listed."""
    from storelib.format.configjson import split_topic_group
    from storelib.format.fastjson import dump_fastjson

    cdir = os.path.join(sim.store.loc.path, "config")
    if not os.path.isdir(cdir):
        return []
    names = sorted({n[:-4] if n.endswith(".bak") else n for n in os.listdir(cdir)
                    if n.endswith(".json") or n.endswith(".json.bak")})
    ranges = {(q.topic, q.qid): (q.report.final_min_offset, q.report.final_max_offset) for q in sim.queues.values()}
    reports: list[dict] = []
    for name in names:
        cands = []
        for suffix in ("", ".bak"):
            p = os.path.join(cdir, name + suffix)
            state, data, detail = _parse_candidate(p)
            mtime = os.stat(p).st_mtime_ns if os.path.exists(p) else -1
            cands.append({"file": name + suffix, "state": state, "data": data, "detail": detail, "mtime_ns": mtime})
        valid = [c for c in cands if c["state"] == "ok"]
        repaired = [c for c in cands if c["state"] == "salvaged"]
        pick = max(valid, key=lambda c: c["mtime_ns"]) if valid else (
            max(repaired, key=lambda c: c["mtime_ns"]) if repaired else None)
        rep: dict[str, Any] = {"name": name,
                               "candidates": [{k: c[k] for k in ("file", "state", "detail", "mtime_ns")} for c in cands],
                               "chosen": pick["file"] if pick else None, "repaired": bool(pick and pick in repaired),
                               "changes": []}
        if pick is None:
            reports.append(rep)
            continue
        data = pick["data"]
        if name in ("consumerOffset.json", "lmqConsumerOffset.json") and isinstance(data.get("offsetTable"), dict):
            for key, qmap in data["offsetTable"].items():
                tg = split_topic_group(str(key))
                if tg is None or not isinstance(qmap, dict):
                    continue
                for q, off in list(qmap.items()):
                    try:
                        qi, oi = int(q), int(off)
                    except (TypeError, ValueError):
                        continue
                    lo, hi = ranges.get((tg[0], qi), (0, 0))
                    new = min(max(oi, lo), hi)
                    if new != oi:
                        qmap[q] = new
                        rep["changes"].append({"key": key, "topic": tg[0], "group": tg[1], "queue_id": qi,
                                               "old": oi, "new": new, "queue_range": [lo, hi],
                                               "why": "above the recovered max offset" if oi > hi
                                               else "below the recovered min offset"})
        os.makedirs(out_dir, exist_ok=True)
        atomic_write(os.path.join(out_dir, name), dump_fastjson(data).encode("utf-8"))
        reports.append(rep)
    return reports


__all__ = ["salvage", "salvage_config"]
