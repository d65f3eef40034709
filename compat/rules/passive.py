"""Passive steps may be added, removed or changed, but the change has a meaning: record what
it changes (data selection, schema, determinism) and where it sits relative to state.

Upstream of a stateful step, a change alters what enters the state: the state keeps its
layout, but history stays computed the old way (a migration recomputes it; see
``--require backfill``).  Downstream of state, only rows written from the restart on change.
What a change of one passive step type means is that step's rule (``compat.rules.compare``,
registered in its module under ``compat/steps/``), which says it with ``where``.
"""

from __future__ import annotations

from compat.findings import Finding
from compat.model import Node
from compat.rules import RuleContext, compare


def history_note(state: Node) -> str:
    """A change upstream of ``state``, for a finding's message."""
    return f" upstream of stateful {state.step} '{state.id}': history stays computed the old way"


def where(ctx: RuleContext) -> str:
    """Where the passive change sits, for a finding's message: upstream of which state
    (the nearest stateful step downstream, through steps that hold none)."""
    old_c, new_c = ctx.consumer
    c = new_c or old_c
    if ctx.upstream_of_state:
        state = ctx.state or c
        return history_note(state) if state is not None else ""
    if c is None:
        return ""
    return f" before {c.step} '{c.id}'"


def check_passive(old: Node | None, new: Node | None, ctx: RuleContext) -> list[Finding]:
    hist = ctx.upstream_of_state
    if old is None and new is not None:
        out = [ctx.f("passive-added", f"{new.step} '{new.id}' is added ({new.describe()})"
                     f"{where(ctx)}", None, new, None, "", history=hist)]
        if not ctx.new.info[new.id].deterministic:
            out.append(_nondet(ctx, None, new))
        return out
    if new is None and old is not None:
        return [ctx.f("passive-removed", f"{old.step} '{old.id}' is removed "
                      f"({old.describe()}){where(ctx)}", old, None, "", None, history=hist)]
    assert old is not None and new is not None
    out = compare(old, new, ctx) if old.step == new.step else []
    if ctx.new.info[new.id].deterministic is False and ctx.old.info[old.id].deterministic:
        out.append(_nondet(ctx, old, new))
    return out


def _nondet(ctx: RuleContext, old: Node | None, new: Node) -> Finding:
    return ctx.f("nondeterminism-introduced", f"{new.step} '{new.id}' is nondeterministic "
                 "(rand, uuid, current time...): a batch replayed after a crash may differ",
                 old, new, None, "")
