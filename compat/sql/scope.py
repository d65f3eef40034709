"""The relations the SQL translator builds: a step's id and the columns in scope over it.

Shared by :mod:`compat.sql.translate` and :mod:`compat.sql.recursive`, which translates a
recursive CTE for it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScopeCol:
    """A column visible to expressions: how SQL names it and what the step outputs."""

    qualifier: str | None  # lower-case table name or alias
    name: str  # as declared / aliased
    physical: str  # the name in the step's output
    side: str | None = None  # ir.LEFT / ir.RIGHT while resolving a join's ON
    hidden: bool = False  # made by explode() in the SELECT list: not part of ``*``


@dataclass
class Rel:
    """A relation under construction: the step producing it and its columns in scope."""

    id: str
    cols: list[ScopeCol]

    def requalify(self, qualifier: str | None) -> Rel:
        q = qualifier.lower() if qualifier else None
        return Rel(self.id, [ScopeCol(q, c.name, c.physical) for c in self.cols])


def column_names(rel: Rel) -> list[str]:
    """The physical names of ``rel``'s columns, in order, each once."""
    seen: list[str] = []
    for c in rel.cols:
        if c.physical not in seen:
            seen.append(c.physical)
    return seen
