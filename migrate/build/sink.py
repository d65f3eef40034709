"""``sink``: the rows it writes are its input's; ``Builder.start`` writes them through the
gated sink (``gates.sink``), keyed by the columns ``sink_key`` names."""

from __future__ import annotations

from typing import Any

from compat.infer import NodeInfo
from compat.steps import Sink
from compat.steps.sink import written_key
from migrate.build.core import Builder, build_step


@build_step.register
def _build(node: Sink, b: Builder, ins: list[Any], info: NodeInfo) -> Any:
    return ins[0]


def sink_key(b: Builder) -> list[str]:
    """The columns of the record key the gated sink writes, in order: ``key_columns``, and
    for a version 2 sink over a windowed output the ``window`` column last (its JSON object
    ``{"start": ..., "end": ...}`` is the key's last member).  A version 1 sink keeps its
    bytes: ``key_columns`` alone."""
    sink = b.plan.sink
    assert isinstance(sink, Sink)
    return list(written_key(sink, b.plan.info[sink.id]))
