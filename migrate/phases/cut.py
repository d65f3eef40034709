"""Step 4. Cut: write one control event into every partition of every source topic; their
offsets are the cut C, and both queries are capped there.  A cascade's downstream adopts the
cut its upstream propagated into its output topic instead (:func:`adopt_cut`)."""

from __future__ import annotations

import json

from compat.errors import MigrationError
from gates import control
from gates.cascade import write_switch
from gates.state import handed_over, read_gate, saw_cap
from migrate import sides
from migrate.context import CUT_POLL, Context
from migrate.phases.align import note_side_end
from migrate.plantopics import control_layout
from migrate.record import Migration, int_offsets, json_offsets, resume_hint


def cut(m: Migration, ctx: Context) -> None:
    if m.cut_from:
        adopt_cut(m, ctx)
        return
    high = int_offsets(m.high)
    topics = sorted(high)
    # The queries wait at H only while the lease holds: renewed now, a lapse since the
    # pause is found before anything is written at H (and the runner pauses again); the
    # writes below renew it again if they take longer than its budget.
    ctx.renew(force=True)
    if m.cut_mode == "offsets":
        at = high
    else:
        with ctx.guard():
            at = control.write_control_events(
                m.bootstrap, topics, m.id, deadline=ctx.deadline,
                **control_layout(m.new_plan, m.old_plan))
    check_cut(high, at)
    m.cut = json_offsets(at)
    ctx.save(m)
    ctx.echo("  cut C = " + json.dumps(m.cut))
    if sides.through_loops(ctx.store, m):
        ctx.gates.arm_loops(m, at)
    else:
        ctx.gates.arm(m, at)


def check_cut(high: dict[str, dict[int, int]], cut: dict[str, dict[int, int]]) -> None:
    """The cut C must cover every partition of the high watermarks H, at or beyond H: both
    queries were paused at H, and a control event lands after everything written before it.
    A cut behind H means the topic was deleted and created again since the pause (or a bug):
    refuse, naming the topic, the partition and both offsets."""
    for t, parts in sorted(high.items()):
        for p, h in sorted(parts.items()):
            c = cut.get(t, {}).get(p)
            if c is None:
                raise MigrationError(f"topic '{t}' partition {p}: the cut C misses a "
                                     "partition of the high watermarks H",
                                     expected=f"C at offset {h} or later (H)", found="none")
            if c < h:
                raise MigrationError(f"topic '{t}' partition {p}: the cut C is behind the "
                                     "high watermark H (the topic was deleted and created "
                                     "again since the pause?)",
                                     expected=f"C at offset {h} or later (H)",
                                     found=f"C at offset {c}")


def adopt_cut(m: Migration, ctx: Context) -> None:
    """Step 4 of a cascade's downstream: its cut C is the control events the upstream's
    hand-over wrote into its output topic. The old query is capped there at once (the
    upstream propagates as soon as its own old query finished: the cap is read by the
    very trigger that reads the old upstream's last output, or the next). The shadow
    reads the upstream shadow's side topic to where its output before the cut ends,
    known once that shadow finished the input before the upstream's cut, then the topic
    from C. The old query must have seen its cap before the upstream's new query writes
    past C (the upstream holds that output until this step is done), so wait for its
    acknowledgement under the cap."""
    up = ctx.record(m.cut_from)
    if not up.out_cut:
        raise MigrationError(f"the upstream migration {up.id} has not propagated its "
                             f"cut (phase {up.phase})", file=str(ctx.store.root),
                             hint=resume_hint(m.query))
    at = int_offsets(up.out_cut)
    m.high = up.out_cut
    m.cut = up.out_cut
    ctx.save(m)
    ctx.echo("  cut C = " + json.dumps(m.cut) + f" (propagated by {up.id})")
    topic = sides.output_topic(up)
    old = m.old_instance
    theirs = {t: at[t] for t in sides.instance_topics(ctx.store, m)[old]}
    g = read_gate(ctx.store.root, old)
    # resumed after the old query was capped: capped again, it would have to acknowledge
    # a new epoch, which a query that handed over (and stopped) never does
    ctx.gates.arm(m, at, old_too=not (g.mode == "capped" and g.cap == theirs and
                                      g.retire == m.id))
    capped = read_gate(ctx.store.root, old).epoch  # acknowledged under this cap
    ctx.mark(m, "capped")
    if not up.side_end:
        note_side_end(up, ctx)  # the upstream shadow finished the input before its cut
    write_switch(ctx.store.root, m.new_instance, topic=topic, side=sides.compare_topic(up),
                 side_from={int(p): o for p, o in up.side_from.items()},
                 side_end={int(p): o for p, o in up.side_end.items()}, at=at[topic])
    ctx.flush()
    ctx.mark(m, "switch")

    def seen() -> bool:
        # It read the cap (it may still have input before C to finish: it plans no
        # batch past C any more, and the alignment waits for the rest); or it stood at
        # C before the cap (idle, caught up: the upstream's old query retired and its
        # new one holds its output): it then handed over as soon as the cap was written
        # (gates.state.retired), its host stops it and it never acknowledges the new
        # epoch, but its sink writes nothing more.
        return saw_cap(ctx.store.root, old, theirs, capped) or \
            handed_over(ctx.store.root, old, theirs, m.id)

    ctx.wait(m, f"'{old}' to see the propagated cut", seen, interval=CUT_POLL)
    ctx.mark(m, "seen")
