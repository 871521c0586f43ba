"""The replica comparison's report: one self-contained HTML page (the audit's look: inline CSS and SVG, no
script) and the JSON beside it, plus the console summary and the job's one-line-per-group row.

Sections: summary, each store's commitlog drawn to scale (shared part, what only it holds, where a rejoin
cuts it), the pairs, what each store holds alone per queue, what a rejoin drops, consumer groups past
another store's end, config/ differences, findings.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jobs.reports.audit_report import jsonable
from jobs.reports.htmlpage import CSS
from jobs.reports.htmlpage import esc as _e
from jobs.reports.htmlpage import findings_section as _findings
from jobs.reports.htmlpage import utc as _ms

MAX_ROWS = 500  # rows per HTML table (the JSON has them all)


def summary_row(r: dict[str, Any]) -> dict[str, Any]:
    """One group in the job's summary.json."""
    if "error" in r:
        return {"group": r.get("group"), "error": r["error"]}
    return {"group": r.get("group"), "mode": r["mode"], "consistent": r["consistent"], "diverged_at": r["diverged_at"],
            "stores": [{"name": s["name"], "only_here": s["only_here"], "truncated_at": s["truncated_at"]}
                       for s in r["stores"]]}


def summary_text(r: dict[str, Any]) -> str:
    """The console summary of one comparison."""
    what = "the leader" if r["mode"] == "dledger" else "the newest epoch"
    lines = [f"mode: {r['mode']}" + (f" (reference: {r['reference']}, {what})" if r.get("reference") else ""),
             "consistent: each store is a prefix of another" if r["consistent"]
             else f"DIVERGED at offset {r['diverged_at']:,}"]
    w = max(len(s["name"]) for s in r["stores"])
    for s in r["stores"]:
        h = s["held_only_here"]
        cut = s["truncated_at"]
        rejoin = s.get("rejoin") or {}
        lines.append(f"  {s['name']:<{w}}  [{s['min_offset']:,}, {s['end']:,})  only here: {s['only_here']:,} message(s)"
                     f" {h['bytes']:,} bytes" + (f" [{h['first_offset']:,}..{h['last_offset']:,}]" if h["messages"] else "")
                     + (f"  rejoin cuts at {cut:,} ({rejoin['drops']['messages']:,} message(s))" if cut is not None
                        else (f"  rejoin: {rejoin['outcome']}" if rejoin else "")))
    c = r["config_summary"]
    if any(c.values()):
        lines.append("config/: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in c.items() if v))
    past = [x for x in r["consumers"] if x["kind"] == "past_end"]
    div = [x for x in r["consumers"] if x["kind"] == "past_divergence"]
    if past or div:
        lines.append(f"consumer offsets: {len(past)} past another store's end, {len(div)} past where the stores part")
    sev = {}
    for f in r["findings"]:
        sev[f["severity"]] = sev.get(f["severity"], 0) + 1
    if sev:
        lines.append("findings: " + ", ".join(f"{n} {k}" for k, n in sorted(sev.items())))
    return "\n".join(lines)


def _summary(r: dict) -> str:
    status = ('<b style="color:#2f9e44">CONSISTENT</b>' if r["consistent"]
              else f'<b style="color:#d9480f">DIVERGED at {r["diverged_at"]:,}</b>')
    ref = "reference (the DLedger leader)" if r["mode"] == "dledger" else "reference (newest epoch)"
    cells = [("status", status), ("mode", _e(r["mode"])), (ref, _e(r.get("reference") or "-")),
             ("stores", len(r["stores"]))]
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in cells)
    st = []
    for s in r["stores"]:
        rj = s.get("rejoin") or {}
        st.append(f'<tr><td>{_e(s["name"])}</td><td class="mono">{_e(s["uri"])}</td><td class="num">{s["min_offset"]:,}'
                  f'</td><td class="num">{s["end"]:,}</td><td class="num">{s["only_here"]:,}</td>'
                  f'<td class="num">{s["held_only_here"]["bytes"]:,}</td><td class="num">'
                  f'{"-" if s["truncated_at"] is None else format(s["truncated_at"], ",")}</td>'
                  f'<td>{_e(rj.get("outcome", "-"))}</td>'
                  f'<td class="mono">{_e(_meta(s))}</td></tr>')
    return (f'<section id="summary"><h2>Summary</h2><table class="kv">{rows}</table><h3>Stores</h3>'
            '<table class="grid"><thead><tr><th>store</th><th>uri</th><th>min offset</th><th>end</th><th>only here</th>'
            '<th>bytes only here</th><th>truncated at</th><th>rejoin</th><th>epochs / ledger</th></tr></thead><tbody>'
            + "".join(st) + "</tbody></table></section>")


