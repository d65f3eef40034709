"""``aggregate``: ``groupBy(window?, keys).agg(...)``."""

from __future__ import annotations

from typing import Any

from compat.infer import NodeInfo
from compat.steps import Aggregate
from compat.steps.aggregate import ROWS_VERSION
from migrate.build import changelog
from migrate.build.core import Builder, build_step


@build_step.register
def _build(node: Aggregate, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    (df,) = ins
    F = b.F
    if info.changelog:
        return changelog.aggregate(b, df, [(g.name, g.expr) for g in node.group_by],
                                   [(a.name, a.function, list(a.args)) for a in node.aggregates],
                                   info.columns, info.names, b.state_name(node.id),
                                   node.version >= ROWS_VERSION)
    keys = []
    if node.window:
        w = node.window
        if w.type == "session":
            keys.append(F.session_window(F.col(w.column), w.gap or w.size).alias("window"))
        elif w.type == "hopping":
            keys.append(F.window(F.col(w.column), w.size, w.slide).alias("window"))
        else:
            keys.append(F.window(F.col(w.column), w.size).alias("window"))
    keys += [F.expr(g.expr).alias(g.name) for g in node.group_by]
    aggs = []
    for a in node.aggregates:
        args = ", ".join(a.args) if a.args else ""
        text = f"{a.function}({'DISTINCT ' if a.distinct else ''}{args})"
        aggs.append(F.expr(text).alias(a.name))
    return df.groupBy(*keys).agg(*aggs)
