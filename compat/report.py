"""Report rendering: text for people, JSON for tools, Markdown for PR comments, SARIF and
GitHub workflow annotations for CI.  Line numbers come from the JSON source itself."""

from __future__ import annotations

import gc
import json
from functools import lru_cache
from typing import Any

from compat.check import Report
from compat.findings import Finding
from compat.infer import characteristics

_VERDICT_TEXT = {
    "identical": "the plans compute the same thing; nothing to do",
    "in_place": "the new plan can restart from the old checkpoint",
    "migrate": "the state is incompatible: deploy with a live migration",
    "unsupported": "this change cannot be done live on the same output",
}
_SEVERITY_MARK = {"error": "✗", "warning": "!", "info": "·"}


def render(report: Report, fmt: str) -> str:
    # Rendering builds a container per finding and per matched pair while both plans are
    # still alive: the cyclic garbage collector would rescan all of them, several times on
    # a large pair (it cost more than the walk itself), as ``check_files`` says.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return {"text": render_text, "json": render_json, "markdown": render_markdown,
                "sarif": render_sarif, "github": render_github}[fmt](report)
    finally:
        if was_enabled:
            gc.enable()


def render_json(report: Report) -> str:
    return json.dumps(report.to_json(), indent=2) + "\n"


def _loc(f: Finding) -> str:
    parts = []
    if f.old_node or f.old_pointer:
        parts.append(f"old {f.old_node or ''}{' ' + f.old_pointer if f.old_pointer else ''}")
    if f.new_node or f.new_pointer:
        parts.append(f"new {f.new_node or ''}{' ' + f.new_pointer if f.new_pointer else ''}")
    return "; ".join(p.replace("  ", " ") for p in parts)


def render_text(report: Report) -> str:
    lines = [f"verdict: {report.verdict} — {_VERDICT_TEXT[report.verdict]} "
             f"(exit {report.exit_code})",
             f"  old: {report.old.file}   new: {report.new.file}"]
    if report.upgrade_types:
        lines.append(f"  upgrade types: {', '.join(report.upgrade_types)}")
    lines.append(f"  characteristics: old {', '.join(characteristics(report.old))}; "
                 f"new {', '.join(characteristics(report.new))}")
    for r in report.requirements:
        lines.append(f"  requirement {r['name']}: {'met' if r['met'] else 'NOT met'} "
                     f"({r['note']})")
    order = {"unsupported": 0, "migrate": 1, "in_place": 2, "none": 3}
    findings = sorted(report.findings, key=lambda f: order[f.effect])
    if not findings:
        lines.append("no findings")
    for f in findings:
        lines.append("")
        lines.append(f"{_SEVERITY_MARK[f.severity]} [{f.code}] {f.effect}: {f.message}")
        loc = _loc(f)
        if loc:
            lines.append(f"    at {loc}")
        lines.append(f"    what to do: {f.hint}")
    return "\n".join(lines) + "\n"


def render_markdown(report: Report) -> str:
    icon = {"identical": "✅", "in_place": "✅", "migrate": "⚠️", "unsupported": "⛔"}
    out = [f"### {icon[report.verdict]} Theseus: `{report.verdict}`",
           "", _VERDICT_TEXT[report.verdict] + ".", "",
           f"`{report.old.file}` → `{report.new.file}`", ""]
    if report.findings:
        out += ["| | code | effect | where | finding | what to do |",
                "|---|---|---|---|---|---|"]
        for f in report.findings:
            where = _md(f.new_node or f.old_node or "plan")
            out.append(f"| {_SEVERITY_MARK[f.severity]} | `{f.code}` | {f.effect} | {where} "
                       f"| {_md(f.message)} | {_md(f.hint)} |")
    else:
        out.append("No findings.")
    out += ["", "<details><summary>Matched enforcing steps</summary>", "",
            "| old | new | step |", "|---|---|---|"]
    out += [f"| `{a}` | `{b}` | {s} |" for a, b, s in report.alignment]
    out += ["", "</details>", ""]
    return "\n".join(out)


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


# -- positions in the source -------------------------------------------------------------


