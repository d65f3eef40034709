"""Step 7 (3 in place). Finish: the new plan is the query's plan; after a shadow migration
its instance is the live one.  The side topic and the control records' keys go."""

from __future__ import annotations

from compat.errors import StoreError
from migrate.context import Context
from migrate.record import Migration


def finish(m: Migration, ctx: Context) -> None:
    if m.kind == "shadow":
        ctx.store.set_live(m.query, m.new_instance)
    ctx.store.put_plan(m.query, new_plan_text(m))
    ctx.topics.delete_side_topic(m)
    ctx.topics.tombstone_controls(m)


def new_plan_text(m: Migration) -> str:
    try:
        with open(m.new_plan, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise StoreError(f"cannot read the migration's new plan: {e.strerror or e}",
                         file=m.new_plan) from None
