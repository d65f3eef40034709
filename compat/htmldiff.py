"""``theseus plan diff OLD NEW --format html``: both plans side by side in one
self-contained page (inline SVG and CSS, no scripts, no network).

Each plan is drawn as layers from the sink (top) to the sources (bottom).  Enforcing steps
are dark boxes, passive steps light ones; a matched pair carries the same number in both
drawings (enforcing pairs first, then passive ones, in a lighter badge); a step whose fields
changed, or that only one plan has, carries a mark (~ changed, + added, - removed; added and
removed steps are dashed); a node with a finding gets a coloured border (red: unsupported,
orange: migrate, blue: in place).  Under the drawings, every changed, added or removed step
with its fields old -> new (``compat.plandiff``), then the findings.
"""

from __future__ import annotations

import html
import json
from typing import Any

from compat.check import Report
from compat.model import ENFORCING, Plan
from compat.plandiff import PlanDiff

BOX_W, BOX_H, GAP_X, GAP_Y = 190, 54, 24, 46
EFFECT_COLOUR = {"unsupported": "#d32f2f", "migrate": "#f57c00", "in_place": "#1976d2",
                 "none": "#9e9e9e"}
RANK = {"none": 0, "in_place": 1, "migrate": 2, "unsupported": 3}
STATUS_COLOUR = {"changed": "#7b1fa2", "added": "#2e7d32", "removed": "#c62828"}
STATUS_MARK = {"changed": "~", "added": "+", "removed": "−"}


def _layers(plan: Plan) -> dict[str, int]:
    """Depth of each node below the sink (the longest path up to it), sink at 0: the
    topological generations of the graph with its edges turned from consumers to inputs."""
    import networkx as nx  # off the check's import path: only ``plan diff --html`` draws

    g = nx.DiGraph()
    g.add_nodes_from(plan.nodes)
    g.add_edges_from((nid, i) for nid, node in plan.nodes.items() for i in node.inputs)
    return {nid: depth for depth, layer in enumerate(nx.topological_generations(g))
            for nid in layer}


