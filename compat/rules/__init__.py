"""Compatibility rules, one module per rule family.

Each rule is a plain function ``(old_node, new_node, ctx) -> list[Finding]`` that never
mutates the plans.  The rule of one step type (what must match between an old and a new
step of that type) is registered with ``compare`` in the step's module under
``compat/steps/``; the families that span step types (versions, passive paths, moved
predicates, output schema and changelog, plan config) live in this package.
``compat.check`` applies them in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import singledispatch
from typing import Any

from compat import expr as E
from compat.findings import Finding, finding
from compat.infer import NodeInfo
from compat.model import Node, Plan


@dataclass
class RuleContext:
    old: Plan
    new: Plan
    require: frozenset[str] = frozenset()
    schema_compat: str = "forward"
    #: set by the walk for passive rules: the change sits upstream of state
    upstream_of_state: bool = False
    #: set by the walk: the enforcing step that consumes the passive path
    consumer: tuple[Node | None, Node | None] = (None, None)
    #: set by the walk with ``upstream_of_state``: the nearest stateful step downstream
    state: Node | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    def oi(self, node: Node) -> NodeInfo:
        return self.old.info[node.id]

    def ni(self, node: Node) -> NodeInfo:
        return self.new.info[node.id]

    def oi_input(self, node: Node, i: int = 0) -> NodeInfo:
        return self.old.info[node.inputs[i]]

    def ni_input(self, node: Node, i: int = 0) -> NodeInfo:
        return self.new.info[node.inputs[i]]

    def f(self, code: str, message: str, old: Node | None, new: Node | None,
          old_field: str | None = None, new_field: str | None = None,
          **kw: Any) -> Finding:
        if new_field is None:
            new_field = old_field
        return finding(
            code, message, old=old, new=new,
            old_pointer=self.old.pointer(old.id, old_field) if old is not None else None,
            new_pointer=self.new.pointer(new.id, new_field) if new is not None else None,
            **kw)


def canon(text: str | None) -> str | None:
    """Canonical form of an optional expression string."""
    return None if text is None else E.canonical(text)


def canon_list(items: tuple[str, ...] | list[str]) -> list[str]:
    return [E.canonical(x) for x in items]


@singledispatch
def compare(old: Node, new: Node, ctx: RuleContext) -> list[Finding]:
    """What differs between an old and a new step of the same type, as findings.  Every
    step type registers its own (``@compare.register``)."""
    raise NotImplementedError(f"no compatibility rule is registered for step '{new.step}'")
