"""Aggregates: grouping keys (order, resolved types), functions, argument types, window.

Spark's state schema check compares key and value schemas by position and type, ignoring
names; so a renamed key keeps the state, a retyped one does not.  An argument expression
may change when its type does not: the state keeps its layout, but history stays computed
the old way.
"""

from __future__ import annotations

from compat import expr as E
from compat import types as T
from compat.findings import Finding
from compat.model import Aggregate
from compat.rules import RuleContext


def check_aggregate(old: Aggregate, new: Aggregate, ctx: RuleContext) -> list[Finding]:
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
            out.append(f("aggregate-arg-type-changed", f"aggregate '{b.name}' of "
                         f"'{new.id}' now aggregates {', '.join(argtypes_n)} "
                         f"(was {', '.join(argtypes_o)}), so its state changes type",
                         old, new, f"aggregates/{i}/args"))
        elif [_c(x) for x in a.args] != [_c(x) for x in b.args]:
            out.append(f("aggregate-arg-changed", f"aggregate '{b.name}' of '{new.id}' "
                         f"now computes {_show(b)} instead of {_show(a)}; the state keeps "
                         "its layout, but history stays computed the old way", old, new,
                         f"aggregates/{i}/args", history=True))
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


def _fn(name: str) -> str:
    n = name.lower()
    return {"mean": "avg", "std": "stddev", "stddev_samp": "stddev"}.get(n, n)


def _c(arg: str) -> str:
    return "*" if arg.strip() == "*" else E.canonical(arg)


def _show(a) -> str:
    return f"{a.function}({'DISTINCT ' if a.distinct else ''}{', '.join(a.args)})"


def _arg_types(args, ctx: RuleContext, node: Aggregate, old: bool) -> list[str]:
    plan = ctx.old if old else ctx.new
    src = plan.info[node.inputs[0]]
    scope = E.Scope(dict(src.columns))
    return [T.UNKNOWN if a.strip() == "*" else E.infer_type(E.shape(a), scope) for a in args]


def _dur(text):
    from compat.infer import duration_seconds
    return None if text is None else duration_seconds(text)


def _show_window(w) -> str:
    if w is None:
        return "no window"
    extra = f", slide {w.slide}" if w.slide else f", gap {w.gap}" if w.gap else ""
    return f"{w.type} {w.size} on {w.column}{extra}"
