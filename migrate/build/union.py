"""``union``: ``unionByName`` of the inputs, in order."""

from __future__ import annotations

from typing import Any

from compat.infer import NodeInfo
from compat.steps import Union
from migrate.build.core import Builder, build_step


@build_step.register
def _build(node: Union, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    out = ins[0]
    for other in ins[1:]:
        out = out.unionByName(other)
    return out
