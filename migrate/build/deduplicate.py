"""``deduplicate``: ``dropDuplicates``, or ``dropDuplicatesWithinWatermark`` with
``within``."""

from __future__ import annotations

from typing import Any

from compat.infer import NodeInfo
from compat.steps import Deduplicate
from migrate.build.core import Builder, build_step


@build_step.register
def _build(node: Deduplicate, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    (df,) = ins
    if node.within:
        return df.dropDuplicatesWithinWatermark(list(node.keys))
    return df.dropDuplicates(list(node.keys))
