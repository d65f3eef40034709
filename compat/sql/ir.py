"""The compiler's intermediate representation: a graph of steps holding sqlglot expressions.

One frozen dataclass per step kind, mirroring ``compat.model`` but with expressions kept as
sqlglot trees (resolved: every column is an unqualified name of the step's input), so that the
optimizer rules can rewrite them without parsing strings again.  In a join's ``condition`` and
``time_bound`` columns are qualified by ``LEFT`` or ``RIGHT``; ``compat.sql.emit`` turns those
into the input ids when it writes the plan.

A ``Graph`` is the steps by id, the sink id and, for error messages, where each step came from
in the SQL text.  Optimizer rules never mutate a graph: they ``copy()`` it and change the copy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from sqlglot import exp

from compat import expr as E
from compat.model import Column, Window  # the same as in plans: no expressions inside
from compat.sql.text import Span

#: qualifiers of the two inputs in a join's condition and time bound
LEFT = "__left__"
RIGHT = "__right__"
DIALECT = "spark"


# -- steps --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    id: str
    inputs: tuple[str, ...]
    kind: ClassVar[str] = ""
    #: keeps state in the checkpoint (a stream-stream join decides per plan)
    stateful: ClassVar[bool] = False

    def replace(self, **changes: object) -> Step:
        """A copy with some fields changed (steps are frozen)."""
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Source(Step):
    topic: str = ""
    partitions: int = 1
    format: str = "json"
    role: str = "stream"
    schema: tuple[Column, ...] = ()
    key_columns: tuple[str, ...] = ()
    event_time: str | None = None
    watermark: str | None = None
    starting_offsets: str = "earliest"
    kind: ClassVar[str] = "source"


@dataclass(frozen=True)
class Filter(Step):
    predicate: exp.Expression = field(default_factory=exp.true)
    kind: ClassVar[str] = "filter"


@dataclass(frozen=True)
class Project(Step):
    columns: tuple[tuple[str, exp.Expression], ...] = ()
    kind: ClassVar[str] = "project"


@dataclass(frozen=True)
class Explode(Step):
    expr: exp.Expression = field(default_factory=exp.null)
    alias: str = "col"
    outer: bool = False
    kind: ClassVar[str] = "explode"


@dataclass(frozen=True)
class Union(Step):
    kind: ClassVar[str] = "union"


@dataclass(frozen=True)
class AggCall:
    name: str
    function: str
    args: tuple[exp.Expression, ...]  # ``exp.Star()`` for ``count(*)``
    distinct: bool = False


@dataclass(frozen=True)
class Aggregate(Step):
    group_by: tuple[tuple[str, exp.Expression], ...] = ()
    aggregates: tuple[AggCall, ...] = ()
    window: Window | None = None
    kind: ClassVar[str] = "aggregate"
    stateful: ClassVar[bool] = True


@dataclass(frozen=True)
class Join(Step):
    type: str = "inner"
    left_keys: tuple[exp.Expression, ...] = ()
    right_keys: tuple[exp.Expression, ...] = ()
    condition: exp.Expression | None = None
    time_bound: exp.Expression | None = None
    kind: ClassVar[str] = "join"


@dataclass(frozen=True)
class Deduplicate(Step):
    keys: tuple[str, ...] = ()
    within: str | None = None
    kind: ClassVar[str] = "deduplicate"
    stateful: ClassVar[bool] = True


@dataclass(frozen=True)
class TopN(Step):
    partition_by: tuple[exp.Expression, ...] = ()
    order_by: tuple[tuple[exp.Expression, bool], ...] = ()  # (expr, desc)
    n: int = 1
    kind: ClassVar[str] = "top_n"
    stateful: ClassVar[bool] = True


@dataclass(frozen=True)
class Sink(Step):
    topic: str = ""
    format: str = "json"
    key_columns: tuple[str, ...] = ()
    mode: str | None = None  # None: decided when the plan is written
    delivery: str = "exactly_once"
    kind: ClassVar[str] = "sink"


STEPS: dict[str, type[Step]] = {
    cls.kind: cls for cls in (Source, Filter, Project, Explode, Union, Aggregate, Join,
                              Deduplicate, TopN, Sink)
}


# -- the graph ------------------------------------------------------------------------------


@dataclass
class Graph:
    """Steps by id (any order; ``order()`` gives inputs first), the sink, and origins."""

    steps: dict[str, Step] = field(default_factory=dict)
    sink: str = ""
    #: where in the SQL text each step came from, for error messages
    origins: dict[str, Span] = field(default_factory=dict)

    def copy(self) -> Graph:
        return Graph(dict(self.steps), self.sink, dict(self.origins))

    def __getitem__(self, step_id: str) -> Step:
        return self.steps[step_id]

    def add(self, step: Step, origin: Span | None = None) -> Step:
        if step.id in self.steps:
            raise ValueError(f"duplicate step id {step.id!r}")  # a compiler bug
        self.steps[step.id] = step
        if origin is not None:
            self.origins[step.id] = origin
        return step

    def put(self, step: Step) -> None:
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
        s = self.steps[consumer]
        self.put(s.replace(inputs=tuple(new_input if i == old_input else i
                                        for i in s.inputs)))

    def order(self) -> list[str]:
        """Ids reachable from the sink, inputs first (depth-first, inputs in order)."""
        out: list[str] = []
        seen: set[str] = set()

        def visit(sid: str) -> None:
            if sid in seen:
                return
            seen.add(sid)
            for i in self.steps[sid].inputs:
                visit(i)
            out.append(sid)

        visit(self.sink)
        return out

    # -- what steps output ---------------------------------------------------------------

    def columns(self, step_id: str) -> list[str]:
        """Output column names of a step, following ``compat.infer``'s naming rules."""
        return _columns(self, step_id, {})

    def is_stream(self, step_id: str) -> bool:
        """Fed by at least one stream source (otherwise only by tables)."""
        s = self.steps[step_id]
        if isinstance(s, Source):
            return s.role == "stream"
        return any(self.is_stream(i) for i in s.inputs)

    def is_stateful(self, step_id: str) -> bool:
        s = self.steps[step_id]
        if isinstance(s, Join):
            return all(self.is_stream(i) for i in s.inputs)
        return s.stateful

    def watermarks(self, step_id: str) -> set[str]:
        """Output columns (lower case) that carry an event-time watermark."""
        s = self.steps[step_id]
        if isinstance(s, Source):
            return {s.event_time.lower()} if s.event_time else set()
        if isinstance(s, (Filter, Deduplicate, Explode, Sink)):
            return self.watermarks(s.inputs[0])
        if isinstance(s, Project):
            marks = self.watermarks(s.inputs[0])
            return {n.lower() for n, e in s.columns
                    if isinstance(e, exp.Column) and not e.table and e.name.lower() in marks}
        if isinstance(s, Union):
            sets = [self.watermarks(i) for i in s.inputs]
            return set.intersection(*sets) if sets else set()
        if isinstance(s, Aggregate):
            ok = s.window is not None and \
                s.window.column.lower() in self.watermarks(s.inputs[0])
            return {"window"} if ok else set()
        if isinstance(s, Join):
            out = {c.lower() for c in self.columns(s.id)}
            return self.watermarks(s.inputs[0]) | (self.watermarks(s.inputs[1]) & out)
        return set()


