"""``aggregate``: groups rows and computes aggregate functions, optionally per window.
Enforcing: Spark keeps one state row per group.

Spark's state schema check compares key and value schemas by position and type, ignoring
names; so a renamed key keeps the state, a retyped one does not.  An argument expression
may change when its type does not: the state keeps its layout, but history stays computed
the old way.

Versions (old versions stay buildable and keep their meaning):

1. over a table read as a changelog, a ``transformWithStateInPandas`` operator;
2. over a changelog, the same state in PySpark's row-based ``transformWithState`` (no
   pandas frame per group): Spark names the operator otherwise and refuses a checkpoint
   whose operators differ, so a query moves from version 1 by a migration.  Refused over a
   stream, where it would mean what 1 means.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from compat import expr as E
from compat import types as T
from compat.demand import Demand, columns, demanded, moves_filter, own, reads, refs
from compat.errors import ExpressionError
from compat.findings import MIGRATE, RESTART, Finding, register_codes
from compat.infer import (
    INSERT,
    RETRACT,
    UPSERT,
    WINDOW_COLUMN,
    WINDOW_TYPE,
    InferContext,
    NodeInfo,
    deterministic,
    duration_seconds,
    infer_step,
    scope,
)
from compat.model import ENFORCING, AggCall, NamedExpr, Node, Plan, Window, prop
from compat.pushdown import Conjunct, PushGraph, Targets, push_through
from compat.pyspark_text import Code, Refusal, export_step, py, var
from compat.rules import RuleContext, compare
from compat.signing import (
    NodeSig,
    by_name,
    canon_expr,
    digest,
    duration,
    expr_token,
    sign_step,
    token,
)


@dataclass(frozen=True, kw_only=True)
class Aggregate(Node):
    """Outputs its ``group_by`` columns then its ``aggregates``; a windowed one adds a
    ``window`` column (``struct<start:timestamp,end:timestamp>``) first.  It emits upserts
    per group, or, feeding an append sink with a watermarked window, each window once."""

    group_by: tuple[NamedExpr, ...] = prop()
    aggregates: tuple[AggCall, ...] = prop(min_items=1)
    window: Window | None = prop(None)
    step: ClassVar[str] = "aggregate"
    klass: ClassVar[str] = ENFORCING
    max_version: ClassVar[int] = 2

    def traits(self) -> frozenset[str]:
        return frozenset({"windowed"}) if self.window else frozenset()

    def kept_state(self, plan: Plan) -> Any:
        return kept_aggregates(self, plan)


def kept_aggregates(node: Aggregate, plan: Plan) -> tuple[int, ...] | None:
    """The positions of the aggregates Spark keeps in a streaming aggregate's state: its
    optimizer drops an aggregate nothing above reads (ColumnPruning), so its buffer is not
    in the state's value.  None where the step holds no Spark aggregate state (a table
    aggregate over a changelog is Theseus' own operator and keeps every aggregate)."""
    info = plan.info[node.id]
    if not info.stateful or info.changelog:
        return None
    # (not demand_at: a filter Spark moves below an aggregate reads grouping keys only,
    # which the state keeps anyway)
    demand = demanded(plan)[node.id]
    return tuple(i for i, a in enumerate(node.aggregates) if demand.get(a.name.lower()))


#: the first version whose changelog operator is the row-based ``transformWithState``
ROWS_VERSION = 2

#: aggregate functions a table aggregate can retract a row from: counts and sums subtract,
#: min and max keep a count per value in state
RETRACTABLE = frozenset({"count", "sum", "avg", "min", "max"})

register_codes({
    "aggregate-key-changed": ("migrate", "error", "topology", MIGRATE),
    "aggregate-key-type-changed": ("migrate", "error", "schema_evolution", MIGRATE),
    "aggregate-key-renamed": ("in_place", "info", "schema_evolution", RESTART),
    "aggregate-function-changed": ("migrate", "error", "schema_evolution", MIGRATE),
    "aggregate-added": ("migrate", "error", "schema_evolution", MIGRATE),
    "aggregate-state-columns-changed": ("migrate", "error", "schema_evolution", MIGRATE),
    "aggregate-removed": ("migrate", "error", "schema_evolution", MIGRATE),
    "aggregate-renamed": ("in_place", "info", "schema_evolution", RESTART),
    "aggregate-arg-type-changed": ("migrate", "error", "schema_evolution", MIGRATE),
    "aggregate-arg-changed": ("in_place", "warning", "data_selection",
                              "History stays computed the old way; add --require backfill "
                              "to have it recomputed by a migration."),
    "aggregate-window-changed": ("migrate", "error", "topology", MIGRATE),
})


