"""Projection pruning: read and carry only the columns the query uses.

What each step reads of its inputs is the step's own ``reads`` registration
(``compat.demand``), the one statement of column demand that the checker's state rules and
the fleet's contracts use too: needs flow from the sink (which needs every column it
writes) to the sources.  Then:

- a source's declared schema keeps only the needed columns, plus its event-time column and its
  key columns (the watermark and the table's key need them) and, if nothing else is left, its
  first column.  This changes the source schema written into the plan: the plan says what the
  query reads, so adding a column to ``CREATE TABLE`` that the query never uses compiles to the
  same plan, and starting to use a column is a ``source-column-added`` finding for the checker;
- a projection inside the query keeps only the needed columns (at least one).

A plan is rewritten, so pruning must not change what any step outputs under the names its
consumers read, and two things would: a right join input's column named like a left one is
written ``<right id>_<name>`` only while the left one is there, and a union's inputs must
keep the same columns.  A step whose output loses a column demanded of it keeps, in each
input, the columns named like those another input keeps (the clashing left column); a step
that no longer infers (the union) keeps all its inputs' columns; and the pruning starts over.
"""

from __future__ import annotations

import dataclasses

from compat.demand import Demand, columns, everything, merge, own, propagate
from compat.errors import PlanError
from compat.infer import NodeInfo
from compat.model import NamedExpr
from compat.sql import ir
from compat.steps import Project, Sink, Source

#: what a step that pruning broke keeps of its inputs
NAMES, ALL = "names", "all"


def prune_columns(graph: ir.Graph) -> ir.Graph:
    kept: dict[str, str] = {}  # step id -> NAMES or ALL
    while True:
        out, need = _prune(graph, kept)
        broken = {sid: how for sid, how in _broken(out, need).items()
                  if kept.get(sid) != ALL and kept.get(sid) != how}
        if not broken:
            return out
        kept.update(broken)


def _prune(graph: ir.Graph, kept: dict[str, str]) -> tuple[ir.Graph, dict[str, Demand]]:
    g = graph.copy()
    order = g.order()
    need = propagate(order, g.steps, g.info, adjust=_keep_one(g), widen=_widen(g, kept))
    for sid in order:
        s = g[sid]
        req = set(need.get(sid, {}))
        if isinstance(s, Source):
            keep = req | {k.lower() for k in s.key_columns} | \
                ({s.event_time.column.lower()} if s.event_time else set())
            schema = tuple(c for c in s.schema if c.name.lower() in keep) or s.schema[:1]
            g.put(dataclasses.replace(s, schema=schema))
        elif _rewritten(g, sid):
            g.put(dataclasses.replace(s, columns=tuple(_kept_columns(s, req))))
    return g, need


def _rewritten(g: ir.Graph, sid: str) -> bool:
    """A projection inside the query (the one the sink reads names the output columns)."""
    return isinstance(g[sid], Project) and not any(isinstance(g[c], Sink)
                                                   for c in g.consumers(sid))


def _keep_one(g: ir.Graph):  # type: ignore[no-untyped-def]
    """A projection that nothing reads keeps its first column: it reads for that one."""
    def adjust(sid: str, demand: Demand) -> Demand:
        s = g[sid]
        if demand or not _rewritten(g, sid):
            return demand
        return {s.columns[0].name.lower(): {sid}}  # type: ignore[attr-defined]
    return adjust


def _widen(g: ir.Graph, kept: dict[str, str]):  # type: ignore[no-untyped-def]
    def widen(sid: str, needs: list[Demand], ins: list[NodeInfo]) -> list[Demand]:
        how = kept.get(sid)
        if how is None:
            return needs
        step = g[sid]
        if how == ALL:
            return everything(step, ins)
        # Keep each input's columns named like a column another input keeps.
        out = []
        for i, (need, info) in enumerate(zip(needs, ins)):
            others = {c for j, n in enumerate(needs) if j != i for c in n}
            out.append(merge(need, own(step, others & set(columns(info)))))
        return out
    return widen


def _kept_columns(s: Project, req: set[str]) -> list[NamedExpr]:
    kept = [c for c in s.columns if c.name.lower() in req]
    return kept or list(s.columns[:1])  # a projection keeps at least one column


def _broken(g: ir.Graph, need: dict[str, Demand]) -> dict[str, str]:
    """The steps of the pruned graph that no longer output what is demanded of them
    (``NAMES``) or no longer infer (``ALL``): pruning their inputs changed their output."""
    probe = g.copy()
    probe.on_error = None
    for sid in probe.order():
        try:
            names = {n.lower() for n in probe.columns(sid)}
        except PlanError:
            return {sid: ALL}
        if set(need.get(sid, {})) - names:
            return {sid: NAMES}
    # (one step at a time, inputs first: what is downstream of a broken step cannot be
    # judged before it is mended)
    return {}


__all__ = ["prune_columns"]
