"""``top_n``: keeps the ``n`` first rows per partition in an order.  Enforcing:
partitioning and ordering define the state; a larger N needs rows the state dropped, a
smaller N does not."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from compat import types as T
from compat.demand import Demand, columns, merge, moves_filter, own, reads, refs
from compat.findings import MIGRATE, RESTART, Finding, register_codes
from compat.infer import INSERT, RETRACT, InferContext, NodeInfo, deterministic, infer_step, scope
from compat.model import ENFORCING, EXPR, INT32_MAX, Node, OrderKey, Plan, prop
from compat.pushdown import Conjunct, PushGraph, Targets, push_through
from compat.pyspark_text import refuse
from compat.rules import RuleContext, canon_list, compare
from compat.signing import NodeSig, by_name, canon_expr, digest, sign_step


@dataclass(frozen=True, kw_only=True)
class TopN(Node):
    """Keeps, per ``partition_by`` value, the ``n`` first rows by ``order_by``; rows that
    fall out of the top are retracted (``[I,UB,UA,D]``)."""

    partition_by: tuple[str, ...] = prop(items=EXPR)
    order_by: tuple[OrderKey, ...] = prop(min_items=1)
    n: int = prop(schema={"type": "integer", "minimum": 1, "maximum": INT32_MAX})
    step: ClassVar[str] = "top_n"
    klass: ClassVar[str] = ENFORCING


register_codes({
    "topn-partition-changed": ("migrate", "error", "topology", MIGRATE),
    "topn-order-changed": ("migrate", "error", "topology", MIGRATE),
    "topn-n-increased": ("migrate", "error", "data_selection",
                         "The state only kept the old top rows; " + MIGRATE[0].lower()
                         + MIGRATE[1:]),
    "topn-n-decreased": ("in_place", "warning", "data_selection", RESTART),
    "topn-state-schema-changed": ("migrate", "error", "schema_evolution", MIGRATE),
})


@infer_step.register
def _infer(node: TopN, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    (src,) = ins
    sc = scope(src)
    det = True
    for i, p in enumerate(node.partition_by):
        ctx.expr_type(node, f"partition_by/{i}", p, sc)
        det = det and deterministic(p)
    for i, o in enumerate(node.order_by):
        ctx.expr_type(node, f"order_by/{i}/expr", o.expr, sc)
        det = det and deterministic(o.expr)
    if src.mode != INSERT:
        raise ctx.err(node, "inputs", "top_n over a stream of updates is not supported",
                      expected="[I]", found=f"[{src.mode}]")
    if ctx.sink_mode == "append":
        raise ctx.err(node, "", "a top_n step retracts rows that fall out of the top, so it "
                      "cannot feed an append sink", expected="sink mode 'update' with "
                      "key_columns", found="mode 'append'", ptr=ctx.pointer(node.id))
    return NodeInfo(src.columns, RETRACT, src.stream, src.stream, frozenset(), det, src.names,
                    windows=src.windows)


@reads.register
def _reads(node: TopN, demand: Demand, ins: list[NodeInfo]) -> list[Demand]:
    cols = columns(ins[0])
    read: set[str] = set()
    for text in (*node.partition_by, *(o.expr for o in node.order_by)):
        read |= refs(text, cols)
    return [merge(demand, own(node, read))]


@moves_filter.register
def _moves(node: TopN, conjunct: str, ins: list[NodeInfo], above: Sequence[str]
           ) -> list[tuple[int, str]] | None:
    return None  # a function of Theseus' own: Spark moves nothing into it


@compare.register
def _compare(old: TopN, new: TopN, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    f = ctx.f
    if canon_list(old.partition_by) != canon_list(new.partition_by):
        out.append(f("topn-partition-changed", f"top_n '{new.id}' partitions by "
                     f"{list(new.partition_by)} instead of {list(old.partition_by)}",
                     old, new, "partition_by"))
    okeys = [(k, o.desc) for k, o in zip(canon_list([o.expr for o in old.order_by]),
                                         old.order_by)]
    nkeys = [(k, o.desc) for k, o in zip(canon_list([o.expr for o in new.order_by]),
                                         new.order_by)]
    if okeys != nkeys:
        out.append(f("topn-order-changed", f"top_n '{new.id}' orders by a different key",
                     old, new, "order_by"))
    if new.n > old.n:
        out.append(f("topn-n-increased", f"top_n '{new.id}' keeps {new.n} rows per "
                     f"partition instead of {old.n}; the state only has the old top {old.n}",
                     old, new, "n"))
    elif new.n < old.n:
        out.append(f("topn-n-decreased", f"top_n '{new.id}' keeps {new.n} rows per "
                     f"partition instead of {old.n}", old, new, "n"))
    a = ctx.old.info[old.inputs[0]].columns
    b = ctx.new.info[new.inputs[0]].columns
    if len(a) != len(b) or not all(T.same_layout(x[1], y[1]) for x, y in zip(a, b)):
        out.append(f("topn-state-schema-changed", f"top_n '{new.id}' keeps whole input rows "
                     "in state and the input columns changed", old, new, "inputs"))
    return out


@sign_step.register
def _sign(node: TopN, ins: list[NodeSig], names: tuple[str, ...], plan: Plan) -> NodeSig:
    (src,) = ins
    r = by_name(src.columns)
    part = tuple(sorted(canon_expr(p, r) for p in node.partition_by))
    order = tuple((canon_expr(o.expr, r), o.desc) for o in node.order_by)
    sig = digest("top_n", node.version, src.sig, part, order, node.n)
    return NodeSig(sig, src.columns)


@push_through.register
def _push_through(node: TopN, c: Conjunct, g: PushGraph) -> Targets | None:
    keys = {n.lower() for n in (g.bare_column(p) for p in node.partition_by) if n}
    return [(node.inputs[0], c)] if c.used and c.used <= keys else None


refuse("Spark's DataFrame API has no streaming top-N; Theseus builds it with a stateful "
       "function of its own", TopN)
