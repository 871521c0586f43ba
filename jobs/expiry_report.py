"""Expiry simulation output: the side-by-side policy table (text) and a self-contained HTML report.

The HTML embeds its plots as inline SVG (matplotlib, Agg backend) so the file can be mailed or archived
alone; it is written through a temp file and renamed, never seen half-written.
"""

from __future__ import annotations

import html
import io
import time
from typing import Any

from storelib.publish import atomic_local_file

COMPARE_COLUMNS = ["policy", "reserved_h", "deleteWhen", "max_used%", "capacity", "deleted", "time", "space",
                   "forced", "manual", "first_deletion", "lost_msgs", "lost_bytes", "groups_lost", "first_loss",
                   "max_ratio"]


def _t(ms: int | None) -> str:
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def compare_rows(policies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per policy: its key settings and what it deleted and lost."""
    rows = []
    for p in policies:
        s, m = p["settings"], p["summary"]
        rows.append({
            "policy": p["name"], "reserved_h": s["file_reserved_time"], "deleteWhen": s["delete_when"],
            "max_used%": s["disk_max_used_space_ratio"],
            "capacity": "-" if s["disk_capacity"] is None else s["disk_capacity"],
            "deleted": m["commitlog_deleted"], **m["by_reason"], "first_deletion": _t(m["first_deletion_ms"]),
            "lost_msgs": m["lost_messages"], "lost_bytes": m["lost_bytes"], "groups_lost": m["groups_with_loss"],
            "first_loss": _t(m["first_loss_ms"]),
            "max_ratio": "-" if m["max_ratio"] is None else f"{m['max_ratio']:.2f}",
        })
    return rows


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    text = buf.getvalue()
    return text[text.find("<svg"):]


def _plots(policies: list[dict[str, Any]], start_ms: int | None = None) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, str] = {}
    shown = policies[:12]
    if shown:
        fig, ax = plt.subplots(figsize=(9, 3.6))
        t0 = start_ms if start_ms is not None else min(
            (p["disk_usage"][0]["time_ms"] for p in shown if p["disk_usage"]), default=0)
        for p in shown:
            d = p["disk_usage"]
            ax.plot([(x["time_ms"] - t0) / 3.6e6 for x in d], [x["used_bytes"] for x in d], label=p["name"], lw=1.2)
        ax.set_xlabel(f"hours since {_t(t0)}")
        ax.set_ylabel("bytes used")
        ax.set_title("Disk usage over time" + (" (first 12 policies)" if len(policies) > 12 else ""))
        ax.legend(fontsize=7, loc="best")
        out["disk"] = _svg(fig)
    fig, ax = plt.subplots(figsize=(9, max(2.0, 0.28 * len(policies) + 1)))
    names = [p["name"] for p in policies]
    ax.barh(names, [p["summary"]["lost_messages"] for p in policies], color="#c0392b")
    ax.set_xlabel("unconsumed messages deleted")
    ax.invert_yaxis()
    ax.set_title("Messages lost before consumption, per policy")
    out["loss"] = _svg(fig)
    return out


def _table(rows: list[dict[str, Any]], columns: list[str], limit: int | None = None) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for r in rows[:limit] if limit else rows:
        body.append("<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in columns) + "</tr>")
    more = f"<p>… {len(rows) - limit} more rows in the JSON output.</p>" if limit and len(rows) > limit else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def render_html(report: dict[str, Any]) -> str:
    """The whole report as one HTML document (plots inline)."""
    sim = report.get("simulation", {})
    policies = report["policies"]
    plots = _plots(policies, sim.get("start_ms"))
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>rmqstore expiry simulation</title>",
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#eee}"
        "h2{margin-top:1.6em}</style></head><body>",
        f"<h1>Expiry simulation: {html.escape(str(sim.get('store', '')))}</h1>",
        "<ul>",
        f"<li>snapshot {_t(sim.get('snapshot_ms'))}; simulated {_t(sim.get('start_ms'))} → {_t(sim.get('until_ms'))}"
        f" (first cleaner run {_t(sim.get('first_tick_ms'))})</li>",
        f"<li>ingest {sim.get('ingest_bytes_per_s', 0):.3f} bytes/s ({html.escape(str(sim.get('ingest_source')))});"
        f" consumption: {html.escape(str(sim.get('consumption')))}</li>",
        f"<li>segment last-modified times from: <b>{html.escape(str(sim.get('mtime_source')))}</b></li>",
        "</ul>",
        "<h2>Policies side by side</h2>",
        _table(compare_rows(policies), COMPARE_COLUMNS),
    ]
    if "disk" in plots:
        parts += ["<h2>Disk usage</h2>", plots["disk"]]
    parts += ["<h2>Losses</h2>", plots["loss"]]
    for p in policies:
        parts.append(f"<h2>Policy {html.escape(p['name'])}</h2>")
        for w in p.get("warnings", []):
            parts.append(f"<p><b>warning:</b> {html.escape(w)}</p>")
        cl = [dict(d, time=_t(d["time_ms"])) for d in p["deletions"]]
        parts.append(f"<h3>Deletion timeline ({len(cl)} files)</h3>")
        parts.append(_table(cl, ["time", "file", "kind", "reason"], limit=300))
        lost = [dict(g, first_loss=_t(g["first_loss_ms"]), ranges=_ranges_text(g["lost_offsets"]))
                for g in p["groups"]]
        parts.append("<h3>Consumer groups</h3>")
        parts.append(_table(lost, ["group", "topic", "queue_id", "committed_offset", "lost_messages", "lost_bytes",
                                   "ranges", "first_loss"], limit=500))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_text_atomic(path: str, text: str) -> None:
    """Temp file + rename, world-readable like any report (mkstemp alone would leave 0600)."""
    with atomic_local_file(path, 0o644) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def write_html(path: str, report: dict[str, Any]) -> None:
    """Render and write the report atomically."""
    write_text_atomic(path, render_html(report))


def _ranges_text(ranges: list, show: int = 20) -> str:
    """Lost offset ranges for a report table: the first ``show`` and how many there are in all."""
    txt = " ".join(f"[{a},{b}]" for a, b in ranges[:show])
    return txt + (f" ... ({len(ranges)} ranges; all in the JSON)" if len(ranges) > show else "")
