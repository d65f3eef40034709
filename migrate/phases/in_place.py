"""Step 2 of the in-place path (docs/design.md's step 1 carried out): stop the query between
batches and restart it on the same checkpoint with the new plan."""

from __future__ import annotations

from compat.check import load_plan
from compat.serde import dumps
from migrate.context import Context
from migrate.record import Migration


def in_place(m: Migration, ctx: Context) -> None:
    q = m.old_instance
    hosts = ctx.processes
    # Resumed after a crash: a restart this step began may still be starting up (it
    # clears stop requests as it starts), or may already run the new plan.
    ctx.wait(m, f"'{q}' to finish starting", lambda: not hosts.starting(q))
    if not (hosts.running(q) and runs_new_plan(m, ctx, q)):
        ctx.store.request_stop(q)
        ctx.wait(m, f"'{q}' to stop", lambda: hosts.stopped(q))
        gen = int(ctx.store.status(q).get("generation", 0))
        ctx.store.clear_stop(q)
        hosts.spawn(m, m.new_plan, q, gen, gated=False)
    ctx.wait(m, f"'{q}' to restart on the new plan", lambda: hosts.running(q))


def runs_new_plan(m: Migration, ctx: Context, instance: str) -> bool:
    """The plan ``instance`` records it runs is the new plan (``theseus run`` records
    the plan it loaded, serialized)."""
    try:
        running = ctx.store.plan_path(instance).read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    return running == dumps(load_plan(m.new_plan))