def _svg(plan: Plan, side: str, badges: dict[str, int], marks: dict[str, str],
         passive_badges: dict[str, int] | None = None,
         status: dict[str, str] | None = None) -> str:
    passive_badges = passive_badges or {}
    status = status or {}
    depth = _layers(plan)
    rows: dict[int, list[str]] = {}
    for nid in plan.nodes:
        rows.setdefault(depth[nid], []).append(nid)
    width = max(len(r) for r in rows.values()) * (BOX_W + GAP_X) + GAP_X
    height = (max(rows) + 1) * (BOX_H + GAP_Y) + GAP_Y
    pos: dict[str, tuple[float, float]] = {}
    for d, ids in rows.items():
        total = len(ids) * (BOX_W + GAP_X) - GAP_X
        x0 = (width - total) / 2
        for k, nid in enumerate(ids):
            pos[nid] = (x0 + k * (BOX_W + GAP_X), GAP_Y / 2 + d * (BOX_H + GAP_Y))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plan" data-side="{side}" '
             f'width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} '
             f'{height:.0f}">',
             '<defs><marker id="arrow-' + side + '" viewBox="0 0 10 10" refX="9" refY="5" '
             'markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" '
             'fill="#78909c"/></marker></defs>']
    for nid, node in plan.nodes.items():  # edges: from input (below) up to consumer
        x2, y2 = pos[nid]
        for i in node.inputs:
            x1, y1 = pos[i]
            parts.append(f'<line x1="{x1 + BOX_W / 2:.0f}" y1="{y1:.0f}" '
                         f'x2="{x2 + BOX_W / 2:.0f}" y2="{y2 + BOX_H:.0f}" stroke="#78909c" '
                         f'stroke-width="1.5" marker-end="url(#arrow-{side})"/>')
    for nid, node in plan.nodes.items():
        x, y = pos[nid]
        info = plan.info.get(nid)
        enforcing = node.klass == ENFORCING
        fill = "#263238" if enforcing else "#eceff1"
        text = "#ffffff" if enforcing else "#263238"
        effect = marks.get(nid)
        st = status.get(nid, "")
        stroke = EFFECT_COLOUR[effect] if effect else STATUS_COLOUR.get(
            st if st != "changed" else "", "#263238" if enforcing else "#b0bec5")
        sw = 4 if effect else 2.5 if st in ("added", "removed") else 1.5
        dash = ' stroke-dasharray="7 4"' if st in ("added", "removed") else ""
        mode = f" [{info.mode}]" if info else ""
        title = f"{nid}: {node.step} ({node.klass}){mode}{' — ' + st if st else ''}"
        parts.append(f'<g class="node {node.klass}" data-id="{html.escape(nid)}" '
                     f'data-effect="{effect or ""}" data-status="{st}">'
                     f'<title>{html.escape(title)}</title>'
                     f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="8" '
                     f'fill="{fill}" stroke="{stroke}" stroke-width="{sw}"{dash}/>'
                     f'<text x="{x + 10:.0f}" y="{y + 22:.0f}" fill="{text}" '
                     f'font-weight="bold">{html.escape(nid[:22])}</text>'
                     f'<text x="{x + 10:.0f}" y="{y + 42:.0f}" fill="{text}" '
                     f'font-size="12">{html.escape(node.step)}{html.escape(mode)}</text>')
        if nid in badges:
            bx, by = x + BOX_W - 16, y + 16
            parts.append(f'<circle cx="{bx:.0f}" cy="{by:.0f}" r="11" fill="#ffca28"/>'
                         f'<text class="badge" x="{bx:.0f}" y="{by + 4:.0f}" '
                         f'text-anchor="middle" font-size="12" fill="#000">{badges[nid]}'
                         '</text>')
        elif nid in passive_badges:
            bx, by = x + BOX_W - 16, y + 16
            parts.append(f'<circle cx="{bx:.0f}" cy="{by:.0f}" r="11" fill="#fff8e1" '
                         f'stroke="#ffca28" stroke-width="2"/>'
                         f'<text class="badge passive" x="{bx:.0f}" y="{by + 4:.0f}" '
                         f'text-anchor="middle" font-size="12" fill="#000">'
                         f'{passive_badges[nid]}</text>')
        if st:
            sx, sy = x + BOX_W - 16, y + BOX_H - 14
            parts.append(f'<rect class="status" x="{sx - 10:.0f}" y="{sy - 9:.0f}" '
                         f'width="20" height="18" rx="4" fill="{STATUS_COLOUR[st]}"/>'
                         f'<text x="{sx:.0f}" y="{sy + 5:.0f}" text-anchor="middle" '
                         f'font-size="14" font-weight="bold" fill="#fff">{STATUS_MARK[st]}'
                         '</text>')
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def render_html(report: Report, diff: PlanDiff | None = None) -> str:
    """The page; ``diff`` (``compat.plandiff.diff`` of the report) adds the passive pairs,
    the marks of changed, added and removed steps and their fields."""
    old_badges: dict[str, int] = {}
    new_badges: dict[str, int] = {}
    for k, (a, b, _) in enumerate(report.alignment, start=1):
        old_badges.setdefault(a, k)
        new_badges.setdefault(b, k)
    old_passive: dict[str, int] = {}
    new_passive: dict[str, int] = {}
    k = len(report.alignment)
    for a, b, _ in report.passive_alignment:
        if a not in old_passive and b not in new_passive:
            k += 1
            old_passive[a] = new_passive[b] = k
    old_status: dict[str, str] = {}
    new_status: dict[str, str] = {}
    if diff is not None:
        old_status = {k: v for k, v in diff.statuses("old").items() if v != "unchanged"}
        new_status = {k: v for k, v in diff.statuses("new").items() if v != "unchanged"}
    old_marks: dict[str, str] = {}
    new_marks: dict[str, str] = {}
    for f in report.findings:
        for marks, nid in ((old_marks, f.old_node), (new_marks, f.new_node)):
            if nid and RANK[f.effect] >= RANK.get(marks.get(nid, "none"), 0):
                marks[nid] = f.effect
    rows = "".join(
        f'<tr class="{f.effect}"><td><code>{html.escape(f.code)}</code></td>'
        f"<td>{f.effect}</td><td>{html.escape(f.old_node or '')} → "
        f"{html.escape(f.new_node or '')}</td><td>{html.escape(f.message)}</td>"
        f"<td>{html.escape(f.hint)}</td></tr>" for f in report.findings)
    legend = "".join(f'<span class="chip" style="border-color:{c}">{e}</span>'
                     for e, c in EFFECT_COLOUR.items() if e != "none")
    marks = "".join(f'<span class="mark" style="background:{STATUS_COLOUR[st]}">'
                    f"{STATUS_MARK[st]}</span> {st} " for st in STATUS_COLOUR)
    steps = _steps_table(diff) if diff is not None else ""
    doc: Any = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>theseus plan diff: {html.escape(report.verdict)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #263238; }}
h1 {{ font-size: 22px; }} .verdict {{ padding: 2px 10px; border-radius: 6px;
  background: {EFFECT_COLOUR.get(report.verdict, '#388e3c') if report.verdict != 'identical'
               else '#388e3c'}; color: white; }}
.panes {{ display: flex; gap: 24px; align-items: flex-start; }}
.pane {{ border: 1px solid #cfd8dc; border-radius: 8px; padding: 12px; overflow: auto; }}
.pane h2 {{ font-size: 15px; margin: 0 0 8px; }}
svg text {{ font-family: system-ui, sans-serif; font-size: 14px; }}
table {{ border-collapse: collapse; margin-top: 20px; }}
td, th {{ border-bottom: 1px solid #eceff1; padding: 6px 10px; text-align: left;
  vertical-align: top; font-size: 13px; }}
.chip {{ border: 3px solid; border-radius: 6px; padding: 1px 6px; margin-right: 8px; }}
.mark {{ color: white; font-weight: bold; border-radius: 4px; padding: 0 6px; }}
del {{ background: #ffebee; color: #b71c1c; }} ins {{ background: #e8f5e9; color: #1b5e20;
  text-decoration: none; }}
.changes {{ margin: 0; padding-left: 18px; }} .changes li {{ font-family: ui-monospace,
  monospace; font-size: 12px; }}
h2.section {{ font-size: 17px; margin-top: 24px; }}
</style></head><body>
<h1>theseus plan diff — <span class="verdict">{html.escape(report.verdict)}</span></h1>
<p>Dark boxes: enforcing steps; light: passive. Numbers pair the matched steps (enforcing
in yellow, passive in a pale badge). Marks: {marks}(dashed: only in one plan).
Borders: {legend}</p>
<div class="panes">
<div class="pane"><h2>old: {html.escape(report.old.file)}</h2>
{_svg(report.old, "old", old_badges, old_marks, old_passive, old_status)}</div>
<div class="pane"><h2>new: {html.escape(report.new.file)}</h2>
{_svg(report.new, "new", new_badges, new_marks, new_passive, new_status)}</div>
</div>
{steps}<h2 class="section">Findings</h2>
<table><tr><th>code</th><th>effect</th><th>old → new</th><th>finding</th><th>what to do</th></tr>
{rows or '<tr><td colspan="5">no findings</td></tr>'}</table>
</body></html>
"""
    return doc


def _steps_table(diff: PlanDiff) -> str:
    """Every step that changed, was added or removed, with its fields old -> new."""
    rows = []
    for s in diff.steps:
        if s.status == "unchanged":
            continue
        ids = html.escape(s.old if s.new is None else s.new if s.old in (None, s.new)
                          else f"{s.old} → {s.new}")
        items = "".join(f"<li>{_change(c)}</li>" for c in s.changes)
        rows.append(f'<tr class="step {s.status}" data-old="{html.escape(s.old or "")}" '
                    f'data-new="{html.escape(s.new or "")}"><td><span class="mark" '
                    f'style="background:{STATUS_COLOUR[s.status]}">'
                    f"{STATUS_MARK[s.status]}</span> {s.status}</td><td><b>{ids}</b></td>"
                    f"<td>{html.escape(s.step)} ({s.klass})</td><td>{s.findings or '—'}</td>"
                    f'<td><ul class="changes">{items}</ul></td></tr>')
    if diff.plan:
        items = "".join(f"<li>{_change(c)}</li>" for c in diff.plan)
        rows.insert(0, f'<tr class="step changed" data-old="" data-new=""><td><span '
                       f'class="mark" style="background:{STATUS_COLOUR["changed"]}">'
                       f'{STATUS_MARK["changed"]}</span> changed</td><td><b>the plan</b></td>'
                       f'<td>query, config</td><td></td><td><ul class="changes">{items}</ul>'
                       '</td></tr>')
    same = sum(1 for s in diff.steps if s.status == "unchanged")
    body = "".join(rows) or '<tr><td colspan="5">no step changed</td></tr>'
    return (f'<h2 class="section">What changed</h2><p>{same} paired step(s) unchanged.</p>'
            f'<table class="steps"><tr><th></th><th>step</th><th>type</th><th>findings</th>'
            f"<th>fields (old → new)</th></tr>{body}</table>\n")


def _change(c: Any) -> str:
    def show(v: Any) -> str:
        return html.escape(json.dumps(v, ensure_ascii=False, separators=(", ", ": ")))

    path = f"<code>{html.escape(c.path)}</code>"
    if c.kind == "added":
        return f"{path}: added <ins>{show(c.new)}</ins>"
    if c.kind == "removed":
        return f"{path}: removed <del>{show(c.old)}</del>"
    if c.kind == "reordered":
        return f"{path}: order <del>{show(c.old)}</del> → <ins>{show(c.new)}</ins>"
    return f"{path}: <del>{show(c.old)}</del> → <ins>{show(c.new)}</ins>"
