"""Step 6. Cutover: open the shadow's start gate and lift its cap; stop the old query; a
reconciling shadow's corrections are awaited and counted (:func:`await_reconciliation`)."""

from __future__ import annotations

import time

from compat.errors import MigrationError
from gates.reconcile import read_record
from gates.startgate import write_start_gate
from migrate import sides
from migrate.context import CUT_POLL, Context
from migrate.phases.align import note_side_end
from migrate.record import Migration
from migrate.run import failure_message


def cutover(m: Migration, ctx: Context) -> None:
    """The old query is capped at C and has acknowledged C (step 5): it cannot write
    anything more, so the shadow takes over at once and the old one stops beside it.
    This keeps the output stall to the shadow's next trigger (see bench/migrate_speed.py).
    """
    old, inst = m.old_instance, m.new_instance
    if m.feeds:
        # A cascade's upstream holds its output until opened here; opened before its
        # shadow finished the input before C, its output before C would go to T too.
        note_side_end(m, ctx)
    else:
        ctx.wait(m, f"'{inst}' to pass the cut", lambda: ctx.gates.switched(inst),
                 interval=CUT_POLL)
    write_start_gate(ctx.store.root, inst, True, m.id, reconcile=sides.reconcile_spec(m))
    ctx.flush()
    if m.feeds:
        ctx.mark(m, "opened")
    ctx.gates.set(m, inst, "open")
    # The old query is capped and idle; stopping its JVM now would compete for CPU with
    # the shadow's first batches. Let the shadow commit a batch past the cut first.
    cut = sides.output_cut(ctx.store, m, "new")
    courtesy = ctx.deadline.within(30)
    while not courtesy.expired() and not ctx.gates.past(inst, cut):
        ctx.renew()
        time.sleep(min(0.2, courtesy.remaining()))
    ctx.store.request_stop(old)
    ctx.wait(m, f"'{old}' to stop", lambda: ctx.processes.stopped(old))
    if m.reconciling:
        await_reconciliation(m, ctx)


def await_reconciliation(m: Migration, ctx: Context) -> None:
    """The shadow's first batch from C carries the corrections; wait until they are
    committed and record their counts. A shadow host that died meanwhile (killed in
    the middle of that batch) is started again on its checkpoint: Spark replays the
    batch, whose transaction was aborted, and the corrections are written once."""
    inst = m.new_instance

    def committed() -> bool:
        rec = read_record(ctx.store.root, inst)
        if rec.get("state") == "committed" and rec.get("migration") == m.id:
            return True
        st = ctx.store.status(inst)
        if st.get("status") == "failed":
            first = failure_message(str(st.get("error") or "see its log"))[:500]
            raise MigrationError(f"the shadow query '{inst}' failed while reconciling: "
                                 f"{first}", file=str(ctx.store.log_path(inst)),
                                 hint=f"fix the cause, then theseus migrate resume "
                                 f"{m.query}")
        if not ctx.processes.starting(inst) and not ctx.processes.running(inst):
            ctx.echo(f"  the shadow '{inst}' is not running: starting it again")
            ctx.processes.spawn(m, m.new_plan, inst, m.generation, gated=True)
        return False

    ctx.wait(m, "the shadow to commit the reconciliation", committed)
    rec = read_record(ctx.store.root, inst)
    m.counts = dict(rec.get("counts") or {})
    ctx.save(m)
    c = m.counts
    ctx.echo(f"  reconciled at the cut: {c.get('corrected', 0)} corrected, "
             f"{c.get('added', 0)} added, {c.get('deleted', 0)} deleted, "
             f"{c.get('matched', 0)} already right")
