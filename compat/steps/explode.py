"""``explode``: one output row per element of an array (or entry of a map).  Passive."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from compat import expr as E
from compat import types as T
from compat.demand import Demand, columns, merge, moves_filter, own, reads, refs
from compat.findings import RESTART, Finding, register_codes
from compat.infer import InferContext, NodeInfo, deterministic, infer_step, scope
from compat.model import EXPR, NAME, Node, Plan, prop
from compat.pushdown import Conjunct, PushGraph, Targets, push_through
from compat.pyspark_text import Code, Refusal, export_step, py, var
from compat.rules import RuleContext, compare
from compat.rules.passive import where
from compat.signing import NodeSig, by_name, canon_expr, digest, sign_step, token


@dataclass(frozen=True, kw_only=True)
class Explode(Node):
    """Adds column ``as`` holding each element of the array ``expr`` (a map gives
    ``struct<key,value>`` entries); ``outer`` keeps rows whose array is empty or null."""

    expr: str = prop(schema=EXPR)
    alias: str = prop(key="as", schema=NAME)
    outer: bool = prop(False)
    step: ClassVar[str] = "explode"

    def describe(self) -> str:
        return f"{'outer ' if self.outer else ''}explode {self.expr} as {self.alias}"

    def canonical(self) -> tuple:
        return ("explode", E.canonical(self.expr), self.alias.lower(), self.outer)


register_codes({"explode-changed": ("in_place", "info", "data_selection", RESTART)})


@infer_step.register
def _infer(node: Explode, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    (src,) = ins
    t = ctx.expr_type(node, "expr", node.expr, scope(src))
    if t.startswith("array<"):
        elem = T.array_element(t)
    elif t.startswith("map<"):
        k, v = T.map_kv(t)
        elem = f"struct<key:{k},value:{v}>"
    elif t == T.UNKNOWN:
        elem = T.UNKNOWN
    else:
        raise ctx.err(node, "expr", "explode needs an array or a map",
                      expected="array<...> or map<...>", found=t)
    if node.alias.lower() in src.types:
        raise ctx.err(node, "as", f"column '{node.alias}' already exists in the input",
                      expected="a new column name", found=repr(node.alias))
    return NodeInfo(src.columns + ((node.alias.lower(), elem),), src.mode, src.stream, False,
                    src.watermarks, deterministic(node.expr), src.names + (node.alias,),
                    changelog=src.changelog, windows=src.windows)


@reads.register
def _reads(node: Explode, demand: Demand, ins: list[NodeInfo]) -> list[Demand]:
    # Explode decides how many rows there are: its expression is read whatever is demanded.
    passed = {c: w for c, w in demand.items() if c != node.alias.lower()}
    return [merge(passed, own(node, refs(node.expr, columns(ins[0]))))]


@moves_filter.register
def _moves(node: Explode, conjunct: str, ins: list[NodeInfo], above: Sequence[str]
           ) -> list[tuple[int, str]] | None:
    # below the generator, unless it reads the generated column
    if node.alias.lower() in refs(conjunct, [*columns(ins[0]), node.alias.lower()]):
        return None
    return [(0, conjunct)]


@compare.register
def _compare(old: Explode, new: Explode, ctx: RuleContext) -> list[Finding]:
    if (E.canonical(old.expr), old.alias.lower(), old.outer) == \
            (E.canonical(new.expr), new.alias.lower(), new.outer):
        return []
    return [ctx.f("explode-changed", f"explode '{new.id}' changes from {old.describe()} to "
                  f"{new.describe()}{where(ctx)}", old, new, "expr",
                  history=ctx.upstream_of_state)]


@sign_step.register
def _sign(node: Explode, ins: list[NodeSig], names: tuple[str, ...], plan: Plan) -> NodeSig:
    (src,) = ins
    tok = token("explode", canon_expr(node.expr, by_name(src.columns)), node.outer)
    sig = digest("explode", node.version, src.sig, tok)
    return NodeSig(sig, {**src.columns, node.alias.lower(): tok})


@push_through.register
def _push_through(node: Explode, c: Conjunct, g: PushGraph) -> Targets | None:
    return [(node.inputs[0], c)] if node.alias.lower() not in c.used else None


@export_step.register
def _export(node: Explode, plan: Plan) -> Code | Refusal:
    fn = "explode_outer" if node.outer else "explode"
    return Code([f'{var(node.id)} = {var(node.inputs[0])}.select("*", '
                 f"F.{fn}(F.expr({py(node.expr)})).alias({py(node.alias)}))"])
