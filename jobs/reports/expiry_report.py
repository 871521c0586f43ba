"""Expiry simulation output: the side-by-side policy table (text) and a self-contained HTML report.

The HTML embeds its plots as inline SVG (matplotlib, Agg backend) so the file can be mailed or archived
alone; it is written through a temp file and renamed, never seen half-written.
"""

from __future__ import annotations

import html
import io
from typing import Any

from jobs.common import human_ms
from storelib.fileio.smallfile_io import atomic_write

COMPARE_COLUMNS = ["policy", "reserved_h", "deleteWhen", "max_used%", "capacity", "deleted", "time", "space",
                   "forced", "manual", "first_deletion", "lost_msgs", "lost_bytes", "groups_lost", "first_loss",
                   "max_ratio", "writes_refused"]


def compare_rows(policies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per policy: its key settings and what it deleted and lost."""
    rows = []
    for p in policies:
        s, m = p["settings"], p["summary"]
        rows.append({
            "policy": p["name"], "reserved_h": s["file_reserved_time"], "deleteWhen": s["delete_when"],
            "max_used%": s["disk_max_used_space_ratio"],
            "capacity": "-" if s["disk_capacity"] is None else s["disk_capacity"],
            "deleted": m["commitlog_deleted"], **m["by_reason"], "first_deletion": human_ms(m["first_deletion_ms"]),
            "lost_msgs": m["lost_messages"], "lost_bytes": m["lost_bytes"], "groups_lost": m["groups_with_loss"],
            "first_loss": human_ms(m["first_loss_ms"]),
            "max_ratio": "-" if m["max_ratio"] is None else f"{m['max_ratio']:.2f}",
            # the broker refuses writes while its disk is marked full: from when, and for how long in all
            "writes_refused": "-" if m.get("writes_refused_ms") is None else
            f"{human_ms(m['writes_refused_ms'])} ({m['writes_refused_total_ms'] / 1000:.0f} s)",
        })
    return rows


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    text = buf.getvalue()
    return text[text.find("<svg"):]


MAX_POINTS = 600  # per line: a long simulation is drawn as each interval's peak and trough
LINE_STYLES = ["-", "--", "-.", ":"]


def _human_bytes(n: float, _pos: Any = None) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _envelope(t: Any, y: Any, points: int = MAX_POINTS) -> tuple[Any, Any, Any]:
    """(times, peaks, troughs) with at most ``points`` intervals: a cleaner that deletes every few
    seconds draws a saw-tooth that, plotted point by point over days, fills the chart as one block."""
    import numpy as np

    t, y = np.asarray(t, dtype=float), np.asarray(y, dtype=float)
    if len(t) <= points:
        return t, y, y
    edges = np.linspace(t[0], t[-1], points + 1)
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, points - 1)
    starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
    peaks = np.maximum.reduceat(y, starts)
    troughs = np.minimum.reduceat(y, starts)
    return (edges[idx[starts]] + edges[idx[starts] + 1]) / 2, peaks, troughs


def _same_usage(policies: list[dict[str, Any]]) -> list[tuple[list[str], dict[str, Any]]]:
    """Policies whose disk usage is the same series, grouped (one line, all their names): identical
    lines drawn one over the other would hide all but the last."""
    groups: list[tuple[list[str], dict[str, Any]]] = []
    for p in policies:
        key = [(x["time_ms"], x["used_bytes"]) for x in p["disk_usage"]]
        for names, q in groups:
            if [(x["time_ms"], x["used_bytes"]) for x in q["disk_usage"]] == key:
                names.append(p["name"])
                break
        else:
            groups.append(([p["name"]], p))
    return groups


def disk_figure(policies: list[dict[str, Any]], start_ms: int | None = None):
    """Disk usage per policy over time (peak line and trough line per interval), the partition's
    capacity as a dashed line, the legend outside the plot area; None without usage data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    shown = [p for p in policies[:12] if p["disk_usage"]]
    if not shown:
        return None
    fig, ax = plt.subplots(figsize=(9, 3.6))
    t0 = start_ms if start_ms is not None else min(p["disk_usage"][0]["time_ms"] for p in shown)
    for i, (names, p) in enumerate(_same_usage(shown)):
        d = p["disk_usage"]
        t, hi, lo = _envelope([(x["time_ms"] - t0) / 3.6e6 for x in d], [x["used_bytes"] for x in d])
        style = LINE_STYLES[i % len(LINE_STYLES)]
        (line,) = ax.plot(t, hi, style, lw=1.4, label=" = ".join(names))
        if len(t) < len(d):
            ax.plot(t, lo, style, lw=0.7, color=line.get_color(), alpha=0.6, label="_trough")
    caps = sorted({p["settings"]["disk_capacity"] for p in shown if p["settings"].get("disk_capacity")})
    for cap in caps:
        ax.axhline(cap, color="#555555", ls=(0, (6, 3)), lw=1, label=f"capacity {_human_bytes(cap)}")
    ax.yaxis.set_major_formatter(FuncFormatter(_human_bytes))
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"hours since {human_ms(t0)}")
    ax.set_ylabel("bytes used")
    many = " (first 12 policies)" if len(policies) > 12 else ""
    ax.set_title("Disk usage over time" + many + ("; long runs: each interval's peak and trough"
                                                  if any(len(p["disk_usage"]) > MAX_POINTS for p in shown) else ""),
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def loss_figure(policies: list[dict[str, Any]]):
    """Unconsumed messages each policy deletes (bars with their values); None when no policy loses any."""
    if not any(p["summary"]["lost_messages"] for p in policies):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, max(2.0, 0.28 * len(policies) + 1)))
    values = [p["summary"]["lost_messages"] for p in policies]
    bars = ax.barh([p["name"] for p in policies], values, color="#c0392b")
    ax.bar_label(bars, labels=[f"{v:,}" for v in values], fontsize=8, padding=3)
    ax.set_xlim(0, max(values) * 1.15)
    ax.set_xlabel("unconsumed messages deleted")
    ax.invert_yaxis()
    ax.set_title("Messages lost before consumption, per policy", fontsize=10)
    return fig