def _columns(g: Graph, sid: str, memo: dict[str, list[str]]) -> list[str]:
    if sid in memo:
        return memo[sid]
    s = g.steps[sid]
    if isinstance(s, Source):
        out = [c.name for c in s.schema]
    elif isinstance(s, (Filter, Deduplicate, TopN, Sink)):
        out = list(_columns(g, s.inputs[0], memo))
    elif isinstance(s, Project):
        out = [n for n, _ in s.columns]
    elif isinstance(s, Explode):
        out = _columns(g, s.inputs[0], memo) + [s.alias]
    elif isinstance(s, Union):
        out = list(_columns(g, s.inputs[0], memo))
    elif isinstance(s, Aggregate):
        out = (["window"] if s.window else []) + [n for n, _ in s.group_by] + \
            [a.name for a in s.aggregates]
    elif isinstance(s, Join):
        out = [o for o, _src in join_output(s, _columns(g, s.inputs[0], memo),
                                            _columns(g, s.inputs[1], memo))]
    else:  # pragma: no cover - every step kind is handled above
        raise AssertionError(s.kind)
    memo[sid] = out
    return out


def paired_keys(join: Join) -> set[str]:
    """Lower-case names that are the same bare column on both sides of an equi-key pair."""
    out = set()
    for lk, rk in zip(join.left_keys, join.right_keys):
        ln, rn = bare_column(lk), bare_column(rk)
        if ln is not None and rn is not None and ln.lower() == rn.lower():
            out.add(ln.lower())
    return out


