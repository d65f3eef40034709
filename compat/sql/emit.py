"""The intermediate graph written as a ``theseus.plan/1`` document.

Steps are written inputs first (depth-first from the sink, inputs in order), so the same graph
always gives the same document.  Expressions become Spark SQL strings; a join's ``LEFT`` and
``RIGHT`` qualifiers become the ids of its inputs, as the plan format wants.
"""

from __future__ import annotations

from typing import Any

from sqlglot import exp

from compat.serde import FORMAT
from compat.sql import ir

VERSION = 1  # every step is written at version 1


def plan_document(g: ir.Graph, *, query: str, config: dict[str, Any],
                  metadata: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {"format": FORMAT, "query": query}
    if config:
        doc["config"] = dict(config)
    if metadata:
        doc["metadata"] = dict(metadata)
    doc["nodes"] = [step_document(g.steps[sid]) for sid in g.order()]
    return doc


def step_document(s: ir.Step) -> dict[str, Any]:
    d: dict[str, Any] = {"id": s.id, "step": s.kind, "version": VERSION}
    if s.inputs:
        d["inputs"] = list(s.inputs)
    if isinstance(s, ir.Source):
        d.update(topic=s.topic, partitions=s.partitions, format=s.format, role=s.role)
        d["schema"] = [{"name": c.name, "type": c.type} | ({} if c.nullable
                                                           else {"nullable": False})
                       for c in s.schema]
        if s.key_columns:
            d["key_columns"] = list(s.key_columns)
        if s.event_time:
            d["event_time"] = {"column": s.event_time, "watermark": s.watermark}
        if s.starting_offsets != "earliest":
            d["starting_offsets"] = s.starting_offsets
    elif isinstance(s, ir.Filter):
        d["predicate"] = ir.sql(s.predicate)
    elif isinstance(s, ir.Project):
        d["columns"] = [{"name": n, "expr": ir.sql(e)} for n, e in s.columns]
    elif isinstance(s, ir.Explode):
        d["expr"] = ir.sql(s.expr)
        d["as"] = s.alias
        if s.outer:
            d["outer"] = True
    elif isinstance(s, ir.Aggregate):
        d["group_by"] = [{"name": n, "expr": ir.sql(e)} for n, e in s.group_by]
        d["aggregates"] = [
            {"name": a.name, "function": a.function,
             "args": ["*" if isinstance(x, exp.Star) else ir.sql(x) for x in a.args]}
            | ({"distinct": True} if a.distinct else {})
            for a in s.aggregates]
        if s.window:
            w: dict[str, Any] = {"type": s.window.type, "column": s.window.column,
                                 "size": s.window.size}
            if s.window.slide:
                w["slide"] = s.window.slide
            if s.window.gap:
                w["gap"] = s.window.gap
            d["window"] = w
    elif isinstance(s, ir.Join):
        d["type"] = s.type
        d["left_keys"] = [ir.sql(k) for k in s.left_keys]
        d["right_keys"] = [ir.sql(k) for k in s.right_keys]
        if s.condition is not None:
            d["condition"] = ir.sql(_qualify(s.condition, s.inputs))
        if s.time_bound is not None:
            d["time_bound"] = ir.sql(_qualify(s.time_bound, s.inputs))
    elif isinstance(s, ir.Deduplicate):
        d["keys"] = list(s.keys)
        if s.within:
            d["within"] = s.within
    elif isinstance(s, ir.TopN):
        d["partition_by"] = [ir.sql(p) for p in s.partition_by]
        d["order_by"] = [{"expr": ir.sql(e)} | ({"desc": True} if desc else {})
                         for e, desc in s.order_by]
        d["n"] = s.n
    elif isinstance(s, ir.Sink):
        d.update(topic=s.topic, format=s.format, key_columns=list(s.key_columns),
                 mode=s.mode or "append", delivery=s.delivery)
    return d


def _qualify(e: exp.Expression, inputs: tuple[str, ...]) -> exp.Expression:
    names = {ir.LEFT: inputs[0], ir.RIGHT: inputs[1]}
    out = e.copy()
    for c in out.find_all(exp.Column):
        if c.table in names:
            c.set("table", ir.ident(names[c.table]))
    return out


__all__ = ["plan_document", "step_document"]
