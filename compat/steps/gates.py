"""``stop_gate`` and ``start_gate``: inserted by the migrator into deployed plans, never
written by users.  Passive plumbing: the stop gate lives in the gated source (it caps what
the query admits), the start gate in the gated sink (it holds output until the cut)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from compat.demand import Demand, moves_filter, reads
from compat.findings import Finding
from compat.infer import InferContext, NodeInfo, infer_step
from compat.model import Node, Plan, prop
from compat.pushdown import Conjunct, PushGraph, Targets, push_through
from compat.pyspark_text import refuse
from compat.rules import RuleContext, compare
from compat.signing import NodeSig, sign_step


@dataclass(frozen=True, kw_only=True)
class StopGate(Node):
    """Caps the source offsets the query admits, for the migration it names."""

    migration: str | None = prop(None, schema={"type": "string"})
    step: ClassVar[str] = "stop_gate"


@dataclass(frozen=True, kw_only=True)
class StartGate(Node):
    """Holds the query's output until the cut of the migration it names."""

    migration: str | None = prop(None, schema={"type": "string"})
    step: ClassVar[str] = "start_gate"


@infer_step.register(StopGate)
@infer_step.register(StartGate)
def _infer(node: Node, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    (src,) = ins
    return NodeInfo(src.columns, src.mode, src.stream, False, src.watermarks, True, src.names,
                    changelog=src.changelog, keys=src.keys, windows=src.windows)


@reads.register(StopGate)
@reads.register(StartGate)
def _reads(node: Node, demand: Demand, ins: list[NodeInfo]) -> list[Demand]:
    return [dict(demand)]  # a gate changes when rows flow, not what they are


@moves_filter.register(StopGate)
@moves_filter.register(StartGate)
def _moves(node: Node, conjunct: str, ins: list[NodeInfo], above: Sequence[str]
           ) -> list[tuple[int, str]] | None:
    return [(0, conjunct)]  # no operator in Spark's plan: the gates work in the source and sink


@compare.register(StopGate)
@compare.register(StartGate)
def _compare(old: Node, new: Node, ctx: RuleContext) -> list[Finding]:
    return []  # deployment plumbing: a gate computes nothing


@sign_step.register(StopGate)
@sign_step.register(StartGate)
def _sign(node: Node, ins: list[NodeSig], names: tuple[str, ...], plan: Plan) -> NodeSig:
    return ins[0]  # a gate changes when rows flow, not what they are


@push_through.register(StopGate)
@push_through.register(StartGate)
def _push_through(node: Node, c: Conjunct, g: PushGraph) -> Targets | None:
    return None  # only the migrator places gates, in deployed plans: the compiler meets none


refuse("gates are Theseus's own operators, inserted by the migrator", StopGate, StartGate)
