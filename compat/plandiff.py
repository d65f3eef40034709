"""``theseus plan diff OLD NEW``: what changed, step by step.

The check's walk pairs the steps of both plans (enforcing steps as it compares them, passive
steps as it aligns the paths between them: ``check_plans(..., pair_passive=True)``).  For
every pair this lists the fields that changed, old value to new value (a predicate, a group
key, an aggregate, a window...); a step no pair holds was added (new plan) or removed (old
plan).  The field-level difference is ``deepdiff``'s, over the steps' JSON documents with
their ids and inputs left out (the pairing says which step is which; an inserted or removed
neighbour shows as a step of its own).  Lists of named items (group keys, aggregates,
columns, a recursive body's nodes) are compared by name, so adding an aggregate is one
change, not a shift of every one after it; a change of their order is a change of its own.

deepdiff is imported here only: ``theseus check`` never loads this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from deepdiff import DeepDiff

from compat import serde
from compat.check import Report
from compat.model import Plan

#: the order in which a step's status is listed, and its mark in text
STATUS_MARK = {"changed": "~", "added": "+", "removed": "-", "unchanged": "="}
#: fields that say where a step sits, not what it computes
_PLACE = ("id", "inputs")


@dataclass(frozen=True)
class FieldChange:
    """One field of a paired step: ``changed`` (old -> new), ``added`` (only new),
    ``removed`` (only old) or ``reordered`` (old and new are the names in order)."""

    path: str
    kind: str
    old: Any = None
    new: Any = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"path": self.path, "kind": self.kind}
        if self.kind != "added":
            doc["old"] = self.old
        if self.kind != "removed":
            doc["new"] = self.new
        return doc

    def text(self) -> str:
        if self.kind == "added":
            return f"{self.path}: added {_show(self.new)}"
        if self.kind == "removed":
            return f"{self.path}: removed (was {_show(self.old)})"
        if self.kind == "reordered":
            return f"{self.path}: order {_show(self.old)} -> {_show(self.new)}"
        return f"{self.path}: {_show(self.old)} -> {_show(self.new)}"


@dataclass(frozen=True)
class StepDiff:
    """A pair of steps (``changed`` or ``unchanged``), or a step of one plan only."""

    status: str
    old: str | None
    new: str | None
    step: str
    klass: str
    changes: tuple[FieldChange, ...] = ()
    #: how many of the check's findings are on this step (either side): a change the check
    #: says nothing about is one of form (formatting, spelling) or without effect
    findings: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "old": self.old, "new": self.new, "step": self.step,
                "class": self.klass, "changes": [c.to_json() for c in self.changes],
                "findings": self.findings}


@dataclass
class PlanDiff:
    report: Report
    steps: list[StepDiff] = field(default_factory=list)
    #: the plan's own fields (``query``, ``config``; metadata is not compared)
    plan: tuple[FieldChange, ...] = ()

    def statuses(self, side: str) -> dict[str, str]:
        """The status of every step of the old or the new plan (``changed`` wins over
        ``unchanged`` when a step is paired twice)."""
        rank = list(STATUS_MARK).index
        out: dict[str, str] = {}
        for s in self.steps:
            nid = getattr(s, side)
            if nid is not None and (nid not in out or rank(s.status) < rank(out[nid])):
                out[nid] = s.status
        return out

    def to_json(self) -> dict[str, Any]:
        r = self.report
        counts = {k: sum(1 for s in self.steps if s.status == k) for k in STATUS_MARK}
        return {"format": "theseus.diff/1", "verdict": r.verdict, "exit_code": r.exit_code,
                "old": {"file": r.old.file, "query": r.old.query},
                "new": {"file": r.new.file, "query": r.new.query},
                "counts": counts, "plan": [c.to_json() for c in self.plan],
                "steps": [s.to_json() for s in self.steps],
                "report": r.to_json()}


def diff(report: Report) -> PlanDiff:
    """The step-by-step difference of a report's plans (its walk must have paired the
    passive steps: ``check_plans(..., pair_passive=True)``)."""
    old, new = report.old, report.new
    pairs = list(dict.fromkeys([(a, b) for a, b, _ in report.alignment] +
                               [(a, b) for a, b, _ in report.passive_alignment]))
    by_new: dict[str, list[str]] = {}
    for a, b in pairs:
        by_new.setdefault(b, []).append(a)
    paired_old = {a for a, _ in pairs}
    on: dict[tuple[str | None, str | None], list[int]] = {}
    for i, f in enumerate(report.findings):
        on.setdefault((f.old_node, None), []).append(i)
        on.setdefault((None, f.new_node), []).append(i)

    def count(oid: str | None, nid: str | None) -> int:
        """Findings on either step (a finding on both counts once)."""
        return len(set(on.get((oid, None), []) if oid is not None else []) |
                   set(on.get((None, nid), []) if nid is not None else []))

    out = PlanDiff(report, plan=tuple(field_changes(
        {"query": old.query, "config": old.config}, {"query": new.query, "config": new.config})))
    # Sink first, as ``plan show`` draws a plan; removed steps after the new plan's.
    for nid in reversed(new.nodes):
        node = new.nodes[nid]
        for oid in by_new.get(nid, []):
            onode = old.nodes[oid]
            # a node shared by both plans (its document was equal) needs no comparing
            changes = () if onode is node else tuple(field_changes(_doc(old, oid),
                                                                   _doc(new, nid)))
            step = node.step if onode.step == node.step else f"{onode.step}->{node.step}"
            out.steps.append(StepDiff("changed" if changes else "unchanged", oid, nid, step,
                                      node.klass, changes, count(oid, nid)))
        if nid not in by_new:
            out.steps.append(StepDiff("added", None, nid, node.step, node.klass,
                                      findings=count(None, nid)))
    for oid in reversed(old.nodes):
        if oid not in paired_old:
            node = old.nodes[oid]
            out.steps.append(StepDiff("removed", oid, None, node.step, node.klass,
                                      findings=count(oid, None)))
    return out


def _doc(plan: Plan, node_id: str) -> dict[str, Any]:
    doc = serde.node_doc(plan.nodes[node_id])
    return {k: v for k, v in doc.items() if k not in _PLACE}


# -- field-level differences -------------------------------------------------------------------


def field_changes(old: dict[str, Any], new: dict[str, Any]) -> list[FieldChange]:
    """What differs between two step documents, field by field (``deepdiff``)."""
    if old == new:
        return []
    a, b = _keyed(old), _keyed(new)
    tree = DeepDiff(a, b, view="tree", verbose_level=2)
    out: list[FieldChange] = []
    for kind, levels in tree.items():
        for level in levels:
            path = _path(level.path(output_format="list"))
            if kind in ("values_changed", "type_changes"):
                out.append(FieldChange(path, "changed", _plain(level.t1), _plain(level.t2)))
            elif kind in ("dictionary_item_added", "iterable_item_added"):
                out.append(FieldChange(path, "added", new=_plain(level.t2)))
            elif kind in ("dictionary_item_removed", "iterable_item_removed"):
                out.append(FieldChange(path, "removed", old=_plain(level.t1)))
    out.extend(_reorders(old, new, []))
    # document order of the fields, then the path: a stable, readable listing
    order = {k: i for i, k in enumerate(list(new) + list(old))}
    out.sort(key=lambda c: (order.get(c.path.split(".")[0].split("[")[0], len(order)),
                            c.path, c.kind))
    return out


def _names(items: Any) -> list[str] | None:
    """The names of a list of named items (``name``, else ``id``), if they are unique."""
    if not isinstance(items, list) or not items:
        return None
    for key in ("name", "id"):
        if all(isinstance(x, dict) and isinstance(x.get(key), str) for x in items):
            names = [x[key] for x in items]
            return names if len(set(names)) == len(names) else None
    return None


def _keyed(value: Any) -> Any:
    """A document with each list of named items turned into a mapping by name."""
    if isinstance(value, dict):
        return {k: _keyed(v) for k, v in value.items()}
    if isinstance(value, list):
        names = _names(value)
        if names is not None:
            return {f"[{n}]": _keyed(x) for n, x in zip(names, value)}
        return [_keyed(x) for x in value]
    return value


def _plain(value: Any) -> Any:
    """A value as it is written in the plan (named lists back to lists)."""
    if isinstance(value, dict):
        if value and all(isinstance(k, str) and k.startswith("[") for k in value):
            return [_plain(v) for v in value.values()]
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(x) for x in value]
    return value


def _path(parts: list[Any]) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and p.startswith("["):
            out += p
        else:
            out += ("." if out else "") + str(p)
    return out


def _reorders(old: Any, new: Any, path: list[Any]) -> list[FieldChange]:
    """Lists of named items whose common items are in another order."""
    out: list[FieldChange] = []
    if isinstance(old, dict) and isinstance(new, dict):
        for k in old.keys() & new.keys():
            out.extend(_reorders(old[k], new[k], path + [k]))
    elif isinstance(old, list) and isinstance(new, list):
        na, nb = _names(old), _names(new)
        if na is None or nb is None:
            return out
        common = set(na) & set(nb)
        before = [n for n in na if n in common]
        after = [n for n in nb if n in common]
        if before != after:
            out.append(FieldChange(_path(path), "reordered", before, after))
        items_b = dict(zip(nb, new))
        for n, x in zip(na, old):
            if n in common:
                out.extend(_reorders(x, items_b[n], path + [f"[{n}]"]))
    return out


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


# -- rendering ---------------------------------------------------------------------------------


def render_text(d: PlanDiff) -> str:
    """The steps of both plans, paired, with what changed; then the check's report."""
    from compat.report import render_text as report_text

    counts = {k: sum(1 for s in d.steps if s.status == k) for k in STATUS_MARK}
    lines = [f"steps: {counts['changed']} changed, {counts['added']} added, "
             f"{counts['removed']} removed, {counts['unchanged']} unchanged "
             "(~ changed, + added, - removed, = unchanged)"]
    for c in d.plan:
        lines.append(f"  ~ plan: {c.text()}")
    for s in d.steps:
        if s.status == "added":
            name = s.new
        elif s.status == "removed":
            name = s.old
        else:
            name = s.new if s.old == s.new else f"{s.old} -> {s.new}"
        note = ""
        if s.status != "unchanged":
            note = (f" ({s.findings} finding{'' if s.findings == 1 else 's'})" if s.findings
                    else " (no finding: same meaning for the check)")
        lines.append(f"  {STATUS_MARK[s.status]} {name}: {s.step} [{s.klass}]"
                     + (f" {s.status}" if s.status in ("added", "removed") else "") + note)
        for c in s.changes:
            lines.append(f"      {c.text()}")
    return "\n".join(lines) + "\n\n" + report_text(d.report)


def render_json(d: PlanDiff) -> str:
    return json.dumps(d.to_json(), indent=2, ensure_ascii=False) + "\n"


def render(d: PlanDiff, fmt: str) -> str:
    """``fmt`` is ``text`` or ``json``; the HTML page is :func:`compat.htmldiff.render_html`,
    which draws a :class:`PlanDiff`."""
    return {"text": render_text, "json": render_json}[fmt](d)


__all__ = ["FieldChange", "PlanDiff", "StepDiff", "diff", "field_changes", "render",
           "render_json", "render_text"]
