"""``explode``: ``explode`` / ``explode_outer`` as a new column."""

from __future__ import annotations

from typing import Any

from compat.infer import NodeInfo
from compat.steps import Explode
from migrate.build.core import Builder, build_step


@build_step.register
def _build(node: Explode, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    (df,) = ins
    fn = b.F.explode_outer if node.outer else b.F.explode
    return df.select("*", fn(b.F.expr(node.expr)).alias(node.alias))
