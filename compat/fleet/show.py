"""``theseus fleet show DIR``: the global plan as text, JSON (``compat/schemas/fleet.v1.json``) or
one self-contained HTML page (inline SVG and CSS, no scripts, no network).

What a topic edge carries is what its producer writes, read from the producer's sink: the
columns the plan infers for it (names as written), the record key as the gated sink writes
it (a version 2 sink over a windowed output adds the window), the changelog mode and the
record format.  A consumer's side of the edge (what it declares and uses) is
``compat.fleet.contract``'s business, not shown here.
"""

from __future__ import annotations

import html
import json
from typing import Any

from compat.fleet.graph import Fleet
from compat.fleet.signature import shared_subplans
from compat.infer import characteristics
from compat.legend import LEGEND
from compat.steps.sink import written_key

FORMAT = "theseus.fleet/1"


def describe(fleet: Fleet) -> dict[str, Any]:
    """The global plan as a document (the JSON format; text and HTML are drawn from it)."""
    order = fleet.order()
    queries = []
    for i, name in enumerate(order, start=1):
        q = fleet.queries[name]
        info = q.plan.info[q.plan.sink_id]
        queries.append({
            "query": name, "file": q.path, "order": i,
            "characteristics": characteristics(q.plan),
            "reads": [{"source": nid, "topic": t} for nid, t in q.sources.items()],
            "writes": q.sink_topic, "mode": info.mode,
            "upstream": sorted({fleet.producers[t] for t in q.sources.values()
                                if t in fleet.producers}),
            "downstream": fleet.successors(name),
        })
    topics = []
    for topic in sorted(set(fleet.producers) | set(fleet.consumers)):
        readers = fleet.consumers.get(topic, [])
        producer = fleet.producers.get(topic)
        topics.append({
            "topic": topic,
            "producer": producer,
            "consumers": [{"query": c, "source": s} for c, s in readers],
            "external": ("input" if producer is None else "output" if not readers else None),
            "written": _written(fleet, producer) if producer is not None else None,
            "read_by": {"queries": len({c for c, _ in readers}), "sources": len(readers)},
        })
    return {
        "format": FORMAT,
        "root": fleet.root,
        "queries": queries,
        "topics": topics,
        "edges": [{"from": p, "to": c, "topic": t, "sources": s} for p, c, t, s in
                  _edges(fleet)],
        "external_inputs": fleet.external_inputs(),
        "external_outputs": fleet.external_outputs(),
        "helpers": list(fleet.helpers),
        "cycles": fleet.cycles(),
        "shared": [{"signature": sh.signature, "short": sh.short, "kind": sh.kind,
                    "steps": sh.steps, "topics": list(sh.topics),
                    "deterministic": sh.deterministic,
                    "members": [{"query": q, "node": n} for q, n in sh.members]}
                   for sh in shared_subplans({n: q.plan for n, q in fleet.queries.items()})],
    }


def _written(fleet: Fleet, producer: str) -> dict[str, Any]:
    """What ``producer`` writes to its topic, from its sink."""
    plan = fleet.queries[producer].plan
    sink, info = plan.sink, plan.info[plan.sink_id]
    names = info.names or tuple(n for n, _ in info.columns)
    return {
        "columns": [{"name": n, "type": t} for n, (_, t) in zip(names, info.columns)],
        "key_columns": list(written_key(sink, info)),  # type: ignore[arg-type]
        "mode": info.mode,
        "format": sink.format,  # type: ignore[attr-defined]
        "sink": plan.sink_id,
    }


def _edges(fleet: Fleet) -> list[tuple[str, str, str, list[str]]]:
    """(producer, consumer, topic, the consumer's source ids), in query order."""
    rank = {q: i for i, q in enumerate(fleet.order())}
    out = []
    for topic, readers in fleet.consumers.items():
        producer = fleet.producers.get(topic)
        if producer is None:
            continue
        by_consumer: dict[str, list[str]] = {}
        for c, s in readers:
            by_consumer.setdefault(c, []).append(s)
        out.extend((producer, c, topic, ids) for c, ids in by_consumer.items())
    return sorted(out, key=lambda e: (rank[e[0]], rank[e[1]], e[2]))


