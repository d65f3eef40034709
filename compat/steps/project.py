"""``project``: computes the output columns from expressions over the input.  Passive."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from compat import expr as E
from compat.demand import Demand, columns, moves_filter, reads, refs
from compat.findings import RESTART, Finding, register_codes
from compat.infer import (
    WINDOW_TYPE,
    InferContext,
    NodeInfo,
    infer_step,
    plain_column,
    scope,
)
from compat.model import NamedExpr, Node, Plan, prop
from compat.pushdown import Conjunct, PushGraph, Targets, push_through
from compat.pyspark_text import Code, Refusal, export_step, py, var
from compat.rules import RuleContext, compare
from compat.rules.passive import where
from compat.signing import NodeSig, by_name, digest, expr_token, sign_step


@dataclass(frozen=True, kw_only=True)
class Project(Node):
    """Outputs one column per entry of ``columns``, in order.  A column that is just an
    input column carrying a watermark keeps it."""

    columns: tuple[NamedExpr, ...] = prop(min_items=1)
    step: ClassVar[str] = "project"

    def describe(self) -> str:
        return "columns " + ", ".join(c.name for c in self.columns)

    def canonical(self) -> tuple:
        return ("project", tuple((c.name.lower(), E.canonical(c.expr)) for c in self.columns))


register_codes({"project-changed": ("in_place", "info", "schema_evolution", RESTART)})


@infer_step.register
def _infer(node: Project, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    (src,) = ins
    # What a project infers depends on its columns' names and expressions and on its
    # input's info only: generated plans repeat the same project many times.
    key = ("project", tuple([(c.name, c.expr) for c in node.columns]), src)
    got = ctx.memo.get(key)
    if got is not None:
        return got
    ctx.memo[key] = got = _infer_columns(node, ctx, src)
    return got


def _infer_columns(node: Project, ctx: InferContext, src: NodeInfo) -> NodeInfo:
    sc = scope(src)
    cols = []
    marks = set()
    windows: set[str] = set()
    det = True
    for i, c in enumerate(node.columns):
        t, info = ctx.typed(node, f"columns/{i}/expr", c.expr, sc)
        name = c.name.lower()
        cols.append((name, t))
        det = det and info.deterministic
        ast = info.ast
        if ast[0] == "col" and len(ast[1]) == 1 and ast[1][0] in src.watermarks:
            marks.add(name)
        if _is_window(ast, src):
            windows.add(name)
    ctx.unique(node, [c.name for c in node.columns], "columns")
    return NodeInfo(tuple(cols), src.mode, src.stream, False, frozenset(marks), det,
                    tuple(c.name for c in node.columns), changelog=src.changelog,
                    keys=_kept_keys(node, src), windows=frozenset(windows))


def _is_window(ast: tuple, src: NodeInfo) -> bool:
    """Whether a column computed as ``ast`` is a window of the input or one of its bounds,
    under whatever name (``window``, ``window AS w``, ``window.start AS day``): only the
    value itself is; ``CAST(window.start AS date)`` is a value computed from it."""
    if ast[0] != "col" or not ast[1] or ast[1][0] not in src.windows:
        return False
    path = ast[1]
    return len(path) == 1 or (len(path) == 2 and path[1] in ("start", "end") and
                              src.types.get(path[0]) == WINDOW_TYPE)


def _kept_keys(node: Project, src: NodeInfo) -> tuple[tuple[str, ...], ...]:
    """The input's unique keys whose columns the project outputs as they are (renamed or
    not): a key column computed into something else, or dropped, no longer tells rows
    apart."""
    if not src.keys:
        return ()
    renamed: dict[str, list[str]] = {}
    for c in node.columns:
        col = plain_column(c.expr)
        if col is not None:
            renamed.setdefault(col, []).append(c.name.lower())
    out: list[tuple[str, ...]] = []
    for key in src.keys:
        if all(k in renamed for k in key):
            # a key column output under two names is a key under either
            out.extend(itertools.islice(itertools.product(*(renamed[k] for k in key)), 16))
    return tuple(dict.fromkeys(out))


@reads.register
def _reads(node: Project, demand: Demand, ins: list[NodeInfo]) -> list[Demand]:
    cols = columns(ins[0])
    out: Demand = {}
    for c in node.columns:
        who = demand.get(c.name.lower())
        if who:
            for r in refs(c.expr, cols):
                out.setdefault(r, set()).update(who)
    return [out]


@moves_filter.register
def _moves(node: Project, conjunct: str, ins: list[NodeInfo], above: Sequence[str]
           ) -> list[tuple[int, str]] | None:
    # Through a projection of deterministic columns, over the columns' expressions.
    if not all(E.analyze(c.expr).deterministic for c in node.columns):
        return None
    return [(0, E.substitute(conjunct, {c.name.lower(): c.expr for c in node.columns}))]


@compare.register
def _compare(old: Project, new: Project, ctx: RuleContext) -> list[Finding]:
    o = {c.name.lower(): E.canonical(c.expr) for c in old.columns}
    n = {c.name.lower(): E.canonical(c.expr) for c in new.columns}
    parts = []
    added = [k for k in n if k not in o]
    removed = [k for k in o if k not in n]
    changed = [k for k in n if k in o and o[k] != n[k]]
    if added:
        parts.append("adds " + ", ".join(added))
    if removed:
        parts.append("removes " + ", ".join(removed))
    if changed:
        parts.append("computes " + ", ".join(f"{k} as {n[k]} (was {o[k]})" for k in changed))
    if not parts and [c.lower() for c in o] != [c.lower() for c in n]:
        parts.append("reorders its columns")
    if not parts:
        return []
    # Adding or reordering columns does not change what a stateful consumer computes.
    changes_values = bool(changed or removed)
    return [ctx.f("project-changed", f"project '{new.id}': {'; '.join(parts)}{where(ctx)}",
                  old, new, "columns", history=ctx.upstream_of_state and changes_values)]


@sign_step.register
def _sign(node: Project, ins: list[NodeSig], names: tuple[str, ...], plan: Plan) -> NodeSig:
    (src,) = ins
    r = by_name(src.columns)
    cols = {c.name.lower(): expr_token(c.expr, r) for c in node.columns}
    sig = digest("project", node.version, src.sig, tuple(sorted(cols.values())))
    return NodeSig(sig, cols)


@push_through.register
def _push_through(node: Project, c: Conjunct, g: PushGraph) -> Targets | None:
    # ``total > 10`` over ``amount * 2 AS total`` is ``amount * 2 > 10`` below; a
    # nondeterministic expression must not be computed twice.
    exprs = {col.name.lower(): col.expr for col in node.columns}
    if not all(g.deterministic(exprs[u]) for u in c.used if u in exprs):
        return None
    return [(node.inputs[0], c.substitute(exprs))]


@export_step.register
def _export(node: Project, plan: Plan) -> Code | Refusal:
    cols = ", ".join(f"F.expr({py(c.expr)}).alias({py(c.name)})" for c in node.columns)
    return Code([f"{var(node.id)} = {var(node.inputs[0])}.select({cols})"])