def join_output(join: Join, left: list[str],
                right: list[str]) -> list[tuple[str, tuple[str, str]]]:
    """The join's output columns, each with where it comes from: ``("left"|"right", name)``.

    As in ``compat.infer``: left columns, then right ones; a right column named like a left one
    is dropped when the two are a paired equi-join key, and otherwise renamed
    ``<right id>_<name>``.  Semi and anti joins output the left columns only.
    """
    out = [(c, ("left", c)) for c in left]
    if join.type in ("left_semi", "left_anti"):
        return out
    lnames = {c.lower() for c in left}
    paired = paired_keys(join)
    rid = join.inputs[1]
    for c in right:
        if c.lower() in lnames:
            if c.lower() in paired:
                continue
            out.append((f"{rid}_{c}", ("right", c)))
        else:
            out.append((c, ("right", c)))
    return out


# -- expressions ----------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def ident(name: str) -> exp.Identifier:
    """An identifier, quoted when Spark or the plan's expression parser would need it."""
    quoted = not _PLAIN.fullmatch(name) or name.lower() in E._KEYWORDS  # noqa: SLF001
    return exp.Identifier(this=name, quoted=quoted)


def col(name: str, table: str | None = None) -> exp.Column:
    return exp.Column(this=ident(name), table=exp.Identifier(this=table) if table else None)


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


def sql(e: exp.Expression) -> str:
    """Spark SQL text of an expression, as written into the plan."""
    return e.sql(dialect=DIALECT)


def key(e: exp.Expression) -> str:
    """A comparison key: equal for the same resolved expression."""
    return e.sql(dialect=DIALECT, normalize=True, comments=False)


# -- a readable dump, for tests and debugging ----------------------------------------------------


def explain(g: Graph) -> str:
    """One line per step, inputs first: ``id = kind(inputs) fields``."""
    return "\n".join(_explain_step(g.steps[sid]) for sid in g.order())


def _explain_step(s: Step) -> str:
    parts = []
    for f in fields(s):
        if f.name in ("id", "inputs"):
            continue
        v = getattr(s, f.name)
        if v in (None, (), "") or (f.name, v) in _DEFAULTS:
            continue
        parts.append(f"{f.name}={_show(v)}")
    return f"{s.id} = {s.kind}({', '.join(s.inputs)}) {' '.join(parts)}".rstrip()


_DEFAULTS = {("partitions", 1), ("format", "json"), ("role", "stream"),
             ("starting_offsets", "earliest"), ("delivery", "exactly_once"), ("outer", False),
             ("n", 1)}


def _show(v: object) -> str:
    if isinstance(v, exp.Expression):
        return sql(v)
    if isinstance(v, Column):
        return f"{v.name}:{v.type}" + ("" if v.nullable else "!")
    if isinstance(v, AggCall):
        args = ", ".join(sql(a) for a in v.args)
        return f"{v.name}:{v.function}({'DISTINCT ' if v.distinct else ''}{args})"
    if isinstance(v, Window):
        extra = v.slide or v.gap
        return f"{v.type}({v.column}, {v.size}{', ' + extra if extra else ''})"
    if isinstance(v, tuple):
        if v and isinstance(v[0], tuple) and len(v[0]) == 2 and \
                isinstance(v[0][1], exp.Expression):
            return "[" + ", ".join(f"{n}:{sql(e)}" for n, e in v) + "]"  # type: ignore[misc]
        if v and isinstance(v[0], tuple) and len(v[0]) == 2 and isinstance(v[0][1], bool):
            return "[" + ", ".join(f"{sql(e)}{' DESC' if d else ''}"  # type: ignore[misc]
                                   for e, d in v) + "]"
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return str(v)


def walk_steps(g: Graph) -> Iterator[Step]:
    for sid in g.order():
        yield g.steps[sid]


__all__ = [
    "LEFT", "RIGHT", "AggCall", "Aggregate", "Column", "Deduplicate", "Explode", "Filter",
    "Graph", "Join", "Project", "STEPS", "Sink", "Source", "Step", "TopN", "Union", "Window",
    "and_all", "bare_column", "col", "columns_in", "conjuncts", "deterministic", "explain",
    "ident", "join_output", "key", "paired_keys", "paren", "sql", "substitute", "walk_steps",
]


def rewrite_to_fixpoint(graph: Graph, kind: type[Step],
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

