"""``recursive``: a loop whose body is applied to its own output until nothing new comes
out (recursion is expressed inside one node; the plan graph stays acyclic).  Enforcing:
the body is compared as a whole (its state and its feedback topic).

Versions (old versions stay buildable and keep their meaning):

1. One input (the base rows), a body reading only the loop (``body_input``), a declared
   ``feedback`` topic; set semantics, at most 100 iterations, an error past them.
2. ``union`` (``set`` | ``bag``), ``max_iterations`` and ``on_limit`` (``error`` |
   ``return``); further inputs after the base that the body reads by their ids (the edges
   of a graph); no feedback topic (the loop runs inside each micro-batch over state the
   step keeps in the checkpoint, ``migrate/build/recursive.py``).  The body must be
   monotone: filter, project, explode, union and inner or left-semi joins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from compat import types as T
from compat.demand import Demand, everything, moves_filter, reads
from compat.errors import PlanError
from compat.findings import MIGRATE, RESTART, Finding, register_codes
from compat.infer import INSERT, InferContext, NodeInfo, infer_step
from compat.model import (
    ENFORCING,
    ID,
    INT32_MAX,
    PARTITIONS,
    Node,
    Plan,
    build_graph,
    enum,
    prop,
    topological_order,
)
from compat.pushdown import Conjunct, PushGraph, Targets, push_through
from compat.pyspark_text import refuse
from compat.rules import RuleContext, compare
from compat.signing import NodeSig, digest, sign_step, token
from compat.steps.sink import Sink
from compat.steps.source import Source

#: Spark's spark.sql.cteRecursionLevelLimit
DEFAULT_MAX_ITERATIONS = 100
#: the first version with union, max_iterations, on_limit and further inputs
V2 = 2
#: body steps a version 2 loop can run: monotone, so that rows derived once stay derived
MONOTONE_STEPS = frozenset({"filter", "project", "explode", "union", "join"})
MONOTONE_JOINS = frozenset({"inner", "left_semi"})


@dataclass(frozen=True)
class Feedback:
    """The internal topic that carries the loop's rows back to the body."""

    partitions: int = prop(schema=PARTITIONS)


@dataclass(frozen=True, kw_only=True)
class Recursive(Node):
    """The least fixpoint R = base ∪ body(R) over all input so far, maintained
    incrementally: each micro-batch feeds only its new rows around the loop (semi-naive)
    until nothing new is derived.  ``inputs[0]`` is the base; from version 2 the further
    inputs are relations the body may read by their ids besides the loop's own rows
    (``body_input``).  Body nodes are addressed as ``<recursive id>/<body id>`` in errors."""

    body: tuple[Node, ...] = prop(min_items=1)
    body_input: str = prop(schema=ID, doc="the name under which the body reads the loop's "
                           "rows (the base rows, then each iteration's new rows)")
    body_output: str = prop(schema=ID, doc="the body node whose rows go around the loop "
                            "again; it must have the base's columns")
    feedback: Feedback | None = prop(None, doc="version 1 only (required there): the "
                                     "partitions of the loop's feedback topic.  Version 2 "
                                     "keeps the loop's state in the query's checkpoint.")
    union: str = prop("set", schema=enum("set", "bag"), doc="version 2: 'set' (SQL UNION) "
                      "keeps a row derived twice once, so recursion over cyclic data "
                      "terminates; 'bag' (UNION ALL) keeps every derivation and relies on "
                      "the body deriving nothing at some point, or on max_iterations")
    max_iterations: int = prop(DEFAULT_MAX_ITERATIONS,
                               schema={"type": "integer", "minimum": 1,
                                       "maximum": INT32_MAX},
                               doc="version 2: how many times the body may be applied to "
                               "one micro-batch's new rows before the limit applies "
                               "(default 100, as Spark's spark.sql.cteRecursionLevelLimit)")
    on_limit: str = prop("error", schema=enum("error", "return"), doc="version 2: what "
                         "happens when the body still derives new rows at max_iterations: "
                         "'error' stops the query naming the step and the iteration count; "
                         "'return' keeps what was derived and records a warning in the "
                         "progress output (Materialize's ERROR AT / RETURN AT RECURSION "
                         "LIMIT)")
    step: ClassVar[str] = "recursive"
    klass: ClassVar[str] = ENFORCING
    max_inputs: ClassVar[int | None] = None
    max_version: ClassVar[int] = V2

    def traits(self) -> frozenset[str]:
        return frozenset({"recursive"})

    @property
    def further_inputs(self) -> tuple[str, ...]:
        """The inputs the body reads besides the loop (version 2)."""
        return self.inputs[1:]