def render(fleet: Fleet, fmt: str) -> str:
    doc = describe(fleet)
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "html":
        return render_html(doc)
    return render_text(doc)


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def _helpers_text(helpers: list[str]) -> str:
    """The ``.py`` files the fleet skipped, counted: a job that lost its ``build`` shows
    here rather than vanishing from the fleet unseen."""
    if not helpers:
        return ""
    named = ", ".join(helpers[:3]) + (f", {len(helpers) - 3} more" if len(helpers) > 3 else "")
    return f"; {_plural(len(helpers), 'helper module')} skipped ({named})"


def render_text(doc: dict[str, Any]) -> str:
    """Queries upstream first, then every topic with who writes it, what it carries and
    who reads it, then the fleet's external topics, cycles and shared subplans."""
    queries, topics = doc["queries"], doc["topics"]
    cycles = doc["cycles"]
    out = [f"fleet {doc['root']}: {_plural(len(queries), 'query', 'queries')}, "
           f"{_plural(len(topics), 'topic')} ({len(doc['external_inputs'])} external "
           f"input{'' if len(doc['external_inputs']) == 1 else 's'}, "
           f"{len(doc['external_outputs'])} external "
           f"output{'' if len(doc['external_outputs']) == 1 else 's'}), "
           f"{_plural(len(cycles), 'cycle') if cycles else 'no cycles'}"
           + _helpers_text(doc.get("helpers") or []), "",
           "queries (upstream first):"]
    wname = max((len(q["query"]) for q in queries), default=0)
    wfile = max((len(q["file"]) for q in queries), default=0)
    for q in queries:
        reads = ", ".join(dict.fromkeys(r["topic"] for r in q["reads"]))
        out.append(f"  {q['order']:>2}. {q['query']:<{wname}}  {q['file']:<{wfile}}  "
                   f"({', '.join(q['characteristics'])})  reads {reads} -> writes "
                   f"{q['writes']} [{q['mode']}]")
    out += ["", "topics:"]
    for t in topics:
        readers = ", ".join(f"{c['query']} ({c['source']})" for c in t["consumers"])
        source = t["producer"] or "(external input)"
        sink = readers or "(external output)"
        out.append(f"  {t['topic']}: {source} -> {sink}")
        w = t["written"]
        if w is not None:
            cols = ", ".join(f"{c['name']} {c['type']}" for c in w["columns"])
            key = ", ".join(w["key_columns"]) or "none (null key)"
            out.append(f"      {w['format']} [{w['mode']}], key ({key}): {cols}")
        n = t["read_by"]
        if n["sources"]:
            out.append(f"      read by {_plural(n['queries'], 'query', 'queries')} through "
                       f"{_plural(n['sources'], 'source')}")
    out += ["", "external inputs: " + (", ".join(doc["external_inputs"]) or "none"),
            "external outputs: " + (", ".join(doc["external_outputs"]) or "none"),
            "cycles: " + ("; ".join(" -> ".join([*c, c[0]]) for c in cycles) or "none"),
            "shared subplans:" + ("" if doc["shared"] else " none")]
    for sh in doc["shared"]:
        where = ", ".join(f"{m['query']} ({m['node']})" for m in sh["members"])
        note = "" if sh["deterministic"] else ", nondeterministic: not computed once"
        out.append(f"  {sh['kind']} {sh['short']}: {_plural(sh['steps'], 'step')} over "
                   f"{', '.join(sh['topics'])}{note}, computed by {where}")
    out += ["", LEGEND.rstrip("\n")]
    return "\n".join(out) + "\n"


# -- HTML ----------------------------------------------------------------------------------

BOX_W, BOX_H, PILL_H, GAP_X, GAP_Y, MARGIN = 230, 62, 26, 40, 78, 24
#: the widest a character of each font size is drawn, give or take (wide letters, bold 14px
#: for a query's name), to size a topic pill and cut what does not fit in a box
CHAR_W = {11: 6.6, 12: 7.2, 14: 9.6}
MODE_COLOUR = {"I": "#2e7d32", "I,UA": "#1565c0", "I,UB,UA,D": "#6a1b9a"}