@infer_step.register
def _infer(node: Aggregate, ctx: InferContext, ins: list[NodeInfo]) -> NodeInfo:
    (src,) = ins
    sc = scope(src)
    if src.changelog and node.window is not None:
        raise ctx.err(node, "window", "a table read as a changelog has no event time to "
                      "window by", expected="no window over a changelog", found="a window")
    if node.version >= ROWS_VERSION and not src.changelog:
        raise ctx.err(node, "version", f"aggregate version {ROWS_VERSION} differs from 1 only "
                      "over a table read as a changelog (its operator)",
                      expected="version 1 over a stream", found=f"version {node.version}")
    if src.mode != INSERT and not src.changelog:
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
        size = ctx.duration(node, "window/size", w.size)
        if w.type == "hopping":
            if not w.slide:
                raise ctx.err(node, "window", "a hopping window needs a slide",
                              expected="a 'slide' duration", found="none")
            slide = ctx.duration(node, "window/slide", w.slide)
            if slide > size:
                raise ctx.err(node, "window/slide", "the slide is longer than the window",
                              expected=f"at most {w.size}", found=w.slide)
        if w.type == "session" and w.gap:
            ctx.duration(node, "window/gap", w.gap)
        if wcol not in src.watermarks:
            det = False  # windows over processing time depend on when rows arrive
        cols.append((WINDOW_COLUMN, WINDOW_TYPE))
        names.append("window")
        if wcol in src.watermarks:
            marks.add("window")
    for i, g in enumerate(node.group_by):
        t = ctx.expr_type(node, f"group_by/{i}/expr", g.expr, sc)
        det = det and deterministic(g.expr)
        cols.append((g.name.lower(), t))
        names.append(g.name)
    for i, a in enumerate(node.aggregates):
        fn = a.function.lower()
        fn = {"mean": "avg", "std": "stddev"}.get(fn, fn)
        if fn not in E.AGGREGATE_FUNCTIONS:
            close = difflib.get_close_matches(fn, sorted(E.AGGREGATE_FUNCTIONS), n=1)
            raise ctx.err(node, f"aggregates/{i}/function", f"unknown aggregate function "
                          f"'{a.function}'", expected="a Spark aggregate function",
                          found=repr(a.function),
                          hint=f"Did you mean '{close[0]}'?" if close else None)
        if src.changelog and (fn not in RETRACTABLE or a.distinct):
            raise ctx.err(node, f"aggregates/{i}/function", "over a table read as a "
                          "changelog, an aggregate retracts a row's old contribution; "
                          f"'{a.function}{' distinct' if a.distinct else ''}' cannot",
                          expected=", ".join(sorted(RETRACTABLE)) + " (not distinct)",
                          found=repr(a.function))
        if a.distinct and src.stream:
            raise ctx.err(node, f"aggregates/{i}/distinct", "Spark does not support distinct "
                          "aggregations on streams", expected="approx_count_distinct(...) or "
                          "a deduplicate step before the aggregate", found="distinct: true")
        args = []
        for j, arg in enumerate(a.args):
            if arg.strip() == "*":
                args.append(("star",))
                continue
            at = ctx.expr_type(node, f"aggregates/{i}/args/{j}", arg, sc)
            if src.changelog and fn in ("sum", "avg") and not T.is_numeric(at) and \
                    at != "void":
                # Spark's own sum casts a string to double (null, or an error under ANSI,
                # when it is no number); the changelog operator adds and subtracts the JSON
                # values themselves, so it takes numbers only.
                raise ctx.err(node, f"aggregates/{i}/args/{j}", f"{fn} over a table read as "
                              "a changelog adds and subtracts numbers; "
                              f"'{arg}' is {'of unknown type' if at == T.UNKNOWN else at}",
                              expected="a number (tinyint, smallint, int, bigint, float, "
                              "double, decimal)", found=at,
                              hint=f"Cast it: {fn}(CAST({arg} AS double)).")
            ast = E.shape(arg)
            det = det and E.is_deterministic(ast)
            args.append(ast)
        try:
            t = E.infer_type(("fn", fn, tuple(args), a.distinct), sc)
        except ExpressionError as on_shapes:  # a type Spark refuses (sum over a boolean)
            err = on_shapes
            own = tuple(("star",) if x.strip() == "*" else E.parse(x) for x in a.args)
            try:  # said again over the arguments as written, not their shapes
                E.infer_type(("fn", fn, own, a.distinct), sc)
            except ExpressionError as e:
                err = e
            raise err.with_location(file=ctx.file, node=node.id, pointer=ctx.pointer(
                node.id, f"aggregates/{i}")) from None
        cols.append((a.name.lower(), t))
        names.append(a.name)
    ctx.unique(node, names, "")
    windowed_final = node.window is not None and node.window.column.lower() in src.watermarks
    if ctx.sink_mode == "append":
        if node.window is None:
            raise ctx.err(node, "", "an append sink fed by an unwindowed aggregate: Spark's "
                          "append mode emits each row once, and an unwindowed aggregate "
                          "never finishes a group", expected="sink mode 'update' or "
                          "'complete', or a window on an event-time column",
                          found="mode 'append' downstream", ptr=ctx.pointer(node.id))
        if not windowed_final:
            raise ctx.err(node, "window/column", "append mode needs a watermark on the "
                          "window column, so that Spark knows when a window is final",
                          expected="an event_time column with a watermark",
                          found=repr(node.window.column))
        mode = INSERT
    else:
        mode = UPSERT
    keys: tuple[tuple[str, ...], ...] = ()
    if src.changelog:
        # A group whose last row is retracted is deleted: its key gets a tombstone.
        mode = RETRACT
        keys = (tuple(g.name.lower() for g in node.group_by),)  # one row per group
    return NodeInfo(tuple(cols), mode, src.stream, src.stream, frozenset(marks), det,
                    tuple(names), changelog=src.changelog, keys=keys,
                    windows=frozenset({WINDOW_COLUMN}) if node.window else frozenset())


