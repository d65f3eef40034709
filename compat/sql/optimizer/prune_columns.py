"""Projection pruning: read and carry only the columns the query uses.

Needs flow from the sink (which needs every column it writes) to the sources; each step needs
what its consumers need plus what its own expressions, keys and windows read.  Then:

- a source's declared schema keeps only the needed columns, plus its event-time column and its
  key columns (the watermark and the table's key need them) and, if nothing else is left, its
  first column.  This changes the source schema written into the plan: the plan says what the
  query reads, so adding a column to ``CREATE TABLE`` that the query never uses compiles to the
  same plan, and starting to use a column is a ``source-column-added`` finding for the checker;
- a projection inside the query keeps only the needed columns.

Two things keep columns that are not read: a union's inputs must keep the same columns (when
pruning would make them differ, the union's inputs keep everything), and a right join input
keeps a column whose name clashes with a left column the join keeps, since dropping it would
rename the join's output (``<right id>_<name>`` only exists while the names clash).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from compat.model import NamedExpr
from compat.sql import ir
from compat.steps import (
    Aggregate,
    Deduplicate,
    Explode,
    Filter,
    Join,
    Project,
    Sink,
    Source,
    TopN,
    Union,
)
from compat.steps.join import join_output

Need = Callable[[str, Iterable[str]], None]


def prune_columns(graph: ir.Graph) -> ir.Graph:
    frozen: set[str] = set()  # unions whose inputs must keep all their columns
    while True:
        out = _prune(graph, frozen)
        bad = {s.id for s in out.steps.values() if isinstance(s, Union) and
               len({tuple(c.lower() for c in out.columns(i)) for i in s.inputs}) > 1}
        if not bad - frozen:
            return out
        frozen |= bad


def _reads(text: str) -> list[str]:
    return ir.columns_in(ir.parse(text))


def _prune(graph: ir.Graph, frozen: set[str]) -> ir.Graph:
    g = graph.copy()
    need: dict[str, set[str]] = {}

    def add(sid: str, names: Iterable[str]) -> None:
        need.setdefault(sid, set()).update(n.lower() for n in names)

    for sid in reversed(g.order()):  # consumers before their inputs
        s = g[sid]
        req = need.get(sid, set())
        if isinstance(s, Source):
            continue
        if isinstance(s, Filter):
            add(s.inputs[0], req | set(_reads(s.predicate)))
        elif isinstance(s, Project):
            for c in _kept_columns(s, req):
                add(s.inputs[0], _reads(c.expr))
            need.setdefault(s.inputs[0], set())
        elif isinstance(s, Explode):
            add(s.inputs[0], (req - {s.alias.lower()}) | set(_reads(s.expr)))
        elif isinstance(s, Union):
            for i in s.inputs:
                add(i, g.columns(i) if sid in frozen else req)
        elif isinstance(s, Aggregate):
            used: list[str] = []
            for gb in s.group_by:
                used += _reads(gb.expr)
            for a in s.aggregates:
                for x in a.args:
                    used += _reads(x)
            if s.window:
                used.append(s.window.column)
            add(s.inputs[0], used)
        elif isinstance(s, Join):
            _join_needs(g, s, req, add)
        elif isinstance(s, Deduplicate):
            add(s.inputs[0], req | {k.lower() for k in s.keys})
        elif isinstance(s, TopN):
            used = []
            for p in s.partition_by:
                used += _reads(p)
            for o in s.order_by:
                used += _reads(o.expr)
            add(s.inputs[0], req | {u.lower() for u in used})
        else:  # the sink, and any step this rule does not know: every input column
            for i in s.inputs:
                add(i, g.columns(i))
    for sid in list(g.steps):
        s = g[sid]
        req = need.get(sid, set())
        if isinstance(s, Source):
            keep = req | {k.lower() for k in s.key_columns} | \
                ({s.event_time.column.lower()} if s.event_time else set())
            schema = tuple(c for c in s.schema if c.name.lower() in keep) or s.schema[:1]
            g.put(dataclasses.replace(s, schema=schema))
        elif isinstance(s, Project) and not any(isinstance(g[c], Sink)
                                                for c in g.consumers(sid)):
            g.put(dataclasses.replace(s, columns=tuple(_kept_columns(s, req))))
    return g


def _kept_columns(s: Project, req: set[str]) -> list[NamedExpr]:
    kept = [c for c in s.columns if c.name.lower() in req]
    return kept or list(s.columns[:1])  # a projection keeps at least one column


def _join_needs(g: ir.Graph, j: Join, req: set[str], add: Need) -> None:
    left, right = j.inputs
    lcols, rcols = g.columns(left), g.columns(right)
    out = join_output(j, lcols, rcols)
    lneed: set[str] = set()
    rneed: set[str] = set()
    for name, side, src in out:
        if name.lower() in req:
            (lneed if side == "left" else rneed).add(src.lower())
    lneed.update(c.lower() for k in j.left_keys for c in _reads(k))
    rneed.update(c.lower() for k in j.right_keys for c in _reads(k))
    for text in (j.condition, j.time_bound):
        if text is None:
            continue
        e = ir.step_parse(j, text, True)
        lneed.update(c.lower() for c in ir.columns_in(e, left))
        rneed.update(c.lower() for c in ir.columns_in(e, right))
    # A kept right column that clashes with a left one is renamed <right id>_<name>; the
    # left one must stay for the name to stay.
    lnames = {c.lower() for c in lcols}
    lneed.update(r for r in rneed if r in lnames)
    add(left, lneed)
    add(right, rneed)


__all__ = ["prune_columns"]
