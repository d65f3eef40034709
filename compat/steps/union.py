"""``union``: the rows of two or more inputs with the same columns (``UNION ALL``).
Passive."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from compat import types as T
from compat.demand import Demand, moves_filter, reads
from compat.findings import Finding
from compat.infer import MODE_RANK, InferContext, NodeInfo, infer_step
from compat.model import Node, Plan
from compat.pushdown import Conjunct, PushGraph, Targets, push_through
from compat.pyspark_text import Code, Refusal, export_step, var
from compat.rules import RuleContext, compare
from compat.signing import NodeSig, digest, sign_step, token


@dataclass(frozen=True, kw_only=True)
class Union(Node):
    """The rows of every input; inputs have the same column names in the same order, and
    each column gets the widest of their types."""

    step: ClassVar[str] = "union"
    min_inputs: ClassVar[int] = 2
    max_inputs: ClassVar[int | None] = None

    def canonical(self) -> tuple:
        return ("union", len(self.inputs))


@infer_step.register
def _infer(node: Union, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    first = ins[0]
    cols = list(first.columns)
    for k, other in enumerate(ins[1:], start=1):
        names = [c[0] for c in other.columns]
        if names != [c[0] for c in cols]:
            raise ctx.err(node, f"inputs/{k}", "union inputs must have the same columns "
                          "in the same order", expected=", ".join(c[0] for c in cols),
                          found=", ".join(names))
        for i, (name, t) in enumerate(other.columns):
            w = T.wider(cols[i][1], t)
            if w == T.UNKNOWN and T.UNKNOWN not in (cols[i][1], t):
                raise ctx.err(node, f"inputs/{k}", f"union column '{name}' has "
                              "incompatible types", expected=cols[i][1], found=t)
            cols[i] = (name, w)
    if len({i.changelog for i in ins}) > 1:
        k = next(k for k, i in enumerate(ins) if i.changelog != ins[0].changelog)
        raise ctx.err(node, f"inputs/{k}", "a union cannot mix a table read as a changelog "
                      "with other inputs (a changelog's rows are changes of a table)",
                      expected="changelog inputs only, or none",
                      found="a changelog and another input")
    mode = max((i.mode for i in ins), key=MODE_RANK.__getitem__)
    marks = frozenset.intersection(*(i.watermarks for i in ins))
    # a column is a window only if it is one in every input
    windows = frozenset.intersection(*(i.windows for i in ins))
    return NodeInfo(tuple(cols), mode, any(i.stream for i in ins), False, marks, True,
                    first.names, changelog=first.changelog, windows=windows)


@reads.register
def _reads(node: Union, demand: Demand, ins: list[NodeInfo]) -> list[Demand]:
    # Inputs line up by name (the same names in the same order): each gives what is
    # demanded of the union.
    return [dict(demand) for _ in ins]


@moves_filter.register
def _moves(node: Union, conjunct: str, ins: list[NodeInfo], above: Sequence[str]
           ) -> list[tuple[int, str]] | None:
    return [(i, conjunct) for i in range(len(ins))]  # into every input


@compare.register
def _compare(old: Union, new: Union, ctx: RuleContext) -> list[Finding]:
    return []  # what a union reads is its inputs: the walk pairs and compares them


@sign_step.register
def _sign(node: Union, ins: list[NodeSig], names: tuple[str, ...], plan: Plan) -> NodeSig:
    # Inputs line up by name (the same names in the same order); a union of the same
    # inputs in another order is the same rows.
    first = names or tuple(ins[0].columns)
    cols = {n.lower(): token("union", tuple(sorted(i.columns.get(n.lower(), "?")
                                                   for i in ins)))
            for n in first}
    sig = digest("union", node.version, tuple(sorted(i.sig for i in ins)),
                 tuple(sorted(cols.values())))
    return NodeSig(sig, cols)


@push_through.register
def _push_through(node: Union, c: Conjunct, g: PushGraph) -> Targets | None:
    return [(i, c) for i in dict.fromkeys(node.inputs)]  # into every input, once


@export_step.register
def _export(node: Union, plan: Plan) -> Code | Refusal:
    first, *rest = (var(i) for i in node.inputs)
    return Code([f"{var(node.id)} = {first}" + "".join(f".union({i})" for i in rest)])
