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
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from compat import expr as E
from compat.infer import duration_seconds
from compat.model import Node, Plan
from compat.steps.source import CHANGELOG_VERSION, table_read

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


@dataclass(frozen=True)
class NodeSig:
    """A node's signature, its output columns' tokens by lower-case name, and, for a filter,
    the conjuncts of the chain of filters it ends and the signature below that chain."""

    sig: str
    columns: Mapping[str, str]
    conjuncts: frozenset[str] = frozenset()
    base: str = ""


def _h(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode("utf-8", "backslashreplace")).hexdigest()


def _token(*parts: Any) -> str:
    return "$" + _h(*parts)[:20]


# -- expressions over column tokens -------------------------------------------------------------

Resolver = Callable[[tuple[str, ...]], tuple[str, ...] | None]


def _subst(ast: Any, resolve: Resolver, bound: frozenset[str] = frozenset()) -> Any:
    """``ast`` with every column reference that ``resolve`` knows replaced by its token (the
    rest of a dotted reference, a struct field, kept); lambda parameters stay as written."""
    tag = ast[0]
    if tag == "col":
        parts = ast[1]
        if parts[0] in bound:
            return ast
        new = resolve(parts)
        return ast if new is None else ("col", new)
    if tag == "lambda":
        return ("lambda", ast[1], _subst(ast[2], resolve, bound | frozenset(ast[1])))
    if tag == "field":  # ``f(x).a``: the field name is data, the inner part an expression
        return ("field", _subst(ast[1], resolve, bound), ast[2])
    out: list[Any] = [tag]
    for part in ast[1:]:
        out.append(_subst_part(part, resolve, bound))
    return tuple(out)


def _subst_part(part: Any, resolve: Resolver, bound: frozenset[str]) -> Any:
    if isinstance(part, tuple) and part:
        if isinstance(part[0], str):
            return _subst(part, resolve, bound) if part[0] in E._TAGS else part
        return tuple(_subst_part(p, resolve, bound) for p in part)
    return part


def _by_name(columns: Mapping[str, str]) -> Resolver:
    def resolve(parts: tuple[str, ...]) -> tuple[str, ...] | None:
        tok = columns.get(parts[0])
        return None if tok is None else (tok,) + parts[1:]
    return resolve


def _canon_ast(text: str, resolve: Resolver) -> Any:
    return E.normalize(_subst(E.parse(text), resolve))


def _canon(text: str, resolve: Resolver) -> str:
    if text.strip() == "*":
        return "*"
    return E.render(_canon_ast(text, resolve))


def _expr_token(text: str, resolve: Resolver) -> str:
    """The token of a computed column: a bare column keeps its token (a rename is free)."""
    ast = _canon_ast(text, resolve)
    if ast[0] == "col" and len(ast[1]) == 1 and ast[1][0].startswith("$"):
        return ast[1][0]
    return _token("expr", E.render(ast))


def _conjuncts(ast: Any) -> list[Any]:
    if ast[0] == "bin" and ast[1] == "and":
        return _conjuncts(ast[2]) + _conjuncts(ast[3])
    return [ast]


def _duration(text: str | None) -> Any:
    if text is None:
        return None
    s = duration_seconds(text)
    return s if s is not None else " ".join(text.lower().split())


def _type(t: str) -> str:
    return "".join(t.lower().split())


# -- per step -----------------------------------------------------------------------------------


