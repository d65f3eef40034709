"""Predicates moved across an aggregate.

A conjunct that reads only grouping keys selects the same groups whether it is applied to
the rows before the aggregate (WHERE) or to the groups after it (HAVING): the output is the
same, and no history needs recomputing.  This rule looks at the filter findings of one walk
and replaces such a pair (a conjunct added upstream, the same conjunct removed downstream,
or the reverse) with one ``predicate-moved`` finding.
"""

from __future__ import annotations

from compat import expr as E
from compat.findings import Finding
from compat.model import ENFORCING, Plan
from compat.rules import RuleContext
from compat.steps import Aggregate, Filter

_FILTER_CODES = ("filter-changed", "passive-added", "passive-removed")


def _conjuncts(f: Filter | None) -> set[str]:
    if f is None:
        return set()
    ast = E.normalize(E.parse(f.predicate))
    parts = E._flatten("and", ast)
    return {E.render(p) for p in parts}


def _neighbour(plan: Plan, nid: str, down: bool) -> str | None:
    """The nearest enforcing node downstream (or upstream) of a passive node."""
    seen = set()
    frontier = [nid]
    while frontier:
        cur = frontier.pop()
        if cur in seen:
            continue
        seen.add(cur)
        nxt = plan.dependents.get(cur, []) if down else list(plan.nodes[cur].inputs)
        for x in nxt:
            if plan.nodes[x].klass == ENFORCING:
                return x
            frontier.append(x)
    return None


def find_moves(findings: list[Finding], ctx: RuleContext,
               alignment: list[tuple[str, str, str]]) -> list[Finding]:
    old, new = ctx.old, ctx.new
    pairs = {(a, b) for a, b, _ in alignment}
    ups, downs = [], []
    for f in findings:
        if f.code not in _FILTER_CODES:
            continue
        fo = old.nodes.get(f.old_node) if f.old_node else None
        fn = new.nodes.get(f.new_node) if f.new_node else None
        if not isinstance(fo, (Filter, type(None))) or not isinstance(fn, (Filter, type(None))):
            continue
        if fo is None and fn is None:
            continue
        # which aggregate does it sit next to?
        if fn is not None:
            below = _neighbour(new, fn.id, down=True)
            above = _neighbour(new, fn.id, down=False)
        else:
            below = _neighbour(old, fo.id, down=True)
            above = _neighbour(old, fo.id, down=False)
        side = new if fn is not None else old
        if below and isinstance(side.nodes[below], Aggregate):
            ups.append((f, fo, fn, below, side is new))
        elif above and isinstance(side.nodes[above], Aggregate):
            downs.append((f, fo, fn, above, side is new))
    out = list(findings)
    for uf, uo, un, uagg, unew in ups:
        added_up = _conjuncts(un) - _conjuncts(uo)
        removed_up = _conjuncts(uo) - _conjuncts(un)
        for df, do, dn, dagg, dnew in downs:
            if uf not in out or df not in out:
                continue
            if not _same_aggregate(uagg, unew, dagg, dnew, pairs):
                continue
            added_down = _conjuncts(dn) - _conjuncts(do)
            removed_down = _conjuncts(do) - _conjuncts(dn)
            moved = None
            if added_up and added_up == removed_down and not removed_up and not added_down:
                moved = ("into", added_up)
            elif removed_up and removed_up == added_down and not added_up \
                    and not removed_down:
                moved = ("out of", removed_up)
            if moved is None:
                continue
            agg = new.nodes[uagg] if unew else old.nodes[uagg]
            if not all(_on_keys(c, agg) for c in moved[1]):
                continue
            out.remove(uf)
            out.remove(df)
            where = "the rows before" if moved[0] == "into" else "the groups after"
            out.append(ctx.f("predicate-moved", f"{' AND '.join(sorted(moved[1]))} now "
                             f"filters {where} aggregate '{agg.id}'; it reads grouping keys "
                             "only, so the same groups come out", uo or do, un or dn,
                             "predicate"))
    return out


def _same_aggregate(a: str, a_new: bool, b: str, b_new: bool,
                    pairs: set[tuple[str, str]]) -> bool:
    if a_new == b_new:
        return a == b
    old_id, new_id = (b, a) if a_new else (a, b)
    return (old_id, new_id) in pairs


def _on_keys(conjunct: str, agg: Aggregate) -> bool:
    keys = {g.name.lower() for g in agg.group_by
            if E.canonical(g.expr) == E.canonical(g.name)}
    cols = E.columns(E.parse(conjunct))
    return bool(cols) and all(len(c) == 1 and c[0] in keys for c in cols)
