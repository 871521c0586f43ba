"""The pieces every rmqstore HTML report shares: the stylesheet, text escaping, UTC times and the findings
table (reports are single self-contained pages: inline CSS and SVG, no script)."""

from __future__ import annotations

import html
import time
from typing import Any


def esc(x: Any) -> str:
    """HTML-escaped text (None: empty)."""
    return html.escape("" if x is None else str(x))


def utc(ms: int | None) -> str:
    """Epoch milliseconds as UTC text to the second ('-' for 0/None)."""
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + "Z"


def findings_section(rep: dict) -> str:
    """The findings table of a report dict (kind, severity, file, offset, detail each)."""
    rows = []
    for f in rep["findings"]:
        rows.append(f'<tr class="{esc(f["severity"])}"><td><span class="sev {esc(f["severity"])}">{esc(f["severity"])}'
                    f'</span></td><td>{esc(f["kind"])}</td><td class="mono">{esc(f["file"])}</td>'
                    f'<td class="num">{esc(f["offset"])}</td><td>{esc(f["detail"])}</td></tr>')
    body = "".join(rows) or '<tr><td colspan="5">No findings.</td></tr>'
    return ('<section id="findings"><h2>Findings</h2><table class="grid"><thead><tr><th>severity</th><th>kind</th>'
            f'<th>file</th><th>offset</th><th>detail</th></tr></thead><tbody>{body}</tbody></table></section>')


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#212529;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;border-bottom:2px solid #dee2e6;padding-bottom:4px;margin-top:28px}
h3{font-size:15px} .note{color:#495057;font-size:13px} .mono{font-family:ui-monospace,monospace;font-size:12px}
table{border-collapse:collapse;font-size:13px} td,th{padding:3px 8px;border-bottom:1px solid #e9ecef;text-align:left;
vertical-align:top} table.kv th{width:190px;color:#495057;font-weight:600} .num{text-align:right}
table.grid thead th{background:#f1f3f5;position:sticky;top:0} .sev{display:inline-block;padding:1px 6px;border-radius:3px;
color:#fff;font-size:12px} .sev.critical{background:#8b0000}.sev.error{background:#d9480f}.sev.warning{background:#f59f00}
.sev.info{background:#4dabf7} .map{display:flex;flex-wrap:wrap;gap:4px;max-width:1000px} .cell{position:relative;
width:64px;height:44px;border-radius:3px;overflow:hidden} .cell .fill{position:absolute;top:0;left:0;right:0;
background:rgba(255,255,255,.55)} .cell span{position:absolute;bottom:2px;left:3px;font-size:10px;color:#fff;
text-shadow:0 0 2px #000;font-family:ui-monospace,monospace} .lg{display:inline-block;width:11px;height:11px;margin:0 3px 0 10px;
vertical-align:middle;border-radius:2px} .bar{height:10px;background:#e8590c;border-radius:2px}
"""


__all__ = ["CSS", "esc", "findings_section", "utc"]
