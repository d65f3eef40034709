"""Merging projections: a projection of a projection is one projection.

Subqueries and views each end in a SELECT list, so ``SELECT a FROM (SELECT x + 1 AS a, y FROM
t)`` translates to two projections; the outer one's expressions are rewritten over the inner
one's input (``x + 1 AS a``) and the inner one goes.  A projection that passes its input
through unchanged (same columns, same names, same order) goes too.

A nondeterministic inner expression is not merged: substituting ``rand() AS r`` into ``r, r``
would draw twice.
"""

from __future__ import annotations

import dataclasses

from sqlglot import exp

from compat.model import NamedExpr
from compat.sql import ir
from compat.steps import Project


def merge_projects(graph: ir.Graph) -> ir.Graph:
    return ir.rewrite_to_fixpoint(graph, Project, _merge)


def _merge(g: ir.Graph, s: Project) -> bool:
    child = g[s.inputs[0]]
    if [c.name for c in s.columns] == g.columns(child.id) and \
            all(ir.bare_column(ir.parse(c.expr)) == c.name for c in s.columns):
        for c in g.consumers(s.id):
            g.rewire(c, s.id, child.id)
        g.remove(s.id)
        return True
    if not isinstance(child, Project) or g.consumers(child.id) != [s.id]:
        return False
    inner = {c.name: ir.parse(c.expr) for c in child.columns}
    if not all(ir.deterministic(e) for e in inner.values()):
        return False
    cols = tuple(NamedExpr(c.name, ir.sql(_unparen(ir.substitute(ir.parse(c.expr), inner))))
                 for c in s.columns)
    g.put(dataclasses.replace(s, inputs=child.inputs, columns=cols))
    g.remove(child.id)
    return True


def _unparen(e: exp.Expression) -> exp.Expression:
    """A whole column expression needs no parentheses."""
    while isinstance(e, exp.Paren):
        e = e.this
    return e


__all__ = ["merge_projects"]
