"""``project``: ``select`` of the expressions (the retraction marker passes through)."""

from __future__ import annotations

from typing import Any

from compat.infer import NodeInfo
from compat.steps import Project
from migrate.build.changelog import SIGN
from migrate.build.core import OP, Builder, build_step


@build_step.register
def _build(node: Project, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    (df,) = ins
    cols = [b.F.expr(c.expr).alias(c.name) for c in node.columns]
    for marker in (OP, SIGN):
        if marker in df.columns:
            cols.append(b.F.col(marker))
    return df.select(*cols)
