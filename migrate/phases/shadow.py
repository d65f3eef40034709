"""Step 2. Start the shadow: the new plan as a new instance, a fresh checkpoint, its start
gate closed (its output discarded, or written to the side topic ``<output>.shadow``)."""

from __future__ import annotations

from compat.check import load_plan
from compat.errors import MigrationError
from gates.cascade import write_switch
from gates.startgate import write_start_gate
from gates.state import GateState, read_gate, write_gate
from migrate import sides
from migrate.context import Context
from migrate.progress import backfill_range
from migrate.record import Migration, resume_hint


def shadow(m: Migration, ctx: Context) -> None:
    inst = m.new_instance
    side = sides.compare_topic(m)
    if sides.side_topic_used(m):
        # compacted when it serves the reconciliation only: its last value per key is
        # all that is read (a cascade's downstream shadow reads every record)
        ctx.topics.ensure(m, side, 1, None if m.compare or m.feeds else
                          {"cleanup.policy": "compact"})
        ctx.echo(f"  shadow output before the cut goes to {side}")
    if (m.reconciling or m.feeds) and not m.side_from:
        # where this shadow's output starts: what an earlier migration left is not ours
        high = ctx.topics.high_watermarks(m.bootstrap, [side])
        m.side_from = {str(p): o for p, o in high[side].items()}
        ctx.save(m)
    write_start_gate(ctx.store.root, inst, False, m.id, reconcile=sides.reconcile_spec(m))
    if read_gate(ctx.store.root, inst).mode != "open" and not m.cut:
        write_gate(ctx.store.root, inst, GateState("open", {}, m.epoch))
    if m.cut_from and not m.cut:
        # a cascade's downstream shadow reads the upstream shadow's output before the
        # upstream's cut first (gates.cascade): where it is, and where it starts
        up = ctx.record(m.cut_from)
        topic, side = sides.output_topic(up), sides.compare_topic(up)
        if not up.side_from:
            raise MigrationError(f"the upstream migration {up.id} has not started its "
                                 "shadow", file=str(ctx.store.root), hint=resume_hint(m.query))
        write_switch(ctx.store.root, inst, topic=topic, side=side,
                     side_from={int(p): o for p, o in up.side_from.items()})
        ctx.flush()
        ctx.echo(f"  the shadow reads {side} (the new upstream's output before the "
                 f"cut), then {topic} from the upstream's cut")
    if not m.backfill and not m.cut_from:
        # what the shadow is about to read as its history: the progress bar's whole,
        # fixed, so that the bar never goes back while the head grows
        topics = sides.source_topics(load_plan(m.new_plan))
        m.backfill = backfill_range(load_plan(m.new_plan),
                                    ctx.topics.low_watermarks(m.bootstrap, topics),
                                    ctx.topics.high_watermarks(m.bootstrap, topics))
        ctx.save(m)
    ctx.processes.spawn(m, m.new_plan, inst, m.generation, gated=True)
    ctx.wait(m, f"shadow '{inst}' to start", lambda: ctx.processes.running(inst))