@lru_cache(maxsize=16)
def pointer_lines(path: str) -> dict[str, int]:
    """Map every JSON pointer of a file to the 1-based line where its value starts."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return {}
    out: dict[str, int] = {}
    line = 1
    i = 0
    n = len(text)
    stack: list[list[Any]] = []  # [kind, key or index, pointer]

    def current() -> str:
        return "".join("/" + str(s[1]).replace("~", "~0").replace("/", "~1")
                       for s in stack if s[1] is not None)

    pending_key: str | None = None
    expect_value = True
    while i < n:
        ch = text[i]
        if ch == "\n":
            line += 1
            i += 1
            continue
        if ch in " \t\r,:":
            if ch == "," and stack and stack[-1][0] == "[":
                stack[-1][1] += 1
                expect_value = True
            elif ch == "," and stack:
                stack[-1][1] = None
            if ch == ":":
                expect_value = True
            i += 1
            continue
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            s = json.loads(text[i:j + 1])
            if stack and stack[-1][0] == "{" and stack[-1][1] is None and not expect_value:
                pending_key = s
                stack[-1][1] = s
            else:
                out.setdefault(current(), line)
            expect_value = False
            i = j + 1
            continue
        if ch in "{[":
            out.setdefault(current(), line)
            stack.append([ch, 0 if ch == "[" else None])
            expect_value = ch == "["
            i += 1
            continue
        if ch in "}]":
            stack.pop()
            i += 1
            expect_value = False
            continue
        j = i
        while j < n and text[j] not in ",}] \t\r\n":
            j += 1
        out.setdefault(current(), line)
        expect_value = False
        i = j
    del pending_key
    return out


def line_of(path: str, pointer: str | None) -> int:
    if pointer is None:
        return 1
    lines = pointer_lines(path)
    p = pointer
    while p:
        if p in lines:
            return lines[p]
        p = p.rsplit("/", 1)[0]
    return 1


def _primary(report: Report, f: Finding) -> tuple[str, int]:
    if f.new_pointer is not None:
        return report.new.file, line_of(report.new.file, f.new_pointer)
    return report.old.file, line_of(report.old.file, f.old_pointer)


def render_github(report: Report) -> str:
    level = {"error": "error", "warning": "warning", "info": "notice"}
    out = []
    for f in report.findings:
        file, line = _primary(report, f)
        msg = f"{f.message}. {f.hint}".replace("%", "%25").replace("\r", "%0D") \
            .replace("\n", "%0A")
        title = f"theseus {f.code} ({f.effect})".replace(",", "%2C").replace("::", "%3A%3A")
        out.append(f"::{level[f.severity]} file={file},line={line},title={title}::{msg}")
    out.append(f"::notice title=theseus verdict::{report.verdict} — "
               f"{_VERDICT_TEXT[report.verdict]}")
    return "\n".join(out) + "\n"


def render_sarif(report: Report) -> str:
    from compat.findings import CODES, EFFECT_RANK

    level = {"error": "error", "warning": "warning", "info": "note"}
    codes = sorted({f.code for f in report.findings})
    # A rule's help and effect are those of its results under the flags in force, not the
    # code's defaults: --schema-compat backward makes an added column unsupported.
    by_code: dict[str, list[Finding]] = {}
    for f in report.findings:
        by_code.setdefault(f.code, []).append(f)
    rules = [{"id": c, "name": c.replace("-", " "),
              "shortDescription": {"text": c.replace("-", " ")},
              "help": {"text": " ".join(dict.fromkeys(f.hint for f in by_code[c]))},
              "properties": {"upgrade_type": CODES[c][2],
                             "effect": max((f.effect for f in by_code[c]),
                                           key=EFFECT_RANK.__getitem__)}}
             for c in codes]
    results = []
    for f in report.findings:
        file, line = _primary(report, f)
        locs = [{"physicalLocation": {"artifactLocation": {"uri": file},
                                      "region": {"startLine": line}},
                 "logicalLocations": [{"name": f.new_node or f.old_node or "plan",
                                       "fullyQualifiedName": f.new_pointer or f.old_pointer
                                       or "/"}]}]
        related = []
        if f.old_pointer is not None and f.new_pointer is not None:
            related.append({"id": 1, "message": {"text": "in the old plan"},
                            "physicalLocation": {
                                "artifactLocation": {"uri": report.old.file},
                                "region": {"startLine": line_of(report.old.file,
                                                                f.old_pointer)}}})
        res = {"ruleId": f.code, "ruleIndex": codes.index(f.code), "level": level[f.severity],
               "message": {"text": f"{f.message}. {f.hint}"}, "locations": locs,
               "properties": {"effect": f.effect, "upgrade_type": f.upgrade_type}}
        if related:
            res["relatedLocations"] = related
        results.append(res)
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{"tool": {"driver": {"name": "theseus", "informationUri":
                                      "https://theseus.dev", "rules": rules}},
                  "results": results,
                  "properties": {"verdict": report.verdict}}],
    }
    return json.dumps(doc, indent=2) + "\n"


def render_sarif_empty() -> str:
    return json.dumps({"$schema": "https://json.schemastore.org/sarif-2.1.0.json",
                       "version": "2.1.0",
                       "runs": [{"tool": {"driver": {"name": "theseus", "informationUri":
                                                     "https://theseus.dev", "rules": []}},
                                 "results": []}]})
