"""What consumers of the output notice: its schema and its changelog mode.

``forward`` (default): every old column still exists with the same or a wider type;
``backward`` is the mirror rule; ``full`` both; ``none`` skips the schema rule.
"""

from __future__ import annotations

from compat import types as T
from compat.findings import Finding
from compat.infer import INSERT, RETRACT, UPSERT
from compat.rules import RuleContext
from compat.rules.avro import check_avro_output
from compat.steps.sink import Sink

_MODE_NAMES = {INSERT: "inserts only [I]", UPSERT: "upserts [I,UA]",
               RETRACT: "retractions [I,UB,UA,D]"}
_RANK = {INSERT: 0, UPSERT: 1, RETRACT: 2}


#: the --schema-compat values under which each kind of output change passes
_PASSES = {"added": ("forward", "none"), "widened": ("forward", "none"),
           "removed": ("backward", "none"), "renamed": ("none",),
           "narrowed": ("backward", "none"), "changed": ("none",)}


def _relax(ctx: RuleContext, kind: str) -> str:
    """Advice naming the --schema-compat value under which a change of ``kind`` passes."""
    options = list(_PASSES[kind])
    if "cascading" in ctx.require:
        # --require cascading checks the output as forward even under none
        if options == ["none"]:
            if ctx.schema_compat == "none":
                return "drop --require cascading (it checks the output as forward)"
            return "relax --schema-compat to none and drop --require cascading"
        options.remove("none")
    return f"relax --schema-compat to {options[0]}" + \
        (f" (or {options[1]})" if len(options) > 1 else "")


def check_output_schema(old: Sink, new: Sink, ctx: RuleContext) -> list[Finding]:
    if old.format == new.format == "avro":
        # Avro's resolution rules know defaults and promotions, which JSON's cannot
        return check_avro_output(old, new, ctx)
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
    flag = f"--schema-compat {mode}"
    removed = [(i, n, t) for i, (n, t) in enumerate(ocols) if n not in nname]
    added = [(i, n, t) for i, (n, t) in enumerate(ncols) if n not in oname]
    renamed = set()
    # Each finding's advice is chosen by the effect the flags give it.
    for ri, rn, rt in removed:
        for ai, an, at in added:
            if ai == ri and at == rt and an not in renamed:
                renamed.add(an)
                out.append(_renamed(ctx, old, new, rn, an))
                break
        else:
            eff = {"hint": f"Keep the column, or {_relax(ctx, 'removed')} if no consumer "
                   "reads it."} if forward else \
                {"effect": "in_place", "severity": "warning",
                 "hint": f"Consumers reading '{rn}' find nothing from the restart on "
                 f"({flag} allows it): make sure none needs it."}
            out.append(f("output-column-removed", f"output column '{rn}' ({rt}) is removed; "
                         "consumers reading it find nothing", old, new, "inputs", **eff))
    for _ai, an, at in added:
        if an in renamed:
            continue
        eff = {"effect": "unsupported", "severity": "error",
               "hint": f"Records written before the upgrade lack '{an}', which readers of "
               f"the new schema expect ({flag}): drop the column, or "
               f"{_relax(ctx, 'added')} if every consumer copes without it."} \
            if backward else {}
        out.append(f("output-column-added", f"output column '{an}' ({at}) is added", old,
                     new, "inputs", **eff))
    # Spark matches column names case-insensitively, but JSON consumers read keys as written.
    ocase = dict(zip((c[0] for c in ocols), ctx.oi(old).names))
    ncase = dict(zip((c[0] for c in ncols), ctx.ni(new).names))
    for name in oname:
        if name in nname and ocase.get(name) != ncase.get(name):
            a, b = ocase.get(name), ncase.get(name)
            out.append(_renamed(ctx, old, new, str(a), str(b),
                                f"output column '{a}' is written as '{b}': JSON keys are "
                                "case-sensitive"))
    for name, ot in ocols:
        nt = nname.get(name)
        if nt is None or nt == ot:
            continue
        if T.can_widen(ot, nt):
            eff = {"effect": "unsupported", "severity": "error",
                   "hint": f"Under {flag} records written before the upgrade must read as "
                   f"the new type, and {ot} is narrower than {nt}: keep {ot}, or "
                   f"{_relax(ctx, 'widened')}."} if backward else {}
            out.append(f("output-column-widened", f"output column '{name}' widens from {ot} "
                         f"to {nt}", old, new, "inputs", **eff))
        else:
            wide_back = T.can_widen(nt, ot)
            kind = "narrowed" if wide_back else "changed"
            eff = {"hint": f"Keep the old type or a wider one, or {_relax(ctx, kind)}."} \
                if forward or not wide_back else \
                {"effect": "in_place", "severity": "warning",
                 "hint": f"Readers of the old schema get {nt} values where they expect "
                 f"{ot} ({flag} allows the narrower type)."}
            out.append(f("output-column-type-changed", f"output column '{name}' changes "
                         f"from {ot} to {nt}, which old readers cannot read", old, new,
                         "inputs", **eff))
    return out


def _renamed(ctx: RuleContext, old: Sink, new: Sink, was: str, now: str,
             message: str | None = None) -> Finding:
    """A rename breaks every checked mode (JSON is read by name): only none lets it pass."""
    return ctx.f("output-column-renamed", message or f"output column '{was}' is renamed to "
                 f"'{now}'", old, new, "inputs", hint="Keep the old name (JSON is read by "
                 f"name), or {_relax(ctx, 'renamed')} if every consumer moves to '{now}'.")


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
