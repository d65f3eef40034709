"""Deduplication: the keys are the state's key schema and must match."""

from __future__ import annotations

from compat.findings import Finding
from compat.infer import duration_seconds
from compat.model import Deduplicate
from compat.rules import RuleContext


def check_deduplicate(old: Deduplicate, new: Deduplicate, ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    if [k.lower() for k in old.keys] != [k.lower() for k in new.keys]:
        out.append(ctx.f("dedup-keys-changed", f"deduplicate '{new.id}' keys change from "
                         f"{list(old.keys)} to {list(new.keys)}", old, new, "keys"))
    if (old.within is None) != (new.within is None):
        out.append(ctx.f("dedup-within-toggled", f"deduplicate '{new.id}' "
                         f"{'now' if new.within else 'no longer'} forgets keys after a "
                         "time: a different Spark operator with a different state", old, new,
                         "within"))
    elif old.within and duration_seconds(old.within) != duration_seconds(new.within or ""):
        out.append(ctx.f("dedup-within-changed", f"deduplicate '{new.id}' remembers keys "
                         f"for {new.within} instead of {old.within}", old, new, "within"))
    return out