@reads.register
def _reads(node: Aggregate, demand: Demand, ins: list[NodeInfo]) -> list[Demand]:
    # Group keys and the window decide which rows meet; aggregate arguments are read for
    # every aggregate (state holds them whether or not its output is read downstream).
    cols = columns(ins[0])
    read: set[str] = set()
    for g in node.group_by:
        read |= refs(g.expr, cols)
    for a in node.aggregates:
        for arg in a.args:
            read |= refs(arg, cols)
    if node.window is not None:
        read |= refs(node.window.column, cols)
    return [own(node, read)]


@moves_filter.register
def _moves(node: Aggregate, conjunct: str, ins: list[NodeInfo], above: Sequence[str]
           ) -> list[tuple[int, str]] | None:
    # Spark moves a condition on group keys below the aggregate, but the aggregate reads
    # those columns anyway: nothing it or the steps below it carry changes.
    return None


@compare.register
def _compare(old: Aggregate, new: Aggregate, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    f = ctx.f
    oi, ni = ctx.oi(old), ctx.ni(new)
    if old.window != new.window:
        ow, nw = old.window, new.window
        same = ow is not None and nw is not None and ow.type == nw.type and \
            ow.column.lower() == nw.column.lower() and _dur(ow.size) == _dur(nw.size) and \
            _dur(ow.slide) == _dur(nw.slide) and _dur(ow.gap) == _dur(nw.gap)
        if not same:
            out.append(f("aggregate-window-changed", f"aggregate '{new.id}' window changes "
                         f"from {_show_window(ow)} to {_show_window(nw)}", old, new,
                         "window"))
    off = 1 if old.window else 0
    nff = 1 if new.window else 0
    okeys = [E.canonical(g.expr) for g in old.group_by]
    nkeys = [E.canonical(g.expr) for g in new.group_by]
    otypes = [oi.columns[off + i][1] for i in range(len(okeys))]
    ntypes = [ni.columns[nff + i][1] for i in range(len(nkeys))]
    if okeys != nkeys:
        out.append(f("aggregate-key-changed", f"aggregate '{new.id}' groups by "
                     f"({', '.join(g.expr for g in new.group_by)}) instead of "
                     f"({', '.join(g.expr for g in old.group_by)}); the state is keyed by "
                     "the grouping keys", old, new, "group_by"))
    else:
        for i, (a, b) in enumerate(zip(otypes, ntypes)):
            if not T.same_layout(a, b):
                out.append(f("aggregate-key-type-changed", f"grouping key "
                             f"'{new.group_by[i].name}' of '{new.id}' is {b}, was {a}",
                             old, new, f"group_by/{i}/expr"))
        for i, (a, b) in enumerate(zip(old.group_by, new.group_by)):
            if a.name.lower() != b.name.lower():
                out.append(f("aggregate-key-renamed", f"grouping key '{a.name}' of "
                             f"'{new.id}' is now called '{b.name}'", old, new,
                             f"group_by/{i}/name"))
    # Aggregates are paired by position (the state's value schema is positional).
    n_o, n_n = len(old.aggregates), len(new.aggregates)
    base_o, base_n = off + len(old.group_by), nff + len(new.group_by)
    for i in range(min(n_o, n_n)):
        a, b = old.aggregates[i], new.aggregates[i]
        fa, fb = _fn(a.function), _fn(b.function)
        if fa != fb or a.distinct != b.distinct or len(a.args) != len(b.args):
            out.append(f("aggregate-function-changed", f"aggregate '{b.name}' of '{new.id}' "
                         f"is {_show(b)} instead of {_show(a)}", old, new,
                         f"aggregates/{i}"))
            continue
        if a.name.lower() != b.name.lower():
            out.append(f("aggregate-renamed", f"aggregate '{a.name}' of '{new.id}' is now "
                         f"called '{b.name}'", old, new, f"aggregates/{i}/name"))
        ta, tb = oi.columns[base_o + i][1], ni.columns[base_n + i][1]
        argtypes_o = _arg_types(a.args, ctx, old, True)
        argtypes_n = _arg_types(b.args, ctx, new, False)
        if not T.same_layout(ta, tb) or any(not T.same_layout(x, y)
                                           for x, y in zip(argtypes_o, argtypes_n)):
            why = _same_buffer(fb, argtypes_o, argtypes_n) \
                if T.same_layout(ta, tb) and not ctx.ni_input(new).changelog else None
            if why:
                out.append(f("aggregate-arg-type-changed", f"aggregate '{b.name}' of "
                             f"'{new.id}' now aggregates {', '.join(argtypes_n)} "
                             f"(was {', '.join(argtypes_o)}); {why}", old, new,
                             f"aggregates/{i}/args", effect="in_place",
                             severity="warning", hint=RESTART))
            else:
                out.append(f("aggregate-arg-type-changed", f"aggregate '{b.name}' of "
                             f"'{new.id}' now aggregates {', '.join(argtypes_n)} "
                             f"(was {', '.join(argtypes_o)}), so its state changes type",
                             old, new, f"aggregates/{i}/args"))
        elif [_c(x) for x in a.args] != [_c(x) for x in b.args]:
            out.append(f("aggregate-arg-changed", f"aggregate '{b.name}' of '{new.id}' "
                         f"now computes {_show(b)} instead of {_show(a)}; the state keeps "
                         "its layout, but history stays computed the old way", old, new,
                         f"aggregates/{i}/args", history=True))
    ko, kn = kept_aggregates(old, ctx.old), kept_aggregates(new, ctx.new)
    if ko is not None and kn is not None:
        both = min(n_o, n_n)
        read = [new.aggregates[i].name for i in range(both) if i in kn and i not in ko]
        unread = [old.aggregates[i].name for i in range(both) if i in ko and i not in kn]
        if read or unread:
            what = "; ".join(x for x in (
                f"{', '.join(read)} now read above it" if read else "",
                f"{', '.join(unread)} no longer read" if unread else "") if x)
            out.append(f("aggregate-state-columns-changed", f"aggregate '{new.id}': {what}. "
                         "Spark keeps in state only the aggregates read above the step "
                         "(its optimizer drops the others), so the state's value changes "
                         "and the old state does not fit "
                         "(STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE)", old, new, "aggregates"))
    for i in range(n_n, n_o):
        a = old.aggregates[i]
        out.append(f("aggregate-removed", f"aggregate '{a.name}' ({_show(a)}) of "
                     f"'{old.id}' is removed", old, new, f"aggregates/{i}", "aggregates"))
    for i in range(n_o, n_n):
        b = new.aggregates[i]
        out.append(f("aggregate-added", f"aggregate '{b.name}' ({_show(b)}) is added to "
                     f"'{new.id}': its history is not in the state", old, new, "aggregates",
                     f"aggregates/{i}"))
    return out


def _same_buffer(fn: str, was: list[str], now: list[str]) -> str | None:
    """Why Spark's buffer for ``fn`` keeps its types when its argument widens from ``was``
    to ``now``, or None.  From Spark 4's DeclarativeAggregates (a streaming aggregate's
    state is the grouping key and these buffers): ``count`` keeps a bigint count whatever
    it counts; ``sum`` of any integral type keeps a bigint sum (plus an isEmpty flag for
    try_sum, for every integral type alike); ``avg`` of a non-decimal number keeps a double
    sum and a bigint count.  ``min``, ``max``, ``first``, ``last`` keep the input's own type,
    decimals change precision, ``approx_count_distinct`` hashes the value's bytes (an int
    and a bigint hash apart): those change the state."""
    if len(was) != 1 or len(now) != 1 or not T.can_widen(was[0], now[0]):
        return None
    a, b = was[0], now[0]
    if fn == "count":
        return "count keeps a bigint count in state whatever it counts"
    if fn == "sum" and a in T.INTEGRAL and b in T.INTEGRAL:
        return ("Spark sums every integral type into a bigint buffer, so the state keeps its "
                "types and Spark restarts on it")
    plain = T.INTEGRAL + T.FRACTIONAL
    if fn == "avg" and a in plain and b in plain:
        return ("Spark averages a non-decimal number with a double sum and a bigint count, "
                "so the state keeps its types and Spark restarts on it")
    return None


def _fn(name: str) -> str:
    n = name.lower()
    return {"mean": "avg", "std": "stddev", "stddev_samp": "stddev"}.get(n, n)


def _c(arg: str) -> str:
    return "*" if arg.strip() == "*" else E.canonical(arg)


def _show(a: AggCall) -> str:
    return f"{a.function}({'DISTINCT ' if a.distinct else ''}{', '.join(a.args)})"


def _arg_types(args: tuple[str, ...], ctx: RuleContext, node: Aggregate,
               old: bool) -> list[str]:
    plan = ctx.old if old else ctx.new
    sc = scope(plan.info[node.inputs[0]])
    return [T.UNKNOWN if a.strip() == "*" else E.infer_type(E.shape(a), sc) for a in args]


def _dur(text: str | None) -> float | None:
    return None if text is None else duration_seconds(text)


def _show_window(w: Window | None) -> str:
    if w is None:
        return "no window"
    extra = f", slide {w.slide}" if w.slide else f", gap {w.gap}" if w.gap else ""
    return f"{w.type} {w.size} on {w.column}{extra}"


@sign_step.register
def _sign(node: Aggregate, ins: list[NodeSig], names: tuple[str, ...],
          plan: Plan) -> NodeSig:
    (src,) = ins
    r = by_name(src.columns)
    cols: dict[str, str] = {}
    w = node.window
    wkey = None
    if w is not None:
        wkey = (w.type, src.columns.get(w.column.lower(), w.column.lower()),
                duration(w.size), duration(w.slide), duration(w.gap))
        cols["window"] = token("window", wkey)
    groups = []
    for g in node.group_by:
        tok = expr_token(g.expr, r)
        groups.append(tok)
        cols[g.name.lower()] = tok
    aggs = []
    for a in node.aggregates:
        fn = {"mean": "avg", "std": "stddev"}.get(a.function.lower(), a.function.lower())
        tok = token("agg", fn, a.distinct, tuple(canon_expr(x, r) for x in a.args))
        aggs.append(tok)
        cols[a.name.lower()] = tok
    sig = digest("aggregate", node.version, src.sig, wkey, tuple(sorted(groups)),
                 tuple(sorted(aggs)))
    return NodeSig(sig, cols)


@push_through.register
def _push_through(node: Aggregate, c: Conjunct, g: PushGraph) -> Targets | None:
    # A conjunct on grouping keys selects the same groups before the aggregate (KLIP-6);
    # one that reads an aggregate's value must see it computed.
    groups = {gb.name.lower(): gb.expr for gb in node.group_by}
    if not c.used or not c.used <= set(groups) or \
            not all(g.deterministic(groups[u]) for u in c.used):
        return None
    return [(node.inputs[0], c.substitute(groups))]


@export_step.register
def _export(node: Aggregate, plan: Plan) -> Code | Refusal:
    keys = []
    w = node.window
    if w is not None:
        if w.type == "session":
            keys.append(f"F.session_window({py(w.column)}, {py(w.gap or w.size)})"
                        '.alias("window")')
        elif w.type == "hopping":
            keys.append(f"F.window({py(w.column)}, {py(w.size)}, {py(w.slide)})")
        else:
            keys.append(f"F.window({py(w.column)}, {py(w.size)})")
    keys += [f"F.expr({py(g.expr)}).alias({py(g.name)})" for g in node.group_by]
    aggs = [f"F.expr({py(_show(a))}).alias({py(a.name)})" for a in node.aggregates]
    return Code([f"{var(node.id)} = ({var(node.inputs[0])}.groupBy({', '.join(keys)})",
                 f"      .agg({', '.join(aggs)}))"])