register_codes({
    "recursive-body-changed": ("migrate", "error", "topology", MIGRATE),
    "recursive-feedback-changed": ("migrate", "error", "scaling", MIGRATE),
    # set <-> bag changes how many times a row is in the loop's state and output
    "recursive-union-changed": ("migrate", "error", "data_selection", MIGRATE),
    # the limit applies to the loop's new rows from the restart on; rows derived before
    # keep the old limit (a backfill requirement makes it a migration)
    "recursive-limit-changed": ("in_place", "warning", "data_selection", RESTART),
    "recursive-on-limit-changed": ("in_place", "info", "data_selection", RESTART),
})


@dataclass(frozen=True, kw_only=True)
class _LoopInput(Node):
    """The looped stream (or a further input of the step), as the body's graph sees it."""

    min_inputs: ClassVar[int] = 0
    max_inputs: ClassVar[int | None] = 0


def _check_version(rec: Recursive, ctx: InferContext) -> None:
    """Version 1 keeps its meaning: one input, a feedback topic, set semantics, the default
    limit; version 2 declares no feedback topic."""
    if rec.version < V2:
        if rec.feedback is None:
            raise ctx.err(rec, "feedback", "a version 1 recursive step declares its "
                          "feedback topic", expected="feedback {partitions}", found="none",
                          hint="Or write version 2, which needs no feedback topic.")
        extra = [f for f, d in (("union", "set"), ("max_iterations", DEFAULT_MAX_ITERATIONS),
                                ("on_limit", "error")) if getattr(rec, f) != d]
        if extra:
            raise ctx.err(rec, extra[0], f"'{extra[0]}' is a field of recursive version 2",
                          expected="version 2 for union, max_iterations or on_limit",
                          found="version 1")
        if len(rec.inputs) != 1:
            raise ctx.err(rec, "inputs", "a version 1 recursive step takes exactly 1 input",
                          expected="1 input (version 2 reads further inputs)",
                          found=str(len(rec.inputs)))
    elif rec.feedback is not None:
        raise ctx.err(rec, "feedback", "a version 2 recursive step has no feedback topic "
                      "(its loop runs inside each micro-batch)", expected="no feedback",
                      found=f"feedback {{partitions: {rec.feedback.partitions}}}")
    if len(set(rec.inputs)) != len(rec.inputs):
        raise ctx.err(rec, "inputs", "a recursive step reads each input once",
                      expected="distinct input ids", found=", ".join(rec.inputs))


def _check_body(rec: Recursive, ctx: InferContext) -> dict[str, str]:
    """The body is its own graph; its nodes may read ``body_input`` (the looped stream) and,
    from version 2, the step's further inputs by their ids.  Returns the pointers of the
    body's nodes by body id."""
    base = ctx.pointer(rec.id)
    inner: dict[str, str] = {n.id: ctx.pointers.get(f"{rec.id}/{n.id}", base + "/body")
                             for n in rec.body}
    ids = set(inner)
    if rec.body_input in ids:
        raise ctx.err(rec, "body_input", "body_input must name the looped stream, not a body "
                      "node", expected="a name no body node uses", found=repr(rec.body_input))
    if rec.body_input in rec.further_inputs:
        raise ctx.err(rec, "body_input", "body_input names a further input of the step",
                      expected="a name of its own for the loop's rows",
                      found=repr(rec.body_input))
    inner[rec.body_input] = base + "/body_input"
    outer = []
    for i, fid in enumerate(rec.further_inputs, 1):
        if fid in ids:
            raise PlanError("a body node has the id of an input of its recursive step, "
                            "which the body reads by that id", file=ctx.file, node=fid,
                            pointer=inner[fid] + "/id", expected="a body id that is no "
                            "input of the step", found=repr(fid))
        inner[fid] = base + f"/inputs/{i}"
        outer.append(_LoopInput(id=fid))
    build_graph([_LoopInput(id=rec.body_input), *outer, *rec.body], ctx.file, inner,
                where=f" (in the body of '{rec.id}')")
    if rec.body_output not in ids:
        raise ctx.err(rec, "body_output", "body_output is not a body node",
                      expected="one of " + ", ".join(sorted(ids)),
                      found=repr(rec.body_output))
    for n in rec.body:
        if isinstance(n, (Source, Sink, Recursive)):
            raise PlanError(f"a {n.step} step cannot be inside a recursive body",
                            file=ctx.file, node=n.id, pointer=inner[n.id] + "/step",
                            expected="passive or stateful steps", found=repr(n.step))
        if rec.version >= V2 and (n.step not in MONOTONE_STEPS or (
                n.step == "join" and n.type not in MONOTONE_JOINS)):  # type: ignore[attr-defined]
            what = f"a {n.type} join" if n.step == "join" else \
                f"{'an' if n.step[0] in 'aeiou' else 'a'} {n.step} step"  # type: ignore
            field = "/type" if n.step == "join" else "/step"
            raise PlanError(f"{what} cannot be inside a recursive body: rows derived once "
                            "must stay derived (aggregates sit after the recursion)",
                            file=ctx.file, node=n.id, pointer=inner[n.id] + field,
                            expected="filter, project, explode, union, inner or left_semi "
                            "join", found=repr(n.type if n.step == "join"  # type: ignore
                                               else n.step))
    if rec.version >= V2 and rec.union == "bag" and any(
            n > 1 for n in body_paths(rec).values()):
        # semi-naive evaluation feeds a path only the new rows; under UNION ALL a row
        # reached along two paths would be counted by the order of evaluation
        raise ctx.err(rec, "union", "a bag (UNION ALL) recursion needs a body that reads the "
                      "loop and each further input along one path at most",
                      expected="a linear body, or union 'set'",
                      found="an input read along several paths: " + ", ".join(
                          f"{i} ({n} paths)" for i, n in body_paths(rec).items() if n > 1))
    return inner


