"""Predicate pushdown: filter rows as close to the sources as their meaning allows.

A filter's conjuncts move below the step under it, one step at a time, until none can move:

- through a projection, with the projected expressions substituted (``WHERE total > 10``
  over ``amount * 2 AS total`` becomes ``amount * 2 > 10`` below it);
- through a union, into every input;
- through an explode, when they do not read the exploded column;
- into the matching side of a join: either side of an inner join, the preserved side of an
  outer one, the left side of a semi or anti join;
- two adjacent filters become one.

State changes meaning under a predicate, so a conjunct crosses a stateful step only when it
reads nothing but that step's keys: an aggregate's GROUP BY columns (a HAVING on a grouping
key selects the same groups before the aggregate: KLIP-6), a deduplication's keys, a top-N's
PARTITION BY columns, a stream-stream join's key columns.  A conjunct never moves past a
nondeterministic one, nor is a nondeterministic conjunct moved or merged: ``rand() < 0.1``
must see the same rows it saw where it was written.
"""

from __future__ import annotations

import dataclasses

from sqlglot import exp

from compat.model import Node
from compat.sql import ir
from compat.steps import Aggregate, Deduplicate, Explode, Filter, Join, Project, TopN, Union
from compat.steps.join import join_output


def predicate_pushdown(graph: ir.Graph) -> ir.Graph:
    # Repeat until nothing moves: every move takes conjuncts one step further down.
    return ir.rewrite_to_fixpoint(graph, Filter, _push)


def _movable(pred: exp.Expression) -> tuple[list[exp.Expression], list[exp.Expression]]:
    """The deterministic conjuncts before the first nondeterministic one, and the rest."""
    parts = ir.conjuncts(pred)
    for i, p in enumerate(parts):
        if not ir.deterministic(p):
            return parts[:i], parts[i:]
    return parts, []


def _push(g: ir.Graph, f: Filter) -> bool:
    child = g[f.inputs[0]]
    if g.consumers(child.id) != [f.id]:
        return False  # a shared step: its other consumers need the rows
    pred = ir.parse(f.predicate)
    if isinstance(child, Filter):
        below = ir.parse(child.predicate)
        if not (ir.deterministic(below) and ir.deterministic(pred)):
            return False
        merged = ir.and_all(ir.conjuncts(below) + ir.conjuncts(pred))
        assert merged is not None
        g.put(dataclasses.replace(child, predicate=ir.sql(merged)))
        _drop(g, f)
        return True
    movable, fixed = _movable(pred)
    if not movable:
        return False
    if isinstance(child, Union):
        for inp in child.inputs:
            _insert_below(g, child.id, inp, movable, f)
        _keep(g, f, fixed)
        return True
    moves: dict[str, list[exp.Expression]] = {}  # input id -> rewritten conjuncts
    stay: list[exp.Expression] = []
    for c in movable:
        target = _target(g, child, c)
        if target is None:
            stay.append(c)
        else:
            moves.setdefault(target[0], []).append(target[1])
    if not moves:
        return False
    for inp, parts in moves.items():
        _insert_below(g, child.id, inp, parts, f)
    _keep(g, f, stay + fixed)
    return True


def _target(g: ir.Graph, child: Node,
            c: exp.Expression) -> tuple[str, exp.Expression] | None:
    """Where conjunct ``c`` (over ``child``'s output) can go: an input of ``child`` and
    ``c`` rewritten over that input's columns.  A step type not named here keeps it."""
    used = {n.lower() for n in ir.columns_in(c)}
    if isinstance(child, Project):
        exprs = {col.name.lower(): ir.parse(col.expr) for col in child.columns}
        if not all(ir.deterministic(exprs[u]) for u in used if u in exprs):
            return None
        return child.inputs[0], ir.substitute(c, exprs)
    if isinstance(child, Explode):
        return (child.inputs[0], c) if child.alias.lower() not in used else None
    if isinstance(child, Aggregate):
        groups = {gb.name.lower(): ir.parse(gb.expr) for gb in child.group_by}
        if not used or not used <= set(groups) or \
                not all(ir.deterministic(groups[u]) for u in used):
            return None
        return child.inputs[0], ir.substitute(c, groups)
    if isinstance(child, Deduplicate):
        keys = {k.lower() for k in child.keys}
        return (child.inputs[0], c) if used and used <= keys else None
    if isinstance(child, TopN):
        keys = {n.lower() for n in (ir.bare_column(ir.parse(p)) for p in child.partition_by)
                if n}
        return (child.inputs[0], c) if used and used <= keys else None
    if isinstance(child, Join):
        return _join_target(g, child, c, used)
    return None


def _join_target(g: ir.Graph, j: Join, c: exp.Expression,
                 used: set[str]) -> tuple[str, exp.Expression] | None:
    left, right = j.inputs
    out = join_output(j, g.columns(left), g.columns(right))
    origin = {name.lower(): (side, src) for name, side, src in out}
    sides = {origin[u][0] for u in used if u in origin}
    if not used or len(sides) != 1:
        return None
    side = sides.pop()
    allowed = {"inner": ("left", "right"), "left": ("left",), "right": ("right",),
               "full": (), "left_semi": ("left",), "left_anti": ("left",)}[j.type]
    if side not in allowed:
        return None  # rows of the other side are kept (null-padded) whatever it holds
    if g.is_stateful(j.id):
        keys = j.left_keys if side == "left" else j.right_keys
        names = {n.lower() for n in (ir.bare_column(ir.parse(k)) for k in keys) if n}
        if not {origin[u][1].lower() for u in used} <= names:
            return None
    if side == "right" and any(name.lower() != src.lower() for name, s, src in out
                               if s == "right"):
        # Right columns renamed <right id>_<name> would change name with a new right input.
        return None
    renames = {u: ir.col(origin[u][1]) for u in used if origin[u][1].lower() != u}
    return (left if side == "left" else right), ir.substitute(c, renames) if renames else c


def _insert_below(g: ir.Graph, consumer: str, inp: str, parts: list[exp.Expression],
                  origin_of: Filter) -> None:
    pred = ir.and_all(parts)
    assert pred is not None
    fid = g.fresh_id("where")
    g.add(Filter(id=fid, inputs=(inp,), predicate=ir.sql(pred)), g.origins.get(origin_of.id))
    g.rewire(consumer, inp, fid)


def _keep(g: ir.Graph, f: Filter, parts: list[exp.Expression]) -> None:
    if parts:
        pred = ir.and_all(parts)
        assert pred is not None
        g.put(dataclasses.replace(f, predicate=ir.sql(pred)))
    else:
        _drop(g, f)


def _drop(g: ir.Graph, f: Filter) -> None:
    for c in g.consumers(f.id):
        g.rewire(c, f.id, f.inputs[0])
    g.remove(f.id)


__all__ = ["predicate_pushdown"]
