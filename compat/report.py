"""Report rendering: text for people, JSON for tools, Markdown for PR comments, SARIF and
GitHub workflow annotations for CI.  Positions come from the source the plan was written in:
a JSON plan's lines from the JSON text itself, a SQL plan's lines and columns from where the
compiler found each part, a PySpark job's from where each DataFrame call was written, in the
job file or a module beside it (``Plan.positions``)."""

from __future__ import annotations

import gc
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from compat.check import Report, is_job
from compat.findings import Finding
from compat.infer import characteristics
from compat.model import Plan

VERDICT_TEXT = {
    "identical": "the plans compute the same thing; nothing to do",
    "in_place": "the new plan can restart from the old checkpoint",
    "migrate": "the state is incompatible: deploy with a live migration",
    "unsupported": "this change cannot be done live on the same output",
}
_SEVERITY_MARK = {"error": "✗", "warning": "!", "info": "·"}


#: which source wrote a checkpoint, as the text report says it (the dry run's form follows)
_WRITTEN_BY = {"kafka-connector": "; written by Spark's Kafka connector (a PySpark job)",
               "gated": "; written by the gated source (theseus run)"}


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


def _loc(report: Report, f: Finding) -> str:
    parts = []
    for side, plan, node, pointer in (("old", report.old, f.old_node, f.old_pointer),
                                      ("new", report.new, f.new_node, f.new_pointer)):
        if not (node or pointer):
            continue
        if plan.positions or is_job(plan.file):
            # a SQL plan or a job: its JSON pointers are into a document nobody wrote
            parts.append(f"{side} {node + ' ' if node else ''}({place(plan, pointer, node)})")
        else:
            parts.append(f"{side} {node or ''}{' ' + pointer if pointer else ''}")
    return "; ".join(p.replace("  ", " ") for p in parts)


#: the in-place verdict of a query over tables read as changelogs: its state keeps its
#: layout, but only a shadow gives the new plan's output (``compat.check``)
IN_PLACE_CHANGELOG = "the state keeps its layout; over tables read as changelogs deploy " \
    "it with theseus migrate start (a shadow), not a restart on the checkpoint"


def render_text(report: Report) -> str:
    text = VERDICT_TEXT[report.verdict]
    if report.verdict == "in_place" and any(f.code == "changelog-restart-shadowed"
                                            for f in report.findings):
        text = IN_PLACE_CHANGELOG
    lines = [f"verdict: {report.verdict} — {text} (exit {report.exit_code})",
             f"  old: {_old_side(report)}   new: {report.new.file}"]
    if report.upgrade_types:
        lines.append(f"  upgrade types: {', '.join(report.upgrade_types)}")
    lines.append(f"  characteristics: old {', '.join(report.old_chars)}; "
                 f"new {', '.join(characteristics(report.new))}")
    if report.checkpoint is not None:
        lines += checkpoint_lines(report.checkpoint)
    for r in report.requirements:
        lines.append(f"  requirement {r['name']}: {'met' if r['met'] else 'NOT met'} "
                     f"({r['note']})")
    # Drift first whatever its effect: it says the rest was checked against a plan that is
    # not what runs.  Then the worst effects.
    order = {"unsupported": 0, "migrate": 1, "in_place": 2, "none": 3}
    findings = sorted(report.findings,
                      key=lambda f: (f.code != "checkpoint-drift", order[f.effect]))
    if not findings:
        lines.append("no findings")
    for f in findings:
        lines.append("")
        lines.append(f"{_SEVERITY_MARK[f.severity]} [{f.code}] {f.effect}: {f.message}")
        loc = _loc(report, f)
        if loc:
            lines.append(f"    at {loc}")
        lines.append(f"    what to do: {f.hint}")
    return "\n".join(lines) + "\n"


def render_markdown(report: Report) -> str:
    icon = {"identical": "✅", "in_place": "✅", "migrate": "⚠️", "unsupported": "⛔"}
    out = [f"### {icon[report.verdict]} Theseus: `{report.verdict}`",
           "", VERDICT_TEXT[report.verdict] + ".", "",
           f"`{_old_side(report)}` → `{report.new.file}`", ""]
    if report.checkpoint is not None:
        out += ["<details><summary>Checkpoint</summary>", "", "```"]
        out += [ln.strip() for ln in checkpoint_lines(report.checkpoint)]
        out += ["```", "", "</details>", ""]
    if report.findings:
        out += ["| | code | effect | where | finding | what to do |",
                "|---|---|---|---|---|---|"]
        for f in report.findings:
            where = _md(at(report, f))
            out.append(f"| {_SEVERITY_MARK[f.severity]} | `{f.code}` | {f.effect} | {where} "
                       f"| {_md(f.message)} | {_md(f.hint)} |")
    else:
        out.append("No findings.")
    out += ["", "<details><summary>Matched enforcing steps</summary>", "",
            "| old | new | step |", "|---|---|---|"]
    out += [f"| `{a}` | `{b}` | {s} |" for a, b, s in report.alignment]
    out += ["", "</details>", ""]
    return "\n".join(out)


