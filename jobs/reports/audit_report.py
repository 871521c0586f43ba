"""Audit report building and rendering: the report dict (schema ``rmqstore.audit/1``) from the checks'
results, data series for the charts, and one self-contained HTML page.

The page has no external resource (inline CSS and SVG, no script needed), so it can be mailed,
archived next to the JSON, or opened from a scheduler's artifact store. Sections: summary, findings
table, per-segment health map, traffic per topic over time, message size distribution, queue lag.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from jobs.reports.htmlpage import CSS
from jobs.reports.htmlpage import esc as _e
from jobs.reports.htmlpage import findings_section as _findings
from jobs.reports.htmlpage import utc as _ms
from storelib.checks.segment import SEVERITY_RANK
from storelib.errors import Finding

if TYPE_CHECKING:
    from storelib.broker.settings.brokerconf import BrokerSettings
    from storelib.broker.settings.store import Store
    from storelib.checks.logview import LogSummary
    from storelib.checks.segment import SegmentResult

SCHEMA = "rmqstore.audit/1"

COLORS = {"critical": "#8b0000", "error": "#d9480f", "warning": "#f59f00", "info": "#4dabf7", None: "#2f9e44"}
PALETTE = ["#1c7ed6", "#e8590c", "#2f9e44", "#ae3ec9", "#f08c00", "#0ca678", "#d6336c", "#5c940d", "#495057"]


def build_report(store: Store, results: list[SegmentResult], log: LogSummary, findings: list[Finding], qstats: dict,
                 consumers: list[dict], idx: dict, cp: Any, settings: BrokerSettings,
                 charts: dict[str, Any]) -> dict[str, Any]:
    """The report dict (JSON schema ``rmqstore.audit/1``); ``charts``: the record-derived series the
    cross-file checks made (:mod:`storelib.checks.logcharts`)."""

    by_sev = {s: 0 for s in SEVERITY_RANK}
    for f in findings:
        by_sev[f.severity] = by_sev.get(f.severity, 0) + 1
    seg_rows = []
    worst: dict[str, str] = {}
    for f in findings:
        if f.file and f.file.startswith("commitlog/"):
            name = f.file.split("/", 1)[1]
            if SEVERITY_RANK.get(f.severity, 0) >= SEVERITY_RANK.get(worst.get(name, "info"), 0):
                worst[name] = f.severity
    for s in store.commitlog.segments:
        r = next((x for x in results if x.name == s.name), None)
        row = {"name": s.name, "base": s.base, "file_size": s.file_size,
               "records": r.records if r else 0, "bytes_valid": r.bytes_valid if r else 0,
               "data_end": r.data_end if r else 0, "end_kind": r.end_kind if r else "skipped",
               "crc_errors": r.crc_errors if r else 0, "bytes_crc_failed": r.crc_bytes if r else 0,
               "bytes_lost": sum(g["end"] - g["start"] for g in (r.regions if r else [])),
               "first_ts": r.first_ts if r else None, "last_ts": r.last_ts if r else None,
               "worst": worst.get(s.name)}
        seg_rows.append(row)
    for f in findings:  # missing segments appear in the map too
        if f.kind == "missing_segment":
            S = log.segment_size
            for b in range(f.extra["from"], f.extra["to"], S):
                seg_rows.append({"name": f"{b:020d}", "base": b, "file_size": 0, "records": 0, "bytes_valid": 0,
                                 "data_end": 0, "end_kind": "missing", "crc_errors": 0, "bytes_lost": S,
                                 "first_ts": None, "last_ts": None, "worst": "critical"})
    seg_rows.sort(key=lambda x: x["base"])
    regions = [{**g, "segment": r.name, "phy_start": r.base + g["start"]} for r in results for g in r.regions]
    queues = sorted(qstats.values(), key=lambda q: (q["topic"], q["queue_id"]))
    return {
        "schema": SCHEMA,
        "store": store.uri,
        "generated_at_ms": int(time.time() * 1000),
        "settings": {"version": settings.version, "commitlog_segment_size": log.segment_size,
                     "broker_line": settings.line.to_json() if settings.line else None,
                     "cq_segment_size": settings.mapped_file_size_consume_queue,
                     "hash_slot_num": settings.max_hash_slot_num, "index_num": settings.max_index_num},
        "summary": {"findings": len(findings), "by_severity": by_sev, "records": log.records,
                    "bytes_valid": log.bytes_valid,
                    "segments": len([s for s in seg_rows if s["end_kind"] != "missing"]),
                    "queues": len(queues), "index_files": len(idx.get("files", [])),
                    "bytes_lost": sum(g["bytes_lost"] for g in regions),
                    "crc_errors": sum(r.crc_errors for r in results),
                    "bytes_crc_failed": sum(r.crc_bytes for r in results),
                    "commitlog_min_offset": log.log_min, "commitlog_end_offset": log.log_end,
                    "first_store_ts": log.ts_lo, "last_store_ts": log.ts_hi},
        "checkpoint": asdict(cp) if cp is not None else None,
        "segments": seg_rows,
        "regions": regions,
        "queues": queues,
        "consumers": consumers,
        "index": idx,
        "traffic": charts["traffic"],
        "sizes": charts["sizes"],
        "findings": [_finding_json(f) for f in findings],
    }


def add_dledger(report: dict[str, Any], findings: list[Finding], summary: dict[str, Any], folder: str) -> None:
    """A DLedger store's report: its own findings added, every finding in DLedger's terms (data files named
    in ``folder``, record findings restated: storelib.checks.dledger), the counts again, the ledger block."""
    from storelib.checks.dledger import restate_record_findings

    allf = restate_record_findings([Finding.from_dict(f) for f in report["findings"]] + list(findings), folder)
    report["findings"] = [_finding_json(f) for f in allf]
    by_sev = {s: 0 for s in SEVERITY_RANK}
    for f in allf:
        by_sev[f.severity] = by_sev.get(f.severity, 0) + 1
    report["summary"].update(findings=len(allf), by_severity=by_sev)
    report["dledger"] = {**summary, "data_folder": folder}


def _finding_json(f: Finding) -> dict[str, Any]:
    """Stable shape: every finding has kind, severity, file, offset, detail and extra."""
    return {"kind": f.kind, "severity": f.severity, "file": f.file, "offset": f.offset, "detail": f.detail,
            "extra": jsonable(f.extra or {})}


def jsonable(x: Any) -> Any:
    """``x`` with numpy scalars as Python numbers and keys as strings: what json.dumps takes."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x



