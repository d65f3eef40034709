"""``sink``: the rows it writes are its input's; ``Builder.start`` writes them through the
gated sink (``gates.sink``), keyed by the columns ``sink_key`` names."""

from __future__ import annotations

from typing import Any

from compat.infer import NodeInfo
from compat.steps import Sink
from migrate.build.core import Builder, build_step, sink_key

__all__ = ["sink_key"]  # the key's columns: decided in core, where the writer is made


@build_step.register
def _build(node: Sink, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    return ins[0]