def _old_side(report: Report) -> str:
    if report.checkpoint is None:
        return report.old.file
    if report.old_is_checkpoint:
        return f"checkpoint {report.checkpoint['path']}"
    return f"{report.old.file} + checkpoint {report.checkpoint['path']}"


_OUTCOME = {"fails": "Spark refuses to start", "wrong_state": "Spark starts with wrong state",
            "starts": "Spark starts, state intact"}


def checkpoint_lines(ck: dict[str, Any]) -> list[str]:
    """The ``checkpoint`` section of a report as text lines."""
    r = ck["restart"]
    lines = []
    if ck.get("drift"):
        lines.append("  DRIFT: the checkpoint was not made by the store's recorded plan:")
        lines += [f"    - {d}" for d in ck["drift"]]
    lines += [f"  restart on the checkpoint: {_OUTCOME[r['outcome']]}"
              + (f" ({r['error_class']})" if r["error_class"] else ""),
              f"  checkpoint: {ck['path']}",
              f"    last committed batch {ck['last_committed_batch']}, shuffle partitions "
              f"{ck['shuffle_partitions']}, watermark {ck['watermark_ms']} ms"
              + _WRITTEN_BY.get(ck.get("written_by", ""), "")]
    for src in ck["sources"]:
        if src["offsets"]:
            for topic, parts in src["offsets"].items():
                offs = ", ".join(f"{p}:{o}" for p, o in parts.items())
                lines.append(f"    source {src['index']}: {topic} [{offs}]")
        else:
            lines.append(f"    source {src['index']}: {json.dumps(src['raw'])}")
    if not ck["operators"]:
        lines.append("    no stateful operator")
    for op in ck["operators"]:
        lines.append(f"    operator {op['id']} {op['name']} (metadata v{op['metadata_version']}"
                     f", {op['partitions']} partitions)")
        for st in op["stores"]:
            lines.append(f"      store {st['name']}: key {st['key_schema'] or '?'}, "
                         f"value {st['value_schema'] or '?'}")
    for lp in ck.get("recursion", []):
        d = lp["derived"]
        lines.append(f"    recursive step {lp['step']}: {d['rows']} rows derived in "
                     f"{d['batches']} batches, {d['columns'] or '?'} (loop topic "
                     f"{lp['topic'] or '?'})")
        for i, t in lp["inputs"].items():
            lines.append(f"      input {i}: {t['rows']} rows in {t['batches']} batches, "
                         f"{t['columns'] or '?'}")
    return lines


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def at(report: Report, f: Finding) -> str:
    """The step a finding is about, with its SQL position when the plan is a script."""
    plan, pointer, node = _primary(report, f)
    name = f.new_node or f.old_node or "plan"
    if not plan.positions:
        return name
    return f"{name} ({place(plan, pointer, node)})"


def place(plan: Plan, pointer: str | None, node: str | None) -> str:
    """``file:line:col`` of a pointer in a SQL or job plan; the file alone for a part of a
    job that no DataFrame call made (its config, a node without an origin)."""
    line, col = where(plan, pointer, node)
    file = plan.source(plan.position(pointer, node))
    return file if line is None else f"{file}:{line}:{col}"


# -- positions in the source -------------------------------------------------------------


@lru_cache(maxsize=16)
def pointer_lines(path: str) -> dict[str, int]:
    """Map every JSON pointer of a file to the 1-based line where its value starts; empty
    for a file that cannot be read or is not JSON (a job file, a broken plan)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return {}
    try:
        return _scan_pointer_lines(text)
    except (IndexError, ValueError, RecursionError):  # not JSON: no line to give
        return {}


def _scan_pointer_lines(text: str) -> dict[str, int]:
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


def where(plan: Plan, pointer: str | None, node: str | None = None
          ) -> tuple[int | None, int | None]:
    """1-based line and column (None for a JSON plan: its lines are whole values) of a
    pointer in the file the plan was written in (``Plan.source`` names it).  A part of a
    plan imported from a PySpark job that no DataFrame call made has neither: its JSON
    pointers are not places in the Python file (the finding names the node, the annotation
    the file)."""
    if plan.positions:
        pos = plan.position(pointer, node)
        if pos is not None:
            return pos.line, pos.col
        return (None, None) if is_job(plan.file) else (1, 1)
    if is_job(plan.file):
        return None, None
    return line_of(plan.file, pointer), None


def _primary(report: Report, f: Finding) -> tuple[Plan, str | None, str | None]:
    if f.new_pointer is not None:
        return report.new, f.new_pointer, f.new_node
    return report.old, f.old_pointer, f.old_node


def _region(plan: Plan, pointer: str | None, node: str | None) -> dict[str, int] | None:
    pos = plan.position(pointer, node)
    if pos is None:
        line = where(plan, pointer, node)[0]
        return {"startLine": line} if line is not None else None
    if (pos.end_line, pos.end_col) == (pos.line, pos.col):  # a call site: a point
        return {"startLine": pos.line, "startColumn": pos.col}
    return {"startLine": pos.line, "startColumn": pos.col, "endLine": pos.end_line,
            "endColumn": pos.end_col}


def _uri(plan: Plan, pointer: str | None, node: str | None) -> str:
    """The file a finding's part is in: the plan's, or a job's helper module."""
    return plan.source(plan.position(pointer, node))