def _meta(s: dict) -> str:
    """A store's epochs (controller mode) or ledger (DLedger: index range, last term, committed index)."""
    led = s.get("ledger")
    if led:
        return (f"{led['self_id']}: index {led['begin_index']}..{led['end_index']} (term {led['end_term']}), committed "
                f"{led['committed_index']}, current term {led['term']}")
    return " ".join(f"{e}-{o}" for e, o in s["epochs"]) or "-"


def _map(r: dict) -> str:
    """Each store's [min, end) to one scale: grey shared with every store, orange held only here, a red line
    where a rejoin cuts, a dashed line where the stores part."""
    lo = min(s["min_offset"] for s in r["stores"])
    hi = max(max(s["end"] for s in r["stores"]), lo + 1)
    W, H, pad = 900, 26, 150
    x = lambda v: pad + (v - lo) / (hi - lo) * W  # noqa: E731
    rows = []
    for k, s in enumerate(r["stores"]):
        y = 10 + k * (H + 12)
        parts = [f'<text x="4" y="{y + 17}" font-size="12">{_e(s["name"][:20])}</text>',
                 f'<rect x="{x(s["min_offset"]):.1f}" y="{y}" width="{max(1, x(s["end"]) - x(s["min_offset"])):.1f}" '
                 f'height="{H}" fill="#ced4da"><title>{_e(s["name"])}: [{s["min_offset"]:,}, {s["end"]:,})</title></rect>']
        h = s["held_only_here"]
        if h["messages"]:
            a, b = h["first_offset"], h["last_offset"]
            parts.append(f'<rect x="{x(a):.1f}" y="{y}" width="{max(2, x(b) - x(a)):.1f}" height="{H}" fill="#e8590c">'
                         f'<title>only here: {h["messages"]:,} message(s) from {a:,} to {b:,}</title></rect>')
        if s["truncated_at"] is not None:
            t = x(s["truncated_at"])
            parts.append(f'<line x1="{t:.1f}" x2="{t:.1f}" y1="{y - 3}" y2="{y + H + 3}" stroke="#c92a2a" stroke-width="3">'
                         f'<title>a rejoin cuts at {s["truncated_at"]:,}</title></line>')
        rows.append("".join(parts))
    total_h = 20 + len(r["stores"]) * (H + 12)
    div = ""
    if r["diverged_at"] is not None:
        d = x(r["diverged_at"])
        div = (f'<line x1="{d:.1f}" x2="{d:.1f}" y1="0" y2="{total_h}" stroke="#212529" stroke-dasharray="4 3">'
               f'<title>diverged at {r["diverged_at"]:,}</title></line>')
    return ('<section id="map"><h2>Commitlogs to scale</h2><p class="note">Physical offsets '
            f'{lo:,} … {hi:,}. Grey: the store\'s data; orange: what no other store holds (first to last such '
            'message); red: where a rejoin cuts; dashed: where the stores part.</p>'
            f'<svg width="{pad + W + 20}" height="{total_h}" xmlns="http://www.w3.org/2000/svg">{"".join(rows)}{div}</svg>'
            '</section>')


def _pairs(r: dict) -> str:
    rows = "".join(f'<tr><td>{_e(p["a"])}</td><td>{_e(p["b"])}</td><td>{_e(p["relation"])}</td><td class="num">'
                   f'{p["overlap"][0]:,} … {p["overlap"][1]:,}</td><td class="num">{_e(p["first_difference"])}</td>'
                   f'<td class="num">{p["shared_until"]:,}</td></tr>' for p in r["pairs"])
    return ('<section id="pairs"><h2>Pairs</h2><table class="grid"><thead><tr><th>a</th><th>b</th><th>relation</th>'
            '<th>overlap</th><th>first differing byte</th><th>shared until</th></tr></thead><tbody>'
            f'{rows}</tbody></table></section>')


def _queue_table(title: str, queues: list[dict]) -> str:
    rows = "".join(f'<tr><td>{_e(q["topic"])}</td><td class="num">{q["queue_id"]}</td><td class="num">{q["messages"]:,}'
                   f'</td><td class="num">{q["bytes"]:,}</td><td class="num">{_e(q["first_queue_offset"])} … '
                   f'{_e(q["last_queue_offset"])}</td><td class="num">{q["first_offset"]:,} … {q["last_offset"]:,}</td>'
                   f'<td>{_ms(q["first_store_ts"])} … {_ms(q["last_store_ts"])}</td></tr>' for q in queues[:MAX_ROWS])
    more = f'<p class="note">{len(queues) - MAX_ROWS} more in the JSON.</p>' if len(queues) > MAX_ROWS else ""
    return (f'<h3>{_e(title)}</h3><table class="grid"><thead><tr><th>topic</th><th>queue</th><th>messages</th>'
            '<th>bytes</th><th>queue offsets</th><th>physical offsets</th><th>store time</th></tr></thead><tbody>'
            + (rows or '<tr><td colspan="7">None.</td></tr>') + f"</tbody></table>{more}")


