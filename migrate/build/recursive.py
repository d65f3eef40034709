"""``recursive``: checked, not yet runnable."""

from __future__ import annotations

from typing import Any

from compat.errors import RuntimeFailure
from compat.infer import NodeInfo
from compat.steps import Recursive
from migrate.build.core import Builder, build_step


@build_step.register
def _build(node: Recursive, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    raise RuntimeFailure("recursive steps are checked but cannot run yet",
                         file=b.plan.file, node=node.id,
                         pointer=b.plan.pointer(node.id, "step"),
                         expected="a plan without recursion", found="recursive")
