"""Column demand: which columns of its inputs each step reads, from the sink back to the
sources.

The sink reads every column it writes; every other step says, through its ``reads``
registration (in its own module under ``compat/steps/``), which columns of each input it
needs for the columns demanded of its output, plus what it reads itself (predicates, keys,
group keys, aggregate arguments, join conditions, windows...).  Spark's optimizer computes
the same thing (``ColumnPruning``) and carries nothing else: a column that nothing above a
step reads never reaches it.  Three users share this one statement of it:

- the SQL compiler's ``prune_columns`` rule, which rewrites a plan to read only what it
  uses;
- the fleet's contract across a topic (``compat.fleet.contract``): which declared columns
  a consumer really reads;
- the state rules: the columns a stateful step receives, and so keeps in state, are the
  ones demanded of its inputs (``demand_at``; a stream-stream join's ``state_rows``), never
  the declared source schema.

A demand maps a lower-case column name to the ids of the steps that read it (for
messages: "read by 'f', 'agg'").

Spark also moves filters down before it prunes (``PushDownPredicates``,
``PushPredicateThroughJoin``): a deterministic conjunct of a filter above a join that reads
one side's columns only is evaluated below the join, so the columns only it reads never
reach the join's state.  Each step says, through its ``moves_filter`` registration, whether
and where Spark moves such a conjunct through it; ``demand_at`` is the demand on a step's
output with the conjuncts Spark evaluates below the step left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import singledispatch

from compat import expr as E
from compat.infer import NodeInfo
from compat.model import Node, Plan

#: per output column (lower-case), the ids of the steps that read it downstream
Demand = dict[str, set[str]]


@singledispatch
def reads(node: Node, demand: Demand, ins: list[NodeInfo]) -> list[Demand]:
    """What each input of ``node`` must provide for ``demand`` on its output: one demand
    per input, in input order.  Every step type registers its own (``@reads.register``
    in its module); ``tests/test_steps.py`` fails for a step without one."""
    raise NotImplementedError(f"no column demand is registered for step '{node.step}'")


@singledispatch
def moves_filter(node: Node, conjunct: str, ins: list[NodeInfo], above: Sequence[str]
                 ) -> list[tuple[int, str]] | None:
    """Where Spark's optimizer moves a deterministic filter ``conjunct`` (text over
    ``node``'s output) sitting on ``node``: the inputs it goes into, each with the conjunct
    rewritten over that input's columns; None when it stays above ``node``.  ``above`` are
    all the conjuncts that sit directly on ``node`` (they may change it: an outer join whose
    null-padded side they reject is an inner one to Spark).  Every step type registers its
    own (``@moves_filter.register``).

    This is what Spark does to the query Theseus builds, to know which columns reach its
    stateful operators; ``compat.pushdown.push_through`` is what the SQL compiler may do to
    a plan it writes (a stricter rule: it moves nothing that would change a state)."""
    raise NotImplementedError(f"no filter movement is registered for step '{node.step}'")


# -- helpers for the registrations -----------------------------------------------------------


def columns(info: NodeInfo) -> list[str]:
    return [c[0] for c in info.columns]


def refs(text: str, cols: Iterable[str]) -> set[str]:
    """The input columns (lower-case) that an expression reads: ``a`` and ``a.f`` (a field
    of ``a``) read ``a``; ``x.a`` (qualified by an input's id) reads ``a``."""
    try:
        found = E.analyze(text).columns
    except Exception:  # noqa: BLE001 - a validated plan parses; be safe: read everything
        return set(cols)
    names = set(cols)
    got = set()
    for parts in found:
        if parts[0] in names:
            got.add(parts[0])
        elif len(parts) > 1 and parts[1] in names:
            got.add(parts[1])
    return got


def own(node: Node, cols: Iterable[str]) -> Demand:
    """``cols`` read by ``node`` itself."""
    return {c: {node.id} for c in cols}


def merge(*ds: Demand) -> Demand:
    out: Demand = {}
    for d in ds:
        for c, who in d.items():
            out.setdefault(c, set()).update(who)
    return out


def everything(node: Node, ins: list[NodeInfo]) -> list[Demand]:
    """Every column of every input, read by ``node`` (a sink; a step that passes whole
    rows to a function of its own)."""
    return [own(node, columns(i)) for i in ins]


# -- the driver ---------------------------------------------------------------------------------


def propagate(order: list[str], nodes: Mapping[str, Node], info: Callable[[str], NodeInfo],
              adjust: Callable[[str, Demand], Demand] | None = None,
              widen: Callable[[str, list[Demand], list[NodeInfo]], list[Demand]] | None = None
              ) -> dict[str, Demand]:
    """The demand on every node's output, for nodes in ``order`` (inputs first): each node,
    consumers before their inputs, adds what its ``reads`` says to its inputs' demands.
    A rewrite that keeps more than is read says so: ``adjust`` may change the demand on a
    node before its ``reads`` is asked, ``widen`` what it then asks of its inputs."""
    out: dict[str, Demand] = {nid: {} for nid in order}
    for nid in reversed(order):
        node = nodes[nid]
        if not node.inputs:
            continue
        if adjust is not None:
            out[nid] = adjust(nid, out[nid])
        ins = [info(i) for i in node.inputs]
        needs = reads(node, out[nid], ins)
        if widen is not None:
            needs = widen(nid, needs, ins)
        for i, need in zip(node.inputs, needs):
            acc = out[i]
            for col, who in need.items():
                acc.setdefault(col, set()).update(who)
    return out


def demanded(plan: Plan) -> dict[str, Demand]:
    """For every node of ``plan``, the output columns that something downstream reads,
    each with the steps that read it (computed once per plan)."""
    cached = plan.derived.get("demand")
    if cached is None:
        cached = plan.derived["demand"] = propagate(list(plan.nodes), plan.nodes,
                                                    plan.info.__getitem__)
    return cached


def demand_at(plan: Plan, nid: str) -> Demand:
    """The demand on ``nid``'s output as Spark plans the query: the filter conjuncts that
    Spark's optimizer moves below ``nid`` (``moves_filter``) are evaluated there, so the
    columns only they read are not carried up through ``nid``."""
    moved = _moved_below(plan, nid)
    if not moved:
        return demanded(plan)[nid]
    nodes = dict(plan.nodes)
    for fid, gone in moved.items():
        f = nodes[fid]
        kept = [c for i, c in enumerate(E.conjuncts(f.row_predicate() or "true"))
                if i not in gone]
        # (the step that keeps rows by a predicate is a filter: its field is ``predicate``)
        nodes[fid] = replace(f, predicate=" AND ".join(  # type: ignore[call-arg]
            f"({c})" for c in kept) or "true")
    return propagate(list(plan.nodes), nodes, plan.info.__getitem__)[nid]


def _moved_below(plan: Plan, nid: str) -> dict[str, set[int]]:
    """The filters' conjuncts (filter id -> conjunct indexes) that Spark moves below
    ``nid``: each deterministic conjunct is followed down from its filter, step by step, as
    far as ``moves_filter`` takes it; where conjuncts come to rest decides how far others
    go (an outer join they turn inner), so the walk is repeated until that settles."""
    start: list[tuple[str, int, str]] = []
    for fid, f in plan.nodes.items():
        pred = f.row_predicate()
        if pred is not None:
            start += [(fid, i, c) for i, c in enumerate(E.conjuncts(pred))
                      if E.analyze(c).deterministic]
    if not start:
        return {}
    above: dict[str, list[str]] = {}
    crossed: dict[tuple[str, int], set[str]] = {}
    for _ in range(len(plan.nodes) + 1):
        crossed = {}
        rest: dict[str, list[str]] = {}
        for fid, i, text in start:
            passed = crossed.setdefault((fid, i), set())
            todo = [(plan.nodes[fid].inputs[0], text)]
            while todo:
                at, conj = todo.pop()
                node = plan.nodes[at]
                moves = moves_filter(node, conj, [plan.info[x] for x in node.inputs],
                                     above.get(at, ()))
                if moves is None:
                    rest.setdefault(at, []).append(conj)
                    continue
                passed.add(at)
                todo += [(node.inputs[k], c) for k, c in moves]
        # What rested on a step once changed it for good (Spark rewrote the join): the
        # conjuncts on a step only grow, so this settles.
        grown = {at: sorted(set(above.get(at, ())) | set(cs)) for at, cs in rest.items()}
        grown = {**above, **grown}
        if grown == above:
            break
        above = grown
    out: dict[str, set[int]] = {}
    for (fid, i), passed in crossed.items():
        if nid in passed:
            out.setdefault(fid, set()).add(i)
    return out


__all__ = ["Demand", "columns", "demand_at", "demanded", "everything", "merge",
           "moves_filter", "own", "propagate", "reads", "refs"]