def _summary(rep: dict) -> str:
    s = rep["summary"]
    sev = s["by_severity"]
    run = rep.get("run") or {}
    worst = next((k for k in ("critical", "error", "warning", "info") if sev.get(k)), None)
    status = "CLEAN" if worst in (None, "info") else worst.upper()
    cells = [("status", f'<b style="color:{COLORS[worst if worst != "info" else None]}">{status}</b>'),
             ("records", f"{s['records']:,}"), ("valid bytes", f"{s['bytes_valid']:,}"),
             ("segments", s["segments"]), ("queues", s["queues"]), ("index files", s["index_files"]),
             ("bytes in corrupt regions", f"{s['bytes_lost']:,}"),
             ("records failing their CRC", f"{s.get('crc_errors', 0):,} ({s.get('bytes_crc_failed', 0):,} bytes)"),
             ("store time range", f"{_ms(s['first_store_ts'])} … {_ms(s['last_store_ts'])}"),
             ("commitlog offsets", f"{s['commitlog_min_offset']:,} … {s['commitlog_end_offset']:,}")]
    for k in ("critical", "error", "warning", "info"):
        cells.append((k, f'<span class="sev {k}">{sev.get(k, 0)}</span>'))
    if run:
        cells.append(("engine", f"{_e(run.get('engine'))}, {run.get('seconds')} s, {run.get('mb_per_s') or '-'} MB/s; "
                                f"{run.get('segments_audited')} audited / {run.get('segments_carried')} carried"))
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in cells)
    return f'<section id="summary"><h2>Summary</h2><table class="kv">{rows}</table></section>'


def _damage(rep: dict) -> str:
    """What the damage costs at a broker start-up and the commands that salvage or repair it."""
    d = rep.get("damage")
    if not d:
        return ""
    if d.get("error"):
        cost = f"<p>A start-up could not be replayed: {_e(d['error'])}</p>"
    else:
        cost = (f"<p>A broker start-up would drop <b>{d['messages_lost']:,}</b> message(s) "
                f"({d['messages_intact']:,} intact and salvageable, {d['bytes_lost']:,} bytes); the commitlog would "
                f"end at physical offset {d['process_offset']:,}.</p>")
    steps = "".join(f'<li><code>{_e(c["command"])}</code> — {_e(c["why"])}</li>' for c in d.get("next", []))
    return f'<section id="damage"><h2>What it costs and what to do</h2>{cost}<ol>{steps}</ol></section>'


