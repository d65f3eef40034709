"""``filter``: ``where``; over updates, a row that stops matching is kept and marked for
retraction."""

from __future__ import annotations

from typing import Any

from compat.infer import INSERT, NodeInfo
from compat.steps import Filter
from migrate.build.core import OP, Builder, build_step


@build_step.register
def _build(node: Filter, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    (df,) = ins
    F = b.F
    src = b.plan.info[node.inputs[0]]
    if src.mode == INSERT or src.changelog:
        # A changelog's retraction of a row passes exactly when the row did.
        return df.where(F.expr(node.predicate))
    # Over updates: keep the row, but retract its key when it stops matching.
    keep = F.coalesce(F.expr(node.predicate), F.lit(False))
    prev = F.col(OP) if OP in df.columns else F.lit("U")
    return df.withColumn(OP, F.when(keep, prev).otherwise(F.lit("D")))
