"""The plan model: one frozen dataclass per step type, registered by name.

The model never knows JSON (that is ``serde``'s job).  Edges are kept apart from node fields:
``Plan`` holds the nodes by id, the ``dependents`` of each node and a topological order, all
computed once when the plan is built.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from compat.errors import PlanError

PASSIVE = "passive"
_CONTENT_FIELDS: dict[type, tuple[str, ...]] = {}
ENFORCING = "enforcing"


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    nullable: bool = True


@dataclass(frozen=True)
class NamedExpr:
    name: str
    expr: str


@dataclass(frozen=True)
class AggCall:
    name: str
    function: str
    args: tuple[str, ...]
    distinct: bool = False


@dataclass(frozen=True)
class Window:
    type: str  # tumbling | hopping | session
    column: str
    size: str
    slide: str | None = None
    gap: str | None = None


@dataclass(frozen=True)
class OrderKey:
    expr: str
    desc: bool = False


@dataclass(frozen=True)
class EventTime:
    column: str
    watermark: str


@dataclass(frozen=True)
class Node:
    """Fields common to every step."""

    id: str
    version: int
    inputs: tuple[str, ...]

    step: ClassVar[str] = ""
    klass: ClassVar[str] = PASSIVE
    min_inputs: ClassVar[int] = 1
    max_inputs: ClassVar[int | None] = 1

    def content(self) -> tuple[Any, ...]:
        """Every field but ``id`` and ``inputs``: what the node computes, for hashing."""
        names = _CONTENT_FIELDS.get(type(self))
        if names is None:
            names = _CONTENT_FIELDS[type(self)] = tuple(
                f for f in self.__dataclass_fields__ if f not in ("id", "inputs"))
        return tuple([getattr(self, f) for f in names])


@dataclass(frozen=True)
class Source(Node):
    topic: str = ""
    partitions: int = 1
    format: str = "json"
    schema: tuple[Column, ...] = ()
    role: str = "stream"
    key_columns: tuple[str, ...] = ()
    event_time: EventTime | None = None
    starting_offsets: str = "earliest"

    step: ClassVar[str] = "source"
    klass: ClassVar[str] = ENFORCING
    min_inputs: ClassVar[int] = 0
    max_inputs: ClassVar[int | None] = 0


@dataclass(frozen=True)
class Filter(Node):
    predicate: str = ""
    step: ClassVar[str] = "filter"


@dataclass(frozen=True)
class Project(Node):
    columns: tuple[NamedExpr, ...] = ()
    step: ClassVar[str] = "project"


@dataclass(frozen=True)
class Explode(Node):
    expr: str = ""
    alias: str = ""  # ``as`` in JSON
    outer: bool = False
    step: ClassVar[str] = "explode"


@dataclass(frozen=True)
class Union(Node):
    step: ClassVar[str] = "union"
    min_inputs: ClassVar[int] = 2
    max_inputs: ClassVar[int | None] = None


@dataclass(frozen=True)
class Aggregate(Node):
    group_by: tuple[NamedExpr, ...] = ()
    aggregates: tuple[AggCall, ...] = ()
    window: Window | None = None
    step: ClassVar[str] = "aggregate"
    klass: ClassVar[str] = ENFORCING


@dataclass(frozen=True)
class Join(Node):
    type: str = "inner"
    left_keys: tuple[str, ...] = ()
    right_keys: tuple[str, ...] = ()
    condition: str | None = None
    time_bound: str | None = None
    step: ClassVar[str] = "join"
    klass: ClassVar[str] = ENFORCING
    min_inputs: ClassVar[int] = 2
    max_inputs: ClassVar[int | None] = 2


@dataclass(frozen=True)
class Deduplicate(Node):
    keys: tuple[str, ...] = ()
    within: str | None = None
    step: ClassVar[str] = "deduplicate"
    klass: ClassVar[str] = ENFORCING


@dataclass(frozen=True)
class TopN(Node):
    partition_by: tuple[str, ...] = ()
    order_by: tuple[OrderKey, ...] = ()
    n: int = 1
    step: ClassVar[str] = "top_n"
    klass: ClassVar[str] = ENFORCING


@dataclass(frozen=True)
class Recursive(Node):
    body: tuple[Node, ...] = ()
    body_input: str = ""
    body_output: str = ""
    feedback_partitions: int = 1
    step: ClassVar[str] = "recursive"
    klass: ClassVar[str] = ENFORCING


@dataclass(frozen=True)
class Sink(Node):
    topic: str = ""
    format: str = "json"
    key_columns: tuple[str, ...] = ()
    mode: str = "append"
    delivery: str = "exactly_once"
    step: ClassVar[str] = "sink"
    klass: ClassVar[str] = ENFORCING


@dataclass(frozen=True)
class StopGate(Node):
    migration: str | None = None
    step: ClassVar[str] = "stop_gate"


@dataclass(frozen=True)
class StartGate(Node):
    migration: str | None = None
    step: ClassVar[str] = "start_gate"


STEPS: dict[str, type[Node]] = {
    cls.step: cls for cls in (Source, Filter, Project, Explode, Union, Aggregate, Join,
                              Deduplicate, TopN, Recursive, Sink, StopGate, StartGate)
}

STATEFUL_STEPS = frozenset({"aggregate", "deduplicate", "top_n", "recursive"})


def step_class(name: str) -> type[Node]:
    try:
        return STEPS[name]
    except KeyError:
        close = difflib.get_close_matches(name, STEPS, n=1, cutoff=0.5)
        raise PlanError(f"unknown step '{name}'", expected="one of " + ", ".join(STEPS),
                        found=repr(name),
                        hint=f"Did you mean '{close[0]}'?" if close else None) from None


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

    @property
    def state_partitions(self) -> int | None:
        v = self.config.get("state_partitions")
        return v if isinstance(v, int) else None

    @property
    def sink(self) -> Sink:
        return self.nodes[self.sink_id]  # type: ignore[return-value]

    def pointer(self, node_id: str, field_name: str | None = None) -> str:
        base = self.pointers.get(node_id, "")
        return base + ("/" + field_name if field_name else "")


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
        n_in = len(node.inputs)
        lo, hi = node.min_inputs, node.max_inputs
        if n_in < lo or (hi is not None and n_in > hi):
            want = (f"exactly {lo}" if lo == hi else
                    f"at least {lo}" if hi is None else f"{lo} to {hi}")
            raise PlanError(f"a {node.step} step takes {want} input(s)", file=file,
                            node=node.id, pointer=pointers.get(node.id, "") + "/inputs",
                            expected=f"{want} input(s)", found=f"{n_in}")
        for i, dep in enumerate(node.inputs):
            if dep not in by_id:
                close = difflib.get_close_matches(dep, list(by_id), n=1, cutoff=0.6)
                raise PlanError(f"input '{dep}' does not exist", file=file, node=node.id,
                                pointer=pointers.get(node.id, "") + f"/inputs/{i}",
                                expected="the id of a node in the plan", found=repr(dep),
                                hint=f"Did you mean '{close[0]}'?" if close else None)
            dependents[dep].append(node.id)
    # Kahn's algorithm, inputs first; what is left over lies on or behind a cycle.
    missing = {nid: len(node.inputs) for nid, node in by_id.items()}
    order = [nid for nid, k in missing.items() if k == 0]
    i = 0
    while i < len(order):
        for dep in dependents[order[i]]:
            missing[dep] -= 1
            if missing[dep] == 0:
                order.append(dep)
        i += 1
    if len(order) != len(by_id):
        cycle = _find_cycle(by_id, {nid for nid, k in missing.items() if k > 0})
        first = cycle[0]
        raise PlanError("the graph has a cycle" + where, file=file, node=first,
                        pointer=pointers.get(first, "") + "/inputs",
                        expected="an acyclic graph (express recursion with a recursive step)",
                        found=" -> ".join(cycle))
    return {nid: by_id[nid] for nid in order}, dependents


def _find_cycle(by_id: dict[str, Node], suspects: set[str]) -> list[str]:
    """One cycle among the nodes Kahn's algorithm could not order, as a closed path."""
    start = min(suspects)
    path: list[str] = []
    seen: dict[str, int] = {}
    nid = start
    while nid not in seen:
        seen[nid] = len(path)
        path.append(nid)
        nid = next(i for i in by_id[nid].inputs if i in suspects)
    cycle = path[seen[nid]:] + [nid]
    return list(reversed(cycle))