@infer_step.register
def _infer(node: Recursive, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    _check_version(node, ctx)
    src = ins[0]
    pointers = _check_body(node, ctx)
    for i, info in enumerate(ins):
        # a table may be read by the body (as of each micro-batch), never looped
        if info.mode != INSERT and (i == 0 or info.stream):
            raise ctx.err(node, f"inputs/{i}", "recursion needs insert-only inputs",
                          expected="[I]", found=f"[{info.mode}]")
    if node.version >= V2 and node.union == "bag":
        _check_bag_semi_joins(node, ctx, ins, pointers)
    infos = body_infos(node, ins, InferContext(ctx.file, {b.id: b for b in node.body},
                                               pointers, "append"))
    out = infos[node.body_output]
    if [c[0] for c in out.columns] != [c[0] for c in src.columns] or \
            not all(T.can_widen(a[1], b[1]) for a, b in zip(out.columns, src.columns)):
        raise ctx.err(node, "body_output", "the body output is fed back into the body "
                      "input, so it must have the input's columns",
                      expected=", ".join(f"{n} {t}" for n, t in src.columns),
                      found=", ".join(f"{n} {t}" for n, t in out.columns))
    det = all(i.deterministic for k, i in infos.items()
              if k != node.body_input and k not in node.further_inputs)
    stream = any(i.stream for i in ins)
    return NodeInfo(src.columns, INSERT, stream, True, src.watermarks, det, src.names,
                    windows=src.windows)


def _check_bag_semi_joins(rec: Recursive, ctx: InferContext, ins: list[NodeInfo],
                          pointers: dict[str, str]) -> None:
    """Under bag semantics a left-semi join may read new rows on its right only from tables.
    It keeps a left row once however many right rows match, so it is not linear in its
    right input: semi-naive evaluation, feeding the right side's new rows apart from its old
    ones, would derive a left row again for each batch that brings another match (the loop,
    or a stream, on the right).  A table is read whole at each batch, never as new rows."""
    body = {b.id: b for b in rec.body}
    streams = {fid for fid, info in zip(rec.further_inputs, ins[1:]) if info.stream}
    reads: dict[str, set[str]] = {rec.body_input: {rec.body_input},
                                  **{f: {f} for f in rec.further_inputs}}
    for bid in _body_order(rec):
        reads[bid] = set().union(*(reads[i] for i in body[bid].inputs))
    for b in rec.body:
        if b.step == "join" and b.type == "left_semi":  # type: ignore[attr-defined]
            fed = sorted(reads[b.inputs[1]] & ({rec.body_input} | streams))
            if fed:
                raise PlanError("a left_semi join in a bag (UNION ALL) recursion reads new "
                                "rows on its right: it keeps a left row once however many "
                                "right rows match, so semi-naive evaluation would derive "
                                "the row again for every batch that brings another match",
                                file=ctx.file, node=b.id, pointer=pointers[b.id] + "/inputs/1",
                                expected="a table on the right (or union 'set')",
                                found="the right side reads " + ", ".join(
                                    f"the loop ('{f}')" if f == rec.body_input else
                                    f"the stream '{f}'" for f in fed))


def body_infos(node: Recursive, ins: list[NodeInfo], sub: InferContext
               ) -> dict[str, NodeInfo]:
    """What the loop (``body_input``), the further inputs and every body node output (the
    builder evaluates the body with them)."""
    body = {b.id: b for b in node.body}
    infos: dict[str, NodeInfo] = {node.body_input: ins[0]}
    infos.update(zip(node.further_inputs, ins[1:]))
    for bid in _body_order(node):
        b = body[bid]
        info = infer_step(b, sub, [infos[i] for i in b.inputs])
        if info.mode != INSERT:
            raise sub.err(b, "", "a recursive body must emit inserts only",
                          expected="[I]", found=f"[{info.mode}]")
        infos[bid] = info
    return infos


def body_order(rec: Recursive) -> list[str]:
    """Body node ids, inputs first (the looped stream and further inputs excluded)."""
    return _body_order(rec)


def _body_order(rec: Recursive) -> list[str]:
    """Body node ids, inputs first (the looped stream and further inputs excluded)."""
    outside = {rec.body_input, *rec.further_inputs}
    graph = {b.id: tuple(i for i in b.inputs if i not in outside) for b in rec.body}
    return topological_order(graph)


def body_paths(rec: Recursive) -> dict[str, int]:
    """How many paths lead from the loop (``body_input``) and from each further input to
    ``body_output``: a body is linear in an input read along one path at most, and then
    semi-naive evaluation may feed it only that input's new rows."""
    body = {b.id: b for b in rec.body}
    out: dict[str, int] = {}
    for start in (rec.body_input, *rec.further_inputs):
        paths: dict[str, int] = {start: 1}
        for bid in _body_order(rec):
            paths[bid] = sum(paths.get(i, 0) for i in body[bid].inputs)
        out[start] = paths.get(rec.body_output, 0)
    return out


@reads.register
def _reads(node: Recursive, demand: Demand, ins: list[NodeInfo]) -> list[Demand]:
    # The loop keeps whole rows of every input in its state (the derived rows and the
    # history of the streams its body reads).
    return everything(node, ins)


@moves_filter.register
def _moves(node: Recursive, conjunct: str, ins: list[NodeInfo], above: Sequence[str]
           ) -> list[tuple[int, str]] | None:
    return None  # a loop of Theseus' own: Spark moves nothing into it


@compare.register
def _compare(old: Recursive, new: Recursive, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    if _body_key(old) != _body_key(new):
        out.append(ctx.f("recursive-body-changed", f"the body of recursive step '{new.id}' "
                         "changed; rows already in the loop were computed by the old body",
                         old, new, "body"))
    if old.feedback is not None and new.feedback is not None and \
            old.feedback.partitions != new.feedback.partitions:
        out.append(ctx.f("recursive-feedback-changed", f"the feedback topic of '{new.id}' "
                         f"goes from {old.feedback.partitions} to {new.feedback.partitions} "
                         "partitions", old, new, "feedback/partitions"))
    if old.union != new.union:
        out.append(ctx.f("recursive-union-changed", f"recursive step '{new.id}' goes from "
                         f"{old.union} to {new.union} semantics: the rows in its state and "
                         "output would be counted differently", old, new, "union"))
    if old.max_iterations != new.max_iterations:
        how = "raised" if new.max_iterations > old.max_iterations else "lowered"
        out.append(ctx.f("recursive-limit-changed", f"the iteration limit of '{new.id}' is "
                         f"{how} from {old.max_iterations} to {new.max_iterations}: it "
                         "applies to new input from the restart on; rows derived before "
                         "stay derived under the old limit", old, new, "max_iterations",
                         history=True))
    if old.on_limit != new.on_limit:
        then = "stop the query" if new.on_limit == "error" else \
            "keep what was derived and warn"
        out.append(ctx.f("recursive-on-limit-changed", f"recursive step '{new.id}' will "
                         f"{then} when it reaches its iteration limit (was on_limit "
                         f"{old.on_limit})", old, new, "on_limit"))
    return out


def _body_key(rec: Recursive) -> tuple:
    """The body in a form independent of ids and formatting (topological, canonical);
    further inputs are named by their position among the step's inputs."""
    body = {b.id: b for b in rec.body}
    order: dict[str, int] = {rec.body_input: -1}
    for i, fid in enumerate(rec.further_inputs, 1):
        order[fid] = -1 - i
    items = []
    for bid in _body_order(rec):
        b = body[bid]
        order[bid] = len(order)
        items.append((b.version, tuple(order[i] for i in b.inputs), b.canonical(),
                      bid == rec.body_output))
    return tuple(items)


@sign_step.register
def _sign(node: Recursive, ins: list[NodeSig], names: tuple[str, ...],
          plan: Plan) -> NodeSig:
    # What a recursion derives depends on its whole body: its canonical form, the body
    # included, is hashed, and its output columns are new tokens by name.
    sig = digest("recursive", node.version, tuple(i.sig for i in ins),
                 repr(node.canonical()))
    return NodeSig(sig, {n.lower(): token(sig, n.lower()) for n in names})


@push_through.register
def _push_through(node: Recursive, c: Conjunct, g: PushGraph) -> Targets | None:
    # The loop feeds its own rows back: a row filtered out of an input could still have
    # derived rows that the conjunct keeps.
    return None


refuse("Spark has no streaming recursion; Theseus builds the fixpoint with a stateful loop "
       "of its own", Recursive)
