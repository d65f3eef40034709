"""Predicate pushdown, per step: the registry ``push_through``.

The SQL compiler's ``predicate_pushdown`` rule (``compat.sql.optimizer``) moves a filter's
conjuncts below the step under it, one step at a time.  Whether a conjunct may pass a step,
into which of its inputs and rewritten how, is the step's to say: each step type registers
with ``push_through`` a function ``(step, conjunct, graph) -> targets`` giving the inputs the
conjunct goes into, each with the conjunct rewritten over that input's columns, or None when
it must stay above the step.  A step that no conjunct may pass says so in its registration.

The conjuncts are the rule's sqlglot trees; a step sees them only through ``Conjunct`` and
the graph only through ``PushGraph``, so that the step modules (and ``theseus check`` on a
JSON plan, which imports them) never import sqlglot.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import singledispatch
from typing import Protocol

from compat.model import Node


class Conjunct(Protocol):
    """One conjunct of a filter's predicate, over the output columns of the step it sits on."""

    @property
    def used(self) -> frozenset[str]:
        """The lower-case names of the columns it reads."""

    def substitute(self, exprs: Mapping[str, str]) -> Conjunct:
        """The conjunct with each column named in ``exprs`` (case-insensitively) replaced by
        that expression (Spark SQL text)."""

    def rename(self, names: Mapping[str, str]) -> Conjunct:
        """The conjunct with each column named in ``names`` renamed to the name it maps to."""


class PushGraph(Protocol):
    """The compiler's graph as a step's pushdown reads it."""

    def columns(self, step_id: str) -> list[str]:
        """The output column names of ``step_id``."""

    def is_stateful(self, step_id: str) -> bool:
        """Whether ``step_id`` keeps state (a join of two streams does)."""

    def deterministic(self, expr: str) -> bool:
        """Whether the expression gives the same result on every run."""

    def bare_column(self, expr: str) -> str | None:
        """The name when the expression is a plain unqualified column, else None."""


#: where a conjunct goes: ``(input id, the conjunct over that input)`` pairs
Targets = list[tuple[str, Conjunct]]


@singledispatch
def push_through(step: Node, c: Conjunct, g: PushGraph) -> Targets | None:
    """Where conjunct ``c`` over ``step``'s output may go below ``step``, or None when it
    stays above.  Every step type registers its own (``@push_through.register``)."""
    raise NotImplementedError(f"no predicate pushdown is registered for step '{step.step}'")


__all__ = ["Conjunct", "PushGraph", "Targets", "push_through"]
