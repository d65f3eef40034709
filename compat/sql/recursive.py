"""``WITH RECURSIVE name(cols) AS (base UNION [ALL] step) ...`` to a ``recursive`` step.

The base is translated into the plan as any query (then a projection naming its columns
``cols``); the recursive member is translated with ``name`` standing for the loop's rows, and
the steps it adds become the body: the sources it reads stay in the plan and become the
step's further inputs.  ``UNION`` is set semantics, ``UNION ALL`` bag semantics.  The limit is
written as optimizer hints on the recursive member's SELECT (Spark's hint syntax):
``SELECT /*+ MAX_ITERATIONS(200), ON_LIMIT('return') */ ...`` (defaults 100 and 'error').

A CTE of ``WITH RECURSIVE`` may read itself and the CTEs before it; reading one defined after
it (mutual recursion) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sqlglot import exp

from compat.model import NamedExpr
from compat.sql import ir
from compat.sql.scope import Rel, ScopeCol, column_names
from compat.sql.text import span_of
from compat.steps import Project, Recursive, Source
from compat.steps.recursive import DEFAULT_MAX_ITERATIONS

#: the hints a recursive member's SELECT may carry
HINTS = ("MAX_ITERATIONS", "ON_LIMIT")


@dataclass(frozen=True)
class RecursiveCte:
    """A CTE that reads itself, with the CTEs visible where it was defined."""

    name: str
    cte: exp.CTE
    defined: dict


@dataclass(frozen=True)
class LoopRef:
    """The CTE's own name inside its recursive member: the loop's rows."""

    id: str
    names: tuple[str, ...]


def _reads(q: exp.Expression) -> set[str]:
    return {t.name.lower() for t in q.find_all(exp.Table) if isinstance(t.this, exp.Identifier)}


def with_recursive(tr: Any, w: exp.With, ctes: dict) -> dict:
    """The CTEs of a WITH RECURSIVE, for ``Translator.table`` to resolve."""
    names = [c.alias_or_name.lower() for c in w.expressions]
    out = dict(ctes)
    for i, cte in enumerate(w.expressions):
        reads = _reads(cte.this)
        later = [n for n in names[i + 1:] if n in reads]
        if later:
            raise tr.err(f"mutual recursion is not supported: '{names[i]}' reads "
                         f"'{later[0]}', defined after it in the same WITH RECURSIVE (a CTE "
                         "may read itself and the CTEs before it)", cte)
        if names[i] in reads:
            out[names[i]] = RecursiveCte(names[i], cte, dict(out))
        else:
            out[names[i]] = (cte.this, dict(out))
    return out


def reference(tr: Any, v: RecursiveCte | LoopRef, t: exp.Table, qualifier: str) -> Rel:
    q = qualifier.lower()
    if isinstance(v, LoopRef):
        return Rel(v.id, [ScopeCol(q, n, n) for n in v.names])
    return _build(tr, v).requalify(qualifier)


def _hints(tr: Any, step: exp.Expression) -> tuple[exp.Expression, int, str]:
    """The recursive member without its MAX_ITERATIONS / ON_LIMIT hints, and their values."""
    limit, on_limit = DEFAULT_MAX_ITERATIONS, "error"
    if not isinstance(step, exp.Select) or not step.args.get("hint"):
        return step, limit, on_limit
    step = step.copy()
    hint = step.args["hint"]
    keep = []
    for h in hint.expressions:
        name = (h.name if isinstance(h, exp.Expression) else "").upper()
        if name not in HINTS:
            keep.append(h)
            continue
        args = h.expressions if isinstance(h, exp.Anonymous) else []
        arg = args[0] if len(args) == 1 and isinstance(args[0], exp.Literal) else None
        if name == "MAX_ITERATIONS":
            if arg is None or arg.is_string or not arg.this.isdigit() or int(arg.this) < 1:
                raise tr.err("MAX_ITERATIONS takes one positive integer, e.g. "
                             "/*+ MAX_ITERATIONS(200) */", span_of(hint))
            limit = int(arg.this)
        else:
            if arg is None or not arg.is_string or arg.this.lower() not in ("error", "return"):
                raise tr.err("ON_LIMIT takes 'error' or 'return', e.g. "
                             "/*+ ON_LIMIT('return') */", span_of(hint))
            on_limit = arg.this.lower()
    if keep:
        hint.set("expressions", keep)
    else:
        step.set("hint", None)
    return step, limit, on_limit


def _project(tr: Any, sid: str, rel: Rel, names: list[str], where: Any) -> str:
    tr.graph.add(Project(id=sid, inputs=(rel.id,), columns=tuple(
        NamedExpr(n, ir.sql(ir.col(p))) for n, p in zip(names, column_names(rel)))), where)
    return sid


def _build(tr: Any, rc: RecursiveCte) -> Rel:
    cte, name = rc.cte, rc.name
    body = cte.this
    if not isinstance(body, exp.Union) or isinstance(body.this, exp.Union) or \
            any(body.args.get(k) for k in ("order", "limit", "offset")):
        raise tr.err(f"a recursive CTE is written '{name}(cols) AS (<base> UNION [ALL] "
                     "<recursive member>)': two branches, the second reading the CTE", body)
    base_q, step_q = body.this, body.expression
    if name in _reads(base_q):
        raise tr.err(f"the base (first branch) of recursive CTE '{name}' must not read "
                     f"'{name}'", base_q)
    step_q, limit, on_limit = _hints(tr, step_q)
    base = tr.query(base_q, rc.defined)
    alias = cte.args.get("alias")
    cols = [c.name for c in (alias.args.get("columns") or [])] if alias else []
    if not cols:
        cols = column_names(base)
    if len(cols) != len(column_names(base)):
        raise tr.err(f"recursive CTE '{name}' names {len(cols)} columns, its base has "
                     f"{len(column_names(base))}", base_q)
    pid = _project(tr, tr.new_id(f"{name}_base"), base, cols, span_of(base_q))
    # The loop's rows, while the member is translated: a stand-in with the base's columns
    # (the translator types expressions over it); the body reads body_input instead.
    loop = _project(tr, tr.new_id(f"{name}_loop"), Rel(pid, [ScopeCol(None, c, c)
                                                             for c in cols]), cols, None)
    before = set(tr.graph.steps)
    step = tr.query(step_q, {**rc.defined, name: LoopRef(loop, tuple(cols))})
    if len(column_names(step)) != len(cols):
        raise tr.err(f"the recursive member of '{name}' has {len(column_names(step))} columns, "
                     f"the CTE {len(cols)}", step_q)
    last = tr.graph[step.id]
    if step.id not in before and isinstance(last, Project) and \
            len(last.columns) == len(cols) and not tr.graph.consumers(step.id):
        # the member's own SELECT list: named as the CTE's columns, no projection on top
        out = step.id
        tr.graph.put(replace(last, columns=tuple(
            NamedExpr(n, c.expr) for n, c in zip(cols, last.columns))))
    else:
        out = _project(tr, tr.new_id(f"{name}_next"), step, cols, span_of(step_q))
    added = [tr.graph[s] for s in tr.graph.steps if s not in before]
    nodes = [n for n in added if not isinstance(n, Source)]
    ids = {n.id for n in nodes}
    further: list[str] = []
    for n in nodes:
        for i in n.inputs:
            if i not in ids and i != loop and i not in further:
                further.append(i)
    origins = {n.id: tr.graph.origins[n.id] for n in nodes if n.id in tr.graph.origins}
    for n in nodes:
        tr.graph.remove(n.id)
    tr.graph.remove(loop)
    rid = tr.new_id(name)
    tr.graph.add(Recursive(id=rid, version=2, inputs=(pid, *further), body=tuple(nodes),
                           body_input=loop, body_output=out,
                           union="bag" if body.args.get("distinct") is False else "set",
                           max_iterations=limit, on_limit=on_limit), span_of(cte))
    # the body's steps keep their place in the member: by id (a refused body step's error
    # names it; ids come from counters, never reused) and by the plan's pointer key
    for bid, span in origins.items():
        tr.graph.origins[bid] = tr.graph.origins[f"{rid}/{bid}"] = span
    tr.group_keys, tr.missing_keys = None, []
    return Rel(rid, [ScopeCol(None, c, c) for c in cols])
