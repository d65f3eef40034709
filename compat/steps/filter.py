"""``filter``: keeps the rows where a predicate holds.  Passive."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from compat import expr as E
from compat import types as T
from compat.demand import Demand, columns, merge, moves_filter, own, reads, refs
from compat.findings import RESTART, Finding, register_codes
from compat.infer import INSERT, RETRACT, InferContext, NodeInfo, infer_step, scope
from compat.model import EXPR, Node, Plan, prop
from compat.pushdown import Conjunct, PushGraph, Targets, push_through
from compat.pyspark_text import Code, Refusal, export_step, py, var
from compat.rules import RuleContext, compare
from compat.rules.passive import where
from compat.signing import NodeSig, by_name, canon_ast, conjuncts, digest, sign_step


@dataclass(frozen=True, kw_only=True)
class Filter(Node):
    """Keeps the rows where ``predicate`` is true.  Over a stream of updates, a row that
    stops matching is retracted (a tombstone for its key), as in Flink."""

    predicate: str = prop(schema=EXPR)
    step: ClassVar[str] = "filter"

    def describe(self) -> str:
        return f"keeps rows where {self.predicate}"

    def canonical(self) -> tuple:
        return ("filter", E.canonical(self.predicate))

    def row_predicate(self) -> str | None:
        return self.predicate


register_codes({"filter-changed": ("in_place", "info", "data_selection", RESTART)})


@infer_step.register
def _infer(node: Filter, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    (src,) = ins
    t, info = ctx.typed(node, "predicate", node.predicate, scope(src))
    if t not in ("boolean", T.UNKNOWN):  # WHERE NULL: Spark refuses a void filter too
        raise ctx.err(node, "predicate", "a filter predicate must be a condition",
                      expected="boolean", found=t)
    # Dropping an update from an upsert stream would leave the old row visible downstream,
    # so, as in Flink, a filter over updates emits retractions.
    mode = RETRACT if src.mode != INSERT else INSERT
    return NodeInfo(src.columns, mode, src.stream, False, src.watermarks, info.deterministic,
                    src.names, changelog=src.changelog, keys=src.keys, windows=src.windows)


@reads.register
def _reads(node: Filter, demand: Demand, ins: list[NodeInfo]) -> list[Demand]:
    return [merge(demand, own(node, refs(node.predicate, columns(ins[0]))))]


@moves_filter.register
def _moves(node: Filter, conjunct: str, ins: list[NodeInfo], above: Sequence[str]
           ) -> list[tuple[int, str]] | None:
    return [(0, conjunct)]  # adjacent filters are one (CombineFilters)


@compare.register
def _compare(old: Filter, new: Filter, ctx: RuleContext) -> list[Finding]:
    if E.canonical(old.predicate) == E.canonical(new.predicate):
        return []
    return [ctx.f("filter-changed", f"filter '{new.id}' keeps rows where {new.predicate} "
                  f"instead of {old.predicate}{where(ctx)}", old, new, "predicate",
                  history=ctx.upstream_of_state)]


@sign_step.register
def _sign(node: Filter, ins: list[NodeSig], names: tuple[str, ...], plan: Plan) -> NodeSig:
    (src,) = ins
    ast = canon_ast(node.predicate, by_name(src.columns))
    own = frozenset((node.version, E.render(c)) for c in conjuncts(ast))
    det = E.is_deterministic(ast)
    # Deterministic filters commute: a chain of them is one set of conjuncts.
    if det and src.conjuncts and isinstance(plan.nodes[node.inputs[0]], Filter):
        conj, base = src.conjuncts | own, src.base
    else:
        conj, base = own, src.sig
    conj = conj if det else frozenset()
    sig = digest("filter", base, tuple(sorted(conj or own)), det)
    return NodeSig(sig, src.columns, conj, base)


@push_through.register
def _push_through(node: Filter, c: Conjunct, g: PushGraph) -> Targets | None:
    # Below a filter a conjunct would trade places with it forever: the pushdown rule
    # merges two deterministic filters into one instead, and leaves the others in order.
    return None


@export_step.register
def _export(node: Filter, plan: Plan) -> Code | Refusal:
    return Code([f"{var(node.id)} = {var(node.inputs[0])}.where(F.expr({py(node.predicate)}))"])
