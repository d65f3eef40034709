"""Joins: type, keys and time bound must match when both inputs are streams (Spark keeps
both sides' rows in state); a stream-table join holds no state and may change freely."""

from __future__ import annotations

from compat import types as T
from compat.findings import Finding
from compat.model import Join
from compat.rules import RuleContext, canon, canon_list


def check_join(old: Join, new: Join, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    f = ctx.f
    o_state, n_state = ctx.oi(old).stateful, ctx.ni(new).stateful
    if o_state != n_state:
        kinds = {True: "stream-stream (stateful)", False: "stream-table (stateless)"}
        out.append(f("join-statefulness-changed", f"join '{new.id}' changes from "
                     f"{kinds[o_state]} to {kinds[n_state]}", old, new, "inputs"))
        return out
    # A stateless join's changes select different rows from now on: a restart suffices.
    soft = {} if n_state else {"effect": "in_place", "severity": "warning"}
    if old.type != new.type:
        out.append(f("join-type-changed", f"join '{new.id}' changes from {old.type} to "
                     f"{new.type}", old, new, "type", **soft))
    if canon_list(old.left_keys) != canon_list(new.left_keys) or \
            canon_list(old.right_keys) != canon_list(new.right_keys):
        out.append(f("join-keys-changed", f"join '{new.id}' keys change from "
                     f"{list(old.left_keys)} = {list(old.right_keys)} to "
                     f"{list(new.left_keys)} = {list(new.right_keys)}", old, new,
                     "left_keys", **soft))
    if _qual(canon(old.time_bound), old) != _qual(canon(new.time_bound), new):
        out.append(f("join-time-bound-changed", f"join '{new.id}' time bound changes from "
                     f"{old.time_bound or 'none'} to {new.time_bound or 'none'}", old, new,
                     "time_bound", **soft))
    if _qual(canon(old.condition), old) != _qual(canon(new.condition), new):
        out.append(f("join-condition-changed", f"join '{new.id}' condition changes from "
                     f"{old.condition or 'none'} to {new.condition or 'none'}", old, new,
                     "condition", **soft))
    if n_state:
        for side in (0, 1):
            a = ctx.old.info[old.inputs[side]].columns
            b = ctx.new.info[new.inputs[side]].columns
            if len(a) != len(b) or not all(T.same_layout(x[1], y[1]) for x, y in zip(a, b)):
                which = "left" if side == 0 else "right"
                out.append(f("join-state-schema-changed", f"the {which} input of stateful "
                             f"join '{new.id}' now has columns "
                             f"({', '.join(n + ' ' + t for n, t in b)}), was "
                             f"({', '.join(n + ' ' + t for n, t in a)}); Spark keeps these "
                             "rows in state", old, new, f"inputs/{side}"))
    return out


def _qual(text: str | None, node: Join) -> str | None:
    """Qualifiers name input ids, which may be renamed: replace them by their position."""
    if text is None:
        return None
    left, right = (i.lower() for i in node.inputs)
    return text.replace(left + ".", "$0.").replace(right + ".", "$1.")
