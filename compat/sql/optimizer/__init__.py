"""The optimizer: rules applied in the fixed order of ``RULES``.

Each rule is a plain function ``(graph) -> graph`` in its own module that never mutates its
input (it copies the graph and changes the copy), as in sqlglot's ``optimizer/``.  A script
can leave rules out with ``SET theseus.optimizer.excluded_rules = 'rule,rule'``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from compat.sql.ir import Graph
from compat.sql.optimizer.constant_folding import constant_folding
from compat.sql.optimizer.merge_projects import merge_projects
from compat.sql.optimizer.predicate_pushdown import predicate_pushdown
from compat.sql.optimizer.prune_columns import prune_columns

Rule = Callable[[Graph], Graph]

#: in order: folding first makes pushed predicates simpler; projections merge once filters
#: have moved through them; pruning comes last, when every use is final
RULES: tuple[tuple[str, Rule], ...] = (
    ("constant_folding", constant_folding),
    ("predicate_pushdown", predicate_pushdown),
    ("merge_projects", merge_projects),
    ("prune_columns", prune_columns),
)


def optimize(graph: Graph, names: Iterable[str] | None = None) -> Graph:
    """Apply the named rules (all by default) in ``RULES`` order."""
    wanted = set(names) if names is not None else {n for n, _ in RULES}
    for name, rule in RULES:
        if name in wanted:
            graph = rule(graph)
    return graph


__all__ = ["RULES", "Rule", "optimize"]
