"""Semantic validation and inference over a plan, in topological order.

For every node this computes what the checker, the builder and the SQL compiler need
(``NodeInfo``): output columns and their types, the changelog mode (Flink's retraction
modes: inserts only, upserts, or retractions), whether the node holds state, reads streams
or tables, which columns carry a watermark, and whether its expressions are deterministic.
Anything Spark could not run is refused here, with the reason, before anything is deployed.

Each step type registers its inference with ``infer_step`` (``functools.singledispatch`` on
the step class, in the step's module under ``compat/steps/``); this module is the driver
and the helpers the step inferences share.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import singledispatch

from compat import expr as E
from compat.errors import ExpressionError, PlanError
from compat.model import Node, Plan

INSERT = "I"
UPSERT = "I,UA"
RETRACT = "I,UB,UA,D"
MODE_RANK = {INSERT: 0, UPSERT: 1, RETRACT: 2}
#: the column a windowed aggregate adds first to its output, and its type
WINDOW_COLUMN = "window"
WINDOW_TYPE = "struct<start:timestamp,end:timestamp>"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")
_UNITS = {
    "ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001, "s": 1, "sec": 1, "second": 1,
    "seconds": 1, "secs": 1, "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400,
    "week": 604800, "weeks": 604800,
}


def duration_seconds(text: str) -> float | None:
    m = _DURATION.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        return None
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


@dataclass(frozen=True)
class NodeInfo:
    columns: tuple[tuple[str, str], ...]  # (lower-case name, type), in output order
    mode: str  # INSERT | UPSERT | RETRACT
    stream: bool  # fed by at least one stream source (otherwise a table)
    stateful: bool  # this node keeps state in the checkpoint
    watermarks: frozenset[str]  # output columns that carry an event-time watermark
    deterministic: bool  # this node's own expressions
    names: tuple[str, ...] = ()  # output column names as written (case kept)
    #: fed by a table read as a changelog (``source`` version 2, ``read: changelog``): the
    #: rows are a table's changes, each an insertion or a retraction of a whole row, and
    #: stateful steps over them retract (Flink's ChangelogNormalize and retract mode)
    changelog: bool = False
    #: over a changelog: the candidate unique keys of its rows (each a tuple of lower-case
    #: output column names; ``()`` is the key of a single row), so that a retraction of one
    #: row names that row alone; empty when no set of columns is known to be unique (an
    #: explode, a union).  A sink over a changelog must be keyed by one of them.
    keys: tuple[tuple[str, ...], ...] = ()
    #: output columns (lower-case) that hold a windowed aggregate's window (the struct) or
    #: one of its bounds (``window.start``, ``window.end``), under whatever name: the
    #: window a version 2 sink keys such an output by
    windows: frozenset[str] = frozenset()

    @property
    def types(self) -> dict[str, str]:
        return dict(self.columns)


#: Kafka's rule for topic names (``org.apache.kafka.common.internals.Topic``)
TOPIC_RULE = "a Kafka topic name: 1 to 249 characters from [a-zA-Z0-9._-], not '.' or '..'"
_TOPIC_LEGAL = re.compile(r"[a-zA-Z0-9._-]")
TOPIC_MAX = 249


def topic_problem(name: str) -> str | None:
    """Why Kafka refuses ``name`` as a topic name, or None when it takes it."""
    if name in (".", ".."):
        return f"'{name}' is not a topic name"
    if not name:
        return "it is empty"
    if len(name) > TOPIC_MAX:
        return f"it is {len(name)} characters long, at most {TOPIC_MAX}"
    bad = next((i for i, ch in enumerate(name) if not _TOPIC_LEGAL.fullmatch(ch)), None)
    if bad is not None:
        return f"{name[bad]!r} at character {bad + 1} is not allowed"
    return None


class InferContext:
    """Where a step's inference reports errors, and what it may look at around the step.

    ``nodes`` are the graph's nodes by id (a plan's, or a partial graph the SQL compiler is
    building); ``sink_mode`` is the plan's sink mode, or None while it is not decided (then
    no rule that depends on it applies).
    """

    def __init__(self, file: str, nodes: Mapping[str, Node], pointers: Mapping[str, str],
                 sink_mode: str | None) -> None:
        self.file = file
        self.nodes = nodes
        self.pointers = pointers
        self.sink_mode = sink_mode
        #: results of step inferences that depend on nothing but their key (a step's
        #: expressions and its input's info): steps that repeat them infer them once
        self.memo: dict[tuple[object, ...], NodeInfo] = {}

    def pointer(self, node_id: str, field: str | None = None) -> str:
        base = self.pointers.get(node_id, "")
        return base + ("/" + field if field else "")

    def err(self, node: Node, field: str, message: str, *, ptr: str | None = None,
            **kw: object) -> PlanError:
        pointer = ptr if ptr is not None else self.pointer(node.id, field)
        return PlanError(message, file=self.file, node=node.id, pointer=pointer,
                         **kw)  # type: ignore[arg-type]

    def expr_type(self, node: Node, field: str, text: str, scope: E.Scope, *,
                  ptr: str | None = None, allow_aggregate: bool = False) -> str:
        return self.typed(node, field, text, scope, ptr=ptr,
                          allow_aggregate=allow_aggregate)[0]

    def typed(self, node: Node, field: str, text: str, scope: E.Scope, *,
              ptr: str | None = None, allow_aggregate: bool = False
              ) -> tuple[str, E.ExprInfo]:
        """The type of an expression over ``scope``, and what ``compat.expr`` made of it."""
        try:
            info = E.analyze(text)
            if not allow_aggregate and info.has_aggregate:
                raise ExpressionError(
                    f"aggregate function in '{text}' outside an aggregate step",
                    expected="a row-level expression", found=text)
            return E.type_of(info, scope, text), info
        except ExpressionError as e:
            pointer = ptr if ptr is not None else self.pointer(node.id, field)
            raise e.with_location(file=self.file, node=node.id, pointer=pointer) from None

    def duration(self, node: Node, field: str, text: str) -> float:
        secs = duration_seconds(text)
        if secs is None:
            raise self.err(node, field, "invalid duration",
                           expected="a duration like '10 minutes'", found=repr(text))
        return secs

    def topic(self, node: Node, name: str, field: str = "topic") -> None:
        """Refuse a topic name Kafka refuses (``Topic.validate``)."""
        why = topic_problem(name)
        if why is not None:
            raise self.err(node, field, f"topic name Kafka refuses: {why}",
                           expected=TOPIC_RULE, found=repr(name))

    def distinct_keys(self, node: Node, keys: tuple[str, ...] | list[str],
                      field: str = "key_columns") -> None:
        """Refuse a column listed twice in a key (names are case-insensitive)."""
        seen: dict[str, int] = {}
        for i, k in enumerate(keys):
            if k.lower() in seen:
                raise self.err(node, f"{field}/{i}", f"key column '{k}' is listed twice",
                               expected="each key column once",
                               found=f"'{k}' at {field}/{seen[k.lower()]} and {field}/{i}")
            seen[k.lower()] = i

    def unique(self, node: Node, names: list[str], field: str) -> None:
        seen: dict[str, int] = {}
        for i, name in enumerate(names):
            low = name.lower()
            if low in seen:
                raise self.err(node, f"{field}/{i}/name" if field else "",
                               f"duplicate output column '{name}' (Spark column names are "
                               f"case-insensitive)", expected="unique column names",
                               found=f"'{name}' twice")
            seen[low] = i


@singledispatch
def infer_step(node: Node, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    """What ``node`` outputs given what its inputs output; raises PlanError when Spark could
    not run it.  Every step type registers its own (``@infer_step.register``)."""
    raise PlanError(f"no inference is registered for step '{node.step}'", file=ctx.file,
                    node=node.id, pointer=ctx.pointer(node.id, "step"))


def scope(info: NodeInfo) -> E.Scope:
    return E.Scope(dict(info.columns))


def deterministic(text: str) -> bool:
    return E.analyze(text).deterministic


def plain_column(text: str) -> str | None:
    """The lower-case name of the input column ``text`` is, when it is just a column
    (``User_Id``, `` `a b` ``), else None."""
    ast = E.analyze(text).ast
    return ast[1][0] if ast[0] == "col" and len(ast[1]) == 1 else None


def covering_key(info: NodeInfo, columns: Iterable[str]) -> tuple[str, ...] | None:
    """The first candidate unique key of ``info`` (a changelog's) that ``columns`` hold
    (the names case-insensitive), or None when they hold none."""
    have = {c.lower() for c in columns}
    for key in info.keys:
        if all(k in have for k in key):
            return key
    return None


def analyze(plan: Plan, reuse: Plan | None = None) -> dict[str, NodeInfo]:
    """Validate ``plan`` semantically and return the inferred NodeInfo per node id.

    With ``reuse`` (an analysed plan that ``plan`` was loaded against), a node that is the
    very same object there and whose inputs got equal infos gets its old info: its
    inference reads nothing else (``Node.infers_from_inputs``), so it would say the same.
    A change far upstream thus costs only the nodes whose inputs it really changes.
    """
    sink_mode = plan.sink.mode  # type: ignore[attr-defined]
    ctx = InferContext(plan.file, plan.nodes, plan.pointers, sink_mode)
    infos: dict[str, NodeInfo] = {}
    if reuse is not None and (not reuse.info or
                              reuse.sink.mode != sink_mode):  # type: ignore[attr-defined]
        reuse = None
    old_nodes = reuse.nodes if reuse is not None else {}
    old_infos = reuse.info if reuse is not None else {}
    # infer_step's implementation per step class, looked up once as singledispatch would
    # (a replacement of infer_step without ``dispatch``, a test's, is called as it is)
    impls: dict[type, Callable[[Node, InferContext, list[NodeInfo]], NodeInfo]] = {}
    dispatch = getattr(infer_step, "dispatch", None)
    for nid, node in plan.nodes.items():
        if old_nodes.get(nid) is node and node.infers_from_inputs and \
                all(infos[i] is old_infos[i] or infos[i] == old_infos[i]
                    for i in node.inputs):
            infos[nid] = old_infos[nid]
            continue
        impl = impls.get(node.__class__)
        if impl is None:
            impl = impls[node.__class__] = (dispatch(node.__class__) if dispatch is not None
                                            else infer_step)
        infos[nid] = impl(node, ctx, [infos[i] for i in node.inputs])
    plan.info = infos
    return infos


class GraphInference:
    """NodeInfo on demand for a graph under construction (the SQL compiler's): inputs
    first, memoised per node object and input infos, so that graphs which share nodes share
    the work (the input infos whose ids the keys hold are memo values: they stay alive).
    No sink mode is assumed."""

    def __init__(self, file: str = "<plan>") -> None:
        self.file = file
        self.memo: dict[tuple[object, ...], NodeInfo] = {}

    def info(self, nodes: Mapping[str, Node], node_id: str) -> NodeInfo:
        node = nodes[node_id]
        ins = [self.info(nodes, i) for i in node.inputs]
        key = (node, *map(id, ins))
        got = self.memo.get(key)
        if got is None:
            ctx = InferContext(self.file, nodes, {}, None)
            got = self.memo[key] = infer_step(node, ctx, ins)
        return got


def characteristics(plan: Plan) -> list[str]:
    """The query characteristics of the ksqlDB upgrade taxonomy."""
    infos = plan.info
    stateful = [n for n in plan.nodes.values() if infos[n.id].stateful]
    traits: set[str] = set()
    for n in plan.nodes.values():
        traits |= n.traits()  # type: ignore[attr-defined]
    out = []
    if stateful:
        out.append("stateful")
    if "windowed" in traits:
        out.append("windowed")
    if "joined" in traits:
        out.append("joined")
    if len(stateful) > 1 or "recursive" in traits:
        out.append("multistage")
    if not all(i.deterministic for i in infos.values()):
        out.append("nondeterministic")
    if not out:
        out.append("simple")
    return out