def _layout(doc: dict[str, Any]) -> tuple[dict[str, tuple[float, float, float, float]],
                                          float, float]:
    """Boxes by key (``q:<query>``, ``t:<topic>``) as (x, y, width, height): external inputs
    on the top row, each query one row below the deepest query or input feeding it (on a
    cycle, only the queries before it in the fleet's order count: the edge back up the cycle
    is drawn upwards), each external output one row below its producer.  Within a row,
    boxes go left to right by the mean position of what feeds them (the barycenter
    heuristic, one pass from the top), which keeps most edges from crossing."""
    rank = {q["query"]: q["order"] for q in doc["queries"]}
    layer: dict[str, int] = {}
    feeds: dict[str, list[str]] = {}
    for q in doc["queries"]:  # upstream first: every producer before it has its row
        key = f"q:{q['query']}"
        feeds[key] = [f"q:{u}" for u in q["upstream"] if rank[u] < q["order"]] + \
            [f"t:{r['topic']}" for r in q["reads"] if r["topic"] in doc["external_inputs"]]
        layer[q["query"]] = max([layer[k[2:]] for k in feeds[key] if k[0] == "q"] +
                                [0 if len(feeds[key]) else -1]) + 1
    rows: dict[int, list[tuple[str, float, float]]] = {}
    for t in doc["external_inputs"]:
        rows.setdefault(0, []).append((f"t:{t}", _pill_w(t), PILL_H))
    for q in doc["queries"]:
        rows.setdefault(layer[q["query"]], []).append((f"q:{q['query']}", BOX_W, BOX_H))
    for t in doc["topics"]:
        if t["external"] == "output":
            feeds[f"t:{t['topic']}"] = [f"q:{t['producer']}"]
            rows.setdefault(layer[t["producer"]] + 1, []).append(
                (f"t:{t['topic']}", _pill_w(t["topic"]), PILL_H))
    width = max((sum(w for _, w, _ in r) + GAP_X * (len(r) - 1) for r in rows.values()),
                default=BOX_W) + 2 * MARGIN
    pos: dict[str, tuple[float, float, float, float]] = {}
    y = MARGIN
    for d in sorted(rows):
        row = rows[d]

        def centre(item: tuple[str, float, float]) -> float:
            placed = [pos[k][0] + pos[k][2] / 2 for k in feeds.get(item[0], []) if k in pos]
            return sum(placed) / len(placed) if placed else width / 2

        row.sort(key=centre)  # stable: a tie keeps the fleet's order
        total = sum(w for _, w, _ in row) + GAP_X * (len(row) - 1)
        x = (width - total) / 2
        tallest = max(h for _, _, h in row)
        for key, w, h in row:
            pos[key] = (x, y + (tallest - h) / 2, w, h)
            x += w + GAP_X
        y += tallest + GAP_Y
    return pos, width, y - GAP_Y + MARGIN


def _pill_w(topic: str) -> float:
    return len(topic) * CHAR_W[12] + 24


def _fit(text: str, size: int, keep_end: bool = False) -> str:
    """``text`` cut with an ellipsis to fit in a query's box (the whole of it is in the
    box's tooltip); a path keeps its end, where the file's name is."""
    room = int((BOX_W - 20) / CHAR_W[size])
    if len(text) <= room:
        return text
    return "…" + text[-(room - 1):] if keep_end else text[:room - 1] + "…"