def _health_map(rep: dict) -> str:
    cells = []
    for s in rep["segments"]:
        color = COLORS.get(s.get("worst"), COLORS[None])
        if s["end_kind"] == "missing":
            color = "#212529"
        elif not s["records"] and not s.get("worst"):
            color = "#dee2e6"
        fill = s["data_end"] / s["file_size"] if s["file_size"] else 0
        tip = (f"{s['name']}: {s['records']} records, {s['bytes_valid']} bytes, end {s['end_kind']} at {s['data_end']}, "
               f"{s['crc_errors']} CRC errors, {s['bytes_lost']} bytes lost, worst {s.get('worst') or 'none'}")
        cells.append(f'<div class="cell" style="background:{color}" title="{_e(tip)}">'
                     f'<div class="fill" style="height:{100 - min(100, fill * 100):.0f}%"></div>'
                     f'<span>{_e(s["name"][-8:])}</span></div>')
    legend = "".join(f'<span class="lg" style="background:{c}"></span>{_e(k or "healthy")} '
                     for k, c in COLORS.items()) + '<span class="lg" style="background:#212529"></span>missing ' \
        '<span class="lg" style="background:#dee2e6"></span>empty'
    return (f'<section id="health"><h2>Segment health map</h2><p class="note">One cell per commitlog segment, '
            f'coloured by its worst finding; the pale top shows the unused part. {legend}</p>'
            f'<div class="map">{"".join(cells)}</div></section>')


def _traffic(rep: dict) -> str:
    tr = rep["traffic"]
    topics = tr.get("topics") or {}
    if not topics:
        return '<section id="traffic"><h2>Traffic per topic over time</h2><p>No messages.</p></section>'
    W, H, L, B = 900, 260, 50, 30
    nb = len(next(iter(topics.values())))
    stack = np.zeros(nb)
    total = np.sum([np.asarray(v) for v in topics.values()], axis=0)
    ymax = max(int(total.max()), 1)
    bw = (W - L - 10) / nb
    bars = []
    for i, (name, vals) in enumerate(topics.items()):
        v = np.asarray(vals, dtype=float)
        col = PALETTE[i % len(PALETTE)]
        for j in np.flatnonzero(v).tolist():
            y0 = H - B - (stack[j] + v[j]) / ymax * (H - B - 10)
            h = v[j] / ymax * (H - B - 10)
            bars.append(f'<rect x="{L + j * bw:.1f}" y="{y0:.1f}" width="{max(bw - 1, 1):.1f}" height="{h:.1f}" '
                        f'fill="{col}"><title>{_e(name)}: {int(v[j])}</title></rect>')
        stack += v
    axis = (f'<line x1="{L}" y1="{H - B}" x2="{W - 10}" y2="{H - B}" stroke="#333"/>'
            f'<text x="{L - 5}" y="18" text-anchor="end" font-size="11">{ymax}</text>'
            f'<text x="{L}" y="{H - 10}" font-size="11">{_ms(tr["start_ms"])}</text>'
            f'<text x="{W - 10}" y="{H - 10}" text-anchor="end" font-size="11">'
            f'{_ms(tr["start_ms"] + tr["bucket_ms"] * nb)}</text>')
    legend = "".join(f'<span class="lg" style="background:{PALETTE[i % len(PALETTE)]}"></span>{_e(n)} '
                     for i, n in enumerate(topics))
    return (f'<section id="traffic"><h2>Traffic per topic over time</h2><p class="note">Messages per '
            f'{tr["bucket_ms"] // 1000} s by store time. {legend}</p>'
            f'<svg width="{W}" height="{H}" role="img">{axis}{"".join(bars)}</svg></section>')


