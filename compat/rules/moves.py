"""Predicates moved across an aggregate.

A conjunct that reads only grouping keys selects the same groups whether it is applied to
the rows before the aggregate (WHERE) or to the groups after it (HAVING): the output is the
same, and no history needs recomputing.  This rule looks at the filter findings of one walk
and replaces such a pair (a conjunct added upstream, the same conjunct removed downstream,
or the reverse) with one ``predicate-moved`` finding.
"""

from __future__ import annotations

from collections import deque

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


def _change(old: Filter | None, new: Filter | None) -> tuple[set[str], set[str]]:
    """The conjuncts a filter change adds and removes."""
    before, after = _conjuncts(old), _conjuncts(new)
    return after - before, before - after


def neighbours(plan: Plan, down: bool) -> dict[str, str | None]:
    """The nearest enforcing node downstream (or upstream) of every node, in one pass.

    For a node, that is the first enforcing node among its dependents (or inputs), in
    order; failing that, the first one found behind them, the last of them searched first
    (the depth-first order the walk of one node at a time used).  Going over the nodes in
    topological order (reversed when looking downstream) means every node's answer is
    ready when a node next to it needs it.
    """
    nodes = plan.nodes
    enforcing = {nid for nid, node in nodes.items() if node.klass == ENFORCING}
    dependents = plan.dependents
    order = list(nodes)
    if down:
        order.reverse()
    out: dict[str, str | None] = {}
    for nid in order:
        nxt = dependents.get(nid, ()) if down else nodes[nid].inputs
        found = None
        for x in nxt:
            if x in enforcing:
                found = x
                break
        else:
            for x in reversed(nxt):
                found = out[x]
                if found is not None:
                    break
        out[nid] = found
    return out


def find_moves(findings: list[Finding], ctx: RuleContext,
               alignment: list[tuple[str, str, str]]) -> list[Finding]:
    """Replace each pair of filter findings that moved a conjunct across an aggregate.

    Linear in the plans and the findings: neighbours are computed once per plan and side,
    and a filter change upstream meets its candidate partners downstream through a table
    keyed by the aggregate and by the conjuncts it moves, not by trying every pair.
    """
    old, new = ctx.old, ctx.new
    near: dict[tuple[bool, bool], dict[str, str | None]] = {}

    def neighbour(is_new: bool, nid: str, down: bool) -> str | None:
        table = near.get((is_new, down))
        if table is None:
            table = near[(is_new, down)] = neighbours(new if is_new else old, down)
        return table[nid]

    ups, downs = [], []
    for k, f in enumerate(findings):
        if f.code not in _FILTER_CODES:
            continue
        fo = old.nodes.get(f.old_node) if f.old_node else None
        fn = new.nodes.get(f.new_node) if f.new_node else None
        if not isinstance(fo, (Filter, type(None))) or not isinstance(fn, (Filter, type(None))):
            continue
        if fo is None and fn is None:
            continue
        # which aggregate does it sit next to?
        on_new = fn is not None
        nid = fn.id if fn is not None else fo.id  # type: ignore[union-attr]
        side = new if on_new else old
        below = neighbour(on_new, nid, True)
        above = neighbour(on_new, nid, False)
        if below and isinstance(side.nodes[below], Aggregate):
            ups.append((k, fo, fn, below, on_new))
        elif above and isinstance(side.nodes[above], Aggregate):
            downs.append((k, fo, fn, above, on_new))
    if not ups or not downs:
        return list(findings)
    ups = [(*u, *_change(u[1], u[2])) for u in ups]
    downs = [(*d, *_change(d[1], d[2])) for d in downs]
    # A conjunct moves "into" the rows before the aggregate when it is added upstream and
    # removed downstream (and nothing else changes in the two filters), "out of" them in
    # the reverse case: downstream filter changes wait in queues keyed by both.
    partners: dict[tuple[bool, str], list[str]] = {}
    for a, b, _ in alignment:
        partners.setdefault((False, a), []).append(b)
        partners.setdefault((True, b), []).append(a)
    waiting: dict[tuple, deque[int]] = {}
    for d, (_k, _do, _dn, dagg, dnew, added, removed) in enumerate(downs):
        if removed and not added:
            waiting.setdefault((dnew, dagg, "into", frozenset(removed)), deque()).append(d)
        elif added and not removed:
            waiting.setdefault((dnew, dagg, "out of", frozenset(added)), deque()).append(d)
    gone: set[int] = set()
    moved_findings: list[Finding] = []
    for uk, uo, un, uagg, unew, added_up, removed_up in ups:
        if added_up and not removed_up:
            moved = ("into", added_up)
        elif removed_up and not added_up:
            moved = ("out of", removed_up)
        else:
            continue
        agg = new.nodes[uagg] if unew else old.nodes[uagg]
        if not all(_on_keys(c, agg) for c in moved[1]):
            continue
        # Downstream filters next to the same aggregate (or to its partner on the other
        # side); of those, the first in the findings' order is taken.
        conj = frozenset(moved[1])
        keys = [(unew, uagg, moved[0], conj)] + \
            [(not unew, p, moved[0], conj) for p in partners.get((unew, uagg), ())]
        best = None
        for key in keys:
            queue = waiting.get(key)
            if queue and (best is None or queue[0] < best[1][0]):
                best = (key, queue)
        if best is None:
            continue
        d = best[1].popleft()
        dk, do, dn = downs[d][:3]
        gone.update((uk, dk))
        where = "the rows before" if moved[0] == "into" else "the groups after"
        moved_findings.append(ctx.f("predicate-moved", f"{' AND '.join(sorted(moved[1]))} "
                                    f"now filters {where} aggregate '{agg.id}'; it reads "
                                    "grouping keys only, so the same groups come out",
                                    uo or do, un or dn, "predicate"))
    return [f for k, f in enumerate(findings) if k not in gone] + moved_findings


def _on_keys(conjunct: str, agg: Aggregate) -> bool:
    keys = {g.name.lower() for g in agg.group_by
            if E.canonical(g.expr) == E.canonical(g.name)}
    cols = E.columns(E.parse(conjunct))
    return bool(cols) and all(len(c) == 1 and c[0] in keys for c in cols)
