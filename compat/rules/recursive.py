"""Recursion: the body is compared as a whole (its state and its feedback topic)."""

from __future__ import annotations

from compat import expr as E
from compat.findings import Finding
from compat.model import Filter, Node, Project, Recursive
from compat.rules import RuleContext


def check_recursive(old: Recursive, new: Recursive, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    if _body_key(old) != _body_key(new):
        out.append(ctx.f("recursive-body-changed", f"the body of recursive step '{new.id}' "
                         "changed; rows already in the loop were computed by the old body",
                         old, new, "body"))
    if old.feedback_partitions != new.feedback_partitions:
        out.append(ctx.f("recursive-feedback-changed", f"the feedback topic of '{new.id}' "
                         f"goes from {old.feedback_partitions} to {new.feedback_partitions} "
                         "partitions", old, new, "feedback/partitions"))
    return out


def _body_key(rec: Recursive) -> tuple:
    """The body in a form independent of ids and formatting (topological, canonical)."""
    order: dict[str, int] = {rec.body_input: -1}
    items = []
    pending = list(rec.body)
    while pending:
        for b in list(pending):
            if all(i in order for i in b.inputs):
                order[b.id] = len(order)
                items.append((b.step, b.version, tuple(order[i] for i in b.inputs),
                              _content(b), b.id == rec.body_output))
                pending.remove(b)
    return tuple(items)


def _content(n: Node) -> tuple:
    if isinstance(n, Filter):
        return (E.canonical(n.predicate),)
    if isinstance(n, Project):
        return tuple((c.name.lower(), E.canonical(c.expr)) for c in n.columns)
    return n.content()
