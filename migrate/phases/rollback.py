"""``theseus migrate abort``: roll a migration back before its point of no return, the old
query reading on as if nothing happened (docs/design.md, "Resume and abort": a crash at any
point resumes or rolls back)."""

from __future__ import annotations

from compat.errors import MigrationError, Refused, RuntimeFailure
from gates import control
from gates.startgate import read_start_gate, write_start_gate
from gates.state import GateState, handed_over, veto, write_gate
from migrate import sides
from migrate.context import Context
from migrate.protocol import TERMINAL
from migrate.record import Migration, int_offsets
from migrate.store import DirectoryStore


def refuse_late(m: Migration, store: DirectoryStore) -> None:
    """Refuse an abort past the point of no return, before anything is touched (nor the
    migration's owner stopped): the new plan is live, the cutover has begun, or the old
    query handed its output over at the cut (read here; :func:`abort` vetoes the hand-over
    atomically).  A refusal (6): nothing was touched."""
    if m.phase in ("finish", "done"):
        raise Refused(f"migration {m.id} is past its cutover; the new plan "
                      "is live", file=str(store.root),
                      hint="migrate again to go back")
    if m.phase == "cutover" and m.kind == "shadow":
        raise Refused("the cutover has begun: the shadow may already write the "
                      "output from the cut on", file=str(store.root),
                      hint="theseus migrate resume finishes the cutover")
    theirs = _old_cut(m, store)
    if theirs and handed_over(store.root, m.old_instance, theirs, m.id):
        raise Refused(TOO_LATE, file=str(store.root), hint=RESUME_FINISHES)


def _old_cut(m: Migration, store: DirectoryStore) -> dict[str, dict[int, int]]:
    """Where the old query hands over (nothing before the cut is armed)."""
    if m.kind != "shadow" or not m.cut or not m.new_instance or m.phase in TERMINAL:
        return {}
    if sides.through_loops(store, m):
        # the shadow's start gate follows the old output query from step 5c on;
        # before, it has nothing to open from
        return int_offsets(read_start_gate(store.root, m.new_instance).get("follow_from")
                           or {})
    return sides.output_cut(store, m, "old")


TOO_LATE = "the old query finished the input before the cut: the shadow takes over from there"
RESUME_FINISHES = "theseus migrate resume finishes the migration"


def abort(m: Migration, ctx: Context, drop_side: bool = True,
          outcome: str = "aborted") -> Migration:
    """Roll back before the point of no return. ``drop_side``: delete the side topic
    here (a cascade deletes its side topics once every shadow of the chain stopped:
    a downstream shadow reads its upstream's).  ``outcome``: the phase it ends in (the
    delete guard of step 3 rolls a pause back into ``refused``).  Past the point of no
    return it refuses (6), touching nothing."""
    refuse_late(m, ctx.store)
    if m.phase in TERMINAL:
        return m
    root = ctx.store.root
    old, inst = m.old_instance, m.new_instance
    theirs = _old_cut(m, ctx.store)
    if theirs:
        # Once the old query finished the input before C, the shadow's start gate
        # hands the output over: that is the point of no return. The veto is atomic
        # with the old query's acknowledgements (one lock, one file): either it comes
        # first and the shadow never writes, or abort refuses.
        if not veto(root, old, theirs, m.id):
            raise Refused(TOO_LATE, file=str(root), hint=RESUME_FINISHES)
    if m.kind == "shadow" and m.cut and inst:
        ctx.flush()
        ctx.gates.set(m, inst, "paused")
        write_start_gate(root, inst, False, m.id)
        ctx.flush()
    write_gate(root, old, GateState("open", {}, m.epoch + 1))
    for lp in sides.loops(ctx.store, old).values():  # the old query's loop reads on
        write_gate(root, lp["gate"], GateState("open", {}, m.epoch + 1))
    if inst and inst != old:
        ctx.store.request_stop(inst)
        write_gate(root, inst, GateState("open", {}, m.epoch + 1))
        for lp in sides.loops(ctx.store, inst).values():
            write_gate(root, lp["gate"], GateState("open", {}, m.epoch + 1))
    m.epoch += 1
    # made at step 5 for the propagated cut, which an aborted migration never writes
    control.close_producer(ctx.producers.pop(m.id, None))
    if drop_side and (m.reconciling or m.feeds) and inst:
        # the side topic of an aborted migration (reconciling, or feeding a cascade)
        ctx.processes.wait_stopped(m)
        ctx.topics.delete_side_topic(m)
    ctx.enter(m, outcome)
    try:
        ctx.topics.tombstone_controls(m)
    except (RuntimeFailure, MigrationError) as e:  # the abort is done; they stay
        ctx.echo(f"  could not tombstone the control records: {e.render()}")
    return m
