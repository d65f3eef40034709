"""``recursive``: a loop whose body is applied to its own output until nothing new comes
out (recursion is expressed inside one node; the plan graph stays acyclic).  Enforcing:
the body is compared as a whole (its state and its feedback topic)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from compat import types as T
from compat.errors import PlanError
from compat.findings import MIGRATE, Finding, register_codes
from compat.infer import INSERT, InferContext, NodeInfo, infer_step
from compat.model import (
    ENFORCING,
    ID,
    PARTITIONS,
    Node,
    build_graph,
    prop,
    topological_order,
)
from compat.rules import RuleContext, compare
from compat.steps.sink import Sink
from compat.steps.source import Source


@dataclass(frozen=True)
class Feedback:
    """The internal topic that carries the loop's rows back to the body."""

    partitions: int = prop(schema=PARTITIONS)


@dataclass(frozen=True, kw_only=True)
class Recursive(Node):
    """Feeds ``body_output`` back into ``body_input`` until no new row is derived.  Body
    nodes are addressed as ``<recursive id>/<body id>`` in errors."""

    body: tuple[Node, ...] = prop(min_items=1)
    body_input: str = prop(schema=ID)
    body_output: str = prop(schema=ID)
    feedback: Feedback = prop()
    step: ClassVar[str] = "recursive"
    klass: ClassVar[str] = ENFORCING

    def traits(self) -> frozenset[str]:
        return frozenset({"recursive"})


register_codes({
    "recursive-body-changed": ("migrate", "error", "topology", MIGRATE),
    "recursive-feedback-changed": ("migrate", "error", "scaling", MIGRATE),
})


@dataclass(frozen=True, kw_only=True)
class _LoopInput(Node):
    """The looped stream, as the body's graph sees it."""

    min_inputs: ClassVar[int] = 0
    max_inputs: ClassVar[int | None] = 0


def _check_body(rec: Recursive, ctx: InferContext) -> dict[str, str]:
    """The body is its own graph; its nodes may read ``body_input``, the looped stream.
    Returns the pointers of the body's nodes by body id."""
    base = ctx.pointer(rec.id)
    inner: dict[str, str] = {n.id: ctx.pointers.get(f"{rec.id}/{n.id}", base + "/body")
                             for n in rec.body}
    ids = set(inner)
    if rec.body_input in ids:
        raise ctx.err(rec, "body_input", "body_input must name the looped stream, not a body "
                      "node", expected="a name no body node uses", found=repr(rec.body_input))
    inner[rec.body_input] = base + "/body_input"
    build_graph([_LoopInput(id=rec.body_input), *rec.body], ctx.file, inner,
                where=f" (in the body of '{rec.id}')")
    if rec.body_output not in ids:
        raise ctx.err(rec, "body_output", "body_output is not a body node",
                      expected="one of " + ", ".join(sorted(ids)),
                      found=repr(rec.body_output))
    for n in rec.body:
        if isinstance(n, (Source, Sink, Recursive)):
            raise PlanError(f"a {n.step} step cannot be inside a recursive body",
                            file=ctx.file, node=n.id, pointer=inner[n.id] + "/step",
                            expected="passive or stateful steps", found=repr(n.step))
    return inner


@infer_step.register
def _infer(node: Recursive, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    (src,) = ins
    pointers = _check_body(node, ctx)
    if src.mode != INSERT:
        raise ctx.err(node, "inputs", "recursion needs an insert-only input",
                      expected="[I]", found=f"[{src.mode}]")
    body = {b.id: b for b in node.body}
    sub = InferContext(ctx.file, body, pointers, "append")
    infos: dict[str, NodeInfo] = {node.body_input: src}
    for bid in _body_order(node):
        b = body[bid]
        info = infer_step(b, sub, [infos[i] for i in b.inputs])
        if info.mode != INSERT:
            raise sub.err(b, "", "a recursive body must emit inserts only",
                          expected="[I]", found=f"[{info.mode}]")
        infos[bid] = info
    out = infos[node.body_output]
    if [c[0] for c in out.columns] != [c[0] for c in src.columns] or \
            not all(T.can_widen(a[1], b[1]) for a, b in zip(out.columns, src.columns)):
        raise ctx.err(node, "body_output", "the body output is fed back into the body "
                      "input, so it must have the input's columns",
                      expected=", ".join(f"{n} {t}" for n, t in src.columns),
                      found=", ".join(f"{n} {t}" for n, t in out.columns))
    det = all(i.deterministic for k, i in infos.items() if k != node.body_input)
    return NodeInfo(src.columns, INSERT, src.stream, True, src.watermarks, det, src.names)


def _body_order(rec: Recursive) -> list[str]:
    """Body node ids, inputs first (the looped stream excluded)."""
    graph = {b.id: tuple(i for i in b.inputs if i != rec.body_input) for b in rec.body}
    return topological_order(graph)


@compare.register
def _compare(old: Recursive, new: Recursive, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    if _body_key(old) != _body_key(new):
        out.append(ctx.f("recursive-body-changed", f"the body of recursive step '{new.id}' "
                         "changed; rows already in the loop were computed by the old body",
                         old, new, "body"))
    if old.feedback.partitions != new.feedback.partitions:
        out.append(ctx.f("recursive-feedback-changed", f"the feedback topic of '{new.id}' "
                         f"goes from {old.feedback.partitions} to {new.feedback.partitions} "
                         "partitions", old, new, "feedback/partitions"))
    return out


def _body_key(rec: Recursive) -> tuple:
    """The body in a form independent of ids and formatting (topological, canonical)."""
    body = {b.id: b for b in rec.body}
    order: dict[str, int] = {rec.body_input: -1}
    items = []
    for bid in _body_order(rec):
        b = body[bid]
        order[bid] = len(order)
        items.append((b.version, tuple(order[i] for i in b.inputs), b.canonical(),
                      bid == rec.body_output))
    return tuple(items)
