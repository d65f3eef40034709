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

Where a conjunct may pass a step, and rewritten how, the step says in its own module
(``@push_through.register``, ``compat.pushdown``); this rule asks it for each movable
conjunct and moves them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from sqlglot import exp

from compat.pushdown import push_through
from compat.sql import ir
from compat.steps import Filter


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
        if ir.deterministic(below) and ir.deterministic(pred):
            # Two filters become one: the rule's own step, which no conjunct passes
            # (``compat.steps.filter``'s registration keeps them above it otherwise).
            merged = ir.and_all(ir.conjuncts(below) + ir.conjuncts(pred))
            assert merged is not None
            g.put(dataclasses.replace(child, predicate=ir.sql(merged)))
            _drop(g, f)
            return True
    movable, fixed = _movable(pred)
    if not movable:
        return False
    view = _View(g)
    moves: dict[str, list[exp.Expression]] = {}  # input id -> rewritten conjuncts
    stay: list[exp.Expression] = []
    for c in movable:
        targets = push_through(child, _Conjunct(c), view)
        if targets is None:
            stay.append(c)
        for inp, moved in targets or ():
            assert isinstance(moved, _Conjunct)
            moves.setdefault(inp, []).append(moved.tree)
    if not moves:
        return False
    for inp, parts in moves.items():
        _insert_below(g, child.id, inp, parts, f)
    _keep(g, f, stay + fixed)
    return True


@dataclass(frozen=True)
class _Conjunct:
    """A conjunct as a step's ``push_through`` sees it (``compat.pushdown.Conjunct``)."""

    tree: exp.Expression

    @cached_property
    def used(self) -> frozenset[str]:
        return frozenset(n.lower() for n in ir.columns_in(self.tree))

    def substitute(self, exprs: Mapping[str, str]) -> _Conjunct:
        return _Conjunct(ir.substitute(self.tree, {k: ir.parse(v) for k, v in exprs.items()}))

    def rename(self, names: Mapping[str, str]) -> _Conjunct:
        if not names:
            return self
        return _Conjunct(ir.substitute(self.tree, {k: ir.col(v) for k, v in names.items()}))


@dataclass(frozen=True)
class _View:
    """The graph as a step's ``push_through`` reads it (``compat.pushdown.PushGraph``)."""

    g: ir.Graph

    def columns(self, step_id: str) -> list[str]:
        return self.g.columns(step_id)

    def is_stateful(self, step_id: str) -> bool:
        return self.g.is_stateful(step_id)

    def deterministic(self, expr: str) -> bool:
        return ir.deterministic(ir.parse(expr))

    def bare_column(self, expr: str) -> str | None:
        return ir.bare_column(ir.parse(expr))


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
