"""``stop_gate`` and ``start_gate``: nothing to build; the stop gate lives in the gated
source and the start gate in the gated sink."""

from __future__ import annotations

from typing import Any

from compat.infer import NodeInfo
from compat.model import Node
from compat.steps import StartGate, StopGate
from migrate.build.core import Builder, build_step


@build_step.register(StopGate)
@build_step.register(StartGate)
def _build(node: Node, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    return ins[0]