def _plots(policies: list[dict[str, Any]], start_ms: int | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    disk = disk_figure(policies, start_ms)
    if disk is not None:
        out["disk"] = _svg(disk)
    loss = loss_figure(policies)
    out["loss"] = (_svg(loss) if loss is not None else
                   "<p>No policy deletes a message before its consumer groups have read it.</p>")
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
        f"<li>snapshot {human_ms(sim.get('snapshot_ms'))}; simulated {human_ms(sim.get('start_ms'))} → {human_ms(sim.get('until_ms'))}"
        f" (first cleaner run {human_ms(sim.get('first_tick_ms'))})</li>",
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
        cl = [dict(d, time=human_ms(d["time_ms"])) for d in p["deletions"]]
        parts.append(f"<h3>Deletion timeline ({len(cl)} files)</h3>")
        parts.append(_table(cl, ["time", "file", "kind", "reason"], limit=300))
        lost = [dict(g, first_loss=human_ms(g["first_loss_ms"]), ranges=ranges_text(g["lost_offsets"]))
                for g in p["groups"]]
        parts.append("<h3>Consumer groups</h3>")
        parts.append(_table(lost, ["group", "topic", "queue_id", "committed_offset", "lost_messages", "lost_bytes",
                                   "ranges", "first_loss"], limit=500))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(path: str, report: dict[str, Any]) -> None:
    """Render and write the report atomically."""
    atomic_write(path, render_html(report).encode("utf-8"))


def ranges_text(ranges: list, show: int = 20) -> str:
    """Lost offset ranges for a report table: the first ``show`` and how many there are in all."""
    txt = " ".join(f"[{a},{b}]" for a, b in ranges[:show])
    return txt + (f" ... ({len(ranges)} ranges; all in the JSON)" if len(ranges) > show else "")
