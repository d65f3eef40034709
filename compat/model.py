"""The plan model: one frozen dataclass per step type, registered by name.

Every step type lives in its own module under ``compat/steps/`` (the dataclass, its finding
codes and every per-step behaviour: inference, compatibility rule, sharing signature,
predicate pushdown, PySpark export; see ``compat.steps``); its Spark builder lives in
``migrate/build/``.  This module holds what they share: the ``Node`` base class and the
registry it fills, the value types that steps are made of (columns, named expressions,
windows...), the field declarations that drive the JSON serde (``compat.serde``) and the
plan schema (``compat.plan_schema``), and the ``Plan`` with its graph.

A field's JSON layout follows its declaration: a field without a default is required in
JSON and always written; a field with a default is optional and written only when it
differs from the default.  ``prop(key=...)`` names a JSON key that is not the field's name,
``prop(schema=...)`` gives the JSON Schema of a scalar, ``prop(items=...)`` the schema of a
list's items, ``prop(doc=...)`` the description the schema carries.

The model never knows JSON documents (that is ``serde``'s job).  Edges are kept apart from
node fields: ``Plan`` holds the nodes by id, the ``dependents`` of each node and a
topological order, all computed once when the plan is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import graphlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from compat.errors import PlanError

PASSIVE = "passive"
ENFORCING = "enforcing"

# -- JSON Schema fragments that field declarations share -------------------------------------

ID = {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$", "minLength": 1}
NAME = {"type": "string", "minLength": 1}
EXPR = {"type": "string", "minLength": 1, "description": "a Spark SQL expression"}
TYPE = {"type": "string", "minLength": 1, "description": "a Spark SQL type"}
DURATION = {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*[A-Za-z]+\s*$",
            "description": "a duration such as '10 minutes'"}
RECORD_FORMAT = {"enum": ["json", "string", "avro"]}
#: Kafka's partition counts and Spark's shuffle partitions are Java ints
INT32_MAX = 2**31 - 1
PARTITIONS = {"type": "integer", "minimum": 1, "maximum": INT32_MAX}


def enum(*values: str) -> dict[str, Any]:
    return {"enum": list(values)}


_MISSING = dataclasses.MISSING


def prop(default: Any = _MISSING, *, key: str | None = None,
         schema: Mapping[str, Any] | None = None, items: Mapping[str, Any] | None = None,
         min_items: int | None = None, doc: str | None = None, qualified: bool = False,
         compare: bool = True) -> Any:
    """Declare a step field: its default (none: required in JSON), JSON key and schema.

    A field whose schema (or items' schema) is ``EXPR`` holds Spark SQL expressions;
    ``qualified`` says their columns are qualified by the ids of the step's inputs."""
    meta = {"key": key, "schema": schema, "items": items, "min_items": min_items, "doc": doc,
            "qualified": qualified}
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple or None as a default")  # frozen dataclasses
    return field(default=default, compare=compare, metadata={"theseus": meta})


def json_key(f: dataclasses.Field) -> str:
    meta = f.metadata.get("theseus") or {}
    return meta.get("key") or f.name


def field_meta(f: dataclasses.Field) -> dict[str, Any]:
    return f.metadata.get("theseus") or {}


def required(f: dataclasses.Field) -> bool:
    return f.default is _MISSING and f.default_factory is _MISSING


def map_expressions(obj: Any, fn: Callable[[str, bool], str]) -> Any:
    """A copy of a step (or value) with ``fn(text, qualified)`` applied to every expression
    it holds, in nested values too; the same object when nothing changes."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        meta = field_meta(f)
        v = getattr(obj, f.name)
        if v is None or f.name in ("id", "inputs"):
            continue
        if meta.get("schema") is EXPR:
            new: Any = fn(v, meta["qualified"])
        elif meta.get("items") is EXPR:
            new = tuple(fn(x, meta["qualified"]) for x in v)
        elif isinstance(v, tuple) and v and dataclasses.is_dataclass(v[0]):
            new = tuple(map_expressions(x, fn) for x in v)
        elif dataclasses.is_dataclass(v):
            new = map_expressions(v, fn)
        else:
            continue
        if new != v:
            changes[f.name] = new
    return dataclasses.replace(obj, **changes) if changes else obj


# -- value types ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """A column of a source topic's records."""

    name: str = prop(schema=NAME)
    type: str = prop(schema=TYPE)
    nullable: bool = prop(True)
    schema_def: ClassVar[str] = "column"


@dataclass(frozen=True)
class NamedExpr:
    """An output column computed by an expression."""

    name: str = prop(schema=NAME)
    expr: str = prop(schema=EXPR)
    schema_def: ClassVar[str] = "named_expr"


@dataclass(frozen=True)
class AggCall:
    """An aggregate function call and the name of its output column."""

    name: str = prop(schema=NAME)
    function: str = prop(schema={"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"})
    args: tuple[str, ...] = prop(items=EXPR)
    distinct: bool = prop(False)


@dataclass(frozen=True)
class Window:
    """A window over an event-time column: tumbling (size), hopping (size, slide) or
    session (gap)."""

    type: str = prop(schema=enum("tumbling", "hopping", "session"))
    column: str = prop(schema={"type": "string"})
    size: str = prop(schema=DURATION)
    slide: str | None = prop(None, schema=DURATION)
    gap: str | None = prop(None, schema=DURATION)


@dataclass(frozen=True)
class OrderKey:
    expr: str = prop(schema=EXPR)
    desc: bool = prop(False)


@dataclass(frozen=True)
class EventTime:
    """The event-time column and how late its rows may arrive."""

    column: str = prop(schema={"type": "string"})
    watermark: str = prop(schema=DURATION)


@dataclass(frozen=True)
class AvroSpec:
    """How a ``format: avro`` topic's records are encoded: values in the schema registry's
    wire format (a zero byte, the schema's 4-byte id, the Avro body) under a subject named
    by ``subject`` (Confluent's subject name strategies: ``topic_name`` is
    ``<topic>-value``, ``record_name`` the record's full name, ``topic_record_name``
    ``<topic>-<record>``)."""

    subject: str = prop("topic_name", schema=enum("topic_name", "record_name",
                                                  "topic_record_name"),
                        doc="how the registry subject is named (default topic_name: "
                        "<topic>-value)")
    record: str | None = prop(None, schema={"type": "string", "pattern":
                                            r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"},
                              doc="the record's full name (default: the topic's name with "
                              "every other character than a letter, digit or _ as _)")
    schema: str | None = prop(None, schema={"type": "string", "minLength": 2},
                              doc="the Avro schema as JSON text, as the registry's API "
                              "carries it (default: derived from the columns, a nullable "
                              "column as a union with null and default null)")
    key: bool = prop(False, doc="the record key is Avro too (subject <topic>-key): a "
                     "record of the key columns")


# -- steps --------------------------------------------------------------------------------------

#: every step class by its ``step`` name, filled as the step modules are imported
STEPS: dict[str, type[Node]] = {}
_CONTENT_FIELDS: dict[type, tuple[str, ...]] = {}


@dataclass(frozen=True, kw_only=True)
class Node:
    """Fields common to every step: ``id``, ``inputs`` (ids, in order), ``version`` (an
    incompatible change to how a step computes gets a new version) and an optional
    ``description``.  ``extras`` keeps a node's ``x-*`` keys, which Theseus ignores."""

    id: str
    inputs: tuple[str, ...] = ()
    version: int = 1
    description: str | None = field(default=None, compare=False)
    extras: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    step: ClassVar[str] = ""
    klass: ClassVar[str] = PASSIVE
    min_inputs: ClassVar[int] = 1
    max_inputs: ClassVar[int | None] = 1
    #: the highest version of the step this build knows: a higher one was written for a
    #: newer Theseus, whose meaning this one cannot know (refused at loading)
    max_version: ClassVar[int] = 1
    #: the step's inference reads the step and its inputs' infos only (with the plan's sink
    #: mode): equal inputs give an equal result, which a check reuses
    infers_from_inputs: ClassVar[bool] = True

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        name = cls.__dict__.get("step")
        if name:
            if name in STEPS and STEPS[name].__qualname__ != cls.__qualname__:
                raise TypeError(f"step '{name}' is registered twice")
            STEPS[name] = cls

    def describe(self) -> str:
        """What the step does, in a few words, for findings' messages."""
        return self.step

    def canonical(self) -> tuple[Any, ...]:
        """What the step computes in a form where formatting does not matter (steps with
        expressions compare them in canonical form: ``a+b`` equals ``A + b``)."""
        return (self.step, self.content())

    def row_predicate(self) -> str | None:
        """The condition this step keeps rows by, if that is all it does (a filter's
        predicate): Spark's optimizer moves such conditions down the query
        (``compat.demand``)."""
        return None

    def kept_state(self, plan: Plan) -> Any:
        """What this step keeps in state that depends on the rest of ``plan`` rather than on
        the step and the steps under it (a stream-stream join keeps only the columns read
        above it: ``compat.steps.join``); None for every other step.  The walk compares it
        where two subtrees are identical: what is read above them may still differ."""
        return None

    def traits(self) -> frozenset[str]:
        """What this step adds to the query characteristics of the upgrade taxonomy
        (``windowed``, ``joined``, ``recursive``)."""
        return frozenset()

    def content(self) -> tuple[Any, ...]:
        """What the node computes, for hashing: every compared field but ``id`` and
        ``inputs`` (a description or ``x-*`` key changes nothing)."""
        names = _CONTENT_FIELDS.get(type(self))
        if names is None:
            names = _CONTENT_FIELDS[type(self)] = tuple(
                f.name for f in dataclasses.fields(self)
                if f.compare and f.name not in ("id", "inputs"))
        return tuple([getattr(self, f) for f in names])


COMMON_FIELDS = frozenset(f.name for f in dataclasses.fields(Node))


def step_fields(cls: type[Node]) -> tuple[dataclasses.Field, ...]:
    """The fields a step type adds to the common ones, in declaration (and JSON) order."""
    return tuple(f for f in dataclasses.fields(cls) if f.name not in COMMON_FIELDS)


def step_class(name: str) -> type[Node]:
    try:
        return STEPS[name]
    except KeyError:
        close = difflib.get_close_matches(name, STEPS, n=1, cutoff=0.5)
        raise PlanError(f"unknown step '{name}'", expected="one of " + ", ".join(STEPS),
                        found=repr(name),
                        hint=f"Did you mean '{close[0]}'?" if close else None) from None


# -- plans --------------------------------------------------------------------------------------


class Position(NamedTuple):
    """Where a part of a plan was written in a source that is not its JSON (a SQL script,
    a PySpark job): 1-based line and column of its first character and of the character
    after its end, and the file when it is not the plan's own (a job's helper module)."""

    line: int
    col: int
    end_line: int
    end_col: int
    file: str | None = None


@dataclass
class Plan:
    """A validated plan: nodes by id in topological order (sources first)."""

    query: str
    nodes: dict[str, Node]
    config: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    file: str = "<plan>"
    pointers: dict[str, str] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    dependents: dict[str, list[str]] = field(default_factory=dict)
    sink_id: str = ""
    #: filled by ``compat.infer``: output columns, changelog modes and more per node
    info: dict[str, Any] = field(default_factory=dict)
    #: the node documents the plan was read from, by id: a plan loaded against this one
    #: reuses the nodes whose documents are equal (opaque to everything but ``serde``)
    documents: dict[str, Any] = field(default_factory=dict, repr=False)
    #: for a plan compiled from SQL, where its parts were written, by JSON pointer (a node's
    #: ``/nodes/<i>``, some of its fields, ``/config/<key>``, ``/query``; ``""`` is the
    #: query): reports point there instead of at the compiled JSON.  For a plan imported
    #: from a PySpark job, where each node's DataFrame call was (``compat.origins``).
    #: Empty for a JSON plan.
    positions: dict[str, Position] = field(default_factory=dict, repr=False)
    #: what analyses derive from the plan once it is inferred, by name (``compat.demand``:
    #: the columns demanded of every node), computed on first use
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def state_partitions(self) -> int | None:
        v = self.config.get("state_partitions")
        return v if isinstance(v, int) else None

    @property
    def sink(self) -> Node:
        return self.nodes[self.sink_id]

    def pointer(self, node_id: str, field_name: str | None = None) -> str:
        base = self.pointers.get(node_id, "")
        return base + ("/" + field_name if field_name else "")

    def source(self, pos: Position | None) -> str:
        """The file a position is in (the plan's own unless it names another)."""
        return pos.file if pos is not None and pos.file else self.file

    def position(self, pointer: str | None, node_id: str | None = None) -> Position | None:
        """Where a SQL plan's part was written: the pointer's (``node_id``'s without one),
        else its closest ancestor's, else the query's; None for a JSON plan."""
        if not self.positions:
            return None
        p = pointer if pointer is not None else self.pointers.get(node_id or "", "")
        while True:
            pos = self.positions.get(p)
            if pos is not None or not p:
                return pos
            p = p.rsplit("/", 1)[0]


def build_graph(nodes: list[Node], file: str, pointers: dict[str, str],
                where: str = "") -> tuple[dict[str, Node], dict[str, list[str]]]:
    """Index nodes, check ids, inputs and arity, refuse cycles; return them in topo order."""
    by_id: dict[str, Node] = {}
    for node in nodes:
        if node.id in by_id:
            raise PlanError(f"duplicate node id '{node.id}'{where}", file=file, node=node.id,
                            pointer=pointers.get(node.id, "") + "/id",
                            expected="ids unique within the plan",
                            found=f"'{node.id}' also at {pointers.get(node.id, '?')}")
        by_id[node.id] = node
    dependents: dict[str, list[str]] = {nid: [] for nid in by_id}
    for node in nodes:
        ins = node.inputs
        hi = node.max_inputs
        if len(ins) < node.min_inputs or (hi is not None and len(ins) > hi):
            check_arity(node, file, pointers)  # raises
        for dep in ins:
            if dep not in by_id:
                i = ins.index(dep)  # the first missing input
                close = difflib.get_close_matches(dep, list(by_id), n=1, cutoff=0.6)
                raise PlanError(f"input '{dep}' does not exist", file=file, node=node.id,
                                pointer=pointers.get(node.id, "") + f"/inputs/{i}",
                                expected="the id of a node in the plan", found=repr(dep),
                                hint=f"Did you mean '{close[0]}'?" if close else None)
            dependents[dep].append(node.id)
    try:
        order = topological_order({nid: n.inputs for nid, n in by_id.items()})
    except graphlib.CycleError as e:
        # graphlib names the cycle as a closed path, each node an input of the next.
        cycle = list(e.args[1])
        first = cycle[0]
        raise PlanError("the graph has a cycle" + where, file=file, node=first,
                        pointer=pointers.get(first, "") + "/inputs",
                        expected="an acyclic graph (express recursion with a recursive step)",
                        found=" -> ".join(cycle)) from None
    return {nid: by_id[nid] for nid in order}, dependents


def check_arity(node: Node, file: str, pointers: Mapping[str, str]) -> None:
    n_in = len(node.inputs)
    lo, hi = node.min_inputs, node.max_inputs
    if n_in < lo or (hi is not None and n_in > hi):
        want = (f"exactly {lo}" if lo == hi else
                f"at least {lo}" if hi is None else f"{lo} to {hi}")
        raise PlanError(f"a {node.step} step takes {want} input(s)", file=file,
                        node=node.id, pointer=pointers.get(node.id, "") + "/inputs",
                        expected=f"{want} input(s)", found=f"{n_in}")


def topological_order(inputs: Mapping[str, tuple[str, ...] | list[str]]) -> list[str]:
    """Ids with their inputs first; nodes that become ready together keep the order in
    which ``inputs`` first mentions them (so the same graph always gives the same order).
    Raises ``graphlib.CycleError`` naming a cycle."""
    # static_order() is the loop of prepare, get_ready and done, run inside graphlib
    return list(graphlib.TopologicalSorter(inputs).static_order())
