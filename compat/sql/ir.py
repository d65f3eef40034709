"""The compiler's graph: ``compat.model`` steps under construction, and sqlglot helpers.

The translator and the optimizer build the very steps a plan holds (``compat.steps``), with
expressions as Spark SQL text; a rule that rewrites an expression parses it (``parse``,
cached), changes the tree and writes it back as text (``sql``).  What a step outputs (its
columns, watermarks, whether it reads a stream or keeps state) is asked of
``compat.infer``, the same inference that validates plans, so the compiler and the checker
cannot disagree.  In a join's ``condition`` and ``time_bound`` columns are qualified by the
join's input ids, as in plans; ``Graph.rewire`` requalifies them when an input changes.

A ``Graph`` is the steps by id, the sink id and, for error messages, where each step came
from in the SQL text.  Optimizer rules never mutate a graph: they ``copy()`` it and change
the copy.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import sqlglot
from sqlglot import exp

from compat import expr as E
from compat.errors import PlanError
from compat.infer import GraphInference, NodeInfo
from compat.model import Node, map_expressions, topological_order
from compat.sql.text import Span

#: qualifiers of the two inputs while the translator resolves a join's ON clause
LEFT = "__left__"
RIGHT = "__right__"
DIALECT = "spark"


# -- the graph ------------------------------------------------------------------------------


@dataclass
class Graph:
    """Steps by id (any order; ``order()`` gives inputs first), the sink, and origins."""

    steps: dict[str, Node] = field(default_factory=dict)
    sink: str = ""
    #: where in the SQL text each step came from, for error messages
    origins: dict[str, Span] = field(default_factory=dict)
    #: what an invalid step becomes (the translator's SQL error at the step's origin)
    on_error: Callable[[Graph, PlanError], Exception] | None = None
    #: shared by copies: inference is memoised per step object
    inference: GraphInference = field(default_factory=GraphInference)

    def copy(self) -> Graph:
        return Graph(dict(self.steps), self.sink, dict(self.origins), self.on_error,
                     self.inference)

    def __getitem__(self, step_id: str) -> Node:
        return self.steps[step_id]

    def add(self, step: Node, origin: Span | None = None) -> Node:
        if step.id in self.steps:
            raise ValueError(f"duplicate step id {step.id!r}")  # a compiler bug
        self.steps[step.id] = step
        if origin is not None:
            self.origins[step.id] = origin
        return step

    def put(self, step: Node) -> None:
        """Replace the step with the same id."""
        self.steps[step.id] = step

    def remove(self, step_id: str) -> None:
        del self.steps[step_id]
        self.origins.pop(step_id, None)

    def consumers(self, step_id: str) -> list[str]:
        return [s.id for s in self.steps.values() if step_id in s.inputs]

    def fresh_id(self, prefix: str) -> str:
        """The first ``<prefix>_<n>`` not taken, counting from 1."""
        n = 1
        while f"{prefix}_{n}" in self.steps:
            n += 1
        return f"{prefix}_{n}"

    def rewire(self, consumer: str, old_input: str, new_input: str) -> None:
        """``consumer`` reads ``new_input`` instead of ``old_input`` (qualified expressions
        follow)."""
        s = self.steps[consumer]
        s = dataclasses.replace(s, inputs=tuple(new_input if i == old_input else i
                                                for i in s.inputs))
        self.put(requalify(s, old_input, new_input))

    def order(self) -> list[str]:
        """Ids reachable from the sink, inputs first: the order the plan will have
        (``compat.model.topological_order``), over the steps met depth-first from the sink,
        inputs in order, so that it depends on the graph alone, not on how it was built."""
        met: list[str] = []
        seen: set[str] = set()
        stack: list[tuple[str, bool]] = [(self.sink, False)]
        while stack:
            sid, done = stack.pop()
            if done:
                met.append(sid)
                continue
            if sid in seen:
                continue
            seen.add(sid)
            stack.append((sid, True))
            stack.extend((i, False) for i in reversed(self.steps[sid].inputs))
        return topological_order({sid: self.steps[sid].inputs for sid in met})

    # -- what steps output (compat.infer) -------------------------------------------------

    def info(self, step_id: str) -> NodeInfo:
        try:
            return self.inference.info(self.steps, step_id)
        except PlanError as e:
            if self.on_error is None:
                raise
            raise self.on_error(self, e) from None

    def columns(self, step_id: str) -> list[str]:
        """Output column names of a step, as written."""
        return list(self.info(step_id).names)

    def is_stream(self, step_id: str) -> bool:
        """Fed by at least one stream source (otherwise only by tables)."""
        return self.info(step_id).stream

    def is_stateful(self, step_id: str) -> bool:
        return self.info(step_id).stateful

    def watermarks(self, step_id: str) -> set[str]:
        """Output columns (lower case) that carry an event-time watermark."""
        return set(self.info(step_id).watermarks)


def walk_steps(g: Graph) -> Iterator[Node]:
    for sid in g.order():
        yield g.steps[sid]


def rewrite_to_fixpoint(graph: Graph, kind: type[Node],
                        rewrite: Callable[[Graph, Any], bool]) -> Graph:
    """A copy of ``graph`` with ``rewrite(g, step)`` applied to its steps of ``kind`` in
    topological order, starting over after every change, until none changes anything."""
    g = graph.copy()
    changed = True
    while changed:
        changed = False
        for sid in g.order():
            s = g.steps.get(sid)
            if isinstance(s, kind) and rewrite(g, s):
                changed = True
                break
    return g


# -- expressions as text and as trees ---------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def sql(e: exp.Expression) -> str:
    """Spark SQL text of an expression, as written into the plan (without the script's
    comments: a plan's expressions have none, and a comment is no change of the query)."""
    return e.sql(dialect=DIALECT, comments=False)


def parse(text: str, qualifiers: tuple[str, ...] = ()) -> exp.Expression:
    """The tree of an expression the compiler wrote (a fresh copy each time).

    ``a.b`` reads column ``a``'s field ``b`` unless ``a`` is one of ``qualifiers`` (a join
    condition's input ids): the tree is the one the translator built, columns with
    ``exp.Dot`` field accesses on top."""
    return _parse(text, tuple(q.lower() for q in qualifiers)).copy()


@lru_cache(maxsize=4096)
def _parse(text: str, qualifiers: tuple[str, ...]) -> exp.Expression:
    # As a SELECT item: alone, a text such as ``load > 1`` would parse as a LOAD command.
    tree = sqlglot.parse_one("SELECT " + text, read=DIALECT).expressions[0]

    def fields(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
            return node
        parts = [p for p in node.parts if isinstance(p, exp.Identifier)]
        if len(parts) < 2:
            return node
        table = None
        if parts[0].name.lower() in qualifiers:
            table, parts = parts[0], parts[1:]
        out: exp.Expression = exp.Column(this=parts[0], table=table)
        for p in parts[1:]:
            out = exp.Dot(this=out, expression=p)
        return out

    return tree.transform(fields, copy=False)


def step_parse(step: Node, text: str, qualified: bool) -> exp.Expression:
    """An expression of ``step`` as a tree (qualified ones by the step's input ids)."""
    return parse(text, step.inputs if qualified else ())


def map_trees(step: Node, fn: Callable[[exp.Expression], exp.Expression]) -> Node:
    """``step`` with ``fn`` applied to the tree of every expression it holds."""
    return map_expressions(step, lambda text, q: sql(fn(step_parse(step, text, q))))


def requalify(step: Node, old: str, new: str) -> Node:
    """``step`` with columns qualified by ``old`` qualified by ``new``."""

    def swap(e: exp.Expression) -> exp.Expression:
        for c in e.find_all(exp.Column):
            if c.table and c.table.lower() == old.lower():
                c.set("table", ident(new))
        return e

    def one(text: str, qualified: bool) -> str:
        if not qualified:
            return text
        return sql(swap(parse(text, (old,) + step.inputs)))

    return map_expressions(step, one)


def ident(name: str) -> exp.Identifier:
    """An identifier, quoted when Spark or the plan's expression parser would need it."""
    quoted = not _PLAIN.fullmatch(name) or name.lower() in E._KEYWORDS  # noqa: SLF001
    return exp.Identifier(this=name, quoted=quoted)


def col(name: str, table: str | None = None) -> exp.Column:
    return exp.Column(this=ident(name), table=ident(table) if table else None)


def bare_column(e: exp.Expression) -> str | None:
    """The name when ``e`` is a plain unqualified column, else None."""
    if isinstance(e, exp.Column) and not e.table and isinstance(e.this, exp.Identifier):
        return e.name
    return None


def columns_in(e: exp.Expression | None, table: str | None = None) -> list[str]:
    """Column names an expression reads (for a join: of one side), in order of appearance."""
    if e is None:
        return []
    out: list[str] = []
    for c in e.find_all(exp.Column):
        if isinstance(c.this, exp.Star):
            continue
        if (c.table or None) == table and c.name not in out:
            out.append(c.name)
    return out


def substitute(e: exp.Expression, mapping: dict[str, exp.Expression],
               table: str | None = None) -> exp.Expression:
    """Replace columns (case-insensitively, of one join side when ``table`` is given)."""
    low = {k.lower(): v for k, v in mapping.items()}

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and (node.table or None) == table and \
                node.name.lower() in low:
            return paren(low[node.name.lower()].copy())
        return node

    return e.copy().transform(swap, copy=False)


_ATOMS = (exp.Column, exp.Literal, exp.Func, exp.Paren, exp.Boolean, exp.Null, exp.Cast,
          exp.Dot, exp.Bracket, exp.Identifier, exp.Star, exp.Interval)


def paren(e: exp.Expression) -> exp.Expression:
    """``e`` made safe to put under an operator: sqlglot never adds parentheses itself."""
    return e if isinstance(e, _ATOMS) else exp.Paren(this=e)


def conjuncts(e: exp.Expression | None) -> list[exp.Expression]:
    if e is None:
        return []
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.And):
        return conjuncts(e.this) + conjuncts(e.expression)
    return [e]


def and_all(parts: list[exp.Expression]) -> exp.Expression | None:
    if not parts:
        return None
    out = paren_connector(parts[0].copy())
    for p in parts[1:]:
        out = exp.And(this=out, expression=paren_connector(p.copy()))
    return out


def paren_connector(e: exp.Expression) -> exp.Expression:
    return exp.Paren(this=e) if isinstance(e, exp.Or) else e


_NONDETERMINISTIC_CLASSES = (exp.Rand, exp.Randn, exp.Uuid, exp.CurrentTimestamp,
                             exp.CurrentDate, exp.CurrentTime)


def deterministic(e: exp.Expression | None) -> bool:
    """False when ``e`` calls a function whose result differs between runs."""
    if e is None:
        return True
    for n in e.walk():
        if isinstance(n, _NONDETERMINISTIC_CLASSES):
            return False
        if isinstance(n, exp.Func):
            name = (n.name if isinstance(n, exp.Anonymous) else n.sql_name()).lower()
            if name in E.NONDETERMINISTIC_FUNCTIONS:
                return False
    return True


def key(e: exp.Expression) -> str:
    """A comparison key: equal for the same resolved expression."""
    return e.sql(dialect=DIALECT, normalize=True, comments=False)


# -- a readable dump, for tests and debugging ----------------------------------------------------


def explain(g: Graph) -> str:
    """One line per step, inputs first: ``id = step(inputs) fields``."""
    return "\n".join(_explain_step(g.steps[sid]) for sid in g.order())


def _explain_step(s: Node) -> str:
    parts = []
    for f in dataclasses.fields(s):
        if f.name in ("id", "inputs", "version", "description", "extras"):
            continue
        v = getattr(s, f.name)
        if v in (None, (), "") or (f.name, v) in _DEFAULTS:
            continue
        parts.append(f"{f.name}={_show(v)}")
    return f"{s.id} = {s.step}({', '.join(s.inputs)}) {' '.join(parts)}".rstrip()


_DEFAULTS = {("partitions", 1), ("format", "json"), ("role", "stream"),
             ("starting_offsets", "earliest"), ("delivery", "exactly_once"), ("outer", False),
             ("n", 1)}


def _show(v: object) -> str:
    from compat.model import AggCall, Column, EventTime, NamedExpr, OrderKey, Window

    if isinstance(v, Column):
        return f"{v.name}:{v.type}" + ("" if v.nullable else "!")
    if isinstance(v, NamedExpr):
        return f"{v.name}:{v.expr}"
    if isinstance(v, AggCall):
        return f"{v.name}:{v.function}({'DISTINCT ' if v.distinct else ''}{', '.join(v.args)})"
    if isinstance(v, Window):
        extra = v.slide or v.gap
        return f"{v.type}({v.column}, {v.size}{', ' + extra if extra else ''})"
    if isinstance(v, OrderKey):
        return f"{v.expr}{' DESC' if v.desc else ''}"
    if isinstance(v, EventTime):
        return f"{v.column}/{v.watermark}"
    if isinstance(v, tuple):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return str(v)


__all__ = [
    "DIALECT", "LEFT", "RIGHT", "Graph", "and_all", "bare_column", "col", "columns_in",
    "conjuncts", "deterministic", "explain", "ident", "key", "map_trees", "paren", "parse",
    "requalify", "rewrite_to_fixpoint", "sql", "step_parse", "substitute", "walk_steps",
]
