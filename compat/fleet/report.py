"""Rendering a fleet check: text for people, JSON for tools
(``compat/schemas/fleet-report.v1.json``), Markdown for pull-request comments, SARIF and GitHub
workflow annotations for CI.  Each query's findings are rendered by ``compat.report`` as a
single-query report would be (positions in JSON and SQL plans alike); only the queries
worth a reader's time are listed in text and Markdown (JSON lists all)."""

from __future__ import annotations

import json
from typing import Any

from compat import report as R
from compat.fleet.check import FleetReport, QueryResult

FORMATS = ("text", "json", "markdown", "sarif", "github")
_ICON = {"identical": "✅", "in_place": "✅", "migrate": "⚠️", "unsupported": "⛔"}
_EFFECT_ORDER = {"unsupported": 0, "migrate": 1, "in_place": 2, "none": 3}


def render(report: FleetReport, fmt: str) -> str:
    return {"text": render_text, "json": render_json, "markdown": render_markdown,
            "sarif": render_sarif, "github": render_github}[fmt](report)


def render_json(report: FleetReport) -> str:
    return json.dumps(report.to_json(), indent=2) + "\n"


def shown(report: FleetReport) -> list[QueryResult]:
    """The queries worth a reader's time: changed, new, removed, or with findings."""
    return [q for q in report.queries if q.status != "unchanged" or q.findings]


def summary(report: FleetReport) -> str:
    n = report.to_json()["summary"]
    total = len(report.queries)
    return f"{total} quer{'y' if total == 1 else 'ies'}: " + \
        ", ".join(f"{n[s]} {s}" for s in ("changed", "unchanged", "new", "removed"))


def _title(q: QueryResult) -> str:
    s = f"{q.query} ({q.status}, {q.path}): {q.verdict}"
    if q.caused_by:
        s += f", caused by {', '.join(q.caused_by)}"
    if q.wave is not None:
        s += f", migration wave {q.wave + 1}"
    return s


def _at(q: QueryResult, pointer: str | None, node: str | None, old: bool = False) -> str:
    plan = q.old_plan if old and q.old_plan is not None else q.plan
    if plan.positions:
        return f"{node + ' ' if node else ''}({R.place(plan, pointer, node)})"
    return f"{plan.file}" + (f" {node}" if node else "") + (f" {pointer}" if pointer else "")


def where(q: QueryResult, f: Any) -> str:
    if f.new_pointer is not None or f.new_node:
        return _at(q, f.new_pointer, f.new_node)
    return _at(q, f.old_pointer, f.old_node, old=q.old_plan is not None)


def render_text(report: FleetReport) -> str:
    lines = [f"fleet verdict: {report.verdict} — {R.VERDICT_TEXT[report.verdict]} "
             f"(exit {report.exit_code})",
             f"  old: {report.old_root}   new: {report.new_root}",
             f"  {summary(report)}"]
    if report.unread:
        ref = report.old_root.split(":", 1)[0]
        lines.append(f"  every file is as it was at {ref}: no plan was read")
    if report.waves:
        new = _new(report)
        lines.append("  migration waves (upstream first): " + "; ".join(
            f"{i + 1}. " + ", ".join(q + (" (new: theseus run)" if q in new else "")
                                     for q in w)
            for i, w in enumerate(report.waves)))
    for c in report.cycles:
        lines.append(f"  cycle: {' -> '.join(c + c[:1])}")
    for q in shown(report):
        lines += ["", f"== {_title(q)}"]
        if not q.findings:
            lines.append("  no findings")
        for f in sorted(q.findings, key=lambda f: _EFFECT_ORDER[f.effect]):
            lines.append(f"  {R._SEVERITY_MARK[f.severity]} [{f.code}] {f.effect}: "
                         f"{f.message}")
            lines.append(f"      at {where(q, f)}")
            lines.append(f"      what to do: {f.hint}")
    return "\n".join(lines) + "\n"


def render_markdown(report: FleetReport) -> str:
    out = [f"### {_ICON[report.verdict]} Theseus fleet: `{report.verdict}`", "",
           R.VERDICT_TEXT[report.verdict] + ".", "",
           f"`{report.old_root}` → `{report.new_root}`: {summary(report)}.", ""]
    if report.waves:
        new = _new(report)
        out += ["Migration waves, upstream first: " + "; ".join(
            f"{i + 1}. " + ", ".join(f"`{q}`" + (" (new: `theseus run`)" if q in new else "")
                                     for q in w)
            for i, w in enumerate(report.waves)) + ".", ""]
    for c in report.cycles:
        out += [f"Cycle: {' → '.join(f'`{x}`' for x in c + c[:1])}.", ""]
    todo = shown(report)
    if not todo:
        return "\n".join(out + ["No query changed.", ""])
    out += ["| query | status | verdict | caused by | findings |", "|---|---|---|---|---|"]
    for q in todo:
        out.append(f"| `{R._md(q.query)}` | {q.status} | {_ICON[q.verdict]} {q.verdict} | "
                   f"{', '.join(f'`{c}`' for c in q.caused_by) or '—'} | "
                   f"{len(q.findings)} |")
    out.append("")
    for q in todo:
        if not q.findings:
            continue
        n = len(q.findings)
        out += [f"<details><summary><code>{R._md(q.query)}</code>: {q.verdict}, {n} "
                f"finding{'' if n == 1 else 's'}</summary>", ""]
        for f in q.findings:
            out.append(f"- {R._SEVERITY_MARK[f.severity]} **{f.effect}** `{f.code}` at "
                       f"{R._md(where(q, f))}: {R._md(f.message)}. *What to do:* "
                       f"{R._md(f.hint)}")
        out += ["", "</details>", ""]
    return "\n".join(out)


def render_github(report: FleetReport) -> str:
    out = [f"::notice title=theseus fleet::{summary(report)}; verdict {report.verdict} — "
           f"{R.VERDICT_TEXT[report.verdict]}"]
    for q in shown(report):
        if q.findings:
            out.append(R.render_github(q.as_report(report), verdict=False).rstrip("\n"))
    return "\n".join(x for x in out if x) + "\n"


def render_sarif(report: FleetReport) -> str:
    """One SARIF run for the fleet: every query's results, the rules merged."""
    base = json.loads(R.render_sarif_empty())
    runs = [json.loads(R.render_sarif(q.as_report(report)))["runs"][0]
            for q in report.queries if q.findings]
    run = base["runs"][0]
    run["properties"] = {"verdict": report.verdict}
    if runs:
        run["results"] = [r for x in runs for r in x["results"]]
        rules: dict[str, Any] = {}
        for x in runs:
            for rule in x["tool"]["driver"]["rules"]:
                rules.setdefault(rule["id"], rule)
        run["tool"]["driver"]["rules"] = list(rules.values())
        ids = list(rules)
        for res in run["results"]:
            res["ruleIndex"] = ids.index(res["ruleId"])
    return json.dumps(base, indent=2) + "\n"


def _new(report: FleetReport) -> set[str]:
    """The queries new to the fleet: in a wave, they are started, not migrated."""
    return {r.query for r in report.queries if r.status == "new"}
