"""Merging projections: a projection of a projection is one projection.

Subqueries and views each end in a SELECT list, so ``SELECT a FROM (SELECT x + 1 AS a, y FROM
t)`` translates to two projections; the outer one's expressions are rewritten over the inner
one's input (``x + 1 AS a``) and the inner one goes.  A projection that passes its input
through unchanged (same columns, same names, same order) goes too.

A nondeterministic inner expression is not merged: substituting ``rand() AS r`` into ``r, r``
would draw twice.
"""

from __future__ import annotations

from sqlglot import exp

from compat.sql import ir


def merge_projects(graph: ir.Graph) -> ir.Graph:
    return ir.rewrite_to_fixpoint(graph, ir.Project, _merge)


def _merge(g: ir.Graph, s: ir.Project) -> bool:
    child = g[s.inputs[0]]
    if [n for n, _e in s.columns] == g.columns(child.id) and \
            all(ir.bare_column(e) == n for n, e in s.columns):
        for c in g.consumers(s.id):
            g.rewire(c, s.id, child.id)
        g.remove(s.id)
        return True
    if not isinstance(child, ir.Project) or g.consumers(child.id) != [s.id]:
        return False
    if not all(ir.deterministic(e) for _n, e in child.columns):
        return False
    inner = {n: e for n, e in child.columns}
    cols = tuple((n, _unparen(ir.substitute(e, inner))) for n, e in s.columns)
    g.put(s.replace(inputs=child.inputs, columns=cols))
    g.remove(child.id)
    return True


def _unparen(e: exp.Expression) -> exp.Expression:
    """A whole column expression needs no parentheses."""
    while isinstance(e, exp.Paren):
        e = e.this
    return e


__all__ = ["merge_projects"]
