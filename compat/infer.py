"""Semantic validation and inference over a plan, in topological order.

For every node this computes what the checker and the builder need (``NodeInfo``): output
columns and their types, the changelog mode (Flink's retraction modes: inserts only, upserts,
or retractions), whether the node holds state, reads streams or tables, which columns carry a
watermark, and whether its expressions are deterministic.  Anything Spark could not run is
refused here, with the reason, before anything is deployed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from compat import expr as E
from compat import types as T
from compat.errors import ExpressionError, PlanError
from compat.model import (
    Aggregate,
    Deduplicate,
    Explode,
    Filter,
    Join,
    Node,
    Plan,
    Project,
    Recursive,
    Sink,
    Source,
    StartGate,
    StopGate,
    TopN,
    Union,
)

INSERT = "I"
UPSERT = "I,UA"
RETRACT = "I,UB,UA,D"
_MODE_RANK = {INSERT: 0, UPSERT: 1, RETRACT: 2}

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

    @property
    def types(self) -> dict[str, str]:
        return dict(self.columns)


class _Ctx:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.file = plan.file

    def err(self, node: Node, field: str, message: str, *, ptr: str | None = None,
            **kw: object) -> PlanError:
        pointer = ptr if ptr is not None else self.plan.pointer(node.id, field)
        return PlanError(message, file=self.file, node=node.id, pointer=pointer,
                         **kw)  # type: ignore[arg-type]

    def expr_type(self, node: Node, field: str, text: str, scope: E.Scope, *,
                  ptr: str | None = None, allow_aggregate: bool = False) -> str:
        try:
            info = E.analyze(text)
            if not allow_aggregate and info.has_aggregate:
                raise ExpressionError(
                    f"aggregate function in '{text}' outside an aggregate step",
                    expected="a row-level expression", found=text)
            return E.type_of(info, scope)
        except ExpressionError as e:
            pointer = ptr if ptr is not None else self.plan.pointer(node.id, field)
            raise e.with_location(file=self.file, node=node.id, pointer=pointer) from None


def analyze(plan: Plan, reuse: Plan | None = None) -> dict[str, NodeInfo]:
    """Validate ``plan`` semantically and return the inferred NodeInfo per node id.

    With ``reuse`` (an analysed plan that ``plan`` was loaded against), a node that is the
    very same object there and whose inputs got the very same infos gets its old info:
    by induction its whole upstream is identical, so validation would say the same.
    """
    ctx = _Ctx(plan)
    infos: dict[str, NodeInfo] = {}
    sink_mode = plan.sink.mode
    if reuse is not None and (not reuse.info or reuse.sink.mode != sink_mode):
        reuse = None
    old_nodes = reuse.nodes if reuse is not None else {}
    old_infos = reuse.info if reuse is not None else {}
    for nid, node in plan.nodes.items():
        if old_nodes.get(nid) is node and \
                all(infos[i] is old_infos[i] for i in node.inputs):
            infos[nid] = old_infos[nid]
            continue
        ins = [infos[i] for i in node.inputs]
        infos[nid] = _infer(ctx, node, ins, sink_mode, infos)
    plan.info = infos
    return infos


def _infer(ctx: _Ctx, node: Node, ins: list[NodeInfo], sink_mode: str,
           infos: dict[str, NodeInfo]) -> NodeInfo:
    fn = _RULES[type(node)]
    return fn(ctx, node, ins, sink_mode)


def _scope(info: NodeInfo) -> E.Scope:
    return E.Scope(dict(info.columns))


def _unique(ctx: _Ctx, node: Node, names: list[str], field: str) -> None:
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        low = name.lower()
        if low in seen:
            raise ctx.err(node, f"{field}/{i}/name" if field else "",
                          f"duplicate output column '{name}' (Spark column names are "
                          f"case-insensitive)", expected="unique column names",
                          found=f"'{name}' twice")
        seen[low] = i


def _duration(ctx: _Ctx, node: Node, field: str, text: str) -> float:
    secs = duration_seconds(text)
    if secs is None:
        raise ctx.err(node, field, "invalid duration", expected="a duration like '10 minutes'",
                      found=repr(text))
    return secs


# -- per step ---------------------------------------------------------------------------


def _source(ctx: _Ctx, node: Source, ins: list[NodeInfo], sink_mode: str) -> NodeInfo:
    cols = []
    for i, c in enumerate(node.schema):
        try:
            cols.append((c.name.lower(), T.parse_type(c.type)))
        except T.TypeSyntaxError as e:
            raise ctx.err(node, f"schema/{i}/type", f"invalid type: {e}",
                          expected="a Spark SQL type such as bigint or array<string>",
                          found=repr(c.type)) from None
    _unique(ctx, node, [c.name for c in node.schema], "schema")
    types = dict(cols)
    if node.format == "string" and (len(cols) != 1 or cols[0][1] != "string"):
        raise ctx.err(node, "schema", "a source with format 'string' reads each record "
                      "as one string column", expected="one column of type string",
                      found=", ".join(f"{n} {t}" for n, t in cols))
    for i, k in enumerate(node.key_columns):
        if k.lower() not in types:
            raise ctx.err(node, f"key_columns/{i}", f"key column '{k}' is not in the schema",
                          expected="one of " + ", ".join(types), found=repr(k))
    if node.role == "table" and not node.key_columns:
        raise ctx.err(node, "key_columns", "a table source keeps the latest value per key, "
                      "so it needs key_columns", expected="a non-empty key_columns list",
                      found="none")
    marks: frozenset[str] = frozenset()
    if node.event_time:
        col = node.event_time.column.lower()
        if col not in types:
            raise ctx.err(node, "event_time/column", f"event-time column '{col}' is not in "
                          "the schema", expected="one of " + ", ".join(types), found=repr(col))
        if types[col] not in ("timestamp", "timestamp_ntz"):
            raise ctx.err(node, "event_time/column", "the event-time column must be a "
                          "timestamp", expected="timestamp", found=types[col])
        _duration(ctx, node, "event_time/watermark", node.event_time.watermark)
        marks = frozenset({col})
    mode = UPSERT if node.role == "table" else INSERT
    return NodeInfo(tuple(cols), mode, node.role == "stream", False, marks, True,
                    tuple(c.name for c in node.schema))


def _filter(ctx: _Ctx, node: Filter, ins: list[NodeInfo], sink_mode: str) -> NodeInfo:
    (src,) = ins
    t = ctx.expr_type(node, "predicate", node.predicate, _scope(src))
    if t not in ("boolean", T.UNKNOWN, "void"):
        raise ctx.err(node, "predicate", "a filter predicate must be a condition",
                      expected="boolean", found=t)
    # Dropping an update from an upsert stream would leave the old row visible downstream,
    # so, as in Flink, a filter over updates emits retractions.
    mode = RETRACT if src.mode != INSERT else INSERT
    det = E.analyze(node.predicate).deterministic
    return NodeInfo(src.columns, mode, src.stream, False, src.watermarks, det, src.names)


def _project(ctx: _Ctx, node: Project, ins: list[NodeInfo], sink_mode: str) -> NodeInfo:
    (src,) = ins
    scope = _scope(src)
    cols = []
    marks = set()
    det = True
    for i, c in enumerate(node.columns):
        t = ctx.expr_type(node, f"columns/{i}/expr", c.expr, scope)
        cols.append((c.name.lower(), t))
        ast = E.analyze(c.expr).ast
        det = det and E.analyze(c.expr).deterministic
        if ast[0] == "col" and len(ast[1]) == 1 and ast[1][0] in src.watermarks:
            marks.add(c.name.lower())
    _unique(ctx, node, [c.name for c in node.columns], "columns")
    return NodeInfo(tuple(cols), src.mode, src.stream, False, frozenset(marks), det,
                    tuple(c.name for c in node.columns))


def _explode(ctx: _Ctx, node: Explode, ins: list[NodeInfo], sink_mode: str) -> NodeInfo:
    (src,) = ins
    t = ctx.expr_type(node, "expr", node.expr, _scope(src))
    if t.startswith("array<"):
        elem = T.array_element(t)
    elif t.startswith("map<"):
        k, v = T.map_kv(t)
        elem = f"struct<key:{k},value:{v}>"
    elif t == T.UNKNOWN:
        elem = T.UNKNOWN
    else:
        raise ctx.err(node, "expr", "explode needs an array or a map",
                      expected="array<...> or map<...>", found=t)
    if node.alias.lower() in src.types:
        raise ctx.err(node, "as", f"column '{node.alias}' already exists in the input",
                      expected="a new column name", found=repr(node.alias))
    det = _det(node.expr)
    return NodeInfo(src.columns + ((node.alias.lower(), elem),), src.mode, src.stream, False,
                    src.watermarks, det, src.names + (node.alias,))


def _union(ctx: _Ctx, node: Union, ins: list[NodeInfo], sink_mode: str) -> NodeInfo:
    first = ins[0]
    cols = list(first.columns)
    for k, other in enumerate(ins[1:], start=1):
        names = [c[0] for c in other.columns]
        if names != [c[0] for c in cols]:
            raise ctx.err(node, f"inputs/{k}", "union inputs must have the same columns "
                          "in the same order", expected=", ".join(c[0] for c in cols),
                          found=", ".join(names))
        for i, (name, t) in enumerate(other.columns):
            w = T.wider(cols[i][1], t)
            if w == T.UNKNOWN and T.UNKNOWN not in (cols[i][1], t):
                raise ctx.err(node, f"inputs/{k}", f"union column '{name}' has "
                              "incompatible types", expected=cols[i][1], found=t)
            cols[i] = (name, w)
    mode = max((i.mode for i in ins), key=_MODE_RANK.__getitem__)
    marks = frozenset.intersection(*(i.watermarks for i in ins))
    return NodeInfo(tuple(cols), mode, any(i.stream for i in ins), False, marks, True,
                    first.names)


def _aggregate(ctx: _Ctx, node: Aggregate, ins: list[NodeInfo], sink_mode: str) -> NodeInfo:
    (src,) = ins
    scope = _scope(src)
    if src.mode != INSERT:
        raise ctx.err(node, "inputs", "Spark cannot aggregate a stream of updates (a second "
                      "aggregation needs windowed, append-mode input)",
                      expected="an insert-only input [I]", found=f"[{src.mode}]")
    cols: list[tuple[str, str]] = []
    names: list[str] = []
    marks: set[str] = set()
    det = True
    if node.window:
        w = node.window
        wcol = w.column.lower()
        if wcol not in src.types:
            raise ctx.err(node, "window/column", f"window column '{w.column}' is not in the "
                          "input", expected="one of " + ", ".join(src.types),
                          found=repr(w.column))
        if src.types[wcol] not in ("timestamp", "timestamp_ntz", T.UNKNOWN):
            raise ctx.err(node, "window/column", "a window needs a timestamp column",
                          expected="timestamp", found=src.types[wcol])
        size = _duration(ctx, node, "window/size", w.size)
        if w.type == "hopping":
            if not w.slide:
                raise ctx.err(node, "window", "a hopping window needs a slide",
                              expected="a 'slide' duration", found="none")
            slide = _duration(ctx, node, "window/slide", w.slide)
            if slide > size:
                raise ctx.err(node, "window/slide", "the slide is longer than the window",
                              expected=f"at most {w.size}", found=w.slide)
        if w.type == "session" and w.gap:
            _duration(ctx, node, "window/gap", w.gap)
        if wcol not in src.watermarks:
            det = False  # windows over processing time depend on when rows arrive
        cols.append(("window", "struct<start:timestamp,end:timestamp>"))
        names.append("window")
        if wcol in src.watermarks:
            marks.add("window")
    for i, g in enumerate(node.group_by):
        t = ctx.expr_type(node, f"group_by/{i}/expr", g.expr, scope)
        det = det and _det(g.expr)
        cols.append((g.name.lower(), t))
        names.append(g.name)
    for i, a in enumerate(node.aggregates):
        fn = a.function.lower()
        fn = {"mean": "avg", "std": "stddev"}.get(fn, fn)
        if fn not in E.AGGREGATE_FUNCTIONS:
            import difflib
            close = difflib.get_close_matches(fn, sorted(E.AGGREGATE_FUNCTIONS), n=1)
            raise ctx.err(node, f"aggregates/{i}/function", f"unknown aggregate function "
                          f"'{a.function}'", expected="a Spark aggregate function",
                          found=repr(a.function),
                          hint=f"Did you mean '{close[0]}'?" if close else None)
        if a.distinct and src.stream:
            raise ctx.err(node, f"aggregates/{i}/distinct", "Spark does not support distinct "
                          "aggregations on streams", expected="approx_count_distinct(...) or "
                          "a deduplicate step before the aggregate", found="distinct: true")
        args = []
        for j, arg in enumerate(a.args):
            if arg.strip() == "*":
                args.append(("star",))
                continue
            ctx.expr_type(node, f"aggregates/{i}/args/{j}", arg, scope)
            ast = E.shape(arg)
            det = det and E.is_deterministic(ast)
            args.append(ast)
        t = E.infer_type(("fn", fn, tuple(args), a.distinct), scope)
        cols.append((a.name.lower(), t))
        names.append(a.name)
    _unique(ctx, node, names, "")
    windowed_final = node.window is not None and node.window.column.lower() in src.watermarks
    if sink_mode == "append":
        if node.window is None:
            raise ctx.err(node, "", "an append sink fed by an unwindowed aggregate: Spark's "
                          "append mode emits each row once, and an unwindowed aggregate "
                          "never finishes a group", expected="sink mode 'update' or "
                          "'complete', or a window on an event-time column",
                          found="mode 'append' downstream", ptr=ctx.plan.pointer(node.id))
        if not windowed_final:
            raise ctx.err(node, "window/column", "append mode needs a watermark on the "
                          "window column, so that Spark knows when a window is final",
                          expected="an event_time column with a watermark",
                          found=repr(node.window.column))
        mode = INSERT
    else:
        mode = UPSERT
    return NodeInfo(tuple(cols), mode, src.stream, src.stream, frozenset(marks), det,
                    tuple(names))


def _join(ctx: _Ctx, node: Join, ins: list[NodeInfo], sink_mode: str) -> NodeInfo:
    left, right = ins
    lid, rid = node.inputs
    if len(node.left_keys) != len(node.right_keys):
        raise ctx.err(node, "right_keys", "left_keys and right_keys pair up one by one",
                      expected=f"{len(node.left_keys)} right key(s)",
                      found=str(len(node.right_keys)))
    if not node.left_keys and not node.condition:
        raise ctx.err(node, "left_keys", "a join needs keys or a condition",
                      expected="left_keys/right_keys or a condition", found="neither")
    lscope, rscope = _scope(left), _scope(right)
    for i, (lk, rk) in enumerate(zip(node.left_keys, node.right_keys)):
        lt = ctx.expr_type(node, f"left_keys/{i}", lk, lscope)
        rt = ctx.expr_type(node, f"right_keys/{i}", rk, rscope)
        if T.wider(lt, rt) == T.UNKNOWN and T.UNKNOWN not in (lt, rt):
            raise ctx.err(node, f"right_keys/{i}", "join keys of incomparable types",
                          expected=lt, found=rt)
    both = E.Scope({}, {lid.lower(): left.types, rid.lower(): right.types})
    both.columns = {k: v for k, v in {**right.types, **left.types}.items()
                    if not (k in left.types and k in right.types)}
    for f in ("condition", "time_bound"):
        text = getattr(node, f)
        if text:
            t = ctx.expr_type(node, f, text, both)
            if t not in ("boolean", T.UNKNOWN):
                raise ctx.err(node, f, f"the join {f} must be a condition",
                              expected="boolean", found=t)
    stateful = left.stream and right.stream
    if not left.stream and not right.stream:
        raise ctx.err(node, "inputs", "Spark cannot join two tables continuously",
                      expected="at least one stream input", found="two table inputs")
    if stateful:
        for side, info in (("left", left), ("right", right)):
            if info.mode != INSERT:
                raise ctx.err(node, "inputs", f"the {side} input of a stream-stream join "
                              "emits updates, which Spark cannot join",
                              expected="[I]", found=f"[{info.mode}]")
        if node.type in ("left", "right", "full", "left_anti") and not node.time_bound:
            raise ctx.err(node, "time_bound", f"a stream-stream {node.type} join needs a "
                          "time bound and watermarks on both sides, or its state never ends",
                          expected="a time_bound such as 'r.ts BETWEEN l.ts AND l.ts + "
                          "INTERVAL 1 HOUR'", found="none")
        if node.time_bound and not (left.watermarks and right.watermarks) and \
                node.type != "inner":
            raise ctx.err(node, "inputs", "an outer stream-stream join needs a watermark on "
                          "both inputs", expected="event_time on both sides",
                          found="a side without a watermark")
    else:
        table_side = "left" if not left.stream else "right"
        ok = {"left": ("inner", "right"), "right": ("inner", "left", "left_semi",
                                                    "left_anti")}[table_side]
        if node.type not in ok:
            raise ctx.err(node, "type", f"a {node.type} join with a table on the "
                          f"{table_side} is not supported (the stream side drives the join)",
                          expected=" or ".join(ok), found=repr(node.type))
    # Output: left columns, then right ones; a clash is dropped when it is a paired
    # equi-join key, otherwise renamed <right id>_<name>.
    cols = list(left.columns)
    names = list(left.names)
    if node.type not in ("left_semi", "left_anti"):
        paired = {(lk.lower(), rk.lower()) for lk, rk in zip(node.left_keys, node.right_keys)}
        lnames = {c[0] for c in left.columns}
        for (name, t), orig in zip(right.columns, right.names):
            if name in lnames:
                if (name, name) in paired:
                    continue
                name, orig = f"{rid.lower()}_{name}", f"{rid}_{orig}"
            cols.append((name, t))
            names.append(orig)
        _unique(ctx, node, names, "")
    marks = left.watermarks | (right.watermarks & {c[0] for c in cols})
    det = all(_det(x) for x in
              (*node.left_keys, *node.right_keys, node.condition or "1", node.time_bound or "1"))
    mode = INSERT if stateful else (left.mode if left.stream else right.mode)
    return NodeInfo(tuple(cols), mode, True, stateful, frozenset(marks), det, tuple(names))


def _dedup(ctx: _Ctx, node: Deduplicate, ins: list[NodeInfo], sink_mode: str) -> NodeInfo:
    (src,) = ins
    for i, k in enumerate(node.keys):
        if k.lower() not in src.types:
            raise ctx.err(node, f"keys/{i}", f"key column '{k}' is not in the input",
                          expected="one of " + ", ".join(src.types), found=repr(k))
    if src.mode != INSERT:
        raise ctx.err(node, "inputs", "Spark cannot deduplicate a stream of updates",
                      expected="[I]", found=f"[{src.mode}]")
    if node.within:
        _duration(ctx, node, "within", node.within)
        if not src.watermarks:
            raise ctx.err(node, "within", "deduplication within a time needs a watermark "
                          "on the input", expected="an event_time upstream", found="none")
    return NodeInfo(src.columns, INSERT, src.stream, src.stream, src.watermarks, True,
                    src.names)


def _top_n(ctx: _Ctx, node: TopN, ins: list[NodeInfo], sink_mode: str) -> NodeInfo:
    (src,) = ins
    scope = _scope(src)
    det = True
    for i, p in enumerate(node.partition_by):
        ctx.expr_type(node, f"partition_by/{i}", p, scope)
        det = det and _det(p)
    for i, o in enumerate(node.order_by):
        ctx.expr_type(node, f"order_by/{i}/expr", o.expr, scope)
        det = det and _det(o.expr)
    if src.mode != INSERT:
        raise ctx.err(node, "inputs", "top_n over a stream of updates is not supported",
                      expected="[I]", found=f"[{src.mode}]")
    if sink_mode == "append":
        raise ctx.err(node, "", "a top_n step retracts rows that fall out of the top, so it "
                      "cannot feed an append sink", expected="sink mode 'update' with "
                      "key_columns", found="mode 'append'", ptr=ctx.plan.pointer(node.id))
    return NodeInfo(src.columns, RETRACT, src.stream, src.stream, frozenset(), det, src.names)


def _recursive(ctx: _Ctx, node: Recursive, ins: list[NodeInfo], sink_mode: str) -> NodeInfo:
    (src,) = ins
    if src.mode != INSERT:
        raise ctx.err(node, "inputs", "recursion needs an insert-only input",
                      expected="[I]", found=f"[{src.mode}]")
    infos: dict[str, NodeInfo] = {node.body_input: src}
    pointers = ctx.plan.pointers
    # Body nodes are addressed as "<recursive id>/<body id>" in the plan's pointers.
    sub = Plan(query=ctx.plan.query, nodes={}, file=ctx.file,
               pointers={b.id: pointers[f"{node.id}/{b.id}"] for b in node.body})
    sub.pointers[node.body_input] = pointers[node.id] + "/body_input"
    subctx = _Ctx(sub)
    done: set[str] = {node.body_input}
    pending = list(node.body)
    while pending:  # the body was checked acyclic; resolve in dependency order
        for b in list(pending):
            if all(i in done for i in b.inputs):
                info = _RULES[type(b)](subctx, b, [infos[i] for i in b.inputs], "append")
                if info.mode != INSERT:
                    raise subctx.err(b, "", "a recursive body must emit inserts only",
                                     expected="[I]", found=f"[{info.mode}]",
                                     ptr=sub.pointers[b.id])
                infos[b.id] = info
                done.add(b.id)
                pending.remove(b)
    out = infos[node.body_output]
    if [c[0] for c in out.columns] != [c[0] for c in src.columns] or \
            not all(T.can_widen(a[1], b[1]) for a, b in zip(out.columns, src.columns)):
        raise ctx.err(node, "body_output", "the body output is fed back into the body "
                      "input, so it must have the input's columns",
                      expected=", ".join(f"{n} {t}" for n, t in src.columns),
                      found=", ".join(f"{n} {t}" for n, t in out.columns))
    det = all(i.deterministic for k, i in infos.items() if k != node.body_input)
    return NodeInfo(src.columns, INSERT, src.stream, True, src.watermarks, det, src.names)


def _sink(ctx: _Ctx, node: Sink, ins: list[NodeInfo], sink_mode: str) -> NodeInfo:
    (src,) = ins
    for i, k in enumerate(node.key_columns):
        if k.lower() not in src.types:
            raise ctx.err(node, f"key_columns/{i}", f"key column '{k}' is not in the output",
                          expected="one of " + ", ".join(src.types), found=repr(k))
    if node.format == "string" and (len(src.columns) != 1 or
                                    src.columns[0][1] not in ("string", T.UNKNOWN)):
        raise ctx.err(node, "format", "a sink with format 'string' writes one string column",
                      expected="exactly one string column",
                      found=", ".join(f"{n} {t}" for n, t in src.columns))
    if node.mode == "append" and src.mode != INSERT:
        raise ctx.err(node, "mode", "an append sink needs an insert-only input",
                      expected="[I]", found=f"[{src.mode}]")
    if node.mode == "complete" and not _has_aggregate(ctx.plan, node):
        raise ctx.err(node, "mode", "Spark's complete mode needs a streaming aggregation",
                      expected="an aggregate upstream", found="none")
    if src.mode == RETRACT and not node.key_columns:
        raise ctx.err(node, "key_columns", "the input retracts rows, and a retraction is "
                      "written as a tombstone for its key", expected="key_columns",
                      found="none")
    if not src.stream:
        raise ctx.err(node, "inputs", "the sink is fed only by tables; a streaming query "
                      "needs at least one stream source", expected="a stream upstream",
                      found="tables only")
    return NodeInfo(src.columns, src.mode if node.mode != "complete" else UPSERT, src.stream,
                    False, src.watermarks, True, src.names)


def _gate(ctx: _Ctx, node: Node, ins: list[NodeInfo], sink_mode: str) -> NodeInfo:
    (src,) = ins
    return NodeInfo(src.columns, src.mode, src.stream, False, src.watermarks, True, src.names)


def _has_aggregate(plan: Plan, node: Node) -> bool:
    stack = list(node.inputs)
    seen = set()
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        n = plan.nodes[nid]
        if isinstance(n, Aggregate):
            return True
        stack.extend(n.inputs)
    return False


_RULES = {
    Source: _source, Filter: _filter, Project: _project, Explode: _explode, Union: _union,
    Aggregate: _aggregate, Join: _join, Deduplicate: _dedup, TopN: _top_n,
    Recursive: _recursive, Sink: _sink, StopGate: _gate, StartGate: _gate,
}


def characteristics(plan: Plan) -> list[str]:
    """The query characteristics of the ksqlDB upgrade taxonomy."""
    infos = plan.info
    stateful = [n for n in plan.nodes.values() if infos[n.id].stateful]
    out = []
    if stateful:
        out.append("stateful")
    if any(isinstance(n, Aggregate) and n.window for n in plan.nodes.values()):
        out.append("windowed")
    if any(isinstance(n, Join) for n in plan.nodes.values()):
        out.append("joined")
    if len(stateful) > 1 or any(isinstance(n, Recursive) for n in plan.nodes.values()):
        out.append("multistage")
    if not all(i.deterministic for i in infos.values()):
        out.append("nondeterministic")
    if not out:
        out.append("simple")
    return out


def _det(text: str) -> bool:
    return E.analyze(text).deterministic
