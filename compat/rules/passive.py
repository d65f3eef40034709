"""Passive steps may be added, removed or changed, but the change has a meaning: record what
it changes (data selection, schema, determinism) and where it sits relative to state.

Upstream of a stateful step, a change alters what enters the state: the state keeps its
layout, but history stays computed the old way (a migration recomputes it; see
``--require backfill``).  Downstream of state, only rows written from the restart on change.
"""

from __future__ import annotations

from compat import expr as E
from compat.findings import Finding
from compat.model import Explode, Filter, Node, Project
from compat.rules import RuleContext


def _where(ctx: RuleContext) -> str:
    old_c, new_c = ctx.consumer
    c = new_c or old_c
    if c is None:
        return ""
    if ctx.upstream_of_state:
        return f" upstream of stateful {c.step} '{c.id}': history stays computed the old way"
    return f" before {c.step} '{c.id}'"


def check_passive(old: Node | None, new: Node | None, ctx: RuleContext) -> list[Finding]:
    hist = ctx.upstream_of_state
    where = _where(ctx)
    if old is None and new is not None:
        what = _describe(new)
        out = [ctx.f("passive-added", f"{new.step} '{new.id}' is added ({what}){where}",
                     None, new, None, "", history=hist)]
        if not ctx.new.info[new.id].deterministic:
            out.append(_nondet(ctx, None, new))
        return out
    if new is None and old is not None:
        return [ctx.f("passive-removed", f"{old.step} '{old.id}' is removed "
                      f"({_describe(old)}){where}", old, None, "", None, history=hist)]
    assert old is not None and new is not None
    out: list[Finding] = []
    if isinstance(old, Filter) and isinstance(new, Filter):
        if E.canonical(old.predicate) != E.canonical(new.predicate):
            out.append(ctx.f("filter-changed", f"filter '{new.id}' keeps rows where "
                             f"{new.predicate} instead of {old.predicate}{where}", old, new,
                             "predicate", history=hist))
    elif isinstance(old, Project) and isinstance(new, Project):
        detail = _project_diff(old, new)
        if detail:
            out.append(ctx.f("project-changed", f"project '{new.id}': {detail}{where}", old,
                             new, "columns", history=hist and _changes_values(old, new)))
    elif isinstance(old, Explode) and isinstance(new, Explode):
        if (E.canonical(old.expr), old.alias.lower(), old.outer) != \
                (E.canonical(new.expr), new.alias.lower(), new.outer):
            out.append(ctx.f("explode-changed", f"explode '{new.id}' changes from "
                             f"{_describe(old)} to {_describe(new)}{where}", old, new, "expr",
                             history=hist))
    if ctx.new.info[new.id].deterministic is False and ctx.old.info[old.id].deterministic:
        out.append(_nondet(ctx, old, new))
    return out


def _nondet(ctx: RuleContext, old: Node | None, new: Node) -> Finding:
    return ctx.f("nondeterminism-introduced", f"{new.step} '{new.id}' is nondeterministic "
                 "(rand, uuid, current time...): a batch replayed after a crash may differ",
                 old, new, None, "")


def _describe(n: Node) -> str:
    if isinstance(n, Filter):
        return f"keeps rows where {n.predicate}"
    if isinstance(n, Project):
        return "columns " + ", ".join(c.name for c in n.columns)
    if isinstance(n, Explode):
        return f"{'outer ' if n.outer else ''}explode {n.expr} as {n.alias}"
    return n.step


def _project_diff(old: Project, new: Project) -> str:
    o = {c.name.lower(): E.canonical(c.expr) for c in old.columns}
    n = {c.name.lower(): E.canonical(c.expr) for c in new.columns}
    parts = []
    added = [k for k in n if k not in o]
    removed = [k for k in o if k not in n]
    changed = [k for k in n if k in o and o[k] != n[k]]
    if added:
        parts.append("adds " + ", ".join(added))
    if removed:
        parts.append("removes " + ", ".join(removed))
    if changed:
        parts.append("computes " + ", ".join(f"{k} as {n[k]} (was {o[k]})" for k in changed))
    if not parts and [c.lower() for c in o] != [c.lower() for c in n]:
        parts.append("reorders its columns")
    return "; ".join(parts)


def _changes_values(old: Project, new: Project) -> bool:
    """Adding or reordering columns does not change what a stateful consumer computes."""
    o = {c.name.lower(): E.canonical(c.expr) for c in old.columns}
    n = {c.name.lower(): E.canonical(c.expr) for c in new.columns}
    return any(k in n and n[k] != v for k, v in o.items()) or any(k not in n for k in o)