def _sizes(rep: dict) -> str:
    sz = rep["sizes"]
    bk = sz.get("buckets") or []
    if not bk:
        return '<section id="sizes"><h2>Message size distribution</h2><p>No messages.</p></section>'
    W, H, B = 900, 220, 40
    cmax = max(b["count"] for b in bk)
    bw = (W - 20) / len(bk)
    bars = []
    for i, b in enumerate(bk):
        h = b["count"] / cmax * (H - B - 10)
        bars.append(f'<rect x="{10 + i * bw:.1f}" y="{H - B - h:.1f}" width="{bw - 4:.1f}" height="{h:.1f}" '
                    f'fill="#1c7ed6"><title>{b["from"]}–{b["to"]} bytes: {b["count"]}</title></rect>'
                    f'<text x="{10 + i * bw + bw / 2:.1f}" y="{H - B + 14}" font-size="10" text-anchor="middle">'
                    f'{_human(b["from"])}</text>'
                    f'<text x="{10 + i * bw + bw / 2:.1f}" y="{H - B - h - 3:.1f}" font-size="10" '
                    f'text-anchor="middle">{b["count"]}</text>')
    note = f'min {sz["min"]}, p50 {sz["p50"]:.0f}, p99 {sz["p99"]:.0f}, max {sz["max"]} bytes (TOTALSIZE)'
    return (f'<section id="sizes"><h2>Message size distribution</h2><p class="note">{note}</p>'
            f'<svg width="{W}" height="{H}" role="img">{"".join(bars)}</svg></section>')


def _human(n: int) -> str:
    for unit in ("", "K", "M", "G"):
        if n < 1024:
            return f"{n}{unit}"
        n //= 1024
    return f"{n}T"


def _lag(rep: dict) -> str:
    rows = []
    lagmax = max([q.get("lag") or 0 for q in rep["queues"]] + [c.get("lag") or 0 for c in rep["consumers"]] + [1])
    for q in rep["queues"]:
        w = (q.get("lag") or 0) / lagmax * 200
        rows.append(f'<tr><td>{_e(q["topic"])}</td><td class="num">{q["queue_id"]}</td><td class="num">{q["min_offset"]}'
                    f'</td><td class="num">{q["max_offset"]}</td><td class="num">{_e(q.get("cl_max_offset"))}</td>'
                    f'<td class="num">{q.get("lag") or 0}</td><td><div class="bar" style="width:{w:.0f}px"></div></td></tr>')
    crow = []
    for c in rep["consumers"]:
        w = (c.get("lag") or 0) / lagmax * 200
        crow.append(f'<tr><td>{_e(c["group"])}</td><td>{_e(c["topic"])}</td><td class="num">{c["queue_id"]}</td>'
                    f'<td class="num">{c["offset"]}</td><td class="num">{c["max_offset"]}</td>'
                    f'<td class="num">{c["lag"]}</td><td><div class="bar" style="width:{w:.0f}px"></div></td></tr>')
    qt = ('<h3>Consume queues behind the commitlog</h3><table class="grid"><thead><tr><th>topic</th><th>queue</th>'
          '<th>CQ min</th><th>CQ max</th><th>commitlog max</th><th>lag</th><th></th></tr></thead><tbody>'
          + ("".join(rows) or '<tr><td colspan="7">No queues.</td></tr>') + "</tbody></table>")
    ct = ('<h3>Consumer lag (config/consumerOffset.json)</h3><table class="grid"><thead><tr><th>group</th>'
          '<th>topic</th><th>queue</th><th>offset</th><th>CQ max</th><th>lag</th><th></th></tr></thead><tbody>'
          + ("".join(crow) or '<tr><td colspan="7">No consumer offsets.</td></tr>') + "</tbody></table>")
    return f'<section id="lag"><h2>Queue lag</h2>{qt}{ct}</section>'


def _live(rep: dict) -> str:
    """The live-store line: a broker ran the store and the run read up to its cut."""
    live = rep.get("live") or {}
    if not live.get("live"):
        return ""
    who = f"pid {live['pid']}" if live.get("pid") else "pid unknown"
    tail = f"; {live['tail']}" if live.get("tail") else ""
    return (f"<p class=\"note\"><b>live store ({_e(who)})</b>: read up to a cut at offset {live['cut_offset']:,} "
            f"taken at {_e(str(live['cut_time']))}{_e(tail)}</p>")


def render_html(rep: dict) -> str:
    """The self-contained HTML page for a report dict."""
    title = f"rmqstore audit — {rep['store']}"
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1><p class=\"note\">Generated {_ms(rep['generated_at_ms'])} · schema "
            f"{_e(rep['schema'])} · broker {_e(rep['settings']['version'])}.x settings, commitlog segment "
            f"{rep['settings']['commitlog_segment_size']:,} bytes</p>"
            + _live(rep) + _summary(rep) + _damage(rep) + _findings(rep) + _health_map(rep) + _traffic(rep) + _sizes(rep) + _lag(rep)
            + "</body></html>")


__all__ = ["render_html"]