def _holdings(r: dict) -> str:
    parts = []
    for s in r["stores"]:
        parts.append(_queue_table(f"{s['name']}: {s['only_here']:,} message(s) no other store holds",
                                  s["held_only_here"]["queues"]))
        rj = s.get("rejoin")
        if rj:
            parts.append(f'<p class="note">{_e(s["name"])} rejoining {_e(rj["master"])}: {_e(rj["detail"])}</p>')
        if rj and rj.get("drops") and rj["drops"]["messages"]:
            parts.append(_queue_table(f"{s['name']}: {rj['drops']['messages']:,} message(s) a rejoin of "
                                      f"{rj['master']} drops", rj["drops"]["queues"]))
    return '<section id="holdings"><h2>What each store holds alone, and what a rejoin drops</h2>' + "".join(parts) + "</section>"


def _consumers(r: dict) -> str:
    rows = "".join(f'<tr><td>{_e(c["group"])}</td><td>{_e(c["topic"])}</td><td class="num">{c["queue_id"]}</td>'
                   f'<td>{_e(c["store"])}</td><td class="num">{c["committed"]:,}</td><td>{_e(c["other"])}</td>'
                   f'<td class="num">{_e(c["other_end"])}</td><td>{_e(c["kind"])}</td><td class="num">{c["messages"]:,}'
                   f'</td></tr>' for c in r["consumers"][:MAX_ROWS])
    return ('<section id="consumers"><h2>Consumer groups after a switch</h2><p class="note">past_end: the committed '
            'offset on one store lies past the other store\'s end of that queue; past_divergence: past where the two '
            'hold different messages in it (the group would skip the other store\'s messages there).</p>'
            '<table class="grid"><thead><tr><th>group</th><th>topic</th><th>queue</th><th>store</th><th>committed</th>'
            '<th>other store</th><th>its end</th><th>kind</th><th>messages</th></tr></thead><tbody>'
            + (rows or '<tr><td colspan="9">None.</td></tr>') + "</tbody></table></section>")


def _config(r: dict) -> str:
    c = r["config"]
    rows = []
    for kind in ("topics", "subscription_groups"):
        for e in c[kind]["only_on_some"][:MAX_ROWS]:
            rows.append(f'<tr><td>{_e(kind)}</td><td>{_e(e["name"])}</td><td>only on {_e(", ".join(e["on"]))}; missing '
                        f'on {_e(", ".join(e["missing_on"]))}</td></tr>')
        for e in c[kind]["differ"][:MAX_ROWS]:
            rows.append(f'<tr><td>{_e(kind)}</td><td>{_e(e["name"])}</td><td class="mono">{_e(json.dumps(e["values"]))}'
                        '</td></tr>')
    for e in c["consumer_offsets"][:MAX_ROWS]:
        rows.append(f'<tr><td>consumer offset</td><td>{_e(e["group"])} / {_e(e["topic"])} / {e["queue_id"]}</td>'
                    f'<td class="mono">{_e(json.dumps(e["offsets"]))} (re-read after a switch: '
                    f'{_e(json.dumps(e["behind"]))})</td></tr>')
    for e in c["delay_offsets"]:
        rows.append(f'<tr><td>delay offset</td><td>level {e["level"]}</td><td class="mono">{_e(json.dumps(e["offsets"]))}'
                    '</td></tr>')
    return ('<section id="config"><h2>config/ differences</h2><table class="grid"><thead><tr><th>table</th><th>entry'
            '</th><th>difference</th></tr></thead><tbody>' + ("".join(rows) or '<tr><td colspan="3">None.</td></tr>')
            + "</tbody></table></section>")


def render_html(r: dict[str, Any]) -> str:
    """The self-contained HTML page of one comparison."""
    title = "rmqstore replicas — " + (r.get("group") or ", ".join(s["name"] for s in r["stores"]))
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body><h1>{_e(title)}</h1>"
            f'<p class="note">schema {_e(r["schema"])}</p>'
            + _summary(r) + _map(r) + _pairs(r) + _holdings(r) + _consumers(r) + _config(r) + _findings(r)
            + "</body></html>")


def write_reports(r: dict[str, Any], prefix: str) -> tuple[str, str]:
    """``prefix.json`` and ``prefix.html``, each written atomically."""
    from storelib.fileio.smallfile_io import atomic_write

    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    jp, hp = prefix + ".json", prefix + ".html"
    atomic_write(jp, (json.dumps(jsonable(r), indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    atomic_write(hp, render_html(r).encode("utf-8"))
    return jp, hp


__all__ = ["render_html", "summary_row", "summary_text", "write_reports"]
