"""What consumers of the output notice: its schema and its changelog mode.

``forward`` (default): every old column still exists with the same or a wider type;
``backward`` is the mirror rule; ``full`` both; ``none`` skips the schema rule.
"""

from __future__ import annotations

from compat import types as T
from compat.findings import Finding
from compat.infer import INSERT, RETRACT, UPSERT
from compat.rules import RuleContext
from compat.steps.sink import Sink

_MODE_NAMES = {INSERT: "inserts only [I]", UPSERT: "upserts [I,UA]",
               RETRACT: "retractions [I,UB,UA,D]"}
_RANK = {INSERT: 0, UPSERT: 1, RETRACT: 2}


def check_output_schema(old: Sink, new: Sink, ctx: RuleContext) -> list[Finding]:
    mode = ctx.schema_compat
    if mode == "none" and "cascading" in ctx.require:
        mode = "forward"  # other queries read this output: it must stay readable
    if mode == "none":
        return []
    ocols = ctx.oi(old).columns
    ncols = ctx.ni(new).columns
    oname, nname = dict(ocols), dict(ncols)
    out: list[Finding] = []
    f = ctx.f
    forward = mode in ("forward", "full")
    backward = mode in ("backward", "full")
    removed = [(i, n, t) for i, (n, t) in enumerate(ocols) if n not in nname]
    added = [(i, n, t) for i, (n, t) in enumerate(ncols) if n not in oname]
    renamed = set()
    for ri, rn, rt in removed:
        for ai, an, at in added:
            if ai == ri and at == rt and an not in renamed:
                renamed.add(an)
                eff = {} if (forward or backward) else {"effect": "in_place"}
                out.append(f("output-column-renamed", f"output column '{rn}' is renamed to "
                             f"'{an}'", old, new, "inputs", **eff))
                break
        else:
            eff = {} if forward else {"effect": "in_place", "severity": "warning"}
            out.append(f("output-column-removed", f"output column '{rn}' ({rt}) is removed; "
                         "consumers reading it find nothing", old, new, "inputs", **eff))
    for _ai, an, at in added:
        if an in renamed:
            continue
        eff = {"effect": "unsupported", "severity": "error"} if backward else {}
        out.append(f("output-column-added", f"output column '{an}' ({at}) is added", old,
                     new, "inputs", **eff))
    # Spark matches column names case-insensitively, but JSON consumers read keys as written.
    ocase = dict(zip((c[0] for c in ocols), ctx.oi(old).names))
    ncase = dict(zip((c[0] for c in ncols), ctx.ni(new).names))
    for name in oname:
        if name in nname and ocase.get(name) != ncase.get(name):
            eff = {} if (forward or backward) else {"effect": "in_place"}
            out.append(f("output-column-renamed", f"output column '{ocase.get(name)}' is "
                         f"written as '{ncase.get(name)}': JSON keys are case-sensitive",
                         old, new, "inputs", **eff))
    for name, ot in ocols:
        nt = nname.get(name)
        if nt is None or nt == ot:
            continue
        if T.can_widen(ot, nt):
            eff = {"effect": "unsupported", "severity": "error"} if backward else {}
            out.append(f("output-column-widened", f"output column '{name}' widens from {ot} "
                         f"to {nt}", old, new, "inputs", **eff))
        else:
            wide_back = T.can_widen(nt, ot)
            eff = {} if forward or not wide_back else {"effect": "in_place",
                                                         "severity": "warning"}
            out.append(f("output-column-type-changed", f"output column '{name}' changes "
                         f"from {ot} to {nt}, which old readers cannot read", old, new,
                         "inputs", **eff))
    return out


def check_changelog(old: Sink, new: Sink, ctx: RuleContext) -> list[Finding]:
    a, b = ctx.oi(old).mode, ctx.ni(new).mode
    if a == b:
        return []
    if _RANK[b] < _RANK[a] and "cascading" not in ctx.require:
        return [ctx.f("changelog-mode-narrowed", f"the output changes from "
                      f"{_MODE_NAMES[a]} to {_MODE_NAMES[b]}", old, new, "inputs")]
    return [ctx.f("changelog-mode-changed", f"the output changes from {_MODE_NAMES[a]} to "
                  f"{_MODE_NAMES[b]}; consumers built for the old kinds of change would "
                  "misread the new ones", old, new, "inputs")]