def _svg(doc: dict[str, Any]) -> str:
    pos, width, height = _layout(doc)
    topics = {t["topic"]: t for t in doc["topics"]}
    pairs = {(e["from"], e["to"]) for e in doc["edges"]}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="fleet" width="{width:.0f}" '
             f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" '
             'markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path '
             'd="M0,0 L10,5 L0,10 z" fill="#78909c"/></marker></defs>']
    lines: list[tuple[str, str, str, str, str]] = []  # (from key, to key, class, topic, label)
    for e in doc["edges"]:
        w = topics[e["topic"]]["written"]
        lines.append((f"q:{e['from']}", f"q:{e['to']}", "edge", e["topic"],
                      f"{e['topic']} [{w['mode']}]"))
    for t in doc["topics"]:
        if t["external"] == "input":
            lines += [(f"t:{t['topic']}", f"q:{c['query']}", "edge external", t["topic"], "")
                      for c in t["consumers"]]
        elif t["external"] == "output":
            lines.append((f"q:{t['producer']}", f"t:{t['topic']}", "edge external",
                          t["topic"], ""))
    for a, b, cls, topic, label in dict.fromkeys(lines):
        (x1, y1, w1, h1), (x2, y2, w2, h2) = pos[a], pos[b]
        sx, ex = x1 + w1 / 2, x2 + w2 / 2
        if y2 > y1:  # downstream: bottom of the producer to the top of the consumer
            sy, ey = y1 + h1, y2
        elif y2 < y1:  # back up a cycle
            sy, ey = y1, y2 + h2
        else:  # across a row: side to side
            sy = ey = y1 + h1 / 2
            sx, ex = (x1 + w1, x2) if x2 > x1 else (x1, x2 + w2)
        # two queries reading each other: bend the two edges apart
        bend = 36 if (a[2:], b[2:]) in pairs and (b[2:], a[2:]) in pairs else 0
        mx, my = (sx + ex) / 2, (sy + ey) / 2
        cx, cy = (mx, my + (bend if a < b else -bend)) if sy == ey else \
            (mx + (bend if a < b else -bend), my)
        w = topics[topic]["written"]
        tip = f"{topic}: " + (
            f"{w['format']} [{w['mode']}], key ({', '.join(w['key_columns'])}): " +
            ", ".join(f"{c['name']} {c['type']}" for c in w["columns"])
            if w else "an external input")
        colour = MODE_COLOUR.get(w["mode"], "#78909c") if w and label else "#b0bec5"
        parts.append(f'<g class="{cls}" data-topic="{html.escape(topic)}" '
                     f'data-from="{html.escape(a[2:])}" data-to="{html.escape(b[2:])}">'
                     f"<title>{html.escape(tip)}</title>"
                     f'<path d="M{sx:.0f},{sy:.0f} Q{cx:.0f},{cy:.0f} {ex:.0f},{ey:.0f}" '
                     f'fill="none" stroke="{colour}" stroke-width="{2 if label else 1.5}" '
                     'marker-end="url(#arrow)"/>')
        if label:
            # Two thirds of the way, where the edges fanning out of one producer are apart,
            # on the outer side of the edge: labels of a fan-out do not run into each other.
            t = 2 / 3
            lx = (1 - t) ** 2 * sx + 2 * (1 - t) * t * cx + t ** 2 * ex
            ly = (1 - t) ** 2 * sy + 2 * (1 - t) * t * cy + t ** 2 * ey
            left = ex < sx - 1 or (abs(ex - sx) <= 1 and cx < mx)
            parts.append(f'<text class="label" x="{lx + (-6 if left else 6):.0f}" '
                         f'y="{ly + 4:.0f}" text-anchor="{"end" if left else "start"}" '
                         f'font-size="12" fill="{colour}">{html.escape(label)}</text>')
        parts.append("</g>")
    for t in doc["topics"]:
        if t["external"] is None:
            continue
        x, y, w, h = pos[f"t:{t['topic']}"]
        parts.append(f'<g class="topic external" data-topic="{html.escape(t["topic"])}" '
                     f'data-external="{t["external"]}"><title>{html.escape(t["topic"])}: '
                     f'external {t["external"]}</title>'
                     f'<rect x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{h}" '
                     f'rx="{h / 2:.0f}" fill="#fffde7" stroke="#f9a825"/>'
                     f'<text x="{x + w / 2:.0f}" y="{y + h / 2 + 4:.0f}" font-size="12" '
                     f'text-anchor="middle">{html.escape(t["topic"])}</text></g>')
    on_cycle = {q for c in doc["cycles"] for q in c}
    for q in doc["queries"]:
        x, y, w, h = pos[f"q:{q['query']}"]
        name = _fit(f"{q['order']}. {q['query']}", 14)
        path = _fit(q["file"], 11, keep_end=True)
        traits = _fit(f"[{q['mode']}] {', '.join(q['characteristics'])}", 11)
        cycle = ' data-cycle="true"' if q["query"] in on_cycle else ""
        shares = " ".join(sh["short"] for sh in doc["shared"]
                          if any(m["query"] == q["query"] for m in sh["members"]))
        parts.append(f'<g class="query" data-query="{html.escape(q["query"])}"{cycle} '
                     f'data-shared="{shares}"><title>{html.escape(q["query"])} '
                     f'({html.escape(q["file"])}): {", ".join(q["characteristics"])}, '
                     f'writes {html.escape(q["writes"])} [{q["mode"]}]'
                     f'{"; shares " + shares if shares else ""}</title>'
                     f'<rect x="{x:.0f}" y="{y:.0f}" width="{w}" height="{h}" rx="8" '
                     f'fill="#263238" stroke="{"#d32f2f" if cycle else "#263238"}" '
                     f'stroke-width="{3 if cycle else 1.5}"/>'
                     + (f'<rect class="shares" x="{x - 4:.0f}" y="{y - 4:.0f}" '
                        f'width="{w + 8}" height="{h + 8}" rx="10" fill="none" '
                        f'stroke="#ef6c00" stroke-width="2" stroke-dasharray="6 3"/>'
                        if shares else "")
                     + f'<text x="{x + 10:.0f}" y="{y + 20:.0f}" fill="#fff" font-size="14" '
                     f'font-weight="bold">{html.escape(name)}</text>'
                     f'<text x="{x + 10:.0f}" y="{y + 37:.0f}" fill="#cfd8dc" '
                     f'font-size="11">{html.escape(path)}</text>'
                     f'<text x="{x + 10:.0f}" y="{y + 53:.0f}" fill="#fff" font-size="11">'
                     f'{html.escape(traits)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def svg(doc: dict[str, Any]) -> str:
    """The drawing of the global plan alone, an inline SVG (``theseus serve`` puts it in
    its page)."""
    return _svg(doc)


def render_html(doc: dict[str, Any]) -> str:
    """The page: the drawing, then the topics table, cycles and shared subplans."""
    rows = []
    for t in doc["topics"]:
        w = t["written"]
        cols = ", ".join(f"{c['name']} {c['type']}" for c in w["columns"]) if w else ""
        rows.append(
            f'<tr data-topic="{html.escape(t["topic"])}"><td><code>'
            f'{html.escape(t["topic"])}</code></td>'
            f'<td>{html.escape(t["producer"] or "external input")}</td>'
            f'<td>{html.escape(", ".join(c["query"] for c in t["consumers"]) or "external output")}'
            f'</td><td>{w["format"] + " [" + w["mode"] + "]" if w else ""}</td>'
            f'<td>{html.escape(", ".join(w["key_columns"])) if w else ""}</td>'
            f'<td>{html.escape(cols)}</td><td>{t["read_by"]["queries"]} / '
            f'{t["read_by"]["sources"]}</td></tr>')
    cycles = "".join(f"<li>{html.escape(' → '.join([*c, c[0]]))}</li>" for c in doc["cycles"])
    shared = "".join(
        f'<li data-signature="{s["short"]}"><code>{s["short"]}</code> {s["kind"]}: '
        f'{_plural(s["steps"], "step")} over {html.escape(", ".join(s["topics"]))}, computed '
        f'by {html.escape(", ".join(m["query"] + " (" + m["node"] + ")" for m in s["members"]))}'
        f'</li>' for s in doc["shared"])
    modes = "".join(f'<span class="chip" style="border-color:{c}">[{m}]</span>'
                    for m, c in MODE_COLOUR.items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>theseus fleet: {html.escape(doc["root"])}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #263238; }}
h1 {{ font-size: 22px; }} h2 {{ font-size: 17px; margin-top: 24px; }}
.pane {{ border: 1px solid #cfd8dc; border-radius: 8px; padding: 12px; overflow: auto; }}
svg text {{ font-family: system-ui, sans-serif; }}
table {{ border-collapse: collapse; }}
td, th {{ border-bottom: 1px solid #eceff1; padding: 6px 10px; text-align: left;
  vertical-align: top; font-size: 13px; }}
.chip {{ border: 3px solid; border-radius: 6px; padding: 1px 6px; margin-right: 8px; }}
</style></head><body>
<h1>theseus fleet — {html.escape(doc["root"])}</h1>
<p>{len(doc["queries"])} queries, numbered upstream first; an edge is a topic one query
writes and another reads, labelled with its changelog mode: {modes} Pale boxes are external
topics; a red border marks a query on a cycle, a dashed orange one a query that
computes a subplan another query computes too (listed under Shared subplans).</p>
<div class="pane">{_svg(doc)}</div>
<h2>Topics</h2>
<table class="topics"><tr><th>topic</th><th>written by</th><th>read by</th><th>format
[mode]</th><th>key</th><th>columns</th><th>queries / sources reading</th></tr>
{"".join(rows)}</table>
<h2>Cycles</h2>
<ul class="cycles">{cycles or "<li>none</li>"}</ul>
<h2>Shared subplans</h2>
<ul class="shared">{shared or "<li>none</li>"}</ul>
</body></html>
"""