def _node_sig(node: Node, ins: list[NodeSig], names: tuple[str, ...], plan: Plan) -> NodeSig:
    step = node.step
    v = node.version
    if step == "source":
        schema = tuple(sorted((c.name.lower(), _type(c.type), c.nullable)
                              for c in node.schema))  # type: ignore[attr-defined]
        et = node.event_time  # type: ignore[attr-defined]
        sig = _h("source", v, node.topic, node.format, node.role,  # type: ignore[attr-defined]
                 schema, tuple(k.lower() for k in node.key_columns),  # type: ignore[attr-defined]
                 (et.column.lower(), _duration(et.watermark)) if et else None,
                 node.starting_offsets,  # type: ignore[attr-defined]
                 # how a version 2 table is read (version 1 hashes as it always did)
                 *((table_read(node),) if v >= CHANGELOG_VERSION else ()))  # type: ignore
        return NodeSig(sig, {c.name.lower(): _token(sig, c.name.lower())
                             for c in node.schema})  # type: ignore[attr-defined]
    if step in ("stop_gate", "start_gate"):
        return ins[0]  # a gate changes when rows flow, not what they are
    if step == "filter":
        (src,) = ins
        ast = _canon_ast(node.predicate, _by_name(src.columns))  # type: ignore[attr-defined]
        own = frozenset((v, E.render(c)) for c in _conjuncts(ast))
        det = E.is_deterministic(ast)
        up = plan.nodes[node.inputs[0]]
        # Deterministic filters commute: a chain of them is one set of conjuncts.
        if det and src.conjuncts and up.step == "filter":
            conj, base = src.conjuncts | own, src.base
        else:
            conj, base = own, src.sig
        conj = conj if det else frozenset()
        sig = _h("filter", base, tuple(sorted(conj or own)), det)
        return NodeSig(sig, src.columns, conj, base)
    if step == "project":
        (src,) = ins
        r = _by_name(src.columns)
        cols = {c.name.lower(): _expr_token(c.expr, r)
                for c in node.columns}  # type: ignore[attr-defined]
        sig = _h("project", v, src.sig, tuple(sorted(cols.values())))
        return NodeSig(sig, cols)
    if step == "aggregate":
        (src,) = ins
        r = _by_name(src.columns)
        cols: dict[str, str] = {}
        w = node.window  # type: ignore[attr-defined]
        wkey = None
        if w is not None:
            wkey = (w.type, src.columns.get(w.column.lower(), w.column.lower()),
                    _duration(w.size), _duration(w.slide), _duration(w.gap))
            cols["window"] = _token("window", wkey)
        groups = []
        for g in node.group_by:  # type: ignore[attr-defined]
            tok = _expr_token(g.expr, r)
            groups.append(tok)
            cols[g.name.lower()] = tok
        aggs = []
        for a in node.aggregates:  # type: ignore[attr-defined]
            fn = {"mean": "avg", "std": "stddev"}.get(a.function.lower(), a.function.lower())
            tok = _token("agg", fn, a.distinct, tuple(_canon(x, r) for x in a.args))
            aggs.append(tok)
            cols[a.name.lower()] = tok
        sig = _h("aggregate", v, src.sig, wkey, tuple(sorted(groups)), tuple(sorted(aggs)))
        return NodeSig(sig, cols)
    if step == "explode":
        (src,) = ins
        tok = _token("explode", _canon(node.expr, _by_name(src.columns)),  # type: ignore[attr-defined]
                     node.outer)  # type: ignore[attr-defined]
        sig = _h("explode", v, src.sig, tok)
        return NodeSig(sig, {**src.columns, node.alias.lower(): tok})  # type: ignore[attr-defined]
    if step == "deduplicate":
        (src,) = ins
        keys = tuple(sorted(src.columns.get(k.lower(), k.lower())
                            for k in node.keys))  # type: ignore[attr-defined]
        sig = _h("deduplicate", v, src.sig, keys, _duration(node.within))  # type: ignore[attr-defined]
        return NodeSig(sig, src.columns)
    if step == "top_n":
        (src,) = ins
        r = _by_name(src.columns)
        part = tuple(sorted(_canon(p, r) for p in node.partition_by))  # type: ignore[attr-defined]
        order = tuple((_canon(o.expr, r), o.desc) for o in node.order_by)  # type: ignore[attr-defined]
        sig = _h("top_n", v, src.sig, part, order, node.n)  # type: ignore[attr-defined]
        return NodeSig(sig, src.columns)
    if step == "union":
        # Inputs line up by name (the same names in the same order); a union of the same
        # inputs in another order is the same rows.
        first = names or tuple(ins[0].columns)
        cols = {n.lower(): _token("union", tuple(sorted(i.columns.get(n.lower(), "?")
                                                        for i in ins)))
                for n in first}
        sig = _h("union", v, tuple(sorted(i.sig for i in ins)), tuple(sorted(cols.values())))
        return NodeSig(sig, cols)
    if step == "join":
        return _join_sig(node, ins, plan)
    if step == "sink":
        (src,) = ins
        out = tuple(sorted((n.lower(), src.columns.get(n.lower(), "?")) for n in names))
        keys = tuple(k.lower() for k in node.key_columns)  # type: ignore[attr-defined]
        sig = _h("sink", v, src.sig, out, keys, node.format, node.mode,  # type: ignore[attr-defined]
                 node.delivery)  # type: ignore[attr-defined]
        return NodeSig(sig, src.columns)
    # A step without a rule here (recursive): its canonical form as the step says it, and
    # its output columns by name.
    sig = _h(step, v, tuple(i.sig for i in ins), repr(node.canonical()))
    return NodeSig(sig, {n.lower(): _token(sig, n.lower()) for n in names})


def _join_sig(node: Any, ins: list[NodeSig], plan: Plan) -> NodeSig:
    from compat.steps.join import join_output

    left, right = ins
    lid, rid = (i.lower() for i in node.inputs)
    # Both inputs may be the same subplan (a self-join): tag each side's tokens.
    lt = {n: _token("left", t) for n, t in left.columns.items()}
    rt = {n: _token("right", t) for n, t in right.columns.items()}
    both = {**{k: t for k, t in rt.items() if k not in lt},
            **{k: t for k, t in lt.items() if k not in rt}}

    def qualified(parts: tuple[str, ...]) -> tuple[str, ...] | None:
        if len(parts) > 1 and parts[0] in (lid, rid):
            side = lt if parts[0] == lid else rt
            if parts[1] in side:
                return (side[parts[1]],) + parts[2:]
        tok = both.get(parts[0])
        return None if tok is None else (tok,) + parts[1:]

    keys = tuple(sorted((_canon(lk, _by_name(lt)), _canon(rk, _by_name(rt)))
                        for lk, rk in zip(node.left_keys, node.right_keys)))
    cond = _canon(node.condition, qualified) if node.condition else None
    bound = _canon(node.time_bound, qualified) if node.time_bound else None
    sig = _h("join", node.version, node.type, left.sig, right.sig, keys, cond, bound)
    lnames = plan.info[node.inputs[0]].names if plan.info else tuple(left.columns)
    rnames = plan.info[node.inputs[1]].names if plan.info else tuple(right.columns)
    cols = {}
    for name, side, col in join_output(node, lnames, rnames):
        cols[name.lower()] = (lt if side == "left" else rt)[col.lower()]
    return NodeSig(sig, cols)


# -- API -----------------------------------------------------------------------------------------


def node_signatures(plan: Plan) -> dict[str, NodeSig]:
    """Every node's ``NodeSig``, in the plan's topological order."""
    out: dict[str, NodeSig] = {}
    for nid, node in plan.nodes.items():
        info = plan.info.get(nid) if plan.info else None
        names = tuple(info.names or (c for c, _ in info.columns)) if info else ()
        out[nid] = _node_sig(node, [out[i] for i in node.inputs], names, plan)
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
            if node.step == "source":
                out[node.topic] += 1  # type: ignore[attr-defined]
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
        topics = sorted({plan.nodes[n].topic for n in nodes  # type: ignore[attr-defined]
                         if plan.nodes[n].step == "source"})
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
