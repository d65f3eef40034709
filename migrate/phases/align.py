"""Step 5. Align: both queries finish exactly the input before C (:func:`align`); with a
recursive step the cut goes on through the loops' internal topics (:func:`align_loops`).
A cascade's upstream propagates its cut into its output topic as soon as its old query
finished (phase ``propagate``, part of step 5: :func:`propagate`)."""

from __future__ import annotations

import json

from gates import control
from gates.startgate import write_start_gate
from gates.state import is_acked, offsets_to_json, overran, read_gate
from migrate import sides
from migrate.context import CUT_POLL, Context
from migrate.lease import Lapsed
from migrate.plantopics import control_layout
from migrate.record import Migration, int_offsets, json_offsets


def align(m: Migration, ctx: Context) -> None:
    """Both queries finish exactly the input before C.

    A cascade's upstream (``feeds``) waits here for its old query only: once that
    finished the input before C, its output topic T ends where the propagated cut will
    be (its new query holds its output from C until the cutover), so the control
    events go into T at once and the downstream's old query is capped there while the
    shadow is still finishing. The shadow's alignment is awaited where it is needed:
    the downstream shadow's switch (:func:`note_side_end`) and this query's cutover."""
    if sides.through_loops(ctx.store, m):
        align_loops(m, ctx)
        return
    full = int_offsets(m.cut)
    per = sides.instance_topics(ctx.store, m)
    old, inst = m.old_instance, m.new_instance
    g_old, g_new = read_gate(ctx.store.root, old), read_gate(ctx.store.root, inst)
    if (g_old.mode, g_old.cap, g_old.retire) != (
            "capped", {t: full[t] for t in per[old]}, m.id) or \
            (g_new.mode, g_new.cap, g_new.follow) != (
                "capped", {t: full[t] for t in per[inst]}, old):
        ctx.gates.arm(m, full)  # resumed after a crash in step 4 (or a refused abort)
    if m.feeds and not m.out_cut and m.id not in ctx.producers:
        ctx.producers[m.id] = control.control_producer(m.bootstrap, deadline=ctx.deadline)
    for q, ts in per.items():
        if m.feeds and q == sides.source_gate(ctx.store, inst):
            continue  # awaited by note_side_end
        cut = {t: full[t] for t in ts}
        ctx.wait(m, f"'{q}' to reach the cut",
                 lambda q=q, cut=cut: at_cut(ctx, m, q, cut), interval=CUT_POLL)
    if m.feeds:
        ctx.mark(m, "old_at_cut")


def at_cut(ctx: Context, m: Migration, query: str, cut: dict[str, dict[int, int]]) -> bool:
    """``query`` acknowledged the cut; the old query must not have read past it: its pause
    was lifted before its cap at C was written (the lease lapsed), it wrote output from C
    on and can never hand over there, so the migration pauses again (Lapsed)."""
    if query == m.old_instance and not m.cut_from:
        past = overran(ctx.store.root, query, cut, marks=m.cut_mode != "offsets")
        if past:
            raise Lapsed(f"migration {m.id}: the old query '{query}' read past the cut "
                         f"({json.dumps(offsets_to_json(past))}) while its pause was lifted")
    return is_acked(ctx.store.root, query, cut)