def _physical(uri: str, region: dict[str, int] | None) -> dict[str, Any]:
    """A SARIF physical location: the file, and its region when there is a line to give."""
    loc: dict[str, Any] = {"artifactLocation": {"uri": uri}}
    if region is not None:
        loc["region"] = region
    return loc


def render_github(report: Report, verdict: bool = True) -> str:
    """Workflow annotations, one per finding, and (with ``verdict``) a notice of the
    verdict."""
    level = {"error": "error", "warning": "warning", "info": "notice"}
    out = []
    for f in report.findings:
        plan, pointer, node = _primary(report, f)
        line, col = where(plan, pointer, node)
        at = f"file={_uri(plan, pointer, node)}" + (f",line={line}" if line is not None else "") \
            + (f",col={col}" if col is not None else "")
        msg = f"{f.message}. {f.hint}".replace("%", "%25").replace("\r", "%0D") \
            .replace("\n", "%0A")
        title = f"theseus {f.code} ({f.effect})".replace(",", "%2C").replace("::", "%3A%3A")
        out.append(f"::{level[f.severity]} {at},title={title}::{msg}")
    if verdict:
        out.append(f"::notice title=theseus verdict::{report.verdict} — "
                   f"{VERDICT_TEXT[report.verdict]}")
    return "\n".join(out) + "\n" if out else ""


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
        plan, pointer, node = _primary(report, f)
        locs = [{"physicalLocation": _physical(_uri(plan, pointer, node),
                                               _region(plan, pointer, node)),
                 "logicalLocations": [{"name": f.new_node or f.old_node or "plan",
                                       "fullyQualifiedName": f.new_pointer or f.old_pointer
                                       or "/"}]}]
        related = []
        if f.old_pointer is not None and f.new_pointer is not None:
            related.append({"id": 1, "message": {"text": "in the old plan"},
                            "physicalLocation": _physical(
                                _uri(report.old, f.old_pointer, f.old_node),
                                _region(report.old, f.old_pointer, f.old_node))})
        res = {"ruleId": f.code, "ruleIndex": codes.index(f.code), "level": level[f.severity],
               "message": {"text": f"{f.message}. {f.hint}"}, "locations": locs,
               "properties": {"effect": f.effect, "upgrade_type": f.upgrade_type}}
        if related:
            res["relatedLocations"] = related
        results.append(res)
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{"tool": {"driver": _driver(rules)},
                  "results": results,
                  "properties": {"verdict": report.verdict}}],
    }
    return json.dumps(doc, indent=2) + "\n"


def render_sarif_empty() -> str:
    return json.dumps({"$schema": "https://json.schemastore.org/sarif-2.1.0.json",
                       "version": "2.1.0",
                       "runs": [{"tool": {"driver": _driver([])}, "results": []}]})


def _driver(rules: list[dict[str, Any]]) -> dict[str, Any]:
    driver: dict[str, Any] = {"name": "theseus"}
    url = project_url()
    if url:
        driver["informationUri"] = url
    driver["rules"] = rules
    return driver


#: the labels of ``[project.urls]`` that say where the project lives, best first
URL_LABELS = ("homepage", "repository", "source")


@lru_cache(maxsize=1)
def project_url() -> str | None:
    """The project's own URL, from ``[project.urls]`` of its ``pyproject.toml``: read from
    the checkout when Theseus runs from one, else from the installed distribution's metadata
    (which carries the same table as ``Project-URL`` lines)."""
    return _url_from_pyproject(Path(__file__).resolve().parent.parent / "pyproject.toml") \
        or _url_from_metadata()


def _pick(urls: dict[str, str]) -> str | None:
    by_label = {k.strip().lower(): v.strip() for k, v in urls.items()}
    return next((by_label[k] for k in URL_LABELS if by_label.get(k)), None)


def _url_from_pyproject(path: Path) -> str | None:
    import tomllib

    try:
        with open(path, "rb") as f:
            project = tomllib.load(f).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    if project.get("name") != "theseus":
        return None
    return _pick(project.get("urls", {}))


def _url_from_metadata() -> str | None:
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        entries = metadata("theseus").get_all("Project-URL") or []
    except PackageNotFoundError:
        return None
    return _pick(dict(e.split(",", 1) for e in entries if "," in e))
