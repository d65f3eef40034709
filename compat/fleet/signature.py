"""Signatures of subplans and the subplans that queries of a fleet compute in common.

NebulaStream merges queries of its global plan that compute the same thing; Theseus finds
them with **signatures**.  The signature of a node is a hash (SHA-256, hex) of the canonical
form of its subplan: the node and everything upstream of it.  What counts:

- step types and versions, source topics with their format, role, declared schema (as a set
  of ``(name, type, nullable)``), key columns, event time and starting offsets;
- expressions in canonical form (``compat.expr.canonical``: case, whitespace, redundant
  parentheses, commutative operand order and comparison direction do not matter, so
  ``a+b > 3`` and ``3 < b + a`` are equal); a filter's predicate as a *set* of conjuncts, and
  consecutive deterministic filters as one set (``WHERE a AND b`` equals a filter on ``b``
  after a filter on ``a``);
- aggregates (function, distinct, arguments), grouping keys and windows; join types, key
  pairs, conditions and time bounds; union, explode, deduplicate, top-n semantics.

What does not count: node ids, query names, descriptions, ``x-*`` keys, formatting, source
partition counts, and **aliases**.  Column references are resolved to *column tokens* that
name what a column computes (a source column is its topic's column; a projected column is
the canonical expression over its input's tokens; an aggregate is its call), so two queries
that project ``a + b`` as ``total`` and as ``sum_ab`` compute the same relation and get the
same signature: a shared subplan's consumers rename its columns with a project.  Column
*order* does not count where records are read by name (a project's or a source schema's
columns); it counts in sort orders and join key pairs' pairing.  Names count only where they
are data: a source's column names (the JSON keys it reads) and a sink's (the JSON keys it
writes), which is why **complete** sharing, two whole queries equal, compares sinks by output
names, key columns, format, mode and delivery, and only the topic is ignored.

Signatures are structural: two queries that both compute ``rand() < 0.5`` get the same one.
``shared_subplans`` does not offer a subplan with a nondeterministic step for sharing.

What of a step counts is said in the step's own module (``@sign_step.register``, over the
helpers of ``compat.signing``); this module chains those registrations over a plan and finds
the subplans that queries share.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from compat.model import Plan
from compat.signing import NodeSig, sign_step
from compat.steps import Source

#: how many hex digits of a signature name it in messages and internal topics
SHORT = 12


@dataclass(frozen=True)
class Shared:
    """A subplan computed by two or more queries.

    ``kind`` is ``complete`` (whole queries equal, sinks included but for their topic) or
    ``partial`` (a common prefix from the sources, maximal: no larger subplan is shared by the
    same queries).  ``members`` are ``(query, node id)`` pairs, the node being the top of the
    subplan in that query (its sink for a complete one); ``steps`` counts the subplan's
    nodes; ``topics`` are the source topics it reads; ``deterministic`` says every step of it
    is (only a deterministic one can be computed once for all)."""

    signature: str
    kind: str
    members: tuple[tuple[str, str], ...]
    steps: int
    topics: tuple[str, ...]
    deterministic: bool = True

    @property
    def queries(self) -> tuple[str, ...]:
        return tuple(sorted({q for q, _ in self.members}))

    @property
    def short(self) -> str:
        return self.signature[:SHORT]


# -- API -----------------------------------------------------------------------------------------


def node_signatures(plan: Plan) -> dict[str, NodeSig]:
    """Every node's ``NodeSig``, in the plan's topological order."""
    out: dict[str, NodeSig] = {}
    for nid, node in plan.nodes.items():
        info = plan.info.get(nid) if plan.info else None
        names = tuple(info.names or (c for c, _ in info.columns)) if info else ()
        out[nid] = sign_step(node, [out[i] for i in node.inputs], names, plan)
    return out


def signatures(plan: Plan) -> dict[str, str]:
    """The signature of every node's subplan (the node and everything upstream of it)."""
    return {nid: s.sig for nid, s in node_signatures(plan).items()}


def upstream(plan: Plan, node_id: str) -> set[str]:
    """``node_id`` and every node it reads from, transitively."""
    seen = {node_id}
    stack = [node_id]
    while stack:
        for i in plan.nodes[stack.pop()].inputs:
            if i not in seen:
                seen.add(i)
                stack.append(i)
    return seen


def source_reads(plans: Mapping[str, Plan]) -> dict[str, int]:
    """How many times each topic is read by the sources of the fleet's queries."""
    out: dict[str, int] = defaultdict(int)
    for plan in plans.values():
        for node in plan.nodes.values():
            if isinstance(node, Source):
                out[node.topic] += 1
    return dict(sorted(out.items()))


def shared_subplans(plans: Mapping[str, Plan]) -> list[Shared]:
    """The subplans that two or more queries compute: complete ones (whole queries equal but
    for the sink's topic) and maximal partial ones (a common prefix from the sources).

    A partial subplan is reported when no larger shared subplan contains it in *every*
    query that has it: if queries A, B and C share a filter and only A and B share the
    projection after it too, both are reported (the filter for A, B, C; filter and
    projection for A and B).  A source alone is not a shared subplan (``source_reads``
    counts how many times each topic is read); neither is a subplan inside one query only."""
    by_sig: dict[str, list[tuple[str, str]]] = defaultdict(list)
    sigs: dict[str, dict[str, str]] = {}
    for q in sorted(plans):
        plan = plans[q]
        sigs[q] = signatures(plan)
        for nid, s in sigs[q].items():
            if plan.nodes[nid].step != "source":
                by_sig[s].append((q, nid))
    groups = {s: sorted(m) for s, m in by_sig.items() if len({q for q, _ in m}) >= 2}
    ups: dict[tuple[str, str], set[str]] = {}

    def up(q: str, nid: str) -> set[str]:
        key = (q, nid)
        if key not in ups:
            ups[key] = upstream(plans[q], nid)
        return ups[key]

    out = []
    for s, members in groups.items():
        queries = {q for q, _ in members}
        dominated = False
        for s2, members2 in groups.items():
            if s2 == s or not queries <= {q for q, _ in members2}:
                continue
            # Every member of s lies inside some member of s2 of the same query.
            if all(any(q2 == q and nid != n2 and nid in up(q2, n2) for q2, n2 in members2)
                   for q, nid in members):
                dominated = True
                break
        if dominated:
            continue
        q0, n0 = members[0]
        plan = plans[q0]
        nodes = up(q0, n0)
        topics = sorted({node.topic for node in (plan.nodes[n] for n in nodes)
                         if isinstance(node, Source)})
        det = all(plan.info[n].deterministic for n in nodes) if plan.info else True
        kind = "complete" if plan.nodes[n0].step == "sink" else "partial"
        out.append(Shared(s, kind, tuple(members), len(nodes), tuple(topics), det))
    out.sort(key=lambda sh: (sh.kind != "complete", -len(sh.queries), -sh.steps,
                             sh.members))
    return out


def describe(shared: Iterable[Shared]) -> list[str]:
    """One line per shared subplan, for text output."""
    lines = []
    for sh in shared:
        where = ", ".join(f"{q}:{n}" for q, n in sh.members)
        lines.append(f"{sh.kind} {sh.short} ({sh.steps} steps over "
                     f"{', '.join(sh.topics)}): {where}")
    return lines