def align_loops(m: Migration, ctx: Context) -> None:
    """Step 5 with a recursive step (README, Recursion): the loop query -> internal
    topic -> output query of each side is cut like a cascade's upstream -> downstream.

    5a. The loops (a side without recursion: the query itself) finish the input before
        C: all the rows they derive from it are committed to their internal topics.
    5b. One control event into every partition of each loop's internal topic: C' (just
        past the old loop's control events) is the old output query's cut, C'' (at the
        shadow loop's) the shadow's (a side without recursion: C).
    5c. The old output query is capped at C' (it retires there); the shadow's at C'',
        following the old one, its start gate opening from C''. Then the shadow loop's
        cap is lifted: what it derives from C on lands after C''.
    5d. Both output queries finish the input before their cuts."""
    full = int_offsets(m.cut)
    old, inst = m.old_instance, m.new_instance
    plans = dict(zip(("old", "new"), sides.plans(ctx.store, m)))
    for side, name in (("old", old), ("new", inst)):
        if side in m.output_cuts:
            continue  # resumed: its loop reached C and its topic is cut
        # 5a.
        gate = sides.source_gate(ctx.store, name)
        cap = {t: full[t] for t in sides.source_topics(plans[side])}
        g = read_gate(ctx.store.root, gate)
        if (g.mode, g.cap) != ("capped", cap):
            ctx.gates.set(m, gate, "capped", cap)  # resumed after a crash in step 4
        ctx.wait(m, f"'{gate}' to reach the cut",
                 lambda gate=gate, cap=cap: is_acked(ctx.store.root, gate, cap))
        # 5b.
        topics = sorted(lp["topic"] for lp in sides.loops(ctx.store, name).values())
        if not topics:
            at = cap
        elif m.cut_mode == "offsets":
            # capped at C with everything before C committed, the loop writes nothing
            # more: the end of its topic stands still
            at = ctx.topics.high_watermarks(m.bootstrap, topics)
        else:
            with ctx.guard():
                at = control.write_control_events(m.bootstrap, topics, m.id,
                                                  deadline=ctx.deadline)
            if side == "old":
                # The old output query reads its loop's topic uncapped until 5c, so it may
                # read the control event before its cap is written; nothing follows it
                # (the old loop is retired at C). Its cut is just past the control event:
                # the hand-over needs its acknowledgement exactly at its cut
                # (gates.state.handed_over), wherever it stood when capped.
                at = {t: {p: o + 1 for p, o in parts.items()} for t, parts in at.items()}
        m.output_cuts[side] = json_offsets(at)
        ctx.save(m)
        if topics:
            mark = "C'" if side == "old" else "C''"
            ctx.echo(f"  cut the {side} loop's topic: {mark} = " +
                     json.dumps(m.output_cuts[side]))
    # 5c.
    c_old, c_new = sides.output_cut(ctx.store, m, "old"), sides.output_cut(ctx.store, m, "new")
    write_start_gate(ctx.store.root, inst, False, m.id, from_offsets=c_new,
                     follow=old, follow_offsets=c_old)
    ctx.flush()
    g_old, g_new = read_gate(ctx.store.root, old), read_gate(ctx.store.root, inst)
    if (g_old.mode, g_old.cap, g_old.retire) != ("capped", c_old, m.id):
        ctx.gates.set(m, old, "capped", c_old, retire=m.id)
    if (g_new.mode, g_new.cap, g_new.follow) != ("capped", c_new, old):
        ctx.gates.set(m, inst, "capped", c_new, follow=old)
    for lp in sides.loops(ctx.store, inst).values():
        if read_gate(ctx.store.root, lp["gate"]).mode != "open":
            ctx.gates.set(m, lp["gate"], "open")
    # 5d.
    for name, c in ((old, c_old), (inst, c_new)):
        ctx.wait(m, f"'{name}' to reach its cut",
                 lambda name=name, c=c: is_acked(ctx.store.root, name, c))


def propagate(m: Migration, ctx: Context) -> None:
    """Part of step 5 for a cascade's upstream, once its old query's output before the
    cut is committed: write one control event into every partition of the output topic
    (the downstream queries' cut). Nothing else writes that topic until the cutover: the
    old query is retired at C, and the new query holds its first output from the cut
    (``hold``). Where the shadow's output before the cut ends in the side topic is noted
    once the shadow finished that input (:func:`note_side_end`)."""
    if not m.out_cut:
        topic = sides.output_topic(m)
        producer = ctx.producers.pop(m.id, None)
        with ctx.guard():
            out = control.write_control_events(
                m.bootstrap, [topic], m.id, deadline=ctx.deadline, producer=producer,
                **control_layout(m.new_plan, m.old_plan))
        m.out_cut = json_offsets(out)
        ctx.save(m)
        ctx.echo(f"  propagated the cut into {topic}: " + json.dumps(m.out_cut))


def note_side_end(m: Migration, ctx: Context) -> None:
    """A cascade's upstream: wait until the shadow finished the input before its cut
    (all its output before the cut is committed to the side topic), then record where
    that output ends (``side_end``: where the downstream shadows switch to the topic)."""
    inst = m.new_instance
    mine = sides.output_cut(ctx.store, m, "new")

    def done() -> bool:
        ctx.processes.check_alive(m, always=True)
        return is_acked(ctx.store.root, inst, mine)

    ctx.wait(m, f"the shadow '{inst}' to reach the cut", done, interval=CUT_POLL)
    if not m.side_end:
        side = sides.compare_topic(m)
        high = ctx.topics.high_watermarks(m.bootstrap, [side])
        m.side_end = {str(p): o for p, o in high[side].items()}
        ctx.save(m)
